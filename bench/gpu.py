"""The GPU benchmark behind bench/gpu.sh. See that script for usage."""
import argparse, json, math, os, signal, subprocess, sys, time, traceback
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers
SMOKE = "--smoke" in sys.argv
if SMOKE: os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
import torch.nn.functional as F

DEV = "cpu" if SMOKE else "cuda"
RESULTS = {"checks": {}, "peer_checks": {}, "timings": [], "errors": [], "skipped": [], "notes": [], "kernels": []}
OUT = None  # the output folder (main)
# Machine epsilon of each precision an op computes in. A check's tolerance is `growth` times the epsilon of the op's
# precision, with `growth` stated where the check is made (how the op's error grows with its size), never a bare number.
EPS = {"float32": 2.0 ** -23, "tf32": 2.0 ** -10, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
# The time budget: bench/gpu.sh sets BENCH_DEADLINE (seconds since the epoch) 450 s after it starts.
DEADLINE = float(os.environ.get("BENCH_DEADLINE") or time.time() + 450)


def left(): return DEADLINE - time.time()


class OutOfTime(BaseException):
    "Raised by the alarm at the deadline; a BaseException, so that a section's `except Exception` does not swallow it."


def _alarm(signum, frame): raise OutOfTime()


def timeit(f, reps=None):
    "Median milliseconds: triton.testing.do_bench on a GPU; a plain timer in smoke mode."
    if SMOKE:  # the interpreter compiles nothing: one call
        t0 = time.perf_counter(); f(); return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench
    return do_bench(f, warmup=25, rep=100 if reps is None else reps, return_mode="median")


def model_bytes(op, direction, shape):
    "The bytes `op` must move in `direction` (fwd or bwd) at `shape`: its module's perf_model(), scaled by the element count."
    from ssm_course.gpu_report import perf_model, MODULES
    for module in MODULES:  # one module at a time, so that one that fails to import does not hide the others
        try: rows = perf_model((module,), issue=False)  # bytes only: nothing to compile
        except Exception as e: RESULTS["errors"].append(f"perf_model {module}: {type(e).__name__}: {e}"); continue
        for r in rows:
            if r["op"] == op and r["direction"] == direction: return r["bytes"] * math.prod(shape) // math.prod(r["shape"])
    return None


def record(op, impl, shape, ms, nbytes=None, copy_gbps=None, note=""):
    "One timing; with `nbytes` (the op's model bytes, the same for every implementation) also the achieved GB/s and % of copy."
    row = {"op": op, "impl": impl, "shape": shape, "ms": ms, "note": note, "bytes": nbytes}
    if nbytes and ms:
        row["GB/s"] = nbytes / ms / 1e6
        if copy_gbps: row["% copy bw"] = 100 * row["GB/s"] / copy_gbps
    RESULTS["timings"].append(row)
    print(f"  {op:28s} {impl:34s} {ms:9.3f} ms" + (f"  {row.get('GB/s', 0):7.0f} GB/s" if nbytes else ""), flush=True)


def guarded(name, need=15, budget=None):
    """Run a benchmark section: record (not raise) its failure so the others still run; skip it when less than `need`
    seconds of the budget are left, stop it at the deadline or after `budget` seconds (a section with `need` 0 runs even
    after the deadline, for 10 s at most), and write the results so far (every row a stopped section recorded stays)."""
    def deco(fn):
        def run(*a, **k):
            if left() < need:
                RESULTS["skipped"].append(f"{name} ({max(left(), 0):.0f} s of the time budget left)")
                print(f"skipped {name}: {max(left(), 0):.0f} s of the time budget left", flush=True)
                return None
            t0 = time.time()
            signal.signal(signal.SIGALRM, _alarm)
            limit = left() if need > 0 else max(left(), 10)  # need 0: after the deadline, 10 s
            signal.setitimer(signal.ITIMER_REAL, max(0.5, min(limit, budget) if budget and not SMOKE else limit))
            try: return fn(*a, **k)
            except OutOfTime:
                why = f"its {budget} s" if budget and time.time() - t0 >= budget - 1 else "the run's"
                RESULTS["errors"].append(f"{name}: stopped at the end of {why} time budget")
                print(f"{name}: stopped at the end of {why} time budget", flush=True)
            except Exception as e:
                RESULTS["errors"].append(f"{name}: {type(e).__name__}: {e}")
                traceback.print_exc()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                RESULTS.setdefault("section_seconds", {})[name] = round(time.time() - t0, 1)
                save()
        return run
    return deco


def rel(x, ref): return float((x.double() - ref.double()).abs().max() / ref.double().abs().max().clamp(min=1e-30))


def check(name, err, tol=None, *, precision=None, growth=None, peer=False):
    """Record a full-size check; the tolerance is `growth` x EPS[`precision`] (a bare `tol` is recorded as untied to a
    precision). A peer's check (`peer=True`) goes to `peer_checks`: it says whether the peer agrees, not whether we pass."""
    if precision is not None: tol = growth * EPS[precision]
    RESULTS["peer_checks" if peer else "checks"][name] = {"max_rel_err": err, "tol": tol, "precision": precision, "growth": growth, "ok": err <= tol}
    how = f" = {growth:g} eps({precision})" if precision else " (not tied to a precision)"
    print(f"check {name}: max rel err {err:.2e} (tol {tol:.1e}{how}) {'OK' if err <= tol else 'FAIL'}", flush=True)


@guarded("loaded kernels", need=0)
def loaded_kernels():
    "n_regs and n_spills of every Triton kernel this run compiled and loaded on the GPU (none under the interpreter)."
    import importlib
    out = []
    for module in ("ssm_course.triton_scan", "ssm_course.triton_ssm"):
        try: mod = importlib.import_module(module)
        except Exception as e: RESULTS["errors"].append(f"{module}: {e}"); continue
        for name, fn in vars(mod).items():
            if not name.endswith("_kernel") or not hasattr(fn, "device_caches"): continue
            for caches in list(fn.device_caches.values()):
                for key, k in list(caches[0].items()):
                    if getattr(k, "n_regs", None) is None and hasattr(k, "_init_handles"): k._init_handles()
                    out.append({"kernel": name, "specialization": str(key)[:300], "n_regs": k.n_regs, "n_spills": k.n_spills,
                                "shared": k.metadata.shared, "num_warps": k.metadata.num_warps, "num_stages": getattr(k.metadata, "num_stages", None)})
    RESULTS["kernels"] = out
    print(f"{len(out)} compiled kernels loaded" + ("" if out else " (interpreter: nothing compiled)"), flush=True)
    for r in out: print(f"  {r['kernel']:28s} n_regs {r['n_regs']:4d}  n_spills {r['n_spills']:4d}  shared {r['shared']:7d} B  warps {r['num_warps']}", flush=True)
    if any(r["n_spills"] for r in out): RESULTS["errors"].append("some loaded kernels spill registers: " + ", ".join(sorted({r["kernel"] for r in out if r["n_spills"]})))
    return out


def copy_bandwidth():
    n = (1 << 20) if SMOKE else (1 << 28)  # 1 GiB of float32 on the GPU
    x, y = torch.randn(n, device=DEV), torch.empty(n, device=DEV)
    ms = timeit(lambda: y.copy_(x))
    gbps = 2 * 4 * n / ms / 1e6
    RESULTS["copy_GBps"] = gbps
    print(f"device-to-device copy: {gbps:.0f} GB/s", flush=True)
    return gbps


@guarded("scan", budget=90)
def bench_scan(copy):
    from ssm_course.scan import scan
    shapes = [(2, 3, 64)] if SMOKE else [(8, 1536, 4096), (8, 1536, 65536), (1, 16, 1 << 20)]  # the last: 16 rows of 2^20 steps (few rows, long L)
    for (B, D, L) in shapes:
        g = torch.Generator(device=DEV).manual_seed(0)
        a = 0.9 + 0.1 * torch.rand(B, D, L, device=DEV, generator=g)
        b = torch.randn(B, D, L, device=DEV, generator=g)
        gy = torch.randn(B, D, L, device=DEV, generator=g)
        shape = [B, D, L]
        # forward and backward at the full length against float64, on a few rows (the float64 autograd reference is slow);
        # the same rows of every peer's output and gradients
        k = 8 if L <= 4096 else 2
        ad, bd = a[:1, :k].double().requires_grad_(), b[:1, :k].double().requires_grad_()
        ref = scan(ad, bd, backend="torch")
        ref_da, ref_db = torch.autograd.grad(ref, (ad, bd), gy[:1, :k].double())
        refs = {"h": ref.detach(), "da": ref_da, "db": ref_db}
        del ad, bd, ref
        ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
        h = scan(ar, br, backend="triton")
        da, db = torch.autograd.grad(h, (ar, br), gy)
        # float32 recurrence: observed 1.8 eps (h) and 1.4 eps (da) relative to the largest value at L = 4096 in the interpreter;
        # with decays in [0.9, 1] a state remembers about 100 steps, so the error does not grow with L
        for name, x in [("h", h), ("da", da), ("db", db)]:
            check(f"scan {name} {tuple(shape)}", rel(x[:1, :k], refs[name]), precision="float32", growth=8)
        del h, da, db
        fwd_bytes, bwd_bytes = model_bytes("scan", "fwd", shape), model_bytes("scan", "bwd", shape)
        ours = scan(a, b, backend="triton")
        record("scan fwd", "ssm_course (triton)", shape, timeit(lambda: scan(a, b, backend="triton")), fwd_bytes, copy)
        ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
        h = scan(ar, br, backend="triton")
        record("scan bwd", "ssm_course (triton)", shape, timeit(lambda: torch.autograd.grad(h, (ar, br), gy, retain_graph=True)), bwd_bytes, copy)
        del h
        record("scan fwd+bwd", "ssm_course (triton)", shape, timeit(lambda: torch.autograd.grad(scan(ar, br, backend="triton"), (ar, br), gy)), fwd_bytes + bwd_bytes, copy)
        from ssm_course._engine.triton_scan import CONFIG as scan_config, _chunks
        if _chunks(B * D, L) > 1:  # few long rows take the chunk-parallel path: the same shape with a program per row beside it
            saved, note = scan_config["CHUNK_PROGRAMS"], f"a program per row (the chunk path, {_chunks(B * D, L)} chunks per row, off)"
            scan_config["CHUNK_PROGRAMS"] = 0
            try:
                record("scan fwd", "ssm_course (triton)", shape, timeit(lambda: scan(a, b, backend="triton")), fwd_bytes, copy, note=note)
                record("scan fwd+bwd", "ssm_course (triton)", shape, timeit(lambda: torch.autograd.grad(scan(ar, br, backend="triton"), (ar, br), gy)), fwd_bytes + bwd_bytes, copy, note=note)
            finally: scan_config["CHUNK_PROGRAMS"] = saved
        # Peers, each in its own layout, built outside the timed region; the note gives its largest difference from ours
        # (relative to the largest value), which shows that it solves the same recurrence.
        try:
            from accelerated_scan.scalar import scan as as_scan  # its Triton version: (B, C, T), h_t = gate_t h_{t-1} + token_t
            got = [as_scan(a, b)] + list(torch.autograd.grad(as_scan(ar, br), (ar, br), gy))
            for name, x in zip(("h", "da", "db"), got): check(f"accelerated-scan {name} {tuple(shape)}", rel(x[:1, :k], refs[name]), precision="float32", growth=8, peer=True)
            note = f"max rel diff from ours {rel(got[0], ours):.1e}"
            del got
            record("scan fwd", "accelerated-scan (triton)", shape, timeit(lambda: as_scan(a, b)), fwd_bytes, copy, note=note)
            if not SMOKE: record("scan fwd+bwd", "accelerated-scan (triton)", shape, timeit(lambda: torch.autograd.grad(as_scan(ar, br), (ar, br), gy)), fwd_bytes + bwd_bytes, copy, note=note)
        except Exception as e: RESULTS["errors"].append(f"accelerated-scan {shape}: {type(e).__name__}: {e}")
        try:
            from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn  # (B, T, D), h_t = exp(g_t) h_{t-1} + x_t
            x_, g_ = b.transpose(1, 2).contiguous(), torch.log(a).transpose(1, 2).contiguous()
            xr, gr, gyt = x_.clone().requires_grad_(), g_.clone().requires_grad_(), gy.transpose(1, 2).contiguous()
            for name, f in [("fla chunk_hgrn", chunk_hgrn), ("fla fused_recurrent_hgrn", fused_recurrent_hgrn)]:
                try:
                    out = f(x_, g_)[0].transpose(1, 2)
                    dx, dg = torch.autograd.grad(f(xr, gr)[0], (xr, gr), gyt)  # dL/dg = dL/da * a (g = log a)
                    for n_, x in (("h", out), ("da", dg.transpose(1, 2) / a), ("db", dx.transpose(1, 2))):
                        check(f"{name} {n_} {tuple(shape)}", rel(x[:1, :k], refs[n_]), precision="float32", growth=8, peer=True)
                    note = f"(B, T, D) layout; max rel diff from ours {rel(out, ours):.1e}"
                    del out, dx, dg
                    record("scan fwd", name, shape, timeit(lambda: f(x_, g_)), fwd_bytes, copy, note=note)
                    record("scan fwd+bwd", name, shape, timeit(lambda: torch.autograd.grad(f(xr, gr)[0], (xr, gr), gyt)), fwd_bytes + bwd_bytes, copy, note=note)
                except Exception as e: RESULTS["errors"].append(f"{name} {shape}: {type(e).__name__}: {e}")
            del x_, g_, xr, gr, gyt
        except Exception as e: RESULTS["errors"].append(f"fla hgrn {shape}: {type(e).__name__}: {e}")
        del a, b, gy, ar, br, ours
        if not SMOKE: torch.cuda.empty_cache()
        if left() < 60 and (B, D, L) != shapes[-1]: RESULTS["skipped"].append(f"scan shapes after {tuple(shape)} (time budget)"); break


@guarded("scan configurations", need=60)
def tune_scan(copy, shape=(8, 1536, 4096)):
    "Time the scan kernels at other (BLOCK, num_warps, num_stages) than the fixed one; each checked against the fixed config's output."
    from ssm_course.scan import scan
    from ssm_course import triton_scan
    fixed = dict(triton_scan.CONFIG)
    g = torch.Generator(device=DEV).manual_seed(1)
    a, b = 0.9 + 0.1 * torch.rand(*shape, device=DEV, generator=g), torch.randn(*shape, device=DEV, generator=g)
    gy = torch.randn(*shape, device=DEV, generator=g)
    ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = [scan(a, b, backend="triton")] + list(torch.autograd.grad(scan(ar, br, backend="triton"), (ar, br), gy))
    fwd_bytes, bwd_bytes = model_bytes("scan", "fwd", shape), model_bytes("scan", "bwd", shape)
    try:
        for block, warps in [(2048, 8), (1024, 4), (4096, 8), (4096, 16)]:
            for stages in (2, 1, 3):
                if left() < 20: RESULTS["skipped"].append(f"scan configurations from BLOCK {block}, warps {warps}, stages {stages} (time budget)"); return
                triton_scan.CONFIG.update(BLOCK=block, num_warps=warps, num_stages=stages)
                note = f"tune: BLOCK {block}, warps {warps}, stages {stages}" + (" (fixed config)" if triton_scan.CONFIG == fixed else "")
                try:
                    got = [scan(a, b, backend="triton")] + list(torch.autograd.grad(scan(ar, br, backend="triton"), (ar, br), gy))
                    err = max(rel(x, y) for x, y in zip(got, want))
                    if err > 8 * EPS["float32"]: RESULTS["errors"].append(f"scan {note}: differs from the fixed config by {err:.1e}")
                    record("scan fwd", "ssm_course (triton)", list(shape), timeit(lambda: scan(a, b, backend="triton")), fwd_bytes, copy, note=note)
                    h = scan(ar, br, backend="triton")
                    record("scan bwd", "ssm_course (triton)", list(shape), timeit(lambda: torch.autograd.grad(h, (ar, br), gy, retain_graph=True)), bwd_bytes, copy, note=note)
                except Exception as e: RESULTS["errors"].append(f"scan {note}: {type(e).__name__}: {e}")
    finally: triton_scan.CONFIG.update(fixed)


@guarded("training", need=45)
def train_steps():
    "A few training steps through the Triton backends (Mamba: the selective scan; S4D: ssm_kernel_diag) with bf16 autocast, each in its own process; --smoke: the same command line on the CPU (its plumbing only)."
    runs = [("mamba", ["--device", "cpu", "--steps", "2"])] if SMOKE else [(layer, ["--device", "cuda", "--amp", "bf16", "--steps", "20"]) for layer in ("mamba", "s4d")]
    oks, log = [], open(os.path.join(OUT, "train.log"), "w")
    for layer, flags in runs:
        cmd = [sys.executable, "-m", "ssm_course.train", *flags, "--layer", layer, "--task", "selective_copying"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5, min(150, left() - 10)))
            ok, text = res.returncode == 0, res.stdout + res.stderr
        except subprocess.TimeoutExpired as e: ok, text = False, f"timed out after {e.timeout:.0f} s\n" + str(e.stdout or "")
        line = f"TRAIN {'OK' if ok else 'FAILED'} ({layer})"
        log.write(" ".join(cmd) + "\n" + text + "\n" + line + "\n"); log.flush()
        print(line, flush=True)
        oks.append(ok)
    log.close()
    tail = open(os.path.join(OUT, "train.log")).read()[-2000:]
    RESULTS["train"] = {"ok": all(oks), "log_tail": tail}
    if not all(oks): RESULTS["errors"].append("training failed: see train.log")


