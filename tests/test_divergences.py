"""The loss menu beyond the 'kl' family: divergence ('tvd', 'skew_kl', 'skew_rkl', 'symmetric_kl') with alpha,
per-row weights, softcap and logit_scale in distillation_loss / DistillationLoss / FusedLinearDistillationLoss, and
the head's z_loss and label_smoothing. Each against the float64 reference (ms_kldiv.reference: values, both
gradients by central differences), in PyNative and GRAPH_MODE, on every distillation backend; against the anchors'
own definitions written out here (Liger's TVD, torchtune's symmetric KL, DistiLLM's skew KL, Gemma's soft cap);
second order through the composite math; bad values raise."""
import contextlib
import functools

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_kldiv
from ms_kldiv import reference as ref

from conftest import DISTILL_BACKENDS, central_differences, graph_mode, to_numpy

VARIANTS = (
    dict(divergence="tvd"),
    dict(divergence="skew_kl", alpha=0.1),
    dict(divergence="skew_kl", alpha=0.6),
    dict(divergence="skew_rkl", alpha=0.1),
    dict(divergence="symmetric_kl", alpha=0.3),
    dict(divergence="kl", softcap=3.0, logit_scale=0.5),
    dict(divergence="kl", beta=0.5, logit_scale=2.0),
    dict(divergence="tvd", softcap=2.0),
)
IDS = [",".join(f"{k}={v}" for k, v in v.items()) for v in VARIANTS]


def _ref_kwargs(variant):
    kw = dict(variant)
    beta = kw.pop("beta", 0.0)
    default = {"skew_kl": 0.1, "skew_rkl": 0.1, "symmetric_kl": 0.5}.get(kw["divergence"], 0.0)
    kw.setdefault("alpha", default)
    kw["softcap"] = kw.get("softcap") or 0.0
    return beta, kw


class Loss(nn.Cell):
    """The summed loss (a Cell: graph mode parses no lambda)."""

    def __init__(self, variant, backend, reduction):
        super().__init__()
        self.cell = ms_kldiv.DistillationLoss(2.0, reduction, backend=backend, **variant)

    def construct(self, s, t, labels, weights):
        return self.cell(s, t, labels, weights).sum()


def _case(rng):
    s = rng.normal(size=(2, 3, 11)) * 2
    t = rng.normal(size=(2, 3, 11)) * 2
    s[..., -2:] = -np.inf  # a padded vocabulary: masked in both models
    t[..., -2:] = -np.inf
    labels = np.array([[1, -100, 2], [3, 4, 5]])
    weights = np.array([[1.0, 7.0, 0.0], [0.5, 2.0, 1.5]])
    s[0, 1, 0] = np.nan  # the ignored row
    return s, t, labels, weights


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_values_and_both_gradients(backend, exec_mode, variant):
    """[B, S, V] logits with vocabulary padding, an ignored NaN row, weights (one 0): 'batchmean' divides by the
    counted rows' weights; 'none' is pointwise (the composition)."""
    s, t, labels, weights = _case(np.random.default_rng(21))
    beta, kw = _ref_kwargs(variant)
    args = [Tensor(s, ms.float32), Tensor(t, ms.float32), Tensor(labels, ms.int32), Tensor(weights, ms.float32)]
    sr, tr = (to_numpy(a) for a in args[:2])
    for reduction in ("batchmean", "none"):
        cell = Loss(variant, backend, reduction)
        grad_fn = ms.value_and_grad(cell, grad_position=(0, 1))
        if exec_mode == "graph":
            with graph_mode():
                value, (ds, dt) = grad_fn(*args)
        else:
            value, (ds, dt) = grad_fn(*args)

        def f(x, y, reduction=reduction):
            return np.sum(ref.distillation_loss(x, y, 2.0, reduction, beta, labels, weights=weights, **kw))
        np.testing.assert_allclose(float(value), f(sr, tr), rtol=2e-6, err_msg=reduction)
        finite_s = np.where(np.isfinite(sr), sr, 0.0)
        g_s = central_differences(lambda x: f(np.where(np.isfinite(sr), x, sr), tr), finite_s)
        g_t = central_differences(lambda y: f(sr, np.where(np.isfinite(tr), y, tr)), np.where(np.isfinite(tr), tr, 0))
        np.testing.assert_allclose(np.nan_to_num(to_numpy(ds)) * np.isfinite(sr), g_s * np.isfinite(sr), atol=3e-6)
        np.testing.assert_allclose(np.nan_to_num(to_numpy(dt)) * np.isfinite(tr), g_t * np.isfinite(tr), atol=3e-6)
        assert np.all(to_numpy(ds)[0, 1] == 0) and np.all(to_numpy(ds)[0, 2] == 0)  # ignored, weight 0


