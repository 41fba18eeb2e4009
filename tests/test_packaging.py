"""The wheel builds, declares its dependencies, and imports in a clean venv without Triton."""
import re, subprocess, sys, venv, zipfile
from pathlib import Path
import pytest
from conftest import ROOT


def test_wheel_and_clean_import(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    whl, = (tmp_path / "dist").glob("ssm_course-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "ssm_course/ssm.py" in names and "ssm_course/_modidx.py" in names
    requires = [l for l in meta.splitlines() if l.startswith("Requires-Dist:")]
    for dep in ("torch", "numpy", "matplotlib", "fastcore", "tqdm"):
        assert any(l.split()[1].startswith(dep) and "extra ==" not in l for l in requires), dep
    assert all("extra ==" in l for l in requires if l.split()[1].startswith("triton")), "triton must be optional"

    # A fresh venv holding only the wheel. Its dependencies (torch & co) are borrowed from this
    # environment through a .pth file *after* the venv's own site-packages, and triton is blocked,
    # as it would be missing on a machine without the `gpu` extra.
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)], check=True, capture_output=True)
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz_borrowed_deps.pth").write_text("\n".join(deps) + "\n")
    code = ("import sys, importlib, pkgutil\n"
            "sys.modules['triton'] = None  # any `import triton` now raises ImportError\n"
            "import ssm_course\n"
            "assert ssm_course.__file__.startswith(sys.prefix), ssm_course.__file__\n"
            "mods = [m.name for m in pkgutil.walk_packages(ssm_course.__path__, 'ssm_course.')]\n"
            "for m in mods:\n"
            "    if m.startswith(('ssm_course.triton_', 'ssm_course._engine.triton_')):  # the kernels need the gpu extra\n"
            "        try: importlib.import_module(m); raise SystemExit(m + ' imported without triton')\n"
            "        except ImportError: pass\n"
            "    else: importlib.import_module(m)\n"
            "import torch\n"
            "from ssm_course.scan import scan\n"
            "assert torch.allclose(scan(torch.full((4,), 0.5), torch.ones(4)), torch.tensor([1.0, 1.5, 1.75, 1.875]))  # auto -> PyTorch\n"
            "print(ssm_course.__version__)")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import ssm_course
    assert out.stdout.strip() == ssm_course.__version__ and ssm_course.__version__.count(".") == 2


def _pyproject():
    try: import tomllib
    except ModuleNotFoundError: tomllib = pytest.importorskip("tomli")  # Python 3.10
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _closure(reqs):
    "Names of the installed distributions that `reqs` pull in, recursively (extras of dependencies not followed)."
    from importlib import metadata
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    seen, todo = set(), [Requirement(r) for r in reqs]
    while todo:
        r = todo.pop()
        if r.marker is not None and not r.marker.evaluate({"extra": ""}): continue
        name = canonicalize_name(r.name)
        if name in seen: continue
        seen.add(name)
        try: todo.extend(Requirement(x) for x in metadata.requires(name) or [])
        except metadata.PackageNotFoundError: pass
    return seen


def test_plain_install_is_small():
    """What a plain `pip install ssm_course` adds beside torch: numpy, matplotlib (and its 8), fastcore, tqdm. fastprogress 1.1
    brought python-fasthtml and a web stack (uvicorn, starlette, httpx, ...): 35 distributions, 209 MiB, against 13 and 175 MiB
    with tqdm (fresh venv, `pip install numpy matplotlib fastcore fastprogress|tqdm`)."""
    deps = _pyproject()["dependencies"]
    extra = _closure(deps) - _closure([d for d in deps if d.startswith("torch")])
    assert not extra & {"python-fasthtml", "uvicorn", "starlette", "httpx", "fastprogress"}, sorted(extra)
    assert len(extra) <= 14, sorted(extra)


def _direct(reqs):
    "Canonical names of the distributions that `reqs` name (markers evaluated for this machine)."
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    return {canonicalize_name(r.name) for r in map(Requirement, reqs) if r.marker is None or r.marker.evaluate({"extra": ""})}


def _third_party_imports(sources):
    "{top-level module: {file names}} for the absolute imports in `sources` ((name, code) pairs), stdlib left out."
    import ast
    found = {}
    for name, src in sources:
        if name.endswith(".ipynb"):  # a cell: IPython's `!` and `%` lines become the calls IPython runs
            from IPython.core.inputtransformer2 import TransformerManager
            src = TransformerManager().transform_cell(src)
        for node in ast.walk(ast.parse(src)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for mod in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"ssm_course"}:
                found.setdefault(mod, set()).add(name)
    return found


