"""ssm_course.checks: the shared boundary checks (nbs/engine/checks.ipynb)."""
import subprocess, sys
import pytest

import torch
from hypothesis import given, settings, strategies as st

from ssm_course.checks import broadcast_shapes

shape = st.lists(st.sampled_from([0, 1, 2, 3]), max_size=4).map(tuple)


@settings(max_examples=300, deadline=None)
@given(st.lists(shape, min_size=1, max_size=4))
def test_broadcast_shapes_is_torchs(shapes):
    try: expected = torch.broadcast_shapes(*shapes)
    except RuntimeError: expected = None
    try: got = broadcast_shapes(*shapes)
    except RuntimeError: got = None
    assert got == expected, (shapes, got, expected)


def test_first_layer_call_does_not_import_sympy():
    "torch.broadcast_shapes imports sympy (about 500 modules) on its first call; a layer's first forward must not."
    code = ("import sys, torch\nfrom ssm_course.layers import S4D\nm = S4D(8, 4)\nm(torch.randn(2, 16, 8))\n"
            "print('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_values_hidden_under_vmap():
    "Issue 25 follow-up 3: a tensor batched by torch.func.vmap hides its values (bool() of a slice raises), also under a grad level."
    from torch.func import vmap, grad
    from ssm_course.checks import values_hidden, check_positive
    seen = []
    vmap(lambda d: seen.append(values_hidden(d)) or d)(torch.ones(2))
    vmap(grad(lambda d: seen.append(values_hidden(d)) or d * d))(torch.ones(2))
    grad(lambda d: seen.append(values_hidden(d)) or d * d)(torch.tensor(1.0))  # grad alone: values are readable
    assert seen == [True, True, False] and not values_hidden(torch.ones(2))
    out = vmap(lambda d: check_positive(d, "dt") + 0)(torch.tensor([-1.0, 2.0]))  # skipped, as under torch.compile
    assert out.tolist() == [-1.0, 2.0]


def test_check_same_device():
    "Issue 25 follow-up 4: the shared device check names the moved argument, the first one and both devices; None, numbers and 0-d CPU tensors pass."
    import pytest
    from ssm_course.checks import check_same_device
    assert check_same_device(a=torch.ones(2), b=None, c=0.5, d=torch.ones(3)) == torch.device("cpu")
    assert check_same_device(dt=torch.tensor(0.1), A=torch.ones(2, device="meta")) == torch.device("meta")
    assert check_same_device() is None and check_same_device(dt=torch.tensor(0.1)) is None
    with pytest.raises(ValueError, match=r"c is on device meta but a is on cpu: all tensors of one call must be on one device \(move c with .to\('cpu'\)\)"):
        check_same_device(a=torch.ones(2), b=torch.ones(2), c=torch.ones(2, device="meta"))
    with pytest.raises(ValueError, match=r"dt is on device meta but a is on cpu"): check_same_device(a=torch.ones(2), dt=torch.tensor(0.1, device="meta"))


def test_an_older_triton_is_not_used(monkeypatch):
    "Triton older than 3.6 (what an older CUDA build of PyTorch pins) counts as unavailable: backend='triton' says which version it "
    "found and what to do; 3.6 and later (3.10 included: versions compare as numbers) are used. Before, any importable Triton was used."
    import importlib.metadata, torch
    from ssm_course import checks
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(checks.importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else None)
    for version, ok in [("3.4.0", False), ("3.5.1+git", False), ("3.6.0", True), ("3.10.2", True), ("4.0", True)]:
        monkeypatch.setattr(checks.importlib.metadata, "version", lambda name, v=version: v)
        assert checks.triton_available() is ok, version
        if ok: assert checks.resolve_backend("triton", torch.zeros(1)) == "triton"
        else:
            with pytest.raises(ValueError, match=rf"needs Triton >= 3.6, found {version[:3]}.*use backend='torch'"):
                checks.resolve_backend("triton", torch.zeros(1))
