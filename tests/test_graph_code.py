"""The package's graph code has no comprehension: graph mode parses each one (also in a branch not taken) into an
iterator loop of helper graphs, each compiled, a large part of the composite losses' compile time
(docs/mindspore-notes.md). Comprehensions stay where MindSpore does not parse: ``constexpr`` functions (run in
Python at compile time), Cells' ``__init__`` / ``__call__`` and the host-side functions named below."""
import ast
import os

import pytest

pytestmark = pytest.mark.isa_independent

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ms_kldiv")
# Modules with code that construct / bprop methods reach.
GRAPH_MODULES = ["_math.py", "_distill_math.py", "_sparse_math.py", "functional.py", "distillation.py",
                 "sparse_distillation.py", "fused_linear.py", "backends/common.py", "backends/composite.py",
                 "backends/distill.py", "backends/sparse.py", "backends/vocab_parallel.py", "backends/aot.py"]
HOST_ONLY = {"__init__", "__call__",
             "HostCall._layout", "_has_exports", "_has_symbols",  # aot.py: the PyNative host call, library lookup
             "_signature"}  # fused_linear.py: what _CompiledLoop.__call__ keys its graphs by
COMPREHENSIONS = (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)


def _decorators(fn):
    names = set()
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


def comprehensions_in_graph_code(path):
    """'file:line in function' for each comprehension outside constexpr and host-only functions."""
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                if isinstance(child, ast.FunctionDef) and ("constexpr" in _decorators(child)
                                                           or child.name in HOST_ONLY
                                                           or ".".join(scope + [child.name]) in HOST_ONLY):
                    continue
                visit(child, scope + [child.name])
            else:
                if isinstance(child, COMPREHENSIONS) and scope:
                    found.append(f"{os.path.relpath(path, ROOT)}:{child.lineno} in {'.'.join(scope)}")
                visit(child, scope)

    with open(path, encoding="utf-8") as f:
        visit(ast.parse(f.read()), [])
    return found


def test_no_comprehension_in_graph_code():
    found = [hit for name in GRAPH_MODULES for hit in comprehensions_in_graph_code(os.path.join(ROOT, name))]
    assert not found, "comprehensions in graph code (index or spell the elements out):\n" + "\n".join(found)


def test_the_check_finds_one(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from mindspore.ops import constexpr\n\n\n@constexpr\ndef ok(xs):\n    return [x for x in xs]\n\n\n"
                   "class C:\n    def __init__(self, xs):\n        self.xs = [x for x in xs]\n\n"
                   "    def construct(self, xs):\n        return tuple(x * 2 for x in xs)\n", encoding="utf-8")
    assert [hit.split(" in ")[1] for hit in comprehensions_in_graph_code(str(src))] == ["C.construct"]
