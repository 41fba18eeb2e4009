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


from conftest import rel


def up(x): return x.to(torch.complex128 if x.is_complex() else torch.float64)


def inputs(kind, L, g):
    "(a, b, h0) for a scan of `kind`: real, complex, lti (a time-invariant decay, shape (..., 1)), near_one, bcast (a decay shared by the batch), shared (a decay shared by consecutive rows, 3 rows: a partly empty tile)."
    if kind == "complex":
        return (torch.polar(torch.rand(2, L, generator=g), torch.randn(2, L, generator=g)),
                torch.randn(3, 2, L, generator=g, dtype=torch.complex64), torch.randn(3, 2, generator=g, dtype=torch.complex64))
    if kind == "shared":
        return torch.rand(3, 1, L, generator=g), torch.randn(3, 3, L, generator=g), torch.randn(3, 3, generator=g)
    a = torch.rand(2, 1 if kind == "lti" else L, generator=g)
    if kind == "near_one": a = 1 - 1e-5 * a
    if kind == "bcast": a = a[0]
    return a, torch.randn(3, 2, L, generator=g), torch.randn(3, 2, generator=g)


def forward_and_grads(a, b, h0, w, backend):
    xs = [x.detach().requires_grad_() for x in (a, b, h0)]
    h, last = scan(*xs, backend=backend, return_last=True)
    (h * w.conj()).sum().real.backward()
    return [h, last] + [x.grad for x in xs]


@pytest.mark.parametrize("L", [1, 16, 17, 50])
@pytest.mark.parametrize("kind", ["real", "complex", "lti", "near_one", "bcast", "shared"])
def test_scan_forward_and_backward(L, kind):
    "The forward kernel and the fused backward kernel against autograd through the float64 loop."
    g = torch.Generator().manual_seed(L)
    a, b, h0 = inputs(kind, L, g)
    w = torch.randn(b.shape, generator=g, dtype=b.dtype)
    ours = forward_and_grads(a, b, h0, w, "triton")
    xs = [up(x).requires_grad_() for x in (a, b, h0)]
    h = scan_sequential(*xs)
    (h * up(w).conj()).sum().real.backward()
    for name, o, r in zip(["h", "last", "da", "db", "dh0"], ours, [h, h[..., -1]] + [x.grad for x in xs]):
        assert rel(o, r) < 1e-6, (name, rel(o, r))
    assert [x.dtype for x in ours[2:]] == [x.dtype for x in (a, b, h0)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scan_half_precision_within_one_ulp(dtype):
    "Loaded and carried in float32, rounded once when stored: within one ulp of the float64 result rounded to `dtype`."
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(2, 40, generator=g).to(dtype), torch.randn(2, 40, generator=g).to(dtype)
    h = scan(a, b, backend="triton")
    ref = scan_sequential(a.double(), b.double()).float().to(dtype)
    ulp = torch.nextafter(ref, torch.full_like(ref, float("inf"))).float() - ref.float()
    assert h.dtype == dtype and ((h.float() - ref.float()).abs() / ulp).max() <= 1
    ah, bh = a.clone().requires_grad_(), b.clone().requires_grad_()
    scan(ah, bh, backend="triton").sum().backward()
    assert ah.grad.dtype == bh.grad.dtype == dtype


@pytest.mark.parametrize("with_h0", [False, True])
def test_backward_saves_no_copy_of_b(with_h0):
    "tests/test_scan.py's test of the same name for backend='triton': `_ScanTriton` saves through engine/scan's `_save_scan`, so the graph keeps a, h0 and h; of b only its shape and dtype."
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 20, generator=g).requires_grad_(); b = torch.randn(3, 20, generator=g).requires_grad_()
    h0 = torch.randn(3, generator=g).requires_grad_() if with_h0 else None
    h = scan(a, b, h0, backend="triton")
    assert type(h.grad_fn).__name__ == "_ScanTritonWithJvpBackward"
    saved = [t for t in h.grad_fn.saved_tensors if t is not None]
    assert not any(t is b or t.data_ptr() == b.data_ptr() for t in saved) and len(saved) == 2 + with_h0
    assert (h.grad_fn.b_shape, h.grad_fn.b_dtype) == (b.shape, b.dtype)  # what the backward still needs of b
    h.sum().backward()  # and the backward runs from what was saved
    assert b.grad.shape == b.shape and torch.isfinite(b.grad).all()


