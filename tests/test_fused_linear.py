"""FusedLinearDistillationLoss: the chunked head + distillation loss against the unchunked composition in float64
(values and the gradients of every input: hidden states, weights and biases of both models), in PyNative and
GRAPH_MODE, for chunk sizes that do and do not divide the rows, ignored rows, a hard + soft mix and -inf padded
vocabulary columns; a GRAPH_MODE training step; argument checks."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

from ms_kldiv.fused_linear import FusedLinearDistillationLoss, default_chunk_size

from conftest import HEAD_KERNEL_MISSING, graph_mode
from _head_checks import H_S, H_T, N, V, Net, case, central, reference_grads, reference_loss, tensors, \
    value_and_grads

@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("chunk_size", [1, 7, N, 32, None])
def test_matches_unchunked_composition(mode, chunk_size):
    c = case()
    args = (2.0, 0.0, 0.0, 1.0)
    net = Net(FusedLinearDistillationLoss(2.0, chunk_size=chunk_size))
    value, grads = value_and_grads(net, c, mode)
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
    c = case(seed=3, padded=padded)
    args = (1.5, beta, hard_weight, soft_weight)
    net = Net(FusedLinearDistillationLoss(1.5, beta=beta, hard_weight=hard_weight, soft_weight=soft_weight,
                                           chunk_size=4, backend=backend))
    assert net.loss_fn.backend == backend
    value, grads = value_and_grads(net, c, mode)
    np.testing.assert_allclose(value, reference_loss(c, *args), rtol=1e-5)
    for name, ref in reference_grads(c, *args).items():
        fin = np.isfinite(c[name])
        np.testing.assert_allclose(grads[name][fin], ref[fin], rtol=1e-4, atol=1e-4 * np.abs(ref[fin]).max(),
                                   err_msg=name)
        if name in ("bs", "bt") and padded:
            assert np.all(grads[name][~fin] == 0), f"{name}: padded columns must get no gradient"


class _Scaled(nn.Cell):
    """The loss times a constant and plus another term: the bprops get an incoming gradient other than 1."""

    def __init__(self, loss_fn, factor):
        super().__init__()
        self.loss_fn, self.factor = loss_fn, factor

    def construct(self, hs, ws, ht, wt, labels, bs, bt):
        return self.factor * self.loss_fn(hs, ws, ht, wt, labels, bs, bt) + ops.reduce_sum(hs * hs)


@pytest.mark.parametrize("backend", ["aot", "composite"])
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_gradients_scale_with_the_incoming_gradient(mode, backend):
    """The student's and the teacher's gradients are the chunk loop's times the incoming gradient (PyNative skips
    the product only when that is 1)."""
    c = case(seed=5)
    args = (2.0, 0.5, 0.4, 1.0)
    net = _Scaled(FusedLinearDistillationLoss(2.0, beta=0.5, hard_weight=0.4, chunk_size=3, backend=backend), -2.5)
    value, grads = value_and_grads(net, c, mode)
    np.testing.assert_allclose(value, -2.5 * reference_loss(c, *args) + np.sum(c["hs"] ** 2), rtol=1e-5)
    for name, ref in reference_grads(c, *args).items():
        ref = -2.5 * ref + (2 * c["hs"] if name == "hs" else 0.0)
        np.testing.assert_allclose(grads[name], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=name)


def test_all_rows_ignored_gives_zero():
    c = case(labels_ignored=range(N))
    value, grads = value_and_grads(Net(FusedLinearDistillationLoss(2.0, chunk_size=3)), c, "pynative")
    assert value == 0.0
    for name, g in grads.items():
        assert np.all(g == 0), name


def test_teacher_grad_false_and_teacher_logits():
    c = case(seed=5)
    (hs, ws, ht, wt), labels, (bs, bt) = tensors(c)
    frozen = FusedLinearDistillationLoss(2.0, chunk_size=3, teacher_grad=False)
    full = FusedLinearDistillationLoss(2.0, chunk_size=3)
    g_frozen = ms.grad(Net(frozen), grad_position=(0, 1, 2, 3))(hs, ws, ht, wt, labels, bs, bt)
    g_full = ms.grad(Net(full), grad_position=(0, 1, 2, 3))(hs, ws, ht, wt, labels, bs, bt)
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
    c = case(seed=9)
    (hs, ws, ht, wt), _, (bs, bt) = tensors(c)
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
    (dict(ignore_index=2**31 + 5), ValueError), (dict(ignore_index=2**63), ValueError),
    (dict(softcap=1e-300), ValueError), (dict(temperature=1e30), ValueError),
    (dict(chunk_size=True), TypeError), (dict(chunk_size=2.0), TypeError), (dict(chunk_bytes=2**63), ValueError),
    (dict(teacher_grad=1), TypeError),
])
def test_bad_arguments(kwargs, error):
    temperature = kwargs.pop("temperature", 1.0)
    with pytest.raises(error):
        FusedLinearDistillationLoss(temperature, **kwargs)


def test_bad_inputs_raise_before_running():
    c = case()
    (hs, ws, ht, wt), labels, (bs, bt) = tensors(c)
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
    with pytest.raises(TypeError, match="'student_bias' must be a floating Tensor of shape .* got Int32"):
        loss_fn(hs, ws, ht, wt, labels, ms.Tensor(np.zeros(V, np.int32)), bt)
    with pytest.raises(ValueError, match=r"'teacher_bias' must be a floating Tensor of shape \(13,\)"):
        loss_fn(hs, ws, ht, wt, labels, bs, bt[:5])


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("backend", ["composite", "auto"])
def test_empty_vocabulary_or_hidden_size_raise(mode, backend):
    """A head without classes (V = 0) or hidden features (H = 0): a ValueError naming the weights, at compile time in
    GRAPH_MODE (before: an uninitialised number from composite, 0 from aot, an IndexError for H = 0)."""
    rng = np.random.default_rng(0)
    labels = ms.Tensor(np.zeros(4, np.int32))
    for (v, h), match in (((0, 6), r"'student_weight' \(0, 6\) has no classes"), ((5, 0), "hidden size")):
        hs, ht = (ms.Tensor(rng.normal(size=(4, h)), ms.float32) for _ in range(2))
        ws, wt = (ms.Tensor(rng.normal(size=(v, h)), ms.float32) for _ in range(2))
        net = Net(FusedLinearDistillationLoss(backend=backend))
        with pytest.raises(ValueError, match=match):
            if mode == "graph":
                with graph_mode():
                    net(hs, ws, ht, wt, labels, None, None)
            else:
                net(hs, ws, ht, wt, labels, None, None)


def test_default_chunk_bounds_the_logits():
    """256 rows, fewer where both models' float32 logits would pass 256 MB; never more than the rows."""
    assert default_chunk_size(4096, 32000) == 256
    assert default_chunk_size(8192, 131072) == 256
    assert default_chunk_size(8192, 262144) == 128
    assert default_chunk_size(-1, 151936) * 151936 * 2 * 4 <= 256 * 2**20
    assert default_chunk_size(3, 10) == 3
    assert default_chunk_size(10, 10**9) == 1


