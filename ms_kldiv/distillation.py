"""Knowledge-distillation loss from raw logits, built on :func:`ms_kldiv.kl_div` (whichever backend is fastest).

Why a dedicated function: the usual hand-written version (``kl_div(log_softmax(s/T), softmax(t/T)) * T**2``)
has three traps that this one avoids. It feeds probabilities, whose logarithm the loss then recomputes less
accurately than ``log_softmax`` gives it (and in float16, probabilities below 6e-8 become 0); it uses 'mean',
which divides by the number of classes as well as the batch; and with MindSpore's ``ops.kl_div`` the teacher
gets no gradient, which silently breaks trainable teachers and mutual learning.
"""

import mindspore as ms
from mindspore import nn, ops
from mindspore.ops import constexpr

from . import _math, _validation
from ._compat import FullPrecisionCell
from ._distill_math import KL, Variant, _pairwise, constants, log_mixture, log_softmax_plain, transformed
from .backends import _device_target_const, check_name, choice_cache, compiled, distill, get_distill_kernels
from .backends.vocab_parallel import VocabParallelKernels, vocab_group
from .functional import kl_div
from .reference import DISTILL_REDUCTIONS

_NAME = "distillation_loss"


@constexpr
def _f64(value):
    return ms.Tensor(value, ms.float64)


@constexpr
def _squared(value):
    return ms.Tensor(value * value, ms.float64)


def _const(value, like):
    """A Python number as a 0-d tensor of ``like``'s dtype. MindSpore turns a bare Python float into float32
    before it meets a float64 tensor (``x + math.log(0.1)`` is off by 3e-8), and graph mode holds float
    constants as float32; a constexpr builds the tensor in Python, at full precision, in both modes."""
    return ops.cast(_f64(value), like.dtype)


def _check_options(temperature, reduction, beta, ignore_index, backend, name):
    _validation.check_temperature(temperature, name)
    _validation.check_reduction(reduction, True, name, DISTILL_REDUCTIONS)
    _validation.check_number(beta, "beta", name, 0.0, 1.0)
    _validation.check_ignore_index(ignore_index, name)
    # Up front: the composition reaches kl_div (which would check it) only after both log-softmaxes.
    _validation.check_backend(backend, name)
    check_name(backend, name)


def _check_sliced(group, reduction, num_items, name):
    """The checks of ``vocab_parallel_group`` and ``num_items_in_batch`` that need no tensor."""
    _validation.check_vocab_parallel(group, reduction, name)
    _validation.check_num_items(num_items, reduction, name)


def _sliced_shapes(student_shape, teacher_shape, name, names):
    """logits_shapes for a rank's slice of the vocabulary: a slice may be empty."""
    return _validation.logits_shapes(student_shape, teacher_shape, name, names, sliced=True)


def _check_args_host(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend,
                     name, weights, group, num_items):
    _check_options(temperature, reduction, beta, ignore_index, backend, name)
    _check_sliced(group, reduction, num_items, name)
    shapes = _validation.logits_shapes if group is None else _sliced_shapes
    dtype = _validation.check_tensors(student_logits, teacher_logits, name, ("student_logits", "teacher_logits"),
                                      min_rank=1, shapes=shapes)
    s_shape, t_shape = student_logits.shape, teacher_logits.shape
    if group is not None:
        _validation.check_vocab_parallel_dtype(dtype, name)
        if s_shape != t_shape:
            raise ValueError(f"For '{name}', 'vocab_parallel_group' needs student and teacher logits of one shape "
                             f"(each rank's slice of both), but got {s_shape} and {t_shape}.")
    if weights is not None:
        _validation.check_weights(weights, _validation.lead_of(s_shape), name)
    if labels is not None:
        if s_shape != t_shape:
            raise ValueError(f"For '{name}', 'labels' needs student and teacher logits of one shape, but got "
                             f"{s_shape} and {t_shape}.")
        _validation.check_labels(labels, _validation.lead_of(s_shape), name)
    return dtype


_checked_args = _validation.on_host(_check_args_host)


@_validation.on_host
def _check_call(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend, weights,
                group, num_items, divergence, alpha, softcap, logit_scale):
    """distillation_loss's checks: (promoted dtype, the fields of the checked ``Variant``)."""
    variant = _validation.check_variant(divergence, alpha, softcap, logit_scale, beta, _NAME)
    return (_check_args_host(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index,
                             backend, _NAME, weights, group, num_items),) + tuple(variant)


