"""Issue 32 (CPU speed at training shapes): `ssm_kernel_diag`'s compiled single-precision CPU path (engine/conv
`_kernel_diag_fast`, `_diag_powers` by numba) against an independent kernel in complex128 (NumPy, one power at a time from
float64 exponents); when the fast path is taken, and that the reference runs (bit for bit) when it is not."""
import math, numpy as np, pytest, torch
import torch.autograd.forward_ad as fwAD
from ssm_course._engine import conv as engine
from ssm_course.conv import ssm_kernel_diag, ssm_kernel_diag_ref

pytestmark = pytest.mark.skipif(engine._diag_powers is None, reason="numba is not installed: ssm_kernel_diag runs the reference only")
EPS32 = 2.0 ** -24


def exact(dA, w, L, log=False):
    """K_l = sum_n w_n dA_n^l and the scale S_l = sum_n |w_n| |dA_n|^l in complex128 (NumPy): dA^l = exp(l log dA) from the
    float64 value of the input (its logarithm when `log`), 0^l = 1, 0, 0, ... (log dA = -inf with `log`)."""
    a, w = np.asarray(dA.detach(), np.complex128), np.asarray(w.detach(), np.complex128)
    zero = (a.real == -np.inf) if log else (a == 0)
    lg = np.where(zero, 0, a) if log else np.log(np.where(zero, 1, a))
    l = np.arange(L)
    P = np.where(zero[..., None], l == 0, np.exp(lg[..., None] * l))
    w = np.broadcast_to(w, np.broadcast_shapes(w.shape, a.shape))
    return (w[..., None] * P).sum(-2), (np.abs(w)[..., None] * np.abs(P)).sum(-2)


def roundings(K, dA, w, L, log=False):
    "The largest error of K against `exact`, in float32 roundings of S_l (S_l floored at float32's smallest normal)."
    ref, S = exact(dA, w, L, log)
    return float((np.abs(np.asarray(K, np.complex128) - ref) / np.maximum(S, 2.0 ** -126)).max() / EPS32)


@pytest.fixture
def calls(monkeypatch):
    "How often the compiled powers ran (the fast path taken: > 0)."
    seen, real = [], engine._diag_powers
    monkeypatch.setattr(engine, "_diag_powers", lambda *a: seen.append(1) or real(*a))
    return seen


def unit_circle(shape, gap, g):
    "complex64 eigenvalues with modulus within `gap` of 1 at uniform phases (the hard case: every power stays large)."
    r = 1 - gap * torch.rand(shape, generator=g, dtype=torch.float64)
    return (r * torch.exp(2j * math.pi * torch.rand(shape, generator=g, dtype=torch.float64))).to(torch.complex64)


@pytest.mark.parametrize("L, block", [(16411, None), (16384, None), (128, None), (784, None), (1, None), (301, 7), (20, 64)])
def test_complex64_near_one(calls, L, block):
    g = torch.Generator().manual_seed(L)
    dA = unit_circle((3, 16), 1e-6, g)
    dA[0, 0], dA[1, 5], dA[2, 7] = 1, 0, -1  # on the circle, a state that forgets at once, a sign flip
    dB, C = torch.randn(3, 16, generator=g, dtype=torch.complex64), torch.randn(16, generator=g, dtype=torch.complex64)
    K = ssm_kernel_diag(dA, dB, C, L, block=block)
    assert calls and K.dtype == torch.complex64 and K.shape == (3, L)
    assert roundings(K, dA, C * dB, L) < 4  # observed up to 2.6 (the reference: 2.4)


def test_zero_states_exact(calls):
    "States at 0 (and only those): K = (sum w, 0, 0, ...) exactly, also with log dA = -inf."
    w = torch.tensor([[1.5 + 2j, -0.25j]], dtype=torch.complex64)
    for dA, log in [(torch.zeros(1, 2, dtype=torch.complex64), False), (torch.full((1, 2), -math.inf, dtype=torch.float64), True)]:
        K = ssm_kernel_diag(dA, w, torch.ones_like(w), 9, log=log)
        assert torch.equal(K, torch.tensor([[1.5 + 1.75j] + [0] * 8], dtype=torch.complex64))
    assert len(calls) == 2


def test_log_inputs(calls):
    "log=True: complex float64 logarithms (S4D's Delta lambda) with complex64 weights, and real logarithms with real weights."
    g = torch.Generator().manual_seed(1)
    z = torch.complex(-1e-5 * torch.rand(2, 32, generator=g, dtype=torch.float64), 3 * torch.randn(2, 32, generator=g, dtype=torch.float64))
    z[0, 3] = complex(-math.inf, 0)
    W = torch.randn(2, 32, generator=g, dtype=torch.complex64)
    K = ssm_kernel_diag(z, W, torch.ones_like(W), 16411, log=True)
    assert K.dtype == torch.complex64 and roundings(K, z, W, 16411, log=True) < 4
    zr, wr = -torch.rand(5, 8, generator=g, dtype=torch.float64) * 0.01, torch.randn(5, 8, generator=g)
    Kr = ssm_kernel_diag(zr, wr, torch.ones(8), 999, log=True)
    assert Kr.dtype == torch.float32 and roundings(Kr, zr, wr, 999, log=True) < 4
    assert len(calls) == 2


