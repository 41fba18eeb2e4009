"""ssm_course.conv and .inits: cross-checks against float64 loops (hypothesis), scipy, dense kernels, and bad input."""
import contextlib, math, numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st
from scipy.signal import lfilter
from ssm_course import conv
from ssm_course._engine import conv as engine  # causal_conv's paths (nbs/engine/conv.ipynb)
from ssm_course.conv import causal_conv, ssm_kernel, krylov, ssm_kernel_diag, ssm_kernel_dplr, ssm_recurrence, dss_kernel, next_fast_len, cauchy
from ssm_course.discretize import discretize, discretize_diag
from ssm_course.hippo import dplr, hippo
from ssm_course.inits import s4d_init, dss_init, log_uniform_dt
from ssm_course.ssm import random_ssm


def kernel_loop(dA, dB, C, L):
    "Float64 reference: the sum over states of C dB dA^l, one state and one lag at a time (0^0 = 1)."
    out = []
    for l in range(L):
        out.append(sum(complex(C[n]) * complex(dB[n]) * (complex(dA[n]) ** l if l else 1) for n in range(len(dA))))
    return np.array(out)


def np_conv(u, K):
    "The causal convolution by `np.convolve` (direct sums, in double precision), row by row: an independent reference."
    L = u.shape[-1]
    ub, Kb = torch.broadcast_tensors(u, K[..., :L])
    wide = torch.complex128 if u.is_complex() or K.is_complex() else torch.float64
    rows = zip(ub.reshape(-1, L).to(wide).numpy(), Kb.reshape(-1, L).to(wide).numpy())
    return torch.from_numpy(np.stack([np.convolve(a, k)[:L] for a, k in rows])).reshape(ub.shape)


def direct_sum(u, K):
    "y_t = sum_{s <= t} K_s u_{t-s}, term by term (the definition)."
    L, K = u.shape[-1], K[..., :u.shape[-1]]
    return torch.stack([sum(K[..., s] * u[..., t - s] for s in range(min(t + 1, K.shape[-1]))) for t in range(L)], -1)


# ---------------------------------------------------------------- ssm_kernel_diag

@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 6), L=st.integers(1, 300), seed=st.integers(0, 10_000), radius=st.floats(0.0, 1.0), block=st.sampled_from([None, 1, 3, 16]))
def test_kernel_diag_matches_loop(N, L, seed, radius, block):
    g = torch.Generator().manual_seed(seed)
    dA = (radius * torch.rand(N, generator=g, dtype=torch.float64)) * torch.exp(2j * math.pi * torch.rand(N, generator=g, dtype=torch.float64))
    dB, C = torch.randn(N, generator=g, dtype=torch.complex128), torch.randn(N, generator=g, dtype=torch.complex128)
    K = ssm_kernel_diag(dA, dB, C, L, block=block).numpy()
    ref = kernel_loop(dA, dB, C, L)
    np.testing.assert_allclose(K, ref, atol=1e-12 * max(1.0, np.abs(ref).max()), rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 5), L=st.integers(1, 200), seed=st.integers(0, 10_000))
def test_kernel_diag_float32_near_unit_circle(N, L, seed):
    "complex64 in, complex64 out, within float32 rounding of the float64 loop even with |dA| = 1 - 1e-6."
    g = torch.Generator().manual_seed(seed)
    dA = ((1 - 1e-6) * torch.exp(2j * math.pi * torch.rand(N, generator=g, dtype=torch.float64))).to(torch.complex64)
    dB, C = torch.randn(N, generator=g, dtype=torch.complex64), torch.randn(N, generator=g, dtype=torch.complex64)
    K = ssm_kernel_diag(dA, dB, C, L)
    assert K.dtype == torch.complex64
    ref = kernel_loop(dA.to(torch.complex128), dB.to(torch.complex128), C.to(torch.complex128), L)
    scale = (dB.abs() * C.abs()).sum().item()
    assert np.abs(K.numpy() - ref).max() <= 1e-6 * scale


def test_kernel_diag_real_inputs_stay_real():
    lam, B = s4d_init("real", 6, torch.complex128)
    dA, dB = discretize_diag(lam, B, 0.1)
    K = ssm_kernel_diag(dA, dB, torch.ones(6, dtype=torch.float64), 40)
    assert K.dtype == torch.float64
    np.testing.assert_allclose(K.numpy(), kernel_loop(dA, dB, torch.ones(6), 40).real, rtol=1e-12)


def test_kernel_diag_zero_eigenvalue_value_and_gradient():
    "Issue 13 item 5: a state with dA = 0 gives C dB at l = 0 and d K_1 / d dA = C dB (the log trick gave 0)."
    dB, C = torch.tensor([0.7, -1.3, 2.0], dtype=torch.float64), torch.tensor([1.5, 0.4, -0.2], dtype=torch.float64)
    dA = torch.tensor([0.0, 0.0, 0.5], dtype=torch.float64, requires_grad=True)
    K = ssm_kernel_diag(dA, dB, C, 5)
    np.testing.assert_allclose(K.detach().numpy(), kernel_loop(dA.detach(), dB, C, 5).real, rtol=1e-14, atol=1e-15)
    grad, = torch.autograd.grad(K[1], dA)
    torch.testing.assert_close(grad, C * dB, rtol=1e-14, atol=0)
    for L in (1, 2, 3):  # kernels shorter than the two special lags
        np.testing.assert_allclose(ssm_kernel_diag(dA.detach(), dB, C, L).numpy(), kernel_loop(dA.detach(), dB, C, L).real, rtol=1e-14)


@pytest.mark.parametrize("case", ["zero", "near_one", "real_signs", "mixed"])
def test_kernel_diag_gradcheck(case):
    "gradcheck in float64 at dA = 0 and |dA| near 1, complex and real."
    g = torch.Generator().manual_seed(5)
    if case == "zero": dA = torch.tensor([0.0, 0.3 + 0.4j, 0.0], dtype=torch.complex128)
    elif case == "near_one": dA = (1 - 1e-7) * torch.exp(1j * torch.randn(3, generator=g, dtype=torch.float64))
    elif case == "real_signs": dA = torch.tensor([0.0, -0.999999, 0.6], dtype=torch.float64)
    else: dA = torch.tensor([0.0, 1 - 1e-6, -0.5j], dtype=torch.complex128)
    ct = dA.dtype
    dB, C = torch.randn(3, generator=g, dtype=ct), torch.randn(3, generator=g, dtype=ct)
    args = [x.clone().requires_grad_() for x in (dA, dB, C)]
    for block in (None, 4):
        assert torch.autograd.gradcheck(lambda a, b, c: ssm_kernel_diag(a, b, c, 17, block=block), args)


def test_kernel_diag_dtypes():
    "Integers give floats; half precision is computed in float32 and cast back."
    torch.testing.assert_close(ssm_kernel_diag(torch.tensor([1, 0]), torch.tensor([1, 2]), torch.tensor([1, 1]), 3), torch.tensor([3.0, 1.0, 1.0]))
    dA = torch.tensor([0.9, -0.5, 0.25])
    for half in (torch.float16, torch.bfloat16):
        K = ssm_kernel_diag(dA.to(half), torch.ones(3, dtype=half), torch.ones(3, dtype=half), 20)
        assert K.dtype == half
        assert torch.equal(K, ssm_kernel_diag(dA.to(half).float(), torch.ones(3), torch.ones(3), 20).to(half))  # float32, rounded once


# ---------------------------------------------------------------- causal_conv

FFTS = ["ducc0", "torch.fft"]


@contextlib.contextmanager
def fft_backend(name):
    "The CPU path's transforms: ducc0's (skipped where it is not installed) or torch.fft's (`ssm_course._engine.conv.ducc0 = None`, as without it)."
    saved = engine.ducc0, engine._CPU_MIN_L, engine._CPU_MIN_SIZE
    if name == "ducc0" and saved[0] is None: pytest.skip("ducc0 is not installed (pip install 'ssm_course[fast]')")
    if name == "torch.fft": engine.ducc0 = None
    engine._CPU_MIN_L = engine._CPU_MIN_SIZE = 0  # the CPU path also for the small shapes of these tests
    try: yield
    finally: engine.ducc0, engine._CPU_MIN_L, engine._CPU_MIN_SIZE = saved


def use_fft(name, monkeypatch):
    "`fft_backend` for the rest of a test (monkeypatch undoes it)."
    if name == "ducc0" and engine.ducc0 is None: pytest.skip("ducc0 is not installed (pip install 'ssm_course[fast]')")
    if name == "torch.fft": monkeypatch.setattr(engine, "ducc0", None)
    monkeypatch.setattr(engine, "_CPU_MIN_L", 0); monkeypatch.setattr(engine, "_CPU_MIN_SIZE", 0)  # the CPU path also for small shapes


@settings(max_examples=25, deadline=None)
@given(L=st.integers(1, 400), LK=st.integers(1, 500), seed=st.integers(0, 10_000))
def test_causal_conv_matches_lfilter(L, LK, seed):
    "An FIR filter is a causal convolution: scipy.signal.lfilter(K, 1, u) is the reference."
    rng = np.random.default_rng(seed)
    u, K = rng.standard_normal((2, L)), rng.standard_normal(LK)
    ref = lfilter(K, [1.0], u, axis=-1)
    for fft in FFTS[int(engine.ducc0 is None):]:
        with fft_backend(fft): y = causal_conv(torch.from_numpy(u), torch.from_numpy(K)).numpy()
        np.testing.assert_allclose(y, ref, atol=1e-10 * (1 + np.abs(K).sum()))


SHAPES = [((3, 5, 30), (5, 30)), ((30,), (4, 30)), ((2, 1, 30), (3, 20)), ((2, 3, 30), (2, 3, 30)), ((6, 30), (1, 30)), ((20, 33), (33,)), ((1,), (1,))]


