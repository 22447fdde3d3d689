"""sparse_distillation_loss / SparseDistillationLoss (a stored top-k or sampled teacher) on every backend that has
stored-teacher kernels, in PyNative, GRAPH_MODE (the Cell) and under ms.jit (the functional): values of every
reduction against the float64 definition (ms_kldiv.reference.sparse_*), student gradients against its central
differences, the dense loss when the ids cover the vocabulary, the sampled estimator's unbiasedness, the edges
(padding ids, ignored rows, -inf and huge logits, an almost empty tail, empty batches), dynamic row counts and the
errors."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

import ms_kldiv
from ms_kldiv import reference as ref

from conftest import assert_close, central_differences, graph_mode, to_numpy

SPARSE_BACKENDS = tuple(r["name"] for r in ms_kldiv.backend_info(op="sparse_distillation") if r["available"])
REDUCTIONS = ("none", "sum", "batchmean", "tokenmean")
EXEC_MODES = ("pynative", "graph", "jit")
# (mode, beta) pairs with a finite loss
DIVERGENCES = (("renormalize", 0.0), ("renormalize", 0.5), ("tail", 0.0), ("tail", 0.3), ("tail", 1.0))
TOL = {ms.float32: 2e-5, ms.bfloat16: 2e-2, ms.float16: 4e-3}


class Loss(nn.Cell):
    def __init__(self, kind, mode, temperature, teacher_temperature, beta, reduction, backend):
        super().__init__()
        self.kind, self.mode, self.reduction, self.backend = kind, mode, reduction, backend
        self.temperature, self.teacher_temperature, self.beta = temperature, teacher_temperature, beta
        self.cell = ms_kldiv.SparseDistillationLoss(mode, temperature, reduction, teacher_temperature=teacher_temperature,
                                                    beta=beta, backend=backend)

    def construct(self, s, ids, values, labels):
        if self.kind == "cell":
            return self.cell(s, ids, values, labels)
        return ms_kldiv.sparse_distillation_loss(s, ids, values, mode=self.mode, temperature=self.temperature,
                                                 teacher_temperature=self.teacher_temperature, beta=self.beta,
                                                 reduction=self.reduction, labels=labels, backend=self.backend)


class Weighted(nn.Cell):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, s, ids, values, labels, w):
        # summed in float32: MindSpore's CPU ReduceSum has no bfloat16
        return (ops.cast(self.loss(s, ids, values, labels), ms.float32) * w).sum()


class AllReductions(nn.Cell):
    """(value, d_student) of every reduction in one graph; w weighs 'none' (the leading shape)."""

    def __init__(self, kind, mode, temperature, teacher_temperature, beta, backend):
        super().__init__()
        self.losses = nn.CellList([Loss(kind, mode, temperature, teacher_temperature, beta, r, backend)
                                   for r in REDUCTIONS])
        self.weighted = nn.CellList([Weighted(loss) for loss in self.losses])
        self.is_none = tuple(r == "none" for r in REDUCTIONS)

    def construct(self, s, ids, values, labels, w_none):
        res = ()
        for i in range(len(REDUCTIONS)):
            w = w_none if self.is_none[i] else 1.0
            res = res + ((self.losses[i](s, ids, values, labels),
                          ms.grad(self.weighted[i])(s, ids, values, labels, w)),)
        return res


_CELLS = {}


def run_all(exec_mode, backend, s, ids, values, labels, w_none, mode="tail", temperature=2.0,
            teacher_temperature=1.0, beta=0.0, dtype=ms.float32, specs=None, key=None):
    full_key = (exec_mode, backend, mode, temperature, teacher_temperature, beta, key)
    if full_key not in _CELLS:
        cell = AllReductions("functional" if exec_mode != "graph" else "cell", mode, temperature,
                             teacher_temperature, beta, backend)
        if specs is not None:
            cell.set_inputs(*specs)
        _CELLS[full_key] = ms.jit(cell) if exec_mode == "jit" else cell
    cell = _CELLS[full_key]
    vdtype = ms.int32 if values.dtype.kind == "i" else ms.float32
    args = (Tensor(s, dtype), Tensor(ids, ms.int32), Tensor(values, vdtype), Tensor(labels, ms.int32),
            Tensor(w_none, ms.float32))
    if exec_mode == "graph":
        with graph_mode():
            return dict(zip(REDUCTIONS, cell(*args)))
    return dict(zip(REDUCTIONS, cell(*args)))


def topk_teacher(rng, shape, vocab, k, scale=3.0):
    """(teacher log-probabilities at T0 = 1 [..., V], ids [..., k] of its top-k, their log-probabilities)."""
    lt = ref.log_softmax(rng.normal(size=shape + (vocab,)) * scale)
    ids = np.argsort(-lt, -1)[..., :k].astype(np.int32)
    # values as the loss receives them (float32), so that only the loss's own error is measured
    return lt, ids, np.take_along_axis(lt, ids, -1).astype(np.float32).astype(np.float64)


def rounded(a, dtype):
    return to_numpy(Tensor(a, dtype))


def check(res, s, ids, values, labels, w_none, mode, temperature, teacher_temperature, beta, dtype, what=""):
    """Every reduction's value and student gradient against the reference and its central differences."""
    sr = rounded(s, dtype)
    for red in REDUCTIONS:
        def f(x, red=red):
            out = ref.sparse_distillation_loss(x, ids, values, mode, temperature, teacher_temperature, beta, red,
                                               labels)
            return np.sum(out * (w_none if red == "none" else 1.0))
        value, grad = res[red]
        expected = ref.sparse_distillation_loss(sr, ids, values, mode, temperature, teacher_temperature, beta, red,
                                                labels)
        assert value.dtype == dtype and value.shape == expected.shape, (red, value.dtype, value.shape)
        assert_close(to_numpy(value), expected, dtype, np.abs(expected), f"{what} {red} value")
        g_expected = central_differences(f, sr)
        assert grad.shape == s.shape and grad.dtype == dtype
        scale = np.max(np.abs(g_expected)) + 1e-3
        err = np.max(np.abs(to_numpy(grad) - g_expected)) / scale
        assert err < max(TOL[dtype], 1e-5) * 50, (what, red, err)


