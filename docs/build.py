"""Render the course as a static HTML site, offline, without Quarto.

nbdev's `proc_nbs` processes the notebooks exactly as it does for `nbdev-docs` (show_doc,
`#| hide`, `#| echo: false`, `#| include: false`, ...); this script turns each processed notebook
into Markdown, honouring the Quarto cell options that remain (`fig-cap`, `fig-alt`, `code-fold`,
`code-summary`, `output`), and pandoc turns that into HTML with MathML math, typeset by the browser
with the bundled STIX Two Math font. Pages need no network and no JavaScript; `site.js` only adds
copy buttons and live search results (MiniSearch over an index prebuilt here).

    python docs/build.py --out _docs            # the site
    python docs/build.py --readme README.md     # README.md from nbs/index.ipynb
"""
import argparse, ast, base64, html, importlib, inspect, json, os, posixpath, re, shutil, string, struct, subprocess, sys, tempfile, unicodedata
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

import yaml
import pypandoc
from nbdev.config import get_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Copied into the site as they are (docs/THIRD_PARTY.md says where the font and MiniSearch come from).
ASSETS = ["site.js", "fonts/STIXTwoMath-Regular.woff2", "fonts/OFL.txt", "vendor/minisearch.js", "vendor/minisearch-LICENSE.txt"]
CODE_BG = "#f6f8fa"  # the code-cell background in style.css; token colours are darkened to 4.5:1 on it
CODE_BG_DARK = "#161b22"  # the same in dark mode (style.css's prefers-color-scheme: dark); colours lightened to 4.5:1 on it
MIN_CONTRAST = 4.5   # WCAG 2 AA for normal text
# A link to a notebook: a lesson or the landing page (`07_scan.ipynb`), or an engine notebook (`engine/scan.ipynb`, or
# `scan.ipynb` / `../07_scan.ipynb` from inside nbs/engine/).
_re_nb_link = re.compile(r"\]\((?:\./)?((?:\.\./)?(?:engine/)?[\w-]+)\.ipynb(#[\w-]*)?\)")
ENGINE = "engine"  # the folder of the engine notebooks (nbs/engine/): their pages are engine/<name>.html
_re_img_token = re.compile(r"ssm-img:(\d+)")


def page_name(nb: Path) -> str:
    """The HTML page of notebook `nb`, named as nbdev/Quarto name it: `01_ssm.ipynb` -> `ssm.html`; an engine notebook
    keeps its folder, `engine/scan.ipynb` -> `engine/scan.html`."""
    name = re.sub(r"^\d+[a-z]?_", "", nb.stem) + ".html"
    return f"{ENGINE}/{name}" if nb.parent.name == ENGINE else name


def lesson_served(nb: Path) -> str:
    "The number of the lesson an engine notebook serves: the first `../NN_name` link of its opening cells ('99' if none)."
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"][:5]
    m = re.search(r"\]\(\.\./(\d\d[a-z]?)_", "\n".join(_text(c["source"]) for c in cells if c["cell_type"] == "markdown"))
    return m[1] if m else "99"


def notebooks(nbs_path: Path):
    """The course's notebooks in course order: the landing page first, then the lessons by number, then the engine
    notebooks in the order of the lessons they serve."""
    nbs = sorted(p for p in nbs_path.glob("*.ipynb") if not p.name.startswith(("_", ".")))
    engine = sorted((p for p in (nbs_path / ENGINE).glob("*.ipynb") if not p.name.startswith(("_", "."))), key=lambda p: (lesson_served(p), p.name))
    return sorted(nbs, key=lambda p: (p.name != "index.ipynb", p.name)) + engine


def lessons(nbs_path: Path):
    "The landing page and the lessons, in course order (what the landing page's course table lists)."
    return [p for p in notebooks(nbs_path) if p.parent.name != ENGINE]


def is_engine(page_or_name) -> bool:
    "Whether a page (its name, e.g. `engine/scan.html`) is an engine notebook's."
    return str(page_or_name).startswith(ENGINE + "/")


def rebase(html_: str, prefix: str) -> str:
    """`html_` written as if at the site's root, for a page one folder down: every relative `href`/`src`/`action` gets `prefix`
    (`../`); in-page anchors, absolute URLs and data URIs are left alone."""
    if not prefix: return html_
    return re.sub(r'\b(href|src|action)="(?![a-z][\w+.-]*:|/|#)([^"]*)"', lambda m: f'{m[1]}="{prefix}{m[2]}"', html_)


# ---------------------------------------------------------------- notebook -> Markdown
def cell_options(src: str):
    "Split the leading `#| key: value` Quarto options off a code cell; the values are YAML, as Quarto reads them."
    lines = src.splitlines()
    n = next((i for i, l in enumerate(lines) if not l.lstrip().startswith("#|")), len(lines))
    opt_lines = [re.sub(r"^\s*#\|\s?", "", l) for l in lines[:n]]
    opt_lines = [l for l in opt_lines if re.match(r"[\w-]+\s*:", l)]  # not nbdev's own flags (`#| export`, `#| hide`)
    try: opts = yaml.safe_load("\n".join(opt_lines)) or {}
    except yaml.YAMLError: opts = None
    if not isinstance(opts, dict):  # not valid YAML (e.g. an unquoted `: `): one option per line, as nbdev reads them
        opts = {}
        for l in opt_lines:
            k, sep, v = l.partition(":")
            if sep: opts[k.strip()] = v.strip().strip("'\"")
    return opts, "\n".join(lines[n:]).strip("\n")


def quarto_option_errors(nb: dict) -> list[int]:
    """Indices of the code cells whose `#| key: value` options are not one YAML mapping. docs/build.py reads them line
    by line as nbdev does, but Quarto parses them as YAML (js-yaml) and stops, so `nbdev-docs` fails on them.
    The usual cause is an unquoted value containing ": "; quoting it (`#| fig-cap: "a: b"`) fixes it."""
    bad = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code": continue
        lines = _text(cell.get("source", "")).splitlines()
        n = next((k for k, l in enumerate(lines) if not l.lstrip().startswith("#|")), len(lines))
        opts = [re.sub(r"^\s*#\|\s?", "", l) for l in lines[:n] if re.match(r"\s*#\|\s*[\w-]+\s*:", l)]
        if not opts: continue
        try: ok = isinstance(yaml.safe_load("\n".join(opts)), dict)
        except yaml.YAMLError: ok = False
        if not ok: bad.append(i)
    return bad


def _text(v): return "".join(v) if isinstance(v, list) else v


def _fence(text: str, lang: str = "") -> str:
    ticks = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _plain(md: str) -> str:
    "Markdown (a caption) as plain text for an `alt` attribute: no `$`, backticks or emphasis marks."
    return re.sub(r"\s+", " ", re.sub(r"[$`*]", "", md)).strip()


def _nth(v, i):
    "Option value for the i-th figure of a cell: Quarto allows one value or a list, one per figure."
    if isinstance(v, list): return v[i] if i < len(v) else None
    return v


class Images:
    """Figures collected while writing Markdown: pandoc sees a short token, which `restore` turns into the path of
    the image file that `save` writes under `figures/` (pages stay small; images load lazily). Without a `prefix`
    (the README) the image stays inline as a data URI."""
    ext = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg"}
    def __init__(self, prefix=None): self.items, self.prefix = [], prefix
    def src(self, mime, b64):
        if self.prefix is None: return f"data:{mime};base64,{b64}"
        self.items.append((mime, b64))
        return f"ssm-img:{len(self.items) - 1}"
    def path(self, i): return f"figures/{self.prefix}-{i + 1}.{self.ext[self.items[i][0]]}"
    def restore(self, s: str) -> str: return _re_img_token.sub(lambda m: self.path(int(m[1])), s)
    def save(self, out: Path):
        for i, (_, b64) in enumerate(self.items):
            (out / self.path(i)).parent.mkdir(parents=True, exist_ok=True)
            (out / self.path(i)).write_bytes(base64.b64decode(b64))


