"""Distillation from a stored teacher: the teacher's top-k (or sampled) ids and values instead of its logits.

A teacher run once, offline, keeps per token K ids and their log-probabilities (top-k) or counts (sampled):
top-64 in bfloat16 with int32 ids is 384 bytes per token where dense float32 logits at V = 151,936 are 600 KB.
``sparse_distillation_loss`` compares that with the student's full-vocabulary logits in fused kernels: one read of
each student row (online log-sum-exp) plus K gathers forward, one write backward, no [N, V] buffer but the
gradient. The math is ``ms_kldiv._sparse_math``; ``ms_kldiv.reference.sparse_support`` is its float64 definition.
"""
import functools

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.ops import constexpr

from . import _validation
from .backends import _device_target_const, check_name_const, compiled, get_kernels, sparse
from .distillation import _reduce
from .reference import SPARSE_MODES, SPARSE_REDUCTIONS

_NAME = "sparse_distillation_loss"
_OP = "sparse_distillation"


def _check_options(mode, temperature, teacher_temperature, beta, reduction, ignore_index, backend, name):
    if not isinstance(mode, str):
        raise TypeError(f"For '{name}', 'mode' must be a str, but got {type(mode).__name__}: {mode!r}.")
    if mode not in SPARSE_MODES:
        raise ValueError(f"For '{name}', 'mode' must be one of {list(SPARSE_MODES)}, but got {mode!r}.")
    _validation.check_temperature(temperature, name)
    _validation.check_number(teacher_temperature, "teacher_temperature", name, 0.0, float("inf"), low_open=True)
    _validation.check_number(beta, "beta", name, 0.0, 1.0)
    if isinstance(reduction, str) and reduction == "mean":
        raise ValueError(f"For '{name}', 'reduction' 'mean' (divide by rows x V) has no meaning for a sparse "
                         f"teacher; use 'batchmean' or 'tokenmean'.")
    _validation.check_reduction(reduction, True, name, SPARSE_REDUCTIONS)
    _validation.check_int(ignore_index, "ignore_index", name)
    _validation.check_backend(backend, name)
    check_name_const(backend, name)
    if mode == "sampled" and beta != 0:
        raise ValueError(f"For '{name}', mode 'sampled' estimates the forward KL only: 'beta' must be 0, but got "
                         f"{beta!r}.")
    if mode == "sampled" and teacher_temperature != 1:
        raise ValueError(f"For '{name}', mode 'sampled' takes counts drawn at the training temperature: "
                         f"'teacher_temperature' must be left at 1, but got {teacher_temperature!r}.")
    if mode == "renormalize" and beta == 1:
        raise ValueError(f"For '{name}', reverse KL (beta=1) against a teacher renormalized over its ids is +inf "
                         f"wherever the student puts mass off them; use mode='tail' (or beta < 1).")


def _check_args(student_logits, teacher_ids, teacher_values, mode, labels, name):
    """Types, dtypes and shapes, plain Python (also at graph compile time)."""
    if not isinstance(student_logits, Tensor):
        raise TypeError(f"For '{name}', 'student_logits' must be a mindspore.Tensor, "
                        f"but got {type(student_logits).__name__}.")
    if student_logits.dtype not in _validation.FLOAT_DTYPES:
        raise TypeError(f"For '{name}', 'student_logits' must have a floating dtype (float16, bfloat16, float32, "
                        f"float64), but got {student_logits.dtype}.")
    if student_logits.ndim < 1:
        raise ValueError(f"For '{name}', 'student_logits' must have at least 1 dimension (the classes on the last "
                         f"axis), but got a 0-d Tensor.")
    for arg_name, value in (("teacher_ids", teacher_ids), ("teacher_values", teacher_values)):
        if not isinstance(value, Tensor):
            raise TypeError(f"For '{name}', '{arg_name}' must be a mindspore.Tensor, but got {type(value).__name__}.")
    if teacher_ids.dtype not in _validation.INT_DTYPES:
        raise TypeError(f"For '{name}', 'teacher_ids' must have dtype int32 or int64, but got {teacher_ids.dtype}.")
    value_dtypes = _validation.FLOAT_DTYPES + (_validation.INT_DTYPES if mode == "sampled" else ())
    if teacher_values.dtype not in value_dtypes:
        kind = "counts (int32, int64 or a float dtype)" if mode == "sampled" else "log-probabilities (a float dtype)"
        raise TypeError(f"For '{name}', 'teacher_values' must hold {kind}, but got {teacher_values.dtype}.")
    _shapes(ops.shape(student_logits), ops.shape(teacher_ids), ops.shape(teacher_values), name)
    if labels is not None:
        # type and dtype here; the shape in a constexpr (under dynamic shapes a comparison in graph code would be a
        # run-time value)
        _validation.check_labels(labels, (None,), name)
        _labels_shape(ops.shape(labels), ops.shape(student_logits), name)


