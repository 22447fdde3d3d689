"""The fused distillation kernels of the CPU library (custom_ops/cpu/distill_cpu.cc, math in
custom_ops/common/distill_math.h) behind ``distillation_loss(..., backend='auto' | 'aot')``: values and both gradients
against the float64 reference, in PyNative, under ``ms.jit`` and as a GRAPH_MODE Cell; masks, extreme logits, tiny
and huge vocabularies, half types, ignored rows, a frozen teacher, second order, dynamic row counts."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv import reference
from ms_kldiv.backends import distill, get_distill_kernels

from conftest import central_differences, graph_mode

_AOT_DISTILL = any(r["name"] == "aot" and r["available"] for r in ms_kldiv.backend_info("CPU", op="distillation"))
pytestmark = pytest.mark.skipif(not _AOT_DISTILL or ms.get_context("device_target") != "CPU",
                                reason="the CPU kernel library is not available here")

MODES = ("pynative", "jit", "graph")


class Loss(nn.Cell):
    def __init__(self, temperature, reduction, beta, frozen=False, backend="aot"):
        super().__init__()
        self.args = (temperature, reduction)
        self.beta = beta
        self.frozen = frozen
        self.backend = backend

    def construct(self, s, t, w):
        if self.frozen:
            t = ops.stop_gradient(t)
        loss = ms_kldiv.distillation_loss(s, t, *self.args, beta=self.beta, backend=self.backend)
        return loss * w


class LossWithLabels(Loss):
    def construct(self, s, t, w, labels):
        return ms_kldiv.distillation_loss(s, t, *self.args, beta=self.beta, labels=labels, backend=self.backend) * w


def _run(mode, cell, *args):
    """(value, d/ds, d/dt) of ``cell`` in ``mode``."""
    grad = ms.value_and_grad(cell, grad_position=(0, 1))
    if mode == "pynative":
        value, (ds, dt) = grad(*args)
    elif mode == "jit":
        value, (ds, dt) = ms.jit(grad)(*args)
    else:
        with graph_mode():
            value, (ds, dt) = _GraphGrad(cell)(*args)
    return value.asnumpy(), ds.asnumpy(), dt.asnumpy()


class _GraphGrad(nn.Cell):
    def __init__(self, cell):
        super().__init__()
        self.grad = ms.value_and_grad(cell, grad_position=(0, 1))

    def construct(self, *args):
        return self.grad(*args)


def _ref_grads(s, t, temperature, reduction, beta, labels=None, eps=None):
    """The float64 reference's gradients, by central differences on every element (small inputs only)."""
    s, t = s.astype(np.float64), t.astype(np.float64)
    eps = eps or 1e-6

    def f(a, b):
        return reference.distillation_loss(a, b, temperature, reduction, beta, labels=labels)

    return [central_differences(lambda a: f(a, t), s, eps), central_differences(lambda b: f(s, b), t, eps)]


