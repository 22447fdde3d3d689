"""FusedLinearDistillationLoss: the chunked head + distillation loss against the unchunked composition in float64
(values and the gradients of every input: hidden states, weights and biases of both models), in PyNative and
GRAPH_MODE, for chunk sizes that do and do not divide the rows, ignored rows, a hard + soft mix and -inf padded
vocabulary columns; a GRAPH_MODE training step; argument checks."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv.fused_linear import FusedLinearDistillationLoss, default_chunk_size

from conftest import graph_mode
from ms_kldiv.reference import distillation_loss as distillation_reference

N, H_S, H_T, V = 10, 6, 5, 13
IGNORE = -100


def _case(seed=0, padded=False, labels_ignored=(1, 4)):
    rng = np.random.default_rng(seed)
    c = dict(hs=rng.normal(size=(N, H_S)), ws=rng.normal(size=(V, H_S)) * 0.5, bs=rng.normal(size=V) * 0.1,
             ht=rng.normal(size=(N, H_T)), wt=rng.normal(size=(V, H_T)) * 0.5, bt=rng.normal(size=V) * 0.1)
    labels = rng.integers(0, V - 2 if padded else V, N)
    labels[list(labels_ignored)] = IGNORE
    c["labels"] = labels
    if padded:  # the last two vocabulary entries are padding in both models
        c["bs"][-2:] = -np.inf
        c["bt"][-2:] = -np.inf
    return c


def _log_softmax(z):
    m = np.max(np.where(np.isfinite(z), z, -np.inf), -1, keepdims=True)
    with np.errstate(invalid="ignore"):
        out = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
    return out


def reference_loss(c, temperature, beta, hard_weight, soft_weight, labels=True):
    """The unchunked composition in float64: logits of both heads, the distillation loss ('batchmean' over the
    counted rows) and the cross-entropy of the student's logits (mean over the same rows)."""
    s = c["hs"] @ c["ws"].T + c["bs"]
    t = c["ht"] @ c["wt"].T + c["bt"]
    lab = c["labels"] if labels else np.zeros(N, np.int64)
    keep = lab != IGNORE if labels else np.ones(N, bool)
    soft = distillation_reference(s, t, temperature, "sum", beta=beta, labels=lab if labels else None,
                                  ignore_index=IGNORE)
    ce = -_log_softmax(s)[np.arange(N), np.where(keep, lab, 0)]
    total = soft_weight * soft + hard_weight * np.sum(np.where(keep, ce, 0.0))
    return total / max(int(keep.sum()), 1)


def _central(f, a, h=1e-6):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        if not np.isfinite(a[i]):
            continue
        ap, am = a.copy(), a.copy()
        ap[i] += h
        am[i] -= h
        g[i] = (f(ap) - f(am)) / (2 * h)
    return g


NAMES = ("hs", "ws", "ht", "wt", "bs", "bt")


def reference_grads(c, *args):
    out = {}
    for name in NAMES:
        def f(a, name=name):
            return reference_loss({**c, name: a}, *args)
        out[name] = _central(f, c[name])
    return out


class _Net(nn.Cell):
    def __init__(self, loss_fn):
        super().__init__()
        self.loss_fn = loss_fn

    def construct(self, hs, ws, ht, wt, labels, bs, bt):
        return self.loss_fn(hs, ws, ht, wt, labels, bs, bt)


def _tensors(c, dtype=ms.float32):
    return [ms.Tensor(c[k], dtype) for k in ("hs", "ws", "ht", "wt")], ms.Tensor(c["labels"], ms.int32), \
        [ms.Tensor(c[k], dtype) for k in ("bs", "bt")]


def _value_and_grads(net, c, mode):
    (hs, ws, ht, wt), labels, (bs, bt) = _tensors(c)
    grad_fn = ms.value_and_grad(net, grad_position=(0, 1, 2, 3, 5, 6))
    if mode == "graph":
        with graph_mode():
            value, grads = grad_fn(hs, ws, ht, wt, labels, bs, bt)
    else:
        value, grads = grad_fn(hs, ws, ht, wt, labels, bs, bt)
    return float(value.asnumpy()), dict(zip(NAMES, (g.asnumpy().astype(np.float64) for g in grads)))


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("chunk_size", [1, 7, N, 32, None])
def test_matches_unchunked_composition(mode, chunk_size):
    c = _case()
    args = (2.0, 0.0, 0.0, 1.0)
    net = _Net(FusedLinearDistillationLoss(2.0, chunk_size=chunk_size))
    value, grads = _value_and_grads(net, c, mode)
    expected = reference_loss(c, *args)
    np.testing.assert_allclose(value, expected, rtol=1e-5)
    for name, ref in reference_grads(c, *args).items():
        np.testing.assert_allclose(grads[name], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=name)


