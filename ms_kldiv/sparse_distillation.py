"""Distillation from a stored teacher: the teacher's top-k (or sampled) ids and values instead of its logits.

A teacher run once, offline, keeps per token K ids and their log-probabilities (top-k) or counts (sampled):
top-64 in bfloat16 with int32 ids is 384 bytes per token where dense float32 logits at V = 151,936 are 600 KB.
``sparse_distillation_loss`` compares that with the student's full-vocabulary logits in fused kernels: one read of
each student row (online log-sum-exp) plus K gathers forward, one write backward, no [N, V] buffer but the
gradient. The math is ``ms_kldiv._sparse_math``; ``ms_kldiv.reference.sparse_support`` is its float64 definition.
"""
import functools

import mindspore as ms
from mindspore import nn, ops

from . import _math, _validation
from ._compat import FullPrecisionCell
from ._sparse_math import int32_ids
from .backends import _device_target_const, check_name_const, choice_cache, compiled, get_kernels, sparse
from .backends.vocab_parallel import SlicedSparseKernels, vocab_group
from .distillation import _reduce
from .reference import SPARSE_REDUCTIONS

_NAME = "sparse_distillation_loss"
_OP = "sparse_distillation"


@_validation.on_host
def _check_options(mode, temperature, teacher_temperature, beta, reduction, ignore_index, backend, name):
    """The options (on the host: in graph code the messages were otherwise re-quoted into a compiled raise)."""
    _validation.check_stored_options(mode, teacher_temperature, beta, name)
    _validation.check_temperature(temperature, name)
    if isinstance(reduction, str) and reduction == "mean":
        raise ValueError(f"For '{name}', 'reduction' 'mean' (divide by rows x V) has no meaning for a sparse "
                         f"teacher; use 'batchmean' or 'tokenmean'.")
    _validation.check_reduction(reduction, True, name, SPARSE_REDUCTIONS)
    _validation.check_ignore_index(ignore_index, name)
    _validation.check_backend(backend, name)
    check_name_const(backend, name)


def _check_args_host(student_logits, teacher_ids, teacher_values, mode, labels, name, reduction, num_items,
                     sliced=False):
    """Types, dtypes and shapes (``_validation.on_host``: at graph compile time, nothing of it in the graph)."""
    _validation.check_num_items(num_items, reduction, name)
    if not _validation.is_tensor(student_logits):
        raise TypeError(f"For '{name}', 'student_logits' must be a mindspore.Tensor, "
                        f"but got {type(student_logits).__name__}.")
    if student_logits.dtype not in _validation.FLOAT_DTYPES:
        raise TypeError(f"For '{name}', 'student_logits' must have a floating dtype (float16, bfloat16, float32, "
                        f"float64), but got {student_logits.dtype}.")
    s_shape = tuple(_validation.shape_of(student_logits))
    if not s_shape:
        raise ValueError(f"For '{name}', 'student_logits' must have at least 1 dimension (the classes on the last "
                         f"axis), but got a 0-d Tensor.")
    _validation.stored_vocab(s_shape, name, sliced)
    _validation.check_stored_teacher(teacher_ids, teacher_values, _validation.lead_of(s_shape), mode, name)
    if labels is not None:
        _validation.check_labels(labels, (None,), name)
        _validation.leading_shape(_validation.shape_of(labels), _validation.lead_of(s_shape), "labels", name)


_checked_args = _validation.on_host(_check_args_host)


def _check_args(student_logits, teacher_ids, teacher_values, mode, labels, name, reduction, num_items, sliced=False):
    """``sliced``: the logits are a rank's slice of the vocabulary (which may be empty)."""
    described = _validation.described
    _checked_args(described(student_logits), described(teacher_ids), described(teacher_values), mode,
                  described(labels), name, reduction, described(num_items), sliced)


