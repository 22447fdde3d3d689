"""Backend 'composite': plain MindSpore ops, runs on every device target in every mode.

kl_div: the pointwise math is ``ms_kldiv._math`` (the twin of ``custom_ops/common/kldiv_math.h``); the core's bprop
gives both gradients of the SPEC's table, and being plain ops that bprop is itself differentiable, which gives
second-order gradients. ``KLDivWrapper`` does the broadcasting and casts around it.

distillation: the kernel contract (``ms_kldiv.backends.base``) computed with the closed forms of
``ms_kldiv._distill_math``, in float64 where the device has it (MindSpore's float32 CPU ``exp`` and ``log`` lose
~1e-6 relative, more than float32's own rounding), float32 on Ascend.
"""
import mindspore as ms
from mindspore import nn, ops

from .._distill_math import (KL, STATS, cross_entropy_and_grad, row_grads, row_losses, slice_grads, slice_states,
                             slice_sums, transform_slope, transformed)
from .._sparse_math import row_stats as sparse_row_stats, student_grad as sparse_student_grad
from . import register
from .base import Backend
from .common import KLDivWrapper, PointwiseCore


def _acc_dtype(device, dtype=None):
    if dtype == ms.float64:
        return ms.float64
    return ms.float32 if device == "Ascend" else ms.float64


def composite_op(reduction, log_target, acc_dtype=None):
    """The composite op for one (reduction, log_target); sums accumulate in ``acc_dtype`` (default float64,
    float32 on Ascend, whose vector units have no float64)."""
    if acc_dtype is None:
        acc_dtype = _acc_dtype(ms.get_context("device_target"))
    return KLDivWrapper(PointwiseCore(reduction != "none", log_target, acc_dtype), reduction)


class _DistillForward(nn.Cell):
    def __init__(self, temperature, beta, acc_dtype, variant=KL):
        super().__init__()
        self.temperature, self.beta, self.acc_dtype, self.variant = temperature, beta, acc_dtype, variant
        # stats = the row loss in column 0; the other columns are exact zeros, not read by this backward (selected,
        # not multiplied: 0 x an inf loss would be NaN in LOG_Z_S, which row_loss adds to the loss)
        self.first_column = ms.Tensor([True] + [False] * (STATS - 1), ms.bool_)

    def construct(self, s, t):
        loss = row_losses(ops.cast(s, self.acc_dtype), ops.cast(t, self.acc_dtype), self.temperature, self.beta,
                          self.variant)
        return ops.where(self.first_column, ops.expand_dims(ops.cast(loss, ms.float32), -1), 0.0)


class _DistillBackward(nn.Cell):
    def __init__(self, temperature, beta, acc_dtype, student=True, teacher=True, variant=KL, given=False):
        super().__init__()
        self.temperature, self.beta, self.acc_dtype, self.variant = temperature, beta, acc_dtype, variant
        self.student, self.teacher = student, teacher
        # given: a slice of the vocabulary, whose stats carry the whole row's normalizers and sums
        self.given = given

    def _scaled(self, d, g, like):
        # rows whose incoming gradient is 0 get exact zeros, even where their logits are NaN
        return ops.cast(ops.where(g != 0, d * ops.cast(g, d.dtype), 0.0), like.dtype)

    def construct(self, s, t, stats, dloss):
        if self.given:
            ds, dt = slice_grads(ops.cast(s, self.acc_dtype), ops.cast(t, self.acc_dtype),
                                 ops.cast(stats, self.acc_dtype), self.temperature, self.beta, self.teacher,
                                 variant=self.variant)
        else:
            ds, dt = row_grads(ops.cast(s, self.acc_dtype), ops.cast(t, self.acc_dtype), self.temperature,
                               self.beta, self.teacher, variant=self.variant)
        g = ops.expand_dims(dloss, -1)
        if not self.student:
            return self._scaled(dt, g, t)
        if self.teacher:
            return self._scaled(ds, g, s), self._scaled(dt, g, t)
        return self._scaled(ds, g, s), ops.zeros((1,), t.dtype)


class _SliceStates(nn.Cell):
    def __init__(self, temperature, acc_dtype, variant=KL):
        super().__init__()
        self.temperature, self.acc_dtype, self.variant = temperature, acc_dtype, variant

    def construct(self, s, t):
        st = slice_states(ops.cast(s, self.acc_dtype), ops.cast(t, self.acc_dtype), self.temperature, self.variant)
        return ops.cast(st, ms.float32)


def _column(v):
    """A row quantity [R] as a float32 stats column [R, 1]."""
    return ops.expand_dims(ops.cast(v, ms.float32), -1)


class _SliceForward(nn.Cell):
    def __init__(self, temperature, beta, acc_dtype, variant=KL):
        super().__init__()
        self.temperature, self.beta, self.acc_dtype, self.variant = temperature, beta, acc_dtype, variant
        self.normalizers = ms.Tensor([1, 2], ms.int32), ms.Tensor([5, 6, 7], ms.int32)

    def construct(self, s, t, states):
        loss, sum_a, sum_b = slice_sums(ops.cast(s, self.acc_dtype), ops.cast(t, self.acc_dtype),
                                        ops.cast(states, self.acc_dtype), self.temperature, self.beta, self.variant)
        # concatenated, not masked: a product with 0 would turn an inf loss into NaN in the other columns
        return ops.concat((_column(loss), ops.gather(states, self.normalizers[0], 1), _column(sum_a), _column(sum_b),
                           ops.gather(states, self.normalizers[1], 1)), -1)