@pytest.mark.parametrize("fft", FFTS)
@pytest.mark.parametrize("ushape,kshape", SHAPES)
def test_causal_conv_paths_and_grad(ushape, kshape, fft):
    "The CPU path (ducc0 or torch.fft transforms) and the torch path equal the direct sum, broadcasting included; gradcheck."
    g = torch.Generator().manual_seed(0)
    u = torch.randn(ushape, generator=g, dtype=torch.float64)
    K = torch.randn(kshape, generator=g, dtype=torch.float64)
    ref = direct_sum(u, K)
    with fft_backend(fft):
        torch.testing.assert_close(causal_conv(u, K), ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(causal_conv(u.float(), K.float()), ref.float(), rtol=1e-5, atol=1e-5)
        args = (u[..., :9].clone().requires_grad_(), K[..., :9].clone().requires_grad_())
        assert torch.autograd.gradcheck(causal_conv, args)
    if fft == "ducc0": return  # the torch path does not depend on it
    torch.testing.assert_close(engine._causal_torch(u, K[..., :u.shape[-1]]), ref, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(engine._causal_torch, args)


@pytest.mark.parametrize("fft", FFTS)
def test_causal_conv_many_rows(fft):
    "More rows than one CPU block (8), a kernel shared by them: the blocked loop and its backward against the torch path."
    g = torch.Generator().manual_seed(1)
    u = torch.randn(3, 7, 100, generator=g, dtype=torch.float64, requires_grad=True)
    K = torch.randn(7, 100, generator=g, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(3, 7, 100, generator=g, dtype=torch.float64)
    with fft_backend(fft): y1 = causal_conv(u, K); g1 = torch.autograd.grad(y1, (u, K), gy)
    y2 = engine._causal_torch(u, K); g2 = torch.autograd.grad(y2, (u, K), gy)
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y1, direct_sum(u, K), rtol=1e-12, atol=1e-12)  # and the definition, term by term
    for a, b in zip(g1, g2): torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("path", ["ducc0", "torch.fft", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_causal_conv_is_causal(path, dtype, monkeypatch):
    "Issue 13 item 7: a NaN, an inf or a huge value at t0 leaves y[:t0] as the prefix alone gives it; NaN from t0 on."
    if path != "torch": use_fft(path, monkeypatch)
    f = engine._causal_torch if path == "torch" else causal_conv
    g = torch.Generator().manual_seed(2)
    u, K = torch.randn(2, 3, 300, generator=g, dtype=dtype), torch.randn(3, 300, generator=g, dtype=dtype) / 10
    tol = 1e-5 if dtype in (torch.float32, torch.complex64) else 1e-12
    for t0 in (1, 30, 299):
        clean = np_conv(u[..., :t0], K[..., :t0])
        for bad in (math.nan, math.inf, -math.inf, 1e6, 1e30):
            ub = u.clone(); ub[..., t0] = bad
            y = f(ub, K)
            assert torch.isfinite(y[..., :t0]).all()
            assert ((y[..., :t0] - clean).abs().max() / clean.abs().max()).item() < tol, (t0, bad)
            if not math.isfinite(bad): assert torch.isnan(y[..., t0:]).all()
            ub = u.clone(); ub[..., -1] = bad  # at the last step
            y = f(ub, K)
            ref = np_conv(u[..., :-1], K[..., :-1])
            assert ((y[..., :-1] - ref).abs().max() / ref.abs().max()).item() < tol


def test_causal_conv_huge_value_leak_is_gone():
    "The repro: a 1e6 input at the last step moved earlier float32 outputs by ~1e-2 relative through FFT round-off."
    g = torch.Generator().manual_seed(3)
    u, K = torch.randn(4, 8, 4096, generator=g), torch.randn(8, 4096, generator=g) / 64
    ub = u.clone(); ub[..., -1] = 1e6
    ref = np_conv(u[..., :-1], K[..., :-1]).float()
    leak = ((conv.fft_conv(ub, K)[..., :-1] - ref).abs().max() / ref.abs().max()).item()
    fixed = ((causal_conv(ub, K)[..., :-1] - ref).abs().max() / ref.abs().max()).item()
    assert leak > 1e-4 and fixed < 1e-6


@pytest.mark.parametrize("fft", FFTS)
def test_causal_conv_growing_input(fft, monkeypatch):
    "A ramp and an exponentially growing input: several passes of step 2, still the direct sum."
    use_fft(fft, monkeypatch)
    L = 200
    t = torch.arange(L, dtype=torch.float64)
    K = torch.randn(L, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for u in (t, torch.exp(t / 10), torch.cat([torch.zeros(50, dtype=torch.float64), torch.ones(150, dtype=torch.float64)])):
        ref = direct_sum(u, K)
        for f in (causal_conv, engine._causal_torch):
            torch.testing.assert_close(f(u, K), ref, rtol=1e-10, atol=1e-10 * ref.abs().max().item())
        y = causal_conv(u.float(), K.float())  # float32: each output within float32 rounding of its own inputs' size
        scale = torch.stack([(K[:s + 1].abs() * u[:s + 1].flip(0).abs()).sum() for s in range(L)])
        err = (y.double() - ref).abs()
        assert (err[scale == 0] == 0).all() and (err[scale > 0] / scale[scale > 0]).max() < 1e-5  # an output with no input is exactly 0


@pytest.mark.parametrize("fft", FFTS)
def test_causal_conv_nonfinite_kernel(fft, monkeypatch):
    use_fft(fft, monkeypatch)
    u = torch.randn(2, 3, 60, dtype=torch.float64)
    K = torch.randn(3, 60, dtype=torch.float64); K[1, 20] = math.inf
    for f in (causal_conv, engine._causal_torch):
        y = f(u, K)
        assert torch.isnan(y[:, 1, 20:]).all() and torch.isfinite(y[:, 1, :20]).all() and torch.isfinite(y[:, [0, 2]]).all()
        torch.testing.assert_close(y[:, 1, :20], direct_sum(u[:, 1, :20], K[1, :20]))


def count_passes(monkeypatch):
    "Wrap both paths' per-pass functions (FFT passes, and the direct sums that end the loop, `_head_sums` on the torch path); the returned list collects the length of every pass."
    calls = []
    np_pass, np_direct, scaled_conv, head_sums = engine._np_pass, engine._np_direct, engine._scaled_conv, engine._head_sums
    monkeypatch.setattr(engine, "_head_sums", lambda u, K, P: (calls.append(P), head_sums(u, K, P))[1])
    monkeypatch.setattr(engine, "_np_pass", lambda A, *a, **k: (calls.append(A.shape[-1]), np_pass(A, *a, **k))[1])
    monkeypatch.setattr(engine, "_np_direct", lambda A, *a: (calls.append(A.shape[-1]), np_direct(A, *a))[1])
    monkeypatch.setattr(engine, "_scaled_conv", lambda u, *a: (calls.append(u.shape[-1]), scaled_conv(u, *a))[1])
    return calls


@pytest.mark.parametrize("path", ["ducc0", "torch.fft", "torch"])
@pytest.mark.parametrize("case", ["exp float64", "2^t float64", "exp float32", "ordinary float32"])
def test_causal_conv_passes_are_bounded(path, case, monkeypatch):
    "Step 2 is a loop of at most 1 + ceil(log16(max/min nonzero |u|)) passes (each pass's largest input < 1/16 of the last's),"
    " and its outputs are the direct sums to rounding of each output's own scale sum_s |K_s u_(t-s)|."
    g = torch.Generator().manual_seed(7)
    if case == "exp float64": L, u, dt = 4096, torch.exp(torch.arange(4096, dtype=torch.float64) / 25), torch.float64
    elif case == "2^t float64": L, u, dt = 2000, torch.exp2(torch.arange(2000, dtype=torch.float64) - 1000), torch.float64  # 2^-1000 .. 2^999
    elif case == "exp float32": L, u, dt = 4096, torch.exp(torch.arange(4096, dtype=torch.float64) / 50 - 40).float(), torch.float32
    else: L, u, dt = 4096, torch.randn(3, 4096, generator=g), torch.float32
    K = (torch.randn(L, generator=g, dtype=torch.float64) / math.sqrt(L)).to(dt)
    un, Kn = u.double().numpy().reshape(-1, L), K.double().numpy()
    ref = np.stack([np.convolve(r, Kn)[:L] for r in un]); scale = np.stack([np.convolve(np.abs(r), np.abs(Kn))[:L] for r in un])
    if path != "torch": use_fft(path, monkeypatch)
    calls = count_passes(monkeypatch)
    y = engine._causal_torch(u, K) if path == "torch" else causal_conv(u, K)
    a = u.abs().double()
    bound = 1 + math.ceil((math.log2(a.max()) - math.log2(a[a > 0].min())) / 4)
    assert len(calls) <= bound, (len(calls), bound)
    if case == "ordinary float32": assert len(calls) <= 2 and sum(calls) < 1.01 * L
    if case.startswith("exp"): assert len(calls) >= bound - 2  # the worst case really is exercised
    tol = 1e-13 if dt == torch.float64 else 3e-5  # float32: observed 1.4e-5 (early outputs are small next to the FFT's rounding)
    assert (np.abs(y.double().numpy().reshape(-1, L) - ref) / np.where(scale > 0, scale, 1)).max() < tol


@pytest.mark.parametrize("path", ["ducc0", "torch.fft", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_conv_near_overflow(path, dtype, monkeypatch):
    "Finite outputs stay finite for inputs or taps far below the largest float (fft_conv's spectra overflow there)."
    g = torch.Generator().manual_seed(8)
    u, K = torch.randn(2, 3, 500, generator=g, dtype=dtype), torch.randn(3, 500, generator=g, dtype=dtype) / 20
    clean = np_conv(u, K).to(dtype)
    for su, sK in [(1e35, 1.0), (1.0, 1e35), (1e18, 1e18)] if dtype == torch.float32 else [(1e306, 1.0), (1.0, 1e306), (1e160, 1e146)]:
        assert not torch.isfinite(conv.fft_conv(u * su, K * sK)).all()
        if path != "torch": use_fft(path, monkeypatch)
        y = engine._causal_torch(u * su, K * sK) if path == "torch" else causal_conv(u * su, K * sK)
        assert torch.isfinite(y).all()
        assert ((y / su / sK - clean).abs().max() / clean.abs().max()).item() < (1e-6 if dtype == torch.float32 else 1e-14)


def test_causal_conv_dtypes_and_empty():
    torch.testing.assert_close(causal_conv(torch.arange(5), torch.tensor([1, 1])), torch.tensor([0.0, 1.0, 3.0, 5.0, 7.0]))
    for half in (torch.float16, torch.bfloat16):
        u, K = torch.randn(2, 40).to(half), torch.randn(40).to(half)
        y = causal_conv(u, K)
        assert y.dtype == half
        ref = direct_sum(u.double(), K.double())  # float32 inside, then one rounding to half (half an ulp: 2^-11 or 2^-8)
        ulp = 2.0 ** -11 if half == torch.float16 else 2.0 ** -8
        assert ((y.double() - ref).abs() <= ulp * ref.abs() + 1e-5 * ref.abs().max()).all()
    u = torch.zeros(0, 5, 40, requires_grad=True)
    y = causal_conv(u, torch.randn(5, 40))
    assert y.shape == (0, 5, 40)
    y.sum().backward()
    assert u.grad.shape == u.shape


def test_recurrence_matches_lfilter():
    "A one-state real SSM is the IIR filter y_k = a y_{k-1} + b c u_k."
    u = torch.randn(3, 77, dtype=torch.float64)
    y = ssm_recurrence(torch.tensor([[0.9]], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64), u)
    np.testing.assert_allclose(y.numpy(), lfilter([1.0], [1.0, -0.9], u.numpy(), axis=-1), rtol=1e-12)


def test_dense_kernel_matches_recurrence_impulse():
    A, B, C, _ = random_ssm(5, seed=3)
    dA, dB = discretize(A, B, 0.2)
    impulse = torch.zeros(64, dtype=torch.float64); impulse[0] = 1
    np.testing.assert_allclose(ssm_kernel(dA, dB, C, 64).numpy(), ssm_recurrence(dA, dB, C, impulse).numpy(), rtol=1e-12, atol=1e-14)
    half = ssm_kernel(dA.half(), dB.half(), C.half(), 16)
    assert half.dtype == torch.float16
    assert ssm_recurrence(dA.half(), dB.half(), C.half(), impulse[:16].half()).dtype == torch.float16


# ---------------------------------------------------------------- ssm_kernel_dplr

@pytest.mark.parametrize("measure", ["legs", "legt", "lagt", "fout"])
@pytest.mark.parametrize("N", [1, 2, 15, 16])
def test_dplr_kernel_matches_dense(measure, N):
    "Issue 13 item 2: every measure, odd N (a pole at g(omega_0) = 0) included, against the dense bilinear kernel."
    A, B = hippo(measure, N)
    Lam, P, Bt, V = dplr(measure, N)
    C = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(N))
    for L, dt in [(129, 0.03), (1000, 0.01), (2, 0.1)]:
        ref = ssm_kernel(*discretize(A, B, dt, "bilinear"), C, L)
        K = ssm_kernel_dplr(Lam, P, Bt, C.to(torch.complex128) @ V, dt, L)
        assert (K - ref).abs().max() < 1e-11 * ref.abs().max(), (L, dt)
        K32 = ssm_kernel_dplr(*(x.to(torch.complex64) for x in (Lam, P, Bt, C.to(torch.complex128) @ V)), dt, L)
        assert K32.dtype == torch.complex64 and (K32 - ref).abs().max() < 5e-5 * ref.abs().max(), (L, dt)


def test_dplr_kernel_tilde_and_chunks():
    Lam, P, Bt, V = dplr("fout", 15)
    A, B = hippo("fout", 15)
    C = torch.randn(15, dtype=torch.float64)
    dA, dB = discretize(A, B, 0.05, "bilinear")
    ref = ssm_kernel(dA, dB, C, 300)
    Ct = C.to(torch.complex128) @ V
    Ct_tilde = Ct - Ct @ torch.linalg.matrix_power(V.mH @ dA.to(torch.complex128) @ V, 300)
    for chunk in (1, 7, 4096):
        K = ssm_kernel_dplr(Lam, P, Bt, Ct_tilde, 0.05, 300, tilde=True, chunk=chunk)
        assert (K - ref).abs().max() < 1e-11 * ref.abs().max()


def test_dplr_kernel_batching():
    "Issue 13: batched Lambda/P with unbatched B/C, and a batched dt alone, give the channels one at a time."
    Lam, P, Bt, _ = dplr("legs", 8)
    A = torch.diag(Lam) - P.mT @ P.conj()
    dts = torch.tensor([0.01, 0.05, 0.1], dtype=torch.float64)
    C = torch.randn(8, dtype=torch.complex128)
    refs = torch.stack([ssm_kernel(*discretize(A, Bt, d.item(), "bilinear"), C, 50) for d in dts])
    for K in (ssm_kernel_dplr(Lam.expand(3, 8), P.expand(3, 1, 8), Bt, C, dts, 50), ssm_kernel_dplr(Lam, P, Bt, C, dts, 50),
              ssm_kernel_dplr(Lam, P[None].expand(3, 1, 8), Bt, C.expand(3, 8), dts, 50)):
        assert K.shape == (3, 50) and (K - refs).abs().max() < 1e-12 * refs.abs().max()


def test_dplr_rank_axis_is_never_guessed():
    """Issue 25 item 13: P always carries its rank axis (..., r, N), with more dimensions than Lambda. LegT's rank-2 P (2, N)
    with a batched Lambda (2, N) was read as two rank-1 channels (210% error): now refused, saying how to write either
    reading; P[None] gives both channels the rank-2 factor. A P without its rank axis is refused; (3, N) is rank 3."""
    N, L, dt = 6, 40, 0.05
    Lam, P, Bt, V = dplr("legt", N)
    assert P.shape == (2, N)
    A = torch.diag(Lam) - P.mT @ P.conj()  # the rank-2 DPLR matrix
    C = torch.randn(2, N, dtype=torch.complex128, generator=torch.Generator().manual_seed(0))
    scale = torch.tensor([1.0, 0.5], dtype=torch.float64)[:, None]  # two channels with different Lambda
    with pytest.raises(ValueError, match=r"P\[\.\.\., None, :\].*P\[None\]"):
        ssm_kernel_dplr(Lam * scale, P, Bt, C, dt, L)
    K = ssm_kernel_dplr(Lam * scale, P[None], Bt, C, dt, L)
    for h in range(2):
        ref = ssm_kernel(*discretize(A + torch.diag(Lam * scale[h] - Lam), Bt, dt, "bilinear"), C[h], L)
        assert (K[h] - ref).abs().max() < 1e-12 * ref.abs().max(), h
    Ls, Ps, Bs, _ = dplr("legs", N)
    for bad in (Ps[0], Ps[0].expand(3, N)):  # (N,) against Lambda (N,); (3, N) against Lambda (3, N)
        with pytest.raises(ValueError, match=r"P\[\.\.\., None, :\]"):
            ssm_kernel_dplr(Ls.expand(*bad.shape[:-1], N), bad, Bs, Bs, dt, L)
    K3 = ssm_kernel_dplr(Ls, Ps.expand(3, N), Bs, Bs, dt, L)  # rank 3 by its shape: diag(Lambda) - 3 P P^*
    ref = ssm_kernel(*discretize(torch.diag(Ls) - 3 * Ps.mT @ Ps.conj(), Bs, dt, "bilinear"), Bs, L)
    assert K3.shape == (L,) and (K3 - ref).abs().max() < 1e-12 * ref.abs().max()
    K1 = ssm_kernel_dplr(Ls.expand(3, N), Ps.expand(3, 1, N), Bs, Bs, dt, L)  # three channels of rank 1
    ref = ssm_kernel(*discretize(torch.diag(Ls) - Ps.mT @ Ps.conj(), Bs, dt, "bilinear"), Bs, L)
    assert K1.shape == (3, L) and (K1 - ref).abs().max() < 1e-12 * ref.abs().max()


@pytest.mark.parametrize("measure,N", [("legs", 3), ("fout", 3), ("legt", 3), ("lagt", 1)])
def test_dplr_kernel_gradcheck(measure, N):
    Lam, P, Bt, _ = dplr(measure, N)
    C = torch.randn(N, dtype=torch.complex128, generator=torch.Generator().manual_seed(0))
    args = [x.clone().requires_grad_() for x in (Lam, P, Bt, C)] + [torch.tensor(0.1, dtype=torch.float64, requires_grad=True)]
    assert torch.autograd.gradcheck(lambda a, b, c, d, e: ssm_kernel_dplr(a, b, c, d, e, 12), args)


def test_dplr_half_and_ints():
    Lam, P, Bt, V = dplr("legs", 4)
    K = ssm_kernel_dplr(Lam, P, Bt, torch.ones(4, dtype=torch.complex128), 0.1, 20)
    Kh = ssm_kernel_dplr(Lam.to(torch.complex64), P.to(torch.complex64), Bt.to(torch.complex64), torch.ones(4, dtype=torch.float16), 0.1, 20)
    assert Kh.dtype == torch.complex64 and (Kh - K).abs().max() < 1e-5 * K.abs().max()
    Ki = ssm_kernel_dplr(torch.tensor([-1, -2]), torch.tensor([[0, 0]]), torch.tensor([1, 1]), torch.tensor([1, 1]), 0.5, 6)  # integers
    ref = ssm_kernel(*discretize(torch.diag(torch.tensor([-1.0, -2.0], dtype=torch.float64)), torch.ones(2, dtype=torch.float64), 0.5, "bilinear"), torch.ones(2, dtype=torch.float64), 6)
    assert (Ki.real.double() - ref).abs().max() < 1e-5


def test_cauchy_skip():
    g = torch.Generator().manual_seed(1)
    v, z, lam = (torch.randn(s, generator=g, dtype=torch.complex128) for s in ((3, 5), (7,), (5,)))
    skip = torch.tensor([0, 4, 2, 2, 1, 3, 0])
    ref = torch.tensor([[sum(v[m, n] / (z[j] - lam[n]) for n in range(5) if n != skip[j]) for j in range(7)] for m in range(3)])
    for chunk in (1, 3, 100):
        torch.testing.assert_close(cauchy(v, z, lam, chunk=chunk, skip=skip), ref)


# ---------------------------------------------------------------- dss_kernel, inits

def test_dss_kernel_formulas_and_growing_modes():
    "DSS's Proposition 1 term by term; Issue 18 item 7: Re lambda > 0 stays finite (the naive softmax is NaN)."
    g = torch.Generator().manual_seed(6)
    lam = torch.complex(torch.rand(6, generator=g, dtype=torch.float64) - 0.5, 3 * torch.randn(6, generator=g, dtype=torch.float64))  # both signs
    W = torch.randn(6, generator=g, dtype=torch.complex128)
    for dt, L in [(0.05, 300), (1.0, 3000)]:
        P = lam[:, None] * dt * torch.arange(L, dtype=torch.float64)
        Pm = P - P.real.amax(-1, keepdim=True)  # DSS's max subtraction, per mode
        soft = (W[:, None] / lam[:, None] * torch.exp(Pm) / torch.exp(Pm).sum(-1, keepdim=True)).sum(0).real
        K = dss_kernel(lam, W, dt, L, "softmax")
        assert torch.isfinite(K).all() and (K - soft).abs().max() < 1e-11 * soft.abs().max()
    P = lam[:, None] * 0.05 * torch.arange(100, dtype=torch.float64)
    ref = (W[:, None] * (torch.exp(lam * 0.05) - 1)[:, None] / lam[:, None] * torch.exp(P)).sum(0).real
    torch.testing.assert_close(dss_kernel(lam, W, 0.05, 100), ref, rtol=1e-11, atol=1e-12)
    zero = dss_kernel(torch.zeros(1, dtype=torch.complex128), torch.ones(1, dtype=torch.complex128), 0.1, 4)  # (e^z - 1)/lambda -> dt
    torch.testing.assert_close(zero, torch.full((4,), 0.1, dtype=torch.float64))
    lam_up = torch.tensor([0.5 + 1j], dtype=torch.complex128)
    assert torch.isfinite(dss_kernel(lam_up, torch.ones(1, dtype=torch.complex128), 1.0, 3000, "softmax")).all()


def test_next_fast_len():
    for n in [1, 2, 7, 97, 1000, 4097, 30001]:
        m = next_fast_len(n)
        assert m >= n
        k = m
        for p in (2, 3, 5):
            while k % p == 0: k //= p
        assert k == 1
        assert not any(_smooth(c) for c in range(n, m))
    assert next_fast_len(np.int64(7)) == 8


def _smooth(c):
    for p in (2, 3, 5):
        while c % p == 0: c //= p
    return c == 1


def test_inits():
    for kind in ["legs", "inv", "lin"]:
        lam, B = s4d_init(kind, 16)
        assert lam.shape == B.shape == (8,) and lam.dtype == torch.complex64 and (lam.real == -0.5).all()
    lam = dss_init(16, torch.complex128)
    torch.testing.assert_close(lam, s4d_init("legs", 16, torch.complex128)[0])
    dt = log_uniform_dt((1000,), 1e-3, 1e-1, generator=torch.Generator().manual_seed(0))
    assert dt.min() >= 1e-3 and dt.max() <= 1e-1
    assert s4d_init("lin", np.int64(8))[0].shape == (4,)


def test_s4d_legs_half_from_woodbury():
    "Issue 18 item 6: with P = B/sqrt(2), S4-LegS's resolvent is the diagonal one divided by 1 + s/2, and s -> 2 frequency by frequency."
    Lam, P, B, _ = dplr("legs", 256)
    assert (P[0] - B / math.sqrt(2)).abs().max() < 1e-12
    g = 3j
    A = torch.diag(Lam) - P.mT @ P.conj()
    full = torch.linalg.solve(g * torch.eye(256, dtype=torch.complex128) - A, B)
    R = 1 / (g - Lam)
    s = (B.abs() ** 2 * R).sum()
    torch.testing.assert_close(full, R * B / (1 + s / 2))
    assert abs(s - 2) < 0.05
    lam_d, B_d = s4d_init("legs", 256, torch.complex128)
    torch.testing.assert_close(B_d, B[Lam.imag > 0] / 2)


Ld, Bd1, Cd1 = torch.ones(4, dtype=torch.complex64) * 0.5, torch.ones(4, dtype=torch.complex64), torch.ones(4, dtype=torch.complex64)
BAD = [
    (lambda: ssm_kernel_diag(Ld, Bd1[:3], Cd1, 8), ValueError, "dB"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1[:2], 8), ValueError, "C"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 0), ValueError, "L"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 3.5), TypeError, "L"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, True), TypeError, "L"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 8, block=-1), ValueError, "block"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 8, block=0), ValueError, "block"),
    (lambda: ssm_kernel_diag(Ld[0], Bd1, Cd1, 8), ValueError, "dA"),
    (lambda: ssm_kernel_diag(Ld.numpy(), Bd1, Cd1, 8), TypeError, "dA"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 8, backend="jax"), ValueError, "backend"),
    (lambda: ssm_kernel_diag(Ld.expand(3, 4), Bd1.expand(2, 4), Cd1, 8), ValueError, "dB"),
    (lambda: ssm_kernel(torch.eye(3), torch.ones(4), torch.ones(3), 5), ValueError, "Bd"),
    (lambda: ssm_kernel(torch.ones(3), torch.ones(3), torch.ones(3), 5), ValueError, "Ad"),
    (lambda: ssm_kernel(torch.eye(3), torch.ones(3), torch.ones(3), 0), ValueError, "L"),
    (lambda: ssm_kernel(torch.eye(3), torch.ones(3), torch.ones(3), True), TypeError, "L"),
    (lambda: krylov(torch.eye(3), torch.ones(3), -2), ValueError, "L"),
    (lambda: krylov(torch.eye(3), torch.ones(2), 4), ValueError, "v"),
    (lambda: next_fast_len(0), ValueError, "n"),
    (lambda: causal_conv(torch.ones(0), torch.ones(3)), ValueError, "u"),
    (lambda: causal_conv(torch.ones(5), torch.ones(0)), ValueError, "K"),
    (lambda: causal_conv(torch.ones(()), torch.ones(3)), ValueError, "u"),
    (lambda: causal_conv(torch.ones(2, 5), torch.ones(3, 5)), ValueError, "u"),
    (lambda: causal_conv([1.0, 2.0], torch.ones(3)), TypeError, "u"),
    (lambda: ssm_recurrence(torch.eye(3), torch.ones(3), torch.ones(3), torch.ones(0)), ValueError, "u"),
    (lambda: ssm_recurrence(torch.eye(3), torch.ones(3), torch.ones(2), torch.ones(4)), ValueError, "C"),
    (lambda: ssm_recurrence(torch.eye(3).expand(2, 3, 3), torch.ones(3), torch.ones(3), torch.ones(3, 4)), ValueError, "Ad"),
    (lambda: ssm_kernel_dplr(Ld, Bd1[:2], Bd1, Cd1, 0.1, 8), ValueError, "P"),
    (lambda: ssm_kernel_dplr(Ld, Bd1, Bd1, Cd1, 0.1, 8), ValueError, "P"),  # no rank axis
    (lambda: ssm_kernel_dplr(Ld, Bd1[None], Bd1, Cd1, -0.1, 8), ValueError, "dt"),
    (lambda: ssm_kernel_dplr(Ld, Bd1[None], Bd1, Cd1, 0.0, 8), ValueError, "dt"),
    (lambda: ssm_kernel_dplr(Ld, Bd1[None], Bd1, Cd1, 0.1, 0), ValueError, "L"),
    (lambda: ssm_kernel_dplr(Ld, Bd1[None], Bd1, Cd1, 0.1, 8, chunk=0), ValueError, "chunk"),
    (lambda: ssm_kernel_dplr(Ld.expand(3, 4), Bd1[None, None], Bd1, Cd1.expand(2, 4), 0.1, 8), ValueError, "Lambda"),
    (lambda: ssm_kernel_dplr(Ld, Bd1[None], Bd1, Cd1, torch.full((3,), 0.1), 8, tilde=True).sum() + ssm_kernel_dplr(Ld.expand(2, 4), Bd1[None, None], Bd1, Cd1, torch.full((3,), 0.1), 8), ValueError, "dt"),
    (lambda: cauchy(torch.ones(2, 4), torch.ones(3), torch.ones(4), chunk=0), ValueError, "chunk"),
    (lambda: cauchy(torch.ones(4), torch.ones(3), torch.ones(4)), ValueError, "v"),
    (lambda: dss_kernel(Ld, Bd1, 0.1, 8, kind="relu"), ValueError, "kind"),
    (lambda: dss_kernel(Ld, Bd1, 0.0, 8, kind="softmax"), ValueError, "dt"),
    (lambda: dss_kernel(Ld, Bd1, -1.0, 8), ValueError, "dt"),
    (lambda: dss_kernel(Ld, Bd1[:2], 0.1, 8), ValueError, "W"),
    (lambda: dss_kernel(torch.zeros(2, dtype=torch.complex64), Bd1[:2], 0.1, 8, kind="softmax"), ValueError, "Lambda"),
    (lambda: s4d_init("legs", 7), ValueError, "N"),
    (lambda: s4d_init("legs", 8.0), TypeError, "N"),
    (lambda: s4d_init("fourier", 8), ValueError, "kind"),
    (lambda: log_uniform_dt((3,), 0.1, 0.01), ValueError, "dt_min"),
]