def figure_html(src, alt, caption=None, width=None, height=None) -> str:
    "A figure with real alt text, its intended display size (retina PNGs are shown at half their pixels) and a caption."
    size = (f' width="{int(width)}"' if width else "") + (f' height="{int(height)}"' if height else "")
    img = f'<img src="{src}" alt="{html.escape(alt, quote=True)}"{size} loading="lazy">'
    cap = f"<figcaption>\n{caption}\n</figcaption>\n" if caption else ""
    return f'<figure class="figure">\n{img}\n{cap}</figure>'


def png_display_size(png: bytes) -> tuple[int, int]:
    """The size to show a PNG at. nbdev-clean drops the output metadata in which IPython records a retina figure's
    display size, so read the PNG itself: matplotlib's retina PNGs are saved at twice the figure's dpi (pHYs chunk,
    200 dpi against 100) and are shown at half their pixels, like IPython shows them; other PNGs at their pixel size."""
    w, h = struct.unpack(">II", png[16:24])
    i = 8
    while i + 8 <= len(png):
        n, kind = struct.unpack(">I4s", png[i:i + 8])
        if kind == b"pHYs":
            ppm, _, unit = struct.unpack(">IIB", png[i + 8:i + 17])
            if unit == 1 and ppm * 0.0254 >= 150: return w // 2, h // 2
            break
        if kind == b"IDAT": break  # pHYs, when present, comes before the image data
        i += 12 + n
    return w, h


def _output_md(o, images: Images, fig: dict, asis=False) -> str:
    "Markdown for one cell output, choosing the richest representation pandoc can use."
    kind = o.get("output_type")
    if kind == "stream": return _fence(_text(o["text"]), "text")
    if kind == "error": return _fence(re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(o.get("traceback", []))), "text")
    d = o.get("data", {})
    for mime in ("image/png", "image/jpeg", "image/svg+xml"):
        if mime not in d: continue
        i = fig["n"]; fig["n"] += 1
        cap, alt = _nth(fig.get("fig-cap"), i), _nth(fig.get("fig-alt"), i)
        b64 = _text(d[mime]).strip() if mime != "image/svg+xml" else base64.b64encode(_text(d[mime]).encode()).decode()
        meta = o.get("metadata", {}).get(mime, {})
        width, height = meta.get("width"), meta.get("height")
        if not width and mime == "image/png": width, height = png_display_size(base64.b64decode(b64))
        return figure_html(images.src(mime, b64), str(alt or _plain(str(cap or "")) or "figure"),
                           str(cap) if cap else None, width, height)
    # HTML before Markdown, as Jupyter ranks them: fastprogress 1.1 sends both, its Markdown being the HTML as a code block
    if "text/html" in d: return '<div class="cell-output-html">\n' + _text(d["text/html"]) + "\n</div>" if _text(d["text/html"]).strip() else ""
    if "text/markdown" in d: return _text(d["text/markdown"])
    if "text/latex" in d: return _text(d["text/latex"])
    if "text/plain" in d: return _text(d["text/plain"]) if asis else _fence(_text(d["text/plain"]), "text")
    return ""


def _merge_streams(outputs):
    "Join consecutive stream outputs of the same name, as Jupyter shows them."
    res = []
    for o in outputs:
        if res and o.get("output_type") == "stream" == res[-1].get("output_type") and o.get("name") == res[-1].get("name"):
            res[-1] = {**res[-1], "text": _text(res[-1]["text"]) + _text(o["text"])}
        else: res.append(o)
    return res


# ---------------------------------------------------------------- show_doc entries
def _split_top(s: str, sep: str):
    "Split `s` at `sep` characters outside brackets and quotes; yields (piece, separator found)."
    depth, quote, start = 0, None, 0
    for i, ch in enumerate(s):
        if quote:
            if ch == quote and s[i - 1] != "\\": quote = None
        elif ch in "'\"": quote = ch
        elif ch in "([{": depth += 1
        elif ch in ")]}": depth -= 1
        elif ch == sep and depth <= 0:  # <= : a line may close the bracket that an earlier one opened
            yield s[start:i], True; start = i + 1
    yield s[start:], False


def _code_and_comment(line: str):
    "A signature line's code and its docments comment (the first `#` outside quotes and brackets)."
    pieces = list(_split_top(line, "#"))
    return pieces[0][0], "#".join(p for p, _ in pieces[1:]) if len(pieces) > 1 else None


def one_param_per_line(sig: str) -> str:
    "Reformat a show_doc signature so that each parameter has its own line (its comment, if any, stays with it)."
    lines = sig.split("\n")
    if len(lines) < 3 or not lines[0].endswith("("): return sig
    head, body, tail = lines[0], lines[1:], []
    while body and not body[-1].startswith("    "): tail.insert(0, body.pop())
    out = []
    for line in body:
        content = line[4:]
        if content.startswith("#"): out.append(line); continue  # a comment's continuation line
        code, comment = _code_and_comment(content)
        params = [p.strip() for p, _ in _split_top(code.rstrip().rstrip(","), ",") if p.strip()]
        for j, p in enumerate(params):
            last = j == len(params) - 1
            out.append(f"    {p}," + (f" #{comment}" if comment is not None and last else ""))
    if out and out[-1].endswith(",") and not body[-1].rstrip().endswith(","): out[-1] = out[-1][:-1]
    return "\n".join([head, *out, *tail])


SIG_WIDTH = 80  # a signature that fits in this many characters is shown on one line, a longer one a parameter per line


def plain_signature(sig: str, width=SIG_WIDTH) -> str:
    """A show_doc signature without its docments comments (they go into the parameter table): on one line when it fits
    in `width` characters, else one parameter per line. nbdev writes a multi-line return comment as bare lines after
    the closing `)`; they are dropped with it."""
    lines = one_param_per_line(sig).split("\n")
    if len(lines) < 3 or not lines[0].endswith("("): return _code_and_comment(lines[0])[0].rstrip()
    close = next(i for i, l in enumerate(lines) if i > 0 and not l.startswith("    "))
    params = [_code_and_comment(l[4:])[0].strip() for l in lines[1:close] if not l[4:].lstrip().startswith("#")]
    params = [p.rstrip(",") for p in params if p.rstrip(",")]
    end = _code_and_comment(lines[close])[0].rstrip()
    one = lines[0] + ", ".join(params) + end
    return one if len(one) <= width or not params else "\n".join([lines[0], *(f"    {p}," for p in params[:-1]), f"    {params[-1]}", end])


def _is_class(source_url: str) -> bool:
    "Does nbdev's source link (`.../blob/<branch>/<path>#L<n>`) point at a `class` statement in this checkout?"
    m = re.search(r"/blob/[^/]+/(.+?)#L(\d+)$", source_url)
    if not m or not (ROOT / m[1]).is_file(): return False
    lines = (ROOT / m[1]).read_text().splitlines()[int(m[2]) - 1:]
    stmt = next((l.strip() for l in lines if l.strip() and not l.strip().startswith("@")), "")
    return stmt.startswith("class ")


