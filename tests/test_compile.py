"""Every Triton kernel compiled for real GPUs (sm_80, sm_90) without one, as `python -m ssm_course.gpu_report` does it.

Per kernel variant that the launchers start at bench/gpu.py's shapes (each module's `compile_specs()`), and per
architecture: it compiles; it spills nothing (stack and local memory 0); its shared memory fits (163 KB on sm_80,
227 KB on sm_90); tensor-core instructions appear wherever it uses `tl.dot`; 128-bit global loads appear wherever its
access is contiguous. Everything is compiled once, in one separate process without TRITON_INTERPRET (which other test
modules set), with Triton's on-disk cache."""
import json, os, re, subprocess, sys
import pytest

pytest.importorskip("triton")
MODULES = ("ssm_course.triton_scan", "ssm_course.triton_ssm")

# A reverse scan over one block, at mirrored offsets (t = L-1-k, forward scan) or forward offsets (reverse=True).
MIRRORED = '''
import triton, triton.language as tl

@triton.jit
def _combine(a1, b1, a2, b2): return a1 * a2, a2 * b1 + b2

@triton.jit
def reverse_scan_kernel(a_ptr, b_ptr, h_ptr, L, MIRRORED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK)
    t = L - 1 - k if MIRRORED else k
    a = tl.load(a_ptr + row * L + t, mask=(t >= 0) & (t < L), other=0.0)
    b = tl.load(b_ptr + row * L + t, mask=(t >= 0) & (t < L), other=0.0)
    _, h = tl.associative_scan((a, b), 0, _combine, reverse=not MIRRORED)
    tl.store(h_ptr + row * L + t, h, mask=(t >= 0) & (t < L))

@triton.jit
def special_kernel(x_ptr, y_ptr, OP: tl.constexpr):  # one function of a block of floats
    i = tl.arange(0, 128)
    x = tl.load(x_ptr + i)
    if OP == 0: y = tl.exp(x)
    elif OP == 1: y = 1.0 / x
    elif OP == 2: y = tl.sin(x)
    elif OP == 3: y = tl.cos(x)
    else: y = tl.log(x)
    tl.store(y_ptr + i, y)
'''

SCRIPT = '''
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ssm_course import gpu_report
import mirrored
out = {"coverage": gpu_report.coverage(MODULES), "rows": gpu_report.report(MODULES, workers=min(2, os.cpu_count() or 1)),
       "perf": gpu_report.perf_model(MODULES)}
bf16 = gpu_report.report(("ssm_course.triton_scan",), variants=["bfloat16"], asm=True)  # already compiled above: from the cache
out["bf16_rtne"] = [(r["kernel"], r["arch"], "cvt.rn.bf16x2.f32" in r["ptx"]) for r in bf16]
sig = {"a_ptr": "*fp32", "b_ptr": "*fp32", "h_ptr": "*fp32", "L": "i32", "MIRRORED": "constexpr", "BLOCK": "constexpr"}
out["mirrored_vector_loads"] = [gpu_report.compile_spec(dict(kernel="k", variant=str(m), fn=mirrored.reverse_scan_kernel, signature=sig,
    constexprs={"MIRRORED": m, "BLOCK": 1024}, aligned=["a_ptr", "b_ptr", "h_ptr", "L"], num_warps=4, num_stages=1, dot=False,
    vector_loads=True), 90)["vector_loads"] for m in (False, True)]
import re, subprocess, tempfile, triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
def mufu(op, arch):  # the special-function-unit instructions in the machine code (SASS) of special_kernel
    k = triton.compile(ASTSource(fn=mirrored.special_kernel, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "OP": "constexpr"}, constexprs={"OP": op}),
                       target=GPUTarget("cuda", arch, 32))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        sass = subprocess.run([gpu_report._tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return sorted(set(re.findall(r"MUFU\\.\\w+", sass)))
out["mufu"] = {f"{name} sm_{arch}": mufu(op, arch) for op, name in enumerate(["exp", "1/x", "sin", "cos", "log"]) for arch in (80, 90)}
print(json.dumps(out))
'''.replace("MODULES", repr(MODULES))


def clean_env(): return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("compile")
    (d / "mirrored.py").write_text(MIRRORED)
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(d)], env=clean_env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def name(r): return f"{r['kernel']} [{r['variant']}] sm_{r['arch']}"


def of(compiled, module):
    assert compiled["coverage"][module]["has_specs"], f"{module} has no compile_specs()"
    return [r for r in compiled["rows"] if r["module"] == module]


@pytest.mark.parametrize("module", MODULES)
def test_every_kernel_has_a_spec(compiled, module):
    of(compiled, module)
    cov = compiled["coverage"][module]
    assert cov["kernels"] and not cov["uncovered"], cov


@pytest.mark.parametrize("module", MODULES)
def test_compiles_for_sm80_and_sm90(compiled, module):
    rs = of(compiled, module)
    assert {r["arch"] for r in rs} == {80, 90}
    assert all({"kernel", "variant", "arch", "registers", "spill_bytes", "shared_bytes", "tensor_cores", "vector_loads"} <= r.keys() for r in rs)
    assert not [(name(r), r["error"]) for r in rs if r["error"]]


@pytest.mark.parametrize("module", MODULES)
def test_no_spills(compiled, module):
    assert not [(name(r), r["stack_bytes"], r["local_bytes"]) for r in of(compiled, module) if r["error"] is None and r["spill_bytes"]]