@choice_cache
def _rows_op(backend, device, dtype, mode, temperature, teacher_temperature, beta):
    """The per-row loss op for these settings: the registry's kernels for ``backend``; float64 logits take the
    composite kernels (the fused ones are float32 inside)."""
    _, kernels = get_kernels(_OP, backend, device, _NAME)
    if dtype not in kernels.dtypes:
        _, kernels = get_kernels(_OP, "composite", device)
    ratio = 1.0 if mode == "sampled" else teacher_temperature / temperature
    return sparse.rows_op(kernels, temperature, ratio, beta, mode == "tail")


@functools.lru_cache(maxsize=None)
def _sliced_rows_op(group, mode, temperature, teacher_temperature, beta):
    """The per-row loss op on this rank's slice of the vocabulary in ``group`` (MindSpore ops: no fused kernel has
    the stored teacher's slice entry points yet)."""
    ratio = 1.0 if mode == "sampled" else teacher_temperature / temperature
    return sparse.rows_op(SlicedSparseKernels(vocab_group(group)), temperature, ratio, beta, mode == "tail")


def _sparse(student_logits, teacher_ids, teacher_values, mode, temperature, teacher_temperature, beta, reduction,
            labels, ignore_index, backend, group=None, num_items=None, name=_NAME):
    if not compiled(student_logits):
        # with a vocabulary split across ranks no rank knows V here: an id past it makes its row NaN
        vocab = student_logits.shape[-1] if group is None else 2**62
        _validation.check_stored_data(teacher_ids, teacher_values, vocab, mode, labels, ignore_index, name)
        if num_items is not None:
            _validation.check_num_items_data(num_items, name)
    dtype = student_logits.dtype
    if group is not None and reduction != "none" and _validation.no_rows(ops.shape(student_logits)):
        # an empty batch on every rank: 0 and no collective (whose gradients MindSpore cannot run on no rows)
        return ops.zeros((), dtype)
    if group is None:
        rows_op = _rows_op(backend, _device_target_const(), dtype, mode, temperature, teacher_temperature, beta)
    else:
        rows_op = _sliced_rows_op(group, mode, temperature, teacher_temperature, beta)
    # the kernels take any leading shape (no reshape: MindSpore's CPU Reshape has no bfloat16 in graph mode)
    s = student_logits
    ids = int32_ids(teacher_ids)
    # float64 logits are computed in float64 with the values as given (cast to float32 first, they lost 5e-8)
    values = ops.cast(teacher_values, ms.float64 if dtype == ms.float64 and group is None else ms.float32)
    if mode == "sampled":
        values = ops.log(values)
    keep = None
    if labels is not None:
        # Ignored rows: the kernels see padding ids; their loss is selected away (NaN logits there included) and
        # their incoming gradient is 0, for which the backward writes zeros without reading the row.
        keep = labels != ignore_index
        ids = ops.where(ops.expand_dims(keep, -1), ids, -1)
        values = ops.where(ops.expand_dims(keep, -1), values, 0.0)
    rows = rows_op(s, ids, values)
    if keep is not None:
        rows = ops.where(keep, rows, 0.0)
    if reduction == "none":
        loss = rows
    elif num_items is not None:  # the caller's count (e.g. the whole global batch's tokens)
        loss = _math.over_count(_reduce(ops.sum(rows), student_logits, "sum", keep), num_items)
    else:
        loss = _reduce(ops.sum(rows), student_logits, reduction, keep)
    return loss if loss.dtype == dtype else ops.cast(loss, dtype)


