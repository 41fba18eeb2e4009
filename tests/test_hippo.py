"""ssm_course.hippo: the contract's matrices, the S4 repository's conventions, DPLR factors, projection against quadrature,
bad input, inputs unchanged."""
import math, numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st
from numpy.polynomial import legendre as npleg
from ssm_course.hippo import MEASURES, dplr, hippo, hippo_basis, hippo_project, hippo_reconstruct


@pytest.mark.parametrize("N", [1, 2, 5, 16])
def test_contract_matrices(N):
    "LegS and LagT exactly as written in API.md, built here with plain loops."
    A, B = hippo("legs", N)
    for n in range(N):
        assert B[n] == math.sqrt(2 * n + 1)
        for k in range(N):
            want = -math.sqrt(2 * n + 1) * math.sqrt(2 * k + 1) if n > k else (-(n + 1) if n == k else 0.0)
            assert abs(A[n, k].item() - want) < 1e-12
    A, B = hippo("lagt", N)
    torch.testing.assert_close(A, torch.eye(N, dtype=torch.float64) / 2 - torch.tril(torch.ones(N, N, dtype=torch.float64)))
    torch.testing.assert_close(B, torch.ones(N, dtype=torch.float64))
    assert hippo("legs", N, dtype=torch.float32)[0].dtype == torch.float32


@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("N", [1, 3, 8, 31])
def test_dplr_reconstructs(measure, N):
    A, B = hippo(measure, N)
    Lambda, P, Bt, V = dplr(measure, N)
    assert Lambda.dtype == P.dtype == Bt.dtype == V.dtype == torch.complex128 and Lambda.shape == (N,)
    assert P.shape == (2 if measure == "legt" else 1, N)  # issue 25 item 13: the rank axis for every measure (was (N,) at rank 1)
    torch.testing.assert_close(V.mH @ V, torch.eye(N, dtype=torch.complex128), atol=1e-10, rtol=0)
    rebuilt = V @ (torch.diag(Lambda) - P.T @ P.conj()) @ V.mH
    assert (rebuilt - A).abs().max() < 1e-8 * max(1.0, A.abs().max().item())
    assert (V @ Bt - B).abs().max() < 1e-8


def test_legt_reconstructs_a_quadratic():
    """A quadratic on the window is reconstructed by LegT (N = 16) to 1e-10 (observed 4.4e-11). The residual is not the
    time step (4.53e-11, 4.44e-11, 4.43e-11 at dt = 2e-3, 1e-3, 5e-4) but the truncated system's imperfect forgetting
    of the switch-on at s = 1, which falls with N (1.8e-6, 9.4e-9, 4.4e-11 at N = 4, 8, 16)."""
    dt = 1e-3
    s = dt * torch.arange(1, 4001, dtype=torch.float64)
    u = torch.where(s > 1.0, (s - 1) ** 2, torch.zeros_like(s))  # switched on at s = 1 (a kink: continuous first derivative)
    x = torch.linspace(0, 1, 50, dtype=torch.float64)
    truth = (4.0 - x - 1) ** 2
    err = {N: ((hippo_reconstruct("legt", hippo_project("legt", u, N, dt)[..., -1], x) - truth).abs().max() / truth.abs().max()).item() for N in (4, 8, 16)}
    assert err[4] > err[8] > err[16] and err[16] < 1e-10, err


def test_legs_matches_quadrature():
    "LegS coefficients of u(s) = sin(3s) on [0, 2] against Gauss-Legendre quadrature with numpy's Legendre."
    dt, N = 5e-4, 12
    s = dt * torch.arange(1, 4001, dtype=torch.float64)
    c = hippo_project("legs", torch.sin(3 * s), N)[..., -1].numpy()
    nodes, w = npleg.leggauss(200)
    sq = (nodes + 1)  # s in [0, 2]
    ref = np.array([math.sqrt(2 * n + 1) * np.sum(w / 2 * np.sin(3 * sq) * npleg.Legendre.basis(n)(nodes)) for n in range(N)])
    np.testing.assert_allclose(c, ref, atol=2e-6)  # observed 1.07e-6


