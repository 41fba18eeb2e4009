"""Fail if `nbdev-clean` would change a notebook or `nbdev-export` would change the package.

Runs both commands on a copy of the project, so the working tree is never modified, and
prints the files that differ. (nbdev's own CI template runs them in place and then checks `git status`;
that would rewrite files a developer has not committed yet, so this does the same on a copy.)"""
import filecmp, shutil, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def differing(a: Path, b: Path, pattern: str):
    "Files matching `pattern` that differ between folders `a` and `b` (or exist in only one)."
    fa = {p.relative_to(a) for p in a.rglob(pattern) if "_proc" not in p.parts and ".ipynb_checkpoints" not in p.parts}
    fb = {p.relative_to(b) for p in b.rglob(pattern) if ".ipynb_checkpoints" not in p.parts}
    return sorted(str(f) for f in fa ^ fb) + sorted(str(f) for f in fa & fb if not filecmp.cmp(a / f, b / f, shallow=False))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copy(ROOT / "pyproject.toml", tmp)
        for d in ("nbs", "ssm_course"):
            shutil.copytree(ROOT / d, tmp / d, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "sidebar.yml"))
        failed = False
        for cmd, folder, pattern, what in [("nbdev-clean", "nbs", "*.ipynb", "not clean"),
                                           ("nbdev-export", "ssm_course", "*.py", "out of sync with the notebooks")]:
            subprocess.run([str(BIN / cmd)], cwd=tmp, check=True, capture_output=True)
            diff = differing(ROOT / folder, tmp / folder, pattern)
            if diff:
                failed = True
                print(f"{cmd} would change {len(diff)} file(s) in {folder}/ ({what}):", *diff, sep="\n  ")
        print("notebooks clean, package in sync" if not failed else "")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
