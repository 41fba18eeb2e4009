"""CPU benchmarks for the scans (issue: notebooks 07-09). Ratios > 1 mean ssm_course is faster.

    python bench/scan_cpu.py [--json out.json]

1. scan, time-varying (4, 256, 8192) float32, forward: against accelerated_scan.ref.scan,
   mambapy.pscan and a time-major NumPy loop (transposes included), interleaved.
2. scan, time-invariant (one decay per channel, 256 x 65536) float32: against
   scipy.signal.lfilter run per channel.
3. selective_scan forward (2, 256, 16, 2048) float32: against the same computation
   (exp(delta A), delta B u, scan, C contraction) through mambapy.pscan.
Peers: pip install accelerated-scan mambapy (benchmark-only dependencies).
"""
import argparse, json, os, sys
import numpy as np, torch, scipy.signal
sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved, machine


def numpy_loop(a, b):
    "Time-major NumPy loop over the last axis, transposes included."
    an, bn = np.ascontiguousarray(np.moveaxis(a.numpy(), -1, 0)), np.ascontiguousarray(np.moveaxis(b.numpy(), -1, 0))
    h, out = np.zeros(bn.shape[1:], bn.dtype), np.empty_like(bn)
    for t in range(bn.shape[0]):
        h = an[t] * h + bn[t]
        out[t] = h
    return np.moveaxis(out, 0, -1)


def mambapy_scan(a, b):
    "mambapy's pscan takes (B, L, D, N); ours is (B, D, L)."
    from mambapy.pscan import pscan
    return pscan(a.transpose(1, 2)[..., None], b.transpose(1, 2)[..., None])[..., 0].transpose(1, 2)


def selective_inputs(b=2, d=256, n=16, l=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    u, delta = torch.randn(b, d, l, generator=g), torch.nn.functional.softplus(torch.randn(b, d, l, generator=g) - 3)
    A = -torch.exp(torch.randn(d, n, generator=g) * 0.5)
    B, C = torch.randn(b, n, l, generator=g), torch.randn(b, n, l, generator=g)
    return u, delta, A, B, C


def selective_mambapy(u, delta, A, B, C):
    "Mamba's selective scan written the mambapy way: (B, L, D, N) tensors through pscan."
    from mambapy.pscan import pscan
    dl = delta.transpose(1, 2)  # (b, l, d)
    dA = torch.exp(dl[..., None] * A)  # (b, l, d, n)
    dBu = dl[..., None] * B.transpose(1, 2)[:, :, None, :] * u.transpose(1, 2)[..., None]
    hs = pscan(dA, dBu)
    return (hs @ C.transpose(1, 2)[..., None])[..., 0].transpose(1, 2)  # (b, d, l)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    args = ap.parse_args()
    import accelerated_scan.ref as asref
    from ssm_course.scan import scan
    res = machine()

    g = torch.Generator().manual_seed(0)
    a, b = 0.9 + 0.1 * torch.rand(4, 256, 8192, generator=g), torch.randn(4, 256, 8192, generator=g)
    ref = scan(a.double(), b.double())
    peers = {"accelerated_scan.ref": lambda: asref.scan(a, b), "mambapy.pscan": lambda: mambapy_scan(a, b), "numpy loop": lambda: numpy_loop(a, b)}
    errs = {k: float((torch.as_tensor(np.asarray(f())).double() - ref).abs().max() / ref.abs().max()) for k, f in {"ssm_course.scan": lambda: scan(a, b), **peers}.items()}
    t = interleaved({"ssm_course.scan": lambda: scan(a, b), **peers}, reps=5)
    best = min(t[k] for k in peers)
    res["scan_time_varying"] = {"shape": [4, 256, 8192], "seconds": t, "max_rel_err_vs_float64": errs, "ratio_vs_best_peer": best / t["ssm_course.scan"]}

    aL, bL = 0.9 + 0.0999 * torch.rand(256, 1, generator=g), torch.randn(256, 65536, generator=g)
    an, bn = aL.numpy()[:, 0].astype(np.float64), bL.numpy()
    lf = lambda: [scipy.signal.lfilter([1.0], [1.0, -an[i]], bn[i]) for i in range(256)]
    err = float(np.abs(scan(aL, bL).numpy() - np.stack(lf())).max() / np.abs(np.stack(lf())).max())
    t = interleaved({"ssm_course.scan": lambda: scan(aL, bL), "scipy.signal.lfilter": lf}, reps=5)
    res["scan_lti"] = {"shape": [256, 65536], "seconds": t, "max_rel_diff": err, "ratio": t["scipy.signal.lfilter"] / t["ssm_course.scan"]}

    try:
        from ssm_course.selective import selective_scan
        u, delta, A, B, C = selective_inputs()
        y_ref = selective_mambapy(u, delta, A, B, C)
        err = float((selective_scan(u, delta, A, B, C) - y_ref).abs().max() / y_ref.abs().max())
        t = interleaved({"ssm_course.selective_scan": lambda: selective_scan(u, delta, A, B, C), "mambapy.pscan": lambda: selective_mambapy(u, delta, A, B, C)}, reps=3)
        res["selective_scan"] = {"shape": [2, 256, 16, 2048], "seconds": t, "max_rel_diff": err, "ratio": t["mambapy.pscan"] / t["ssm_course.selective_scan"]}
    except ImportError as e:
        res["selective_scan"] = {"skipped": str(e)}

    r = res["scan_time_varying"]
    print(f"scan time-varying (4, 256, 8192) float32: ours {r['seconds']['ssm_course.scan']*1e3:.0f} ms; " + ", ".join(f"{k} {v*1e3:.0f} ms" for k, v in r["seconds"].items() if k != "ssm_course.scan")
          + f" -> {r['ratio_vs_best_peer']:.2f}x the best peer")
    r = res["scan_lti"]
    print(f"scan time-invariant (256, 65536) float32: ours {r['seconds']['ssm_course.scan']*1e3:.0f} ms, lfilter per channel {r['seconds']['scipy.signal.lfilter']*1e3:.0f} ms -> {r['ratio']:.2f}x")
    r = res["selective_scan"]
    if "ratio" in r: print(f"selective_scan forward (2, 256, 16, 2048): ours {r['seconds']['ssm_course.selective_scan']*1e3:.0f} ms, mambapy {r['seconds']['mambapy.pscan']*1e3:.0f} ms -> {r['ratio']:.2f}x")
    if args.json:
        with open(args.json, "w") as f: json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
