"""ssm_course.discretize: scipy cross-checks on random systems (hypothesis) and bad input."""
import math, numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st
from scipy.signal import cont2discrete
from ssm_course.discretize import discretize, discretize_diag, expm1, phi1
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
    (lambda: discretize_diag(torch.ones(3), torch.ones(3), 1j), TypeError, "dt"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(3), True), TypeError, "dt"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(3), float("nan")), ValueError, "dt"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(3), float("inf")), ValueError, "dt"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(3), "0.1"), TypeError, "dt"),
    (lambda: discretize(A, B, 0.1, "gbt", alpha="0.5"), TypeError, "alpha"),
    (lambda: discretize(A, B, 0.1, "gbt", alpha=float("nan")), ValueError, "alpha"),
    (lambda: discretize(A.expand(2, 3, 3), torch.ones(3, 3), 0.1), ValueError, "B"),
    (lambda: discretize_diag(torch.ones(2, 3), torch.ones(4, 3), 0.1), ValueError, "Lambda"),
    (lambda: discretize_diag(torch.ones(3), torch.ones(()), 0.1), ValueError, "B"),
    (lambda: discretize_diag(torch.ones(()), torch.ones(3), 0.1), ValueError, "Lambda"),
]


@pytest.mark.parametrize("call,exc,name", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


# Issue 13: half precision, dtype promotion, meta tensors and torch.compile.
HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("method", ["zoh", "bilinear", "euler", "backward_euler"])
def test_half_precision_is_float32_rounded(dtype, method):
    "Half precision is computed in float32 and cast back: the result is the float32 result, rounded."
    A, B, _, _ = random_ssm(5, seed=3, margin=0.5, dtype=torch.float32)
    dA, dB = discretize(A.to(dtype), B.to(dtype), 0.1, method)
    ref = discretize(A.to(dtype).float(), B.to(dtype).float(), 0.1, method)
    assert dA.dtype == dB.dtype == dtype
    assert torch.equal(dA, ref[0].to(dtype)) and torch.equal(dB, ref[1].to(dtype))
    Lam = torch.diagonal(A).to(dtype)
    dA, dB = discretize_diag(Lam, B.to(dtype), 0.1, method)
    ref = discretize_diag(Lam.float(), B.to(dtype).float(), 0.1, method)
    assert dA.dtype == dtype and torch.equal(dA, ref[0].to(dtype)) and torch.equal(dB, ref[1].to(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_matrix_exp_half(dtype):
    "torch's CPU matrix_exp returns garbage in half precision (a diagonal of -21072 for this matrix); ours is float32, rounded."
    from ssm_course.ssm import matrix_exp
    A = random_ssm(6, seed=0, margin=0.5)[0].to(dtype)
    E = matrix_exp(0.1 * A)
    assert E.dtype == dtype and torch.equal(E, matrix_exp((0.1 * A).float()).to(dtype))
    assert (E.double() - torch.linalg.matrix_exp(0.1 * A.double())).abs().max() < 1e-2


@pytest.mark.parametrize("method", ["zoh", "bilinear", "gbt"])
def test_real_A_complex_B_keeps_imaginary_part(method):
    "A real A with a complex B: dB is the complex result (the same as with A made complex), dA stays real."
    A, _, _, _ = random_ssm(4, seed=1)
    B = torch.randn(4, dtype=torch.complex128, generator=torch.Generator().manual_seed(0))
    alpha = 0.3 if method == "gbt" else None
    dA, dB = discretize(A, B, 0.2, method, alpha)
    ref = discretize(A.to(torch.complex128), B, 0.2, method, alpha)
    assert not dA.is_complex() and dB.dtype == torch.complex128
    torch.testing.assert_close(dA.to(torch.complex128), ref[0], rtol=0, atol=1e-14)
    torch.testing.assert_close(dB, ref[1], rtol=0, atol=1e-14)
    assert dB.imag.abs().max() > 0.1  # the imaginary part is really there
    dA, dB = discretize(A, B[:, None].expand(4, 2), 0.2, method, alpha)  # several complex inputs
    torch.testing.assert_close(dB[:, 1], ref[1], rtol=0, atol=1e-14)


def test_integer_inputs_promote_to_float():
    "Integer Lambda, A or B are computed in float: dt = 1.5 is not truncated to 1, and dt = 0.5 is not 0."
    dA, dB = discretize_diag(torch.tensor([-1, -2]), torch.ones(2), 1.5)
    torch.testing.assert_close(dA, torch.exp(torch.tensor([-1.5, -3.0])))
    dA, _ = discretize_diag(torch.tensor([-1, -2]), torch.tensor([1, 1]), 0.5)
    assert dA.dtype == torch.float32
    torch.testing.assert_close(dA, torch.exp(torch.tensor([-0.5, -1.0])))
    A = -2 * torch.eye(2, dtype=torch.int64)
    for m in ["zoh", "bilinear"]:
        dA, dB = discretize(A, torch.tensor([1, 0]), 0.5, m)
        ref = discretize(A.float(), torch.tensor([1.0, 0.0]), 0.5, m)
        assert dA.dtype == torch.float32
        torch.testing.assert_close(dA, ref[0]); torch.testing.assert_close(dB, ref[1])


def test_meta_tensors():
    "Meta tensors carry no values: the dt check is skipped and shapes propagate."
    Lam, B = torch.zeros(2, 3, device="meta", dtype=torch.complex64), torch.zeros(3, device="meta", dtype=torch.complex64)
    dA, dB = discretize_diag(Lam, B, torch.ones(2, device="meta"))
    assert dA.device.type == "meta" and dA.shape == dB.shape == (2, 3)
    dA, dB = discretize(torch.zeros(3, 3, device="meta"), torch.zeros(3, device="meta"), 0.1, "bilinear")
    assert dA.shape == (3, 3) and dB.shape == (3,)


def test_compiles_without_graph_breaks():
    "The dt check reads no values while torch.compile traces (fullgraph=True fails on any graph break)."
    Lam, B = torch.complex(-torch.rand(4), torch.randn(4)), torch.randn(4, dtype=torch.complex64)
    dt = torch.rand(3, 1) + 0.01
    f = torch.compile(lambda l, b, d: discretize_diag(l, b, d, "zoh"), fullgraph=True, backend="eager")
    for got, want in zip(f(Lam, B, dt), discretize_diag(Lam, B, dt, "zoh")): torch.testing.assert_close(got, want)


@settings(max_examples=30, deadline=None)
@given(N=st.integers(1, 5), batch=st.sampled_from([(), (1,), (3,)]), seed=st.integers(0, 1000),
       method=st.sampled_from(["zoh", "bilinear", "euler", "backward_euler"]), layout=st.sampled_from(["contiguous", "transposed", "expanded"]))
def test_inputs_unchanged_outputs_finite(N, batch, seed, method, layout):
    "Inputs are never modified (whatever their strides) and finite stable input gives finite output."
    A, B, _, _ = random_ssm(N, seed=seed)
    if layout == "transposed": A = A.T.contiguous().T
    A, B = A.expand(*batch, N, N), B.expand(*batch, N)
    if layout == "contiguous": A, B = A.contiguous(), B.contiguous()
    Lam = torch.complex(-torch.rand(*batch, N, dtype=torch.float64), torch.randn(*batch, N, dtype=torch.float64))
    args = [A, B, Lam]
    copies = [a.clone() for a in args]
    outs = discretize(A, B, 0.1, method) + discretize_diag(Lam, B, 0.1, method)
    for a, c in zip(args, copies): assert torch.equal(a, c)
    for o in outs: assert torch.isfinite(torch.view_as_real(o) if o.is_complex() else o).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128])
def test_phi1_value_and_gradient_against_mpmath(dtype):
    """phi1 and expm1 against 30-digit mpmath for |z| from 1e-9 to 20 (both signs, random phases), at the rounded z:
    values to a few ulps, and phi1's gradient too, also where the Taylor branch (|z| < 0.2) meets the quotient."""
    import mpmath
    mpmath.mp.dps = 30
    g = torch.Generator().manual_seed(0)
    mags = torch.cat([torch.logspace(-9, 1.3, 60, dtype=torch.float64), torch.tensor([0.1999, 0.2, 0.2001], dtype=torch.float64)])
    z = torch.cat([mags, -mags]) if not dtype.is_complex else torch.polar(torch.cat([mags, mags]), 2 * np.pi * torch.rand(2 * len(mags), generator=g, dtype=torch.float64))
    z = z.to(dtype).requires_grad_()
    exact = lambda f: torch.tensor([complex(f(mpmath.mpmathify(complex(v)))) for v in z.detach().to(torch.complex128).tolist()], dtype=torch.complex128)
    phi, dphi = exact(lambda w: mpmath.expm1(w) / w), exact(lambda w: mpmath.diff(lambda q: mpmath.expm1(q) / q, w))
    rel = lambda got, ref: ((got.detach().to(torch.complex128) - ref).abs() / ref.abs()).max().item()
    eps = torch.finfo(dtype).eps
    assert rel(expm1(z), exact(mpmath.expm1)) < 2 * eps  # observed up to 1.3 eps
    assert rel(phi1(z), phi) < 2 * eps  # observed up to 1.45 eps
    v = phi1(z)
    grad = torch.autograd.grad(v.real.sum() if dtype.is_complex else v.sum(), z)[0]
    assert rel(grad.conj() if dtype.is_complex else grad, dphi) < 30 * eps  # observed up to 24 eps; float32 was 2e-3 (1.7e4 eps) with the former 3-term series below |z| = 1e-4


# ---------------------------------------------------------------- issue 25

SINGULAR = [("backward_euler", None, 2.0), ("bilinear", None, 4.0), ("gbt", 0.25, 8.0)]  # dt = 0.5: alpha dt lambda = 1 exactly


@pytest.mark.parametrize("method,alpha,lam", SINGULAR)
def test_singular_solve_names_A_dt_and_method(method, alpha, lam):
    "Issue 25 item 22: a singular I - alpha dt A raised torch's raw LinAlgError; now a ValueError naming A, dt, the method (and batch index)."
    A1 = torch.diag(torch.tensor([lam, -1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"\bA\b.*\bdt\b.*{method}|{method}.*\bA\b.*\bdt\b") as e: discretize(A1, torch.ones(2, dtype=torch.float64), 0.5, method, alpha)
    assert "singular" in str(e.value)
    Ab = torch.stack([torch.diag(torch.tensor([-1.0, -2.0], dtype=torch.float64)), A1])
    with pytest.raises(ValueError, match=r"batch index \(1,\)"): discretize(Ab, torch.ones(2, dtype=torch.float64), 0.5, method, alpha)
    with pytest.raises(ValueError, match=rf"\bLambda\b.*\bdt\b"): discretize_diag(torch.tensor([-1.0, lam], dtype=torch.float64), torch.ones(2, dtype=torch.float64), 0.5, method, alpha)
    discretize(A1, torch.ones(2, dtype=torch.float64), 0.5, "zoh")  # no solve: fine


def test_B_layout_is_fixed_by_ndim_and_the_error_says_the_other():
    "Issue 25 item 13: B with fewer dims than A is vectors, else matrices; a mismatch says how to write the other layout, which then works."
    A3 = random_ssm(3, seed=2)[0]
    Bs = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))  # 5 per-channel vectors, one shared A
    with pytest.raises(ValueError, match=r"read as input matrices.*discretize\(A\[None, \.\.\.\], B, dt\)"): discretize(A3, Bs, 0.1)
    dA, dB = discretize(A3[None, ...], Bs, 0.1)
    assert dA.shape == (5, 3, 3) and dB.shape == (5, 3)
    for i in range(5): torch.testing.assert_close(dB[i], discretize(A3, Bs[i], 0.1)[1], rtol=1e-14, atol=1e-16)  # batched matrix_exp rounds differently
    Ab = torch.stack([A3, 2 * A3])
    Bm = torch.randn(3, 2, dtype=torch.float64)  # one input matrix shared by a batch of A
    with pytest.raises(ValueError, match=r"read as input vectors.*B\[None, \.\.\.\]"): discretize(Ab, Bm, 0.1)
    dA, dB = discretize(Ab, Bm[None, ...], 0.1)
    assert dB.shape == (2, 3, 2)
    torch.testing.assert_close(dB[1], discretize(2 * A3, Bm, 0.1)[1], rtol=1e-14, atol=1e-16)
    with pytest.raises(ValueError, match=r"read as input vectors \(\.\.\., N\) with N=3, got shape \(4,\)$"): discretize(A3, torch.ones(4, dtype=torch.float64), 0.1)  # no other reading to offer


@settings(max_examples=30, deadline=None, derandomize=True)
@given(a_batch=st.sampled_from([(), (2,), (1, 2)]), b_batch=st.sampled_from([(), (2,), (3, 1)]), M=st.sampled_from([None, 1, 3]), seed=st.integers(0, 1000))
def test_B_ndim_rule_fuzz(a_batch, b_batch, M, seed):
    "Fuzz: with N = 3 and M = 3 available to confuse sizes, B (..., N) with fewer dims than A is vectors, B (..., N, M) with as many or more is matrices; each batch entry equals its own discretization."
    g = torch.Generator().manual_seed(seed)
    N = 3
    A = random_ssm(N, seed=seed)[0].expand(*a_batch, N, N).contiguous() * (1 + torch.rand(*a_batch, 1, 1, generator=g, dtype=torch.float64))
    B = torch.randn(*b_batch, N, *([M] if M else []), generator=g, dtype=torch.float64)
    vector = M is None
    if vector != (B.ndim < A.ndim):
        with pytest.raises(ValueError, match=r"\bB\b"): discretize(A, B, 0.1)
        return
    dA, dB = discretize(A, B, 0.1, "bilinear")
    batch = torch.broadcast_shapes(a_batch, b_batch)
    assert dA.shape == (*batch, N, N) and dB.shape == (*batch, N, *([M] if M else []))
    for idx in np.ndindex(*batch):
        a = A.expand(*batch, N, N)[idx]
        b = B.expand(*batch, *B.shape[-(1 if vector else 2):])[idx]
        ref = discretize(a, b, 0.1, "bilinear")
        torch.testing.assert_close(dB[idx], ref[1], rtol=1e-13, atol=1e-15)


def test_phi1_at_infinity_and_large_arguments():
    "Issue 25 item 15: phi1(+inf) was NaN (limit +inf); phi1(-inf) = 0; complex infinities; e^z/z no longer overflows before the value does."
    import mpmath
    mpmath.mp.dps = 30
    inf, nan = math.inf, math.nan
    for dtype in (torch.float32, torch.float64):
        assert phi1(torch.tensor([inf, -inf], dtype=dtype)).tolist() == [inf, 0.0]
    got = phi1(torch.tensor([complex(inf, 0), complex(inf, 1), complex(inf, -2), complex(-inf, 1), complex(-inf, 0), complex(1, inf), complex(-inf, -inf), complex(2, -inf)], dtype=torch.complex128))
    assert got[0] == complex(inf, 0) and got[1] == complex(inf, inf) and got[2] == complex(-inf, -inf)  # e^z's direction
    assert (got[3:] == 0).all()  # bounded numerator over an infinite denominator
    assert torch.isnan(phi1(torch.tensor([nan]))).all()
    exact = lambda v: complex(mpmath.expm1(mpmath.mpmathify(v)) / mpmath.mpmathify(v))
    for dtype, zs in [(torch.float32, [40.5, 60.0, 89.0, 92.0]), (torch.float64, [40.5, 60.0, 300.0, 700.0, 709.0]),
                      (torch.complex64, [50 + 3j, 90 - 1j]), (torch.complex128, [50 + 3j, 600 - 2j, 41 + 100j])]:
        z = torch.tensor(zs, dtype=dtype)
        ref = torch.tensor([exact(complex(v)) for v in z.to(torch.complex128).tolist()], dtype=torch.complex128)
        got = phi1(z).to(torch.complex128)
        assert torch.isfinite(got.real).all() and ((got - ref).abs() / ref.abs()).max() < 4 * torch.finfo(dtype).eps  # float32 92: was inf
    assert torch.isinf(phi1(torch.tensor([94.0]))).all()  # e^94/94 = 6.6e38 overflows float32 itself
    zg = torch.tensor([39.0, 45.0, 80.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(phi1, (zg,))
    assert torch.autograd.gradcheck(phi1, (torch.tensor([45 + 2j, 39 - 1j], dtype=torch.complex128, requires_grad=True),))


AUTOCAST_OPS = {
    "discretize zoh": lambda A, B, lam: discretize(A, B, 0.1),
    "discretize bilinear": lambda A, B, lam: discretize(A, B[:, None].expand(4, 2), 0.1, "bilinear"),
    "discretize_diag zoh": lambda A, B, lam: discretize_diag(lam, B, 0.1),
    "discretize_diag bilinear": lambda A, B, lam: discretize_diag(lam.real, B, 0.1, "bilinear"),
    "expm1": lambda A, B, lam: expm1(lam), "phi1": lambda A, B, lam: phi1(lam), "phi1 real": lambda A, B, lam: phi1(100 * lam.real),
}


@pytest.mark.parametrize("name", list(AUTOCAST_OPS))
def test_autocast_is_ignored(name):
    "Issue 25 item 5: under bfloat16 autocast, float32 inputs are computed in float32: bit-identical to the result without autocast."
    A, B, _, _ = random_ssm(4, seed=6, dtype=torch.float32)
    lam = torch.complex(-torch.rand(4, generator=torch.Generator().manual_seed(6)), torch.randn(4, generator=torch.Generator().manual_seed(7)))
    ref = AUTOCAST_OPS[name](A, B, lam)
    with torch.autocast("cpu", torch.bfloat16): got = AUTOCAST_OPS[name](A, B, lam)
    for r, o in zip(ref if isinstance(ref, tuple) else (ref,), got if isinstance(got, tuple) else (got,)):
        assert o.dtype == r.dtype and torch.equal(o, r)


def test_vmap_over_dt_equals_the_loop():
    "Issue 25 follow-up 3: torch.func.vmap over dt (the dt check reads no values of a batched tensor) gives the loop over dt; "
    "per-dt gradients by vmap(grad) give autograd's, one dt at a time."
    from torch.func import vmap, grad
    A, B, _, _ = random_ssm(4, seed=3)
    Lam = torch.complex(-torch.rand(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64))
    dts = torch.tensor([0.01, 0.1, 0.5, 2.0], dtype=torch.float64)
    for method in ["zoh", "bilinear", "backward_euler"]:
        for f in (lambda d: discretize(A, B, d, method), lambda d: discretize_diag(Lam, B.to(Lam.dtype), d, method)):
            got, loop = vmap(f)(dts), [f(d) for d in dts]
            for i in range(2): torch.testing.assert_close(got[i], torch.stack([r[i] for r in loop]), rtol=1e-13, atol=1e-15)
    loss = lambda d: discretize(A, B, d)[1].sum()
    want = torch.stack([torch.autograd.grad(loss(x := d.clone().requires_grad_()), x)[0] for d in dts])
    torch.testing.assert_close(vmap(grad(loss))(dts), want, rtol=1e-13, atol=1e-15)


def test_mixed_devices_are_refused_by_name():
    "Issue 25 follow-up 4: B or dt on another device (meta here) raised 'Tensor on device meta is not on the expected device cpu' or "
    "'Cannot copy out of meta tensor'; now a ValueError naming both arguments and devices. A 0-d CPU dt is a number (goes anywhere)."
    A, B, _, _ = random_ssm(3)
    Lam = -torch.rand(3, dtype=torch.float64)
    for method in ("zoh", "bilinear"):
        with pytest.raises(ValueError, match=r"B is on device meta but A is on cpu: all tensors of one call must be on one device \(move B with .to\('cpu'\)\)"):
            discretize(A, B.to("meta"), 0.1, method)
        with pytest.raises(ValueError, match=r"B is on device cpu but A is on meta"): discretize(A.to("meta"), B, 0.1, method)
        with pytest.raises(ValueError, match=r"dt is on device meta but A is on cpu"): discretize(A, B, torch.tensor([0.1], device="meta"), method)
        with pytest.raises(ValueError, match=r"dt is on device meta but A is on cpu"): discretize(A, B, torch.tensor(0.1, device="meta"), method)
        with pytest.raises(ValueError, match=r"B is on device meta but Lambda is on cpu"): discretize_diag(Lam, B.to("meta"), 0.1, method)
        with pytest.raises(ValueError, match=r"dt is on device meta but Lambda is on cpu"): discretize_diag(Lam, B, torch.tensor(0.1, device="meta"), method)
        assert discretize(A.to("meta"), B.to("meta"), torch.tensor(0.1), method)[0].device.type == "meta"  # a 0-d CPU dt: a number
        assert discretize_diag(Lam.to("meta"), B.to("meta"), torch.tensor(0.1), method)[0].device.type == "meta"