def api_object(source_url: str, name: str):
    """The object a show_doc entry documents: its module from nbdev's source link (`.../blob/<branch>/pkg/mod.py#L<n>`),
    its qualified name (`Mamba.forward`) from the entry's heading."""
    m = re.search(r"/blob/[^/]+/(.+?)\.py#L\d+$", source_url)
    try:
        if not m: raise ValueError("the source link names no Python file")
        obj = importlib.import_module(m[1].replace("/", "."))
        for part in name.replace("\\", "").split("."): obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"show_doc entry {name!r} (source {source_url}): cannot import the object for its parameter table: {e}") from e


def _type_str(anno) -> str:
    "An annotation as show_doc writes it in the signature (`int | None`, `torch.Tensor`); '' for none, or None's own type."
    from fastcore.docments import ann_parts
    anno = ann_parts(anno)[0]
    if anno is inspect.Parameter.empty or anno is type(None): return ""
    return inspect.formatannotation(anno).removeprefix("typing.").strip("'")


def _default_str(v) -> str:
    "A default value as show_doc writes it."
    if v is inspect.Parameter.empty: return ""
    return v.__name__ if hasattr(v, "__name__") else repr(v)


def param_rows(obj) -> list[tuple]:
    """(name, type, default, description) of each parameter of `obj` (a class: its `__init__`), then (None, type, '',
    description) for the result when it is annotated or described, from fastcore's `docments`, which show_doc reads too.
    With `args_kwargs=True`, so that the comment after `**kwargs,` is that parameter's and not the return's."""
    from fastcore.docments import docments
    if not hasattr(obj, "__signature__"): obj = getattr(obj, "__wrapped__", obj)
    if isinstance(obj, property): obj = obj.fget
    dm = docments(obj, full=True, args_kwargs=True)
    star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    rows = [(star.get(d.get("kind"), "") + k, _type_str(d["anno"]), _default_str(d["default"]), " ".join((d["docment"] or "").split()))
            for k, d in dm.items() if k not in ("self", "return")]
    ret = dm.get("return")
    if ret and not inspect.isclass(obj) and (_type_str(ret["anno"]) or ret["docment"]):
        rows.append((None, _type_str(ret["anno"]), "", " ".join((ret["docment"] or "").split())))
    return rows


def _width(s: str) -> int:
    "Columns a string takes in a grid table, as pandoc counts them: wide characters 2, combining marks 0."
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _code(s: str) -> str:
    "`s` as an inline code span (fenced with more backticks than it contains)."
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    return f"{ticks} {s} {ticks}" if s.startswith("`") or s.endswith("`") else f"{ticks}{s}{ticks}"


def param_table(rows, linkify=lambda md: md) -> str:
    """The parameters as a pandoc grid table, nbdev's columns (Type and Default only when some row has one), each
    description Markdown with its math typeset like the page's. A grid table, as a pipe table would split a cell at a
    `|` in code (`int | None`) or math (`|x|`). Empty when no parameter and no result is described."""
    if not any(d for *_, d in rows): return ""
    cols = [("Parameter", 0), *[(h, i) for h, i in (("Type", 1), ("Default", 2)) if any(r[i] for r in rows)], ("Description", 3)]
    def cell(r, i):
        if i == 3: return linkify(r[3]) if r[3] else ""
        if i == 0: return "**Returns**" if r[0] is None else _code(r[0])
        return _code(r[i]) if r[i] else ""
    body = [[h for h, _ in cols]] + [[cell(r, i) for _, i in cols] for r in rows]
    widths = [max(_width(row[j]) for row in body) for j in range(len(cols))]
    line = lambda ch: "+" + "+".join(ch * (w + 2) for w in widths) + "+"
    fmt = lambda row: "| " + " | ".join(c + " " * (w - _width(c)) for c, w in zip(row, widths)) + " |"
    head = "+" + "+".join(":" + "=" * (w + 1) for w in widths) + "+"
    return "\n".join([line("-"), fmt(body[0]), head, *(x for row in body[1:] for x in (fmt(row), line("-")))])


_re_showdoc = re.compile(r"\A\s*---\s*\n+\[source\]\((?P<url>[^)]+)\)\{[^}]*\}\s*\n+(?P<h>#{2,6}) (?P<name>[^\n]+)\n+"
                         r"```python\n(?P<sig>.*?)\n```[ \t]*\n?(?P<rest>.*)\Z", re.S)


def api_entry(md: str, resolve=api_object, linkify=lambda md: md) -> str:
    """Tidy one show_doc entry, as nbdev sites show one: the signature without comments (`class` for classes, `=None`
    for unannotated None defaults), the source link under the heading, the docstring (its first line without nbdev's
    `*...*` wrapper, which a `*` in the docstring would end early), then a table of the parameters and the result
    with their docments. `resolve(source_url, name)` gives the documented object."""
    m = _re_showdoc.match(md)
    if not m: return md
    sig = m["sig"]
    if _is_class(m["url"]): sig = re.sub(r"^def ", "class ", sig)
    sig = plain_signature(re.sub(r":\s*NoneType\s*=\s*None\b", "=None", sig))
    sig = re.sub(r"\b__main__\.", "", sig)  # a type defined in the notebook itself: nbdev's processing runs it as __main__
    rest = m["rest"].strip("\n")
    first, nl, after = rest.partition("\n")
    if len(first.strip()) > 2 and first.lstrip().startswith("*") and first.rstrip().endswith("*"):
        rest = f"::: {{.doc-summary}}\n{first.strip()[1:-1]}\n:::\n{nl}{after}"
    table = param_table(param_rows(resolve(m["url"], m["name"])), linkify)
    table = f"\n\n::: {{.params}}\n{table}\n:::" if table else ""
    return (f"{m['h']} {m['name']} {{.api}}\n\n[source]({m['url']}){{.api-source}}\n\n"
            f"```python\n{sig}\n```\n\n{rest}{table}\n")


def _linkify(md: str) -> str:
    "Backticked names that nbdev knows become links to their API entries, as nbdev's processing links the rest of a page."
    from nbdev.doclinks import NbdevLookup
    return NbdevLookup().linkify(md)


def nb_to_markdown(nb: dict, link_fn, images: Images, wrap_outputs=True) -> tuple[dict, str]:
    "Frontmatter and Markdown body of a processed notebook."
    meta, parts = {}, []
    for cell in nb["cells"]:
        src = _text(cell.get("source", ""))
        if cell["cell_type"] == "raw":
            if src.strip().startswith("---"):
                meta.update(yaml.safe_load(src.strip().strip("-")) or {})
            continue
        if cell["cell_type"] == "markdown":
            if src.strip().startswith("<!-- WARNING: THIS FILE WAS AUTOGENERATED"): continue
            parts.append(link_fn(src))
            continue
        opts, code = cell_options(src)
        if str(opts.get("include")).lower() == "false": continue
        out = []
        if code and str(opts.get("echo")).lower() != "false":
            block = _fence(code, "python")
            fold = opts.get("code-fold")
            if fold not in (None, False, "false"):
                summary = html.escape(str(opts.get("code-summary", "Code")))
                block = f"<details class=\"code-fold\"{' open' if fold == 'show' else ''}><summary>{summary}</summary>\n\n{block}\n\n</details>"
            out.append(block)
        if str(opts.get("output")).lower() != "false":
            asis = opts.get("output") == "asis"
            fig = {"n": 0, "fig-cap": opts.get("fig-cap"), "fig-alt": opts.get("fig-alt")}
            outs = []
            for o in _merge_streams(cell.get("outputs", [])):
                md = _output_md(o, images, fig, asis=asis)
                if not md: continue
                # links rewritten inside the table's cells before it is laid out: rewritten after, a row would be shorter
                # than its grid and pandoc would show its closing `|` as text
                if asis and re.match(r"\s*show_doc\(", code): md = api_entry(md, linkify=lambda d: link_fn(_linkify(d)))
                if asis or "text/markdown" in o.get("data", {}) or "text/html" in o.get("data", {}): md = link_fn(md)
                outs.append(md)
            if outs and wrap_outputs and not asis: out.append('<div class="cell-output">\n\n' + "\n\n".join(outs) + "\n\n</div>")
            elif outs: out.extend(outs)
        if out: parts.append("\n\n".join(out))
    return meta, "\n\n".join(parts) + "\n"


