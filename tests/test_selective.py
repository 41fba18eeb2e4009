"""ssm_course.selective: fast path vs the reference loop (hypothesis), mamba's packing, chaining, bad input; both against a transcription of mamba_ssm's own selective_scan_ref."""
import math, pytest, torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from ssm_course.selective import selective_scan, selective_scan_ref


def inputs(seed, b, d, n, l, layout, cplx, groups=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    A = torch.complex(-torch.rand(d, n, generator=g, dtype=dtype), r(d, n)) if cplx else -torch.rand(d, n, generator=g, dtype=dtype) - 0.05
    shape = {2: (d, n), 3: (b, n, l), 4: (b, groups, n, l)}[layout]
    if cplx and layout == 2: B, C = torch.complex(r(*shape), r(*shape)), torch.complex(r(*shape), r(*shape))
    elif cplx: B, C = r(*shape[:-1], 2 * l), r(*shape[:-1], 2 * l)
    else: B, C = r(*shape), r(*shape)
    return dict(u=r(b, d, l), delta=r(b, d, l), A=A, B=B, C=C)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), g=st.sampled_from([1, 2]), n=st.integers(1, 4), l=st.integers(1, 40),
       layout=st.sampled_from([2, 3, 4]), cplx=st.booleans(), chunk=st.integers(1, 16), extras=st.booleans())
def test_fast_equals_reference(seed, b, g, n, l, layout, cplx, chunk, extras):
    d = 2 * g
    kw = inputs(seed, b, d, n, l, layout, cplx, groups=g)
    if extras:
        gen = torch.Generator().manual_seed(seed + 1)
        kw.update(D=torch.randn(d, generator=gen, dtype=torch.float64), z=torch.randn(b, d, l, generator=gen, dtype=torch.float64),
                  delta_bias=torch.randn(d, generator=gen, dtype=torch.float64), delta_softplus=True,
                  initial_state=torch.randn(b, d, n, generator=gen, dtype=torch.complex128 if cplx else torch.float64))
    y1, s1 = selective_scan_ref(**kw, return_last_state=True)
    y2, s2 = selective_scan(**kw, return_last_state=True, chunk=chunk)
    torch.testing.assert_close(y2, y1, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(s2, s1, rtol=1e-9, atol=1e-9)


def test_mamba_packing_equals_complex_tensors():
    "Mamba's real (b, n, 2l) packing of a complex B/C means the same as passing complex tensors."
    kw = inputs(0, 2, 4, 3, 9, 3, True)
    packed = selective_scan_ref(**kw)
    as_complex = {**kw, "B": torch.view_as_complex(kw["B"].unflatten(-1, (9, 2)).contiguous()), "C": torch.view_as_complex(kw["C"].unflatten(-1, (9, 2)).contiguous())}
    torch.testing.assert_close(selective_scan_ref(**as_complex), packed)
    torch.testing.assert_close(selective_scan(**as_complex), packed)


def test_gradcheck_small():
    kw = inputs(3, 1, 2, 2, 5, 3, False)
    kw = {k: v.requires_grad_() for k, v in kw.items()}
    assert torch.autograd.gradcheck(lambda u, delta, A, B, C: selective_scan(u, delta, A, B, C, delta_softplus=True, chunk=2), tuple(kw.values()))


def test_dtype_follows_u():
    kw = {k: v.float() for k, v in inputs(1, 2, 4, 3, 10, 3, False).items()}
    y = selective_scan(**{**kw, "u": kw["u"].half()})
    assert y.dtype == torch.float16


@pytest.mark.parametrize("fn", [selective_scan, selective_scan_ref])
def test_integer_u_is_promoted(fn):
    "Issue 25 item 14: an integer u is computed as float (the default dtype), as everywhere else; it returned int64 zeros."
    kw = {k: v.float() for k, v in inputs(2, 2, 4, 3, 10, 3, False).items()}
    u = torch.randint(-3, 4, kw["u"].shape)
    y = fn(**{**kw, "u": u})
    assert y.dtype == torch.float32
    assert torch.equal(y, fn(**{**kw, "u": u.float()}))
    ref = selective_scan_ref(**{k: v.double() for k, v in {**kw, "u": u}.items()})
    assert (y.double() - ref).abs().max() / ref.abs().max() < 1e-6


def test_reference_matches_a_scalar_closed_form():
    "One channel, one state, constant delta: y is the IIR filter with pole exp(delta A)."
    from scipy.signal import lfilter
    import numpy as np
    u = torch.randn(1, 1, 50, dtype=torch.float64)
    dlt, a = 0.3, -0.7
    y = selective_scan_ref(u, torch.full_like(u, dlt), torch.tensor([[a]], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64))
    ref = lfilter([dlt], [1.0, -math.exp(dlt * a)], u[0, 0].numpy())
    np.testing.assert_allclose(y[0, 0].numpy(), ref, rtol=1e-12)


KW = inputs(0, 2, 4, 3, 7, 3, False)
BAD = [
    (dict(u=KW["u"][0]), ValueError, "u"),
    (dict(delta=KW["delta"][..., :3]), ValueError, "delta"),
    (dict(A=KW["A"][:3]), ValueError, "A"),
    (dict(A=KW["A"][0]), ValueError, "A"),
    (dict(B=KW["B"][..., :3]), ValueError, "B"),
    (dict(C=torch.randn(2, 3, 3, 7)), ValueError, "C"),
    (dict(D=torch.ones(3)), ValueError, "D"),
    (dict(z=torch.ones(2, 4, 6)), ValueError, "z"),
    (dict(delta_bias=torch.ones(2)), ValueError, "delta_bias"),
    (dict(initial_state=torch.ones(2, 4, 2)), ValueError, "initial_state"),
    (dict(u=KW["u"][..., :0], delta=KW["delta"][..., :0], B=KW["B"][..., :0], C=KW["C"][..., :0]), ValueError, "u"),
    (dict(u=KW["u"].numpy()), TypeError, "u"),
    (dict(backend="jax"), ValueError, "backend"),
]


@pytest.mark.parametrize("f", [selective_scan, selective_scan_ref])
@pytest.mark.parametrize("change,exc,word", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(f, change, exc, word):
    with pytest.raises(exc, match=rf"\b{word}\b"):
        f(**{**KW, **change})


# ---- issue 13 item 1: inputs are never modified ------------------------------------------------------------
from ssm_course.ssd import ssd, ssd_quadratic, ssd_ref, segsum


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 3), n=st.integers(1, 4), l=st.integers(1, 30), layout=st.sampled_from([2, 3, 4]),
       cplx=st.booleans(), chunk=st.integers(1, 33))
