"""FusedLinearDistillationLoss at LLM scale, structurally, in both implementations of a pass (``head_impl``: the
head kernel of the CPU library, and the chunk loop that other devices run): the chunk loop (one non-unrolled
ops.ForiLoop, compiled in GRAPH_MODE and in PyNative alike) and the kernel give the unchunked composition's value
and all six gradients for 1, 2, 7 and 300 chunks; hundreds of chunks compile under TrainOneStepCell (an unrolled loop hit MindSpore's call-depth
limit there); dynamic row counts (set_inputs with None rows, [B, S, H] with None batch and sequence) are chunked, with
and without the hard term, forward and training, and a variable-length training loop compiles once."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

from ms_kldiv import FusedLinearDistillationLoss

from _head_checks import H_S, H_T, V, Net, case, log_softmax, reference_grads, reference_loss, value_and_grads
from conftest import graph_mode


@pytest.mark.parametrize("rows,chunk_size,mode", [
    pytest.param(rows, chunk, mode, id=f"{name}-{mode}")
    for mode in ("pynative", "graph")
    for rows, chunk, name in [(10, 10, "1-chunk"), (10, 5, "2-chunks"), (14, 2, "7-chunks"), (300, 1, "300-chunks")]])
def test_chunk_loop_matches_unchunked_composition(mode, rows, chunk_size, head_impl):
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


def test_hundreds_of_chunks_compile_and_train_in_graph_mode(head_impl):
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
def test_dynamic_rows_train_and_match_static(mode, hard_weight, lead, head_impl):
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
    elif head_impl == "loop":
        loop = dynamic.loss_fn.core.student_loop_pynative.compiled_loop
        assert [bool(rows) for _, rows in loop.signatures.values()] == [True], loop.signatures


@pytest.mark.parametrize("hard_weight", [0.0, 0.5])
def test_dynamic_rows_forward_against_reference(hard_weight, head_impl):
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


def test_pynative_calls_change_rows_bias_and_dtype(head_impl):
    """PyNative, one loss object: the rows change, then the biases go (another graph: the dynamic inputs left from
    the first crashed MindSpore), the rows change again, the biases return, the hidden states turn float16 (a
    TypeError before): each value against the float64 composition."""
    loss_fn = FusedLinearDistillationLoss(1.5, hard_weight=0.5, chunk_size=3)
    calls = ((9, True, np.float32), (14, True, np.float32), (6, False, np.float32), (11, False, np.float32),
             (5, True, np.float32), (10, True, np.float16), (7, True, np.float16))
    for rows, bias, dtype in calls:
        c = case(seed=rows, rows=rows, labels_ignored=(0,))
        c["hs"], c["ht"] = c["hs"].astype(dtype).astype(np.float64), c["ht"].astype(dtype).astype(np.float64)
        if not bias:
            c["bs"], c["bt"] = np.zeros(V), np.zeros(V)
        biases = (ms.Tensor(c["bs"], ms.float32), ms.Tensor(c["bt"], ms.float32)) if bias else ()
        value = loss_fn(ms.Tensor(c["hs"].astype(dtype)), ms.Tensor(c["ws"], ms.float32),
                        ms.Tensor(c["ht"].astype(dtype)), ms.Tensor(c["wt"], ms.float32),
                        ms.Tensor(c["labels"], ms.int32), *biases)
        np.testing.assert_allclose(float(value.asnumpy()), reference_loss(c, 1.5, 0.0, 0.5, 1.0), rtol=1e-5,
                                   err_msg=str((rows, bias, dtype)))


def _view(a):
    """``a`` as a non-contiguous MindSpore float32 view: the leading columns of a wider tensor (2-D), every other
    element (1-D)."""
    if a.ndim == 1:
        return ms.Tensor(np.repeat(a, 2), ms.float32)[::2]
    return ms.Tensor(np.concatenate([a, np.full_like(a[:, :3], 7.0)], -1), ms.float32)[:, :a.shape[1]]


class _HeadViews(nn.Cell):
    """The head called three ways on its inputs as views; a Cell, so that GRAPH_MODE compiles the same calls."""

    def __init__(self, loss_fn):
        super().__init__()
        self.loss_fn = loss_fn

    def construct(self, hs, ws, ht, wt, labels, bs, bt, teacher_logits, ids, values):
        return (self.loss_fn(hs, ws, ht, wt, labels, bs, bt),
                self.loss_fn.from_teacher_logits(hs, ws, teacher_logits, labels, bs),
                self.loss_fn.from_teacher_topk(hs, ws, ids, values, labels, bs))


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_views_as_the_row_count_changes(mode, head_impl):
    """One loss object, its inputs given as views (the student's head as a tied embedding's transpose, columns of
    wider tensors, strided biases, a padded teacher vocabulary sliced to the student's, top-k ids and values sliced
    from wider stores) while the row count changes. Once PyNative had compiled its pass again with the rows dynamic,
    it read such inputs as if contiguous (5-30% off, NaN with the top-k ids). Each value against float64."""
    from ms_kldiv import reference as ref
    net = _HeadViews(FusedLinearDistillationLoss(1.5, hard_weight=0.5, chunk_size=3))
    for rows in (9, 14, 6, 14):
        c = case(seed=rows, rows=rows, labels_ignored=(0,))
        c = {k: (v.astype(np.float32).astype(np.float64) if k != "labels" else v) for k, v in c.items()}
        t = c["ht"] @ c["wt"].T + c["bt"]
        k = 5
        ids = np.argsort(-t, -1)[:, :k].astype(np.int32)
        values = np.take_along_axis(ref.log_softmax(t), ids, -1).astype(np.float32)
        tied = ms.Tensor(np.ascontiguousarray(c["ws"].T), ms.float32).T
        labels = ms.Tensor(c["labels"], ms.int32)
        wide_ids = ms.Tensor(np.concatenate([ids, ids[:, :2]], -1))[:, :k]
        args = (_view(c["hs"]), tied, _view(c["ht"]), _view(c["wt"]), labels, _view(c["bs"]), _view(c["bt"]),
                _view(t), wide_ids, _view(values.astype(np.float64)))
        if mode == "graph":
            with graph_mode():
                dense, logits, topk = net(*args)
        else:
            dense, logits, topk = net(*args)
        want = reference_loss(c, 1.5, 0.0, 0.5, 1.0)
        np.testing.assert_allclose(float(dense.asnumpy()), want, rtol=1e-5, err_msg=f"dense, {rows} rows")
        np.testing.assert_allclose(float(logits.asnumpy()), want, rtol=1e-5, err_msg=f"logits, {rows} rows")
        s = c["hs"] @ c["ws"].T + c["bs"]
        keep = c["labels"] != -100
        hard = -np.take_along_axis(log_softmax(s), np.where(keep, c["labels"], 0)[:, None], -1)[:, 0]
        stored = ref.sparse_distillation_loss(s, ids, values.astype(np.float64), "tail", 1.5, 1.0, 0.0, "tokenmean",
                                              c["labels"]) + 0.5 * np.sum(np.where(keep, hard, 0.0)) / keep.sum()
        np.testing.assert_allclose(float(topk.asnumpy()), stored, rtol=1e-5, err_msg=f"top-k, {rows} rows")


@pytest.mark.parametrize("backend", ["composite", "auto"])
def test_graph_train_step_with_trainable_teacher(backend, head_impl):
    """GRAPH_MODE TrainOneStepCell over both heads' parameters (mutual learning): the step's loss and both heads'
    SGD updates against the float64 composition, whatever the learning rate (the student's pass read teacher
    weights the optimizer had already updated: the loss changed with the rate)."""
    c = case(seed=31, rows=12, labels_ignored=(2,))
    args = (2.0, 0.0, 0.5, 1.0)
    expected_loss, expected = reference_loss(c, *args), reference_grads(c, *args)

    class Both(nn.Cell):
        def __init__(self):
            super().__init__()
            self.params = ms.ParameterTuple(ms.Parameter(ms.Tensor(c[k], ms.float32), name=k)
                                            for k in ("ws", "bs", "wt", "bt"))
            self.kd = FusedLinearDistillationLoss(2.0, hard_weight=0.5, chunk_size=5, backend=backend)

        def construct(self, hs, ht, labels):
            ws, bs, wt, bt = self.params
            return self.kd(hs, ws, ht, wt, labels, bs, bt)

    for lr in (1.0, 10.0):
        net = Both()
        step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=lr))
        with graph_mode():
            loss = step(ms.Tensor(c["hs"], ms.float32), ms.Tensor(c["ht"], ms.float32),
                        ms.Tensor(c["labels"], ms.int32))
        np.testing.assert_allclose(float(loss.asnumpy()), expected_loss, rtol=1e-5, err_msg=str(lr))
        for p, name in zip(net.params, ("ws", "bs", "wt", "bt")):
            grad = (c[name].astype(np.float32) - p.asnumpy()) / lr
            ref = expected[name]
            np.testing.assert_allclose(grad, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max(), err_msg=f"{name} {lr}")


@pytest.mark.parametrize("mode,dtype", [("graph", ms.float32), ("jit", ms.float32), ("graph", ms.float16)],
                         ids=["graph", "jit", "graph-float16"])
def test_trainable_teacher_sees_the_student_weights_of_the_forward(mode, dtype, head_impl):
    """A student body and nn.Dense head, a trainable teacher head, SGD in one compiled step (a GRAPH_MODE
    TrainOneStepCell, or value_and_grad and the optimizer under ms.jit): the teacher's gradients, computed in the
    backward, used the student's head weight after the optimizer had updated it (teacher update 1e-2 off; the
    student's was right). Both updates against the float64 composition on the forward's weights."""
    c = case(seed=33, rows=12, labels_ignored=(2,))
    rng = np.random.default_rng(34)
    x, body = rng.normal(size=(12, H_S)), rng.normal(size=(H_S, H_S)) * 0.5
    c["hs"] = np.tanh(x @ body.T)
    if dtype != ms.float32:  # the heads' parameters as float16 holds them
        for name in ("ws", "bs", "wt", "bt"):
            c[name] = c[name].astype(np.float16).astype(np.float64)
    args, lr = (2.0, 0.0, 0.0, 1.0), 0.5
    expected = reference_grads(c, *args)

    class Mutual(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.Dense(H_S, H_S, weight_init=ms.Tensor(body, ms.float32), has_bias=False)
            self.head = nn.Dense(H_S, V, weight_init=ms.Tensor(c["ws"], dtype), bias_init=ms.Tensor(c["bs"], dtype),
                                 dtype=dtype)
            self.wt = ms.Parameter(ms.Tensor(c["wt"], dtype), name="wt")
            self.bt = ms.Parameter(ms.Tensor(c["bt"], dtype), name="bt")
            self.kd = FusedLinearDistillationLoss(2.0, chunk_size=5)

        def construct(self, x, ht, labels):
            return self.kd(ops.tanh(self.body(x)), self.head.weight, ht, self.wt, labels, self.head.bias, self.bt)

    net = Mutual()
    params = net.trainable_params()
    inputs = (ms.Tensor(x, ms.float32), ms.Tensor(c["ht"], dtype), ms.Tensor(c["labels"], ms.int32))
    if mode == "graph":
        with graph_mode():
            nn.TrainOneStepCell(net, nn.SGD(params, learning_rate=lr))(*inputs)
    else:
        grad_fn, optimizer = ms.value_and_grad(net, None, params), nn.SGD(params, learning_rate=lr)

        @ms.jit
        def step(*args):
            loss, grads = grad_fn(*args)
            optimizer(grads)
            return loss

        step(*inputs)
    for p, name in ((net.head.weight, "ws"), (net.head.bias, "bs"), (net.wt, "wt"), (net.bt, "bt")):
        grad = (c[name] - p.astype(ms.float32).asnumpy()) / lr
        ref = expected[name]
        if dtype != ms.float32:  # the weights and their update in float16 (2^-11 relative)
            np.testing.assert_allclose(grad, ref, atol=2 * 2.0 ** -11 * np.abs(c[name]).max() / lr, err_msg=name)
        else:
            np.testing.assert_allclose(grad, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max(), err_msg=name)


def _analytic_head(hs, ws, bs, ht, wt, bt, labels, temperature, hard_weight):
    """Forward KL at ``temperature`` plus ``hard_weight`` x cross-entropy, 'tokenmean' over the counted rows, in
    float64 with its gradients in closed form: d(soft)/d(s) = T (softmax(s/T) - softmax(t/T)), d(ce)/d(s) =
    softmax(s) - onehot."""
    s, t = hs @ ws.T + bs, ht @ wt.T + bt
    keep = labels != -100
    count = max(int(keep.sum()), 1)
    ls, lt = log_softmax(s / temperature), log_softmax(t / temperature)
    soft = temperature ** 2 * np.sum(np.exp(lt) * (lt - ls), -1)
    l1 = log_softmax(s)
    lab = np.where(keep, labels, 0)
    ce = -l1[np.arange(len(s)), lab]
    loss = np.sum(np.where(keep, soft + hard_weight * ce, 0.0)) / count
    onehot = np.eye(s.shape[1])[lab]
    d = (temperature * (np.exp(ls) - np.exp(lt)) + hard_weight * (np.exp(l1) - onehot)) * keep[:, None] / count
    return loss, {"hs": d @ ws, "ws": d.T @ hs, "bs": d.sum(0)}


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("dtype", [ms.float32, ms.bfloat16, ms.float16], ids=["float32", "bfloat16", "float16"])
def test_head_at_block_and_thread_boundaries(mode, dtype, head_impl):
    """Widths that cross the head kernel's internal boundaries (several converted weight blocks of a half-precision
    weight, the products split into column ranges over the threads, a last partial chunk, V not a multiple of 16),
    at a small size: value and the student's gradients against float64 closed forms on the inputs as rounded to
    ``dtype``."""
    rng = np.random.default_rng(11)
    n, h, v = 45, 136, 1203
    raw = dict(hs=rng.normal(size=(n, h)), ws=rng.normal(size=(v, h)) * 0.1, bs=rng.normal(size=v) * 0.1,
               ht=rng.normal(size=(n, h)), wt=rng.normal(size=(v, h)) * 0.1, bt=rng.normal(size=v) * 0.1)
    tensors_ = {k: ms.Tensor(a, dtype) for k, a in raw.items()}
    rounded = {k: t.astype(ms.float32).asnumpy().astype(np.float64) for k, t in tensors_.items()}
    labels = rng.integers(0, v, n)
    labels[[0, 17, 44]] = -100
    net = Net(FusedLinearDistillationLoss(2.0, hard_weight=0.5, chunk_size=16, teacher_grad=False))
    args = (tensors_["hs"], tensors_["ws"], tensors_["ht"], tensors_["wt"], ms.Tensor(labels, ms.int32),
            tensors_["bs"], tensors_["bt"])
    grad_fn = ms.value_and_grad(net, grad_position=(0, 1, 5))
    if mode == "graph":
        with graph_mode():
            value, grads = grad_fn(*args)
    else:
        value, grads = grad_fn(*args)
    want, want_grads = _analytic_head(rounded["hs"], rounded["ws"], rounded["bs"], rounded["ht"], rounded["wt"],
                                      rounded["bt"], labels, 2.0, 0.5)
    np.testing.assert_allclose(float(value.asnumpy()), want, rtol=2e-5)
    # the gradients come back in the inputs' dtype: within its rounding of the float32 arithmetic's result
    tol = {ms.float32: 1e-4, ms.bfloat16: 1e-2, ms.float16: 2e-3}[dtype]
    for name, got in zip(("hs", "ws", "bs"), grads):
        ref = want_grads[name]
        np.testing.assert_allclose(got.astype(ms.float32).asnumpy(), ref, rtol=tol, atol=tol * np.abs(ref).max(),
                                   err_msg=name)
