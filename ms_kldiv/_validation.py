"""Argument checks shared by the functional and the Cell: every bad input fails here, before any kernel runs.

These run in PyNative and, at compile time, inside GRAPH_MODE / ``ms.jit`` (shapes and dtypes are constants
there), so they use only plain Python on shapes, dtypes and strings.
"""
import math
import numbers
import warnings

import mindspore as ms
from mindspore import Tensor, ops
from mindspore.ops import constexpr

import numpy as np

from ._distill_math import DIVERGENCES, Variant
from .reference import REDUCTIONS, SPARSE_MODES

FLOAT_DTYPES = (ms.float16, ms.bfloat16, ms.float32, ms.float64)
HALF_DTYPES = (ms.float16, ms.bfloat16)


# ------------------------------------------------------------------------------------------- checks on the host
def static_shape(shape):
    """``ops.shape`` as the checks take it: an unknown rank as ``(-2,)``, which ms.jit gives and a GRAPH_MODE Cell
    gives as None."""
    return (-2,) if shape is None else tuple(shape)


class TensorMeta:
    """What the checks read of a Tensor, as constants: its shape (``ops.shape``: unknown dims None or -1, an unknown
    rank ``(-2,)``) and dtype. While a graph compiles, a constexpr receives only a placeholder for a variable
    Tensor (None on MindSpore 2.7/2.8), so ``on_host`` checks get this instead."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape = static_shape(shape)
        self.dtype = dtype

    @property
    def ndim(self):
        return None if -2 in self.shape else len(self.shape)


_DESCRIBED = "ms_kldiv.described_tensor"


def described(value):
    """``value`` as an ``on_host`` check takes it: a Tensor as its shape and dtype, anything else as it is."""
    if isinstance(value, Tensor):
        return (_DESCRIBED, ops.shape(value), value.dtype)
    return value


def _restored(value):
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str) and value[0] == _DESCRIBED:
        return TensorMeta(value[1], value[2])
    return value


def on_host(check):
    """``check`` (plain Python over shapes, dtypes and Python values) as a constexpr taking ``described``
    arguments: in graph code it runs once, in Python, while the graph compiles, and nothing of it is parsed into
    the graph (parsing and specializing the checks took a fifth of a distillation loss's compile); in PyNative
    it is a plain call."""
    def run(*args):
        return check(*(_restored(a) for a in args))
    run.__name__ = run.__qualname__ = check.__name__
    return constexpr(run, check=False)


def is_tensor(value):
    return isinstance(value, (Tensor, TensorMeta))


def shape_of(value):
    """A Tensor's ``ops.shape`` (unknown dims None or -1 in graph code), or a TensorMeta's shape."""
    return value.shape if isinstance(value, TensorMeta) else ops.shape(value)


def check_reduction(reduction, log_target, name="kl_div", allowed=REDUCTIONS):
    if not isinstance(reduction, str):
        raise TypeError(f"For '{name}', 'reduction' must be a str, but got {type(reduction).__name__}: {reduction!r}.")
    if reduction not in allowed:
        raise ValueError(f"For '{name}', 'reduction' must be one of {list(allowed)}, but got {reduction!r}.")
    if not isinstance(log_target, bool):
        raise TypeError(f"For '{name}', 'log_target' must be a bool, but got {type(log_target).__name__}: {log_target!r}.")


def check_backend(backend, name="kl_div"):
    # Before the op cache: a list there raised "unhashable type" instead of this.
    if not isinstance(backend, str):
        raise TypeError(f"For '{name}', 'backend' must be a str, but got {type(backend).__name__}: {backend!r}.")


def legacy_reduction(size_average, reduce, reduction, name="kl_div"):
    """Map PyTorch's deprecated ``size_average``/``reduce`` onto ``reduction`` (they override it)."""
    if size_average is None and reduce is None:
        return reduction
    warnings.warn(f"For '{name}', 'size_average' and 'reduce' are deprecated; use 'reduction' instead.",
                  DeprecationWarning, stacklevel=3)
    for arg_name, value in (("size_average", size_average), ("reduce", reduce)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"For '{name}', '{arg_name}' must be a bool or None, but got {value!r}.")
    if reduce is False:
        return "none"
    if size_average is False:
        return "sum"
    return "mean"


def broadcast_shapes(shape_a, shape_b, name="kl_div", names=("input", "target")):
    """NumPy broadcast of two shapes (``ops.shape`` tuples); ValueError if they do not broadcast.

    Under dynamic shapes unknown dims arrive as None (or -1); they are trusted to match and stay None.
    """
    if not isinstance(shape_a, (tuple, list)) or not isinstance(shape_b, (tuple, list)) \
            or -2 in shape_a or -2 in shape_b:
        return None  # dynamic rank: nothing to check before the shapes are known
    out = []
    n = max(len(shape_a), len(shape_b))
    a = (1,) * (n - len(shape_a)) + tuple(None if d is None or d < 0 else d for d in shape_a)
    b = (1,) * (n - len(shape_b)) + tuple(None if d is None or d < 0 else d for d in shape_b)
    for da, db in zip(a, b):
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif da is None or db is None:
            out.append(None)
        else:
            raise ValueError(f"For '{name}', '{names[0]}' shape {tuple(shape_a)} and '{names[1]}' shape "
                             f"{tuple(shape_b)} cannot be broadcast together.")
    return tuple(out)


# Evaluated at compile time in graph mode, and a plain Python call in PyNative (no primitive launch: the
# check stays cheap there). Under dynamic shapes the unknown dims arrive as None and are trusted;
# check=False keeps MindSpore from warning that they are not constants.
# The name must not clash with a MindSpore primitive's ('broadcast_shape' does).
kldiv_broadcast_shape = constexpr(broadcast_shapes, check=False)



def promote(dtype_a, dtype_b):
    """PyTorch's float promotion: the wider type wins; float16 with bfloat16 gives float32."""
    if dtype_a == dtype_b:
        return dtype_a
    if ms.float64 in (dtype_a, dtype_b):
        return ms.float64
    return ms.float32


def check_tensors(input, target, name="kl_div", names=("input", "target"), min_rank=0, shapes=None):
    """Type, dtype and shape checks; returns the dtype both operands are computed in. ``min_rank``: the least
    number of dims each operand must have (1 for logits: the classes are on the last axis). ``shapes``: the
    shape rule, a constexpr (shape_a, shape_b, name, names); default NumPy broadcasting."""
    for arg_name, value in zip(names, (input, target)):
        if not is_tensor(value):
            raise TypeError(f"For '{name}', '{arg_name}' must be a mindspore.Tensor, "
                            f"but got {type(value).__name__}.")
        if value.dtype not in FLOAT_DTYPES:
            raise TypeError(f"For '{name}', '{arg_name}' must have a floating dtype "
                            f"(float16, bfloat16, float32, float64), but got {value.dtype}.")
        if value.ndim is not None and value.ndim < min_rank:
            raise ValueError(f"For '{name}', '{arg_name}' must have at least {min_rank} dimension(s) (the classes "
                             f"on the last axis), but got a {value.ndim}-d Tensor.")
    (kldiv_broadcast_shape if shapes is None else shapes)(shape_of(input), shape_of(target), name, names)
    return promote(input.dtype, target.dtype)


def _dim(d):
    """A dim as an int, or None where it is unknown at compile time (None or negative under dynamic shapes)."""
    return None if d is None or d < 0 else d


def logits_shapes(student_shape, teacher_shape, name, names=("student_logits", "teacher_logits"), sliced=False):
    """The shapes distillation accepts: the classes on the last axis, as many in both (at least one; ``sliced``, a
    rank's slice of the vocabulary: none is allowed), and the
    teacher broadcasting to the student's shape (one teacher distribution may serve several student rows; a
    student row never serves several teacher rows, which would leave 'batchmean' without a meaning). Dims unknown
    at compile time are trusted."""
    if not isinstance(student_shape, (tuple, list)) or not isinstance(teacher_shape, (tuple, list)) \
            or -2 in student_shape or -2 in teacher_shape:
        return None  # dynamic rank: nothing to check before the shapes are known
    s_shape, t_shape = tuple(student_shape), tuple(teacher_shape)
    vocab_s, vocab_t = _dim(s_shape[-1]), _dim(t_shape[-1])
    if vocab_s is not None and vocab_t is not None and vocab_s != vocab_t:
        raise ValueError(f"For '{name}', '{names[0]}' and '{names[1]}' must have the same number of classes (the "
                         f"last axis), but got shapes {s_shape} and {t_shape}.")
    if (vocab_s == 0 or vocab_t == 0) and not sliced:
        raise ValueError(f"For '{name}', '{names[0]}' and '{names[1]}' must have at least one class on the last "
                         f"axis, but got shapes {s_shape} and {t_shape}.")
    out = broadcast_shapes(s_shape, t_shape, name, names)
    student_is_broadcast = len(t_shape) > len(s_shape) or any(
        _dim(d) is not None and _dim(o) is not None and d != o for d, o in zip(s_shape, out))
    if student_is_broadcast:
        raise ValueError(f"For '{name}', '{names[1]}' shape {t_shape} must broadcast to '{names[0]}' shape "
                         f"{s_shape}: the student's rows are the samples, and one student row cannot serve several "
                         f"teacher rows.")
    return out


def is_number(value):
    """A Python or NumPy int or float (a temperature from a NumPy schedule is one); bool is not (an int subclass,
    always a mistake here; ``numpy.bool_`` is no ``numbers.Real``)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_number(value, arg_name, name, low=-math.inf, high=math.inf, low_open=False):
    """A finite number (``is_number``) in [low, high] ((low, high] with ``low_open``)."""
    if not is_number(value):
        raise TypeError(f"For '{name}', '{arg_name}' must be an int or float, "
                        f"but got {type(value).__name__}: {value!r}.")
    if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ValueError(f"For '{name}', '{arg_name}' must be a finite number in {bound}, but got {value!r}.")


#: The range of a temperature, softcap or logit scale: the kernels compute in float32, where such a scale's square
#: and inverse must stay finite and normal (outside it backends gave NaN, 0 or the untransformed loss, differently).
SCALE_RANGE = (2.0**-60, 2.0**60)


def check_scale(value, arg_name, name):
    """A temperature, softcap or logit scale: a finite number in ``SCALE_RANGE``."""
    check_number(value, arg_name, name)
    if not SCALE_RANGE[0] <= value <= SCALE_RANGE[1]:
        raise ValueError(f"For '{name}', '{arg_name}' must be a finite number in [2^-60, 2^60], but got {value!r}.")


def check_temperature(temperature, name):
    check_scale(temperature, "temperature", name)


def is_integer(value):
    """A Python or NumPy int; not bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value, arg_name, name):
    if not is_integer(value):
        raise TypeError(f"For '{name}', '{arg_name}' must be an int, but got {type(value).__name__}: {value!r}.")


