"""The notebooks as Jupyter and Colab open them (issue 31 items 1, 2 and 4): every notebook carries a python3 kernelspec
(no "Select Kernel" dialog), opens with the hidden setup cell of engine/jupyter (the Colab install; slow cells show their
committed results unless SSM_COURSE_RUN_SLOW is set) and says how long Run All takes; the setup cell's Colab branch
clones, installs the `colab` extra and moves to the notebook's folder; the `colab` extra covers what the notebooks import."""
import json, os, re, sys, tomllib, types
from pathlib import Path
import pytest
from conftest import ROOT

from ssm_course._engine.jupyter import setup_cell, SWITCH

NBS = ROOT / "nbs"
NOTEBOOKS = sorted(NBS.glob("*.ipynb")) + sorted((NBS / "engine").glob("*.ipynb"))
IDS = [p.relative_to(NBS).as_posix() for p in NOTEBOOKS]


def _cells(p): return json.loads(p.read_text(encoding="utf-8"))["cells"]
def _src(c): return "".join(c["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_has_a_kernelspec_and_opens_with_the_setup_cell(path):
    "JupyterLab opens the notebook in the python3 kernel without asking; the first code cell is the setup cell, right after the title."
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", f"{path.name}: no python3 kernelspec"
    cells = nb["cells"]
    first = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    assert first == 1 and _src(cells[first]) == setup_cell(path.relative_to(NBS).as_posix()), \
        f"{path.name}: the first code cell (cell {first}) is not setup_cell({path.relative_to(NBS).as_posix()!r})"


RUN_ALL = re.compile(r"\*\*Run All\*\*")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name != "index.ipynb"], ids=[i for i in IDS if i != "index.ipynb"])
def test_notebook_says_how_long_run_all_takes(path):
    "The markdown cell after the setup cell gives the measured Run All time (tests/run_all_times.py), and for notebooks with slow cells how many there are and how to rerun them (the landing page, index.ipynb, explains it for all)."
    cells = _cells(path)
    line = _src(cells[2]) if len(cells) > 2 and cells[2]["cell_type"] == "markdown" else ""
    assert RUN_ALL.search(line) and re.search(r"\d+ s\b|\d+ min\b", line), f"{path.name}: no Run All line after the setup cell: {line[:120]!r}"
    n_slow = sum(1 for c in cells if c["cell_type"] == "code" and re.search(r"^\s*#\|\s*(slow|gpu)\s*$", _src(c), re.M))
    if n_slow: assert SWITCH in line and str(n_slow) in line, f"{path.name}: {n_slow} slow cells, not stated in the Run All line: {line!r}"


