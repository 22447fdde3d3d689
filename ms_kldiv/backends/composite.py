"""Backend 'composite': plain MindSpore ops, runs on every device target in every mode.

The pointwise math mirrors ``custom_ops/common/kldiv_math.h``: masks implement the zero-mass rule, and masked
lanes are fed safe values (t=1, x=0) so that neither the value nor any derivative of any order sees
``0 * inf``. The core Cell has a custom bprop giving both gradients of the SPEC's table; being plain ops,
that bprop is itself differentiable, which gives second-order gradients. Broadcasting and dtype casts sit
outside the core, so MindSpore's own autodiff sums gradients back to each operand's shape and dtype.
"""
import math

import mindspore as ms
from mindspore import nn, ops

from .._validation import HALF_DTYPES, kldiv_broadcast_shape
from . import register
from .base import Backend


# The math is written as branch-free functions, one set per target space, picked once in __init__:
# a Python `if` on a constant inside a helper called from a Cell that has a bprop breaks grad-of-jit in
# MindSpore 2.10 ("func_graph->get_return() is null"), and so does ops.zeros_like inside a bprop.
# Masked lanes get safe values (x=0, t=1) so that no derivative of any order sees 0 * inf.
# !(t <= 0) rather than t > 0: a NaN target keeps its mass and propagates NaN.

def _mass_prob(t):
    return ops.logical_not(t <= 0)


def _mass_log(t):
    return ops.logical_not(t == -math.inf)


def _loss_prob(x, t):
    mass = _mass_prob(t)
    xs, ts = ops.where(mass, x, 0.0), ops.where(mass, t, 1.0)
    return ops.where(mass, ts * (ops.log(ts) - xs), 0.0)


def _loss_log(x, t):
    mass = _mass_log(t)
    xs, ts = ops.where(mass, x, 0.0), ops.where(mass, t, 0.0)
    return ops.where(mass, ops.exp(ts) * (ts - xs), 0.0)


def _grads_prob(x, t):
    mass = _mass_prob(t)
    xs, ts = ops.where(mass, x, 0.0), ops.where(mass, t, 1.0)
    return ops.where(mass, -ts, 0.0), ops.where(mass, ops.log(ts) + 1 - xs, 0.0)


def _grads_log(x, t):
    mass = _mass_log(t)
    xs, ts = ops.where(mass, x, 0.0), ops.where(mass, t, 0.0)
    e = ops.exp(ts)
    return ops.where(mass, -e, 0.0), ops.where(mass, e * (ts - xs + 1), 0.0)


def pointwise_fns(log_target):
    """(loss(x, t), grads(x, t) -> (d/dx, d/dt)) for the target space; plain differentiable ops."""
    return (_loss_log, _grads_log) if log_target else (_loss_prob, _grads_prob)


class _PointwiseKL(nn.Cell):
    """Loss of same-shaped x, t ('none') or its sum ('sum'), with the SPEC's gradient table as bprop."""

    def __init__(self, summed, log_target, acc_dtype):
        super().__init__()
        self.summed = summed
        self.loss_fn, self.grads_fn = pointwise_fns(log_target)
        self.acc_dtype = acc_dtype

    def construct(self, x, t):
        loss = self.loss_fn(x, t)
        if self.summed:
            return ops.sum(ops.cast(loss, self.acc_dtype))
        return loss

    def bprop(self, x, t, out, dout):
        dx, dt = self.grads_fn(x, t)
        g = ops.cast(dout, x.dtype)
        return dx * g, dt * g


class CompositeKLDiv(nn.Cell):
    """The composite op: broadcast, widen half types, pointwise core, reduce, scale, cast back."""

    def __init__(self, reduction, log_target, acc_dtype=ms.float64):
        super().__init__()
        self.reduction = reduction
        self.core = _PointwiseKL(reduction != "none", log_target, acc_dtype)

    def construct(self, x, t):
        dtype = x.dtype
        # 'batchmean' divides by input's first dim (not the broadcast one); a tensor so dynamic shapes work.
        batch = ops.ones((), ms.float32)
        if self.reduction == "batchmean" and x.ndim > 0:
            # A slice, not [0]: integer-indexing a shape tensor fails under PyNative grad-of-grad.
            batch = ops.reshape(ops.cast(ops.dyn_shape(x)[:1], ms.float32), ())
        # Widen half types before broadcasting: MindSpore's CPU BroadcastTo and ReduceSum (which sums a
        # broadcast gradient back) have no bfloat16 kernel, and float32 sums are more accurate anyway.
        if dtype in HALF_DTYPES:
            x = ops.cast(x, ms.float32)
            t = ops.cast(t, ms.float32)
        sx, st = ops.shape(x), ops.shape(t)
        shape = kldiv_broadcast_shape(sx, st)
        # Compiled CPU BroadcastTo refuses an empty target shape; arithmetic broadcasting handles it.
        if None in shape or 0 in shape:
            if sx != st:  # dynamic dims: let the arithmetic broadcast (summing gradients back) at run time
                x = x + ops.zeros_like(t)
                t = t + ops.zeros_like(x)
        else:
            if sx != shape:
                x = ops.broadcast_to(x, shape)
            if st != shape:
                t = ops.broadcast_to(t, shape)
        if self.reduction != "none" and 0 in shape:
            # MindSpore's CPU ReduceSum returns garbage for empty inputs; the sum of nothing is 0.
            out = ops.zeros((), ms.float32)
        else:
            out = self.core(x, t)
        if self.reduction == "mean":
            out = out / ops.cast(ops.prod(ops.cast(ops.dyn_shape(x), ms.float64)), out.dtype)
        elif self.reduction == "batchmean":
            out = out / ops.cast(batch, out.dtype)
        return ops.cast(out, dtype)


class CompositeBackend(Backend):
    name = "composite"
    description = "plain MindSpore ops (runs on every device target)"
    preference = {"CPU": 0, "GPU": 0, "Ascend": 0}

    def unavailable_reason(self, device):
        return None

    def make_op(self, reduction, log_target):
        # Ascend's vector units have no float64: accumulate float32 there.
        acc = ms.float32 if ms.get_context("device_target") == "Ascend" else ms.float64
        return CompositeKLDiv(reduction, log_target, acc)


register(CompositeBackend())
