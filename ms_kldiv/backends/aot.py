"""Backend 'aot': the compiled kernel library for the current device target, through ``ops.Custom(func_type="aot")``.

One Python implementation serves every library that exports the ABI of ``custom_ops/common/kldiv_abi.h``:
device target 'CPU' loads ``libkldiv_cpu.so`` (custom_ops/cpu), 'GPU' loads ``libkldiv_cuda.so``
(custom_ops/gpu). ``ms_kldiv._build`` finds an up-to-date library or compiles it once into the per-user cache;
when it cannot, ``unavailable_reason`` says why and ``'auto'`` falls back to 'composite'.

Each (reduction, log_target) pair is its own exported symbol with a C++ ``<Fn>InferShape`` and a
``reg_info`` with unknown dtype/format, which is what makes ``Cell.set_inputs`` with ``None`` dims work; the
output dtype comes from a Python function (a plain dtype would turn the 0-d result into a Python float in
GRAPH_MODE and silently zero its gradient). The forward op's bprop is the fused backward op (both
gradients, summed back to each operand's shape, in one pass); the backward op's own bprop is written with
plain MindSpore ops, which gives second-order gradients (and higher, by MindSpore's autodiff).
"""
import logging
import math
import os
import threading

import numpy as np

import mindspore as ms
from mindspore import nn, ops
from mindspore.ops import CustomRegOp, DataType

from .. import _build
from .._validation import HALF_DTYPES
from . import register
from .base import Backend

_logger = logging.getLogger("ms_kldiv")

_REDUCTION_SYMBOL = {"none": "None", "sum": "Sum", "mean": "Mean", "batchmean": "Batchmean"}


def symbol(kind, reduction, log_target):
    """Exported name, e.g. symbol('Fwd', 'batchmean', True) == 'KLDivFwdBatchmeanLog' (see kldiv_abi.h)."""
    return f"KLDiv{kind}{_REDUCTION_SYMBOL[reduction]}{'Log' if log_target else 'Prob'}"


def _reg_info(name, target, inputs, outputs):
    reg = CustomRegOp(name)
    for i, n in enumerate(inputs):
        reg = reg.input(i, n)
    for i, n in enumerate(outputs):
        reg = reg.output(i, n)
    return reg.dtype_format(*([DataType.None_None] * (len(inputs) + len(outputs)))).target(target).get_op_info()


# ------------------------------------------------------------------------------ second-order (plain ops)
# d(grad_input)/dt, d(grad_target)/dx, d(grad_target)/dt; d(grad_input)/dx is 0. Branch-free and with safe
# masked lanes, like composite.py (a Python `if` on a constant in a bprop helper breaks grad-of-jit).
def _hess_prob(x, t):
    mass = ops.logical_not(t <= 0)
    ts = ops.where(mass, t, 1.0)
    one = ops.ones_like(ts)
    return (ops.where(mass, -one, 0.0), ops.where(mass, -one, 0.0), ops.where(mass, 1.0 / ts, 0.0))


def _hess_log(x, t):
    mass = ops.logical_not(t == -math.inf)
    xs, ts = ops.where(mass, x, 0.0), ops.where(mass, t, 0.0)
    e = ops.exp(ts)
    return ops.where(mass, -e, 0.0), ops.where(mass, -e, 0.0), ops.where(mass, e * (ts - xs + 2), 0.0)


def _sum_to(v, shape):
    """Sum a broadcast-shaped ``v`` back to ``shape`` (static rank; unknown dims are taken as not broadcast)."""
    lead = v.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and v.shape[lead + i] != 1)
    if axes:
        v = ops.sum(v, axes, keepdim=True)
        if lead:
            v = ops.reshape(v, v.shape[lead:]) if len(shape) else ops.reshape(v, ())
    return v