def _known(d):
    return d is not None and d >= 0


@constexpr
def _shapes(s_shape, ids_shape, vals_shape, name):
    if -2 in tuple(s_shape) or -2 in tuple(ids_shape) or -2 in tuple(vals_shape):
        return
    if _known(s_shape[-1]) and s_shape[-1] == 0:
        raise ValueError(f"For '{name}', 'student_logits' must have at least one class on the last axis, but got "
                         f"shape {tuple(s_shape)}.")
    if len(ids_shape) != len(s_shape) or any(_known(a) and _known(b) and a != b
                                             for a, b in zip(ids_shape[:-1], s_shape[:-1])):
        raise ValueError(f"For '{name}', 'teacher_ids' must have the student's leading shape {tuple(s_shape[:-1])} "
                         f"and K ids on the last axis, but got shape {tuple(ids_shape)}.")
    if _known(ids_shape[-1]) and ids_shape[-1] == 0:
        raise ValueError(f"For '{name}', 'teacher_ids' must hold at least one id per row, but got shape "
                         f"{tuple(ids_shape)}.")
    if len(vals_shape) != len(ids_shape) or any(_known(a) and _known(b) and a != b
                                                for a, b in zip(vals_shape, ids_shape)):
        raise ValueError(f"For '{name}', 'teacher_values' must have the shape of 'teacher_ids' {tuple(ids_shape)}, "
                         f"but got {tuple(vals_shape)}.")


@constexpr
def _labels_shape(labels_shape, s_shape, name):
    if -2 in tuple(s_shape) or -2 in tuple(labels_shape):
        return
    lead = tuple(s_shape)[:-1]
    if len(labels_shape) != len(lead) or any(_known(a) and _known(b) and a != b for a, b in zip(labels_shape, lead)):
        raise ValueError(f"For '{name}', 'labels' must have the logits' leading shape {lead}, but got "
                         f"{tuple(labels_shape)}.")


def _check_data(student_logits, teacher_ids, teacher_values, mode, labels, ignore_index, name):
    """The values (PyNative only: compiled code cannot raise; there a row with an id >= V or a repeated id gives
    NaN). Ignored rows are not looked at."""
    vocab = student_logits.shape[-1]
    ids = teacher_ids.asnumpy().reshape(-1, teacher_ids.shape[-1])
    vals = teacher_values.asnumpy().astype(np.float64).reshape(ids.shape)
    if labels is not None:
        keep = labels.asnumpy().reshape(-1) != ignore_index
        ids, vals = ids[keep], vals[keep]
    valid = ids >= 0
    if np.any(ids >= vocab):
        raise ValueError(f"For '{name}', 'teacher_ids' must be in [0, {vocab}) (negative: padding), but got "
                         f"{int(ids.max())}.")
    ordered = np.sort(np.where(valid, ids, -1 - np.arange(ids.shape[-1])), -1)  # padding never repeats
    if np.any(ordered[:, 1:] == ordered[:, :-1]):
        raise ValueError(f"For '{name}', 'teacher_ids' must not repeat an id within a row (merge the entries: add "
                         f"their counts, or log-add their probabilities).")
    if mode == "sampled" and np.any(valid & (vals < 0)):
        raise ValueError(f"For '{name}', 'teacher_values' (counts) must be >= 0, but got {vals[valid].min()}.")
    if mode != "sampled" and np.any(valid & (vals > 0)):
        raise ValueError(f"For '{name}', 'teacher_values' (log-probabilities) must be <= 0, but got "
                         f"{vals[valid].max()}.")


