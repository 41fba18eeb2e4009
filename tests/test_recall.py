"""ssm_course.layers additions of notebook 13c: CausalAttention (SequenceModel(layer="attention")), rope, mimetic_init_."""
import copy, math, pytest, torch
import torch.nn.functional as F
from ssm_course.layers import LAYERS, CausalAttention, Mamba, SequenceModel, mimetic_init_, rope


def naive(layer, x):
    "The layer written out: positions, projections, masked softmax per head, output projection (float64)."
    b, L, H = x.shape
    h = x + layer.pos[:L] if layer.positions == "learned" else x
    q, k, v = layer.qkv(h).view(b, L, 3, layer.n_heads, H // layer.n_heads).permute(2, 0, 3, 1, 4)
    if layer.positions == "rope": q, k = rope(q), rope(k)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return layer.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(b, L, H))


@pytest.mark.parametrize("positions", ["learned", "rope", None])
@pytest.mark.parametrize("L", [1, 7, 33])
def test_attention_matches_the_formula(positions, L):
    torch.manual_seed(0)
    layer = CausalAttention(12, n_heads=3, positions=positions, max_len=40).double()
    x = torch.randn(2, L, 12, dtype=torch.float64)
    with torch.no_grad(): torch.testing.assert_close(layer(x), naive(layer, x), rtol=1e-12, atol=1e-12)


def test_rope_is_a_rotation_by_position_times_frequency():
    "Independent reference: feature pairs (i, i + d/2) as complex numbers multiplied by e^{i t theta_i}."
    x = torch.randn(3, 9, 8, dtype=torch.float64)
    z = torch.complex(x[..., :4], x[..., 4:])
    theta = 10000.0 ** (-torch.arange(4, dtype=torch.float64) / 4)
    zr = z * torch.exp(1j * torch.arange(9, dtype=torch.float64)[:, None] * theta)
    torch.testing.assert_close(rope(x), torch.cat([zr.real, zr.imag], -1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))  # a rotation keeps the norm


