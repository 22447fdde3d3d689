"""Shared fixtures and helpers of the ms_kldiv test suite (other tests/test_*.py files use them too).

Import helpers with ``from conftest import run, make, ...`` (pytest puts tests/ on sys.path). Importing this
file also sets ``GLOG_v=3`` (unless set) to quiet MindSpore's C++ warnings, and moves hypothesis' cache out of
the working directory.

Backends
    ``backend`` (fixture, str): one parameter per backend that ``ms_kldiv.backend_info()`` reports available on
        the current device target ('composite' always; 'aot', 'akg', ... as soon as they register and can run).
        New backends are picked up with no edit here.
    ``BACKENDS`` (tuple of str): the same list, for tests that parametrize by hand.
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
import contextlib
import os
from collections import namedtuple

# MindSpore's C++ warnings (e.g. about eliminated side-effect nodes of compile-time checks) drown test output.
os.environ.setdefault("GLOG_v", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

import ms_kldiv  # noqa: E402
from ms_kldiv import reference as ref  # noqa: E402
from ms_kldiv._env import cache_dir  # noqa: E402

try:  # hypothesis keeps a cache in ./.hypothesis; the suite, like the package, leaves the cwd alone
    from hypothesis.configuration import set_hypothesis_home_dir
    set_hypothesis_home_dir(cache_dir("hypothesis"))
except ImportError:
    pass

REDUCTIONS = ref.REDUCTIONS
MODES = ("pynative", "jit", "graph", "pynative_cell")
COMPILED_MODES = ("jit", "graph")
DTYPES = (ms.float64, ms.float32, ms.float16, ms.bfloat16)
DTYPE_IDS = ("f64", "f32", "f16", "bf16")
# Relative error allowed, relative to |expected| + the magnitude of the summed terms. Half types are computed
# in float32 and rounded once on output (and once more where a broadcast gradient is summed back).
TOL = {ms.float64: 1e-12, ms.float32: 1e-5, ms.float16: 2e-3, ms.bfloat16: 1.6e-2}
# A result in a dtype's subnormal range has a fixed absolute spacing (its smallest subnormal): no relative
# tolerance applies there.
SUBNORMAL_SPACING = {ms.float64: 2.0**-1074, ms.float32: 2.0**-149, ms.float16: 2.0**-24, ms.bfloat16: 2.0**-133}


# ----------------------------------------------------------------------------------------------- backends
def _available_backends():
    return tuple(row["name"] for row in ms_kldiv.backend_info() if row["available"])


BACKENDS = _available_backends()


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


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


@pytest.fixture(autouse=True)
def _restore_pynative():
    """A test that fails inside GRAPH_MODE must not leave the next test in it."""
    yield
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        ms.set_context(mode=ms.PYNATIVE_MODE)


@contextlib.contextmanager
def graph_mode():
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=previous)


# ------------------------------------------------------------------------------------------------- data
def cpu_isa():
    from ms_kldiv import _build
    return _build.library_isa(_build.ensure_library("CPU"))


def dense(rng, n_in, n_out, std=0.3):
    """An ``nn.Dense`` with weights drawn from ``rng`` (normal, ``std``) and zero bias: MindSpore's default init is
    unseeded, and tests that train from it pass or fail with the draw."""
    layer = nn.Dense(n_in, n_out)
    layer.weight.set_data(ms.Tensor(rng.normal(0, std, (n_out, n_in)), ms.float32))
    layer.bias.set_data(ms.Tensor(np.zeros(n_out), ms.float32))
    return layer


def to_numpy(tensor):
    if tensor.dtype == ms.bfloat16:
        tensor = ops.cast(tensor, ms.float32)
    return np.asarray(tensor.asnumpy(), dtype=np.float64)


def make(a, dtype):
    """A Tensor of ``dtype`` holding ``a``, and the float64 values it actually holds after rounding."""
    a = np.asarray(a, dtype=np.float64)
    if dtype == ms.bfloat16:
        tensor = ms.Tensor(a.astype(np.float32), ms.bfloat16)
    else:
        tensor = ms.Tensor(a.astype(ms.dtype_to_nptype(dtype)), dtype)
    return tensor, to_numpy(tensor)


def _sum_to(g, shape):
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape) if axes else g.reshape(shape)


Expected = namedtuple("Expected", "out dx dt out_mag dx_mag dt_mag")


def reference(x, t, reduction, log_target, w=None):
    """Float64 reference of value and weighted gradients, with the error scales of each (see module doc)."""
    x = np.asarray(x, np.float64)
    t = np.asarray(t, np.float64)
    out = ref.kl_div(x, t, reduction, log_target)
    dx, dt = ref.kl_div_grads(x, t, reduction, log_target, dout=w)
    loss_mag, pdx_mag, pdt_mag = _term_magnitudes(x, t, log_target)
    s = abs(ref.reduction_scale(reduction, x.shape, loss_mag.shape))
    g = np.ones(loss_mag.shape) if w is None else np.abs(np.broadcast_to(np.asarray(w, np.float64), loss_mag.shape))
    with np.errstate(all="ignore"):
        out_mag = loss_mag if reduction == "none" else np.asarray(loss_mag.sum() * s)
        dx_mag = _sum_to(pdx_mag * g * s, x.shape)
        dt_mag = _sum_to(pdt_mag * g * s, t.shape)
    return Expected(out, dx, dt, out_mag, dx_mag, dt_mag)


def _term_magnitudes(x, t, log_target):
    """Pointwise sums of the absolute values of what each formula adds up (t*log t and t*x, ...): the scale
    of the rounding error, which can exceed the result where log t is close to x."""
    x, t = np.broadcast_arrays(x, t)
    mass = ref.has_mass(t, log_target)
    xs, ts = np.where(mass, np.abs(x), 0.0), np.where(mass, t, 1.0)
    with np.errstate(all="ignore"):
        if log_target:
            e = np.exp(ts)
            loss, dx, dt = e * (np.abs(ts) + xs), e, e * (np.abs(ts) + xs + 1)
        else:
            # + 1: vectorized float32 log kernels are accurate to ~eps absolute (not relative) near t = 1.
            loss, dx, dt = np.abs(ts) * (np.abs(np.log(ts)) + xs + 1), np.abs(ts), np.abs(np.log(ts)) + 1 + xs
    return tuple(np.where(mass & np.isfinite(m), m, 0.0) for m in (loss, dx, dt))


def assert_close(actual, expected, dtype, mag=None, what=""):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    if not np.array_equal(nan_a, nan_e):
        i = tuple(np.argwhere(nan_a != nan_e)[0])
        raise AssertionError(f"{what}: NaN mismatch at {np.argwhere(nan_a != nan_e)[:5].tolist()}; "
                             f"first: got {actual[i]!r}, expected {expected[i]!r}")
    inf_e = np.isinf(expected)
    assert np.array_equal(actual[inf_e], expected[inf_e]), f"{what}: infinities differ"
    fin = ~(nan_e | inf_e)
    assert np.all(np.isfinite(actual[fin])), f"{what}: non-finite where the reference is finite"
    scale = np.abs(expected) if mag is None else np.abs(expected) + np.abs(np.broadcast_to(mag, expected.shape))
    tol = TOL[dtype] * scale + 4 * SUBNORMAL_SPACING[dtype]
    err = np.abs(actual - expected)
    bad = fin & ~(err <= tol)
    if np.any(bad):
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what} ({dtype}): {int(bad.sum())} of {bad.size} elements off; first at {i}: "
                             f"got {actual[i]!r}, expected {expected[i]!r}, tol {tol[i]:.3g}")


# ------------------------------------------------------------------------------------------------ cells
def _wide(v):
    return ops.cast(v, ms.float32) if v.dtype in (ms.float16, ms.bfloat16) else v


class FunctionalLoss(nn.Cell):
    """``ms_kldiv.kl_div`` as a Cell, so the functional can be compiled with ``ms.jit``."""

    def __init__(self, backend, reduction, log_target):
        super().__init__()
        self.backend = backend
        self.reduction = reduction
        self.log_target = log_target

    def construct(self, x, t):
        return ms_kldiv.kl_div(x, t, self.reduction, self.log_target, backend=self.backend)


class Weighted(nn.Cell):
    """sum(loss(x, t) * w): w injects an arbitrary incoming gradient (sensitivity). Summed in float32 at
    least, because MindSpore's CPU ReduceSum has no bfloat16 kernel."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, x, t, w):
        return _wide(self.loss(x, t) * w).sum()