def test_time_invariant_decay_is_not_expanded():
    "A decay of shape (..., 1) reaches the kernel as one number per row with time stride 0, not as an (..., L) copy."
    from ssm_course._engine.triton_scan import _rows
    A, rs, ts, group = _rows(torch.rand(3, 1), (2, 3, 500), torch.float32)
    assert A.numel() == 6 and ts == 0 and group == 1
    A, rs, ts, group = _rows(torch.rand(500), (2, 3, 500), torch.float32)  # shared by every row: one row in memory
    assert A.untyped_storage().nbytes() == 500 * 4 and ts == 1 and group == 6
    u = torch.rand(2, 3, 500)
    A, rs, ts, group = _rows(u[:, :, None, :], (2, 3, 4, 500), torch.float32)  # an input shared by 4 consecutive rows: a view of u
    assert A.data_ptr() == u.data_ptr() and A.shape == (6, 500) and group == 4


OFFSETS = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from ssm_course.scan import scan, scan_sequential
L, stride = 20, 2**30 + 16  # row 2 starts at element 2^31 + 32: past the int32 range
base = torch.empty(2 * stride + L, dtype=torch.float16)  # 4 GiB of address space, three rows of it touched
a = base.as_strided((3, L), (stride, 1))
g = torch.Generator().manual_seed(0)
a.copy_(torch.rand(3, L, generator=g).to(torch.float16))
b = torch.randn(3, L, generator=g).to(torch.float16).requires_grad_()
ad = a.detach().requires_grad_()
h = scan(ad, b, backend="triton")
h.float().sum().backward()
ref = scan_sequential(a.double(), b.double())
err = ((h.double() - ref).abs().max() / ref.abs().max()).item()
print(err, ad.grad.isfinite().all().item())
sys.exit(0 if err < 2e-3 else 1)
"""


def test_offsets_past_int32():
    "Offsets are 64-bit: a row that starts past element 2^31 is read right (int32 offsets wrap and read elsewhere or crash, so this runs in its own process)."
    import subprocess, sys
    res = subprocess.run([sys.executable, "-c", OFFSETS], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr[-2000:])


def test_dispatch(monkeypatch):
    x = torch.zeros(3)
    assert resolve_backend("auto", x) == "torch"  # CPU tensors: PyTorch, interpreter or not
    assert resolve_backend("triton", x) == "triton"  # under the interpreter
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs CUDA tensors"): resolve_backend("triton", x)
    with pytest.raises(ValueError, match="needs CUDA tensors"): scan(torch.rand(3), torch.rand(3), backend="triton")
    with pytest.raises(ValueError, match="needs CUDA tensors"): ssm_kernel_diag(torch.rand(3), torch.rand(3), torch.rand(3), 4, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"): scan(torch.rand(3), torch.rand(3), backend="cuda")


def test_scan_triton_refuses_cpu_tensors_without_the_interpreter_and_mixed_devices(monkeypatch):
    from ssm_course.triton_scan import scan_triton
    with pytest.raises(ValueError, match="h0 is on meta"): scan_triton(torch.rand(2, 3), torch.rand(2, 3), torch.zeros(2, device="meta"))
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs CUDA tensors"): scan_triton(torch.rand(3), torch.rand(3))


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
    assert all(c["precision"] == "float32" and c["tol"] == c["growth"] * 2.0 ** -23 for n, c in res["checks"].items() if n.startswith("scan"))
    n = 2 * 3 * 64  # the smoke shape: the scan rows record the model's bytes, forward and backward separately
    assert {r["op"]: r["bytes"] for r in res["timings"] if r["impl"] == "ssm_course (triton)" and r["op"].startswith("scan")} == {"scan fwd": 12 * n, "scan bwd": 20 * n, "scan fwd+bwd": 32 * n}
    assert res["train"]["ok"] and res["kernels"] == []  # trained a few steps; under the interpreter no compiled kernels are loaded
    assert res["skipped"] == [] and (tmp_path / "train.log").exists() and "fastcore" in res["versions"]["packages"]


def test_gpu_image_imports():
    "bench/gpu.py runs on a GPU image with torch, Triton, numpy and pytest only: the modules it imports need nothing else (fastcore and fastprogress, for training and mambapy's case, come as wheels: bench/gpu.sh --wheels)."
    import subprocess, sys
    code = ("import sys\nfor m in ['fastcore', 'fastprogress', 'scipy', 'matplotlib', 'IPython', 'pandas', 'sklearn', 'hypothesis']: sys.modules[m] = None\n"
            "import ssm_course.scan, ssm_course.triton_scan, ssm_course.gpu_report, ssm_course.triton_ssm, ssm_course.conv, ssm_course.selective, ssm_course.ssd\n"
            "print(len(ssm_course.gpu_report.perf_model(issue=False)))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and int(res.stdout.split()[-1]) > 0, res.stderr[-2000:]


# ---- issue 25 items 5, 18, 22 and 23: autocast, torch.func, integer inputs, second derivatives ---------------------------------------
def test_scan_integer_inputs_promoted():
    "Item 22: integer inputs are promoted to the default float, as on the PyTorch path (they raised an InterpreterError about fp_downcast_rounding)."
    h = scan(torch.full((2, 5), 2), torch.ones(2, 5, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), backend="triton")
    assert h.dtype == torch.get_default_dtype() and h.tolist() == [[1.0, 3.0, 7.0, 15.0, 31.0]] * 2
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(3, 17, generator=g), torch.randint(-5, 5, (3, 17), generator=g)
    assert rel(scan(a, b, backend="triton"), scan_sequential(a.double(), b.double())) < 1e-6
    with pytest.raises(TypeError, match=r"\bb must be a real or complex"): scan(a, b.bool(), backend="triton")


def hvp(f, xs, w, v):
    "Gradients of sum(f(xs) conj(w)) with create_graph=True, then the gradients of their products with v: second derivatives."
    gs = torch.autograd.grad((f(*xs) * w.conj()).real.sum(), xs, create_graph=True)
    assert all(g.requires_grad for g in gs), "the gradient was detached"
    return torch.autograd.grad(sum((g * u.conj()).real.sum() for g, u in zip(gs, v)), xs)


@pytest.mark.parametrize("kind", ["real", "complex", "lti", "bcast"])
def test_scan_double_backward(kind, monkeypatch):
    "Item 23: with create_graph=True the gradient stays attached and second derivatives equal the float64 loop's (they were silently detached). gradgradcheck needs float64, which the Triton scan refuses: compared instead."
    g = torch.Generator().manual_seed(1)
    a, b, h0 = inputs(kind, 19, g)
    w, v = torch.randn(b.shape, generator=g, dtype=b.dtype), [torch.randn(x.shape, generator=g, dtype=x.dtype) for x in (a, b, h0)]
    ours = hvp(lambda *x: scan(*x, backend="triton"), [x.clone().requires_grad_() for x in (a, b, h0)], w, v)
    ref = hvp(scan_sequential, [up(x).requires_grad_() for x in (a, b, h0)], up(w), [up(u) for u in v])
    for name, o, r in zip("a b h0".split(), ours, ref): assert rel(o, r) < 1e-6, (name, rel(o, r))
    import ssm_course.triton_scan as TS
    calls, bwd = [], TS._scan_bwd
    monkeypatch.setattr(TS, "_scan_bwd", lambda *args: (calls.append(1), bwd(*args))[1])
    x = [t.clone().requires_grad_() for t in (a, b, h0)]  # without create_graph: the fused backward kernel, as before
    (scan(*x, backend="triton") * w.conj()).real.sum().backward()
    assert calls == [1] and not x[0].grad.requires_grad
    x = [t.clone().requires_grad_() for t in (a, b, h0)]
    gs = torch.autograd.grad((scan(*x, backend="triton") * w.conj()).real.sum(), x, create_graph=True)
    assert calls == [1] and all(g.requires_grad for g in gs)  # with create_graph: differentiable operations instead of the kernel


def test_scan_autocast_is_ignored():
    "Item 5: under torch.autocast('cpu', bfloat16) the Triton scan's forward and gradients are bit-identical to those without autocast."
    g = torch.Generator().manual_seed(2)
    xs = [x.requires_grad_() for x in inputs("real", 21, g)]
    w = torch.randn(xs[1].shape, generator=g)
    def run():
        h = scan(*xs, backend="triton")
        return [h] + list(torch.autograd.grad((h * w).sum(), xs))
    plain = run()
    with torch.autocast("cpu", torch.bfloat16): auto = run()
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(auto, plain))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.func.jvp imports its decompositions
def test_scan_torch_func():
    "Item 18: vmap, grad, jvp and vmap of grad of the Triton scan equal the same transforms of the float64 loop."
    from torch.func import vmap, grad, jvp
    g = torch.Generator().manual_seed(3)
    a, b, h0 = torch.rand(2, 3, 9, generator=g), torch.randn(2, 3, 9, generator=g), torch.randn(2, 3, generator=g)
    loss = lambda s: (lambda *x: (s(*x) ** 2).sum())
    cases = {"vmap": lambda s, *x: vmap(s)(*x), "vmap h0 only": lambda s, a, b, h0: vmap(s, in_dims=(None, None, 0))(a[0], b[0], h0),
             "grad": lambda s, *x: grad(loss(s), argnums=(0, 1, 2))(*x), "jvp": lambda s, a, b, h0: jvp(s, (a, b, h0), (b, a, h0))[1],
             "vmap of grad": lambda s, a, b, h0: vmap(grad(loss(s), argnums=(0, 1)))(a, b)}
    for name, f in cases.items():
        got, ref = f(lambda *x: scan(*x, backend="triton"), a, b, h0), f(scan_sequential, up(a), up(b), up(h0))
        for o, r in zip(*((got, ref) if isinstance(got, tuple) else ((got,), (ref,)))): assert rel(o, r) < 1e-6, (name, rel(o, r))


# ---- issue 26: the engine (nbs/engine/triton_scan.ipynb) runs lesson 10's plain launch, bit for bit ------------------------------------
@pytest.mark.parametrize("kind", ["real", "complex", "lti", "bcast", "shared", "float16", "bfloat16"])
@pytest.mark.parametrize("L", [1, 16, 37])
def test_scan_triton_is_the_lessons_plain_launch(kind, L):
    "At the same tile, scan_triton (strides, row groups, dtype policy, autograd) equals lesson 10's scan_triton_ref on the broadcast inputs copied to one contiguous shape, bit for bit; its fused backward equals scan_triton_backward_ref bit for bit where every input has the full shape, and summed over the broadcast axes to float32 rounding elsewhere (to the input's rounding in half precision)."
    from ssm_course.triton_scan import scan_triton, scan_triton_ref, scan_triton_backward_ref
    from ssm_course._engine.triton_scan import _config
    g = torch.Generator().manual_seed(L)
    a, b, h0 = inputs("real" if kind in ("float16", "bfloat16") else kind, L, g)
    if kind in ("float16", "bfloat16"): a, b, h0 = (x.to(getattr(torch, kind)) for x in (a, b, h0))
    shape = torch.broadcast_shapes(a.shape, b.shape)
    A, B, H0 = a.expand(shape).contiguous(), b.expand(shape).contiguous(), h0.expand(shape[:-1]).contiguous()
    rows, block, warps, _ = _config(L)
    h = scan_triton_ref(A, B, H0, rows, block, num_warps=warps)
    gh = torch.randn(shape, generator=g, dtype=torch.complex64 if b.is_complex() else torch.float32).to(b.dtype)
    xs = [x.clone().requires_grad_() for x in (a, b, h0)]
    ours = scan_triton(*xs)
    assert ours.dtype == h.dtype and torch.equal(ours, h)
    grads = torch.autograd.grad(ours, xs, gh)
    for x, o, r in zip(xs, grads, scan_triton_backward_ref(A, H0, h, gh, rows, block, num_warps=warps)):
        if x.shape == r.shape: assert torch.equal(o, r)
        else:  # the plain gradient is rounded to the input's dtype per element before this sum: half precision differs by its rounding
            tol = 2 * torch.finfo(x.dtype).eps if x.dtype in (torch.float16, torch.bfloat16) else 1e-6
            assert rel(o, r.to(torch.complex64 if r.is_complex() else torch.float32).sum_to_size(x.shape)) < tol


def test_triton_engine_does_not_import_the_public_module():
    "ssm_course._engine.triton_scan (launch plumbing, nbs/engine/triton_scan.ipynb) is imported by ssm_course.triton_scan, so it must not import it at import time; CONFIG, which bench/gpu.py tunes through ssm_course.triton_scan, is the engine's dict."
    import subprocess, sys
    code = ("import os, sys\nos.environ['TRITON_INTERPRET'] = '1'\nimport ssm_course._engine.triton_scan as E\n"
            "assert 'ssm_course.triton_scan' not in sys.modules, 'the engine imported the public module'\n"
            "import ssm_course.triton_scan as T\nassert T.CONFIG is E.CONFIG and 'CONFIG' in T.__all__ and T._scan_dtype is E._scan_dtype\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


# ---- issue 29 item 7: the peers bench/gpu.py times, called as it calls them, on tiny shapes in the interpreter ------------------------
def _bench_peers():
    "bench/peers.py, imported from its path (bench/ is not a package)."
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("bench_peers", Path(__file__).resolve().parents[1] / "bench" / "peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try: mod.mamba_ssm()
    except ImportError as e: pytest.skip(str(e))  # a reader's make test: mamba-ssm is no dependency of the course
    import mamba_ssm.ops.triton.ssd_combined, mamba_ssm.ops.triton.selective_state_update
    assert mod.pin_autotune("mamba_ssm") >= 0  # first configs only: the interpreter cannot benchmark several
    return mod


def test_mamba_ssm_ssd_call_path():
    """mamba-ssm's mamba_chunk_scan_combined, as bench/gpu.py calls it on ssd's arguments (chunk 16, three chunks), agrees
    with the float64 chunked PyTorch ssd, forward and every gradient (observed 1.3e-7 and <= 2.4e-7 relative)."""
    peers = _bench_peers()
    g = torch.Generator().manual_seed(0)
    b, l, h, p, n = 1, 48, 2, 4, 4
    x, B, C = torch.randn(b, l, h, p, generator=g), torch.randn(b, l, 1, n, generator=g), torch.randn(b, l, 1, n, generator=g)
    dt, A = F.softplus(torch.randn(b, l, h, generator=g) - 2), -torch.exp(torch.randn(h, generator=g))
    gy = torch.randn(b, l, h, p, generator=g)
    xs = [t.clone().requires_grad_() for t in (x, dt, A, B, C)]
    xd = [t.double().requires_grad_() for t in (x, dt, A, B, C)]
    y, yd = peers.mamba_ssd(*xs, chunk_size=16), ssd(*xd, chunk_size=16, backend="torch")
    assert y.shape == yd.shape and rel(y, yd) < 1e-6
    for got, want in zip(torch.autograd.grad(y, xs, gy), torch.autograd.grad(yd, xd, gy.double())): assert rel(got, want) < 1e-6


def test_mamba_ssm_step_call_path():
    """mamba-ssm's selective_state_update, as bench/gpu.py calls it: the state (b, d, n) updated in place to
    exp(dt A) h + dt x B and y = C . h + D x, against the float64 closed form (observed 6.3e-8 relative)."""
    peers = _bench_peers()
    g = torch.Generator().manual_seed(1)
    b, d, n = 2, 4, 8
    h0, x, D = torch.randn(b, d, n, generator=g), torch.randn(b, d, generator=g), torch.randn(d, generator=g)
    dt, A, B, C = 0.1 * torch.rand(b, d, generator=g), -torch.exp(torch.randn(d, n, generator=g)), torch.randn(b, n, generator=g), torch.randn(b, n, generator=g)
    h = h0.clone()
    y = peers.mamba_step(h, x, dt, A, B, C, D)
    hd = torch.exp(dt.double()[..., None] * A.double()) * h0.double() + (dt.double() * x.double())[..., None] * B.double()[:, None]
    assert rel(h, hd) < 5e-7 and rel(y, (hd * C.double()[:, None]).sum(-1) + D.double() * x.double()) < 5e-7


# ---- issue 29 item 8: few long rows, split into chunks ------------------------------------------------------------------------------
def test_chunks_per_row():
    "At the GPU configuration: the benchmark's 12,288 rows stay a program each; 16 rows of 2^20 steps become 16 x 32 programs of 32,768 steps, one row 128 of 8,192 (the shortest chunk: 4 blocks); a length with no factor 2 is not split."
    from ssm_course._engine.triton_scan import _chunks, CONFIG
    assert CONFIG["BLOCK"] == 2048 and CONFIG["CHUNK_PROGRAMS"] == 264
    assert _chunks(8 * 1536, 4096) == 1 and _chunks(16, 1 << 20) == 32 and _chunks(1, 1 << 20) == 128 and _chunks(16, (1 << 20) + 1) == 1
    assert _chunks(16, 16384) == 2 and _chunks(16, 8192) == 1  # chunks of at least 4 blocks (8192 steps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.bfloat16])
def test_few_long_rows_chunk_parallel(monkeypatch, dtype):
    """Few long rows take the chunk-parallel path (chunks scanned from zero, a scan of the chunk ends, each chunk again
    from its incoming state; the backward through notebook 07's formulas with that path reversed): forward and every
    gradient against the float64 loop, with an initial state, at BLOCK 16 (so 2 rows of 512 steps become 16 chunks of 64)."""
    from ssm_course._engine import triton_scan as eng
    from ssm_course import triton_scan as ts
    monkeypatch.setitem(eng.CONFIG, "BLOCK", 16)
    assert eng._chunks(2, 512) == 8
    calls, original = [], ts._scan_fwd_chunks
    monkeypatch.setattr(ts, "_scan_fwd_chunks", lambda *a: calls.append(a[-1]) or original(*a))
    g = torch.Generator().manual_seed(0)
    if dtype.is_complex:
        a = (0.95 + 0.05 * torch.rand(2, 512, generator=g)) * torch.exp(0.3j * torch.randn(2, 512, generator=g))
        b, h0, w = (torch.randn(*s, generator=g, dtype=torch.complex128) for s in ((2, 512), (2,), (2, 512)))
    else:
        a, b, h0, w = 0.9 + 0.1 * torch.rand(2, 512, generator=g, dtype=torch.float64), torch.randn(2, 512, generator=g, dtype=torch.float64), torch.randn(2, generator=g, dtype=torch.float64), torch.randn(2, 512, generator=g, dtype=torch.float64)
    low = [x.to(dtype).detach().requires_grad_() for x in (a, b, h0)]
    ref = [x.to(dtype).to(a.dtype).detach().requires_grad_() for x in (a, b, h0)]  # the same values in float64
    h, hd = scan(*low, backend="triton"), scan_sequential(*ref)
    (h.to(hd.dtype) * w.conj()).sum().real.backward(); (hd * w.conj()).sum().real.backward()
    assert calls and calls[0] == 8  # forward and the backward's reverse scan took the chunk path
    # observed: float32 <= 2.3e-7, complex64 <= 4.2e-7 (h and gradients); bfloat16 2.5e-3 (h) and 3.8e-3 (gradients): one rounding to bfloat16
    tol_h, tol_grad = (2 ** -8, 2 ** -7) if dtype == torch.bfloat16 else (1e-6, 1e-6)
    assert rel(h, hd) < tol_h and h.dtype == dtype
    for x, r in zip(low, ref): assert rel(x.grad, r.grad) < tol_grad
