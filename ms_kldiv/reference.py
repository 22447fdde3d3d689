"""Float64 NumPy reference of the SPEC, with the structure of ``ms_kldiv._math`` (the MindSpore-ops math every
backend uses) and ``custom_ops/common/kldiv_math.h`` (the C++/CUDA kernels'): safe operands, loss, both
gradients, second derivatives, reduction scale, sum back to an operand's shape.

It is deliberately plain (no MindSpore) so that tests, the Ascend tile model and the benchmarks can check
every backend against an independent implementation of the same contract.
"""
import numpy as np

REDUCTIONS = ("none", "mean", "batchmean", "sum")
# distillation_loss also takes 'tokenmean': the sum over the counted rows (every position of the leading dims, or
# those whose label is not ignore_index) divided by their number, with or without labels.
DISTILL_REDUCTIONS = REDUCTIONS + ("tokenmean",)


def has_mass(t, log_target):
    t = np.asarray(t, dtype=np.float64)
    return ~(t == -np.inf) if log_target else ~(t <= 0)


def safe_operands(x, t, log_target=False):
    """(mass, xs, ts), broadcast, float64: lanes without mass get x = 0 and t = 1 (0 in log space)."""
    x, t = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(t, np.float64))
    mass = has_mass(t, log_target)
    return mass, np.where(mass, x, 0.0), np.where(mass, t, 0.0 if log_target else 1.0)


def _elementwise(x, t, log_target, log_space, prob_space):
    """The formulas of one target space, ``(xs, ts) -> tuple of arrays``, on safe operands, with the zero-mass rule
    (0 where the target has no mass); broadcast, float64."""
    mass, xs, ts = safe_operands(x, t, log_target)
    with np.errstate(all="ignore"):
        values = (log_space if log_target else prob_space)(xs, ts)
    return tuple(np.where(mass, v, 0.0) for v in values)


def pointwise_loss(x, t, log_target=False):
    """Elementwise loss with the zero-mass rule, broadcast, float64."""
    return _elementwise(x, t, log_target, lambda xs, ts: (np.exp(ts) * (ts - xs),),
                        lambda xs, ts: (ts * (np.log(ts) - xs),))[0]


def pointwise_grads(x, t, log_target=False):
    """(d/dinput, d/dtarget) elementwise, broadcast shape, float64."""
    return _elementwise(x, t, log_target, lambda xs, ts: (-np.exp(ts), np.exp(ts) * (ts - xs + 1.0)),
                        lambda xs, ts: (-ts, np.log(ts) + 1.0 - xs))


def pointwise_second(x, t, log_target=False):
    """Second derivatives (d2/dx dt, d2/dt dx, d2/dt2) elementwise, float64; d2/dx2 is 0."""
    return _elementwise(x, t, log_target, lambda xs, ts: (-np.exp(ts), -np.exp(ts), np.exp(ts) * (ts - xs + 2.0)),
                        lambda xs, ts: (-np.ones_like(ts), -np.ones_like(ts), 1.0 / ts))


def reduction_scale(reduction, input_shape, out_shape):
    """The factor s applied to the sum ('none' and 'sum' -> 1)."""
    if reduction == "mean":
        n = int(np.prod(out_shape, dtype=np.int64))
        return 1.0 / n if n else np.nan
    if reduction == "batchmean":
        b = input_shape[0] if len(input_shape) else 1
        return 1.0 / b if b else np.nan
    return 1.0


