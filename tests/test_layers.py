"""ssm_course.layers: shapes, step == forward, state carrying, gradients, causality, precision, bad input, torch.compile, param groups."""
import copy, itertools, math, pickle, pytest, torch
from ssm_course.layers import LAYERS, SequenceModel, ssm_param_groups, S4D, S4, LRU, Mamba, dplr_bilinear_step
from ssm_course.discretize import discretize
from ssm_course.hippo import dplr
from conftest import rel as _rel

SMALL = {"s4d": dict(d_state=8), "s4": dict(d_state=8), "dss": dict(d_state=8), "lru": dict(d_state=10), "mamba": dict(d_state=4)}
# every layer, plus Mamba with complex states (init="lin") and with the shortest convolutions
CONFIGS = {**{name: (name, kw) for name, kw in SMALL.items()}, "mamba-lin": ("mamba", dict(d_state=4, init="lin")),
           "mamba-dconv1": ("mamba", dict(d_state=4, d_conv=1)), "mamba-dconv2": ("mamba", dict(d_state=4, d_conv=2))}


def flat(s): return torch.cat([t.reshape(-1) for t in s]) if isinstance(s, tuple) else s.reshape(-1)


def build(config, H=5, seed=0):
    torch.manual_seed(seed)
    name, kw = CONFIGS[config]
    return LAYERS[name](H, **kw)


def steps(layer, x, state):
    ys = []
    for t in range(x.shape[1]):
        y_t, state = layer.step(x[:, t], state)
        ys.append(y_t)
    return torch.stack(ys, 1), state


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_shape_and_dtype(config):
    y = build(config, H=6)(torch.randn(3, 17, 6))
    assert y.shape == (3, 17, 6) and y.dtype == torch.float32


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("L,split", [(1, 0), (9, 4), (31, 30)])
def test_step_equals_forward_and_chunking(config, L, split):
    "step == forward; forward in two pieces carrying the state == one forward; a forward prefill continued by step (float64: observed up to 5.3e-15)."
    layer = build(config).double()
    x = torch.randn(2, L, 5, dtype=torch.float64)
    y, last = layer(x, return_state=True)
    ys, state = steps(layer, x, layer.initial_state(2))
    torch.testing.assert_close(ys, y, rtol=1e-12, atol=5e-14)
    torch.testing.assert_close(flat(state), flat(last), rtol=1e-12, atol=5e-14)
    if split:
        y1, s1 = layer(x[:, :split], return_state=True)
        y2, s2 = layer(x[:, split:], state=s1, return_state=True)
        torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-12, atol=5e-14)
        torch.testing.assert_close(flat(s2), flat(last), rtol=1e-12, atol=5e-14)
        torch.testing.assert_close(steps(layer, x[:, split:], s1)[0], y[:, split:], rtol=1e-12, atol=5e-14)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_empty_batch(config):
    "A batch of 0 sequences gives empty outputs and states of the right shapes (forward, forward with a state, step), and gradients."
    layer = build(config)
    x = torch.randn(0, 7, 5, requires_grad=True)
    y, last = layer(x, return_state=True)
    assert y.shape == (0, 7, 5) and [t.shape for t in (last if isinstance(last, tuple) else (last,))] == \
        [t.shape for t in (layer.initial_state(0) if isinstance(last, tuple) else (layer.initial_state(0),))]
    assert layer(x, state=layer.initial_state(0)).shape == (0, 7, 5)
    y_t, _ = layer.step(x[:, 0], layer.initial_state(0))
    assert y_t.shape == (0, 5)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_mamba_conv_state_keeps_only_the_last_inputs():
    "Mamba(d_conv=1) has an empty convolution state (it used to return the whole sequence)."
    for d_conv in (1, 2, 4):
        _, (conv_state, _) = Mamba(4, d_conv=d_conv)(torch.randn(2, 7, 4), return_state=True)
        assert conv_state.shape == (2, 8, d_conv - 1)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_parameter_gets_a_finite_gradient(config):
    torch.manual_seed(1)
    name, kw = CONFIGS[config]
    model = SequenceModel(4, d_model=8, n_layers=2, layer=name, d_input=3, **kw)
    model(torch.randn(2, 20, 3)).square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_with_nan_or_huge_values_later(config, dtype):
    "Outputs before t depend only on inputs up to t: a NaN at t = 30, or 1e6 at the last step, leaves them as the 30-step prefix gives them."
    layer = build(config, H=3).to(dtype)
    x = torch.randn(2, 40, 3, dtype=dtype)
    rtol = 1e-5 if dtype == torch.float32 else 1e-11
    with torch.no_grad():
        clean = layer(x[:, :30])
        for t, bad in [(30, float("nan")), (39, float("nan")), (39, 1e6), (30, 1e6)]:
            xb = x.clone(); xb[:, t] = bad
            y = layer(xb)[:, :30]
            assert torch.isfinite(y).all(), f"{config}: a {bad} at t={t} made earlier outputs non-finite"
            err = ((y - clean).abs().max() / clean.abs().max()).item()
            assert err <= rtol, f"{config}: a {bad} at t={t} moved earlier outputs by {err:.2e} (relative)"


def test_sequence_model_mlp_follows_the_layer():
    "S4-style blocks have the GELU-linear-GLU stage, Mamba blocks (norm, mixer, residual) do not; mlp= overrides; any class is a layer."
    kw = dict(d_model=8, n_layers=2, d_input=3)
    assert SequenceModel(4, layer="s4d", **kw).mlps is not None and SequenceModel(4, layer="mamba", **kw).mlps is None
    assert SequenceModel(4, layer="mamba", mlp=True, **kw).mlps is not None and SequenceModel(4, layer="lru", mlp=False, **kw).mlps is None
    m = SequenceModel(4, layer=torch.nn.Identity, pool=None, **kw)  # any module mapping (b, L, H) to (b, L, H)
    assert m(torch.randn(2, 9, 3)).shape == (2, 9, 4)
    with pytest.raises(TypeError, match="no step"): m.step(torch.randn(2, 3), [None, None])


