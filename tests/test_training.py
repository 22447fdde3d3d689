"""Training with the loss: ``nn.TrainOneStepCell`` in GRAPH_MODE reduces it, and the target's gradient reaches
a trainable network that produces the target (mutual learning), which MindSpore's own kl_div cannot do."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from conftest import dense, graph_mode, to_numpy

pytestmark = pytest.mark.async_dispatch  # training loops in the dispatch users get (tests/conftest.py)

N, FEATURES, CLASSES, STEPS = 32, 8, 5, 40


def _data(rng):
    x = rng.normal(size=(N, FEATURES))
    features = ms.Tensor(x, ms.float32)
    teacher_logits = x @ rng.normal(0, 1.0, (FEATURES, CLASSES))  # linear, so the student can match it
    probs = np.exp(teacher_logits - teacher_logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    return features, probs


class StudentLoss(nn.Cell):
    def __init__(self, student, loss):
        super().__init__()
        self.student = student
        self.loss = loss
        self.log_softmax = nn.LogSoftmax(axis=-1)

    def construct(self, features, target):
        return self.loss(self.log_softmax(self.student(features)), target)


@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
def test_train_one_step_reduces_loss(backend, log_target):
    rng = np.random.default_rng(0)
    features, probs = _data(rng)
    target = ms.Tensor(np.log(probs) if log_target else probs, ms.float32)
    net = StudentLoss(dense(rng, FEATURES, CLASSES),
                      ms_kldiv.KLDivLoss("batchmean", log_target=log_target, backend=backend))
    step = nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), learning_rate=0.05))
    with graph_mode():
        losses = [float(to_numpy(step(features, target))) for _ in range(STEPS)]
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < 0.5 * losses[0], f"loss did not fall enough: {losses[0]:.4f} -> {losses[-1]:.4f}"
    assert losses[-1] >= -1e-6, "a KL divergence with 'batchmean' cannot be negative"


class MutualLoss(nn.Cell):
    """KL(teacher || student) where both networks learn; the teacher is trained only through d/dtarget."""

    def __init__(self, student, teacher, loss):
        super().__init__()
        self.student = student
        self.teacher = teacher
        self.loss = loss
        self.log_softmax = nn.LogSoftmax(axis=-1)

    def construct(self, features, labels):
        log_p_student = self.log_softmax(self.student(features))
        log_p_teacher = self.log_softmax(self.teacher(features))
        anchor = -ops.mean(ops.sum(log_p_student * labels, -1))  # cross-entropy keeps the student honest
        return anchor + self.loss(log_p_student, log_p_teacher)


def test_target_gradient_trains_the_teacher(backend):
    rng = np.random.default_rng(1)
    features, probs = _data(rng)
    labels = ms.Tensor(np.eye(CLASSES)[probs.argmax(1)], ms.float32)
    student, teacher = dense(rng, FEATURES, CLASSES), dense(rng, FEATURES, CLASSES)
    net = MutualLoss(student, teacher, ms_kldiv.KLDivLoss("batchmean", log_target=True, backend=backend))
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=0.5))
    teacher_before = teacher.weight.asnumpy().copy()

    def kl_student_teacher():
        ls = ops.log_softmax(student(features), -1)
        lt = ops.log_softmax(teacher(features), -1)
        return float(to_numpy(ms_kldiv.kl_div(ls, lt, "batchmean", log_target=True, backend=backend)))

    kl_before = kl_student_teacher()
    with graph_mode():
        for _ in range(STEPS):
            step(features, labels)
    moved = np.abs(teacher.weight.asnumpy() - teacher_before).max()
    assert moved > 1e-3, "the teacher received no gradient through the target"
    assert kl_student_teacher() < 0.5 * kl_before
