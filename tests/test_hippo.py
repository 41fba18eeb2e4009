"""ssm_course.hippo: the contract's matrices, DPLR factors, projection against quadrature, bad input."""
import math, numpy as np, pytest, torch
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
    P = P if P.ndim == 2 else P[None]
    torch.testing.assert_close(V.mH @ V, torch.eye(N, dtype=torch.complex128), atol=1e-10, rtol=0)
    rebuilt = V @ (torch.diag(Lambda) - P.T @ P.conj()) @ V.mH
    assert (rebuilt - A).abs().max() < 1e-8 * max(1.0, A.abs().max().item())
    assert (V @ Bt - B).abs().max() < 1e-8
    if measure == "legs": assert (Lambda.real + 0.5).abs().max() < 1e-10


def test_projection_of_polynomial_is_exact():
    "A polynomial of degree < N on the window is reconstructed exactly by LegT (up to the time step)."
    dt = 1e-3
    s = dt * torch.arange(1, 4001, dtype=torch.float64)
    u = torch.where(s > 1.0, (s - 1) ** 2, torch.zeros_like(s)) * (s > 1.0)  # a smooth-enough ramp switched on at s=1
    c = hippo_project("legt", u, 16, dt)[..., -1]
    x = torch.linspace(0, 1, 50, dtype=torch.float64)
    rec = hippo_reconstruct("legt", c, x)
    truth = (4.0 - x - 1) ** 2
    assert (rec - truth).abs().max() < 1e-3 * truth.abs().max()


def test_legs_matches_quadrature():
    "LegS coefficients of u(s) = sin(3s) on [0, 2] against Gauss-Legendre quadrature with numpy's Legendre."
    dt, N = 5e-4, 12
    s = dt * torch.arange(1, 4001, dtype=torch.float64)
    c = hippo_project("legs", torch.sin(3 * s), N)[..., -1].numpy()
    nodes, w = npleg.leggauss(200)
    sq = (nodes + 1)  # s in [0, 2]
    ref = np.array([math.sqrt(2 * n + 1) * np.sum(w / 2 * np.sin(3 * sq) * npleg.Legendre.basis(n)(nodes)) for n in range(N)])
    np.testing.assert_allclose(c, ref, atol=2e-4)


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