def check_ignore_index(value, name):
    """``ignore_index``: an int that int32 labels can hold (the kernels compare labels as int32: a larger one would
    wrap onto another label)."""
    check_int(value, "ignore_index", name)
    if not -2**31 <= value < 2**31:
        raise ValueError(f"For '{name}', 'ignore_index' must lie in int32's range [-2147483648, 2147483647] (labels "
                         f"are compared as int32), but got {value}.")


INT_DTYPES = (ms.int32, ms.int64)


def check_labels(labels, rows_shape, name):
    """``labels``: None, or an int32/int64 Tensor of the logits' leading shape."""
    if labels is None:
        return
    if not is_tensor(labels):
        raise TypeError(f"For '{name}', 'labels' must be a mindspore.Tensor or None, but got {type(labels).__name__}.")
    if labels.dtype not in INT_DTYPES:
        raise TypeError(f"For '{name}', 'labels' must have dtype int32 or int64, but got {labels.dtype}.")
    known = None not in tuple(rows_shape) and -1 not in tuple(rows_shape) and -2 not in tuple(rows_shape)
    if known and tuple(shape_of(labels)) != tuple(rows_shape):
        raise ValueError(f"For '{name}', 'labels' must have the logits' leading shape {tuple(rows_shape)}, "
                         f"but got {tuple(shape_of(labels))}.")