def test_auto_uses_the_fused_kernels_on_cpu():
    """One registry: distillation's 'auto' on CPU is the C++ kernels; backend_info says so, per op."""
    rows = {r["name"]: r for r in ms_kldiv.backend_info("CPU", op="distillation")}
    assert rows["aot"]["auto"] and rows["aot"]["available"] and rows["composite"]["available"]
    assert not rows["akg"]["available"] and "does not implement distillation" in rows["akg"]["reason"]
    assert isinstance(get_distill_kernels("auto", "CPU")[1], distill.AotDistillKernels)
    assert get_distill_kernels("composite", "CPU")[0] == "composite"
    assert {r["op"] for r in ms_kldiv.backend_info("CPU", op=None)} == {"kl_div", "distillation", "sparse_distillation"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_values_and_both_gradients(mode, beta, temperature):
    rng = np.random.default_rng(int(beta * 10 + temperature * 100))
    s = (rng.standard_normal((3, 7)) * 2).astype(np.float32)
    t = (rng.standard_normal((3, 7)) * 2).astype(np.float32)
    s[0, 2] = t[0, 2] = -np.inf  # a class masked in both models (a padded vocabulary entry)
    value, ds, dt = _run(mode, Loss(temperature, "batchmean", beta), ms.Tensor(s), ms.Tensor(t),
                         ms.Tensor(1.0, ms.float32))
    exact = reference.distillation_loss(s, t, temperature, "batchmean", beta)
    np.testing.assert_allclose(value, exact, rtol=1e-6)
    es, et = _ref_grads(s, t, temperature, "batchmean", beta)
    np.testing.assert_allclose(ds, es, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dt, et, rtol=1e-4, atol=1e-6)
    assert ds[0, 2] == 0 and dt[0, 2] == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature, trl_index", [(1.0, 0), (4.0, 1)])
def test_ignored_rows_and_reductions(mode, beta, temperature, trl_index):
    rng = np.random.default_rng(trl_index)
    s = rng.standard_normal((2, 3, 5)).astype(np.float32)
    t = rng.standard_normal((2, 3, 5)).astype(np.float32)
    labels = np.array([[1, -100, 2], [-100, 0, 4]], np.int32)
    for reduction in ("batchmean", "mean", "sum"):
        value, ds, dt = _run(mode, LossWithLabels(temperature, reduction, beta), ms.Tensor(s), ms.Tensor(t),
                             ms.Tensor(1.0, ms.float32), ms.Tensor(labels))
        exact = reference.distillation_loss(s, t, temperature, reduction, beta, labels=labels)
        # float32 per-class terms: at T = 4 the JSD's log-probabilities and the mixture's nearly cancel, and without
        # FMA (the SSE baseline unit, tests/test_isa.py) the loss is 2.7e-6 off
        np.testing.assert_allclose(value, exact, rtol=1e-6 if beta != 0.5 else 4e-6)
        es, et = _ref_grads(s, t, temperature, reduction, beta, labels=labels)
        np.testing.assert_allclose(ds, es, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(dt, et, rtol=1e-4, atol=1e-6)
        ignored = labels == -100
        assert (ds[ignored] == 0).all() and (dt[ignored] == 0).all()


@pytest.mark.parametrize("mode", MODES)
def test_all_rows_ignored_is_zero_not_nan(mode):
    s = np.ones((2, 4), np.float32)
    labels = np.full((2,), -100, np.int32)
    value, ds, dt = _run(mode, LossWithLabels(1.0, "batchmean", 0.0), ms.Tensor(s), ms.Tensor(s * 2),
                         ms.Tensor(1.0, ms.float32), ms.Tensor(labels))
    assert value == 0 and (ds == 0).all() and (dt == 0).all()


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_masks_teacher_only_and_student_only(mode):
    s = np.array([[0.5, -np.inf, 1.0, 2.0], [0.1, 0.2, -np.inf, 0.4]], np.float32)
    t = np.array([[1.0, 0.3, -np.inf, 0.0], [0.0, 1.0, 0.5, -np.inf]], np.float32)
    for beta in (0.0, 0.5, 1.0):
        rows = distill.rows_op(get_distill_kernels("aot", "CPU")[1], 1.0, beta)
        if mode == "graph":
            with graph_mode():
                got = rows(ms.Tensor(s), ms.Tensor(t)).asnumpy()
        else:
            got = rows(ms.Tensor(s), ms.Tensor(t)).asnumpy()
        exact = reference.distillation_pointwise(s, t, 1.0, beta).sum(-1)
        assert not np.isnan(got).any()
        np.testing.assert_array_equal(np.isinf(got), np.isinf(exact))  # +inf exactly where the math says
        np.testing.assert_allclose(got[np.isfinite(exact)], exact[np.isfinite(exact)], rtol=1e-6)


@pytest.mark.parametrize("vocab", [1, 2, 1023, 1024, 1025, 262144])
def test_vocabulary_sizes_and_extreme_logits(vocab):
    rng = np.random.default_rng(vocab)
    rows = 3 if vocab < 262144 else 1
    s = (rng.standard_normal((rows, vocab)) * 1e4).astype(np.float32)  # |z| ~ 1e4 with a small T: no overflow
    t = (rng.standard_normal((rows, vocab)) * 1e4).astype(np.float32)
    s2 = rng.standard_normal((rows, vocab)).astype(np.float32)
    t2 = s2 + 0.1 * rng.standard_normal((rows, vocab)).astype(np.float32)
    for beta in (0.0, 0.5):
        op = distill.rows_op(get_distill_kernels("aot", "CPU")[1], 0.05, beta)
        got = op(ms.Tensor(s), ms.Tensor(t)).asnumpy()
        exact = reference.distillation_pointwise(s, t, 0.05, beta).sum(-1)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, exact, rtol=2e-5, atol=1e-6 * np.abs(exact).max())
        op = distill.rows_op(get_distill_kernels("aot", "CPU")[1], 1.0, beta)
        got = op(ms.Tensor(s2), ms.Tensor(t2)).asnumpy()
        exact = reference.distillation_pointwise(s2, t2, 1.0, beta).sum(-1)
        # Near-identical models: the divergence (~1e-5) is a difference of O(log V) terms, so its error is absolute
        np.testing.assert_allclose(got, exact, rtol=2e-6, atol=5e-8 * max(1.0, np.log(vocab)))


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16])
def test_half_inputs_compute_in_float32(dtype):
    rng = np.random.default_rng(3)
    s = rng.standard_normal((4, 300)).astype(np.float32)
    t = rng.standard_normal((4, 300)).astype(np.float32)
    sh, th = ms.Tensor(s).astype(dtype), ms.Tensor(t).astype(dtype)
    s_q, t_q = sh.astype(ms.float32).asnumpy(), th.astype(ms.float32).asnumpy()  # the inputs as rounded
    value, ds, dt = _run("pynative", Loss(2.0, "batchmean", 0.0), sh, th, ms.Tensor(1.0, dtype))
    exact = reference.distillation_loss(s_q, t_q, 2.0, "batchmean", 0.0)
    np.testing.assert_allclose(np.float64(value), exact, rtol=1e-2)
    # gradients: float32 values rounded once to the half type
    exact_ds = 2.0 * (np.exp(reference.log_softmax(s_q / 2)) - np.exp(reference.log_softmax(t_q / 2))) / 4
    got = ds.astype(np.float64) if ds.dtype != np.uint16 else ds
    half_eps = 2.0 ** -8 if dtype == ms.bfloat16 else 2.0 ** -11
    assert np.mean(np.abs(got - exact_ds) <= half_eps * np.abs(exact_ds) + 1e-7) >= 0.999


