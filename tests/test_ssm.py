"""Notebook 01's functions: bad input raises a clear error naming the argument; dtypes and batches; inputs unchanged."""
import pytest, torch
import numpy as np
from hypothesis import given, settings, strategies as st
from ssm_course.ssm import matrix_exp, basis_functions, impulse_response, random_ssm, state_transition, step_response, spectral_abscissa, is_stable

A, B, C, D = random_ssm(3)
t = torch.linspace(0, 1, 5, dtype=torch.float64)

CASES = [
    (state_transition, (A[0], t), ValueError, "A"),
    (state_transition, (A[:, :2], t), ValueError, "A"),
    (state_transition, (A, t[None]), ValueError, "t"),
    (state_transition, (A, [0.0, 1.0]), TypeError, "t"),
    (basis_functions, (A, B[:2], t), ValueError, "B"),
    (basis_functions, (A.numpy(), B, t), TypeError, "A"),
    (impulse_response, (A, B, C[:2], t), ValueError, "C"),
    (impulse_response, (A, B, 1.0, t), TypeError, "C"),
    (step_response, (A, B[:2], C, t), ValueError, "B"),
    (step_response, (A, B, C[:1], t), ValueError, "C"),
    (spectral_abscissa, (A[0],), ValueError, "A"),
    (is_stable, (torch.zeros(2, 3),), ValueError, "A"),
    (random_ssm, (0,), ValueError, "N"),
    (random_ssm, (2.5,), TypeError, "N"),
    (random_ssm, (True,), TypeError, "N"),
    (random_ssm, (3, True, 0.1, -1), ValueError, "seed"),
    (matrix_exp, (torch.zeros(2, 3),), ValueError, "M"),
    (state_transition, (A, t * 1j), TypeError, "t"),
    (spectral_abscissa, (torch.zeros(0, 0),), ValueError, "A"),
    (basis_functions, (A.expand(2, 3, 3), B.expand(3, 3), t), ValueError, "B"),
    (impulse_response, (A.expand(2, 3, 3), B, C.expand(3, 3), t), ValueError, "C"),
    (step_response, (A.expand(2, 3, 3), B, C, t, torch.zeros(3)), ValueError, "D"),
    (step_response, (A, B, C, t, "0"), TypeError, "D"),
    (random_ssm, (3, True, float("nan")), ValueError, "margin"),  # issue 25 item 15: NaN gave a NaN A
    (random_ssm, (3, True, float("inf")), ValueError, "margin"),
    (random_ssm, (3, True, 0.0), ValueError, "margin"),  # stable needs margin > 0
    (random_ssm, (3, True, -0.1), ValueError, "margin"),
    (random_ssm, (3, False, float("nan")), ValueError, "margin"),
    (random_ssm, (3, True, True), TypeError, "margin"),
    (random_ssm, (3, True, "0.1"), TypeError, "margin"),
    (random_ssm, (3, "yes"), TypeError, "stable"),
    (random_ssm, (3, True, 0.1, 0, torch.int64), TypeError, "dtype"),  # issue 25 item 14: returned integer matrices
    (random_ssm, (3, True, 0.1, 0, torch.bool), TypeError, "dtype"),
]