def test_selective_inputs_unchanged(seed, b, n, l, layout, cplx, chunk):
    "selective_scan and its reference leave every input bit-identical, forward and backward (odd shapes, every chunk size)."
    d = 2
    kw = inputs(seed, b, d, n, l, layout, cplx, groups=1, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    kw.update(D=torch.randn(d, generator=gen), z=torch.randn(b, d, l, generator=gen), delta_bias=torch.randn(d, generator=gen),
              initial_state=torch.randn(b, d, n, generator=gen, dtype=torch.complex64 if cplx else torch.float32))
    saved = {k: v.clone() for k, v in kw.items()}
    selective_scan_ref(**kw, delta_softplus=True)
    selective_scan(**kw, delta_softplus=True, chunk=chunk)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    views = {k: v * 1 for k, v in leaves.items()}
    vsaved = {k: v.detach().clone() for k, v in views.items()}
    y, last = selective_scan(**views, delta_softplus=True, chunk=chunk, return_last_state=True)
    (y.sum() + last.abs().sum()).backward()
    for k in kw: assert torch.equal(kw[k], saved[k]) and torch.equal(views[k].detach(), vsaved[k]), k


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), l=st.integers(1, 40), g=st.sampled_from([1, 2]), p=st.integers(1, 3),
       n=st.integers(1, 4), chunk=st.integers(1, 45), with_h0=st.booleans())
def test_ssd_inputs_unchanged(seed, b, l, g, p, n, chunk, with_h0):
    "ssd, ssd_ref, ssd_quadratic and segsum leave every input bit-identical, forward and backward."
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    h = 2 * g
    kw = dict(x=r(b, l, h, p), dt=torch.rand(b, l, h, generator=gen) + 0.05, A=-torch.rand(h, generator=gen), B=r(b, l, g, n), C=r(b, l, g, n),
              D=r(h), initial_states=r(b, h, p, n) if with_h0 else None)
    kw = {k: v for k, v in kw.items() if v is not None}
    saved = {k: v.clone() for k, v in kw.items()}
    for f in (ssd_ref, ssd_quadratic, ssd): f(**kw, chunk_size=chunk, return_final_states=True)
    segsum(kw["A"])
    leaves = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    views = {k: v * 1 for k, v in leaves.items()}
    vsaved = {k: v.detach().clone() for k, v in views.items()}
    y, final = ssd(**views, chunk_size=chunk, return_final_states=True)
    (y.sum() + final.sum()).backward()
    for k in kw: assert torch.equal(kw[k], saved[k]) and torch.equal(views[k].detach(), vsaved[k]), k


def test_mamba_backward_repro():
    "Issue 13: Mamba(3, 3, expand=1) on (1, 12, 3) crashed in backward with 'modified by an inplace operation'."
    from ssm_course.layers import Mamba
    torch.manual_seed(0)
    m = Mamba(3, 3, expand=1)
    m(torch.randn(1, 12, 3)).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


# ---- ssd: issue 13 items 6 and 12, the unclear errors, issue 19's log_decay ----------------------------------
def _ssd_inputs(seed=0, b=2, l=37, h=4, p=3, g=2, n=5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    return dict(x=r(b, l, h, p), dt=torch.nn.functional.softplus(r(b, l, h) - 1), A=-torch.exp(r(h)), B=r(b, l, g, n), C=r(b, l, g, n),
                D=r(h), initial_states=r(b, h, p, n))


@pytest.mark.parametrize("f", [ssd, ssd_ref, ssd_quadratic])
def test_ssd_rejects_negative_dt_and_complex(f):
    "dt = 0 is a step (issue 25 item 19: tests/test_ssd.py); a negative or NaN dt is refused by name."
    kw = _ssd_inputs()
    for bad in (-kw["dt"], kw["dt"].masked_fill(torch.rand(kw["dt"].shape) < 0.1, float("nan"))):
        with pytest.raises(ValueError, match=r"\bdt must be >= 0\b"): f(**{**kw, "dt": bad})
    with pytest.raises(TypeError, match=r"\bx\b"): f(**{**kw, "x": kw["x"].to(torch.complex128)})
    with pytest.raises(TypeError, match=r"\bB\b"): f(**{**kw, "B": kw["B"].to(torch.complex128)})
    with pytest.raises(ValueError, match=r"\blog_decay\b"): f(**{**kw, "A": None}, log_decay=kw["dt"])  # a positive log decay
    with pytest.raises(ValueError, match=r"\bchunk_size\b"): f(**kw, chunk_size=0)


@pytest.mark.parametrize("f", [ssd, ssd_ref, ssd_quadratic])
def test_ssd_mixed_and_half_precision(f):
    kw = _ssd_inputs()
    mixed = {**kw, "x": kw["x"].float(), "B": kw["B"].float()}
    y = f(**mixed)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, f(**{k: v.double() for k, v in mixed.items()}))
    yh = f(**{k: v.half() for k, v in kw.items()})
    assert yh.dtype == torch.float16
    ref = ssd_ref(**{k: v.half().double() for k, v in kw.items()})
    assert ((yh.double() - ref).abs() <= 2e-3 * ref.abs().max()).all()


