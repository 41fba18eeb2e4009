"""ssm_course.tasks and .train: task contracts, dataset readers on fake files, exact resume, torchrun/DDP, bench machinery."""
import gzip, json, os, pickle, struct, subprocess, sys
from pathlib import Path
import numpy as np, pytest, torch
from ssm_course import tasks
from ssm_course.layers import SequenceModel
from ssm_course.train import Trainer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fn,kw", [(tasks.copying, dict(K=3, T=5)), (tasks.delayed_recall, dict(L=20, D=5)), (tasks.selective_copying, dict(K=3, T=9)),
                                   (tasks.associative_recall, dict(P=4, V=8)), (tasks.adding, dict(L=12))])
def test_tasks_are_reproducible_and_shaped(fn, kw):
    a = fn(5, g=torch.Generator().manual_seed(1), **kw)
    b = fn(5, g=torch.Generator().manual_seed(1), **kw)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and a[0].shape[0] == a[1].shape[0] == 5


def _write_idx(path, arr):
    arr = np.asarray(arr, dtype=np.uint8)
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes())


def test_sequential_mnist_reader_on_fake_files(tmp_path):
    raw = tmp_path / "MNIST" / "raw"; raw.mkdir(parents=True)
    imgs = np.random.default_rng(0).integers(0, 256, (3, 28, 28))
    _write_idx(raw / "t10k-images-idx3-ubyte.gz", imgs); _write_idx(raw / "t10k-labels-idx1-ubyte.gz", [7, 2, 1])
    x, y = tasks.sequential_images("mnist", tmp_path, "test")
    assert x.shape == (3, 784, 1) and y.tolist() == [7, 2, 1]
    np.testing.assert_allclose(x[1, :, 0].numpy(), imgs[1].reshape(-1) / 255.0, rtol=1e-6)


def test_sequential_cifar_reader_on_fake_files(tmp_path):
    d = tmp_path / "cifar-10-batches-py"; d.mkdir()
    data = np.random.default_rng(0).integers(0, 256, (2, 3072), dtype=np.uint8)
    with open(d / "test_batch", "wb") as f: pickle.dump({b"data": data, b"labels": [3, 9]}, f)
    x, y = tasks.sequential_images("cifar10", tmp_path, "test")
    assert x.shape == (2, 1024, 3) and y.tolist() == [3, 9]
    np.testing.assert_allclose(x[0, :, 1].numpy(), data[0, 1024:2048] / 255.0, rtol=1e-6)  # green channel, pixel order


def test_sequential_digits():
    x, y = tasks.sequential_digits("test")
    assert x.shape == (360, 64, 1) and set(y.tolist()) == set(range(10)) and 0 <= x.min() and x.max() <= 1


def _trainer(seed=0):
    torch.manual_seed(seed)
    m = SequenceModel(4, d_model=8, n_layers=1, layer="lru", vocab_size=4, pool=None)
    return Trainer(m, lambda n, g: tasks.delayed_recall(n, L=16, D=4, g=g), steps=8, batch_size=4, warmup=2)


def test_resume_is_exact(tmp_path):
    a = _trainer(); a.fit(progress=False)
    b = _trainer(); b.fit(4, progress=False); b.save(tmp_path / "c.pt")
    c = _trainer(seed=99).load(tmp_path / "c.pt"); c.fit(4, progress=False)
    for p, q in zip(a.module.parameters(), c.module.parameters()): assert torch.equal(p, q)
    assert a.history["loss"] == c.history["loss"]


def test_trainer_bad_input():
    m = SequenceModel(4, d_model=8, n_layers=1, layer="s4d", vocab_size=4, pool=None)
    with pytest.raises(ValueError, match="loss"): Trainer(m, tasks.copying, steps=5, loss="l1")
    with pytest.raises(ValueError, match="steps"): Trainer(m, tasks.copying, steps=0)


def test_torchrun_two_processes_equal_one_process(tmp_path):
    "Two CPU processes (gloo DDP) on halves of each global batch end where one process ends on the whole batches."
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = ["-m", "ssm_course.train", "--steps", "4", "--batch-size", "8", "--layer", "s4d"]
    def launch(*cmd):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, f"{' '.join(cmd)} exited with {r.returncode}:\n{r.stderr[-4000:]}"
    launch(sys.executable, *common, "--save", str(tmp_path / "one.pt"))
    launch(str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node=2", "--standalone", *common, "--save", str(tmp_path / "two.pt"))
    one, two = (torch.load(tmp_path / f, weights_only=False) for f in ("one.pt", "two.pt"))
    assert max((one["model"][k] - two["model"][k]).abs().max().item() for k in one["model"]) < 1e-5
    assert max(abs(a - b) for a, b in zip(one["history"]["loss"], two["history"]["loss"])) < 1e-5
    assert two["history"]["rank_param_diff"] == 0  # identical parameters on both ranks
