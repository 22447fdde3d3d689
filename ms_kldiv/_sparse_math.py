"""Distillation from a stored (sparse) teacher, value and student gradient in closed form, in MindSpore ops: what a
fused kernel computes for a block of rows, declared once (``custom_ops/common/sparse_math.h`` is the C++ twin,
``ms_kldiv.reference.sparse_support`` the float64 definition). Bottom layer: it imports only ``_math`` and
``_distill_math``.

Per row: student logits s [V], the teacher's K ids (negative: padding) and values v [K] (log-probabilities at
temperature T0, or log-counts for a sampled teacher). Both models become distributions over K + 1 buckets, the ids
and the tail (every class off the ids), x = s / T:

    log r_i = x[id_i] - lse(x),      log r_tail = lse(x off the ids) - lse(x)
    y_i = (T0 / T) v_i,              y_tail = (T0 / T) log(1 - sum_i exp(v_i))  ('tail'; -inf for 'renormalize')
    log q = log_softmax([y, y_tail]) (no tail bucket in either model where the student has no mass off the ids)

and the row loss is T^2 D_beta(q, r) over the buckets (the family of ``_distill_math``). With a_u the bucket terms
of that module (forward KL: a = -q; reverse KL: a = r (log r - log q); JSD: a = (1 - beta) r (log r - log M)),
A = sum_u a_u, p = softmax(x) and w_j = exp(x_j - lse(x off the ids)) (the student's distribution inside the tail):

    d(T^2 D)/ds_j = T (a_j - p_j A)           for j among the ids
                  = T (a_tail w_j - p_j A)    off the ids

(the tail's share of a_tail spread by w, never divided by r_tail, so a student with almost no mass off the ids is
exact). A row with an id >= V or a repeated id gets NaN in its loss and gradient.
"""
import mindspore as ms
from mindspore import ops
from mindspore.ops import constexpr

from . import _math
from ._distill_math import (INV_T, LOG_W_S, LOG_W_T, T_LIN, T_SQ, W_S, W_T, constant, log_mixture, ranks_logsumexp,
                            slice_normalizer)

#: Columns of the per-row statistics (sparse::Stat in custom_ops/common/sparse_math.h).
SPARSE_STATS = 8
_NEG_INF = float("-inf")
_pointwise_kl = _math.pointwise(True).loss  # p (log p - log q) for (log q, log p), exactly 0 where p is 0
_row_max = ops.ReduceMax(keep_dims=True)
_row_sum = ops.ReduceSum(keep_dims=True)
# primitives: the ops.zeros_like / ones_like wrappers fail to compile inside a bprop in graph mode
# ("func graph is empty")
_zeros_like = ops.ZerosLike()
# the primitive: ops.any fails inside a bprop in graph mode when the differentiated function has an unused input
# ("func graph is empty")
_any_over = ops.ReduceAny()
_ones_like = ops.OnesLike()


@constexpr
def _f64(value):
    # graph mode holds a Python float as float32; built in Python, the constant keeps float64 precision
    return ms.Tensor(value, ms.float64)


def _lse(z):
    """log-sum-exp over the last axis (keepdims), -inf for a row with no finite entry."""
    m = ops.stop_gradient(_row_max(z, -1))
    m = ops.where(m == _NEG_INF, 0.0, m)
    return m + ops.log(_row_sum(ops.exp(z - m), -1))


def id_hits(x, ids):
    """(float count of each class among the row's ids [..., V], the ids with padding pointed at class 0, valid).
    No slices anywhere below: a slice of 0 rows under dynamic shapes crashes graph mode (docs/mindspore-notes.md)."""
    valid = ids >= 0
    inside = ops.logical_and(valid, ids < x.shape[-1])  # ids >= V make the row bad; they count nowhere
    at = ops.where(inside, ids, 0)
    hits = ops.tensor_scatter_elements(_zeros_like(x), at, ops.cast(inside, x.dtype), -1, "add")
    return hits, at, valid


def _log_add(a, b):
    """log(e^a + e^b), -inf when both are -inf."""
    hi = ops.maximum(a, b)
    safe = ops.where(hi == _NEG_INF, 0.0, hi)
    return safe + ops.log(ops.exp(a - safe) + ops.exp(b - safe))