@pytest.mark.parametrize("exec_mode", EXEC_MODES)
@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
@pytest.mark.parametrize("mode,beta", DIVERGENCES)
def test_values_and_gradients(backend, exec_mode, mode, beta):
    """[B, S, V] logits, K = 5 ids with padding, an ignored row holding NaN, T = 2 over stored T0 = 1.5."""
    rng = np.random.default_rng(7)
    shape, vocab = (2, 3), 37
    s = rng.normal(size=shape + (vocab,)) * 2
    _, ids, values = topk_teacher(rng, shape, vocab, 5)
    ids[0, 1, 3:] = -1
    values[0, 1, 3:] = 0.0
    labels = np.array([[1, -100, 2], [3, 4, 5]])
    s[0, 1, :4] = np.nan  # an ignored row: nothing of it may reach a value or a gradient
    w_none = rng.uniform(0.5, 1.5, size=shape)
    res = run_all(exec_mode, backend, s, ids, values, labels, w_none, mode, 2.0, 1.5, beta)
    check(res, s, ids, values, labels, w_none, mode, 2.0, 1.5, beta, ms.float32, f"{backend} {exec_mode}")
    assert np.all(to_numpy(res["sum"][1])[0, 1] == 0.0)


@pytest.mark.parametrize("exec_mode", EXEC_MODES)
@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
@pytest.mark.parametrize("temperature,gap", [(1.0, 110.0), (0.5, 55.0), (1.0, 60.0), (1.0, 40.0)],
                         ids=["T1-gap110", "T0.5-gap55", "T1-gap60", "T1-gap40"])
