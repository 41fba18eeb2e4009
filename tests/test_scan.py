"""ssm_course.scan: property tests of the scan algebra (hypothesis), equality to the loop, gradients, bad input."""
import numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st
from scipy.signal import lfilter
from ssm_course.scan import scan, scan_chunked, scan_parallel, scan_sequential

floats = st.floats(-2, 2, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 120), split=st.integers(0, 120), seed=st.integers(0, 10_000), complex_=st.booleans())
def test_split_and_carry(L, split, seed, complex_):
    "Scanning a prefix, then the rest from its last state, equals scanning the whole (the monoid law behind chunking)."
    g = torch.Generator().manual_seed(seed)
    dt = torch.complex128 if complex_ else torch.float64
    a, b = torch.randn(2, L, generator=g, dtype=dt) * 0.9, torch.randn(2, L, generator=g, dtype=dt)
    k = min(split, L)
    whole = scan_chunked(a, b)
    if 0 < k < L:
        first = scan_chunked(a[:, :k], b[:, :k])
        rest = scan_chunked(a[:, k:], b[:, k:], first[:, -1])
        torch.testing.assert_close(torch.cat([first, rest], -1), whole, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(whole, scan_sequential(a, b), rtol=1e-10, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 200), chunk=st.integers(2, 40), seed=st.integers(0, 10_000), with_h0=st.booleans(), lti=st.booleans())
def test_algorithms_agree(L, chunk, seed, with_h0, lti):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(3, 1 if lti else L, generator=g, dtype=torch.float64) * 1.5 - 0.5
    b = torch.randn(2, 3, L, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 3, generator=g, dtype=torch.float64) if with_h0 else None
    ref = scan_sequential(a, b, h0)
    for h in (scan_parallel(a, b, h0), scan_chunked(a, b, h0, chunk=chunk), scan(a, b, h0)):
        torch.testing.assert_close(h, ref, rtol=1e-9, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(L=st.integers(1, 300), seed=st.integers(0, 10_000))
def test_lti_matches_lfilter(L, seed):
    "A constant decay is the IIR filter 1 / (1 - a z^-1): scipy's lfilter is an independent reference."
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-0.99, 0.99, size=4), rng.standard_normal((4, L))
    h = scan(torch.from_numpy(a)[:, None], torch.from_numpy(b)).numpy()
    ref = np.stack([lfilter([1.0], [1.0, -a[i]], b[i]) for i in range(4)])
    np.testing.assert_allclose(h, ref, rtol=1e-9, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(L=st.integers(1, 40), seed=st.integers(0, 10_000), complex_=st.booleans())
def test_gradients_match_loop(L, seed, complex_):
    g = torch.Generator().manual_seed(seed)
    dt = torch.complex128 if complex_ else torch.float64
    a = (torch.randn(3, L, generator=g, dtype=dt) * 0.5).requires_grad_()
    b = torch.randn(2, 3, L, generator=g, dtype=dt, requires_grad=True)
    h0 = torch.randn(2, 3, generator=g, dtype=dt, requires_grad=True)
    w = torch.randn(2, 3, L, generator=g, dtype=dt)
    g1 = torch.autograd.grad((scan(a, b, h0) * w).sum().real, (a, b, h0))
    g2 = torch.autograd.grad((scan_sequential(a, b, h0) * w).sum().real, (a, b, h0))
    for x, y in zip(g1, g2): torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-9)


def test_gradcheck_and_return_last():
    a = torch.rand(2, 11, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 11, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: scan(a, b, return_last=True)[1], (a, b))
    h, last = scan(a, b, return_last=True)
    torch.testing.assert_close(last, h[..., -1])