class MeanLoss(nn.Cell):
    def __init__(self, variant, backend):
        super().__init__()
        self.cell = ms_kldiv.DistillationLoss(2.0, "batchmean", backend=backend, **variant)

    def construct(self, s, t):
        return self.cell(s, t)


@pytest.mark.parametrize("variant", VARIANTS[:5] + (dict(divergence="kl", beta=0.5),), ids=IDS[:5] + ["jsd"])
@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_row_without_distribution_is_nan(backend, exec_mode, variant):
    """A row whose student logits have no distribution (every logit -inf, a NaN, a +inf) makes the loss NaN for
    every divergence, as in the reference; the other rows' gradients are unchanged (the mark comes from the
    forward's saved log-normalizer: no second read of the logits)."""
    rng = np.random.default_rng(24)
    s, t = (rng.normal(size=(3, 6)) * 2).astype(np.float32), (rng.normal(size=(3, 6)) * 2).astype(np.float32)
    beta, kw = _ref_kwargs(variant)
    grad_fn = ms.value_and_grad(MeanLoss(variant, backend), grad_position=0)
    for bad_s, bad_t in (([-np.inf] * 6, [-np.inf] * 6), ([0.0, np.nan, 1.0, 2.0, 0.5, 0.0], t[1]),
                         ([-np.inf, np.inf, 0.0, 0.0, 0.0, 1.0], t[1])):
        a, b = s.copy(), t.copy()
        a[1], b[1] = bad_s, bad_t
        if exec_mode == "graph":
            with graph_mode():
                value, ds = grad_fn(Tensor(a), Tensor(b))
        else:
            value, ds = grad_fn(Tensor(a), Tensor(b))
        expected = ref.distillation_loss(a, b, 2.0, "batchmean", beta, **kw)
        assert np.isnan(float(value)) and np.isnan(expected), (float(value), expected, bad_s)
        rows = [0, 2]
        g = central_differences(lambda x: np.sum(ref.distillation_loss(x[rows], b[rows], 2.0, "sum", beta, **kw)) / 3,
                                a.astype(np.float64))
        np.testing.assert_allclose(to_numpy(ds)[rows], g[rows], atol=3e-6)


@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_infinite_row_stays_infinite(backend, exec_mode):
    """A row with a distribution whose loss is +inf (symmetric KL, the teacher's mass on a class the student
    masks) stays +inf, as in the reference: the NaN mark for rows without a distribution does not reach it."""
    s = np.array([[0.0, 1.0, 2.0, -np.inf], [0.5, 0.1, -1.0, 2.0]], np.float32)
    t = np.array([[0.0, 1.0, 2.0, 3.0], [0.2, 0.1, -1.0, 1.0]], np.float32)
    variant = dict(divergence="symmetric_kl", alpha=0.3)
    cell = MeanLoss(variant, backend)
    if exec_mode == "graph":
        with graph_mode():
            value = float(cell(Tensor(s), Tensor(t)))
    else:
        value = float(cell(Tensor(s), Tensor(t)))
    beta, kw = _ref_kwargs(variant)
    assert value == np.inf == ref.distillation_loss(s, t, 2.0, "batchmean", beta, **kw), value


