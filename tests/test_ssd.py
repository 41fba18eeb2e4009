"""ssm_course.ssd against Mamba-2's own minimal reference: the argument conventions notebook 09 states.

Notebook 09 says that `ssd` takes mamba_ssm's `mamba_chunk_scan_combined` arguments with their layouts and meaning,
and that its chunked algorithm is the four steps of `ssd_minimal_discrete`. Here that is checked against an
independent transcription of that listing, called the way mamba_ssm's own test calls it:
`ssd_minimal_discrete(x * dt.unsqueeze(-1), A * dt, B, C, chunk_size)` against `mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size)`.
"""
import pytest, torch
import torch.nn.functional as F
from ssm_course.ssd import ssd, ssd_ref


# ---- Transcription of Mamba-2's minimal SSD (not ssm_course code) --------------------------------------------------
# Dao & Gu (2024), "Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured State Space
# Duality", ICML 2024, Listing 1, as published in state-spaces/mamba, mamba_ssm/modules/ssd_minimal.py (whose docstring
# says "This is the same as Listing 1 from the paper"; `segsum` and `ssd_minimal_discrete`, Copyright (c) 2024, Albert Gu
# and Tri Dao, Apache-2.0), read at commit e9594ce (the file last changed in a70e3d8, June 2024).
# Transcribed line by line; the changes: einops' rearrange/repeat are written with reshape/permute/expand (einops is not
# a dependency of this project) and `segsum` is renamed `segsum_listing` (ssm_course.ssd has its own). Comments
# marked "listing:" are the original's.

def segsum_listing(x):
    "listing: More stable segment sum calculation."
    T = x.size(-1)
    x = x[..., None].expand(*x.shape, T)  # repeat(x, "... d -> ... d e", e=T)
    mask = torch.tril(torch.ones(T, T, device=x.device, dtype=bool), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    x_segsum = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(T, T, device=x.device, dtype=bool), diagonal=0)
    x_segsum = x_segsum.masked_fill(~mask, -torch.inf)
    return x_segsum


def ssd_minimal_discrete(X, A, B, C, block_len, initial_states=None):
    """listing: X (batch, length, n_heads, d_head), A (batch, length, n_heads), B and C (batch, length, n_heads, d_state);
    returns Y (batch, length, n_heads, d_head) and the final state (batch, n_heads, d_head, d_state).
    initial_states, if given, is (batch, 1, n_heads, d_head, d_state) (it is concatenated to the chunk states on dim 1)."""
    assert X.dtype == A.dtype == B.dtype == C.dtype
    assert X.shape[1] % block_len == 0

    # listing: Rearrange into blocks/chunks -- rearrange(x, "b (c l) ... -> b c l ...", l=block_len)
    X, A, B, C = [x.reshape(x.shape[0], x.shape[1] // block_len, block_len, *x.shape[2:]) for x in (X, A, B, C)]

    A = A.permute(0, 3, 1, 2)  # rearrange(A, "b c l h -> b h c l")
    A_cumsum = torch.cumsum(A, dim=-1)

    # listing: 1. Compute the output for each intra-chunk (diagonal blocks)
    L = torch.exp(segsum_listing(A))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)

    # listing: 2. Compute the state for each intra-chunk
    # (right term of low-rank factorization of off-diagonal blocks; B terms)
    decay_states = torch.exp((A_cumsum[:, :, :, -1:] - A_cumsum))
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)

    # listing: 3. Compute the inter-chunk SSM recurrence; produces correct SSM states at chunk boundaries
    # (middle term of factorization of off-diag blocks; A terms)
    if initial_states is None:
        initial_states = torch.zeros_like(states[:, :1])
    states = torch.cat([initial_states, states], dim=1)
    decay_chunk = torch.exp(segsum_listing(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]

    # listing: 4. Compute state -> output conversion per chunk
    # (left term of low-rank factorization of off-diagonal blocks; C terms)
    state_decay_out = torch.exp(A_cumsum)
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, state_decay_out)

    # listing: Add output of intra-chunk and inter-chunk terms (diagonal and off-diagonal blocks)
    Y = Y_diag + Y_off
    Y = Y.reshape(Y.shape[0], -1, *Y.shape[3:])  # rearrange(Y, "b c l h p -> b (c l) h p")
    return Y, final_state
# ---- end of the transcription ---------------------------------------------------------------------------------------