def _check_args(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend, name,
                weights=None, group=None, num_items=None):
    """All checks, before anything runs; returns the promoted dtype."""
    described = _validation.described
    return _checked_args(described(student_logits), described(teacher_logits), temperature, reduction, beta,
                         described(labels), ignore_index, backend, name, described(weights), group,
                         described(num_items))


def _log_probs(logits, temperature, compute_dtype, keep=None, variant=KL):
    if logits.dtype != compute_dtype:
        logits = ops.cast(logits, compute_dtype)
    if keep is not None:
        # Ignored rows' logits become zeros before any math: a NaN or inf there cannot reach the value or, through
        # a NaN x 0 product in some backward, a gradient (where's backward selects; it does not multiply).
        logits = ops.where(ops.expand_dims(keep, -1), logits, 0.0)
    logits = transformed(logits, variant)
    if temperature != 1:
        logits = logits / _const(temperature, logits)
    if compute_dtype == ms.float64:
        # MindSpore's CPU LogSoftmax computes float64 at float32 accuracy.
        return log_softmax_plain(logits)
    # log_softmax subtracts the row max, so large logits do not overflow, and -inf (masked) logits stay -inf.
    return ops.log_softmax(logits, -1)


def _divergence(log_p_student, log_p_teacher, beta, reduction, backend, variant=KL):
    """The divergence of the two log-distributions: forward KL (beta 0), reverse KL (beta 1), else the
    generalized Jensen-Shannon divergence beta * KL(P_t || M) + (1 - beta) * KL(P_s || M); the other divergences
    of ``variant`` from their pointwise terms."""
    if variant.divergence != "kl":
        terms = _pairwise(log_p_student, log_p_teacher, ops.exp(log_p_student), ops.exp(log_p_teacher), beta,
                          variant)[0]
        return terms if reduction == "none" else ops.sum(terms)
    if beta == 0:
        return kl_div(log_p_student, log_p_teacher, reduction=reduction, log_target=True, backend=backend)
    if beta == 1:
        return kl_div(log_p_teacher, log_p_student, reduction=reduction, log_target=True, backend=backend)
    w_teacher, w_student, log_w_teacher, log_w_student = constants(1.0, beta)[3:]
    log_m = log_mixture(log_p_student, log_p_teacher, ops.cast(log_w_teacher, log_p_teacher.dtype),
                        ops.cast(log_w_student, log_p_student.dtype))
    return (ops.cast(w_teacher, log_m.dtype) * kl_div(log_m, log_p_teacher, reduction=reduction, log_target=True,
                                                       backend=backend)
            + ops.cast(w_student, log_m.dtype) * kl_div(log_m, log_p_student, reduction=reduction, log_target=True,
                                                        backend=backend))


@choice_cache
def _fused_rows(backend, device, temperature, beta, graph, variant=KL):
    """(dtypes the kernels take, their per-row loss op) for these settings: the distillation kernels that the
    registry picks for ``backend`` on ``device`` for ``variant`` (RuntimeError when that backend cannot run them)."""
    _, kernels = get_distill_kernels(backend, device, variant, _NAME)
    return kernels.dtypes, distill.rows_op(kernels, temperature, beta, split=graph, variant=variant)


@choice_cache
def _sliced_rows(backend, device, temperature, beta, graph, variant, group):
    """As _fused_rows, for each rank's slice of the vocabulary in ``group``: the kernels merge the rows across it."""
    _, kernels = get_distill_kernels(backend, device, variant, _NAME, vocab_parallel=True)
    sliced = VocabParallelKernels(kernels, vocab_group(group))
    return sliced.dtypes, distill.rows_op(sliced, temperature, beta, split=graph, variant=variant)


def _fusable_fn(student_shape, teacher_shape, reduction):
    # The kernels take one shape [..., V] with V >= 1 known at compile time and some rows; 'none' needs the pointwise
    # [..., V] terms, which the composition gives. Dims unknown at compile time (None or -1) are trusted to match.
    s_shape, t_shape = tuple(student_shape), tuple(teacher_shape)
    vocab = s_shape[-1]
    return (reduction != "none" and s_shape == t_shape and vocab is not None and vocab > 0 and 0 not in s_shape)


# A constexpr: in graph code a comparison of dynamic dims is a run-time value, which a branch cannot join with a
# constant (a 'none' reduction with unknown rows failed to compile: "Type Join Failed: Bool, Any").
_fusable = constexpr(_fusable_fn, check=False)