@pytest.mark.parametrize("divergence", ("skew_kl", "skew_rkl"))
@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_skew_with_alpha_zero(backend, exec_mode, divergence):
    """alpha = 0: the mixture is the other model alone (skew KL is forward KL, skew reverse KL reverse KL). A class
    only the weighted model keeps gives +inf, as in the reference; where the other model's probability underflows
    float32 (log P = -150: no linear mixture holds it) the loss and both gradients are the reference's."""
    kept = np.array([[0.0, 1.0, 2.0, 3.0], [0.5, 0.1, -1.0, 2.0]], np.float32)
    masked = np.array([[0.0, 1.0, 2.0, -np.inf], [0.5, 0.1, -1.0, 2.0]], np.float32)
    tiny = np.array([[0.0, 1.0, 2.0, -300.0], [0.5, 0.1, -1.0, 2.0]], np.float32)
    variant = dict(divergence=divergence, alpha=0.0)
    _, kw = _ref_kwargs(variant)
    # the weighted model: the teacher for skew KL, the student for skew reverse KL
    pairs = [(masked, kept), (tiny, kept)] if divergence == "skew_kl" else [(kept, masked), (kept, tiny)]
    grad_fn = ms.value_and_grad(MeanLoss(variant, backend), grad_position=(0, 1))
    with graph_mode() if exec_mode == "graph" else contextlib.nullcontext():
        (inf_value, _), (value, (ds, dt)) = (grad_fn(Tensor(s), Tensor(t)) for s, t in pairs)
    assert float(inf_value) == np.inf == ref.distillation_loss(*pairs[0], 2.0, "batchmean", **kw)

    s, t = (x.astype(np.float64) for x in pairs[1])
    f = lambda x, y: ref.distillation_loss(x, y, 2.0, "batchmean", **kw)  # noqa: E731
    np.testing.assert_allclose(float(value), f(s, t), rtol=2e-6)
    np.testing.assert_allclose(to_numpy(ds), central_differences(lambda x: f(x, t), s), atol=3e-6)
    np.testing.assert_allclose(to_numpy(dt), central_differences(lambda y: f(s, y), t), atol=3e-6)


# the kinds with vector loops of their own in the CPU kernels (forward and reverse KL take the compiler's)
VECTOR_KINDS = (dict(divergence="kl", beta=0.5), dict(divergence="skew_kl", alpha=0.1),
                dict(divergence="skew_rkl", alpha=0.3), dict(divergence="tvd"),
                dict(divergence="symmetric_kl", alpha=0.3))