def listing_call(x, dt, A, B, C, chunk_size, D=None, initial_states=None):
    """`mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D, initial_states=...)` as the listing computes it: mamba_ssm's
    test passes X = x dt and A = A dt; B and C of group j serve heads j h/g ... (j+1) h/g - 1, as mamba_ssm's
    chunk_scan_ref repeats them (repeat(B, "b l g n -> b l (g h) n")); D adds x D (chunk_scan_ref: out + x * D)."""
    h, g = x.shape[2], B.shape[2]
    Bh, Ch = B.repeat_interleave(h // g, dim=2), C.repeat_interleave(h // g, dim=2)
    y, final = ssd_minimal_discrete(x * dt.unsqueeze(-1), A * dt, Bh, Ch, chunk_size,
                                    None if initial_states is None else initial_states[:, None])
    if D is not None: y = y + x * D[:, None]
    return y, final


def make(seed, b, l, h, p, g, n):
    "Mamba-2 inputs drawn as in mamba_ssm's test (A = -exp(rand), dt = softplus(randn - 4) there; randn - 1 here, so that decays matter over these short lengths)."
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    return dict(x=r(b, l, h, p), dt=F.softplus(r(b, l, h) - 1), A=-torch.exp(torch.rand(h, generator=gen, dtype=torch.float64)),
                B=r(b, l, g, n), C=r(b, l, g, n)), dict(D=r(h), initial_states=r(b, h, p, n))


# (b, l, h, p, g, n, Q): odd lengths that are multiples of the chunk (the listing needs one), one chunk, Q = 1, several
# heads and groups, and mamba_ssm's test shape scaled down (one group, p = n = 16, several chunks).
SHAPES = [(2, 45, 4, 3, 2, 5, 15), (1, 63, 6, 2, 3, 4, 9), (2, 21, 2, 3, 1, 3, 21), (1, 7, 3, 2, 3, 2, 1), (1, 64, 4, 16, 1, 16, 16)]
TOL = dict(rtol=0, atol=3e-14)  # observed: at most 8.9e-15 absolute (outputs and final states up to 30 in size)
GRAD_TOL = dict(rtol=0, atol=5e-14)  # observed: at most 1.8e-14 absolute (gradients up to 42 in size)


@pytest.mark.parametrize("b, l, h, p, g, n, Q", SHAPES)
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "D+initial_states"])
def test_ssd_matches_mamba2_minimal_listing(b, l, h, p, g, n, Q, extras):
    "Notebook 09's conventions: ssd and ssd_ref on mamba_chunk_scan_combined's arguments = ssd_minimal_discrete(x dt, A dt, B, C)."
    kw, more = make(l * 7 + Q, b, l, h, p, g, n)
    if extras: kw.update(more)
    y_min, final_min = listing_call(**kw, chunk_size=Q)
    assert torch.isfinite(y_min).all() and y_min.abs().max() > 0.1  # a non-trivial output to compare
    for f, chunk in ((ssd, Q), (ssd, 8), (ssd_ref, Q)):  # ssd's chunk need not be the listing's
        y, final = f(**kw, chunk_size=chunk, return_final_states=True)
        torch.testing.assert_close(y, y_min, **TOL, msg=lambda m: f"{f.__name__} chunk={chunk}: {m}")
        torch.testing.assert_close(final, final_min, **TOL, msg=lambda m: f"{f.__name__} chunk={chunk} final: {m}")


