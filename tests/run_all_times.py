"""Measure each notebook's Run All as a student runs it and write the line under its title (issue 31 item 2).

    .venv/bin/python tests/run_all_times.py [nbs/07_scan.ipynb ...] [--write-only]

Each notebook runs in a fresh python3 kernel with PyTorch's default threads (tests/test_notebooks_in_kernel.run_in_kernel:
every cell in order, the slow cells showing their committed outputs through the setup cell). The wall and the kernel's CPU
seconds go to nbs/results/run_all.json; the markdown cell after the setup cell then says them, and for notebooks with slow
cells how many there are and how long rerunning them took when their outputs were committed: the elapsed times of the
seconds tests/run_notebook.py --slow recorded for each (nbs/results/slow_cells.json), else the elapsed time of the
progress bars in its committed outputs (tqdm's and fastprogress's `[mm:ss<00:00`). `--write-only` rewrites the lines from the JSON without running anything."""
import argparse, json, re, sys, uuid
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from ssm_course._engine.jupyter import cell_key, is_setup_cell, is_slow
NBS = ROOT / "nbs"
OUT = NBS / "results" / "run_all.json"
SLOW = NBS / "results" / "slow_cells.json"
ELAPSED = re.compile(r"(?:\[|\s)(?:(\d+):)?(\d\d):(\d\d)(?:<|&lt;)00:00")


def _src(c): return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]


def _text(o):
    parts = [o.get("text", "")] + [v for k, v in o.get("data", {}).items() if k in ("text/plain", "text/html")]
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def slow_seconds(cell, recorded=None) -> float | None:
    "How long a slow cell took when its output was committed: as recorded by run_notebook.py, else the longest finished progress bar in its outputs (None: not known)."
    if recorded:
        if (k := cell_key(_src(cell))) in recorded: return float(recorded[k])
    found = [int(h or 0) * 3600 + int(m) * 60 + int(s) for o in cell.get("outputs", []) for h, m, s in ELAPSED.findall(_text(o))]
    return float(max(found)) if found else None


def _fmt(s):
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def line(rel, times, cells) -> str:
    t = times[rel]
    s = (f"**Run All** takes about {_fmt(t['wall'])} on a 2-core CPU in a Jupyter kernel with PyTorch's default threads "
         f"(the kernel's CPU time: {_fmt(t['cpu'])}; measured {t['date']} by `tests/run_all_times.py`).")
    slow = [c for c in cells if c["cell_type"] == "code" and is_slow(_src(c))]
    if slow:
        recorded = json.loads(SLOW.read_text()).get(rel, {}) if SLOW.exists() else {}
        timed = [x for x in (slow_seconds(c, recorded) for c in slow) if x is not None]
        many = len(slow) > 1
        s += (f" Its {len(slow)} slow cell{'s' if many else ''} show{'' if many else 's'} the committed results instead of rerunning; "
              f"set `SSM_COURSE_RUN_SLOW=1` to rerun {'them' if many else 'it'}")
        if timed: s += f", which took at least {_fmt(sum(timed))} when last run ({len(timed)} of {len(slow)} timed)."
        else: s += " (minutes or more each: they train models or compile kernel sweeps; not timed yet)."
        if any("cached(" in _src(c) or "run_cached" in _src(c) for c in slow):
            s += " Their training runs are stored in `nbs/results/` and read back when rerun; `SSM_COURSE_RERUN=1` trains them again."
    return s


def write(rel, times):
    p = NBS / rel
    nb = json.loads(p.read_text(encoding="utf-8"))
    cells = nb["cells"]
    assert is_setup_cell(_src(cells[1])), f"{rel}: no setup cell at position 1"
    text = line(rel, times, cells)
    if len(cells) > 2 and cells[2]["cell_type"] == "markdown" and _src(cells[2]).startswith("**Run All**"):
        cells[2]["source"] = text
    else:
        cells.insert(2, {"cell_type": "markdown", "id": uuid.uuid4().hex[:8], "metadata": {}, "source": text})
    p.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--write-only", action="store_true")
    a = ap.parse_args()
    paths = [p.resolve() for p in a.notebooks] or sorted(NBS.glob("[0-9]*.ipynb")) + sorted((NBS / "engine").glob("*.ipynb"))
    times = json.loads(OUT.read_text()) if OUT.exists() else {}
    if not a.write_only:
        sys.path.insert(0, str(ROOT / "tests"))
        from test_notebooks_in_kernel import run_in_kernel
        for p in paths:
            rel = p.relative_to(NBS).as_posix()
            r = run_in_kernel(rel)
            if r["errors"] or r["stderr"]: print(f"{rel}: errors {r['errors']} stderr {r['stderr'][:1]}", flush=True)
            times[rel] = {"wall": round(r["seconds"], 1), "cpu": float(r["threads"][3]), "cells": r["cells"], "date": str(date.today())}
            print(f"{rel}: {times[rel]}", flush=True)
            OUT.parent.mkdir(exist_ok=True)
            OUT.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    for p in paths:
        rel = p.relative_to(NBS).as_posix()
        if rel in times: write(rel, times)


if __name__ == "__main__":
    main()
