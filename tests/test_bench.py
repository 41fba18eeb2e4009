"""ssm_course.bench: the benchmark command's machinery, on tiny shapes."""
import json, subprocess, sys
import torch
from ssm_course.bench import Case, evaluate, measure, ratio


def test_bench_cli_quick(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "ssm_course.bench", "--quick", "--out", str(out)], check=True, capture_output=True, timeout=600)
    res = json.loads(out.read_text())
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
