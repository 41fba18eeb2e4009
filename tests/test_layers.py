"""ssm_course.layers: shapes, step == forward, state carrying, gradients, bad input, torch.compile, DDP on CPU."""
import os, socket, pytest, torch
import torch.multiprocessing as mp
from ssm_course.layers import LAYERS, SequenceModel, ssm_param_groups, S4D, LRU

SMALL = {"s4d": dict(d_state=8), "s4": dict(d_state=8), "dss": dict(d_state=8), "lru": dict(d_state=10), "mamba": dict(d_state=4)}
# every layer, plus Mamba with complex states (init="lin")
CONFIGS = {**{name: (name, kw) for name, kw in SMALL.items()}, "mamba-lin": ("mamba", dict(d_state=4, init="lin"))}


def flat(s): return torch.cat([t.reshape(-1) for t in s]) if isinstance(s, tuple) else s.reshape(-1)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_shape_and_dtype(config):
    name, kw = CONFIGS[config]
    layer = LAYERS[name](6, **kw)
    y = layer(torch.randn(3, 17, 6))
    assert y.shape == (3, 17, 6) and y.dtype == torch.float32


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("L,split", [(1, 0), (9, 4), (31, 30)])
def test_step_equals_forward_and_chunking(config, L, split):
    torch.manual_seed(0)
    name, kw = CONFIGS[config]
    layer = LAYERS[name](5, **kw).double()
    x = torch.randn(2, L, 5, dtype=torch.float64)
    y, last = layer(x, return_state=True)
    state, ys = layer.initial_state(2), []
    for t in range(L):
        y_t, state = layer.step(x[:, t], state)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(flat(state), flat(last), rtol=1e-8, atol=1e-9)
    if split:
        y1, s1 = layer(x[:, :split], return_state=True)
        y2 = layer(x[:, split:], state=s1)
        torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_parameter_gets_a_finite_gradient(config):
    torch.manual_seed(1)
    name, kw = CONFIGS[config]
    model = SequenceModel(4, d_model=8, n_layers=2, layer=name, d_input=3, **kw)
    model(torch.randn(2, 20, 3)).square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


def test_param_groups_cover_everything_once():
    model = SequenceModel(4, d_model=8, n_layers=2, layer="mamba", vocab_size=7)
    groups = ssm_param_groups(model, lr=1e-2, weight_decay=0.1)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    ssm = next(g for g in groups if g["name"] == "ssm")
    assert ssm["lr"] == 1e-3 and ssm["weight_decay"] == 0.0 and any(p is model.layers[0].A_log for p in ssm["params"])


@pytest.mark.parametrize("name", ["s4d", "lru"])
def test_torch_compile_matches_eager(name):
    torch.manual_seed(2)
    layer = LAYERS[name](6, **SMALL[name])
    x = torch.randn(2, 16, 6)
    compiled = torch.compile(layer)
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-4, atol=1e-5)


BAD = [
    (lambda: S4D(4)(torch.randn(2, 5)), "x"),
    (lambda: S4D(4)(torch.randn(2, 5, 3)), "d_model"),
    (lambda: LRU(4)(torch.randn(2, 0, 4)), "empty"),
    (lambda: LAYERS["mamba"](4, init="complex"), "init"),
    (lambda: SequenceModel(3, layer="rnn", d_input=2), "layer"),
    (lambda: SequenceModel(3), "vocab_size"),
    (lambda: SequenceModel(3, d_input=2, pool="max"), "pool"),
]


@pytest.mark.parametrize("call,word", BAD, ids=[b[1] for b in BAD])
def test_bad_input(call, word):
    with pytest.raises((ValueError, TypeError), match=word):
        call()


def _ddp_worker(rank, world, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(SequenceModel(3, d_model=8, n_layers=2, layer="s4d", d_input=2, d_state=8))
    opt = torch.optim.AdamW(ssm_param_groups(model, lr=1e-2))
    g = torch.Generator().manual_seed(100 + rank)  # different data per rank
    for _ in range(2):
        loss = model(torch.randn(4, 12, 2, generator=g)).square().mean()
        opt.zero_grad(); loss.backward(); opt.step()
    flat_params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(flat_params) for _ in range(world)]
    torch.distributed.all_gather(gathered, flat_params)
    if rank == 0: q.put(max((gathered[0] - t).abs().max().item() for t in gathered))
    torch.distributed.destroy_process_group()


def test_ddp_two_processes_stay_in_sync():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(_ddp_worker, args=(2, port, q), nprocs=2, join=True, start_method="spawn")
    assert q.get(timeout=60) == 0.0
