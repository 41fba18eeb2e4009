"""Structured state space models from first principles to fast GPU kernels."""
__version__ = "0.1.0"

import importlib.abc, importlib.machinery, sys


class _Documenting(importlib.abc.MetaPathFinder):
    """Finds this package's public modules (`ssm_course.scan`, not `ssm_course._engine.scan`) and, once one has run, writes
    the docments comments of its public functions and classes into their docstrings, for `help()` (`checks._document`,
    engine/checks). Written by hand, not by nbdev."""
    def find_spec(self, name, path=None, target=None):
        if not name.startswith(__name__ + ".") or name.count(".") != 1 or name.rpartition(".")[2].startswith("_"): return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"): return spec
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            from .checks import _document
            _document(module)
        spec.loader.exec_module = exec_module
        return spec


if not any(isinstance(f, _Documenting) for f in sys.meta_path): sys.meta_path.insert(0, _Documenting())
