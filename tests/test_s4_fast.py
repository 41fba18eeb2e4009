"""Issue 32, S4's forward within 4x of S4D's: the compiled paths of `ssm_kernel_dplr` for calls that nothing records (engine/conv):
C~ (`_c_tilde_fast` for rank 1, `_lowrank_fast`'s products otherwise) and the kernel spectrum in one pass (`_kernel_spectrum_fast`), against
independent references in complex128 (NumPy's dense powers and the dense kernel $C\\bar A^l\\bar B$), against lesson 05's path, and
when they hand back to it (autograd, rank 2, values out of range)."""
import numpy as np, pytest, torch
from ssm_course._engine import conv as engine
from ssm_course import conv as lesson
from ssm_course.conv import ssm_kernel_dplr
from ssm_course.hippo import dplr

pytestmark = pytest.mark.skipif(engine._lowrank is None, reason="numba is not installed: the torch paths only")


@pytest.fixture
def counted(monkeypatch):
    "Calls of the compiled low-rank products (`_lowrank`), C~ of rank 1 (`_ctilde`) and kernel spectra (`_spectrum`)."
    seen = {"lowrank": 0, "ctilde": 0, "spectrum": 0}
    for name in seen:
        real = getattr(engine, "_" + name)
        def wrap(*a, name=name, real=real):
            seen[name] += 1
            return real(*a)
        monkeypatch.setattr(engine, "_" + name, wrap)
    return seen


def dense_powers(w, e, X, Y, q):
    "w (diag(e) + X Y^*)^q by q products with the dense matrix in NumPy complex128, batch broadcast (matrix_power's squarings round more: 4e-14 at q = 300 below)."
    M = np.einsum("...n,nk->...nk", e, np.eye(e.shape[-1])) + X @ np.conj(np.swapaxes(Y, -1, -2))
    for _ in range(q): w = np.einsum("...n,...nk->...k", w, M)
    return w


def test_lowrank_products_equal_dense_powers(counted):
    """w (diag(e) + XY^*)^q by the compiled products against NumPy's dense power, with rows of w broadcast against fewer factors
    (observed 6e-15 of the largest entry of w at q = 300, with |M| = 1.1); not taken under autograd, in complex64 or for q = 0."""
    g = torch.Generator().manual_seed(0)
    c = lambda *s: torch.randn(*s, dtype=torch.complex128, generator=g)
    e, X, Y, w = 0.9 * torch.exp(1j * torch.rand(3, 1, 11, generator=g, dtype=torch.float64)), c(3, 1, 11, 4) / 6, c(1, 1, 11, 4) / 6, c(2, 11)
    for q in (1, 7, 300):
        y = engine._lowrank_fast(w, e, X, Y, q)
        ref = dense_powers(w.numpy(), e.numpy(), X.numpy(), Y.numpy(), q)
        err = np.abs(y.numpy() - ref).max() / np.abs(w.numpy()).max()  # rounding, relative to the rows multiplied
        assert y.shape == (3, 2, 11) and err < 1e-14, err
    assert counted["lowrank"] == 3
    assert (engine._lowrank_fast(w, e, X[..., :0], Y[..., :0], 2) - w * e * e).abs().max() < 3e-16 * w.abs().max()  # rank 0: the diagonal alone (fused multiply-adds: not bit for bit)
    assert engine._lowrank_fast(w.clone().requires_grad_(), e, X, Y, 3) is None
    assert engine._lowrank_fast(w.to(torch.complex64), e, X, Y, 3) is None and engine._lowrank_fast(w, e, X, Y, 0) is None
    assert counted["lowrank"] == 4


def np_c_tilde(Lam, P, C, dt, L):
    "C (I - Ad^L) with the dense bilinear Ad, NumPy complex128."
    A = np.diag(Lam.numpy()) - P.numpy().T @ P.numpy().conj()
    I = np.eye(len(A))
    return C.numpy() - C.numpy() @ np.linalg.matrix_power(np.linalg.solve(I - dt / 2 * A, I + dt / 2 * A), L)