def test_confident_student_keeps_the_teacher_tail(backend, exec_mode, temperature, gap):
    """A student whose classes off the ids lie ``gap`` below them: their exponentials relative to the row's
    maximum underflow float32 (flushed to zero in compiled code from gap / T ~ 87), and the CPU and AscendC kernels
    read the tail as none, dropping the teacher's tail mass (loss and gradient 0 where the definition gives ~gap / 2).
    Rows of V = 37 and 300 (the vector loops' masked tails), ids with padding, every reduction, both ways of JSD."""
    rng = np.random.default_rng(17)
    for vocab, beta in ((37, 0.0), (300, 0.5)):
        rows, k = 3, 5
        s = np.full((rows, vocab), -gap) + rng.uniform(-3.0, 0.0, size=(rows, vocab))
        ids = np.stack([rng.permutation(vocab)[:k] for _ in range(rows)]).astype(np.int32)
        ids[1, -1] = -1  # padding
        np.put_along_axis(s, np.maximum(ids, 0), rng.uniform(-1.0, 1.0, size=(rows, k)), -1)
        # the teacher keeps 0.6 of its mass on the ids, 0.4 in its tail
        values = np.log(0.6 * rng.dirichlet(np.ones(k), rows)).astype(np.float32).astype(np.float64)
        values[ids < 0] = 0.0
        labels, w_none = np.array([1, 2, 3]), rng.uniform(0.5, 1.5, size=(rows,))
        res = run_all(exec_mode, backend, s, ids, values, labels, w_none, "tail", temperature, 1.0, beta,
                      key=("confident", vocab))
        what = f"{backend} {exec_mode} V={vocab}"
        check(res, s, ids, values, labels, w_none, "tail", temperature, 1.0, beta, ms.float32, what)


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16, ms.float64], ids=["f16", "bf16", "f64"])
@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_dtypes(backend, exec_mode, dtype):
    """Half logits compute in float32 (the result and gradient in their dtype); float64 takes the composite
    kernels in float64 on every backend."""
    rng = np.random.default_rng(8)
    s = rng.normal(size=(4, 29)) * 2
    _, ids, values = topk_teacher(rng, (4,), 29, 6)
    labels = np.arange(4)
    res = run_all(exec_mode, backend, s, ids, values, labels, np.ones(4), "tail", 1.0, 1.0, 0.3, dtype,
                  key=str(dtype))
    tol = {ms.float64: 1e-9}.get(dtype, TOL.get(dtype))
    sr = rounded(s, dtype)
    for red in ("none", "batchmean"):
        expected = ref.sparse_distillation_loss(sr, ids, values, "tail", 1.0, 1.0, 0.3, red, labels)
        got = to_numpy(res[red][0])
        assert res[red][0].dtype == dtype
        np.testing.assert_allclose(got, expected, rtol=tol * 10, atol=tol)
    g = central_differences(lambda x: float(ref.sparse_distillation_loss(x, ids, values, "tail", 1.0, 1.0, 0.3,
                                                                         "sum", labels)), sr)
    np.testing.assert_allclose(to_numpy(res["sum"][1]), g, atol=max(tol, 1e-7) * 20)