def test_gradients_match_mamba2_minimal_listing():
    "The same conventions under autograd: dt enters both X = x dt and A dt, so its gradient checks both at once."
    kw, more = make(5, 2, 27, 4, 3, 2, 5)
    kw.update(more)
    w = torch.randn(2, 27, 4, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    grads = []
    for f in (lambda **a: listing_call(**a, chunk_size=9), lambda **a: ssd(**a, chunk_size=9, return_final_states=True),
              lambda **a: ssd_ref(**a, return_final_states=True)):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
        y, final = f(**leaves)
        ((y * w).sum() + final.square().sum()).backward()
        grads.append({k: v.grad for k, v in leaves.items()})
    for name, got in zip(("ssd", "ssd_ref"), grads[1:]):
        for k in kw: torch.testing.assert_close(got[k], grads[0][k], **GRAD_TOL, msg=lambda m: f"{name} d/d{k}: {m}")


def test_transcription_is_not_vacuous():
    "The listing as transcribed does react to the conventions: the undiscretized input (X = x, not x dt) or groups mapped the other way round give another answer."
    kw, _ = make(1, 1, 45, 4, 3, 2, 5)
    y = ssd(**kw, chunk_size=15)
    y_min, _ = listing_call(**kw, chunk_size=15)
    torch.testing.assert_close(y, y_min, **TOL)
    x, dt, A, B, C = kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"]
    undiscretized, _ = ssd_minimal_discrete(x, A * dt, B.repeat_interleave(2, 2), C.repeat_interleave(2, 2), 15)
    interleaved, _ = ssd_minimal_discrete(x * dt[..., None], A * dt, B.repeat(1, 1, 2, 1), C.repeat(1, 1, 2, 1), 15)  # head i -> group i % g
    assert (undiscretized - y).abs().max() > 0.1 and (interleaved - y).abs().max() > 0.1


# ---- issue 25: growing states, causality, dt = 0, seq_idx, chunk cap, autocast, devices, torch.func ------------------
import math
from hypothesis import given, settings, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from ssm_course.ssd import ssd_quadratic, segsum


def rel(x, ref): return ((x.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("A", [1.5, 3.0])
def test_ssd_growing_state_past_float32_within_a_chunk(A):
    "Issue 25 item 3: with chunk_size 64, A = 1.5 and 3 (dt = 1) make a chunk's decay factor e^96 and e^192, past float32: 1,446 and 1,626 NaN; ssd now shortens its chunk (dt A x chunk <= 44) and gives the float64 loop's answer (observed 1.1e-7, 2.6e-8)."
    gen = torch.Generator().manual_seed(4)
    l = 300
    x = torch.zeros(1, l, 2, 3); x[:, -5:] = torch.randn(1, 5, 2, 3, generator=gen)  # input at the last 5 steps only: the loop's output is finite
    kw = dict(x=x, dt=torch.ones(1, l, 2), A=torch.tensor([A, A]), B=torch.randn(1, l, 1, 4, generator=gen), C=torch.randn(1, l, 1, 4, generator=gen))
    ref = ssd_ref(**{k: v.double() for k, v in kw.items()})
    y = ssd(**kw, chunk_size=64)
    assert torch.isfinite(ref).all() and torch.isfinite(y).all() and rel(y, ref) < 3e-7
    with pytest.raises(ValueError, match="overflows"): ssd_quadratic(**kw)


def test_ssd_growing_state_with_inputs_over_the_last_40_steps():
    "The same with random steps and inputs at every one of the last 40 of 100 steps (the loop's outputs reach 1.9e25): chunks of 64 gave 246 NaN (e^96 times the zeros before); ssd within 3e-6 of the float64 loop (observed 2.0e-6: exponents summed over up to 44 in float32; the float32 loop 5.9e-7)."
    gen = torch.Generator().manual_seed(5)
    l, A = 100, torch.tensor([1.5, 1.2])
    x = torch.zeros(2, l, 2, 3); x[:, -40:] = torch.randn(2, 40, 2, 3, generator=gen)
    kw = dict(x=x, dt=0.75 + 0.5 * torch.rand(2, l, 2, generator=gen), A=A, B=torch.randn(2, l, 1, 4, generator=gen), C=torch.randn(2, l, 1, 4, generator=gen))
    ref = ssd_ref(**{k: v.double() for k, v in kw.items()})
    assert torch.isfinite(ssd_ref(**kw)).all() and ref.abs().max() > 1e24
    y = ssd(**kw, chunk_size=64)
    assert torch.isfinite(y).all() and rel(y, ref) < 3e-6, rel(y, ref)


BAD = {"x": [math.nan, math.inf, -1e30], "B": [math.nan, -math.inf, 3e37], "C": [math.nan, math.inf, 1e30], "dt": [math.inf, 1e30],
       "log_decay": [-math.inf, -1e30]}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), l=st.integers(2, 40), chunk=st.integers(1, 17), g=st.sampled_from([1, 2]), p=st.integers(1, 3),
       which=st.sampled_from(["x", "B", "C", "dt", "log_decay"]), pick=st.integers(0, 2), frac=st.floats(0, 1), double=st.booleans(), extras=st.booleans())
def test_property_ssd_causal_with_nonfinite_or_huge_later_values(seed, l, chunk, g, p, which, pick, frac, double, extras):
    "Issue 25 item 4: a NaN, an infinity or a huge value at step s leaves every output before s bit for bit unchanged, in ssd, ssd_quadratic and ssd_ref (a NaN at the last step made steps 8-15 non-finite with chunk 8, and every step in ssd_quadratic)."
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if double else torch.float32
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    b, h, n = 2, 2 * g, 3
    kw = dict(x=r(b, l, h, p), dt=F.softplus(r(b, l, h)), A=-torch.rand(h, generator=gen, dtype=dtype) - 0.1, B=r(b, l, g, n), C=r(b, l, g, n))
    if which == "log_decay": kw.update(A=None, log_decay=-F.softplus(r(b, l, h)))
    if extras: kw.update(D=r(h), initial_states=r(b, h, p, n))
    s = 1 + int(frac * (l - 2))
    bad = dict(kw)
    bad[which] = kw[which].clone()
    bad[which][:, s] = BAD[which][pick % len(BAD[which])]
    for f in (ssd, ssd_quadratic, ssd_ref):
        y, y_bad = f(**kw, chunk_size=chunk), f(**bad, chunk_size=chunk)
        assert torch.equal(y_bad[:, :s], y[:, :s]), (f.__name__, s, (y_bad[:, :s] - y[:, :s]).abs().max())


def test_ssd_nan_reaches_later_outputs_as_in_the_loop():
    "The NaN is not dropped: from its step on, the outputs of its channel are NaN in all three (as the loop's), and the final state is non-finite."
    kw, _ = make(3, 1, 16, 2, 2, 1, 3)
    kw["x"][:, 9, 1, 0] = math.nan
    for f in (ssd, ssd_quadratic, ssd_ref):
        y, final = f(**kw, chunk_size=8, return_final_states=True)
        assert torch.isnan(y[:, 9:, 1, 0]).all() and torch.isfinite(y[:, :9]).all() and torch.isfinite(y[:, :, 0]).all()
        assert not torch.isfinite(final[:, 1, 0]).all()


def test_ssd_accepts_dt_zero():
    "Issue 25 item 19: dt = 0 (mamba accepts it; float32 softplus underflows to 0) is a step with no input and decay 1: all three equal the loop, and an all-zero dt gives the initial state read out, C_t H_{-1} + D x_t."
    kw, more = make(7, 2, 30, 4, 3, 2, 5)
    kw.update(more)
    kw["dt"] = kw["dt"].masked_fill(torch.rand(kw["dt"].shape, generator=torch.Generator().manual_seed(1)) < 0.3, 0)
    kw["dt"][:, 11] = 0
    assert (F.softplus(torch.tensor(-104.0)) == 0).item()  # float32's softplus of a very negative raw step
    ref = ssd_ref(**kw)
    for f in (ssd, ssd_quadratic): torch.testing.assert_close(f(**kw, chunk_size=8), ref, rtol=0, atol=1e-13)
    zero = {**kw, "dt": torch.zeros_like(kw["dt"])}
    want = torch.einsum("blgn,bgkpn->blgkp", kw["C"], kw["initial_states"].unflatten(1, (2, 2))).flatten(2, 3) + kw["D"][:, None] * kw["x"]
    for f in (ssd, ssd_quadratic, ssd_ref): torch.testing.assert_close(f(**zero, chunk_size=8), want, rtol=0, atol=1e-13)
    for bad in (-1e-3, math.nan):
        with pytest.raises(ValueError, match=r"dt must be >= 0"): ssd(**{**kw, "dt": kw["dt"].clone().fill_(bad)})


def test_ssd_seq_idx_emulation_equals_per_document_runs():
    "Issue 25 item 19: mamba's seq_idx (documents packed in one row) as log_decay = dt A with -inf at each document's first step (decay 0: the state restarts); equal to running each document alone (observed 1.8e-15), gradients too."
    gen = torch.Generator().manual_seed(8)
    b, l, h, p, g, n = 2, 37, 4, 3, 2, 5
    kw, _ = make(9, b, l, h, p, g, n)
    starts = [[0, 5, 14, 15, 29], [0, 20]]  # the documents of each row (a one-step document among them)
    first = torch.zeros(b, l, h, dtype=torch.bool)
    for i, st_ in enumerate(starts): first[i, st_] = True
    def packed(x, dt, A, B, C):
        return ssd(x, dt, None, B, C, chunk_size=8, log_decay=torch.where(first, -math.inf, dt * A))
    def per_document(x, dt, A, B, C):
        rows = []
        for i, st_ in enumerate(starts):
            ends = st_[1:] + [l]
            rows.append(torch.cat([ssd_ref(x[i:i + 1, a:e], dt[i:i + 1, a:e], A, B[i:i + 1, a:e], C[i:i + 1, a:e]) for a, e in zip(st_, ends)], 1))
        return torch.cat(rows)
    args = [kw[k] for k in ("x", "dt", "A", "B", "C")]
    torch.testing.assert_close(packed(*args), per_document(*args), rtol=0, atol=1e-13)
    w = torch.randn(b, l, h, p, generator=gen, dtype=torch.float64)
    grads = []
    for f in (packed, per_document):
        leaves = [a.detach().clone().requires_grad_() for a in args]
        (f(*leaves) * w).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads): torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