@pytest.mark.skipif(HEAD_KERNEL_MISSING is not None, reason=str(HEAD_KERNEL_MISSING))
def test_head_kernel_chunk_rows():
    """The CPU head kernel's own rule (KLDivHeadChunkRows): both models' float32 logits within 128 MB, at least 128
    rows, at most CHUNK_ROWS, and with float32 weights never over 192 MB; a given size or budget alone otherwise."""
    from ms_kldiv.backends import get_distill_kernels
    from ms_kldiv.backends.head import head_chunk_rows
    from ms_kldiv.fused_linear import CHUNK_ROWS
    lib = get_distill_kernels("auto")[1].lib_path

    def rows(n, v, **kw):
        return head_chunk_rows(lib, n, v, CHUNK_ROWS, **kw)
    assert rows(4096, 32000) == CHUNK_ROWS == 256  # 128 MB would be 524 rows
    assert rows(8192, 131072) == 128                # 128 MB
    assert rows(8192, 151936) == 128                # the floor (128 MB is 110 rows)
    assert rows(4096, 262144) == 96                 # the ceiling: 192 MB, the floor gives way
    assert rows(4096, 262144, half_weights=True) == 128
    assert rows(4096, 2**20) == 24 and rows(4096, 2**30) == 1
    assert rows(50, 262144) == 50 and rows(0, 262144) == 1
    assert rows(4096, 262144, chunk_size=7) == 7 and rows(3, 262144, chunk_size=7) == 3
    assert rows(4096, 262144, chunk_bytes=8 * 262144 * 300) == 300  # the user's budget: no floor, cap or ceiling
    assert rows(4096, 262144, chunk_bytes=1) == 1