@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
@pytest.mark.parametrize("beta", (0.0, 0.5, 1.0))
def test_all_ids_equal_the_dense_loss(backend, exec_mode, beta):
    """K = V: 'renormalize' (beta < 1) and 'tail' are distillation_loss on the dense teacher, values and
    student gradients (ids in a shuffled order, the teacher's log-probabilities taken at T0 = 1, used at T = 2)."""
    rng = np.random.default_rng(9)
    vocab = 23
    s = rng.normal(size=(5, vocab)) * 3
    t = rng.normal(size=(5, vocab)) * 3
    ids = np.stack([rng.permutation(vocab) for _ in range(5)]).astype(np.int32)
    values = np.take_along_axis(ref.log_softmax(t), ids, -1)
    labels = np.arange(5)
    # log-probabilities at T0 = 1 used at T = 2: softmax(log p / 2) = softmax(t / 2), the dense teacher at T = 2
    dense = ref.distillation_loss(rounded(s, ms.float32), t, 2.0, "sum", beta)
    for mode in (("tail",) if beta == 1.0 else ("renormalize", "tail")):
        res = run_all(exec_mode, backend, s, ids, values, labels, np.ones(5), mode, 2.0, 1.0, beta, key="dense")
        np.testing.assert_allclose(to_numpy(res["sum"][0]), dense, rtol=2e-6)
        g_dense = ref.distillation_grads(rounded(s, ms.float32), t, 2.0, "sum", beta)[0]
        np.testing.assert_allclose(to_numpy(res["sum"][1]), g_dense, atol=2e-6)


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_renormalize_is_the_dense_loss_of_the_truncated_teacher(backend):
    """'renormalize' = distillation_loss against logits T0 * logprob on the ids and -inf elsewhere; K = 1 too."""
    rng = np.random.default_rng(10)
    vocab = 31
    s = rng.normal(size=(6, vocab)) * 2
    for k in (1, 4):
        lt, ids, values = topk_teacher(rng, (6,), vocab, k)
        truncated = np.full_like(lt, -np.inf)
        np.put_along_axis(truncated, ids, 1.5 * values, -1)
        for beta in (0.0, 0.4):
            got = ms_kldiv.sparse_distillation_loss(Tensor(s, ms.float32), Tensor(ids), Tensor(values, ms.float32),
                                                    temperature=2.0, teacher_temperature=1.5, beta=beta,
                                                    reduction="sum", backend=backend)
            dense = ref.distillation_loss(rounded(s, ms.float32), truncated, 2.0, "sum", beta)
            np.testing.assert_allclose(float(got), dense, rtol=2e-6)


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_edges(backend):
    """-inf student logits (off the ids, and at an id: +inf under forward KL, as the dense loss says), huge logits,
    an almost empty student tail (the tail's sum is formed directly, not as 1 - the ids' mass), every id padding
    ('tail': 0; 'renormalize': NaN, no teacher distribution)."""
    rng = np.random.default_rng(11)
    vocab = 40
    s = rng.normal(size=(5, vocab))
    _, ids, values = topk_teacher(rng, (5,), vocab, 4)
    s[0, np.setdiff1d(np.arange(vocab), ids[0])[-10:]] = -np.inf  # masked classes off the ids
    s[1] += 1e6
    s[2, ids[2]] += 60.0  # student tail ~ e^-60: 1 - sum(ids) would be 0 in float64
    ids[3] = -1
    values[3] = 0.0
    s[4, ids[4, 0]] = -np.inf
    sr = rounded(s, ms.float32)
    for mode in ("tail", "renormalize"):
        x = Tensor(s, ms.float32)
        fn = ms.value_and_grad(lambda a, mode=mode: ms_kldiv.sparse_distillation_loss(
            a, Tensor(ids), Tensor(values, ms.float32), mode=mode, reduction="none", backend=backend).sum())
        rows = to_numpy(ms_kldiv.sparse_distillation_loss(x, Tensor(ids), Tensor(values, ms.float32), mode=mode,
                                                          reduction="none", backend=backend))
        expected = ref.sparse_distillation_rows(sr, ids, values, mode)
        assert np.isinf(expected[4]) and np.isinf(rows[4])
        assert (np.isnan(rows[3]) if mode == "renormalize" else rows[3] == 0.0)
        np.testing.assert_allclose(rows[:3], expected[:3], rtol=1e-5)
        assert expected[2] > 1.0  # the tail term is large and exact: log(q_tail / r_tail), r_tail ~ e^-60
        _, g = fn(x)
        g = to_numpy(g)
        for r in (0, 1, 2):
            g_ref = central_differences(lambda a, r=r: ref.sparse_distillation_rows(a[None], ids[r:r + 1],
                                                                                     values[r:r + 1], mode)[0],
                                        sr[r].astype(np.float64), h=1e-4 if r == 1 else 1e-6)
            finite = np.isfinite(sr[r])
            np.testing.assert_allclose(g[r][finite], g_ref[finite], atol=2e-5, err_msg=f"{mode} row {r}")
            assert np.all(g[r][~finite] == 0.0)


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_sampled_estimator_is_unbiased(backend):
    """mode='sampled': ids drawn from the teacher with replacement (16 draws per row), counts; the student gradient
    averaged over 4,000 independent draws converges to the dense forward KL's gradient: within 5 standard errors
    (the estimator's gradient is T (p_s - c / n), whose variance is p_t (1 - p_t) / n per class)."""
    rng = np.random.default_rng(12)
    vocab, draws, n = 12, 4000, 16
    s1 = rng.normal(size=vocab)
    pt = np.exp(ref.log_softmax(rng.normal(size=vocab) * 1.5))
    ids = np.full((draws, n), -1, np.int32)
    counts = np.zeros((draws, n), np.int32)
    for d in range(draws):
        u, c = np.unique(rng.choice(vocab, size=n, p=pt), return_counts=True)
        ids[d, :len(u)] = u
        counts[d, :len(u)] = c
    s = np.tile(s1, (draws, 1))
    grad = ms.grad(lambda a: ms_kldiv.sparse_distillation_loss(a, Tensor(ids), Tensor(counts), mode="sampled",
                                                               reduction="sum", backend=backend))(
        Tensor(s, ms.float32))
    mean = to_numpy(grad).mean(0)
    dense = ref.distillation_grads(s1[None], np.log(pt)[None], 1.0, "sum")[0][0]
    stderr = np.sqrt(pt * (1 - pt) / n / draws)
    assert np.all(np.abs(mean - dense) < 5 * stderr + 1e-6), (mean - dense) / stderr
    # a single draw is not the dense gradient (the test could not pass by accident)
    assert np.max(np.abs(to_numpy(grad)[0] - dense)) > 10 * stderr.max()


