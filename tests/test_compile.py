"""Every Triton kernel compiled for real GPUs (sm_80, sm_90) without one, as `python -m ssm_course.gpu_report` does it.

Per kernel variant that the launchers start (each module's `compile_specs()`), and per architecture: it compiles; it
spills nothing (stack and local memory 0); its shared memory fits (163 KB on sm_80, 227 KB on sm_90); tensor-core
instructions appear wherever it uses `tl.dot`; 128-bit global loads appear wherever its access is contiguous. On sm_75
and sm_100 one `tl.dot` kernel is compiled for the report's tensor-core detection (FMA on sm_75, `tcgen05.mma` on sm_100).

Time: everything is compiled once, in one separate process without TRITON_INTERPRET (which other test modules set),
with Triton's on-disk cache and gpu_report's cache of the measured facts (keyed by Triton's version, the kernel's source
with its callees, the spec and the architecture: a second run reads files). The specs at the benchmark shapes are all
checked. The shape sweeps (specs with a `sweep` dict: state sizes, chunk sizes, ...) are sampled deterministically, so
that a cold run stays within the time of the benchmark specs: per kernel, the sweep point with the largest swept values
(the largest tiles, where spills and shared memory peak) and every point whose sha256(kernel + variant) is 0 mod 4.
SSM_COURSE_COMPILE_SWEEP=all checks every point (as `python -m ssm_course.gpu_report` and notebook engine/gpu_report do)."""
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
import hashlib, multiprocessing
from concurrent.futures import ProcessPoolExecutor
def sampled(specs):  # the module docstring's rule: every spec without a sweep; of each kernel's sweep the largest point and a hash-chosen quarter
    if os.environ.get("SSM_COURSE_COMPILE_SWEEP") == "all": return list(range(len(specs)))
    size = lambda s: tuple(v for _, v in sorted(s["sweep"].items()) if isinstance(v, (int, float)))
    largest = {}
    for i, s in enumerate(specs):
        if "sweep" in s and (s["kernel"] not in largest or size(s) > size(specs[largest[s["kernel"]]])): largest[s["kernel"]] = i
    return [i for i, s in enumerate(specs) if "sweep" not in s or largest[s["kernel"]] == i
            or int(hashlib.sha256((s["kernel"] + s["variant"]).encode()).hexdigest(), 16) % 4 == 0]
jobs = [(m, i, arch, False) for m in MODULES for i in sampled(gpu_report.specs(m)) for arch in (80, 90)]
with ProcessPoolExecutor(min(2, os.cpu_count() or 1), mp_context=multiprocessing.get_context("fork")) as ex: rows = list(ex.map(gpu_report._compile_job, jobs))
out = {"coverage": gpu_report.coverage(MODULES), "rows": rows, "perf": gpu_report.perf_model(MODULES)}
dot = [s for s in gpu_report.specs("ssm_course.triton_ssm") if s["dot"] and "sweep" not in s][0]
out["dot_other_archs"] = [gpu_report.compile_spec(dot, arch) for arch in (75, 100)]
out["dot_other_archs_table"] = gpu_report.table(out["dot_other_archs"])
bf16 = gpu_report.report(("ssm_course.triton_scan",), (80, 90), variants=["bfloat16"], asm=True)  # already compiled above: from the cache
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


def test_tensor_cores_on_other_targets(compiled):
    "sm_100's tcgen05.mma counts as tensor cores (was reported False); on sm_75 tl.dot is FMA, and the table says so in a note, not a warning."
    sm75, sm100 = compiled["dot_other_archs"]
    assert sm75["error"] is None and sm75["tensor_cores"] is False and sm100["error"] is None and sm100["tensor_cores"] is True
    assert compiled["dot_other_archs_table"].endswith("On sm_75 `tl.dot` compiles to FMA instructions on the CUDA cores (Triton uses tensor cores from sm_80 on): "
                                                      "the results are the same, the dots run at the float32 rate.")


