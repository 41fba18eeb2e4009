"""ssm_course.scan: property tests of the scan algebra (hypothesis), equality to the loop, gradients, bad input."""
import numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st
from scipy.signal import lfilter
import ssm_course.scan as scan_module
from ssm_course.scan import scan, scan_backward_ref, scan_chunked, scan_parallel, scan_sequential

floats = st.floats(-2, 2, allow_nan=False, allow_infinity=False)


@pytest.fixture(autouse=True, params=["loop", "pytorch"] if scan_module._loop is not None else ["pytorch"])
def cpu_path(request, monkeypatch):
    "Every test runs on both CPU paths of `scan`: the loop compiled by numba (when installed) and PyTorch's chunked scan."
    if request.param == "pytorch": monkeypatch.setattr(scan_module, "_loop", None)
    return request.param


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


# ---- issue 13 items 6, 7 and the unclear errors; issue 19 item 10 ------------------------------------------
def test_growing_decay_without_inf_times_zero():
    "Issue 13 item 6: a = 2, b zero except the last 5 steps: the loop's 1, 3, 7, 15, 31, not NaN (also time-invariant)."
    for L in (200, 5000):
        a, b = torch.full((2, L), 2.0), torch.zeros(2, L)
        b[:, -5:] = 1.0
        for f in (scan_sequential, scan_parallel, scan_chunked, scan, lambda a, b: scan(a[:, :1], b)):
            assert f(a, b)[:, -5:].tolist() == [[1.0, 3.0, 7.0, 15.0, 31.0]] * 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e30])
@pytest.mark.parametrize("lti", [True, False])
def test_outputs_before_t_ignore_later_inputs(bad, lti):
    "Issue 13 item 7: a NaN, inf or huge input at t = 30 leaves every output before t as the clean input gives it."
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 1 if lti else 200, generator=g) * 0.5 + 0.5
    b = torch.randn(2, 3, 200, generator=g)
    bb = b.clone(); bb[..., 30] = bad
    for h0 in (None, torch.randn(2, 3, generator=g)):
        h = scan(a, bb, h0)
        torch.testing.assert_close(h[..., :30], scan_sequential(a, b, h0)[..., :30], rtol=1e-5, atol=1e-5)
        if bad != 1e30: assert not torch.isfinite(h[..., 30:]).any()