# ------------------------------------------------------------------------------------------ stored (sparse) teachers
def check_stored_options(mode, teacher_temperature, beta, name):
    """``mode``, ``teacher_temperature`` and ``beta`` of a stored-teacher loss, and the combinations without a
    meaning."""
    if not isinstance(mode, str):
        raise TypeError(f"For '{name}', 'mode' must be a str, but got {type(mode).__name__}: {mode!r}.")
    if mode not in SPARSE_MODES:
        raise ValueError(f"For '{name}', 'mode' must be one of {list(SPARSE_MODES)}, but got {mode!r}.")
    check_scale(teacher_temperature, "teacher_temperature", name)
    check_number(beta, "beta", name, 0.0, 1.0)
    if mode == "sampled" and beta != 0:
        raise ValueError(f"For '{name}', mode 'sampled' estimates the forward KL only: 'beta' must be 0, but got "
                         f"{beta!r}.")
    if mode == "sampled" and teacher_temperature != 1:
        raise ValueError(f"For '{name}', mode 'sampled' takes counts drawn at the training temperature: "
                         f"'teacher_temperature' must be left at 1, but got {teacher_temperature!r}.")
    if mode == "renormalize" and beta == 1:
        raise ValueError(f"For '{name}', reverse KL (beta=1) against a teacher renormalized over its ids is +inf "
                         f"wherever the student puts mass off them; use mode='tail' (or beta < 1).")


