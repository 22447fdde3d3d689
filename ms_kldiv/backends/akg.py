"""Backend 'akg': forward and backward written in MindSpore's Hybrid DSL, compiled by the AKG compiler.

Layout (mirrors the composite backend so that MindSpore's autodiff handles what the DSL cannot):

    AkgKLDiv (no bprop)    broadcast, widen half types, flatten, empty/dynamic fallbacks, scale, cast back
      _AkgCore (bprop)     forward kernel; its bprop is the fused two-gradient kernel
        backward kernel    a Custom op whose own bprop (plain ops) gives second-order gradients

The DSL indexes a tensor only by its own loop variables, and an AKG kernel is compiled per static shape, so
every kernel works on flat 1-D operands of one length: broadcasting is an ``ops.broadcast_to`` before the
core, and its adjoint (summing gradients back to each operand's shape) is MindSpore's own. Each distinct
length is one compile, cached on disk under ``MS_COMPILER_CACHE_PATH`` (ms_kldiv points it at a per-user
cache), so a length compiles once per machine, not once per process.

The pointwise formulas are the ones of ``custom_ops/common/kldiv_math.h`` / ``ms_kldiv.reference``, restated
in DSL syntax because AKG parses Python source and cannot include the C header. They are templated over
the compute dtype: the DSL types literals as float32 and refuses float64 mixes, so each literal is cast.

AKG's compiler runs in a helper process that MindSpore spawns, in the current working directory, on the
first kernel that is not in the disk cache; it writes ``./dsa_transfrom.log`` there (hard-coded in
libakg.so). ``_spawn_compiler_in_cache_dir`` therefore makes that process start inside our cache directory.
"""
import glob
import importlib.util
import linecache
import os
import threading
import time
import uuid

import mindspore as ms
from mindspore import nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from .. import _env
from .._validation import HALF_DTYPES, kldiv_broadcast_shape
from . import register
from .base import Backend
from .composite import CompositeKLDiv, pointwise_fns

# ---------------------------------------------------------------------------------------------------------
# Kernel sources. {F} is the compute dtype ('float32' or 'float64'); {Z} is {F}(0), the typed zero.
# No-mass tests are the header's: "t <= 0" (so a NaN target keeps its mass) and "t == -inf", written as
# isinf(t) and t < 0 because the DSL has no infinite literal.

_LOSS = {
    False: "{Z} if t[i] <= {Z} else t[i] * (log(t[i]) - x[i])",
    True: "({Z} if t[i] < {Z} else exp(t[i]) * (t[i] - x[i])) if isinf(t[i]) else exp(t[i]) * (t[i] - x[i])",
}
_GRAD_X = {
    False: "{Z} if t[i] <= {Z} else -t[i] * {G}",
    True: "({Z} if t[i] < {Z} else -exp(t[i]) * {G}) if isinf(t[i]) else -exp(t[i]) * {G}",
}
_GRAD_T = {
    False: "{Z} if t[i] <= {Z} else (log(t[i]) + {F}(1) - x[i]) * {G}",
    True: "({Z} if t[i] < {Z} else exp(t[i]) * (t[i] - x[i] + {F}(1)) * {G}) if isinf(t[i]) "
          "else exp(t[i]) * (t[i] - x[i] + {F}(1)) * {G}",
}

_FWD_NONE = """
def {name}(x, t):
    out = output_tensor(x.shape, x.dtype)
    for i in range(x.shape[0]):
        out[i] = {loss}
    return out
"""

# Sums accumulate in float64 whatever the compute dtype (SPEC: a float32 sum of 32M terms within 1e-6).
# The outer one-trip loop is load-bearing: without it AKG 2.10's CPU reduce-vectorizer keeps only one of
# its 4 lanes (a sum of x over 12 elements returned x[3] + x[7] + x[11], measured); inside it, it is right.
_FWD_SUM = """
def {name}(x, t):
    acc = output_tensor((1,), 'float64')
    for j in range(1):
        acc[j] = float64(0)
        for i in range(x.shape[0]):
            acc[j] = acc[j] + float64({loss})
    return acc
"""