class _Largest(TorchDispatchMode):
    "The largest tensor any operation creates inside the context (bytes)."
    def __init__(self): super().__init__(); self.bytes = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor): self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


def test_ssd_chunk_capped_at_the_length():
    "Issue 25 item 17: ssd(l=5, chunk_size=4096) allocated a 128 MiB (4096 x 4096 float64) mask; the chunk is now at most l: no tensor above 1 KiB, the same result as chunk_size=5, equal to the loop."
    kw, more = make(2, 1, 5, 1, 2, 1, 3)
    kw.update(more)
    with _Largest() as m: y = ssd(**kw, chunk_size=4096)
    assert m.bytes <= 1024, m.bytes
    assert torch.equal(y, ssd(**kw, chunk_size=5))
    torch.testing.assert_close(y, ssd_ref(**kw), rtol=0, atol=1e-14)


@pytest.mark.parametrize("f", [ssd, ssd_quadratic, ssd_ref])
def test_ssd_family_ignores_autocast(f):
    "Issue 25 item 5: under torch.autocast('cpu', bfloat16) ssd had 7.0e-3 relative error while returning float32; every op of the family now computes in float32 inside it, bit for bit as outside."
    kw, more = make(3, 2, 64, 4, 8, 1, 16)
    kw = {k: v.float() for k, v in {**kw, **more}.items()}
    y, final = f(**kw, return_final_states=True)
    with torch.autocast("cpu", torch.bfloat16): ya, fa = f(**kw, return_final_states=True)
    assert ya.dtype == torch.float32 and torch.equal(ya, y) and torch.equal(fa, final)


def test_segsum_ignores_autocast():
    a = -torch.rand(3, 20)
    with torch.autocast("cpu", torch.bfloat16): s = segsum(a)
    assert s.dtype == torch.float32 and torch.equal(s, segsum(a))