@pytest.mark.parametrize("exec_mode", ("pynative", "graph", "jit"))
@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_dynamic_rows_and_empty(backend, exec_mode):
    """set_inputs with unknown leading dims: several row counts through one compiled graph, 0 rows included
    (every reduction 0, an empty gradient)."""
    vocab, k = 19, 3
    specs = (Tensor(shape=[None, None, vocab], dtype=ms.float32), Tensor(shape=[None, None, k], dtype=ms.int32),
             Tensor(shape=[None, None, k], dtype=ms.float32), Tensor(shape=[None, None], dtype=ms.int32),
             Tensor(shape=[None, None], dtype=ms.float32))
    rng = np.random.default_rng(13)
    for b, n in ((2, 3), (1, 5), (0, 4)):
        s = rng.normal(size=(b, n, vocab))
        _, ids, values = topk_teacher(rng, (b, n), vocab, k)
        labels = np.ones((b, n), np.int64)
        if b * n:
            labels.reshape(-1)[0] = -100
        res = run_all(exec_mode, backend, s, ids, values, labels, np.ones((b, n)), "renormalize", 1.0, 1.0, 0.0,
                      specs=specs if exec_mode != "pynative" else None, key="dynamic")
        if b * n == 0:
            for red in REDUCTIONS:
                assert res[red][1].shape == (0, n, vocab)
                assert to_numpy(res[red][0]).size == 0 if red == "none" else float(res[red][0]) == 0.0
            continue
        check(res, s, ids, values, labels, np.ones((b, n)), "renormalize", 1.0, 1.0, 0.0, ms.float32,
              f"{exec_mode} {b}x{n}")


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_bad_ids_compiled_give_nan_rows(backend):
    """Compiled code cannot raise on values: a row with an id >= V or a repeated id gets NaN (and no out-of-bounds
    read); the other rows are unaffected."""
    s = np.zeros((3, 8), np.float32)
    ids = np.array([[0, 1], [2, 9], [3, 3]], np.int32)
    values = np.log(np.full((3, 2), 0.25, np.float32))
    def rows_of(a, i, v):
        return ms_kldiv.sparse_distillation_loss(a, i, v, mode="tail", reduction="none", backend=backend)

    rows = to_numpy(ms.jit(rows_of)(Tensor(s), Tensor(ids), Tensor(values)))
    assert np.isfinite(rows[0]) and np.isnan(rows[1]) and np.isnan(rows[2])
    np.testing.assert_allclose(rows[0], ref.sparse_distillation_rows(s[:1], ids[:1], values[:1], "tail")[0],
                               rtol=1e-6)


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_int64_ids_past_int32_give_nan_rows_compiled(backend):
    """int64 ids past int32's range: compiled code gives the documented NaN row (an id >= V), not the row of the id
    they wrapped onto (2^33 acted as id 0, 2^33 + 5 as id 5, 2^32 - 1 as padding); an id below int32's range is
    padding, as every negative id. The stored-teacher loss and the fused head's from_teacher_topk."""
    s = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(3, 8)
    ids = np.array([[2**33, 1], [2**33 + 5, 2], [2**32 - 1, 3]], np.int64)
    values = np.log(np.full((3, 2), 0.25, np.float32))

    def rows_of(a, i, v):
        return ms_kldiv.sparse_distillation_loss(a, i, v, mode="tail", reduction="none", backend=backend)

    rows = to_numpy(ms.jit(rows_of)(Tensor(s), Tensor(ids), Tensor(values)))
    assert np.all(np.isnan(rows)), rows
    below = np.array([[-(2**33), 1]], np.int64)  # padding: the row of id 1 alone
    row = to_numpy(ms.jit(rows_of)(Tensor(s[:1]), Tensor(below), Tensor(values[:1])))
    np.testing.assert_allclose(row, ref.sparse_distillation_rows(s[:1], np.array([[-1, 1]]), values[:1], "tail"),
                               rtol=1e-6)
    head = ms_kldiv.FusedLinearDistillationLoss(stored_mode="tail", backend=backend)
    loss = ms.jit(head.from_teacher_topk)(Tensor(np.eye(3, dtype=np.float32)), Tensor(s.T.copy()), Tensor(ids),
                                          Tensor(values))
    assert np.isnan(to_numpy(loss))


