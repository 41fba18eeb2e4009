"""The three command-line tools as a user meets them: `--help` (the command's name, every option explained with its
default), a common mistake (one line and a non-zero status, never a traceback), and the progress output (plain lines
on stdout when it is not a terminal, a bar on a terminal's stderr)."""
import fcntl, os, pty, re, struct, subprocess, sys, termios
import pytest, torch

TRAIN_SMALL = ["--batch-size", "4", "--d-model", "8", "--n-layers", "1", "--device", "cpu"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(args, block=None, timeout=300):
    "`python -m <args>` in a fresh process; `block` names a module made unimportable first (as if not installed)."
    if block is None: cmd = [sys.executable, "-m", *args]
    else:  # sys.modules[name] = None: `import name` raises ModuleNotFoundError, find_spec(name) is None
        code = f"import runpy, sys; sys.modules[{block!r}] = None; sys.argv[1:] = {args[1:]!r}; runpy.run_module({args[0]!r}, run_name='__main__', alter_sys=True)"
        cmd = [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)


def _one_line_error(r, status, prog, msg):
    "Exit `status`, nothing on stdout, no traceback, and stderr ends with the one-line error `prog: error: msg...`."
    err = r.stderr.strip().splitlines()
    assert r.returncode == status and r.stdout == "" and "Traceback" not in r.stderr, (r.returncode, r.stdout, r.stderr)
    assert err[-1].startswith(f"{prog}: error: {msg}"), err
    return err


MISTAKES = [  # (command, blocked module, exit status, error message start)
    (["ssm_course.train", "--device", "gpu"], None, 2, "--device gpu: not a device; use auto, cpu, cuda or cuda:N"),
    (["ssm_course.train", "--steps", "0"], None, 2, "--steps must be at least 1, got 0"),
    (["ssm_course.train", "--task", "sequential_digits"], "sklearn", 1,
     "--task sequential_digits: sequential_digits reads scikit-learn's copy of the digits, and scikit-learn is not installed: pip install scikit-learn, or pip install \"ssm_course[course]\""),
    (["ssm_course.gpu_report"], "triton", 1, 'Triton is not installed; it compiles the kernels (no GPU needed): pip install "ssm_course[gpu]"'),
    (["ssm_course.bench", "--quick"], "scipy", 1,
     'the benchmark checks every case against references that need scipy, which is not installed: pip install "ssm_course[bench]"'),
]


@pytest.mark.parametrize("args,block,status,msg", MISTAKES, ids=[" ".join(m[0]).replace("ssm_course.", "") + (f" without {m[1]}" if m[1] else "") for m in MISTAKES])
def test_a_common_mistake_is_one_line_not_a_traceback(args, block, status, msg):
    "Was: a traceback (gpu_report without Triton, bench without scipy: after a progress bar), a raw RuntimeError (--device gpu)."
    err = _one_line_error(_run(args, block), status, f"python -m {args[0]}", msg)
    if status == 1: assert len(err) == 1, err  # a missing package: the line alone, no usage


def test_train_device_cuda_without_cuda():
    "--device cuda on a CPU build of PyTorch (was a 15-line traceback ending in 'Torch not compiled with CUDA enabled')."
    if torch.cuda.is_available(): pytest.skip("CUDA is available here: --device cuda trains")
    want = f"this PyTorch ({torch.__version__}) is built without CUDA" if not torch.backends.cuda.is_built() else "PyTorch finds no CUDA GPU here"
    _one_line_error(_run(["ssm_course.train", "--device", "cuda", "--steps", "1"]), 2, "python -m ssm_course.train", f"--device cuda: {want}")


def _parsers():
    from ssm_course import bench, gpu_report, train
    return {"ssm_course.train": train._parser(), "ssm_course.bench": bench._parser(), "ssm_course.gpu_report": gpu_report._parser()}


@pytest.mark.parametrize("module", ["ssm_course.train", "ssm_course.bench", "ssm_course.gpu_report"])
def test_help_names_the_command_and_explains_every_option(module):
    "usage: python -m ssm_course.<tool> (was train.py, bench.py); every option has a help text, and each with a default says it."
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"usage: python -m {module} "), r.stdout[:200]
    for act in _parsers()[module]._actions:
        if act.dest == "help": continue
        assert act.help, f"{module} {act.option_strings} has no help"
        if act.default not in (None, False): assert "(default: " in act.help, f"{module} {act.option_strings}: default {act.default!r} not shown"
    if module == "ssm_course.train": assert "optimizer steps in all, at least 1; with --resume, counted from the start of the first run (default: 200)" in " ".join(r.stdout.split()), r.stdout


LINE = r"step {}/{}: train loss \d+\.\d{{4}}, eval loss \d+\.\d{{4}}{} \(\d\d:\d\d\)"


