"""The two MindSpore-free modules of ms_kldiv this suite uses: ``reference`` (the float64 definitions) and
``_build`` (finds or compiles the kernel libraries).

This suite needs NumPy, and torch with CUDA for the device tests; not MindSpore. Where MindSpore is missing the
package's ``__init__`` refuses to import, so the two modules are then loaded from their files (they import
nothing of the package)."""
import importlib
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name):
    try:
        return importlib.import_module(f"ms_kldiv.{name}")
    except ImportError:
        spec = importlib.util.spec_from_file_location(f"_ms_kldiv_{name.lstrip('_')}",
                                                      os.path.join(ROOT, "ms_kldiv", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


reference = _load("reference")
build = _load("_build")
