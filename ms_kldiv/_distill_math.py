"""Distillation from logits, value and both gradients in closed form, in MindSpore ops: what a fused kernel computes
for a block of rows, declared once. The composite backend's distillation kernels are these formulas; the fused
kernels' second-order gradients are these formulas differentiated. Like ``ms_kldiv._math`` (whose zero-mass
pointwise KL it uses) this module is the bottom layer: it imports nothing else of the package.

For rows of student logits s and teacher logits t, P_s = softmax(s/T), P_t = softmax(t/T), the loss is
T^2 * D_beta summed over the rows (``ms_kldiv.reference.distillation_pointwise`` is the float64 twin):

    beta = 0:      D = KL(P_t || P_s)
    beta = 1:      D = KL(P_s || P_t)
    0 < beta < 1:  D = beta KL(P_t || M) + (1 - beta) KL(P_s || M),  M = beta P_t + (1 - beta) P_s

With u = the pointwise terms that depend on P_s through P_s itself (a = P_s * dD/dP_s, written below per case), the
softmax's Jacobian gives d(T^2 D)/ds = T (a - P_s sum(a)), and likewise for t with b = P_t * dD/dP_t:

    beta = 0:      a = -P_t (so d/ds = T (P_s - P_t)),         b = P_t (log P_t - log P_s)
    beta = 1:      a = P_s (log P_s - log P_t),                b = -P_s (d/dt = T (P_t - P_s))
    0 < beta < 1:  a = (1 - beta) P_s (log P_s - log M),       b = beta P_t (log P_t - log M)

Entries with P = 0 (a -inf logit, a padded vocabulary entry) contribute exactly 0 to every term.
"""
import collections
import math

import mindspore as ms
from mindspore import ops
from mindspore.ops import constexpr

from . import _math

#: Columns of the distillation kernels' per-row statistics (distill::kStats in custom_ops/common/distill_math.h).
STATS = 8

#: The divergences besides the 'kl' family (by beta), in the order of their codes (hyper[2] of the kernels):
#: 'tvd' 1/2 sum |P_s - P_t|; 'skew_kl' KL(P_t || alpha P_t + (1-alpha) P_s); 'skew_rkl' KL(P_s || alpha P_s +
#: (1-alpha) P_t); 'symmetric_kl' alpha KL(P_t || P_s) + (1-alpha) KL(P_s || P_t).
DIVERGENCES = ("kl", "tvd", "skew_kl", "skew_rkl", "symmetric_kl")

#: What a distillation loss computes besides (temperature, beta): the divergence, its alpha, and the transform of
#: both models' logits before the temperature (softcap > 0: cap tanh(z / cap), after z * logit_scale).
Variant = collections.namedtuple("Variant", ["divergence", "alpha", "softcap", "logit_scale"])
KL = Variant("kl", 0.0, 0.0, 1.0)


def hyper(temperature, beta, variant=KL):
    """The kernels' float64 hyper input: (temperature, beta, divergence code, alpha, soft cap, logit scale)."""
    return (float(temperature), float(beta), float(DIVERGENCES.index(variant.divergence)), float(variant.alpha),
            float(variant.softcap), float(variant.logit_scale))


def hard_hyper(variant, z_loss, label_smoothing, ignore_index):
    """The hard-label kernel's float64 hyper input (custom_ops/common/distill_abi.h, DistillHard): ``hyper``'s six
    (only the transform is read), then z-loss, label smoothing, ignore_index."""
    return hyper(1.0, 0.0, variant) + (float(z_loss), float(label_smoothing), float(ignore_index))


def transformed(z, variant, wide=None):
    """Both models' logits as the loss sees them: z * logit_scale, soft-capped (differentiable). ``wide``: a dtype
    the soft cap is computed in (MindSpore's float32 CPU tanh is up to 1e-4 off); the result has z's dtype."""
    if variant.logit_scale != 1.0:
        z = z * ops.cast(_f64(variant.logit_scale), z.dtype)
    if variant.softcap > 0:
        narrow = z.dtype
        if wide is not None:
            z = ops.cast(z, wide)
        cap = ops.cast(_f64(variant.softcap), z.dtype)
        # a masked class (-inf) stays masked: cap * tanh(-inf) would give it the finite logit -cap
        z = ops.where(z == _NEG_INF, z, cap * ops.tanh(ops.where(z == _NEG_INF, 0.0, z) / cap))
        if wide is not None:
            z = ops.cast(z, narrow)
    return z


