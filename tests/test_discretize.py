"""ssm_course.discretize: scipy cross-checks on random systems (hypothesis) and bad input."""
import numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st
from scipy.signal import cont2discrete
from ssm_course.discretize import discretize, discretize_diag
from ssm_course.ssm import random_ssm

SCIPY = {"zoh": "zoh", "bilinear": "bilinear", "euler": "euler", "backward_euler": "backward_diff", "gbt": "gbt"}


@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 7), M=st.integers(0, 3), seed=st.integers(0, 10_000), log_dt=st.floats(-4, 1),
       method=st.sampled_from(sorted(SCIPY)), alpha=st.floats(0, 1))
def test_dense_matches_scipy(N, M, seed, log_dt, method, alpha):
    A, B, _, _ = random_ssm(N, seed=seed)
    if M: B = torch.randn(N, M, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    dt, alpha = 10.0 ** log_dt, (alpha if method == "gbt" else None)
    dA, dB = discretize(A, B, dt, method, alpha)
    Bn = B.numpy() if M else B.numpy()[:, None]
    Ad, Bd, *_ = cont2discrete((A.numpy(), Bn, np.zeros((1, N)), np.zeros((1, Bn.shape[1]))), dt, method=SCIPY[method], alpha=alpha)
    Bd = Bd if M else Bd[:, 0]
    assert dA.shape == A.shape and dB.shape == B.shape
    assert np.abs(dA.numpy() - Ad).max() <= 1e-10 * np.abs(Ad).max()
    assert np.abs(dB.numpy() - Bd).max() <= 1e-10 * np.abs(Bd).max()


@settings(max_examples=40, deadline=None)
@given(re=st.floats(-50, -1e-6), im=st.floats(-100, 100), log_dt=st.floats(-5, 0), method=st.sampled_from(sorted(SCIPY)), alpha=st.floats(0, 1))
def test_diag_matches_scipy_on_real_block(re, im, log_dt, method, alpha):
    "A complex eigenvalue pair is the real 2x2 rotation-scaling block; scipy discretizes that in real arithmetic."
    dt, alpha = 10.0 ** log_dt, (alpha if method == "gbt" else None)
    lam = torch.tensor([complex(re, im)], dtype=torch.complex128)
    dA, dB = discretize_diag(lam, torch.ones(1, dtype=torch.complex128), dt, method, alpha)
    blk = np.array([[re, -im], [im, re]])
    Ad, Bd, *_ = cont2discrete((blk, np.array([[1.0], [0.0]]), np.zeros((1, 2)), np.zeros((1, 1))), dt, method=SCIPY[method], alpha=alpha)
    np.testing.assert_allclose([dA.real.item(), dA.imag.item()], Ad[:, 0], rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose([dB.real.item(), dB.imag.item()], Bd[:, 0], rtol=1e-9, atol=1e-13 * dt)


def test_dt_adds_batch_dims():
    "One system and a vector of steps gives one discretization per step."
    dts = torch.tensor([0.1, 0.2], dtype=torch.float64)
    dA, dB = discretize(A, B, dts, "zoh")
    assert dA.shape == (2, 3, 3) and dB.shape == (2, 3)
    for i in range(2):
        ref = discretize(A, B, dts[i].item(), "zoh")
        torch.testing.assert_close(dA[i], ref[0]); torch.testing.assert_close(dB[i], ref[1])


def test_dtype_device_and_batch():
    Lam = torch.complex(-torch.rand(3, 4), torch.randn(3, 4))
    dA, dB = discretize_diag(Lam, torch.ones(4, dtype=torch.complex64), torch.tensor([0.1, 0.2, 0.3]))
    assert dA.dtype == dB.dtype == torch.complex64 and dA.shape == dB.shape == (3, 4)
    A = torch.stack([random_ssm(3, seed=s, dtype=torch.float32)[0] for s in range(2)])
    dA, dB = discretize(A, torch.ones(3), torch.tensor([0.1, 0.2]), "bilinear")
    assert dA.dtype == torch.float32 and dA.shape == (2, 3, 3) and dB.shape == (2, 3)


A, B, _, _ = random_ssm(3)
BAD = [
    (lambda: discretize(A, B, 0.1, "rk4"), ValueError, "method"),
    (lambda: discretize(A, B, 0.1, "gbt"), ValueError, "alpha"),
    (lambda: discretize(A, B, 0.1, "gbt", alpha=-0.1), ValueError, "alpha"),
    (lambda: discretize(A, B, 0.1, "zoh", alpha=0.5), ValueError, "alpha"),
    (lambda: discretize(A, B, 0.0), ValueError, "dt"),
    (lambda: discretize(A, B, -1.0), ValueError, "dt"),
    (lambda: discretize(A, B, torch.tensor([0.1, -0.1])), ValueError, "dt"),
    (lambda: discretize(torch.stack([A, A, A]), B, torch.ones(4)), ValueError, "dt"),
    (lambda: discretize(A[:, :2], B, 0.1), ValueError, "A"),
    (lambda: discretize(A[0], B, 0.1), ValueError, "A"),
    (lambda: discretize(A, B[:2], 0.1), ValueError, "B"),
    (lambda: discretize(A, torch.ones(2, 2), 0.1), ValueError, "B"),
    (lambda: discretize(A.numpy(), B, 0.1), TypeError, "A"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(4), 0.1), ValueError, "B"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(3), 0.1, "expm"), ValueError, "method"),
    (lambda: discretize_diag(torch.ones(2, 3), torch.ones(3), torch.ones(3)), ValueError, "dt"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(3), 1j), ValueError, "dt"),
    (lambda: discretize_diag(torch.ones(()), torch.ones(3), 0.1), ValueError, "Lambda"),
]


@pytest.mark.parametrize("call,exc,name", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()
