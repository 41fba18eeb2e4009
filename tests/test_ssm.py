"""Bad input to every exported function of notebook 01 raises a clear error naming the argument."""
import pytest, torch
from ssm_course.ssm import basis_functions, impulse_response, random_ssm, state_transition, step_response, spectral_abscissa, is_stable

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
