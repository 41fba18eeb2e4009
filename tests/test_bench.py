"""ssm_course.bench: the benchmark command's machinery, on tiny shapes."""
import json, subprocess, sys


def test_bench_cli_quick(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "ssm_course.bench", "--quick", "--out", str(out)], check=True, capture_output=True, timeout=600)
    res = json.loads(out.read_text())
    assert res["mode"] == "quick" and len(res["cases"]) >= 7 and res["copy_GBps"] > 0
    assert all(d < 1e-3 for c in res["cases"] for d in c["max_rel_diff"].values())