def sum_to(g, shape):
    """Undo broadcasting: sum g down to `shape`."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g.reshape(shape)


def kl_div(x, t, reduction="mean", log_target=False):
    """Forward value in float64 (a 0-d array for the reducing modes)."""
    x = np.asarray(x, np.float64)
    loss = pointwise_loss(x, t, log_target)
    if reduction == "none":
        return loss
    with np.errstate(all="ignore"):
        return np.asarray(loss.sum() * reduction_scale(reduction, x.shape, loss.shape))


def kl_div_grads(x, t, reduction="mean", log_target=False, dout=None):
    """(d/dinput, d/dtarget) of kl_div, each summed back to its operand's shape, float64.

    ``dout`` is the incoming gradient (broadcast shape for 'none', a scalar otherwise; default ones).
    """
    x = np.asarray(x, np.float64)
    t = np.asarray(t, np.float64)
    dx, dt = pointwise_grads(x, t, log_target)
    out_shape = dx.shape
    s = reduction_scale(reduction, x.shape, out_shape)
    g = np.ones(out_shape) if dout is None else np.broadcast_to(np.asarray(dout, np.float64), out_shape)
    with np.errstate(all="ignore"):
        return sum_to(dx * g * s, x.shape), sum_to(dt * g * s, t.shape)


# ------------------------------------------------------------------------------------------ distillation
def log_softmax(z):
    """Stable log-softmax over the last axis, float64. A row without a distribution (every entry -inf, or a NaN
    or +inf among them) gives NaN in every entry, as MindSpore's log-softmax does."""
    z = np.asarray(z, np.float64)
    m = np.max(z, axis=-1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m)  # every entry -inf: log(0) - (-inf); a +inf or NaN max makes the row NaN
    with np.errstate(all="ignore"):
        return z - m - np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))


def transformed(z, softcap=0.0, logit_scale=1.0):
    """Logits as a distillation loss sees them: z * logit_scale, then cap * tanh(. / cap) when softcap > 0 (Gemma's
    final_logit_softcapping, Cohere's logit_scale); -inf (a masked class) stays -inf."""
    z = np.asarray(z, np.float64) * logit_scale
    # a masked class (-inf) stays masked
    return np.where(z == -np.inf, z, softcap * np.tanh(z / softcap)) if softcap > 0 else z


def distillation_pointwise(student_logits, teacher_logits, temperature=1.0, beta=0.0, divergence="kl", alpha=0.0,
                           softcap=0.0, logit_scale=1.0):
    """The pointwise terms (summing over the last axis gives one row's divergence), float64, times T^2, of the
    transformed logits' softmaxes at T, with the zero-mass rule of ``kl_div``:

    - 'kl': TRL's ``generalized_jsd_loss`` (beta 0 forward KL(P_t || P_s), beta 1 reverse KL(P_s || P_t), else
      beta KL(P_t || M) + (1 - beta) KL(P_s || M), M = beta P_t + (1 - beta) P_s);
    - 'tvd': 1/2 |P_s - P_t| (Liger's ``LigerTVDLoss``);
    - 'skew_kl': KL(P_t || alpha P_t + (1 - alpha) P_s), 'skew_rkl': KL(P_s || alpha P_s + (1 - alpha) P_t)
      (DistiLLM's skew KL and skew reverse KL);
    - 'symmetric_kl': alpha KL(P_t || P_s) + (1 - alpha) KL(P_s || P_t) (torchtune's ``SymmetricKLLoss`` with
      sym_kd_ratio = alpha)."""
    ls = log_softmax(transformed(student_logits, softcap, logit_scale) / temperature)
    lt = log_softmax(transformed(teacher_logits, softcap, logit_scale) / temperature)

    def kl(lp, lq):  # p (log p - log q) with the zero-mass rule
        return pointwise_loss(lq, lp, log_target=True)

    def log_mix(w_p, lp, lq):  # log(w_p p + (1 - w_p) q)
        with np.errstate(all="ignore"):
            if w_p == 0:
                return lq
            if w_p == 1:
                return lp
            return np.logaddexp(lp + np.log(w_p), lq + np.log1p(-w_p))

    if divergence == "kl" and beta == 0:
        terms = kl(lt, ls)
    elif divergence == "kl" and beta == 1:
        terms = kl(ls, lt)
    elif divergence == "kl":
        lm = log_mix(beta, lt, ls)
        terms = beta * kl(lt, lm) + (1 - beta) * kl(ls, lm)
    elif divergence == "tvd":
        terms = 0.5 * np.abs(np.exp(ls) - np.exp(lt))
    elif divergence == "skew_kl":
        terms = kl(lt, log_mix(alpha, lt, ls))
    elif divergence == "skew_rkl":
        terms = kl(ls, log_mix(alpha, ls, lt))
    elif divergence == "symmetric_kl":
        terms = alpha * kl(lt, ls) + (1 - alpha) * kl(ls, lt)
    else:
        raise ValueError(divergence)
    return terms * temperature ** 2


