"""Issue 32 (S4's forward on the CPU): `cauchy`'s compiled sums (engine/conv `_cauchy_fast`, numba) for calls that nothing
records, against an independent double sum in complex128; when the fast path is taken and when the Function runs instead."""
import numpy as np, pytest, torch
import torch.autograd.forward_ad as fwAD
from ssm_course._engine import conv as engine
from ssm_course.conv import cauchy, ssm_kernel_dplr
from ssm_course.hippo import dplr

pytestmark = pytest.mark.skipif(engine._sums is None, reason="numba is not installed: cauchy runs the Function only")


def loop(v, g, lam, skip):
    "sum_n v[..., m, n] / (g[..., j] - lam[..., n]) over n != skip[..., j]: Python complex arithmetic, one term at a time."
    shape = torch.broadcast_shapes(v.shape[:-2], g.shape[:-1], lam.shape[:-1], () if skip is None else skip.shape[:-1])
    M, N, Z = v.shape[-2], lam.shape[-1], g.shape[-1]
    vb, gb, lb = (x.to(torch.complex128).expand(*shape, *x.shape[-k:]).reshape(-1, *x.shape[-k:]).numpy() for x, k in ((v, 2), (g, 1), (lam, 1)))
    sb = None if skip is None else skip.expand(*shape, Z).reshape(-1, Z).numpy()
    out = np.zeros((len(vb), M, Z), np.complex128)
    for b in range(len(vb)):
        for m in range(M):
            for j in range(Z):
                out[b, m, j] = sum(complex(vb[b, m, n]) / (complex(gb[b, j]) - complex(lb[b, n])) for n in range(N) if sb is None or n != sb[b, j])
    return torch.from_numpy(out).reshape(*shape, M, Z)


@pytest.fixture
def calls(monkeypatch):
    "The row counts the compiled sums were called with (the fast path taken: a non-empty list)."
    seen, real = [], engine._sums
    if real is not None: monkeypatch.setattr(engine, "_sums", lambda *a: seen.append(len(a[2])) or real(*a))
    return seen


# (v, g, lam, skip) shapes: broadcast batches; N, M and Z that fill no vector evenly
SHAPES = [((3, 5), (9,), (5,), (9,)),
          ((2, 1, 4, 13), (3, 33), (13,), (2, 3, 33)),
          ((1, 1, 7), (2, 1, 17), (3, 7), None),
          ((4, 2, 64), (4, 100), (4, 64), (4, 100))]


@pytest.mark.parametrize("dtype, tol", [(torch.complex64, 2e-7), (torch.complex128, 1e-15)])
@pytest.mark.parametrize("shapes", SHAPES)
def test_fast_sums_equal_the_double_sum(shapes, dtype, tol, calls):
    """The compiled sums of a plain call (no gradient) against the double sum in complex128: both precisions (largest error
    observed 8.7e-8 and 3.4e-16 of the largest sum), broadcast batches, a pole left out at each point or none, odd sizes."""
    g = torch.Generator().manual_seed(SHAPES.index(shapes))
    sv, sg, sl, ss = shapes
    v, z = torch.randn(*sv, dtype=dtype, generator=g), 3 * torch.randn(*sg, dtype=dtype, generator=g)
    lam = torch.complex(-torch.rand(*sl, generator=g) - 0.1, 3 * torch.randn(*sl, generator=g)).to(dtype)
    skip = None if ss is None else torch.randint(0, sl[-1], ss, generator=g)
    y = cauchy(v, z, lam, skip=skip)
    assert calls, "the compiled sums were not used"
    ref = loop(v, z, lam, skip)
    assert y.dtype == dtype and y.shape == ref.shape
    assert (y.to(torch.complex128) - ref).abs().max() < tol * ref.abs().max()