@pytest.mark.parametrize("backend", ["aot", "composite"])
@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("beta,hard_weight,soft_weight,padded", [
    (0.0, 0.5, 1.0, False),    # forward KL + cross-entropy
    (0.5, 0.0, 1.0, True),     # generalized JSD, padded vocabulary (-inf bias in both heads)
    (1.0, 0.3, 0.7, False),    # reverse KL, weighted mix
])
def test_variants(mode, beta, hard_weight, soft_weight, padded, backend):
    """'aot': a chunk's loss and d(logits) from the fused distillation kernels; 'composite': MindSpore ops."""
    c = _case(seed=3, padded=padded)
    args = (1.5, beta, hard_weight, soft_weight)
    net = _Net(FusedLinearDistillationLoss(1.5, beta=beta, hard_weight=hard_weight, soft_weight=soft_weight,
                                           chunk_size=4, backend=backend))
    assert net.loss_fn.backend == backend
    value, grads = _value_and_grads(net, c, mode)
    np.testing.assert_allclose(value, reference_loss(c, *args), rtol=1e-5)
    for name, ref in reference_grads(c, *args).items():
        fin = np.isfinite(c[name])
        np.testing.assert_allclose(grads[name][fin], ref[fin], rtol=1e-4, atol=1e-4 * np.abs(ref[fin]).max(),
                                   err_msg=name)
        if name in ("bs", "bt") and padded:
            assert np.all(grads[name][~fin] == 0), f"{name}: padded columns must get no gradient"


def test_all_rows_ignored_gives_zero():
    c = _case(labels_ignored=range(N))
    value, grads = _value_and_grads(_Net(FusedLinearDistillationLoss(2.0, chunk_size=3)), c, "pynative")
    assert value == 0.0
    for name, g in grads.items():
        assert np.all(g == 0), name