class AotKLDiv(nn.Cell):
    """The kernels for one (library, reduction, log_target).

    ``fwd``: the forward Custom op whose bprop is the fused backward op (both gradients in one pass), for
    PyNative, where a bprop always runs whole. ``fwd_graph`` (None when the library lacks the single-gradient
    symbols): the same forward with a bprop of two single-gradient ops, for graph mode, which drops an op
    whose output nobody uses: with a fixed target (distillation) only d/dinput is computed, and that needs
    no log. The backward ops' own bprops (second order) are plain MindSpore ops.
    """

    def __init__(self, lib_path, target, reduction, log_target, split=False):
        super().__init__()
        self.lib_path = lib_path
        self.target = target
        self.reduction = reduction
        self.log_target = log_target
        self.hess_fn = _hess_log if log_target else _hess_prob
        self.pointwise_grads = _pointwise_grads(log_target)
        fwd_name, bwd_name = symbol("Fwd", reduction, log_target), symbol("Bwd", reduction, log_target)
        self.bwd = ops.Custom(f"{lib_path}:{bwd_name}", out_shape=None, out_dtype=lambda x, t, g: (x, t),
                              func_type="aot", bprop=self._bwd_bprop,
                              reg_info=_reg_info(bwd_name, target, ("x", "t", "g"), ("dx", "dt")))
        self.fwd = ops.Custom(f"{lib_path}:{fwd_name}", out_shape=None, out_dtype=lambda x, t: x,
                              func_type="aot", bprop=self._fwd_bprop,
                              reg_info=_reg_info(fwd_name, target, ("x", "t"), ("y",)))
        self.fwd_graph = None
        if split:
            dx_name = symbol("BwdInput", reduction, log_target)
            dt_name = symbol("BwdTarget", reduction, log_target)
            self.bwd_dx = ops.Custom(f"{lib_path}:{dx_name}", out_shape=None, out_dtype=lambda x, t, g: x,
                                     func_type="aot", bprop=self._bwd_dx_bprop,
                                     reg_info=_reg_info(dx_name, target, ("x", "t", "g"), ("dx",)))
            self.bwd_dt = ops.Custom(f"{lib_path}:{dt_name}", out_shape=None, out_dtype=lambda x, t, g: t,
                                     func_type="aot", bprop=self._bwd_dt_bprop,
                                     reg_info=_reg_info(dt_name, target, ("x", "t", "g"), ("dt",)))
            self.fwd_graph = ops.Custom(f"{lib_path}:{fwd_name}", out_shape=None, out_dtype=lambda x, t: x,
                                        func_type="aot", bprop=self._fwd_bprop_split,
                                        reg_info=_reg_info(fwd_name, target, ("x", "t"), ("y",)))

    def construct(self, x, t):
        return self.fwd(x, t)

    def _fwd_bprop(self, x, t, out, dout):
        dx, dt = self.bwd(x, t, dout)
        return dx, dt

    def _scale(self, x, full):
        # In full's dtype: a float32 1/numel would cost float64 gradients 3e-8 of relative accuracy.
        if self.reduction == "mean":
            return 1.0 / ops.cast(ops.size(full), full.dtype)
        if self.reduction == "batchmean":
            return 1.0 / ops.cast(x.shape[0], full.dtype) if x.ndim else ops.ones((), full.dtype)
        return ops.ones((), full.dtype)

    def _fwd_bprop_split(self, x, t, out, dout):
        return self.bwd_dx(x, t, dout), self.bwd_dt(x, t, dout)

    # The backward computes dx = sum_to_x(Gi * G), dt = sum_to_t(Gt * G) with G = dout * s broadcast; the
    # vjps against their cotangents a (of dx) and b (of dt) are written out in the broadcast shape, then
    # summed back to each operand's shape.
    def _second_order_terms(self, x, t, g):
        dtype = x.dtype
        # float32 for half types (CPU BroadcastTo/ReduceSum have no bfloat16 kernel); arithmetic
        # broadcasting (x + 0*t-shaped zeros) also works with dynamic shapes.
        cdt = ms.float32 if dtype in HALF_DTYPES else dtype
        xf, tf = ops.cast(x, cdt), ops.cast(t, cdt)
        xb = xf + ops.zeros_like(tf)
        tb = tf + ops.zeros_like(xf)
        s = self._scale(x, xb)
        gfull = ops.cast(g, xb.dtype) * s
        return cdt, xb, tb, s, gfull

    def _finish(self, x, t, d_x, d_t, d_g):
        if self.reduction != "none":
            d_g = ops.sum(d_g)
        dtype = x.dtype
        return (ops.cast(_sum_to(d_x, x.shape), dtype), ops.cast(_sum_to(d_t, t.shape), dtype),
                ops.cast(d_g, dtype))

    def _bwd_bprop(self, x, t, g, out, dout):
        a, b = dout
        cdt, xb, tb, s, gfull = self._second_order_terms(x, t, g)
        ab = ops.cast(a, cdt) + ops.zeros_like(xb)
        bb = ops.cast(b, cdt) + ops.zeros_like(xb)
        gi_t, gt_x, gt_t = self.hess_fn(xb, tb)
        gi, gt = self.pointwise_grads(xb, tb)
        return self._finish(x, t, gfull * (bb * gt_x), gfull * (ab * gi_t + bb * gt_t), (ab * gi + bb * gt) * s)

    def _bwd_dx_bprop(self, x, t, g, out, dout):
        cdt, xb, tb, s, gfull = self._second_order_terms(x, t, g)
        ab = ops.cast(dout, cdt) + ops.zeros_like(xb)
        gi_t, _, _ = self.hess_fn(xb, tb)
        gi, _ = self.pointwise_grads(xb, tb)
        return self._finish(x, t, ops.zeros_like(xb), gfull * (ab * gi_t), ab * gi * s)

    def _bwd_dt_bprop(self, x, t, g, out, dout):
        cdt, xb, tb, s, gfull = self._second_order_terms(x, t, g)
        bb = ops.cast(dout, cdt) + ops.zeros_like(xb)
        _, gt_x, gt_t = self.hess_fn(xb, tb)
        _, gt = self.pointwise_grads(xb, tb)
        return self._finish(x, t, gfull * (bb * gt_x), gfull * (bb * gt_t), bb * gt * s)


