"""FusedLinearDistillationLoss at LLM scale, structurally: the chunk loop (one non-unrolled ops.ForiLoop, compiled in
GRAPH_MODE and in PyNative alike) gives the unchunked composition's value and all six gradients for 1, 2,
7 and 300 chunks; hundreds of chunks compile under TrainOneStepCell (an unrolled loop hit MindSpore's call-depth
limit there); dynamic row counts (set_inputs with None rows, [B, S, H] with None batch and sequence) are chunked, with
and without the hard term, forward and training, and a variable-length training loop compiles once."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

from ms_kldiv import FusedLinearDistillationLoss

from _head_checks import H_S, H_T, V, Net, case, reference_grads, reference_loss, value_and_grads
from conftest import graph_mode


@pytest.mark.parametrize("rows,chunk_size,mode", [
    pytest.param(rows, chunk, mode, id=f"{name}-{mode}")
    for mode in ("pynative", "graph")
    for rows, chunk, name in [(10, 10, "1-chunk"), (10, 5, "2-chunks"), (14, 2, "7-chunks"), (300, 1, "300-chunks")]])
def test_chunk_loop_matches_unchunked_composition(mode, rows, chunk_size):
    c = case(seed=21, rows=rows, labels_ignored=(1, rows - 1))
    args = (1.5, 0.5, 0.3, 0.8)
    net = Net(FusedLinearDistillationLoss(1.5, beta=0.5, hard_weight=0.3, soft_weight=0.8, chunk_size=chunk_size))
    value, grads = value_and_grads(net, c, mode)
    np.testing.assert_allclose(value, reference_loss(c, *args), rtol=1e-5)
    for name, ref in reference_grads(c, *args).items():
        np.testing.assert_allclose(grads[name], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=name)


class _Student(nn.Cell):
    """A student body + head trained against a teacher given as hidden states and a frozen head."""

    def __init__(self, h, v, loss_fn, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.body = nn.Dense(h, h, weight_init=ms.Tensor(np.eye(h), ms.float32), bias_init="zeros")
        self.head = nn.Dense(h, v, weight_init=ms.Tensor(rng.normal(size=(v, h)) * 0.1, ms.float32), bias_init="zeros")
        self.loss_fn = loss_fn

    def construct(self, x, teacher_hidden, teacher_weight, labels):
        return self.loss_fn(self.body(x), self.head.weight, teacher_hidden, ops.stop_gradient(teacher_weight),
                            labels, self.head.bias)


def _train(net, batches, graph):
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=0.5))
    if graph:
        with graph_mode():
            return [float(step(*b).asnumpy()) for b in batches], step
    return [float(step(*b).asnumpy()) for b in batches], step


def _batch(rng, rows, h, v, teacher_weight, lead=None):
    x = rng.normal(size=(rows, h)).astype(np.float32)
    labels = rng.integers(0, v, rows).astype(np.int32)
    labels[::5] = -100
    shape = (rows,) if lead is None else lead
    return (ms.Tensor(x.reshape(shape + (h,))), ms.Tensor(x.reshape(shape + (h,))), teacher_weight,
            ms.Tensor(labels.reshape(shape)))


def test_hundreds_of_chunks_compile_and_train_in_graph_mode():
    """512 chunks of one row: an unrolled loop would exceed MindSpore's function call depth limit (1000)."""
    rng = np.random.default_rng(3)
    h, v, rows = 8, 24, 512
    teacher_weight = ms.Tensor(rng.normal(size=(v, h)), ms.float32)
    net = _Student(h, v, FusedLinearDistillationLoss(2.0, hard_weight=0.5, chunk_size=1))
    batch = _batch(rng, rows, h, v, teacher_weight)
    losses, _ = _train(net, [batch] * 3, graph=True)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("hard_weight", [0.0, 0.5])
@pytest.mark.parametrize("lead", [None, "batch-seq"])
def test_dynamic_rows_train_and_match_static(mode, hard_weight, lead):
    """set_inputs with None rows (or None batch and sequence of [B, S, H]): several lengths through one Cell, each
    step's loss and parameters equal to a static-shape twin's; in graph mode the loop compiles once; in PyNative the
    compiled chunk loop turns dynamic at the first new row count (so it compiles twice in all)."""
    rng = np.random.default_rng(5)
    h, v = 6, 20
    teacher_weight = ms.Tensor(rng.normal(size=(v, h)), ms.float32)
    lengths = [(9,), (23,), (4,)] if lead is None else [(2, 5), (3, 7), (1, 4)]
    batches = [_batch(rng, int(np.prod(n)), h, v, teacher_weight, None if lead is None else n) for n in lengths]

    def make():
        return _Student(h, v, FusedLinearDistillationLoss(2.0, hard_weight=hard_weight, chunk_size=4), seed=1)

    dynamic = make()
    hidden = [None] if lead is None else [None, None]
    step = nn.TrainOneStepCell(dynamic, nn.SGD(dynamic.trainable_params(), learning_rate=0.5))
    step.set_inputs(ms.Tensor(shape=hidden + [h], dtype=ms.float32), ms.Tensor(shape=hidden + [h], dtype=ms.float32),
                    ms.Tensor(shape=[v, h], dtype=ms.float32), ms.Tensor(shape=hidden, dtype=ms.int32))
    static = make()
    static_step = nn.TrainOneStepCell(static, nn.SGD(static.trainable_params(), learning_rate=0.5))
    got, want = [], []
    for b in batches:
        if mode == "graph":
            with graph_mode():
                got.append(float(step(*b).asnumpy()))
        else:
            got.append(float(step(*b).asnumpy()))
        want.append(float(static_step(*b).asnumpy()))  # PyNative, static shapes
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for p, q in zip(dynamic.trainable_params(), static.trainable_params()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-5, atol=1e-7, err_msg=p.name)
    if mode == "graph":
        assert len(step.compile_cache) == 1, step.compile_cache
    else:
        loop = dynamic.loss_fn.core.student_loop_pynative.compiled_loop
        assert loop.rows == -1, loop.rows


@pytest.mark.parametrize("hard_weight", [0.0, 0.5])
def test_dynamic_rows_forward_against_reference(hard_weight):
    """Forward only, GRAPH_MODE, None rows: values of several lengths against the float64 composition."""
    net = Net(FusedLinearDistillationLoss(1.5, hard_weight=hard_weight, chunk_size=3))
    net.set_inputs(*[ms.Tensor(shape=s, dtype=ms.float32) for s in ([None, H_S], [V, H_S], [None, H_T], [V, H_T])],
                   ms.Tensor(shape=[None], dtype=ms.int32), ms.Tensor(shape=[V], dtype=ms.float32),
                   ms.Tensor(shape=[V], dtype=ms.float32))
    for rows in (7, 12, 1):
        c = case(seed=rows, rows=rows, labels_ignored=(0,) if rows > 1 else ())
        args = [ms.Tensor(c[k], ms.float32) for k in ("hs", "ws", "ht", "wt")]
        with graph_mode():
            value = float(net(*args, ms.Tensor(c["labels"], ms.int32), ms.Tensor(c["bs"], ms.float32),
                              ms.Tensor(c["bt"], ms.float32)).asnumpy())
        np.testing.assert_allclose(value, reference_loss(c, 1.5, 0.0, hard_weight, 1.0), rtol=1e-5)
