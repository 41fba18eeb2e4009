"""Notebook 11's Triton kernels (ssm_kernel_diag, selective scan, SSD) against their float64 references, in Triton's CPU interpreter (tiny shapes).

TRITON_INTERPRET must be set before triton is imported, so this module sets it first; the kernels
are imported lazily by the dispatcher, after this line."""
import os
os.environ["TRITON_INTERPRET"] = "1"
import math, pytest, torch
import torch.nn.functional as F
from ssm_course.conv import ssm_kernel_diag
from ssm_course.selective import selective_scan, selective_scan_ref
from ssm_course.ssd import ssd, ssd_ref

pytest.importorskip("triton")


def rel(x, ref): return ((x.to(ref.dtype) - ref).abs().max() / (ref.abs().max() + 1e-30)).item()


def test_kernel_diag_forward_and_gradients():
    g = torch.Generator().manual_seed(3)
    H, N, L = 2, 6, 45
    dA = ((1 - 1e-4 * torch.rand(H, N, generator=g, dtype=torch.float64)) * torch.exp(2j * math.pi * torch.rand(H, N, generator=g, dtype=torch.float64))).to(torch.complex64)
    dB, C, w = (torch.randn(H, N, generator=g, dtype=torch.complex64) for _ in range(3))
    w = torch.randn(H, L, generator=g, dtype=torch.complex64)
    assert rel(ssm_kernel_diag(dA, dB, C, L, backend="triton"), ssm_kernel_diag(dA.cdouble(), dB.cdouble(), C.cdouble(), L)) < 1e-5
    def grads(backend, cast):
        xs = [cast(x).detach().requires_grad_() for x in (dA, dB, C)]
        (ssm_kernel_diag(*xs, L, backend=backend) * cast(w).conj()).sum().real.backward()
        return [x.grad for x in xs]
    for ours, ref in zip(grads("triton", lambda x: x), grads("torch", lambda x: x.cdouble())): assert rel(ours, ref) < 1e-4


@pytest.mark.parametrize("layout", [2, 3, 4])
def test_selective_forward_and_gradients(layout):
    g = torch.Generator().manual_seed(layout)
    b, d, n, l = 2, 4, 3, 21
    r = lambda *s: torch.randn(*s, generator=g)
    shape = {2: (d, n), 3: (b, n, l), 4: (b, 2, n, l)}[layout]
    kw = dict(u=r(b, d, l), delta=r(b, d, l), A=-torch.rand(d, n, generator=g) - 0.1, B=r(*shape), C=r(*shape), D=r(d), z=r(b, d, l),
              delta_bias=r(d), delta_softplus=True, initial_state=r(b, d, n))
    y, s = selective_scan(**kw, backend="triton", chunk=16, return_last_state=True)
    y_ref, s_ref = selective_scan_ref(**{k: (v.double() if torch.is_tensor(v) else v) for k, v in kw.items()}, return_last_state=True)
    assert rel(y, y_ref) < 1e-5 and rel(s, s_ref) < 1e-5
    w = r(b, d, l)
    kws = {k: (v.clone().requires_grad_() if torch.is_tensor(v) else v) for k, v in kw.items()}
    kwd = {k: (v.double().requires_grad_() if torch.is_tensor(v) else v) for k, v in kw.items()}
    (selective_scan(**kws, backend="triton", chunk=16) * w).sum().backward()
    (selective_scan_ref(**kwd) * w.double()).sum().backward()
    for k in ("u", "delta", "A", "B", "C", "initial_state"): assert rel(kws[k].grad, kwd[k].grad) < 1e-4, k


@pytest.mark.parametrize("l,Q", [(16, 16), (37, 16), (40, 32)])
def test_ssd_forward_and_gradients(l, Q):
    g = torch.Generator().manual_seed(l)
    r = lambda *s: torch.randn(*s, generator=g)
    b, h, p, grp, n = 1, 4, 5, 2, 6
    kw = dict(x=r(b, l, h, p), dt=F.softplus(r(b, l, h) - 1), A=-torch.exp(r(h)), B=r(b, l, grp, n), C=r(b, l, grp, n), D=r(h), initial_states=r(b, h, p, n))
    y, s = ssd(**kw, chunk_size=Q, backend="triton", return_final_states=True)
    y_ref, s_ref = ssd_ref(**{k: v.double() for k, v in kw.items()}, return_final_states=True)
    assert rel(y, y_ref) < 1e-5 and rel(s, s_ref) < 1e-5
    kws = {k: v.clone().requires_grad_() for k, v in kw.items()}
    kwd = {k: v.double().requires_grad_() for k, v in kw.items()}
    w = r(*y.shape)
    (ssd(**kws, chunk_size=Q, backend="triton") * w).sum().backward()
    (ssd_ref(**kwd) * w.double()).sum().backward()
    for k in kw: assert rel(kws[k].grad, kwd[k].grad) < 1e-4, k


def test_unsupported_arguments_raise_instead_of_falling_back():
    with pytest.raises(ValueError, match="complex64"): ssm_kernel_diag(torch.rand(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64), 4, backend="triton")
    u = torch.randn(1, 2, 5)
    with pytest.raises(ValueError, match="real A"):
        selective_scan(u, u, torch.complex(-torch.ones(2, 3), torch.ones(2, 3)), torch.ones(2, 3, dtype=torch.complex64), torch.ones(2, 3, dtype=torch.complex64), backend="triton")