def test_backend_info_and_registry():
    rows = ms_kldiv.backend_info(op="sparse_distillation")
    by_name = {r["name"]: r for r in rows}
    assert by_name["composite"]["available"]
    assert by_name["aot"]["available"] and by_name["aot"]["auto"]  # the CPU library on this CPU-only CI
    assert "does not implement sparse_distillation" in by_name["akg"]["reason"]
    with pytest.raises(RuntimeError, match="akg"):
        ms_kldiv.sparse_distillation_loss(Tensor(np.zeros((1, 3), np.float32)), Tensor([[0]]),
                                          Tensor([[-1.0]]), backend="akg")


S = Tensor(np.zeros((2, 5), np.float32))
IDS = Tensor(np.array([[0, 1], [2, -1]], np.int32))
LOGP = Tensor(np.array([[-0.5, -1.5], [-0.1, 0.0]], np.float32))


@pytest.mark.parametrize("kwargs,args,err,match", [
    (dict(mode="dense"), (), ValueError, "'mode'"),
    (dict(mode=1), (), TypeError, "'mode'"),
    (dict(mode="sampled", beta=0.5), (), ValueError, "forward KL only"),
    (dict(mode="sampled", teacher_temperature=2.0), (), ValueError, "'teacher_temperature'"),
    (dict(mode="renormalize", beta=1.0), (), ValueError, "mode='tail'"),
    (dict(reduction="mean"), (), ValueError, "'mean'"),
    (dict(temperature=0.0), (), ValueError, "'temperature'"),
    (dict(teacher_temperature=-1.0), (), ValueError, "'teacher_temperature'"),
    (dict(teacher_temperature=1e-40), (), ValueError, "'teacher_temperature'"),
    (dict(beta=1.5), (), ValueError, "'beta'"),
    (dict(ignore_index=2**32 - 100), (), ValueError, "'ignore_index' must lie in int32's range"),
    (dict(backend="nope"), (), ValueError, "backend"),
    (dict(), (S, Tensor(np.array([[0.0, 1.0], [2.0, 3.0]], np.float32)), LOGP), TypeError, "'teacher_ids'"),
    (dict(), (S, IDS, Tensor(np.array([[1, 2], [3, 4]], np.int32))), TypeError, "'teacher_values'"),
    (dict(), (S, Tensor(np.zeros((3, 2), np.int32)), LOGP), ValueError, "'teacher_ids'"),
    (dict(), (S, IDS, Tensor(np.zeros((2, 3), np.float32))), ValueError, "'teacher_values'"),
    (dict(), (S, Tensor(np.zeros((2, 0), np.int32)), Tensor(np.zeros((2, 0), np.float32))), ValueError,
     "at least one id"),
    (dict(), (Tensor(np.zeros((2, 0), np.float32)), IDS, LOGP), ValueError, "at least one class"),
    (dict(), (S, Tensor(np.array([[0, 5], [2, -1]], np.int32)), LOGP), ValueError, r"\[0, 5\)"),
    (dict(), (S, Tensor(np.array([[1, 1], [2, -1]], np.int32)), LOGP), ValueError, "repeat"),
    (dict(), (S, IDS, Tensor(np.array([[0.5, -1.0], [-0.1, 0.0]], np.float32))), ValueError, "<= 0"),
    (dict(mode="sampled"), (S, IDS, Tensor(np.array([[-1, 2], [3, 0]], np.int32))), ValueError, ">= 0"),
    (dict(labels=Tensor(np.zeros((3,), np.int32))), (), ValueError, "'labels'"),
])
def test_errors(kwargs, args, err, match):
    args = args or (S, IDS, LOGP)
    with pytest.raises(err, match=match):
        ms_kldiv.sparse_distillation_loss(*args, **kwargs)


