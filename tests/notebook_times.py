"""Run every notebook as `nbdev-test` does (cells flagged slow or gpu skipped) and report each notebook's time, so that
a slow notebook is seen when it appears rather than when the suite has become slow. Used by `make test`:

    python tests/notebook_times.py [--max-seconds 60] [--n-workers 2] [--enforce] [notebooks...]

Unlike `nbdev-test`, each notebook runs in a fresh process (forked from a server that has already imported torch),
so no notebook's module state reaches another. Each notebook gets two times: wall-clock seconds, and CPU seconds (the
process time of its process, all its threads, plus any child processes it waited for). A reader's laptop may be slow or busy, and a timing there is a
report, not a test: the budget fails the run only with `--enforce` (or SSM_COURSE_ENFORCE_NB_BUDGET=1, which `.ci/run`
sets), and then on CPU time, which a second busy process does not inflate."""
import argparse, os, resource, sys, time
from pathlib import Path

from nbdev.config import get_config
from nbdev.doclinks import nbglob
from nbdev.test import test_nb


def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def timed_test(fn, **kwargs):
    "`test_nb(fn)` in this worker: (passed, wall seconds, CPU seconds)."
    wall, cpu = time.perf_counter(), _cpu()
    ok, _ = test_nb(fn, **kwargs)
    return ok, time.perf_counter() - wall, _cpu() - cpu


# What every notebook imports anyway: the fork server loads it once, and each notebook's process is forked from there.
PRELOAD = ["numpy", "torch", "matplotlib", "matplotlib.pyplot", "IPython", "execnb.shell", "nbdev.test", "ssm_course"]


def run_isolated(files, n_workers, **kw):
    """`timed_test` on each notebook in a process of its own (`max_tasks_per_child=1`), `n_workers` side by side.

    nbdev-test runs several notebooks in one process, so one notebook's module state (a switched-off accelerator, a
    re-registered torch.library operator, a patched function) reaches the next, depending on which notebooks share a
    worker: failures that come and go. A fresh process per notebook costs little because each is forked from a server
    that has already imported torch & co (the forkserver's preload)."""
    import concurrent.futures, importlib.util, multiprocessing
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([m for m in PRELOAD if importlib.util.find_spec(m.split(".")[0])])
    # Pass the function by this module's name: the workers import it (and __main__ is IPython's once a notebook runs).
    import notebook_times
    with concurrent.futures.ProcessPoolExecutor(max(1, n_workers), mp_context=ctx, max_tasks_per_child=1) as ex:
        futures = [ex.submit(notebook_times.timed_test, f, **kw) for f in files]
        return [f.result() for f in futures]


def notebooks(paths=()):
    "The notebooks nbdev-test would run: `paths`, or every notebook under the project's nbs/ (sorted)."
    if paths: return [Path(p).absolute() for p in paths]
    cfg = get_config()
    return [f.absolute() for f in sorted(nbglob(cfg.nbs_path, as_path=True))
            if not any((d / ".notest").exists() for d in f.parents)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", help="notebooks to run (default: all)")
    ap.add_argument("--max-seconds", type=float, default=float(os.environ.get("NB_MAX_SECONDS", 60)),
                    help="the budget per notebook (default: $NB_MAX_SECONDS or 60)")
    ap.add_argument("--n-workers", type=int, default=2, help="notebooks run side by side (default: 2)")
    ap.add_argument("--enforce", action="store_true", default=os.environ.get("SSM_COURSE_ENFORCE_NB_BUDGET") == "1",
                    help="fail when a notebook's CPU time is over the budget (default: only in CI, "
                         "where SSM_COURSE_ENFORCE_NB_BUDGET=1)")
    a = ap.parse_args(argv)
    cfg = get_config()
    files = notebooks(a.notebooks)
    skip = cfg.tst_flags.split() if isinstance(cfg.tst_flags, str) else list(cfg.tst_flags)
    os.chdir(cfg.nbs_path)
    kw = dict(skip_flags=skip, basepath=cfg.config_path, do_print=True, cell_timeout=cfg.cell_timeout or None)
    results = run_isolated(files, a.n_workers, **kw)
    print(f"seconds per notebook in test mode (budget {a.max_seconds:g} s of CPU time each"
          f"{', enforced' if a.enforce else ', reported only: pass --enforce to fail on it'}):")
    print(f"  {'notebook':<32} {'wall':>6} {'CPU':>6}")
    over = []
    names = [str(f.relative_to(cfg.nbs_path)) if f.is_relative_to(cfg.nbs_path) else f.name for f in files]
    for name, (ok, wall, cpu) in zip(names, results):
        flag = "  FAILED" if not ok else ("  OVER BUDGET" if cpu > a.max_seconds else "")
        if ok and cpu > a.max_seconds: over.append(name)
        print(f"  {name:<32} {wall:>6.0f} {cpu:>6.0f}{flag}")
    print(f"  {'total (sum)':<32} {sum(r[1] for r in results):>6.0f} {sum(r[2] for r in results):>6.0f}")
    failed = [n for n, r in zip(names, results) if not r[0]]
    if failed:
        print(f"notebooks that raised: {', '.join(failed)} (the error is printed above)")
        return 1
    if over:
        print(f"notebooks over the {a.max_seconds:g} s budget of CPU time: {', '.join(over)}; move the long runs into "
              "`#| slow` cells (outputs committed) or reduce their scale" + ("" if a.enforce else " (a report, not a failure)"))
        return 1 if a.enforce else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