@pytest.mark.parametrize("f", [ssd, ssd_quadratic, ssd_ref])
@pytest.mark.parametrize("name", ["dt", "A", "B", "C", "D", "initial_states", "log_decay"])
def test_ssd_mixed_devices_name_the_argument(f, name):
    "Issue 25 item 22: a meta tensor among CPU tensors raised 'Tensor on device meta is not on the expected device cpu'; now a ValueError naming both."
    kw, more = make(4, 1, 9, 2, 2, 1, 3)
    kw.update(more)
    if name == "log_decay": kw.update(A=None, log_decay=-kw["dt"])
    with pytest.raises(ValueError, match=rf"^{name} is on device meta but x is on cpu"): f(**{**kw, name: kw[name].to("meta")})
    with pytest.raises(ValueError, match=r"^dt is on device cpu but x is on meta"): f(**{**kw, "x": kw["x"].to("meta")})


def test_ssd_torch_func_vmap_and_grad():
    "Issue 25 item 18: vmap over x, dt and B equals a loop over the reference; torch.func.grad equals autograd."
    V = 3
    kw, _ = make(6, 2, 21, 4, 3, 2, 5)
    gen = torch.Generator().manual_seed(9)
    xs, dts, Bs = (torch.randn(V, *kw[k].shape, generator=gen, dtype=torch.float64) for k in ("x", "dt", "B"))
    dts = F.softplus(dts)
    y = torch.func.vmap(lambda x, dt, B: ssd(x, dt, kw["A"], B, kw["C"], chunk_size=8))(xs, dts, Bs)
    for v in range(V): torch.testing.assert_close(y[v], ssd_ref(xs[v], dts[v], kw["A"], Bs[v], kw["C"]), rtol=0, atol=1e-13)
    loss = lambda x: ssd(x, kw["dt"], kw["A"], kw["B"], kw["C"], chunk_size=8).square().sum()
    x = kw["x"].clone().requires_grad_()
    want, = torch.autograd.grad(ssd_ref(x, kw["dt"], kw["A"], kw["B"], kw["C"]).square().sum(), x)
    torch.testing.assert_close(torch.func.grad(loss)(kw["x"]), want, rtol=0, atol=1e-12)



# ---- issue 25 follow-up 2: under vmap and torch.compile, ssd computes what the plain call computes ----------------------
def growing(gen, lead=(), l=100, start=90):
    "Head 0 grows (A = 1, dt = 1.5: chunks of 64 would form e^96, past float32), head 1 decays; no input before step `start`."
    x = torch.randn(*lead, 1, l, 2, 2, generator=gen); x[..., :start, :, :] = 0
    return x, torch.full((*lead, 1, l, 2), 1.5), torch.tensor([1.0, -0.5]), torch.randn(*lead, 1, l, 1, 3, generator=gen), torch.randn(*lead, 1, l, 1, 3, generator=gen)


def loop64(*args, **kw):
    "The float64 loop on float32 inputs."
    return ssd_ref(*(a.double() if a is not None else None for a in args), **kw)


def test_ssd_vmap_reads_the_values_of_every_mapped_slice():
    """Under vmap the chunk for a growing state and the sign checks were skipped: 164 NaN where the plain call has none, and a negative
    dt accepted. Now they read the tensor below vmap's wrapper (every mapped slice at once): equal bit for bit to the plain call on the
    mapped slices as one batch (one chunk for all, as for a batch), within 3e-7 of the float64 loop (observed 5.8e-8, 1.2e-7); A
    mapped too; dt < 0 and log_decay > 0 raise the plain call's errors."""
    from conftest import rel
    gen = torch.Generator().manual_seed(5)
    x, dt, A, B, C = growing(gen, lead=(2,))
    dt[1] = 0.5  # a slice whose own chunk would be 64: the mapped batch shares the shorter one
    y = torch.func.vmap(lambda *z: ssd(*z, chunk_size=64), in_dims=(0, 0, None, 0, 0))(x, dt, A, B, C)
    assert torch.equal(y, ssd(x.flatten(0, 1), dt.flatten(0, 1), A, B.flatten(0, 1), C.flatten(0, 1), chunk_size=64).unflatten(0, (2, 1)))
    for v in range(2): assert rel(y[v], loop64(x[v], dt[v], A, B[v], C[v])) < 3e-7
    As = torch.tensor([[1.0, -0.5], [-1.0, 0.3]])
    y = torch.func.vmap(lambda x, A: ssd(x, dt[0], A, B[0], C[0], chunk_size=64))(x, As)
    for v in range(2): assert rel(y[v], loop64(x[v], dt[0], As[v], B[0], C[0])) < 3e-7
    with pytest.raises(ValueError, match=r"^dt must be >= 0 .*got -0.5"): torch.func.vmap(lambda dt: ssd(x[0], dt, A, B[0], C[0]))(torch.stack([dt[0], -dt[1]]))
    with pytest.raises(ValueError, match=r"^log_decay must be <= 0"):
        torch.func.vmap(lambda ld: ssd(x[0], None, None, B[0], C[0], log_decay=ld))(torch.stack([-dt[0], dt[1]]))