@pytest.mark.parametrize("call,exc,name", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_ducc0_is_optional():
    "ducc0 only speeds up causal_conv's CPU path: not a core dependency, but in the `fast` extra (and dev, bench, course)."
    import tomllib
    from conftest import ROOT
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(r.startswith("ducc0") for r in proj["dependencies"])
    assert all("ducc0" in proj["optional-dependencies"][extra] for extra in ("fast", "dev", "bench", "course"))


@pytest.mark.parametrize("fft", FFTS)
def test_cpu_path_double_backward(fft, monkeypatch):
    "The CPU path's backward is differentiable when a double backward asks for it (create_graph), broadcast rows included."
    use_fft(fft, monkeypatch)
    g = torch.Generator().manual_seed(7)
    u = torch.randn(2, 3, 9, generator=g, dtype=torch.float64, requires_grad=True)
    K = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    calls, np_causal = [], engine._np_causal
    monkeypatch.setattr(engine, "_np_causal", lambda *a: (calls.append(1), np_causal(*a))[1])
    assert torch.autograd.gradgradcheck(causal_conv, (u, K))
    assert calls  # the CPU path ran


# ---------------------------------------------------------------- issue 25: causal in K too, compiled, devices, autocast, torch.func

def prefix_bound(u, K, t0, dtype, c=256):
    """c eps sqrt(t+1) max_{s<=t}|u_s| max_{s<=t}|K_s| for t < t0 (rows of u): the rounding of an FFT convolution that reads
    only the prefixes. c = 256: over 2100 random cases (L up to 1200, growing, decaying and constant u and K, real and
    complex, both paths) the guarded prefix-only computation reached 84 and the outputs with later values made huge or NaN 163."""
    Mu = np.maximum.accumulate(np.abs(u[..., :t0]), -1)
    MK = np.maximum.accumulate(np.abs(K[..., :t0]), -1)
    return c * torch.finfo(dtype).eps * Mu * MK * np.sqrt(np.arange(1, t0 + 1))


@pytest.mark.parametrize("path", ["ducc0", "torch.fft", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_conv_late_tap_and_growing_kernel(path, dtype, monkeypatch):
    """Issue 25 item 2: the guard covers K's magnitudes too. A late tap of 1e20 gave [-4096, 24576, ...] for [1, ..., 1, 1e20 + 1];
    the kernel 1.05^l (|dA| = 1.05, L = 1000) gave y[0] = -1.9e6 for K_0 u_0 = -2.31. Each output is now within
    rounding of its own prefixes, and step 2's passes stay within 1 + ceil(log16 of the range of max|u_<=t| max|K_<=t|)."""
    if path != "torch": use_fft(path, monkeypatch)
    f = engine._causal_torch if path == "torch" else causal_conv
    K = torch.zeros(8, dtype=dtype); K[0], K[-1] = 1, 1e20
    y = f(torch.ones(8, dtype=dtype), K)
    eps = torch.finfo(dtype).eps
    assert (y[:7] - 1).abs().max() <= 4 * eps and abs(y[7] / 1e20 - 1) <= 4 * eps  # 1 and 1e20 + 1, to rounding
    L = 1000
    K = -2.31 * 1.05 ** torch.arange(L, dtype=torch.float64)  # a growing kernel, |dA| = 1.05 (1.05^999 = 1.5e21)
    u = torch.randn(3, L, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u[0] = 1
    calls = count_passes(monkeypatch)
    y = f(u.to(dtype), K.to(dtype)).double().numpy()
    un, Kn = u.to(dtype).double().numpy(), K.to(dtype).double().numpy()
    ref = np.stack([np.convolve(r, Kn)[:L] for r in un])
    assert (np.abs(y - ref) <= prefix_bound(un, Kn, L, dtype)).all()  # y[0, 0] = K_0 u_0 = -2.31 within 256 eps of it (was -1.9e6)
    prod = np.maximum.accumulate(np.abs(un), -1) * np.maximum.accumulate(np.abs(Kn))
    bound = 1 + math.ceil(math.log(prod.max() / prod[prod > 0].min(), 16))
    assert bound - 3 <= len(calls) <= bound, (len(calls), bound)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(L=st.integers(2, 300), t0=st.integers(1, 299), seed=st.integers(0, 10_000), where=st.sampled_from(["u", "K", "both"]),
       bad=st.sampled_from([math.nan, math.inf, -math.inf, 1e8, 1e30, "tail"]), dtype=st.sampled_from([torch.float32, torch.float64, torch.complex64]),
       gu=st.sampled_from([0.0, 0.05, -0.05]), gk=st.sampled_from([0.0, 0.05, -0.05]), path=st.sampled_from(["cpu", "torch"]))
def test_causal_conv_prefix_property(L, t0, seed, where, bad, dtype, gu, gk, path):
    """Issue 25 item 2, as a property: outputs before t0 depend only on u[:t0] and K[:t0], in value. Making a later input or
    tap (or the whole tail) huge, infinite or NaN leaves them finite and within the rounding of the prefixes alone of the
    float64 direct sums (np.convolve), for growing and decaying inputs and kernels, both paths, real and complex."""
    t0 = 1 + t0 % (L - 1)
    rng = np.random.default_rng(seed)
    draw = lambda *s: rng.standard_normal(s) + (1j * rng.standard_normal(s) if dtype.is_complex else 0)
    un, Kn = draw(2, L) * np.exp(gu * np.arange(L)), draw(L) * np.exp(gk * np.arange(L))
    u, K = torch.from_numpy(un).to(dtype), torch.from_numpy(Kn).to(dtype)
    un, Kn = u.to(torch.complex128 if dtype.is_complex else torch.float64).numpy(), K.to(torch.complex128 if dtype.is_complex else torch.float64).numpy()
    ref = np.stack([np.convolve(r[:t0], Kn[:t0])[:t0] for r in un])
    ub, Kb = u.clone(), K.clone()
    t1 = int(rng.integers(t0, L))
    for x, on in ((ub, where in ("u", "both")), (Kb, where in ("K", "both"))):
        if not on: continue
        if bad == "tail": x[..., t0:] *= 1e15 if dtype != torch.float64 else 1e150  # everything from t0 on
        else: x[..., t1] = bad
    with fft_backend("torch.fft") if path == "cpu" else contextlib.nullcontext():
        y = causal_conv(ub, Kb) if path == "cpu" else engine._causal_torch(ub, Kb)
    y = y[..., :t0].to(torch.complex128 if dtype.is_complex else torch.float64).numpy()
    assert np.isfinite(y).all()
    err = np.abs(y - ref)
    assert (err <= prefix_bound(un, Kn, t0, dtype)).all(), (err / prefix_bound(un, Kn, t0, dtype, 1)).max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_causal_conv_compiled_is_causal(dtype):
    """Issue 25 item 6: under torch.compile (eager backend, dynamic shapes) causal_conv applies the same guard as in eager
    mode (one opaque operator, called with real values): a huge last input or tap leaves the earlier outputs as eager
    leaves them (bit for bit), within rounding of the prefixes; the compiled graph used masks only and moved them."""
    g = torch.Generator().manual_seed(3)
    u, K = torch.randn(2, 3, 300, generator=g).to(dtype), (torch.randn(3, 300, generator=g) / 10).to(dtype)
    f = torch.compile(causal_conv, backend="eager", dynamic=True)
    for ub, Kb in [(u.index_fill(-1, torch.tensor([299]), 1e30), K), (u, K.index_fill(-1, torch.tensor([299]), 1e30)),
                   (u.index_fill(-1, torch.tensor([150]), math.nan), K.index_fill(-1, torch.tensor([200]), 1e20))]:
        y = f(ub, Kb)
        assert torch.equal(torch.view_as_real(y) if y.is_complex() else y, torch.view_as_real(causal_conv(ub, Kb)) if y.is_complex() else causal_conv(ub, Kb)) or \
            bool(((y == causal_conv(ub, Kb)) | (y.isnan() & causal_conv(ub, Kb).isnan())).all())
        t0 = 150 if ub[..., 150].isnan().any() else 299
        ref = np_conv(u[..., :t0], K[..., :t0])
        assert torch.isfinite(y[..., :t0]).all() and ((y[..., :t0] - ref).abs().max() / ref.abs().max()).item() < 1e-5
    y = f(torch.randn(4, 77, dtype=torch.float64), torch.randn(77, dtype=torch.float64))  # another shape, no recompilation needed
    assert y.shape == (4, 77)


def test_causal_conv_devices():
    "Issue 25 item 22: tensors on different devices are refused at the boundary, naming u and K (was a raw device error)."
    for u, K in [(torch.ones(5, device="meta"), torch.ones(5)), (torch.ones(2, 5), torch.ones(5, device="meta"))]:
        with pytest.raises(ValueError, match=r"K is on device (meta|cpu) but u is on (cpu|meta)"):
            causal_conv(u, K)
    y = causal_conv(torch.ones(2, 3, 50, device="meta"), torch.ones(3, 40, device="meta", dtype=torch.float64))  # shapes only
    assert y.shape == (2, 3, 50) and y.dtype == torch.float64 and y.device.type == "meta"


@pytest.mark.parametrize("path", ["cpu", "torch"])
def test_causal_conv_ignores_autocast(path, monkeypatch):
    "Issue 25 item 5: float32 inputs are convolved in float32 under torch.autocast('cpu', bfloat16): bit-identical, as without it."
    if path == "cpu": use_fft("torch.fft", monkeypatch)
    g = torch.Generator().manual_seed(4)
    u, K = torch.randn(3, 4, 200, generator=g), torch.randn(4, 200, generator=g)
    ref = causal_conv(u, K)
    with torch.autocast("cpu", torch.bfloat16):
        y = causal_conv(u, K)
    assert y.dtype == torch.float32 and torch.equal(y, ref)


def test_causal_conv_vmap_and_func_grad():
    "Issue 25 item 18: torch.func.vmap (over u, K or both, any in_dims) and torch.func.grad/jacrev give the loop's and autograd's results."
    g = torch.Generator().manual_seed(5)
    u, K = torch.randn(4, 3, 30, generator=g, dtype=torch.float64), torch.randn(3, 30, generator=g, dtype=torch.float64)
    loop = torch.stack([causal_conv(u[i], K) for i in range(4)])
    torch.testing.assert_close(torch.func.vmap(causal_conv, in_dims=(0, None))(u, K), loop, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(torch.func.vmap(causal_conv, in_dims=(2, None), out_dims=2)(u.movedim(0, 2), K), loop.movedim(0, 2), rtol=1e-13, atol=1e-13)
    Ks = torch.randn(5, 30, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(causal_conv, in_dims=(None, 0))(u[0, 0], Ks), torch.stack([causal_conv(u[0, 0], k) for k in Ks]), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(torch.func.vmap(causal_conv)(u[:, 0], Ks[:4]), torch.stack([causal_conv(u[i, 0], Ks[i]) for i in range(4)]), rtol=1e-13, atol=1e-13)
    loss = lambda u, K: causal_conv(u, K).square().sum()
    uq, Kq = u.clone().requires_grad_(), K.clone().requires_grad_()
    ref = torch.autograd.grad(loss(uq, Kq), (uq, Kq))
    for a, b in zip(torch.func.grad(loss, argnums=(0, 1))(u, K), ref): torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    per = torch.func.vmap(torch.func.grad(loss), in_dims=(0, None))(u, K)  # per-sample gradients
    torch.testing.assert_close(per, torch.stack([torch.autograd.grad(loss(uq[i], K), uq)[0][i] for i in range(4)]), rtol=1e-12, atol=1e-12)
    J = torch.func.jacrev(lambda x: causal_conv(x, K[0]))(u[0, 0])
    torch.testing.assert_close(J, torch.tril(torch.stack([torch.roll(torch.cat([K[0], torch.zeros(30, dtype=torch.float64)]), i)[:30] for i in range(30)], 1)), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- issue 25: ssm_kernel_dplr and cauchy

def saved_bytes(f):
    "Bytes of the distinct storages autograd saves for the backward while f() runs (saved_tensors_hooks sees every one)."
    seen = {}
    def pack(t): seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes(); return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t): out = f()
    return out, sum(seen.values())


def test_dplr_training_memory_is_O_N_plus_L():
    """Issue 25 item 9: autograd kept every Cauchy block for the backward, O(N L): 74 MiB at N = 64, L = 32768 (complex128,
    tilde=True), 66 MiB at N = 256, L = 8192. cauchy's backward recomputes them: about 320 bytes per frequency whatever N
    (measured 2.52 MiB at L = 8192 for N = 16, 64 and 256), and the gradients are unchanged (gradcheck below)."""
    out = {}
    for N, L in [(16, 8192), (256, 8192), (16, 2048)]:
        Lam, P, B, _ = dplr("legs", N)
        args = [x.clone().requires_grad_() for x in (Lam, P, B, torch.randn(N, dtype=torch.complex128))]
        K, out[N, L] = saved_bytes(lambda: ssm_kernel_dplr(*args, torch.tensor(0.01, dtype=torch.float64, requires_grad=True), L, tilde=True, chunk=1024))
        K.real.sum().backward()
        assert all(torch.isfinite(a.grad).all() for a in args)
    assert out[256, 8192] < 1.02 * out[16, 8192]  # no N x L term (before: 66 MiB against 6.4 MiB)
    assert out[16, 8192] < 400 * 8192 and 3.5 < out[16, 8192] / out[16, 2048] < 4.5  # O(L): 4 times the length, 4 times the bytes


@pytest.mark.parametrize("measure", ["legs", "legt"])
def test_dplr_empty_and_degenerate(measure):
    """Issue 25 item 16: a zero batch gave an MKL FFT error and N = 0 an IndexError; now an empty result and a zero kernel
    (K = C dA^l dB with no state), with gradients; a rank-0 P is the diagonal system."""
    Lam, P, B, _ = dplr(measure, 6)
    r = P.shape[-2]
    K = ssm_kernel_dplr(Lam.expand(0, 6), P[None], B, B, 0.1, 10)
    assert K.shape == (0, 10) and K.dtype == torch.complex128
    assert ssm_kernel_dplr(Lam, P, B, B, torch.ones(0, dtype=torch.float64), 10).shape == (0, 10)  # an empty batch of steps
    args = [torch.zeros(3, 0, dtype=torch.complex128, requires_grad=True), torch.zeros(3, r, 0, dtype=torch.complex128), torch.zeros(0, dtype=torch.complex128), torch.zeros(0, dtype=torch.complex128)]
    K = ssm_kernel_dplr(*args, 0.1, 7)
    assert K.shape == (3, 7) and torch.equal(K, torch.zeros(3, 7, dtype=torch.complex128))
    K.real.sum().backward(); assert args[0].grad.shape == (3, 0)
    K = ssm_kernel_dplr(Lam, P[..., :0, :], B, B, 0.1, 30)  # rank 0
    ref = ssm_kernel(*discretize(torch.diag(Lam), B, 0.1, "bilinear"), B, 30)
    assert (K - ref).abs().max() < 1e-12 * ref.abs().max()


def test_cauchy_skip_is_checked():
    "Issue 25 item 15: a skip of the wrong length was silently accepted (scatter used its first entries); bad values and dtypes too."
    v, z, lam = torch.ones(2, 4, dtype=torch.complex128), torch.ones(7, dtype=torch.complex128), torch.zeros(4, dtype=torch.complex128)
    with pytest.raises(ValueError, match=r"skip must have shape \(\.\.\., Z\) with Z=7, got shape \(3,\)"): cauchy(v, z, lam, skip=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"skip must hold pole indices in \[0, 4\)"): cauchy(v, z, lam, skip=torch.full((7,), 4))
    with pytest.raises(ValueError, match=r"skip must hold pole indices"): cauchy(v, z, lam, skip=torch.full((7,), -1))
    with pytest.raises(TypeError, match=r"skip must be an integer tensor"): cauchy(v, z, lam, skip=torch.zeros(7))
    with pytest.raises(ValueError, match=r"do not broadcast.*skip \(2,\)"): cauchy(v.expand(3, 2, 4), z, lam, skip=torch.zeros(2, 7, dtype=torch.long))
    g = torch.Generator().manual_seed(2)
    v, z, lam = (torch.randn(s, generator=g, dtype=torch.complex128) for s in ((2, 4), (7,), (4,)))
    skip = torch.randint(0, 4, (5, 7), generator=g)  # a batch of skips for one set of poles and points
    ref = torch.tensor([[[sum(v[m, n] / (z[j] - lam[n]) for n in range(4) if n != skip[b, j]) for j in range(7)] for m in range(2)] for b in range(5)])
    torch.testing.assert_close(cauchy(v, z, lam, chunk=3, skip=skip), ref)


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_cauchy_gradients_and_func(chunk):
    "cauchy's recomputing backward: gradcheck and gradgradcheck (complex, with skip, broadcast batch; real v and g with complex poles), torch.func.grad and vmap."
    g = torch.Generator().manual_seed(3)
    v, z, lam = torch.randn(2, 3, 5, generator=g, dtype=torch.complex128), torch.randn(7, generator=g, dtype=torch.complex128), torch.randn(5, generator=g, dtype=torch.complex128)
    skip = torch.tensor([0, 4, 2, 2, 1, 3, 0])
    args = [x.clone().requires_grad_() for x in (v, z, lam)]
    f = lambda a, b, c: cauchy(a, b, c, chunk=chunk, skip=skip)
    assert torch.autograd.gradcheck(f, args) and torch.autograd.gradgradcheck(f, args)
    assert torch.autograd.gradcheck(lambda a, b: cauchy(a, b, args[2], chunk=chunk), [v.real.clone().requires_grad_(), z.real.clone().requires_grad_()])
    loss = lambda c: f(v, z, c).abs().square().sum()
    torch.testing.assert_close(torch.func.grad(loss)(lam), torch.autograd.grad(loss(args[2]), args[2])[0])
    torch.testing.assert_close(torch.func.vmap(lambda a: f(a, z, lam))(v), f(v, z, lam))
    torch.testing.assert_close(torch.func.vmap(lambda c: f(v, z, c))(torch.stack([lam, 2 * lam])), torch.stack([f(v, z, lam), f(v, z, 2 * lam)]))


def test_ops_ignore_autocast():
    """Issue 25 item 5: under torch.autocast("cpu", torch.bfloat16) float32 inputs are computed in float32: each op bit-identical
    to its result without autocast (before: ssm_kernel, krylov, ssm_recurrence and cauchy ran their matrix products in bfloat16)."""
    g = torch.Generator().manual_seed(6)
    A, B, C, _ = random_ssm(6, seed=1)
    dA, dB = (x.float() for x in discretize(A, B, 0.1))
    C, u = C.float(), torch.randn(2, 50, generator=g)
    v, z, lam = torch.randn(4, 6, generator=g), torch.randn(9, generator=g), torch.randn(6, generator=g)
    Lam, P, Bt, V = (x.to(torch.complex64) for x in dplr("legt", 6))
    calls = {"ssm_kernel": lambda: ssm_kernel(dA, dB, C, 40), "krylov": lambda: krylov(dA, dB, 40), "ssm_recurrence": lambda: ssm_recurrence(dA, dB, C, u),
             "causal_conv": lambda: causal_conv(u, u[0]), "cauchy": lambda: cauchy(v, z, lam, chunk=4),
             "ssm_kernel_dplr": lambda: ssm_kernel_dplr(Lam, P, Bt, Bt, torch.tensor(0.05), 40)}
    for name, f in calls.items():
        ref = f()
        with torch.autocast("cpu", torch.bfloat16): y = f()
        assert y.dtype == ref.dtype and torch.equal(y, ref), name


@settings(max_examples=25, deadline=None, derandomize=True)
@given(N=st.integers(1, 5), r=st.integers(0, 3), lam_batch=st.sampled_from([(), (2,), (3, 1)]), p_batch=st.sampled_from([(), (1,), (2,), (1, 2)]),
       L=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_dplr_rank_axis_property(N, r, lam_batch, p_batch, L, seed):
    """Issue 25 item 13 as a property: P's last two axes are always (r, N), its other dims broadcast with Lambda's, and each
    channel's kernel is the dense bilinear kernel of diag(Lambda) - P^T conj(P); a P without more dims than Lambda is refused."""
    g = torch.Generator().manual_seed(seed)
    cplx = lambda *s: torch.complex(torch.randn(s, generator=g, dtype=torch.float64), torch.randn(s, generator=g, dtype=torch.float64))
    Lam = torch.complex(-0.1 - torch.rand(*lam_batch, N, generator=g, dtype=torch.float64), 3 * torch.randn(*lam_batch, N, generator=g, dtype=torch.float64))
    P = cplx(*p_batch, r, N) / 2
    B, C = cplx(N), cplx(N)
    if P.ndim <= Lam.ndim:  # not more dims than Lambda: refused, the rank axis is never guessed
        with pytest.raises(ValueError, match=r"P\[\.\.\., None, :\]"): ssm_kernel_dplr(Lam, P, B, C, 0.1, L)
        return
    try: batch = torch.broadcast_shapes(lam_batch, p_batch)
    except RuntimeError:
        with pytest.raises(ValueError, match="do not broadcast"): ssm_kernel_dplr(Lam, P, B, C, 0.1, L)
        return
    K = ssm_kernel_dplr(Lam, P, B, C, 0.1, L)
    assert K.shape == (*batch, L)
    Lb, Pb = Lam.expand(*batch, N).reshape(math.prod(batch), N), P.expand(*batch, r, N).reshape(math.prod(batch), r, N)
    for i, k in enumerate(K.reshape(-1, L)):
        ref = ssm_kernel(*discretize(torch.diag(Lb[i]) - Pb[i].mT @ Pb[i].conj(), B, 0.1, "bilinear"), C, L)
        assert (k - ref).abs().max() <= 1e-10 * ref.abs().max(), i


def test_vmap_over_dt_equals_the_loop():
    "Issue 25 follow-up 3: torch.func.vmap over dt failed in the dt check (bool() of a batched tensor); now the loop over dt."
    from torch.func import vmap
    Lam, P, B, _ = dplr("legs", 6)
    C = torch.randn(6, dtype=torch.complex128, generator=torch.Generator().manual_seed(4))
    dts = torch.tensor([0.01, 0.05, 0.3], dtype=torch.float64)
    calls = {"ssm_kernel_dplr": lambda d: ssm_kernel_dplr(Lam, P, B, C, d, 32),
             "ssm_kernel_dplr tilde": lambda d: ssm_kernel_dplr(Lam, P, B, C, d, 32, tilde=True),
             "dss_kernel exp": lambda d: dss_kernel(Lam, C, d, 32), "dss_kernel softmax": lambda d: dss_kernel(Lam, C, d, 32, "softmax")}
    for name, f in calls.items():
        loop = torch.stack([f(d) for d in dts])
        torch.testing.assert_close(vmap(f)(dts), loop, rtol=1e-12, atol=1e-12 * loop.abs().max().item(), msg=name)


def _mixed_device_cases():
    "(op name, call, the arguments): every op of ssm_course.conv with tensors, each tensor argument to be moved to the meta device."
    c = torch.complex64
    Lam, P, B, _ = (x.to(c) for x in dplr("legs", 4))
    A3, B3 = torch.eye(3) * 0.5, torch.ones(3)
    return [("ssm_kernel_diag", lambda dA, dB, C: ssm_kernel_diag(dA, dB, C, 5), dict(dA=torch.rand(3), dB=torch.rand(3), C=torch.rand(3))),
            ("ssm_kernel_diag log", lambda dA, dB, C: ssm_kernel_diag(dA, dB, C, 5, log=True), dict(dA=-torch.rand(3), dB=torch.rand(3), C=torch.rand(3))),
            ("cauchy", lambda v, g, lam, skip: cauchy(v, g, lam, skip=skip),
             dict(v=torch.ones(1, 3, dtype=c), g=torch.ones(4, dtype=c), lam=torch.ones(3, dtype=c), skip=torch.zeros(4, dtype=torch.long))),
            ("ssm_kernel", lambda Ad, Bd, C: ssm_kernel(Ad, Bd, C, 5), dict(Ad=A3, Bd=B3, C=B3)),
            ("krylov", lambda Ad, v: krylov(Ad, v, 5), dict(Ad=A3, v=B3)),
            ("ssm_recurrence", lambda Ad, Bd, C, u, x0: ssm_recurrence(Ad, Bd, C, u, x0), dict(Ad=A3, Bd=B3, C=B3, u=torch.ones(5), x0=torch.zeros(3))),
            ("ssm_kernel_dplr", lambda Lambda, P, B, C, dt: ssm_kernel_dplr(Lambda, P, B, C, dt, 8), dict(Lambda=Lam, P=P, B=B, C=B, dt=torch.tensor([0.1]))),
            ("dss_kernel", lambda Lambda, W, dt: dss_kernel(Lambda, W, dt, 8), dict(Lambda=Lam, W=B, dt=torch.tensor([0.1]))),
            ("causal_conv", lambda u, K: causal_conv(u, K), dict(u=torch.randn(8), K=torch.randn(8)))]


@pytest.mark.parametrize("op", [name for name, _, _ in _mixed_device_cases()])
def test_mixed_devices_are_refused_by_name(op):
    """Issue 25 follow-up 4: one argument on another device (meta here) raised a raw 'Tensor on device meta is not on the expected
    device cpu' from inside an operation, 'Cannot copy out of meta tensor' for dt, or silently returned a meta (ssm_kernel with C on
    meta: a CPU) result; now a ValueError naming the moved argument, the first argument and both devices. A 0-d CPU dt is a number."""
    _, f, args = next(case for case in _mixed_device_cases() if case[0] == op)
    first = next(iter(args))
    for name in args:
        moved = {k: (v.to("meta") if k == name else v) for k, v in args.items()}
        other = next(k for k in args if k != name) if name == first else first
        pattern = (rf"{other} is on device cpu but {name} is on meta" if name == first else rf"{name} is on device meta but {first} is on cpu")
        with pytest.raises(ValueError, match=pattern + ": all tensors of one call must be on one device"): f(**moved)
    if "dt" in args:  # a 0-d CPU step goes with any device, like a Python float
        y = f(**{k: (v.to("meta") if k != "dt" else v[0]) for k, v in args.items()})
        assert y.device.type == "meta"


def test_dplr_recomputed_c_tilde_keeps_every_derivative():
    "Follow-up 6: C~ = C (I - dA^L) is recomputed in the backward (torch.utils.checkpoint); double backward (gradgradcheck), "
    "torch.func.grad and vmap(grad) still work (checkpointing's saved-tensor hooks are skipped under torch.func, which refuses them)."
    from torch.func import grad, vmap
    Lam, P, B, _ = dplr("legt", 3)
    C = torch.randn(3, dtype=torch.complex128, generator=torch.Generator().manual_seed(0))
    args = [x.clone().requires_grad_() for x in (Lam, P, B, C)] + [torch.tensor(0.1, dtype=torch.float64, requires_grad=True)]
    assert torch.autograd.gradgradcheck(lambda a, b, c, d, e: ssm_kernel_dplr(a, b, c, d, e, 6), args)
    loss = lambda d: ssm_kernel_dplr(Lam, P, B, C, d, 6).abs().square().sum()
    dts = torch.tensor([0.05, 0.1], dtype=torch.float64)
    want = torch.stack([torch.autograd.grad(loss(x := d.clone().requires_grad_()), x)[0] for d in dts])
    torch.testing.assert_close(vmap(grad(loss))(dts), want, rtol=1e-13, atol=0)
    torch.testing.assert_close(grad(loss)(dts[0]), want[0], rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [5, engine._DIRECT, engine._DIRECT + 1, 100])
def test_causal_conv_head_sums_on_both_sides_of_direct(p, dtype, monkeypatch):
    "Step 2's outputs before the first big step p: up to _DIRECT steps by `_head_sums` on the unmasked rows (one call, K not copied per row),"
    " beyond it by another FFT level; both equal float64's direct sums to each output's own scale. A 1e6 tap at 2p + 3 (below step 3's"
    " scaling, so `_head_sums` reads the unmasked rows) leaves the outputs before it as their prefixes give them."
    g = torch.Generator().manual_seed(11)
    L = 512
    u = torch.randn(3, 2, L, generator=g, dtype=torch.float64) * 1e-3
    u[..., p] = 1.0  # the first big step of every row: M_t jumps 1000-fold there
    u[0, 0, p // 2] = 0.5  # one row's first big step earlier (rows differ: the head mask is per row)
    K = torch.exp(-torch.arange(L, dtype=torch.float64) / 50) * torch.randn(2, L, generator=g, dtype=torch.float64)
    tap = K.clone(); tap[0, 2 * p + 3] = 1e6
    un, calls, head_sums = u.double().numpy(), [], engine._head_sums
    monkeypatch.setattr(engine, "_head_sums", lambda u_, K_, P: (calls.append((u_.shape, K_.shape, P)), head_sums(u_, K_, P))[1])
    for Kx, n_ok in ((K, L), (tap, 2 * p + 3)):
        ux, Kx = u.to(dtype), Kx.to(dtype)
        calls.clear()
        y = engine._causal_torch(ux, Kx)
        Kn = Kx.double().numpy()
        ref = np.stack([[np.convolve(un[b, h], Kn[h])[:L] for h in range(2)] for b in range(3)])
        scale = np.stack([[np.convolve(np.abs(un[b, h]), np.abs(Kn[h]))[:L] for h in range(2)] for b in range(3)])
        err = (np.abs(y.double().numpy() - ref) / np.where(scale > 0, scale, 1))[..., :n_ok]
        first = engine._first_big(ux, Kx, engine._absmax(ux), engine._absmax(Kx))
        assert err.max() < (1e-13 if dtype == torch.float64 else 3e-5), err.max()  # float32: observed 1.1e-5
        if Kx is K:
            assert int(first.max()) == p and int(first.min()) == p // 2
            if p <= engine._DIRECT:
                assert calls == [((3, 2, L), (2, L), p)]  # the whole rows, the shared (2, L) kernel: no copies per row
                head = np.arange(L) < first.numpy()[..., None]
                assert err[head].max() < (1e-15 if dtype == torch.float64 else 3e-7)  # the direct sums: observed 0 / 1.2e-7
            else: assert len(calls) <= 1 and all(P < p for _, _, P in calls)  # an FFT level over the prefixes first


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_conv_head_sums_not_on_scaled_rows(dtype, monkeypatch):
    "A row that step 3 scales (largest value >= 2^32 in float32, 2^256 in float64) sends step 2 through the masked levels, not `_head_sums`: its huge late"
    " input would otherwise set the scale of the early outputs; they still equal the direct sums of their prefixes."
    big = 2.0**40 if dtype == torch.float32 else 2.0**300
    g = torch.Generator().manual_seed(12)
    u = torch.randn(2, 300, generator=g, dtype=torch.float64) * 1e-3
    u[:, 7] = 1.0; u[1, 40] = big
    K = torch.randn(300, generator=g, dtype=torch.float64) / 8
    u, K = u.to(dtype), K.to(dtype)
    calls = []
    head_sums = engine._head_sums
    monkeypatch.setattr(engine, "_head_sums", lambda *a: (calls.append(1), head_sums(*a))[1])
    y = engine._causal_torch(u, K)
    assert not calls
    ref = np.stack([np.convolve(r, K.double().numpy())[:300] for r in u.double().numpy()])
    scale = np.stack([np.convolve(np.abs(r), np.abs(K.double().numpy()))[:300] for r in u.double().numpy()])
    assert (np.abs(y.double().numpy() - ref) / np.where(scale > 0, scale, 1)).max() < (1e-13 if dtype == torch.float64 else 3e-5)  # observed 1.1e-5


# ---------------------------------------------------------------- issue 32: S4's kernel at training shapes

def np_c_tilde(Lam, P, C, dt, L):
    "C (I - Ad^L) with the dense bilinear Ad = (I - dt/2 A)^{-1} (I + dt/2 A), A = diag(Lam) - P^T conj(P), in NumPy complex128."
    A = np.diag(Lam.numpy()) - P.numpy().T @ P.numpy().conj()
    I = np.eye(len(A))
    Ad = np.linalg.solve(I - dt / 2 * A, I + dt / 2 * A)
    return C.numpy() - C.numpy() @ np.linalg.matrix_power(Ad, L)


@pytest.mark.parametrize("measure,N,L", [
    ("legs", 64, 1), ("legs", 64, 1000),  # one product; low-rank squarings to rank N/_RANK = 16, then 62 products with Ad^16
    ("legs", 64, 1024 * 16 + 5), ("legt", 16, 777),  # more than _APPLY products left: the dense form squared first
    ("legt", 64, 99), ("fout", 15, 300), ("lagt", 16, 65), ("legs", 3, 4097)])  # rank 2; poles on the axis; N / _RANK < 2 r
def test_c_tilde_equals_the_dense_power(measure, N, L):
    """Issue 32 item 1: S4's C~ = C (I - Ad^L) took a third of the layer's forward as dense (H, N, N) powers (O(N^3 log L));
    _c_tilde keeps Ad = diag(e) + X Y^* and its powers diagonal plus low rank. Against NumPy's dense power in complex128, per
    channel with its own step, on every branch (the low bits of L, products with the last low-rank power, the dense squarings)."""
    Lam, P, B, _ = dplr(measure, N)
    gen = torch.Generator().manual_seed(N + L)
    dts = torch.tensor([1e-3, 0.02, 0.3], dtype=torch.float64)
    C = torch.randn(3, N, dtype=torch.complex128, generator=gen)
    Ct = engine._c_tilde(Lam.expand(3, N), P.expand(3, *P.shape), B, C, dts[:, None], L)
    for h in range(3):
        ref = np_c_tilde(Lam, P, C[h], dts[h].item(), L)
        assert np.abs(Ct[h].numpy() - ref).max() < 1e-12 * np.abs(C[h].numpy()).max(), (h, np.abs(Ct[h].numpy() - ref).max())
    Ct32 = engine._c_tilde(*(x.to(torch.complex64) for x in (Lam.expand(3, N), P.expand(3, *P.shape), B, C)), dts[:, None].float(), L)
    assert Ct32.dtype == torch.complex64 and (Ct32 - Ct).abs().max() < 1e-6 * C.abs().max()  # computed in complex128, rounded once


def test_c_tilde_branches_are_taken(monkeypatch):
    "The cases above reach each branch of _c_tilde: counted by the products it forms (dense squarings only beyond _APPLY)."
    Lam, P, B, _ = dplr("legs", 64)
    C = torch.ones(64, dtype=torch.complex128)
    dense = []
    monkeypatch.setattr(torch, "diag_embed", lambda e, f=torch.diag_embed: dense.append(e.shape) or f(e))
    engine._c_tilde(Lam, P, B, C, torch.tensor([0.01], dtype=torch.float64), 1000)
    assert not dense  # 1000 = 62 x 16 + 8: no dense form
    engine._c_tilde(Lam, P, B, C, torch.tensor([0.01], dtype=torch.float64), 1024 * 16 + 5)
    assert len(dense) == 1  # 16389 >> 4 = 1024 > _APPLY products: the dense form of Ad^16, squared


def test_solve_small_against_numpy():
    "_solve_small: Cramer's rule for 2 x 2 systems (the bordered system of rank 1), torch.linalg.solve otherwise; against NumPy."
    gen = torch.Generator().manual_seed(3)
    for n in (1, 2, 3):
        M = torch.randn(5, 7, n, n, dtype=torch.complex128, generator=gen) + 3 * torch.eye(n)
        b = torch.randn(5, 7, n, dtype=torch.complex128, generator=gen)
        x = engine._solve_small(M, b)
        assert x.shape == b.shape and np.abs(x.numpy() - np.linalg.solve(M.numpy(), b.numpy()[..., None])[..., 0]).max() < 1e-14


@pytest.mark.parametrize("block", [16, 40, 2**18])
def test_cauchy_blocks_in_cache_sized_pieces(block, monkeypatch):
    """Issue 32 item 1: the Cauchy sums of an S4 layer (H = 128, N = 64, L = 1024) ran in one block of 8M numbers (136 ms, one
    thread); blocks of at most _BLOCK = 2^18 numbers (32 points there) take 23 ms. With _BLOCK small enough to split tiny
    problems (at least 8 points a block), a batch with skipped poles equals the double loop, and the gradients pass gradcheck."""
    monkeypatch.setattr(engine, "_BLOCK", block)
    gen = torch.Generator().manual_seed(5)
    v = torch.randn(2, 3, 4, dtype=torch.complex128, generator=gen)
    g = torch.randn(2, 1, 21, dtype=torch.complex128, generator=gen)
    lam = torch.randn(4, dtype=torch.complex128, generator=gen)
    skip = torch.randint(0, 4, (21,), generator=gen)
    loop = torch.tensor([[[[sum(v[b, m, n] / (g[a, 0, j] - lam[n]) for n in range(4) if n != skip[j]) for j in range(21)]
                           for m in range(3)] for b in range(2)] for a in range(2)])  # batch (2,) of v against (2, 1) of g
    assert (cauchy(v, g, lam, skip=skip) - loop).abs().max() < 1e-13 * loop.abs().max()
    sizes = [w.shape[-1] for _, w in engine._blocks(v, g, lam, skip, 4096)]
    assert sum(sizes) == 21 and max(sizes) == min(21, max(8, block // (2 * 2 * 4)))
    args = [x.clone().requires_grad_() for x in (v, g, lam)]
    assert torch.autograd.gradcheck(lambda a, b, c: cauchy(a, b, c, skip=skip), args)


@pytest.mark.parametrize("p", [0, 3, 15, 16, 40, 63, 64, 100, 199])
def test_first_big_step_on_both_sides_of_each_window(p):
    """Issue 32 item 2: step 2 looks for each row's first big step among its first 16 steps, then 64, then the whole row
    (_FIRST). Rows whose first big step lies before, at and after each window get the step of the definition (the first t
    with max|u_0..t| max|K_0..t| >= max|u| max|K| / 16), and the outputs before it stay the prefix's direct sums."""
    L = 200
    g = torch.Generator().manual_seed(p)
    u = torch.randn(3, L, generator=g, dtype=torch.float64) * 1e-3
    u[:, p] = 100.0  # (largest |u| so far) x (largest |K| so far) jumps 1e5-fold at step p
    K = torch.ones(L, dtype=torch.float64) + 0.1 * torch.rand(L, generator=g, dtype=torch.float64)
    hu, hK = engine._absmax(u), engine._absmax(K)
    M = u.abs().cummax(-1).values * K.abs().cummax(-1).values
    expected = (M >= (hu * hK / 16)[:, None]).to(torch.uint8).argmax(-1)
    assert torch.equal(expected, torch.full((3,), p)) and torch.equal(engine._first_big(u, K, hu, hK), expected)
    y = causal_conv(u, K)
    if p: torch.testing.assert_close(y[:, :p], np_conv(u[:, :p], K[:p]), rtol=1e-13, atol=1e-18)  # the huge step leaves no rounding in them
    torch.testing.assert_close(y, np_conv(u, K), rtol=1e-12, atol=1e-12 * 100 * L)


def test_first_big_step_reads_few_steps_on_ordinary_data(monkeypatch):
    """Issue 32 item 2: on ordinary data (the sweep's causal_conv data, every row's first big step within 9 steps) the search
    reads the first 16 steps of each row, not 64: cummax over 64 steps of every row took as long as the FFT at (32, 32, 128)."""
    g = torch.Generator().manual_seed(4)
    u, K = torch.randn(64, 32, 784, generator=g), torch.randn(32, 784, generator=g) / math.sqrt(784)
    seen, cummax = [], torch.Tensor.cummax
    monkeypatch.setattr(torch.Tensor, "cummax", lambda x, *a, **k: seen.append(x.shape[-1]) or cummax(x, *a, **k))
    y = engine._causal_torch(u, K)
    assert seen and max(seen) == 16
    monkeypatch.undo()
    assert (y.double() - np_conv(u, K)).abs().max() < 1e-6 * np_conv(u, K).abs().max()


@pytest.mark.skipif(engine._heads is None, reason="numba is not installed: step 2 runs as NumPy operations")
def test_guard_fused_with_numba_on_ordinary_data(monkeypatch):
    """Issue 32 item 2: with numba, step 2 of the CPU path on ordinary data (each row's first big step, the direct sums before it)
    is one compiled pass over the rows (_heads), not NumPy's search and levels (which fail here if called); it equals the float64
    reference, with broadcast rows, float64 and a 1-d call too."""
    monkeypatch.setattr(engine, "_np_first", lambda *a: pytest.fail("step 2 ran as NumPy operations"))
    monkeypatch.setattr(engine, "_np_direct", lambda *a: pytest.fail("step 2 ran as NumPy operations"))
    g = torch.Generator().manual_seed(4)
    for us, ks, dtype in [((32, 32, 128), (32, 128), torch.float32), ((3, 1, 50), (4, 50), torch.float64), ((70,), (70,), torch.float32)]:
        u, K = torch.randn(us, generator=g, dtype=dtype), torch.randn(ks, generator=g, dtype=dtype) / math.sqrt(us[-1])
        y, ref = causal_conv(u, K), np_conv(u, K)
        assert y.dtype == dtype and (y.double() - ref).abs().max() < (1e-14 if dtype == torch.float64 else 1e-6) * ref.abs().max()


@pytest.mark.parametrize("p", [5, 63, 64, 150])
@pytest.mark.parametrize("fused", [True, False])
def test_guard_fused_and_numpy_levels_agree(p, fused, monkeypatch):
    """Both sides of _heads' window (a first big step before step 64: compiled; from 64 on: the NumPy levels) and both
    implementations (numba's, NumPy's) on the CPU path: the outputs before a 1e6 input at step p stay the prefix's direct sums."""
    if fused and engine._heads is None: pytest.skip("numba is not installed")
    if not fused: monkeypatch.setattr(engine, "_heads", None)
    g = torch.Generator().manual_seed(p)
    u, K = torch.randn(4, 3, 200, generator=g), torch.randn(3, 200, generator=g) / 14
    u[..., p] = 1e6
    y = causal_conv(u, K)
    ref, scale = np_conv(u[..., :p], K), np_conv(u[..., :p].abs(), K.abs())
    assert ((y[..., :p].double() - ref).abs() / scale).max() < (3e-7 if p < 64 else 3e-5)  # the 1e6 leaks nothing: direct sums or a prefix FFT level
    assert ((y.double() - np_conv(u, K)).abs().max() / np_conv(u.abs(), K.abs()).max()) < 3e-7


def test_guard_fused_only_where_it_applies(monkeypatch):
    "The CPU path calls _heads only on ordinary data: not for a row with a NaN, an infinity or a huge value (step 1 or 3 applies)."
    calls, heads = [], engine._heads
    monkeypatch.setattr(engine, "_heads", lambda *a: calls.append(1) or (heads(*a) if heads is not None else False))
    u, K = torch.randn(2, 30), torch.randn(30)
    clean = causal_conv(u, K)
    assert len(calls) == 1
    for bad in (math.nan, math.inf, 1e37):
        ub = u.clone(); ub[0, 7] = bad
        y = causal_conv(ub, K)
        assert len(calls) == 1 and torch.isfinite(y[0, :7]).all() and torch.allclose(y[1], clean[1], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- issue 32: the CPU path's lean pass, workspaces, thresholds

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_absmax_rows_matches_numpy(dtype):
    "The rows' largest |x| from the bits (numba) or NumPy: equal to NumPy's max of |x|, NaN or inf where a row has one, -0 and subnormals included."
    g = np.random.default_rng(0)
    A = g.standard_normal((7, 33)).astype(dtype)
    A[1, 4], A[2, 0], A[3, -1], A[4] = np.nan, -np.inf, np.inf, -0.0
    A[5, 3] = -np.finfo(dtype).max; A[6] = np.finfo(dtype).smallest_subnormal * np.arange(33)
    h = engine._absmax_rows(A)
    ref = np.abs(A).max(-1)
    assert h.dtype == dtype and np.array_equal(h[~np.isnan(ref)], ref[~np.isnan(ref)]) and np.isnan(h[1]) and np.isinf(h[[2, 3]]).all()
    np.testing.assert_array_equal(engine._absmax_rows(A[[0, 5, 6], ::3]), np.abs(A[[0, 5, 6], ::3]).max(-1))  # a strided view


def test_mul_rows_matches_numpy():
    "X[r] *= F[idx[r]] (or its conjugate) and acc[idx[r]] += X[r] in place, the rows of F read where they are: equal to NumPy's gathered products and a loop's sums."
    g = np.random.default_rng(1)
    X = (g.standard_normal((9, 17)) + 1j * g.standard_normal((9, 17))).astype(np.complex64)
    F = (g.standard_normal((4, 17)) + 1j * g.standard_normal((4, 17))).astype(np.complex64)
    idx = np.array([0, 1, 2, 3, 0, 1, 2, 3, 3])
    Xb = np.concatenate([X, np.ones((9, 3), X.dtype)], 1)  # rows longer than the product (the CPU path's padded buffers)
    ref = X * F[idx]
    engine._mul_rows(Xb, 17, F, idx)
    np.testing.assert_allclose(Xb[:, :17], ref, rtol=3e-7, atol=0)  # float32 rounding (the compiled product may fuse a multiply-add)
    assert (Xb[:, 17:] == 1).all()  # the padding untouched
    Xc = np.concatenate([X, np.ones((9, 3), X.dtype)], 1)
    engine._mul_rows(Xc, 17, F, idx, conj=True)  # the backward's correlation: the conjugate spectrum
    np.testing.assert_allclose(Xc[:, :17], X * F[idx].conj(), rtol=3e-7, atol=0)
    acc = np.zeros((4, 17), X.dtype)
    engine._add_rows(acc, Xb, 17, idx)  # repeated rows add up (the gradient of a kernel broadcast over the batch)
    ref_acc = np.zeros((4, 17), np.complex128)
    for r, j in enumerate(idx): ref_acc[j] += Xb[r, :17]
    np.testing.assert_allclose(acc, ref_acc, rtol=1e-6, atol=1e-6)


def test_workspaces_are_reused_and_kept_apart(monkeypatch):
    """The CPU path's buffers are kept per thread between calls (no fresh pages per call) and never leak one call's data into
    another: calls of other lengths, kernels and batches in between, then the first call again, all equal the float64 reference."""
    monkeypatch.setattr(engine, "_CPU_MIN_L", 0); monkeypatch.setattr(engine, "_CPU_MIN_SIZE", 0)
    g = torch.Generator().manual_seed(11)
    calls = [(torch.randn(3, 4, 300, generator=g), torch.randn(4, 300, generator=g) / 17),
             (torch.randn(2, 300, generator=g), torch.randn(2, 120, generator=g) / 11),  # a shorter kernel: same length n, other rows
             (torch.randn(5, 1, 301, generator=g), torch.randn(3, 301, generator=g) / 17)]
    for u, K in calls + calls[:1]:
        y, ref = causal_conv(u, K), np_conv(u, torch.nn.functional.pad(K, (0, u.shape[-1] - K.shape[-1])))
        assert (y.double() - ref).abs().max() < 1e-6 * ref.abs().max()
    n = next_fast_len(2 * 300 - 1)
    w = engine._workspace("u", n, 300, np.float32, engine._block_rows(n))
    assert engine._workspace("u", n, 300, np.float32, engine._block_rows(n)) is w  # kept
    assert w.buf.strides[0] == (n + engine._PAD) * 4 and not w.buf[:, 300:].any()  # padded rows; the zero padding stays zero
    assert len(engine._kept.spectra) <= engine._KEPT
    big = 2 * engine._SPAN // engine._ROWS  # rows this long would need blocks of more than _SPAN samples: not kept (memory)
    assert engine._workspace("u", big, big // 2, np.float32, engine._block_rows(big)) is not engine._workspace("u", big, big // 2, np.float32, engine._block_rows(big))


def test_workspaces_per_thread():
    "Two threads convolving different data at once each get their own buffers: both results equal the reference."
    import threading
    g = torch.Generator().manual_seed(12)
    data = [(torch.randn(64, 1024, generator=g), torch.randn(1024, generator=g) / 32) for _ in range(2)]
    out = [None, None]
    def work(i):
        for _ in range(5): out[i] = causal_conv(*data[i])
    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts: t.start()
    for t in ts: t.join()
    for (u, K), y in zip(data, out): assert (y.double() - np_conv(u, K)).abs().max() < 1e-6 * np_conv(u, K).abs().max()


@pytest.mark.parametrize("L", [1, 2, 7, 128, 255, 256, 1024])
@pytest.mark.parametrize("complex_", [False, True])
def test_cpu_path_for_every_real_input(L, complex_, monkeypatch):
    """Issue 32: measured faster at every shape tried with rows of 2 samples or more (section 2 of engine/conv), the CPU path runs
    for every such real CPU input; rows of one sample and complex inputs take the torch path. Both equal the float64 reference,
    forward and backward."""
    taken = []
    np_causal, causal_torch = engine._np_causal, engine._causal_torch
    monkeypatch.setattr(engine, "_np_causal", lambda *a: (taken.append("CPU"), np_causal(*a))[1])
    monkeypatch.setattr(engine, "_causal_torch", lambda *a: (taken.append("torch"), causal_torch(*a))[1])
    g, dt = torch.Generator().manual_seed(L), torch.complex128 if complex_ else torch.float64
    u, K = torch.randn(2, 3, L, generator=g, dtype=dt), torch.randn(3, L, generator=g, dtype=dt) / math.sqrt(L)
    y = causal_conv(u, K)
    assert taken == ["torch" if complex_ or L < 2 else "CPU"]
    torch.testing.assert_close(y, np_conv(u, K), rtol=0, atol=1e-12)
    ug, Kg = u.clone().requires_grad_(), K.clone().requires_grad_()
    w = torch.randn(2, 3, L, generator=g, dtype=dt)
    (causal_conv(ug, Kg) * w).real.sum().backward()
    gu = np.stack([[np.correlate(w[b, h].numpy().conj(), K[h].numpy(), "full")[L - 1:] for h in range(3)] for b in range(2)])  # conj(sum_t w_t K_{t-s}): PyTorch's complex gradient
    torch.testing.assert_close(ug.grad, torch.from_numpy(gu), rtol=0, atol=1e-11)


@pytest.mark.parametrize("fft", FFTS)
def test_lean_pass_equals_general_pass(fft, monkeypatch):
    """Ordinary data (finite, nothing huge) takes the CPU path's lean pass (no masks or scaling; step 2 by `_heads` with numba):
    it equals the general pass (forced by reporting a non-finite row maximum) to float32 rounding, and both the reference."""
    use_fft(fft, monkeypatch)
    g = torch.Generator().manual_seed(13)
    u, K = torch.randn(6, 5, 700, generator=g), torch.randn(5, 700, generator=g) / 26
    lean = causal_conv(u, K)
    absmax = engine._absmax_rows
    monkeypatch.setattr(engine, "_absmax_rows", lambda A: np.full(len(A), np.nan, A.dtype))  # every row looks non-finite: the general pass
    general = causal_conv(u, K)
    monkeypatch.setattr(engine, "_absmax_rows", absmax)
    ref = np_conv(u, K)
    assert (lean.double() - ref).abs().max() < 3e-7 * ref.abs().max() and (general.double() - ref).abs().max() < 3e-7 * ref.abs().max()
    assert (lean - general).abs().max() < 1e-6 * ref.abs().max()


def test_cpu_backward_transforms_g_once(monkeypatch):
    """The CPU path's backward computes the spectrum of each block of g once for both gradients (was once per gradient): with a kernel
    broadcast over the batch and one block, three forward transforms (g, u, the kernel's rows), not four; both gradients against
    the float64 direct sums."""
    monkeypatch.setattr(engine, "_CPU_MIN_L", 1)
    g = torch.Generator().manual_seed(14)
    u = torch.randn(4, 3, 100, generator=g, dtype=torch.float64, requires_grad=True)
    K = torch.randn(3, 100, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 100, generator=g, dtype=torch.float64)
    y = causal_conv(u, K)
    calls, fwd = [], engine._Spectra.fwd
    monkeypatch.setattr(engine._Spectra, "fwd", lambda self, r: (calls.append(r), fwd(self, r))[1])
    (y * w).sum().backward()
    assert len(calls) == 3, calls
    gu = np.stack([[np.correlate(w[b, h].numpy(), K[h].detach().numpy(), "full")[99:] for h in range(3)] for b in range(4)])
    gK = sum(np.stack([np.correlate(w[b, h].numpy(), u[b, h].detach().numpy(), "full")[99:] for h in range(3)]) for b in range(4))
    torch.testing.assert_close(u.grad, torch.from_numpy(gu), rtol=0, atol=1e-11)
    torch.testing.assert_close(K.grad, torch.from_numpy(gK), rtol=0, atol=1e-11)


# ---------------------------------------------------------------- ordinary data, a kernel shared by many rows: ducc0's convolve_axis

SHARED = [((7, 3, 600), (3, 600), False), ((8, 3, 600), (3, 600), True),  # rows per kernel row: 7, 8 (n = 1200)
          ((2, 36, 3, 33), (3, 20), False), ((2, 40, 3, 33), (3, 20), True),  # 72 or 80 rows of n = 54: 3888 or 4320 samples a call
          ((45, 45), (45,), False), ((48, 45), (45,), True), ((3, 8, 2, 40), (8, 1, 40), False), ((44, 8, 2, 24), (8, 1, 24), True),
          ((600, 3, 4), (3, 4), False), ((600, 3, 16), (3, 16), True)]  # transforms of n = 8 or 32: 4800 or 19200 samples a kernel row


def count_shared(monkeypatch):
    "Record the number of rows of each call of `_np_shared` (the fused pass)."
    calls, shared = [], engine._np_shared
    monkeypatch.setattr(engine, "_np_shared", lambda A, ia, *a, **k: (calls.append(len(ia)), shared(A, ia, *a, **k))[1])
    return calls


@pytest.mark.parametrize("ushape,kshape,fused", SHARED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shared_kernel_pass_on_both_sides_of_its_threshold(ushape, kshape, fused, dtype, monkeypatch):
    """Ordinary data whose kernel rows are each shared by `_SHARED` (8) rows or more on average, whose transforms are at
    least `_SHARED_N` (32) long and fill `_SHARED_SPAN` (4096) samples or more a kernel row, takes ducc0's fused
    convolution (`_np_shared`), else the blocked pass; both equal np.convolve in float64 to the dtype's rounding."""
    assert (engine._SHARED, engine._SHARED_SPAN, engine._SHARED_N) == (8, 4096, 32)  # the thresholds these shapes straddle
    use_fft("ducc0", monkeypatch)
    calls = count_shared(monkeypatch)
    g = torch.Generator().manual_seed(15)
    u, K = torch.randn(ushape, generator=g, dtype=dtype), torch.randn(kshape, generator=g, dtype=dtype)
    pad = K.new_zeros(*K.shape[:-1], u.shape[-1] - K.shape[-1])  # a kernel shorter than u: zero taps for the reference
    y, ref = causal_conv(u, K), np_conv(u, torch.cat([K, pad], -1))
    assert bool(calls) == fused, (calls, engine._SHARED)
    eps = 1e-6 if dtype == torch.float32 else 1e-14
    assert y.dtype == dtype and (y.double() - ref).abs().max() < eps * ref.abs().max()


def test_shared_kernel_pass_blocks_and_copies(monkeypatch):
    """`_np_shared` with blocks that cut a kernel row's rows apart (rows = 5, 7), and without numba (NumPy's fancy indexing for
    the copies: the same bits as the compiled copies), against np.convolve in float64."""
    if engine.ducc0 is None: pytest.skip("ducc0 is not installed")
    g = torch.Generator().manual_seed(16)
    u, K = torch.randn(4, 3, 3, 50, generator=g), torch.randn(3, 1, 30, generator=g)  # kernel rows shared by 12 rows, in runs of 3
    A, Bm = u.reshape(-1, 50).numpy(), K.reshape(-1, 30).numpy()
    ia, ib = engine._row_index((4, 3, 3), (4, 3, 3)), engine._row_index((4, 3, 3), (3, 1))
    ref = np_conv(u, torch.cat([K, K.new_zeros(3, 1, 20)], -1)).reshape(-1, 50).numpy()
    one = engine._np_shared(A, ia, Bm, ib, 50)
    assert np.abs(one - ref).max() < 1e-6 * np.abs(ref).max()
    for rows in (5, 7):  # ducc0 rounds a row alike whatever the call, up to its vector lanes: float32 rounding, not bits
        assert np.abs(engine._np_shared(A, ia, Bm, ib, 50, rows) - ref).max() < 1e-6 * np.abs(ref).max()
    monkeypatch.setattr(engine, "_copy_rows_compiled", None)
    np.testing.assert_array_equal(engine._np_shared(A, ia, Bm, ib, 50), one)  # the same calls: the copies are exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shared_kernel_pass_is_causal(dtype, monkeypatch):
    """The fused pass is followed by step 2 like the blocked one: a large finite input (1e6, 1e30 in float64) at t0 leaves
    y[:t0] as the prefix alone gives it."""
    use_fft("ducc0", monkeypatch)
    calls = count_shared(monkeypatch)
    g = torch.Generator().manual_seed(17)
    u, K = torch.randn(8, 3, 300, generator=g, dtype=dtype), torch.randn(3, 300, generator=g, dtype=dtype) / 10
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for t0 in (1, 30, 299):
        clean = np_conv(u[..., :t0], K[..., :t0])
        for big in (1e6, 1e9) if dtype == torch.float32 else (1e6, 1e30):
            ub = u.clone(); ub[..., t0] = big
            y = causal_conv(ub, K)
            assert ((y[..., :t0] - clean).abs().max() / clean.abs().max()).item() < tol, (t0, big)
    assert calls  # the fused pass ran


@pytest.mark.parametrize("path", ["ducc0", "torch.fft", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_conv_nonfinite_input_after_small_taps(path, dtype, monkeypatch):
    """A NaN or an inf at t0 with the kernel's early taps under 1/_GUARD of its largest: y[:t0] as the prefix alone gives it
    (the CPU path's step 2 rebuilt prefixes past the non-finite input, whose first big step came after it: NaN before t0)."""
    if path != "torch": use_fft(path, monkeypatch)
    f = engine._causal_torch if path == "torch" else causal_conv
    for bad in (math.nan, math.inf):
        for t0 in (1, 3, 10):
            u, K = torch.ones(1, 100, dtype=dtype), torch.ones(100, dtype=dtype)
            K[:2] = 0.01; u[0, t0] = bad
            y = f(u, K)
            torch.testing.assert_close(y[0, :t0].double(), np_conv(u[:, :t0], K[:t0])[0], rtol=1e-6, atol=1e-8)
            assert torch.isnan(y[0, t0:]).all()
    g = torch.Generator().manual_seed(18)  # the reviewer's random case: 4 of 36 rows had y[0] = NaN
    u, K = torch.randn(4, 9, 1000, generator=g, dtype=dtype), torch.randn(9, 1000, generator=g, dtype=dtype) / 10
    u[..., 1] = math.nan
    y = f(u, K)
    torch.testing.assert_close(y[..., 0], u[..., 0] * K[..., 0])
    assert torch.isnan(y[..., 1:]).all()