def _known(d):
    return _dim(d) is not None


@constexpr
def no_rows(shape):
    """True when a leading dimension of ``shape`` is 0 where the graph is built (an empty batch); an unknown one is
    not known to be."""
    if not isinstance(shape, (tuple, list)) or -2 in tuple(shape):
        return False
    return any(_dim(d) == 0 for d in tuple(shape)[:-1])


@constexpr
def stored_vocab(s_shape, name, sliced=False):
    if -2 not in tuple(s_shape) and _known(s_shape[-1]) and s_shape[-1] == 0 and not sliced:
        raise ValueError(f"For '{name}', 'student_logits' must have at least one class on the last axis, but got "
                         f"shape {tuple(s_shape)}.")


def lead_of(shape):
    """The leading shape of logits of ``shape`` [..., V]: ``(-2,)`` (unknown) where their rank is unknown."""
    return (-2,) if -2 in tuple(shape) else tuple(shape)[:-1]


@constexpr
def leading_shape(shape, lead, arg, name):
    """``shape`` equals ``lead`` where both are known (a dynamic rank is not checked)."""
    if -2 in tuple(shape) or -2 in tuple(lead):
        return
    if len(shape) != len(lead) or any(_known(a) and _known(b) and a != b for a, b in zip(shape, lead)):
        raise ValueError(f"For '{name}', '{arg}' must have the logits' leading shape {tuple(lead)}, but got "
                         f"{tuple(shape)}.")


@constexpr
def _stored_shapes(lead, ids_shape, vals_shape, name):
    if -2 in tuple(lead) or -2 in tuple(ids_shape) or -2 in tuple(vals_shape):
        return
    if len(ids_shape) != len(lead) + 1 or any(_known(a) and _known(b) and a != b for a, b in zip(ids_shape, lead)):
        raise ValueError(f"For '{name}', 'teacher_ids' must have the student's leading shape {tuple(lead)} and K ids "
                         f"on the last axis, but got shape {tuple(ids_shape)}.")
    if _known(ids_shape[-1]) and ids_shape[-1] == 0:
        raise ValueError(f"For '{name}', 'teacher_ids' must hold at least one id per row, but got shape "
                         f"{tuple(ids_shape)}.")
    if len(vals_shape) != len(ids_shape) or any(_known(a) and _known(b) and a != b
                                                for a, b in zip(vals_shape, ids_shape)):
        raise ValueError(f"For '{name}', 'teacher_values' must have the shape of 'teacher_ids' {tuple(ids_shape)}, "
                         f"but got {tuple(vals_shape)}.")