@guarded("ssm_kernel_diag", budget=45)
def bench_kernel_diag(copy):
    from ssm_course.conv import ssm_kernel_diag
    from ssm_course.triton_ssm import KDIAG_SHAPE
    H, N, L = (4, 8, 64) if SMOKE else KDIAG_SHAPE
    shape = [H, N, L]
    g = torch.Generator(device=DEV).manual_seed(0)
    dA = ((1 - 1e-3 * torch.rand(H, N, device=DEV, generator=g)) * torch.exp(1j * 6.28 * torch.rand(H, N, device=DEV, generator=g))).to(torch.complex64)
    dB, C = (torch.randn(H, N, device=DEV, dtype=torch.complex64, generator=g) for _ in range(2))
    gK = torch.randn(H, L, device=DEV, dtype=torch.complex64, generator=g)
    # forward and backward at full length against float64, on 8 channels. float32 phases reduced in float64 and tf32x3 dots:
    # observed 1.1 eps (K) and 1.1 eps (gradients) at L = 16384 in the interpreter; a GPU's ex2.approx and tf32x3 add a few eps
    ins = [x[:8].clone().requires_grad_() for x in (dA, dB, C)]
    ind = [x[:8].cdouble().requires_grad_() for x in (dA, dB, C)]
    K, Kd = ssm_kernel_diag(*ins, L, backend="triton"), ssm_kernel_diag(*ind, L, backend="torch")
    got, want = torch.autograd.grad(K, ins, gK[:8]), torch.autograd.grad(Kd, ind, gK[:8].cdouble())
    check(f"ssm_kernel_diag K {tuple(shape)}", rel(torch.view_as_real(K), torch.view_as_real(Kd)), precision="float32", growth=16)
    for name, x, r in zip(("ddA", "ddB", "dC"), got, want): check(f"ssm_kernel_diag {name} {tuple(shape)}", rel(torch.view_as_real(x), torch.view_as_real(r)), precision="float32", growth=16)
    fwd_bytes, bwd_bytes = model_bytes("ssm_kernel_diag", "fwd", shape), model_bytes("ssm_kernel_diag", "bwd", shape)
    own = [model_bytes("ssm_kernel_diag (torch, blocked)", d, shape) for d in ("fwd", "bwd")]  # what the blocked path itself moves (perf_model)
    # both paths timed side by side, same inputs: issue 15's target is triton >= 2x faster than the blocked PyTorch path
    for impl, backend in [("ssm_course (triton)", "triton"), ("ssm_course (torch, blocked)", "torch")]:
        note = "bytes: the Triton kernels' (perf_model)" + (f"; the blocked path's own model: {own[0] / 1e6:.0f} MB fwd, {own[1] / 1e6:.0f} MB bwd" if backend == "torch" and None not in own else "")
        record("ssm_kernel_diag fwd", impl, shape, timeit(lambda: ssm_kernel_diag(dA, dB, C, L, backend=backend)), fwd_bytes, copy, note=note)
        xs = [x.clone().requires_grad_() for x in (dA, dB, C)]
        K = ssm_kernel_diag(*xs, L, backend=backend)
        record("ssm_kernel_diag bwd", impl, shape, timeit(lambda: torch.autograd.grad(K, xs, gK, retain_graph=True)), bwd_bytes, copy, note=note)
        del K
        record("ssm_kernel_diag fwd+bwd", impl, shape, timeit(lambda: torch.autograd.grad(ssm_kernel_diag(*xs, L, backend=backend), xs, gK)), fwd_bytes + bwd_bytes, copy, note=note)
    naive = lambda: torch.einsum("hn,hnl->hl", C * dB, torch.exp(torch.log(dA)[..., None] * torch.arange(L, device=DEV)))
    record("ssm_kernel_diag fwd", "naive einsum", shape, timeit(naive), fwd_bytes, copy, note="bytes: the Triton kernels' (perf_model)")


