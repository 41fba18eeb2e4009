"""The contracts of API.md that hold for every public function, as hypothesis properties over the public API:

1. inputs are never modified, whatever their shape or strides (forward and backward);
2. finite, stable input gives finite output;
3. a causal layer's output at t depends only on inputs up to t, also with NaN or huge values later;
4. `backend="torch"` and `backend="triton"` agree (Triton's CPU interpreter, tiny shapes).

Each property draws shapes (odd lengths included), strides (contiguous, transposed, sliced, broadcast),
real and complex dtypes and every chunk size, with a fixed seed so that CI is repeatable."""
import os
os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (the dispatchers import it lazily)
import importlib.util, math
import pytest, torch
from hypothesis import given, settings, strategies as st, HealthCheck
from ssm_course.scan import scan, scan_chunked, scan_parallel, scan_sequential
from ssm_course.selective import selective_scan, selective_scan_ref
from ssm_course.ssd import ssd, ssd_ref, ssd_quadratic
from ssm_course.conv import causal_conv, ssm_kernel, ssm_kernel_diag, ssm_kernel_dplr, ssm_recurrence, dss_kernel
from ssm_course.discretize import discretize, discretize_diag
from ssm_course.ssm import matrix_exp
from ssm_course import layers

prop = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
seeds = st.integers(0, 2**31 - 1)
LAYOUTS = ("contiguous", "transposed", "sliced", "broadcast")


def make(shape, g, dtype=torch.float64, layout="contiguous", fill=None):
    "A tensor of `shape` with values from `g`, laid out as `layout` ('broadcast' draws one row and expands it: stride 0)."
    base = fill(shape, g) if fill else torch.randn(shape, generator=g, dtype=dtype)
    base = base.to(dtype)
    if layout == "transposed" and len(shape) >= 2:
        return base.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, column-major strides
    if layout == "sliced":
        big = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype) if shape else torch.zeros(2, dtype=dtype)
        if not shape: return base
        big[..., ::2] = base
        return big[..., ::2]  # stride 2 along the last axis
    if layout == "broadcast" and len(shape) >= 1 and shape[0] > 1:
        return base[:1].expand(shape)  # stride 0 along the first axis: an in-place write would hit every row
    return base


def snapshot(xs):
    "Copies of every tensor in `xs` with its strides, to compare bit for bit afterwards."
    return [(x, x.clone(), x.stride()) if isinstance(x, torch.Tensor) else (x, None, None) for x in xs]


def assert_unchanged(snap, what):
    for i, (x, copy, stride) in enumerate(snap):
        if copy is None: continue
        assert x.stride() == stride, f"{what}: argument {i} changed strides"
        x, copy = x.detach(), copy.detach()
        if x.is_complex(): x, copy = torch.view_as_real(x.resolve_conj()), torch.view_as_real(copy.resolve_conj())
        same = (x == copy) | (x.isnan() & copy.isnan()) if x.is_floating_point() else x == copy
        assert bool(same.all()), f"{what}: argument {i} was modified in place"


def check_call(fn, args, what, grad=True):
    """Run `fn(*args)` (and its backward, through non-leaf inputs) and assert no input changed and the output is finite.
    Returns the output (the first one when `fn` returns a tuple)."""
    snap = snapshot(args)
    if grad:
        leaves = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()) else a for a in args]
        nonleaf = [a * 1 if isinstance(a, torch.Tensor) and a.requires_grad else a for a in leaves]  # non-leaf views, as a model would pass
        snap_nl = snapshot(nonleaf)
        out = fn(*nonleaf)
        y = out[0] if isinstance(out, tuple) else out
        (y.real.sum() + (y.imag.sum() if y.is_complex() else 0)).backward()
        assert_unchanged(snap_nl, what + " (non-leaf inputs, after backward)")
        for a in leaves:
            if isinstance(a, torch.Tensor) and a.requires_grad and a.grad is not None:
                assert torch.isfinite(torch.view_as_real(a.grad) if a.grad.is_complex() else a.grad).all(), f"{what}: non-finite gradient"
    out = fn(*args)
    assert_unchanged(snap, what)
    y = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(torch.view_as_real(y) if y.is_complex() else y).all(), f"{what}: non-finite output for finite stable input"
    return y