@pytest.mark.parametrize("measure,L", [("legs", 1000), ("legs", 4096), ("legs", 8205), ("legt", 1000), ("legt", 4101)])
def test_c_tilde_compiled_equals_the_dense_power(measure, L, counted):
    """C~ compiled (rank 1, LegS: all of it in `_ctilde`; rank 2, LegT: torch's squarings, then `_lowrank`), with up to
    _APPLY_FAST = 512 products with the last low-rank power (rank 16: 62, 256 and 512 here; LegT's rank 32 at N = 64: 31 and 128),
    against NumPy's dense power per channel, steps 1e-4 to 5e-3 so that |C A-bar^L| is 3e-3 to 0.9 of |C| (observed 1.9e-12 of
    |C|, the torch path's 1.8e-12: NumPy's squarings round as much), and against the torch path that autograd runs (observed 5.1e-13;
    LegT 2.7e-14)."""
    Lam, P, B, _ = dplr(measure, 64)
    gen = torch.Generator().manual_seed(L)
    dts = torch.tensor([1e-4, 1e-3, 5e-3], dtype=torch.float64)
    C = torch.randn(3, 64, dtype=torch.complex128, generator=gen)
    args = (Lam.expand(3, 64), P.expand(3, *P.shape), B, C)
    Ct = engine._c_tilde(*args, dts[:, None], L)
    assert (counted["ctilde"], counted["lowrank"]) == ((1, 0) if measure == "legs" else (0, 1))
    for h in range(3):
        ref = np_c_tilde(Lam, P, C[h], dts[h].item(), L)
        assert np.abs(Ct[h].numpy() - ref).max() < 2.5e-12 * np.abs(C[h].numpy()).max(), (h, np.abs(Ct[h].numpy() - ref).max())
    Cg = C.clone().requires_grad_()
    Ct_torch = engine._c_tilde(*args[:3], Cg, dts[:, None], L)  # recorded: torch's products
    assert counted["ctilde"] + counted["lowrank"] == 1 and (Ct_torch.detach() - Ct).abs().max() < 1e-12 * C.abs().max()


def dense_kernel(Lam, P, B, C, dt, L):
    "K_l = C Ad^l Bd for the dense bilinear discretization of A = diag(Lam) - P^T conj(P) (P (r, N)), NumPy complex128, one channel."
    A = np.diag(Lam) - P.T @ P.conj()
    I = np.eye(len(A))
    Ad, Bd = np.linalg.solve(I - dt / 2 * A, I + dt / 2 * A), np.linalg.solve(I - dt / 2 * A, dt * B)
    K, x = np.empty(L, np.complex128), Bd
    for l in range(L): K[l], x = C @ x, Ad @ x
    return K


def lesson_path(*args, **kw):
    "ssm_kernel_dplr with every compiled path off: lesson 05's code (the Cauchy Function, torch's C~ products, the elementwise solves)."
    saved = {k: getattr(engine, k) for k in ("_spectrum", "_ctilde", "_lowrank", "_sums", "_powers")}
    try:
        for k in saved: setattr(engine, k, None)
        return ssm_kernel_dplr(*args, **kw)
    finally:
        for k, f in saved.items(): setattr(engine, k, f)


@pytest.mark.parametrize("measure,N,L", [("legs", 64, 1000), ("legs", 32, 4097), ("fout", 15, 300), ("lagt", 16, 513)])
def test_kernel_spectrum_compiled_equals_the_dense_kernel(measure, N, L, counted):
    """ssm_kernel_dplr with C~'s products and the spectrum compiled, in complex128 and complex64, against the dense kernel per
    channel (steps 1e-3, 0.02, 0.3; FouT's frequencies land on its poles: the pole left out matters) and against lesson 05's
    path in complex128; odd and even L (the Nyquist point), blocks of 256 points and a partial one."""
    Lam, P, B, _ = dplr(measure, N)
    gen = torch.Generator().manual_seed(N + L)
    dts = torch.tensor([1e-3, 0.02, 0.3], dtype=torch.float64)
    C = torch.randn(3, N, dtype=torch.complex128, generator=gen)
    K = ssm_kernel_dplr(Lam, P, B, C, dts, L)  # Lam, P, B broadcast against C's and dt's channels
    assert counted["spectrum"] == 1 and counted["ctilde"] == 1
    ref = np.stack([dense_kernel(Lam.numpy(), P.numpy(), B.numpy(), C[h].numpy(), dts[h].item(), L) for h in range(3)])
    scale = np.abs(ref).max(-1, keepdims=True)
    err = (np.abs(K.numpy() - ref) / scale).max()
    assert err < 1.5e-13, err  # observed 3.9e-14 to 8.3e-14; the lesson's path 3.5e-14 to 9e-14
    K_lesson = lesson_path(Lam, P, B, C, dts, L)
    assert counted["spectrum"] == 1 and (np.abs(K.numpy() - K_lesson.numpy()) / scale).max() < 6e-14  # observed 5e-15 to 4.4e-14
    K32 = ssm_kernel_dplr(*(x.to(torch.complex64) for x in (Lam, P, B, C)), dts.float(), L)
    assert counted["spectrum"] == 2 and K32.dtype == torch.complex64
    err32 = (np.abs(K32.numpy() - ref) / scale).max()
    err32_lesson = (np.abs(lesson_path(*(x.to(torch.complex64) for x in (Lam, P, B, C)), dts.float(), L).numpy() - ref) / scale).max()
    assert err32 < err32_lesson and err32 < 8e-7, (err32, err32_lesson)  # observed 2.2e-7 to 5.7e-7; the lesson's 2.6e-6 to 9.9e-6
    # (its frequencies and bilinear factors are complex64 arithmetic; the compiled pass rounds float64 tangents once)