def distillation_row_grads(student_logits, teacher_logits, temperature=1.0, beta=0.0, dloss=None):
    """Gradients (d_student, d_teacher) of sum_rows dloss[row] * (row sum of ``distillation_pointwise``), float64,
    in closed form (the tests check them against central differences of ``distillation_pointwise``). A class
    without mass in a distribution contributes nothing it weights."""
    temperature = float(temperature)
    ls = log_softmax(np.asarray(student_logits, np.float64) / temperature)
    lt = log_softmax(np.asarray(teacher_logits, np.float64) / temperature)
    ps, pt = np.exp(ls), np.exp(lt)

    def centered(p, terms):  # p * (terms - sum(p * terms)) over the classes with mass
        terms = np.where(p > 0, terms, 0.0)
        return np.where(p > 0, p * (terms - np.sum(p * terms, axis=-1, keepdims=True)), 0.0)

    with np.errstate(all="ignore"):
        if beta == 0:    # KL(P_t || P_s)
            ds, dt = ps - pt, centered(pt, lt - ls)
        elif beta == 1:  # KL(P_s || P_t)
            ds, dt = centered(ps, ls - lt), pt - ps
        else:            # a = (1 - beta) P_s (log P_s - log M), b = beta P_t (log P_t - log M)
            lm = np.logaddexp(ls + np.log1p(-beta), lt + np.log(beta))
            a = np.where(ps > 0, (1 - beta) * ps * (ls - lm), 0.0)
            b = np.where(pt > 0, beta * pt * (lt - lm), 0.0)
            ds = a - ps * a.sum(axis=-1, keepdims=True)
            dt = b - pt * b.sum(axis=-1, keepdims=True)
    g = temperature * (1.0 if dloss is None else np.asarray(dloss, np.float64)[..., None])
    return ds * g, dt * g


def _distill_keep(student_logits, labels, ignore_index):
    """The counted rows (bool, the leading shape), or None without labels."""
    return None if labels is None else np.asarray(labels) != ignore_index


def _distill_operands(student_logits, teacher_logits, keep):
    """float64 logits with ignored rows' logits replaced by zeros (they then influence nothing, NaN and inf
    included)."""
    s = np.asarray(student_logits, np.float64)
    t = np.asarray(teacher_logits, np.float64)
    if keep is not None:
        s = np.where(keep[..., None], s, 0.0)
        t = np.where(keep[..., None], t, 0.0)
    return s, t


def distillation_count(student_shape, reduction, keep=None):
    """What ``distillation_loss`` divides the sum of the counted rows by (1 for 'none' / 'sum'); 0 when there is
    nothing to count (no rows, or every row ignored), where the loss is 0."""
    student_shape = tuple(student_shape)
    rows = int(np.prod(student_shape[:-1], dtype=np.int64))
    vocab = student_shape[-1]
    if reduction in ("none", "sum"):
        return 1 if rows else 0
    if keep is not None:
        counted = int(np.sum(keep))
        return counted * vocab if reduction == "mean" else counted
    if reduction == "mean":
        return rows * vocab
    if reduction == "batchmean" and len(student_shape) > 1:
        return student_shape[0]
    return rows  # 'tokenmean', or 'batchmean' of 1-D logits (one row)


