"""Property-based fuzzing (hypothesis) of values and both gradients against the float64 reference, on every backend,
plus bad-input fuzzing.

Valid inputs: ranks 0-6, broadcast pairs (leading dims dropped, dims set to 1 on either side), sizes 0 and 1,
float16/bfloat16/float32/float64 and mixes, special values in either operand (0, -0, negatives, subnormals of the
operand's dtype, +-inf, NaN of both signs), every reduction and ``log_target``, contiguous / transposed / strided
views. The checks are conftest's ``check_outcomes``: NaN and inf positions exact, finite values within the dtype's
tolerance, shapes and dtypes of the value and of each gradient (gradients of ``sum(out * w)`` for a cotangent w).

* PyNative: ``ms.vjp`` for the value and both gradients, functional or Cell; on 'aot' also the value outside
  autograd, which on CPU is the direct host call (on non-contiguous views too).
* Compiled: GRAPH_MODE ``KLDivLoss`` Cells and ``kl_div`` under ``ms.jit``, all
  four reductions and their gradients in one graph. For 'composite' and 'aot' each family (mode, log_target,
  dtypes, ranks) is compiled once with ``set_inputs`` dims unknown, and every example reuses it; 'akg' compiles
  per static shape (its dynamic-shape path is the composite op), so it gets a few fixed shapes.
* Subnormals: MindSpore's runtimes flush them (graph mode, docs/mindspore-notes.md, and the CPU kernels behind the
  PyNative 'composite' and 'akg' ops), and not consistently: per kernel, per operand dtype (a float16 subnormal
  is normal once widened) and per thread (one ms.jit graph gave 0 on its first call and the exact value later).
  So subnormal operands are fuzzed where the result is IEEE-exact, PyNative 'aot' (the host call and the kernels
  under autograd), against the exact reference. Elsewhere regular values below 2^-60 become 0, and a value or
  gradient may also match the reference of the operands with their subnormals flushed.

Runs are derandomized (fixed seed, no example database), so a failure reproduces; ``EXAMPLES`` below gives the
volume per backend (at least 2,000 each), ``MS_KLDIV_FUZZ_SCALE`` scales it for quick local runs.
"""
import os
import warnings
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mindspore as ms
from mindspore import Tensor, nn, ops

import ms_kldiv
from conftest import (BACKENDS, REDUCTIONS, Outcome, assert_close, check_outcomes, graph_mode, loss_cell, make,
                      reference, to_numpy)

# Examples per backend, PyNative + compiled >= 2,000 for each. A PyNative example costs ~16 ms on 'aot', ~60 ms on
# 'akg' and ~150 ms on 'composite' (MindSpore op dispatch), a compiled one (4 reductions, both gradients) ~30 ms
# once its graph exists, so the slow backends take more of their volume compiled.
EXAMPLES = {"aot": (2000, 400), "akg": (1000, 1000), "composite": (600, 1400)}
DEFAULT_EXAMPLES = (600, 1400)
# MS_KLDIV_FUZZ_SCALE=0.1: a quick local run (CI uses 1).
SCALE = float(os.environ.get("MS_KLDIV_FUZZ_SCALE", "1"))


def _examples(backend, compiled):
    return max(1, int(SCALE * EXAMPLES.get(backend, DEFAULT_EXAMPLES)[compiled]))
DTYPES = (ms.float16, ms.bfloat16, ms.float32, ms.float64)
MAX_ELEMENTS = 96


def _settings(n):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


def _promote(a, b):
    if a == b:
        return a
    return ms.float64 if ms.float64 in (a, b) else ms.float32


def _tiny(dtype):
    """Smallest normal of ``dtype``."""
    return {ms.float16: 2.0 ** -14, ms.bfloat16: 2.0 ** -126, ms.float32: 2.0 ** -126, ms.float64: 2.0 ** -1022}[dtype]