@pytest.mark.parametrize("mode", ["jit", "graph"])
def test_frozen_teacher_gets_zeros_and_the_same_student_gradient(mode):
    rng = np.random.default_rng(8)
    s, t = rng.standard_normal((4, 9)).astype(np.float32), rng.standard_normal((4, 9)).astype(np.float32)
    w = ms.Tensor(1.0, ms.float32)
    _, ds_free, _ = _run(mode, Loss(2.0, "batchmean", 0.5), ms.Tensor(s), ms.Tensor(t), w)
    _, ds_frozen, dt_frozen = _run(mode, Loss(2.0, "batchmean", 0.5, frozen=True), ms.Tensor(s), ms.Tensor(t), w)
    np.testing.assert_array_equal(ds_frozen, ds_free)
    assert (dt_frozen == 0).all()


class _SecondOrder(nn.Cell):
    """sum(d/ds * v1) + sum(d/dt * v2) of the loss: its gradient is the second order."""

    def __init__(self, loss):
        super().__init__()
        self.grad = ms.grad(loss, grad_position=(0, 1))

    def construct(self, s, t, w, v1, v2):
        ds, dt = self.grad(s, t, w)
        return (ds * v1).sum() + (dt * v2).sum()


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_second_order_matches_the_composition_in_float64(mode, beta):
    rng = np.random.default_rng(21)
    args = [ms.Tensor(rng.standard_normal((3, 6)).astype(np.float32)) for _ in range(2)]
    args.append(ms.Tensor(1.0, ms.float32))
    args += [ms.Tensor(rng.standard_normal((3, 6)).astype(np.float32)) for _ in range(2)]
    results = []
    # the reference: the composition in float64 (its log-softmax is plain ops there, differentiable twice)
    for backend, dtype in (("aot", ms.float32), ("composite", ms.float64)):
        cell = _SecondOrder(Loss(2.0, "batchmean", beta, backend=backend))
        grad = ms.grad(cell, grad_position=(0, 1))
        cast = [a.astype(dtype) for a in args]
        if mode == "graph":
            with graph_mode():
                gs, gt = _Graph2(grad)(*cast)
        else:
            gs, gt = grad(*cast)
        results.append((gs.asnumpy(), gt.asnumpy()))
    for ours, composed in zip(*results):
        np.testing.assert_allclose(ours, composed, rtol=2e-4, atol=1e-6)


class _Graph2(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, *args):
        return self.fn(*args)


def test_dynamic_row_count_in_graph_mode():
    rng = np.random.default_rng(4)
    net = _GraphGrad(Loss(2.0, "batchmean", 0.0))
    with graph_mode():
        net.set_inputs(ms.Tensor(shape=[None, 11], dtype=ms.float32), ms.Tensor(shape=[None, 11], dtype=ms.float32),
                       ms.Tensor(1.0, ms.float32))
        for rows in (1, 5, 17):
            s = rng.standard_normal((rows, 11)).astype(np.float32)
            t = rng.standard_normal((rows, 11)).astype(np.float32)
            value, (ds, _) = net(ms.Tensor(s), ms.Tensor(t), ms.Tensor(1.0, ms.float32))
            np.testing.assert_allclose(value.asnumpy(), reference.distillation_loss(s, t, 2.0, "batchmean"),
                                       rtol=1e-6)
            exact_ds = 2.0 * (np.exp(reference.log_softmax(s / 2)) - np.exp(reference.log_softmax(t / 2))) / rows
            np.testing.assert_allclose(ds.asnumpy(), exact_ds, rtol=1e-4, atol=1e-7)