def test_ssd_compiled_computes_what_eager_computes():
    """Compiled (backend="eager"), ssd kept chunks of 64 for a growing state (NaN where eager has none: 42 of 320 at l = 80) and
    accepted dt < 0. The checks and the chunk now run outside the graph (a graph break): bit for bit eager's output (l = 80: chunks
    of 29), for a decaying state its gradients too; dt < 0 and log_decay > 0 raise eager's errors, ssd_quadratic refuses its
    overflowing mask; and fullgraph=True refuses the graph break instead of computing something else."""
    gen = torch.Generator().manual_seed(6)
    f = torch.compile(lambda *z, **k: ssd(*z, chunk_size=64, **k), backend="eager")
    args = growing(gen, l=80, start=70)
    y = f(*args)
    assert torch.isfinite(y).all() and torch.equal(y, ssd(*args, chunk_size=64))
    x, dt, _, B, C = args
    dec = [t.clone().requires_grad_() for t in (torch.randn(x.shape, generator=gen), dt / 3, torch.tensor([-1.0, -0.5]), B, C)]
    y, ye = f(*dec), ssd(*dec, chunk_size=64)
    assert torch.equal(y, ye)
    for a, b in zip(torch.autograd.grad(y.square().sum(), dec), torch.autograd.grad(ye.square().sum(), dec)): assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"^dt must be >= 0"): f(x, -dt, *args[2:])
    with pytest.raises(ValueError, match=r"^log_decay must be <= 0"): f(x, None, None, B, C, log_decay=dt)
    with pytest.raises(ValueError, match="overflows"): torch.compile(ssd_quadratic, backend="eager")(*args)
    with pytest.raises(Exception, match="torch.compiler.disable"):
        torch.compile(lambda *z: ssd(*z, chunk_size=64), backend="eager", fullgraph=True)(*dec)


def test_ssd_compiled_growing_state_over_many_chunks():
    "l = 100: four chunks of 29 steps; compiled ssd's state passing goes through the compiled scan, whose state passing multiplies with lesson 07's _mul (26 NaN of 400 with a plain *, eager none)."
    gen = torch.Generator().manual_seed(7)
    args = growing(gen)
    y = torch.compile(lambda *z: ssd(*z, chunk_size=64), backend="eager")(*args)
    assert torch.equal(y, ssd(*args, chunk_size=64))

