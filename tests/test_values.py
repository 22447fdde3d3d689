"""Forward values (and first-order gradients, which come out of the same compiled graph) of every backend in
every mode against the float64 NumPy reference of the SPEC, plus the SPEC's documented values."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mindspore as ms

import ms_kldiv
from ms_kldiv import reference as ms_reference
from conftest import (COMPILED_MODES, DTYPE_IDS, DTYPES, MODES, REDUCTIONS, check_outcomes, graph_mode, make,
                      reference, run, to_numpy)

F32 = ms.float32
# The Cell in PyNative adds nothing over the functional in PyNative beyond the documented-value checks,
# and every mode costs compile time, so the sweeps run these three.
SWEEP_MODES = ("pynative", "jit", "graph")


def alternate(cases):
    """Each (id, args) case eagerly and in one compiled mode, jit and GRAPH_MODE taking turns: a compile costs
    0.3-3 s and the suite runs once per backend, so every kind of case reaches both compiled modes across
    neighbouring cases rather than each case reaching both."""
    params = []
    for i, (case_id, args) in enumerate(cases):
        for mode in ("pynative", COMPILED_MODES[i % 2]):
            params.append(pytest.param(mode, *args, id=f"{case_id}-{mode}"))
    return params


def _snake(dtypes, ids):
    """(dtype, log_target) pairs ordered so that ``alternate`` sends each dtype and each space to both modes."""
    cases = []
    for k, (dtype, did) in enumerate(zip(dtypes, ids)):
        spaces = (False, True) if k % 2 == 0 else (True, False)
        cases += [(f"{did}-{'logt' if lt else 'prob'}", (dtype, lt)) for lt in spaces]
    return cases

# ----------------------------------------------------------------------------------- documented values
ONEFLOW_X = [-0.9021705, 0.08798598, 1.04686249]
ONEFLOW_T = [1.22386942, -0.89729659, 0.01615712]
# (input, target, reduction, log_target, documented value, absolute precision the value is documented to)
DOCUMENTED = [
    pytest.param([[0.5, 0.5], [0.4, 0.6]], [[0., 1.], [1., 0.]], "mean", False, -0.225, 1e-7, id="mint-mean"),
    pytest.param([0.2, 0.7, 0.1], [0., 1., 0.], "mean", False, -0.23333333, 1e-7, id="ops-mean"),
    pytest.param(ONEFLOW_X, ONEFLOW_T, "none", False, [1.3514, 0.0000, -0.0836], 5e-5, id="oneflow-none"),
    pytest.param(ONEFLOW_X, ONEFLOW_T, "mean", False, 0.4226, 5e-5, id="oneflow-mean"),
    pytest.param(ONEFLOW_X, ONEFLOW_T, "sum", True, 5.7801, 5e-5, id="oneflow-sum-logtarget"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("x, t, reduction, log_target, documented, prec", DOCUMENTED)
def test_documented_values(backend, mode, x, t, reduction, log_target, documented, prec):
    xt, xv = make(x, F32)
    tt, tv = make(t, F32)
    out = run(mode, backend, xt, tt, log_target, reductions=(reduction,), grads=False)[reduction].out
    assert out.dtype == F32
    assert tuple(out.shape) == np.shape(documented)
    got = to_numpy(out)
    np.testing.assert_allclose(got, documented, rtol=0, atol=prec)
    np.testing.assert_allclose(got, reference(xv, tv, reduction, log_target).out, rtol=2e-6, atol=1e-7)


# --------------------------------------------------------------------------------- reference sweeps
def inputs(rng, x_shape, t_shape, log_target, zero_mass=True):
    """Log-probability-like input and a target with, optionally, some zero-mass entries (t = 0, t < 0,
    or t = -inf in log space) among regular ones, some of them facing x = -inf (a masked log_softmax)."""
    x = rng.normal(-1.0, 1.0, x_shape)
    if log_target:
        t = rng.normal(-1.5, 1.0, t_shape)
        if zero_mass:
            t = np.where(rng.random(t_shape) < 0.15, -np.inf, t)
    else:
        t = rng.uniform(0.01, 1.0, t_shape)
        if zero_mass:
            u = rng.random(t_shape)
            t = np.where(u < 0.1, 0.0, np.where(u < 0.15, -t, t))
    if zero_mass and tuple(x_shape) == tuple(t_shape):
        no_mass = (t == -np.inf) if log_target else (t <= 0)
        x = np.where(no_mass & (rng.random(t_shape) < 0.5), -np.inf, x)
    return np.asarray(x), np.asarray(t)


def sweep_case(mode, backend, x_shape, t_shape, dtype, log_target, seed=0, grads=True, zero_mass=True):
    rng = np.random.default_rng(seed)
    x, t = inputs(rng, x_shape, t_shape, log_target, zero_mass)
    bshape = np.broadcast_shapes(x_shape, t_shape)
    xt, xv = make(x, dtype)
    tt, tv = make(t, dtype)
    wn, wnv = make(rng.uniform(0.5, 1.5, bshape), dtype)
    wr, wrv = make(1.25, dtype)
    results = run(mode, backend, xt, tt, log_target, grads=grads, w_none=wn, w_red=wr)
    check_outcomes(results, xv, tv, log_target, wnv, wrv, dtype, grads=grads,
                   what=f"[{mode} {backend} {x_shape}x{t_shape}]")


@pytest.mark.parametrize("mode, dtype, log_target", alternate(_snake(DTYPES, DTYPE_IDS)))
def test_reference_dtypes(backend, mode, dtype, log_target):
    """Broadcast in both directions; same-shaped operands of every dtype are covered by test_zero_mass."""
    sweep_case(mode, backend, (4, 1, 3), (5, 3), dtype, log_target)


SHAPES = [
    ((), ()),
    ((2, 3), ()),          # 0-d target
    ((), (2, 3)),          # 0-d input: 'batchmean' divides by 1
    ((1, 5), (3, 1)),      # both operands broadcast
    ((5,), (2, 3, 5)),     # input broadcast over leading dims: 'batchmean' uses input's shape[0] = 5
    ((2, 3, 4, 5), (3, 1, 5)),
    ((1,), (6,)),
    ((33, 17), (33, 17)),  # odd sizes (vector tails)
]
# Each shape pair once, log_target alternating (both spaces are swept per dtype above).
SHAPE_CASES = [(f"{a}x{b}-{'logt' if (i // 2) % 2 else 'prob'}", (a, b, (i // 2) % 2 == 1))
               for i, (a, b) in enumerate(SHAPES)]


@pytest.mark.parametrize("mode, x_shape, t_shape, log_target", alternate(SHAPE_CASES))
def test_reference_shapes(backend, mode, x_shape, t_shape, log_target):
    sweep_case(mode, backend, x_shape, t_shape, ms.float64, log_target, seed=len(x_shape) * 10 + len(t_shape))


@pytest.mark.parametrize("mode, x_shape, t_shape, log_target", alternate([
    ("70000-prob", ((70_000,), (70_000,), False)), ("3x70001-bcast-logt", ((3, 70_001), (70_001,), True))]))
def test_reference_larger_than_a_block(backend, mode, x_shape, t_shape, log_target):
    sweep_case(mode, backend, x_shape, t_shape, F32, log_target, seed=7)


@pytest.mark.parametrize("mode", SWEEP_MODES)
@pytest.mark.parametrize("x_shape, t_shape, dtype", [((0, 3), (0, 3), ms.float32), ((0, 3), (3,), ms.float16),
                                                     ((2, 0), (2, 0), ms.float64)],
                         ids=["0x3-f32", "0x3-bcast-f16", "2x0-f64"])
def test_empty(backend, mode, dtype, x_shape, t_shape):
    """'sum' of nothing is 0; 'mean' is NaN; 'batchmean' is NaN only when input.shape[0] == 0."""
    sweep_case(mode, backend, x_shape, t_shape, dtype, False)


@pytest.mark.parametrize("mode", ("pynative", "jit"))
def test_float32_sum_accuracy(backend, mode):
    """SPEC: float32 sums accumulate accurately (float64 or blocked): 1e-6 relative to the float64 result."""
    n = 1 << 20
    rng = np.random.default_rng(3)
    t = rng.uniform(0.0, 1.0, n)
    x = np.log(rng.uniform(0.0, 1.0, n)) - 2.0  # terms of one sign, so the relative error is meaningful
    xt, xv = make(x, F32)
    tt, tv = make(t, F32)
    results = run(mode, backend, xt, tt, False, reductions=("sum", "mean"), grads=False)
    for reduction, res in results.items():
        exp = float(reference(xv, tv, reduction, False).out)
        got = float(to_numpy(res.out))
        assert abs(got - exp) <= 1e-6 * abs(exp), f"{reduction}: {got!r} vs float64 {exp!r}"


# -------------------------------------------------------------------------------- zero mass and NaN
# log_target=False: every kind of "no mass" (t = 0, t < 0, t = -inf) against every kind of input, including
# x = -inf (masked log_softmax) and x = +inf, next to a few regular terms.
ZM_PROB_X = [0.5, -np.inf, np.inf, -2.0, -np.inf, 1e4, -0.7, -1.2, -np.inf]
ZM_PROB_T = [0.0, 0.0, 0.0, -0.5, -np.inf, -3.0, 0.25, 1.0, -0.0]
ZM_LOG_X = [0.5, -np.inf, np.inf, -2.0, 1e4, -0.7, -1.2]
ZM_LOG_T = [-np.inf, -np.inf, -np.inf, -np.inf, -np.inf, -1.5, 0.0]


@pytest.mark.parametrize("mode, dtype, log_target", alternate(_snake(DTYPES, DTYPE_IDS)))
def test_zero_mass(backend, mode, dtype, log_target):
    x, t = (ZM_LOG_X, ZM_LOG_T) if log_target else (ZM_PROB_X, ZM_PROB_T)
    xt, xv = make(x, dtype)
    tt, tv = make(t, dtype)
    results = run(mode, backend, xt, tt, log_target)
    check_outcomes(results, xv, tv, log_target, None, None, dtype, what=f"[{mode} {backend} zero mass]")
    mass = ~(tv == -np.inf) if log_target else tv > 0
    for reduction, res in results.items():
        # The reference agrees, but say it plainly: no NaN/inf anywhere, zero-mass terms exactly 0.
        assert np.all(np.isfinite(to_numpy(res.out))), reduction
        assert np.all(np.isfinite(to_numpy(res.dx))) and np.all(np.isfinite(to_numpy(res.dt))), reduction
        assert np.all(to_numpy(res.dx)[~mass] == 0) and np.all(to_numpy(res.dt)[~mass] == 0), reduction
    assert np.all(to_numpy(results["none"].out)[~mass] == 0)


@pytest.mark.parametrize("mode", SWEEP_MODES)
@pytest.mark.parametrize("dtype, log_target", [(ms.float32, False), (ms.bfloat16, True)], ids=["f32-prob", "bf16-logt"])
def test_nan_propagation(backend, mode, dtype, log_target):
    """NaN target -> NaN; NaN input where the target has mass -> NaN; NaN input without mass -> 0."""
    no_mass = -np.inf if log_target else 0.0
    some_mass = -0.5 if log_target else 0.5
    x = [np.nan, np.nan, 0.3, -0.2]
    t = [some_mass, no_mass, np.nan, some_mass]
    xt, xv = make(x, dtype)
    tt, tv = make(t, dtype)
    results = run(mode, backend, xt, tt, log_target)
    check_outcomes(results, xv, tv, log_target, None, None, dtype, what=f"[{mode} {backend} NaN]")
    none = to_numpy(results["none"].out)
    assert np.isnan(none[0]) and none[1] == 0 and np.isnan(none[2]) and np.isfinite(none[3])
    for reduction in ("mean", "batchmean", "sum"):
        assert np.isnan(to_numpy(results[reduction].out))


# ------------------------------------------------------------------------------------- mixed dtypes
MIXED = [(ms.float16, ms.bfloat16, ms.float32), (ms.float32, ms.float64, ms.float64),
         (ms.bfloat16, ms.float32, ms.float32)]


@pytest.mark.parametrize("mode, x_dtype, t_dtype, promoted", alternate([(f"{a}+{b}", (a, b, c)) for a, b, c in MIXED]))
def test_mixed_dtypes_promote(backend, mode, x_dtype, t_dtype, promoted):
    """PyTorch promotion (f16+bf16 -> f32); each gradient comes back in its own operand's dtype."""
    rng = np.random.default_rng(11)
    x, t = inputs(rng, (2, 3), (3,), False)
    xt, xv = make(x, x_dtype)
    tt, tv = make(t, t_dtype)
    wn, wnv = make(rng.uniform(0.5, 1.5, (2, 3)), promoted)
    wr, wrv = make(0.75, promoted)
    results = run(mode, backend, xt, tt, False, w_none=wn, w_red=wr)
    check_outcomes(results, xv, tv, False, wnv, wrv, promoted, x_dtype=x_dtype, t_dtype=t_dtype,
                   what=f"[{mode} {backend} mixed]")


