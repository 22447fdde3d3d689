"""distillation_loss at the edges (issue 36), one rule per test, on every available backend, in PyNative and in
compiled code (GRAPH_MODE Cells and ms.jit), values and both gradients against the float64 reference
(``ms_kldiv.reference.distillation_loss`` / ``distillation_grads``). The rules are docs/SPEC.md's distillation
edge-case table; tests/test_distill_fuzz.py fuzzes them."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

import ms_kldiv
from ms_kldiv import distillation, reference
from ms_kldiv.distillation import DistillationLoss

from conftest import DISTILL_BACKENDS, central_differences, graph_mode, to_numpy
from _distill_cells import REDUCTIONS, all_reductions_cell, run_all

NEG = -np.inf
RUN_MODES = ("pynative", "graph", "jit")


def run(mode, backend, s, t, labels=None, temperature=2.0, beta=0.0, w_none=None, w_red=1.0, kind=None):
    """{reduction: (value, d_student, d_teacher)} as float64 arrays, every reduction from one (cached) Cell."""
    res = run_all(mode, backend, s, t, labels, temperature, beta, w_none, w_red, kind=kind)
    return {r: tuple(to_numpy(o) for o in out) for r, out in res.items()}


def expected(s, t, labels=None, temperature=2.0, beta=0.0, w_none=None, w_red=1.0):
    """{reduction: (value, d_student, d_teacher)} of the float64 reference on the float32 values."""
    s32, t32 = np.asarray(s, np.float32), np.asarray(t, np.float32)
    out = {}
    for r in REDUCTIONS:
        w = (np.ones(s32.shape) if w_none is None else w_none) if r == "none" else w_red
        value = reference.distillation_loss(s32, t32, temperature, r, beta, labels)
        out[r] = (value,) + reference.distillation_grads(s32, t32, temperature, r, beta, labels, dout=w)
    return out


def check(got, exp, rtol=2e-5, atol=2e-6):
    for r in REDUCTIONS:
        for g, e, what in zip(got[r], exp[r], ("value", "d_student", "d_teacher")):
            assert g.shape == np.shape(e), (r, what, g.shape, np.shape(e))
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{r} {what}")


def _logits(rng, shape, scale=2.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- 1, 2: shapes
@pytest.mark.parametrize("mode", RUN_MODES)
@pytest.mark.parametrize("kind,name", [("functional", "distillation_loss"), ("cell", "DistillationLoss")])
@pytest.mark.parametrize("s_shape,t_shape,match", [
    ((3, 1), (3, 5), "same number of classes"), ((3, 5), (3, 1), "same number of classes"),
    ((5,), (3, 1), "same number of classes"), ((2, 0), (2, 0), "at least one class"),
    ((1, 5), (4, 5), "must broadcast to 'student_logits'"), ((5,), (4, 5), "must broadcast to 'student_logits'"),
    ((2, 1, 5), (2, 3, 5), "must broadcast to 'student_logits'"), ((2, 5), (3, 5), "cannot be broadcast"),
])
def test_shapes_refused(mode, kind, name, s_shape, t_shape, match):
    """Defects 1 and 2: a vocabulary axis that differs (broadcast over the classes gave a negative KL) and a student
    broadcast to the teacher's rows ('batchmean' had no consistent count) are ValueErrors naming both arguments,
    at the call in PyNative and at compile time in graph code."""
    with pytest.raises(ValueError, match=rf"^For '{name}', .*{match}") as excinfo:
        run(mode, "composite", np.zeros(s_shape), np.zeros(t_shape), kind=kind, w_none=np.ones(s_shape))
    assert "student_logits" in str(excinfo.value) and "teacher_logits" in str(excinfo.value)


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", RUN_MODES)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_teacher_broadcast_every_beta(backend, mode, beta):
    """Defect 2: one teacher distribution for several student rows is defined for every beta and reduction: the
    counts are the student's ('batchmean' divided reverse KL by the teacher's one row before), the teacher's
    gradient is summed back to its shape."""
    rng = np.random.default_rng(1)
    s = _logits(rng, (4, 5))
    w_none = np.linspace(0.5, 1.5, 20).reshape(4, 5)
    for t_shape in ((1, 5), (5,)):
        t = _logits(rng, t_shape)
        check(run(mode, backend, s, t, beta=beta, w_none=w_none), expected(s, t, beta=beta, w_none=w_none))


# ----------------------------------------------------------------------------- 3: empty batches
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", RUN_MODES)
def test_empty_batch_is_zero(backend, mode):
    """Defect 3: no rows gives 0 for every reduction, with labels or without, and empty gradients (0 rows with labels
    returned 4, 8 or the previous call's loss; 'batchmean' without labels NaN). test_empty_batch_dynamic_shape runs
    empty batches after non-empty ones in one graph."""
    rng = np.random.default_rng(2)
    for shape, with_labels, beta in (((0, 5), False, 0.0), ((0, 5), True, 0.5), ((0, 3, 5), True, 1.0),
                                     ((2, 0, 5), False, 0.5)):
        labels = np.zeros(shape[:-1], np.int32) if with_labels else None
        if mode == "pynative":  # a non-empty call first: a stale ReduceSum result would show in the empty one
            s, t = _logits(rng, (3, 5)), _logits(rng, (3, 5))
            run(mode, backend, s, t, np.ones(3, np.int32) if with_labels else None, beta=beta)
        got = run(mode, backend, np.zeros(shape), np.zeros(shape), labels, beta=beta)
        for reduction, (value, ds, dt) in got.items():
            assert value.shape == (shape if reduction == "none" else ()), (shape, reduction)
            assert reduction == "none" or value == 0, (shape, with_labels, reduction, value)
            assert ds.shape == shape and dt.shape == shape
        check(got, expected(np.zeros(shape), np.zeros(shape), labels, beta=beta))
    # a broadcast teacher's gradient is summed over the student's rows: none here, so exactly 0 (MindSpore's sum
    # back over an empty axis returned uninitialized memory)
    got = run(mode, backend, np.zeros((0, 5)), np.array([0.3, -0.4, 1.0, 0.0, 2.0]), beta=0.5)
    for reduction, (value, ds, dt) in got.items():
        assert dt.shape == (5,) and np.all(dt == 0), (reduction, dt)


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("with_labels", [False, True])
def test_empty_batch_dynamic_shape(backend, with_labels):
    """Defect 3 where the row count is unknown at compile time: one graph (set_inputs with None rows, the classes
    known, so 'auto'/'aot' run the fused kernels) for 3, 0, 2 and 0 rows; the empty calls give 0 (the guard
    selects at run time), the others the reference."""
    rng = np.random.default_rng(3)
    for beta in (0.0, 0.5):
        f32 = ms.float32
        specs = [ms.Tensor(shape=[None, 6], dtype=f32)] * 2
        specs += [ms.Tensor(shape=[None], dtype=ms.int32)] if with_labels else []
        specs += [ms.Tensor(shape=[None, 6], dtype=f32), ms.Tensor(shape=[], dtype=f32)]
        all_reductions_cell("graph", backend, 2.0, beta, with_labels, specs=specs, key="dynamic")
        for rows in (3, 0, 2, 0):
            s, t = _logits(rng, (rows, 6)), _logits(rng, (rows, 6))
            labels = np.where(np.arange(rows) % 2, 1, -100).astype(np.int32) if with_labels else None
            res = run_all("graph", backend, s, t, labels, 2.0, beta, key="dynamic")
            got = {r: tuple(to_numpy(o) for o in out) for r, out in res.items()}
            check(got, expected(s, t, labels, beta=beta))
            if rows == 0:
                assert all(got[r][0] == 0 for r in REDUCTIONS if r != "none")


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", ("pynative", "jit"))
def test_empty_batch_with_weights_or_count_is_zero(backend, mode):
    """The empty-batch rule with per-row ``weights`` and with ``num_items_in_batch`` (the weighted means returned
    MindSpore's uninitialized empty sums, 1.0, inf or 1e9, before they reached the row-count guard): 0 for every
    reduction, after non-empty calls that would leave a stale sum behind; and a Tensor count of 0 (no token
    counted in the whole batch) gives 0 in both modes, not inf; so does a Python 0, on any batch."""
    rng = np.random.default_rng(5)
    empty = ms.Tensor(np.zeros((0, 5), np.float32))

    def loss(s, t, reduction, **kw):
        return ms_kldiv.distillation_loss(s, t, 2.0, reduction, beta=0.5, backend=backend, **kw)

    fn = ms.jit(loss, static_argnames=("reduction",)) if mode == "jit" else loss
    for _ in range(3):
        s, t = ms.Tensor(_logits(rng, (4, 5))), ms.Tensor(_logits(rng, (4, 5)))
        weights = ms.Tensor(rng.uniform(0.5, 2.0, 4).astype(np.float32))
        for reduction in ("batchmean", "tokenmean", "mean", "sum"):
            assert float(fn(s, t, reduction, weights=weights)) > 0
            assert float(fn(empty, empty, reduction, weights=ms.Tensor(np.zeros(0, np.float32)))) == 0, reduction
        for reduction in ("batchmean", "tokenmean"):
            assert float(fn(s, t, reduction, num_items_in_batch=ms.Tensor(3.0))) > 0
            assert float(fn(empty, empty, reduction, num_items_in_batch=ms.Tensor(3.0))) == 0, reduction
            assert float(fn(empty, empty, reduction, num_items_in_batch=ms.Tensor(0.0))) == 0, reduction
            assert float(fn(s, t, reduction, num_items_in_batch=ms.Tensor(0.0))) == 0, reduction
            assert float(fn(s, t, reduction, num_items_in_batch=0)) == 0, reduction
    if mode == "pynative":
        for bad in (-1.0, float("nan"), float("inf")):
            for count in (ms.Tensor(bad), bad):
                with pytest.raises(ValueError, match="'num_items_in_batch' must be finite and >= 0"):
                    loss(s, t, "batchmean", num_items_in_batch=count)


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", ("pynative", "jit"))
def test_num_items_in_every_dtype(backend, mode):
    """num_items_in_batch with bfloat16 / float16 logits (MindSpore's CPU comparison has no bfloat16 kernel, so the
    count's guard runs in float32) and float64 (divided in float64, not rounded through float32): the 'sum' loss
    over the count, in the logits' dtype; a count of 0 gives 0."""
    rng = np.random.default_rng(9)
    s64, t64 = rng.standard_normal((6, 7)) * 2, rng.standard_normal((6, 7)) * 2
    for dtype, rtol in ((ms.bfloat16, 1e-2), (ms.float16, 1e-2), (ms.float64, 1e-12)):
        s, t = ms.Tensor(s64).astype(dtype), ms.Tensor(t64).astype(dtype)

        def loss(a, b, n):
            return ms_kldiv.distillation_loss(a, b, 2.0, "batchmean", backend=backend, num_items_in_batch=n)
        fn = ms.jit(loss) if mode == "jit" else loss
        got = fn(s, t, ms.Tensor(4.0))
        assert got.dtype == dtype
        exact = reference.distillation_loss(s.astype(ms.float64).asnumpy(), t.astype(ms.float64).asnumpy(), 2.0,
                                            "sum") / 4.0
        np.testing.assert_allclose(float(got.astype(ms.float64).asnumpy()), exact, rtol=rtol, err_msg=str(dtype))
        assert float(fn(s, t, ms.Tensor(0.0)).astype(ms.float64).asnumpy()) == 0


# ----------------------------------------------------------------------------- 4: ignored rows
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", RUN_MODES)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_ignored_rows_influence_nothing(backend, mode, beta):
    """Defect 4: NaN / inf in an ignored row (label == ignore_index) reach neither the value nor any gradient (the
    composite backend's gradients were NaN: NaN x 0); the ignored rows' gradients are exact zeros."""
    rng = np.random.default_rng(4)
    s, t = _logits(rng, (2, 3, 5)), _logits(rng, (2, 3, 5))
    labels = np.array([[1, -100, 2], [-100, 0, 0]], np.int32)
    s[0, 1] = [np.nan, 1.0, NEG, np.inf, 0.0]
    t[0, 1] = NEG
    t[1, 0, 2] = np.nan
    w_none = np.linspace(0.5, 1.5, 30).reshape(2, 3, 5)
    got = run(mode, backend, s, t, labels, beta=beta, w_none=w_none)
    check(got, expected(s, t, labels, beta=beta, w_none=w_none))
    for value, ds, dt in got.values():
        assert np.all(ds[0, 1] == 0) and np.all(dt[0, 1] == 0) and np.all(dt[1, 0] == 0)
        assert all(np.all(np.isfinite(g)) for g in (value, ds, dt))


# ----------------------------------------------------------------------------- 5: rows without a distribution
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", RUN_MODES)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_row_without_distribution_is_nan(backend, mode, beta):
    """Defect 5: a counted row whose logits are all -inf (or hold a NaN / +inf) in both models has no distribution:
    the loss is NaN on every backend (the fused JSD gave a finite value); the other rows' gradients are unchanged."""
    rng = np.random.default_rng(5)
    s, t = _logits(rng, (3, 5)), _logits(rng, (3, 5))
    for bad_s, bad_t in (([NEG] * 5, [NEG] * 5), ([0.0, np.nan, 1.0, 2.0, 0.5], [NEG] * 5),
                         ([NEG, np.inf, NEG, NEG, NEG], [1.0, np.nan, 0.0, 0.0, 0.0])):
        a, b = s.copy(), t.copy()
        a[1], b[1] = bad_s, bad_t
        got, exp = run(mode, backend, a, b, beta=beta), expected(a, b, beta=beta)
        for r in REDUCTIONS:
            value, ds, dt = got[r]
            assert np.isnan(value).any() and np.array_equal(np.isnan(value), np.isnan(exp[r][0])), r
            for g, e in ((ds, exp[r][1]), (dt, exp[r][2])):
                np.testing.assert_allclose(g[[0, 2]], e[[0, 2]], rtol=2e-5, atol=2e-6)


# ----------------------------------------------------------------------------- 7: backend
@pytest.mark.parametrize("bad,error", [("quantum", ValueError), ("", ValueError), ("AOT", ValueError),
                                       (["auto"], TypeError), (None, TypeError), (3, TypeError)])
def test_backend_checked_before_anything_runs(monkeypatch, bad, error):
    """Defect 7: an unknown backend raised only after log_softmax had run, worded for 'kl_div'; a list raised
    "unhashable type". Now checked first, naming the API, in PyNative and when a graph compiles."""
    def fail(*args, **kwargs):
        raise AssertionError("the loss ran before the backend was checked")
    s, t = ms.Tensor(np.zeros((2, 3), np.float32)), ms.Tensor(np.zeros((2, 3), np.float32))
    monkeypatch.setattr(distillation, "_distill", fail)
    with pytest.raises(error, match=r"^For 'distillation_loss', 'backend' must be"):
        ms_kldiv.distillation_loss(s, t, backend=bad)
    with pytest.raises(error, match=r"^For 'DistillationLoss', 'backend' must be"):
        DistillationLoss(backend=bad)
    monkeypatch.undo()

    class Fn(nn.Cell):
        def construct(self, a, b):
            return ms_kldiv.distillation_loss(a, b, backend=bad)
    with graph_mode(), pytest.raises(error, match=r"For 'distillation_loss', 'backend' must be"):
        Fn()(s, t)


# ----------------------------------------------------------------------------- 8: per-token normalization
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", RUN_MODES)
def test_tokenmean_and_batchmean(backend, mode):
    """Defect 8: on [B, S, V] 'batchmean' divides by B without labels but by the counted tokens with labels (kept
    for compatibility, documented); 'tokenmean' divides by the counted tokens either way (all B x S without
    labels)."""
    rng = np.random.default_rng(8)
    s, t = _logits(rng, (2, 3, 5)), _logits(rng, (2, 3, 5))
    labels = np.array([[0, -100, 1], [2, 2, -100]], np.int32)
    for labs, divisors in ((None, {"batchmean": 2, "tokenmean": 6}), (labels, {"batchmean": 4, "tokenmean": 4})):
        got = run(mode, backend, s, t, labs)
        check(got, expected(s, t, labs))
        for reduction, divisor in divisors.items():
            np.testing.assert_allclose(got[reduction][0], got["sum"][0] / divisor, rtol=1e-6)
    with pytest.raises(ValueError, match="'tokenmean'"):
        ms_kldiv.distillation_loss(ms.Tensor(s), ms.Tensor(t), reduction="tokens")
    with pytest.raises(ValueError, match="'batchmean'"):
        ms_kldiv.kl_div(ms.Tensor(s), ms.Tensor(t), reduction="tokenmean")  # kl_div has no rows to count


# ----------------------------------------------------------------------------- 9: float32 accuracy
@pytest.mark.slow
@pytest.mark.parametrize("mode", RUN_MODES)
@pytest.mark.parametrize("backend", [b for b in DISTILL_BACKENDS if b == "composite"])
def test_composite_float32_accuracy(mode, backend):
    """Defect 9: the composition computes float32 logits in float64 on CPU/GPU (MindSpore's float32 exp / log are
    several ulp off): within float32 rounding of the float64 reference (it was 1e-6..1.3e-5 relative off), and
    TRL's identical-input check |loss| < 5e-7 holds with a wide margin (it was 5.3e-7)."""
    rng = np.random.default_rng(9)
    for beta in (0.0, 0.1, 0.5, 0.9, 1.0):
        s, t = _logits(rng, (8, 300), 3.0), _logits(rng, (8, 300), 3.0)
        check(run(mode, backend, s, t, temperature=2.0, beta=beta), expected(s, t, temperature=2.0, beta=beta),
              rtol=2e-7, atol=1e-9)
        same = _logits(rng, (8, 300))
        got = run(mode, backend, same, same, temperature=2.0, beta=beta)
        assert all(abs(got[r][0]).max() < 1e-12 for r in REDUCTIONS)


# ----------------------------------------------------------------------------- NumPy scalars as options
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode,kind", [("pynative", "functional"), ("pynative", "cell"), ("graph", "cell"),
                                       ("jit", "functional")])
def test_numpy_scalar_options(backend, mode, kind):
    """A temperature or beta from a NumPy schedule (``np.float32``) is the number it holds, as Python's float:
    values and both gradients against the reference (it raised a TypeError before)."""
    rng = np.random.default_rng(12)
    s, t = _logits(rng, (4, 6)), _logits(rng, (4, 6))
    got = {r: tuple(to_numpy(o) for o in out) for r, out in
           run_all(mode, backend, s, t, None, np.float32(2.0), np.float64(0.5), kind=kind, key="numpy").items()}
    check(got, expected(s, t, None, 2.0, 0.5))


@pytest.mark.parametrize("mode", ("pynative", "jit"))
def test_numpy_scalar_options_of_every_loss(mode):
    """Every loss's numeric options as NumPy scalars (ints for ignore_index, chunk_size, num_items_in_batch) give
    what the same Python numbers give; NumPy bools stay refused."""
    rng = np.random.default_rng(13)
    s, t = ms.Tensor(_logits(rng, (6, 9))), ms.Tensor(_logits(rng, (6, 9)))
    labels = ms.Tensor(np.array([1, -7, 3, 0, -7, 8], np.int32))
    ids = ms.Tensor(np.argsort(-t.asnumpy(), -1)[:, :4].astype(np.int32))
    values = ms.Tensor(np.sort(t.asnumpy() - np.log(np.exp(t.asnumpy()).sum(-1, keepdims=True)), -1)[:, ::-1][:, :4]
                       .copy())
    h = ms.Tensor(_logits(rng, (6, 5)))
    ws, wt = ms.Tensor(_logits(rng, (9, 5), 0.5)), ms.Tensor(_logits(rng, (9, 5), 0.5))

    def losses(f, i):
        """Each loss with numbers made by ``f`` (float options) and ``i`` (int options)."""
        dense = ms_kldiv.distillation_loss(s, t, f(1.5), "batchmean", labels=labels, ignore_index=i(-7),
                                           divergence="skew_kl", alpha=f(0.2), softcap=f(7.0), logit_scale=f(0.9),
                                           num_items_in_batch=i(5))
        sparse = ms_kldiv.sparse_distillation_loss(s, ids, values, temperature=f(1.5), teacher_temperature=f(1.0),
                                                   beta=f(0.25), labels=labels, ignore_index=i(-7))
        return dense, sparse

    fn = ms.jit(losses, static_argnames=("f", "i")) if mode == "jit" else losses
    want = [float(x) for x in fn(float, int)]
    got = [float(x) for x in fn(np.float32, np.int64)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert all(w > 0 for w in want)
    head = ms_kldiv.FusedLinearDistillationLoss(np.float32(1.5), beta=np.float64(0.5), ignore_index=np.int32(-7),
                                                hard_weight=np.float32(0.3), soft_weight=np.float64(0.7),
                                                chunk_size=np.int64(4), z_loss=np.float32(1e-3))
    plain = ms_kldiv.FusedLinearDistillationLoss(1.5, beta=0.5, ignore_index=-7, hard_weight=0.3, soft_weight=0.7,
                                                 chunk_size=4, z_loss=1e-3)
    assert head.chunk_size == 4 and type(head.chunk_size) is int and type(head.temperature) is float
    head_fn = ms.jit(head) if mode == "jit" else head
    np.testing.assert_allclose(float(head_fn(h, ws, h, wt, labels)), float(plain(h, ws, h, wt, labels)),
                               rtol=1e-6)
    for bad in ({"temperature": np.bool_(True)}, {"beta": np.array([0.5])}):
        with pytest.raises(TypeError, match=list(bad)[0]):
            ms_kldiv.distillation_loss(s, t, **bad)


class _WeightedLosses(nn.Cell):
    """Each loss that takes row weights or a count, called on the same rows (the head on hidden states whose
    logits are the rows)."""

    def __init__(self, backend):
        super().__init__()
        self.dense = DistillationLoss(2.0, backend=backend)
        self.head = ms_kldiv.FusedLinearDistillationLoss(2.0, backend=backend, chunk_size=2)
        self.backend = backend

    def construct(self, s, t, ids, values, eye, weights, count):
        return (self.dense(s, t, None, weights), self.dense(s, t, None, None, count),
                ms_kldiv.sparse_distillation_loss(s, ids, values, mode="tail", temperature=2.0,
                                                  backend=self.backend, num_items_in_batch=count),
                self.head(s, eye, t, eye, None, None, None, weights), self.head(s, eye, t, eye, None, None, None, None,
                                                                               count))


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", ["jit", "graph"])
def test_bad_weights_and_counts_compiled_give_nan(backend, mode):
    """Compiled code cannot raise on values (PyNative raises ValueError): a negative or NaN row weight, or a
    negative or NaN num_items_in_batch, makes the loss and its gradient NaN in every loss, never the clean-looking 0
    of 'nothing counted' (what it gave before); valid ones still match float64, and a count of 0 still gives 0."""
    rng = np.random.default_rng(5)
    s_np, t_np = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    s, t = ms.Tensor(s_np, ms.float32), ms.Tensor(t_np, ms.float32)
    ids = ms.Tensor(np.argsort(-t_np, -1)[:, :2].astype(np.int32))
    values = ms.Tensor(np.take_along_axis(reference.log_softmax(t_np), np.argsort(-t_np, -1)[:, :2], -1), ms.float32)
    eye = ms.Tensor(np.eye(5), ms.float32)
    net = _WeightedLosses(backend)
    grad = ms.value_and_grad(net, grad_position=0)
    if mode == "jit":
        grad = ms.jit(grad)

    def run(weights, count):
        args = (s, t, ids, values, eye, ms.Tensor(np.array(weights, np.float32)), ms.Tensor(count, ms.float32))
        if mode == "graph":
            with graph_mode():
                return grad(*args)
        return grad(*args)

    (losses, d_s) = run([1.0, 2.0, 0.5, 1.0], 3.0)
    rows = reference.distillation_loss(s_np, t_np, 2.0, "none").sum(-1)
    want = (np.sum(rows * [1.0, 2.0, 0.5, 1.0]) / 4.5, np.sum(rows) / 3.0, None, np.sum(rows * [1.0, 2.0, 0.5, 1.0])
            / 4.5, np.sum(rows) / 3.0)
    for got, w in zip(losses, want):
        if w is not None:
            np.testing.assert_allclose(float(to_numpy(got)), w, rtol=1e-5)
    assert np.isfinite(to_numpy(d_s)).all()
    assert all(float(to_numpy(v)) == 0.0 for v in run([1.0, 2.0, 0.5, 1.0], 0.0)[0][1:3] + run([0.0] * 4, 3.0)[0][::3])
    for weights, count in (([1.0, -1.0, 0.5, 1.0], float("nan")), ([1.0, float("nan"), 0.5, 1.0], -4.0),
                           ([-1.0, -1.0, -1.0, -1.0], -1.0), ([1.0, -1.0, 0.5, -0.5], float("nan"))):
        losses, d_s = run(weights, count)
        assert all(np.isnan(float(to_numpy(v))) for v in losses), (weights, count, [to_numpy(v) for v in losses])
        assert np.isnan(to_numpy(d_s)).any(), (weights, count)


class _LossAndGrads(nn.Cell):
    """A loss Cell's value and its gradients towards both logits (labels, if any, passed on)."""

    def __init__(self, loss):
        super().__init__()
        self.grad = ms.value_and_grad(loss, grad_position=(0, 1))

    def construct(self, s, t, labels):
        return self.grad(s, t, labels)


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_graph_cell_with_unknown_rank(backend):
    """A GRAPH_MODE DistillationLoss whose set_inputs leave the rank unknown (``Tensor(shape=None)``: the shape reaches
    the checks and the compile-time shape rules as None, which crashed them, and the labels' check compared them with
    a leading shape of ()): the value and both gradients against float64 for 2-D and 3-D logits through one compiled
    Cell, with ignored rows."""
    rng = np.random.default_rng(23)
    cell = _LossAndGrads(DistillationLoss(2.0, "tokenmean", beta=0.5, backend=backend))
    cell.set_inputs(ms.Tensor(shape=None, dtype=ms.float32), ms.Tensor(shape=None, dtype=ms.float32),
                    ms.Tensor(shape=None, dtype=ms.int32))
    for shape in ((4, 6), (2, 3, 6)):
        s, t = rng.normal(size=shape), rng.normal(size=shape)
        labels = rng.integers(0, 6, shape[:-1]).astype(np.int32)
        labels.reshape(-1)[1] = -100
        s, t = s.astype(np.float32).astype(np.float64), t.astype(np.float32).astype(np.float64)
        with graph_mode():
            value, (d_s, d_t) = cell(ms.Tensor(s, ms.float32), ms.Tensor(t, ms.float32), ms.Tensor(labels))

        def f(a, b):
            return reference.distillation_loss(a, b, 2.0, "tokenmean", beta=0.5, labels=labels)
        np.testing.assert_allclose(float(to_numpy(value)), f(s, t), rtol=1e-5, err_msg=str(shape))
        np.testing.assert_allclose(to_numpy(d_s), central_differences(lambda a: f(a, t), s), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(to_numpy(d_t), central_differences(lambda b: f(s, b), t), rtol=1e-4, atol=1e-6)


class _PairLossAndGrads(nn.Cell):
    def __init__(self, loss):
        super().__init__()
        self.grad = ms.value_and_grad(loss, grad_position=(0, 1))

    def construct(self, s, t):
        return self.grad(s, t)


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("dtype", [ms.float32, ms.float64])
def test_graph_cell_with_dynamic_rows_and_one_teacher_row(backend, dtype):
    """DistillationLoss in a GRAPH_MODE Cell with set_inputs([None, V], [V]) (one teacher row for every student row)
    and its gradients: MindSpore's compiler crashed the process (SIGSEGV) on the composition's broadcast between
    ranks under dynamic dims. Value and both gradients against float64 central differences, two row counts."""
    rng = np.random.default_rng(25)
    np_dtype = np.float32 if dtype == ms.float32 else np.float64
    cell = _PairLossAndGrads(DistillationLoss(2.0, "batchmean", beta=0.4, backend=backend))
    cell.set_inputs(ms.Tensor(shape=[None, 5], dtype=dtype), ms.Tensor(shape=[5], dtype=dtype))
    for rows in (3, 1):
        s = rng.normal(size=(rows, 5)).astype(np_dtype).astype(np.float64)
        t = rng.normal(size=5).astype(np_dtype).astype(np.float64)
        with graph_mode():
            value, (d_s, d_t) = cell(ms.Tensor(s, dtype), ms.Tensor(t, dtype))

        def f(a, b):
            return reference.distillation_loss(a, np.broadcast_to(b, a.shape), 2.0, "batchmean", beta=0.4)
        np.testing.assert_allclose(float(to_numpy(value)), f(s, t), rtol=1e-5, err_msg=str(rows))
        np.testing.assert_allclose(to_numpy(d_s), central_differences(lambda a: f(a, t), s), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(to_numpy(d_t), central_differences(lambda b: f(s, b), t), rtol=1e-4, atol=1e-6)