def _takes_fused(student_logits, teacher_logits, reduction, dtype, dtypes):
    # A dtype the kernels take (float64 runs the composition).
    return dtype in dtypes and _fusable(_shape(student_logits), _shape(teacher_logits), reduction)


def _known_size(dims):
    """The product of ``dims``, or -1 if one is unknown at compile time (None or negative under dynamic shapes)."""
    n = 1
    for d in dims:
        if d is None or d < 0:
            return -1
        n *= d
    return n


def _known_rows_fn(shape):
    if -2 in shape:  # an unknown rank
        return -1
    return 1 if len(shape) == 1 else _known_size(shape[:-1])


# ``ops.shape`` for the constexprs below, an unknown rank as (-2,)
_static_shape = constexpr(_validation.static_shape, check=False)


def _shape(x):
    return _static_shape(ops.shape(x))


# Constexprs: plain Python on the shape, evaluated at compile time in graph mode (unknown dims arrive as None or -1).
_known_rows = constexpr(_known_rows_fn, check=False)
_known_numel = constexpr(_known_size, check=False)


def _known_dim0_fn(shape):
    return _known_size(shape[:1])


_known_dim0 = constexpr(_known_dim0_fn, check=False)


def _shapes_differ_fn(shape_a, shape_b):
    return tuple(shape_a) != tuple(shape_b)


_shapes_differ = constexpr(_shapes_differ_fn, check=False)


def _dims_product(x, dims, like):
    """The product of ``x``'s dims at run time, a 0-d tensor of ``like``'s dtype: 'dim0' the first, 'rows' all but
    the last (rank >= 2), 'vocab' the last, 'all' every one. Slices of ``dyn_shape``, never an integer index, which
    fails under PyNative grad of grad."""
    sizes = ops.dyn_shape(x)
    if dims == "dim0":
        sizes = sizes[:1]
    elif dims == "rows":
        sizes = sizes[:-1]
    elif dims == "vocab":
        sizes = sizes[-1:]
    return ops.cast(ops.prod(ops.cast(sizes, ms.float64)), like.dtype)


def _count(known, x, dims, like):
    return _const(float(known), like) if known >= 0 else _dims_product(x, dims, like)


def _reduce(total, student_logits, reduction, keep, weights=None):
    """The reduction of ``total``, the sum of the counted rows' terms, by the count ``reduction`` names:

    - 'sum': none; 'batchmean': student_logits.shape[0] (1 for 1-D logits) without labels, the counted rows with
      labels; 'tokenmean': the counted rows (every position of the leading dims without labels); 'mean': the
      counted rows x V (all elements without labels).
    - No rows, or every row ignored: 0, whatever the reduction. MindSpore's CPU ReduceSum of an empty tensor
      returns uninitialized memory (docs/mindspore-notes.md), so where the row count is not known to be positive
      at compile time (empty shapes, dynamic shapes) the result is selected by the row count at run time.
    """
    shape = _shape(student_logits)
    if reduction == "sum":
        loss = total
    elif weights is not None:
        # weighted rows: the means divide by the counted rows' weights (0 when they sum to 0)
        counted = ops.sum(weights if keep is None else ops.where(keep, weights, 0.0))
        if reduction == "mean":
            counted = counted * _count(_known_numel(shape[-1:]), student_logits, "vocab", total)
        loss = _math.over_count(total, counted)
    elif keep is not None:
        counted = ops.sum(ops.cast(keep, total.dtype))
        if reduction == "mean":
            counted = counted * _count(_known_numel(shape[-1:]), student_logits, "vocab", total)
        loss = total / ops.maximum(counted, 1.0)
    elif len(shape) == 1 and reduction != "mean":
        loss = total  # a 1-D logits vector is one sample, one row
    else:
        if reduction == "batchmean":
            known, dims = _known_dim0(shape), "dim0"
        elif reduction == "tokenmean":
            known, dims = _known_rows(shape), "rows"
        else:
            known, dims = _known_numel(shape), "all"
        loss = total / ops.maximum(_count(known, student_logits, dims, total), 1.0)
    rows = _known_rows(shape)
    if rows > 0:
        return loss
    return ops.where(_count(rows, student_logits, "rows", total) > 0, loss, 0.0)


