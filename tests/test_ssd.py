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