def test_double_backward():
    "Issue 13: double backward through scan raised 'addcmul() out='; now second derivatives match finite differences."
    g = torch.Generator().manual_seed(0)
    for lti in (False, True):
        args = (torch.rand(2, 1 if lti else 6, generator=g, dtype=torch.float64, requires_grad=True),
                torch.randn(2, 6, generator=g, dtype=torch.float64, requires_grad=True), torch.randn(2, generator=g, dtype=torch.float64, requires_grad=True))
        assert torch.autograd.gradgradcheck(scan, args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computed_in_float32(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(3, 300, generator=g).to(dtype), torch.randn(3, 300, generator=g).to(dtype)
    h = scan(a, b)
    assert h.dtype == dtype
    ref = scan_sequential(a.double(), b.double())
    eps = torch.finfo(dtype).eps
    assert ((h.double() - ref).abs() <= eps * ref.abs() + 2 * eps).all()  # one rounding of a float32 result
    assert torch.equal(h, scan(a.float(), b.float()).to(dtype))  # exactly: the float32 scan, rounded once (a pure half loop is not)
    a.requires_grad_(); b.requires_grad_()
    scan(a, b).sum().backward()
    assert a.grad.dtype == dtype and torch.isfinite(a.grad.float()).all()


def test_scan_matrix_is_ssds_mask_for_one_state():
    "Lesson 07's h = L_a b: the columns of L_a are scans of unit inputs, and L_a is lesson 09's decay mask exp(segsum(log a)); ssd with N = p = 1, B = C = 1 is the scan."
    from ssm_course.ssd import segsum, ssd, ssd_quadratic
    g = torch.Generator().manual_seed(0)
    L = 40
    a, b = 0.3 + 0.7 * torch.rand(L, generator=g, dtype=torch.float64), torch.randn(L, generator=g, dtype=torch.float64)
    La = torch.tensor([[a[s + 1:t + 1].prod().item() if s <= t else 0.0 for s in range(L)] for t in range(L)], dtype=torch.float64)
    torch.testing.assert_close(scan_sequential(a, torch.eye(L, dtype=torch.float64)).T, La, rtol=2e-15, atol=0)  # column s: the scan of e_s (observed 8e-16)
    torch.testing.assert_close(segsum(a.log()).exp(), La, rtol=1e-14, atol=0)  # observed 5.6e-15
    one = torch.ones(1, L, 1, 1, dtype=torch.float64)
    for f in (ssd, ssd_quadratic):
        y = f(b.view(1, L, 1, 1), None, None, one, one, chunk_size=8, log_decay=a.log().view(1, L, 1))
        torch.testing.assert_close(y.view(L), La @ b, rtol=1e-15, atol=1e-15)  # observed 2.2e-16 on values up to 1.9
        torch.testing.assert_close(y.view(L), scan(a, b), rtol=1e-15, atol=1e-15)


def test_meta_and_integer_inputs():
    h = scan(torch.rand(4, 3, 10, device="meta"), torch.rand(4, 3, 10, device="meta"), torch.rand(4, 3, device="meta"))
    assert h.shape == (4, 3, 10) and h.device.type == "meta"
    assert scan(torch.ones(5, dtype=torch.int64), torch.ones(5, dtype=torch.int64)).dtype == torch.get_default_dtype()
    torch.testing.assert_close(scan(torch.full((5,), 2), torch.ones(5, dtype=torch.int32)), torch.tensor([1.0, 3, 7, 15, 31]))


def test_backward_saves_no_copy_of_b():
    "Issue 19 item 10: the autograd graph keeps a, h0 and h; of b only its shape and dtype."
    a = torch.rand(3, 50, requires_grad=True); b = torch.randn(3, 50, requires_grad=True)
    h = scan(a, b)
    saved = [t for t in h.grad_fn.saved_tensors if t is not None]
    assert not any(t is b or (t.data_ptr() == b.data_ptr()) for t in saved) and len(saved) == 2


def test_matches_mambapy_pscan():
    "An independent implementation: mambapy's pscan on its native (B, L, D, N) layout (skipped when mambapy is absent)."
    pscan = pytest.importorskip("mambapy.pscan").pscan
    g = torch.Generator().manual_seed(0)
    a, b = 0.8 + 0.2 * torch.rand(2, 16, 100, generator=g), torch.randn(2, 16, 100, generator=g)
    ref = pscan(a.transpose(1, 2)[..., None].contiguous(), b.transpose(1, 2)[..., None].contiguous())[..., 0].transpose(1, 2)
    torch.testing.assert_close(scan(a, b), ref, rtol=1e-5, atol=1e-5)


BAD2 = [
    (lambda: scan_chunked(torch.ones(3), torch.ones(3), chunk=2.5), TypeError, "chunk"),
    (lambda: scan_chunked(torch.ones(3), torch.ones(3), chunk=0), ValueError, "chunk"),
    (lambda: scan_chunked(torch.ones(3), torch.ones(3), chunk=True), TypeError, "chunk"),
    (lambda: scan(torch.ones(3, dtype=torch.bool), torch.ones(3)), TypeError, "a"),
    (lambda: scan(torch.ones(3), torch.ones(3, dtype=torch.bool)), TypeError, "b"),
]


@pytest.mark.parametrize("call,exc,word", BAD2, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD2)])
def test_bad_input_extra(call, exc, word):
    with pytest.raises(exc, match=rf"\b{word}\b"):
        call()