def _link_rewriter(doc_url: str, target: str, folder: str = ""):
    """Rewrite links to notebooks and to the published site so that they work in `target` ('site' or 'readme'). `folder`
    is the notebook's folder under nbs/ ("" or "engine"): its relative links are resolved from there. Site links come out
    relative to the site's root (`rebase` moves an engine page's links down a folder)."""
    def nb(m):  # the linked notebook's path under nbs/, without .ipynb
        return posixpath.normpath(posixpath.join(folder, m[1]))
    def fn(md: str) -> str:
        if target == "site":
            md = _re_nb_link.sub(lambda m: f"]({page_name(Path(nb(m)))}{m[2] or ''})", md)
            if doc_url: md = md.replace(doc_url.rstrip("/") + "/", "")
        else:
            md = _re_nb_link.sub(lambda m: f"](nbs/{nb(m)}.ipynb{m[2] or ''})", md)
        return md
    return fn


def process(cfg, n_workers=0, file_glob=""):
    """Run nbdev's notebook processing (the same as `nbdev-docs` does before Quarto); return the cache folder.

    To give show_doc its names, nbdev executes the exported cells, the show_doc cells and every cell that contains an
    import. In this process (`n_workers=0`) two kinds of cell are left out of that: cells with a test flag
    (`#| slow`, `#| gpu`), which nbdev-test leaves out too and whose committed outputs the page shows; and lesson
    cells that mix an import with other code (nbdev warns about them), which would run computations, or fail on names
    from cells nbdev does not run, in a build that only needs names. Their outputs are the committed ones."""
    import nbdev.doclinks, nbdev.processors as P
    from nbdev.serve import proc_nbs
    os.chdir(cfg.config_path)
    nbdev.doclinks._build_modidx()
    flags, do_eval = set(str(cfg.get("tst_flags", "")).split()), P._do_eval
    def _do_eval(cell):
        dirs = set(getattr(cell, "directives_", None) or {})
        if dirs & flags: return False
        if not dirs & {"export", "exports", "exporti", "exec_doc"} and cell.cell_type == "code" and (trees := cell.parsed_()) \
           and P._tl_contains(trees, (ast.Import, ast.ImportFrom)) and P._tl_contains(trees, (ast.Expr, ast.Assign)): return False
        return do_eval(cell)
    P._do_eval = _do_eval
    try: return Path(proc_nbs(str(cfg.nbs_path), n_workers=n_workers, file_glob=file_glob))
    finally: P._do_eval = do_eval