def transform_slope(z, variant, wide=None):
    """d transformed(z) / dz (``wide``: as in ``transformed``)."""
    scale = ops.cast(_f64(variant.logit_scale), z.dtype)
    if variant.softcap <= 0:
        return ops.ones_like(z) * scale
    zw = z if wide is None else ops.cast(z, wide)
    th = ops.tanh(zw * ops.cast(_f64(variant.logit_scale / variant.softcap), zw.dtype))
    return scale * ops.cast(1.0 - th * th, z.dtype)
_NEG_INF = float("-inf")
_pointwise_kl = _math.pointwise(True).loss  # p (log p - log q) for (log q, log p), exactly 0 where p is 0


@constexpr
def _f64(value):
    return ms.Tensor(value, ms.float64)


def _constant_values(temperature, beta):
    logs = (math.log(beta), math.log1p(-beta)) if 0 < beta < 1 else (0.0, 0.0)
    return (1.0 / temperature, temperature, temperature * temperature, beta, 1.0 - beta) + logs


@constexpr
def constants(temperature, beta):
    """(1/T, T, T^2, beta, 1 - beta, log beta, log(1 - beta)) as float64 0-d tensors, computed in Python at full
    precision: graph mode holds float constants (and their arithmetic) as float32."""
    return tuple(ms.Tensor(v, ms.float64) for v in _constant_values(temperature, beta))


INV_T, T_LIN, T_SQ, W_T, W_S, LOG_W_T, LOG_W_S = range(7)  # constants()' entries


@constexpr
def _constant64(index, temperature, beta):
    return ms.Tensor(_constant_values(temperature, beta)[index], ms.float64)


def constant(index, temperature, beta, dtype):
    """constants(temperature, beta)[index] in ``dtype``, the one tensor made (PyNative runs a constexpr on every call).
    Graph code indexes the constants one by one: graph mode parses a comprehension (``[ops.cast(v, dtype) for v in
    ...]``) into an iterator loop of helper graphs, each compiled (docs/mindspore-notes.md)."""
    return ops.cast(_constant64(index, temperature, beta), dtype)


_row_max_prim = ops.ReduceMax(keep_dims=True)


def _row_max(z):
    # the primitive: graph mode fails to differentiate a bprop Cell that calls ops.amax's Python wrapper
    return _row_max_prim(z, -1)


def log_softmax_plain(z):
    """log_softmax in plain ops: differentiable to any order (MindSpore's LogSoftmaxGrad has no bprop) and exact in
    float64 (MindSpore's CPU LogSoftmax computes float64 at float32 accuracy). The shift is a constant to autodiff
    (it cancels in the gradient), which also keeps amax's tie-breaking out of it."""
    shifted = z - ops.stop_gradient(_row_max(z))
    return shifted - ops.log(ops.sum(ops.exp(shifted), -1, keepdim=True))


def two_pass(beta, variant):
    """The kinds whose class terms test p > 0 (the JSD family, TVD, skew, symmetric): on a row where no model has a
    distribution the fused kernels' sums are 0, not NaN: the row loss is marked NaN there from the student's
    log-normalizer (``backends.distill.row_loss``)."""
    return beta not in (0, 1) or variant.divergence != "kl"


def log_mixture(log_ps, log_pt, log_w_t, log_w_s):
    """log(w_t P_t + w_s P_s), stable. Lanes where both are -inf (a class masked in both models) get safe operands
    and -inf after, so that no gradient sees exp(-inf - -inf)."""
    both = ops.logical_and(log_ps == _NEG_INF, log_pt == _NEG_INF)
    x = ops.where(both, 0.0, log_pt) + log_w_t
    y = ops.where(both, 0.0, log_ps) + log_w_s
    m = ops.stop_gradient(ops.maximum(x, y))
    return ops.where(both, _NEG_INF, m + ops.log(ops.exp(x - m) + ops.exp(y - m)))


