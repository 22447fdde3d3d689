"""distillation_loss's beta (forward KL, generalized JSD, reverse KL) and labels / ignore_index: against TRL's
definition (golden values and gradients from torch, tests/golden/distill_trl_golden.json, made by
tests/golden/make_distill_golden.py), the float64 reference ``ms_kldiv.reference.distillation_loss``, finite
differences for both gradients and the second order, in PyNative and GRAPH_MODE, on every available backend."""
import json
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv import reference
from ms_kldiv.distillation import DistillationLoss

from conftest import DISTILL_BACKENDS, dense, graph_mode, make, to_numpy

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "distill_trl_golden.json")
with open(GOLDEN, encoding="utf-8") as _f:
    DOC = json.load(_f)
STUDENT, TEACHER = np.array(DOC["student"]), np.array(DOC["teacher"])
LABELS = np.array(DOC["labels"])
REDUCTIONS = ("batchmean", "sum", "mean", "none")


class _Loss(nn.Cell):
    def __init__(self, temperature, reduction, beta, backend="auto"):
        super().__init__()
        self.args = (temperature, reduction)
        self.beta = beta
        self.backend = backend

    def construct(self, s, t, labels):
        return ms_kldiv.distillation_loss(s, t, *self.args, beta=self.beta, labels=labels, backend=self.backend)


