"""The wheel builds, declares its dependencies, and imports in a clean venv without Triton."""
import subprocess, sys, venv, zipfile
from pathlib import Path
from conftest import ROOT


def test_wheel_and_clean_import(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    whl, = (tmp_path / "dist").glob("ssm_course-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "ssm_course/ssm.py" in names and "ssm_course/_modidx.py" in names
    requires = [l for l in meta.splitlines() if l.startswith("Requires-Dist:")]
    for dep in ("torch", "numpy", "matplotlib", "fastcore"):
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
            "    if m.startswith('ssm_course.triton_'):  # the kernels need the gpu extra, and say so\n"
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