class _HalfHead(nn.Cell):
    def __init__(self, with_labels):
        super().__init__()
        self.loss_fn = FusedLinearDistillationLoss(2.0, chunk_size=3)
        self.with_labels = with_labels

    def construct(self, hs, ws, ht, wt, labels):
        return self.loss_fn(hs, ws, ht, wt, labels if self.with_labels else None)


@pytest.mark.parametrize("with_labels", [True, False])
@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16])
def test_half_inputs_accumulate_in_float32(dtype, mode, with_labels):
    """Half-precision hidden states and weights, with and without labels, in PyNative and compiled (ms.jit, where
    bfloat16 without labels once failed: no CPU kernel for a bfloat16 slice's gradient): the loss as in float32 of
    the same (rounded) inputs, the gradients of both models (a trainable teacher: its bprop once failed on MindSpore
    2.7's bfloat16 ZerosLike in PyNative) in the inputs' dtype and within its precision of the reference's."""
    c = case(seed=13)
    args = [ms.Tensor(c[k], ms.float32).astype(dtype) for k in ("hs", "ws", "ht", "wt")]
    held = {k: a.astype(ms.float32).asnumpy().astype(np.float64) for k, a in zip(("hs", "ws", "ht", "wt"), args)}
    grad_fn = ms.value_and_grad(_HalfHead(with_labels), grad_position=(0, 1, 2, 3))
    if mode == "graph":
        grad_fn = ms.jit(grad_fn)
    value, grads = grad_fn(*args, ms.Tensor(c["labels"], ms.int32))
    assert all(g.dtype == dtype for g in grads)
    rounded = {**c, **held, "bs": np.zeros(V), "bt": np.zeros(V)}
    ref_args = (2.0, 0.0, 0.0, 1.0, with_labels)
    np.testing.assert_allclose(float(value.asnumpy()), reference_loss(rounded, *ref_args), rtol=1e-5)
    for name, got in zip(("hs", "ws", "ht", "wt"), grads):
        ref = central(lambda a, name=name: reference_loss({**rounded, name: a}, *ref_args), rounded[name])
        np.testing.assert_allclose(got.astype(ms.float32).asnumpy(), ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max(),
                                   err_msg=name)


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


# ------------------------------------------------------------------------------------ edges (issue 36)
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_nan_in_ignored_rows_reaches_no_gradient(mode):
    """An ignored row's hidden states are never read: NaN there leaves the loss and every gradient finite and
    equal to the case without it (hard term included)."""
    c = case(seed=31, labels_ignored=(2, 6))
    args = (2.0, 0.5, 0.4, 1.0)
    poisoned = {**c, "hs": c["hs"].copy(), "ht": c["ht"].copy()}
    poisoned["hs"][2] = np.nan
    poisoned["ht"][6] = np.inf
    net = Net(FusedLinearDistillationLoss(2.0, beta=0.5, hard_weight=0.4, chunk_size=3))
    value, grads = value_and_grads(net, poisoned, mode)
    np.testing.assert_allclose(value, reference_loss(c, *args), rtol=1e-5)
    for name, ref in reference_grads(c, *args).items():
        g = grads[name]
        if name in ("hs", "ht"):  # the poisoned rows get zeros, the others their gradient
            assert np.all(g[[2, 6]] == 0), name
        np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=name)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_empty_batch_gives_zero(mode):
    c = case(seed=2, rows=0, labels_ignored=())
    value, grads = value_and_grads(Net(FusedLinearDistillationLoss(2.0, hard_weight=0.5)), c, mode)
    assert value == 0.0
    for name, g in grads.items():
        assert np.all(g == 0), name