# ---- overflowing products (issue 13 item 6, review R-scan): exact, or non-finite, never a wrong finite number ------------------
def test_tiny_initial_state_across_overflowing_products():
    "h0 = 1e-30 with a = 2 over 200 steps: the exact state 2^200 * 1e-30 is finite; h0 is folded into b_0, never multiplied by a product."
    a, b, h0 = torch.full((1, 200), 2.0), torch.zeros(1, 200), torch.tensor([1e-30])
    exact = 2.0 ** torch.arange(1, 201, dtype=torch.float64) * h0.double()
    for f in (scan, scan_chunked, lambda *x: scan_chunked(*x, chunk=3)):
        assert torch.equal(f(a, b, h0)[0].double(), exact)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), L=st.integers(1, 400), hi=st.sampled_from([1.5, 2.0, 3.0, 3.9]), p_zero_a=st.floats(0, 0.3),
       p_zero_b=st.floats(0, 0.95), with_h0=st.booleans())
def test_growing_decays_exact_or_nonfinite(seed, L, hi, p_zero_a, p_zero_b, with_h0):
    "Positive decays in [0, hi) (some exactly 0) and positive inputs spanning 13 decades (many exactly 0): every finite output is the loop's."
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(2, L, generator=g) * hi
    a[torch.rand(2, L, generator=g) < p_zero_a] = 0.0
    b = torch.rand(2, L, generator=g) * torch.exp(-30 * torch.rand(2, L, generator=g))
    b[torch.rand(2, L, generator=g) < p_zero_b] = 0.0
    h0 = torch.rand(2, generator=g) * 1e-20 if with_h0 else None
    ref = scan_sequential(a.double(), b.double(), None if h0 is None else h0.double())
    for f in (scan, scan_parallel, scan_chunked, lambda *x: scan_chunked(*x, chunk=5)):
        h = f(a, b, h0).double()
        fin = torch.isfinite(h)
        assert not (fin & (ref.abs() > 1e39)).any()  # a true overflow is not hidden
        inrange = fin & (ref.abs() < 1e37)
        assert ((h - ref).abs() <= 1e-4 * ref.abs() + 1e-37)[inrange].all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("a_val", [4.0, 100.0])
def test_overflow_inside_a_chunk(dtype, a_val):
    "Products inside one 64-step chunk overflow (4^64, 100^64), the states do not: scan gives the loop's answer; a state that itself overflows is inf."
    b = torch.zeros(1, 200, dtype=dtype); b[0, -5:] = 1
    ref = scan_sequential(torch.full((1, 200), a_val, dtype=torch.float64), b.double())
    for f in (scan, scan_chunked, scan_parallel):
        h = f(torch.full((1, 200), a_val, dtype=dtype), b)
        assert ((h.double() - ref).abs() / ref.abs().clamp_min(1)).max() <= 2 * torch.finfo(dtype).eps
    huge = scan(torch.full((1, 200), 1e10, dtype=torch.float32), b.float())
    assert torch.equal(torch.isinf(huge), scan_sequential(torch.full((1, 200), 1e10, dtype=torch.float64), b.double()).abs() > torch.finfo(torch.float32).max)


# ---- issue 25 items 4 and 7: causality, bitwise -----------------------------------------------------------------------------------
BAD_VALUES = [float("nan"), float("inf"), -float("inf"), 1e30, 3e38]
SCANS = {"scan": scan, "scan_parallel": scan_parallel, "scan_chunked": scan_chunked}


@settings(max_examples=120, deadline=None)
@given(batch=st.lists(st.integers(1, 4), min_size=0, max_size=2), L=st.integers(2, 300), where=st.floats(0, 1), bad=st.sampled_from(BAD_VALUES),
       in_a=st.booleans(), lti=st.booleans(), hi=st.sampled_from([0.5, 1.0, 1.5]), with_h0=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.complex64]), f=st.sampled_from(sorted(SCANS)), seed=st.integers(0, 10_000))
