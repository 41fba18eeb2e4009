"""ssm_course.checks: the shared boundary checks (nbs/engine/checks.ipynb)."""
import subprocess, sys

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
