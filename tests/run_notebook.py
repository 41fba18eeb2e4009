"""Re-execute notebooks in place, in a real Jupyter kernel, keeping the committed outputs of `#| slow` and `#| gpu` cells.

    .venv/bin/python tests/run_notebook.py nbs/07_scan.ipynb [more.ipynb ...] [--slow] [--timeout 600]

Every other code cell runs in order (as `nbdev-test` runs them) and its outputs replace the committed ones; `--slow`
runs the slow cells too. Figures are kept: the kernel uses matplotlib's inline backend (MPLBACKEND is cleared), so a
figure cell gets its image. Without a GPU, Triton runs under its interpreter (TRITON_INTERPRET=1), as in `make test`.
Run `nbdev-clean` afterwards (this script does it for the notebooks it ran)."""
import argparse, os, re, subprocess, sys, time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"^\s*#\|\s*(slow|gpu)\s*$", re.M)


def run(path: Path, slow: bool, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or (not slow and FLAG.search(cell.source)): continue
            client.execute_cell(cell, i)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error": raise RuntimeError(f"{path.name} cell {i} raised {out.get('ename')}: {out.get('evalue')}")
    nbformat.write(nb, path)
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
