"""Every Triton kernel against its float64 reference, in Triton's CPU interpreter (tiny shapes), and the dispatcher.

TRITON_INTERPRET must be set before triton is imported, so this module sets it first; the kernels
are imported lazily by the dispatcher, after this line."""
import os
os.environ["TRITON_INTERPRET"] = "1"
import math, pytest, torch
import torch.nn.functional as F
from ssm_course.scan import scan, scan_sequential
from ssm_course.conv import ssm_kernel_diag
from ssm_course.selective import selective_scan, selective_scan_ref
from ssm_course.ssd import ssd, ssd_ref
from ssm_course.checks import resolve_backend

pytest.importorskip("triton")


def rel(x, ref): return ((x.to(ref.dtype) - ref).abs().max() / (ref.abs().max() + 1e-30)).item()


@pytest.mark.parametrize("L", [1, 15, 16, 17, 50])
@pytest.mark.parametrize("kind", ["real", "complex", "lti", "near_one"])
def test_scan_forward(L, kind):
    g = torch.Generator().manual_seed(L)
    if kind == "complex":
        a = torch.polar(torch.rand(2, L, generator=g), torch.randn(2, L, generator=g))
        b, h0 = torch.randn(3, 2, L, generator=g, dtype=torch.complex64), torch.randn(3, 2, generator=g, dtype=torch.complex64)
    else:
        a = torch.rand(2, 1 if kind == "lti" else L, generator=g)
        if kind == "near_one": a = 1 - 1e-5 * a
        b, h0 = torch.randn(3, 2, L, generator=g), torch.randn(3, 2, generator=g)
    ref = scan_sequential(a.to(torch.complex128 if a.is_complex() else torch.float64), b.to(torch.complex128 if b.is_complex() else torch.float64), h0.to(torch.complex128 if h0.is_complex() else torch.float64))
    h, last = scan(a, b, h0, backend="triton", return_last=True)
    assert rel(h, ref) < 1e-5 and rel(last, ref[..., -1]) < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_scan_half_precision_accumulates_in_float32(dtype, tol):
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(2, 40, generator=g).to(dtype), torch.randn(2, 40, generator=g).to(dtype)
    h = scan(a, b, backend="triton")
    assert h.dtype == dtype and rel(h, scan_sequential(a.double(), b.double())) < tol


@pytest.mark.parametrize("cplx", [False, True])
def test_scan_reverse_equals_flipped_forward(cplx):
    from ssm_course.triton_scan import _launch_scan
    g = torch.Generator().manual_seed(1)
    a = torch.polar(torch.rand(2, 37, generator=g), torch.randn(2, 37, generator=g)) if cplx else torch.rand(2, 37, generator=g)
    b = torch.randn(2, 37, generator=g, dtype=torch.complex64 if cplx else torch.float32)
    torch.testing.assert_close(_launch_scan(a, b, reverse=True), _launch_scan(a.flip(-1), b.flip(-1)).flip(-1))


@pytest.mark.parametrize("cplx", [False, True])
def test_scan_gradients(cplx):
    g = torch.Generator().manual_seed(2)
    dt = torch.complex64 if cplx else torch.float32
    a = (torch.polar(torch.rand(3, 19, generator=g), torch.randn(3, 19, generator=g)) if cplx else torch.rand(3, 19, generator=g))
    b, h0, w = torch.randn(2, 3, 19, generator=g, dtype=dt), torch.randn(2, 3, generator=g, dtype=dt), torch.randn(2, 3, 19, generator=g, dtype=dt)
    def grads(backend, up):
        xs = [x.detach().to(up(x)).requires_grad_() for x in (a, b, h0)]
        (scan(*xs, backend=backend) * w.to(up(w)).conj()).sum().real.backward()
        return [x.grad for x in xs]
    up = lambda x: torch.complex128 if x.is_complex() else torch.float64
    for ours, ref in zip(grads("triton", lambda x: x.dtype), grads("torch", up)): assert rel(ours, ref) < 1e-4


def test_dispatch(monkeypatch):
    x = torch.zeros(3)
    assert resolve_backend("auto", x) == "torch"  # CPU tensors: PyTorch, interpreter or not
    assert resolve_backend("triton", x) == "triton"  # under the interpreter
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs CUDA tensors"): resolve_backend("triton", x)
    with pytest.raises(ValueError, match="needs CUDA tensors"): scan(torch.rand(3), torch.rand(3), backend="triton")
    with pytest.raises(ValueError, match="needs CUDA tensors"): ssm_kernel_diag(torch.rand(3), torch.rand(3), torch.rand(3), 4, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"): scan(torch.rand(3), torch.rand(3), backend="cuda")


def test_unsupported_arguments_raise_instead_of_falling_back():
    with pytest.raises(ValueError, match="float32"): scan(torch.rand(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64), backend="triton")


def test_gpu_script_smoke(tmp_path):
    "bench/gpu.sh's plumbing, on tiny shapes in the Triton interpreter: every kernel check passes."
    import json, subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["bash", str(root / "bench" / "gpu.sh"), str(tmp_path), "--smoke"], check=True, capture_output=True, timeout=600, cwd=root)
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["checks"] and all(c["ok"] for c in res["checks"].values()) and (tmp_path / "gpu.md").exists()