@constexpr
def _pair(w):
    """(w, 1 - w, log w, log(1 - w)) as float64 0-d tensors, computed in Python: graph mode would do the arithmetic
    in float32 (then w + (1 - w) != 1 in float64, and a model compared with itself is not exactly 0)."""
    logs = (math.log(w) if w > 0 else -math.inf, math.log1p(-w) if w < 1 else -math.inf)
    return tuple(ms.Tensor(v, ms.float64) for v in (w, 1.0 - w) + logs)


def _weights(w, dtype):
    """(w, 1 - w) in ``dtype``, from _pair's float64 values (indexed: see ``constant``)."""
    pair = _pair(w)
    return ops.cast(pair[0], dtype), ops.cast(pair[1], dtype)


def _log_mix(log_ps, log_pt, w_t):
    """log(w_t P_t + (1 - w_t) P_s) for a Python weight (log_mixture; a weight of 0 or 1 drops a model)."""
    if w_t == 0:
        return log_ps
    if w_t == 1:
        return log_pt
    pair = _pair(w_t)
    return log_mixture(log_ps, log_pt, ops.cast(pair[2], log_ps.dtype), ops.cast(pair[3], log_ps.dtype))


def _pairwise(log_ps, log_pt, ps, pt, beta, variant):
    """(pointwise divergence terms, a, b) of the log-probabilities (module docstring; a = P_s dD/dP_s and
    b = P_t dD/dP_t without the constants that cancel in the softmax's backward). custom_ops/common/distill_math.h
    ``class_terms`` is the C++ twin."""
    kind, alpha = variant.divergence, variant.alpha
    dt = log_ps.dtype
    if kind == "kl" and beta == 0:
        b = _pointwise_kl(log_ps, log_pt)
        return b, -pt, b
    if kind == "kl" and beta == 1:
        a = _pointwise_kl(log_pt, log_ps)
        return a, a, -ps
    if kind == "kl":
        w_t, w_s = _weights(beta, dt)
        log_m = _log_mix(log_ps, log_pt, beta)
        a = w_s * _pointwise_kl(log_m, log_ps)
        b = w_t * _pointwise_kl(log_m, log_pt)
        return a + b, a, b
    if kind == "tvd":
        sign = ops.sign(ps - pt)
        return 0.5 * ops.abs(ps - pt), 0.5 * ps * sign, -0.5 * pt * sign
    if kind in ("skew_kl", "skew_rkl"):
        t_weighs = kind == "skew_kl"
        lp, lq, p = (log_pt, log_ps, pt) if t_weighs else (log_ps, log_pt, ps)
        w_p, w_q = _weights(alpha, dt)
        log_m = _log_mix(lq, lp, alpha)  # alpha P + (1 - alpha) Q
        kl = _pointwise_kl(log_m, lp)
        has = p > 0
        safe_m = ops.where(has, log_m, 0.0)
        pq = ops.where(has, ops.exp(ops.where(has, lp + lq, 0.0) - safe_m), 0.0)
        pp = ops.where(has, ops.exp(ops.where(has, lp + lp, 0.0) - safe_m), 0.0)
        da_p = kl - w_p * pp
        da_q = -w_q * pq
        return (kl, da_q, da_p) if t_weighs else (kl, da_p, da_q)
    # symmetric_kl
    fwd = _pointwise_kl(log_ps, log_pt)
    rev = _pointwise_kl(log_pt, log_ps)
    w_f, w_r = _weights(alpha, dt)
    return w_f * fwd + w_r * rev, -w_f * pt + w_r * rev, w_f * fwd - w_r * ps