def test_float32_long_sequence_near_one():
    a = (0.999 + 0.001 * torch.rand(8, 20000)).float()
    b = torch.randn(8, 20000)
    ref = scan_sequential(a.double(), b.double())
    err = ((scan(a, b).double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-5


BAD = [
    (lambda: scan(torch.ones(3, 4), torch.ones(2, 4)), ValueError, "a"),
    (lambda: scan(torch.ones(3, 0), torch.ones(3, 0)), ValueError, "empty"),
    (lambda: scan(torch.ones(3, 4), torch.ones(3, 4), torch.ones(2)), ValueError, "h0"),
    (lambda: scan(torch.ones(4), torch.ones(4), h0=torch.ones(1, 1)), ValueError, "h0"),
    (lambda: scan(np.ones(3), torch.ones(3)), TypeError, "a"),
    (lambda: scan(torch.ones(3), [1.0, 2.0, 3.0]), TypeError, "b"),
    (lambda: scan(torch.ones(()), torch.ones(3)), ValueError, "a"),
    (lambda: scan(torch.ones(3), torch.ones(3), backend="gpu"), ValueError, "backend"),
    (lambda: scan_sequential(torch.ones(2, 3), torch.ones(3, 3)), ValueError, "a"),
    (lambda: scan_parallel(torch.ones(2, 3), torch.ones(3, 3)), ValueError, "a"),
    (lambda: scan_chunked(torch.ones(2, 3), torch.ones(3, 3)), ValueError, "a"),
]


@pytest.mark.parametrize("call,exc,word", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(call, exc, word):
    with pytest.raises(exc, match=rf"\b{word}\b"):
        call()


# ---- issue 13 item 1: inputs are never modified ------------------------------------------------------------
def _snapshot(*xs): return [None if x is None else x.clone() for x in xs]

def _unchanged(xs, saved):
    for x, s in zip(xs, saved):
        if x is not None: assert torch.equal(x, s) and x.dtype == s.dtype, "an input was modified"


@settings(max_examples=80, deadline=None)
@given(batch=st.lists(st.integers(1, 5), min_size=0, max_size=3), L=st.integers(1, 70), chunk=st.integers(1, 72),
       lti=st.booleans(), with_h0=st.booleans(), complex_=st.booleans(), layout=st.sampled_from(["contiguous", "transposed", "expanded"]),
       seed=st.integers(0, 10_000))
def test_inputs_unchanged(batch, L, chunk, lti, with_h0, complex_, layout, seed):
    "Every scan leaves every input bit-identical, forward and backward, whatever the shape, strides and chunk size."
    g = torch.Generator().manual_seed(seed)
    dt = torch.complex64 if complex_ else torch.float32
    def make(*shape):
        if layout == "transposed" and len(shape) >= 2: return torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g, dtype=dt).mT
        if layout == "expanded" and len(shape) >= 2: return torch.randn(*shape[:-2], 1, shape[-1], generator=g, dtype=dt).expand(shape)
        return torch.randn(tuple(shape), generator=g, dtype=dt)
    a = make(*batch, 1 if lti else L) * 0.5
    b = make(*batch, L)
    h0 = make(*batch) if with_h0 else None
    saved = _snapshot(a, b, h0)
    for f in (scan_sequential, scan_parallel, lambda *x: scan_chunked(*x, chunk=chunk), lambda *x: scan_chunked(*x, chunk=None), scan,
              lambda *x: scan(*x, return_last=True)[0]):
        f(a, b, h0)
        _unchanged((a, b, h0), saved)
    # backward: gradients with respect to non-leaf views of the inputs
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in (a, b, h0)]
    views = [None if x is None else x * 1 for x in leaves]
    vsaved = _snapshot(*views)
    scan(*views).abs().sum().backward()
    _unchanged(views, vsaved)


def test_aliased_inputs():
    "a and b may be the same tensor (issue 13: scan(x, x) returned 0.19 where the loop gives 0.9998)."
    for shape in [(1, 12), (3, 6), (1, 64), (5, 7)]:
        x = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
        x0 = x.clone()
        torch.testing.assert_close(scan(x, x), scan_sequential(x0, x0))
        torch.testing.assert_close(scan_chunked(x, x, x[..., 0], chunk=3), scan_sequential(x0, x0, x0[..., 0]))
        assert torch.equal(x, x0)
        first, second = scan(x, x), scan(x, x)  # repeated calls agree
        assert torch.equal(first, second)


def test_nonleaf_gradients():
    "Gradients of non-leaf inputs through scan equal those through the loop (issue 13: 1.14 vs 2.00)."
    for shape in [(1, 12), (3, 6), (2, 5, 9)]:
        w = torch.rand(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        got = torch.autograd.grad(scan(w * 0.9, w * 1.0).sum(), w)[0]
        ref = torch.autograd.grad(scan_sequential(w * 0.9, w * 1.0).sum(), w)[0]
        torch.testing.assert_close(got, ref)