def _compute_dtype(dtype, upcast):
    """Half types compute in float32: softmax in float16 loses most of the tail mass the student learns from.
    With ``upcast`` (the composition on CPU/GPU) float32 computes in float64: MindSpore 2.10's CPU float32 exp and
    log are several ulp off (docs/mindspore-notes.md), which put the composite loss 1e-6..1e-5 relative off the
    exact value where the fused kernels, which accumulate in double, are ~1e-8."""
    if dtype in _validation.HALF_DTYPES:
        return ms.float32
    if dtype == ms.float32 and upcast:
        return ms.float64
    return dtype


@constexpr
def _upcasts(device):
    # Ascend's vector units have no float64 exp/log: the composition stays float32 there.
    return device in ("CPU", "GPU")


def _row_weights(weights, keep, dtype):
    """The weights in ``dtype`` (a negative one NaN, ``_math.checked_weights``) with ignored rows' set to 0 (a bad
    weight there must not reach anything)."""
    w = _math.checked_weights(weights, dtype)
    return w if keep is None else ops.where(keep, w, 0.0)


def _distill_sliced(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend,
                    dtype, variant, weights, group):
    """The loss of logits whose vocabulary is split across ``group`` (each rank its slice [..., V_r]): every rank
    gets the whole loss, and its slices' gradients."""
    if _validation.no_rows(ops.shape(student_logits)):
        # an empty batch on every rank: 0 and no collective (whose gradients MindSpore cannot run on no rows)
        return ops.zeros((), dtype)
    keep = None if labels is None else labels != ignore_index
    device = _device_target_const()
    graph = compiled(student_logits)
    dtypes, rows_op = _sliced_rows(backend, device, temperature, beta, graph, variant, group)
    kernel_dtype = dtype if dtype in dtypes else ms.float32
    vocab = student_logits.shape[-1]
    # (a cast only where the dtype changes: a cast to the same dtype copies the logits)
    s2 = student_logits if student_logits.dtype == kernel_dtype else ops.cast(student_logits, kernel_dtype)
    t2 = teacher_logits if teacher_logits.dtype == kernel_dtype else ops.cast(teacher_logits, kernel_dtype)
    if len(ops.shape(s2)) != 2:
        s2, t2 = ops.reshape(s2, (-1, vocab)), ops.reshape(t2, (-1, vocab))
    rows = rows_op(s2, t2)
    w = None if weights is None else _row_weights(weights, keep, rows.dtype)
    if w is not None:
        rows = rows * ops.reshape(w, (-1,))
    if keep is not None:
        rows = ops.where(ops.reshape(keep, (-1,)), rows, 0.0)
    loss = _reduce(ops.sum(rows), student_logits, reduction, keep, w)
    return loss if dtype == ms.float32 else ops.cast(loss, dtype)


def _distill(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend, dtype,
             variant=KL, weights=None, group=None, num_items=None):
    if num_items is not None:
        # the counted rows' sum over the caller's count (e.g. the whole global batch's tokens)
        reduction = "sum"
    if group is not None:
        loss = _distill_sliced(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index,
                               backend, dtype, variant, weights, group)
    else:
        loss = _distill_whole(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index,
                              backend, dtype, variant, weights)
    if num_items is not None:
        loss = _math.over_count(loss, num_items)
    return loss


def _distill_whole(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend,
                   dtype, variant, weights):
    keep = None if labels is None else labels != ignore_index
    device = _device_target_const()
    graph = compiled(student_logits)
    dtypes, rows_op = _fused_rows(backend, device, temperature, beta, graph, variant)
    if _takes_fused(student_logits, teacher_logits, reduction, dtype, dtypes):
        if student_logits.dtype != dtype:
            student_logits = ops.cast(student_logits, dtype)
        if teacher_logits.dtype != dtype:
            teacher_logits = ops.cast(teacher_logits, dtype)
        rows = rows_op(student_logits, teacher_logits)
        w = None if weights is None else _row_weights(weights, keep, rows.dtype)
        if w is not None:
            rows = rows * w
        if keep is not None:
            rows = ops.where(keep, rows, 0.0)
        loss = _reduce(ops.sum(rows), student_logits, reduction, keep, w)
        return loss if dtype == ms.float32 else ops.cast(loss, dtype)
    return _compose(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend,
                    dtype, _compute_dtype(dtype, _upcasts(device)), variant, weights)