def test_setup_cell_in_colab_clones_installs_and_moves_to_the_notebook(monkeypatch, tmp_path):
    "The Colab branch, run as IPython runs it (its `!` and `%` lines become calls), with the shell commands recorded instead of run."
    from IPython.core.inputtransformer2 import TransformerManager
    calls = []
    shell = types.SimpleNamespace(system=lambda cmd: calls.append(("system", cmd)),
                                  run_line_magic=lambda name, line: calls.append((name, line)))
    code = TransformerManager().transform_cell(setup_cell("engine/scan.ipynb"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(os.path, "isdir", lambda p: False if p == "/content/ssm_course" else os.path.exists(p))
    moved = []
    monkeypatch.setattr(os, "chdir", moved.append)
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ssm_course" else find_spec(name, *a))
    exec(code, {"get_ipython": lambda: shell})  # a fresh runtime: clone, install, move
    assert calls == [("system", "git clone -q --depth 1 https://github.com/ssm-course/ssm_course /content/ssm_course"),
                     ("pip", 'install -q "/content/ssm_course[colab]"')], calls
    assert moved == ["/content/ssm_course/nbs/engine"]
    monkeypatch.setattr(os.path, "isdir", lambda p: True)
    calls.clear(); moved.clear()
    exec(code, {"get_ipython": lambda: shell})  # cloned, but the install failed: installs again
    assert calls == [("pip", 'install -q "/content/ssm_course[colab]"')] and moved == ["/content/ssm_course/nbs/engine"]
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    calls.clear(); moved.clear()
    exec(code, {"get_ipython": lambda: shell})  # cloned and installed: only the move
    assert calls == [] and moved == ["/content/ssm_course/nbs/engine"]
    # outside Colab nothing is run and the directory is not changed
    monkeypatch.delitem(sys.modules, "google.colab")
    monkeypatch.setattr(os.path, "isdir", lambda p: False)
    calls.clear(); moved.clear()
    exec(code, {"get_ipython": lambda: shell})
    assert calls == [] and moved == []


# what each imported top-level module is called on PyPI; torch, numpy, matplotlib, triton and IPython come with Colab
DIST = {"sklearn": "scikit-learn", "IPython": None, "torch": None, "numpy": None, "matplotlib": None, "triton": None,
        "torchvision": None, "llvmlite": "numba"}  # llvmlite: numba's own dependency, imported only where numba is


def test_setup_cell_says_how_to_install_when_the_course_is_missing(monkeypatch):
    "Outside Colab, a kernel without the course gets one line saying what to install, not a bare ModuleNotFoundError."
    from IPython.core.inputtransformer2 import TransformerManager
    code = TransformerManager().transform_cell(setup_cell("07_scan.ipynb"))
    monkeypatch.setitem(sys.modules, "ssm_course._engine.jupyter", None)  # an import of it now fails as if not installed
    with pytest.raises(ModuleNotFoundError, match=r'ssm_course is not installed for this kernel: run pip install -e "\.\[course\]"'):
        exec(code, {"get_ipython": lambda: None})


def test_colab_extra_covers_what_the_notebooks_import():
    "Every third-party module a notebook imports is a dependency of the package, in the `colab` extra, or preinstalled in Colab."
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    have = {re.split(r"[<>=!~; \[]", d)[0].lower() for d in meta["dependencies"] + meta["optional-dependencies"]["colab"]}
    missing = set()
    for p in NOTEBOOKS:
        for c in _cells(p):
            if c["cell_type"] != "code": continue
            for m in re.finditer(r"^\s*(?:from\s+(\w+)[\w.]*\s+import|import\s+(\w+))", _src(c), re.M):
                mod = m.group(1) or m.group(2)
                if mod in sys.stdlib_module_names or mod == "ssm_course": continue
                dist = DIST.get(mod, mod)
                if dist is not None and dist.lower() not in have: missing.add((mod, p.name))
    assert not missing, f"imported by notebooks but not installed in Colab: {sorted(missing)}"


def test_slow_cells_show_their_committed_outputs_in_a_real_kernel(tmp_path):
    "A saved notebook with the setup cell, run in a python3 kernel: its slow cell (which would raise) shows the committed output, a PNG "
    "included, and an ordinary cell runs; with SSM_COURSE_RUN_SLOW=1 in the kernel's environment the slow cell runs (and raises)."
    import nbformat
    from nbclient import NotebookClient
    from test_notebooks_in_kernel import student_env
    slow = "#| slow\nraise RuntimeError('the slow cell ran')"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell(setup_cell("t.ipynb")),
                                         nbformat.v4.new_code_cell(slow), nbformat.v4.new_code_cell("print(6 * 7)")])
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="committed 42\n"),
                           nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]
    nbformat.write(nb, tmp_path / "t.ipynb")

    def run(env):
        fresh = nbformat.read(tmp_path / "t.ipynb", as_version=4)
        client = NotebookClient(fresh, timeout=120, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(tmp_path)}})
        with client.setup_kernel(env=env):
            for i, c in enumerate(fresh.cells):
                if c.cell_type == "code": client.execute_cell(c, i)
        return fresh.cells

    cells = run(student_env())
    assert [o.get("output_type") for o in cells[1].outputs] == []  # the setup cell is silent outside Colab
    text = "".join(o.get("text", "") for o in cells[2].outputs)
    assert text.startswith("Slow cell not rerun: its committed output follows. Set SSM_COURSE_RUN_SLOW=1") and "committed 42" in text, text
    assert [o["data"]["image/png"] for o in cells[2].outputs if "image/png" in o.get("data", {})] == ["iVBORw0KGgo="]
    assert cells[3].outputs[0]["text"] == "42\n"
    cells = run({**student_env(), SWITCH: "1"})
    assert cells[2].outputs[-1]["output_type"] == "error" and cells[2].outputs[-1]["evalue"] == "the slow cell ran"