def _terms(student, teacher, temperature, beta, differentiable, variant=KL):
    """(pointwise divergence terms, a, b, P_s, P_t, T) for rows of logits, in the logits' dtype (module docstring);
    the logits are transformed first (``variant``)."""
    inv_t, t_lin = constant(INV_T, temperature, beta, student.dtype), constant(T_LIN, temperature, beta, student.dtype)
    log_softmax = log_softmax_plain if differentiable or student.dtype == ms.float64 else (
        lambda z: ops.log_softmax(z, -1))
    log_ps = log_softmax(transformed(student, variant) * inv_t)
    log_pt = log_softmax(transformed(teacher, variant) * inv_t)
    ps, pt = ops.exp(log_ps), ops.exp(log_pt)
    terms, a, b = _pairwise(log_ps, log_pt, ps, pt, beta, variant)
    return terms, a, b, ps, pt, t_lin


def row_losses(student, teacher, temperature, beta, variant=KL):
    """T^2 * D of each row of 2-D logits [R, V], in their dtype."""
    terms = _terms(student, teacher, temperature, beta, False, variant)[0]
    return constant(T_SQ, temperature, beta, student.dtype) * ops.sum(terms, -1)


def _softmax_vjp(t_lin, u, p):
    return t_lin * (u - p * ops.sum(u, -1, keepdim=True))


def row_grads(student, teacher, temperature, beta, want_teacher, differentiable=False, variant=KL):
    """(d/d student, d/d teacher or None) of the sum of the row losses; ``differentiable``: the gradients will be
    differentiated again, so the log-softmax is written in plain ops."""
    _, a, b, ps, pt, t_lin = _terms(student, teacher, temperature, beta, differentiable, variant)
    plain = variant.divergence == "kl" and beta == 0
    d_student = t_lin * (ps - pt) if plain else _softmax_vjp(t_lin, a, ps)
    d_teacher = _softmax_vjp(t_lin, b, pt) if want_teacher else None
    if variant.softcap > 0 or variant.logit_scale != 1.0:
        d_student = d_student * transform_slope(student, variant)
        d_teacher = None if d_teacher is None else d_teacher * transform_slope(teacher, variant)
    return d_student, d_teacher


# ----------------------------------------------------------------------- a slice of the vocabulary per rank
# Vocabulary parallelism: each rank holds the columns [v0, v1) of both models' logits. A row's normalizer is kept
# as (base, log Z) with base the slice's own largest transformed logit (0 when it has none) and Z the sum of
# exp((x - base) / T) over the whole row, so that log P = (x - base) / T - log Z is formed without large terms
# cancelling; the kernels' stats (STATS columns, distill_math.h's Stat) carry it in columns 1 / 2 (log Z of the
# student / teacher) and 5 / 6 (their bases).
LOG_Z_S, LOG_Z_T, SUM_A, SUM_B, BASE_S, BASE_T = 1, 2, 3, 4, 5, 6
# the primitive: the functional ops.zeros_like inside a Cell with a bprop fails graph compilation when the
# differentiated function has an unused input (docs/mindspore-notes.md)
_zeros_like = ops.ZerosLike()
_max_over = ops.ReduceMax()  # the primitive (ops.amax fails inside a bprop in graph mode)


def slice_normalizer(z, inv_t):
    """(base, log Z) of each row of a slice (float32 [R] each); a slice without mass gives (0, -inf)."""
    if z.shape[-1] == 0:  # no classes (MindSpore's CPU reductions of an empty axis return uninitialized memory)
        # (after z: a constant would let a collective it feeds run before those that z's computation waits for)
        zero = ops.depend(ops.zeros(z.shape[:-1], z.dtype), z)
        return zero, zero + _NEG_INF
    base = _row_max(z)
    base = ops.where(base == _NEG_INF, 0.0, base)
    return ops.squeeze(base, -1), ops.log(ops.sum(ops.exp((z - base) * inv_t), -1))