def _compose(student_logits, teacher_logits, temperature, reduction, beta, labels, ignore_index, backend, dtype,
             compute_dtype=None, variant=KL, weights=None):
    """Two log-softmaxes and kl_div (the other divergences: their pointwise terms): every shape, dtype, reduction
    and device. ``compute_dtype``: the dtype of the math (default: float32 for half types, else ``dtype``, what a
    user's own composition computes in)."""
    if compute_dtype is None:
        compute_dtype = _compute_dtype(dtype, False)
    keep = None if labels is None else labels != ignore_index
    log_p_student = _log_probs(student_logits, temperature, compute_dtype, keep, variant)
    log_p_teacher = _log_probs(teacher_logits, temperature, compute_dtype, keep, variant)
    if _known_rows(_shape(student_logits)) <= 0 and _shapes_differ(_shape(student_logits), _shape(teacher_logits)):
        # Autodiff sums a broadcast teacher's gradient back to its shape with ReduceSum, which returns uninitialized
        # memory on CPU when the student has no rows: where the row count may be 0, the teacher's gradient passes
        # a select on it (a select, unlike a product, drops a garbage cotangent).
        has_rows = _count(-1, student_logits, "rows", log_p_teacher) > 0
        log_p_teacher = ops.where(has_rows, log_p_teacher, ops.stop_gradient(log_p_teacher))
    w = None if weights is None else _row_weights(weights, keep, compute_dtype)
    if reduction == "none":
        loss = _divergence(log_p_student, log_p_teacher, beta, "none", backend, variant)
        if w is not None:
            loss = loss * ops.expand_dims(w, -1)
        if keep is not None:
            loss = ops.where(ops.expand_dims(keep, -1), loss, 0.0)
    elif keep is None and w is None:
        # kl_div's own 'sum' (0 for empty operands); the count is ours: kl_div's 'batchmean' would divide by its
        # first operand's rows, the teacher's for reverse KL, which may be broadcast.
        loss = _reduce(_divergence(log_p_student, log_p_teacher, beta, "sum", backend, variant), student_logits,
                       reduction, None)
    else:
        # Rows whose label is ignore_index contribute 0 and leave the counts; weights scale their rows.
        pointwise = _divergence(log_p_student, log_p_teacher, beta, "none", backend, variant)
        if w is not None:
            pointwise = pointwise * ops.expand_dims(w, -1)
        if keep is not None:
            pointwise = ops.where(ops.expand_dims(keep, -1), pointwise, 0.0)
        loss = _reduce(ops.sum(pointwise), student_logits, reduction, keep, w)
    if temperature != 1:
        loss = loss * ops.cast(_squared(temperature), loss.dtype)
    # kl_div returns compute_dtype; decided from the constants rather than loss.dtype, which a custom op's
    # Python type inference leaves unknown until run time in a dynamic-shape graph.
    if compute_dtype != dtype:
        loss = ops.cast(loss, dtype)
    return loss


