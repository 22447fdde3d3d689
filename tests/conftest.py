"""Shared fixtures and helpers of the ms_kldiv test suite (other tests/test_*.py files use them too).

Import helpers with ``from conftest import run, make, ...`` (pytest puts tests/ on sys.path); they are defined
in ``_checks.py`` (data, reference, comparisons) and ``_runners.py`` (modes, Cells, running a case). Importing this
file also sets ``GLOG_v=3`` (unless set) to quiet MindSpore's C++ warnings, and moves hypothesis' cache out of
the working directory.

Backends
    ``backend`` (fixture, str): one parameter per backend that ``ms_kldiv.backend_info()`` reports available on
        the current device target ('composite' always; 'aot', 'akg', ... as soon as they register and can run).
        New backends are picked up with no edit here.
    ``BACKENDS`` (tuple of str): the same list, for tests that parametrize by hand.
    ``distill_backend`` (fixture) / ``DISTILL_BACKENDS``: the same for the distillation op
        (``backend_info(op='distillation')``): the backends that implement distillation and can run here.
    ``MS_KLDIV_REQUIRE_BACKENDS=composite,aot,akg`` (env): a listed backend that is unknown or unavailable is a
        usage error before any test runs (pytest exit code 4), with the reason from ``backend_info()``,
        so that no backend silently drops out of CI.

Modes (how a case is executed)
    ``MODES = ('pynative', 'jit', 'graph', 'pynative_cell')`` and the ``mode`` fixture over them:
        'pynative'       ``ms_kldiv.kl_div`` eagerly (PyNative);
        'jit'            ``ms_kldiv.kl_div`` inside a Cell compiled with ``ms.jit`` (context stays PyNative);
        'graph'          ``ms_kldiv.KLDivLoss`` Cells called with the context in GRAPH_MODE;
        'pynative_cell'  ``ms_kldiv.KLDivLoss`` Cells eagerly.
    ``COMPILED_MODES = ('jit', 'graph')``.
    ``graph_mode()``: context manager, GRAPH_MODE inside, the previous mode restored afterwards.
    ``call_in_mode(mode, cell, *args)``: run any Cell in a mode ('jit' wraps it in ``ms.jit``, cached per Cell).

Running the op (one compiled graph serves every reduction of a case)
    ``run(mode, backend, x, t, log_target=False, reductions=REDUCTIONS, grads=True, w_none=None, w_red=None)``
        -> ``{reduction: Outcome(out, dx, dt)}`` of MindSpore Tensors. ``dx, dt`` are the gradients of
        ``sum(kl_div(x, t, reduction) * w)`` with ``w = w_none`` (broadcast shape) for 'none' and
        ``w = w_red`` (0-d) otherwise; both default to ones. Cells are cached, so repeated shapes never recompile.
    ``run_second_order(mode, backend, x, t, log_target, w_none, w_red, v1, v2, reductions=REDUCTIONS)``
        -> ``{reduction: SecondOrder(out, dx, dt, gx, gt)}``: value, the gradients of ``sum(out * w)`` and
        the gradients of ``sum(dx * v1 + dt * v2)`` (v1: input's shape, v2: target's shape), i.e. ``ms.grad``
        of ``ms.grad``, all from one compiled graph.
    ``loss_cell(kind, backend, reduction, log_target)``: cached single-loss Cell, kind 'cell' (KLDivLoss) or
        'functional' (a Cell calling ``ms_kldiv.kl_div``).

Data and checking
    ``DTYPES`` (the four float dtypes), ``DTYPE_IDS``, ``TOL`` (relative tolerance per dtype).
    ``make(a, dtype)`` -> ``(Tensor, float64 ndarray of the values the Tensor really holds)``: compare against
        the reference evaluated on the rounded values, so only the op's own error is measured.
    ``to_numpy(tensor)`` -> float64 ndarray (bfloat16 is cast to float32 inside MindSpore first).
    ``cpu_isa()`` -> the kernel unit the CPU library runs in this process ('avx512', 'avx2' or 'baseline'; the
        widest the CPU supports unless ``MS_KLDIV_ISA`` narrows it).
    ``reference(x, t, reduction, log_target, w)`` -> ``Expected(out, dx, dt, out_mag, dx_mag, dt_mag)`` from
        ``ms_kldiv.reference``; the ``*_mag`` arrays are the same sums over absolute values, the scale of
        the rounding error of a sum with cancellation.
    ``assert_close(actual, expected, dtype, mag=None, what='')``: NaN/inf positions must match exactly,
        finite values within ``TOL[dtype] * (|expected| + mag)`` plus 4 of the dtype's smallest subnormals.
    ``check_outcomes(results, x, t, log_target, w_none, w_red, dtype, grads=True, x_dtype=None, t_dtype=None)``:
        every value and gradient of ``run``'s result against the reference, plus shapes and dtypes
        (reduced outputs 0-d, gradients shaped and typed like their operands).
"""
import os

# MindSpore's C++ warnings (e.g. about eliminated side-effect nodes of compile-time checks) drown test output.
os.environ.setdefault("GLOG_v", "3")

import pytest  # noqa: E402