def test_param_groups_cover_everything_once_and_survive_copies():
    model = SequenceModel(4, d_model=8, n_layers=2, layer="mamba", vocab_size=7)
    for m in (model, copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        groups = ssm_param_groups(m, lr=1e-2, weight_decay=0.1)
        ids = [id(p) for g in groups for p in g["params"]]
        assert len(ids) == len(set(ids)) == len(list(m.parameters()))
        ssm = next(g for g in groups if g["name"] == "ssm")
        assert ssm["lr"] == 1e-3 and ssm["weight_decay"] == 0.0
        want = {m.layers[i].A_log for i in range(2)} | {m.layers[i].D for i in range(2)} | {m.layers[i].dt_proj.bias for i in range(2)}
        assert {id(p) for p in ssm["params"]} == {id(p) for p in want}  # dt_proj.bias too, also in a deepcopy


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_half_precision_is_computed_in_float32(config):
    "A bfloat16 or float16 layer returns the input's dtype; the SSM layers equal the float32 computation rounded once."
    for dtype in (torch.bfloat16, torch.float16):
        half = build(config, H=6).to(dtype)
        x = torch.randn(2, 13, 6).to(dtype)
        with torch.no_grad():
            y, ref = half(x), copy.deepcopy(half).float()(x.float())
            state = half.initial_state(2)
            y_t, _ = half.step(x[:, 0], state)
        assert y.dtype == y_t.dtype == dtype and torch.isfinite(y).all()
        if config.startswith("mamba"): assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2
        else: assert torch.equal(y, ref.to(dtype)), config


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_wrong_state_names_state(config):
    layer = build(config)
    x = torch.randn(2, 6, 5)
    good = layer.initial_state(2)
    bad = [layer.initial_state(3), torch.zeros(2, 1)] if not isinstance(good, tuple) else \
          [layer.initial_state(3), (good[0], good[1][:, :1]), good[0], (good[0],)]
    for state in bad:
        with pytest.raises((ValueError, TypeError), match="state"): layer(x, state=state)
        with pytest.raises((ValueError, TypeError), match="state"): layer.step(x[:, 0], state)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_meta_tensors_give_shapes(config):
    "On the meta device (shapes without values) every layer runs: no value-reading check in the way."
    layer = build(config).to("meta")
    y, state = layer(torch.randn(2, 7, 5, device="meta"), return_state=True)
    assert y.shape == (2, 7, 5) and y.device.type == "meta"
    y_t, _ = layer.step(torch.randn(2, 5, device="meta"), state)
    assert y_t.shape == (2, 5)


def _compile_two_lengths(layer):
    "Compile with dynamic shapes and no graph breaks (fullgraph); a second length must reuse the graph. The compiled layer is as "
    "causal as the eager one (test_causal_with_nan_or_huge_values_later): huge, NaN or inf inputs from step t on leave the outputs "
    "before t as the clean input gives them (compiled DSS moved them by 2.3e-2 of their size with 1e6 at the last step, eager 2e-7)."
    compiled = torch.compile(layer, backend="eager", dynamic=True, fullgraph=True)
    torch._dynamo.reset()
    for L in (13, 17):
        x = torch.randn(2, L, 6)
        with torch.compiler.set_stance("fail_on_recompile" if L == 17 else "default"):
            y = compiled(x)
        torch.testing.assert_close(y, layer(x), rtol=1e-4, atol=1e-5)
    with torch.compiler.set_stance("fail_on_recompile"):  # the same graph: the guard must not need another one
        for t, bad in [(16, 1e6), (16, 1e30), (9, 1e30), (12, float("nan")), (12, float("inf"))]:
            xb = x.clone(); xb[:, t:] = bad
            early = compiled(xb)[:, :t].detach()
            assert torch.isfinite(early).all(), f"a {bad} from t={t} on made earlier compiled outputs non-finite"
            err = _rel(early, y[:, :t].detach())
            assert err <= 1e-6, f"a {bad} from t={t} on moved earlier compiled outputs by {err:.2e} (relative)"  # observed up to 7.4e-8


COMPILE = {**SMALL, "attention": dict(n_heads=3, max_len=32)}  # notebook 13c's CausalAttention too (it has no step, so not in CONFIGS)


@pytest.mark.parametrize("name", sorted(COMPILE))
def test_torch_compile_two_lengths_without_graph_breaks(name):
    torch.manual_seed(2)
    _compile_two_lengths(LAYERS[name](6, **COMPILE[name]))


@pytest.mark.parametrize("measure", ["legs", "legt", "lagt", "fout"])
def test_s4_step_is_the_dense_bilinear_step(measure):
    "S4.step (O(Nr), Woodbury) equals the step with the dense bilinear (Ad, Bd) in float64 at odd N, where LegT, LagT and FouT have an eigenvalue 0 "
    "(notebook 05's pole case), for steps 1e-3 to 1; 50 steps from zero end in forward's state (observed up to 3.4e-15, 1.5e-15, 7.9e-15)."
    torch.manual_seed(3)
    layer = S4(4, d_state=15, measure=measure).double()
    with torch.no_grad(): layer.log_dt.copy_(torch.log(torch.tensor([1e-3, 1e-2, 1e-1, 1.0])))
    Ad, Bd = layer.discrete()
    x, state = torch.randn(3, 50, 4, dtype=torch.float64), torch.randn(3, 4, 15, dtype=torch.complex128)
    layer.discrete = lambda: pytest.fail("S4.step formed the dense Ad")  # the step must not build the N x N matrices
    y_t, new = layer.step(x[:, 0], state)
    del layer.discrete  # forward with return_state uses them
    ref = (Ad @ state[..., None])[..., 0] + Bd * x[:, 0, :, None]
    assert _rel(new, ref) < 1e-14
    assert _rel(y_t, (torch.view_as_complex(layer.C) * ref).sum(-1).real + layer.D * x[:, 0]) < 1e-14
    _, last = layer(x, return_state=True)
    s = layer.initial_state(3)
    for t in range(50): _, s = layer.step(x[:, t], s)
    assert _rel(s, last) < 2e-14
    # the function on HiPPO's own DPLR form, where the eigenvalue is 0 to rounding (the layer keeps Re < 0)
    Lambda, P, B, _ = dplr(measure, 15)
    Lambda, P, B = (t.expand(3, *t.shape) for t in (Lambda, P.reshape(-1, 15), B))
    dt = torch.tensor([1e-3, 1e-1, 1.0], dtype=torch.float64)
    Ad, Bd = discretize(torch.diag_embed(Lambda) - P.mT @ P.conj(), B, dt, "bilinear")
    xs, us = torch.randn(2, 3, 15, dtype=torch.complex128), torch.randn(2, 3, dtype=torch.float64)
    assert _rel(dplr_bilinear_step(Lambda, P, B, dt, xs, us), (Ad @ xs[..., None])[..., 0] + Bd * us[..., None]) < 1e-14  # observed 3.4e-15


def test_dplr_bilinear_step_gradients_and_precision():
    "gradcheck in float64 (rank 2, LegT); a Python float dt; half-precision u computed in complex64."
    torch.manual_seed(4)
    Lambda, P, B, _ = dplr("legt", 5)
    args = (Lambda, P, B, torch.tensor([0.1, 0.5], dtype=torch.float64),
            torch.randn(3, 2, 5, dtype=torch.complex128), torch.randn(3, 2, dtype=torch.float64))
    args = tuple(a.clone().requires_grad_() for a in args)
    assert torch.autograd.gradcheck(dplr_bilinear_step, args)
    Lambda, P, B, _ = dplr("legs", 6)
    x, u = torch.randn(2, 6, dtype=torch.complex128), torch.randn(2, dtype=torch.float64)
    torch.testing.assert_close(dplr_bilinear_step(Lambda, P, B, 0.05, x, u), dplr_bilinear_step(Lambda, P, B, torch.tensor(0.05, dtype=torch.float64), x, u), rtol=0, atol=0)
    c64 = [t.to(torch.complex64) for t in (Lambda, P, B)]
    half = dplr_bilinear_step(*c64, 0.05, x.to(torch.complex64), u.bfloat16())
    assert half.dtype == torch.complex64
    torch.testing.assert_close(half, dplr_bilinear_step(*c64, 0.05, x.to(torch.complex64), u.bfloat16().float()), rtol=0, atol=0)


_L, _P, _B, _ = dplr("legs", 4)
_X, _U = torch.zeros(2, 4, dtype=torch.complex128), torch.zeros(2)


BAD = [
    (lambda: dplr_bilinear_step(_L.numpy(), _P, _B, 0.1, _X, _U), TypeError, "Lambda must be a torch.Tensor"),
    (lambda: dplr_bilinear_step(_L, _P[..., :3], _B, 0.1, _X, _U), ValueError, r"P must have shape \(\.\.\., N\) with N=4"),
    (lambda: dplr_bilinear_step(_L, _P[0], _B, 0.1, _X, _U), ValueError, r"P must have shape \(\.\.\., r, N\).*write P\[\.\.\., None, :\]"),
    (lambda: dplr_bilinear_step(_L, _P, _B, 0.1, _X[:, :3], _U), ValueError, "x must have shape"),
    (lambda: dplr_bilinear_step(_L, _P, _B, -0.1, _X, _U), ValueError, "dt must be positive"),
    (lambda: dplr_bilinear_step(_L, _P, _B, 0.1, _X, _U.to(torch.complex64)), TypeError, "u must be real"),
    (lambda: dplr_bilinear_step(_L, _P, _B, 0.1, _X, torch.zeros(3)), ValueError, "batch dimensions do not broadcast"),
    (lambda: dplr_bilinear_step(_L, _P, _B, 0.1, _X.to("meta"), _U), ValueError, r"x is on device meta but Lambda is on cpu"),  # follow-up 4: was a raw device error
    (lambda: dplr_bilinear_step(_L, _P, _B, torch.tensor([0.1], device="meta"), _X, _U), ValueError, r"dt is on device meta but Lambda is on cpu"),
    (lambda: S4D(4)(torch.randn(2, 5)), ValueError, "x must have 3 dimension"),
    (lambda: S4D(4)(torch.randn(2, 5, 3)), ValueError, "d_model=4"),
    (lambda: S4D(4)(torch.randint(0, 3, (2, 5, 4))), TypeError, "x must be a real floating-point"),
    (lambda: S4D(4).step(torch.randn(2, 5, 4), S4D(4).initial_state(2)), ValueError, "x_t must have 2 dimension"),
    (lambda: LRU(4)(torch.randn(2, 0, 4)), ValueError, "empty"),
    (lambda: LAYERS["mamba"](4, init="complex"), ValueError, "init"),
    (lambda: S4D(4, init="leg"), ValueError, "init"),
    (lambda: S4D(0), ValueError, "d_model must be at least 1"),
    (lambda: S4D(4, d_state=7), ValueError, "d_state must be even"),
    (lambda: S4D(4, d_state=2.0), TypeError, "d_state must be an integer"),
    (lambda: S4D(4, dt_min=0.1, dt_max=0.01), ValueError, "dt_min"),
    (lambda: S4D(4, dt_min=-1.0), ValueError, "dt_min must be positive"),
    (lambda: LRU(4, d_state=0), ValueError, "d_state must be at least 1"),
    (lambda: LRU(4, r_max=1.5), ValueError, "r_max"),
    (lambda: LRU(4, r_min=0.99, r_max=0.9), ValueError, "r_min"),
    (lambda: LRU(4, max_phase=-1.0), ValueError, "max_phase"),
    (lambda: Mamba(4, dt_rank=0), ValueError, "dt_rank must be at least 1"),
    (lambda: Mamba(4, d_conv=0), ValueError, "d_conv must be at least 1"),
    (lambda: Mamba(4, expand=0), ValueError, "expand must be at least 1"),
    (lambda: S4D(4).initial_state(-1), ValueError, "batch"),
    (lambda: S4D(4).kernel(0), ValueError, "L must be at least 1"),
    (lambda: SequenceModel(3, layer="rnn", d_input=2), ValueError, "layer must be one of"),
    (lambda: SequenceModel(3), ValueError, "vocab_size"),
    (lambda: SequenceModel(3, d_input=2, pool="max"), ValueError, "pool"),
    (lambda: SequenceModel(3, d_input=2, n_layers=0), ValueError, "n_layers"),
    (lambda: SequenceModel(3, vocab_size=5, n_layers=1)(torch.randn(2, 7)), TypeError, "integer token ids"),
    (lambda: SequenceModel(3, vocab_size=5, n_layers=1)(torch.full((2, 7), 5)), ValueError, r"token ids in \[0, 5\)"),
    (lambda: SequenceModel(3, d_input=2, n_layers=1)(torch.randn(2, 7, 3)), ValueError, "2 features"),
    (lambda: SequenceModel(3, d_input=2, n_layers=1)(torch.randint(0, 2, (2, 7, 2))), TypeError, "floating-point"),
]


@pytest.mark.parametrize("call,exc,msg", BAD, ids=[b[2] for b in BAD])
def test_bad_input(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ---- issue 25 ----------------------------------------------------------------------------------------------------------
from ssm_course.layers import DSS
from ssm_course.conv import dss_kernel


def test_dss_layer_computes_dss_exp():
    "DSS's kernel, Re sum_n W_n (e^{lambda dt} - 1)/lambda e^{lambda l dt}, for every channel: against notebook 06's dss_kernel and "
    "against the float64 sum written out (it used B-bar = 1: about 1/dt too large, 86.6 / 116.7 / 18.3 times at dt = 0.0119 / 0.0086 / 0.0533)."
    torch.manual_seed(5)
    layer = DSS(6, d_state=16).double()
    with torch.no_grad(): layer.log_dt.copy_(torch.log(torch.tensor([1e-3, 0.0086, 0.0119, 0.0533, 0.1, 0.5], dtype=torch.float64)))
    L = 300
    with torch.no_grad(): K = layer.kernel(L)
    Lambda = torch.complex(-torch.exp(layer.log_neg_re), layer.im).detach()
    W, dt = torch.view_as_complex(layer.W).detach(), torch.exp(layer.log_dt).detach()
    l = torch.arange(L, dtype=torch.float64)
    for h in range(6):
        ref = dss_kernel(Lambda[h], W[h], dt[h].item(), L, kind="exp")
        z = Lambda[h] * dt[h]
        direct = (W[h, :, None] * torch.expm1(z)[:, None] / Lambda[h, :, None] * torch.exp(z[:, None] * l)).sum(0).real
        assert _rel(K[h], ref) < 1e-13 and _rel(K[h], direct) < 1e-13, h  # observed up to 3.1e-15
    x = torch.randn(2, L, 6, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x)
        conv = torch.stack([torch.stack([(K[h, :t + 1].flip(0) * x[b, :t + 1, h]).sum() for t in range(L)]) for h in range(6) for b in range(2)])
    assert _rel(y - layer.D.detach() * x, conv.view(6, 2, L).permute(1, 2, 0)) < 1e-12  # forward is that convolution (plus D u)


def test_layers_refuse_bad_step_ranges_at_the_constructor():
    "dt_min/dt_max infinite or NaN (S4D(dt_max=inf) was accepted, then failed on the first forward naming an internal dt)."
    for cls in (S4D, S4, DSS, Mamba):
        for kw, msg in [(dict(dt_max=math.inf), "dt_max must be positive and finite"), (dict(dt_min=math.nan), "dt_min must be positive and finite"),
                        (dict(dt_min=math.inf, dt_max=math.inf), "dt_min must be positive and finite"), (dict(dt_max="0.1"), "dt_max must be a real number")]:
            with pytest.raises((ValueError, TypeError), match=msg): cls(4, **kw)


def test_lru_with_zero_radius_is_memoryless():
    "LRU(r_min=r_max=0) gave nu_log = inf; now every |lambda| is the smallest float32 radius (about 1e-19): finite parameters, outputs "
    "equal to the memoryless y_t = Re(C gamma B u_t) + D u_t, finite gradients. r_min = 0 with r_max > 0 (the LRU paper's ListOps setting) too."
    torch.manual_seed(6)
    layer = LRU(4, d_state=6, r_min=0.0, r_max=0.0)
    assert all(torch.isfinite(p).all() for p in layer.parameters())
    assert layer.eigenvalues().abs().max() < 1e-18
    x = torch.randn(2, 9, 4)
    y = layer(x)
    B, C = torch.view_as_complex(layer.B), torch.view_as_complex(layer.C)
    ref = ((x.to(B.dtype) @ B.T) * torch.exp(layer.gamma_log) @ C.T).real + layer.D * x
    assert _rel(y, ref) < 1e-6
    y.square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())
    torch.manual_seed(7)
    with torch.no_grad(): layer.nu_log.copy_(LRU(4, d_state=6, r_min=0.0, r_max=0.5).nu_log)
    assert torch.isfinite(layer.nu_log).all()


def test_sequence_model_step_needs_one_state_per_layer():
    "Fewer (or more) states than layers used to run silently with what it got and return fewer states."
    m = SequenceModel(3, d_model=8, n_layers=3, layer="s4d", vocab_size=5, pool=None, d_state=4)
    x_t, states = torch.randint(0, 5, (2,)), m.initial_state(2)
    for bad in (states[:2], states + states[:1], []):
        with pytest.raises(ValueError, match=rf"states must hold one state per layer: got {len(bad)}, expected 3"): m.step(x_t, bad)
    for bad in (states[0], tuple(states) + (None,), None, iter(states)):
        with pytest.raises((TypeError, ValueError), match="states"): m.step(x_t, bad)
    logits, new = m.step(x_t, tuple(states))  # a tuple of states is fine
    assert logits.shape == (2, 3) and len(new) == 3




@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_mixed_devices_are_refused_by_name(config):
    "x, state and the parameters on different devices: a ValueError naming the argument and both devices (was a custom op's "
    "'Tensor on device meta is not on the expected device cpu')."
    layer = build(config)
    x, state = torch.randn(2, 6, 5), layer.initial_state(2)
    meta_state = (state[0], state[1].to("meta")) if isinstance(state, tuple) else state.to("meta")
    name = r"state\[1\]" if isinstance(state, tuple) else "state"
    calls = [(lambda: layer(x.to("meta")), "x is on device meta"), (lambda: layer(x, state=meta_state), name),
             (lambda: layer.step(x[:, 0].to("meta"), state), "x_t is on device meta"), (lambda: layer.step(x[:, 0], meta_state), name)]
    if isinstance(state, tuple): calls.append((lambda: layer.step(x[:, 0], (state[0].to("meta"), state[1])), r"state\[0\]"))
    for call, msg in calls:
        with pytest.raises(ValueError, match=msg) as e: call()
        assert "device meta" in str(e.value) and "cpu" in str(e.value)
    m = SequenceModel(3, d_model=5, n_layers=1, layer=CONFIGS[config][0], vocab_size=7, **CONFIGS[config][1])
    with pytest.raises(ValueError, match="x is on device meta"): m(torch.randint(0, 7, (2, 6)).to("meta"))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_layers_ignore_the_callers_autocast(config):
    "Under bf16 autocast the SSM layers give exactly what they give without it (forward and step); Mamba's projections run in "
    "bfloat16 by design (its scan in float32), so it matches to bfloat16 rounding (observed 4e-3)."
    torch.manual_seed(8)
    layer = build(config, H=6)
    x = torch.randn(2, 13, 6)
    with torch.no_grad():
        y, (y_t, _) = layer(x), layer.step(x[:, 0], layer.initial_state(2))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ya, (ya_t, _) = layer(x), layer.step(x[:, 0], layer.initial_state(2))
    assert ya.dtype == ya_t.dtype == torch.float32
    if config.startswith("mamba"): assert _rel(ya, y) < 2e-2 and _rel(ya_t, y_t) < 2e-2
    else: assert torch.equal(ya, y) and torch.equal(ya_t, y_t), config


def test_dplr_bilinear_step_under_autocast():
    Lambda, P, B, _ = dplr("legt", 6)
    c64 = [t.to(torch.complex64) for t in (Lambda, P, B)]
    x, u = torch.randn(3, 6, dtype=torch.complex64), torch.randn(3)
    ref = dplr_bilinear_step(*c64, 0.1, x, u)
    with torch.autocast("cpu", dtype=torch.bfloat16): got = dplr_bilinear_step(*c64, 0.1, x, u)
    assert torch.equal(got, ref)


def test_dplr_bilinear_step_rank_axis_is_never_guessed():
    "P's last two axes are always (r, N) (API.md). LegT's rank-2 P (2, N) with two channels' Lambda (2, N) was read as two rank-1 "
    "channels; now it is refused (saying P[None]), and P[None] gives each channel its rank-2 step, equal to the dense bilinear step "
    "(observed 1e-15). A rank-1 P without its axis is refused too (saying P[..., None, :]); S4 stores P as (H, r, N) for both measures."
    torch.manual_seed(10)
    Lambda, P, B, _ = dplr("legt", 6)
    assert P.shape == (2, 6)
    Lambda2, B2 = torch.stack([Lambda, Lambda - 0.3]), B.expand(2, 6)  # two channels
    x, u, dt = torch.randn(2, 6, dtype=torch.complex128), torch.randn(2, dtype=torch.float64), torch.tensor([0.1, 0.7], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"P must have shape \(\.\.\., r, N\).*Lambda \(2, 6\).*P\[None\]"): dplr_bilinear_step(Lambda2, P, B2, dt, x, u)
    Ad, Bd = discretize(torch.diag_embed(Lambda2) - P.mT @ P.conj(), B2, dt, "bilinear")  # each channel: rank 2
    assert _rel(dplr_bilinear_step(Lambda2, P[None], B2, dt, x, u), (Ad @ x[..., None])[..., 0] + Bd * u[..., None]) < 1e-13
    for measure, r in (("legs", 1), ("legt", 2)): assert S4(3, d_state=6, measure=measure).P.shape == (3, r, 6, 2)


@pytest.mark.parametrize("cls", [S4D, DSS])
def test_diagonal_kernel_is_accurate_near_the_unit_circle(cls):
    "|dA| = 1 - 1e-5 and L = 65536 (issue 25 item 8): the float32 layer's kernel within 1e-6 of the sum written out in float64 from the "
    "same parameters (observed 2.3e-7; 1.4e-3 when the kernel raised the complex64 dA to powers), also through forward's free response."
    torch.manual_seed(11)
    layer = cls(2, d_state=4)
    with torch.no_grad(): layer.log_dt.fill_(math.log(0.01)); layer.log_neg_re.fill_(math.log(1e-3))  # Re(dt lambda) = -1e-5
    L = 65536
    z = torch.exp(layer.log_dt.double())[:, None] * torch.complex(-torch.exp(layer.log_neg_re.double()), layer.im.double())  # (H, N/2)
    c128 = lambda p: torch.view_as_complex(p).to(torch.complex128)
    W = c128(layer.W) if cls is DSS else 2 * c128(layer.C) * c128(layer.B)
    dB = torch.expm1(z) / (z / torch.exp(layer.log_dt.double())[:, None])  # ZOH: (e^z - 1)/lambda
    powers = torch.exp(z[..., None] * torch.arange(L, dtype=torch.float64))  # (H, N/2, L)
    ref = ((W * dB)[..., None] * powers).sum(-2).real.detach()
    with torch.no_grad(): K = layer.kernel(L)
    assert K.dtype == torch.float32 and _rel(K, ref) < 1e-6
    x0 = torch.randn(1, 2, 2, dtype=torch.complex64)  # free response of a carried state: scale Re sum C dA^{t+1} x0
    with torch.no_grad(): y = layer(torch.zeros(1, L, 2), state=x0)[0].T
    Cs = c128(layer.W) if cls is DSS else 2 * c128(layer.C)
    free = ((Cs * x0[0].to(torch.complex128))[..., None] * powers * torch.exp(z)[..., None]).sum(-2).real.detach()
    assert _rel(y, free) < 1e-6


from hypothesis import given, settings, strategies as st, HealthCheck
_ODD = [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e-300, 1e-45, 1e-38, 1e-31, 1e-30, 1e-3, 0.5, 1.0, 1.5, 1e30, 1e31, 1e38, 1e300,
        True, "0.1", None, torch.tensor(0.01), 0, 1]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(cls=st.sampled_from([S4D, S4, DSS, Mamba]), dt_min=st.sampled_from(_ODD), dt_max=st.sampled_from(_ODD))
def test_fuzz_step_range_is_refused_or_works(cls, dt_min, dt_max):
    "Fuzz: a constructor either refuses (dt_min, dt_max) with a ValueError/TypeError naming one of them, or builds a layer with finite "
    "parameters whose forward and step are finite. Found: 1e-300 (positive, finite) was accepted and stored as dt = 0 (then 'dt must be "
    "positive' naming an internal dt; Mamba's bias -inf), 1e300 as inf, 1e-38 gave S4 non-finite outputs: steps are now in [1e-30, 1e30]."
    torch.manual_seed(0)
    try: layer = cls(3, d_state=4, dt_min=dt_min, dt_max=dt_max)
    except (ValueError, TypeError) as e:
        assert "dt_min" in str(e) or "dt_max" in str(e), str(e)
        return
    assert all(torch.isfinite(p).all() for p in layer.parameters())
    x = torch.randn(2, 9, 3)
    with torch.no_grad(): y, (y_t, _) = layer(x), layer.step(x[:, 0], layer.initial_state(2))
    assert torch.isfinite(y).all() and torch.isfinite(y_t).all()


_RADII = [math.nan, math.inf, -math.inf, -1e-9, 0.0, 1e-300, 0.5, 0.999, 1 - 2 ** -24, 1 - 1e-9, 1.0, True, "0.5", None, 0]


def test_fuzz_lru_radii_are_refused_or_stable():
    "Fuzz, every pair of odd radii: LRU(r_min, r_max) refuses with an error naming r_min/r_max, or has finite parameters, |lambda| < 1 "
    "in float32, finite outputs and gradients. Found: r_max = 1 - 1e-9 (< 1) gave |lambda| = 1 once stored in float32 (now r_max <= "
    "1 - 2**-24); r_min = r_max = 0 gave nu_log = inf (now |lambda| = 1e-19)."
    for r_min, r_max in itertools.product(_RADII, _RADII):
        torch.manual_seed(0)
        try: layer = LRU(3, d_state=16, r_min=r_min, r_max=r_max)
        except (ValueError, TypeError) as e:
            assert "r_min" in str(e) or "r_max" in str(e), str(e)
            continue
        assert all(torch.isfinite(p).all() for p in layer.parameters()) and layer.eigenvalues().abs().max() < 1, (r_min, r_max)
        y = layer(torch.randn(2, 9, 3))
        y.square().sum().backward()
        assert torch.isfinite(y).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters()), (r_min, r_max)


