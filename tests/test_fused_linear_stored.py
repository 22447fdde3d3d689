"""FusedLinearDistillationLoss.from_teacher_topk: the chunked head against a stored teacher (top-k ids and
log-probabilities, or sampled ids and counts), on every backend with stored-teacher kernels, in PyNative and
GRAPH_MODE, static and dynamic row counts: the value against the float64 definition on the full logits
(ms_kldiv.reference.sparse_distillation_loss 'tokenmean' + the hard term's cross-entropy) and the gradients of the
hidden states, weight and bias against the chain rule of that definition's central differences."""
import functools

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_kldiv
from ms_kldiv import reference as ref

from conftest import central_differences, graph_mode

SPARSE_BACKENDS = tuple(r["name"] for r in ms_kldiv.backend_info(op="sparse_distillation") if r["available"])
CASES = (("tail", 0.3, 1.5), ("renormalize", 0.0, 1.0), ("sampled", 0.0, 1.0))


class Head(nn.Cell):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def construct(self, h, w, b, ids, values, labels):
        return self.head.from_teacher_topk(h, w, ids, values, labels, b)


def reference(h, w, b, ids, values, labels, mode, temperature, teacher_temperature, beta, hard_weight):
    """(loss, d hidden, d weight, d bias) in float64 from the logits h @ w^T + b."""
    def loss_of(logits):
        soft = ref.sparse_distillation_loss(logits, ids, values, mode, temperature, teacher_temperature, beta,
                                            "tokenmean", labels)
        keep = labels != -100
        log_p = ref.log_softmax(logits)
        hard = -np.take_along_axis(log_p, np.where(keep, labels, 0)[:, None], -1)[:, 0]
        return soft + hard_weight * np.sum(np.where(keep, hard, 0.0)) / max(keep.sum(), 1)

    logits = h @ w.T + b
    d_logits = central_differences(loss_of, logits)
    return loss_of(logits), d_logits @ w, d_logits.T @ h, d_logits.sum(0)


def teacher(rng, rows, vocab, k, mode):
    lt = ref.log_softmax(rng.normal(size=(rows, vocab)) * 2)
    if mode == "sampled":
        ids = np.full((rows, k), -1, np.int32)
        counts = np.zeros((rows, k), np.int32)
        for r in range(rows):
            u, c = np.unique(rng.choice(vocab, size=8, p=np.exp(lt[r])), return_counts=True)
            ids[r, :len(u)], counts[r, :len(u)] = u[:k], c[:k]
        return ids, counts
    ids = np.argsort(-lt, -1)[:, :k].astype(np.int32)
    ids[1, -2:] = -1  # padding
    values = np.take_along_axis(lt, np.maximum(ids, 0), -1).astype(np.float32)
    return ids, np.where(ids >= 0, values, 0.0).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _case(mode, beta, teacher_temperature):
    """The inputs of one stored-teacher case and their float64 reference (the central differences take seconds:
    computed once per case for its backends, modes and chunk sizes)."""
    rng = np.random.default_rng(3)
    rows, hidden, vocab, k = 21, 6, 33, 8
    h = rng.normal(size=(rows, hidden))
    w = rng.normal(size=(vocab, hidden)) * 0.5
    b = rng.normal(size=vocab) * 0.1
    ids, values = teacher(rng, rows, vocab, k, mode)
    labels = rng.integers(0, vocab, size=rows).astype(np.int32)
    labels[5] = -100
    hr, wr, br = (a.astype(np.float32).astype(np.float64) for a in (h, w, b))
    expected = reference(hr, wr, br, ids, values.astype(np.float64), labels, mode, 2.0, teacher_temperature, beta,
                         0.5)
    return (h, w, b, ids, values, labels), expected


