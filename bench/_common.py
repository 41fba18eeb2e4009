"""Shared helpers for the CPU benchmarks: interleaved timing and the machine description."""
import platform, statistics, time
import numpy as np, torch


def interleaved(fns, reps=7):
    "Median seconds per function, calling them in turn so that machine drift hits all of them equally."
    for f in fns.values(): f()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter(); f(); times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def machine():
    import scipy
    return {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__, "scipy": scipy.__version__, "date": time.strftime("%Y-%m-%d")}
