"""What the Cell-based backends share: the wrapper around a core op, the pointwise core with the SPEC's
gradients, and the registration info of a Custom op.

``KLDivWrapper`` is the one sequence around every core: route to a fallback op (cases the core cannot take)
-> widen half types -> broadcast -> core -> reduction scale -> cast back. Broadcasting and casts sit outside
the core, so MindSpore's own autodiff sums gradients back to each operand's shape and dtype; the core sees
two same-shaped operands of one compute dtype.
"""
import threading

import mindspore as ms
from mindspore import nn, ops
from mindspore.ops import constexpr

from .. import _math
from .._validation import HALF_DTYPES, kldiv_broadcast_shape


# MindSpore 2.10 dispatches a PyNative Custom op (aot, hybrid) through state shared by every thread: two threads
# calling Custom ops at once can each get the other's result (built-in ops are safe). PyNative calls of the ops
# built on Custom hold this lock while they dispatch (not while the kernel runs); compiled graphs are unaffected.
DISPATCH_LOCK = threading.RLock()
#: The most dims compiled BroadcastTo takes.
_BROADCAST_TO_MAX_RANK = 8


class SerializedDispatch:
    """A PyNative op whose dispatch holds ``DISPATCH_LOCK``; ``prim`` is the wrapped op."""

    def __init__(self, prim):
        self.prim = prim

    def __call__(self, x, t):
        with DISPATCH_LOCK:
            return self.prim(x, t)


@constexpr
def _routes_to_fallback(dtype, shape, x_rank, t_rank, float64, dynamic_or_empty, max_rank):
    if float64 and dtype == ms.float64:
        return True
    if dynamic_or_empty and (None in shape or 0 in shape):
        return True
    return max_rank is not None and max(x_rank, t_rank) > max_rank


class KLDivWrapper(nn.Cell):
    """The op of one (reduction, core): route, widen, broadcast, core, scale, cast back.

    Args:
        core (Cell): same-shaped x, t in the compute dtype -> the loss ('none') or its sum (any one-element
            shape), or, with ``core_scales``, the reduced value itself.
        reduction (str): the SPEC's reduction.
        fallback (Cell, optional): the op for what the core cannot take (the flags below say what).
        fallback_float64 / fallback_dynamic_or_empty (bool), fallback_max_rank (int): route float64 inputs /
            unknown or zero dims / ranks above this to ``fallback``.
        widen_halves (str): ``'always'`` computes half types in float32; ``'to_broadcast'`` only when an
            operand is broadcast (the core itself takes half types and computes in float32; widening first
            keeps the broadcast gradient's sum in float32).
        core_scales (bool): the core applies the reduction scale; then ``core_sum`` (the core for 'sum') serves
            'batchmean' when the input is broadcast or 0-d, whose divisor the core cannot see.
    """

    def __init__(self, core, reduction, *, fallback=None, fallback_float64=False, fallback_dynamic_or_empty=False,
                 fallback_max_rank=None, widen_halves="always", core_scales=False, core_sum=None):
        super().__init__()
        self.core = core
        self.core_sum = core_sum
        self.reduction = reduction
        self.fallback = fallback
        self.route = (fallback_float64, fallback_dynamic_or_empty, fallback_max_rank)
        self.widen_always = widen_halves == "always"
        self.core_scales = core_scales

    def construct(self, x, t):
        sx, st = ops.shape(x), ops.shape(t)
        shape = kldiv_broadcast_shape(sx, st)
        if shape is None:  # an unknown rank (a Cell's set_inputs with shape=None): broadcast at run time
            shape = (None,)
        if self.fallback is not None and _routes_to_fallback(x.dtype, shape, len(sx), len(st), *self.route):
            return self.fallback(x, t)
        dtype = x.dtype
        # 'batchmean' divides by the input's first dim (not the broadcast one); a tensor so dynamic shapes work.
        # A slice, not [0]: integer-indexing a shape tensor fails under PyNative grad-of-grad.
        batch = ops.ones((), ms.float32)
        if self.reduction == "batchmean" and x.ndim > 0:
            batch = ops.reshape(ops.cast(ops.dyn_shape(x)[:1], ms.float32), ())
        broadcast = sx != shape or st != shape
        if dtype in HALF_DTYPES and (self.widen_always or broadcast):
            # Before broadcasting: MindSpore's CPU BroadcastTo and ReduceSum (which sums a broadcast gradient
            # back) have no bfloat16 kernel, and float32 sums are more accurate anyway.
            x = ops.cast(x, ms.float32)
            t = ops.cast(t, ms.float32)
        if None in shape or 0 in shape or len(shape) > _BROADCAST_TO_MAX_RANK:
            # Compiled CPU BroadcastTo refuses an empty target shape and more than 8 dims, and dynamic dims are
            # only known at run time: arithmetic broadcasting handles all three (and its gradient sums back).
            # Every gradient of an empty broadcast is a sum of nothing, 0; autodiff's sum back through the broadcast
            # would run CPU ReduceSum on an empty tensor, which returns garbage. So the operands are cut from the
            # gradient when the broadcast is empty: known at compile time, or (unknown dims) at run time.
            if sx != st and sx is not None and st is not None:
                # one rank first: autodiff of a broadcast between ranks under dynamic dims crashed MindSpore
                # 2.10's compiler (SIGSEGV after "dynamic shape inference ... overly generalized")
                x, t = _leading_ones(x, len(st) - len(sx)), _leading_ones(t, len(sx) - len(st))
            if 0 in shape:
                x = ops.stop_gradient(x)
                t = ops.stop_gradient(t)
            elif sx != st:
                nonempty = ops.prod(ops.cast(ops.dyn_shape(ops.zeros_like(x) + ops.zeros_like(t)), ms.float32)) > 0
                x = ops.where(nonempty, x, ops.stop_gradient(x))
                t = ops.where(nonempty, t, ops.stop_gradient(t))
            if sx != st:
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
        elif self.core_scales:
            if self.reduction == "batchmean" and (sx != shape or not shape):
                out = self.core_sum(x, t) / ops.cast(batch, x.dtype)
            else:
                out = self.core(x, t)
        else:
            out = self.core(x, t)
        if self.reduction != "none":
            out = ops.reshape(out, ())
            if None in shape and not self.core_scales:
                # Unknown dims may be 0 at run time, and CPU ReduceSum of an empty tensor returns garbage.
                out = ops.where(ops.prod(ops.cast(ops.dyn_shape(x), ms.float32)) > 0, out, 0.0)
        if not self.core_scales:
            if self.reduction == "mean":
                out = out / ops.cast(ops.prod(ops.cast(ops.dyn_shape(x), ms.float64)), out.dtype)
            elif self.reduction == "batchmean":
                out = out / ops.cast(batch, out.dtype)
        return ops.cast(out, dtype)