def sparse_distillation_loss(student_logits, teacher_ids, teacher_values, *, mode="renormalize", temperature=1.0,
                             teacher_temperature=1.0, beta=0.0, reduction="batchmean", labels=None,
                             ignore_index=-100, backend="auto", vocab_parallel_group=None, num_items_in_batch=None):
    r"""
    Knowledge distillation from a stored teacher: K ids per token with the teacher's log-probabilities (top-k) or
    sample counts, against the student's logits over the full vocabulary.

    Both models become distributions over K + 1 buckets, the ids and the *tail* (every other class). The student's
    are exact: :math:`r_i = \operatorname{softmax}(s/T)[id_i]`, :math:`r_{tail}` its mass off the ids. The teacher's
    depend on `mode`:

    - ``'renormalize'`` (DistillKit's default): :math:`q = \operatorname{softmax}((T_0/T)\,\ell)` over the ids,
      :math:`\ell` the stored log-probabilities at :math:`T_0` = `teacher_temperature`; no tail. The loss is exactly
      :func:`ms_kldiv.distillation_loss` against a teacher whose logits are :math:`T_0 \ell` on the ids and
      :math:`-\infty` elsewhere. Forward KL is then :math:`\sum_i q_i (\log q_i - \log r_i)`.
    - ``'tail'`` (Megatron's ghost token): the teacher keeps its own mass on the ids and its missing mass
      :math:`1 - \sum_i e^{\ell_i}` in the tail bucket (re-tempered as one more logit when :math:`T \ne T_0`, an
      approximation); the divergence over the K + 1 buckets is a lower bound of the dense one (grouping classes
      never increases a divergence), exact when the ids cover the vocabulary.
    - ``'sampled'`` (random-sampling KD): `teacher_values` are counts :math:`c_i` of ids drawn from the teacher with
      replacement; :math:`q_i = c_i / \sum c`, no tail. Forward KL only: its gradient is an unbiased estimate of
      the dense forward KL's.

    The loss of a row is :math:`T^2 D_\beta(q, r)` with ``distillation_loss``'s family over the buckets: forward KL
    (``beta=0``), reverse KL (``beta=1``, 'tail' only: a renormalized teacher has no mass where the student has
    some, which makes it infinite) or the generalized JSD in between. Where the student has no mass off the ids
    (the ids cover its vocabulary) neither model has a tail. With all V ids, 'renormalize' and 'tail' equal
    ``distillation_loss`` on the dense teacher.

    Args:
        student_logits (Tensor): ``[..., V]`` float16, bfloat16, float32 or float64 (half types are computed in
            float32).
        teacher_ids (Tensor): ``[..., K]`` int32/int64 class ids (global, in ``[0, V)``; negative: padding, ignored),
            no id twice in a row.
        teacher_values (Tensor): ``[..., K]``: log-probabilities over the full vocabulary at the ids (float; <= 0)
            for 'renormalize'/'tail', counts (int or float; >= 0) for 'sampled'.
        mode (str): ``'renormalize'`` | ``'tail'`` | ``'sampled'``. Default ``'renormalize'``.
        temperature (float): :math:`T > 0` of the student (and of the loss's :math:`T^2`). Default ``1.0``.
        teacher_temperature (float): :math:`T_0`, the temperature the stored log-probabilities were taken at
            (1.0: a plain ``log_softmax`` of the teacher's logits). Must stay 1 for 'sampled'. Default ``1.0``.
        beta (float): 0 forward KL, 1 reverse KL, in between generalized JSD. Default ``0.0``.
        reduction (str): ``'none'`` (each row's loss, the leading shape) | ``'sum'`` | ``'batchmean'`` |
            ``'tokenmean'``, counted as in :func:`ms_kldiv.distillation_loss` (no ``'mean'``). Default
            ``'batchmean'``.
        labels (Tensor, optional): ``[...]`` int labels; rows equal to `ignore_index` contribute 0, leave the counts
            and are not read. Default ``None``.
        ignore_index (int): Default ``-100``.
        backend (str): ``'auto'`` or a registered name with stored-teacher kernels
            (``ms_kldiv.backend_info(op='sparse_distillation')``). Default ``'auto'``.
        vocab_parallel_group (str): A communication group whose ranks each hold a contiguous slice of the
            vocabulary in rank order: `student_logits` is then this rank's slice ``[..., V_r]``, the ids stay global,
            and every rank gets the whole rows' loss and its slice's gradient (docs/vocab_parallel.md; computed in
            MindSpore ops). Default ``None``.
        num_items_in_batch (Union[int, float, Tensor]): With 'batchmean' / 'tokenmean': divide the counted rows'
            sum by this instead of their local count (the whole global batch's tokens). Default ``None``.

    Returns:
        Tensor of the student's dtype: 0-d, or the leading shape for ``'none'``. The teacher's ids and values get
        a zero gradient (they are stored data).

    Raises:
        TypeError: A wrong type or dtype (named).
        ValueError: Bad options (mode, temperatures, beta, reduction), shapes that disagree, and in PyNative: an id
            >= V, an id repeated in a row, log-probabilities > 0 or counts < 0. Compiled code cannot raise on
            values: such a row's loss and gradient are NaN (ids) or the values are taken as given.
        RuntimeError: The requested backend cannot run stored-teacher kernels on this device.

    Supported Platforms:
        ``CPU`` (fused), ``GPU`` ``Ascend`` (composite)
    """
    _check_options(mode, temperature, teacher_temperature, beta, reduction, ignore_index, backend, _NAME)
    _validation.check_vocab_parallel(vocab_parallel_group, "sum", _NAME)
    _check_args(student_logits, teacher_ids, teacher_values, mode, labels, _NAME, reduction, num_items_in_batch,
                vocab_parallel_group is not None)
    return _sparse(student_logits, teacher_ids, teacher_values, mode, float(temperature), float(teacher_temperature),
                   float(beta), reduction, labels, int(ignore_index), backend, vocab_parallel_group,
                   num_items_in_batch)