def check_stored_teacher(teacher_ids, teacher_values, lead, mode, name):
    """Types, dtypes and shapes of a stored teacher for rows of leading shape ``lead`` (``ops.shape``)."""
    for arg_name, value in (("teacher_ids", teacher_ids), ("teacher_values", teacher_values)):
        if not is_tensor(value):
            raise TypeError(f"For '{name}', '{arg_name}' must be a mindspore.Tensor, but got {type(value).__name__}.")
    if teacher_ids.dtype not in INT_DTYPES:
        raise TypeError(f"For '{name}', 'teacher_ids' must have dtype int32 or int64, but got {teacher_ids.dtype}.")
    value_dtypes = FLOAT_DTYPES + (INT_DTYPES if mode == "sampled" else ())
    if teacher_values.dtype not in value_dtypes:
        kind = "counts (int32, int64 or a float dtype)" if mode == "sampled" else "log-probabilities (a float dtype)"
        raise TypeError(f"For '{name}', 'teacher_values' must hold {kind}, but got {teacher_values.dtype}.")
    _stored_shapes(lead, shape_of(teacher_ids), shape_of(teacher_values), name)


def check_stored_data(teacher_ids, teacher_values, vocab, mode, labels, ignore_index, name):
    """The stored teacher's values (PyNative only: compiled code cannot raise; there a row with an id >= V or a
    repeated id gives NaN). Ignored rows are not looked at."""
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


# ------------------------------------------------------------------------------------------------- row weights
def check_weights(weights, lead, name):
    """``weights``: a float Tensor of the logits' leading shape ``lead`` (``ops.shape``)."""
    if not is_tensor(weights):
        raise TypeError(f"For '{name}', 'weights' must be a mindspore.Tensor or None, but got "
                        f"{type(weights).__name__}.")
    if weights.dtype not in FLOAT_DTYPES:
        raise TypeError(f"For '{name}', 'weights' must have a floating dtype, but got {weights.dtype}.")
    leading_shape(shape_of(weights), lead, "weights", name)


def check_weights_data(weights, name):
    """PyNative only (compiled code cannot raise on values): weights must be finite and >= 0."""
    values = weights.float().asnumpy() if weights.dtype == ms.bfloat16 else weights.asnumpy()
    if values.size and not np.all(np.isfinite(values)):
        raise ValueError(f"For '{name}', 'weights' must be finite and >= 0, but got "
                         f"{values[~np.isfinite(values)][:3].tolist()}.")
    if values.size and values.min() < 0:
        raise ValueError(f"For '{name}', 'weights' must be finite and >= 0, but got values in "
                         f"[{values.min()}, {values.max()}].")


def check_num_items_data(num_items, name):
    """PyNative only: a Tensor ``num_items_in_batch`` must be finite and >= 0, as a number must (0: no token counted
    in the whole batch, whose loss is then 0, as an all-ignored batch's)."""
    if not isinstance(num_items, Tensor):
        return
    value = float(num_items.float().asnumpy() if num_items.dtype == ms.bfloat16 else num_items.asnumpy())
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"For '{name}', 'num_items_in_batch' must be finite and >= 0, but got {value}.")


# --------------------------------------------------------------------------------- divergences and transforms
#: alpha when not given: DistiLLM's skew 0.1; torchtune's sym_kd_ratio 0.5.
_DEFAULT_ALPHA = {"skew_kl": 0.1, "skew_rkl": 0.1, "symmetric_kl": 0.5}


def check_variant(divergence, alpha, softcap, logit_scale, beta, name):
    """The checked ``Variant`` of these options (``ms_kldiv._distill_math``)."""
    if not isinstance(divergence, str):
        raise TypeError(f"For '{name}', 'divergence' must be a str, but got {type(divergence).__name__}.")
    if divergence not in DIVERGENCES:
        raise ValueError(f"For '{name}', 'divergence' must be one of {list(DIVERGENCES)}, but got {divergence!r}.")
    check_number(beta, "beta", name, 0.0, 1.0)  # its type first: a str beta is a TypeError whatever the divergence
    if divergence != "kl" and beta != 0:
        raise ValueError(f"For '{name}', 'beta' selects within divergence='kl' (forward, reverse, JSD); with "
                         f"divergence={divergence!r} it must stay 0, but got {beta!r}.")
    if alpha is not None and divergence not in _DEFAULT_ALPHA:
        raise ValueError(f"For '{name}', 'alpha' is the parameter of 'skew_kl', 'skew_rkl' and 'symmetric_kl'; "
                         f"divergence={divergence!r} takes none (got alpha={alpha!r}).")
    if alpha is None:
        alpha = _DEFAULT_ALPHA.get(divergence, 0.0)
    check_number(alpha, "alpha", name, 0.0, 1.0)
    if divergence in ("skew_kl", "skew_rkl") and alpha == 1:
        raise ValueError(f"For '{name}', 'alpha' of {divergence!r} must be < 1 (1 compares a model with itself).")
    if softcap is not None:
        check_scale(softcap, "softcap", name)
    check_scale(logit_scale, "logit_scale", name)
    return Variant(divergence, float(alpha), float(softcap or 0.0), float(logit_scale))