def slice_states(student, teacher, temperature, variant=KL):
    """The stats [R, STATS] of a slice whose only meaningful columns are its normalizers (2-D logits)."""
    inv_t = constant(INV_T, temperature, 0.0, student.dtype)
    base_s, log_z_s = slice_normalizer(transformed(student, variant), inv_t)
    base_t, log_z_t = slice_normalizer(transformed(teacher, variant), inv_t)
    zero = _zeros_like(base_s)
    return ops.stack([zero, log_z_s, log_z_t, zero, zero, base_s, base_t, zero], -1)


def ranks_logsumexp(every, k):
    """The whole row's log-sum-exp [R] from every rank's slice normalizer (base, log Z) in columns k, k + 1 of
    ``every`` [ranks, R, C] (scaled units: base already divided by T); -inf when no slice has mass."""
    part = every[:, :, k] + every[:, :, k + 1]
    top = _max_over(part, 0)
    top = ops.where(top == _NEG_INF, 0.0, top)
    return top + ops.log(ops.sum(ops.exp(part - top), 0))


def merged_log_z(states, gathered, temperature):
    """This rank's (log Z_s, log Z_t) [R] of the whole row, relative to its own bases, from its slice's ``states``
    [R, STATS] and every rank's slice normalizers ``gathered`` [ranks, R, 4] = (base_s, log Z_s, base_t, log Z_t).
    Exact: log Z = log Z_r + log sum_q exp(d_q), d_q = (base_q - base_r) / T + log Z_q - log Z_r (d_r = 0), which
    never subtracts two large log-sum-exps (huge logits keep float32's relative accuracy in log P)."""
    inv_t = constant(INV_T, temperature, 0.0, states.dtype)
    out = []
    for k, (log_z_col, base_col) in enumerate(((LOG_Z_S, BASE_S), (LOG_Z_T, BASE_T))):
        base_r, log_z_r = states[:, base_col], states[:, log_z_col]
        has_mass = log_z_r > _NEG_INF
        safe_r = ops.where(has_mass, log_z_r, 0.0)
        d = (gathered[:, :, 2 * k] - base_r) * inv_t + (gathered[:, :, 2 * k + 1] - safe_r)
        top = _max_over(d, 0)
        top = ops.where(top == _NEG_INF, 0.0, top)
        # a slice without mass (base 0, safe log Z 0): the row's log-sum-exp; its own classes keep P = 0
        out.append(safe_r + top + ops.log(ops.sum(ops.exp(d - top), 0)))
    return out


def slice_log_probs(z, stats, base_col, log_z_col, temperature, variant=KL):
    """log P of a slice's classes from the whole row's normalizer in ``stats``."""
    inv_t = constant(INV_T, temperature, 0.0, z.dtype)
    base = ops.expand_dims(ops.cast(stats[:, base_col], z.dtype), -1)
    log_z = ops.expand_dims(ops.cast(stats[:, log_z_col], z.dtype), -1)
    return (transformed(z, variant) - base) * inv_t - log_z


def slice_sums(student, teacher, stats, temperature, beta, variant=KL):
    """(T^2 sum of the terms, sum(a), sum(b)) [R] over a slice's classes, with the whole row's normalizers."""
    if student.shape[-1] == 0:  # no classes: nothing to add (and no empty reduction, see slice_normalizer)
        # (after the normalizers' gather: with no data path, the empty rank's next collective could run before it)
        zero = ops.depend(ops.zeros(student.shape[:-1], student.dtype), stats)
        return zero, zero, zero
    log_ps = slice_log_probs(student, stats, BASE_S, LOG_Z_S, temperature, variant)
    log_pt = slice_log_probs(teacher, stats, BASE_T, LOG_Z_T, temperature, variant)
    terms, a, b = _pairwise(log_ps, log_pt, ops.exp(log_ps), ops.exp(log_pt), beta, variant)
    t_sq = constant(T_SQ, temperature, beta, student.dtype)
    return t_sq * ops.sum(terms, -1), ops.sum(a, -1), ops.sum(b, -1)