def test_engine_does_not_import_the_public_module():
    "ssm_course._engine.layers (the layers' checks and precision helpers, nbs/engine/layers.ipynb) is imported by ssm_course.layers, so it must "
    "not import ssm_course.layers itself (a circular import); and the layers' helpers are the engine's objects, not copies."
    import subprocess, sys
    code = ("import sys, ssm_course._engine.layers as E\nassert 'ssm_course.layers' not in sys.modules, 'the engine imported the public module'\n"
            "import ssm_course.layers as L\nassert all(getattr(L, n) is getattr(E, n) for n in ('_check_x', '_check_state', '_f32', '_c', '_cparam', '_no_autocast', '_check_dplr_step'))\n"
            "assert L._check_rope is E._check_rope\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def _saved_bytes(f):
    "Bytes of the distinct storages autograd saves for the backward while f() runs, and f()'s result."
    seen = {}
    def pack(t): seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes(); return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t): out = f()
    return out, sum(seen.values())


def test_s4_training_saves_O_N_plus_L(monkeypatch):
    """Issue 25 follow-up 6 (item 9 for the layer): S4.kernel passes the true C, and autograd saved the dense powers of the
    bilinear Ad forming C~ = C (I - Ad^L): 13 (H, N, N) complex128 tensors, 16.4 MiB at H = 16, N = 64, L = 1024 and 58.6 MiB
    at N = 128. C~ is now recomputed in the backward: 2.39 and 2.50 MiB (no N^2 term), and the output and every parameter's
    gradient are bit for bit those of the kernel that saves the matrices."""
    from ssm_course import conv
    saved, runs = {}, {}
    for N in (64, 128):
        torch.manual_seed(0)
        layer, x = S4(16, N), torch.randn(2, 1024, 16)
        for way in ("recomputed", "kept"):
            with monkeypatch.context() as mp:
                if way == "kept": mp.setattr(conv, "_recomputed", lambda f, *args: f(*args), raising=False)  # autograd records C~'s matrices
                y, saved[N, way] = _saved_bytes(lambda: layer(x))
                runs[N, way] = (y,) + torch.autograd.grad(y.square().sum(), list(layer.parameters()))
        assert all(torch.equal(a, b) for a, b in zip(runs[N, "recomputed"], runs[N, "kept"])), N
    assert saved[64, "kept"] > 4.5 * 2**20 and saved[128, "kept"] > 7.5 * 2**20  # kept: 5.03, 8.35 MiB (C~'s low-rank powers, issue 32; the dense powers were 16.7, 58.9)
    assert saved[64, "recomputed"] < 3 * 2**20 and saved[128, "recomputed"] < 1.1 * saved[64, "recomputed"]  # observed 2.64, 2.75 MiB