def test_kernel_spectrum_hands_back():
    """The compiled spectrum is not used under autograd, for rank 2 (LegT) or with a NaN; where a determinant leaves the normal
    range it hands back to the lesson's code (whose values it then returns, bit for bit); the training path's gradients pass
    gradcheck in float64."""
    Lam, P, B, _ = dplr("legs", 8)
    C = torch.randn(8, dtype=torch.complex128, generator=torch.Generator().manual_seed(1))
    dt = torch.tensor([0.1], dtype=torch.float64)
    args = engine._check_dplr(Lam, P, B, C, dt, 16, 4096)[:6]  # Lambda, P, B, C, dt (..., 1), L
    assert engine._kernel_spectrum_fast(*args) is not None
    Lc, Pc, Bc, Cc, dtc, Lk = args
    assert engine._kernel_spectrum_fast(Lc, Pc, Bc, Cc.clone().requires_grad_(), dtc, Lk) is None
    assert engine._kernel_spectrum_fast(Lc, torch.cat([Pc, Pc], -2), Bc, Cc, dtc, Lk) is None  # rank 2
    Cn = Cc.clone(); Cn[..., 3] = float("nan")
    assert engine._kernel_spectrum_fast(Lc, Pc, Bc, Cn, dtc, Lk) is None
    for bad in (float("nan"), complex(0, float("nan")), complex(float("inf"), 0)):  # a pole NaN (no grid point for it) or infinite
        Ln = Lc.clone(); Ln[..., 2] = bad
        assert engine._kernel_spectrum_fast(Ln, Pc, Bc, Cc, dtc, Lk) is None
    Pb = P * 1e160  # |det|^2 overflows in complex128
    assert engine._kernel_spectrum_fast(Lc, Pc * 1e160, Bc, Cc, dtc, Lk) is None
    K = ssm_kernel_dplr(Lam, Pb, B, C, dt, 16, tilde=True)
    real, engine._spectrum = engine._spectrum, None
    try: torch.testing.assert_close(K, ssm_kernel_dplr(Lam, Pb, B, C, dt, 16, tilde=True), rtol=0, atol=0, equal_nan=True)  # the lesson's code ran
    finally: engine._spectrum = real
    Lt, Pt, Bt, _ = dplr("legt", 4)
    f = lambda C, Lam: ssm_kernel_dplr(Lam, Pt, Bt, C, dt, 6)
    Cg, Lg = torch.randn(4, dtype=torch.complex128, requires_grad=True), Lt.clone().requires_grad_()
    assert torch.autograd.gradcheck(f, (Cg, Lg))
    f1 = lambda C, Lam: ssm_kernel_dplr(Lam, P[:, :4], B[:4], C, dt, 6)
    assert torch.autograd.gradcheck(f1, (Cg, Lam[:4].clone().requires_grad_()))


def test_s4_layer_forward_compiled_equals_training_path(counted):
    "The S4 layer's forward without gradients (the compiled paths) against the same forward recorded by autograd (lesson 05's path), float32."
    from ssm_course.layers import S4
    torch.manual_seed(0)
    m = S4(16)
    x = torch.randn(2, 300, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(): y = m(x)
    assert counted["spectrum"] == 1 and counted["ctilde"] == 1
    y_train = m(x)
    assert counted["spectrum"] == 1 and (y - y_train.detach()).abs().max() < 2e-6 * y_train.abs().max()


def test_kernel_spectrum_rows_split_over_threads(counted):
    "Above _FAST_MIN numbers the channels are split over PyTorch's threads (numba releases the GIL): the same values, bit for bit."
    Lam, P, B, _ = dplr("legs", 64)
    C = torch.randn(3, 64, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    args = (Lam.to(torch.complex64), P.to(torch.complex64), B.to(torch.complex64), C, torch.tensor([1e-3, 0.02, 0.3]), 2048)
    assert 3 * 4 * 64 * 2048 >= engine._FAST_MIN
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1); one = ssm_kernel_dplr(*args)
        torch.set_num_threads(3); three = ssm_kernel_dplr(*args)
    finally: torch.set_num_threads(threads)
    assert counted["spectrum"] == 4 and torch.equal(one, three)  # one call, then one per thread
