"""Run every notebook with `nbdev-test` (cells flagged slow or gpu skipped), print each notebook's time, and fail
if one takes longer than the budget, so that a slow notebook is seen when it appears rather than when the suite has
become slow. Used by `make test`:

    python tests/notebook_times.py [--max-seconds 60] [nbdev-test arguments...]

The times are nbdev-test's own (`--timing`: wall-clock seconds per notebook, with its workers running side by side)."""
import argparse, os, re, subprocess, sys, time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-seconds", type=float, default=float(os.environ.get("NB_MAX_SECONDS", 60)),
                    help="fail if a notebook takes longer (default: $NB_MAX_SECONDS or 60)")
    a, rest = ap.parse_known_args(argv)
    # --do-print makes each worker say when a notebook starts and ends; unbuffered, so the times are also known when a
    # notebook fails (nbdev-test prints its own --timing table only when every notebook passes).
    cmd = [str(Path(sys.executable).parent / "nbdev-test"), "--timing", "--do-print", *rest]
    out, started, seen = [], {}, {}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as p:
        for line in p.stdout:
            out.append(line)
            if m := re.match(r"Starting (\S+\.ipynb)$", line.strip()): started[Path(m[1]).name] = time.monotonic(); continue
            if m := re.match(r"- Completed (\S+\.ipynb)$", line.strip()):
                name = Path(m[1]).name; seen[name] = round(time.monotonic() - started.get(name, time.monotonic())); continue
            if not re.match(r"\S+\.ipynb: \d+ secs$", line.strip()): print(line, end="", flush=True)
    times = {m[1]: int(m[2]) for l in out if (m := re.match(r"(\S+\.ipynb): (\d+) secs$", l.strip()))} or seen
    if times:
        print(f"seconds per notebook (test mode, budget {a.max_seconds:g} s each):")
        for name, t in sorted(times.items()): print(f"  {name:<28} {t:>4}{'  OVER BUDGET' if t > a.max_seconds else ''}")
        print(f"  {'total (sum)':<28} {sum(times.values()):>4}")
    if p.returncode: return p.returncode
    over = [n for n, t in times.items() if t > a.max_seconds]
    if over:
        print(f"notebooks over the {a.max_seconds:g} s test-mode budget: {', '.join(sorted(over))}; "
              "move the long runs into `#| slow` cells (outputs committed) or reduce their scale")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
