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


MIRRORED = '''
import triton, triton.language as tl

@triton.jit
def _combine(a1, b1, a2, b2): return a1 * a2, a2 * b1 + b2

@triton.jit
def reverse_scan_kernel(a_ptr, b_ptr, h_ptr, L, MIRRORED: tl.constexpr, BLOCK: tl.constexpr):
    "One block of a reverse scan: at mirrored offsets t = L-1-k with a forward scan, or at forward offsets with reverse=True."
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK)
    t = L - 1 - k if MIRRORED else k
    a = tl.load(a_ptr + row * L + t, mask=(t >= 0) & (t < L), other=0.0)
    b = tl.load(b_ptr + row * L + t, mask=(t >= 0) & (t < L), other=0.0)
    _, h = tl.associative_scan((a, b), 0, _combine, reverse=not MIRRORED)
    tl.store(h_ptr + row * L + t, h, mask=(t >= 0) & (t < L))
'''


def test_mirrored_offsets_lose_vector_loads(tmp_path):
    "Notebook 10's reason for forward-ordered offsets in the backward: mirrored indices compile to 4-byte loads, forward ones to 128-bit."
    (tmp_path / "mirrored.py").write_text(MIRRORED)
    code = (f"import sys, json; sys.path.insert(0, {str(tmp_path)!r}); import mirrored\n"
            "from ssm_course.gpu_report import compile_spec\n"
            "sig = {'a_ptr': '*fp32', 'b_ptr': '*fp32', 'h_ptr': '*fp32', 'L': 'i32', 'MIRRORED': 'constexpr', 'BLOCK': 'constexpr'}\n"
            "rows = [compile_spec(dict(kernel='k', variant=str(m), fn=mirrored.reverse_scan_kernel, signature=sig, constexprs={'MIRRORED': m, 'BLOCK': 1024},\n"
            "        aligned=['a_ptr', 'b_ptr', 'h_ptr', 'L'], num_warps=4, num_stages=1, dot=False, vector_loads=True), 90) for m in (False, True)]\n"
            "print(json.dumps([r['vector_loads'] for r in rows]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [True, False]  # forward-ordered: 128-bit; mirrored: not


def test_bfloat16_stores_round_to_nearest_even():
    "The scan kernels store bfloat16 with cvt.rn (round to nearest even), which the interpreter does not show (it truncates)."
    rows = gpu_report("--json", "--asm", "--modules", "ssm_course.triton_scan", "--variants", "bfloat16")
    assert len(rows) == 4 and all("cvt.rn.bf16x2.f32" in r["ptx"] for r in rows)
