"""CPU benchmarks for the convolution view (issue: notebooks 04-06).

    python bench/conv_cpu.py [--json out.json]

1. ssm_kernel_diag vs the naive einsum over exp(log(dA)[..., None] * arange(L)),
   (H=256, N=32, L=16384, complex64): median time of interleaved runs, and peak
   extra memory of one call measured in a fresh process (ru_maxrss).
2. causal_conv vs scipy.signal.fftconvolve and oaconvolve on (4, 256, 16384) float32,
   interleaved, same data.
Ratios > 1 mean ssm_course is faster.
"""
import argparse, json, math, os, subprocess, sys
import numpy as np, torch
sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved, machine


def naive_kernel(dA, dB, C, L):
    "The Vandermonde kernel as usually written: materializes (H, N, L)."
    return torch.einsum("hn,hnl->hl", C * dB, torch.exp(torch.log(dA)[..., None] * torch.arange(L, dtype=torch.float32)))


def kernel_inputs(H=256, N=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    from ssm_course.inits import s4d_init, log_uniform_dt
    from ssm_course.discretize import discretize_diag
    Lam, B = s4d_init("lin", 2 * N)
    dt = log_uniform_dt((H, 1), generator=g)
    dA, dB = discretize_diag(Lam.expand(H, N), B, dt[:, 0])
    C = torch.randn(H, N, dtype=torch.complex64, generator=g)
    return dA, dB, C


def peak_mb(which, L):
    "Peak extra resident memory (MB) of one kernel call, in a fresh process."
    code = f"""
import resource, torch, sys
sys.path.insert(0, 'bench')
from conv_cpu import kernel_inputs, naive_kernel
from ssm_course.conv import ssm_kernel_diag
dA, dB, C = kernel_inputs()
f = naive_kernel if {which!r} == 'naive' else (lambda a, b, c, L: ssm_kernel_diag(a, b, c, L))
f(dA[:2], dB[:2], C[:2], 64)  # warm up the libraries
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
K = f(dA, dB, C, {L})
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""
    return float(subprocess.check_output([sys.executable, "-c", code], text=True).strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from ssm_course.conv import ssm_kernel_diag, causal_conv
    import scipy, scipy.signal

    res = machine()
    H, N, L = 256, 32, 16384
    # Memory first: a child process inherits the parent's peak RSS (ru_maxrss), so measure before this process grows.
    mem = {k: peak_mb(k, L) for k in ("naive", "ours")}
    dA, dB, C = kernel_inputs(H, N)
    ref = naive_kernel(dA, dB, C, L)
    err = ((ssm_kernel_diag(dA, dB, C, L) - ref).abs().max() / ref.abs().max()).item()
    t = interleaved({"naive": lambda: naive_kernel(dA, dB, C, L), "ssm_kernel_diag": lambda: ssm_kernel_diag(dA, dB, C, L)})
    res["ssm_kernel_diag"] = {"shape": [H, N, L], "dtype": "complex64", "seconds": t, "speedup": t["naive"] / t["ssm_kernel_diag"],
                              "peak_extra_MB": mem, "output_MB": H * L * 8 / 2**20, "max_rel_diff": err}

    B_, H_, L_ = 4, 256, 16384
    g = torch.Generator().manual_seed(1)
    u, K = torch.randn(B_, H_, L_, generator=g), torch.randn(H_, L_, generator=g) / math.sqrt(L_)
    un, Kn = u.numpy(), K.numpy()[None]
    y = causal_conv(u, K)
    y_sp = scipy.signal.fftconvolve(un, Kn, axes=-1)[..., :L_]
    err = float(np.abs(y.numpy() - y_sp).max() / np.abs(y_sp).max())
    t = interleaved({"causal_conv": lambda: causal_conv(u, K),
                     "scipy.fftconvolve": lambda: scipy.signal.fftconvolve(un, Kn, axes=-1)[..., :L_],
                     "scipy.oaconvolve": lambda: scipy.signal.oaconvolve(un, Kn, axes=-1)[..., :L_]}, reps=5)
    res["causal_conv"] = {"shape": [B_, H_, L_], "dtype": "float32", "seconds": t,
                          "speedup_vs_fftconvolve": t["scipy.fftconvolve"] / t["causal_conv"],
                          "speedup_vs_oaconvolve": t["scipy.oaconvolve"] / t["causal_conv"], "max_rel_diff": err}

    k, c = res["ssm_kernel_diag"], res["causal_conv"]
    print(f"ssm_kernel_diag (H,N,L)={tuple(k['shape'])} complex64: {k['seconds']['ssm_kernel_diag']*1e3:.1f} ms vs naive einsum {k['seconds']['naive']*1e3:.1f} ms"
          f" -> {k['speedup']:.1f}x faster; peak extra memory {k['peak_extra_MB']['ours']:.0f} MB vs {k['peak_extra_MB']['naive']:.0f} MB (output {k['output_MB']:.0f} MB); max rel diff {k['max_rel_diff']:.1e}")
    print(f"causal_conv (B,H,L)={tuple(c['shape'])} float32: {c['seconds']['causal_conv']*1e3:.1f} ms vs fftconvolve {c['seconds']['scipy.fftconvolve']*1e3:.1f} ms"
          f" ({c['speedup_vs_fftconvolve']:.2f}x) and oaconvolve {c['seconds']['scipy.oaconvolve']*1e3:.1f} ms ({c['speedup_vs_oaconvolve']:.2f}x); max rel diff {c['max_rel_diff']:.1e}")
    if args.json:
        with open(args.json, "w") as f: json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