# g is the incoming gradient: elementwise ('none') or one scaled value shared by all elements (g[0]).
# Both gradients come from one pass, stacked as rows of one output: MindSpore 2.10's CPU runtime returns
# zeros for a hybrid kernel with two outputs (measured), a single (2, n) output works.
_BWD = """
def {name}(x, t, g):
    d = output_tensor((2, x.shape[0]), x.dtype)
    for i in range(x.shape[0]):
        d[0, i] = {gx}
        d[1, i] = {gt}
    return d
"""

_KERNELS = {}
_KERNELS_LOCK = threading.Lock()


def _source(kind, log_target, dtype):
    space = "log" if log_target else "prob"
    name = f"ms_kldiv_{kind}_{space}_{dtype}"
    g = "g[i]" if kind == "bwd_none" else "g[0]"
    fill = dict(F=dtype, Z=f"{dtype}(0)", G=g)
    if kind.startswith("bwd"):
        src = _BWD.format(name=name, gx=_GRAD_X[log_target].format(**fill), gt=_GRAD_T[log_target].format(**fill))
    else:
        template = _FWD_NONE if kind == "fwd_none" else _FWD_SUM
        src = template.format(name=name, loss=_LOSS[log_target].format(**fill))
    return name, src.lstrip("\n")


def _kernel_fn(kind, log_target, dtype):
    """The @kernel function for one variant, defined from generated source.

    ``ops.Custom`` reads a hybrid function's text with ``inspect.getsource``; registering the generated text
    in ``linecache`` under a pseudo file name makes that work without writing a file anywhere.
    """
    key = (kind, log_target, dtype)
    with _KERNELS_LOCK:
        if key not in _KERNELS:
            name, src = _source(kind, log_target, dtype)
            filename = f"<ms_kldiv-akg-{name}>"
            linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
            namespace = {}
            exec(compile(src, filename, "exec"), namespace)  # pylint: disable=exec-used
            _KERNELS[key] = ops.kernel(namespace[name])
        return _KERNELS[key]


# ---------------------------------------------------------------------------------------------------------
# Keeping the AKG compiler process out of the user's working directory.

_SPAWNED = False
_SPAWN_LOCK = threading.Lock()
#: seconds the one-off compiler start took in this process (None until it ran); reported by the tests.
COMPILER_START_SECONDS = None


def _spawn_compiler_in_cache_dir():
    """Make MindSpore start its AKG compile server now, with the cache directory as its cwd.

    The server is started lazily by MindSpore's C++ on the first kernel missing from the disk cache and
    inherits the cwd of that moment for good. We force that moment here: compile a throw-away kernel whose
    source is unique to this process (so it can never be a cache hit) while the cwd is the cache dir, then
    restore the cwd and delete the throw-away kernel's files. The chdir window covers only this
    synchronous warm-up, before any of our ops is handed to the user.
    """
    global _SPAWNED, COMPILER_START_SECONDS  # pylint: disable=global-statement
    with _SPAWN_LOCK:
        if _SPAWNED:
            return
        _SPAWNED = True
        workdir = _env.cache_dir("akg_cwd")
        marker = f"msk{uuid.uuid4().hex}"
        src = (f"def {marker}(x):\n"
               f"    out = output_tensor(x.shape, x.dtype)\n"
               f"    for i in range(x.shape[0]):\n"
               f"        out[i] = x[i] + float32(1)\n"
               f"    return out\n")
        filename = f"<ms_kldiv-akg-{marker}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        namespace = {}
        exec(compile(src, filename, "exec"), namespace)  # pylint: disable=exec-used
        probe = ops.Custom(ops.kernel(namespace[marker]), out_shape=lambda s: s, out_dtype=lambda d: d,
                           func_type="hybrid")
        start = time.perf_counter()
        cwd = os.getcwd()
        os.chdir(workdir)
        try:
            probe(ms.Tensor([0.0], ms.float32)).asnumpy()
        finally:
            os.chdir(cwd)
        COMPILER_START_SECONDS = time.perf_counter() - start
        _remove_probe_files(marker)