@guarded("selective_scan", budget=75)
def bench_selective(copy):
    from ssm_course.selective import selective_scan, selective_scan_ref
    from ssm_course.triton_ssm import SELECTIVE_SHAPE, selective_scan_triton
    b, d, n, l = (1, 4, 4, 32) if SMOKE else SELECTIVE_SHAPE
    shape = [b, d, n, l]
    g = torch.Generator(device=DEV).manual_seed(0)
    u, delta = torch.randn(b, d, l, device=DEV, generator=g), torch.randn(b, d, l, device=DEV, generator=g) - 2
    A = -torch.exp(0.5 * torch.randn(d, n, device=DEV, generator=g))
    B, C = torch.randn(b, n, l, device=DEV, generator=g), torch.randn(b, n, l, device=DEV, generator=g)
    gy = torch.randn_like(u)
    # full length against the float64 chunked PyTorch path (itself checked against the loop), on one batch and 64 channels,
    # forward and every gradient. float32 recurrence: observed <= 3.5 eps (y) and 13 eps (gradients, sums over l) at l = 19
    sl = lambda x: x[:1, :64] if x.dim() == 3 and x.shape[1] == d else (x[:64] if x.shape[0] == d else x[:1])
    ins = [sl(x).clone().requires_grad_() for x in (u, delta, A, B, C)]
    ind = [sl(x).double().requires_grad_() for x in (u, delta, A, B, C)]
    y, yd = selective_scan_triton(*ins, delta_softplus=True), selective_scan(*ind, delta_softplus=True, backend="torch")
    got, want = torch.autograd.grad(y, ins, sl(gy)), torch.autograd.grad(yd, ind, sl(gy).double())
    check(f"selective_scan y {tuple(shape)}", rel(y, yd), precision="float32", growth=16)
    for name, x, r in zip(("du", "ddelta", "dA", "dB", "dC"), got, want): check(f"selective_scan {name} {tuple(shape)}", rel(x, r), precision="float32", growth=128)
    fwd_bytes, bwd_bytes = model_bytes("selective_scan", "fwd", shape), model_bytes("selective_scan", "bwd", shape)
    xs = [x.clone().requires_grad_() for x in (u, delta, A, B, C)]
    Dm = torch.zeros(d, device=DEV)  # the skip term D u: mambapy's selective_scan always takes one, so ours gets it too
    for impl, f in [("ssm_course (triton kernels)", lambda *a: selective_scan_triton(*a, D=Dm, delta_softplus=True)),
                    ("ssm_course selective_scan(backend='triton')", lambda *a: selective_scan(*a, D=Dm, delta_softplus=True, backend="triton"))]:
        record("selective_scan fwd", impl, shape, timeit(lambda: f(u, delta, A, B, C)), fwd_bytes, copy)
        y = f(*xs)
        record("selective_scan bwd", impl, shape, timeit(lambda: torch.autograd.grad(y, xs, gy, retain_graph=True)), bwd_bytes, copy)
        del y
        record("selective_scan fwd+bwd", impl, shape, timeit(lambda: torch.autograd.grad(f(*xs), xs, gy)), fwd_bytes + bwd_bytes, copy)
    try:  # mambapy as its blocks call it: MambaBlock.selective_scan on its own contiguous (b, l, d) and (b, l, n) tensors,
        # prepared outside the timed region; softplus inside, as in its block (and in ours, delta_softplus=True); the same D = 0 as ours
        from mambapy.mamba import MambaBlock
        xm, dm, Bm, Cm = (t.transpose(1, 2).contiguous().requires_grad_() for t in (u, delta, B, C))
        Am, gym = A.clone().requires_grad_(), gy.transpose(1, 2).contiguous()
        mamba = lambda: MambaBlock.selective_scan(None, xm, F.softplus(dm), Am, Bm, Cm, Dm)  # (b, l, d)
        with torch.no_grad():
            ym = mamba().transpose(1, 2)
            check(f"mambapy y {tuple(shape)}", rel(sl(ym), yd), precision="float32", growth=16, peer=True)  # the same rows, full length
            note = f"(b, l, d) layout; max rel diff from ours {rel(ym, selective_scan_triton(u, delta, A, B, C, D=Dm, delta_softplus=True)):.1e}"
            del ym
        record("selective_scan fwd+bwd", "mambapy MambaBlock.selective_scan", shape, timeit(lambda: torch.autograd.grad(mamba(), (xm, dm, Am, Bm, Cm), gym)),
               fwd_bytes + bwd_bytes, copy, note=note + "; GB/s: the Triton kernels' bytes")
        del xm, dm, Bm, Cm, Am, gym
    except Exception as e: RESULTS["errors"].append(f"mambapy: {type(e).__name__}: {e}")
    if peers.has_selective_scan_cuda():  # mamba-ssm's CUDA kernel: only where its extension was built (the wheel bench/gpu.sh makes has none)
        try:
            xp = [sl(x).clone().requires_grad_() for x in (u, delta, A, B, C)]
            yp = peers.mamba_selective_scan(*xp, Dm[:64])
            check(f"mamba-ssm selective_scan_fn y {tuple(shape)}", rel(yp, yd), precision="float32", growth=16, peer=True)
            for name, x, r in zip(("du", "ddelta", "dA", "dB", "dC"), torch.autograd.grad(yp, xp, sl(gy)), want):
                check(f"mamba-ssm selective_scan_fn {name} {tuple(shape)}", rel(x, r), precision="float32", growth=128, peer=True)
            del xp, yp
            impl = "mamba-ssm selective_scan_fn (CUDA)"
            record("selective_scan fwd", impl, shape, timeit(lambda: peers.mamba_selective_scan(u, delta, A, B, C, Dm)), fwd_bytes, copy, note="GB/s: the Triton kernels' bytes")
            record("selective_scan fwd+bwd", impl, shape, timeit(lambda: torch.autograd.grad(peers.mamba_selective_scan(*xs, Dm), xs, gy)), fwd_bytes + bwd_bytes, copy, note="GB/s: the Triton kernels' bytes")
        except Exception as e: RESULTS["errors"].append(f"mamba-ssm selective_scan_fn: {type(e).__name__}: {e}")
    else: RESULTS["notes"].append("mamba-ssm selective_scan_fn not timed: its CUDA extension selective_scan_cuda is not built here")
    def loop():  # the reference loop, timed once (it is slow)
        torch.autograd.grad(selective_scan_ref(*xs, delta_softplus=True), xs, gy)
    t0 = time.perf_counter(); loop(); torch.cuda.synchronize() if not SMOKE else None
    record("selective_scan fwd+bwd", "PyTorch reference loop", shape, (time.perf_counter() - t0) * 1e3, None, copy, note="one run")