def _chunks(n, size=64):
    return [slice(r, min(r + size, n)) for r in range(0, n, size)]


@pytest.mark.slow
def test_accuracy_at_llm_vocabulary():
    """256 x 151936 (Qwen's vocabulary; the accuracy of a row depends on V, more rows only repeat it), PyNative and
    ms.jit: the float32 loss within 1e-6 of float64, and bfloat16 gradients within one bfloat16 rounding of the
    float64 gradient (of the same rounded logits) for >= 99.9% of elements. The reference runs a few rows at a time
    (bounded memory)."""
    rows, vocab, temperature = 256, 151936, 2.0
    rng = np.random.default_rng(151936)
    s = rng.standard_normal((rows, vocab), np.float32) * 3
    t = s + rng.standard_normal((rows, vocab), np.float32)
    modes = ("pynative", "jit")
    loss = Loss(temperature, "batchmean", 0.0)
    values = [float(_run(mode, loss, ms.Tensor(s), ms.Tensor(t), ms.Tensor(1.0, ms.float32))[0]) for mode in modes]
    exact = sum(reference.distillation_pointwise(s[c], t[c], temperature, 0.0).sum() for c in _chunks(rows)) / rows
    print(f"float32 loss, relative error: {[abs(v - exact) / exact for v in values]}")
    for mode, value in zip(modes, values):
        assert abs(value - exact) <= 1e-6 * exact, (mode, value, exact)
    sh, th = ms.Tensor(s).astype(ms.bfloat16), ms.Tensor(t).astype(ms.bfloat16)
    del s, t
    s_q, t_q = sh.astype(ms.float32).asnumpy(), th.astype(ms.float32).asnumpy()  # the inputs as rounded
    grads = [_run(mode, loss, sh, th, ms.Tensor(1.0, ms.bfloat16))[1:] for mode in modes]
    within = np.zeros((len(modes), 2))
    for c in _chunks(rows):
        want = reference.distillation_row_grads(s_q[c], t_q[c], temperature, 0.0, np.full(c.stop - c.start, 1 / rows))
        for m, got in enumerate(grads):
            for k in (0, 1):
                # one rounding to bfloat16 (8 significant bits) is at most 2^-8 relative (half an ulp)
                err = np.abs(got[k][c].astype(np.float64) - want[k])
                within[m, k] += np.count_nonzero(err <= 2.0 ** -8 * np.abs(want[k]))
    print(f"bfloat16 gradients within one rounding (mode x (student, teacher)): {within / (rows * vocab)}")
    assert (within / (rows * vocab) >= 0.999).all(), within / (rows * vocab)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_small_divergences_have_the_documented_absolute_error(mode):
    """docs/distillation.md#accuracy: the row's D (before T^2) carries an absolute error, < 1e-8 for the one-pass
    sums (forward / reverse / symmetric KL, TVD: identical inputs exactly 0) and at most 3e-7 for the JSD and the
    skews (their float32 logs of the mixture), against the float64 reference, for a student close to its teacher."""
    rng = np.random.default_rng(12)
    t = (rng.normal(size=(8, 4096)) * 3).astype(np.float32)
    s = (t + 0.01 * rng.normal(size=t.shape) + 5.0).astype(np.float32)
    kinds = ((dict(), 1e-8), (dict(beta=1.0), 1e-8), (dict(divergence="symmetric_kl", alpha=0.5), 1e-8),
             (dict(divergence="tvd"), 1e-8), (dict(beta=0.5), 3e-7), (dict(divergence="skew_kl", alpha=0.1), 3e-7),
             (dict(divergence="skew_rkl", alpha=0.1), 3e-7))
    for kw, floor in kinds:
        for temperature in (1.0, 20.0):
            def loss(a, b, kw=kw, temperature=temperature):
                return ms_kldiv.distillation_loss(a, b, temperature, backend="aot", **kw)
            fn = ms.jit(loss) if mode == "jit" else loss
            beta = kw.get("beta", 0.0)
            extra = {k: kw[k] for k in ("divergence", "alpha") if k in kw}
            exact = reference.distillation_loss(s, t, temperature, "batchmean", beta, **extra)
            got = float(fn(ms.Tensor(s), ms.Tensor(t)))
            assert abs(got - exact) / temperature ** 2 <= floor, (kw, temperature, got, exact)
            same = float(fn(ms.Tensor(t), ms.Tensor(t))) / temperature ** 2
            assert (same == 0) if floor < 1e-7 else abs(same) <= floor, (kw, temperature, same)