class FirstOrder(nn.Cell):
    """sum(dx * v1 + dt * v2) for the gradients of ``Weighted``: its gradient is the second order."""

    def __init__(self, weighted):
        super().__init__()
        self.weighted = weighted

    def construct(self, x, t, w, v1, v2):
        dx, dt = ms.grad(self.weighted, grad_position=(0, 1))(x, t, w)
        return _wide(dx * v1).sum() + _wide(dt * v2).sum()


class AllReductions(nn.Cell):
    """Value (and gradients) for several reductions in one Cell: one compile serves all of them."""

    def __init__(self, losses, reductions, grads):
        super().__init__()
        self.losses = nn.CellList(losses)
        self.weighted = nn.CellList([Weighted(l) for l in losses])
        self.is_none = tuple(r == "none" for r in reductions)
        self.grads = grads
        self.n = len(losses)

    def construct(self, x, t, w_none, w_red):
        res = ()
        for i in range(self.n):
            out = self.losses[i](x, t)
            if self.grads:
                w = w_none if self.is_none[i] else w_red
                dx, dt = ms.grad(self.weighted[i], grad_position=(0, 1))(x, t, w)
                res = res + ((out, dx, dt),)
            else:
                res = res + ((out,),)
        return res


class AllSecondOrders(nn.Cell):
    """Value, first- and second-order gradients for several reductions, in one compiled graph."""

    def __init__(self, losses, reductions):
        super().__init__()
        self.losses = nn.CellList(losses)
        self.weighted = nn.CellList([Weighted(l) for l in losses])
        self.first = nn.CellList([FirstOrder(w) for w in self.weighted])
        self.is_none = tuple(r == "none" for r in reductions)
        self.n = len(losses)

    def construct(self, x, t, w_none, w_red, v1, v2):
        res = ()
        for i in range(self.n):
            w = w_none if self.is_none[i] else w_red
            out = self.losses[i](x, t)
            dx, dt = ms.grad(self.weighted[i], grad_position=(0, 1))(x, t, w)
            gx, gt = ms.grad(self.first[i], grad_position=(0, 1))(x, t, w, v1, v2)
            res = res + ((out, dx, dt, gx, gt),)
        return res