@pytest.mark.parametrize("ids,values,match", [
    (Tensor(np.array([[0, 5], [2, -1]], np.int32)), LOGP, r"\[0, 5\)"),
    (Tensor(np.array([[1, 1], [2, -1]], np.int32)), LOGP, "repeat"),
    (IDS, Tensor(np.array([[0.5, -1.0], [-0.1, 0.0]], np.float32)), "<= 0")])
def test_data_errors_name_the_cell(ids, values, match):
    """The Cell's data errors name the Cell, as its other errors do (they named the functional)."""
    with pytest.raises(ValueError, match=r"^For 'SparseDistillationLoss', .*" + match):
        ms_kldiv.SparseDistillationLoss()(S, ids, values)


@pytest.mark.parametrize("mode", ["jit", "graph"])
def test_option_errors_read_the_same_compiled(mode):
    """Option errors raise PyNative's exception and message under ms.jit and from a GRAPH_MODE Cell (the checks run
    on the host while the graph compiles; before, their text was re-quoted into a compiled raise)."""
    class Loss(nn.Cell):
        def construct(self, s, ids, values):
            return ms_kldiv.sparse_distillation_loss(s, ids, values, mode="x")

    def call(s, ids, values):
        return ms_kldiv.sparse_distillation_loss(s, ids, values, mode="x")
    with pytest.raises(ValueError, match=r"^For 'sparse_distillation_loss', 'mode' must be one of \['renormalize', "):
        if mode == "graph":
            with graph_mode():
                Loss()(S, IDS, LOGP)
        else:
            ms.jit(call)(S, IDS, LOGP)


def test_errors_skip_ignored_rows():
    """An ignored row's ids and values are never looked at: no error for them, and no effect."""
    ids = Tensor(np.array([[0, 1], [7, 7]], np.int32))
    labels = Tensor(np.array([0, -100], np.int32))
    got = ms_kldiv.sparse_distillation_loss(S, ids, LOGP, labels=labels, reduction="sum")
    expected = ref.sparse_distillation_loss(np.zeros((2, 5)), np.array([[0, 1], [-1, -1]]), LOGP.asnumpy(),
                                            reduction="sum", labels=labels.asnumpy())
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("backend", ["composite", "aot"])
def test_float64_logits_keep_float64_values(backend, mode):
    """float64 logits are computed in float64 with the teacher's float64 values as given (they were rounded to
    float32 first: 5e-8 relative off): value and gradient against the float64 definition at 1e-12."""
    rng = np.random.default_rng(9)
    s = rng.normal(size=(4, 8))
    ids = np.array([[0, 3, 5], [1, 2, 6], [7, 6, 0], [4, 1, 2]], np.int32)
    values = np.log(rng.dirichlet(np.ones(4), 4)[:, :3])

    def loss(a):
        return ms_kldiv.sparse_distillation_loss(a, Tensor(ids), Tensor(values), mode="tail", temperature=2.0,
                                                 backend=backend)
    grad = ms.value_and_grad(loss)
    if mode == "jit":
        grad = ms.jit(grad)
    value, d_s = grad(Tensor(s))

    def f(a):
        return ref.sparse_distillation_loss(a, ids, values, "tail", 2.0)
    np.testing.assert_allclose(float(value.asnumpy()), f(s), rtol=1e-12)
    np.testing.assert_allclose(d_s.asnumpy(), central_differences(f, s), rtol=1e-6, atol=1e-9)