def test_later_values_leave_earlier_outputs_bitwise(batch, L, where, bad, in_a, lti, hi, with_h0, dtype, f, seed):
    "Issue 25 items 4 and 7: a NaN, inf or huge value at step t (in b, or in a time-varying a) leaves every output before t bit-identical, on both CPU paths; a NaN makes every output from t on non-finite."
    g = torch.Generator().manual_seed(seed)
    t = min(L - 1, 1 + int(where * (L - 1)))
    a = (torch.rand(*batch, 1 if lti else L, generator=g, dtype=torch.float64) * 2 * hi - hi).to(dtype)
    b = torch.randn(*batch, L, generator=g, dtype=torch.float64).to(dtype)
    h0 = torch.randn(batch, generator=g, dtype=torch.float64).to(dtype) if with_h0 else None
    a2, b2 = a.clone(), b.clone()
    (a2 if in_a and not lti else b2)[..., t] = bad
    clean, dirty = SCANS[f](a, b, h0), SCANS[f](a2, b2, h0)
    torch.testing.assert_close(dirty[..., :t], clean[..., :t], rtol=0, atol=0, equal_nan=True)
    if bad != bad: assert not torch.isfinite(dirty[..., t:]).any()
    ref = scan_sequential(*(x if x is None else x.to(torch.complex128 if dtype.is_complex else torch.float64) for x in (a, b, h0)))
    fin = torch.isfinite(ref) & (ref.abs() < 1e30)
    eps = torch.finfo(dtype).eps
    assert ((clean - ref).abs() <= 1e3 * eps * (1 + ref.abs()))[fin].all()  # and the clean result is the loop's


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("lti", [True, False])
def test_nan_at_the_last_step_of_a_long_sequence(dtype, lti):
    "Issue 25 item 7 where every level of the PyTorch path runs (L = 5000: 79 chunks of 64, then 2 of 64): NaN at the last step, in b or a, changes nothing before it (it changed 4.8e-7)."
    g = torch.Generator().manual_seed(0)
    a = (0.5 + 0.5 * torch.rand(3, 1 if lti else 5000, generator=g)).to(dtype)
    b = torch.randn(2, 3, 5000, generator=g).to(dtype)
    h = scan(a, b)
    for x in ([b] if lti else [a, b]):
        x0 = x.clone()
        x[..., -1] = float("nan")
        h2 = scan(a, b)
        x.copy_(x0)
        assert torch.equal(h2[..., :-1], h[..., :-1]) and h2[..., -1].isnan().all()


# ---- issue 25 item 16: empty batches and the shortest sequences --------------------------------------------------------------------
@pytest.mark.parametrize("shapes", [((0, 1), (0, 5)), ((3, 1), (0, 3, 5)), ((1,), (0, 7)), ((2, 0, 1), (2, 0, 9)), ((0, 4), (0, 4)),
                                    ((2, 1), (2, 1)), ((2, 2), (2, 2)), ((1,), (3, 2)), ((3, 1), (3, 3))], ids=str)
@pytest.mark.parametrize("with_h0", [False, True])
def test_empty_batch_and_short_sequences(shapes, with_h0):
    "A zero batch gives an empty result (the time-invariant PyTorch path raised aminmax's RuntimeError); L = 1, 2, 3 equal the loop; gradients too."
    g = torch.Generator().manual_seed(0)
    a = (0.9 * torch.rand(shapes[0], generator=g, dtype=torch.float64)).requires_grad_()
    b = torch.randn(shapes[1], generator=g, dtype=torch.float64, requires_grad=True)
    shape = torch.broadcast_shapes(a.shape, b.shape)
    h0 = torch.randn(shape[:-1], generator=g, dtype=torch.float64, requires_grad=True) if with_h0 else None
    xs = [x for x in (a, b, h0) if x is not None]
    for f in (scan, scan_parallel, scan_chunked, lambda *x: scan(*x, return_last=True)[0]):
        h, ref = f(a, b, h0), scan_sequential(a, b, h0)
        assert h.shape == shape
        torch.testing.assert_close(h, ref, rtol=1e-12, atol=1e-12)
        w = torch.randn(shape, generator=g, dtype=torch.float64)
        for x, y in zip(torch.autograd.grad((h * w).sum(), xs, materialize_grads=True), torch.autograd.grad((ref * w).sum(), xs, materialize_grads=True)):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