def _ssd_case(dtype=torch.float32):
    "SSD's benchmark inputs (b, l, h, p, n) = SSD_SHAPE, the upstream gradient, and the slice checked at the full length: batch 0, the first heads."
    from ssm_course.triton_ssm import SSD_SHAPE
    b, l, h, p, n = (1, 32, 2, 4, 4) if SMOKE else SSD_SHAPE
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(b, l, h, p, device=DEV, generator=g)
    dt = F.softplus(torch.randn(b, l, h, device=DEV, generator=g) - 2)
    A = -torch.exp(torch.randn(h, device=DEV, generator=g))
    B, C = (torch.randn(b, l, 1, n, device=DEV, generator=g) / math.sqrt(n) for _ in range(2))
    gy = torch.randn_like(x)
    hs = min(h, 4)
    sl = lambda ts: [ts[0][:1, :, :hs], ts[1][:1, :, :hs], ts[2][:hs], ts[3][:1], ts[4][:1]]  # x, dt, A, B, C: batch 0, heads < hs, every step
    return [b, l, h, p, n], [t.to(dtype) for t in (x, dt, A, B, C)], gy.to(dtype), sl


def _ssd_reference(ins, gy):
    "y and the gradients of (x, dt, A, B, C) by the float64 chunked PyTorch path, from `ins` as given (bfloat16 values exactly)."
    from ssm_course.ssd import ssd
    ind = [t.detach().double().requires_grad_() for t in ins]
    yd = ssd(*ind, chunk_size=64, backend="torch")
    return yd.detach(), torch.autograd.grad(yd, ind, gy.double())


