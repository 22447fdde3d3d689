"""The KL divergence's pointwise math in MindSpore ops, declared once for every backend.

This is the Python twin of ``custom_ops/common/kldiv_math.h`` (what the C++/CUDA kernels use) and has the same
structure as ``ms_kldiv/reference.py`` (the float64 NumPy oracle the tests use): the loss, both first
derivatives and the second-order terms sit side by side, so no backend restates a formula.

x = input (log-probabilities), t = target (probabilities, or log-probabilities with ``log_target``).
Zero-mass rule (SPEC): a term whose target has no mass (t <= 0, or t == -inf in log space) contributes 0 to the
loss and to every derivative. The test is ``!(t <= 0)`` so a NaN target keeps its mass and propagates NaN.
Masked lanes are fed safe operands (x = 0, t = 1, or t = 0 in log space) so that no derivative of any order
sees ``0 * inf``.

Every function is branch-free and one set exists per target space, picked once with :func:`pointwise`:
a Python ``if`` on a constant inside a helper called from a Cell that has a bprop breaks grad-of-jit in
MindSpore ("func_graph->get_return() is null"), and graph mode resolves module functions and closures.
"""
import collections
import math

import mindspore as ms
from mindspore import ops
from mindspore.ops import constexpr

#: The derivatives of dx = px(x, t) * g and dt = pt(x, t) * g, the first-order gradients, are
#:   d(px)/dx = 0, d(px)/dt = d(pt)/dx = -1 (-e^t in log space), d(pt)/dt = 1/t (e^t (t - x + 2) in log space).
#: Graph mode turns a namedtuple into a plain tuple, so Cells copy the fields they use into attributes.
Pointwise = collections.namedtuple("Pointwise", [
    "safe",    # (x, t) -> (mass, xs, ts): the mask and operands safe to feed to log/exp
    "loss",    # (x, t) -> elementwise loss
    "grads",   # (x, t) -> (px, pt): d loss/dx, d loss/dt
    "second",  # (x, t) -> second derivatives (d(px)/dt, d(pt)/dx, d(pt)/dt); d(px)/dx is 0
])


def _safe_prob(x, t):
    mass = ops.logical_not(t <= 0)
    return mass, ops.where(mass, x, 0.0), ops.where(mass, t, 1.0)


def _safe_log(x, t):
    mass = ops.logical_not(t == -math.inf)
    return mass, ops.where(mass, x, 0.0), ops.where(mass, t, 0.0)


def _loss_prob(x, t):
    mass, xs, ts = _safe_prob(x, t)
    return ops.where(mass, ts * (ops.log(ts) - xs), 0.0)


def _loss_log(x, t):
    mass, xs, ts = _safe_log(x, t)
    return ops.where(mass, ops.exp(ts) * (ts - xs), 0.0)


def _grads_prob(x, t):
    mass, xs, ts = _safe_prob(x, t)
    return ops.where(mass, -ts, 0.0), ops.where(mass, ops.log(ts) + 1 - xs, 0.0)


def _grads_log(x, t):
    mass, xs, ts = _safe_log(x, t)
    e = ops.exp(ts)
    return ops.where(mass, -e, 0.0), ops.where(mass, e * (ts - xs + 1), 0.0)


def _second_prob(x, t):
    mass, _, ts = _safe_prob(x, t)
    one = ops.ones_like(ts)
    return ops.where(mass, -one, 0.0), ops.where(mass, -one, 0.0), ops.where(mass, 1.0 / ts, 0.0)


def _second_log(x, t):
    mass, xs, ts = _safe_log(x, t)
    e = ops.exp(ts)
    return ops.where(mass, -e, 0.0), ops.where(mass, -e, 0.0), ops.where(mass, e * (ts - xs + 2), 0.0)


_PROB = Pointwise(_safe_prob, _loss_prob, _grads_prob, _second_prob)
_LOG = Pointwise(_safe_log, _loss_log, _grads_log, _second_log)


def pointwise(log_target):
    """The :class:`Pointwise` functions of one target space (plain differentiable ops)."""
    return _LOG if log_target else _PROB


# Second order: the cotangents of (x, t, g) through the first-order gradients dx = px * g and dt = pt * g, given
# the cotangents cx of dx and ct of dt, from the pointwise values above (plain tensor functions: graph mode
# cannot resolve closures over the per-space functions inside a bprop).

def vjp_input_grad(px, second, g, cx):
    """(d_t, d_g) through dx = px * g; ``second`` is the ``second(x, t)`` triple."""
    return cx * second[0] * g, cx * px


def vjp_target_grad(pt, second, g, ct):
    """(d_x, d_t, d_g) through dt = pt * g."""
    return ct * second[1] * g, ct * second[2] * g, ct * pt


def vjp_grads(px, pt, second, g, cx, ct):
    """(d_x, d_t, d_g) through both."""
    return ct * second[1] * g, (cx * second[0] + ct * second[2]) * g, cx * px + ct * pt