@functools.lru_cache(maxsize=None)
def _rows_op(backend, device, dtype, mode, temperature, teacher_temperature, beta):
    """The per-row loss op for these settings: the registry's kernels for ``backend``; float64 logits take the
    composite kernels (the fused ones are float32 inside)."""
    _, kernels = get_kernels(_OP, backend, device)
    if dtype not in kernels.dtypes:
        _, kernels = get_kernels(_OP, "composite", device)
    ratio = 1.0 if mode == "sampled" else teacher_temperature / temperature
    return sparse.rows_op(kernels, temperature, ratio, beta, mode == "tail")


def _sparse(student_logits, teacher_ids, teacher_values, mode, temperature, teacher_temperature, beta, reduction,
            labels, ignore_index, backend):
    if not compiled(student_logits):
        _check_data(student_logits, teacher_ids, teacher_values, mode, labels, ignore_index, _NAME)
    dtype = student_logits.dtype
    rows_op = _rows_op(backend, _device_target_const(), dtype, mode, temperature, teacher_temperature, beta)
    # the kernels take any leading shape (no reshape: MindSpore's CPU Reshape has no bfloat16 in graph mode)
    s = student_logits
    ids = ops.cast(teacher_ids, ms.int32)
    values = ops.cast(teacher_values, ms.float32)
    if mode == "sampled":
        values = ops.log(values)
    if dtype == ms.float64:
        values = ops.cast(values, ms.float64)
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
    else:
        loss = _reduce(ops.sum(rows), student_logits, reduction, keep)
    return loss if loss.dtype == dtype else ops.cast(loss, dtype)


def sparse_distillation_loss(student_logits, teacher_ids, teacher_values, *, mode="renormalize", temperature=1.0,
                             teacher_temperature=1.0, beta=0.0, reduction="batchmean", labels=None,
                             ignore_index=-100, backend="auto"):
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
    _check_args(student_logits, teacher_ids, teacher_values, mode, labels, _NAME)
    return _sparse(student_logits, teacher_ids, teacher_values, mode, float(temperature), float(teacher_temperature),
                   float(beta), reduction, labels, ignore_index, backend)


class SparseDistillationLoss(nn.Cell):
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
                 beta=0.0, ignore_index=-100, backend="auto"):
        super().__init__()
        _check_options(mode, temperature, teacher_temperature, beta, reduction, ignore_index, backend,
                       "SparseDistillationLoss")
        self.mode = mode
        self.temperature = float(temperature)
        self.teacher_temperature = float(teacher_temperature)
        self.beta = float(beta)
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.backend = backend

    def construct(self, student_logits, teacher_ids, teacher_values, labels=None):
        _check_args(student_logits, teacher_ids, teacher_values, self.mode, labels, "SparseDistillationLoss")
        return _sparse(student_logits, teacher_ids, teacher_values, self.mode, self.temperature,
                       self.teacher_temperature, self.beta, self.reduction, labels, self.ignore_index, self.backend)

    def extend_repr(self):
        return (f"mode={self.mode!r}, temperature={self.temperature}, teacher_temperature={self.teacher_temperature}, "
                f"beta={self.beta}, reduction={self.reduction!r}, ignore_index={self.ignore_index}, "
                f"backend={self.backend!r}")