def test_initial_state_of_a_model_without_recurrent_form():
    "Follow-up 7: SequenceModel(layer='attention').initial_state(1) raised AttributeError ('CausalAttention' object has no attribute "
    "'initial_state'); now the TypeError step gives, naming the layer. Recurrent models are unchanged."
    m = SequenceModel(3, d_model=6, n_layers=2, layer="attention", d_input=2, n_heads=2)
    with pytest.raises(TypeError, match=r"CausalAttention has no step\(\) or initial_state\(\): only recurrent layers can run step by step"): m.initial_state(1)
    m.pool = None
    with pytest.raises(TypeError, match=r"CausalAttention has no step\(\) or initial_state\(\)"): m.step(torch.randn(1, 2), [None, None])
    s = SequenceModel(3, d_model=6, n_layers=2, layer="lru", d_input=2).initial_state(2)
    assert len(s) == 2 and all(torch.equal(t, torch.zeros(2, 6, dtype=torch.complex64)) for t in s)


def test_initialization_against_the_reference_code():
    """Issue 28 item 16, lesson 12's 'Against the reference code': S4D's and S4's C have E|C|^2 = 1/2 (state-spaces/s4's
    torch.randn(..., dtype=cfloat): 1), DSS's W 2; Mamba's dt_proj.weight is nn.Linear's default, which is mamba_ssm's
    U(-dt_rank^-1/2, dt_rank^-1/2) draw number for number; no dt_init_floor; SequenceModel keeps PyTorch's defaults
    (out_proj bound 1/sqrt(d_inner) at any depth, N(0, 1) embedding, random biases), not MixerModel's _init_weights."""
    from ssm_course.layers import DSS
    from ssm_course._engine.layers import _c
    torch.manual_seed(0)
    for layer, attr, expected in [(S4D(512, 64), "C", 0.5), (S4(128, 64), "C", 0.5), (DSS(256, 64), "W", 2.0)]:
        m2 = _c(getattr(layer, attr)).abs().square().mean().item()  # 8192-16384 entries: standard error <= 1.1%
        assert abs(m2 - expected) < 0.04 * expected, (type(layer).__name__, m2)
    assert abs(torch.randn(16384, dtype=torch.complex64).abs().square().mean().item() - 1) < 0.04  # what s4 draws
    m = Mamba(256)  # d_inner 512, dt_rank 16: 8192 weights
    r, w = m.dt_rank, m.dt_proj.weight.detach().double()
    assert w.abs().max() <= r ** -0.5 and abs(w.var().item() * 3 * r - 1) < 0.05  # U(-b, b) with b = r^-1/2: variance b^2/3
    torch.manual_seed(1); default = torch.nn.Linear(r, 512).weight
    torch.manual_seed(1); mambas = torch.nn.init.uniform_(torch.empty(512, r), -r ** -0.5, r ** -0.5)
    assert torch.equal(default, mambas)
    import torch.nn.functional as F
    assert F.softplus(Mamba(8, dt_min=1e-6, dt_max=1e-5).dt_proj.bias.double()).max() < 1e-4  # mamba_ssm would clamp these to 1e-4
    model = SequenceModel(5, d_model=64, n_layers=4, layer="mamba", vocab_size=11)
    assert all(abs(l.out_proj.weight.abs().max().item() * math.sqrt(l.d_inner) - 1) < 1e-3 for l in model.layers)  # mamba_ssm: 1/sqrt(4)
    assert abs(model.encoder.weight.std().item() - 1) < 0.1 and model.head.bias.abs().min() > 0  # mamba_ssm: 0.02 and 0