# ---------------------------------------------------------------- 1 + 2: inputs unchanged, outputs finite

@prop
@given(R=st.integers(1, 4), L=st.integers(1, 40), chunk=st.integers(1, 41), complex_=st.booleans(), lti=st.booleans(),
       h0=st.booleans(), la=st.sampled_from(LAYOUTS), lb=st.sampled_from(LAYOUTS), seed=seeds)
def test_scan_family_leaves_inputs_alone(R, L, chunk, complex_, lti, h0, la, lb, seed):
    "Every scan, every chunk size, odd shapes such as (1, 12) and (3, 6) included: inputs bit-identical, output finite."
    g = torch.Generator().manual_seed(seed)
    dt = torch.complex128 if complex_ else torch.float64
    unit = lambda s, g: torch.polar(torch.rand(s, generator=g, dtype=torch.float64), torch.randn(s, generator=g, dtype=torch.float64)) if complex_ else torch.rand(s, generator=g, dtype=torch.float64)
    a = make((R, 1 if lti else L), g, dt, la, fill=unit)
    b = make((R, L), g, dt, lb)
    h = make((R,), g, dt) if h0 else None
    ref = scan_sequential(a, b, h)
    for name, fn in [("scan_sequential", scan_sequential), ("scan_parallel", scan_parallel),
                     ("scan_chunked", lambda a, b, h: scan_chunked(a, b, h, chunk=chunk)), ("scan", scan)]:
        y = check_call(fn, [a, b, h], f"{name}(R={R}, L={L}, chunk={chunk})", grad=name == "scan")
        torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-9)


def test_scan_aliasing():
    "The repros of the in-place bug: shape (1, 12), scan(x, x), and the gradient through non-leaf inputs."
    a = torch.rand(1, 12); a0 = a.clone(); b = torch.rand(1, 12); b0 = b.clone()
    scan(a, b)
    assert torch.equal(a, a0) and torch.equal(b, b0)
    x = torch.full((1, 12), 0.5, dtype=torch.float64)
    torch.testing.assert_close(scan(x, x), scan_sequential(x, x))
    w = torch.full((3, 6), 0.5, dtype=torch.float64, requires_grad=True)
    scan(w * 1, w * 1).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    scan_sequential(w2, w2).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)


@prop
@given(b=st.integers(1, 2), d=st.integers(1, 3), n=st.integers(1, 4), l=st.integers(1, 20), lay=st.sampled_from(["dn", "bnl", "bgnl"]),
       layC=st.sampled_from(["dn", "bnl", "bgnl"]), extras=st.booleans(), chunk=st.integers(1, 21), layout=st.sampled_from(LAYOUTS), seed=seeds)
def test_selective_leaves_inputs_alone(b, d, n, l, lay, layC, extras, chunk, layout, seed):
    g = torch.Generator().manual_seed(seed)
    shape = lambda k: {"dn": (d, n), "bnl": (b, n, l), "bgnl": (b, 1, n, l)}[k]
    u, delta = make((b, d, l), g, layout=layout), make((b, d, l), g, layout=layout, fill=lambda s, g: torch.rand(s, generator=g, dtype=torch.float64))
    A = -make((d, n), g, fill=lambda s, g: torch.rand(s, generator=g, dtype=torch.float64) + 0.1)
    B, C = make(shape(lay), g, layout=layout), make(shape(layC), g)
    D, z, bias, x0 = (make((d,), g), make((b, d, l), g), make((d,), g), make((b, d, n), g)) if extras else (None,) * 4
    args = [u, delta, A, B, C, D, z, bias]
    ref = selective_scan_ref(*args, delta_softplus=extras, initial_state=x0)
    y = check_call(lambda *a: selective_scan(*a[:8], delta_softplus=extras, initial_state=a[8], chunk=chunk), args + [x0], "selective_scan")
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-9)
    check_call(lambda *a: selective_scan_ref(*a[:8], delta_softplus=extras, initial_state=a[8]), args + [x0], "selective_scan_ref", grad=False)