@pytest.mark.parametrize("fn,args,exc,name", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_bad_input(fn, args, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        fn(*args)


def test_float32_and_batches():
    "float32 in, float32 out; leading batch dimensions broadcast."
    A32, B32, C32 = (x.float() for x in (A, B, C))
    h = impulse_response(A32, B32, C32, t.float())
    assert h.dtype == torch.float32 and h.shape == (5,)
    torch.testing.assert_close(h.double(), impulse_response(A, B, C, t), rtol=1e-5, atol=1e-6)
    Ab = torch.stack([A, 2 * A])
    assert impulse_response(Ab, B, C, t).shape == (2, 5)
    assert step_response(Ab, B, C, t, torch.tensor([0.0, 1.0], dtype=torch.float64)).shape == (2, 5)


def test_numpy_size():
    for x, y in zip(random_ssm(np.int64(4), seed=np.int64(2)), random_ssm(4, seed=2)): assert torch.equal(x, y)


def test_complex_and_integer_inputs_promote():
    "A complex B or C with a real A keeps its imaginary part; integer A is computed in float; half in float32."
    Bc = B + 1j * torch.flip(B, [0])
    E = basis_functions(A, Bc, t)
    assert E.dtype == torch.complex128
    torch.testing.assert_close(E, basis_functions(A, B, t) + 1j * basis_functions(A, torch.flip(B, [0]), t), rtol=0, atol=1e-14)
    h = impulse_response(A, B, 1j * C, t)
    torch.testing.assert_close(h, 1j * impulse_response(A, B, C, t), rtol=0, atol=1e-14)
    y = step_response(A, Bc, C, t, 1j)
    torch.testing.assert_close(y, step_response(A, B, C, t) + 1j * (step_response(A, torch.flip(B, [0]), C, t) + 1), rtol=0, atol=1e-13)
    Ai = -torch.eye(2, dtype=torch.int64)
    torch.testing.assert_close(state_transition(Ai, t), state_transition(Ai.float(), t))
    assert spectral_abscissa(Ai).item() == -1.0 and bool(is_stable(Ai))
    Ah = A.half()
    assert torch.equal(impulse_response(Ah, B.half(), C.half(), t.half()), impulse_response(Ah.float(), B.half().float(), C.half().float(), t.half().float()).half())


@settings(max_examples=25, deadline=None, derandomize=True)
@given(N=st.integers(1, 5), T=st.integers(1, 6), batch=st.sampled_from([(), (2,)]), layout=st.sampled_from(["contiguous", "transposed", "sliced", "expanded"]),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.complex128]), seed=st.integers(0, 1000))
def test_inputs_unchanged_outputs_finite(N, T, batch, layout, dtype, seed):
    "Every function of notebook 01 leaves its inputs bit-identical (values and strides) and gives finite output for a stable A."
    A, B, C, D = (x.to(dtype) for x in random_ssm(N, seed=seed))
    A, B, C = A.expand(*batch, N, N), B.expand(*batch, N), C.expand(*batch, N)
    if layout != "expanded": A, B, C = A.contiguous(), B.contiguous(), C.contiguous()  # else stride 0 across the batch
    if layout == "transposed": A = A.mT.contiguous().mT  # column-major
    if layout == "sliced": B, C = torch.stack([B, B], -1)[..., 0], torch.stack([C, C], -1)[..., 1]  # stride 2
    t = torch.linspace(0, 3, 2 * T, dtype=torch.float64)[::2]
    args = [A, B, C, D, t]
    copies = [(a.clone(), a.stride()) for a in args]
    outs = [state_transition(A, t), basis_functions(A, B, t), impulse_response(A, B, C, t), step_response(A, B, C, t, D),
            spectral_abscissa(A), matrix_exp(0.5 * A)]
    assert is_stable(A).all()
    for a, (copy, stride) in zip(args, copies): assert torch.equal(a, copy) and a.stride() == stride
    for o in outs: assert torch.isfinite(torch.view_as_real(o) if o.is_complex() else o).all()


def test_random_ssm_margin_and_dtypes():
    "The rightmost eigenvalue sits at -margin; stable=False ignores a margin of 0; floating and complex dtypes are honoured."
    for margin in (0.3, 1e-3):
        torch.testing.assert_close(spectral_abscissa(random_ssm(6, margin=margin, seed=4)[0]), torch.tensor(-margin, dtype=torch.float64), rtol=0, atol=1e-12)
    assert random_ssm(3, stable=False, margin=0.0)[0].dtype == torch.float64
    for dtype in (torch.float32, torch.float16, torch.complex64):
        assert all(x.dtype == dtype for x in random_ssm(3, dtype=dtype))


def _autocast_ops():
    A32, B32, C32, D32 = random_ssm(5, seed=9, dtype=torch.float32)
    t32 = torch.linspace(0, 2, 7)
    return {"matrix_exp": lambda: matrix_exp(0.3 * A32), "state_transition": lambda: state_transition(A32, t32),
            "basis_functions": lambda: basis_functions(A32, B32, t32), "impulse_response": lambda: impulse_response(A32, B32, C32, t32),
            "step_response": lambda: step_response(A32, B32, C32, t32, D32), "spectral_abscissa": lambda: spectral_abscissa(A32),
            "is_stable": lambda: is_stable(A32)}


@pytest.mark.parametrize("name", list(_autocast_ops()))
def test_autocast_is_ignored(name):
    "Issue 25 item 5: under bfloat16 autocast the float32 ops compute in float32, bit for bit (basis_functions, impulse_response and step_response were off by 3e-3)."
    f = _autocast_ops()[name]
    ref = f()
    with torch.autocast("cpu", torch.bfloat16): got = f()
    assert got.dtype == ref.dtype and torch.equal(got, ref)


@pytest.mark.parametrize("lam", [0.0, -0.5, 0.3])
@pytest.mark.parametrize("m", [1, 3, 6])
def test_state_transition_of_a_jordan_block(lam, m):
    """Notebook 01's t^(m-1) factor: e^{tJ} for a Jordan block J = lam I + E (E the subdiagonal ones) equals the finite
    series e^{lam t} sum_{k<m} t^k E^k / k!, built here entry by entry (entry (i, j) is e^{lam t} t^(i-j) / (i-j)!)."""
    import math
    J = lam * torch.eye(m, dtype=torch.float64) + torch.diag(torch.ones(m - 1, dtype=torch.float64), -1)
    ts = torch.tensor([0.0, 0.5, 3.0, 20.0], dtype=torch.float64)
    got = state_transition(J, ts)
    for k, tk in enumerate(ts.tolist()):
        ref = torch.tensor([[math.exp(lam * tk) * tk ** (i - j) / math.factorial(i - j) if i >= j else 0.0 for j in range(m)] for i in range(m)], dtype=torch.float64)
        assert ((got[k] - ref).abs().max() / ref.abs().max()).item() < 1e-13, (lam, m, tk)


