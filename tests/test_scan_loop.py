"""The compiled CPU loop of nbs/engine/scan.ipynb (numba, optional): it is lesson 07's reference loop, every CPU input takes it, and PyTorch's path still runs without it."""
import itertools, pytest, torch
import ssm_course.scan as S
from ssm_course.scan import scan, scan_sequential, scan_backward_ref

pytestmark = pytest.mark.skipif(S._loop is None, reason="numba is not installed (pip install 'ssm_course[fast]')")

def _ref(a, b, h0, reverse=False):
    if not reverse: return scan_sequential(a, b, h0)
    return scan_sequential(a.flip(-1) if a.shape[-1] > 1 else a, b.flip(-1), h0).flip(-1)

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128])
def test_loop_is_the_reference_loop(dtype):
    "Real inputs: bit-identical to scan_sequential; complex: to rounding (complex products are formed differently)."
    g = torch.Generator().manual_seed(0)
    for (shp_a, shp_b), L, with_h0, reverse in itertools.product(
            [((1,), (1,)), ((5,), (5,)), ((2, 3), (2, 3)), ((3, 1), (3, 4)), ((1, 4), (3, 4))], [1, 2, 9, 40, 100], [False, True], [False, True]):
        for La in {1, L}:
            a = (0.95 * torch.randn(*shp_a, La, generator=g, dtype=torch.float64)).to(dtype)
            b = torch.randn(*shp_b, L, generator=g, dtype=torch.float64).to(dtype)
            shape = torch.broadcast_shapes(a.shape, b.shape)
            h0 = torch.randn(shape[:-1], generator=g, dtype=torch.float64).to(dtype) if with_h0 else None
            got = S._scan_loop(S._loop, a, b, h0, shape, dtype, reverse)
            ref = _ref(a, b, h0, reverse)
            if dtype.is_complex:
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                assert err < (1e-6 if dtype == torch.complex64 else 1e-14), (shp_a, shp_b, L, La, with_h0, reverse, err)
            else: assert torch.equal(got, ref), (shp_a, shp_b, L, La, with_h0, reverse)

def test_scan_takes_the_loop_on_cpu(monkeypatch):
    "The public scan (forward and its reverse-scan backward) runs the loop on CPU tensors; with _loop = None, PyTorch's path agrees."
    calls = []
    loop = S._loop
    monkeypatch.setattr(S, "_loop", lambda *args: (calls.append(args[-1]), loop(*args))[1])
    g = torch.Generator().manual_seed(1)
    a = (0.9 + 0.1 * torch.rand(3, 7, 50, generator=g)).requires_grad_()
    b = torch.randn(3, 7, 50, generator=g, requires_grad=True)
    h = scan(a, b)
    h.square().sum().backward()
    assert calls == [False, True]  # forward, then the reverse scan of the backward
    assert torch.equal(h.detach(), scan_sequential(a.detach(), b.detach()))
    da, db = a.grad.clone(), b.grad.clone()
    monkeypatch.setattr(S, "_loop", None)
    a.grad = b.grad = None
    h2 = scan(a, b); h2.square().sum().backward()
    torch.testing.assert_close(h2, h.detach(), rtol=2e-6, atol=2e-6)
    for x, y in ((a.grad, da), (b.grad, db)): assert ((x - y).abs().max() / y.abs().max()).item() < 1e-5  # float32 rounding, relative to the largest

def test_loop_gradcheck():
    g = torch.Generator().manual_seed(2)
    a = (0.9 * torch.rand(2, 3, 11, generator=g, dtype=torch.float64)).requires_grad_()
    b = torch.randn(2, 3, 11, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(scan, (a, b, h0))
    assert torch.autograd.gradgradcheck(scan, (a, b, h0))

def test_loop_leaves_inputs_alone_and_handles_views():
    "Non-contiguous, conjugated and broadcast inputs are read correctly and never written."
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 30, 6, generator=g, dtype=torch.complex64).transpose(1, 2)  # (4, 6, 30), not contiguous
    b = torch.randn(6, 30, generator=g, dtype=torch.complex64).conj()  # a conjugate view, broadcast over the batch
    a0, b0 = a.clone(), b.clone()
    h = scan(a, b)
    assert torch.equal(a, a0) and torch.equal(b.resolve_conj(), b0.resolve_conj())
    ref = scan_sequential(a.to(torch.complex128), b.resolve_conj().to(torch.complex128))
    assert ((h - ref).abs().max() / ref.abs().max()).item() < 1e-6

def test_growing_and_nonfinite_values_follow_the_loop():
    "|a| > 1 and NaN/inf: exactly what the reference loop gives (NaN from the first NaN on, nothing before it)."
    a = torch.tensor([[2.0] * 130, [0.5] * 130])
    b = torch.ones(2, 130); b[1, 60] = float("nan")
    h = scan(a, b)
    assert torch.equal(h[:, :60], scan_sequential(a, b)[:, :60]) and h[1, 60:].isnan().all() and torch.isinf(h[0, -1])

