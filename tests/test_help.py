"""help() shows what the docs pages show: each public function's and class's parameters (name, type, default and the
docments comment after it in the source, with the input and output layouts), its result, and for a layer its
constructor and its forward (checks._document, run by ssm_course/__init__.py when a public module is imported)."""
import dataclasses, importlib, inspect, pkgutil, pydoc, re
import pytest
import ssm_course
from ssm_course.checks import _definitions, _docments


def _help(obj) -> str:
    "help(obj)'s text, without a class's ' | ' margin, whitespace collapsed (pydoc wraps nothing, but indents)."
    lines = [re.sub(r"^ \|", "", l) for l in pydoc.render_doc(obj, renderer=pydoc.plaintext).splitlines()]
    return " ".join(" ".join(lines).split())


def _comments(f) -> dict:
    "The reference: fastcore's docments (the docs' parameter tables), {name: comment} without self and undescribed names."
    from fastcore.docments import docments
    return {k: " ".join(v.split()) for k, v in docments(f, args_kwargs=True).items() if k != "self" and v}


@pytest.mark.parametrize("module,name,methods", [("layers", "Mamba", ["forward", "step"]), ("layers", "S4D", ["forward"]),
                                                 ("scan", "scan", []), ("ssd", "ssd", []), ("conv", "causal_conv", [])])
def test_help_shows_every_parameter_description(module, name, methods):
    "Was: help(Mamba) a one-line docstring, its __init__ PyTorch's 'Initialize internal Module state'; help(scan) no parameters."
    obj = getattr(importlib.import_module(f"ssm_course.{module}"), name)
    text = _help(obj)
    for f in [obj] + [getattr(obj, m) for m in methods]:
        want = _comments(f)
        assert want, f"{name}: no docments comments to show"
        sig = inspect.signature(f)
        for k, comment in want.items():
            if k == "return": assert f"Returns: " in text and comment in text, (name, k)
            else:
                p = sig.parameters[k]
                head = k + (f": {inspect.formatannotation(p.annotation)}" if p.annotation is not p.empty else "") + (f" = {p.default!r}" if p.default is not p.empty else "")
                assert f"{head} {comment}" in text, (name, f.__name__, head, comment)
    if inspect.isclass(obj):
        init = _help(obj.__init__)
        assert "Initialize internal Module state" not in init and all(c in init for c in _comments(obj).values()), init[:300]


def _public_definitions():
    for m in pkgutil.iter_modules(ssm_course.__path__):
        if m.name.startswith("_"): continue
        mod = importlib.import_module(f"ssm_course.{m.name}")
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                if dataclasses.is_dataclass(obj): yield mod, obj  # its fields; another class: its __init__, below
                yield from ((mod, f) for a, f in vars(obj).items() if inspect.isfunction(f) and (not a.startswith("_") or a == "__init__"))
            elif callable(obj) and inspect.isfunction(inspect.unwrap(obj)) and obj.__module__ == mod.__name__: yield mod, obj


def test_help_reads_the_comments_as_the_docs_do():
    "checks._docments (one parse per module, at import) gives, for every public function, class and method, the comments fastcore's docments gives (the docs' tables)."
    import linecache
    checked = 0
    for mod, obj in _public_definitions():
        lines = linecache.getlines(mod.__file__)
        f = inspect.unwrap(obj)
        node = _definitions(__import__("ast").parse("".join(lines))).get(f.__qualname__)
        if node is None: continue  # a class whose __init__ is inherited
        ours = {k: " ".join(v.split()) for k, v in _docments(node, lines).items() if v}
        assert ours == _comments(obj), (mod.__name__, f.__qualname__)
        checked += 1
    assert checked > 100, checked


def test_a_module_is_documented_once():
    "Importing again (importlib.reload) documents the new objects once; _document on a documented module adds nothing."
    from ssm_course import checks, scan
    doc = scan.scan.__doc__
    checks._document(scan)
    assert scan.scan.__doc__ == doc and doc.count("Parameters:") == 1
    importlib.reload(scan)
    assert scan.scan.__doc__.count("Parameters:") == 1


def test_examples_run_as_doctests():
    "Every `Example:` section that `checks._document` adds (checks._EXAMPLES) is a doctest that passes in its module's names: the call "
    "works and prints what the docstring says; each example's object is public and shows it in help()."
    import doctest, importlib, pydoc
    from ssm_course.checks import _EXAMPLES
    assert len(_EXAMPLES) >= 10
    for key in _EXAMPLES:
        mod, name = key.rsplit(".", 1)
        module = importlib.import_module(mod)
        obj = getattr(module, name)
        assert name in module.__all__ and "Example:\n    >>> " in obj.__doc__ and ">>> " in pydoc.render_doc(obj, renderer=pydoc.plaintext), key
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        for t in doctest.DocTestFinder(recurse=False).find(obj, name, globs=dict(vars(module))): runner.run(t)
        failed, attempted = runner.summarize(verbose=False)
        assert attempted >= 1 and failed == 0, f"{key}: {failed} of {attempted} example lines failed"


def test_every_public_op_and_layer_method_states_its_result():
    "Every public function of the library's modules, and every layer's forward and step, has a result comment that docments reads "
    "(help()'s Returns and the docs' table); a comment on a bare '):' line is not read (scan, ssd, selective_scan and the layers' "
    "methods had theirs there)."
    import ast, importlib, inspect, linecache
    from ssm_course.checks import _definitions, _docments
    missing = []
    for m in "ssm discretize hippo conv scan selective ssd layers inits tasks".split():
        mod = importlib.import_module(f"ssm_course.{m}")
        lines = linecache.getlines(mod.__file__); defs = _definitions(ast.parse("".join(lines)))
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj): targets = [(f"{name}.{a}", f) for a, f in vars(obj).items() if inspect.isfunction(f) and a in ("forward", "step")]
            elif callable(obj) and inspect.isfunction(inspect.unwrap(obj)): targets = [(name, inspect.unwrap(obj))]
            else: targets = []
            for q, f in targets:
                node = defs.get(f.__qualname__) if f.__module__ == mod.__name__ else None
                if node is not None and not _docments(node, lines).get("return"): missing.append(f"{m}.{q}")
    assert not missing, f"no result documented: {missing}"