@pytest.mark.parametrize("chunk_size", (None, 1, 4))
@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
@pytest.mark.parametrize("mode,beta,teacher_temperature", CASES)
def test_head_from_stored_teacher(backend, exec_mode, chunk_size, mode, beta, teacher_temperature):
    """One chunk, 21 chunks of 1 row (the loop, not an unrolled graph) and 6 chunks of 4 with an overhang; an
    ignored row, padding ids, the hard term."""
    (h, w, b, ids, values, labels), expected = _case(mode, beta, teacher_temperature)
    head = ms_kldiv.FusedLinearDistillationLoss(2.0, beta=beta, hard_weight=0.5, chunk_size=chunk_size,
                                                backend=backend, stored_mode=mode,
                                                teacher_temperature=teacher_temperature)
    fn = ms.value_and_grad(Head(head), grad_position=(0, 1, 2))
    args = [Tensor(a, ms.float32) for a in (h, w, b)] + [Tensor(ids), Tensor(values), Tensor(labels)]
    if exec_mode == "graph":
        with graph_mode():
            value, grads = fn(*args)
    else:
        value, grads = fn(*args)
    np.testing.assert_allclose(float(value), expected[0], rtol=2e-6)
    for got, exp, name in zip(grads, expected[1:], ("hidden", "weight", "bias")):
        np.testing.assert_allclose(got.asnumpy(), exp, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_head_dynamic_rows_train_step(backend):
    """GRAPH_MODE TrainOneStepCell with unknown [B, S] dims (set_inputs): two batch shapes through one graph, each
    step's updated weight equals an SGD step on the reference gradient."""
    rng = np.random.default_rng(4)
    hidden, vocab, k = 5, 17, 4

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(hidden, vocab, weight_init=Tensor(rng.normal(size=(vocab, hidden)) * 0.5,
                                                                    ms.float32))
            self.head = ms_kldiv.FusedLinearDistillationLoss(1.0, chunk_size=3, backend=backend, stored_mode="tail")

        def construct(self, h, ids, values, labels):
            return self.head.from_teacher_topk(h, self.dense.weight, ids, values, labels, self.dense.bias)

    net = Net()
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=0.1))
    step.set_inputs(Tensor(shape=[None, None, hidden], dtype=ms.float32), Tensor(shape=[None, None, k], dtype=ms.int32),
                    Tensor(shape=[None, None, k], dtype=ms.float32), Tensor(shape=[None, None], dtype=ms.int32))
    for batch, seq in ((2, 3), (1, 7)):
        h = rng.normal(size=(batch, seq, hidden))
        ids, values = teacher(rng, batch * seq, vocab, k, "tail")
        labels = np.ones((batch, seq), np.int32)
        w0, b0 = net.dense.weight.asnumpy().astype(np.float64), net.dense.bias.asnumpy().astype(np.float64)
        with graph_mode():
            loss = step(Tensor(h, ms.float32), Tensor(ids.reshape(batch, seq, k)),
                        Tensor(values.reshape(batch, seq, k)), Tensor(labels))
        hr = h.reshape(-1, hidden).astype(np.float32).astype(np.float64)
        expected = reference(hr, w0, b0, ids, values.astype(np.float64), labels.reshape(-1), "tail", 1.0, 1.0, 0.0,
                             0.0)
        np.testing.assert_allclose(float(loss), expected[0], rtol=2e-6)
        np.testing.assert_allclose(net.dense.weight.asnumpy(), w0 - 0.1 * expected[2], atol=2e-6)
        np.testing.assert_allclose(net.dense.bias.asnumpy(), b0 - 0.1 * expected[3], atol=2e-6)


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_head_pynative_row_counts_change(backend):
    """PyNative calls with three row counts: the compiled chunk loop turns dynamic at the second, with the stored
    teacher's ids and values (in the teacher weight's place) dynamic too (the third count was refused by
    set_inputs), each value against the reference."""
    rng = np.random.default_rng(6)
    hidden, vocab, k = 6, 19, 4
    w, b = rng.normal(size=(vocab, hidden)) * 0.5, rng.normal(size=vocab) * 0.1
    head = ms_kldiv.FusedLinearDistillationLoss(2.0, chunk_size=4, backend=backend, stored_mode="tail")
    for rows in (9, 14, 6, 14):
        h = rng.normal(size=(rows, hidden))
        ids, values = teacher(rng, rows, vocab, k, "tail")
        labels = np.ones(rows, np.int32)
        loss = head.from_teacher_topk(Tensor(h, ms.float32), Tensor(w, ms.float32), Tensor(ids), Tensor(values),
                                      Tensor(labels), Tensor(b, ms.float32))
        f64 = lambda a: a.astype(np.float32).astype(np.float64)
        expected = ref.sparse_distillation_loss(f64(h) @ f64(w).T + f64(b), ids, values.astype(np.float64), "tail",
                                                2.0, 1.0, 0.0, "tokenmean", labels)
        np.testing.assert_allclose(float(loss), expected, rtol=2e-6, err_msg=str(rows))


def test_head_stored_errors():
    h, w = Tensor(np.zeros((3, 4), np.float32)), Tensor(np.zeros((6, 4), np.float32))
    ids, values = Tensor(np.zeros((3, 2), np.int32) + [[0, 1]]), Tensor(np.full((3, 2), -1.0, np.float32))
    head = ms_kldiv.FusedLinearDistillationLoss(beta=1.0, stored_mode="renormalize")
    with pytest.raises(ValueError, match="mode='tail'"):
        head.from_teacher_topk(h, w, ids, values)
    head = ms_kldiv.FusedLinearDistillationLoss()
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        head.from_teacher_topk(h, w, Tensor(np.full((3, 2), 6, np.int32)), values)
    with pytest.raises(ValueError, match="'teacher_ids'"):
        head.from_teacher_topk(h, w, Tensor(np.zeros((2, 2), np.int32)), values)
    with pytest.raises(TypeError, match="'teacher_values'"):
        head.from_teacher_topk(h, w, ids, Tensor(np.zeros((3, 2), np.int32)))


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_head_stored_errors_read_the_same_in_graph_mode(mode):
    """A stored-teacher option error kept by the constructor and the ids' / values' checks raise the PyNative
    exception and message from a GRAPH_MODE Cell too (before: an opaque pybind cast error, and messages re-quoted
    into a compiled raise)."""
    h, w = Tensor(np.zeros((3, 4), np.float32)), Tensor(np.zeros((6, 4), np.float32))
    ids, values = Tensor(np.zeros((3, 2), np.int32) + [[0, 1]]), Tensor(np.full((3, 2), -1.0, np.float32))
    cases = ((dict(stored_mode="x"), ids, ValueError,
              r"^For 'FusedLinearDistillationLoss', 'mode' must be one of \['renormalize', 'tail', 'sampled'\]"),
             (dict(divergence="tvd"), ids, ValueError, r"^For 'FusedLinearDistillationLoss.from_teacher_topk', a "),
             (dict(), Tensor(np.zeros((3, 2), np.float32)), TypeError,
              r"^For 'FusedLinearDistillationLoss.from_teacher_topk', 'teacher_ids' must have dtype int32 or int64"))
    for options, teacher_ids, error, match in cases:
        net = Head(ms_kldiv.FusedLinearDistillationLoss(**options))
        with pytest.raises(error, match=match):
            if mode == "graph":
                with graph_mode():
                    net(h, w, Tensor(np.zeros(6, np.float32)), teacher_ids, values, Tensor(np.zeros(3, np.int32)))
            else:
                net(h, w, Tensor(np.zeros(6, np.float32)), teacher_ids, values, Tensor(np.zeros(3, np.int32)))