@prop
@given(b=st.integers(1, 2), l=st.integers(1, 20), h=st.sampled_from([1, 2, 4]), p=st.integers(1, 3), n=st.integers(1, 3),
       groups=st.sampled_from([1, 2]), chunk=st.integers(1, 21), extras=st.booleans(), layout=st.sampled_from(LAYOUTS), seed=seeds)
def test_ssd_family_leaves_inputs_alone(b, l, h, p, n, groups, chunk, extras, layout, seed):
    g = torch.Generator().manual_seed(seed)
    gr = groups if h % groups == 0 else 1
    x = make((b, l, h, p), g, layout=layout)
    dt = make((b, l, h), g, layout=layout, fill=lambda s, g: torch.rand(s, generator=g, dtype=torch.float64) + 0.05)
    A = -make((h,), g, fill=lambda s, g: torch.rand(s, generator=g, dtype=torch.float64) + 0.1)
    B, C = make((b, l, gr, n), g, layout=layout), make((b, l, gr, n), g)
    D, s0 = (make((h,), g), make((b, h, p, n), g)) if extras else (None, None)
    ref = ssd_ref(x, dt, A, B, C, D=D, initial_states=s0)
    for name, fn, grad in [("ssd", lambda *a: ssd(*a[:5], chunk_size=chunk, D=a[5], initial_states=a[6]), True),
                           ("ssd_ref", lambda *a: ssd_ref(*a[:5], D=a[5], initial_states=a[6]), False),
                           ("ssd_quadratic", lambda *a: ssd_quadratic(*a[:5], D=a[5], initial_states=a[6]), True)]:
        if name == "ssd_quadratic" and s0 is not None: continue
        y = check_call(fn, [x, dt, A, B, C, D, s0], name, grad=grad)
        torch.testing.assert_close(y, ref, rtol=1e-8, atol=1e-8)


@prop
@given(batch=st.integers(1, 3), H=st.integers(1, 3), L=st.integers(1, 50), LK=st.integers(1, 60), complex_=st.booleans(),
       layout=st.sampled_from(LAYOUTS), seed=seeds)
def test_causal_conv_leaves_inputs_alone(batch, H, L, LK, complex_, layout, seed):
    g = torch.Generator().manual_seed(seed)
    dt = torch.complex128 if complex_ else torch.float64
    u, K = make((batch, H, L), g, dt, layout), make((H, LK), g, dt, layout)
    y = check_call(causal_conv, [u, K], "causal_conv")
    ref = torch.stack([sum(K[..., s] * u[..., t - s] for s in range(min(t + 1, LK))) for t in range(L)], -1)  # the direct sum
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-9)


@prop
@given(H=st.integers(1, 3), N=st.integers(1, 6), L=st.integers(1, 70), block=st.one_of(st.none(), st.integers(1, 71)),
       complex_=st.booleans(), layout=st.sampled_from(LAYOUTS), seed=seeds)
def test_kernels_leave_inputs_alone(H, N, L, block, complex_, layout, seed):
    g = torch.Generator().manual_seed(seed)
    dt = torch.complex128 if complex_ else torch.float64
    unit = lambda s, g: (torch.polar(torch.rand(s, generator=g, dtype=torch.float64), torch.randn(s, generator=g, dtype=torch.float64)) if complex_
                         else torch.rand(s, generator=g, dtype=torch.float64) * 2 - 1)
    dA, dB, C = make((H, N), g, dt, layout, fill=unit), make((H, N), g, dt, layout), make((H, N), g, dt)
    K = check_call(lambda *a: ssm_kernel_diag(*a, L, block=block), [dA, dB, C], "ssm_kernel_diag")
    powers = dA[..., None] ** torch.arange(L, dtype=torch.float64)
    torch.testing.assert_close(K, (C * dB).unsqueeze(-1).mul(powers).sum(-2), rtol=1e-9, atol=1e-9)
    Ad = torch.diag_embed(dA)
    check_call(lambda *a: ssm_kernel(*a, L), [Ad, dB, C], "ssm_kernel")
    u = make((2, H, min(L, 12)), g, dt, layout)
    check_call(ssm_recurrence, [Ad, dB, C, u], "ssm_recurrence", grad=False)