def distillation_loss(student_logits, teacher_logits, temperature=1.0, reduction="batchmean", beta=0.0,
                      labels=None, ignore_index=-100, weights=None, **variant):
    """``ms_kldiv.distillation_loss`` in float64. The teacher may broadcast to the student's shape. Rows whose label
    is ``ignore_index`` contribute 0 (their logits, NaN or inf included, are not used) and leave the counts; the sum
    is divided by ``distillation_count``; no rows or every row ignored gives 0 for every reduction. ``weights`` (the
    leading shape) multiply each row's terms; the means then divide by the sum of the counted rows' weights ('mean'
    also by V). ``variant``: divergence, alpha, softcap, logit_scale of ``distillation_pointwise``."""
    keep = _distill_keep(student_logits, labels, ignore_index)
    s, t = _distill_operands(student_logits, teacher_logits, keep)
    terms = np.broadcast_to(distillation_pointwise(s, t, temperature, beta, **variant), s.shape)
    if weights is not None:
        w = np.broadcast_to(np.asarray(weights, np.float64), s.shape[:-1])
        terms = terms * w[..., None]
    if keep is not None:
        terms = np.where(keep[..., None], terms, 0.0)
    if reduction == "none":
        return np.array(terms)
    count = distillation_count(s.shape, reduction, keep)
    if weights is not None and reduction not in ("sum", "none"):
        counted = w if keep is None else np.where(keep, w, 0.0)
        count = float(np.sum(counted)) * (s.shape[-1] if reduction == "mean" else 1)
    if count == 0:
        return np.asarray(0.0)
    with np.errstate(all="ignore"):
        return np.asarray(terms.sum() / count)


def distillation_grads(student_logits, teacher_logits, temperature=1.0, reduction="batchmean", beta=0.0,
                       labels=None, ignore_index=-100, dout=None):
    """(d_student, d_teacher) of ``sum(distillation_loss(...) * dout)``, float64, d_teacher summed back to the
    teacher's shape. ``dout``: the incoming gradient, broadcastable to the student's shape for 'none' (it may vary
    over the classes), a scalar otherwise; default ones. Ignored rows get exact zeros.

    In log space every term depends on its own class only: d term_j / d log P_s,j = a_j and d / d log P_t,j = b_j
    with a, b of ``distillation_row_grads`` (forward KL: a = -P_t, b = P_t (log P_t - log P_s + 1); reverse KL the
    mirror image), then the log-softmax's backward, times T^2 / T."""
    temperature = float(temperature)
    keep = _distill_keep(student_logits, labels, ignore_index)
    s, t = _distill_operands(student_logits, teacher_logits, keep)
    t_shape = t.shape
    ls = log_softmax(s / temperature)
    lt = np.broadcast_to(log_softmax(t / temperature), ls.shape)
    ps, pt = np.exp(ls), np.exp(lt)
    with np.errstate(all="ignore"):
        if beta == 0:
            a = -pt
            b = np.where(pt > 0, pt * (lt - ls + 1.0), 0.0)
        elif beta == 1:
            a = np.where(ps > 0, ps * (ls - lt + 1.0), 0.0)
            b = -ps
        else:
            lm = np.logaddexp(ls + np.log1p(-beta), lt + np.log(beta))
            a = np.where(ps > 0, (1 - beta) * ps * (ls - lm), 0.0)
            b = np.where(pt > 0, beta * pt * (lt - lm), 0.0)
        count = distillation_count(s.shape, reduction, keep)
        w = np.ones(()) if dout is None else np.asarray(dout, np.float64)
        w = np.broadcast_to(w if reduction == "none" else w / max(count, 1), ls.shape)
        if keep is not None:
            w = np.where(keep[..., None], w, 0.0)
        ga, gb = w * a, w * b
        ds = temperature * (ga - ps * ga.sum(axis=-1, keepdims=True))
        dt = temperature * (gb - pt * gb.sum(axis=-1, keepdims=True))
    if keep is not None:
        ds = np.where(keep[..., None], ds, 0.0)
        dt = np.where(keep[..., None], dt, 0.0)
    return ds, sum_to(dt, t_shape)