def _check_ssd(label, f, ins, gy, ref, precision, growth_y, growth_grad, peer=False):
    "Check f(x, dt, A, B, C) and its gradients on the slice `ins` (full length) against the float64 reference `ref`."
    xs = [t.detach().clone().requires_grad_() for t in ins]
    y = f(*xs)
    check(f"{label} y", rel(y, ref[0]), precision=precision, growth=growth_y, peer=peer)
    for name, t, r in zip(("dx", "ddt", "dA", "dB", "dC"), torch.autograd.grad(y, xs, gy), ref[1]):
        check(f"{label} {name}", rel(t, r), precision=precision, growth=growth_grad, peer=peer)


def _time_ssd(impl, f, ins, gy, shape, copy, note=""):
    "ssd's forward and forward + backward rows for one implementation f(x, dt, A, B, C)."
    fwd_bytes, bwd_bytes = model_bytes("ssd", "fwd", shape), model_bytes("ssd", "bwd", shape)
    record("ssd fwd", impl, shape, timeit(lambda: f(*ins)), fwd_bytes, copy, note=note)
    xs = [t.detach().clone().requires_grad_() for t in ins]
    record("ssd fwd+bwd", impl, shape, timeit(lambda: torch.autograd.grad(f(*xs), xs, gy)), fwd_bytes + bwd_bytes, copy, note=note)


