"""Every kernel unit of the CPU library that this CPU runs passes the kernel tests, not only the one it picks.

The library compiles the kernels once per ISA (custom_ops/cpu/isa_*.cc: AVX-512, AVX2 + FMA, an SSE baseline) and
picks the widest the CPU and OS support, once per process; the rest of the suite runs that unit. MS_KLDIV_ISA narrows
the choice, so here each narrower unit runs tests/test_aot_kernel.py and tests/test_host_call.py in PyNative (values
and both gradients against the float64 reference, every dtype, broadcast patterns, sizes around the vector/block/
thread boundaries, special values in lean and exact blocks, the log's accuracy sweep, the host call against the
primitive), and the distillation kernels' tests/test_distill_kernel.py and tests/test_divergences.py (every
divergence, the mixture kinds' vector loops in each dtype), in a subprocess of its own; the main run covers the
compiled modes, which launch the same unit. A unit this CPU cannot run is reported as skipped, with the reason.
Tests marked ``isa_independent`` (no library, Python only, the pool's diagnostics) are not rerun: the main run has
checked them, and no unit takes part in them.
"""
import os
import sys

import pytest

from ms_kldiv import _build
from conftest import cpu_isa
import _procs

TESTS = os.path.dirname(os.path.abspath(__file__))
ISAS = ("avx512", "avx2", "baseline")  # widest first
# the KL kernels, the distillation kernels with every divergence (their vector loops are per unit), and the stored
# teacher's second pass over a confident student's tail (the AVX-512 unit and the others have their own sweeps)
UNIT_TESTS = ("test_aot_kernel.py", "test_host_call.py", "test_distill_kernel.py", "test_divergences.py",
              "test_sparse_distillation.py::test_confident_student_keeps_the_teacher_tail")

HAVE_CXX = _build._cxx() is not None


def _isa_in_subprocess(isa, cwd):
    code = _procs.LOAD_BUILD + "print(_build.library_isa(_build.ensure_library('CPU')))"
    env = _procs.with_repo_path(dict(os.environ, MS_KLDIV_ISA=isa))
    proc = _procs.run([sys.executable, "-c", code], 600, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_CXX, reason="no C++ compiler on this machine")
@pytest.mark.parametrize("isa", ISAS)
def test_kernel_suite_on_each_isa(isa, tmp_path):
    if os.environ.get("MS_KLDIV_ISA"):
        pytest.skip(f"MS_KLDIV_ISA={os.environ['MS_KLDIV_ISA']} is set for the whole run")
    default = cpu_isa()
    if isa == default:
        pytest.skip(f"{isa} is this CPU's default unit: the rest of the suite runs it")
    if ISAS.index(isa) < ISAS.index(default):
        pytest.skip(f"this CPU does not run the {isa} unit (its widest is {default})")
    work = tmp_path / "cwd"
    work.mkdir()
    assert _isa_in_subprocess(isa, str(work)) == isa  # MS_KLDIV_ISA really selects the unit
    # PyNative only: a unit runs the same code whichever mode launches it (the main run covers the modes), and
    # the compiled modes' graph builds are most of a rerun's time
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "-m", "not isa_independent", "-k", "not jit and not graph and not llm_vocabulary",
           *(os.path.join(TESTS, name) for name in UNIT_TESTS)]
    proc = _procs.run(cmd, 1200, cwd=str(work),
                      env=_procs.with_repo_path(dict(os.environ, MS_KLDIV_ISA=isa)))
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, tail
    assert sorted(os.listdir(work)) == [], os.listdir(work)  # nothing left in the working directory