# ---- issue 26: the engine (nbs/engine/ssd.ipynb) around lesson 09's four steps -------------------------------------------
def test_engine_does_not_import_the_public_module():
    "ssm_course._engine.ssd (checks, causal products, the growth chunk) is imported by ssm_course.ssd, so it must not import ssm_course.ssd itself; the helpers ssm_course.ssd (and lesson 11c, through it) uses are the engine's objects."
    import subprocess, sys
    code = ("import sys, ssm_course._engine.ssd as E\nassert 'ssm_course.ssd' not in sys.modules, 'the engine imported the public module'\n"
            "import ssm_course.ssd as S\nassert all(getattr(S, n) is getattr(E, n) for n in ('_check_ref', '_check_ssd', '_causal_apply', '_check_mask', '_growth_chunk'))\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("l, Q, gated", [(50, 16, False), (37, 64, True), (100, 7, False)])
def test_ssd_is_the_lessons_four_steps(dtype, l, Q, gated):
    "ssd (backend='torch') is notebook 09's _ssd_chunks on _inputs' discretized inputs, plus D: bit for bit."
    from ssm_course.ssd import _inputs, _ssd_chunks
    kw, more = make(7, 2, l, 4, 3, 2, 5)
    kw = {k: v.to(dtype) for k, v in {**kw, **more}.items()}
    if gated: kw.update(A=None, log_decay=kw["dt"] * kw["A"], dt=None)
    y, s = ssd(**kw, chunk_size=Q, return_final_states=True, backend="torch")
    xdt, dA, _ = _inputs(kw["x"], kw["dt"], kw["A"], kw.get("log_decay"), dtype)
    y_c, s_c = _ssd_chunks(xdt, dA, kw["B"], kw["C"], Q, kw["initial_states"])
    assert torch.equal(y, y_c + kw["D"][:, None] * kw["x"]) and torch.equal(s, s_c)


# ---- issue 28: the duality as one identity (notebook 09) -------------------------------------------------------------
from ssm_course.scan import scan_chunked, scan_sequential
from ssm_course.conv import ssm_kernel, fft_conv


def ssd_matrix(log_a, B, C, chunk):
    "The L x L matrix that `ssd` applies to one head's input (dt=None, log_decay given), read off from its output on the L unit impulses (p = L channels)."
    L = log_a.shape[0]
    eye = torch.eye(L, dtype=B.dtype)[None, :, None, :]  # channel s carries an impulse at step s
    return ssd(eye, None, None, B[None, :, None], C[None, :, None], chunk_size=chunk, log_decay=log_a[None, :, None])[0, :, 0, :]


def matrix_loop(a, B, C):
    "M_ts = (prod_{s<r<=t} a_r) C_t . B_s for s <= t, 0 above: products and sums in plain Python floats (float64)."
    L = len(a)
    return torch.tensor([[math.prod(a[s + 1:t + 1]) * sum(c * b for c, b in zip(C[t], B[s])) if s <= t else 0.0 for s in range(L)]
                         for t in range(L)], dtype=torch.float64)


@pytest.mark.parametrize("L, n, chunk, seed", [(40, 3, 8, 0), (33, 5, 7, 1), (24, 1, 24, 2), (50, 4, 64, 3)])
def test_ssd_matrix_is_semiseparable_on_and_below_the_diagonal(L, n, chunk, seed):
    "Issue 28 item 17: the matrix ssd applies equals the loop's L o (C B^T), and every submatrix on or below the diagonal, M[j:, :j+1] (all others are inside one of these), has rank min(n, j+1, L-j): rank n through the state at step j, the diagonal included."
    gen = torch.Generator().manual_seed(seed)
    a = 0.7 + 0.3 * torch.rand(L, generator=gen, dtype=torch.float64)
    B, C = torch.randn(L, n, generator=gen, dtype=torch.float64), torch.randn(L, n, generator=gen, dtype=torch.float64)
    M = ssd_matrix(torch.log(a), B, C, chunk)
    torch.testing.assert_close(M, matrix_loop(a.tolist(), B.tolist(), C.tolist()), rtol=0, atol=1e-13)
    ranks = [torch.linalg.matrix_rank(M[j:, :j + 1]).item() for j in range(L)]
    assert ranks == [min(n, j + 1, L - j) for j in range(L)], ranks
    for j in range(n, L - n):  # the rank is exactly n: n singular values well above rounding, the rest at it
        s = torch.linalg.svdvals(M[j:, :j + 1])
        assert s[n - 1] > 1e-6 * s[0] and (n == len(s) or s[n] < 1e-14 * s[0]), (j, s[n - 1:n + 1] / s[0])


@pytest.mark.parametrize("L, n, p, chunk", [(64, 4, 3, 16), (45, 1, 2, 8), (30, 6, 1, 64)])
def test_ssd_time_invariant_is_the_toeplitz_convolution(L, n, p, chunk):
    "Issue 28 item 2: with constant dt, B, C, ssd's output is notebook 04's causal convolution with K_l = C dA^l dB (dA = e^{dt A} I, dB = dt B; 04's ssm_kernel, by Krylov doubling), as T_K x and by fft_conv."
    gen = torch.Generator().manual_seed(L + n)
    dt, A = 0.15, -0.8
    B, C = torch.randn(n, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen, dtype=torch.float64)
    x = torch.randn(1, L, 1, p, generator=gen, dtype=torch.float64)
    K = ssm_kernel(math.exp(dt * A) * torch.eye(n, dtype=torch.float64), dt * B, C, L)
    t, s = torch.arange(L)[:, None], torch.arange(L)[None, :]
    T_K = torch.where(t >= s, K[(t - s).clamp(min=0)], 0.0)
    y = ssd(x, torch.full((1, L, 1), dt, dtype=torch.float64), torch.tensor([A], dtype=torch.float64),
            B.expand(1, L, 1, n), C.expand(1, L, 1, n), chunk_size=chunk)[0, :, 0]  # (L, p)
    torch.testing.assert_close(y, T_K @ x[0, :, 0], rtol=0, atol=1e-13)
    torch.testing.assert_close(y.T, fft_conv(x[0, :, 0].T, K), rtol=0, atol=1e-13)


@pytest.mark.parametrize("N, dt, seed", [(6, 0.5, 0), (3, 1.0, 1), (5, 0.2, 2)])
def test_lti_ssms_are_toeplitz_and_semiseparable_but_not_every_toeplitz_matrix(N, dt, seed):
    "Lesson 09, three structures: an LTI SSM's matrix (04's T_K, K_l = C dA^l dB of a random dense N-state SSM) is Toeplitz and N-semiseparable, rank min(N, j+1, L-j) on M[j:, :j+1]; a Toeplitz matrix with a random kernel has full rank min(j+1, L-j) there (32 at L = 64), so Toeplitz is not inside semiseparable; the kernel (0, 0, 1) is 1-semiseparable and is ssd's matrix with one state and varying B_t, C_t."
    from ssm_course.ssm import random_ssm
    from ssm_course.discretize import discretize
    L = 64
    t, s = torch.arange(L)[:, None], torch.arange(L)[None, :]
    def toeplitz(K): return torch.where(t >= s, K[(t - s).clamp(min=0)], 0.0)
    A, B, C, _ = random_ssm(N, seed=seed)
    K = ssm_kernel(*discretize(A, B, dt), C, L)
    K_rand = torch.randn(L, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ranks = lambda T: [torch.linalg.matrix_rank(T[j:, :j + 1]).item() for j in range(L)]
    assert ranks(toeplitz(K)) == [min(N, j + 1, L - j) for j in range(L)]
    assert ranks(toeplitz(K_rand)) == [min(j + 1, L - j) for j in range(L)]
    M = ssd_matrix(torch.zeros(3, dtype=torch.float64), torch.tensor([[1.0], [0], [0]], dtype=torch.float64), torch.tensor([[0.0], [0], [1]], dtype=torch.float64), 2)
    assert torch.equal(M, torch.tensor([[0.0, 0, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.float64))


@pytest.mark.parametrize("L, chunk", [(100, 16), (37, 5), (8, 64), (256, 1)])
def test_chunked_scan_is_ssd_with_one_state_and_one_channel(L, chunk):
    "Issue 28 item 3: notebook 07's chunked scan is SSD with N = p = 1 and B = C = 1: ssd on log_decay = log a equals scan_chunked at the same chunk and the loop."
    gen = torch.Generator().manual_seed(L)
    a, b = 0.3 + 0.7 * torch.rand(3, L, generator=gen, dtype=torch.float64), torch.randn(3, L, generator=gen, dtype=torch.float64)
    one = torch.ones(3, L, 1, 1, dtype=torch.float64)
    y = ssd(b[..., None, None], None, None, one, one, chunk_size=chunk, log_decay=torch.log(a)[..., None])[..., 0, 0]
    torch.testing.assert_close(y, scan_sequential(a, b), rtol=0, atol=1e-13)
    torch.testing.assert_close(y, scan_chunked(a, b, chunk=chunk), rtol=0, atol=1e-13)


def test_masked_linear_attention_is_the_recurrence():
    "Issue 28 item 5: (q k^T o L) v with a 1-semiseparable mask L_ts = prod a_r, summed term by term in float64, equals ssd's recurrence S_t = a_t S_{t-1} + k_t v_t^T, y_t = S_t^T q_t (q -> C, k -> B, v -> the input)."
    gen = torch.Generator().manual_seed(11)
    b, L, h, n, p = 2, 23, 3, 4, 5
    q, k = torch.randn(b, L, h, n, generator=gen, dtype=torch.float64), torch.randn(b, L, h, n, generator=gen, dtype=torch.float64)
    v, a = torch.randn(b, L, h, p, generator=gen, dtype=torch.float64), 0.5 + 0.5 * torch.rand(b, L, h, generator=gen, dtype=torch.float64)
    want = torch.zeros(b, L, h, p, dtype=torch.float64)
    for t in range(L):
        for s in range(t + 1):
            mask = torch.prod(a[:, s + 1:t + 1], 1)  # (b, h)
            want[:, t] += (mask * (q[:, t] * k[:, s]).sum(-1))[..., None] * v[:, s]
    for f in (ssd, ssd_quadratic, ssd_ref):
        torch.testing.assert_close(f(v, None, None, k, q, chunk_size=8, log_decay=torch.log(a)), want, rtol=0, atol=1e-13)


def test_log_sigmoid_gates_near_zero_float32():
    "Issue 28 item 11: log sigma(z) as -softplus(-z) matters for gates near 0, not near 1: in float32 log(sigmoid(-120)) is -inf with a NaN gradient; through ssd with gates from sigma(-130) to sigma(30), -softplus(-z) gives the float64 value (observed 1.5e-7 relative) and gradient (1.7e-7), the naive route a NaN gradient at every gate that rounds to 0."
    z = torch.tensor([-120.0, -30.0, 0.0, 20.0], requires_grad=True)
    naive, stable = torch.log(torch.sigmoid(z)), -F.softplus(-z)
    g_naive, = torch.autograd.grad(naive.sum(), z)
    g_stable, = torch.autograd.grad(stable.sum(), z)
    z64 = z.detach().double()
    assert naive[0].item() == -math.inf and torch.isnan(g_naive[0]) and torch.isfinite(g_naive[1:]).all()
    torch.testing.assert_close(stable.double(), torch.log(torch.sigmoid(z64)), rtol=2 ** -23, atol=0)
    torch.testing.assert_close(g_stable.double(), 1 - torch.sigmoid(z64), rtol=2 ** -23, atol=0)
    assert torch.exp(stable[3]).item() == 1.0 == torch.exp(naive[3]).item()  # near 1 the two logs differ (0 vs -2e-9), the decay does not
    gen = torch.Generator().manual_seed(3)
    x, B, C = torch.randn(2, 40, 4, 8, generator=gen), torch.randn(2, 40, 1, 16, generator=gen), torch.randn(2, 40, 1, 16, generator=gen)
    logit = torch.empty(2, 40, 4).uniform_(-130, 30, generator=gen)
    l64 = logit.double().requires_grad_()
    y64 = ssd_ref(x.double(), None, None, B.double(), C.double(), log_decay=torch.log(torch.sigmoid(l64)))
    g64, = torch.autograd.grad(y64.sum(), l64)
    for route in ("stable", "naive"):
        lg = logit.clone().requires_grad_()
        y = ssd(x, None, None, B, C, chunk_size=16, log_decay=-F.softplus(-lg) if route == "stable" else torch.log(torch.sigmoid(lg)))
        g, = torch.autograd.grad(y.sum(), lg)
        assert rel(y, y64) < 3e-7, (route, rel(y, y64))
        if route == "stable": assert torch.isfinite(g).all() and rel(g, g64) < 3e-7, rel(g, g64)
        else: assert torch.equal(torch.isnan(g), torch.sigmoid(logit) == 0) and (torch.sigmoid(logit) == 0).any()