@guarded("ssd", budget=60)
def bench_ssd(copy):
    from ssm_course.ssd import ssd
    shape, ins, gy, sl = _ssd_case()
    # The full length against the float64 chunked PyTorch path on batch 0 and 4 heads, forward and every gradient. float32
    # inputs, tf32x3 dots: observed <= 3 eps (y) and 24 eps (gradients; A's sums over every step) in the interpreter;
    # bfloat16 inputs: y within 1 ulp
    hs = sl(ins)[0].shape[2]
    ref = _ssd_reference(sl(ins), gy[:1, :, :hs])
    ours = lambda chunk: (lambda *t: ssd(*t, chunk_size=chunk, backend="triton"))
    _check_ssd(f"ssd {tuple(shape)}", ours(64), sl(ins), gy[:1, :, :hs], ref, "float32", 16, 128)
    bshape, bins, bgy, _ = _ssd_case(torch.bfloat16)
    bref = _ssd_reference(sl(bins), bgy[:1, :, :hs])
    check(f"ssd y bf16 {tuple(shape)}", rel(ssd(*sl(bins), chunk_size=64, backend="triton"), bref[0]), precision="bfloat16", growth=1)
    save()
    _time_ssd("ssm_course (triton)", ours(64), ins, gy, shape, copy, note="chunk 64")
    _time_ssd("ssm_course (torch chunked)", lambda *t: ssd(*t, chunk_size=64, backend="torch"), ins, gy, shape, copy, note="chunk 64")
    _time_ssd("ssm_course (triton) bf16", ours(64), bins, bgy, shape, copy, note="chunk 64; bfloat16 inputs")
    try: _time_ssd("ssm_course (triton)", ours(256), ins, gy, shape, copy, note="chunk 256 (Mamba-2's default)")
    except Exception as e: RESULTS["errors"].append(f"ssd chunk 256: {type(e).__name__}: {e}")


