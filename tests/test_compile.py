"""Every Triton kernel compiled for real GPUs (sm_80, sm_90) without one, as `python -m ssm_course.gpu_report` does it.

Per kernel variant that the launchers start at bench/gpu.py's shapes (each module's `compile_specs()`), and per
architecture: it compiles; it spills nothing (stack and local memory 0); its shared memory fits (163 KB on sm_80,
227 KB on sm_90); tensor-core instructions appear wherever it uses `tl.dot`; 128-bit global loads appear wherever its
access is contiguous. The compile runs in a separate process, without TRITON_INTERPRET (which other test modules set)."""
import json, os, subprocess, sys
import pytest

pytest.importorskip("triton")
MODULES = ("ssm_course.triton_scan", "ssm_course.triton_ssm")


def gpu_report(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "ssm_course.gpu_report", *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def coverage(): return gpu_report("--coverage", "--modules", *MODULES)


@pytest.fixture(scope="module")
def rows(): return gpu_report("--json", "--workers", str(min(2, os.cpu_count() or 1)), "--modules", *MODULES)


def name(r): return f"{r['kernel']} [{r['variant']}] sm_{r['arch']}"


def of(rows, module): return [r for r in rows if r["module"] == module]


def needs_specs(coverage, module):
    if not coverage[module]["has_specs"]: pytest.xfail(f"{module} has no compile_specs() yet")


@pytest.mark.parametrize("module", MODULES)
def test_every_kernel_has_a_spec(coverage, module):
    needs_specs(coverage, module)
    assert coverage[module]["kernels"] and not coverage[module]["uncovered"], coverage[module]


@pytest.mark.parametrize("module", MODULES)
def test_compiles_for_sm80_and_sm90(coverage, rows, module):
    needs_specs(coverage, module)
    rs = of(rows, module)
    assert {r["arch"] for r in rs} == {80, 90}
    assert not [(name(r), r["error"]) for r in rs if r["error"]]


@pytest.mark.parametrize("module", MODULES)
def test_no_spills(coverage, rows, module):
    needs_specs(coverage, module)
    assert not [(name(r), r["stack_bytes"], r["local_bytes"]) for r in of(rows, module) if r["error"] is None and r["spill_bytes"]]


@pytest.mark.parametrize("module", MODULES)
def test_shared_memory_fits(coverage, rows, module):
    needs_specs(coverage, module)
    assert all(r["shared_limit"] == {80: 163 * 1024, 90: 227 * 1024}[r["arch"]] for r in rows)
    assert not [(name(r), r["shared_bytes"]) for r in of(rows, module) if r["error"] is None and r["shared_bytes"] > r["shared_limit"]]


@pytest.mark.parametrize("module", MODULES)
def test_tensor_cores_wherever_tl_dot(coverage, rows, module):
    needs_specs(coverage, module)
    rs = [r for r in of(rows, module) if r["error"] is None]
    assert not [name(r) for r in rs if r["dot"] and r["tensor_cores"] is not True]
    assert all(r["tensor_cores"] is None for r in rs if not r["dot"])


@pytest.mark.parametrize("module", MODULES)
def test_vector_loads_wherever_contiguous(coverage, rows, module):
    needs_specs(coverage, module)
    assert not [name(r) for r in of(rows, module) if r["error"] is None and r["expect_vector_loads"] and not r["vector_loads"]]


def test_report_prints_a_table():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "ssm_course.gpu_report", "--modules", "ssm_course.triton_scan", "--variants", "float32",
                          "--kernels", "_scan_fwd_kernel", "--archs", "90"], env=env, capture_output=True, text=True, timeout=300).stdout
    assert out.startswith("| kernel | variant | arch | registers | spill_bytes | shared_bytes | tensor_cores | vector_loads |") and "| `_scan_fwd_kernel` | float32 | sm_90 |" in out


def test_perf_model_rows():
    rows = gpu_report("--perf", "--modules", *MODULES)
    scan = {r["direction"]: r for r in rows if r["op"] == "scan"}
    n = 8 * 1536 * 4096
    assert scan["fwd"]["bytes"] == 12 * n and scan["bwd"]["bytes"] == 20 * n  # forward + backward: 32 bytes per element
    assert all(r["bandwidth_is_estimate"] and r["floor_ms"] > 0 for r in rows)
