"""The test harness itself: the per-notebook time budget is a report on a reader's machine and a failure only in CI."""
import os, subprocess, sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]

@pytest.fixture
def busy_notebook(tmp_path):
    "A notebook that burns about 0.3 s of CPU time."
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass")])
    path = tmp_path / "busy.ipynb"
    nbformat.write(nb, path)
    return path

def test_budget_is_reported_not_enforced_by_default(busy_notebook):
    env = {k: v for k, v in os.environ.items() if k != "SSM_COURSE_ENFORCE_NB_BUDGET"}
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_times.py"), str(busy_notebook), "--max-seconds", "0.1"],
                       cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OVER BUDGET" in r.stdout and "a report, not a failure" in r.stdout

def test_budget_fails_on_cpu_time_when_enforced(busy_notebook):
    env = {**os.environ, "SSM_COURSE_ENFORCE_NB_BUDGET": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_times.py"), str(busy_notebook), "--max-seconds", "0.1"],
                       cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "over the 0.1 s budget of CPU time: busy.ipynb" in r.stdout, r.stdout + r.stderr
    ok = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_times.py"), str(busy_notebook), "--max-seconds", "30"],
                        cwd=ROOT, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr

def test_a_raising_notebook_fails(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("raise ValueError('boom')")])
    nbformat.write(nb, tmp_path / "bad.ipynb")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_times.py"), str(tmp_path / "bad.ipynb")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "FAILED" in r.stdout and "boom" in r.stderr, r.stdout + r.stderr


def test_a_worker_runs_several_notebooks(busy_notebook, tmp_path):
    "A worker that has run one notebook (whose IPython shell replaces __main__) still runs the next: 3 notebooks, 2 workers."
    import shutil
    for n in ("b", "c"): shutil.copy(busy_notebook, tmp_path / f"{n}.ipynb")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_times.py"), str(busy_notebook), str(tmp_path / "b.ipynb"),
                        str(tmp_path / "c.ipynb"), "--n-workers", "2"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.count("- Completed") == 3, r.stdout + r.stderr


def test_each_notebook_runs_in_a_fresh_process(tmp_path):
    "A notebook that changes module state (here: replaces a library function) cannot reach the next one, whichever worker runs it."
    first = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import ssm_course.scan as s\ns.scan = None")])
    second = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import ssm_course.scan as s\nassert s.scan is not None")])
    nbformat.write(first, tmp_path / "a.ipynb"); nbformat.write(second, tmp_path / "b.ipynb")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "notebook_times.py"), str(tmp_path / "a.ipynb"), str(tmp_path / "b.ipynb"),
                        "--n-workers", "1"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.count("- Completed") == 2, r.stdout + r.stderr