@pytest.mark.parametrize("module", MODULES)
def test_shared_memory_fits(compiled, module):
    rs = of(compiled, module)
    assert all(r["shared_limit"] == {80: 163 * 1024, 90: 227 * 1024}[r["arch"]] for r in rs)
    assert not [(name(r), r["shared_bytes"]) for r in rs if r["error"] is None and r["shared_bytes"] > r["shared_limit"]]


@pytest.mark.parametrize("module", MODULES)
def test_tensor_cores_wherever_tl_dot(compiled, module):
    rs = [r for r in of(compiled, module) if r["error"] is None]
    assert not [name(r) for r in rs if r["dot"] and r["tensor_cores"] is not True]
    assert all(r["tensor_cores"] is None for r in rs if not r["dot"])


@pytest.mark.parametrize("module", MODULES)
def test_vector_loads_wherever_contiguous(compiled, module):
    assert not [name(r) for r in of(compiled, module) if r["error"] is None and r["expect_vector_loads"] and not r["vector_loads"]]


def test_mirrored_offsets_lose_vector_loads(compiled):
    "Notebook 10's reason for forward-ordered offsets in the backward: mirrored indices compile to 4-byte loads, forward ones to 128-bit."
    assert compiled["mirrored_vector_loads"] == [True, False]


def test_bfloat16_stores_round_to_nearest_even(compiled):
    "The scan kernels store bfloat16 with cvt.rn (round to nearest even), which the interpreter does not show (it truncates)."
    assert len(compiled["bf16_rtne"]) == 4 and all(ok for *_, ok in compiled["bf16_rtne"])


def test_special_functions_units(compiled):
    "Notebook 10b's performance model: tl.exp and a division's reciprocal run on the special function units (MUFU), sin, cos and log do not (libdevice polynomials)."
    want = {"exp": ["MUFU.EX2"], "1/x": ["MUFU.RCP"], "sin": [], "cos": [], "log": []}
    assert compiled["mufu"] == {f"{name} sm_{arch}": w for name, w in want.items() for arch in (80, 90)}


def test_perf_model_rows(compiled):
    scan = {r["direction"]: r for r in compiled["perf"] if r["op"] == "scan"}
    n = 8 * 1536 * 4096
    assert scan["fwd"]["bytes"] == 12 * n and scan["bwd"]["bytes"] == 20 * n  # forward + backward: 32 bytes per element
    assert all(r["bandwidth_is_estimate"] and r["floor_ms"] > 0 for r in compiled["perf"])


def test_command_line_prints_the_table():
    "The table on stdout; on stderr (not a terminal here) a line before compiling and one per kernel compiled (a first run takes minutes: was silent)."
    r = subprocess.run([sys.executable, "-m", "ssm_course.gpu_report", "--modules", "ssm_course.triton_scan", "--variants", "float32",
                        "--kernels", "_scan_fwd_kernel", "--archs", "90"], env=clean_env(), capture_output=True, text=True, timeout=300)
    out, err = r.stdout, r.stderr.splitlines()
    assert out.startswith("| kernel | variant | arch | registers | spill_bytes | shared_bytes | tensor_cores | vector_loads |") and "| `_scan_fwd_kernel` | float32 | sm_90 |" in out
    assert re.fullmatch(r"compiling 1 kernel variant\(s\) for sm_90 with [12] worker\(s\)", err[0]) and re.fullmatch(r"compiled 1/1: _scan_fwd_kernel float32 sm_90 \(\d+ s\)", err[1]) and len(err) == 2, err


@pytest.mark.parametrize("args,msg", [
    (["--archs", "70"], "argument --archs: invalid choice: 70 (choose from 80, 90)"),
    (["--modules", "foo"], "argument --modules: cannot import 'foo'"), (["--modules", "foo.bar"], "argument --modules: cannot import 'foo.bar'"),
    (["--modules", "ssm_course.checks"], "argument --modules: ssm_course.checks has no compile_specs()"),
    (["--kernels", "nothing_kernel"], "argument --kernels: no compile spec of ssm_course.triton_scan, ssm_course.triton_ssm has the kernel name(s) ['nothing_kernel']; they are ['_kdiag_bwd_kernel'"),
    (["--variants", "float8"], "argument --variants: no compile spec of ssm_course.triton_scan, ssm_course.triton_ssm has the variant name(s) ['float8']"),
    (["--kernels", "_scan_fwd_kernel", "--variants", "forward, bench, N=16"], "argument --variants: none of the kernels ['_scan_fwd_kernel'] has a variant in ['forward, bench, N=16']"),
    (["--workers", "0"], "argument --workers: must be at least 1, got 0"),
    (["--coverage", "--modules", "foo"], "argument --modules: cannot import 'foo'"),
])
def test_command_line_refuses_bad_options(args, msg, capsys):
    "Exit status 2 and argparse's one-line error naming the option, before compiling anything (was a traceback, or an empty table and exit 0)."
    from ssm_course import gpu_report
    with pytest.raises(SystemExit) as e: gpu_report.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[0].startswith("usage: ") and f"error: {msg}" in err[-1], err
    with pytest.raises(ValueError, match="kernels: no compile spec"): gpu_report.report(("ssm_course.triton_scan",), kernels=["nothing_kernel"])
    with pytest.raises(ValueError, match=r"archs: unknown architecture\(s\) \[70\]"): gpu_report.report(archs=(70,))