def test_hard_labels_out_of_range():
    """PyNative raises before the loss runs; compiled code cannot raise, so the loss is NaN (not a wrong mean)."""
    c = case(seed=7)
    c["labels"][3] = V  # outside [0, V), not ignore_index
    net = Net(FusedLinearDistillationLoss(2.0, hard_weight=0.5, chunk_size=4))
    (hs, ws, ht, wt), labels, (bs, bt) = tensors(c)
    with pytest.raises(ValueError, match=r"'labels' must be in \[0, 13\)"):
        net(hs, ws, ht, wt, labels, bs, bt)
    # int64 labels that int32 would wrap into range (3) or onto ignore_index (-100)
    for wrapped in (2**32 + 3, 2**32 - 100):
        labels64 = c["labels"].astype(np.int64)
        labels64[3] = wrapped
        with pytest.raises(ValueError, match=r"'labels' must be in \[0, 13\)"):
            net(hs, ws, ht, wt, ms.Tensor(labels64), bs, bt)
        with graph_mode():
            assert np.isnan(float(net(hs, ws, ht, wt, ms.Tensor(labels64), bs, bt).asnumpy()))
    with graph_mode():
        assert np.isnan(float(net(hs, ws, ht, wt, labels, bs, bt).asnumpy()))
    # soft term only: labels only mark ignored rows, any other value counts the row
    soft = Net(FusedLinearDistillationLoss(2.0, chunk_size=4))
    assert np.isfinite(float(soft(hs, ws, ht, wt, labels, bs, bt).asnumpy()))


def test_weights_and_missing_teacher_weight_are_named():
    with pytest.raises(ValueError, match="hard_weight"):
        FusedLinearDistillationLoss(hard_weight=-0.5)
    with pytest.raises(ValueError, match="soft_weight"):
        FusedLinearDistillationLoss(soft_weight=-1.0)
    with pytest.raises(ValueError, match="chunk_size.*chunk_bytes"):
        FusedLinearDistillationLoss(chunk_size=4, chunk_bytes=2**20)
    c = case()
    (hs, ws, ht, wt), labels, _ = tensors(c)
    with pytest.raises(TypeError, match="'teacher_weight'"):
        FusedLinearDistillationLoss()(hs, ws, ht, None, labels)
    with pytest.raises(ValueError, match="'backend'"):
        FusedLinearDistillationLoss(backend="quantum")
    with pytest.raises(TypeError, match="'backend'"):
        FusedLinearDistillationLoss(backend=["auto"])


def test_chunk_bytes_sets_the_rows_per_chunk():
    assert default_chunk_size(1000, 100, chunk_bytes=8 * 100 * 7) == 7
    assert default_chunk_size(-1, 100, chunk_bytes=8 * 100 * 7) == 7  # dynamic rows: the budget alone
    c = case(seed=8)
    args = (2.0, 0.0, 0.0, 1.0)
    value, _ = value_and_grads(Net(FusedLinearDistillationLoss(2.0, chunk_bytes=8 * V * 3)), c, "graph")
    np.testing.assert_allclose(value, reference_loss(c, *args), rtol=1e-5)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("backend", ["composite", "auto"])
def test_second_order_is_nan_not_zero(mode, backend):
    """The head is first order (its gradients come from the chunk pass): differentiating them again, a
    Hessian-vector product towards the hidden states and the weight, gives NaN, not the 0 it gave before, silently;
    the first-order gradients stay those of the float64 composition."""
    c = case(seed=4)
    (hs, ws, ht, wt), labels, (bs, bt) = tensors(c)
    v = ms.Tensor(np.random.default_rng(1).normal(size=c["hs"].shape), ms.float32)
    head = FusedLinearDistillationLoss(1.5, chunk_size=2, backend=backend)

    def loss(h, w):
        return head(h, w, ht, wt, labels, bs, bt)

    def inner(h, w):
        return (ms.grad(loss, grad_position=0)(h, w) * v).sum()
    first, hvp = ms.grad(loss, grad_position=(0, 1)), ms.grad(inner, grad_position=(0, 1))
    if mode == "jit":
        first, hvp = ms.jit(first), ms.jit(hvp)
    d_h, d_w = (g.asnumpy() for g in first(hs, ws))
    want = reference_grads(c, 1.5, 0.0, 0.0, 1.0)
    np.testing.assert_allclose(d_h, want["hs"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d_w, want["ws"], rtol=1e-4, atol=1e-5)
    for g in hvp(hs, ws):
        assert np.isnan(g.asnumpy()).all()