# ------------------------------------------------------------------------------------------------ strategies
SPECIALS = ("zero", "-zero", "inf", "-inf", "nan", "-nan", "subnormal", "-subnormal", "negative")
_REGULAR = {"x": st.floats(-30, 8, width=32), "p": st.floats(0, 1.25, width=32), "l": st.floats(-30, 2, width=32)}


def _special(name, dtype):
    return {"zero": 0.0, "-zero": -0.0, "inf": np.inf, "-inf": -np.inf, "nan": np.nan,
            "-nan": np.copysign(np.nan, -1.0), "subnormal": 0.375 * _tiny(dtype),
            "-subnormal": -0.375 * _tiny(dtype), "negative": -0.5}[name]


@st.composite
def _values(draw, n, kind, dtype, subnormals=True):
    """n float64 values for an operand of ``dtype``: 'x' log-probabilities, 'p' probabilities, 'l' log-targets."""
    if n == 0:
        return np.zeros(0)
    specials = draw(st.booleans())
    names = SPECIALS if subnormals else tuple(v for v in SPECIALS if "subnormal" not in v)
    elem = st.one_of(_REGULAR[kind], _REGULAR[kind], _REGULAR[kind], st.sampled_from(names)) if specials \
        else _REGULAR[kind]
    vals = draw(st.lists(elem, min_size=n, max_size=n))
    # Regular values below 2^-60 become 0: their products (t * w / n) can fall below the normal range, which
    # MindSpore's kernels flush (subnormals come from the specials, see the module docstring).
    return np.array([_special(v, dtype) if isinstance(v, str) else (v if abs(v) >= 2.0 ** -60 else 0.0 * v)
                     for v in vals], np.float64)


@st.composite
def _out_shape(draw, rank):
    dims = draw(st.lists(st.sampled_from((1, 1, 2, 3, 4, 5, 7)), min_size=rank, max_size=rank))
    while int(np.prod(dims, dtype=np.int64)) > MAX_ELEMENTS:
        dims[int(np.argmax(dims))] = 1
    if rank and draw(st.integers(0, 11)) == 0:
        dims[draw(st.integers(0, rank - 1))] = 0
    return tuple(dims)


@st.composite
def _operand_shape(draw, out, rank=None):
    """A shape that broadcasts into ``out``: leading dims dropped (or exactly ``rank`` dims), some dims set to 1."""
    if rank is None:
        rank = draw(st.integers(0, len(out)))
    dims = list(out[len(out) - rank:])
    for i in range(rank):
        if draw(st.integers(0, 3)) == 0:
            dims[i] = 1
    return tuple(dims)


Case = namedtuple("Case", "xs ts x_dtype t_dtype x t reduction log_target layout_x layout_t w_scale cell")


@st.composite
def _dtypes(draw):
    x_dtype = draw(st.sampled_from(DTYPES))
    t_dtype = draw(st.sampled_from(DTYPES)) if draw(st.integers(0, 2)) == 0 else x_dtype
    return x_dtype, t_dtype


@st.composite
def pynative_cases(draw, shapes=None, subnormals=True):
    if shapes is None:
        out = draw(_out_shape(draw(st.integers(0, 6))))
        xs, ts = draw(_operand_shape(out)), draw(_operand_shape(out))
    else:
        xs, ts = draw(st.sampled_from(shapes))
    x_dtype, t_dtype = draw(_dtypes())
    log_target = draw(st.booleans())
    x = draw(_values(int(np.prod(xs, dtype=np.int64)), "x", x_dtype, subnormals)).reshape(xs)
    t = draw(_values(int(np.prod(ts, dtype=np.int64)), "l" if log_target else "p", t_dtype, subnormals)).reshape(ts)
    layouts = st.sampled_from(("contiguous", "contiguous", "transposed", "strided"))
    return Case(xs, ts, x_dtype, t_dtype, x, t, draw(st.sampled_from(REDUCTIONS)), log_target, draw(layouts),
                draw(layouts), draw(st.sampled_from((1.0, -0.5, 2.0, 0.75))), draw(st.booleans()))