class PointwiseCore(nn.Cell):
    """Same-shaped x, t -> the loss ('none') or its sum in ``acc_dtype``, with the SPEC's gradient table as
    bprop. The bprop is plain differentiable ops, which gives second-order gradients. Subclasses may compute
    the value another way (``value``) and keep this gradient."""

    def __init__(self, summed, log_target, acc_dtype=ms.float64):
        super().__init__()
        self.summed = summed
        math_fns = _math.pointwise(log_target)
        self.safe_fn, self.loss_fn, self.grads_fn = math_fns.safe, math_fns.loss, math_fns.grads
        self.acc_dtype = acc_dtype

    def value(self, x, t):
        loss = self.loss_fn(x, t)
        if self.summed:
            return ops.sum(ops.cast(loss, self.acc_dtype))
        return loss

    def construct(self, x, t):
        return self.value(x, t)

    def bprop(self, x, t, out, dout):
        dx, dt = self.grads_fn(x, t)
        g = ops.cast(dout, x.dtype)
        return dx * g, dt * g


def custom_reg_info(name, target, inputs, outputs, *, formats=None, attrs=(), required=False):
    """``reg_info`` of a Custom op: its inputs, outputs, attributes (name, type) and dtype formats (default:
    any dtype and format, which is what lets ``Cell.set_inputs`` with ``None`` dims work for AOT ops). Each entry of
    ``formats`` is one ``DataType`` (itself a (dtype, format) pair) for every position, or a tuple of them with one
    per input and output."""
    from mindspore.ops import CustomRegOp, DataType
    reg = CustomRegOp(name)
    extra = ("required",) if required else ()
    for i, n in enumerate(inputs):
        reg = reg.input(i, n, *extra)
    for i, n in enumerate(outputs):
        reg = reg.output(i, n, *extra)
    for attr_name, attr_type in attrs:
        reg = reg.attr(attr_name, "required", attr_type)
    count = len(inputs) + len(outputs)
    for fmt in formats or (DataType.None_None,):
        reg = reg.dtype_format(*(fmt if isinstance(fmt[0], tuple) else [fmt] * count))
    return reg.target(target).get_op_info()


def _leading_ones(v, count):
    """``v`` with ``count`` (a compile-time int, nothing when <= 0) dimensions of 1 in front."""
    for _ in range(count):
        v = ops.expand_dims(v, 0)
    return v