def distillation_loss(student_logits, teacher_logits, temperature=1.0, reduction="batchmean", *, beta=0.0,
                      labels=None, ignore_index=-100, backend="auto", divergence="kl", alpha=None, weights=None,
                      softcap=None, logit_scale=1.0, vocab_parallel_group=None, num_items_in_batch=None):
    r"""
    Knowledge-distillation loss (Hinton et al., 2015) from raw logits: a temperature-scaled divergence between
    the teacher's and the student's distributions over the last axis, forward KL by default.

    .. math::
        \begin{aligned}
        P_t &= \operatorname{softmax}(z_{teacher} / T), \qquad P_s = \operatorname{softmax}(z_{student} / T),
        \qquad M = \beta P_t + (1 - \beta) P_s \\
        \ell &= T^2 \cdot \begin{cases} \mathrm{KL}(P_t \,\|\, P_s) & \beta = 0 \\
                 \mathrm{KL}(P_s \,\|\, P_t) & \beta = 1 \\
                 \beta\,\mathrm{KL}(P_t \,\|\, M) + (1 - \beta)\,\mathrm{KL}(P_s \,\|\, M) & 0 < \beta < 1
                 \end{cases}
        \end{aligned}

    For :math:`0 < \beta < 1` this is TRL's ``generalized_jsd_loss`` times :math:`T^2` (Liger-Kernel's
    ``LigerJSD`` with the same ``beta``); :math:`\beta = 0` is torchtune's ``ForwardKLLoss`` and
    :math:`\beta = 1` its ``ReverseKLLoss``, both times :math:`T^2`.

    Soft-target gradients shrink as :math:`1/T^2`; the :math:`T^2` factor keeps their scale roughly independent
    of :math:`T`, so the loss can be mixed with a cross-entropy term without retuning the weight. Both
    log-distributions come from a numerically stable ``log_softmax`` and are passed to :func:`ms_kldiv.kl_div`
    with ``log_target=True``, so the teacher's log-probabilities are used as computed and the fastest
    available backend does the work.

    Gradients flow to **both** `student_logits` and `teacher_logits` (trainable teachers, mutual learning).
    Call ``ops.stop_gradient`` on the teacher logits for classic distillation from a frozen teacher.

    Masked classes (logit :math:`-\infty`, e.g. padded vocabulary entries):

    - masked in the teacher: :math:`q_c = 0`, so the class contributes exactly 0 to the loss and to both
      gradients, whatever the student says;
    - masked in both: 0, with no NaN in the loss or the gradients;
    - masked only in the student while the teacher gives it mass: the loss is :math:`+\infty`, as the
      mathematics says (the student rules out an outcome the teacher considers possible); the gradient
      reaching the teacher is then not finite either. Mask both sides the same way.

    Edges (the same on every backend, in PyNative and graph mode; docs/SPEC.md has the full table):

    - A counted row with no distribution in a model (all its logits :math:`-\infty`, or a NaN or :math:`+\infty`
      among them) gives NaN. Give padded rows `labels` equal to `ignore_index` instead.
    - Rows whose label is `ignore_index` influence nothing: their logits are replaced by zeros before any math,
      so NaN or inf there reaches neither the value nor a gradient, and their gradients are exact zeros.
    - No rows (a leading dim of 0), or every row ignored: 0 for every reduction, gradients 0 (empty).
    - `labels` are only compared with `ignore_index`: any other value counts the row (they are not class indices).

    Args:
        student_logits (Tensor): Logits of the student, classes on the last axis. float16, bfloat16, float32
            or float64, at least 1-D, at least one class.
        teacher_logits (Tensor): Logits of the teacher with as many classes as the student, of the student's shape
            or broadcasting to it (e.g. ``[V]`` or ``[1, V]``: one teacher distribution for every student row). A
            student shape that would itself need broadcasting is refused: its rows are the samples the reductions
            count.
        temperature (Union[int, float], optional): Softmax temperature :math:`T > 0`. Default: ``1.0``.
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'batchmean'`` | ``'sum'`` | ``'tokenmean'``: the sum
            of the counted rows' divergences divided by

            - ``'batchmean'``: ``student_logits.shape[0]`` without `labels` (a 1-D `student_logits` is one sample),
              **but the number of counted rows with** `labels`. On ``[B, S, V]`` logits that is B (the loss per
              sequence) without labels and the number of counted tokens (the loss per token) with them, as TRL
              and Liger-Kernel do for their flattened ``[B * S, V]``. Kept for compatibility; say
              ``'tokenmean'`` to get the per-token loss either way.
            - ``'tokenmean'``: the number of counted rows: every position of the leading dims (``B * S``) without
              `labels`, those whose label is not `ignore_index` with them.
            - ``'mean'``: the counted rows times the number of classes; ``'sum'``: nothing.

            Default: ``'batchmean'``.
        beta (float, optional): Interpolation in [0, 1] between forward KL (0) and reverse KL (1); in between,
            the generalized Jensen-Shannon divergence. Default: ``0.0``.
        labels (Tensor, optional): int32/int64 labels of the logits' leading shape (one per row/token); rows
            whose label equals `ignore_index` contribute 0 and are left out of the counts; all rows ignored gives
            0. Needs logits of one shape. Default: ``None``.
        ignore_index (int, optional): The label of ignored rows, within int32's range. Default: ``-100``.
        divergence (str, optional): ``'kl'`` (the family above, by `beta`), ``'tvd'`` (:math:`\tfrac12\sum|P_s -
            P_t|`, Liger's ``LigerTVDLoss``), ``'skew_kl'`` (:math:`\mathrm{KL}(P_t \| \alpha P_t + (1-\alpha) P_s)`)
            / ``'skew_rkl'`` (:math:`\mathrm{KL}(P_s \| \alpha P_s + (1-\alpha) P_t)`, DistiLLM), ``'symmetric_kl'``
            (:math:`\alpha\,\mathrm{KL}(P_t\|P_s) + (1-\alpha)\,\mathrm{KL}(P_s\|P_t)`, torchtune's
            ``SymmetricKLLoss`` with ``sym_kd_ratio=alpha``); each times :math:`T^2`. Default: ``'kl'``.
        alpha (float, optional): The skew (default 0.1, DistiLLM's) or the forward-KL share of 'symmetric_kl'
            (default 0.5); only for those divergences.
        weights (Tensor, optional): Float weights of the logits' leading shape (>= 0): each row's divergence is
            multiplied by its weight and the means divide by the sum of the counted rows' weights ('mean' also by V)
            instead of their number; 0 when they sum to 0. Default: ``None``.
        softcap (float, optional): Soft-cap both models' logits, :math:`c \tanh(z / c)` (Gemma's
            ``final_logit_softcapping``), before the temperature. Default: ``None``.
        logit_scale (float, optional): Multiply both models' logits by this (> 0, Cohere's ``logit_scale``) before
            the soft cap and the temperature. Default: ``1.0``.
        vocab_parallel_group (str, optional): The name of a communication group whose ranks each hold a contiguous
            slice of the vocabulary, in rank order (tensor parallelism): the logits are then this rank's slice
            ``[..., V_r]`` of both models (one shape; V_r may differ across ranks), and every rank gets the loss of
            the whole rows and the gradients of its slices (docs/vocab_parallel.md). Reductions 'sum', 'batchmean',
            'tokenmean'; first-order gradients. Default: ``None``.
        num_items_in_batch (Union[int, float, Tensor], optional): With 'batchmean' or 'tokenmean': divide the sum
            of the counted rows' (weighted) divergences by this instead of the local count, e.g. the counted tokens
            of the whole global batch across data-parallel ranks and gradient-accumulation steps, so that the
            micro-batches' losses add up to the batch's. A count of 0 (no token counted anywhere) gives
            0. Default: ``None``.
        backend (str, optional): ``'auto'`` or a name from :func:`ms_kldiv.backend_names`, checked before anything
            runs. ``'auto'`` / ``'aot'`` use the fused distillation kernels where they run (CPU, GPU, Ascend with its
            operators installed) for one shape of float32/half logits and a reducing `reduction`; otherwise, and on
            ``'composite'``, two log-softmaxes and the divergence's pointwise terms. Backends that implement kl_div
            only (``'akg'``, ``'native'``; ``ms_kldiv.backend_info(op='distillation')``) raise RuntimeError, from
            the Cell's constructor for :class:`DistillationLoss`. On CPU and GPU that composition computes float32
            logits in float64 (MindSpore's float32 ``exp`` / ``log`` are several ulp off; the result is within float32 rounding of the exact loss); on Ascend it computes in
            float32 (about 1e-5 relative). Default: ``'auto'``.

    Returns:
        Tensor of the promoted dtype of the two logits: the student's shape for ``'none'``, else 0-d.
        float16/bfloat16 logits are computed in float32 and the result is cast back.

    Raises:
        TypeError: If a logits argument is not a floating-point Tensor, `temperature` is not an int or float,
            `reduction` or `backend` is not a str, or `labels` is not an int32/int64 Tensor.
        ValueError: If `temperature` is not positive and finite, `reduction` or `backend` is unknown, a logits
            Tensor is 0-d, the numbers of classes differ or are 0, the teacher does not broadcast to the student's
            shape, or `labels` does not have the logits' leading shape.
        RuntimeError: If the requested `backend` cannot run distillation on the current device target (the message
            gives the registry's reason, e.g. a backend that implements kl_div only).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import ms_kldiv
        >>> student = ms.Tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], ms.float32)
        >>> teacher = ms.Tensor([[2.0, 1.0, 0.0], [0.5, -2.0, 4.0]], ms.float32)
        >>> loss = ms_kldiv.distillation_loss(student, teacher, temperature=2.0)
        >>> print(loss.shape, loss.dtype, f"{float(loss):.4f}")
        () Float32 0.2660
    """
    dtype, *variant = _check_call(_validation.described(student_logits), _validation.described(teacher_logits),
                                  temperature, reduction, beta, _validation.described(labels), ignore_index, backend,
                                  _validation.described(weights), vocab_parallel_group,
                                  _validation.described(num_items_in_batch), divergence, alpha, softcap, logit_scale)
    variant = Variant(*variant)
    if weights is not None and not compiled(weights):
        _validation.check_weights_data(weights, _NAME)
    if num_items_in_batch is not None and not compiled(student_logits):
        _validation.check_num_items_data(num_items_in_batch, _NAME)
    # Python numbers from here (NumPy scalars are accepted; kernels and constants are keyed on plain numbers)
    return _distill(student_logits, teacher_logits, float(temperature), reduction, float(beta), labels,
                    int(ignore_index), backend, dtype, variant, weights, vocab_parallel_group, num_items_in_batch)


