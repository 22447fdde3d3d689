"""Backend 'akg': forward and backward written in MindSpore's Hybrid DSL, compiled by the AKG compiler.

Layout (mirrors the composite backend so that MindSpore's autodiff handles what the DSL cannot):

    KLDivWrapper           widen half types, broadcast, empty/dynamic/rank fallbacks, scale, cast back
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

from .. import _env, _math
from . import register
from .base import Backend
from .common import KLDivWrapper, SerializedDispatch
from .composite import composite_op

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


def _second_order_bprop(which, log_target, scalar_g):
    """bprop of a backward kernel (x, t, g) -> px * g ('x') or pt * g ('t'), in plain ops (_math's vjps), so
    that the first-order gradient is itself differentiable; d/dg is summed to one element when g is the
    reduced gradient. Closures over functions picked here, not methods with `if`s: MindSpore 2.10 breaks
    grad-of-jit on constant `if`s in helpers called from a bprop, and graph mode resolves closures.
    """
    math_fns = _math.pointwise(log_target)
    grads_fn, second_fn = math_fns.grads, math_fns.second
    # A primitive instance, not ops.sum: that builds its primitive through a cached helper that
    # grad-of-jit cannot differentiate inside a bprop ("func graph is empty").
    sum_keep = ops.ReduceSum(keep_dims=False)
    reshape = ops.Reshape()

    def to_g(v, g):
        return reshape(sum_keep(v), (1,)) if scalar_g else v

    def bprop_x(x, t, g, out, dout):
        px, _ = grads_fn(x, t)
        d_t, d_g = _math.vjp_input_grad(px, second_fn(x, t), g, dout)
        return _masked_zeros(x), d_t, to_g(d_g, g)

    def bprop_t(x, t, g, out, dout):
        _, pt = grads_fn(x, t)
        d_x, d_t, d_g = _math.vjp_target_grad(pt, second_fn(x, t), g, dout)
        return d_x, d_t, to_g(d_g, g)

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


class _AkgEntry(nn.Cell):
    """Same-shaped operands of any rank 0..MAX_RANK -> the core of their compute dtype (one is traced: the
    dtype is a compile-time constant); 0-d operands go through as one element, since the kernels need a loop."""

    def __init__(self, summed, log_target):
        super().__init__()
        self.summed = summed
        self.core32 = _AkgCore(summed, log_target, ms.float32)
        self.core64 = _AkgCore(summed, log_target, ms.float64)

    def construct(self, x, t):
        scalar = x.ndim == 0
        if scalar:  # (no broadcast is involved, so this reshape is harmless to autodiff)
            x = ops.reshape(x, (1,))
            t = ops.reshape(t, (1,))
        out = self.core64(x, t) if x.dtype == ms.float64 else self.core32(x, t)
        if scalar and not self.summed:
            out = ops.reshape(out, ())
        return out


def akg_op(reduction, log_target):
    """The 'akg' op: KLDivWrapper around the AKG kernels. Empty tensors (AKG cannot compile a zero-trip loop),
    dynamic shapes (AKG compiles per static shape) and ranks above MAX_RANK take the composite op."""
    _spawn_compiler_in_cache_dir()
    return KLDivWrapper(_AkgEntry(reduction != "none", log_target), reduction,
                        fallback=composite_op(reduction, log_target), fallback_dynamic_or_empty=True,
                        fallback_max_rank=MAX_RANK)


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

    def unavailable_reason(self, device, op="kl_div"):
        reason = super().unavailable_reason(device, op)
        if reason is not None:
            return reason
        if device == "CPU":
            libakg = os.path.join(os.path.dirname(ms.__file__), "lib", "plugin", "cpu", "libakg.so")
            if not os.path.isfile(libakg):
                return f"this MindSpore wheel has no CPU AKG library ({libakg} is missing)"
        try:  # AKG's compiler process must start somewhere other than the user's working directory
            _env.cache_dir("akg_cwd")
        except OSError as e:
            return f"no writable cache directory for AKG's compiler ({e})"
        return _akg_unavailable_reason()

    def make_op(self, reduction, log_target):
        return SerializedDispatch(akg_op(reduction, log_target))

    def make_graph_op(self, reduction, log_target):
        return akg_op(reduction, log_target)


register(AkgBackend())