class SparseDistillationLoss(FullPrecisionCell, nn.Cell):
    r"""The ``nn.Cell`` form of :func:`ms_kldiv.sparse_distillation_loss` (the same arguments, fixed at
    construction, where they are checked).

    Inputs:
        - **student_logits** (Tensor) - ``[..., V]``.
        - **teacher_ids** (Tensor) - ``[..., K]`` int ids, negative = padding.
        - **teacher_values** (Tensor) - ``[..., K]`` log-probabilities, or counts for ``mode='sampled'``.
        - **labels** (Tensor, optional) - ``[...]``; rows equal to `ignore_index` are ignored.

    Outputs:
        Tensor of the student's dtype: 0-d, or the leading shape for ``'none'``.
    """

    def __init__(self, mode="renormalize", temperature=1.0, reduction="batchmean", *, teacher_temperature=1.0,
                 beta=0.0, ignore_index=-100, backend="auto", vocab_parallel_group=None):
        super().__init__()
        _check_options(mode, temperature, teacher_temperature, beta, reduction, ignore_index, backend,
                       "SparseDistillationLoss")
        _validation.check_vocab_parallel(vocab_parallel_group, "sum", "SparseDistillationLoss")
        self.vocab_parallel_group = vocab_parallel_group
        self.mode = mode
        self.temperature = float(temperature)
        self.teacher_temperature = float(teacher_temperature)
        self.beta = float(beta)
        self.reduction = reduction
        self.ignore_index = int(ignore_index)
        self.backend = backend

    def construct(self, student_logits, teacher_ids, teacher_values, labels=None, num_items_in_batch=None):
        _check_args(student_logits, teacher_ids, teacher_values, self.mode, labels, "SparseDistillationLoss",
                    self.reduction, num_items_in_batch, self.vocab_parallel_group is not None)
        return _sparse(student_logits, teacher_ids, teacher_values, self.mode, self.temperature,
                       self.teacher_temperature, self.beta, self.reduction, labels, self.ignore_index, self.backend,
                       self.vocab_parallel_group, num_items_in_batch, "SparseDistillationLoss")

    def extend_repr(self):
        return (f"mode={self.mode!r}, temperature={self.temperature}, teacher_temperature={self.teacher_temperature}, "
                f"beta={self.beta}, reduction={self.reduction!r}, ignore_index={self.ignore_index}, "
                f"backend={self.backend!r}")