def test_transient_bounded_by_the_symmetric_part():
    """Notebook 01's bound ||e^{tA}||_2 <= e^{mu t}, mu the top eigenvalue of (A + A^T)/2 (numpy's eigvalsh), on random
    matrices and the lesson's 2x2 example, with scipy's expm as the exponential; mu is the initial rate."""
    from scipy.linalg import expm
    ts = np.linspace(0, 5, 51)
    for seed in range(10):
        M = random_ssm(6, stable=seed % 2 == 0, seed=seed)[0].numpy()
        mu = np.linalg.eigvalsh((M + M.T) / 2).max()
        for tk in ts: assert np.linalg.norm(expm(tk * M), 2) <= np.exp(mu * tk) * (1 + 1e-12), (seed, tk)
    M = np.array([[-0.5, 20.0], [0.0, -1.0]])
    mu, h = np.linalg.eigvalsh((M + M.T) / 2).max(), 1e-7
    assert abs((np.linalg.norm(expm(h * M), 2) - 1) / h - mu) < 1e-4 * mu  # observed 9.2531 vs 9.2531


@pytest.mark.parametrize("N", [2, 3, 4, 8, 12])
def test_lagt_shift_is_one_jordan_block(N):
    """Notebook 01: M = LagT's A + I/2 = -E (I - E)^{-1} has M^{N-1} = (-1)^{N-1} e_N e_1^T exactly and M^N = 0 (one Jordan
    block of size N), so ||e^{tM}||_2 = t^{N-1}/(N-1)! (1 + O(1/t)); numpy's matrix_power and scipy's expm."""
    import math
    from scipy.linalg import expm
    from ssm_course.hippo import hippo
    M = hippo("lagt", N)[0].numpy() + np.eye(N) / 2
    corner = np.zeros((N, N)); corner[-1, 0] = (-1) ** (N - 1)
    assert np.array_equal(np.linalg.matrix_power(M, N - 1), corner) and not np.linalg.matrix_power(M, N).any()
    for t in [1e3, 1e5]:
        ratio = np.linalg.norm(expm(t * M), 2) / (t ** (N - 1) / math.factorial(N - 1))
        assert abs(ratio - 1) < N**2 / t, (t, ratio)  # observed about (N-1)(N-2)/t


@pytest.mark.parametrize("N", [2, 5, 16, 64])
def test_symmetric_parts_of_legs_and_lagt(N):
    "Notebook 01: LegS's A + A^T = -I - r r^T (mu = -1/2), LagT's = -1 1^T (mu = 0), with numpy's eigvalsh."
    from ssm_course.hippo import hippo
    r = np.sqrt(2 * np.arange(N) + 1)
    legs, lagt = hippo("legs", N)[0].numpy(), hippo("lagt", N)[0].numpy()
    assert np.abs(legs + legs.T - (-np.eye(N) - np.outer(r, r))).max() < 1e-13
    assert np.array_equal(lagt + lagt.T, -np.ones((N, N)))
    tol = 1e-15 * N**2  # eigvalsh's rounding, relative to ||r r^T|| = N^2: observed 5.0e-13 at N = 64
    assert abs(np.linalg.eigvalsh((legs + legs.T) / 2).max() + 0.5) < tol and abs(np.linalg.eigvalsh((lagt + lagt.T) / 2).max()) < tol


def test_norm_within_kappa_of_the_eigenvector_basis():
    """Notebook 01: for a diagonalisable A = X diag(Lambda) X^{-1}, e^{alpha t}/kappa(X) <= ||e^{tA}||_2 <= kappa(X) e^{alpha t}
    (numpy's eig and cond, scipy's expm)."""
    from scipy.linalg import expm
    for seed in range(6):
        A = random_ssm(8, stable=seed % 2 == 0, seed=seed)[0].numpy()
        lam, X = np.linalg.eig(A)
        kappa, alpha = np.linalg.cond(X), lam.real.max()
        for t in np.linspace(0, 30, 31):
            n = np.linalg.norm(expm(t * A), 2)
            assert np.exp(alpha * t) / kappa * (1 - 1e-12) <= n <= kappa * np.exp(alpha * t) * (1 + 1e-12), (seed, t)