def test_fast_path_only_where_nothing_records(calls):
    """Taken under torch.no_grad and for inputs that need no gradient; not taken (the Function runs) when an input needs its
    gradient, under torch.func.grad/vmap, forward-mode AD, a dispatch mode, or for real inputs."""
    g = torch.Generator().manual_seed(1)
    v, z, lam = (torch.randn(*s, dtype=torch.complex64, generator=g) for s in ((2, 6), (11,), (6,)))
    skip = torch.randint(0, 6, (11,), generator=g)
    f = lambda a, b, c: cauchy(a, b, c, skip=skip)
    f(v, z, lam); assert len(calls) == 1
    with torch.no_grad(): f(v.requires_grad_(), z, lam)
    assert len(calls) == 2
    out = f(v, z, lam)  # v needs its gradient: the Function, and the gradient flows
    out.abs().sum().backward(); assert v.grad is not None and len(calls) == 2
    v = v.detach()
    torch.func.grad(lambda c: f(v, z, c).abs().square().sum())(lam)
    torch.func.vmap(lambda a: f(a, z, lam))(torch.stack([v, 2 * v]))
    with fwAD.dual_level(): f(v, z, lam)  # a forward-mode level is active
    with engine._LargestTensor(): f(v, z, lam)
    cauchy(v.real, z.real, lam.real)  # real inputs: the Function
    assert len(calls) == 2


def test_fast_path_matches_the_function(monkeypatch):
    """S4's shapes (rank 1: 4 sums, HiPPO-LegS poles, points on the imaginary axis, the nearest pole skipped): the compiled sums
    equal the Function's (the lesson's blocks) to rounding; `_sums = None` gives the Function's values bit for bit."""
    Lam, P, B, _ = dplr("legs", 64)
    g = torch.Generator().manual_seed(2)
    C = torch.randn(64, dtype=torch.complex128, generator=g)
    for dtype, tol in ((torch.complex64, 5e-7), (torch.complex128, 2e-15)):  # observed 2.6e-7 and 5.6e-16 (sums), 2.4e-7 and 4.0e-16 (kernel)
        args = [x.to(dtype).expand(3, *x.shape) for x in (Lam, P, B, C)]
        dt = torch.tensor([[1e-3], [1e-2], [1e-1]], dtype=torch.float64)
        fast = ssm_kernel_dplr(*args, dt, 333)
        v = torch.randn(3, 4, 64, dtype=dtype, generator=g)
        z = 1j * torch.randn(3, 333, generator=g).to(dtype) * 50
        skip = torch.randint(0, 64, (3, 333), generator=g)
        y = cauchy(v, z, args[0], skip=skip)
        function = engine._Cauchy.apply(v, z, args[0], skip, 4096)
        assert (y - function).abs().max() < tol * function.abs().max()
        with monkeypatch.context() as mp:
            mp.setattr(engine, "_sums", None)
            assert torch.equal(cauchy(v, z, args[0], skip=skip), function)
            slow = ssm_kernel_dplr(*args, dt, 333)
        assert (fast - slow).abs().max() < tol * slow.abs().max()


def test_reciprocals_out_of_range_fall_back(calls):
    """Where a |g - lam|^2 of a pole not left out leaves the normal range (complex64: 1e-40 underflows, 1e40 overflows) or is
    NaN or inf (a point or pole not finite), the compiled sums' values are not used, and a v not finite skips them: the result
    is the Function's, bit for bit."""
    v = torch.ones(1, 3, dtype=torch.complex64)
    lam = torch.tensor([0, 1, 2], dtype=torch.complex64)
    for z, skip in [(torch.tensor([1e-20, 5.0], dtype=torch.complex64), None),  # |d|^2 = 1e-40 at pole 0
                    (torch.tensor([1e20j, 5.0], dtype=torch.complex64), None),  # |d|^2 = 1e40
                    (torch.tensor([0, 5.0], dtype=torch.complex64), torch.tensor([1, 0]))]:  # d = 0 at a pole not left out
        calls.clear()
        y = cauchy(v, z, lam, skip=skip)
        assert calls  # the compiled sums ran, and their values were not used:
        torch.testing.assert_close(y, engine._Cauchy.apply(v, z, lam, skip, 4096), rtol=0, atol=0, equal_nan=True)
    calls.clear()
    z, skip = torch.tensor([0, 5.0], dtype=torch.complex64), torch.tensor([0, 1])  # d = 0 only at the skipped pole: fast
    y = cauchy(v, z, lam, skip=skip)
    assert calls
    assert (y - loop(v, z, lam, skip)).abs().max() < 1e-6
    assert engine._cauchy_fast(v, z, lam, skip) is not None
    for z in (torch.tensor([float("nan"), 5.0]), torch.tensor([5.0, float("inf")])):  # a NaN or inf point: the sums run, the Function's values
        calls.clear()
        z = z.to(torch.complex64)
        torch.testing.assert_close(cauchy(v, z, lam), engine._Cauchy.apply(v, z, lam, None, 4096), rtol=0, atol=0, equal_nan=True)
        assert calls
    calls.clear()
    vn = v.clone(); vn[0, 1] = float("inf")
    torch.testing.assert_close(cauchy(vn, z, lam), engine._Cauchy.apply(vn, z, lam, None, 4096), rtol=0, atol=0, equal_nan=True)
    assert not calls  # v not finite: the Function, without calling the compiled sums