def _buckets(log_r, lse, lse_off, values, valid, tail, ratio):
    """(log r, log q) of the ids and of the tail from the student's log r at the ids, lse(x), lse(x off the ids)
    and the teacher's values (module docstring)."""
    ratio = ops.cast(_f64(ratio), lse.dtype)
    y = ops.where(valid, values * ratio, _NEG_INF)
    if tail:
        kept = ops.minimum(_lse(ops.where(valid, values, _NEG_INF)), 0.0)
        y_tail = ratio * ops.log(-ops.expm1(kept))
        y_tail = ops.where(lse_off == _NEG_INF, _NEG_INF, y_tail)
    else:
        y_tail = ops.full_like(lse, _NEG_INF)
    log_q_norm = _log_add(_lse(y), y_tail)  # -inf without a teacher distribution: log q is NaN, so is the row
    return (log_r, y - log_q_norm), (lse_off - lse, y_tail - log_q_norm)


def support(x, ids, values, tail, ratio):
    """The buckets for scaled student logits x = s / T [..., V] (module docstring): ((log r, log q) of the ids
    [..., K], (log r, log q) of the tail [..., 1], lse(x), lse(x off the ids), hits, ids safe to gather, the ids
    whose a is scattered into the gradient (the valid ones), bad rows)."""
    hits, at, valid = id_hits(x, ids)
    lse = _lse(x)
    lse_off = _lse(ops.where(hits > 0, _NEG_INF, x))
    log_r = ops.where(valid, ops.gather_elements(x, -1, at) - lse, _NEG_INF)
    bad = ops.logical_or(_any_over(hits > 1, -1), _any_over(ops.logical_and(valid, ids >= x.shape[-1]), -1))
    return _buckets(log_r, lse, lse_off, values, valid, tail, ratio) + (lse, lse_off, hits, at, valid, bad)


def int32_ids(ids):
    """Stored-teacher ids as the kernels take them: past int32's range int32's largest (past any vocabulary: a NaN
    row, as any id >= V in compiled code), below it -1 (padding, as every negative id)."""
    return _math.narrowed_to_int32(ids, -1)


def sliced_support(x, ids, values, tail, ratio, slice_info, gather, total, width=None):
    """``support`` for this rank's slice x [R, V_r] of the scaled student logits (vocabulary parallelism): the ids
    stay global, ``slice_info`` = int32 (first column of the slice, whole vocabulary); ``gather`` (x [R, k] ->
    [ranks, R, k]) merges the slices' normalizers, ``total`` (a SUM over the ranks) assembles the student's logits at
    the ids. The hits, positions and scattered ids are this slice's. ``width``: the slice's own width when x
    carries a stand-in column (an empty slice; default: x's)."""
    valid = ids >= 0
    # slices [i:i + 1], not integer indices: after a check raised inside a PyNative value_and_grad, MindSpore
    # refused integer indexing of tensors for the rest of the process
    local = ids - slice_info[0:1]
    mine = ops.logical_and(valid, ops.logical_and(local >= 0, local < (x.shape[-1] if width is None else width)))
    at = ops.where(mine, local, 0)
    hits = ops.tensor_scatter_elements(_zeros_like(x), at, ops.cast(mine, x.dtype), -1, "add")
    every = gather(ops.stack(slice_normalizer(x, 1.0) + slice_normalizer(ops.where(hits > 0, _NEG_INF, x), 1.0),
                             -1))
    lse, lse_off = ops.expand_dims(ranks_logsumexp(every, 0), -1), ops.expand_dims(ranks_logsumexp(every, 2), -1)
    # each collective after the one before (depend): with no data path between them, a rank's runtime may start
    # them in another order than the other ranks' (it did for an empty slice's constant operands)
    x_ids = total(ops.depend(ops.where(mine, ops.gather_elements(x, -1, at), 0.0), every))
    log_r = ops.where(valid, x_ids - lse, _NEG_INF)
    repeated = total(ops.depend(ops.cast(_any_over(hits > 1, -1), x.dtype), x_ids)) > 0
    bad = ops.logical_or(repeated, _any_over(ops.logical_and(valid, ids >= slice_info[1:2]), -1))
    return _buckets(log_r, lse, lse_off, values, valid, tail, ratio) + (lse, lse_off, hits, at, mine, bad)