@pytest.mark.parametrize("positions", ["learned", "rope", None])
def test_attention_is_causal_with_nan_later(positions):
    torch.manual_seed(1)
    layer = CausalAttention(8, n_heads=2, positions=positions, max_len=32)
    x = torch.randn(2, 20, 8)
    with torch.no_grad():
        clean = layer(x)[:, :12]
        xb = x.clone(); xb[:, 12] = float("nan"); xb[:, 19] = 1e6
        y = layer(xb)
    assert torch.isfinite(y[:, :12]).all() and torch.isnan(y[:, 12:]).all()  # NaN from the bad input on, not hidden
    torch.testing.assert_close(y[:, :12], clean, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        xh = x.clone(); xh[:, 15] = 1e6  # huge but finite: outputs before 15 unchanged, all finite
        yh = layer(xh)
    assert torch.isfinite(yh).all()
    torch.testing.assert_close(yh[:, :15], layer(x)[:, :15], rtol=1e-6, atol=1e-6)


def test_learned_positions_beyond_the_trained_length_get_no_gradient():
    "Training at length L updates only the table's first L rows: the mechanism behind notebook 13c's length generalization."
    torch.manual_seed(2)
    m = SequenceModel(4, d_model=8, n_layers=2, layer="attention", vocab_size=5, pool=None, n_heads=2, max_len=32)
    m(torch.randint(0, 5, (3, 10))).square().mean().backward()
    for layer in m.layers:
        g = layer.pos.grad
        assert g[:10].abs().sum(-1).min() > 0 and torch.equal(g[10:], torch.zeros_like(g[10:]))


def test_sequence_model_attention_shapes_and_no_step():
    m = SequenceModel(6, d_model=16, n_layers=2, layer="attention", vocab_size=9, pool=None, max_len=20)
    assert LAYERS["attention"] is CausalAttention
    assert m(torch.randint(0, 9, (2, 20))).shape == (2, 20, 6)
    with pytest.raises(TypeError, match="step"): m.step(torch.randint(0, 9, (2,)), [None, None])
    with pytest.raises(ValueError, match="longer than the learned position table"): m(torch.randint(0, 9, (2, 21)))
    for positions in ("rope", None):  # no table: longer than the default max_len
        m = SequenceModel(6, d_model=8, n_layers=1, layer="attention", vocab_size=9, pool="last", n_heads=2, positions=positions)
        assert m(torch.randint(0, 9, (1, 1100))).shape == (1, 6)


def test_attention_in_bfloat16_is_within_its_rounding():
    "A bfloat16 layer gives bfloat16 output within bfloat16 rounding of the same weights in float32 (observed 2.5e-3; that SDPA itself runs in float32 is test_attention_under_autocast_runs_in_float32's)."
    torch.manual_seed(3)
    layer = CausalAttention(16, n_heads=4, positions="rope").bfloat16()
    x = torch.randn(2, 30, 16).bfloat16()
    ref = copy.deepcopy(layer).float()(x.float())
    y = layer(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert (y.float() - ref).abs().max() < 5e-3 * ref.abs().max()


def test_attention_under_autocast_runs_in_float32(monkeypatch):
    "Under bf16 autocast the projections run in bfloat16 and the attention itself in float32 (autocast would cast SDPA down)."
    seen = []
    sdpa = F.scaled_dot_product_attention
    def spy(q, k, v, **kw):
        out = sdpa(q, k, v, **kw); seen.append((q.dtype, out.dtype)); return out
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    layer = CausalAttention(16, n_heads=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(torch.randn(2, 9, 16))
    assert seen == [(torch.float32, torch.float32)] and y.dtype == torch.float32 and torch.isfinite(y).all()


@pytest.mark.parametrize("make, exc, match", [
    (lambda: CausalAttention(10, n_heads=4), ValueError, "divisible by n_heads"),
    (lambda: CausalAttention(12, n_heads=4, positions="rope"), ValueError, "even head dimension"),
    (lambda: CausalAttention(8, positions="alibi"), ValueError, "positions"),
    (lambda: CausalAttention(0), ValueError, "d_model must be at least 1"),
    (lambda: CausalAttention(8, max_len=2.5), TypeError, "max_len must be an integer"),
    (lambda: CausalAttention(8)(torch.randn(2, 5)), ValueError, "x must have 3 dimension"),
    (lambda: CausalAttention(8)(torch.randn(2, 5, 7)), ValueError, "d_model=8"),
])
def test_attention_bad_input(make, exc, match):
    with pytest.raises(exc, match=match): make()


def test_attention_does_not_modify_its_input():
    x = torch.randn(2, 9, 8); x0 = x.clone()
    CausalAttention(8, n_heads=2)(x)
    assert torch.equal(x, x0)


def test_mimetic_init_sets_a_and_ties_c_to_b():
    torch.manual_seed(5)
    model = SequenceModel(4, d_model=8, n_layers=3, layer="mamba", vocab_size=6, pool=None, d_state=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert mimetic_init_(model, a=0.02) is model
    for i, layer in enumerate(model.layers):
        r, n = layer.dt_rank, layer.d_state
        torch.testing.assert_close(layer.A(), torch.full((16, 5), -0.02))
        W = layer.x_proj.weight
        assert torch.equal(W[r + n:], W[r:r + n]) and torch.equal(W[:r + n], before[f"layers.{i}.x_proj.weight"][:r + n])
        _, B, C = layer._ssm_inputs(torch.randn(2, 7, 16))
        torch.testing.assert_close(C, B, rtol=1e-6, atol=1e-7)  # the same rows (matmul blocking may round them differently)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {f"layers.{i}.{p}" for i in range(3) for p in ("A_log", "x_proj.weight")}


def test_mimetic_matrix_has_a_nonnegative_diagonal_and_slow_decay():
    "With C = B the diagonal of Mamba's matrix, sum_n C_tn B_tn Delta_t, is >= 0; with A = -a the decay over L steps is >= e^{-a sum Delta}."
    torch.manual_seed(6)
    layer = mimetic_init_(Mamba(8, d_state=6))
    xc = torch.randn(2, 16, 20)
    delta, B, C = layer._ssm_inputs(xc.transpose(1, 2))
    delta = F.softplus(delta + layer.dt_proj.bias)
    diag = (C * B).sum(-1)[..., None] * delta  # (b, L, d)
    assert (diag >= 0).all()
    assert torch.exp(layer.A()[None] * delta.sum(1)[..., None]).min() > 0.97  # 20 steps with Delta < ~0.15


@pytest.mark.parametrize("make, exc, match", [
    (lambda: mimetic_init_(Mamba(4, init="lin")), ValueError, "real A"),
    (lambda: mimetic_init_(torch.nn.Linear(3, 3)), TypeError, "Mamba"),
    (lambda: mimetic_init_(Mamba(4), a=0.0), ValueError, "a must be positive"),
    (lambda: mimetic_init_(Mamba(4), a=float("nan")), ValueError, "a must be positive"),
    (lambda: mimetic_init_(Mamba(4), a=True), TypeError, "a must be a real number"),
    (lambda: mimetic_init_(Mamba(4), a="0.1"), TypeError, "a must be a real number"),
    (lambda: Mamba(4, init="mimetc"), ValueError, "init must be one of"),
])
def test_mimetic_bad_input(make, exc, match):
    with pytest.raises(exc, match=match): make()


def test_mamba_init_mimetic_is_mimetic_init_applied_to_the_default():
    "Mamba(init='mimetic') == mimetic_init_(Mamba()) under the same seed: real A, then A_n = -0.01 and C's rows = B's rows."
    torch.manual_seed(7); a = Mamba(4, d_state=5, init="mimetic")
    torch.manual_seed(7); b = mimetic_init_(Mamba(4, d_state=5))
    assert not a.complex and a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    torch.manual_seed(8); m = SequenceModel(3, d_model=8, n_layers=2, layer="mamba", vocab_size=5, pool=None, d_state=4, init="mimetic")
    assert all(torch.equal(layer.A(), torch.full((16, 4), -0.01)) for layer in m.layers)


@pytest.mark.parametrize("kw", [dict(n_pairs=4, V=8), dict(n_pairs=1, V=1), dict(n_pairs=8, V=8)])
def test_multi_query_recall_contract(kw):
    "Reproducible, shaped (n, 3 n_pairs); every key queried once after the pairs; each target is the value stored after that key."
    from ssm_course.tasks import IGNORE, multi_query_recall
    x, y = multi_query_recall(6, g=torch.Generator().manual_seed(1), **kw)
    x2, y2 = multi_query_recall(6, g=torch.Generator().manual_seed(1), **kw)
    n, V = kw["n_pairs"], kw["V"]
    assert torch.equal(x, x2) and torch.equal(y, y2) and x.shape == y.shape == (6, 3 * n)
    keys, vals = x[:, 0:2 * n:2], x[:, 1:2 * n:2]
    assert (keys < V).all() and (vals >= V).all() and (vals < 2 * V).all() and (y[:, :2 * n] == IGNORE).all()
    assert all(len(set(k.tolist())) == n for k in keys) and torch.equal(x[:, 2 * n:].sort(-1).values, keys.sort(-1).values)
    for xi, yi, k, v in zip(x, y, keys, vals):
        table = dict(zip(k.tolist(), (v - V).tolist()))
        assert [table[q] for q in xi[2 * n:].tolist()] == yi[2 * n:].tolist()


@pytest.mark.parametrize("kw, exc, match", [
    (dict(n_pairs=9, V=8), ValueError, "n_pairs must be at most V"),
    (dict(n_pairs=0), ValueError, "n_pairs must be at least 1"),
    (dict(n_pairs=2.0), TypeError, "n_pairs must be an integer"),
    (dict(V=True), TypeError, "V must be an integer"),
])
def test_multi_query_recall_bad_input(kw, exc, match):
    from ssm_course.tasks import multi_query_recall
    with pytest.raises(exc, match=match): multi_query_recall(3, **kw)


# ---- issue 25 ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, exc, match", [
    (lambda: rope(torch.randn(2, 5, 7)), ValueError, r"head dimension d_h, which must be even .* got d_h = 7"),  # returned a (2, 5, 8) tensor
    (lambda: rope(torch.randn(5)), ValueError, "x must have at least 2 dimension"),
    (lambda: rope(torch.randint(0, 3, (5, 4))), TypeError, "x must be a real floating-point"),
    (lambda: rope(torch.randn(5, 4), base=0.0), ValueError, "base must be positive and finite"),
    (lambda: rope(torch.randn(5, 4), base=math.inf), ValueError, "base must be positive and finite"),
    (lambda: rope(torch.randn(5, 4), base="1e4"), TypeError, "base must be a real number"),
])
def test_rope_bad_input(call, exc, match):
    with pytest.raises(exc, match=match): call()


def test_rope_and_attention_ignore_the_callers_autocast():
    "rope computes in its input's precision whatever the autocast (bit-identical); CausalAttention as documented: projections "
    "in bfloat16 under autocast, attention in float32, float32 out (within bfloat16 rounding of the float32 run, observed 5e-3)."
    torch.manual_seed(9)
    x = torch.randn(2, 3, 17, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16): got = rope(x)
    assert got.dtype == torch.float32 and torch.equal(got, rope(x))
    layer = CausalAttention(16, n_heads=4, positions="rope")
    x = torch.randn(2, 11, 16)
    with torch.no_grad():
        ref = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16): y = layer(x)
    assert y.dtype == torch.float32 and (y - ref).abs().max() < 2e-2 * ref.abs().max()


def test_attention_refuses_mixed_devices_by_name():
    with pytest.raises(ValueError, match="x is on device meta but the layer's parameters are on cpu"):
        CausalAttention(8, n_heads=2)(torch.randn(2, 5, 8, device="meta"))
