"""Mixed precision (``ms.amp.auto_mixed_precision`` 'O2' / 'O3', ``Cell.to_float``) around the package's losses.

amp flags every cell of a network (O2 calls ``to_float`` on each one), and in a flagged cell MindSpore casts every
float operand of every op: the kernels' float64 hyper-parameters and float32 saved statistics became float16 and
the kernels refused them ("DistillFwd is 1" / "SparseFwd is 1" / "HeadStudent is 1"), in PyNative for the logits
losses and in both modes for the fused head; in PyNative the first such failure left the process's cached kernels
failing for every later call. The losses now run as amp's black-listed cells do: on the operands as they arrive
(float16 logits), without casts inside. Values and gradients against float64 on the float16-rounded operands,
PyNative and GRAPH_MODE."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv import reference as ref

from _head_checks import V, case, reference_grads, reference_loss
from conftest import graph_mode


def _half(a):
    return np.asarray(a, np.float64).astype(np.float16).astype(np.float64)


class _Logits(nn.Cell):
    """A network whose loss takes the logits it is given (O2 / O3 cast them to float16 at its boundary; O1 casts
    the Dense's operands) and the labels (where the loss has them)."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss
        self.dense = nn.Dense(50, 50, weight_init=ms.Tensor(np.eye(50), ms.float32), has_bias=False)

    def construct(self, s, t, labels):
        return self.loss(self.dense(s), t, labels)  # identity weights: float16-exact logits stay as they are


class _LogitsOnly(_Logits):
    def construct(self, s, t):
        return self.loss(self.dense(s), t)


class _LogitsFunctional(_Logits):
    """The same with the functional API. (Not under O1 here: O1's mindspore.rewrite parses the functions a network
    calls unless they come from an installed package, and from this source tree it failed inside MindSpore's
    parser; docs/training.md.)"""

    def construct(self, s, t, labels):
        return ms_kldiv.distillation_loss(self.dense(s), t, 2.0, beta=0.5, labels=labels)


def _in_mode(mode, fn, *args):
    if mode == "graph":
        with graph_mode():
            return fn(*args)
    return fn(*args)


def _run(net, args, mode, grad_position=0):
    value, grad = _in_mode(mode, ms.value_and_grad(net, grad_position), *args)
    return float(value.astype(ms.float32).asnumpy()), grad.astype(ms.float32).asnumpy()


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("which,level", [(which, level) for which in ("DistillationLoss", "KLDivLoss")
                                         for level in ("O1", "O2", "O3")]
                         + [("distillation_loss", "O2"), ("distillation_loss", "O3")])
def test_logits_losses_under_amp(which, mode, level, tmp_path, monkeypatch):
    """O1 rewrites the network's code (mindspore.rewrite, which writes a 'rewritten_network' folder into the working
    directory: a temporary one here): it parsed the loss's own code too, and failed on it with labels."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    s, t = _half(rng.normal(size=(6, 50)) * 2), _half(rng.normal(size=(6, 50)) * 2)
    labels = np.array([1, -100, 2, 3, 4, 5])
    if which == "KLDivLoss":
        s, t = _half(ref.log_softmax(s)), _half(np.exp(ref.log_softmax(t)))
        loss, expected = ms_kldiv.KLDivLoss("batchmean"), ref.kl_div(s, t, "batchmean")
        grad, labels = ref.kl_div_grads(s, t, "batchmean")[0], None
    else:
        loss = ms_kldiv.DistillationLoss(2.0, beta=0.5)
        expected = ref.distillation_loss(s, t, 2.0, beta=0.5, labels=labels)
        grad = ref.distillation_grads(s, t, 2.0, beta=0.5, labels=labels)[0]
    kind = {"distillation_loss": _LogitsFunctional, "KLDivLoss": _LogitsOnly}.get(which, _Logits)
    net = ms.amp.auto_mixed_precision(kind(loss), level)
    args = (ms.Tensor(s, ms.float32), ms.Tensor(t, ms.float32)) + (() if labels is None else (ms.Tensor(labels),))
    value, got = _run(net, args, mode)
    # amp's float16 around the loss: the value leaves it into float16 ops (2^-11 relative), and the functional's
    # own reduction runs in the caller's flagged cell
    np.testing.assert_allclose(value, expected, rtol=2e-3)
    # the gradient leaves the loss in float16 (the logits' dtype)
    np.testing.assert_allclose(got, grad, rtol=0, atol=2e-3 * np.abs(grad).max())


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_stored_teacher_under_amp(mode):
    rng = np.random.default_rng(4)
    s = _half(rng.normal(size=(5, 40)) * 2)
    ids = np.stack([rng.permutation(40)[:6] for _ in range(5)]).astype(np.int32)
    values = np.log(0.7 * rng.dirichlet(np.ones(6), 5)).astype(np.float32)

    class Stored(nn.Cell):
        def __init__(self):
            super().__init__()
            self.loss = ms_kldiv.SparseDistillationLoss("tail", 2.0)

        def construct(self, x, i, v):
            return self.loss(x * 1.0, i, v)

    net = ms.amp.auto_mixed_precision(Stored(), "O2")
    value, _ = _run(net, (ms.Tensor(s, ms.float32), ms.Tensor(ids), ms.Tensor(values)), mode)
    expected = ref.sparse_distillation_loss(s, ids, values.astype(np.float64), "tail", 2.0, 1.0, 0.0, "batchmean")
    np.testing.assert_allclose(value, expected, rtol=2e-3)  # (the value leaves into amp's float16)


@pytest.mark.parametrize("level", ["O2", "O3"])
@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("entry", ["hidden", "logits"])
def test_fused_head_under_amp(entry, mode, level, head_impl):
    """The fused head inside an amp network: the student's hidden states from a float16 cell, the head weight a
    float32 Parameter; its gradient against the float64 composition (the operands float16-exact)."""
    c = case(seed=8, rows=10, labels_ignored=(3,))
    for name in ("hs", "ws", "ht", "wt"):
        c[name] = _half(c[name])
    c["bs"], c["bt"] = np.zeros(V), np.zeros(V)
    t_logits = c["ht"] @ c["wt"].T

    class Head(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ws = ms.Parameter(ms.Tensor(c["ws"], ms.float32), name="ws")
            self.wt = ms.Parameter(ms.Tensor(c["wt"], ms.float32), name="wt", requires_grad=False)
            self.kd = ms_kldiv.FusedLinearDistillationLoss(2.0, hard_weight=0.5, chunk_size=4)

        def construct(self, hs, ht, labels, t):
            hs = hs * 1.0
            if entry == "logits":
                return self.kd.from_teacher_logits(hs, self.ws, t, labels)
            return self.kd(hs, self.ws, ht, ops.stop_gradient(self.wt), labels)

    head = Head()
    net = ms.amp.auto_mixed_precision(head, level)
    args = (ms.Tensor(c["hs"], ms.float32), ms.Tensor(c["ht"], ms.float32), ms.Tensor(c["labels"], ms.int32),
            ms.Tensor(t_logits, ms.float32))
    value, (grad,) = _in_mode(mode, ms.value_and_grad(net, None, (head.ws,)), *args)
    if entry == "logits":  # teacher logits given (as float16 holds them): hidden states I, weight the logits
        c["ht"], c["wt"] = np.eye(len(t_logits)), _half(t_logits).T
    # float16's accuracy: the head forms its logits and gradients from float16 operands, and the value leaves into
    # amp's float16
    expected = reference_loss(c, 2.0, 0.0, 0.5, 1.0)
    np.testing.assert_allclose(float(value.asnumpy()), expected, rtol=2e-3)
    ref_grad = reference_grads(c, 2.0, 0.0, 0.5, 1.0)["ws"]
    np.testing.assert_allclose(grad.asnumpy(), ref_grad, rtol=0, atol=5e-3 * np.abs(ref_grad).max())


def test_to_float_on_the_loss_leaves_it_and_the_process_working():
    """``to_float(float16)`` on the loss itself is a no-op (it computes in float32 on the logits it gets), and in
    PyNative a loss under amp no longer leaves later plain calls failing."""
    rng = np.random.default_rng(5)
    s, t = rng.normal(size=(4, 30)), rng.normal(size=(4, 30))
    half = ms_kldiv.DistillationLoss(2.0).to_float(ms.float16)
    value = float(half(ms.Tensor(s, ms.float32), ms.Tensor(t, ms.float32)).asnumpy())
    np.testing.assert_allclose(value, ref.distillation_loss(s, t, 2.0), rtol=1e-5)
    plain = float(ms_kldiv.DistillationLoss(2.0)(ms.Tensor(s, ms.float32), ms.Tensor(t, ms.float32)).asnumpy())
    np.testing.assert_allclose(plain, ref.distillation_loss(s, t, 2.0), rtol=1e-5)