def slice_grads(student, teacher, stats, temperature, beta, want_teacher, variant=KL):
    """(d/d student, d/d teacher or None) of the sum of the whole rows' losses, on a slice: the softmax's backward
    with the whole row's normalizers and sums (stats columns SUM_A / SUM_B)."""
    log_ps = slice_log_probs(student, stats, BASE_S, LOG_Z_S, temperature, variant)
    log_pt = slice_log_probs(teacher, stats, BASE_T, LOG_Z_T, temperature, variant)
    ps, pt = ops.exp(log_ps), ops.exp(log_pt)
    _, a, b = _pairwise(log_ps, log_pt, ps, pt, beta, variant)
    t_lin = constant(T_LIN, temperature, beta, student.dtype)
    sum_a = ops.expand_dims(ops.cast(stats[:, SUM_A], student.dtype), -1)
    sum_b = ops.expand_dims(ops.cast(stats[:, SUM_B], student.dtype), -1)
    plain = variant.divergence == "kl" and beta == 0
    d_student = t_lin * (ps - pt) if plain else t_lin * (a - ps * sum_a)
    d_teacher = t_lin * (b - pt * sum_b) if want_teacher else None
    if variant.softcap > 0 or variant.logit_scale != 1.0:
        d_student = d_student * transform_slope(student, variant)
        d_teacher = None if d_teacher is None else d_teacher * transform_slope(teacher, variant)
    return d_student, d_teacher


def cross_entropy_and_grad(logits, labels, keep, weights=None, z_loss=0.0, label_smoothing=0.0):
    """(each row's hard-label loss [C], the gradient of their sum weighted by ``weights``). The loss of a row is

        (1 - eps) (-log p[label]) + eps * mean over the classes with a finite logit of (-log p_j)  +  z lse^2

    (eps = ``label_smoothing``, PyTorch's and Liger's label smoothing, the uniform part over the classes a padded
    vocabulary really has; z = ``z_loss``, PaLM's and Liger's penalty on the log-normalizer). Rows not kept
    have loss 0 and exact zero gradients, whatever their logits hold; a kept row whose label is outside [0, V) has
    loss and gradient NaN (compiled code cannot raise; a silently wrong mean would be worse)."""
    # [C, V] temporaries kept few (a loop body holds each of them, several times over): the label's log-probability
    # gathered and its one-hot subtracted by a scatter, no [C, V] masks; the row mask and the NaN of a bad label
    # folded into each row's factor.
    # log p from the row's log-sum-exp, not log_softmax: MindSpore's CPU log_softmax gives -inf, not NaN, beside a
    # NaN logit; a +inf logit leaves no distribution either (NaN, as the kernels give)
    lse = ops.logsumexp(logits, -1)
    lse = ops.where(lse == float("inf"), float("nan"), lse)
    lse_col = ops.expand_dims(lse, 1)
    log_p = logits - lse_col
    vocab = logits.shape[-1]
    keep2 = ops.expand_dims(keep, 1)
    outside = ops.logical_and(keep, ops.logical_or(labels < 0, labels >= vocab))
    w = ops.cast(keep, logits.dtype) if weights is None else ops.where(keep, weights, 0.0)
    w2 = ops.expand_dims(ops.where(outside, float("nan"), w), 1)
    at = ops.stack((ops.arange(labels.shape[0], dtype=ms.int32),
                    ops.cast(ops.where(ops.logical_and(keep, ops.logical_not(outside)), labels, 0), ms.int32)), 1)
    row_loss = -ops.gather_nd(log_p, at)
    p = ops.exp(log_p)
    grad, hot = p, 1.0
    if label_smoothing:
        eps = ops.cast(_f64(label_smoothing), logits.dtype)
        finite = log_p > float("-inf")
        classes = ops.sum(ops.cast(finite, logits.dtype), -1, keepdim=True)
        uniform = ops.cast(finite, logits.dtype) / classes
        grad = grad - eps * uniform
        hot = 1.0 - eps
        row_loss = (1.0 - eps) * row_loss - eps * ops.sum(ops.where(finite, log_p, 0.0) * uniform, -1)
    if z_loss:
        z = ops.cast(_f64(z_loss), logits.dtype)
        row_loss = row_loss + z * lse * lse
        grad = grad + 2.0 * z * lse_col * p
    grad = ops.tensor_scatter_add(grad, at, ops.fill(logits.dtype, labels.shape, -1.0) * hot)
    rows = ops.where(outside, float("nan"), ops.where(keep, row_loss, 0.0))
    return rows, ops.where(keep2, grad * w2, 0.0)