# ------------------------------------------------------------------------------------------ stored (sparse) teachers
SPARSE_MODES = ("renormalize", "tail", "sampled")
SPARSE_REDUCTIONS = ("none", "sum", "batchmean", "tokenmean")


def sparse_support(student_logits, teacher_ids, teacher_values, mode="renormalize", temperature=1.0,
                   teacher_temperature=1.0):
    """The two distributions a stored-teacher loss compares, over K + 1 buckets per row (the K ids, then the
    tail: every class not among the ids), as float64 log-probabilities (log r for the student, log q for the
    teacher), with the bucket of a padding id (negative) at -inf in both.

    - student: log r_i = log softmax(s / T)[id_i]; the tail bucket holds the student's mass off the ids.
    - 'renormalize': teacher logits over the ids (T0 / T) * logprob_i (T0 = ``teacher_temperature``), softmax over
      the ids; the tail bucket is empty (-inf).
    - 'tail': the same logits plus a tail bucket (T0 / T) * log(1 - sum_i exp(logprob_i)), softmax over the K + 1.
      At T = T0 the teacher keeps its own probabilities and its missing mass.
    - 'sampled': counts c_i; q_i = c_i / sum(c) (no re-tempering), tail empty.

    Where the student has no mass off the ids (the ids cover its vocabulary) there is no tail in either model."""
    s = np.asarray(student_logits, np.float64)
    ids = np.asarray(teacher_ids)
    vals = np.asarray(teacher_values, np.float64)
    valid = ids >= 0
    idc = np.where(valid, ids, 0)
    ls = log_softmax(s / temperature)
    log_r = np.where(valid, np.take_along_axis(ls, idc, -1), -np.inf)
    # classes off the ids; a padding id marks a spare column past the vocabulary
    off = np.ones(s.shape[:-1] + (s.shape[-1] + 1,), bool)
    np.put_along_axis(off, np.where(valid, ids, s.shape[-1]), False, -1)
    off = off[..., :-1]
    with np.errstate(all="ignore"):
        log_r_tail = np.log(np.sum(np.where(off, np.exp(ls), 0.0), -1))
        if mode == "sampled":
            y = np.where(valid, np.log(vals), -np.inf)
            y_tail = np.full(y.shape[:-1], -np.inf)
        else:
            ratio = teacher_temperature / temperature
            y = np.where(valid, ratio * vals, -np.inf)
            if mode == "tail":
                kept = np.log(np.sum(np.where(valid, np.exp(vals), 0.0), -1))
                y_tail = ratio * np.log(-np.expm1(np.minimum(kept, 0.0)))
            else:
                y_tail = np.full(y.shape[:-1], -np.inf)
        y_tail = np.where(log_r_tail == -np.inf, -np.inf, y_tail)
        log_q = log_softmax(np.concatenate([y, y_tail[..., None]], -1))
    return np.concatenate([log_r, log_r_tail[..., None]], -1), log_q


def _support_divergence(log_r, log_q, beta):
    """Row divergences over the buckets (the generalized JSD family of ``distillation_pointwise``), float64."""
    if beta == 0:
        terms = pointwise_loss(log_r, log_q, log_target=True)
    elif beta == 1:
        terms = pointwise_loss(log_q, log_r, log_target=True)
    else:
        with np.errstate(all="ignore"):
            lm = np.logaddexp(log_r + np.log1p(-beta), log_q + np.log(beta))
        terms = beta * pointwise_loss(lm, log_q, log_target=True) + (1 - beta) * pointwise_loss(lm, log_r, True)
    return terms.sum(-1)


def sparse_distillation_rows(student_logits, teacher_ids, teacher_values, mode="renormalize", temperature=1.0,
                             teacher_temperature=1.0, beta=0.0):
    """T^2 times each row's divergence between the stored teacher and the student (``sparse_support``), float64,
    the logits' leading shape. With ids covering the vocabulary it is ``distillation_pointwise(...).sum(-1)``."""
    log_r, log_q = sparse_support(student_logits, teacher_ids, teacher_values, mode, temperature,
                                  teacher_temperature)
    return _support_divergence(log_r, log_q, beta) * temperature ** 2