_CELLS = {}


def _cached(key, factory):
    if key not in _CELLS:
        _CELLS[key] = factory()
    return _CELLS[key]


def loss_cell(kind, backend, reduction, log_target):
    def factory():
        if kind == "cell":
            return ms_kldiv.KLDivLoss(reduction, log_target, backend=backend)
        return FunctionalLoss(backend, reduction, log_target)
    return _cached(("loss", kind, backend, reduction, log_target), factory)


def _kind(mode):
    return "cell" if mode in ("graph", "pynative_cell") else "functional"


def call_in_mode(mode, cell, *args):
    if mode == "jit":
        return _cached(("jit", id(cell)), lambda: ms.jit(cell))(*args)
    if mode == "graph":
        with graph_mode():
            return cell(*args)
    return cell(*args)


def _ones_like_out(x, t, dtype):
    shape = np.broadcast_shapes(tuple(x.shape), tuple(t.shape))
    return make(np.ones(shape), dtype)[0], make(1.0, dtype)[0]


Outcome = namedtuple("Outcome", "out dx dt")


def run(mode, backend, x, t, log_target=False, reductions=REDUCTIONS, grads=True, w_none=None, w_red=None):
    assert mode in MODES, mode
    reductions = tuple(reductions)
    if w_none is None or w_red is None:
        ones_none, ones_red = _ones_like_out(x, t, x.dtype)
        w_none = ones_none if w_none is None else w_none
        w_red = ones_red if w_red is None else w_red
    kind = _kind(mode)
    cell = _cached(("all", kind, backend, log_target, reductions, grads), lambda: AllReductions(
        [loss_cell(kind, backend, r, log_target) for r in reductions], reductions, grads))
    res = call_in_mode(mode, cell, x, t, w_none, w_red)
    return {r: Outcome(*(tuple(o) + (None, None))[:3]) for r, o in zip(reductions, res)}


def run_second_order(mode, backend, x, t, log_target, w_none, w_red, v1, v2, reductions=REDUCTIONS):
    assert mode in MODES, mode
    reductions = tuple(reductions)
    kind = _kind(mode)
    cell = _cached(("second", kind, backend, log_target, reductions), lambda: AllSecondOrders(
        [loss_cell(kind, backend, r, log_target) for r in reductions], reductions))
    res = call_in_mode(mode, cell, x, t, w_none, w_red, v1, v2)
    return {r: SecondOrder(*g) for r, g in zip(reductions, res)}


SecondOrder = namedtuple("SecondOrder", "out dx dt gx gt")


def check_outcomes(results, x, t, log_target, w_none, w_red, dtype, grads=True, x_dtype=None, t_dtype=None,
                   what=""):
    """Check ``run``'s result; ``x, t, w_*`` are the float64 values the Tensors hold, ``dtype`` the promoted
    dtype, ``x_dtype``/``t_dtype`` the operands' own dtypes (default: ``dtype``)."""
    x = np.asarray(x, np.float64)
    t = np.asarray(t, np.float64)
    x_dtype = x_dtype or dtype
    t_dtype = t_dtype or dtype
    bshape = np.broadcast_shapes(x.shape, t.shape)
    for reduction, res in results.items():
        w = (np.ones(bshape) if w_none is None else w_none) if reduction == "none" else \
            (1.0 if w_red is None else w_red)
        exp = reference(x, t, reduction, log_target, w)
        tag = f"{what} reduction={reduction!r} log_target={log_target}"
        assert res.out.dtype == dtype, f"{tag}: output dtype {res.out.dtype} != {dtype}"
        assert tuple(res.out.shape) == (bshape if reduction == "none" else ()), \
            f"{tag}: output shape {res.out.shape}"
        assert_close(to_numpy(res.out), exp.out, dtype, exp.out_mag, f"{tag} value")
        if not grads:
            continue
        for name, g, e, m, shape, dt in (("d/dinput", res.dx, exp.dx, exp.dx_mag, x.shape, x_dtype),
                                         ("d/dtarget", res.dt, exp.dt, exp.dt_mag, t.shape, t_dtype)):
            assert tuple(g.shape) == shape, f"{tag} {name}: shape {g.shape} != operand's {shape}"
            assert g.dtype == dt, f"{tag} {name}: dtype {g.dtype} != operand's {dt}"
            # Summing a broadcast gradient back in the operand's half dtype adds one rounding per term.
            assert_close(to_numpy(g), e, dt, m, f"{tag} {name}")
