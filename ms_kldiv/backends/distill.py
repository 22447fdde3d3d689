"""The fused distillation op on top of a pair of kernels, for any device: the autodiff around them is written once.

A *kernels* object (``AotDistillKernels`` below for the CPU and CUDA libraries, ``ascend.AscendCDistillKernels`` on
Ascend, ``composite.CompositeDistillKernels`` everywhere) meets the distillation kernel contract of
``ms_kldiv.backends.base``; the registry hands it out (``get_distill_kernels``).

``rows_op`` makes the differentiable per-row loss from them; ``ms_kldiv.distillation`` applies ignored rows and
the reduction (O(rows) work). Second order goes through plain MindSpore ops: the closed-form gradients of
``ms_kldiv._distill_math``, differentiated.
"""
import os

import mindspore as ms
from mindspore import nn, ops

from .._compat import without_mixed_precision
from .._distill_math import KL, LOG_Z_S, hard_hyper, hyper, row_grads, two_pass
from .common import custom_reg_info
from .head import AotFusedHead, head_ready


# Picked in __init__: (d_student, d_teacher) from what the backward core returns.
def _both_grads(teacher, grads):  # pylint: disable=unused-argument
    return grads


def _student_grad_only(teacher, d_student):
    # A constant of the teacher's shape: a frozen teacher gets zeros and costs no kernel work.
    return d_student, ops.zeros(teacher.shape, teacher.dtype)


class _DistillGradPairing(nn.Cell):
    """sum(cs * d_student) + sum(ct * d_teacher) (each term only when ``student`` / ``teacher``) for d_* the
    gradients of sum_rows g * loss_row, in plain MindSpore ops (ms_kldiv._distill_math's closed forms, float32):
    differentiating it gives the backward kernel's own gradient, with the saved stats taken as the functions of the
    logits they are."""

    def __init__(self, temperature, beta, student=True, teacher=True, variant=KL):
        super().__init__()
        self.temperature = temperature
        self.beta = beta
        self.student = student
        self.teacher = teacher
        self.variant = variant

    def construct(self, student, teacher, g, cs, ct):
        f32 = ms.float32
        vocab = student.shape[-1]
        s2 = ops.reshape(ops.cast(student, f32), (-1, vocab))
        t2 = ops.reshape(ops.cast(teacher, f32), (-1, vocab))
        w = ops.reshape(ops.cast(g, f32), (-1, 1))
        ds, dt = row_grads(s2, t2, self.temperature, self.beta, self.teacher, differentiable=True,
                           variant=self.variant)
        total = ops.zeros((), f32)
        if self.student:
            total = total + (ops.reshape(ops.cast(cs, f32), (-1, vocab)) * w * ds).sum()
        if self.teacher:
            total = total + (ops.reshape(ops.cast(ct, f32), (-1, vocab)) * w * dt).sum()
        return total


def _identity(v):
    return v


def _first(v):
    return v[0]


def _twice(v):
    return v, v


class _DistillGradCore(nn.Cell):
    """A backward kernel, differentiable once more through _DistillGradPairing (second order): both gradients
    (``student`` and ``teacher``), d_student alone (the kernel's placeholder output is dropped inside this Cell, so
    autodiff never builds a cotangent for it) or d_teacher alone (``backward_teacher``: compiled code with one op
    per gradient, so that an unused one is dropped). The stats input gets a zero gradient: its dependence on the
    logits is inside the pairing's derivative."""

    def __init__(self, kernels, temperature, beta, student=True, teacher=True, variant=KL):
        super().__init__()
        # Picked here, not by a Python branch in construct/bprop: that breaks grad-of-jit in a Cell with a bprop.
        if student:
            self.kernel = kernels.backward(temperature, beta, teacher, variant)
            self.output = _identity if teacher else _first
        else:
            self.kernel, self.output = kernels.backward_teacher(temperature, beta, variant), _identity
        self.cotangents = _identity if student and teacher else _twice
        self.pairing_grad = ops.GradOperation(get_all=True)(
            _DistillGradPairing(temperature, beta, student, teacher, variant))

    def construct(self, student, teacher, stats, dloss):
        return self.output(self.kernel(student, teacher, stats, dloss))

    def bprop(self, student, teacher, stats, dloss, out, dout):
        cs, ct = self.cotangents(dout)
        gs, gt, gg, _, _ = self.pairing_grad(student, teacher, dloss, cs, ct)
        return gs, gt, ops.zeros(stats.shape, stats.dtype), gg