class DistillationLoss(FullPrecisionCell, nn.Cell):
    r"""
    The ``nn.Cell`` form of :func:`ms_kldiv.distillation_loss`:
    :math:`T^2 \cdot \mathrm{KL}(\operatorname{softmax}(z_t/T) \,\|\, \operatorname{softmax}(z_s/T))`.

    Args:
        temperature (Union[int, float], optional): Softmax temperature :math:`T > 0`. Default: ``1.0``.
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'batchmean'`` | ``'sum'`` | ``'tokenmean'``, as in
            :func:`ms_kldiv.distillation_loss`: on ``[B, S, V]`` logits ``'batchmean'`` divides by B without labels
            and by the counted tokens with labels; ``'tokenmean'`` divides by the counted tokens either way.
            Default: ``'batchmean'``.
        beta (float, optional): 0 forward KL, 1 reverse KL, in between generalized JSD. Default: ``0.0``.
        ignore_index (int, optional): The label of ignored rows. Default: ``-100``.
        backend (str, optional): Implementation, as in :func:`ms_kldiv.kl_div`. Default: ``'auto'``.
        divergence, alpha, softcap, logit_scale, vocab_parallel_group: As in :func:`ms_kldiv.distillation_loss`.

    Inputs:
        - **student_logits** (Tensor) - Logits of the student, classes on the last axis.
        - **teacher_logits** (Tensor) - Logits of the teacher, of the student's shape or broadcasting to it.
        - **labels** (Tensor, optional) - Labels of the leading shape; rows equal to `ignore_index` are ignored.
        - **weights** (Tensor, optional) - Float weights of the leading shape, as in the functional.
        - **num_items_in_batch** (Union[int, float, Tensor], optional) - The count 'batchmean' / 'tokenmean' divide
          by, as in the functional.

    Outputs:
        Tensor of the promoted dtype: the student's shape for ``'none'``, else a 0-d Tensor.

    Raises:
        TypeError, ValueError: As :func:`ms_kldiv.distillation_loss`; argument errors are raised by the
            constructor, input errors at the call (or at graph compile time).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, temperature=1.0, reduction="batchmean", *, beta=0.0, ignore_index=-100, backend="auto",
                 divergence="kl", alpha=None, softcap=None, logit_scale=1.0, vocab_parallel_group=None):
        super().__init__()
        _check_options(temperature, reduction, beta, ignore_index, backend, "DistillationLoss")
        _check_sliced(vocab_parallel_group, reduction, None, "DistillationLoss")
        self.vocab_parallel_group = vocab_parallel_group
        self.variant = _validation.check_variant(divergence, alpha, softcap, logit_scale, beta, "DistillationLoss")
        self.temperature = float(temperature)
        self.reduction = reduction
        self.beta = float(beta)
        self.ignore_index = int(ignore_index)
        self.backend = backend
        # a backend that cannot run this loss here raises now, for this Cell, not at its first call
        get_distill_kernels(backend, variant=self.variant, caller="DistillationLoss",
                            vocab_parallel=vocab_parallel_group is not None)

    def construct(self, student_logits, teacher_logits, labels=None, weights=None, num_items_in_batch=None):
        dtype = _check_args(student_logits, teacher_logits, self.temperature, self.reduction, self.beta, labels,
                            self.ignore_index, self.backend, "DistillationLoss", weights, self.vocab_parallel_group,
                            num_items_in_batch)
        if weights is not None and not compiled(weights):
            _validation.check_weights_data(weights, "DistillationLoss")
        if num_items_in_batch is not None and not compiled(student_logits):
            _validation.check_num_items_data(num_items_in_batch, "DistillationLoss")
        return _distill(student_logits, teacher_logits, self.temperature, self.reduction, self.beta, labels,
                        self.ignore_index, self.backend, dtype, self.variant, weights, self.vocab_parallel_group,
                        num_items_in_batch)

    def extend_repr(self):
        return (f"temperature={self.temperature}, reduction={self.reduction!r}, beta={self.beta}, "
                f"ignore_index={self.ignore_index}, backend={self.backend!r}, divergence={self.variant.divergence!r}, "
                f"alpha={self.variant.alpha}, softcap={self.variant.softcap}, logit_scale={self.variant.logit_scale}")