def _pointwise_grads(log_target):
    from .composite import pointwise_fns
    return pointwise_fns(log_target)[1]


class AotBackend(Backend):
    name = "aot"
    description = "compiled C++ (CPU) / CUDA (GPU) kernels: fused single-pass forward and backward"
    preference = {"CPU": 100, "GPU": 100}

    def __init__(self):
        self._lock = threading.RLock()
        self._libs = {}  # device -> (path or None, reason or None)
        self._cells = {}  # (device, reduction, log_target) -> AotKLDiv

    def library(self, device):
        """(path, None) or (None, reason) for ``device``, building once if needed."""
        with self._lock:
            if device not in self._libs:
                try:
                    self._libs[device] = (_build.ensure_library(device, log=_logger.warning), None)
                except _build.BuildError as e:
                    self._libs[device] = (None, str(e).splitlines()[0])
                except OSError as e:  # unwritable cache, ...
                    self._libs[device] = (None, f"{_build.LIB_NAMES[device]} could not be built: {e}")
            return self._libs[device]

    def unavailable_reason(self, device):
        reason = super().unavailable_reason(device)
        if reason:
            return reason
        return self.library(device)[1]

    def info(self, device="CPU"):
        """The library's own one-line description (ABI version, ISA, threads), or the reason it is missing."""
        path, reason = self.library(device)
        if reason:
            return reason
        return f"{_build.library_info(path)} ({path})"

    def _kernels(self, reduction, log_target):
        device = ms.get_context("device_target")
        path, reason = self.library(device)
        if reason:
            raise RuntimeError(f"For 'kl_div', backend 'aot' cannot run on {device}: {reason}.")
        key = (device, reduction, log_target)
        with self._lock:
            if key not in self._cells:
                self._cells[key] = AotKLDiv(path, device, reduction, log_target,
                                            split=_has_symbols(path, ("BwdInput", "BwdTarget"), reduction, log_target))
            return self._cells[key]

    def make_op(self, reduction, log_target):
        # The forward primitive itself is the op (its bprop is bound to the Cell, which it keeps alive):
        # calling a primitive skips Cell.__call__, which matters for small PyNative calls. On CPU, PyNative
        # calls that autograd does not record call the same kernel directly (HostCall).
        cell = self._kernels(reduction, log_target)
        if cell.target == "CPU" and HostCall.supported():
            return HostCall(cell.fwd, cell.lib_path, symbol("Fwd", reduction, log_target), reduction)
        return cell.fwd

    def make_graph_op(self, reduction, log_target):
        cell = self._kernels(reduction, log_target)
        return cell.fwd_graph if cell.fwd_graph is not None else cell.fwd