BAD = [
    (lambda: hippo("legx", 4), ValueError, "measure"),
    (lambda: hippo("legs", 0), ValueError, "N"),
    (lambda: hippo("legs", 2.5), TypeError, "N"),
    (lambda: hippo("legs", True), TypeError, "N"),
    (lambda: hippo("legs", 3, dtype=torch.int64), TypeError, "dtype"),
    (lambda: dplr("legs", 0), ValueError, "N"),
    (lambda: dplr("legs", 2.5), TypeError, "N"),
    (lambda: hippo_basis("legt", True, torch.zeros(3)), TypeError, "N"),
    (lambda: hippo_basis("legt", 3, torch.zeros(3, dtype=torch.complex64)), TypeError, "x"),
    (lambda: hippo_project("legt", torch.zeros(5), 0), ValueError, "N"),
    (lambda: hippo_project("legt", torch.zeros(5), 4, dt=float("nan")), ValueError, "dt"),
    (lambda: dplr("lagx", 4), ValueError, "measure"),
    (lambda: dplr("legt", -1), ValueError, "N"),
    (lambda: hippo_basis("fout", 4, np.zeros(3)), TypeError, "x"),
    (lambda: hippo_project("legs", [1.0, 2.0], 4), TypeError, "u"),
    (lambda: hippo_project("legs", torch.zeros(0), 4), ValueError, "u"),
    (lambda: hippo_project("legt", torch.zeros(5), 4, dt=0.0), ValueError, "dt"),
    (lambda: hippo_reconstruct("legs", torch.zeros(()), torch.zeros(3)), ValueError, "c"),
]


