"""The course's layout: lessons tell the story, engine notebooks hold the engine.

A lesson (`nbs/NN_*.ipynb`) is math, the naive code, the refined code, a check against an independent reference and the
export of the readable function. What makes the library fast and safe (compiled CPU loops, FFT back ends, autograd
Functions, torch.compile variants, dispatch, Triton launch plumbing, compile specs) lives in `nbs/engine/`, and a lesson
links to its engine notebook once, at the end ("Summary" or "Next"). This test is the check a contributor meets when
engine code creeps back into a lesson:

    .venv/bin/pytest tests/test_course_layout.py          # which cell of which lesson mentions what
    .venv/bin/python tests/test_course_layout.py          # the same, as a report"""
import json, re, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"

# What a lesson reader never meets before the lesson's Summary/Next section: (pattern, what it is).
MARKERS = [
    (r"\bnumba\b|@njit|\bprange\b", "numba (compiled CPU loop)"),
    (r"\bducc0\b|pocketfft", "ducc0 (FFT back end)"),
    (r"\bTHP\b|transparent huge|\bmmap\b|\bmalloc\b|\bmadvise\b|MALLOC_|page fault", "allocator / page-fault tuning"),
    (r"autograd\.Function|setup_context|once_differentiable|generate_vmap_rule", "torch.autograd.Function plumbing"),
    (r"TorchDispatchMode|__torch_dispatch__|dispatch mode", "dispatch modes"),
    (r"resolve_backend|\bbackend\s*=|backend selection|_select_backend", "backend selection"),
    (r"torch\.compiler\b|is_compiling\(|torch\.library|custom_op", "torch.compile plumbing"),
    (r"compile_specs?\b|_specs_\w+", "compile specs"),
]
# Triton lessons are about kernels: a kernel and the few lines that launch it stay; launch plumbing does not.
LAUNCH = (r"\w+_kernel\[\s*[\w(]", "a Triton kernel launch")
TRITON_LESSONS = re.compile(r"^1[01][a-z]?_")
END = re.compile(r"^#{1,3}\s*(Summary|Next|What'?s next|Where next)\b", re.I | re.M)


def lessons():
    return sorted(p for p in NBS.glob("[0-9]*.ipynb"))


def engine_notebooks():
    return sorted((NBS / "engine").glob("*.ipynb"))


def _src(cell):
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def story_cells(path):
    "The cells of a lesson before its Summary/Next heading: (index, cell)."
    cells = json.loads(path.read_text())["cells"]
    for i, c in enumerate(cells):
        if c["cell_type"] == "markdown" and END.search(_src(c)): return
        yield i, c


def violations(path):
    "Every (cell index, marker, matched text) of the engine in a lesson's story."
    markers = MARKERS if TRITON_LESSONS.match(path.name) else MARKERS + [LAUNCH]
    out = []
    for i, c in story_cells(path):
        src = _src(c)
        for pat, what in markers:
            if m := re.search(pat, src): out.append((i, what, m.group(0)))
    return out


@pytest.mark.parametrize("path", lessons(), ids=lambda p: p.name)
def test_lesson_story_has_no_engine(path):
    bad = violations(path)
    assert not bad, f"{path.name}: engine code in the lesson's story (move it to nbs/engine/):\n" + "\n".join(
        f"  cell {i}: {what} ({text!r})" for i, what, text in bad)


@pytest.mark.parametrize("path", lessons(), ids=lambda p: p.name)
def test_lesson_links_its_engine_once_at_the_end(path):
    "A lesson that has an engine notebook links to it in its Summary/Next section, and nowhere before."
    cells = json.loads(path.read_text())["cells"]
    story = {i for i, _ in story_cells(path)}
    links = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and re.search(r"engine/[\w.-]+\.(ipynb|html)", _src(c))]
    assert not [i for i in links if i in story], f"{path.name}: links to the engine before its Summary/Next section: cells {links}"


def test_every_engine_notebook_names_its_lesson_and_is_linked():
    "Each engine notebook opens by saying which lesson's algorithm it makes fast, and some lesson links to it."
    engines = engine_notebooks()
    assert engines, "no engine notebooks in nbs/engine/"
    linked = "\n".join(_src(c) for p in lessons() for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "markdown")
    for p in engines:
        cells = json.loads(p.read_text())["cells"]
        opening = "\n".join(_src(c) for c in [c for c in cells if c["cell_type"] == "markdown"][:4])  # title, Run All line, the opening
        assert re.search(r"\.\./\d\d[a-z]?_\w+\.(ipynb|html)", opening), f"{p.name}: its opening does not link the lesson it serves"
        assert f"engine/{p.stem}." in linked, f"{p.name}: no lesson links to it"


def test_engine_links_to_lessons_go_up_a_folder():
    "An engine notebook lives in nbs/engine/: a link to a lesson is `../NN_name.ipynb` (a bare `NN_name.ipynb` breaks on the site)."
    bad = [(p.name, m) for p in engine_notebooks() for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "markdown"
           for m in re.findall(r"\]\((\d\d[a-z]?_[\w-]+\.ipynb)", _src(c))]
    assert not bad, f"links from engine notebooks to lessons without ../: {bad}"


if __name__ == "__main__":
    total = 0
    for p in lessons():
        bad = violations(p)
        total += len(bad)
        for i, what, text in bad: print(f"{p.name} cell {i}: {what} ({text!r})")
    print(f"{total} engine mentions in lesson stories")
    sys.exit(1 if total else 0)