def test_lru_scan_takes_the_toeplitz_path_only_without_the_compiled_loop(monkeypatch):
    """Lesson 12's Summary: LRU.forward hands its constant decay to scan as a (N, 1); on a CPU with numba installed scan runs the
    compiled loop, and only without it (_loop None: PyTorch's path) the chunked scan whose local scans are one product with the
    Toeplitz block of powers (_scan_lti). Both equal the float64 loop of the recurrence."""
    import ssm_course.scan as S
    if S._loop is None: pytest.skip("numba is not installed: the compiled loop is absent")
    real, calls = S._scan_lti, []
    monkeypatch.setattr(S, "_scan_lti", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    torch.manual_seed(0)
    lru, x = LRU(4, 6), torch.randn(2, 50, 4)
    with torch.no_grad():
        lru64 = copy.deepcopy(lru).double()
        ref = steps(lru64, x.double(), lru64.initial_state(2))[0]  # the recurrence, one step at a time, float64
        y_loop = lru(x)
        assert not calls
        monkeypatch.setattr(S, "_loop", None)
        y_lti = lru(x)
    assert calls and calls[0] == (6, 1)  # the decay, once per state
    assert _rel(y_loop, ref) < 5e-7 and _rel(y_lti, ref) < 5e-7  # observed 2.8e-7 and 3.0e-7


# ---- issue 31 item 14: mixed dtypes -------------------------------------------------------------------------------------
# The rule (engine/layers, 'Mixed precisions'): a layer computes in its parameters' precision; bfloat16 and float16 count as
# float32 (a half-precision input to a float32 layer is computed in float32 and its output rounded once to the input's dtype);
# float32 and float64 never mix: a TypeError naming both dtypes and both conversions, as nn.Linear refuses them.
MIXED = sorted(CONFIGS) + ["attention"]


def _layer(config, H=6):
    if config != "attention": return build(config, H)
    torch.manual_seed(0)
    return LAYERS["attention"](H, n_heads=2)


def _outputs(layer, x):
    "forward, and a step from the zero state where the layer has one."
    with torch.no_grad():
        return (layer(x),) + ((layer.step(x[:, 0], layer.initial_state(x.shape[0]))[0],) if hasattr(layer, "step") else ())


@pytest.mark.parametrize("config", MIXED)
def test_float32_and_float64_do_not_mix(config):
    "A float64 layer given float32 (or bfloat16) input returned float32, a float32 (or bfloat16) layer given float64 input returned "
    "float64 computed from float32 parameters; now forward and step raise a TypeError naming both dtypes and both conversions."
    f32 = _layer(config)
    x = torch.randn(2, 7, 6)
    for layer, inp, p, to_layer, to_x in [(copy.deepcopy(f32).double(), x, "float64", "float32", "float64"),
                                          (f32, x.double(), "float32", "float64", "float32"),
                                          (copy.deepcopy(f32).double(), x.bfloat16(), "float64", "float32", "float64"),
                                          (copy.deepcopy(f32).bfloat16(), x.double(), "bfloat16", "float64", "float32")]:
        msg = rf"is {inp.dtype} but the layer's parameters are torch.{p}: .*layer.to\(torch.{to_layer}\), or x(_t)?.to\(torch.{to_x}\)"
        with pytest.raises(TypeError, match="x " + msg): layer(inp)
        if hasattr(layer, "step"):
            with pytest.raises(TypeError, match="x_t " + msg): layer.step(inp[:, 0], layer.initial_state(2))


@pytest.mark.parametrize("config", MIXED)
def test_half_input_to_a_float32_layer_is_computed_in_float32(config):
    "bfloat16/float16 input to a float32 layer: the output has the input's dtype and is the float32 result rounded once (bit for bit), "
    "within half an ulp of the half type (plus float32 rounding) of the float64 layer on the same input; a bfloat16 layer given float32 "
    "input returns float32. Under bf16 autocast a float32 layer takes the bfloat16 output of an nn.Linear (what autocast hands it)."
    f32 = _layer(config)
    f64 = copy.deepcopy(f32).double()
    x = torch.randn(2, 7, 6)
    for half in (torch.bfloat16, torch.float16):
        xh = x.to(half)
        for y, y32, y64 in zip(_outputs(f32, xh), _outputs(f32, xh.float()), _outputs(f64, xh.double())):
            assert y.dtype == half and torch.equal(y, y32.to(half)), (config, half)
            tol = torch.finfo(half).eps / 2 * y64.abs() + 1e-5 * y64.abs().max()  # observed float32 error below 1e-6 of the largest output
            assert ((y.double() - y64).abs() <= tol).all(), (config, half)
    assert all(y.dtype == torch.float32 for y in _outputs(copy.deepcopy(f32).bfloat16(), x))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.nn.Linear(6, 6)(x)
        assert h.dtype == torch.bfloat16 and f32(h).dtype == torch.bfloat16


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_state_must_have_the_layers_precision(config):
    "A float32 layer's state (complex64) carried into a float64 layer, or a complex128 state into a float32 layer, was promoted "
    "silently (the new state in the other precision); now a TypeError naming the state, for forward and step."
    f32 = build(config)
    f64, x = copy.deepcopy(f32).double(), torch.randn(2, 6, 5)
    s32, s64 = f32.initial_state(2), f64.initial_state(2)
    name = r"state\[0\] \(the convolution state\)" if isinstance(s32, tuple) else "state"
    for layer, inp, state in [(f64, x.double(), s32), (f32, x, s64)]:
        msg = rf"{name} is torch.\w+ but the layer's parameters are {layer.D.dtype}"
        with pytest.raises(TypeError, match=msg): layer(inp, state=state)
        with pytest.raises(TypeError, match=msg): layer.step(inp[:, 0], state)
    if isinstance(s32, tuple):  # Mamba: each half of the pair
        with pytest.raises(TypeError, match=r"state\[1\] \(the SSM state\) is torch.\w+ but .*state\[1\].to\(torch.(float32|complex64)\)"): f32(x, state=(s32[0], s64[1]))


@pytest.mark.parametrize("layer", ["s4d", "mamba"])
def test_sequence_model_follows_the_layers_precision_rule(layer):
    "SequenceModel with real inputs: float32/float64 mismatches raised nn.Linear's RuntimeError ('mat1 and mat2 must have the same "
    "dtype'), a TypeError now; a half-precision input raised it too, now it is converted to the model's dtype (logits float32, equal "
    "to the model on the input converted to float32), in forward and step. Token models are unchanged (a float64 model: float64 logits)."
    torch.manual_seed(0)
    m = SequenceModel(3, d_model=6, n_layers=2, layer=layer, d_input=2, pool=None, d_state=4)
    m64, x = copy.deepcopy(m).double(), torch.randn(2, 5, 2)
    for model, inp, p in [(m64, x, "float64"), (m, x.double(), "float32"), (m64, x.bfloat16(), "float64")]:
        with pytest.raises(TypeError, match=rf"x is {inp.dtype} but the model's parameters are torch.{p}"): model(inp)
        with pytest.raises(TypeError, match=rf"x_t is {inp.dtype} but the model's parameters are torch.{p}"): model.step(inp[:, 0], model.initial_state(2))
    with torch.no_grad():
        for half in (torch.bfloat16, torch.float16):
            xh = x.to(half)
            y, y_t = m(xh), m.step(xh[:, 0], m.initial_state(2))[0]
            assert y.dtype == y_t.dtype == torch.float32 and torch.equal(y, m(xh.float())) and torch.equal(y_t, m.step(xh[:, 0].float(), m.initial_state(2))[0])
        tokens = SequenceModel(3, d_model=6, n_layers=1, layer=layer, vocab_size=5, d_state=4).double()
        assert tokens(torch.randint(0, 5, (2, 5))).dtype == torch.float64