@pytest.mark.parametrize("call,exc,name", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_numpy_sizes_accepted():
    "NumPy integers are sizes like any other (check_size)."
    for N in [np.int64(5), np.int32(5)]:
        torch.testing.assert_close(hippo("legs", N)[0], hippo("legs", 5)[0])
        assert dplr("legt", N)[0].shape == (5,) and hippo_basis("lagt", N, torch.zeros(2)).shape == (5, 2)


@pytest.mark.parametrize("measure", MEASURES)
def test_project_dtypes(measure):
    "Integer input is projected in float, half precision in float32 (cast back), complex input by linearity."
    u = torch.tensor([0, 1, 3, 2, 0, -1, 4])
    ref = hippo_project(measure, u.double(), 6, 0.1)
    c = hippo_project(measure, u, 6, 0.1)
    assert c.dtype == torch.float32
    torch.testing.assert_close(c.double(), ref, rtol=1e-5, atol=1e-5)
    h = hippo_project(measure, u.to(torch.float16), 6, 0.1)
    assert h.dtype == torch.float16 and torch.equal(h, hippo_project(measure, u.float(), 6, 0.1).to(torch.float16))
    cc = hippo_project(measure, u.double() + 2j * u.double().flip(-1), 6, 0.1)
    torch.testing.assert_close(cc, ref + 2j * hippo_project(measure, u.double().flip(-1), 6, 0.1), rtol=0, atol=1e-12)
    x = torch.linspace(0, 1, 5)
    assert hippo_reconstruct(measure, c[..., -1], x).dtype == torch.float32
    assert hippo_reconstruct(measure, torch.tensor([1, 0, 2]), x).dtype == torch.float32  # integer coefficients are not truncated


def test_s4_repository_conventions():
    """Notebook 03's claims about state-spaces/s4 (`src/models/hippo/hippo.py`, `transition`), with that file's
    matrices rebuilt here from its definitions: its legt is ours times 1/2 (A and B: a window of length 2); its fout
    of size N is our FouT of size N - 1 for a window of length 2 (frequencies pi j, A = J/2 - e e^T, B = e), with
    each cosine before its sine, plus an identically zero state at index 1; at even N that is our FouT of size N
    (whose dead state is the last one), reordered."""
    N = 8
    n = np.arange(N, dtype=np.float64)
    r = np.sqrt(2 * n + 1)
    row, col = np.meshgrid(n, n, indexing="ij")
    A_s4, B_s4 = -0.5 * r[:, None] * np.where(row < col, (-1.0) ** (row - col), 1.0) * r[None, :], 0.5 * r
    A, B = hippo("legt", N)
    np.testing.assert_array_equal(A_s4, A.numpy() / 2); np.testing.assert_array_equal(B_s4, B.numpy() / 2)
    e = np.zeros(N); e[0::2] = math.sqrt(2); e[0] = 1.0  # the S4 fout's B: constant, then (cos, sin) pairs
    A_s4 = -np.outer(e, e)
    for j in range(1, N // 2): A_s4[2 * j, 2 * j + 1], A_s4[2 * j + 1, 2 * j] = -math.pi * j, math.pi * j
    assert not A_s4[1].any() and not A_s4[:, 1].any() and e[1] == 0  # index 1: a state that never moves
    A, B = hippo("fout", N - 1)
    used, ours = [0, 2, 3, 4, 5, 6, 7], [0, 2, 1, 4, 3, 6, 5]  # S4's (const, cos j, sin j) = our (const, sin j at 2j-1, cos j at 2j)
    np.testing.assert_allclose(A_s4[np.ix_(used, used)], A.numpy()[np.ix_(ours, ours)] / 2, rtol=0, atol=1e-15)
    np.testing.assert_allclose(e[used], B.numpy()[ours] / 2, rtol=0, atol=1e-15)
    A, B = hippo("fout", N)  # even N: ours carries its dead state last (a sine without its cosine), S4's at index 1
    order = [0, 7, 2, 1, 4, 3, 6, 5]  # S4's state k is our state order[k]
    np.testing.assert_allclose(A_s4, A.numpy()[np.ix_(order, order)] / 2, rtol=0, atol=1e-15)
    np.testing.assert_allclose(e, B.numpy()[order] / 2, rtol=0, atol=1e-15)


@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("N", [1, 2, 3, 8, 16, 33, 64])
def test_every_hippo_matrix_is_dissipative(measure, N):
    """Issue 27 item 1: A + A^T = 2 eta I - 2 P^ P^T <= 2 eta I (eta = -1/2 for LegS, 0 otherwise; P^ the factor in HiPPO's own
    basis), so ||e^{tA}||_2 <= e^{eta t} and the bilinear dA has ||dA||_2 <= 1. Checked with numpy's eigvalsh, scipy's expm and scipy's cont2discrete, not the course's code."""
    from scipy.linalg import expm
    from scipy.signal import cont2discrete
    A, B = (m.numpy() for m in hippo(measure, N))
    eta = -0.5 if measure == "legs" else 0.0
    scale = max(1.0, np.abs(A).max())
    assert np.linalg.eigvalsh((A + A.T) / 2).max() <= eta + 1e-15 * scale * N  # observed at most 4.2e-16 * scale * N
    for t in np.linspace(0, 20, 41):
        assert np.linalg.norm(expm(t * A), 2) <= np.exp(eta * t) * (1 + 2e-13), t  # observed at most 1 + 5.7e-14
    for dt in [1e-3, 0.1, 10.0]:
        dA = cont2discrete((A, B[:, None], np.eye(N), np.zeros((N, 1))), dt, method="bilinear")[0]
        assert np.linalg.norm(dA, 2) <= 1 + 1e-14, dt  # observed at most 1 + 1.1e-15


@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("N", [1, 3, 8, 31])
def test_dplr_spectrum_is_the_normal_parts(measure, N):
    """Issue 27 item 6: Lambda against numpy's general eigensolver on A + P^ P^T (P^ from the table of notebook 03, built here),
    so Re Lambda = eta is checked, not assumed."""
    A = hippo(measure, N)[0].numpy()
    n = np.arange(N)
    P = {"legs": np.sqrt(n + 0.5)[:, None], "legt": np.stack([np.sqrt(2 * n + 1) * (n % 2 == 0), np.sqrt(2 * n + 1) * (n % 2 == 1)], 1),
         "lagt": np.full((N, 1), 0.5 ** 0.5), "fout": math.sqrt(2) * np.where(n == 0, 1.0, np.where(n % 2 == 0, math.sqrt(2), 0.0))[:, None]}[measure]
    ev = np.linalg.eigvals(A + P @ P.T)
    lam = dplr(measure, N)[0].numpy()
    ev, lam = ev[np.lexsort((ev.real, ev.imag))], lam[np.lexsort((lam.real, lam.imag))]
    scale = max(1.0, np.abs(lam).max())
    assert np.abs(ev - lam).max() < 5e-15 * scale and np.abs(ev.real - (-0.5 if measure == "legs" else 0.0)).max() < 1e-15 * scale


@pytest.mark.parametrize("N", [2, 3, 6, 7, 8, 9, 16, 17])
def test_legs_real_mode_at_odd_N(N):
    """Issue 27 item 4: LegS's normal part has N/2 conjugate pairs at even N and, at odd N, one real eigenvalue -1/2
    (a real skew-symmetric matrix of odd size is singular), whose computed imaginary part is rounding."""
    Lambda = dplr("legs", N)[0]
    real = Lambda.imag.abs() < 1e-13
    assert int(real.sum()) == N % 2
    if N % 2: assert abs(Lambda[real].real.item() + 0.5) < 1e-14
    else: assert int((Lambda.imag > 0).sum()) == N // 2


@pytest.mark.parametrize("N", [2, 5, 8, 13, 16])
def test_fout_dead_state_at_even_N(N):
    """Issue 27 item 5: at even N the last FouT state (a sine without its cosine) has a zero row and column of A and B = 0,
    so it stays 0 whatever the input, and the other N - 1 states are FouT with N - 1 states; odd N has no such state."""
    A, B = hippo("fout", N)
    u = torch.randn(2, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(N))
    c = hippo_project("fout", u, N, 0.03)
    if N % 2:
        assert A[-1].any() and B[-1] != 0 and c[..., -1, :].abs().max() > 0.01
        return
    assert not A[-1].any() and not A[:, -1].any() and B[-1] == 0 and not c[..., -1, :].any()
    torch.testing.assert_close(A[:-1, :-1], hippo("fout", N - 1)[0], rtol=0, atol=0)
    torch.testing.assert_close(c[..., :-1, :], hippo_project("fout", u, N - 1, 0.03), rtol=0, atol=1e-14)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(measure=st.sampled_from(MEASURES), N=st.integers(1, 6), L=st.integers(1, 9), batch=st.sampled_from([(), (2,)]),
       layout=st.sampled_from(["contiguous", "transposed", "sliced", "expanded"]), complex_=st.booleans(), seed=st.integers(0, 1000))
def test_inputs_unchanged_outputs_finite(measure, N, L, batch, layout, complex_, seed):
    "hippo_project, hippo_reconstruct and hippo_basis never modify their inputs, whatever the strides, and give finite output."
    g = torch.Generator().manual_seed(seed)
    dtype = torch.complex128 if complex_ else torch.float64
    if layout == "transposed": u = torch.randn(L, *batch, generator=g, dtype=dtype).movedim(0, -1)  # time not the fastest axis
    elif layout == "sliced": u = torch.randn(*batch, 2 * L, generator=g, dtype=dtype)[..., ::2]  # stride 2 in time
    elif layout == "expanded": u = torch.randn(1, L, generator=g, dtype=dtype).expand(3, L)  # stride 0 across the batch
    else: u = torch.randn(*batch, L, generator=g, dtype=dtype)
    x = torch.rand(9, generator=g, dtype=torch.float64)[::2]  # ages, strided
    args = [u, x]
    copies = [(a.clone(), a.stride()) for a in args]
    c = hippo_project(measure, u, N, 0.1)
    rec = hippo_reconstruct(measure, c[..., -1], x)
    G = hippo_basis(measure, N, x)
    for a, (copy, stride) in zip(args, copies): assert torch.equal(a, copy) and a.stride() == stride
    for o in (c, rec, G): assert torch.isfinite(torch.view_as_real(o) if o.is_complex() else o).all()


@pytest.mark.parametrize("measure", MEASURES)
def test_project_batched_dt(measure):
    """Issue 25 item 22: a dt tensor (one step per sequence, broadcasting with u's batch dims) raised a broadcasting error.
    Each sequence's coefficients equal the run with its own scalar step; legs checks dt and ignores it."""
    g = torch.Generator().manual_seed(1)
    u = torch.randn(3, 40, generator=g, dtype=torch.float64)
    dts = torch.tensor([0.01, 0.05, 0.2], dtype=torch.float64)
    c = hippo_project(measure, u, 5, dts)
    assert c.shape == (3, 5, 40)
    for i in range(3): torch.testing.assert_close(c[i], hippo_project(measure, u[i], 5, dts[i].item()), rtol=1e-13, atol=1e-13)
    c2 = hippo_project(measure, u[0], 5, dts[:, None])  # dt with more dims than u's batch: (3, 1) against (): a batch of 3 x 1
    assert c2.shape == (3, 1, 5, 40) if measure != "legs" else c2.shape == (5, 40)
    with pytest.raises(ValueError, match=r"\bdt\b.*broadcast"): hippo_project(measure, u, 5, torch.full((2,), 0.1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\bdt\b"): hippo_project(measure, u, 5, torch.tensor([0.1, -0.1, 0.1], dtype=torch.float64))


def test_ops_ignore_autocast():
    """Issue 25 item 5: under torch.autocast("cpu", torch.bfloat16) float32 inputs are computed in float32, bit-identical to
    the result without autocast (before: hippo_project's and hippo_reconstruct's matrix products ran in bfloat16)."""
    u = torch.randn(2, 60, generator=torch.Generator().manual_seed(2))
    x = torch.linspace(0, 1, 7)
    for measure in MEASURES:
        calls = {"hippo": lambda: hippo(measure, 6, torch.float32)[0], "hippo_basis": lambda: hippo_basis(measure, 6, x),
                 "hippo_project": lambda: hippo_project(measure, u, 6, 0.05), "dplr": lambda: dplr(measure, 6)[1],
                 "hippo_reconstruct": lambda: hippo_reconstruct(measure, hippo_project(measure, u, 6, 0.05)[..., -1], x)}
        for name, f in calls.items():
            ref = f()
            with torch.autocast("cpu", torch.bfloat16): y = f()
            assert y.dtype == ref.dtype and torch.equal(y, ref), (measure, name)


def test_hippo_project_dt_on_another_device():
    "Issue 25 follow-up 4: a dt tensor on another device than u raised 'Cannot copy out of meta tensor'; now a ValueError naming both."
    with pytest.raises(ValueError, match=r"dt is on device meta but u is on cpu"):
        hippo_project("legt", torch.randn(20), 4, torch.tensor(0.01, device="meta"))
    assert hippo_project("legt", torch.randn(20, device="meta"), 4, torch.tensor(0.01)).device.type == "meta"  # a 0-d CPU dt: a number


# ---------------------------------------------------------------- cold read of issue 27 (B): LegS's eigenvectors

def test_legs_eigenvectors_are_signed_binomials_exactly():
    """Notebook 03: M = -(Sigma R)^{-1} A (Sigma R) is the integer matrix (-1)^{n-k}(2k+1) below the diagonal, n+1 on it, and
    M Pi = Pi diag(1..N) for Pi_ij = C(i+j, i-j), i.e. sum_{k=j}^{n-1} (-1)^{n-k}(2k+1) C(k+j,k-j) = (j-n) C(n+j,n-j): exact
    integers for n < 60; and W = Sigma R Pi are eigenvectors of the float matrix (numpy)."""
    from math import comb
    assert all(sum((-1) ** (n - k) * (2 * k + 1) * comb(k + j, k - j) for k in range(j, n)) == (j - n) * comb(n + j, n - j)
               for n in range(60) for j in range(n + 1))
    N = 30
    M = [[(-1) ** (n - k) * (2 * k + 1) if k < n else (n + 1 if k == n else 0) for k in range(N)] for n in range(N)]
    Pi = [[comb(i + j, i - j) if i >= j else 0 for j in range(N)] for i in range(N)]
    assert all(sum(M[n][k] * Pi[k][j] for k in range(N)) == Pi[n][j] * (j + 1) for n in range(N) for j in range(N))
    A = hippo("legs", 12)[0].numpy()
    sr = (-1.0) ** np.arange(12) * np.sqrt(2 * np.arange(12) + 1)
    assert np.allclose(-(A * sr[None, :]) / sr[:, None], np.array(M)[:12, :12], rtol=0, atol=1e-13)
    W = sr[:, None] * np.array(Pi, dtype=float)[:12, :12]
    assert np.abs(A @ W - W * -np.arange(1, 13)).max() < 1e-14 * np.abs(W).max()


def _kappa_unit_columns_mpmath(N, dps=100):
    import mpmath
    from math import comb
    with mpmath.workdps(dps):
        W = mpmath.matrix([[(-1) ** i * mpmath.sqrt(2 * i + 1) * comb(i + j, i - j) if i >= j else 0 for j in range(N)] for i in range(N)])
        for j in range(N):
            norm = mpmath.sqrt(mpmath.fsum(W[i, j] ** 2 for i in range(N)))
            for i in range(N): W[i, j] /= norm
        sv = mpmath.svd_r(W, compute_uv=False)
        return float(max(sv) / min(sv))


def test_legs_eigenvector_condition_number_and_the_eig_kernel():
    """Notebook 03 (cold read B3-4): kappa_2 of LegS's eigenvectors (unit columns) in 100-digit arithmetic is far above the
    bound beta_N (even divided by van der Sluis's sqrt N), and the kernel computed through numpy's eig, against the dense
    ZOH kernel from scipy's expm, has a relative error between 1e-3 and 1 times eps kappa_2 (a factor 5.8 per state)."""
    from math import comb
    from scipy.linalg import expm
    eps = np.finfo(float).eps
    got = {}
    for N in [8, 16, 24, 32]:
        kappa = _kappa_unit_columns_mpmath(N)
        beta = max(math.sqrt(2 * i + 1) * comb(i + j, i - j) / math.sqrt(2 * j + 1) for i in range(N) for j in range(i + 1))
        assert kappa / math.sqrt(N) > 50 * beta, N
        A, B = (m.numpy() for m in hippo("legs", N))
        C = np.random.default_rng(N).standard_normal(N)
        dt, L = 0.01, 400
        dA = expm(dt * A)
        dB = np.linalg.solve(A, (dA - np.eye(N)) @ B)
        x, K = dB, []
        for _ in range(L): K.append(C @ x); x = dA @ x
        K = np.array(K)
        lam, X = np.linalg.eig(A)
        Bt = np.linalg.solve(X, B.astype(complex)) * np.expm1(dt * lam) / lam
        K_eig = ((C @ X) * Bt) @ np.exp(dt * lam)[:, None] ** np.arange(L)
        got[N] = kappa, np.abs(K_eig - K).max() / np.abs(K).max()
        assert 1e-3 < got[N][1] / (eps * kappa) < 1, (N, got[N])
    assert 7e4 < got[8][0] < 8e4 and 1.2e23 < got[32][0] < 1.3e23
    assert 5.5 < (got[32][0] / got[16][0]) ** (1 / 16) < 6.0  # about 5.8 per state