# ---------------------------------------------------------------- code colours
# The WCAG 2 formulas, six lines: not worth a dependency (PyPI's wcag-contrast-ratio computes the same).
def _luminance(hex_colour: str) -> float:
    "WCAG 2 relative luminance of `#rrggbb`."
    c = [int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = (v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    "WCAG 2 contrast ratio of two `#rrggbb` colours."
    a, b = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def _darken(colour: str, bg: str, target: float) -> str:
    "`colour` mixed with black in small steps until its contrast on `bg` reaches `target` (the hue is kept)."
    rgb = [int(colour.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4)]
    for k in range(101):
        c = "#" + "".join(f"{round(v * (1 - k / 100)):02x}" for v in rgb)
        if contrast(c, bg) >= target: return c
    return "#000000"


def _lighten(colour: str, bg: str, target: float) -> str:
    "`colour` mixed with white in small steps until its contrast on the dark `bg` reaches `target` (the hue is kept)."
    rgb = [int(colour.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4)]
    for k in range(101):
        c = "#" + "".join(f"{round(v + (255 - v) * k / 100):02x}" for v in rgb)
        if contrast(c, bg) >= target: return c
    return "#ffffff"


def dark_code_css(css: str, bg=CODE_BG_DARK, target=MIN_CONTRAST + 0.1) -> str:
    "The token colours of pandoc's highlighting CSS `css`, lightened to `target` contrast on `bg`, for dark mode."
    rules = [f"  code span.{k} {{ color: {_lighten(c, bg, target)}; }}"
             for k, c in re.findall(r"^code span\.(\w+) \{[^}]*?color: (#[0-9a-fA-F]{6})", css, re.M)]
    return (f"/* code colours in dark mode: the same theme lightened to {MIN_CONTRAST}:1 on {bg} by docs/build.py */\n"
            "@media (prefers-color-scheme: dark) {\n" + "\n".join(rules) + "\n}\n")


def highlight_theme(path: Path, base="pygments", bg=CODE_BG, target=MIN_CONTRAST + 0.1) -> Path:
    "Pandoc's `base` highlighting theme with every token colour darkened to `target` contrast on `bg`; written to `path`."
    theme = json.loads(subprocess.run([pypandoc.get_pandoc_path(), "--print-highlight-style", base],
                                      capture_output=True, text=True, check=True).stdout)
    for style in theme["text-styles"].values():
        if style.get("text-color"): style["text-color"] = _darken(style["text-color"], bg, target)
    path.write_text(json.dumps(theme, indent=1))
    return path


# ---------------------------------------------------------------- MathML spacing
# Browsers typeset pandoc's MathML without TeX's rules in a few places that a reader notices:
# - function names (`\log`, `\exp`, `\max`: `<mi>log</mi><mo>&#8289;</mo>`) get no space: "O(LlogL)", "2cosθ";
# - `\|` is U+2225 and `|` an `<mo>` in mid-formula, which the operator dictionary spaces like a relation: "‖ M ‖ ≤ 1";
#   in TeX both are ordinary symbols, without space;
# - `\bar` is a stretchy U+203E overline that reaches under a following superscript; MathJax uses a macron;
# - `\overline{a_{t+1}}` (a conjugate) is a U+00AF macron, which Chromium leaves short, over the letter only;
# - `\mathrel{+}=` is a binary + and a relation =, spaced apart ("a + = b");
# - the rows of a display's `aligned` are set compact (small fractions, sums with limits at the side), not as TeX does;
# - a prime is a superscript `<msup><mi>c</mi><mo>′</mo></msup>`, but the font's U+2032 is already a raised prime (its
#   script-size variant needs the `ssty` feature, which Chromium does not apply), so it sits high and detached: "c ′";
# - accents are combining marks (`\tilde` U+0303, `\hat` U+0302, `\dot` U+0307), which Chromium draws left of the
#   letter ("~P") or stretched; the spacing accents (˜ ˆ ˙) of MathML Core's operator dictionary sit centred over it.
MATHML = "http://www.w3.org/1998/Math/MathML"
_PRIMES = "\u2032\u2033\u2034\u2057"  # ′ ″ ‴ ⁗
# combining accent -> the spacing accent MathML Core's operator dictionary knows (U+02DC ˜, U+02C6 ˆ, U+02D9 ˙, ...)
_SPACING_ACCENTS = {"\u0303": "\u02dc", "\u0302": "\u02c6", "\u0307": "\u02d9", "\u0308": "\u00a8", "\u030c": "\u02c7",
                    "\u0306": "\u02d8", "\u0301": "\u00b4", "\u0300": "\u0060"}
THIN = "0.1667em"  # TeX's \, : the space between an ordinary symbol and a function name
_SCRIPTS = {"msub", "msup", "msubsup", "munder", "mover", "munderover"}


def _local(el) -> str: return el.tag.rpartition("}")[2]


def _is_function(el) -> bool:
    "An `<mrow>` holding a function name (two or more letters in an upright `<mi>`) and the invisible function application."
    kids = list(el)
    return (_local(el) == "mrow" and len(kids) == 2 and _local(kids[0]) == "mi" and len((kids[0].text or "").strip()) > 1
            and _local(kids[1]) == "mo" and (kids[1].text or "") == "\u2061")


_BARS = {"|", "\u2016", "\u2225"}  # ordinary symbols in TeX, operators in MathML


def _is_op(el) -> bool:
    "An operator, fence or space: it brings its own spacing (or wants none) next to a function name. Bars do not."
    return el is not None and (_local(el) == "mspace" or _local(el) == "mo" and (el.text or "").strip() not in _BARS)


def _opens(el) -> bool:
    "Does `el` begin with an operator, fence or space?"
    while el is not None and _local(el) in {"mrow", "mstyle"} and len(el): el = el[0]
    return _is_op(el)


def _tidy_math(root) -> None:
    parents = {c: p for p in root.iter() for c in p}
    for fn in [el for el in root.iter() if _is_function(el)]:
        atom = fn  # the function with its limits or scripts (\log_2, \max_n) is the unit that gets the spaces
        if parents.get(atom) is not None and _local(parents[atom]) in _SCRIPTS and parents[atom][0] is atom: atom = parents[atom]
        box = parents.get(atom)
        if box is None: continue
        i = list(box).index(atom)
        before, after = (box[i - 1] if i > 0 else None), (box[i + 1] if i + 1 < len(box) else None)
        space = lambda: ET.Element(f"{{{MATHML}}}mspace", width=THIN)
        if after is not None and not _opens(after) and _local(box) not in _SCRIPTS: box.insert(i + 1, space())
        if before is not None and not _is_op(before) and _local(box) not in _SCRIPTS: box.insert(i, space())
    for mo in root.iter(f"{{{MATHML}}}mo"):
        if (mo.text or "").strip() in _BARS and "lspace" not in mo.attrib and mo.get("stretchy") != "true":
            if mo.text.strip() == "\u2225": mo.text = "\u2016"  # pandoc writes \| as "parallel to"; the norm is the double bar
            mo.set("lspace", "0"); mo.set("rspace", "0")
    for mover in root.iter(f"{{{MATHML}}}mover"):
        if len(mover) == 2 and _local(mover[0]) in {"mi", "mn"} and (mover[1].text or "") == "\u203e" and mover[1].get("accent") == "true":
            mover[1].text = "\u00af"; mover[1].set("stretchy", "false")
        elif len(mover) == 2 and (mover[1].text or "") == "\u00af" and mover[1].get("accent") == "true" and "stretchy" not in mover[1].attrib:
            mover[1].text = "\u203e"  # `\overline{a_{t+1}}`: pandoc's macron does not stretch in Chromium; the overline does
    # a prime as the font draws it, right after its base: <mrow><mi>c</mi><mo>′</mo></mrow>; `x'_k` as x′ with subscript k
    for box in list(root.iter()):
        for i, el in enumerate(list(box)):
            if _local(el) not in ("msup", "msubsup") or len(el) < 2 or _local(el[-1]) not in ("mo", "mi") \
                    or not (el[-1].text or "").strip() or set(el[-1].text.strip()) - set(_PRIMES): continue
            prime = ET.Element(f"{{{MATHML}}}mo", lspace="0", rspace="0"); prime.text = el[-1].text.strip()
            row = ET.Element(f"{{{MATHML}}}mrow"); row.extend([el[0], prime])
            if _local(el) == "msubsup":
                new = ET.Element(f"{{{MATHML}}}msub"); new.extend([row, el[1]])
            else: new = row
            box.remove(el); box.insert(i, new)
    for mover in root.iter(f"{{{MATHML}}}mover"):
        if len(mover) == 2 and _local(mover[1]) == "mo" and (mover[1].text or "") in _SPACING_ACCENTS:
            mover[1].text = _SPACING_ACCENTS[mover[1].text]; mover.set("accent", "true")
            if _local(mover[0]) in ("mi", "mn"): mover[1].set("stretchy", "false")  # one letter: the accent's own width
    # `\mathrel{+}=` (an update, +=) comes out as a binary + and a relation =, spaced apart ("a + = b"): one operator
    for box in list(root.iter()):
        kids = list(box)
        for a, b in zip(kids, kids[1:]):
            if _local(a) == _local(b) == "mo" and (a.text or "").strip() == "+" and (b.text or "").strip() == "=":
                a.text = "+="; box.remove(b)
    # TeX sets the rows of a display's `aligned`/`gathered`/`split` in display style (full-size fractions, sums with
    # limits below); pandoc writes a bare <mtable>, which MathML Core sets compact, as TeX does `cases` and matrices.
    sem = root[0] if len(root) and _local(root[0]) == "semantics" else None
    tex = sem.find(f"{{{MATHML}}}annotation") if sem is not None else None
    if (sem is not None and root.get("display") == "block" and len(sem) and _local(sem[0]) == "mtable" and tex is not None
            and re.match(r"\s*\\begin\{(aligned|gathered|split)\}", tex.text or "")):
        sem[0].set("displaystyle", "true")


def tidy_mathml(html_: str) -> str:
    "Every `<math>` of a page with TeX's spacing around function names and bars, and `\\bar` as a macron (see above)."
    def one(m):
        try: root = ET.fromstring(m[0])
        except ET.ParseError: return m[0]  # not well-formed XML: leave it as pandoc wrote it
        _tidy_math(root)
        return ET.tostring(root, encoding="unicode", short_empty_elements=False)
    return re.sub(r"<math\b.*?</math>", one, html_, flags=re.S)


ET.register_namespace("", MATHML)


# ---------------------------------------------------------------- HTML pages
PAGE = string.Template((HERE / "template.html").read_text())
# Pandoc renders the pieces; Python puts them into template.html.
_FRAGMENT = "$title$\n<!--ssm-split-->\n$description$\n<!--ssm-split-->\n$table-of-contents$\n<!--ssm-split-->\n$body$\n"


def _pandoc_html(md: str, theme: Path, fragment: Path) -> list[str]:
    "Title, description, table of contents and body of a Markdown page, as HTML with MathML."
    args = ["--standalone", f"--template={fragment}", "--mathml", "--toc", "--toc-depth=3", "--section-divs",
            f"--syntax-highlighting={theme}", "--wrap=none"]
    return [s.strip() for s in pypandoc.convert_text(md, "html5", format="markdown", extra_args=args).split("<!--ssm-split-->")]


def _yaml_header(meta):
    "A YAML block carrying the page's title and description, so that pandoc parses them as Markdown (math included)."
    keep = {k: meta[k] for k in ("title", "description") if meta.get(k)}
    return "---\n" + yaml.safe_dump(keep, allow_unicode=True) + "---\n\n" if keep else ""


def nav_html(pages, current):
    "The course's pages as a list, the current one marked for browsers and screen readers."
    items, engine = [], False
    for p in pages:
        if is_engine(p["name"]) and not engine:  # the engine notebooks: their own section, after the lessons
            engine = True
            items.append('<li class="nav-section"><span>Engine: how the library makes it fast</span></li>')
        cur = p["name"] == current
        li, aria = (' class="active"', ' aria-current="page"') if cur else ("", "")
        num = f'<span class="num">{p["num"]}</span> ' if p["num"] else ""
        items.append(f'<li{li}><a href="{p["name"]}"{aria}>{num}{html.escape(p["label"])}</a></li>')
    return '<ul class="nav">\n' + "\n".join(items) + "\n</ul>"


def table_labels(body: str) -> str:
    """Each body cell of a table with a header row gets its column's heading as `data-label`, so that a table can be
    laid out as one card per row on a phone (style.css does it for the landing page's course table)."""
    def one(m):
        t = m[0]
        head = re.search(r"<thead>(.*?)</thead>", t, re.S)
        if not head: return t
        labels = [html.escape(re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", h))).strip(), quote=True)
                  for h in re.findall(r"<th\b[^>]*>(.*?)</th>", head[1], re.S)]
        def row(r):
            k = iter(labels)
            return re.sub(r"<td\b", lambda _: f'<td data-label="{next(k, "")}"', r[0])
        return t[:head.end()] + re.sub(r"<tr\b.*?</tr>", row, t[head.end():], flags=re.S)
    return re.sub(r"<table\b.*?</table>", one, body, flags=re.S)


def param_tables(body: str) -> str:
    "The API entries' parameter tables size their columns to their content: pandoc's widths come from the Markdown's layout."
    def one(m): return re.sub(r'<table style="width:[^"]*">', "<table>", re.sub(r"<colgroup>.*?</colgroup>\s*", "", m[0], flags=re.S))
    return re.sub(r'<div class="params">.*?</div>', one, body, flags=re.S)


def wrap_tables(body: str) -> str:
    "Each table in a box that scrolls sideways when the table is wider than the page (style.css draws the edge shadows)."
    return re.sub(r"<table\b.*?</table>", lambda m: f'<div class="table-wrap">\n{m[0]}\n</div>', body, flags=re.S)


INLINE_CODE_NOWRAP = 30  # characters: inline code up to this long is never broken across lines (style.css: nowrap)


def inline_code(body: str) -> str:
    """Inline code longer than INLINE_CODE_NOWRAP characters is marked `long`: it may break at its spaces and after a
    `.`, `/` or `,` (a <wbr>), where shorter code stays on one line. Code blocks are left alone."""
    def one(m):
        if m[1] is None or len(html.unescape(m[1])) <= INLINE_CODE_NOWRAP: return m[0]
        return '<code class="long">' + re.sub(r"([./,])(?=\S)", r"\1<wbr>", m[1]) + "</code>"
    return re.sub(r"<pre\b.*?</pre>|<code>([^<]*)</code>", one, body, flags=re.S)


def _permalinks(body: str) -> str:
    "A `#` link in each section heading, pointing at the section (pandoc puts the id on the `<section>`)."
    pat = re.compile(r'(<section id="(?P<id>[^"]+)"[^>]*>\s*<h(?P<lvl>[1-6])[^>]*>)(?P<text>.*?)</h(?P=lvl)>', re.S)
    return pat.sub(lambda m: f'{m[1]}{m["text"]} <a class="anchor" href="#{m["id"]}" aria-label="Link to this section">#</a></h{m["lvl"]}>', body)


def _strip_toc_ids(toc: str) -> str:
    "The table of contents appears twice (side panel and phone menu): drop pandoc's `toc-...` ids so ids stay unique."
    return re.sub(r'\s+id="toc-[^"]*"', "", toc)


def render_page(page, pages, i, cfg, theme, fragment) -> str:
    "One finished HTML page."
    md, images = page["md"], page["images"]
    title, description, toc, body = (tidy_mathml(s) for s in _pandoc_html(md, theme, fragment))
    body = images.restore(_permalinks(wrap_tables(table_labels(param_tables(inline_code(body))))))
    nb = page["nb"]
    nb_path = f"{cfg.nbs_path.name}/{nb.relative_to(cfg.nbs_path).as_posix()}"
    colab = f"https://colab.research.google.com/github/{cfg.user}/{cfg.repo}/blob/{cfg.branch}/{nb_path}"
    # the notebook as the repository shows it (pyproject.toml's Repository URL), rendered; the file itself to download
    source = (f'Source notebook: <a href="{cfg.git_url}/blob/{cfg.branch}/{nb_path}">{nb_path}</a>'
              f' (<a href="{nb_path}" download>download</a>; open it in Jupyter: <code>make lab</code>)'
              f' · <a href="{colab}">Open in Colab</a>')
    toc = _strip_toc_ids(toc)
    nxt = page.get("next", i + 1)
    prev_ = f'<a class="prev" rel="prev" href="{pages[i-1]["name"]}">← {html.escape(pages[i-1]["label"])}</a>' if i > 0 else "<span></span>"
    next_ = f'<a class="next" rel="next" href="{pages[nxt]["name"]}">{html.escape(pages[nxt]["label"])} →</a>' if nxt < len(pages) else ""
    plain_title = _plain(page["meta"].get("title", nb.stem))
    head_title = cfg.title if plain_title == cfg.title else f"{plain_title} – {cfg.title}"
    desc = _plain(str(page["meta"].get("description", "")))
    return PAGE.substitute(
        head_title=html.escape(head_title), meta_description=html.escape(desc, quote=True),
        site_title=html.escape(cfg.title), nav=nav_html(pages, page["name"]), title=title,
        description=f'<p class="description">{description}</p>' if description else "", source=source,
        toc=f'<nav class="toc" aria-label="On this page"><p>On this page</p>\n{toc}\n</nav>' if toc else "",
        toc_mobile=f'<details class="toc-mobile"><summary>On this page</summary>\n{toc}\n</details>' if toc else "",
        body=body, prev=prev_, next=next_)


# ---------------------------------------------------------------- search
# Search snippets are plain text: each formula is written out from its MathML as a reader would type it ("c′ = Ac + Bu",
# "x_(k−1)", "10⁻³", "(a)/(b)"), not as its TeX source.
_SPACED = set("=≠≤≥<>≈∼≃≡→←↦⇒∈∉⊂⊆+−×·⋅∘⊙±∓") | {":=", "+=", "≪", "≫"}
_SUP = dict(zip("0123456789+−=()n", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿ"))
_SUB = dict(zip("0123456789+−=()", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎"))
# an accent over one letter as the combining mark that puts it there ("P̃", "Ā"); MathML spells it either way
_ACCENTS = {"¯": "\u0304", "‾": "\u0304", "~": "\u0303", "˜": "\u0303", "^": "\u0302", "ˆ": "\u0302", "˙": "\u0307",
            "¨": "\u0308", "ˇ": "\u030c", "˘": "\u0306", "→": "\u20d7"}
_ACCENTS.update({c: c for c in "\u0304\u0303\u0302\u0307\u0308\u030c\u0306\u20d7"})
_BIG_OPS = set("∑∏∐∫∬∮⋃⋂⋁⋀")


_TOKENS = {"mi", "mn", "mo", "mtext", "ms"}


def _group(t: str, el) -> str:
    "A sub-formula as one unit: in parentheses unless it is one symbol, number or name (a token) or already bracketed."
    t = t.strip()
    return t if _local(el) in _TOKENS | {"msqrt"} or len(t) <= 1 or re.fullmatch(r"\([^()]*\)", t) else f"({t})"


def _script(base: str, s: str, el, table: dict, mark: str) -> str:
    if s in ("′", "″", "‴", "∗", "*", "⊤", "†") and mark == "^": return base + s
    if s and all(c in table for c in s): return base + "".join(table[c] for c in s)
    return f"{base}{mark}{_group(s, el)}" if s else base


def math_text(el) -> str:
    "A MathML element (xml.etree) as plain readable text."
    tag, kids = _local(el), list(el)
    t = lambda k: math_text(k)
    if tag == "annotation" or tag == "annotation-xml" or tag == "mphantom": return ""
    if tag == "semantics": return t(kids[0]) if kids else ""
    if tag in ("mi", "mn", "mtext", "ms", "mo"):
        op = (el.text or "").strip()
        if op == "\u2061": return ""  # function application: the name and its argument stay as written
        if op in _SPACED: return f" {op} "  # pandoc writes a formula's leading sign as <mi>: an operator all the same
        return op + " " if op in (",", ";") else (el.text or "")
    if tag == "mspace": return " " if not re.match(r"\s*-", el.get("width", "")) else ""
    if tag == "mfrac" and len(kids) == 2: return f"{_group(t(kids[0]), kids[0])}/{_group(t(kids[1]), kids[1])}"
    if tag == "msqrt": return "√" + _group("".join(map(t, kids)), kids[0] if len(kids) == 1 else el)
    if tag == "mroot" and len(kids) == 2: return f"{_group(t(kids[1]), kids[1])}√{_group(t(kids[0]), kids[0])}"
    if tag in ("msub", "msup", "msubsup", "munder", "mover", "munderover") and kids:
        base, scripts = t(kids[0]), [re.sub(r"\s+", "", t(k)) for k in kids[1:]]
        if tag == "mover" and len(scripts) == 1 and scripts[0] in _ACCENTS and len(base.strip()) == 1:
            return base.strip() + _ACCENTS[scripts[0]]
        if tag in ("munder", "mover") and len(scripts) == 1 and scripts[0] in ("⏟", "⏞", "_", "‾", "¯"): return base
        has_sub = tag in ("msub", "msubsup", "munder", "munderover")
        sub, sup = (scripts[0] if has_sub else ""), (scripts[-1] if tag in ("msup", "msubsup", "mover", "munderover") else "")
        res = _script(_script(base, sub, kids[1], _SUB, "_"), sup, kids[-1], _SUP, "^")
        return res + " " if base.strip() in _BIG_OPS else res
    if tag == "mtable":
        rows = [" ".join(t(c) for c in tr) for tr in kids]
        return "; ".join(r.strip() for r in rows if r.strip())
    parts = [t(k) for k in kids]
    if tag == "mrow" and parts and parts[0].strip() in ("−", "+", "±", "∓"): parts[0] = parts[0].strip()  # a sign: "−x"
    return "".join(parts)


def formula_text(mathml: str) -> str:
    "A whole `<math>` element as one line of plain text; its TeX when it is not well-formed XML."
    try: return re.sub(r"\s+", " ", math_text(ET.fromstring(mathml))).strip()
    except ET.ParseError:
        tex = re.search(r'<annotation encoding="application/x-tex">(.*?)</annotation>', mathml, re.S)
        return html.unescape(tex[1]) if tex else ""


def greek_names(text: str) -> str:
    "The names of the Greek letters in `text` ('Δ λ' -> 'delta lambda'): search finds a formula's Δ by the word delta."
    names = {unicodedata.name(c, "").split(" LETTER ")[-1].split()[0].lower() for c in text if unicodedata.name(c, "").startswith("GREEK ")}
    return " ".join(sorted({"lamda": "lambda"}.get(n, n) for n in names if n.isalpha() and len(n) > 1))


class _Sections(HTMLParser):
    """Split a rendered page into searchable sections: anchor, heading, prose (formulas as plain text, see `math_text`)
    and an API entry's signature and parameter table (other code and the outputs left out)."""
    void = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
    skipped = {"pre", "script", "style", "figure"}
    def __init__(self):
        super().__init__(); self.docs = [{"a": "", "t": "", "x": []}]; self.open = []  # (tag, skip, section id, api or params)
    def handle_starttag(self, tag, attrs):
        if tag in self.void: return
        a = dict(attrs); cls = set((a.get("class") or "").split())
        skip = tag in self.skipped or bool(cls & {"anchor", "cell-output", "api-source"})
        if tag == "thead" and any(t == "div" and p for t, _, _, p in self.open): skip = True  # "Parameter Type ...": no words
        in_api = next((api for t, _, _, api in reversed(self.open) if t == "section"), False)
        if tag == "pre" and in_api and not self.docs[-1].get("sig"): skip = self.docs[-1]["sig"] = False  # the signature
        self.open.append((tag, skip, a.get("id") if tag == "section" else None,
                          tag == "section" and "api" in cls or tag == "div" and "params" in cls))
        if re.fullmatch(r"h[1-6]", tag):
            self.docs.append({"a": next((i for _, _, i, _ in reversed(self.open) if i), ""), "t": "", "x": []})
        elif tag in ("td", "th", "li", "p", "div", "tr"): self.docs[-1]["x"].append(" ")  # cells and blocks: words apart
    def handle_endtag(self, tag):
        if tag == "pre" and self.docs[-1].get("sig") is False: self.docs[-1]["sig"] = True
        if any(t == tag for t, _, _, _ in self.open):
            while self.open.pop()[0] != tag: pass
    def handle_data(self, data):
        if any(s for _, s, _, _ in self.open): return
        d = self.docs[-1]
        if any(re.fullmatch(r"h[1-6]", t) for t, _, _, _ in self.open): d["t"] += data
        else: d["x"].append(data)


def search_docs(pages, out: Path):
    "The search index: one record per section of every page (heading, page, anchor, prose; `k`: the Greek letters' names)."
    docs = []
    for p in pages:
        article = re.search(r"<article>(.*)</article>", (out / p["name"]).read_text(), re.S)[1]
        article = re.sub(r"<math\b.*?</math>", lambda m: html.escape(formula_text(m[0]), quote=False), article, flags=re.S)
        parser = _Sections(); parser.feed(article)
        for d in parser.docs:
            text = re.sub(r"\s+", " ", "".join(d["x"])).strip()
            title = re.sub(r"\s+", " ", d["t"]).strip() or p["label"]
            if not (text or d["a"]): continue
            docs.append({"id": len(docs), "p": p["name"], "a": d["a"], "pt": p["label"], "t": title, "x": text})
            if k := greek_names(title + " " + text): docs[-1]["k"] = k
    return docs


def write_search(pages, out: Path, cfg, nav_pages):
    "search-index.js (the index inlined, as file:// pages cannot fetch JSON) and search.html (all sections, for readers without JavaScript)."
    docs = search_docs(pages, out)
    (out / "search-index.js").write_text("// Generated by docs/build.py: every section of every page, for site.js's search.\n"
                                         "window.SSM_SEARCH_DOCS = " + json.dumps(docs, ensure_ascii=False, separators=(",", ":")) + ";\n")
    items, cur = [], None
    for d in docs:
        if d["p"] != cur:
            if cur: items.append("</ul></li>")
            cur = d["p"]; items.append(f'<li><a href="{d["p"]}">{html.escape(d["pt"])}</a><ul>')
        if d["a"]: items.append(f'<li><a href="{d["p"]}#{d["a"]}">{html.escape(d["t"])}</a></li>')
    items.append("</ul></li>")
    body = ('<div id="search-results" aria-live="polite"></div>\n'
            '<section id="all-sections"><h2>All sections</h2>\n<p>Every section of every page; use your browser\'s find (Ctrl+F) '
            'to search them without JavaScript.</p>\n<ul class="sitemap">\n' + "\n".join(items) + "\n</ul></section>")
    (out / "search.html").write_text(PAGE.substitute(
        head_title=f"Search – {html.escape(cfg.title)}", meta_description="Search the course", site_title=html.escape(cfg.title),
        nav=nav_html(nav_pages, None), title="Search", description="", source="", toc="", toc_mobile="", body=body,
        prev="<span></span>", next=""))
    return docs


# ---------------------------------------------------------------- the site
def start_page(md: str, pages) -> int | None:
    """The page that the landing page's "Start here" line sends a newcomer to (its first link), by index in `pages`: the
    landing page's "next" link goes there too, so that the text and the navigation agree (01, not 00, the notation)."""
    m = re.search(r"Start here\b[^\n]*?\]\(([\w-]+\.html)(?:#[\w-]*)?\)", md)
    return next((i for i, p in enumerate(pages) if m and p["name"] == m[1]), None)


def build_site(out: Path, n_workers=0):
    cfg = get_config()
    cache = process(cfg, n_workers)
    pages = []
    for nb in notebooks(cfg.nbs_path):
        rel = nb.relative_to(cfg.nbs_path)
        images = Images(prefix=page_name(nb)[:-len(".html")])
        link_fn = _link_rewriter(cfg.doc_url, "site", rel.parent.as_posix().strip("."))
        meta, body = nb_to_markdown(json.loads((cache / rel).read_text()), link_fn, images)
        num = re.match(r"(\d+[a-z]?)_", nb.name)
        label = "Overview" if nb.name == cfg.readme_nb else meta.get("title", nb.stem)
        pages.append(dict(nb=nb, meta=meta, md=_yaml_header(meta) + body, images=images, name=page_name(nb),
                          label=_plain(str(label)), num=num[1] if num else ""))
    home = next((i for i, p in enumerate(pages) if p["nb"].name == cfg.readme_nb), None)
    if home is not None and (start := start_page(pages[home]["md"], pages)) is not None: pages[home]["next"] = start
    quarto_bad = {nb.name: b for nb in notebooks(cfg.nbs_path) if (b := quarto_option_errors(json.loads(nb.read_text())))}
    if quarto_bad:  # our build reads them; Quarto (nbdev-docs) would not
        print("warning: cell options that are not YAML, which Quarto cannot read (quote the value): "
              + "; ".join(f"{k} cells {v}" for k, v in quarto_bad.items()), file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    for a in ASSETS:
        (out / a).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / a, out / a)
    (out / "nbs").mkdir(exist_ok=True)
    for p in pages:  # "Source notebook" links work offline and online
        (out / "nbs" / p["nb"].relative_to(cfg.nbs_path)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p["nb"], out / "nbs" / p["nb"].relative_to(cfg.nbs_path))
    with tempfile.TemporaryDirectory() as tmp:
        theme, fragment = highlight_theme(Path(tmp) / "code.theme"), Path(tmp) / "fragment.html"
        fragment.write_text(_FRAGMENT)
        (css_tpl := Path(tmp) / "css.html").write_text("$highlighting-css$\n")
        css = pypandoc.convert_text("```python\nx = 1\n```", "html5", format="markdown",
                                    extra_args=["--standalone", f"--template={css_tpl}", f"--syntax-highlighting={theme}"])
        (out / "style.css").write_text((HERE / "style.css").read_text() + "\n/* code colours: pandoc's pygments theme, darkened to "
                                       f"{MIN_CONTRAST}:1 on {CODE_BG} by docs/build.py */\n" + css + dark_code_css(css))
        with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:  # pandoc runs as a subprocess: threads suffice
            htmls = list(ex.map(lambda i: render_page(pages[i], pages, i, cfg, theme, fragment), range(len(pages))))
    shutil.rmtree(out / "figures", ignore_errors=True)
    for p, s in zip(pages, htmls):
        (out / p["name"]).parent.mkdir(parents=True, exist_ok=True)
        (out / p["name"]).write_text(s)
        p["images"].save(out)
    _unlink_missing_anchors(out)
    write_search(pages, out, cfg, pages)
    write_markdown(pages, out, cfg)
    for p in pages:  # written as if at the root; an engine page's links move down its folder, last
        if is_engine(p["name"]): (out / p["name"]).write_text(rebase((out / p["name"]).read_text(), "../"))
    return out


def write_markdown(pages, out: Path, cfg):
    """Each page's Markdown beside it as `<page>.html.md` (nbdev's convention, which the `Docs:` line of each module's
    docstring points to): the text the page is rendered from, math as TeX, figures as the page's image files. And
    `llms.txt` (llmstxt.org) listing them, with the site's title and description."""
    for p in pages:
        md = p["images"].restore(p["md"])
        if is_engine(p["name"]): md = re.sub(r"\]\((?![a-z][\w+.-]*:|/|#)", "](../", rebase(md, "../"))  # one folder down
        (out / (p["name"] + ".md")).write_text(md)
    home = next(p for p in pages if p["nb"].name == cfg.readme_nb)
    url = cfg.doc_url.rstrip("/") + "/" if cfg.doc_url else ""  # absolute: llms.txt is read on its own
    def item(p):
        desc = _plain(str(p["meta"].get("description", "")))
        return f"- [{p['num'] + ' · ' if p['num'] else ''}{p['label']}]({url}{p['name']}.md)" + (f": {desc}" if desc else "")
    desc = _plain(str(home["meta"].get("description", "")))
    (out / "llms.txt").write_text(f"# {cfg.title}\n\n" + (f"> {desc}\n\n" if desc else "") +
                                  "Each page of the course as Markdown (math as TeX), in course order.\n\n## Course\n\n"
                                  + "\n".join(item(p) for p in pages) + "\n")


def _unlink_missing_anchors(out: Path):
    "nbdev links every backticked name it knows, private helpers included; drop links whose anchor no page defines."
    files = [*out.glob("*.html"), *out.glob(f"{ENGINE}/*.html")]
    ids = {p.relative_to(out).as_posix(): set(re.findall(r'\sid="([^"]+)"', p.read_text())) for p in files}
    link = re.compile(r'<a\s+href="([\w./-]+\.html)#([^"]+)"[^>]*>(.*?)</a>', re.S)
    for p in files:
        html_ = p.read_text()
        fixed = link.sub(lambda m: m[0] if m[2] in ids.get(m[1], ()) else m[3], html_)
        if fixed != html_: p.write_text(fixed)


def build_readme(dest: Path):
    "Write README.md from the landing notebook, as `nbdev-readme` does with Quarto."
    cfg = get_config()
    cache = process(cfg, file_glob=cfg.readme_nb)
    meta, body = nb_to_markdown(json.loads((cache / cfg.readme_nb).read_text()), _link_rewriter(cfg.doc_url, "readme"),
                                Images(), wrap_outputs=False)
    head = f"# {meta.get('title', cfg.title)}\n\n" + (f"> {meta['description']}\n\n" if meta.get("description") else "")
    md = pypandoc.convert_text(head + body, "gfm", format="markdown", extra_args=["--wrap=preserve"])
    text = "<!-- WARNING: generated from nbs/index.ipynb by `make docs`; edit the notebook, not this file. -->\n\n" + md
    dest.write_text(text)
    return text


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="folder to write the site to")
    ap.add_argument("--readme", type=Path, help="path to write README.md to")
    ap.add_argument("--workers", type=int, default=0,
                    help="processes for nbdev's notebook processing (0: in this process, the fastest for this course: one torch import)")
    a = ap.parse_args()
    if not (a.out or a.readme): ap.error("give --out and/or --readme")
    out, readme = (p.resolve() if p else None for p in (a.out, a.readme))
    if out: print(f"site written to {build_site(out, a.workers) / 'index.html'}")
    if readme: build_readme(readme); print(f"README written to {readme}")