def test_scan_hot_loop(compiled):
    """The scan's instructions per element from its sm_90/sm_80 machine code. One trip through the loop is one iteration (not
    unrolled): the forward's loop holds the 128-bit loads of a and b and the stores of h for ROWS x BLOCK = 2048 elements
    by 256 threads (2 + 2 + 2); the backward's also the 4-byte loads of a_{t+1} and h_{t-1} (8 + 8), dL/dh (2), da and db (2 + 2)."""
    rs = {(r["kernel"], r["arch"]): r for r in of(compiled, "ssm_course.triton_scan") if r["variant"] == "float32"}
    for arch in (80, 90):
        fwd, bwd = rs["_scan_fwd_kernel", arch], rs["_scan_bwd_kernel", arch]
        assert fwd["hot_loop"]["loop"] and fwd["hot_loop"]["global memory"] == 6 and bwd["hot_loop"]["global memory"] == 22
        assert 20 < fwd["instructions_per_element"] < 40 and 35 < bwd["instructions_per_element"] < 65, (fwd["instructions_per_element"], bwd["instructions_per_element"])


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
    # the issue floor: the hot loop's thread-instructions per element (sm_90) times the elements, over 132 SMs x 4 schedulers x 32 x 1.98 GHz
    ipe = {r["kernel"]: r["instructions_per_element"] for r in compiled["rows"] if r["variant"] == "float32" and r["arch"] == 90 and r["module"] == "ssm_course.triton_scan"}
    for d, k in (("fwd", "_scan_fwd_kernel"), ("bwd", "_scan_bwd_kernel")):
        assert scan[d]["ms_issue"] == pytest.approx(1e3 * ipe[k] * n / (132 * 4 * 32 * 1.98e9), rel=1e-9)
        assert scan[d]["floor_ms"] == max(scan[d][c] for c in ("ms_memory", "ms_compute", "ms_sfu", "ms_issue")) and scan[d]["bound"] == "memory"
    assert all(r["floor_ms"] == max(r[c] for c in ("ms_memory", "ms_compute", "ms_sfu", "ms_issue") if r[c] is not None) for r in compiled["perf"])


def test_command_line_prints_the_table():
    "The table on stdout; on stderr (not a terminal here) a line before compiling and one per kernel compiled (a first run takes minutes: was silent)."
    r = subprocess.run([sys.executable, "-m", "ssm_course.gpu_report", "--modules", "ssm_course.triton_scan", "--variants", "float32",
                        "--kernels", "_scan_fwd_kernel", "--archs", "90"], env=clean_env(), capture_output=True, text=True, timeout=300)
    out, err = r.stdout, r.stderr.splitlines()
    assert out.startswith("| kernel | variant | arch | registers | spill_bytes | shared_bytes | tensor_cores | vector_loads |") and "| `_scan_fwd_kernel` | float32 | sm_90 |" in out
    assert re.fullmatch(r"compiling 1 kernel variant\(s\) for sm_90 with [12] worker\(s\)", err[0]) and re.fullmatch(r"compiled 1/1: _scan_fwd_kernel float32 sm_90 \(\d+ s\)", err[1]) and len(err) == 2, err