# ------------------------------------------------------------------------------- randomized shapes
# Graph compiles cost ~0.3-1 s each, so the randomized part runs eagerly and under ms.jit only; the fixed
# cases above cover GRAPH_MODE Cells.
@pytest.mark.parametrize("mode", ("pynative", "jit"))
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=1, max_side=5),
       dtype=st.sampled_from((ms.float32, ms.float64)),
       log_target=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_randomized_broadcasts(backend, mode, shapes, dtype, log_target, seed):
    x_shape, t_shape = shapes.input_shapes
    sweep_case(mode, backend, x_shape, t_shape, dtype, log_target, seed=seed)


@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_compiled_cache_reused(backend, mode):
    """The same shapes run twice through one compiled graph give identical results (no stale state)."""
    rng = np.random.default_rng(5)
    x, t = inputs(rng, (4, 6), (4, 6), False)
    xt, _ = make(x, F32)
    tt, _ = make(t, F32)
    first = run(mode, backend, xt, tt, grads=False)
    x2, t2 = inputs(rng, (4, 6), (4, 6), False)
    xt2, xv2 = make(x2, F32)
    tt2, tv2 = make(t2, F32)
    second = run(mode, backend, xt2, tt2, grads=False)
    check_outcomes(second, xv2, tv2, False, None, None, F32, grads=False)
    assert not np.array_equal(to_numpy(first["none"].out), to_numpy(second["none"].out))
    for r in REDUCTIONS:
        assert tuple(second[r].out.shape) == (() if r != "none" else (4, 6))



