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
import os
import threading

import numpy as np

import mindspore as ms
from mindspore import nn, ops

from .. import _build, _math
from . import register
from .base import Backend
from .common import DISPATCH_LOCK, SerializedDispatch, custom_reg_info
from .distill import AotDistillKernels
from .sparse import AotSparseKernels

_logger = logging.getLogger("ms_kldiv")

_REDUCTION_SYMBOL = {"none": "None", "sum": "Sum", "mean": "Mean", "batchmean": "Batchmean"}


def symbol(kind, reduction, log_target):
    """Exported name, e.g. symbol('Fwd', 'batchmean', True) == 'KLDivFwdBatchmeanLog' (see kldiv_abi.h)."""
    return f"KLDiv{kind}{_REDUCTION_SYMBOL[reduction]}{'Log' if log_target else 'Prob'}"


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
        math_fns = _math.pointwise(log_target)
        self.grads_fn, self.second_fn = math_fns.grads, math_fns.second
        self.scale = _math.scale_fn(reduction)

        def custom(name, inputs, outputs, out_dtype, bprop):
            return ops.Custom(f"{lib_path}:{name}", out_shape=None, out_dtype=out_dtype, func_type="aot",
                              bprop=bprop, reg_info=custom_reg_info(name, target, inputs, outputs))

        fwd_name, bwd_name = symbol("Fwd", reduction, log_target), symbol("Bwd", reduction, log_target)
        self.bwd = custom(bwd_name, ("x", "t", "g"), ("dx", "dt"), lambda x, t, g: (x, t), self._bwd_bprop)
        self.fwd = custom(fwd_name, ("x", "t"), ("y",), lambda x, t: x, self._fwd_bprop)
        self.fwd_graph = None
        if split:
            self.bwd_dx = custom(symbol("BwdInput", reduction, log_target), ("x", "t", "g"), ("dx",),
                                 lambda x, t, g: x, self._bwd_dx_bprop)
            self.bwd_dt = custom(symbol("BwdTarget", reduction, log_target), ("x", "t", "g"), ("dt",),
                                 lambda x, t, g: t, self._bwd_dt_bprop)
            self.fwd_graph = custom(fwd_name, ("x", "t"), ("y",), lambda x, t: x, self._fwd_bprop_split)

    def construct(self, x, t):
        return self.fwd(x, t)

    def _fwd_bprop(self, x, t, out, dout):
        dx, dt = self.bwd(x, t, dout)
        return dx, dt

    def _fwd_bprop_split(self, x, t, out, dout):
        return self.bwd_dx(x, t, dout), self.bwd_dt(x, t, dout)

    # The backward computes dx = sum_to_x(px * G), dt = sum_to_t(pt * G) with G = dout * s broadcast; the
    # vjps against the cotangents a (of dx) and b (of dt) are _math's, in the broadcast shape, then summed
    # back to each operand's shape.
    def _broadcast_operands(self, x, t, g):
        # float32 for half types; arithmetic broadcasting (x + 0*t-shaped zeros) also works with dynamic shapes.
        cdt = _math.compute_dtype(x.dtype)
        xf, tf = ops.cast(x, cdt), ops.cast(t, cdt)
        xb = xf + ops.zeros_like(tf)
        tb = tf + ops.zeros_like(xf)
        s = self.scale(x, xb)
        return cdt, xb, tb, s, ops.cast(g, xb.dtype) * s

    def _finish(self, x, t, d_x, d_t, d_g, s):
        d_g = d_g * s
        if self.reduction != "none":
            d_g = ops.sum(d_g)
        dtype = x.dtype
        return (ops.cast(_math.sum_to(d_x, x.shape), dtype), ops.cast(_math.sum_to(d_t, t.shape), dtype),
                ops.cast(d_g, dtype))

    def _bwd_bprop(self, x, t, g, out, dout):
        a, b = dout
        cdt, xb, tb, s, gfull = self._broadcast_operands(x, t, g)
        ab = ops.cast(a, cdt) + ops.zeros_like(xb)
        bb = ops.cast(b, cdt) + ops.zeros_like(xb)
        px, pt = self.grads_fn(xb, tb)
        return self._finish(x, t, *_math.vjp_grads(px, pt, self.second_fn(xb, tb), gfull, ab, bb), s)

    def _bwd_dx_bprop(self, x, t, g, out, dout):
        cdt, xb, tb, s, gfull = self._broadcast_operands(x, t, g)
        ab = ops.cast(dout, cdt) + ops.zeros_like(xb)
        px, _ = self.grads_fn(xb, tb)
        d_t, d_g = _math.vjp_input_grad(px, self.second_fn(xb, tb), gfull, ab)
        return self._finish(x, t, ops.zeros_like(xb), d_t, d_g, s)

    def _bwd_dt_bprop(self, x, t, g, out, dout):
        cdt, xb, tb, s, gfull = self._broadcast_operands(x, t, g)
        bb = ops.cast(dout, cdt) + ops.zeros_like(xb)
        _, pt = self.grads_fn(xb, tb)
        return self._finish(x, t, *_math.vjp_target_grad(pt, self.second_fn(xb, tb), gfull, bb), s)


class AotBackend(Backend):
    name = "aot"
    description = "compiled C++ (CPU) / CUDA (GPU) kernels: fused single-pass forward and backward"
    preference = {"CPU": 100, "GPU": 100}
    ops = ("kl_div", "distillation", "sparse_distillation")

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

    def unavailable_reason(self, device, op="kl_div"):
        reason = super().unavailable_reason(device, op)
        if reason:
            return reason
        path, reason = self.library(device)
        if reason is None and op == "distillation" and not _has_exports(path, ("DistillFwd",)):
            # a library given by MS_KLDIV_LIB_DIR may predate the distillation kernels
            reason = f"{path} predates the distillation kernels (no DistillFwd)"
        if reason is None and op == "sparse_distillation" and not _has_exports(path, ("SparseFwd",)):
            reason = f"{path} predates the stored-teacher kernels (no SparseFwd)"
        return reason

    def distill_kernels(self, device):
        return AotDistillKernels(self.library(device)[0], device)

    def sparse_kernels(self, device):
        return AotSparseKernels(self.library(device)[0], device)

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
        return SerializedDispatch(cell.fwd)

    def make_graph_op(self, reduction, log_target):
        cell = self._kernels(reduction, log_target)
        return cell.fwd_graph if cell.fwd_graph is not None else cell.fwd


class HostCall:
    """The CPU forward for PyNative calls that autograd does not record: the exported kernel, called directly.

    On CPU a Tensor's memory is host memory, and ``asnumpy()`` returns it without a copy once the ops producing
    it are done (it waits for them). Calling the kernel on it through ctypes skips MindSpore's PyNative op
    dispatch (it hands the op through its frontend and launch threads), which dominates small calls. The result is
    the same function of the same inputs, computed by the same symbol (tests compare the two paths bit for bit).

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
            with DISPATCH_LOCK:
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


def _has_exports(path, names):
    import ctypes
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return False
    return all(hasattr(lib, n) for n in names)


def _has_symbols(path, kinds, reduction, log_target):
    return _has_exports(path, [symbol(k, reduction, log_target) for k in kinds])


register(AotBackend())