@functools.lru_cache(maxsize=None)
def _vector_case(kind, dtype):
    """Inputs of test_divergences_at_vector_widths as rounded to ``dtype`` and their float64 value and gradients
    (central differences: seconds, so once per kind and dtype for every backend and mode)."""
    rng = np.random.default_rng(203)
    s = rng.normal(size=(3, 203)) * 2
    t = rng.normal(size=(3, 203)) * 2
    s[2] *= 40  # probabilities far below 2^-126 (the mixture's log-space branch), the peaks shared
    t[2] = s[2] + t[2]
    s[:, 40:43] = t[:, 40:43] = -np.inf
    mstype = getattr(ms, dtype)
    s_in, t_in = Tensor(s.astype(np.float32), mstype), Tensor(t.astype(np.float32), mstype)
    sr, tr = to_numpy(s_in), to_numpy(t_in)  # the inputs as rounded
    beta, kw = _ref_kwargs(VECTOR_KINDS[kind])
    f = lambda x, y: ref.distillation_loss(x, y, 2.0, "batchmean", beta, **kw)  # noqa: E731
    return ((s_in, t_in), f(sr, tr), central_differences(lambda x: f(x, tr), sr),
            central_differences(lambda y: f(sr, y), tr))


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("kind", range(len(VECTOR_KINDS)), ids=("jsd", "skew_kl", "skew_rkl", "tvd", "symmetric_kl"))
@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_divergences_at_vector_widths(backend, exec_mode, kind, dtype):
    """V = 203 (twelve 16-lane vectors on AVX-512, six 32-lane ones on AVX2, and a tail of 11: the CPU kernels'
    vector loops and their scalar rest) in each input dtype, with -inf padding inside a vector and a peaked row whose
    probabilities fall below float32's normal range (the exponential's general path, the mixture's log-space bound):
    the value and both gradients within one rounding of their dtype of the float64 reference on the rounded inputs."""
    (s_in, t_in), want_value, want_ds, want_dt = _vector_case(kind, dtype)
    grad_fn = ms.value_and_grad(MeanLoss(VECTOR_KINDS[kind], backend), grad_position=(0, 1))
    with graph_mode() if exec_mode == "graph" else contextlib.nullcontext():
        value, (ds, dt) = grad_fn(s_in, t_in)
    # the loss and gradients come back in the inputs' dtype: one rounding of it (float32: of its arithmetic)
    ulp = {"float32": 2.0 ** -20, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    np.testing.assert_allclose(float(value), want_value, rtol=max(ulp, 1e-5))
    for got, want in ((ds, want_ds), (dt, want_dt)):
        got = to_numpy(got)
        assert np.all(got[:, 40:43] == 0)
        if dtype == "float32":
            np.testing.assert_allclose(got, want, rtol=ulp, atol=2e-6)
            continue
        # a half-precision gradient is the float32 one rounded once: within one ulp everywhere, within half an ulp
        # (correct rounding) wherever float32's own error does not straddle a rounding boundary
        # (the floor: float32's error on the per-class terms, O(T / rows), which cancel where a gradient is small,
        # and float16's subnormal spacing 2^-24)
        floor = 1e-7 + (2.0 ** -24 if dtype == "float16" else 0.0)
        err = np.abs(got - want)
        assert np.all(err <= ulp * np.abs(want) + floor), np.max(err - ulp * np.abs(want))
        assert np.mean(err <= ulp / 2 * np.abs(want) + floor / 2) >= 0.98


def test_anchor_definitions():
    """The reference equals the anchors' definitions, written out: Liger's TVD (1/2 sum |p - q| per token),
    torchtune's SymmetricKLLoss (sym_kd_ratio * forward KL + (1 - ratio) * reverse KL), DistiLLM's skew KL
    (KL(p || a p + (1 - a) q)), Gemma's soft cap (cap * tanh(logits / cap))."""
    rng = np.random.default_rng(22)
    s, t = rng.normal(size=(4, 9)) * 2, rng.normal(size=(4, 9)) * 2
    p_s, p_t = np.exp(ref.log_softmax(s)), np.exp(ref.log_softmax(t))
    kl = lambda p, q: np.sum(p * np.log(p / q), -1)  # noqa: E731
    np.testing.assert_allclose(ref.distillation_pointwise(s, t, divergence="tvd").sum(-1),
                               0.5 * np.abs(p_s - p_t).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(ref.distillation_pointwise(s, t, divergence="symmetric_kl", alpha=0.3).sum(-1),
                               0.3 * kl(p_t, p_s) + 0.7 * kl(p_s, p_t), rtol=1e-12)
    np.testing.assert_allclose(ref.distillation_pointwise(s, t, divergence="skew_kl", alpha=0.1).sum(-1),
                               kl(p_t, 0.1 * p_t + 0.9 * p_s), rtol=1e-12)
    np.testing.assert_allclose(ref.distillation_pointwise(s, t, divergence="skew_rkl", alpha=0.1).sum(-1),
                               kl(p_s, 0.1 * p_s + 0.9 * p_t), rtol=1e-12)
    capped = lambda z: 30.0 * np.tanh(z / 30.0)  # noqa: E731
    np.testing.assert_allclose(ref.distillation_pointwise(s * 40, t * 40, softcap=30.0).sum(-1),
                               ref.distillation_pointwise(capped(s * 40), capped(t * 40)).sum(-1), rtol=1e-12)
    # alpha = 0 skew KL is forward KL; symmetric with alpha 1 is forward KL
    np.testing.assert_allclose(ref.distillation_pointwise(s, t, divergence="skew_kl", alpha=0.0),
                               ref.distillation_pointwise(s, t), rtol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS[:5], ids=IDS[:5])
def test_second_order_through_the_composite_math(variant):
    """grad of (grad . v) for both logits on the fused route equals central differences of the first-order
    reference gradient (the composite math's derivative)."""
    rng = np.random.default_rng(23)
    s, t = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    v = rng.normal(size=(3, 7))
    beta, kw = _ref_kwargs(variant)

    def first(a, b):
        return ms.grad(lambda x, y: ms_kldiv.distillation_loss(x, y, 1.5, "sum", **variant), grad_position=(0, 1))(
            a, b)

    def second(a, b):
        ds, dt = first(a, b)
        return (ds * Tensor(v, ms.float32)).sum() + (dt * Tensor(v, ms.float32)).sum()

    gs, gt = ms.grad(second, grad_position=(0, 1))(Tensor(s, ms.float32), Tensor(t, ms.float32))

    def ref_pair(x, y):
        fs = central_differences(lambda a: ref.distillation_loss(a, y, 1.5, "sum", beta, **kw), x, 1e-5)
        ft = central_differences(lambda b: ref.distillation_loss(x, b, 1.5, "sum", beta, **kw), y, 1e-5)
        return np.sum(fs * v) + np.sum(ft * v)
    sr, tr = to_numpy(Tensor(s, ms.float32)), to_numpy(Tensor(t, ms.float32))
    np.testing.assert_allclose(to_numpy(gs), central_differences(lambda a: ref_pair(a, tr), sr, 1e-4), atol=2e-3)
    np.testing.assert_allclose(to_numpy(gt), central_differences(lambda b: ref_pair(sr, b), tr, 1e-4), atol=2e-3)


def _hard_reference(logits, labels, z_loss, eps):
    """Per-row hard loss: (1 - eps) CE + eps * uniform CE over the finite classes + z lse^2."""
    log_p = ref.log_softmax(logits)
    finite = np.isfinite(logits)
    nll = -np.take_along_axis(log_p, labels[:, None], -1)[:, 0]
    smooth = -np.sum(np.where(finite, log_p, 0.0), -1) / finite.sum(-1)
    lse = np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1)
    return (1 - eps) * nll + eps * smooth + z_loss * lse ** 2


@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
@pytest.mark.parametrize("backend", DISTILL_BACKENDS)
def test_head_variants_weights_z_loss_label_smoothing(backend, exec_mode):
    """The chunked head with a divergence, a soft cap, weights, z_loss and label smoothing equals the float64
    definition on the full logits (both terms weighted, divided by the counted rows' weights); gradients of the
    hidden states, weight and bias by the chain rule, of the row weights by central differences (they enter the
    sum and the count it is divided by), and with ``num_items_in_batch`` (the count given) too."""
    rng = np.random.default_rng(24)
    rows, hidden, vocab = 9, 5, 13
    h, ht = rng.normal(size=(rows, hidden)), rng.normal(size=(rows, hidden))
    w, wt = rng.normal(size=(vocab, hidden)), rng.normal(size=(vocab, hidden))
    b = rng.normal(size=vocab) * 0.1
    labels = rng.integers(0, vocab, size=rows)
    labels[2] = -100
    weights = rng.uniform(0, 2, size=rows)
    weights[4] = 0.0
    head = ms_kldiv.FusedLinearDistillationLoss(2.0, divergence="skew_kl", alpha=0.2, softcap=4.0, hard_weight=0.5,
                                                z_loss=1e-2, label_smoothing=0.1, chunk_size=4, backend=backend,
                                                teacher_grad=False)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.head = head

        def construct(self, h, w, b, ht, wt, labels, weights, items=None):
            return self.head(h, w, ht, wt, labels, b, None, weights, items)

    args = [Tensor(a, ms.float32) for a in (h, w, b, ht, wt)] + [Tensor(labels, ms.int32),
                                                                 Tensor(weights, ms.float32)]
    fn = ms.value_and_grad(Net(), grad_position=(0, 1, 2, 6))
    items = 11.0
    with graph_mode() if exec_mode == "graph" else contextlib.nullcontext():
        value, grads = fn(*args)
        _, d_weights_items = ms.value_and_grad(Net(), grad_position=6)(*args, Tensor(items, ms.float32))
    hr, wr, br, htr, wtr = (to_numpy(a) for a in args[:5])
    keep = labels != -100
    teacher_logits = htr @ wtr.T

    def loss_of(logits, weights=weights, count=None):
        soft = ref.distillation_loss(logits, teacher_logits, 2.0, "sum" if count else "tokenmean", 0.0, labels,
                                     weights=weights, divergence="skew_kl", alpha=0.2, softcap=4.0) / (count or 1)
        capped = 4.0 * np.tanh(logits / 4.0)
        hard = _hard_reference(capped, np.where(keep, labels, 0), 1e-2, 0.1)
        return soft + 0.5 * np.sum(np.where(keep, hard * weights, 0.0)) / (count or np.sum(weights[keep]))

    logits = hr @ wr.T + br
    d_logits = central_differences(loss_of, logits)
    np.testing.assert_allclose(float(value), loss_of(logits), rtol=2e-6)
    for got, exp, name in zip(grads, (d_logits @ wr, d_logits.T @ hr, d_logits.sum(0)), ("hidden", "weight", "bias")):
        np.testing.assert_allclose(to_numpy(got), exp, atol=3e-6, err_msg=name)
    # the row weights (an ignored row's weight has no effect: 0; a counted row's weight of 0 still has a gradient)
    d_weights = central_differences(lambda v: loss_of(logits, v), weights)
    assert d_weights[2] == 0.0 and d_weights[4] != 0.0
    np.testing.assert_allclose(to_numpy(grads[3]), d_weights, atol=3e-6, err_msg="row weights")
    d_weights = central_differences(lambda v: loss_of(logits, v, items), weights)
    np.testing.assert_allclose(to_numpy(d_weights_items), d_weights, atol=3e-6, err_msg="row weights, num_items")


class _HeadOnLogits(nn.Cell):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def construct(self, h, w, ht, wt, labels):
        return self.head(h, w, ht, wt, labels)


@pytest.mark.parametrize("exec_mode", ("pynative", "graph"))
def test_head_hard_term_under_a_tight_soft_cap(head_impl, exec_mode):
    """The hard term of logits soft-capped where tanh bends most (cap 1, scale 2: cap * tanh(2 z)), with and without
    the soft term: value and gradients at float32 accuracy on both head implementations (the chunk loop's float32
    tanh, MindSpore's CPU one, put the gradients 7e-4 off)."""
    rng = np.random.default_rng(25)
    rows, hidden, vocab = 9, 5, 37
    h, ht = rng.normal(size=(rows, hidden)), rng.normal(size=(rows, hidden))
    w, wt = rng.normal(size=(vocab, hidden)), rng.normal(size=(vocab, hidden))
    labels = rng.integers(0, vocab, size=rows)
    labels[::4] = -100
    args = [Tensor(a, ms.float32) for a in (h, w, ht, wt)] + [Tensor(labels, ms.int32)]
    hr, wr, htr, wtr = (to_numpy(a) for a in args[:4])
    keep = labels != -100
    for soft_weight in (0.0, 1.0):
        head = ms_kldiv.FusedLinearDistillationLoss(1.0, softcap=1.0, logit_scale=2.0, hard_weight=1.0,
                                                    soft_weight=soft_weight, chunk_size=4, teacher_grad=False)
        fn = ms.value_and_grad(_HeadOnLogits(head), grad_position=(0, 1))
        with graph_mode() if exec_mode == "graph" else contextlib.nullcontext():
            value, grads = fn(*args)

        def loss_of(logits, soft_weight=soft_weight):
            soft = ref.distillation_loss(logits, htr @ wtr.T, 1.0, "tokenmean", 0.0, labels, softcap=1.0,
                                         logit_scale=2.0)
            hard = _hard_reference(np.tanh(2.0 * logits), np.where(keep, labels, 0), 0.0, 0.0)
            return soft_weight * soft + np.sum(np.where(keep, hard, 0.0)) / keep.sum()

        logits = hr @ wr.T
        d_logits = central_differences(loss_of, logits)
        np.testing.assert_allclose(float(value), loss_of(logits), rtol=1e-6)
        for got, exp, name in zip(grads, (d_logits @ wr, d_logits.T @ hr), ("hidden", "weight")):
            np.testing.assert_allclose(to_numpy(got), exp, atol=2e-6, err_msg=f"{name} soft_weight={soft_weight}")


S, T = Tensor(np.zeros((2, 3), np.float32)), Tensor(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(divergence="js"), ValueError, "'divergence'"),
    (dict(divergence=3), TypeError, "'divergence'"),
    (dict(divergence="tvd", beta=0.5), ValueError, "'beta'"),
    (dict(divergence="tvd", alpha=0.5), ValueError, "'alpha'"),
    (dict(divergence="skew_kl", alpha=1.5), ValueError, "'alpha'"),
    (dict(divergence="skew_kl", alpha=1.0), ValueError, "'alpha'"),
    (dict(divergence="symmetric_kl", alpha=-0.1), ValueError, "'alpha'"),
    (dict(softcap=0.0), ValueError, "'softcap'"),
    (dict(softcap=-1.0), ValueError, "'softcap'"),
    (dict(logit_scale=0.0), ValueError, "'logit_scale'"),
    (dict(weights=Tensor(np.array([1.0, -1.0], np.float32))), ValueError, "'weights'"),
    (dict(weights=Tensor(np.array([1.0, np.nan], np.float32))), ValueError, r"'weights' .* got \[nan\]"),
    (dict(weights=Tensor(np.array([1, 2], np.int32))), TypeError, "'weights'"),
    (dict(weights=Tensor(np.ones(3, np.float32))), ValueError, "'weights'"),
])
def test_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        ms_kldiv.distillation_loss(S, T, **kwargs)


@pytest.mark.parametrize("kwargs,match", [(dict(z_loss=-1.0), "'z_loss'"), (dict(label_smoothing=1.5),
                                                                             "'label_smoothing'"),
                                          (dict(divergence="tvd", softcap=-2.0), "'softcap'")])
def test_head_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ms_kldiv.FusedLinearDistillationLoss(**kwargs)