class _HardLabels(nn.Cell):
    """The head's hard-label term (contract: ``ms_kldiv.backends.base``, ``hard``) in MindSpore ops, in the logits'
    dtype (float32 for bfloat16 on CPU, which has no bfloat16 arithmetic); the soft cap in float64 where MindSpore's
    float32 tanh is too rough (CPU)."""

    def __init__(self, variant, z_loss, label_smoothing, ignore_index, device):
        super().__init__()
        self.variant = variant
        self.transformed = variant.softcap > 0 or variant.logit_scale != 1.0
        self.wide = ms.float64 if variant.softcap > 0 and device == "CPU" else None
        self.cpu = device == "CPU"
        self.z_loss, self.label_smoothing, self.ignore_index = z_loss, label_smoothing, ignore_index

    def construct(self, s, labels, g, ds):
        dtype = s.dtype
        if self.cpu and dtype == ms.bfloat16:
            s, ds = ops.cast(s, ms.float32), ops.cast(ds, ms.float32)
        keep = labels != self.ignore_index
        z = transformed(s, self.variant, self.wide) if self.transformed else s
        rows, d = cross_entropy_and_grad(z, ops.where(keep, labels, 0), keep, ops.cast(g, s.dtype), self.z_loss,
                                         self.label_smoothing)
        if self.transformed:
            d = d * transform_slope(s, self.variant, self.wide)
        return ops.cast(rows, ms.float32), ops.cast(ds + d, dtype)


class CompositeDistillKernels:
    """The distillation kernel contract in MindSpore ops (closed forms of ``ms_kldiv._distill_math``): every dtype,
    every device. The stats hold the row loss only; the backward recomputes the softmaxes. float64 logits are left
    to the callers' float64 composition (the contract's stats are float32)."""

    dtypes = (ms.float16, ms.bfloat16, ms.float32)

    def __init__(self, device):
        self.device = device

    def unsupported(self, variant):  # every divergence and transform
        return None

    def forward(self, temperature, beta, variant=KL):
        return _DistillForward(temperature, beta, _acc_dtype(self.device), variant)

    def backward(self, temperature, beta, teacher_grad, variant=KL, given=False):
        return _DistillBackward(temperature, beta, _acc_dtype(self.device), teacher=teacher_grad, variant=variant,
                                given=given)

    def backward_teacher(self, temperature, beta, variant=KL, given=False):
        return _DistillBackward(temperature, beta, _acc_dtype(self.device), student=False, variant=variant,
                                given=given)

    # The vocabulary-parallel entry points (base.py): the stats carry the whole row's normalizers and sums.
    def states(self, temperature, variant=KL):
        return _SliceStates(temperature, _acc_dtype(self.device), variant)

    def forward_given(self, temperature, beta, variant=KL):
        return _SliceForward(temperature, beta, _acc_dtype(self.device), variant)

    def backward_given(self, temperature, beta, teacher_grad, variant=KL):
        return self.backward(temperature, beta, teacher_grad, variant, given=True)

    def backward_teacher_given(self, temperature, beta, variant=KL):
        return self.backward_teacher(temperature, beta, variant, given=True)

    def hard(self, variant, z_loss, label_smoothing, ignore_index):
        return _HardLabels(variant, z_loss, label_smoothing, ignore_index, self.device)


class _SparseForward(nn.Cell):
    def __init__(self, hyper, acc_dtype):
        super().__init__()
        self.hyper, self.acc_dtype = hyper, acc_dtype

    def construct(self, s, ids, values):
        stats = sparse_row_stats(ops.cast(s, self.acc_dtype), ids, values, *self.hyper)
        return stats if s.dtype == ms.float64 else ops.cast(stats, ms.float32)


class _SparseBackward(nn.Cell):
    def __init__(self, hyper, acc_dtype):
        super().__init__()
        self.hyper, self.acc_dtype = hyper, acc_dtype

    def construct(self, s, ids, values, stats, dloss):
        acc = self.acc_dtype
        return ops.cast(sparse_student_grad(ops.cast(s, acc), ids, values, *self.hyper, ops.cast(dloss, acc)), s.dtype)


class CompositeSparseKernels:
    """The stored-teacher kernel contract in MindSpore ops (``ms_kldiv._sparse_math``): every device; float64 off
    Ascend (whose stats are then float64). The backward recomputes the row sums from the logits."""

    def __init__(self, device):
        self.device = device
        self.dtypes = (ms.float16, ms.bfloat16, ms.float32) + (() if device == "Ascend" else (ms.float64,))

    def forward(self, temperature, ratio, beta, tail):
        return _SparseForward((temperature, ratio, beta, tail), _acc_dtype(self.device))

    def backward(self, temperature, ratio, beta, tail):
        return _SparseBackward((temperature, ratio, beta, tail), _acc_dtype(self.device))


class CompositeBackend(Backend):
    name = "composite"
    description = "plain MindSpore ops (runs on every device target)"
    preference = {"CPU": 0, "GPU": 0, "Ascend": 0}
    ops = ("kl_div", "distillation", "sparse_distillation")

    def unavailable_reason(self, device, op="kl_div"):
        return None if op in self.ops else super().unavailable_reason(device, op)

    def make_op(self, reduction, log_target):
        return composite_op(reduction, log_target)

    def distill_kernels(self, device):
        return CompositeDistillKernels(device)

    def sparse_kernels(self, device):
        return CompositeSparseKernels(device)


register(CompositeBackend())