import mindspore as ms  # noqa: E402

import ms_kldiv  # noqa: E402
from ms_kldiv._env import cache_dir  # noqa: E402

# MS_KLDIV_TEST_SYNC=1 (CI's legs set it: .ci/run, .ci/slow): PyNative ops run synchronously (MindSpore's
# launch_blocking), except in the modules marked ``async_dispatch``. Values and gradients are the same either way; on a
# small CPU machine with several test processes per core the default asynchronous hand-offs between threads cost more
# CPU than the ops (docs/mindspore-notes.md). What depends on the dispatch itself (the host call, the kernel tests)
# keeps the default; the thread tests skip (they need the default from the start of the process).
SYNC_DISPATCH = os.environ.get("MS_KLDIV_TEST_SYNC") == "1"
if SYNC_DISPATCH:
    ms.set_context(pynative_synchronize=True)

try:  # hypothesis keeps a cache in ./.hypothesis; the suite, like the package, leaves the cwd alone
    from hypothesis.configuration import set_hypothesis_home_dir
    set_hypothesis_home_dir(cache_dir("hypothesis"))
except ImportError:
    pass

# The helpers live in _checks.py (data, reference, comparisons) and _runners.py (modes, Cells, run); tests
# import them from here.
from _checks import (DTYPES, DTYPE_IDS, SUBNORMAL_SPACING, TOL, Expected, assert_close, central_differences,  # noqa: E402,F401
                     check_outcomes, cpu_isa, dense, distill_abi_kernels, make, reference, to_numpy)
from _runners import (COMPILED_MODES, MODES, REDUCTIONS, AllReductions, AllSecondOrders, FirstOrder,  # noqa: E402,F401
                      FunctionalLoss, Outcome, SecondOrder, Weighted, call_in_mode, graph_mode, loss_cell, run,
                      run_second_order)


# ----------------------------------------------------------------------------------------------- backends
def _available_backends(op="kl_div"):
    return tuple(row["name"] for row in ms_kldiv.backend_info(op=op) if row["available"])


BACKENDS = _available_backends()
DISTILL_BACKENDS = _available_backends("distillation")


def _head_kernel_missing():
    """None when the default backend runs the fused head as one kernel here, else why not."""
    from ms_kldiv.backends import get_distill_kernels
    from ms_kldiv.backends.head import head_ready
    name, kernels = get_distill_kernels("auto")
    if getattr(kernels, "target", None) != "CPU" or not head_ready(kernels.lib_path):
        return f"the head kernel needs the CPU 'aot' library with MindSpore's libdnnl (backend '{name}' here)"
    return None


HEAD_KERNEL_MISSING = _head_kernel_missing() if ms.get_context("device_target") == "CPU" else "not a CPU target"
HEAD_IMPLS = ("kernel", "loop")


def pytest_configure(config):
    required = [n.strip() for n in os.environ.get("MS_KLDIV_REQUIRE_BACKENDS", "").split(",") if n.strip()]
    if not required:
        return
    rows = {row["name"]: row for row in ms_kldiv.backend_info()}
    problems = []
    for name in required:
        if name not in rows:
            problems.append(f"'{name}' is not registered (registered: {sorted(rows)})")
        elif not rows[name]["available"]:
            problems.append(f"'{name}' is unavailable: {rows[name]['reason']}")
    if problems:
        raise pytest.UsageError("MS_KLDIV_REQUIRE_BACKENDS: " + "; ".join(problems))


def pytest_collection_modifyitems(config, items):
    """The tests marked ``slow`` (multi-process, builds, fuzz) first. With workers (``-n``), pytest.ini's
    ``--dist loadfile`` gives each file to one worker and xdist hands the files out largest (most tests) first."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(params=DISTILL_BACKENDS)
def distill_backend(request):
    return request.param


@pytest.fixture(params=HEAD_IMPLS)
def head_impl(request, monkeypatch):
    """How FusedLinearDistillationLoss runs a pass with the default backend: 'kernel' (the whole head in one op,
    ms_kldiv/backends/head.py; a skip with its reason where the library cannot run it) or 'loop' (the MindSpore chunk
    loop around the distillation kernels, as on GPU and Ascend; forced with MS_KLDIV_HEAD_KERNEL=0)."""
    if request.param == "loop":
        monkeypatch.setenv("MS_KLDIV_HEAD_KERNEL", "0")
    elif HEAD_KERNEL_MISSING:
        pytest.skip(HEAD_KERNEL_MISSING)
    return request.param


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


@pytest.fixture(autouse=True)
def _dispatch_of_the_module(request):
    """The default (asynchronous) PyNative dispatch for tests marked ``async_dispatch`` in a synchronized run."""
    if not (SYNC_DISPATCH and request.node.get_closest_marker("async_dispatch")):
        yield
        return
    ms.set_context(pynative_synchronize=False)
    try:
        yield
    finally:
        ms.set_context(pynative_synchronize=True)


@pytest.fixture(autouse=True)
def _restore_pynative():
    """A test that fails inside GRAPH_MODE must not leave the next test in it."""
    yield
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        ms.set_context(mode=ms.PYNATIVE_MODE)