def test_teacher_grad_false_and_teacher_logits():
    c = _case(seed=5)
    (hs, ws, ht, wt), labels, (bs, bt) = _tensors(c)
    frozen = FusedLinearDistillationLoss(2.0, chunk_size=3, teacher_grad=False)
    full = FusedLinearDistillationLoss(2.0, chunk_size=3)
    g_frozen = ms.grad(_Net(frozen), grad_position=(0, 1, 2, 3))(hs, ws, ht, wt, labels, bs, bt)
    g_full = ms.grad(_Net(full), grad_position=(0, 1, 2, 3))(hs, ws, ht, wt, labels, bs, bt)
    np.testing.assert_allclose(g_frozen[0].asnumpy(), g_full[0].asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(g_frozen[1].asnumpy(), g_full[1].asnumpy(), rtol=1e-6)
    assert np.all(g_frozen[2].asnumpy() == 0) and np.all(g_frozen[3].asnumpy() == 0)
    assert np.abs(g_full[3].asnumpy()).max() > 0
    # The teacher given as logits: same loss and student gradients.
    logits = ms.Tensor(c["ht"] @ c["wt"].T + c["bt"], ms.float32)

    def from_logits(h, w):
        return full.from_teacher_logits(h, w, logits, labels, bs)

    value, (dh, dw) = ms.value_and_grad(from_logits, grad_position=(0, 1))(hs, ws)
    np.testing.assert_allclose(float(value.asnumpy()), reference_loss(c, 2.0, 0.0, 0.0, 1.0), rtol=1e-5)
    np.testing.assert_allclose(dh.asnumpy(), g_full[0].asnumpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw.asnumpy(), g_full[1].asnumpy(), rtol=1e-4, atol=1e-6)


def test_three_dim_hidden_and_no_labels():
    c = _case(seed=9)
    (hs, ws, ht, wt), _, (bs, bt) = _tensors(c)
    loss_fn = FusedLinearDistillationLoss(1.0, chunk_size=4)
    value = loss_fn(ops.reshape(hs, (2, 5, H_S)), ws, ops.reshape(ht, (2, 5, H_T)), wt, None, bs, bt)
    np.testing.assert_allclose(float(value.asnumpy()), reference_loss(c, 1.0, 0.0, 0.0, 1.0, labels=False),
                               rtol=1e-5)


def test_training_step_graph_mode_loss_falls():
    rng = np.random.default_rng(11)
    n, h, v = 64, 16, 40
    teacher_head = rng.normal(size=(v, h)) * 0.8
    x_np = rng.normal(size=(n, h))
    x = ms.Tensor(x_np, ms.float32)
    teacher_logits = ms.Tensor(x_np @ teacher_head.T, ms.float32)

    class Student(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.Dense(h, h, weight_init=ms.Tensor(np.eye(h), ms.float32))
            self.head = nn.Dense(h, v, weight_init=ms.Tensor(rng.normal(size=(v, h)) * 0.1, ms.float32))
            self.loss = FusedLinearDistillationLoss(2.0, chunk_size=24)

        def construct(self, x, teacher_logits):
            return self.loss.from_teacher_logits(self.body(x), self.head.weight, teacher_logits, None, self.head.bias)

    net = Student()
    step = nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), learning_rate=0.05))
    with graph_mode():
        losses = [float(step(x, teacher_logits).asnumpy()) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("kwargs,error", [
    (dict(temperature=0.0), ValueError), (dict(temperature="2"), TypeError), (dict(backend="cuda"), ValueError), (dict(beta=1.5), ValueError),
    (dict(chunk_size=0), ValueError), (dict(ignore_index=1.5), TypeError), (dict(teacher_grad="yes"), TypeError),
])
def test_bad_arguments(kwargs, error):
    temperature = kwargs.pop("temperature", 1.0)
    with pytest.raises(error):
        FusedLinearDistillationLoss(temperature, **kwargs)


def test_bad_inputs_raise_before_running():
    c = _case()
    (hs, ws, ht, wt), labels, (bs, bt) = _tensors(c)
    loss_fn = FusedLinearDistillationLoss()
    with pytest.raises(ValueError, match="student_weight"):
        loss_fn(hs, wt, ht, wt, labels)
    with pytest.raises(ValueError, match="labels"):
        loss_fn(hs, ws, ht, wt, labels[:3])
    with pytest.raises(TypeError, match="labels"):
        loss_fn(hs, ws, ht, wt, ms.Tensor(c["labels"], ms.float32))
    with pytest.raises(ValueError, match="labels"):
        FusedLinearDistillationLoss(hard_weight=1.0)(hs, ws, ht, wt)
    with pytest.raises(TypeError):
        loss_fn(c["hs"], ws, ht, wt)


def test_default_chunk_bounds_the_logits():
    assert default_chunk_size(4096, 32000) * 32000 * 2 * 4 <= 64 * 2**20
    assert default_chunk_size(3, 10) == 3
    assert default_chunk_size(10, 10**9) == 1


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16])
def test_half_inputs_accumulate_in_float32(dtype):
    c = _case(seed=13)
    args = [ms.Tensor(c[k], ms.float32).astype(dtype) for k in ("hs", "ws", "ht", "wt")]
    held = {k: a.astype(ms.float32).asnumpy().astype(np.float64) for k, a in zip(("hs", "ws", "ht", "wt"), args)}
    loss_fn = FusedLinearDistillationLoss(2.0, chunk_size=3)
    value, grads = ms.value_and_grad(lambda *a: loss_fn(*a, ms.Tensor(c["labels"], ms.int32)),
                                     grad_position=(0, 1))(*args)
    assert grads[0].dtype == dtype and grads[1].dtype == dtype
    expected = reference_loss({**c, **held, "bs": np.zeros(V), "bt": np.zeros(V)}, 2.0, 0.0, 0.0, 1.0)
    np.testing.assert_allclose(float(value.asnumpy()), expected, rtol=1e-5)


def test_model_train_with_the_chunked_head():
    from mindspore.train import Model
    rng = np.random.default_rng(17)
    n, h, v = 48, 8, 30
    x = rng.normal(size=(n, h)).astype(np.float32)
    teacher_logits = (x @ rng.normal(size=(v, h)).T).astype(np.float32)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.head = nn.Dense(h, v, weight_init=ms.Tensor(rng.normal(size=(v, h)) * 0.1, ms.float32))
            self.kd = FusedLinearDistillationLoss(2.0, chunk_size=16)

        def construct(self, x, t):
            return self.kd.from_teacher_logits(x, self.head.weight, t, None, self.head.bias)

    net = Net()

    def loss_now():
        return float(net(ms.Tensor(x), ms.Tensor(teacher_logits)).asnumpy())
    before = loss_now()
    data = ms.dataset.NumpySlicesDataset({"x": x, "t": teacher_logits}, shuffle=False).batch(16)
    model = Model(net, optimizer=nn.Adam(net.trainable_params(), learning_rate=0.05))
    with graph_mode():
        model.train(15, data, dataset_sink_mode=False)
    assert loss_now() < 0.5 * before
