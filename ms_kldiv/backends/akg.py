"""Backend 'akg': forward and backward written in MindSpore's Hybrid DSL, compiled by the AKG compiler.

Layout (mirrors the composite backend so that MindSpore's autodiff handles what the DSL cannot):

    AkgKLDiv (no bprop)    widen half types, broadcast, empty/dynamic/rank fallbacks, scale, cast back
      _AkgCore (bprop)     forward kernel on the flattened operands; its bprop runs the two backward kernels
        backward kernels   per-rank Custom ops (d/dinput, d/dtarget), each with a plain-ops bprop that gives
                           second-order gradients

The DSL cannot stride, so broadcasting is an ``ops.broadcast_to`` before the core and its adjoint (summing
gradients back to each operand's shape) is MindSpore's own. AKG compiles per static shape: each distinct
shape is one compile (0.2-2 s), cached on disk under ``MS_COMPILER_CACHE_PATH`` (ms_kldiv points it at a
per-user cache), so a shape compiles once per machine, not once per process. Empty tensors, dynamic shapes
and ranks above ``MAX_RANK`` use the composite op.

Each measured MindSpore 2.10 / AKG limitation that shaped this is noted where it is worked around: CPU
reduce-vectorizer dropping lanes, multi-level reductions that fail to compile, two-output kernels returning
zeros, and PyNative losing second-order gradients through a reshape/unstack on the backward path.

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
# Kernel sources. {F} is the compute dtype ('float32' or 'float64'), {Z} is {F}(0), the typed zero; {I} is
# the index tuple "i0, i1, ..." of one element and {G} the incoming gradient there.
# No-mass tests are the header's: "t <= 0" and "t == -inf" (written as isinf(t) and t < 0: the DSL has no
# infinite literal). A NaN target must keep its mass and give NaN; AKG rewrites "0 if t <= 0 else v" into
# "v if t > 0 else 0" (measured: NaN target -> 0), so prob-space formulas return the NaN explicitly.

MAX_RANK = 8

_LOSS = {
    False: "t[{I}] if isnan(t[{I}]) else ({Z} if t[{I}] <= {Z} else t[{I}] * (log(t[{I}]) - x[{I}]))",
    True: "({Z} if t[{I}] < {Z} else exp(t[{I}]) * (t[{I}] - x[{I}])) if isinf(t[{I}]) "
          "else exp(t[{I}]) * (t[{I}] - x[{I}])",
}
_GRAD = {
    ("x", False): "t[{I}] if isnan(t[{I}]) else ({Z} if t[{I}] <= {Z} else -t[{I}] * {G})",
    ("x", True): "({Z} if t[{I}] < {Z} else -exp(t[{I}]) * {G}) if isinf(t[{I}]) else -exp(t[{I}]) * {G}",
    ("t", False): "t[{I}] if isnan(t[{I}]) else ({Z} if t[{I}] <= {Z} else (log(t[{I}]) + {F}(1) - x[{I}]) * {G})",
    ("t", True): "({Z} if t[{I}] < {Z} else exp(t[{I}]) * (t[{I}] - x[{I}] + {F}(1)) * {G}) if isinf(t[{I}]) "
                 "else exp(t[{I}]) * (t[{I}] - x[{I}] + {F}(1)) * {G}",
}

_KERNELS = {}
_KERNELS_LOCK = threading.Lock()


def _loops(rank, depth, body):
    lines = []
    for d in range(rank):
        lines.append("    " * (depth + d) + f"for i{d} in range(x.shape[{d}]):")
    lines.append("    " * (depth + rank) + body)
    return "\n".join(lines)


def _source(kind, log_target, dtype, rank):
    """Source of one kernel. kind: 'fwd_none' (loss), 'fwd_sum' (float64 sum of the loss), 'bwd<o>_<g>' with
    o in {x, t} (gradient for input or target) and g in {none, scalar} (elementwise or one shared g[0]).

    Kernels are written per rank (nested loops, no flattening) and each gradient is its own kernel: a
    reshape, or an unstack of a two-row output, between these kernels and the broadcast adjoint loses
    second-order gradients in MindSpore 2.10's PyNative (measured), and two-output hybrid kernels return
    zeros on CPU (measured).
    """
    space = "log" if log_target else "prob"
    name = f"ms_kldiv_{kind}_{space}_{dtype}_r{rank}"
    index = ", ".join(f"i{d}" for d in range(rank))
    fill = dict(F=dtype, Z=f"{dtype}(0)", I=index, G=f"g[{index}]" if kind.endswith("_none") else "g[0]")
    if kind == "fwd_none":
        body = _loops(rank, 1, f"out[{index}] = " + _LOSS[log_target].format(**fill))
        src = f"def {name}(x, t):\n    out = output_tensor(x.shape, x.dtype)\n{body}\n    return out\n"
    elif kind == "fwd_sum":
        # Sums accumulate in float64 whatever the compute dtype (SPEC: float32 sums of 32M terms within
        # 1e-6). The outer one-trip loop is load-bearing: without it AKG 2.10's CPU reduce-vectorizer keeps
        # one of its 4 lanes (a 12-element sum returned x[3] + x[7] + x[11], measured).
        body = _loops(rank, 2, f"acc[j] = acc[j] + float64({_LOSS[log_target].format(**fill)})")
        src = (f"def {name}(x, t):\n    acc = output_tensor((1,), 'float64')\n    for j in range(1):\n"
               f"        acc[j] = float64(0)\n{body}\n    return acc\n")
    else:
        which = kind[3]
        body = _loops(rank, 1, f"d[{index}] = " + _GRAD[(which, log_target)].format(**fill))
        src = f"def {name}(x, t, g):\n    d = output_tensor(x.shape, x.dtype)\n{body}\n    return d\n"
    return name, src


def _kernel_fn(kind, log_target, dtype, rank):
    """The @kernel function for one variant, defined from generated source.

    ``ops.Custom`` reads a hybrid function's text with ``inspect.getsource``; registering the generated text
    in ``linecache`` under a pseudo file name makes that work without writing a file anywhere.
    """
    key = (kind, log_target, dtype, rank)
    with _KERNELS_LOCK:
        if key not in _KERNELS:
            name, src = _source(kind, log_target, dtype, rank)
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
        # AKG reads its own tiling repository (inside the wheel) only from under AKG_WHITE_LIST_PATH, which
        # defaults to the server's cwd; otherwise it prints "Please set tiling repo path ..." for every kernel.
        os.environ.setdefault("AKG_WHITE_LIST_PATH", os.path.join(os.path.dirname(ms.__file__), "_akg"))
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


def _one(*_):
    return (1,)


def _f64(*_):
    return mstype.TensorType(ms.float64)


def _masked_zeros(v):
    # Zeros shaped like v as plain ops (ops.zeros_like inside a bprop breaks grad-of-jit in MindSpore 2.10);
    # the condition is false for every value, NaN included.
    return ops.where(ops.logical_and(v == v, v != v), v, 0.0)


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


def _second_order_bprop(which, log_target, scalar_g):
    """bprop of a backward kernel (x, t, g) -> px * g ('x') or pt * g ('t'), in plain ops, so that the
    first-order gradient is itself differentiable. (px, pt) = grads(x, t) are the pointwise gradients
    (composite's). For the upstream gradient a:

        'x':  d/dx = 0                  d/dt = a * d(px)/dt * g                  d/dg = a * px
        't':  d/dx = a * d(pt)/dx * g   d/dt = a * d(pt)/dt * g                  d/dg = a * pt
        d(px)/dt = d(pt)/dx = -1 (prob), -exp(t) (log);  d(pt)/dt = 1/t (prob), exp(t)(t - x + 2) (log)

    every term 0 where the target has no mass; d/dg summed to one element when g is the reduced gradient.
    Closures over functions picked here, not methods with `if`s: MindSpore 2.10 breaks grad-of-jit on
    constant `if`s in helpers called from a bprop, and graph mode resolves closures.
    """
    _, grads_fn = pointwise_fns(log_target)
    second_fn = _second_log if log_target else _second_prob
    # A primitive instance, not ops.sum: that builds its primitive through a cached helper that
    # grad-of-jit cannot differentiate inside a bprop ("func graph is empty").
    sum_keep = ops.ReduceSum(keep_dims=False)
    reshape = ops.Reshape()

    def to_g(v, g):
        return reshape(sum_keep(v), (1,)) if scalar_g else v

    def bprop_x(x, t, g, out, dout):
        cross, _, _ = second_fn(x, t)
        px, _ = grads_fn(x, t)
        return _masked_zeros(x), dout * cross * g, to_g(dout * px, g)

    def bprop_t(x, t, g, out, dout):
        cross, _, dpt_dt = second_fn(x, t)
        _, pt = grads_fn(x, t)
        return dout * cross * g, dout * dpt_dt * g, to_g(dout * pt, g)

    return bprop_x if which == "x" else bprop_t


class _AkgCore(nn.Cell):
    """Same-shaped x, t (rank 1..MAX_RANK) in one compute dtype -> loss ('none') or its float64 sum, (1,).

    The backward kernels exist per rank, picked by the (compile-time constant) rank of the operands.
    """

    def __init__(self, summed, log_target, dtype):
        super().__init__()
        name = "float64" if dtype == ms.float64 else "float32"
        g_kind = "scalar" if summed else "none"
        # The forward kernels run on flattened operands (a reduction over several loop levels fails to
        # compile in AKG 2.10: "variable has already been defined, the Stmt is not SSA"); this Cell's own
        # bprop means autodiff never sees these reshapes.
        if summed:
            self.fwd = ops.Custom(_kernel_fn("fwd_sum", log_target, name, 1), out_shape=_one, out_dtype=_f64,
                                  func_type="hybrid")
        else:
            self.fwd = ops.Custom(_kernel_fn("fwd_none", log_target, name, 1), out_shape=_same,
                                  out_dtype=_same, func_type="hybrid")
        self.summed = summed
        self.reshape = ops.Reshape()
        bwd_x, bwd_t = [], []
        for rank in range(1, MAX_RANK + 1):
            bwd_x.append(ops.Custom(_kernel_fn(f"bwdx_{g_kind}", log_target, name, rank), out_shape=_same,
                                    out_dtype=_same, func_type="hybrid",
                                    bprop=_second_order_bprop("x", log_target, summed)))
            bwd_t.append(ops.Custom(_kernel_fn(f"bwdt_{g_kind}", log_target, name, rank), out_shape=_same,
                                    out_dtype=_same, func_type="hybrid",
                                    bprop=_second_order_bprop("t", log_target, summed)))
        self.bwd_x = tuple(bwd_x)
        self.bwd_t = tuple(bwd_t)

    def construct(self, x, t):
        out = self.fwd(self.reshape(x, (-1,)), self.reshape(t, (-1,)))
        if self.summed:
            return out
        return self.reshape(out, x.shape)

    def bprop(self, x, t, out, dout):
        g = ops.cast(dout, x.dtype)
        return self.bwd_x[x.ndim - 1](x, t, g), self.bwd_t[x.ndim - 1](x, t, g)


@constexpr
def _use_fallback(x_shape, t_shape):
    dims = tuple(x_shape) + tuple(t_shape)
    return any(d is None or d <= 0 for d in dims) or max(len(x_shape), len(t_shape)) > MAX_RANK


class AkgKLDiv(nn.Cell):
    """The 'akg' op: widen half types, broadcast, AKG core, reduce scale, cast back."""

    def __init__(self, reduction, log_target):
        super().__init__()
        _spawn_compiler_in_cache_dir()
        self.reduction = reduction
        summed = reduction != "none"
        # One core per compute dtype; the dtype is a compile-time constant, so only one is ever traced.
        self.core32 = _AkgCore(summed, log_target, ms.float32)
        self.core64 = _AkgCore(summed, log_target, ms.float64)
        # Empty tensors (AKG cannot compile a zero-trip loop), dynamic shapes (AKG compiles per static shape)
        # and ranks above MAX_RANK take the composite path.
        self.fallback = CompositeKLDiv(reduction, log_target)

    def construct(self, x, t):
        if _use_fallback(ops.shape(x), ops.shape(t)):
            return self.fallback(x, t)
        shape = kldiv_broadcast_shape(ops.shape(x), ops.shape(t))
        dtype = x.dtype
        batch = x.shape[0] if x.ndim else 1  # 'batchmean' divides by input's first dim, not the broadcast one
        # Widen before broadcasting: MindSpore's CPU BroadcastTo (and the ReduceSum of its adjoint) has no
        # bfloat16 kernel.
        if dtype in HALF_DTYPES:
            x = ops.cast(x, ms.float32)
            t = ops.cast(t, ms.float32)
        if not shape:
            # Both 0-d: the kernels need a loop. (No broadcast is involved, so this reshape is harmless.)
            x = ops.reshape(x, (1,))
            t = ops.reshape(t, (1,))
        else:
            if x.shape != shape:
                x = ops.broadcast_to(x, shape)
            if t.shape != shape:
                t = ops.broadcast_to(t, shape)
        if dtype == ms.float64:
            out = self.core64(x, t)
        else:
            out = self.core32(x, t)
        if self.reduction == "none":
            if not shape:
                out = ops.reshape(out, ())
            return ops.cast(out, dtype)
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
