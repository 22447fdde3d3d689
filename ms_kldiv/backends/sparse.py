"""The stored-teacher distillation op on top of a pair of kernels (contract: ``ms_kldiv.backends.base``), for any
device: the autodiff around them is written once.

``AotSparseKernels`` are the compiled libraries' kernels (custom_ops/cpu/sparse_kernels.inc,
custom_ops/gpu/sparse_cuda.cu), ``CompositeSparseKernels`` (``ms_kldiv.backends.composite``) the closed forms of
``ms_kldiv._sparse_math``; the registry hands them out (``get_kernels('sparse_distillation', ...)``). The
teacher's ids and values are stored data: their gradient is 0.
"""
import mindspore as ms
from mindspore import nn, ops

from .._compat import without_mixed_precision
from .common import custom_reg_info


_zeros_like = ops.ZerosLike()


class _SparseCore(nn.Cell):
    """The forward kernel (its output: the stats) with the backward kernel as its gradient; only the loss column
    carries a gradient."""

    def __init__(self, kernels, temperature, ratio, beta, tail):
        super().__init__()
        self.forward_kernel = kernels.forward(temperature, ratio, beta, tail)
        self.backward_kernel = kernels.backward(temperature, ratio, beta, tail)

    def construct(self, s, ids, values):
        return self.forward_kernel(s, ids, values)

    def bprop(self, s, ids, values, out, dout):
        dloss = dout[..., 0]
        return self.backward_kernel(s, ids, values, out, dloss), _zeros_like(ids), _zeros_like(values)


class _SparseRows(nn.Cell):
    def __init__(self, core):
        super().__init__()
        self.core = core
        self.loss_column = ms.Tensor([True] + [False] * 7)

    def construct(self, s, ids, values):
        # Column 0 by a select and a sum, which work for 0 rows everywhere: [..., 0] is a Gather whose gradient
        # (UnsortedSegmentSum) fails on 0 rows, and a slice [..., :1] of 0 dynamic rows crashes graph mode (SIGFPE).
        return ops.sum(ops.where(self.loss_column, self.core(s, ids, values), 0.0), -1)


def rows_op(kernels, temperature, ratio, beta, tail):
    """Cell (s [..., V], ids int32 [..., K], values float32 [..., K]) -> per-row loss [...] (the stats' dtype) on
    ``kernels``, differentiable for the student logits."""
    return without_mixed_precision(_SparseRows(_SparseCore(kernels, temperature, ratio, beta, tail)))


class _AotSparseKernel(nn.Cell):
    """One exported symbol of the library (custom_ops/common/sparse_abi.h) with (temperature, ratio, beta, tail)
    bound as a float64 constant input."""

    def __init__(self, kernels, name, inputs, outputs, out_dtype, hyper):
        super().__init__()
        self.hyper = ms.Tensor([float(v) for v in hyper], ms.float64)
        # out_shape None: the library's C++ <name>InferShape, which dynamic row counts need
        self.op = ops.Custom(f"{kernels.lib_path}:{name}", out_shape=None, out_dtype=out_dtype, func_type="aot",
                             reg_info=custom_reg_info(name, kernels.target, inputs, outputs))

    def construct(self, s, ids, values, *rest):
        return self.op(s, ids, values, self.hyper, *rest)


def _stats_dtype(*_):
    return ms.float32


def _student_dtype(s, *_):
    return s


class AotSparseKernels:
    """The stored-teacher kernels of libkldiv_cpu.so (target 'CPU') or libkldiv_cuda.so ('GPU')."""

    dtypes = (ms.float16, ms.bfloat16, ms.float32)

    def __init__(self, lib_path, target="CPU"):
        self.lib_path = lib_path
        self.target = target

    def forward(self, temperature, ratio, beta, tail):
        return _AotSparseKernel(self, "SparseFwd", ("s", "ids", "values", "hyper"), ("stats",), _stats_dtype,
                                (temperature, ratio, beta, tail))

    def backward(self, temperature, ratio, beta, tail):
        return _AotSparseKernel(self, "SparseBwd", ("s", "ids", "values", "hyper", "stats", "dloss"), ("ds",),
                                _student_dtype, (temperature, ratio, beta, tail))