def sparse_distillation_loss(student_logits, teacher_ids, teacher_values, mode="renormalize", temperature=1.0,
                             teacher_temperature=1.0, beta=0.0, reduction="batchmean", labels=None,
                             ignore_index=-100):
    """``ms_kldiv.sparse_distillation_loss`` in float64: the row losses of ``sparse_distillation_rows``, rows whose
    label is ``ignore_index`` left out (their inputs unread), reduced as ``distillation_loss`` reduces (no 'mean';
    'none' gives the row losses)."""
    s = np.asarray(student_logits, np.float64)
    keep = _distill_keep(s, labels, ignore_index)
    ids = np.asarray(teacher_ids)
    vals = np.asarray(teacher_values, np.float64)
    if keep is not None:
        s = np.where(keep[..., None], s, 0.0)
        ids = np.where(keep[..., None], ids, -1)
        vals = np.where(keep[..., None], vals, 0.0)
    rows = sparse_distillation_rows(s, ids, vals, mode, temperature, teacher_temperature, beta)
    if keep is not None:
        rows = np.where(keep, rows, 0.0)
    if reduction == "none":
        return rows
    count = distillation_count(s.shape, reduction, keep)
    if count == 0:
        return np.asarray(0.0)
    with np.errstate(all="ignore"):
        return np.asarray(rows.sum() / count)


# ------------------------------------------------------------------------------------------ hard labels
def hard_label_rows(student_logits, labels, z_loss=0.0, label_smoothing=0.0, softcap=0.0, logit_scale=1.0,
                    ignore_index=-100):
    """(each row's cross-entropy, its gradient towards the raw logits) in float64: the fused head's hard-label term
    on the transformed logits z (PyTorch's label smoothing over the classes with a finite logit, PaLM's z-loss):
    (1 - eps) (lse - z_label) + eps (lse - mean of the finite z) + z_loss lse^2. Rows whose label is
    ``ignore_index``: 0 and zero gradients; a counted label outside [0, V): NaN."""
    raw = np.asarray(student_logits, np.float64)
    z = transformed(raw, softcap, logit_scale)
    labels = np.asarray(labels).astype(np.int64)
    keep = labels != ignore_index
    vocab = z.shape[-1]
    inside = (labels >= 0) & (labels < vocab)
    m = np.max(z, axis=-1, keepdims=True) if vocab else np.zeros(z.shape[:-1] + (1,))
    m = np.where(m == -np.inf, 0.0, m)
    with np.errstate(all="ignore"):
        lse = m + np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))  # NaN for a NaN or +inf logit
    log_p = z - lse
    finite = z > -np.inf
    classes = finite.sum(-1, keepdims=True)
    eps = label_smoothing
    hot = np.zeros_like(z)
    idx = np.where(keep & inside, labels, 0)
    np.put_along_axis(hot, idx[..., None], 1.0, -1)
    with np.errstate(all="ignore"):
        label_log_p = np.take_along_axis(log_p, idx[..., None], -1)[..., 0]
        smooth = np.where(finite, log_p, 0.0).sum(-1) / classes[..., 0]
        rows = -(1 - eps) * label_log_p - eps * smooth + z_loss * lse[..., 0] ** 2
        grad = np.exp(log_p) * (1 + 2 * z_loss * lse) - eps * finite / classes - (1 - eps) * hot
        if softcap > 0:
            th = np.tanh(raw * logit_scale / softcap)
            grad = grad * logit_scale * (1 - th * th)
        else:
            grad = grad * logit_scale
    rows = np.where(keep & ~inside, np.nan, np.where(keep, rows, 0.0))
    grad = np.where((keep & ~inside)[..., None], np.nan, np.where(keep[..., None], grad, 0.0))
    return rows, grad
