"""Helpers shared by the Ascend test files (test_ascend_kldiv/distill/sparse.py, test_ascend_tiling_kldiv/distill.py).

Importing this module puts tests/ascend on sys.path, so the CPU stand-ins there import as top-level modules:
    ``model``        kldiv_tile_model: the KLDiv tiling through ctypes, the NumPy replay, the kernels on the stand-in;
    ``distill_sim``  the distillation kernels and their tiling on the stand-in;
    ``sparse_sim``   the stored-teacher kernels and their tiling on the stand-in.

Tiling
    ``needs_compiler``: skip mark for tests that build the tiling or the stand-in with g++ (or $CXX).
    ``UBS`` (unified-buffer sizes: a 910B's 192 KiB and a 256 KiB part), ``CORES`` (vector core counts).

Backends (the Python layer with the kernels replaced by pyfunc Custom ops)
    ``backends``: the registry module; ``F32``, ``F16``; ``WIRING_MODES = ('pynative', 'graph', 'jit')``.
    ``run_in_mode(mode, cell, *args)``: 'jit' wraps the Cell in ``ms.jit`` (cached per Cell), 'graph' calls it in
        GRAPH_MODE, 'pynative' calls it as is.
    ``Bound(op)``: a Cell calling ``op``; ``NP_DTYPE``: NumPy dtype -> the stand-ins' dtype name.
    ``fake_vendor(root, ...)``: the files of an installed custom-op package that detection looks at;
    ``clean_env`` (fixture): no ASCEND_CUSTOM_OPP_PATH / ASCEND_OPP_PATH, detection cache cleared around the test.
"""
import json
import os
import sys

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

from ms_kldiv.backends import ascend

from conftest import graph_mode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ascend"))
import distill_sim  # noqa: E402,F401 - for the test files
import sparse_sim  # noqa: E402,F401 - for the test files
import kldiv_tile_model as model  # noqa: E402

backends = sys.modules["ms_kldiv.backends"]  # the registry module (ms_kldiv.backends is also a function)

# ------------------------------------------------------------------------------------------------ tiling
needs_compiler = pytest.mark.skipif(model.compiler() is None,
                                    reason="no C++ compiler (g++ or $CXX) to build the tiling")
# 910B (192 KiB UB, 40 or 48 vector cores), a 256 KiB part, and small core counts.
UBS = (192 * 1024, 256 * 1024)
CORES = (1, 3, 40, 48)

# ---------------------------------------------------------------------------------------------- backends
F32, F16 = ms.float32, ms.float16
WIRING_MODES = ("pynative", "graph", "jit")
NP_DTYPE = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}

_JITTED = {}


def run_in_mode(mode, cell, *args):
    if mode == "jit":
        key = id(cell)
        if key not in _JITTED:
            _JITTED[key] = ms.jit(cell)
        return _JITTED[key](*args)
    if mode == "graph":
        with graph_mode():
            return cell(*args)
    return cell(*args)


class Bound(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, *args):
        return self.op(*args)


def fake_vendor(root, name="ms_kldiv", ops_in_json=("KlDivCustom", "KlDivCustomGrad"), header=True):
    """The files of an installed custom-op package that detection looks at."""
    vendor = os.path.join(root, name)
    cfg = os.path.join(vendor, "op_impl", "ai_core", "tbe", "config", "ascend910b")
    os.makedirs(cfg)
    with open(os.path.join(cfg, "aic-ascend910b-ops-info.json"), "w") as f:
        json.dump({op: {"opFile": {"value": "kl_div_custom"}} for op in ops_in_json}, f)
    inc = os.path.join(vendor, "op_api", "include")
    os.makedirs(inc)
    if header:
        open(os.path.join(inc, "aclnn_kl_div_custom.h"), "w").close()
    return vendor


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    monkeypatch.delenv("ASCEND_OPP_PATH", raising=False)
    ascend._find_custom_opp.cache_clear()
    yield monkeypatch
    ascend._find_custom_opp.cache_clear()