@guarded("ssd peers", budget=90)
def bench_ssd_peers(copy):
    """mamba-ssm's mamba_chunk_scan_combined (chunk 256, as Mamba-2 calls it) and fla's chunk_simple_gla, float32 and
    bfloat16: each checked at the full length against float64 on the slice ours is checked on, then timed. Their first
    calls (untimed) autotune; the section stops after its budget, keeping every row it recorded."""
    shape, ins, gy, sl = _ssd_case()
    bshape, bins, bgy, _ = _ssd_case(torch.bfloat16)
    hs = sl(ins)[0].shape[2]
    ref, bref = _ssd_reference(sl(ins), gy[:1, :, :hs]), _ssd_reference(sl(bins), bgy[:1, :, :hs])
    cases = [("mamba-ssm mamba_chunk_scan_combined", lambda *t: peers.mamba_ssd(*t, chunk_size=min(256, shape[1])), "chunk 256; "),
             ("fla chunk_simple_gla", peers.fla_simple_gla, "q = C, k = B, v = dt x, g = dt A; ")]
    for impl, f, note in cases:
        try:
            # their float32 dots are TF32 (Triton's default for tl.dot on float32): the tolerance is TF32's, as for agreement
            t0 = time.time()
            _check_ssd(f"{impl} {tuple(shape)}", f, sl(ins), gy[:1, :, :hs], ref, "tf32", 16, 128, peer=True)
            if SMOKE: RESULTS["notes"].append(f"{impl} bf16: not checked under the interpreter, whose bfloat16 tl.dot is wrong (GPU.md)")
            else: _check_ssd(f"{impl} bf16 {tuple(shape)}", f, sl(bins), bgy[:1, :, :hs], bref, "bfloat16", 8, 64, peer=True)
            f(*ins); f(*bins)  # autotuning at the timed shapes, outside the timing
            note += f"first calls (autotuning) {time.time() - t0:.0f} s; GB/s: the Triton kernels' bytes"
            _time_ssd(impl, f, ins, gy, shape, copy, note=note)
            _time_ssd(impl + " bf16", f, bins, bgy, shape, copy, note=note)
        except Exception as e: RESULTS["errors"].append(f"{impl}: {type(e).__name__}: {str(e)[:300]}")
        save()


@guarded("selective step", budget=20)
def bench_step(copy):
    """One decoding step of the selective SSM, state (b, d, n) = SELECTIVE_SHAPE's: mamba-ssm's selective_state_update
    (Triton) against ours, selective_scan over one step with the state carried (triton and torch backends), each checked
    against the float64 closed form exp(dt A) h + dt x B, y = C . h + D x."""
    from ssm_course.selective import selective_scan
    from ssm_course.triton_ssm import SELECTIVE_SHAPE
    b, d, n, _ = (2, 4, 4, 1) if SMOKE else SELECTIVE_SHAPE
    g = torch.Generator(device=DEV).manual_seed(0)
    h0, x, D = torch.randn(b, d, n, device=DEV, generator=g), torch.randn(b, d, device=DEV, generator=g), torch.randn(d, device=DEV, generator=g)
    dt, A = 0.1 * torch.rand(b, d, device=DEV, generator=g), -torch.exp(torch.randn(d, n, device=DEV, generator=g))
    B, C = torch.randn(b, n, device=DEV, generator=g), torch.randn(b, n, device=DEV, generator=g)
    hd = torch.exp(dt.double()[..., None] * A.double()) * h0.double() + (dt.double() * x.double())[..., None] * B.double()[:, None]
    yd = (hd * C.double()[:, None]).sum(-1) + D.double() * x.double()
    shape, nbytes = [b, d, n, 1], 4 * (2 * b * d * n + d * n + 4 * b * d + 2 * b * n)  # read h, A, x, dt, B, C, D; write h, y
    def ours(backend):
        def f():
            y, h = selective_scan(x[..., None], dt[..., None], A, B[..., None], C[..., None], D, initial_state=h0, return_last_state=True, backend=backend)
            return y[..., 0], h
        return f
    impls = [("ssm_course selective_scan, 1 step (triton)", ours("triton")), ("ssm_course selective_scan, 1 step (torch)", ours("torch"))]
    def mamba():
        h = h0.clone()
        return peers.mamba_step(h, x, dt, A, B, C, D), h
    try: peers.mamba_ssm(); impls.append(("mamba-ssm selective_state_update", mamba))
    except ImportError as e: RESULTS["errors"].append(f"mamba-ssm: {e}")
    for impl, f in impls:
        try:
            y, h = f()
            check(f"{impl} y {tuple(shape)}", rel(y, yd), precision="float32", growth=4, peer=impl.startswith("mamba"))
            check(f"{impl} state {tuple(shape)}", rel(h, hd), precision="float32", growth=4, peer=impl.startswith("mamba"))
            record("selective step", impl, shape, timeit(f), nbytes, copy, note="the state copied first in mamba-ssm's (it updates in place)" if impl.startswith("mamba") else "")
        except Exception as e: RESULTS["errors"].append(f"{impl}: {type(e).__name__}: {str(e)[:300]}")