class HostCall:
    """The CPU forward for PyNative calls that autograd does not record: the exported kernel, called directly.

    On CPU a Tensor's memory is host memory, and ``asnumpy()`` returns it without a copy once the ops producing
    it are done (it waits for them). Calling the kernel on it through ctypes skips MindSpore's PyNative op
    dispatch (~100 us per op on 2 cores, handing the op through its frontend and launch threads), which
    dominates small calls: 4K elements ~150 -> ~35 us per call+sync. The result is the same function of the
    same inputs, computed by the same symbol (tests compare the two paths bit for bit).

    When autograd records (``ms.grad``, ``value_and_grad``, ``GradOperation``, ``TrainOneStepCell``, ...)
    the primitive runs instead, so its bprop is recorded. ``MS_KLDIV_HOST_CALL=0`` turns this path off.
    """

    _executor = None

    @classmethod
    def supported(cls):
        if os.environ.get("MS_KLDIV_HOST_CALL", "1") == "0":
            return False
        if cls._executor is None:
            try:  # private API: if it moves, every call takes the primitive (correct, just slower)
                from mindspore.graph.api import _pynative_executor
                _pynative_executor.requires_grad()
                cls._executor = _pynative_executor
            except (ImportError, AttributeError):
                cls._executor = False
        return bool(cls._executor)

    def __init__(self, prim, lib_path, name, reduction):
        import ctypes
        self.prim = prim
        self._ct = ctypes
        self._fn = getattr(ctypes.CDLL(lib_path), name)
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 6
        self._none = reduction == "none"
        self._layouts = {}  # (x shape, t shape, dtype) -> (out shape, ndims, shapes, dtypes, keep-alive)

    def _layout(self, a, b):
        key = (a.shape, b.shape, a.dtype)  # (dtype.name is slow: a Python property)
        layout = self._layouts.get(key)
        if layout is None:
            ct = self._ct
            oshape = np.broadcast_shapes(a.shape, b.shape) if self._none else ()
            dims = [(ct.c_int64 * max(len(s), 1))(*s) for s in (a.shape, b.shape, oshape)]
            shapes = (ct.POINTER(ct.c_int64) * 3)(*[ct.cast(d, ct.POINTER(ct.c_int64)) for d in dims])
            ndims = (ct.c_int * 3)(len(a.shape), len(b.shape), len(oshape))
            name = a.dtype.name.encode()  # the ABI's dtype strings are NumPy's names
            dtypes = (ct.c_char_p * 3)(name, name, name)
            if len(self._layouts) > 256:
                self._layouts.clear()
            layout = self._layouts[key] = (oshape, ndims, shapes, dtypes, dims)
        return layout

    def __call__(self, x, t):
        if self._executor.requires_grad():
            return self.prim(x, t)
        return ms.Tensor.from_numpy(self.run(x.asnumpy(), t.asnumpy()))

    def run(self, a, b):
        """The kernel on two NumPy arrays of one dtype (validated by the caller); returns the output array."""
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would also turn a 0-d array into 1-d)
            a = a.copy()
        if not b.flags.c_contiguous:
            b = b.copy()
        oshape, ndims, shapes, dtypes, _ = self._layout(a, b)
        out = np.empty(oshape, a.dtype)
        params = (self._ct.c_void_p * 3)(a.ctypes.data, b.ctypes.data, out.ctypes.data)
        if self._fn(3, params, ndims, shapes, dtypes, None, None) != 0:
            raise RuntimeError(f"For 'kl_div', the CPU kernel rejected shapes {a.shape}, {b.shape} ({a.dtype}).")
        return out


def _has_symbols(path, kinds, reduction, log_target):
    import ctypes
    lib = ctypes.CDLL(path)
    return all(hasattr(lib, symbol(k, reduction, log_target)) for k in kinds)


register(AotBackend())