def _undeclared(imports, declared, via=()):
    """Modules in `imports` whose distribution is not a `declared` requirement. A module imported directly must be
    declared directly, not arrive as a dependency of a dependency (mpmath comes with torch through sympy today, and
    would vanish with that chain); `via` names the few that may, each with its reason, and they must still be installed."""
    from importlib.metadata import packages_distributions
    from packaging.utils import canonicalize_name
    dists = packages_distributions()
    # a top-level extension module (ducc0.cpython-311-...so) is missing from packages_distributions(): its name is its distribution
    return {mod: files for mod, files in imports.items() if mod not in via
            and not any(canonicalize_name(d) in declared for d in dists.get(mod, [mod]))}


def test_course_extra_runs_every_notebook():
    """Every third-party module a notebook imports is a direct requirement of `pip install -e ".[course]"` (the
    library's dependencies or the `course` extra), except the few named here with their reason."""
    import json
    optional = {"mambapy": "notebook 14's peer, in the [bench] extra, skipped when missing",
                "torchvision": "only for sequential_images(download=True), which needs the internet anyway"}
    via = {"IPython": "the Jupyter kernel itself (jupyterlab -> ipykernel -> ipython)"}
    proj = _pyproject()
    reqs = proj["dependencies"] + proj["optional-dependencies"]["course"]
    cells = [(nb.name, "".join(c["source"])) for nb in sorted((ROOT / "nbs").glob("*.ipynb"))
             for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    imports = {m: f for m, f in _third_party_imports(cells).items() if m not in optional}
    missing = _undeclared(imports, _direct(reqs), via)
    assert not missing, f"notebooks import modules that [course] does not declare: {missing}"
    assert {"ipython"} <= _closure(reqs), "IPython must come with [course]'s jupyterlab"
    assert "mambapy" in proj["optional-dependencies"]["bench"]


def test_dev_extra_runs_every_test():
    "Every third-party module that tests/ and docs/build.py import is a direct requirement of `pip install -e \".[dev]\"`."
    proj = _pyproject()
    files = sorted((ROOT / "tests").glob("*.py")) + [ROOT / "docs" / "build.py"]
    local = {p.stem for p in files}  # conftest, build (docs/build.py), test modules importing each other
    optional = {"mamba_ssm": "bench/gpu.py's peer (needs CUDA to build): its call-path tests skip without it",
                "fla": "bench/gpu.py's peer (flash-linear-attention): its call-path tests skip without it"}
    imports = {m: f for m, f in _third_party_imports([(p.name, p.read_text()) for p in files]).items() if m not in local | set(optional)}
    missing = _undeclared(imports, _direct(proj["dependencies"] + proj["optional-dependencies"]["dev"]))
    assert not missing, f"tests import modules that [dev] does not declare: {missing}"


def test_triton_floor_is_the_tested_one():
    "pyproject's lowest Triton is the version `make test-triton36` tests, and the README calls it the oldest supported."
    from packaging.requirements import Requirement
    proj = _pyproject()
    floors = {str(Requirement(r).specifier) for extra in proj["optional-dependencies"].values() for r in extra
              if Requirement(r).name == "triton"}
    tested = re.search(r'"triton==(\d+\.\d+)\.\d+"', (ROOT / "Makefile").read_text())[1]
    assert floors == {f">={tested}"}, floors
    readme = (ROOT / "README.md").read_text()
    assert f"Triton {tested}, the oldest version supported" in readme and f"triton>={tested}" in readme


def test_optional_accelerators_present_where_required():
    "Where SSM_COURSE_REQUIRE_FAST=1 (set by .ci/run), numba's loop and ducc0 must be importable, so that their tests run rather than skip."
    import os
    if os.environ.get("SSM_COURSE_REQUIRE_FAST") != "1": pytest.skip("set SSM_COURSE_REQUIRE_FAST=1 to require numba and ducc0 (pip install '.[fast]')")
    import ssm_course.scan as scan, ssm_course._engine.conv as conv_engine  # the engine notebooks' fast paths
    assert scan._loop is not None, "numba is not importable: the compiled scan loop and its tests would be skipped"
    assert conv_engine.ducc0 is not None, "ducc0 is not importable: the ducc0 causal_conv tests would be skipped"