# ---- issue 25 item 5: the caller's autocast does not lower the precision ------------------------------------------------------------
@pytest.mark.parametrize("f", sorted(SCANS) + ["scan_sequential"])
@pytest.mark.parametrize("lti", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_autocast_is_ignored(f, lti, dtype):
    "Under torch.autocast('cpu', bfloat16) every scan computes in float32: bit-identical to the result without autocast, forward and gradients (the time-invariant PyTorch path was 6.8e-3 off)."
    fn = {**SCANS, "scan_sequential": scan_sequential}[f]
    g = torch.Generator().manual_seed(0)
    a = (0.8 + 0.2 * torch.rand(4, 1 if lti else 300, generator=g)).to(dtype).requires_grad_()
    b = torch.randn(4, 300, generator=g).to(dtype).requires_grad_()
    h0 = torch.randn(4, generator=g).to(dtype).requires_grad_()
    w = torch.randn(4, 300, generator=g).to(dtype)
    def run():
        h = fn(a, b, h0)
        return [h] + list(torch.autograd.grad((h * w).real.sum(), (a, b, h0)))
    plain = run()
    with torch.autocast("cpu", torch.bfloat16): auto = run()
    ref = scan_sequential(*(x.detach().to(torch.complex128 if dtype.is_complex else torch.float64) for x in (a, b, h0)))
    assert ((plain[0] - ref).abs().max() / ref.abs().max()).item() < 1e-5  # the float32 result, checked against the loop
    for x, y in zip(auto, plain): assert x.dtype == y.dtype and torch.equal(x, y)


# ---- issue 25 item 18: torch.func ----------------------------------------------------------------------------------------------------
from torch.func import vmap, grad, jvp, jacrev, jacfwd, hessian

def _args(complex_=False, lti=False):
    g = torch.Generator().manual_seed(5)
    dt = torch.complex128 if complex_ else torch.float64
    a = 0.9 * torch.rand(4, 3, 1 if lti else 6, generator=g, dtype=torch.float64).to(dt)
    return a, torch.randn(4, 3, 6, generator=g, dtype=dt), torch.randn(4, 3, generator=g, dtype=dt)

TRANSFORMS = {
    "vmap": lambda s, a, b, h0: vmap(s)(a, b, h0),
    "vmap in_dims=(1, 1, 1)": lambda s, a, b, h0: vmap(s, in_dims=(1, 1, 1))(a, b, h0),
    "vmap a only": lambda s, a, b, h0: vmap(s, in_dims=(0, None))(a, b[0]),
    "vmap b only": lambda s, a, b, h0: vmap(s, in_dims=(None, 0))(a[0], b),
    "vmap h0 only": lambda s, a, b, h0: vmap(s, in_dims=(None, None, 0))(a[0], b[0], h0),
    "vmap of vmap": lambda s, a, b, h0: vmap(vmap(s))(a, b, h0),
    "grad": lambda s, a, b, h0: grad(lambda *x: (s(*x) * s(*x).conj()).real.sum(), argnums=(0, 1, 2))(a, b, h0),
    "jvp": lambda s, a, b, h0: jvp(s, (a, b, h0), (b[..., :a.shape[-1]], a.expand(b.shape), b[..., 0])),
    "jacrev": lambda s, a, b, h0: jacrev(s, argnums=(0, 1))(a[0, 0], b[0, 0]),
    "jacfwd": lambda s, a, b, h0: jacfwd(s, argnums=(0, 1))(a[0, 0], b[0, 0]),
    "vmap of grad": lambda s, a, b, h0: vmap(grad(lambda *x: (s(*x) * s(*x).conj()).real.sum(), argnums=(0, 1)))(a, b),
    "hessian": lambda s, a, b, h0: hessian(lambda a: (s(a, b[0, 0]) ** 3).sum())(a[0, 0]),
}


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.func.jvp imports its decompositions
@pytest.mark.parametrize("name", list(TRANSFORMS))
@pytest.mark.parametrize("kind", ["real", "complex", "lti"])
def test_torch_func_transforms(name, kind):
    "Issue 25 item 18: vmap, grad, jvp, jacrev, jacfwd and compositions of scan equal the same transforms of the loop (they raised: no setup_context)."
    args = _args(kind == "complex", kind == "lti")
    if kind == "complex" and name in ("jacrev", "jacfwd", "hessian"): pytest.skip("torch.func's jacrev and jacfwd take real inputs only (the loop's jacobians too)")
    got, ref = TRANSFORMS[name](scan, *args), TRANSFORMS[name](scan_sequential, *args)
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    assert len(got) == len(ref)
    for x, y in zip(got, ref): torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


# ---- issue 26: the lesson's reverse scan, and the engine module ---------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 60), seed=st.integers(0, 10_000), complex_=st.booleans(), with_h0=st.booleans(), lti=st.booleans())
def test_scan_backward_ref_is_the_gradient(L, seed, complex_, with_h0, lti):
    "Lesson 07's scan_backward_ref (one reverse scan) equals autograd through the float64 loop, real and complex, with and without h0, for a time-invariant decay summed back to its shape; and scan's backward equals it."
    g = torch.Generator().manual_seed(seed)
    dt = torch.complex128 if complex_ else torch.float64
    a = torch.randn(2, 3, 1 if lti else L, generator=g, dtype=dt) * 0.6
    b, gh = torch.randn(2, 3, L, generator=g, dtype=dt), torch.randn(2, 3, L, generator=g, dtype=dt)
    h0 = torch.randn(2, 3, generator=g, dtype=dt) if with_h0 else None
    xs = [x.clone().requires_grad_() for x in (a, b, h0) if x is not None]
    auto = torch.autograd.grad(scan_sequential(*xs), xs, gh)
    ref = [r for r in scan_backward_ref(a, h0, scan_sequential(a, b, h0), gh) if r is not None]
    assert (ref[2] is not None) if with_h0 else len(ref) == 2
    ref[0] = ref[0].sum_to_size(a.shape)  # a broadcast decay: its gradient summed over the broadcast axes
    for r, x in zip(ref, auto): torch.testing.assert_close(r, x, rtol=1e-12, atol=1e-12)
    xs = [x.clone().requires_grad_() for x in (a, b, h0) if x is not None]
    for o, r in zip(torch.autograd.grad(scan(*xs), xs, gh), ref): torch.testing.assert_close(o, r, rtol=1e-10, atol=1e-10)


def test_engine_does_not_import_the_public_module():
    "ssm_course._engine.scan (the fast paths, nbs/engine/scan.ipynb) is imported by ssm_course.scan, so it must not import ssm_course.scan itself at import time; the switch _loop and the paths scan uses are the engine's objects."
    import subprocess, sys
    code = ("import sys, ssm_course._engine.scan as E\nassert 'ssm_course.scan' not in sys.modules, 'the engine imported the public module'\n"
            "import ssm_course.scan as S\nassert all(getattr(S, n) is getattr(E, n) for n in ('_check_scan', '_dtype', '_loop', '_scan_loop', '_scan_cpu', '_scan_lti', '_scan_traced', '_empty'))\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_compiled_scan_state_passing_is_inf_times_zero_safe():
    "Under torch.compile, scan's state passing multiplies with lesson 07's _mul: products of growing decays that overflow times a zero state give 0, as the loop does (a plain * gave NaN from step 2)."
    a = torch.full((1, 200), float(np.exp(43.5)), dtype=torch.float32)
    b = torch.zeros(1, 200); b[0, 150] = 1.0
    y = torch.compile(lambda a, b: scan(a, b, backend="torch"), backend="eager", dynamic=True)(a, b)
    ref = scan_sequential(a.double(), b.double()).float()
    assert torch.equal(torch.isfinite(y), torch.isfinite(ref)) and not y[0, :150].any()


# ---- issue 32 item 2: a call nothing records runs the forward without the autograd Function -----------------------------------------
def _count_function_calls(monkeypatch):
    calls, Fs = [], (scan_module._Scan, scan_module._ScanWithJvp)
    for F, apply in [(F, F.apply) for F in Fs]:  # both bound before either is replaced (_ScanWithJvp inherits _Scan's)
        monkeypatch.setattr(F, "apply", (lambda apply: lambda *args: (calls.append(1), apply(*args))[1])(apply))
    return calls


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.complex64, torch.int64])
def test_plain_calls_skip_the_function(monkeypatch, dtype):
    "Issue 32 item 2: inputs that record no gradient (or torch.no_grad) run scan's forward directly (the Function's apply cost ~25 us of a 56 us call at (1, 1, 4)); the result equals the float64 loop in every layout (broadcast, h0, transposed, time-invariant), its dtype is the Function's, and the inputs are unchanged. Inputs that need gradients still go through the Function."
    calls = _count_function_calls(monkeypatch)
    g = torch.Generator().manual_seed(32)
    wide = torch.complex128 if dtype.is_complex else torch.float64
    def x(*shape): return (torch.rand(*shape, generator=g, dtype=torch.float64) * (2 if dtype == torch.int64 else 0.95)).to(wide).to(dtype)
    cases = [(x(3, 5, 40), x(3, 5, 40), None), (x(5, 1), x(3, 5, 40), x(3, 5)), (x(40, 5).mT, x(5, 40), None), (x(1, 40), x(3, 5, 40), x(5))]
    for a, b, h0 in cases:
        saved = [t.clone() for t in (a, b, h0) if t is not None]
        h = scan(a, b, h0)
        ref = scan_sequential(*(t if t is None else t.to(wide) for t in (a, b, h0)))
        assert h.dtype == (torch.float32 if dtype == torch.int64 else dtype) and h.grad_fn is None
        tol = {torch.float16: 2e-3, torch.float32: 2e-6, torch.complex64: 2e-6, torch.int64: 2e-6}.get(dtype, 1e-13)  # integers: 0 or 1, computed in float32
        assert ((h.to(ref.dtype) - ref).abs().max() / ref.abs().max()).item() < tol, (dtype, a.shape, b.shape)
        assert all(torch.equal(s, t) for s, t in zip(saved, (t for t in (a, b, h0) if t is not None)))
    assert calls == []
    if dtype.is_floating_point or dtype.is_complex:
        a, b = x(2, 30).requires_grad_(), x(2, 30)
        with torch.no_grad(): scan(a, b)
        assert calls == []  # nothing records under no_grad
        h = scan(a, b)
        assert calls == [1] and h.grad_fn is not None


def test_forward_ad_dual_inputs_still_get_their_tangent():
    "Dual tensors of torch.autograd.forward_ad record no gradient (requires_grad is False), yet the tangent must be computed: inside a dual level scan goes through the Function (a fast path keyed on requires_grad alone drops the tangent)."
    import torch.autograd.forward_ad as fwAD
    g = torch.Generator().manual_seed(33)
    a, b, ta, tb = (0.9 * torch.rand(3, 25, generator=g, dtype=torch.float64), torch.randn(3, 25, generator=g, dtype=torch.float64),
                    torch.randn(3, 25, generator=g, dtype=torch.float64), torch.randn(3, 25, generator=g, dtype=torch.float64))
    with fwAD.dual_level():
        h, th = fwAD.unpack_dual(scan(fwAD.make_dual(a, ta), fwAD.make_dual(b, tb)))
    with fwAD.dual_level():
        h_ref, th_ref = fwAD.unpack_dual(scan_sequential(fwAD.make_dual(a, ta), fwAD.make_dual(b, tb)))
    assert th is not None
    torch.testing.assert_close(h, h_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(th, th_ref, rtol=1e-12, atol=1e-12)
