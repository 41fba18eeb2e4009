"""Re-execute notebooks in place, in a real Jupyter kernel, keeping the committed outputs of `#| slow` and `#| gpu` cells.

    .venv/bin/python tests/run_notebook.py nbs/07_scan.ipynb [more.ipynb ...] [--slow] [--timeout 600]

Every other code cell runs in order (as `nbdev-test` runs them) and its outputs replace the committed ones; `--slow`
runs the slow cells too (SSM_COURSE_RUN_SLOW=1 in the kernel, so the setup cell lets them run) and records each one's
seconds in nbs/results/slow_cells.json (keyed by notebook and a hash of the cell's source), which the Run All line of
tests/run_all_times.py reads. Figures are kept: the kernel uses matplotlib's inline backend (MPLBACKEND is cleared), so a
figure cell gets its image. Without a GPU, Triton runs under its interpreter (TRITON_INTERPRET=1), as in `make test`.
Run `nbdev-clean` afterwards (this script does it for the notebooks it ran)."""
import argparse, json, os, subprocess, sys, time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from ssm_course._engine.jupyter import cell_key, is_slow  # what the setup cell skips, and its key in slow_cells.json

ROOT = Path(__file__).resolve().parents[1]
SLOW_TIMES = ROOT / "nbs" / "results" / "slow_cells.json"




def run(path: Path, slow: bool, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    start, slow_times = time.perf_counter(), {}
    env = {**os.environ, "SSM_COURSE_RUN_SLOW": "1"} if slow else {k: v for k, v in os.environ.items() if k != "SSM_COURSE_RUN_SLOW"}
    with client.setup_kernel(env=env):
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or (not slow and is_slow(cell.source)): continue
            t0 = time.perf_counter()
            client.execute_cell(cell, i)
            if is_slow(cell.source): slow_times[cell_key(cell.source)] = round(time.perf_counter() - t0, 1)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error": raise RuntimeError(f"{path.name} cell {i} raised {out.get('ename')}: {out.get('evalue')}")
    nbformat.write(nb, path)
    if slow_times:
        rel = path.relative_to(ROOT / "nbs").as_posix()
        allt = json.loads(SLOW_TIMES.read_text()) if SLOW_TIMES.exists() else {}
        allt.setdefault(rel, {}).update(slow_times)
        SLOW_TIMES.write_text(json.dumps(allt, indent=1, sort_keys=True) + "\n")
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--slow", action="store_true", help="run the #| slow and #| gpu cells too")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    a = ap.parse_args()
    os.environ.pop("MPLBACKEND", None)
    try: import torch; gpu = torch.cuda.is_available()
    except ImportError: gpu = False
    if not gpu: os.environ["TRITON_INTERPRET"] = "1"
    for p in a.notebooks:
        print(f"{p}: {run(p.resolve(), a.slow, a.timeout):.1f} s", flush=True)
    subprocess.run([str(Path(sys.executable).parent / "nbdev-clean")], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