# ------------------------------------------------------------------------------------------------ operands
def _tensor(values, dtype, layout):
    """(Tensor, float64 values it holds): contiguous, or a transposed / strided view with the same values."""
    if layout == "transposed" and values.ndim >= 2 and values.size:
        perm = tuple(reversed(range(values.ndim)))
        base, held = make(np.ascontiguousarray(np.transpose(values, perm)), dtype)
        return ops.transpose(base, perm), np.transpose(held, perm)
    if layout == "strided" and values.ndim >= 1 and values.size:
        wide = np.zeros(values.shape[:-1] + (2 * values.shape[-1],))
        wide[..., ::2] = values
        base, held = make(wide, dtype)
        return base[..., ::2], held[..., ::2]
    return make(values, dtype)


def _cotangents(case, dtype):
    """w for 'none' (broadcast shape, varied) and for the reduced outputs (0-d), as Tensors and held values."""
    shape = np.broadcast_shapes(case.xs, case.ts)
    w = case.w_scale * (1.0 + 0.25 * (np.arange(int(np.prod(shape, dtype=np.int64))) % 3)).reshape(shape)
    (w_none, wv_none), (w_red, wv_red) = make(w, dtype), make(case.w_scale, dtype)
    return w_none, wv_none, w_red, wv_red


def _flushed(values, dtype, compute_dtype):
    """values with what is subnormal in their own dtype or in the compute dtype set to zero."""
    tiny = max(_tiny(dtype), _tiny(ms.float64 if compute_dtype == ms.float64 else ms.float32))
    return np.where(np.abs(values) < tiny, 0.0 * values, values)


def _check(results, xv, tv, case, wv_none, wv_red, dtype, grads=True, flush_ok=False, what=""):
    """conftest's check_outcomes; with ``flush_ok`` the value and each gradient may instead match the reference of
    the flushed operands, each on its own (forward and backward kernels may run in different runtimes)."""
    if not flush_ok:
        check_outcomes(results, xv, tv, case.log_target, wv_none, wv_red, dtype, grads=grads, x_dtype=case.x_dtype,
                       t_dtype=case.t_dtype, what=what)
        return
    flushed = (_flushed(xv, case.x_dtype, dtype), _flushed(tv, case.t_dtype, dtype))

    def either(check):
        try:
            check(xv, tv)
        except AssertionError:
            check(*flushed)

    values = {r: Outcome(o.out, None, None) for r, o in results.items()}
    either(lambda xs, ts: check_outcomes(values, xs, ts, case.log_target, wv_none, wv_red, dtype, grads=False,
                                         what=what))
    if not grads:
        return
    for r, o in results.items():
        w = wv_none if r == "none" else wv_red
        for i, g, g_dtype, shape, name in ((1, o.dx, case.x_dtype, xv.shape, "d/dinput"),
                                           (2, o.dt, case.t_dtype, tv.shape, "d/dtarget")):
            tag = f"{what} reduction={r!r} {name}"
            assert tuple(g.shape) == shape and g.dtype == g_dtype, f"{tag}: {g.shape} {g.dtype}"

            def check(xs, ts, g=g, i=i, g_dtype=g_dtype, tag=tag):
                exp = reference(xs, ts, r, case.log_target, w)
                assert_close(to_numpy(g), exp[i], g_dtype, exp[i + 3], tag)
            either(check)


# ------------------------------------------------------------------------------------------------ PyNative
def _pynative_fn(backend, case):
    if case.cell:
        return loss_cell("cell", backend, case.reduction, case.log_target)

    def fn(x, t):
        return ms_kldiv.kl_div(x, t, case.reduction, case.log_target, backend=backend)
    return fn