def bucket_terms(log_r, log_q, beta):
    """(divergence terms, a) per bucket (module docstring), in the operands' dtype."""
    if beta == 0:
        return _pointwise_kl(log_r, log_q), -ops.exp(log_q)
    if beta == 1:
        a = _pointwise_kl(log_q, log_r)
        return a, a
    dt = log_r.dtype
    log_m = log_mixture(log_r, log_q, constant(LOG_W_T, 1.0, beta, dt), constant(LOG_W_S, 1.0, beta, dt))
    a = constant(W_S, 1.0, beta, dt) * _pointwise_kl(log_m, log_r)
    return a + constant(W_T, 1.0, beta, dt) * _pointwise_kl(log_m, log_q), a


def _sums(ids_part, tail_part, beta, bad):
    """(sum of the terms, A, a of the ids, a of the tail) over the buckets, NaN for bad rows."""
    terms, a = bucket_terms(*ids_part, beta)
    tail_terms, a_tail = bucket_terms(*tail_part, beta)
    nan = ops.expand_dims(bad, -1)
    total = ops.where(nan, float("nan"), ops.sum(terms, -1, keepdim=True) + tail_terms)
    big_a = ops.where(nan, float("nan"), ops.sum(a, -1, keepdim=True) + a_tail)
    return total, big_a, a, a_tail


def _stats(parts, t_sq, beta):
    ids_part, tail_part, lse, lse_off, _, _, _, bad = parts
    total, big_a, _, a_tail = _sums(ids_part, tail_part, beta, bad)
    zero = _zeros_like(lse)
    return ops.concat((t_sq * total, lse, lse_off, big_a, a_tail, zero, zero, zero), -1)


def _grad(x, parts, t_lin, beta, dloss):
    ids_part, tail_part, lse, lse_off, hits, at, scattered, bad = parts
    _, big_a, a, a_tail = _sums(ids_part, tail_part, beta, bad)
    a_at_ids = ops.tensor_scatter_elements(_zeros_like(x), at, ops.where(scattered, a, 0.0), -1, "add")
    in_tail = a_tail * ops.exp(ops.where(lse_off == _NEG_INF, _NEG_INF, x - lse_off))
    d = t_lin * (ops.where(hits > 0, a_at_ids, in_tail) - ops.exp(x - lse) * big_a)
    g = ops.expand_dims(ops.cast(dloss, x.dtype), -1)
    return ops.where(g != 0, d * g, 0.0)


def row_stats(s, ids, values, temperature, ratio, beta, tail):
    """[..., SPARSE_STATS] in the logits' dtype: (T^2 D, lse, lse off the ids, A, a_tail, 0, 0, 0) of student
    logits [..., V] (float32 or float64), int ids [..., K] and values [..., K]."""
    inv_t, t_sq = constant(INV_T, temperature, beta, s.dtype), constant(T_SQ, temperature, beta, s.dtype)
    return _stats(support(s * inv_t, ids, ops.cast(values, s.dtype), tail, ratio), t_sq, beta)


def student_grad(s, ids, values, temperature, ratio, beta, tail, dloss):
    """d/ds of sum_rows dloss * (T^2 D) for logits [..., V] (dtype as ``row_stats``); rows with dloss == 0 get
    exact zeros whatever they hold."""
    inv_t, t_lin = constant(INV_T, temperature, beta, s.dtype), constant(T_LIN, temperature, beta, s.dtype)
    x = s * inv_t
    return _grad(x, support(x, ids, ops.cast(values, s.dtype), tail, ratio), t_lin, beta, dloss)


def sliced_row_stats(s, ids, values, temperature, ratio, beta, tail, slice_info, gather, total, width=None):
    """``row_stats`` of the whole rows from this rank's slice s [R, V_r] (``sliced_support``)."""
    inv_t, t_sq = constant(INV_T, temperature, beta, s.dtype), constant(T_SQ, temperature, beta, s.dtype)
    return _stats(sliced_support(s * inv_t, ids, ops.cast(values, s.dtype), tail, ratio, slice_info, gather, total,
                                 width), t_sq, beta)


def sliced_student_grad(s, ids, values, temperature, ratio, beta, tail, dloss, slice_info, gather, total,
                        width=None):
    """``student_grad`` of the whole rows' losses for this rank's slice s [R, V_r]."""
    inv_t, t_lin = constant(INV_T, temperature, beta, s.dtype), constant(T_LIN, temperature, beta, s.dtype)
    x = s * inv_t
    parts = sliced_support(x, ids, ops.cast(values, s.dtype), tail, ratio, slice_info, gather, total, width)
    return _grad(x, parts, t_lin, beta, dloss)