# ---------------------------------------------------------------------------------------- reductions
# The factor s of the reduced loss s * sum(loss): 1 for 'none'/'sum', 1/numel for 'mean', 1/input.shape[0]
# (1 for a 0-d input) for 'batchmean'. One branch-free function per reduction, picked with scale_fn(), so
# they can be called inside a bprop. `full` is a broadcast-shaped tensor in the dtype the factor is wanted in
# (a float32 1/numel would cost float64 gradients accuracy); dims may be dynamic.

def _scale_one(x, full):
    return ops.ones((), full.dtype)


def _scale_mean(x, full):
    return 1.0 / ops.cast(ops.size(full), full.dtype)


def _scale_batchmean(x, full):
    return 1.0 / ops.cast(x.shape[0], full.dtype) if x.ndim else ops.ones((), full.dtype)


_SCALES = {"none": _scale_one, "sum": _scale_one, "mean": _scale_mean, "batchmean": _scale_batchmean}


def scale_fn(reduction):
    """(x, full) -> the reduction's factor as a 0-d tensor of ``full``'s dtype; x is the input operand."""
    return _SCALES[reduction]


@constexpr
def _broadcast_axes(v_shape, shape):
    """The axes of ``v_shape`` that broadcasting ``shape`` to it added or stretched (in Python: graph mode would
    parse the comprehension into a loop of helper graphs)."""
    lead = len(v_shape) - len(shape)
    return tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and v_shape[lead + i] != 1)


def sum_to(v, shape):
    """Sum a broadcast-shaped ``v`` back to ``shape``: the adjoint of broadcasting (static rank; unknown dims
    are taken as not broadcast)."""
    lead = v.ndim - len(shape)
    axes = _broadcast_axes(v.shape, shape)
    if axes:
        v = ops.sum(v, axes, keepdim=True)
        if lead:
            v = ops.reshape(v, v.shape[lead:]) if len(shape) else ops.reshape(v, ())
    return v


def compute_dtype(dtype):
    """The dtype the math runs in: float32 for half types (the SPEC's accuracy; MindSpore's CPU BroadcastTo and
    ReduceSum also lack bfloat16 kernels), the dtype itself otherwise."""
    return ms.float32 if dtype in (ms.float16, ms.bfloat16) else dtype


def narrowed_to_int32(x, below):
    """Integer ``x`` as int32, the form the kernels take: a value past int32's range becomes int32's largest and one
    below it ``below``, instead of wrapping onto another value (an int64 label or id of 2^33 became 0)."""
    if x.dtype == ms.int32:
        return x
    narrow = ops.cast(x, ms.int32)
    outside = ops.where(x < 0, ops.full_like(narrow, below), ops.full_like(narrow, 2**31 - 1))
    return ops.where(ops.cast(narrow, x.dtype) == x, narrow, outside)


def over_count(total, count):
    """``total / count``; 0 where the count is 0 (the counted rows' weights sum to 0, no token counted in the whole
    batch: as an all-ignored batch gives); NaN where it is negative or NaN (compiled code cannot raise on values:
    a bad ``num_items_in_batch`` or weight makes the loss NaN, never a clean-looking 0). Half types divide in
    float32: MindSpore's CPU comparisons and selects have no bfloat16 kernels."""
    dtype = ms.float32 if total.dtype in (ms.float16, ms.bfloat16) else total.dtype
    count = ops.cast(count, dtype)
    positive = count > 0
    loss = ops.where(positive, ops.cast(total, dtype) / ops.where(positive, count, 1.0),
                     ops.where(count == 0, 0.0, float("nan")))
    return loss if dtype == total.dtype else ops.cast(loss, total.dtype)


def checked_weights(weights, dtype):
    """Row weights in ``dtype``, a negative one NaN: compiled code cannot raise on values (PyNative has raised
    already), so such a row's loss, the mean and their gradients are NaN instead of silently weighted."""
    negative = ops.cast(weights, ms.float32) < 0
    return ops.where(negative, float("nan"), ops.cast(weights, dtype))


def no_class_column(rows, dtype):
    """One -inf column [R, 1] of ``dtype`` (no mass, no class) shaped after ``rows`` [R, 1]: what an empty vocabulary
    slice computes on, since the reductions, gathers and scatters over the classes need a column. Built from
    ``rows`` because the row count may be known at run time only; it also ties the column to ``rows``' producer."""
    return ops.cast(_ZEROS_LIKE(rows), dtype) + float("-inf")


# A primitive, not ops.zeros_like: that function, parsed here for a Cell with a bprop, compiled to an empty graph
# in the vocabulary-parallel stored teacher's backward (MindSpore 2.10: "The func graph is empty ... zeros_like").
_ZEROS_LIKE = ops.ZerosLike()