def test_ssd_log_decay_equals_dt_A_and_survives_saturated_gates():
    "log_decay = dt A with dt = None gives the same outputs as feeding dt x, dt A; gates that saturate to 1.0 in float32 stay finite."
    kw = _ssd_inputs()
    gated = {**kw, "x": kw["x"] * kw["dt"][..., None], "dt": None, "A": None}
    ld = kw["dt"] * kw["A"]
    for f in (ssd, ssd_ref, ssd_quadratic):
        torch.testing.assert_close(f(**gated, log_decay=ld) - kw["D"][:, None] * gated["x"], f(**kw) - kw["D"][:, None] * kw["x"])
    gen = torch.Generator().manual_seed(1)
    logit = 10 + 30 * torch.rand(2, 37, 4, generator=gen)
    assert (torch.sigmoid(logit) == 1).any()
    args = {k: v.float() for k, v in gated.items() if v is not None}
    y = ssd(**args, dt=None, A=None, log_decay=-torch.nn.functional.softplus(-logit), chunk_size=8)
    ref = ssd_ref(**{k: v.double() for k, v in args.items()}, dt=None, A=None, log_decay=torch.log(torch.sigmoid(logit.double())))
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


@pytest.mark.parametrize("l", [300, 2000])
def test_ssd_growing_state(l):
    "Issue 13 item 6: A = +0.5 at l = 300 and 2000 (chunk decays e^32, their products overflow): the chunked ssd gives the loop's answer; the quadratic form raises clearly instead of NaN."
    gen = torch.Generator().manual_seed(2)
    x = torch.zeros(1, l, 2, 3); x[:, -5:] = torch.randn(1, 5, 2, 3, generator=gen)
    kw = dict(x=x, dt=torch.ones(1, l, 2), A=torch.tensor([0.5, 0.5]), B=torch.randn(1, l, 1, 4, generator=gen), C=torch.randn(1, l, 1, 4, generator=gen))
    ref = ssd_ref(**{k: v.double() for k, v in kw.items()})
    assert ((ssd(**kw).double() - ref).abs().max() / ref.abs().max()) < 3e-7  # observed 9.6e-8 and 5.4e-8
    with pytest.raises(ValueError, match="overflows"): ssd_quadratic(**kw)


def test_ssd_meta():
    kw = {k: v.float().to("meta") for k, v in _ssd_inputs().items()}
    for f in (ssd, ssd_ref, ssd_quadratic):
        y, s = f(**kw, return_final_states=True)
        assert y.shape == kw["x"].shape and s.shape == kw["initial_states"].shape and y.device.type == "meta"


# ---- selective_scan: issue 19 item 11, the unclear errors ------------------------------------------------------
@pytest.mark.parametrize("f", [selective_scan, selective_scan_ref])
def test_real_A_with_complex_B_or_C_is_one_clear_error(f):
    kw = inputs(0, 2, 4, 3, 7, 3, False)
    for name in ("B", "C", "initial_state"):
        bad = kw.get(name, torch.randn(2, 4, 3, dtype=torch.float64)).to(torch.complex128)
        with pytest.raises(ValueError, match=rf"{name} is complex but A is real"): f(**{**kw, name: bad})


@pytest.mark.parametrize("chunk,exc", [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)])
def test_selective_chunk_checked(chunk, exc):
    with pytest.raises(exc, match=r"\bchunk\b"): selective_scan(**inputs(0, 2, 4, 3, 7, 3, False), chunk=chunk)


def test_selective_half_and_meta():
    kw = {k: v.float() for k, v in inputs(1, 2, 4, 3, 10, 4, False, groups=2).items()}
    yh = selective_scan(**{**kw, "u": kw["u"].bfloat16()})
    assert yh.dtype == torch.bfloat16 and torch.equal(yh, selective_scan(**{**kw, "u": kw["u"].bfloat16().float()}).bfloat16())
    ym = selective_scan(**{k: v.to("meta") for k, v in kw.items()})
    assert ym.shape == kw["u"].shape and ym.device.type == "meta"


# ---- selective_scan(backend="triton"): lesson 11b's full op (forward and backward kernels) --------------------------
TRITON_DISPATCH = r'''
import torch
from ssm_course.selective import selective_scan, selective_scan_ref
import ssm_course.triton_ssm as ts
calls, full_op = [], ts.selective_scan_triton
ts.selective_scan_triton = lambda *a, **k: (calls.append(1), full_op(*a, **k))[1]  # count the calls of the full op
def rel(x, ref): return ((x.double() - ref).abs().max() / ref.abs().max()).item()
worst = {}
for seed, (layB, layC) in enumerate([(2, 3), (3, 4), (4, 2)]):
    g = torch.Generator().manual_seed(seed)
    b, d, n, l = 2, 4, 3, 21
    shape = lambda lay: {2: (d, n), 3: (b, n, l), 4: (b, 2, n, l)}[lay]
    kw = dict(u=torch.randn(b, d, l, generator=g), delta=torch.randn(b, d, l, generator=g), A=-torch.rand(d, n, generator=g) - 0.1,
              B=torch.randn(*shape(layB), generator=g), C=torch.randn(*shape(layC), generator=g), D=torch.randn(d, generator=g),
              z=torch.randn(b, d, l, generator=g), delta_bias=torch.randn(d, generator=g), initial_state=torch.randn(b, d, n, generator=g))
    w, ws = torch.randn(b, d, l, generator=g), torch.randn(b, d, n, generator=g)
    out = {}
    for name, f, dtype, extra in [("triton", selective_scan, torch.float32, dict(backend="triton", chunk=16)), ("torch", selective_scan, torch.float32, dict(backend="torch", chunk=16)),
                                  ("ref64", selective_scan_ref, torch.float64, {})]:
        leaves = {k: v.detach().to(dtype).clone().requires_grad_() for k, v in kw.items()}
        y, s = f(**leaves, delta_softplus=True, return_last_state=True, **extra)
        ((y * w.to(dtype)).sum() + (s * ws.to(dtype)).sum()).backward()
        out[name] = [y, s] + [leaves[k].grad for k in kw]
    for other in ("ref64", "torch"):
        for i, (x, r) in enumerate(zip(out["triton"], out[other])):
            worst[other] = max(worst.get(other, 0.0), rel(x, r.double()))
cplx = dict(u=torch.randn(1, 2, 5), delta=torch.randn(1, 2, 5), A=torch.complex(-torch.ones(2, 3), torch.ones(2, 3)), B=torch.randn(2, 3, dtype=torch.complex64), C=torch.randn(2, 3, dtype=torch.complex64))
errors = []
for bad in (cplx, {**kw, "u": kw["u"].double()}):
    try: selective_scan(**{k: v.detach() for k, v in bad.items()}, backend="triton"); errors.append(None)
    except ValueError as e: errors.append(str(e))
auto = selective_scan(**cplx)  # "auto" on CPU tensors: PyTorch
print(repr((worst, errors, bool(torch.isfinite(auto).all()), len(calls))))
'''