def test_real_and_broadcast(calls):
    "Real eigenvalues of either sign (a real product), and dA, dB, C with batches that broadcast to (2, 3)."
    g = torch.Generator().manual_seed(2)
    dA, dB, C = torch.rand(3, 8, generator=g) * 2 - 1, torch.randn(2, 1, 8, generator=g), torch.randn(8, generator=g)
    dA[1, 2] = 0
    K = ssm_kernel_diag(dA, dB, C, 333)
    assert K.dtype == torch.float32 and K.shape == (2, 3, 333) and roundings(K, dA, C * dB, 333) < 4
    dAc, dBc = unit_circle((4, 1, 8), 1e-3, g), torch.randn(5, 8, generator=g, dtype=torch.complex64)
    Kc = ssm_kernel_diag(dAc, dBc, torch.ones(8), 1001)  # dA (4, 1, N), dB (5, N): batch (4, 5)
    assert Kc.shape == (4, 5, 1001) and roundings(Kc, dAc, dBc, 1001) < 4
    Kh = ssm_kernel_diag(dA.half(), dB.half(), C.half(), 50)  # half precision: this path in float32, rounded once
    assert torch.equal(Kh, ssm_kernel_diag(dA.half().float(), dB.half().float(), C.half().float(), 50).half())
    assert len(calls) == 4


def test_double_precision_is_the_reference(calls):
    "float64 and complex128 (also a float64 dA with complex64 weights without `log`) keep the reference's exponentials, bit for bit."
    g = torch.Generator().manual_seed(3)
    dA = unit_circle((2, 8), 1e-6, g).to(torch.complex128)
    dB = torch.randn(2, 8, generator=g, dtype=torch.complex128)
    b32 = dB.to(torch.complex64)  # with a complex128 dA: complex128 throughout
    for args, ref in [((dA, dB, dB), (dA, dB, dB)), ((dA.real, dB.real, dB.real),) * 2, ((dA, b32, b32), (dA, b32.to(dB.dtype), b32.to(dB.dtype)))]:
        assert torch.equal(ssm_kernel_diag(*args, 4097), ssm_kernel_diag_ref(*ref, 4097))
    assert roundings(ssm_kernel_diag(dA, dB, dB, 4097), dA, dB * dB, 4097) < 3e-5  # float64 level: 1.1e-5 float32 roundings, 6e-13 (both err by ~L|log dA| ulps)
    assert not calls


def test_recorded_calls_take_the_reference(calls):
    "Gradients, forward-mode AD, torch.func and dispatch modes see the reference (bit for bit), so autograd differentiates it."
    g = torch.Generator().manual_seed(4)
    dA, dB = unit_circle((2, 8), 1e-3, g), torch.randn(2, 8, generator=g, dtype=torch.complex64)
    C = torch.ones(8, dtype=torch.complex64)
    ref = ssm_kernel_diag_ref(dA, dB, C, 100)
    a = dA.clone().requires_grad_()
    K = ssm_kernel_diag(a, dB, C, 100)
    assert torch.equal(K.detach(), ref) and K.grad_fn is not None
    K.real.sum().backward(); assert a.grad is not None
    with fwAD.dual_level():
        Kf = ssm_kernel_diag(fwAD.make_dual(dA, torch.ones_like(dA)), dB, C, 100)
        assert torch.equal(fwAD.unpack_dual(Kf).primal, ref)
    Kv = torch.func.vmap(lambda x, y: ssm_kernel_diag(x, y, C, 100))(dA, dB)
    assert torch.equal(Kv, torch.func.vmap(lambda x, y: ssm_kernel_diag_ref(x, y, C, 100))(dA, dB))
    assert not calls
    with torch.no_grad(): ssm_kernel_diag(a, dB, C, 100)  # a leaf that needs its gradient, but nothing is recorded
    assert len(calls) == 1


def test_not_finite_takes_the_reference(calls):
    "A growing state whose powers overflow float32, or a NaN weight: the compiled loop reports it and the reference runs."
    dA, w = torch.tensor([1.5 + 0.5j, 0.5], dtype=torch.complex64), torch.ones(2, dtype=torch.complex64)
    for args in [(dA, w, w), (dA.abs() / 2, torch.tensor([math.nan, 1], dtype=torch.complex64), w)]:
        torch.testing.assert_close(ssm_kernel_diag(*args, 300), ssm_kernel_diag_ref(*args, 300), rtol=0, atol=0, equal_nan=True)
    assert len(calls) == 2


def test_sweep_shapes_taken(calls):
    "The shapes of notebook 14's sweep take the compiled path (the speed of issue 32)."
    g = torch.Generator().manual_seed(6)
    dA, W = unit_circle((32, 32), 1e-2, g), torch.randn(32, 32, generator=g, dtype=torch.complex64)
    K = ssm_kernel_diag(dA, W, torch.ones_like(W), 128)
    assert calls and roundings(K, dA, W, 128) < 4