@prop
@given(N=st.integers(1, 6), measure=st.sampled_from(["legs", "legt", "lagt", "fout"]), L=st.integers(1, 40),
       method=st.sampled_from(["zoh", "bilinear", "euler", "backward_euler"]), layout=st.sampled_from(LAYOUTS[:3]), seed=seeds)
def test_continuous_ops_leave_inputs_alone(N, measure, L, method, layout, seed):
    from ssm_course.hippo import hippo, dplr
    g = torch.Generator().manual_seed(seed)
    A, B = hippo(measure, N)
    A, B = make(A.shape, g, layout=layout, fill=lambda s, g: A), make(B.shape, g, layout=layout, fill=lambda s, g: B)
    check_call(lambda A, B: discretize(A, B, 0.1, method), [A, B], f"discretize({method})", grad=False)
    check_call(matrix_exp, [0.1 * A], "matrix_exp", grad=False)
    Lam = make((N,), g, torch.complex128, layout, fill=lambda s, g: torch.complex(-torch.rand(s, generator=g, dtype=torch.float64) - 0.1, torch.randn(s, generator=g, dtype=torch.float64)))
    check_call(lambda Lam, B: discretize_diag(Lam, B, 0.1, method)[0], [Lam, B.to(torch.complex128)], f"discretize_diag({method})")
    check_call(lambda Lam, W: dss_kernel(Lam, W, 0.1, L), [Lam, Lam.conj()], "dss_kernel")
    Lam, P, Bd, _ = dplr(measure, N)  # every measure: LegT/LagT at odd N and FouT put an eigenvalue on a pole of the Cauchy kernel
    C = make((N,), g, torch.complex128)
    check_call(lambda *a: ssm_kernel_dplr(*a, 0.1, L), [Lam, P, Bd, C], "ssm_kernel_dplr")


LAYER_CASES = [("S4D", dict(d_state=8)), ("S4D", dict(d_state=8, init="real")), ("S4", dict(d_state=8)), ("DSS", dict(d_state=8)),
               ("LRU", dict(d_state=8)), ("Mamba", dict(d_state=4, expand=1)), ("Mamba", dict(d_state=4, expand=2, d_conv=2))]
LAYER_IDS = [f"{n}-{i}" for i, (n, _) in enumerate(LAYER_CASES)]


def build(name, kw, H=3, seed=0):
    torch.manual_seed(seed)
    return getattr(layers, name)(H, **kw).double()