def test_train_offers_every_task_and_prints_its_evaluation(capsys):
    "Every task of notebook 13a but sequential_images trains from the command line (was 3 of them: --task adding was refused), with a line per round and the final held-out evaluation."
    from ssm_course import tasks, train
    offered = {a.dest: a for a in train._parser()._actions}["task"].choices
    assert set(offered) == {"delayed_recall", "copying", "selective_copying", "adding", "associative_recall", "multi_query_recall", "sequential_digits"}
    assert set(offered) | {"sequential_images", "IGNORE"} == set(tasks.__all__)
    for task in offered:
        t = train.main(["--task", task, "--steps", "2", "--eval-every", "1", *TRAIN_SMALL])
        out = capsys.readouterr().out.splitlines()
        acc = "" if task == "adding" else r", eval accuracy \d\.\d{3}"
        n = 360 if task == "sequential_digits" else 512
        assert len(out) == 3 and re.fullmatch(LINE.format(1, 2, acc), out[0]) and re.fullmatch(LINE.format(2, 2, acc), out[1]), (task, out)
        assert re.fullmatch(rf"final loss \d+\.\d{{6}} on cpu; held out \({n} examples\): loss \d+\.\d{{4}}" + acc.replace("eval ", ""), out[2]), (task, out)
        assert t.step == 2 and len(t.history["eval_loss"]) == 2, task


def test_train_prints_plain_lines_into_a_pipe():
    "stdout not a terminal: a line per evaluation round and the final evaluation, no bar on either stream (was a bar redrawn with carriage returns, then only 'final loss')."
    r = _run(["ssm_course.train", "--steps", "4", "--eval-every", "2", *TRAIN_SMALL])
    out = r.stdout.splitlines()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    acc = r", eval accuracy \d\.\d{3}"
    assert len(out) == 3 and re.fullmatch(LINE.format(2, 4, acc), out[0]) and re.fullmatch(LINE.format(4, 4, acc), out[1]) and out[2].startswith("final loss "), out


@pytest.mark.parametrize("size", [(24, 100), (0, 0)], ids=["24x100", "0x0"])
def test_train_draws_a_bar_on_a_terminal(size):
    "stderr a terminal: tqdm's bar there, redrawn in place, while the lines go to stdout; also on a terminal that reports a 0 x 0 size (a container's before a resize), where tqdm alone draws nothing."
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))  # rows, columns
    p = subprocess.Popen([sys.executable, "-m", "ssm_course.train", "--steps", "4", "--eval-every", "2", *TRAIN_SMALL], stdout=subprocess.PIPE, stderr=slave, env=ENV)
    os.close(slave)
    err = b""
    while True:
        try: chunk = os.read(master, 4096)
        except OSError: break  # EIO: the process closed the terminal
        if not chunk: break
        err += chunk
    out = p.communicate(timeout=300)[0].decode()
    os.close(master)
    err = err.decode()
    assert p.returncode == 0 and "\r" in err and re.search(r"training: 100%.*4/4", err), err
    assert len(out.splitlines()) == 3 and out.startswith("step 2/4: train loss"), out


def test_train_resumes_from_a_periodic_checkpoint(tmp_path, monkeypatch, capsys):
    "--checkpoint-every writes the --save file every N steps (was: only at the end); --resume continues from one exactly: the same losses and weights as the run straight through."
    from ssm_course import train
    args = ["--steps", "6", "--eval-every", "3", *TRAIN_SMALL]
    straight = train.main(args)
    saved, real_save = [], train.save_checkpoint
    def spy(obj, path):  # keep a copy of every checkpoint as it is written
        real_save(obj, path); saved.append(obj["step"]); real_save(obj, tmp_path / f"at{obj['step']}.pt")
    monkeypatch.setattr(train, "save_checkpoint", spy)
    train.main([*args, "--save", str(tmp_path / "run.pt"), "--checkpoint-every", "2"])
    assert saved[:3] == [2, 4, 6], saved
    monkeypatch.setattr(train, "save_checkpoint", real_save)
    capsys.readouterr()
    resumed = train.main([*args, "--resume", str(tmp_path / "at2.pt")])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"resumed from {tmp_path / 'at2.pt'} at step 2/6" and re.fullmatch(LINE.format(3, 6, r", eval accuracy \d\.\d{3}"), out[1]), out
    assert resumed.history["loss"] == straight.history["loss"]
    for p, q in zip(straight.module.parameters(), resumed.module.parameters()): assert torch.equal(p, q)


@pytest.mark.parametrize("extra,msg", [(["--checkpoint-every", "2"], "--checkpoint-every needs --save FILE"),
                                       (["--resume", "missing.pt"], "--resume missing.pt: no such file"),
                                       (["--checkpoint-every", "0", "--save", "x.pt"], "--checkpoint-every must be at least 1, got 0")])
def test_train_checkpoint_options_are_checked_first(extra, msg, capsys):
    from ssm_course import train
    with pytest.raises(SystemExit) as e: train.main(["--steps", "2", *TRAIN_SMALL, *extra])
    assert e.value.code == 2 and f"error: {msg}" in capsys.readouterr().err


def test_train_resume_with_other_options_is_one_line(tmp_path, capsys):
    "--resume with another --lr: the checkpoint's and the command's values in one line, exit 2."
    from ssm_course import train
    train.main(["--steps", "2", *TRAIN_SMALL, "--save", str(tmp_path / "c.pt")])
    with pytest.raises(SystemExit) as e: train.main(["--steps", "4", "--lr", "0.01", *TRAIN_SMALL, "--resume", str(tmp_path / "c.pt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "written by a trainer with lr=0.003; this trainer has lr=0.01" in err[-1], err