def test_triton_backend_is_notebook_11s_full_op():
    "backend='triton' runs selective_scan_triton (forward and backward kernels) in Triton's interpreter: equal to the float64 reference and to backend='torch'; complex A and float64 are refused by name."
    pytest.importorskip("triton")
    import subprocess, sys, os
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", TRITON_DISPATCH], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    worst, errors, auto_finite, calls = eval(res.stdout.strip().splitlines()[-1])
    assert calls == 3 and worst["ref64"] < 1.5e-6 and worst["torch"] < 1.5e-6, (calls, worst)  # observed 6.3e-7 and 7.4e-7
    assert "real A" in errors[0] and "float64" in errors[1] and auto_finite, errors


# ---- issue 25: double backward, torch.func, autocast, mixed devices (selective_scan) --------------------------------
def _full_inputs(seed, layout, cplx, b=2, d=4, n=2, l=7, groups=2, dtype=torch.float64):
    kw = inputs(seed, b, d, n, l, layout, cplx, groups=groups, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    kw.update(D=r(d), z=r(b, d, l), delta_bias=r(d), initial_state=r(b, d, n).to(torch.complex128 if cplx else dtype) if dtype == torch.float64
              else r(b, d, n).to(torch.complex64 if cplx else dtype))
    return kw


@pytest.mark.parametrize("layout, cplx", [(2, True), (3, False), (3, True), (4, False)])
def test_selective_scan_double_backward(layout, cplx):
    "Issue 25 items 10/23: gradgradcheck of selective_scan (float64, chunk 2 of l = 5, every input, y and the last state); the gradient with create_graph=True was detached (requires_grad=False) and gradgradcheck failed."
    kw = _full_inputs(0, layout, cplx, b=1, d=2, n=2, l=5)
    names = [k for k, v in kw.items() if torch.is_tensor(v)]
    f = lambda *t: selective_scan(**dict(zip(names, t)), delta_softplus=True, chunk=2, return_last_state=True)
    x = tuple(kw[k].detach().requires_grad_() for k in names)
    y, _ = f(*x)
    gu, = torch.autograd.grad(y.square().sum(), x[0], create_graph=True)
    assert gu.requires_grad
    assert torch.autograd.gradgradcheck(f, x, fast_mode=True)


def test_selective_scan_torch_func_vmap_and_grad():
    "Issue 25 item 18: vmap over u, delta, A, B (each layout) and the initial state equals a loop over the reference; torch.func.grad and vmap(grad) equal autograd."
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    V, b, d, n, l = 3, 2, 4, 2, 9
    u, dl, A, x0 = r(V, b, d, l), r(V, b, d, l), -torch.rand(V, d, n, generator=g, dtype=torch.float64), r(V, b, d, n)
    for shape in [(d, n), (b, n, l), (b, 2, n, l)]:
        B, C = r(V, *shape), r(*shape)
        f = lambda u, dl, A, B, x0: selective_scan(u, dl, A, B, C, initial_state=x0, delta_softplus=True, chunk=4, return_last_state=True)
        y, last = torch.func.vmap(f)(u, dl, A, B, x0)
        for v in range(V):
            yr, lr = selective_scan_ref(u[v], dl[v], A[v], B[v], C, initial_state=x0[v], delta_softplus=True, return_last_state=True)
            torch.testing.assert_close(y[v], yr, rtol=0, atol=1e-12); torch.testing.assert_close(last[v], lr, rtol=0, atol=1e-12)
    y = torch.func.vmap(lambda u: selective_scan(u, dl[0], A[0], B[0], C, chunk=4), in_dims=2, out_dims=2)(u[0].unsqueeze(2).expand(b, d, 3, l))
    torch.testing.assert_close(y, selective_scan_ref(u[0], dl[0], A[0], B[0], C).unsqueeze(2).expand(b, d, 3, l), rtol=0, atol=1e-12)
    loss = lambda u: selective_scan(u, dl[0], A[0], B[0], C, chunk=4).square().sum()
    want = torch.stack([torch.autograd.grad(selective_scan_ref(x.requires_grad_(), dl[0], A[0], B[0], C).square().sum(), x)[0] for x in u.clone()])
    torch.testing.assert_close(torch.func.grad(loss)(u[0]), want[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(loss))(u), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("f", [selective_scan, selective_scan_ref])
def test_selective_ignores_autocast(f):
    "Issue 25 item 5: under torch.autocast('cpu', bfloat16) float32 inputs were computed at bf16 accuracy (selective_scan 3.1e-3); now the output and the gradients (backward called inside the context too) equal those without, bit for bit."
    kw = _full_inputs(2, 3, False, b=2, d=16, n=8, l=64, groups=1, dtype=torch.float32)
    def run():
        leaves = {k: v.clone().requires_grad_() for k, v in kw.items()}
        y, last = f(**leaves, delta_softplus=True, return_last_state=True)
        return [y, last, *torch.autograd.grad(y.square().sum() + last.square().sum(), list(leaves.values()))]
    plain = run()
    with torch.autocast("cpu", torch.bfloat16): cast = run()
    assert cast[0].dtype == torch.float32
    for a, b in zip(plain, cast): assert torch.equal(a, b)


@pytest.mark.parametrize("f", [selective_scan, selective_scan_ref])
@pytest.mark.parametrize("name", ["delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"])
def test_selective_mixed_devices_name_the_argument(f, name):
    "Issue 25 item 22: a meta tensor among CPU tensors raised 'Tensor on device meta is not on the expected device cpu' from a custom op; now a ValueError naming both."
    kw = _full_inputs(3, 3, False, dtype=torch.float32)
    with pytest.raises(ValueError, match=rf"^{name} is on device meta but u is on cpu"):
        f(**{**kw, name: kw[name].to("meta")})
    with pytest.raises(ValueError, match=r"^delta is on device cpu but u is on meta"):
        f(**{**kw, "u": kw["u"].to("meta")})


# ---- issue 26: the engine (nbs/engine/selective.ipynb) around lesson 08's chunked algorithm ------------------------------
def test_engine_does_not_import_the_public_module():
    "ssm_course._engine.selective (checks, time-major forward, Triton dispatch, vmap helpers) is imported by ssm_course.selective, so it must not import ssm_course.selective itself; the names ssm_course.selective (and lesson 11b, through it) uses are the engine's objects."
    import subprocess, sys
    code = ("import sys, ssm_course._engine.selective as E\nassert 'ssm_course.selective' not in sys.modules, 'the engine imported the public module'\n"
            "import ssm_course.selective as S\nassert all(getattr(S, n) is getattr(E, n) for n in ('_check_ref', '_check_selective', '_selective_forward', '_chunk_tm', "
            "'_scan_steps', '_selective_triton', '_to_front', '_fold_channels', '_unfold_channels'))\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


@pytest.mark.parametrize("layout", [2, 3, 4])
def test_backward_is_the_lessons_chunk_walk(layout):
    "selective_scan's backward is notebook 08's _backward_chunks (with the engine's time-major chunk) from the tuned forward's boundary states: every gradient bit for bit."
    from ssm_course.selective import _backward_chunks
    from ssm_course._engine.selective import _selective_forward, _chunk_tm
    kw = _full_inputs(5, layout, False, l=29)
    names = ["u", "delta", "A", "B", "C", "initial_state"]
    leaves = {k: kw[k].clone().requires_grad_() for k in names}
    gen = torch.Generator().manual_seed(1)
    y, last = selective_scan(**leaves, return_last_state=True, chunk=8)  # delta as given: no bias, no softplus
    gy, glast = torch.randn(y.shape, generator=gen, dtype=y.dtype), torch.randn(last.shape, generator=gen, dtype=last.dtype)
    got = torch.autograd.grad((y, last), list(leaves.values()), (gy, glast))
    _, _, starts, _ = _selective_forward(*(kw[k] for k in names), 8)
    want = _backward_chunks(gy, glast, *(kw[k] for k in names[:5]), starts, 8, chunk=_chunk_tm)
    for a, b in zip(got, want): assert torch.equal(a, b)


# ---- issue 28 item 18: selective_scan against mamba_ssm's own reference -------------------------------------------------
# Lesson 08 says that selective_scan follows mamba_ssm's `selective_scan_fn` argument for argument. mamba_ssm's own test
# (tests/ops/test_selective_scan.py) checks its CUDA op against `selective_scan_ref`; here the same reference, transcribed,
# checks ours: every layout of B and C (fixed (d, n), per step (b, n, l), in groups (b, g, n, l)), real and complex A (with
# mamba's (real, imaginary) packing of a variable B/C), D, z, delta_bias, softplus and the last state, outputs and gradients.
#
# ---- Transcription of mamba_ssm's selective_scan_ref (not ssm_course code) ---------------------------------------------
# state-spaces/mamba, mamba_ssm/ops/selective_scan_interface.py, `selective_scan_ref` (Copyright (c) 2023, Tri Dao, Albert
# Gu; Apache-2.0), read at commit e9594ce (the file last changed in f577286, July 2026; the function is unchanged since
# the first release). Transcribed line by line; the changes: einops' rearrange/repeat are written with
# unflatten/repeat_interleave/indexing (einops is not a dependency of this project), the original shown in a comment; and
# each `.float()` is `.to(work)`, with `work=torch.float32` (the default) being the original, so that the same lines can
# also run in float64 for a comparison at float64 rounding.
def mamba_selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, work=torch.float32):
    """
    u: r(B D L)
    delta: r(B D L)
    A: c(D N) or r(D N)
    B: c(D N) or r(B N L) or r(B N 2L) or r(B G N L) or (B G N L)
    C: c(D N) or r(B N L) or r(B N 2L) or r(B G N L) or (B G N L)
    D: r(D)
    z: r(B D L)
    delta_bias: r(D), fp32

    out: r(B D L)
    last_state (optional): r(B D dstate) or c(B D dstate)
    """
    dtype_in = u.dtype
    u = u.to(work)  # u.float()
    delta = delta.to(work)  # delta.float()
    if delta_bias is not None:
        delta = delta + delta_bias[..., None].to(work)  # delta_bias[..., None].float()
    if delta_softplus:
        delta = F.softplus(delta)
    batch, dim, dstate = u.shape[0], A.shape[0], A.shape[1]
    is_variable_B = B.dim() >= 3
    is_variable_C = C.dim() >= 3
    if A.is_complex():
        if is_variable_B:
            B = torch.view_as_complex(B.to(work).unflatten(-1, (-1, 2)))  # rearrange(B.float(), "... (L two) -> ... L two", two=2)
        if is_variable_C:
            C = torch.view_as_complex(C.to(work).unflatten(-1, (-1, 2)))  # rearrange(C.float(), "... (L two) -> ... L two", two=2)
    else:
        B = B.to(work)  # B.float()
        C = C.to(work)  # C.float()
    x = A.new_zeros((batch, dim, dstate))
    ys = []
    deltaA = torch.exp(torch.einsum('bdl,dn->bdln', delta, A))
    if not is_variable_B:
        deltaB_u = torch.einsum('bdl,dn,bdl->bdln', delta, B, u)
    else:
        if B.dim() == 3:
            deltaB_u = torch.einsum('bdl,bnl,bdl->bdln', delta, B, u)
        else:
            B = B.repeat_interleave(dim // B.shape[1], dim=1)  # repeat(B, "B G N L -> B (G H) N L", H=dim // B.shape[1])
            deltaB_u = torch.einsum('bdl,bdnl,bdl->bdln', delta, B, u)
    if is_variable_C and C.dim() == 4:
        C = C.repeat_interleave(dim // C.shape[1], dim=1)  # repeat(C, "B G N L -> B (G H) N L", H=dim // C.shape[1])
    last_state = None
    for i in range(u.shape[2]):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        if not is_variable_C:
            y = torch.einsum('bdn,dn->bd', x, C)
        else:
            if C.dim() == 3:
                y = torch.einsum('bdn,bn->bd', x, C[:, :, i])
            else:
                y = torch.einsum('bdn,bdn->bd', x, C[:, :, :, i])
        if i == u.shape[2] - 1:
            last_state = x
        if y.is_complex():
            y = y.real * 2
        ys.append(y)
    y = torch.stack(ys, dim=2) # (batch dim L)
    out = y if D is None else y + u * D[:, None]  # rearrange(D, "d -> d 1")
    if z is not None:
        out = out * F.silu(z)
    out = out.to(dtype=dtype_in)
    return out if not return_last_state else (out, last_state)
# ---- end of the transcription ---------------------------------------------------------------------------------------


def _mamba_inputs(seed, layB, layC, cplx, extras, dtype=torch.float64, b=2, d=4, n=3, l=23, g=2):
    "Arguments as mamba_ssm's test draws them (A = -0.5 rand, delta = 0.5 rand, delta_bias = 0.5 rand); a complex variable B/C packed as mamba packs it, real (..., 2l)."
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    A = -0.5 * torch.rand(d, n, generator=gen, dtype=dtype)
    if cplx: A = torch.complex(A, r(d, n))
    def BC(lay):
        if lay == 2: return torch.complex(r(d, n), r(d, n)) if cplx else r(d, n)
        return r(*{3: (b, n), 4: (b, g, n)}[lay], 2 * l if cplx else l)
    kw = dict(u=r(b, d, l), delta=0.5 * torch.rand(b, d, l, generator=gen, dtype=dtype), A=A, B=BC(layB), C=BC(layC))
    if extras: kw.update(D=r(d), z=r(b, d, l), delta_bias=0.5 * torch.rand(d, generator=gen, dtype=dtype), delta_softplus=True)
    return kw


MAMBA_CASES = [(layB, layC, cplx, extras) for layB in (2, 3, 4) for layC in (2, 3, 4) for cplx in (False, True) for extras in (False, True)]


@pytest.mark.parametrize("layB, layC, cplx, extras", MAMBA_CASES, ids=[f"B{b}-C{c}-{'complex' if x else 'real'}-{'DzBias' if e else 'plain'}" for b, c, x, e in MAMBA_CASES])
def test_selective_scan_matches_mamba_reference(layB, layC, cplx, extras):
    """Ours (selective_scan and selective_scan_ref) = mamba_ssm's selective_scan_ref on the same arguments: outputs and last
    states in float64 (mamba's lines run in float64) and in float32 (mamba's lines as written), gradients of every input in float64."""
    kw = _mamba_inputs(7 * layB + layC + 100 * cplx + 1000 * extras, layB, layC, cplx, extras)
    y_m, last_m = mamba_selective_scan_ref(**kw, return_last_state=True, work=torch.float64)
    assert y_m.abs().max() > 0.5 and last_m.abs().max() > 0.5  # a non-trivial output to compare
    scale = max(y_m.abs().max(), last_m.abs().max())  # up to 59 over the cases
    for f in (selective_scan, selective_scan_ref):
        y, last = f(**kw, return_last_state=True)
        for got, want in ((y, y_m), (last, last_m)):
            assert (got - want).abs().max() <= 2e-15 * scale, (got - want).abs().max() / scale  # observed: at most 5.5e-16 of the largest value
    kw32 = {k: (v.to(torch.complex64 if v.is_complex() else torch.float32) if torch.is_tensor(v) else v) for k, v in kw.items()}
    y_m32, last_m32 = mamba_selective_scan_ref(**kw32, return_last_state=True)
    assert y_m32.dtype == torch.float32
    for f in (selective_scan, selective_scan_ref):
        y, last = f(**kw32, return_last_state=True)
        assert y.dtype == torch.float32
        for got, want in ((y, y_m32), (last, last_m32)):  # both in float32: two roundings of the same numbers
            assert (got - want).abs().max() <= 1e-6 * scale, (got - want).abs().max() / scale  # observed: at most 3.0e-7 of the largest value
    # gradients of a random functional of (y, last state) with respect to every tensor argument, float64
    gen = torch.Generator().manual_seed(1)
    wy, wl = torch.randn(y_m.shape, generator=gen, dtype=torch.float64), torch.randn(last_m.shape, generator=gen, dtype=last_m.dtype)
    names = [k for k, v in kw.items() if torch.is_tensor(v)]
    grads = []
    for f, extra in ((mamba_selective_scan_ref, dict(work=torch.float64)), (selective_scan, dict(chunk=8)), (selective_scan_ref, {})):
        leaves = {k: (v.detach().clone().requires_grad_() if torch.is_tensor(v) else v) for k, v in kw.items()}
        y, last = f(**leaves, return_last_state=True, **extra)
        grads.append(torch.autograd.grad((y * wy).sum() + (last * wl).real.sum(), [leaves[k] for k in names]))
    for name, got in zip(("selective_scan", "selective_scan_ref"), grads[1:]):
        for k, a, w in zip(names, got, grads[0]):
            assert (a - w).abs().max() <= 3e-15 * w.abs().max(), (name, k)  # observed: at most 9.9e-16 of the largest gradient (up to 3009)


@pytest.mark.parametrize("layB, cplx", [(3, False), (4, True)])
def test_initial_state_continues_mamba_reference(layB, cplx):
    "initial_state (ours: mamba's op has none) continues mamba's reference: its last state after steps 0..9 as our initial state gives its output on steps 10..22."
    kw = _mamba_inputs(3, layB, layB, cplx, True)
    y_m, last_m = mamba_selective_scan_ref(**kw, return_last_state=True, work=torch.float64)
    s = slice(10, None)
    tail = {k: (v[..., 2 * 10:] if k in "BC" and cplx else v[..., s]) if k in ("u", "delta", "z", "B", "C") and v.dim() > 2 else v for k, v in kw.items()}
    _, first = mamba_selective_scan_ref(**{k: (v[..., :20] if k in "BC" and cplx else v[..., :10]) if k in ("u", "delta", "z", "B", "C") and v.dim() > 2 else v
                                             for k, v in kw.items()}, return_last_state=True, work=torch.float64)
    for f in (selective_scan, selective_scan_ref):
        y, last = f(**tail, initial_state=first, return_last_state=True)
        torch.testing.assert_close(y, y_m[..., s], rtol=0, atol=2e-14); torch.testing.assert_close(last, last_m, rtol=0, atol=2e-14)  # observed: 7.1e-15 (|y| up to 53)


def test_mamba_reference_comparison_is_not_vacuous():
    "The comparison reacts to the conventions: groups mapped the other way (tiled instead of repeated) or the complex packing read as halves instead of pairs change mamba's answer by far more than the tolerance."
    kw = _mamba_inputs(0, 4, 4, False, True)
    y = selective_scan(**kw)
    tiled = mamba_selective_scan_ref(**{**kw, "B": kw["B"][:, [1, 0]]}, work=torch.float64)  # group j serving the other channels
    assert (tiled - y).abs().max() > 0.1
    kw = _mamba_inputs(0, 3, 3, True, True)
    y = selective_scan(**kw)
    halves = lambda X: X.unflatten(-1, (2, -1)).transpose(-1, -2).flatten(-2)  # (re..., im...) instead of (re, im) pairs
    assert (mamba_selective_scan_ref(**{**kw, "B": halves(kw["B"])}, work=torch.float64) - y).abs().max() > 0.1


def test_bf16_gate_follows_mamba_kernel_not_its_reference():
    """The one difference from mamba's reference: it applies F.silu to z in z's dtype (it does not cast z), so with a bf16 z
    the gate is rounded to bf16 before it multiplies the float32 output. mamba's CUDA kernel casts z to float32 first
    (csrc/selective_scan/selective_scan_fwd_kernel.cuh: `float z_val = z_vals[i]; out_vals[r][i] *= z_val / (1 + expf(-z_val));`),
    and so do we: our bf16 output is the float32 result rounded once. On mamba's test inputs in bf16 (as tests/ops/
    test_selective_scan.py draws them), the reference differs from ours by one bf16 ulp in about a quarter of the outputs;
    with z cast to float32 first, as the kernel does, it equals ours except in a handful of roundings."""
    gen = torch.Generator().manual_seed(0)
    b, d, n, l, bf = 2, 16, 8, 256, torch.bfloat16
    kw = dict(u=torch.randn(b, d, l, generator=gen).to(bf), delta=(0.5 * torch.rand(b, d, l, generator=gen)).to(bf), A=-0.5 * torch.rand(d, n, generator=gen),
              B=torch.randn(b, n, l, generator=gen).to(bf), C=torch.randn(b, n, l, generator=gen).to(bf), D=torch.randn(d, generator=gen),
              z=torch.randn(b, d, l, generator=gen).to(bf), delta_bias=0.5 * torch.rand(d, generator=gen), delta_softplus=True)
    assert torch.equal(F.silu(kw["z"]), F.silu(kw["z"].float()).to(bf))  # the reference's gate: silu in float32, rounded to bf16
    y_ref32z = mamba_selective_scan_ref(**{**kw, "z": kw["z"].float()})  # the kernel's gate
    y_mamba = mamba_selective_scan_ref(**kw)
    for f in (selective_scan, selective_scan_ref):
        y = f(**kw)
        assert y.dtype == bf and torch.equal(y, f(**{**kw, "z": kw["z"].float()}))  # z cast first: our gate is the kernel's
        ulp = (torch.nextafter(y.abs(), torch.tensor(float("inf"), dtype=bf)) - y.abs()).float()  # one bf16 ulp at each output
        big = y.float().abs() > 1e-3 * y.float().abs().max()  # away from outputs that cancel to ~0 (where float32 rounding shows)
        off = (y_mamba != y).float().mean().item()
        assert 0.2 < off < 0.35, off  # observed 0.284 (both ops)
        assert ((y_mamba.float() - y.float()).abs()[big] <= ulp[big]).all()  # by one ulp
        assert (y_ref32z != y).sum() <= 5  # observed 3 of 8192 (selective_scan), 3 (selective_scan_ref)


def _loop_off(f):
    "f run on the PyTorch forward (as without numba)."
    import ssm_course._engine.selective as E
    saved, E._sel_loop = E._sel_loop, None
    try: return f()
    finally: E._sel_loop = saved


@pytest.mark.parametrize("layB, layC", [(2, 2), (3, 3), (4, 4), (2, 3), (4, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [1, 3, 1 << 30])  # rows per block: 1, 3 of 8 (a short last block), all
def test_compiled_forward_equals_reference(layB, layC, dtype, block, monkeypatch):
    "Issue 32 item 2: the compiled CPU forward (numba, real A; absent before) on every layout of B and C (also mixed), with an initial state and chunk boundaries, in blocks of 1, 3 and all 8 rows: y, the last state and the boundary states against the float64 reference and the PyTorch forward."
    import ssm_course._engine.selective as E
    assert E._sel_loop is not None, "numba is installed in the test environment: the compiled loop must exist"
    calls = []
    real = E._sel_loop
    monkeypatch.setattr(E, "_sel_loop", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(E, "_SEL_BLOCK", block * 23 * 3 * dtype.itemsize)  # l = 23, n = 3
    kw = _full_inputs(7, layB, False, b=2, d=4, n=3, l=23, dtype=dtype)
    kw["C"] = _full_inputs(8, layC, False, b=2, d=4, n=3, l=23, dtype=dtype)["C"]
    args = [kw[k] for k in ("u", "delta", "A", "B", "C", "initial_state")]
    y, last, starts, T = E._selective_forward(*args, 5)
    assert calls, "the compiled loop ran"
    y_t, last_t, starts_t, _ = _loop_off(lambda: E._selective_forward(*args, 5))
    y_r, last_r = selective_scan_ref(*(a.double() for a in args[:5]), initial_state=args[5].double(), return_last_state=True)
    eps = {torch.float32: 1e-6, torch.float64: 2e-15}[dtype]  # observed: 3.9e-7 and 7.1e-16 of the largest |y|
    scale = y_r.abs().max()
    assert float((y.double() - y_r).abs().max() / scale) < eps and float((last.double() - last_r).abs().max() / last_r.abs().max()) < eps
    assert len(starts) == len(starts_t) == 5 and starts[0] is args[5]
    for p, q in zip(starts[1:], starts_t[1:]): assert float((p - q).abs().max() / q.abs().max()) < eps  # the states the backward restarts from
    assert y.dtype == dtype and y.shape == (2, 4, 23)



def test_compiled_forward_threads_and_causality():
    "Issue 32 item 2: the compiled forward split over 2 threads (large input) equals the float64 reference; a NaN or 1e30 at step 40 in u, delta, B or C leaves every earlier output unchanged, bit for bit."
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        kw = inputs(3, 2, 64, 16, 2048, 3, False, dtype=torch.float32)  # R l n = 2^22: split over the threads
        kw["delta"] = F.softplus(kw["delta"] - 3)
        y = selective_scan(**kw)
        y_r = selective_scan_ref(**{k: v.double() for k, v in kw.items()})
        assert float((y.double() - y_r).abs().max() / y_r.abs().max()) < 1e-6  # observed: 3.5e-7
    finally: torch.set_num_threads(old)
    kw = inputs(4, 2, 4, 3, 60, 3, False, dtype=torch.float32)
    y0 = selective_scan(**kw)
    for name in ("u", "delta", "B", "C"):
        for bad in (float("nan"), 1e30):
            x = kw[name].clone(); x[..., 40] = bad
            y = selective_scan(**{**kw, name: x})
            assert torch.equal(y[..., :40], y0[..., :40]), (name, bad)


@pytest.mark.parametrize("budget, pieces", [(1 << 40, 8), (3 * 2 * 2 * 4 * 3 * 8, 2), (2 * 2 * 4 * 3 * 8, 1)])  # k = T, k = 3 -> 2 (a divisor of 8), k = 1
def test_torch_forward_in_cache_sized_pieces(budget, pieces, monkeypatch):
    "Issue 32 item 2: without numba the CPU forward fills its time-major workspaces k steps at a time (k dividing the chunk T = 8; whole chunks before): y, the last state and the states entering each chunk against the float64 reference and the whole-chunk forward, on both sides of the size threshold."
    import ssm_course._engine.selective as E
    kw = _full_inputs(9, 3, False, b=2, d=4, n=3, l=29, dtype=torch.float64)
    args = [kw[k] for k in ("u", "delta", "A", "B", "C", "initial_state")]
    monkeypatch.setattr(E, "_TM_BLOCK", 1 << 40)
    y_w, last_w, starts_w, _ = E._selective_forward_torch(*args, 8)
    monkeypatch.setattr(E, "_TM_BLOCK", budget)
    seen = []
    real_empty = torch.empty
    monkeypatch.setattr(E.torch, "empty", lambda *s, **k: (seen.append(s), real_empty(*s, **k))[1])
    y, last, starts, T = E._selective_forward_torch(*args, 8)
    monkeypatch.setattr(E.torch, "empty", real_empty)
    assert seen[0][0] == pieces and T == 8  # the workspace: `pieces` steps
    y_r, last_r = selective_scan_ref(*args[:5], initial_state=args[5], return_last_state=True)
    assert float((y - y_r).abs().max() / y_r.abs().max()) < 2e-15 and float((last - last_r).abs().max() / last_r.abs().max()) < 2e-15  # observed: 4e-16
    assert len(starts) == len(starts_w) == 4 and starts[0] is args[5]
    for p, q in zip(starts[1:], starts_w[1:]): assert torch.equal(p, q)  # the same recurrence, step by step


@pytest.mark.parametrize("b, d, n", [(0, 4, 3), (2, 0, 3), (2, 4, 0)])
def test_compiled_and_torch_forward_on_empty_axes(b, d, n):
    "An empty batch, no channels or no states (test_layers' empty batch found the first): the compiled forward and the PyTorch forward give the reference's empty or zero result and the boundary states' shapes."
    import ssm_course._engine.selective as E
    g = torch.Generator().manual_seed(0)
    u, dl = torch.randn(b, d, 12, generator=g), torch.rand(b, d, 12, generator=g)
    A, B, C = -torch.rand(d, n, generator=g) - 0.1, torch.randn(b, n, 12, generator=g), torch.randn(b, n, 12, generator=g)
    want = selective_scan_ref(u.double(), dl.double(), A.double(), B.double(), C.double())
    for fwd in (E._selective_forward, E._selective_forward_torch):
        y, last, starts, T = fwd(u, dl, A, B, C, None, 5)
        assert y.shape == (b, d, 12) and last.shape == (b, d, n) and len(starts) == 3 and all(s.shape == (b, d, n) for s in starts[1:])
        assert torch.equal(y.double(), want)  # zeros (no states) or empty
