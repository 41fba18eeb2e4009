"""A sample of notebooks run as a student runs them: in a real Jupyter kernel (ipykernel, through nbclient), with PyTorch's
default threads (no OMP_NUM_THREADS), matplotlib's inline backend and no TRITON_INTERPRET, every cell in order as Run All
runs them: the notebook's setup cell (engine/jupyter) makes the `#| slow` and `#| gpu` cells show their committed outputs
(checked: each says so). A cell that raises, or that writes anything to stderr (a warning included), fails.

Measured on the 2-core machine: 41 s for the file (13b 17 s, 07 8 s, 01 6 s, 13a 4 s, the check of the check 6 s; the
kernels' CPU time 01 18 s, 07 6 s, 13a 3 s, 13b 20 s). Under a load of 4 to 5 other processes PyTorch's default threads
wait for each other, and the same file once took 4 min 41 s (13b alone 230 s). So a reader's `make test` skips it unless
SSM_COURSE_REQUIRE_KERNEL_NOTEBOOKS=1; `.ci/run` sets it, so CI always runs it. `python tests/test_notebooks_in_kernel.py
[notebooks]` runs it by hand and prints each notebook's wall and CPU time."""
import os, sys, time
from pathlib import Path
import pytest
from conftest import ROOT

NOTEBOOKS = ["01_ssm.ipynb", "07_scan.ipynb", "13a_tasks.ipynb", "13b_training.ipynb"]
REQUIRE = "SSM_COURSE_REQUIRE_KERNEL_NOTEBOOKS"
from ssm_course._engine.jupyter import is_setup_cell, is_slow  # the cells nbdev-test skips (tst_flags = "slow gpu"); the setup cell
# What a student's environment does not set: thread caps, the test suite's Agg backend and Triton's interpreter.
UNSET = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MPLBACKEND", "TRITON_INTERPRET", "PYTEST_CURRENT_TEST",
         "SSM_COURSE_RUN_SLOW")
PROBE = "import os, time, torch\nprint(torch.get_num_threads(), os.cpu_count(), os.environ.get('OMP_NUM_THREADS'), round(time.process_time(), 1))"


def student_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in UNSET}


def run_in_kernel(nb_or_name, timeout: int = 600) -> dict:
    """Execute a notebook of nbs/ (by name, not saved) or a notebook object, cell by cell in a fresh python3 kernel with
    `student_env()`: every cell when the notebook opens with the setup cell (its slow cells then show their committed
    outputs), else skipping slow and gpu cells as nbdev-test does; returns {"nb" (executed), "seconds", "cells", "errors":
    [(cell, ename, evalue)], "stderr": [(cell, text)], "slow": [(cell, first line of its output)], "threads": (torch threads,
    cpus, OMP_NUM_THREADS, the kernel's CPU seconds)}."""
    import nbformat
    from nbclient import NotebookClient
    if isinstance(nb_or_name, str): path = ROOT / "nbs" / nb_or_name; nb = nbformat.read(path, as_version=4)
    else: path, nb = ROOT / "nbs" / "scratch.ipynb", nb_or_name
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(path.parent)}})
    res, ran, start = {"nb": nb, "errors": [], "stderr": [], "slow": []}, 0, time.perf_counter()
    code = [c for c in nb.cells if c.cell_type == "code"]
    run_all = bool(code) and is_setup_cell(code[0].source)  # the setup cell: Run All as a student runs it
    with client.setup_kernel(env=student_env()):
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or (is_slow(cell.source) and not run_all): continue
            client.execute_cell(cell, i); ran += 1
            if is_slow(cell.source):
                first = next((o for o in cell.get("outputs", []) if o.get("output_type") == "stream"), {})
                res["slow"].append((i, first.get("text", "").split("\n")[0]))
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error": res["errors"].append((i, out.get("ename"), out.get("evalue")))
                elif out.get("output_type") == "stream" and out.get("name") == "stderr": res["stderr"].append((i, out.get("text")))
            if res["errors"]: break
    res.update(seconds=time.perf_counter() - start, cells=ran)
    probe = nb.cells[-1].get("outputs", [])
    res["threads"] = tuple(probe[0]["text"].split()) if probe and probe[0].get("output_type") == "stream" else None
    return res


def test_the_check_sees_stderr_and_errors():
    "The check itself: a warning on stderr and an exception are both caught (a notebook that prints neither passes)."
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in
                                         ["import warnings; warnings.warn('a warning')", "print('fine')", "#| slow\nraise RuntimeError('skipped')", "1 / 0"]])
    r = run_in_kernel(nb, timeout=120)
    assert [i for i, _ in r["stderr"]] == [0] and "UserWarning: a warning" in r["stderr"][0][1], r["stderr"]
    assert r["errors"] == [(3, "ZeroDivisionError", "division by zero")] and r["cells"] == 3, r


def test_ci_runs_the_notebooks_in_a_kernel():
    "CI (.ci/run) sets the variable, so there the notebooks below run instead of skipping."
    assert f"export {REQUIRE}=1" in (ROOT / ".ci" / "run").read_text()


def _enabled():
    on = os.environ.get(REQUIRE, "") not in ("", "0")
    if not on: pytest.skip(f"runs notebooks in a Jupyter kernel (about 50 s of CPU, minutes on a busy machine): set {REQUIRE}=1 to run it (CI does)")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_a_kernel_without_errors_or_stderr(name):
    _enabled()
    r = run_in_kernel(name)
    assert not r["errors"], f"{name}: cell {r['errors'][0][0]} raised {r['errors'][0][1]}: {r['errors'][0][2]}"
    assert not r["stderr"], f"{name} wrote to stderr: " + "; ".join(f"cell {i}: {t.strip()[:500]}" for i, t in r["stderr"])
    threads, cpus, omp, cpu_seconds = r["threads"]
    assert omp == "None", f"the kernel ran with OMP_NUM_THREADS={omp}: not a student's default"
    assert all(t.startswith("Slow cell not rerun: its committed output follows") for _, t in r["slow"]), r["slow"]
    if name == "13b_training.ipynb":  # the trainer's progress in Jupyter: tqdm as HTML, a line per round, the figure
        cell = next(c for c in r["nb"].cells if "trainer.fit(eval_every=100, plot=True)" in c.source)
        html = [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
        assert len(html) == 1 and '<progress value="300" max="300"' in html[0] and "training: 100% 300/300" in html[0], html
        assert sum("image/png" in o.get("data", {}) for o in cell.outputs) == 1
        lines = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout").splitlines()
        assert [l.split(":")[0] for l in lines] == ["step 100/300", "step 200/300", "step 300/300"], lines


if __name__ == "__main__":
    for n in sys.argv[1:] or NOTEBOOKS:
        r = run_in_kernel(n); r.pop("nb")
        print(f"{n}: {r['seconds']:.1f} s wall, {r['cells']} cells, threads {r['threads']}, errors {r['errors']}, stderr {[(i, t[:300]) for i, t in r['stderr']]}", flush=True)