def test_rows_split_over_threads(monkeypatch):
    "With several threads and a big enough call, the rows are split among them: the same values as one thread, bit for bit."
    g = torch.Generator().manual_seed(3)
    v, z, lam = torch.randn(5, 4, 9, dtype=torch.complex64, generator=g), torch.randn(5, 31, dtype=torch.complex64, generator=g), torch.randn(9, dtype=torch.complex64, generator=g)
    skip = torch.randint(0, 9, (31,), generator=g)
    one = cauchy(v, z, lam, skip=skip)
    monkeypatch.setattr(engine, "_FAST_MIN", 1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert torch.equal(cauchy(v, z, lam, skip=skip), one)
    finally: torch.set_num_threads(threads)


# ---------------------------------------------------------------- C~'s products (engine/conv)

@pytest.fixture
def counted(monkeypatch):
    "Calls of the compiled products (`_powers`) by name."
    seen = {"powers": 0}
    for name in seen:
        real = getattr(engine, "_" + name)
        if real is None: continue  # switched off: nothing to count
        def wrap(*a, name=name, real=real):
            seen[name] += 1
            return real(*a)
        monkeypatch.setattr(engine, "_" + name, wrap)
    return seen


@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex64, torch.float64])
def test_times_power_equals_numpy_matrix_power(dtype, counted):
    """w M^q by the compiled products (one row's matrix at a time) against NumPy's matrix_power in complex128, with a batch of
    rows broadcast against fewer matrices (observed 1.4e-15 of the largest entry in double at q = 64, 6.8e-7 in complex64); autograd runs
    torch's products and gets the same values."""
    g = torch.Generator().manual_seed(4)
    cast = lambda x: (x if dtype.is_complex else x.real).to(dtype)
    M = cast(torch.randn(3, 1, 9, 9, dtype=torch.complex128, generator=g) / 3)
    w = cast(torch.randn(2, 9, dtype=torch.complex128, generator=g))
    for q in (2, 7, 64):
        y = engine._times_power(w, M, q)
        ref = np.einsum("bn,abnk->abk", w.to(torch.complex128).numpy(), np.linalg.matrix_power(M.to(torch.complex128).numpy(), q))
        tol = 1e-6 if dtype == torch.complex64 else 2e-15
        assert y.shape == (3, 2, 9) and y.dtype == dtype and np.abs(y.numpy() - ref).max() < tol * np.abs(ref).max()
    assert counted["powers"] == 3
    wg = w.clone().requires_grad_()
    y = engine._times_power(wg, M, 7)
    y.abs().sum().backward()
    assert counted["powers"] == 3 and wg.grad is not None
    assert (y.detach() - engine._times_power(w, M, 7)).abs().max() < 1e-5 * y.abs().max()


def test_c_tilde_fast_equals_dense_power(counted):
    "C~ = C(I - A-bar^L) with the compiled products (L = 2^14 + 5: dense squarings, then 64 products) against lesson 05's dense power."
    from ssm_course.conv import _dense_c_tilde
    Lam, P, B, _ = dplr("legs", 32)
    g = torch.Generator().manual_seed(5)
    C = torch.randn(3, 32, dtype=torch.complex128, generator=g)
    dt = torch.tensor([[1e-3], [0.02], [0.3]], dtype=torch.float64)
    args = (Lam.expand(3, 32), P.expand(3, *P.shape), B.expand(3, 32), C)
    L = 2 ** 14 + 5
    fast = engine._c_tilde(*args, dt, L)
    assert counted["powers"] == 1
    assert (fast - _dense_c_tilde(*args, dt, L)).abs().max() < 1e-16 * C.abs().max()  # observed 3.8e-18