def _run_pynative(backend, case):
    x, xv = _tensor(case.x, case.x_dtype, case.layout_x)
    t, tv = _tensor(case.t, case.t_dtype, case.layout_t)
    dtype = _promote(case.x_dtype, case.t_dtype)
    w_none, wv_none, w_red, wv_red = _cotangents(case, dtype)
    fn = _pynative_fn(backend, case)
    what = f"{backend} PyNative {case}"
    flush_ok = backend != "aot"  # (see the module docstring: subnormals)
    if backend == "aot":  # (elsewhere the same ops as under autograd)
        _check({case.reduction: Outcome(fn(x, t), None, None)}, xv, tv, case, wv_none, wv_red, dtype, grads=False,
               what=what + " (value outside autograd)")
    out, vjp = ms.vjp(fn, x, t)
    dx, dt = vjp(w_none if case.reduction == "none" else w_red)
    _check({case.reduction: Outcome(out, dx, dt)}, xv, tv, case, wv_none, wv_red, dtype, flush_ok=flush_ok, what=what)


assert all(sum(n) >= 2000 for n in list(EXAMPLES.values()) + [DEFAULT_EXAMPLES])

# AKG compiles per shape: its PyNative examples draw from these pairs (ranks 0-6, broadcasting, empty).
AKG_SHAPES = [((), ()), ((1,), ()), ((5,), (5,)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((), (2, 3)),
              ((2, 3, 1, 2), (3, 2, 2)), ((1, 2, 1, 2, 1, 2), (2, 1, 2, 1, 2, 1)), ((0, 3), (3,)), ((2, 0), (1,))]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_pynative(backend):
    count = []

    examples = _examples(backend, compiled=False)

    @_settings(examples)
    @given(case=pynative_cases(AKG_SHAPES if backend == "akg" else None, subnormals=backend == "aot"))
    def check(case):
        count.append(1)
        _run_pynative(backend, case)

    check()
    assert len(count) >= examples, f"hypothesis ran {len(count)} examples"
    print(f"{backend}: {len(count)} PyNative examples")


# ------------------------------------------------------------------------------------------------ compiled
# (mode, log_target, input dtype, target dtype, input rank, target rank); 'akg' also fixes the shapes.
FAMILIES = [
    ("graph", False, ms.float32, ms.float32, 2, 2),
    ("jit", True, ms.float32, ms.float32, 3, 1),
    ("graph", True, ms.float64, ms.float64, 1, 3),
    ("jit", False, ms.float16, ms.float16, 2, 2),
    ("graph", False, ms.bfloat16, ms.bfloat16, 0, 2),
    ("jit", True, ms.float16, ms.bfloat16, 4, 4),
    ("graph", False, ms.float32, ms.float64, 6, 5),
    ("jit", False, ms.bfloat16, ms.float32, 2, 3),
]
AKG_FAMILIES = [
    ("graph", False, ms.float32, ms.float32, (3, 4), (4,)),
    ("jit", True, ms.float64, ms.float64, (2, 1, 3), (1, 5, 1)),
    ("graph", True, ms.float16, ms.bfloat16, (5,), (2, 5)),
    ("jit", False, ms.bfloat16, ms.bfloat16, (), (3,)),
    ("graph", False, ms.float32, ms.float64, (1, 2, 1, 2, 1, 2), (2, 1, 2, 1, 2, 1)),
]


@st.composite
def compiled_cases(draw, family):
    mode, log_target, x_dtype, t_dtype, xr, tr = family
    if isinstance(xr, tuple):
        xs, ts = xr, tr
    else:
        out = draw(_out_shape(max(xr, tr)))
        xs, ts = draw(_operand_shape(out, xr)), draw(_operand_shape(out, tr))
    x = draw(_values(int(np.prod(xs, dtype=np.int64)), "x", x_dtype, subnormals=False)).reshape(xs)
    t = draw(_values(int(np.prod(ts, dtype=np.int64)), "l" if log_target else "p", t_dtype, subnormals=False)).reshape(ts)
    case = Case(xs, ts, x_dtype, t_dtype, x, t, None, log_target, "contiguous", "contiguous",
                draw(st.sampled_from((1.0, -0.5, 2.0))), mode == "graph")
    return mode, case


class _Weighted(nn.Cell):
    """sum(loss * w), the product taken in float32/float64: with unknown dims MindSpore's autodiff of a product sums
    its gradient back over possible broadcast dims, and CPU ReduceSum has no half-type kernel."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, x, t, w):
        out = self.loss(x, t)
        wide = ms.float64 if out.dtype == ms.float64 else ms.float32
        return (ops.cast(out, wide) * ops.cast(w, wide)).sum()


class _AllReductions(nn.Cell):
    """Value and both gradients of every reduction in one graph (conftest's AllReductions, with _Weighted)."""

    def __init__(self, losses):
        super().__init__()
        self.losses = nn.CellList(losses)
        self.weighted = nn.CellList([_Weighted(loss) for loss in losses])
        self.is_none = tuple(r == "none" for r in REDUCTIONS)

    def construct(self, x, t, w_none, w_red):
        res = ()
        for i in range(len(REDUCTIONS)):
            w = w_none if self.is_none[i] else w_red
            dx, dt = ms.grad(self.weighted[i], grad_position=(0, 1))(x, t, w)
            res = res + ((self.losses[i](x, t), dx, dt),)
        return res


_COMPILED = {}


def _compiled_cell(backend, families, index):
    """One AllReductions graph per family, with unknown dims (static shapes for akg)."""
    key = (backend, index)
    if key not in _COMPILED:
        mode, log_target, x_dtype, t_dtype, xr, tr = families[index]
        kind = "cell" if mode == "graph" else "functional"
        cell = _AllReductions([loss_cell(kind, backend, r, log_target) for r in REDUCTIONS])
        if not isinstance(xr, tuple):
            dtype = _promote(x_dtype, t_dtype)
            cell.set_inputs(Tensor(shape=[None] * xr, dtype=x_dtype), Tensor(shape=[None] * tr, dtype=t_dtype),
                            Tensor(shape=[None] * max(xr, tr), dtype=dtype), Tensor(shape=[], dtype=dtype))
        _COMPILED[key] = ms.jit(cell) if mode == "jit" else cell
    return _COMPILED[key]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_compiled(backend):
    families = AKG_FAMILIES if backend == "akg" else FAMILIES
    examples = _examples(backend, compiled=True)
    count = []
    for index, family in enumerate(families):
        _fuzz_family(backend, families, index, family, -(-examples // len(families)), count)
    assert len(count) >= examples, f"hypothesis ran {len(count)} examples"
    print(f"{backend}: {len(count)} compiled examples over {len(families)} graphs")


def _fuzz_family(backend, families, index, family, examples, count):
    @_settings(examples)
    @given(drawn=compiled_cases(family))
    def check(drawn):
        mode, case = drawn
        count.append(1)
        x, xv = make(case.x, case.x_dtype)
        t, tv = make(case.t, case.t_dtype)
        dtype = _promote(case.x_dtype, case.t_dtype)
        w_none, wv_none, w_red, wv_red = _cotangents(case, dtype)
        cell = _compiled_cell(backend, families, index)
        if mode == "graph":
            with graph_mode():
                res = cell(x, t, w_none, w_red)
        else:
            res = cell(x, t, w_none, w_red)
        results = {r: Outcome(*o) for r, o in zip(REDUCTIONS, res)}
        _check(results, xv, tv, case, wv_none, wv_red, dtype, flush_ok=True, what=f"{backend} {mode} {case}")

    check()


# ------------------------------------------------------------------------------------------------ bad input
# Every invalid argument the documented checks cover, combined: the call raises the documented TypeError or
# ValueError (a message starting "For 'kl_div'" / "For 'KLDivLoss'") before any op runs, and nothing breaks for the
# next call (a GRAPH_MODE Cell keeps working). Extends test_validation.py's one-bad-argument cases.
_BAD_OPERANDS = {
    "list": (lambda: [[0.1, 0.2, 0.3]] * 2, TypeError), "ndarray": (lambda: np.ones((2, 3), np.float32), TypeError),
    "float": (lambda: 0.5, TypeError), "int": (lambda: 3, TypeError), "None": (lambda: None, TypeError),
    "str": (lambda: "x", TypeError),
    "int32": (lambda: Tensor(np.ones((2, 3), np.int32)), TypeError),
    "int64": (lambda: Tensor(np.ones((2, 3), np.int64)), TypeError),
    "uint8": (lambda: Tensor(np.ones((2, 3), np.uint8)), TypeError),
    "bool": (lambda: Tensor(np.ones((2, 3), np.bool_)), TypeError),
    "complex64": (lambda: Tensor(np.ones((2, 3), np.complex64)), TypeError),
}
_UNBROADCASTABLE = [((2, 3), (4,)), ((2, 3), (3, 2)), ((5,), (2, 3, 4)), ((0, 3), (2, 3)), ((2, 1, 3), (4, 2))]
_BAD_REDUCTIONS = [(1, TypeError), (None, TypeError), (1.5, TypeError), (b"sum", TypeError), (["sum"], TypeError),
                   ("avg", ValueError), ("Mean", ValueError), ("", ValueError), ("sum ", ValueError)]
_BAD_LOG_TARGETS = [(1, TypeError), (0, TypeError), ("yes", TypeError), (None, TypeError), (np.bool_(True), TypeError),
                    (1.0, TypeError)]
_BAD_BACKENDS = [(3, TypeError), (None, TypeError), (["aot"], TypeError), ("cuda", ValueError), ("AOT", ValueError),
                 ("", ValueError), ("auto ", ValueError)]
_BAD_PIECES = ("input", "target", "shapes", "reduction", "log_target", "backend", "size_average")


@st.composite
def bad_calls(draw):
    """(input, target, kwargs, exception types any of which is right, which pieces are bad)."""
    pieces = draw(st.sets(st.sampled_from(_BAD_PIECES), min_size=1, max_size=3))
    dtype = draw(st.sampled_from(DTYPES))
    xs, ts = draw(st.sampled_from(_UNBROADCASTABLE)) if "shapes" in pieces else ((2, 3), (3,))
    x, t = make(np.full(xs, -1.0), dtype)[0], make(np.full(ts, 0.25), draw(st.sampled_from(DTYPES)))[0]
    kwargs = {"reduction": draw(st.sampled_from(REDUCTIONS)), "log_target": draw(st.booleans()),
              "backend": draw(st.sampled_from(("auto",) + BACKENDS))}
    expected = set()
    if "shapes" in pieces:
        expected.add(ValueError)
    for name in ("input", "target"):
        if name in pieces:
            make_bad, exc = _BAD_OPERANDS[draw(st.sampled_from(sorted(_BAD_OPERANDS)))]
            x, t = (make_bad(), t) if name == "input" else (x, make_bad())
            expected.add(exc)
    for name, bad in (("reduction", _BAD_REDUCTIONS), ("log_target", _BAD_LOG_TARGETS), ("backend", _BAD_BACKENDS)):
        if name in pieces:
            kwargs[name], exc = draw(st.sampled_from(bad))
            expected.add(exc)
    if "size_average" in pieces:
        kwargs["size_average"] = draw(st.sampled_from(("no", 1, 0.5)))
        expected.add(TypeError)
    return x, t, kwargs, tuple(expected), pieces


def _starts(excinfo, *names):
    msg = str(excinfo.value).strip().lstrip("'\"")
    assert any(msg.startswith(f"For '{name}'") for name in names), msg[:300]


class _NoKernel:
    """get_op's result, counting calls: an op that runs before the arguments are all checked fails the test."""

    def __init__(self, get_op):
        self.get_op, self.calls = get_op, 0

    def __call__(self, *args, **kwargs):
        op = self.get_op(*args, **kwargs)

        def counted(*a):
            self.calls += 1
            return op(*a)
        return counted


@pytest.mark.slow
def test_fuzz_bad_input_pynative(monkeypatch):
    from ms_kldiv import functional
    from ms_kldiv.nn import loss as loss_module
    spy = _NoKernel(functional.get_op)
    monkeypatch.setattr(functional, "get_op", spy)
    monkeypatch.setattr(loss_module, "get_op", spy)
    count = []

    @_settings(max(1, int(SCALE * 400)))
    @given(call=bad_calls())
    def check(call):
        x, t, kwargs, expected, pieces = call
        count.append(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with pytest.raises(expected) as excinfo:
                ms_kldiv.kl_div(x, t, **kwargs)
            _starts(excinfo, "kl_div")
            if pieces & {"reduction", "log_target", "backend", "size_average"}:
                with pytest.raises(expected) as excinfo:  # the Cell checks its options when it is built
                    ms_kldiv.KLDivLoss(**kwargs)
                # (the backend registry words its errors for 'kl_div' whichever API asked)
                _starts(excinfo, "KLDivLoss", *(("kl_div",) if "backend" in pieces else ()))
            else:
                cell = ms_kldiv.KLDivLoss(**kwargs)
                with pytest.raises(expected) as excinfo:
                    cell(x, t)
                _starts(excinfo, "KLDivLoss")
        assert spy.calls == 0, f"an op ran before the bad argument was reported: {kwargs}, {pieces}"

    check()
    assert count
    x, xv = make([[-1.2, -0.4], [-2.0, -0.1]], ms.float32)
    t, tv = make([[0.3, 0.7], [0.0, 1.0]], ms.float32)
    check_outcomes({"sum": Outcome(ms_kldiv.kl_div(x, t, "sum"), None, None)}, xv, tv, False, None, None, ms.float32,
                   grads=False)


@st.composite
def bad_graph_operands(draw):
    kind = draw(st.sampled_from(("dtype-input", "dtype-target", "shapes")))
    if kind == "shapes":
        xs, ts = draw(st.sampled_from(_UNBROADCASTABLE))
        return make(np.full(xs, -1.0), ms.float32)[0], make(np.full(ts, 0.5), ms.float32)[0], ValueError
    bad = _BAD_OPERANDS[draw(st.sampled_from(("int32", "int64", "uint8", "bool", "complex64")))][0]()
    good = make(np.full((2, 3), 0.5), ms.float32)[0]
    return (bad, good, TypeError) if kind == "dtype-input" else (good, bad, TypeError)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_bad_input_graph_cell_keeps_working(backend):
    """Bad operands in a row against one GRAPH_MODE Cell (each refused at compile time), then good ones: the Cell
    computes the reference value and both gradients."""
    loss = ms_kldiv.KLDivLoss("sum", backend=backend)

    @_settings(max(1, int(SCALE * 12)))
    @given(call=bad_graph_operands())
    def check(call):
        x, t, exc = call
        with graph_mode():
            with pytest.raises(exc) as excinfo:
                loss(x, t)
        _starts(excinfo, "KLDivLoss")

    check()
    x, xv = make([[-1.2, -0.4, -3.0], [-2.0, -0.1, -0.5]], ms.float32)
    t, tv = make([0.2, 0.0, 0.8], ms.float32)
    with graph_mode():
        out = loss(x, t)
        dx, dt = ms.grad(loss, grad_position=(0, 1))(x, t)
    check_outcomes({"sum": Outcome(out, dx, dt)}, xv, tv, False, None, 1.0, ms.float32)
