"""The offline docs build: one page per notebook, math typeset as MathML, no network resources,
an API entry for every exported symbol, working internal links, and a README in sync with nbs/index.ipynb."""
import html.parser, json, re, subprocess, sys, tempfile
from pathlib import Path
import pytest
from conftest import ROOT, find_chromium

sys.path.insert(0, str(ROOT / "docs"))
import build  # docs/build.py


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, str(ROOT / "docs" / "build.py"), "--out", str(out)], cwd=ROOT, check=True, capture_output=True)
    return out


def dump_dom(page: Path) -> str:
    "The DOM of `page` after headless Chromium has loaded it with the network off."
    chromium = find_chromium()
    assert chromium, "headless Chromium is needed (Debian: apt-get install chromium-headless-shell)"
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--disable-background-networking", "--disable-component-update", "--disable-sync",
                              "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
                              f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "<html" in res.stdout, res.stderr[-2000:]
    return res.stdout


class Text(html.parser.HTMLParser):
    "Collects attribute URLs, element ids and the visible prose (outside code, pre and math)."
    skip = {"code", "pre", "math", "script", "style"}
    def __init__(self):
        super().__init__(); self.depth = 0; self.text = []; self.urls = []; self.ids = set(); self.tags = []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs); self.tags.append(tag)
        if tag in self.skip: self.depth += 1
        if "id" in a: self.ids.add(a["id"])
        for k in ("src", "href"):
            if a.get(k): self.urls.append((tag, a[k]))
    def handle_endtag(self, tag):
        if tag in self.skip: self.depth -= 1
    def handle_data(self, data):
        if not self.depth: self.text.append(data)


def parse(s):
    p = Text(); p.feed(s); return p


def test_one_page_per_notebook(site):
    nbs = build.notebooks(ROOT / "nbs")
    assert len(nbs) >= 3 and nbs[0].name == "index.ipynb"
    pages = sorted(p.name for p in site.glob("*.html"))
    assert pages == sorted(build.page_name(nb) for nb in nbs)
    for nb in nbs:  # every page has the navigation with every page in it, in course order
        nav = re.search(r'<ul class="nav">.*?</ul>', (site / build.page_name(nb)).read_text(), re.S)[0]
        assert [u for t, u in parse(nav).urls] == [build.page_name(n) for n in nbs]


@pytest.mark.parametrize("page", ["index.html", "ssm.html"])
def test_math_typeset_offline(site, page):
    dom = dump_dom(site / page)
    p = parse(dom)
    assert p.tags.count("math") >= 3, "no MathML in the rendered page"
    assert "mi" in p.tags and "mrow" in p.tags
    prose = " ".join(p.text)
    leftover = re.findall(r"\$\$?[^$\s][^$]*\$", prose)
    assert not leftover, f"untypeset TeX in {page}: {leftover[:3]}"


def test_no_network_resources(site):
    for page in site.glob("*.html"):
        s = page.read_text()
        p = parse(s)
        remote = [(t, u) for t, u in p.urls if t in ("script", "link", "img", "iframe", "source") and re.match(r"(https?:)?//", u)]
        assert not remote, f"{page.name} loads {remote}"
        assert not re.search(r"url\(\s*['\"]?(https?:)?//", s), page.name
        assert "<script" not in s  # MathML needs no JavaScript
    assert not re.search(r"url\(\s*['\"]?(https?:)?//|@import", (site / "style.css").read_text())


def test_figures_embedded(site):
    s = (site / "ssm.html").read_text()
    assert s.count('src="data:image/png;base64,') >= 2


def test_every_export_documented(site):
    "Every public name (each module's `__all__`) has a show_doc entry on its notebook's page."
    import importlib
    from ssm_course._modidx import d
    checked = 0
    for mod, syms in d["syms"].items():
        for name in importlib.import_module(mod).__all__:
            if not callable(getattr(importlib.import_module(mod), name)): continue  # constants have no show_doc entry
            page, anchor = syms[f"{mod}.{name}"][0].split("#")
            assert (site / page).exists(), (name, page)
            assert anchor in parse((site / page).read_text()).ids, f"no API entry for {mod}.{name} in {page}"
            checked += 1
    assert checked >= 10


def test_internal_links_resolve(site):
    for page in site.glob("*.html"):
        for tag, url in parse(page.read_text()).urls:
            if tag != "a" or re.match(r"[a-z]+:", url): continue
            target, _, anchor = url.partition("#")
            dest = site / target if target else page
            assert dest.exists(), f"{page.name}: broken link {url}"
            if anchor: assert anchor in parse(dest.read_text()).ids, f"{page.name}: missing anchor {url}"


def test_readme_in_sync(tmp_path):
    "README.md is committed and must equal what `make docs` regenerates from nbs/index.ipynb."
    subprocess.run([sys.executable, str(ROOT / "docs" / "build.py"), "--readme", str(tmp_path / "README.md")], cwd=ROOT, check=True, capture_output=True)
    assert (ROOT / "README.md").read_text() == (tmp_path / "README.md").read_text(), "README.md is stale: run `make docs`"