def test_threads_split_the_rows_without_changing_the_result(monkeypatch):
    "Large inputs run on torch.get_num_threads() threads, each on its own rows: bit-identical to one thread, also for a row count the threads do not divide."
    calls, loop = [], S._loop
    monkeypatch.setattr(S, "_loop", lambda *args: (calls.append(len(args[1])), loop(*args))[1])  # rows per call
    g = torch.Generator().manual_seed(4)
    a, b = 0.9 + 0.1 * torch.rand(3, 67, 2 ** 14, generator=g), torch.randn(67, 2 ** 14, generator=g)  # 3 * 67 rows, 2^14 steps: above the threshold
    h0 = torch.randn(3, 67, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1); one = scan(a, b, h0)
        torch.set_num_threads(3); three = scan(a, b, h0)
        torch.set_num_threads(3); rev = S._scan_loop(S._loop, a, b, None, (3, 67, 2 ** 14), torch.float32, reverse=True)
        torch.set_num_threads(1); rev1 = S._scan_loop(S._loop, a, b, None, (3, 67, 2 ** 14), torch.float32, reverse=True)
    finally: torch.set_num_threads(threads)
    assert torch.equal(one, three) and torch.equal(rev, rev1)
    assert sorted(calls) == [67] * 6 + [201, 201]  # one call on one thread, three calls of 67 rows on three
    assert torch.equal(three[1, 5], scan_sequential(a[1, 5], b[5], h0[1, 5]))

def test_backward_is_the_lessons_reverse_scan_bit_for_bit():
    "On the loop, scan's backward (real inputs of full shape) is lesson 07's scan_backward_ref bit for bit: the same reverse loop, the same products."
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.float64):
        for L, with_h0 in itertools.product([1, 2, 37, 300], [False, True]):
            a, b = (0.95 * torch.randn(3, 3, L, generator=g, dtype=torch.float64)).to(dtype), torch.randn(3, 3, L, generator=g, dtype=torch.float64).to(dtype)  # 9 rows: a group of 8 in tiles, 1 left
            h0 = torch.randn(3, 3, generator=g, dtype=torch.float64).to(dtype) if with_h0 else None
            gh = torch.randn(3, 3, L, generator=g, dtype=torch.float64).to(dtype)
            xs = [x.clone().requires_grad_() for x in (a, b, h0) if x is not None]
            ours = torch.autograd.grad(scan(*xs), xs, gh)
            ref = [r for r in scan_backward_ref(a, h0, scan_sequential(a, b, h0), gh) if r is not None]
            assert all(o.dtype == r.dtype and torch.equal(o, r) for o, r in zip(ours, ref)), (dtype, L, with_h0)


def test_loop_tiles_are_the_reference_loop():
    "Issue 32: real inputs varying in time, forward and from the end, run eight rows at a time as vectors (8 x 8 tiles transposed in registers, `_tile_vectors`): bit-identical to scan_sequential for every row count (whole groups of 8 and the rest, 4 rows at a time) and length (whole tiles and the L % 8 steps no tile covers), with broadcast row maps, an initial state, growing decays and a NaN."
    g = torch.Generator().manual_seed(6)
    for dtype in (torch.float32, torch.float64):
        for (shp_a, shp_b), L, reverse in itertools.product([((8,), (8,)), ((3, 5), (3, 5)), ((4, 1, 9), (4, 3, 9)), ((1, 16), (3, 16))], [7, 8, 9, 16, 31, 100], [False, True]):
            a = (1.05 * torch.rand(*shp_a, L, generator=g, dtype=torch.float64) - 0.5).to(dtype)  # |a| up to 0.55, some above 0.5
            b = torch.randn(*shp_b, L, generator=g, dtype=torch.float64).to(dtype)
            shape = torch.broadcast_shapes(a.shape, b.shape)
            h0 = torch.randn(shape[:-1], generator=g, dtype=torch.float64).to(dtype)
            assert torch.equal(S._scan_loop(S._loop, a, b, h0, shape, dtype, reverse), _ref(a, b, h0, reverse)), (dtype, shp_a, shp_b, L, reverse)
        a, b = torch.full((9, 43), 1.5, dtype=dtype), torch.randn(9, 43, generator=g, dtype=torch.float64).to(dtype)
        b[2, 13] = float("nan")
        for reverse in (False, True):
            got, ref = S._scan_loop(S._loop, a, b, None, (9, 43), dtype, reverse), _ref(a, b, None, reverse)
            assert torch.equal(got[~ref.isnan()], ref[~ref.isnan()]) and torch.equal(got.isnan(), ref.isnan()), (dtype, reverse)

def test_loop_compiles_the_tiles_as_vectors():
    "Issue 32: the common case's tiles are compiled as vectors of eight steps, transposed with shuffles, and the loop asks the CPU to prefetch the rows 32 steps ahead. Measured with `scan` against the time-major NumPy loop (one thread, medians of 5 interleaved rounds, load 2.6 on 2 cores): (64, 64, 784) float32 0.83 -> 0.58, (32, 64, 128) 0.79 -> 0.51, (16, 128, 1024) 0.49 -> 0.30; (8, 256, 4096) 0.49 -> 0.44 and (4, 256, 16384) 0.36 -> 0.29 (3 rounds); forward + backward of scan alone 0.74, 0.71, 0.71 of its former time at the first three (9 rounds). Complex inputs keep four scalar chains."
    import numba
    for dtype, vec in ((torch.float32, "<8 x float>"), (torch.float64, "<8 x double>")):
        loop = numba.njit(S._loop.py_func)  # compiled afresh (the on-disk cache keeps no IR to inspect), for this dtype only
        a, b = torch.rand(9, 50, dtype=dtype), torch.randn(9, 50, dtype=dtype)
        S._scan_loop(loop, a, b, None, (9, 50), dtype)
        ir = "".join(loop.inspect_llvm().values())
        assert "shufflevector" in ir and "llvm.prefetch" in ir, dtype
        assert ir.count(f"fmul {vec}") >= 16 and ir.count(f"fadd {vec}") >= 16, dtype  # eight vector steps forward, eight from the end