@pytest.mark.parametrize("name,kw", LAYER_CASES, ids=LAYER_IDS)
@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(b=st.integers(1, 2), L=st.integers(1, 25), layout=st.sampled_from(LAYOUTS), seed=seeds)
def test_layers_leave_inputs_and_parameters_alone(name, kw, b, L, layout, seed):
    "forward with and without a state, and step: the input, the state and the parameters are untouched."
    m = build(name, kw)
    params = {k: v.detach().clone() for k, v in m.state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    x = make((b, L, 3), g, layout=layout)
    check_call(m, [x], f"{name}.forward")
    _, state = m(x, return_state=True)
    snap = snapshot([x] + (list(state) if isinstance(state, (tuple, list)) else [state]))
    m(x, state)
    m.step(x[:, 0], state)
    assert_unchanged(snap, f"{name}: forward(x, state) / step")
    for k, v in m.state_dict().items(): assert torch.equal(v, params[k]), f"{name}: parameter {k} changed by a forward pass"


# ---------------------------------------------------------------- 3: causality of every layer

def _prefix_close(y, ref, what, rtol):
    assert torch.isfinite(y).all(), f"{what}: a later input made an earlier output non-finite"
    err = ((y - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
    assert err <= rtol, f"{what}: earlier outputs moved by {err:.2e} (relative) because of a later input"


@pytest.mark.parametrize("name,kw", LAYER_CASES, ids=LAYER_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(L=st.integers(2, 70), frac=st.floats(0.05, 0.95), seed=seeds)
def test_layers_are_causal(name, kw, dtype, L, frac, seed):
    "A NaN, an inf or a 1e6 at step t0 leaves every output before t0 as it was (up to rounding of the clean run)."
    torch.manual_seed(0)
    m = getattr(layers, name)(3, **kw).to(dtype)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, L, 3, generator=g, dtype=torch.float64).to(dtype)
    t0 = max(1, min(L - 1, int(frac * L)))
    with torch.no_grad():
        clean = m(x[:, :t0])  # the prefix alone: what a causal layer must reproduce
        rtol = 1e-5 if dtype == torch.float32 else 1e-11
        for bad in (float("nan"), float("inf"), 1e6):
            xb = x.clone(); xb[:, t0] = bad
            _prefix_close(m(xb)[:, :t0], clean, f"{name} ({dtype}) with {bad} at t0={t0} of L={L}", rtol)
            xb = x.clone(); xb[:, -1] = bad
            _prefix_close(m(xb)[:, :t0], clean, f"{name} ({dtype}) with {bad} at the last step", rtol)


def test_sequence_model_is_causal():
    torch.manual_seed(0)
    m = layers.SequenceModel(5, d_model=8, n_layers=2, layer="s4d", d_input=3, pool=None).double()
    x = torch.randn(2, 40, 3, dtype=torch.float64)
    with torch.no_grad():
        clean = m(x[:, :25])
        xb = x.clone(); xb[:, 25:] = float("nan")
        _prefix_close(m(xb)[:, :25], clean, "SequenceModel(s4d)", 1e-11)


# ---------------------------------------------------------------- 4: torch == triton (interpreter, tiny shapes)

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (pip install 'ssm_course[gpu]')")
tiny = settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def both(fn, args):
    "Outputs and input gradients of `fn(*args, backend=...)` for both backends."
    res = []
    for backend in ("torch", "triton"):
        xs = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        y = fn(*xs, backend=backend)
        y = y[0] if isinstance(y, tuple) else y
        gy = torch.linspace(-1, 1, y.numel(), dtype=y.real.dtype).reshape(y.shape).to(y.dtype)
        grads = torch.autograd.grad((y * gy).real.sum(), [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad], allow_unused=True)
        res.append((y.detach(), grads))
    return res


def agree(res, rtol, what):
    (y0, g0), (y1, g1) = res
    torch.testing.assert_close(y1, y0, rtol=rtol, atol=rtol * float(y0.abs().max().clamp(min=1)), msg=lambda m: f"{what} forward: {m}")
    for i, (a, b) in enumerate(zip(g0, g1)):
        if a is None or b is None: assert a is None and b is None, f"{what}: gradient {i} missing on one backend"; continue
        torch.testing.assert_close(b, a, rtol=rtol, atol=rtol * float(a.abs().max().clamp(min=1)), msg=lambda m: f"{what} gradient {i}: {m}")


@needs_triton
@tiny
@given(R=st.integers(1, 3), L=st.integers(1, 33), lti=st.booleans(), h0=st.booleans(), seed=seeds)
def test_scan_backends_agree(R, L, lti, h0, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.rand(R, 1 if lti else L, generator=g), torch.randn(R, L, generator=g)
    args = [a, b, torch.randn(R, generator=g) if h0 else None]
    agree(both(lambda a, b, h, backend: scan(a, b, h, backend=backend), args), 1e-5, f"scan R={R} L={L}")


@needs_triton
@tiny
@given(d=st.integers(1, 3), n=st.integers(1, 4), l=st.integers(1, 20), lay=st.sampled_from(["dn", "bnl", "bgnl"]), extras=st.booleans(), seed=seeds)
def test_selective_backends_agree(d, n, l, lay, extras, seed):
    g = torch.Generator().manual_seed(seed)
    b = 2
    shape = {"dn": (d, n), "bnl": (b, n, l), "bgnl": (b, 1, n, l)}[lay]
    args = [torch.randn(b, d, l, generator=g), torch.rand(b, d, l, generator=g), -torch.rand(d, n, generator=g) - 0.1,
            torch.randn(shape, generator=g), torch.randn((b, n, l) if lay != "bnl" else (d, n), generator=g)]
    kw = dict(D=torch.randn(d, generator=g), z=torch.randn(b, d, l, generator=g), delta_softplus=True) if extras else {}
    agree(both(lambda *a, backend: selective_scan(*a, backend=backend, **kw), args), 1e-5, f"selective_scan d={d} n={n} l={l} {lay}")


@needs_triton
@tiny
@given(l=st.integers(1, 20), h=st.sampled_from([1, 2]), p=st.sampled_from([1, 4]), n=st.sampled_from([2, 4]), seed=seeds)
def test_ssd_backends_agree(l, h, p, n, seed):
    g = torch.Generator().manual_seed(seed)
    args = [torch.randn(1, l, h, p, generator=g), torch.rand(1, l, h, generator=g) + 0.05, -torch.rand(h, generator=g) - 0.1,
            torch.randn(1, l, 1, n, generator=g), torch.randn(1, l, 1, n, generator=g)]
    agree(both(lambda *a, backend: ssd(*a, chunk_size=8, backend=backend), args), 1e-4, f"ssd l={l} h={h} p={p} n={n}")


@needs_triton
@tiny
@given(N=st.integers(1, 5), L=st.integers(1, 40), seed=seeds)
def test_kernel_diag_backends_agree(N, L, seed):
    g = torch.Generator().manual_seed(seed)
    dA = torch.polar(torch.rand(2, N, generator=g) * 0.5 + 0.5, torch.randn(2, N, generator=g))
    dB, C = torch.randn(2, N, generator=g, dtype=torch.complex64), torch.randn(2, N, generator=g, dtype=torch.complex64)
    res = []
    for backend in ("torch", "triton"):
        xs = [t.clone().requires_grad_() for t in (dA, dB, C)]
        K = ssm_kernel_diag(*xs, L, backend=backend)
        gy = torch.linspace(-1, 1, K.numel()).reshape(K.shape).to(K.dtype)
        res.append((K.detach(), torch.autograd.grad((K * gy).real.sum(), xs)))
    agree(res, 1e-5, f"ssm_kernel_diag N={N} L={L}")


# ---------------------------------------------------------------- 5: the caller's autocast changes nothing

def _f32(g, *shape, cplx=False, neg=False):
    x = torch.randn(*shape, generator=g)
    if neg: x = -x.abs() - 0.1
    return torch.complex(x, torch.randn(*shape, generator=g)) if cplx else x


def _autocast_cases(g, N, L, b, cplx):
    "(name, thunk) for every public op, each on float32 (complex64) inputs drawn from `g`."
    from ssm_course.hippo import hippo, hippo_project, dplr
    from ssm_course.ssm import impulse_response, basis_functions, step_response, state_transition
    from ssm_course.conv import cauchy
    A, B = hippo("legs", N, dtype=torch.float32)
    Lam = torch.complex(-torch.rand(N, generator=g) - 0.1, torch.randn(N, generator=g))
    dA, dB = discretize_diag(Lam, _f32(g, N, cplx=True), 0.05)
    a = torch.rand(b, 3, L, generator=g) * 0.9 + 0.05
    if cplx: a = torch.polar(a, torch.randn(b, 3, L, generator=g))
    u, dt = _f32(g, b, 3, L), torch.rand(b, 3, L, generator=g) * 0.2
    Lp, P, Bp, _ = dplr("legs", N)
    x, dts = _f32(g, b, L, 2, 3), torch.rand(b, L, 2, generator=g) * 0.2
    Bs, Cs = _f32(g, b, L, 1, N), _f32(g, b, L, 1, N)
    t = torch.linspace(0, 1, 7)
    return [
        ("discretize", lambda: discretize(A, B, 0.1, "zoh")),
        ("discretize bilinear", lambda: discretize(A, B, 0.1, "bilinear")),
        ("discretize_diag", lambda: discretize_diag(Lam, Lam, 0.1)),
        ("matrix_exp", lambda: matrix_exp(0.1 * A)),
        ("state_transition", lambda: state_transition(A, t)),
        ("impulse_response", lambda: impulse_response(A, B, B, t)),
        ("step_response", lambda: step_response(A, B, B, t)),
        ("basis_functions", lambda: basis_functions(A, B, t)),
        ("ssm_kernel", lambda: ssm_kernel(*discretize(A, B, 0.1), B, L)),
        ("ssm_recurrence", lambda: ssm_recurrence(*discretize(A, B, 0.1), B, u[0, 0])),
        ("ssm_kernel_diag", lambda: ssm_kernel_diag(dA, dB, Lam, L)),
        ("ssm_kernel_diag log", lambda: ssm_kernel_diag(0.05 * Lam, dB, Lam, L, log=True)),
        ("dss_kernel", lambda: dss_kernel(Lam, Lam, 0.05, L)),
        ("ssm_kernel_dplr", lambda: ssm_kernel_dplr(Lp.to(torch.complex64), P.to(torch.complex64), Bp.to(torch.complex64), Lam, 0.1, L)),
        ("cauchy", lambda: cauchy(Lam[None], Lam[:2] + 1.0, Lam)),
        ("causal_conv", lambda: causal_conv(u, _f32(g, 3, L))),
        ("hippo_project", lambda: hippo_project("legs", u[0, 0], N, dt=0.1)),
        ("scan", lambda: scan(a, u.to(a.dtype))),
        ("scan lti", lambda: scan(a[..., :1].expand_as(a), u.to(a.dtype))),
        ("scan_sequential", lambda: scan_sequential(a, u.to(a.dtype))),
        ("scan_parallel", lambda: scan_parallel(a, u.to(a.dtype))),
        ("scan_chunked", lambda: scan_chunked(a, u.to(a.dtype), chunk=4)),
        ("selective_scan", lambda: selective_scan(u, dt, -torch.rand(3, N, generator=g) - 0.1, _f32(g, b, N, L), _f32(g, b, N, L))),
        ("selective_scan_ref", lambda: selective_scan_ref(u, dt, -torch.rand(3, N, generator=g) - 0.1, _f32(g, 3, N), _f32(g, 3, N))),
        ("ssd", lambda: ssd(x, dts, -torch.rand(2, generator=g), Bs, Cs, chunk_size=4)),
        ("ssd_ref", lambda: ssd_ref(x, dts, -torch.rand(2, generator=g), Bs, Cs)),
        ("ssd_quadratic", lambda: ssd_quadratic(x, dts, -torch.rand(2, generator=g), Bs, Cs)),
    ]


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(N=st.integers(1, 6), L=st.integers(1, 33), b=st.integers(1, 2), cplx=st.booleans(), seed=seeds)
def test_ops_ignore_the_callers_autocast(N, L, b, cplx, seed):
    "API.md: each op computes at the precision its docstring states whatever the caller's autocast; float32 inputs under bfloat16 autocast give the result without autocast, bit for bit."
    def run(ctx):
        with ctx: return [(name, f()) for name, f in _autocast_cases(torch.Generator().manual_seed(seed), N, L, b, cplx)]
    import contextlib
    plain, auto = run(contextlib.nullcontext()), run(torch.autocast("cpu", dtype=torch.bfloat16))
    for (name, p), (_, q) in zip(plain, auto):
        for p_, q_ in zip(p if isinstance(p, tuple) else (p,), q if isinstance(q, tuple) else (q,)):
            assert p_.dtype == q_.dtype and torch.equal(p_, q_), f"{name}: under autocast {q_.dtype}, max diff {(p_ - q_).abs().max():.3g}"