def _nan_like(x):
    return ops.fill(x.dtype, x.shape, float("nan"))


class _FirstOrderGradCore(_DistillGradCore):
    """The backward kernel of kernels without a second-order rule (``second_order = False``: a vocabulary-parallel
    loss, whose stats hold values merged across ranks): its own gradient is NaN, not one rank's slice differentiated
    alone (silently wrong). (Not a raise: graph mode builds this bprop even when nobody differentiates twice, and a
    bprop that only raises has no return value to build.)"""

    def bprop(self, student, teacher, stats, dloss, out, dout):
        return _nan_like(student), _nan_like(teacher), ops.zeros(stats.shape, stats.dtype), _nan_like(dloss)


def _grad_core(kernels, *args, **kwargs):
    cls = _DistillGradCore if getattr(kernels, "second_order", True) else _FirstOrderGradCore
    return cls(kernels, *args, **kwargs)


class _DistillStatsCore(nn.Cell):
    """The forward kernel (its output: the stats) with the backward kernel as its gradient. Only the loss column
    of the stats carries a gradient; the other columns are saved values."""

    def __init__(self, kernels, temperature, beta, teacher_grad, variant=KL):
        super().__init__()
        self.kernel = kernels.forward(temperature, beta, variant)
        if teacher_grad:
            self.grad, self.split = _grad_core(kernels, temperature, beta, variant=variant), _both_grads
        else:
            self.grad = _grad_core(kernels, temperature, beta, teacher=False, variant=variant)
            self.split = _student_grad_only

    def construct(self, student, teacher):
        return self.kernel(student, teacher)

    def bprop(self, student, teacher, out, dout):
        dloss = ops.cast(dout[..., 0], ms.float32)
        return self.split(teacher, self.grad(student, teacher, out, dloss))


class _DistillStatsCoreSplit(nn.Cell):
    """As _DistillStatsCore, for compiled code: each gradient from its own kernel, so that graph mode drops the one
    nobody uses (a frozen teacher costs no teacher work) at the price of a second read when both are used."""

    def __init__(self, kernels, temperature, beta, variant=KL):
        super().__init__()
        self.kernel = kernels.forward(temperature, beta, variant)
        self.grad_student = _grad_core(kernels, temperature, beta, teacher=False, variant=variant)
        self.grad_teacher = _grad_core(kernels, temperature, beta, student=False, variant=variant)

    def construct(self, student, teacher):
        return self.kernel(student, teacher)

    def bprop(self, student, teacher, out, dout):
        dloss = ops.cast(dout[..., 0], ms.float32)
        return (self.grad_student(student, teacher, out, dloss), self.grad_teacher(student, teacher, out, dloss))


def row_loss(stats, mark):
    """Each row's loss from the forward kernel's stats; with ``mark`` (``_distill_math.two_pass``) NaN on a row
    whose student has no distribution (NaN, +inf or every logit -inf: its log-normalizer, stats column LOG_Z_S, is
    not finite), marked by adding 0 x that column: no second read of the logits."""
    loss = stats[..., 0]
    return loss + ops.stop_gradient(stats[..., LOG_Z_S]) * 0.0 if mark else loss


class _DistillRows(nn.Cell):
    def __init__(self, core, mark):
        super().__init__()
        self.core = core
        self.mark = mark

    def construct(self, student, teacher):
        return row_loss(self.core(student, teacher), self.mark)


def rows_op(kernels, temperature=1.0, beta=0.0, teacher_grad=True, split=False, variant=KL):
    """Cell (student, teacher) -> float32 per-row loss [...] on ``kernels``, differentiable for both logits (one
    backward launch writes both gradients; with ``teacher_grad=False`` the teacher gets zeros and the kernels do
    no teacher work). ``split`` (compiled code, kernels with ``backward_teacher``): one kernel per gradient.
    ``variant``: the divergence and the logits' transform (``ms_kldiv._distill_math.Variant``)."""
    if split and hasattr(kernels, "backward_teacher"):
        core = _DistillStatsCoreSplit(kernels, temperature, beta, variant)
    else:
        core = _DistillStatsCore(kernels, temperature, beta, teacher_grad, variant)
    return without_mixed_precision(_DistillRows(core, two_pass(beta, variant)))


