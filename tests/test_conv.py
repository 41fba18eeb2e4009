"""ssm_course.conv and .inits: cross-checks against float64 loops (hypothesis), scipy, and bad input."""
import math, numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st
from scipy.signal import lfilter
from ssm_course.conv import causal_conv, ssm_kernel, ssm_kernel_diag, ssm_kernel_dplr, ssm_recurrence, dss_kernel, next_fast_len
from ssm_course.discretize import discretize, discretize_diag
from ssm_course.hippo import dplr, hippo
from ssm_course.inits import s4d_init, dss_init, log_uniform_dt
from ssm_course.ssm import random_ssm


def kernel_loop(dA, dB, C, L):
    "Float64 reference: the sum over states of C dB dA^l, one state and one lag at a time."
    out = []
    for l in range(L):
        out.append(sum(complex(C[n]) * complex(dB[n]) * complex(dA[n]) ** l for n in range(len(dA))))
    return np.array(out)


@settings(max_examples=40, deadline=None)
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


@settings(max_examples=25, deadline=None)
@given(L=st.integers(1, 400), LK=st.integers(1, 500), seed=st.integers(0, 10_000))
def test_causal_conv_matches_lfilter(L, LK, seed):
    "An FIR filter is a causal convolution: scipy.signal.lfilter(K, 1, u) is the reference."
    rng = np.random.default_rng(seed)
    u, K = rng.standard_normal((2, L)), rng.standard_normal(LK)
    y = causal_conv(torch.from_numpy(u), torch.from_numpy(K)).numpy()
    np.testing.assert_allclose(y, lfilter(K, [1.0], u, axis=-1), atol=1e-10 * (1 + np.abs(K).sum()))


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


@pytest.mark.parametrize("measure", ["legs", "legt"])
def test_dplr_kernel_matches_dense(measure):
    A, B = hippo(measure, 12)
    Lam, P, Bt, V = dplr(measure, 12)
    C = torch.randn(12, dtype=torch.float64)
    K = ssm_kernel_dplr(Lam, P, Bt, C.to(torch.complex128) @ V, 0.03, 129)
    ref = ssm_kernel(*discretize(A, B, 0.03, "bilinear"), C, 129)
    assert (K - ref).abs().max() < 1e-8 * ref.abs().max()


def test_next_fast_len():
    for n in [1, 2, 7, 97, 1000, 4097, 30001]:
        m = next_fast_len(n)
        assert m >= n
        k = m
        for p in (2, 3, 5):
            while k % p == 0: k //= p
        assert k == 1
        assert not any(_smooth(c) for c in range(n, m))


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


Ld, Bd1, Cd1 = torch.ones(4, dtype=torch.complex64) * 0.5, torch.ones(4, dtype=torch.complex64), torch.ones(4, dtype=torch.complex64)
BAD = [
    (lambda: ssm_kernel_diag(Ld, Bd1[:3], Cd1, 8), ValueError, "dB"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1[:2], 8), ValueError, "C"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 0), ValueError, "L"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 3.5), ValueError, "L"),
    (lambda: ssm_kernel_diag(Ld[0], Bd1, Cd1, 8), ValueError, "dA"),
    (lambda: ssm_kernel_diag(Ld.numpy(), Bd1, Cd1, 8), TypeError, "dA"),
    (lambda: ssm_kernel_diag(Ld, Bd1, Cd1, 8, backend="jax"), ValueError, "backend"),
    (lambda: ssm_kernel(torch.eye(3), torch.ones(4), torch.ones(3), 5), ValueError, "Bd"),
    (lambda: ssm_kernel(torch.ones(3), torch.ones(3), torch.ones(3), 5), ValueError, "Ad"),
    (lambda: ssm_kernel(torch.eye(3), torch.ones(3), torch.ones(3), 0), ValueError, "L"),
    (lambda: causal_conv(torch.ones(0), torch.ones(3)), ValueError, "u"),
    (lambda: causal_conv(torch.ones(5), torch.ones(0)), ValueError, "K"),
    (lambda: causal_conv(torch.ones(()), torch.ones(3)), ValueError, "u"),
    (lambda: causal_conv(torch.ones(2, 5), torch.ones(3, 5)), ValueError, "u"),
    (lambda: ssm_recurrence(torch.eye(3), torch.ones(3), torch.ones(3), torch.ones(0)), ValueError, "u"),
    (lambda: ssm_recurrence(torch.eye(3), torch.ones(3), torch.ones(2), torch.ones(4)), ValueError, "C"),
    (lambda: ssm_kernel_dplr(Ld, Bd1[:2], Bd1, Cd1, 0.1, 8), ValueError, "P"),
    (lambda: ssm_kernel_dplr(Ld, Bd1, Bd1, Cd1, -0.1, 8), ValueError, "dt"),
    (lambda: ssm_kernel_dplr(Ld, Bd1, Bd1, Cd1, 0.1, 0), ValueError, "L"),
    (lambda: dss_kernel(Ld, Bd1, 0.1, 8, kind="relu"), ValueError, "kind"),
    (lambda: s4d_init("legs", 7), ValueError, "N"),
    (lambda: s4d_init("fourier", 8), ValueError, "kind"),
]


@pytest.mark.parametrize("call,exc,name", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


@pytest.mark.parametrize("ushape,kshape", [((3, 5, 50), (5, 50)), ((50,), (4, 50)), ((2, 1, 50), (3, 30)), ((2, 3, 50), (2, 3, 50)), ((6, 50), (1, 50))])
def test_causal_conv_sliced_path_and_grad(ushape, kshape):
    "Processing in slices of the last batch dim (small `chunk`) changes nothing, gradients included."
    u = torch.randn(ushape, dtype=torch.float64, requires_grad=True)
    K = torch.randn(kshape, dtype=torch.float64, requires_grad=True)
    y_whole, y_sliced = causal_conv(u, K, chunk=10**9), causal_conv(u, K, chunk=1)
    torch.testing.assert_close(y_sliced, y_whole)
    Kf = torch.nn.functional.pad(K, (0, 50 - K.shape[-1])).detach().numpy()
    ub, Kb = np.broadcast_arrays(u.detach().numpy(), Kf)
    np.testing.assert_allclose(y_whole.detach().numpy(), np.stack([lfilter(k, [1.0], x) for x, k in zip(ub.reshape(-1, 50), Kb.reshape(-1, 50))]).reshape(y_whole.shape), atol=1e-10)
    assert torch.autograd.gradcheck(lambda a, b: causal_conv(a, b, chunk=1), (u[..., :12].detach().requires_grad_(), K[..., :12].detach().requires_grad_()))
