"""The AscendC CPU stand-in itself (tests/ascend/ascendc_sim): its declarations bind to the real API's signatures
(tests/ascend/api_signatures.cpp, file:line of each declaration in custom_ops/ascend/API_CHECK.md), and calls the
real API rejects are rejected by the stand-in too. Compile-only (g++ -fsyntax-only); no Ascend device or CANN.
"""
import os
import subprocess

import pytest

from _ascend_common import model, needs_compiler

pytestmark = needs_compiler

# --------------------------------------------------------------- the stand-in's signatures vs the real API
SIG_SRC = os.path.join(os.path.dirname(model.__file__), "api_signatures.cpp")


def _syntax_only(*defines):
    cmd = [model.compiler(), "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-I", model.SIM_DIR] \
        + [f"-D{d}" for d in defines] + [SIG_SRC]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_stand_in_declares_the_real_signatures():
    """Every stand-in call binds to a pointer typed from the asc-devkit declaration (API_CHECK.md)."""
    res = _syntax_only()
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("case", ["REJECT_DOUBLE_SCALAR", "REJECT_RVALUE_FREE", "REJECT_DOUBLE_DUPLICATE",
                                  "REJECT_MIXED_COMPARE"])
def test_stand_in_rejects_what_the_real_api_rejects(case):
    res = _syntax_only(case)
    assert res.returncode != 0, f"{case} compiled against the stand-in; the real API rejects it"
    assert "error" in res.stderr and "api_signatures.cpp" in res.stderr