# --------------------------------------------------------------------------------- vocabulary parallelism
def _group_error_fn(group):
    """'' when this process is a member of the initialized communication group ``group``, else why not."""
    from mindspore import communication  # pylint: disable=import-outside-toplevel
    # (imported here: only a loss with a group needs it)
    try:
        ranks = communication.get_process_group_ranks(group)
        rank = communication.get_rank()
    except Exception as err:  # pylint: disable=broad-except  # RuntimeError or ValueError, by state and release
        return (f"is not a usable communication group (call mindspore.communication.init() first, and "
                f"create_group for a sub-group): {err}")
    if rank not in ranks:
        return f"does not hold this process (rank {rank}; its ranks: {list(ranks)})"
    return ""


# A constexpr: evaluated in Python at graph compile time, where a try statement cannot be compiled.
_group_error = constexpr(_group_error_fn, check=False)


def check_vocab_parallel(group, reduction, name):
    """``vocab_parallel_group``: None, or the name of an initialized communication group (str) of which this
    process is a member; its losses reduce rows (no 'none': that would be each rank's slice of the terms)."""
    if group is None:
        return
    if not isinstance(group, str):
        raise TypeError(f"For '{name}', 'vocab_parallel_group' must be a str (a communication group's name) or "
                        f"None, but got {type(group).__name__}.")
    if reduction == "none":
        raise ValueError(f"For '{name}', 'vocab_parallel_group' needs a reducing 'reduction', but got 'none'.")
    if reduction == "mean":
        raise ValueError(f"For '{name}', 'vocab_parallel_group' takes 'sum', 'batchmean' or 'tokenmean' ('mean' "
                         f"would divide by the whole vocabulary, which no rank holds).")
    error = _group_error(group)
    if error:
        raise ValueError(f"For '{name}', 'vocab_parallel_group' {group!r} {error}.")


def check_vocab_parallel_dtype(dtype, name):
    if dtype == ms.float64:
        raise TypeError(f"For '{name}', 'vocab_parallel_group' takes float16, bfloat16 or float32 logits (the "
                        f"collectives of MindSpore's CPU backend have no float64), but got {dtype}.")


def check_num_items(num_items, reduction, name):
    """``num_items_in_batch``: None, a number >= 0, or a 0-d float/int Tensor; with 'batchmean' or
    'tokenmean' only (it replaces their count)."""
    if num_items is None:
        return
    if reduction not in ("batchmean", "tokenmean"):
        raise ValueError(f"For '{name}', 'num_items_in_batch' replaces the count of 'batchmean' / 'tokenmean', but "
                         f"'reduction' is {reduction!r}.")
    if is_tensor(num_items):
        if num_items.dtype not in FLOAT_DTYPES + (ms.int32, ms.int64) or len(num_items.shape) != 0:
            raise TypeError(f"For '{name}', 'num_items_in_batch' must be a number or a 0-d int/float Tensor, but "
                            f"got a {num_items.dtype} Tensor of shape {num_items.shape}.")
        return
    if not is_number(num_items):
        raise TypeError(f"For '{name}', 'num_items_in_batch' must be a number or a 0-d Tensor, but got "
                        f"{type(num_items).__name__}.")
    if not (math.isfinite(num_items) and num_items >= 0):  # 0: no token counted in the whole batch, loss 0
        raise ValueError(f"For '{name}', 'num_items_in_batch' must be finite and >= 0, but got {num_items}.")