# ----------------------------------------------------------------------------------- compiled libraries
class _AotKernel(nn.Cell):
    """One exported symbol of a kernel library (custom_ops/common/distill_abi.h) with (temperature, beta, divergence
    code, alpha, soft cap, logit scale) bound as a float64 constant input."""

    def __init__(self, kernels, name, inputs, outputs, out_dtype, temperature, beta, variant=KL, values=None):
        super().__init__()
        self.hyper = ms.Tensor(values or hyper(temperature, beta, variant), ms.float64)
        # out_shape None: the library's C++ <name>InferShape, which dynamic row counts (set_inputs) need
        self.op = ops.Custom(f"{kernels.lib_path}:{name}", out_shape=None, out_dtype=out_dtype, func_type="aot",
                             reg_info=custom_reg_info(name, kernels.target, inputs, outputs))

    def construct(self, *args):
        return self.op(args[0], args[1], self.hyper, *args[2:])


def _stats_dtype(*_):
    return ms.float32


class _AotBackwardStudent(nn.Cell):
    def __init__(self, kernels, temperature, beta, variant=KL):
        super().__init__()
        self.kernel = _AotKernel(kernels, "DistillBwdStudent", ("s", "t", "hyper", "stats", "dloss"), ("ds",),
                                 lambda s, *_: s, temperature, beta, variant)

    def construct(self, s, t, stats, dloss):
        return self.kernel(s, t, stats, dloss), ops.zeros((1,), s.dtype)


class AotDistillKernels:
    """The fused distillation kernels of a compiled library: libkldiv_cpu.so (custom_ops/cpu/distill_cpu.cc) for
    target 'CPU', libkldiv_cuda.so (custom_ops/gpu/distill_cuda.cu) for 'GPU'."""

    dtypes = (ms.float16, ms.bfloat16, ms.float32)

    def __init__(self, lib_path, target="CPU"):
        self.lib_path = lib_path
        self.target = target

    def unsupported(self, variant):  # pylint: disable=unused-argument
        """Why these kernels cannot compute ``variant`` (None: they can; both libraries compute every one)."""
        return None

    def forward(self, temperature, beta, variant=KL):
        return _AotKernel(self, "DistillFwd", ("s", "t", "hyper"), ("stats",), _stats_dtype, temperature, beta,
                          variant)

    def backward(self, temperature, beta, teacher_grad, variant=KL):
        if not teacher_grad:
            return _AotBackwardStudent(self, temperature, beta, variant)
        return _AotKernel(self, "DistillBwd", ("s", "t", "hyper", "stats", "dloss"), ("ds", "dt"),
                          lambda s, t, *_: (s, t), temperature, beta, variant)

    def backward_teacher(self, temperature, beta, variant=KL):
        return _AotKernel(self, "DistillBwdTeacher", ("s", "t", "hyper", "stats", "dloss"), ("dt",),
                          lambda s, t, *_: t, temperature, beta, variant)

    def hard(self, variant, z_loss, label_smoothing, ignore_index):
        return _AotKernel(self, "DistillHard", ("s", "labels", "hyper", "g", "ds"), ("rows", "d"),
                          lambda s, *_: (ms.float32, s), 1.0, 0.0,
                          values=hard_hyper(variant, z_loss, label_smoothing, ignore_index))

    def fused_head(self, student, *options):
        """The fused linear head's pass in one kernel (``ms_kldiv.backends.head.AotFusedHead``) where this library
        has it (the CPU one, with MindSpore's libdnnl loaded), else None (the head runs its chunk loop, as it does
        with ``MS_KLDIV_HEAD_KERNEL=0``)."""
        if self.target != "CPU" or os.environ.get("MS_KLDIV_HEAD_KERNEL", "1") == "0" or not head_ready(self.lib_path):
            return None
        return AotFusedHead(self.lib_path, student, *options)

    # The vocabulary-parallel entry points (base.py): the backward kernels already read every normalizer and sum
    # from the stats, so the merged stats of a slice need no kernel of their own there.
    def states(self, temperature, variant=KL):
        return _AotKernel(self, "DistillStates", ("s", "t", "hyper"), ("stats",), _stats_dtype, temperature, 0.0,
                          variant)

    def forward_given(self, temperature, beta, variant=KL):
        return _AotKernel(self, "DistillFwdGiven", ("s", "t", "hyper", "states"), ("stats",), _stats_dtype,
                          temperature, beta, variant)

    def backward_given(self, temperature, beta, teacher_grad, variant=KL):
        return self.backward(temperature, beta, teacher_grad, variant)

    def backward_teacher_given(self, temperature, beta, variant=KL):
        return self.backward_teacher(temperature, beta, variant)