class _ValueAndGrads(ms.nn.Cell):
    """(loss, d input, d target) of a loss Cell, the gradients of its sum."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss
        self.grad = ms.ops.GradOperation(get_all=True)

    def summed(self, x, t):
        return self.loss(x, t).sum()

    def construct(self, x, t):
        return (self.loss(x, t),) + self.grad(self.summed)(x, t)


@pytest.mark.parametrize("log_target", [False, True])
def test_graph_cell_with_unknown_rank(backend, log_target):
    """A GRAPH_MODE KLDivLoss whose set_inputs leave the rank unknown (``Tensor(shape=None)``; its shape reaches the
    checks as None, which crashed them, and composite / akg's broadcasting): values and both gradients of every
    reduction against the float64 reference, for three shapes and a broadcast target through one compiled Cell."""
    rng = np.random.default_rng(21)
    cells = {}
    for reduction in REDUCTIONS:
        cells[reduction] = _ValueAndGrads(ms_kldiv.KLDivLoss(reduction, log_target=log_target, backend=backend))
        cells[reduction].set_inputs(ms.Tensor(shape=None, dtype=F32), ms.Tensor(shape=None, dtype=F32))
    for x_shape, t_shape in (((3, 5), (3, 5)), ((2, 3, 4), (3, 4)), ((6,), (6,))):
        x = rng.standard_normal(x_shape).astype(np.float32) - 1.0
        t = rng.uniform(0.05, 1.0, t_shape).astype(np.float32)
        if log_target:
            t = np.log(t)
        for reduction in REDUCTIONS:
            with graph_mode():
                value, dx, dt = (o.asnumpy() for o in cells[reduction](ms.Tensor(x), ms.Tensor(t)))
            want = ms_reference.kl_div(x, t, reduction, log_target)
            want_dx, want_dt = ms_reference.kl_div_grads(x, t, reduction, log_target)
            for got, exp, what in ((value, want, "value"), (dx, want_dx, "dx"), (dt, want_dt, "dt")):
                np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6, err_msg=f"{reduction} {what} {x_shape}")


@pytest.mark.parametrize("dtype", [ms.float32, ms.float64])
def test_graph_cell_with_dynamic_rows_and_a_lower_rank_target(backend, dtype):
    """A GRAPH_MODE KLDivLoss with set_inputs([None, V], [V]) and its gradients: MindSpore's compiler crashed the
    process (SIGSEGV) on composite and akg's broadcast between ranks under dynamic dims. Values and both gradients of
    every reduction against float64, for two row counts through one compiled Cell."""
    rng = np.random.default_rng(24)
    np_dtype = np.float32 if dtype == ms.float32 else np.float64
    for reduction in REDUCTIONS:
        cell = _ValueAndGrads(ms_kldiv.KLDivLoss(reduction, log_target=True, backend=backend))
        cell.set_inputs(ms.Tensor(shape=[None, 5], dtype=dtype), ms.Tensor(shape=[5], dtype=dtype))
        for rows in (3, 1):
            x = rng.standard_normal((rows, 5)).astype(np_dtype) - 1.0
            t = np.log(rng.uniform(0.05, 1.0, 5)).astype(np_dtype)
            with graph_mode():
                value, dx, dt = (o.asnumpy() for o in cell(ms.Tensor(x), ms.Tensor(t)))
            want = ms_reference.kl_div(x, t, reduction, True)
            want_dx, want_dt = ms_reference.kl_div_grads(x, t, reduction, True)
            for got, exp, what in ((value, want, "value"), (dx, want_dx, "dx"), (dt, want_dt, "dt")):
                np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6, err_msg=f"{reduction} {what} {rows}")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_compiled_broadcast_above_eight_dims(backend, reduction):
    """A target broadcast to 9 dims under ms.jit (compiled BroadcastTo takes at most 8: composite and akg failed
    there, PyNative and aot did not): value and both gradients against the float64 reference."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2, 1, 2, 1, 2, 1, 2, 3, 2)).astype(np.float32) - 1.0
    t = rng.uniform(0.1, 1.0, (2, 2, 1, 2, 1, 2, 3, 1)).astype(np.float32)

    def summed(a, b):
        return ms_kldiv.kl_div(a, b, reduction, backend=backend).sum()
    value = ms.jit(summed)(ms.Tensor(x), ms.Tensor(t))
    dx, dt = ms.jit(ms.grad(summed, grad_position=(0, 1)))(ms.Tensor(x), ms.Tensor(t))
    np.testing.assert_allclose(float(value), ms_reference.kl_div(x, t, reduction).sum(), rtol=1e-5)
    want_dx, want_dt = ms_reference.kl_div_grads(x, t, reduction)
    np.testing.assert_allclose(dx.asnumpy(), want_dx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dt.asnumpy(), want_dt, rtol=1e-5, atol=1e-5)