def _remove_probe_files(marker):
    meta = os.path.join(os.environ.get("MS_COMPILER_CACHE_PATH", ""), "akg_kernel_meta")
    for info in glob.glob(os.path.join(meta, "*.json")) + glob.glob(os.path.join(meta, "*.info")):
        try:
            with open(info, encoding="utf-8", errors="replace") as f:
                if marker not in f.read():
                    continue
        except OSError:
            continue
        for path in glob.glob(os.path.splitext(info)[0] + ".*"):
            try:
                os.remove(path)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------------------
# Cells.

def _same(a, *_):
    return a


def _stacked_shape(x, *_):
    return (2,) + tuple(x)


def _second_prob(x, t):
    mass = ops.logical_not(t <= 0)
    m = ops.cast(mass, t.dtype)
    ts = ops.where(mass, t, 1.0)
    return -m, -m, ops.where(mass, 1.0 / ts, 0.0)


def _second_log(x, t):
    mass = ops.logical_not(t == -float("inf"))
    ts = ops.where(mass, t, 0.0)
    xs = ops.where(mass, x, 0.0)
    e = ops.where(mass, ops.exp(ts), 0.0)
    return -e, -e, ops.where(mass, e * (ts - xs + 2), 0.0)


class _SecondOrder:
    """bprop of the backward kernel (x, t, g) -> (dx, dt) = (px * g, pt * g), in plain ops, so that the
    first-order gradient is itself differentiable. (px, pt) = grads(x, t) are the pointwise gradients;
    for upstream (ax, at):

        d/dx = at * d(pt)/dx * g                        d(pt)/dx = -1 (prob), -exp(t) (log)
        d/dt = (ax * d(px)/dt + at * d(pt)/dt) * g      d(px)/dt = -1 | -exp(t);  d(pt)/dt = 1/t | exp(t)(t-x+2)
        d/dg = ax * px + at * pt                        summed to one element when g is the reduced gradient

    with every term 0 where the target has no mass. The helpers are picked here, not by an `if` inside the
    bprop: MindSpore 2.10 breaks grad-of-jit on constant `if`s in helpers called from a bprop.
    """

    def __init__(self, log_target):
        _, self.grads_fn = pointwise_fns(log_target)
        self.second_fn = _second_log if log_target else _second_prob

    def bprop_full(self, x, t, g, out, dout):
        ax, at = dout[0], dout[1]
        dpt_dx, dpx_dt, dpt_dt = self.second_fn(x, t)
        px, pt = self.grads_fn(x, t)
        return at * dpt_dx * g, (ax * dpx_dt + at * dpt_dt) * g, ax * px + at * pt

    def bprop_scalar(self, x, t, g, out, dout):
        ax, at = dout[0], dout[1]
        dpt_dx, dpx_dt, dpt_dt = self.second_fn(x, t)
        px, pt = self.grads_fn(x, t)
        return at * dpt_dx * g, (ax * dpx_dt + at * dpt_dt) * g, ops.reshape(ops.sum(ax * px + at * pt), (1,))


def _make_kernels(summed, log_target, dtype):
    name = "float64" if dtype == ms.float64 else "float32"
    if summed:
        fwd = ops.Custom(_kernel_fn("fwd_sum", log_target, name), out_shape=lambda x, t: (1,),
                         out_dtype=lambda x, t: mstype.TensorType(ms.float64), func_type="hybrid")
    else:
        fwd = ops.Custom(_kernel_fn("fwd_none", log_target, name), out_shape=_same, out_dtype=_same,
                         func_type="hybrid")
    second = _SecondOrder(log_target)
    kind = "bwd_scalar" if summed else "bwd_none"
    bwd = ops.Custom(_kernel_fn(kind, log_target, name), out_shape=_stacked_shape, out_dtype=_same,
                     func_type="hybrid", bprop=second.bprop_scalar if summed else second.bprop_full)
    return fwd, bwd