class _Weighted(nn.Cell):
    """sum(loss * w): any reduction to a scalar with a non-uniform upstream gradient."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, s, t, labels, w):
        return ops.sum(ops.cast(self.loss(s, t, labels), ms.float64) * w)


def _value_and_grads(mode, net, *args):
    fn = ms.value_and_grad(net, grad_position=(0, 1))
    if mode == "graph":
        with graph_mode():
            value, (ds, dt) = fn(*args)
    else:
        value, (ds, dt) = fn(*args)
    return to_numpy(value), to_numpy(ds), to_numpy(dt)


def test_reference_matches_trl_golden():
    for case in DOC["cases"]:
        got = reference.distillation_loss(STUDENT, TEACHER, case["temperature"], "batchmean", case["beta"], LABELS)
        np.testing.assert_allclose(got, case["batchmean"], rtol=1e-12, err_msg=str(case["beta"]))


def _golden_cases(compiled):
    for case in DOC["cases"]:
        if compiled and not (case["beta"] in (0.0, 0.5, 1.0) and case["temperature"] in (0.5, 2.0)):
            continue  # every case eagerly; a spread of them compiled (each is one graph compile per backend)
        yield case


@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_trl_golden_values_and_both_gradients(backend, mode):
    s, t = ms.Tensor(STUDENT, ms.float64), ms.Tensor(TEACHER, ms.float64)
    labels = ms.Tensor(LABELS, ms.int32)
    for case in _golden_cases(mode == "graph"):
        net = _Loss(case["temperature"], "batchmean", case["beta"], backend)
        value, ds, dt = _value_and_grads(mode, net, s, t, labels)
        what = f"beta={case['beta']} T={case['temperature']}"
        np.testing.assert_allclose(value, case["batchmean"], rtol=1e-10, err_msg=what)
        np.testing.assert_allclose(ds, case["d_student"], rtol=1e-9, atol=1e-12, err_msg=what)
        np.testing.assert_allclose(dt, case["d_teacher"], rtol=1e-9, atol=1e-12, err_msg=what)
        assert np.all(ds[1] == 0) and np.all(dt[1] == 0), "an ignored row must get no gradient"


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("ignored", ["none", "some", "all"])
def test_labels_every_reduction(mode, beta, ignored):
    rng = np.random.default_rng(1)
    s, t = rng.normal(size=(2, 3, 5)) * 2, rng.normal(size=(2, 3, 5)) * 2
    labels = rng.integers(0, 5, (2, 3))
    if ignored == "some":
        labels[0, 1] = labels[1, 2] = -100
    elif ignored == "all":
        labels[:] = -100
    for reduction in REDUCTIONS:
        expected = reference.distillation_loss(s, t, 2.0, reduction, beta, labels)
        w = np.linspace(0.5, 1.5, expected.size).reshape(expected.shape)
        net = _Weighted(_Loss(2.0, reduction, beta))
        value, ds, dt = _value_and_grads(mode, net, ms.Tensor(s), ms.Tensor(t), ms.Tensor(labels, ms.int64),
                                         ms.Tensor(w))
        np.testing.assert_allclose(value, np.sum(expected * w), rtol=1e-10, atol=1e-300, err_msg=reduction)
        if ignored == "all":
            assert value == 0 and np.all(ds == 0) and np.all(dt == 0), reduction
        keep = labels != -100
        assert np.all(ds[~keep] == 0) and np.all(dt[~keep] == 0), reduction


def _central(f, a, h=1e-6):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        ap, am = a.copy(), a.copy()
        ap[i] += h
        am[i] -= h
        g[i] = (f(ap) - f(am)) / (2 * h)
    return g


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gradients_and_second_order_match_finite_differences(mode, beta):
    rng = np.random.default_rng(4)
    s, t = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    labels = np.array([1, -100, 2])
    w = rng.normal(size=(3, 4))
    T = 1.5
    net = _Weighted(_Loss(T, "none", beta))
    args = (ms.Tensor(s), ms.Tensor(t), ms.Tensor(labels, ms.int32), ms.Tensor(w))
    _, ds, dt = _value_and_grads(mode, net, *args)

    def ref(a, b):
        return np.sum(reference.distillation_loss(a, b, T, "none", beta, labels) * w)
    np.testing.assert_allclose(ds, _central(lambda a: ref(a, t), s), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dt, _central(lambda b: ref(s, b), t), rtol=1e-6, atol=1e-8)

    # Second order: the gradient of sum(ds * v1 + dt * v2), against central differences of the first order.
    v1, v2 = rng.normal(size=s.shape), rng.normal(size=t.shape)

    class FirstOrder(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = net

        def construct(self, a, b, lab, weights, u1, u2):
            ga, gb = ms.grad(self.net, grad_position=(0, 1))(a, b, lab, weights)
            return ops.sum(ga * u1) + ops.sum(gb * u2)
    second = ms.grad(FirstOrder(), grad_position=(0, 1))
    extra = (ms.Tensor(v1), ms.Tensor(v2))
    if mode == "graph":
        with graph_mode():
            gs, gt = second(*args, *extra)
    else:
        gs, gt = second(*args, *extra)

    def first(a, b):
        _, ga, gb = _value_and_grads("pynative", net, ms.Tensor(a), ms.Tensor(b), *args[2:])
        return np.sum(ga * v1) + np.sum(gb * v2)
    np.testing.assert_allclose(to_numpy(gs), _central(lambda a: first(a, t), s, 1e-5), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(to_numpy(gt), _central(lambda b: first(s, b), t, 1e-5), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_masked_vocabulary(mode, beta):
    """-inf in both logits: 0 and no NaN anywhere. Masked in one model only: +inf where the masked side's
    divergence needs the class (forward KL masks the student, reverse KL the teacher), finite for the JSD
    (the mixture keeps mass), never NaN."""
    rng = np.random.default_rng(2)
    s, t = rng.normal(size=(2, 6)), rng.normal(size=(2, 6))
    s[:, 5] = t[:, 5] = -np.inf  # padded vocabulary: both
    net = _Loss(2.0, "batchmean", beta)
    value, ds, dt = _value_and_grads(mode, net, ms.Tensor(s), ms.Tensor(t), None)
    np.testing.assert_allclose(value, reference.distillation_loss(s, t, 2.0, "batchmean", beta), rtol=1e-10)
    assert np.all(np.isfinite(ds)) and np.all(np.isfinite(dt))
    assert np.all(ds[:, 5] == 0) and np.all(dt[:, 5] == 0)
    for side in ("student", "teacher"):
        a, b = s.copy(), t.copy()
        (a if side == "student" else b)[0, 2] = -np.inf
        value = _value_and_grads(mode, net, ms.Tensor(a), ms.Tensor(b), None)[0]
        expected = reference.distillation_loss(a, b, 2.0, "batchmean", beta)
        assert not np.isnan(value)
        infinite = (beta == 0 and side == "student") or (beta == 1 and side == "teacher")
        assert np.isinf(expected) == infinite
        if infinite:
            assert value == np.inf
        else:
            np.testing.assert_allclose(value, expected, rtol=1e-10)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_large_logits_and_tiny_temperature(beta):
    rng = np.random.default_rng(3)
    s, t = rng.normal(size=(3, 8)) * 1e4, rng.normal(size=(3, 8)) * 1e4
    for T in (1.0, 0.05):
        got = to_numpy(ms_kldiv.distillation_loss(ms.Tensor(s, ms.float32), ms.Tensor(t, ms.float32), T,
                                                  beta=beta))
        expected = reference.distillation_loss(s.astype(np.float32), t.astype(np.float32), T, "batchmean", beta)
        assert np.isfinite(got)
        np.testing.assert_allclose(got, expected, rtol=1e-4)


@pytest.mark.parametrize("dtype", [ms.float64, ms.float32, ms.float16, ms.bfloat16])
def test_dtypes_with_jsd(dtype):
    rng = np.random.default_rng(5)
    s, s64 = make(rng.normal(size=(4, 9)) * 2, dtype)
    t, t64 = make(rng.normal(size=(4, 9)) * 2, dtype)
    labels = np.array([0, 1, -100, 3])
    got = ms_kldiv.distillation_loss(s, t, 2.0, beta=0.5, labels=ms.Tensor(labels, ms.int32))
    assert got.dtype == dtype
    expected = reference.distillation_loss(s64, t64, 2.0, "batchmean", 0.5, labels)
    tol = {ms.float64: 1e-12, ms.float32: 1e-5, ms.float16: 2e-3, ms.bfloat16: 1.6e-2}[dtype]
    np.testing.assert_allclose(to_numpy(got), expected, rtol=tol)


def test_graph_mode_training_step_with_jsd_and_labels():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    teacher_logits = (x @ rng.normal(size=(8, 12)) * 1.5).astype(np.float32)
    labels = teacher_logits.argmax(-1).astype(np.int32)
    labels[::5] = -100

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.student = dense(rng, 8, 12)
            self.loss = DistillationLoss(2.0, beta=0.5)

        def construct(self, x, t, labels):
            return self.loss(self.student(x), t, labels)
    net = Net()
    step = nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), learning_rate=0.05))
    args = (ms.Tensor(x), ms.Tensor(teacher_logits), ms.Tensor(labels))
    with graph_mode():
        losses = [float(step(*args).asnumpy()) for _ in range(40)]
    assert losses[-1] < 0.3 * losses[0], losses


def test_dynamic_row_count():
    net = _Loss(2.0, "batchmean", 0.5)
    net.set_inputs(ms.Tensor(shape=[None, 6], dtype=ms.float32), ms.Tensor(shape=[None, 6], dtype=ms.float32),
                   ms.Tensor(shape=[None], dtype=ms.int32))
    rng = np.random.default_rng(7)
    with graph_mode():
        for rows in (5, 2, 9):
            s = rng.normal(size=(rows, 6)).astype(np.float32)
            t = rng.normal(size=(rows, 6)).astype(np.float32)
            labels = rng.integers(-1, 6, rows)
            labels[labels < 0] = -100
            got = net(ms.Tensor(s, ms.float32), ms.Tensor(t, ms.float32), ms.Tensor(labels, ms.int32))
            expected = reference.distillation_loss(s, t, 2.0, "batchmean", 0.5, labels)
            # float32: the JSD's two KL terms cancel to a small total
            np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-4)


def _st():
    return ms.Tensor(np.zeros((2, 3), np.float32)), ms.Tensor(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(beta=1.5), ValueError, "'beta'"), (dict(beta=-0.1), ValueError, "'beta'"),
    (dict(beta="0.5"), TypeError, "'beta'"), (dict(beta=True), TypeError, "'beta'"),
    (dict(ignore_index=1.0), TypeError, "'ignore_index'"),
    (dict(temperature=1e20), ValueError, "'temperature'"), (dict(softcap=1e-300), ValueError, "'softcap'"),
    (dict(logit_scale=1e30), ValueError, "'logit_scale'"), (dict(divergence="tvd", beta="x"), TypeError, "'beta'"),
    (dict(ignore_index=2**32 - 100), ValueError, "'ignore_index' must lie in int32's range"),
    (dict(ignore_index=-2**31 - 1), ValueError, "'ignore_index' must lie in int32's range"),
    (dict(labels=ms.Tensor(np.zeros(2, np.float32))), TypeError, "'labels'"),
    (dict(labels=ms.Tensor(np.zeros(3, np.int32))), ValueError, "'labels'"),
    (dict(labels=np.zeros(2, np.int32)), TypeError, "'labels'"),
])
def test_bad_arguments_raise_before_running(kwargs, error, match):
    s, t = _st()
    with pytest.raises(error, match=r"^For 'distillation_loss', " + match):
        ms_kldiv.distillation_loss(s, t, **kwargs)
    if "labels" not in kwargs:
        with pytest.raises(error, match=r"^For 'DistillationLoss', " + match):
            DistillationLoss(**kwargs)