@pytest.mark.parametrize("args,msg", [
    (["--archs", "70"], "argument --archs: invalid choice: 70 (choose from 75, 80, 86, 89, 90, 100)"),
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


def test_ssd_and_kdiag_issue_from_every_loop_of_products(compiled):
    """Issue 29 item 5: the SSD kernels count each loop that issues tensor-core instructions (lesson 10b's mma_loops), not the
    innermost loop: the chunk outputs' two loops (the causal blocks, then the entering state), the C B^T backward's two loops of
    products around its loops over heads; a kernel whose one trip is known when compiling counts its whole listing."""
    rs = {(r["kernel"], r["variant"]): r for r in of(compiled, "ssm_course.triton_ssm") if r["arch"] == 90}
    f32, b16 = "bench: Q=64, p=64, n=128, float32", "bench: Q=64, p=64, n=128, bfloat16"
    out = rs["_ssd_out_kernel", f32]
    assert list(out["hot_loops"]) == ["causal", "state", "program"] and all(out["hot_loops"][k]["loop"] and out["hot_loops"][k]["mma"] > 0 for k in ("causal", "state"))
    assert out["hot_loops"]["causal"]["instructions"] > out["hot_loops"]["state"]["instructions"]  # the shortest loop is not the only hot one
    cbb = rs["_ssd_cb_bwd_kernel", f32]["hot_loops"]
    assert list(cbb) == ["dC", "dB", "program"] and cbb["dC"]["mma"] > 0 and cbb["dB"]["mma"] > 0 and not cbb["program"]["loop"]
    assert [l["loop"] for l in rs["_ssd_cb_bwd_kernel", b16]["hot_loops"].values()] == [False]  # one block per chunk: no loop of products
    assert list(rs["_ssd_out_kernel", b16]["hot_loops"]) == ["state", "program"]  # the diagonal block: code outside the loop
    assert rs["_ssd_pass_kernel", f32]["hot_loop"]["special functions"] == 1  # one chunk per trip: one exponential of its decay
    assert list(rs["_kdiag_fwd_kernel", "complex64"]["hot_loops"]) == ["lags", "program"]


def test_ssd_and_kdiag_issue_floors(compiled):
    """The SSD rows (float32, bench shape) and the kdiag rows have an issue floor: the sm_90 loops' thread-instructions (SASS count x 32 x
    warps per trip) over each trip's multiply-adds (or elements), times the op's multiply-adds at this shape, plus the code outside the
    loops (SASS count x 32 x warps) once per program, over 3.3e13/s. The float32
    SSD (three TF32 passes per product: split, convert, three mma) and the kdiag kernel are bound by issue; the bound is the largest floor."""
    rs = {(r["kernel"], r["variant"]): r for r in of(compiled, "ssm_course.triton_ssm") if r["arch"] == 90}
    perf = {(r["op"], r["direction"]): r for r in compiled["perf"]}
    rate, v = 132 * 4 * 32 * 1.98e9, "bench: Q=64, p=64, n=128, float32"
    b, l, h, p, n, Q = 2, 4096, 32, 64, 128, 64
    per = lambda k, loop, trip, v=v: (rs[k, v]["hot_loops"][loop] if loop else rs[k, v]["hot_loop"])["instructions"] * 32 * rs[k, v]["num_warps"] / trip
    tri = 3 / 4  # blocks of 32 steps: 3 of the 4 blocks of a 64 x 64 chunk are on or below the diagonal
    fwd = (per("_ssd_cb_kernel", "C B^T", 32 ** 3) * b * l * Q * n * tri + per("_ssd_state_kernel", "steps", 32 ** 3) * b * l * h * p * n
           + per("_ssd_out_kernel", "causal", 32 ** 3) * b * l * h * Q * p * tri + per("_ssd_out_kernel", "state", 32 ** 3) * b * l * h * p * n
           + per("_ssd_pass_kernel", None, 1024) * b * h * p * n * (l // Q)
           + per("_ssd_cb_kernel", "program", 1) * b * (l // Q) * 3 + per("_ssd_state_kernel", "program", 1) * b * h * (l // Q) * 2 * 4
           + per("_ssd_out_kernel", "program", 1) * b * h * (l // Q) * 2 * 2)  # programs: 3 blocks of C B^T per chunk; 2 x 4 state tiles; 2 x 2 output tiles
    assert perf["ssd", "fwd"]["ms_issue"] == pytest.approx(1e3 * fwd / rate, rel=1e-3)
    assert perf["ssd", "fwd"]["bound"] == perf["ssd", "bwd"]["bound"] == "issue" and perf["ssd", "fwd"]["ms_issue"] > 1.5 * perf["ssd", "fwd"]["ms_memory"]
    H, N, L = 1024, 64, 16384
    kd = per("_kdiag_fwd_kernel", "lags", 16 * 64 * 64, "complex64") * H * L * N + per("_kdiag_fwd_kernel", "program", 1, "complex64") * H * 4  # 4 programs per channel
    assert perf["ssm_kernel_diag", "fwd"]["ms_issue"] == pytest.approx(1e3 * kd / rate, rel=1e-3)
    for k in (("ssd", "fwd"), ("ssd", "bwd"), ("ssm_kernel_diag", "fwd"), ("ssm_kernel_diag", "bwd")):
        r = perf[k]
        assert r["bound"] == "issue" and r["floor_ms"] == r["ms_issue"] == max(r[c] for c in ("ms_memory", "ms_compute", "ms_sfu", "ms_issue")), k


def test_every_loop_of_products_is_named(compiled):
    "Every SSD spec compiled for sm_80 and sm_90 names as many loops of products as its machine code has (else the row has no count, and says why)."
    rs = [r for r in of(compiled, "ssm_course.triton_ssm") if r["kernel"].startswith("_ssd") and r["dot"] and r["error"] is None]
    assert rs and not [(name(r), r["hot_loops_error"]) for r in rs if r.get("hot_loops_error") or not isinstance(r.get("instructions_per_element"), dict)]