class _AkgCore(nn.Cell):
    """Flat same-length x, t in the compute dtype -> loss ('none') or its float64 sum, shape (1,)."""

    def __init__(self, summed, log_target, dtype):
        super().__init__()
        _spawn_compiler_in_cache_dir()
        self.fwd, self.bwd = _make_kernels(summed, log_target, dtype)

    def construct(self, x, t):
        return self.fwd(x, t)

    def bprop(self, x, t, out, dout):
        d = self.bwd(x, t, ops.cast(dout, x.dtype))
        return d[0], d[1]


@constexpr
def _use_fallback(x_shape, t_shape):
    dims = tuple(x_shape) + tuple(t_shape)
    return any(d is None or d <= 0 for d in dims)


class AkgKLDiv(nn.Cell):
    """The 'akg' op: broadcast, widen half types, flatten, AKG core, reduce scale, cast back."""

    def __init__(self, reduction, log_target):
        super().__init__()
        self.reduction = reduction
        summed = reduction != "none"
        # One core per compute dtype; the dtype is a compile-time constant, so only one is ever traced.
        self.core32 = _AkgCore(summed, log_target, ms.float32)
        self.core64 = _AkgCore(summed, log_target, ms.float64)
        # Empty tensors (AKG cannot compile a zero-length loop) and dynamic shapes (AKG compiles per static
        # shape) take the composite path, which defines both.
        self.fallback = CompositeKLDiv(reduction, log_target)

    def construct(self, x, t):
        if _use_fallback(ops.shape(x), ops.shape(t)):
            return self.fallback(x, t)
        shape = kldiv_broadcast_shape(ops.shape(x), ops.shape(t))
        dtype = x.dtype
        batch = x.shape[0] if x.ndim else 1  # 'batchmean' divides by input's first dim, not the broadcast one
        if x.shape != shape:
            x = ops.broadcast_to(x, shape)
        if t.shape != shape:
            t = ops.broadcast_to(t, shape)
        if dtype in HALF_DTYPES:
            x = ops.cast(x, ms.float32)
            t = ops.cast(t, ms.float32)
        xf = ops.reshape(x, (-1,))
        tf = ops.reshape(t, (-1,))
        if dtype == ms.float64:
            out = self.core64(xf, tf)
        else:
            out = self.core32(xf, tf)
        if self.reduction == "none":
            return ops.cast(ops.reshape(out, shape), dtype)
        out = ops.reshape(out, ())
        if self.reduction == "mean":
            out = out / ops.size(x)
        elif self.reduction == "batchmean":
            out = out / batch
        return ops.cast(out, dtype)


# ---------------------------------------------------------------------------------------------------------
# Registration.

def _akg_unavailable_reason():
    if importlib.util.find_spec("decorator") is None:
        return ("MindSpore's AKG compiler needs the pure-Python package 'decorator', which MindSpore does not "
                "declare (pip install decorator)")
    akg_dir = os.path.join(os.path.dirname(ms.__file__), "_akg")
    if not os.path.isdir(akg_dir):
        return f"this MindSpore wheel has no AKG compiler ({akg_dir} is missing)"
    return None


class AkgBackend(Backend):
    name = "akg"
    description = "MindSpore Hybrid DSL kernels compiled by AKG (one compile per tensor length, disk-cached)"
    preference = {"CPU": 10, "GPU": 50}

    def unavailable_reason(self, device):
        reason = super().unavailable_reason(device)
        if reason is not None:
            return reason
        if device == "CPU":
            libakg = os.path.join(os.path.dirname(ms.__file__), "lib", "plugin", "cpu", "libakg.so")
            if not os.path.isfile(libakg):
                return f"this MindSpore wheel has no CPU AKG library ({libakg} is missing)"
        return _akg_unavailable_reason()

    def make_op(self, reduction, log_target):
        return AkgKLDiv(reduction, log_target)


register(AkgBackend())
