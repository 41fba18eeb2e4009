"""ssm_course.bench: the benchmark command's machinery, on tiny shapes."""
import json, subprocess, sys
import torch
from ssm_course.bench import Case, evaluate, measure, ratio


def test_bench_cli_quick(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "ssm_course.bench", "--quick", "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    res = json.loads(out.read_text())
    n = len(res["cases"])  # stdout is not a terminal: no bar, a line per case as it ends
    assert [l.rsplit(" (", 1)[0] for l in r.stdout.splitlines()[:n]] == [f"{i}/{n} {c['case']}" for i, c in enumerate(res["cases"], 1)], r.stdout[:2000]
    assert res["mode"] == "quick" and len(res["cases"]) >= 7 and res["copy_GBps"] == max(res["copy_GBps_start"], res["copy_GBps_end"]) > 0 and res["matmul_GFLOPs"] > 0
    assert res["threads"] == 1 and len(res["load_avg_before"]) == 3 and len(res["load_avg_after"]) == 3
    for c in res["cases"]:  # every implementation checked, in every case (the layers included), and timed
        assert c["agree"] and c["max_rel_diff"] and all(d <= c["tol"] for d in c["max_rel_diff"].values()), c["case"]
        assert set(c["seconds"]) == set(c["max_rel_diff"]) and all(t > 0 for t in c["seconds"].values())


def test_measure_interleaves_rounds():
    calls = []
    times = measure({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, min_run_time=1e-4)
    assert [len(v) for v in times.values()] == [3, 3]
    # each round measures a, then b: the order of first calls alternates a-block, b-block
    blocks = [k for i, k in enumerate(calls) if i == 0 or calls[i - 1] != k]
    assert blocks == ["a", "b"] * 3


def test_ratio_is_median_of_per_round_ratios():
    assert ratio({"x": [1.0, 2.0, 10.0], "y": [2.0, 2.0, 2.0]}, "x", "y") == 1.0


def test_disagreeing_implementation_is_not_timed():
    c = Case("toy", {"ours": lambda: torch.arange(1.0, 4.0), "peer": lambda: torch.arange(1.0, 4.0).flip(0), "good": lambda: torch.arange(1.0, 4.0)},
             tol=1e-6, nbytes=24, flops=3)
    rec = evaluate(c, rounds=1, min_run_time=1e-3)
    assert not rec["agree"] and set(rec["seconds"]) == {"ours", "good"} and rec["best_peer"] == "good"
    assert abs(rec["max_rel_diff"]["peer"] - 2 / 3) < 1e-6 and rec["max_rel_diff"]["good"] == 0
    assert set(rec["pct_copy"]) == {"ours", "good"} and rec["copy_GBps"] > 0  # the copy is timed alongside, not reported as an implementation


def test_cli_exits_1_when_an_implementation_disagrees(monkeypatch, tmp_path, capsys):
    import pytest
    import ssm_course.bench as bench
    toy = lambda quick: Case("toy", {"ours": lambda: torch.ones(3), "wrong": lambda: torch.zeros(3)}, tol=1e-6)
    monkeypatch.setattr(bench, "CASES", [toy])
    with pytest.raises(SystemExit) as e: bench.main(["--quick", "--out", str(tmp_path / "r.json")])
    assert "DISAGREE" in str(e.value.code) and "wrong" in str(e.value.code)  # a string code: exit status 1
    res = json.loads((tmp_path / "r.json").read_text())  # the results are still written, with the disagreement recorded
    assert res["cases"][0]["agree"] is False and "wrong" not in res["cases"][0]["seconds"]


def test_reference_probes_and_roofs_side_by_side():
    # every implementation, ours included, is measured against the case's reference; probes are timed but are not peers
    ref = torch.arange(1.0, 5.0)
    c = Case("toy", {"ours": lambda: ref * (1 + 1e-7), "peer": lambda: ref.clone(), "off": lambda: ref * 1.01}, tol=1e-6,
             ref=lambda: ref.double(), nbytes=32, flops=4, probes={"probe": lambda: ref + 1})
    rec = evaluate(c, rounds=2, min_run_time=1e-3, matmul=32)
    assert 0 < rec["max_rel_diff"]["ours"] < 1e-6 and rec["max_rel_diff"]["peer"] == 0 and abs(rec["max_rel_diff"]["off"] - 0.01) < 1e-6
    assert set(rec["seconds"]) == {"ours", "peer"} and rec["best_peer"] == "peer" and not rec["agree"]
    assert set(rec["probe_seconds"]) == {"probe"} and len(rec["probe_round_seconds"]["probe"]) == 2
    assert rec["matmul_GFLOPs"] > 0 and set(rec["pct_roof"]) == {"ours", "peer"} and all(0 < v for v in rec["pct_roof"].values())


def test_triton_ms_picks_our_kernels_only():
    from ssm_course.bench import triton_ms
    row = lambda impl, ms, note="", op="scan fwd", shape=(8, 16, 64): {"op": op, "impl": impl, "shape": list(shape), "ms": ms, "note": note}
    gpu = {"timings": [row("accelerated-scan (triton)", 0.5), row("ssm_course (triton)", 0.9, "tune: BLOCK 4096, warps 16, stages 1"),
                       row("ssm_course (triton)", 1.0), row("ssm_course (torch, blocked)", 0.1), row("ssm_course (triton)", 2.0, op="scan bwd"),
                       row("ssm_course (triton)", 3.0, shape=(1, 2, 3)), row("ssm_course selective_scan(backend='triton')", 1.2)]}
    assert triton_ms(gpu, "scan fwd", [8, 16, 64]) == 1.0 and triton_ms(gpu, "scan bwd", (8, 16, 64)) == 2.0
    assert triton_ms(gpu, "ssd fwd", [8, 16, 64]) is None and triton_ms(None, "scan fwd", [8, 16, 64]) is None
    assert triton_ms(gpu, "scan fwd", [8, 16, 64], "torch, blocked") == 0.1  # ssm_kernel_diag's PyTorch path, modelled beside the kernel


import pytest


@pytest.mark.parametrize("args,msg", [(["--threads", "0"], "--threads must be at least 1, got 0"), (["--rounds", "0"], "--rounds must be at least 1, got 0"),
                                      (["--rounds", "-1"], "--rounds must be at least 1, got -1"), (["--out", "{tmp}"], "--out {tmp} is a directory"),
                                      (["--out", "{tmp}/file/r.json"], "--out {tmp}/file/r.json: cannot create its directory {tmp}/file")])
def test_cli_refuses_bad_options_before_running(args, msg, tmp_path, capsys, monkeypatch):
    "Exit status 2 with argparse's one-line error naming the option, before the run (--rounds 0 ran with the default and exited 0; --out a directory failed after the whole run)."
    import ssm_course.bench as bench
    def ran(**kw): raise AssertionError(f"the benchmark ran: {kw}")
    monkeypatch.setattr(bench, "run", ran)
    (tmp_path / "file").write_text("")  # a file where --out wants a directory
    with pytest.raises(SystemExit) as e: bench.main(["--quick"] + [a.replace("{tmp}", str(tmp_path)) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[0].startswith("usage: ") and f"error: {msg}".replace("{tmp}", str(tmp_path)) in err[-1], err


def test_run_and_measure_refuse_zero_rounds_and_threads():
    "run read rounds=0 as 'the default'; measure returned empty lists for rounds=0 and raised torch's 'set_num_threads expects a positive integer' for threads=0."
    from ssm_course.bench import run
    toy = lambda quick: Case("toy", {"ours": lambda: torch.ones(3)}, tol=1e-6)
    for kw, msg in [(dict(rounds=0), "rounds must be at least 1, got 0"), (dict(rounds=-1), "rounds must be at least 1, got -1"),
                    (dict(threads=0), "threads must be at least 1, got 0"), (dict(min_run_time=0.0), "min_run_time must be positive")]:
        with pytest.raises(ValueError, match=msg): measure({"a": lambda: None}, **kw)
        with pytest.raises(ValueError, match=msg): run(quick=True, cases=[toy], progress=False, **kw)
    with pytest.raises(TypeError, match="rounds must be an integer"): measure({"a": lambda: None}, rounds=2.0)


@pytest.mark.parametrize("op", ["scan", "selective_scan", "causal_conv"])
def test_accelerators_off_reaches_the_path_the_op_takes(op, monkeypatch):
    "The rows 'no numba' / 'no ducc0' time our op as a user without the optional package: with the package's entry point made to raise, "
    "our call raises (it goes through the accelerator) and the switched-off call does not, agreeing with a float64 reference. Guards the "
    "switch against the entry point moving to another module (it would then silently time the accelerated path twice)."
    from ssm_course.bench import _ACCELERATORS, _accelerators_off, rel_diff
    from ssm_course._engine.bench import _holders
    from ssm_course.scan import scan, scan_sequential
    from ssm_course.conv import causal_conv
    g = torch.Generator().manual_seed(0)
    if op == "scan":
        a, b = 0.9 + 0.1 * torch.rand(2, 8, 256, generator=g), torch.randn(2, 8, 256, generator=g)
        f, ref = (lambda: scan(a, b)), scan_sequential(a.double(), b.double())
    elif op == "selective_scan":  # issue 32: its CPU forward is numba's compiled loop when installed
        from ssm_course.selective import selective_scan, selective_scan_ref
        u, dl, B, C = torch.randn(2, 8, 64, generator=g), torch.rand(2, 8, 64, generator=g) / 4, torch.randn(2, 4, 64, generator=g), torch.randn(2, 4, 64, generator=g)
        A = -torch.rand(8, 4, generator=g) - 0.1
        f, ref = (lambda: selective_scan(u, dl, A, B, C)), selective_scan_ref(u.double(), dl.double(), A.double(), B.double(), C.double())
    else:
        u, K = torch.randn(4, 64, 1024, generator=g), torch.randn(64, 1024, generator=g) / 32  # 2**18 samples: the CPU path
        f, ref = (lambda: causal_conv(u, K)), torch.fft.irfft(torch.fft.rfft(u.double(), n=2048) * torch.fft.rfft(K.double(), n=2048), n=2048)[..., :1024]
    name, attr, modules = _ACCELERATORS[op]
    mods = _holders(attr, *modules)
    if all(getattr(m, attr) is None for m in mods): pytest.skip(f"{attr}'s package is not installed")
    off = _accelerators_off(op, f)[name]
    class Used(Exception): pass
    class Raising:
        def __call__(self, *a, **k): raise Used()
        def __getattr__(self, k): raise Used()
    for m in mods: monkeypatch.setattr(m, attr, Raising())
    with pytest.raises(Used): f()
    assert rel_diff(off(), ref) < 5e-7


def test_sweep_records_every_point_with_its_spread():
    "`sweep` evaluates each case at each of its shapes (checked against float64 first), records op, shape, L and the per-round ratios to the"
    " best peer; the default SWEEP spans L = 128 .. 16384 for every case with a peer, and includes notebook 13b's shapes."
    from ssm_course.bench import sweep, SWEEP, case_causal_conv, case_scan, case_selective, TORCH_LOOP
    res = sweep(rounds=2, min_run_time=0.005, cases=[case_causal_conv, case_scan, case_selective], progress=False,
                shapes={"case_causal_conv": [(2, 3, 128), (1, 2, 1000)], "case_scan": [(2, 3, 64)], "case_selective": [(1, 4, 2, 32)]})
    assert [(p["op"], p["shape"], p["L"]) for p in res["points"]] == [("causal_conv", [2, 3, 128], 128), ("causal_conv", [1, 2, 1000], 1000),
                                                                   ("scan", [2, 3, 64], 64), ("selective", [1, 4, 2, 32], 32)]
    for p in res["points"]:
        assert p["agree"] and set(p["round_over_best_peer"]) == set(p["seconds"])
        assert all(len(r) == 2 for r in p["round_over_best_peer"].values()) and p["round_over_best_peer"][p["best_peer"]] == [1.0, 1.0]
    assert "torch.fft, n = 2L" in res["points"][0]["seconds"] and TORCH_LOOP in res["points"][2]["seconds"] and TORCH_LOOP in res["points"][3]["seconds"]
    from ssm_course.bench import CASES, _length
    assert {f.__name__ for f in CASES} == set(SWEEP)
    for f in CASES:
        L, k = [_length(f, s) for s in SWEEP[f.__name__]], f.__name__
        if "mamba_block" in k or "lru" in k: assert L == [256, 1024, 4096], k  # issue 32's layer lengths
        else: assert min(L) == 128 and (max(L) >= 16384 or k in ("case_ssd", "case_layers")), k  # SSD's quadratic form and the layers stop at 2048, 4096
    assert (32, 32, 128) in SWEEP["case_causal_conv"] and (32, 64, 16, 128) in SWEEP["case_selective"] and (32, 128, 32) in SWEEP["case_layers"]


def test_cli_sweep_writes_every_point(tmp_path, monkeypatch, capsys):
    "`python -m ssm_course.bench --sweep --out F` runs `sweep` and writes its points."
    import ssm_course.bench as b
    monkeypatch.setattr(b, "SWEEP", {"case_scan_lti": [(2, 64)]})
    monkeypatch.setattr(b, "CASES", [b.case_scan_lti])
    out = tmp_path / "sweep.json"
    res = b.main(["--sweep", "--rounds", "1", "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["mode"] == "sweep" and [p["shape"] for p in got["points"]] == [[2, 64]] and res["points"][0]["agree"]
    assert "| scan_lti | (2, 64) |" in capsys.readouterr().out


def test_peak_memory_of_the_layer_cases():
    "`peak_memory` measures every implementation of a layer case in its own process (Linux: VmHWM); the sweep records it for the layer cases only."
    import pathlib
    from ssm_course.bench import peak_memory, case_lru, _MEMORY
    if not pathlib.Path("/proc/self/clear_refs").exists(): pytest.skip("needs Linux's /proc/self/clear_refs")
    mem = peak_memory(case_lru, (2, 512, 64))
    assert set(mem) == set(case_lru(shape=(2, 512, 64)).fns) and all(v >= 0 for v in mem.values())
    assert max(mem.values()) > 0.1  # a (2, 512, 64) complex state sequence is 0.5 MB: something is measured
    assert set(_MEMORY) == {"case_mamba_block", "case_mamba_block_train", "case_lru", "case_lru_train"}


def test_quick_run_grades_nothing():
    "A --quick run's toy shapes check the machinery, not the speed: its summary does not grade the target (it said 'not met')."
    from ssm_course.bench import summary
    case = {"case": "scan", "ours": ["ours"], "seconds": {"ours": 2.0, "peer": 1.0}, "best_peer": "peer",
            "over_best_peer": {"ours": 2.0}, "target": True}
    assert summary({"mode": "quick", "cases": [case]}).splitlines()[-1].endswith("| n/a (quick) |")
    assert summary({"mode": "full", "cases": [case]}).splitlines()[-1].endswith("| not met |")
