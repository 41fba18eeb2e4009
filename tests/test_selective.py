"""ssm_course.selective: fast path vs the reference loop (hypothesis), mamba's packing, chaining, bad input."""
import math, pytest, torch
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