def sliced_cross_entropy_and_grad(logits, labels, keep, weights, z_loss, label_smoothing, vocab_start, vocab,
                                  gather, total):
    """``cross_entropy_and_grad`` of the whole rows for this rank's slice [C, V_r] of their logits (columns
    ``vocab_start`` .. ``vocab_start + V_r`` of ``vocab``, 0-d int32 tensors): ``gather`` (x [C, k] -> every
    rank's [ranks, C, k]) merges the slices' normalizers exactly, ``total`` (a SUM over the ranks) adds the label's
    log-probability and the label-smoothing sums; the gradient is this slice's."""
    width = logits.shape[-1]
    if width == 0:
        # An empty slice computes on one -inf column (no mass, never a label): no reduction over an empty axis, and
        # the same collectives as the other ranks', after the same ones (depend: a constant would not wait for them).
        logits = ops.depend(_math.no_class_column(ops.expand_dims(labels, 1), logits.dtype), logits)
    lse = ranks_logsumexp(gather(ops.stack(slice_normalizer(logits, 1.0), -1)), 0)
    lse_col = ops.expand_dims(lse, 1)
    log_p = logits - lse_col
    # The label's log-probability gathered and its one-hot subtracted by a scatter, on the rank whose slice holds it
    # (no [C, V] masks; the stand-in column of an empty slice is no label's).
    local = labels - vocab_start
    here = ops.logical_and(keep, ops.logical_and(local >= 0, local < width))
    at = ops.stack((ops.arange(labels.shape[0], dtype=ms.int32), ops.cast(ops.where(here, local, 0), ms.int32)), 1)
    label_log_p = ops.where(here, ops.gather_nd(log_p, at), 0.0)
    p = ops.exp(log_p)
    grad, hot = p, 1.0
    if label_smoothing:  # (every rank runs the same collectives: the options are the same on all)
        finite = log_p > _NEG_INF
        sums = total(ops.stack([label_log_p, ops.sum(ops.cast(finite, logits.dtype), -1),
                                ops.sum(ops.where(finite, log_p, 0.0), -1)], -1))
        label_log_p, classes, finite_log_p = sums[:, 0], sums[:, 1], sums[:, 2]
        eps = ops.cast(_f64(label_smoothing), logits.dtype)
        grad = grad - eps * ops.cast(finite, logits.dtype) / ops.expand_dims(classes, 1)
        hot = 1.0 - eps
        row_loss = -(1.0 - eps) * label_log_p - eps * finite_log_p / classes
    else:
        label_log_p = total(ops.expand_dims(label_log_p, -1))[:, 0]
        row_loss = -label_log_p
    if z_loss:
        z = ops.cast(_f64(z_loss), logits.dtype)
        row_loss = row_loss + z * lse * lse
        grad = grad + 2.0 * z * lse_col * p
    grad = ops.tensor_scatter_add(grad, at, ops.where(here, ops.fill(logits.dtype, labels.shape, -1.0) * hot, 0.0))
    w = ops.cast(keep, logits.dtype) if weights is None else ops.where(keep, weights, 0.0)
    outside = ops.logical_and(keep, ops.logical_or(labels < 0, labels >= vocab))
    rows = ops.where(outside, float("nan"), ops.where(keep, row_loss, 0.0))
    # (a NaN factor for a counted label outside the whole vocabulary: that row's gradient NaN on every rank)
    w2 = ops.expand_dims(ops.where(outside, float("nan"), w), 1)
    grad = ops.where(ops.expand_dims(keep, 1), grad * w2, 0.0)
    return rows, (grad[:, :0] if width == 0 else grad)