PEERS = ("accelerated-scan", "fla-core", "mamba-ssm", "mambapy", "einops", "packaging", "fastcore", "tqdm")


def versions():
    from importlib.metadata import version, PackageNotFoundError
    info = {"torch": torch.__version__, "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}
    try:
        import triton; info["triton"] = triton.__version__
    except ImportError: info["triton"] = None
    if not SMOKE:
        info["gpu"] = torch.cuda.get_device_name()
        try: info["driver"] = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], text=True).strip()
        except Exception: info["driver"] = None
    info["packages"] = {}
    for p in PEERS:  # None: not importable here (bench/gpu.sh --wheels fetches them)
        try: info["packages"][p] = version(p)
        except PackageNotFoundError: info["packages"][p] = None
    return info


def table():
    "The timings as markdown; GB/s is the op's model bytes (the same for every implementation) over the median time."
    lines = ["| op | implementation | shape | median ms | model MB | GB/s | % of copy bw | note |", "|---|---|---|---|---|---|---|---|"]
    for r in RESULTS["timings"]:
        mb = f"{r['bytes'] / 1e6:.0f}" if r.get("bytes") else ""
        lines.append(f"| {r['op']} | {r['impl']} | {tuple(r['shape'])} | {r['ms']:.3f} | {mb} | {r.get('GB/s', float('nan')):.0f} | {r.get('% copy bw', float('nan')):.0f} | {r['note']} |")
    return "\n".join(lines)


def markdown():
    v = RESULTS["versions"]
    copy = RESULTS.get("copy_GBps")
    head = (f"Measured {v.get('date')} on {v.get('gpu', 'CPU (smoke test)')}, driver {v.get('driver')}, torch {v['torch']}, triton {v['triton']}"
            + (f"; copy bandwidth {copy:.0f} GB/s" if copy else "") + ".")
    if RESULTS["skipped"]: head += "\n\nSkipped (time budget): " + "; ".join(RESULTS["skipped"]) + "."
    if RESULTS["notes"]: head += "\n\nNotes: " + "; ".join(RESULTS["notes"]) + "."
    checks = [f"| {n} | {'ours' if k == 'checks' else 'peer'} | {c['max_rel_err']:.1e} | {c['tol']:.1e} | {'OK' if c['ok'] else 'FAIL'} |"
              for k in ("checks", "peer_checks") for n, c in RESULTS[k].items()]
    if checks: head += "\n\nChecks against float64 at the full length (max error relative to the largest value):\n\n| check | whose | error | tolerance | |\n|---|---|---|---|---|\n" + "\n".join(checks)
    return head + "\n\n" + table()


def save():
    "Write gpu.json and gpu.md as they stand (after every section, so that a run stopped early keeps what it measured)."
    if OUT is None: return
    RESULTS["seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(OUT, "gpu.json"), "w") as f: json.dump(RESULTS, f, indent=1)
    with open(os.path.join(OUT, "gpu.md"), "w") as f: f.write(markdown() + "\n")


T0 = time.time()


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    OUT = args.out
    os.makedirs(OUT, exist_ok=True)
    RESULTS["versions"] = versions()
    print(RESULTS["versions"], f"time budget: {left():.0f} s", flush=True)
    missing = [p for p, v in RESULTS["versions"]["packages"].items() if v is None]
    if missing: print("not importable (their sections record errors): " + ", ".join(missing), flush=True)
    copy = copy_bandwidth()
    save()
    # The op timings first, then the training steps, then the scan configuration sweep: what is skipped when time runs
    # out is the least needed.
    if SMOKE:  # the interpreter cannot benchmark autotune configs: the peers' first configs
        try: peers.mamba_ssm(); import mamba_ssm.ops.triton.ssd_combined, mamba_ssm.ops.triton.selective_state_update; print("pinned", peers.pin_autotune("mamba_ssm"), "mamba-ssm autotune(s)", flush=True)
        except ImportError: pass
    for section in (bench_scan, bench_kernel_diag, bench_selective, bench_ssd, bench_step, bench_ssd_peers): section(copy)
    train_steps()
    if not SMOKE: tune_scan(copy)
    loaded_kernels()
    save()
    if RESULTS["errors"]: print("errors:", *RESULTS["errors"], sep="\n  ")
    if RESULTS["skipped"]: print("skipped:", *RESULTS["skipped"], sep="\n  ")
    print(markdown())


if __name__ == "__main__":
    main()
