"""Backend registry and dispatcher: the one door through which every op chooses its implementation.

Each module in this package implements the package's ops one way and registers a ``Backend`` that declares which
ops it implements (``ops``), a capability check per op and device (``unavailable_reason``) and a per-device
preference. For each op, ``'auto'`` picks the most preferred backend that can run it on the current device target
and falls back (warning once) when a better one cannot; ``backend=NAME`` means the same thing for every op. The
API layer calls ``get_op`` (``kl_div``) and ``get_kernels`` (the distillation losses, the fused head and the
stored-teacher loss).
"""
import functools
import importlib
import logging
import warnings

import mindspore as ms
from mindspore import context as _ms_context
from mindspore.ops import constexpr

from .. import _compat
from .base import OPS, Backend

__all__ = ["Backend", "OPS", "register", "names", "get", "resolve", "get_op", "get_kernels", "get_distill_kernels",
           "backend_info", "device_target", "choice_cache", "DEVICES"]

_logger = logging.getLogger("ms_kldiv")
_REGISTRY = {}
_WARNED = set()
# Modules of this package that register a backend when imported.
_BUILTIN_MODULES = ("composite", "aot", "akg", "ascend")
#: MindSpore's device targets.
DEVICES = ("CPU", "GPU", "Ascend")
_CHOICE_CACHES = []


def choice_cache(fn):
    """``functools.lru_cache`` for what is built from the registry's choice (ops, kernels, the ops over them):
    ``register`` empties every such cache, so a newly registered backend takes effect for every op at once."""
    cached = functools.lru_cache(maxsize=None)(fn)
    _CHOICE_CACHES.append(cached)
    return cached


def register(backend):
    """Add a backend instance.

    Several implementations may share one user-facing name when they target different devices (e.g. 'aot'
    is a C++ library on CPU, a CUDA library on GPU and an AscendC operator on Ascend); registering the same
    class again replaces the earlier instance.
    """
    if not isinstance(backend, Backend) or not isinstance(backend.name, str) or not backend.name:
        raise TypeError(f"register() expects an ms_kldiv.backends.Backend instance whose name is a non-empty str, "
                        f"got {backend!r}")
    if backend.name == "auto":  # backend='auto' is the automatic choice: such a backend could never be picked
        raise ValueError("register(): 'auto' is reserved for the automatic choice; name the backend otherwise.")
    impls = [b for b in _REGISTRY.get(backend.name, []) if type(b) is not type(backend)]
    _REGISTRY[backend.name] = impls + [backend]
    for cache in _CHOICE_CACHES:
        cache.cache_clear()
    return backend


def names():
    """Names accepted by ``backend=`` besides 'auto'."""
    return tuple(_REGISTRY)


def get(name, device=None):
    """The implementation registered under ``name`` for ``device`` (default: current device target)."""
    device = device or device_target()
    impls = _REGISTRY[name]
    for b in impls:
        if device in b.preference:
            return b
    return impls[0]


def _all():
    return [b for impls in _REGISTRY.values() for b in impls]


def device_target():
    try:  # the raw context read: ms.get_context is slow enough to show in small PyNative calls
        return _ms_context._context().get_param(_ms_context.ms_ctx_param.device_target)
    except AttributeError:  # private API moved: the public one
        return ms.get_context("device_target")


# Graph mode refuses get_context inside jit code; a constexpr is evaluated in Python at compile time instead.
_device_target_const = constexpr(device_target)


def _ranked(device):
    cands = [b for b in _all() if device in b.preference]
    return sorted(cands, key=lambda b: -b.preference[device])


def _warn_once(key, message):
    if key in _WARNED:
        return
    _WARNED.add(key)
    _logger.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def check_name(name, caller="kl_div"):
    """TypeError/ValueError for a ``backend=`` that is not a str or not a registered name (before anything runs)."""
    if not isinstance(name, str):
        raise TypeError(f"For '{caller}', 'backend' must be a str, but got {type(name).__name__}: {name!r}.")
    if name != "auto" and name not in _REGISTRY:
        raise ValueError(f"For '{caller}', 'backend' must be 'auto' or one of {list(_REGISTRY)}, but got {name!r}.")


# The same check at graph compile time (graph mode parses every function reachable from construct; the registry
# lookup is plain Python it need not see).
check_name_const = constexpr(check_name)


def resolve(name="auto", device=None, op="kl_div", caller=None, warn=True):
    """The Backend that ``backend=name`` runs ``op`` with on ``device`` (default: the current device target);
    ``warn``: say once when 'auto' falls back (not for a query, ``backend_info``)."""
    device = device or device_target()
    caller = caller or op
    check_name(name, caller)
    if name == "auto":
        skipped = []
        for b in _ranked(device):
            reason = b.unavailable_reason(device, op)
            if reason is None:
                if skipped and warn:
                    _warn_once((device, op, b.name, tuple(s for s, _ in skipped)),
                               f"ms_kldiv: backend 'auto' runs {op} on {device} with '{b.name}' because "
                               + "; ".join(f"'{s}' is unavailable ({r})" for s, r in skipped))
                return b
            skipped.append((b.name, reason))
        raise RuntimeError(f"For '{caller}', no backend can run {op} on device target {device!r}: "
                           + "; ".join(f"'{s}': {r}" for s, r in skipped))
    b = get(name, device)
    reason = b.unavailable_reason(device, op)
    if reason is not None:
        raise RuntimeError(f"For '{caller}', backend {name!r} cannot run on {device}: {reason}.")
    return b


@choice_cache
def _make_op(backend_name, device, reduction, log_target, graph):
    b = resolve(backend_name, device)
    op = b.make_graph_op(reduction, log_target) if graph else b.make_op(reduction, log_target)
    return _compat.without_mixed_precision(op) if isinstance(op, ms.nn.Cell) else op


def get_op(backend, reduction, log_target, graph=False):
    """The op for these settings on the current device; created once and reused. ``graph``: the op is for
    compiled code (see ``compiled``)."""
    return _make_op(backend, _device_target_const(), reduction, log_target, graph)


#: compiled(x) is True in graph code (GRAPH_MODE, ms.jit) and False in PyNative, at no run-time cost.
compiled = constexpr(_compat.is_graph_placeholder, check=False)


get_op.cache_clear = _make_op.cache_clear


@choice_cache
def _kernels(op, backend_name, device):
    return get(backend_name, device).kernels(op, device)


def get_kernels(op, backend, device=None, caller=None):
    """(name of the backend chosen, its kernels of ``op``) for ``backend=`` on ``device``; created once. Errors
    name ``caller`` (default: the op)."""
    device = device or device_target()
    b = resolve(backend, device, op, caller=caller or op)
    return b.name, _kernels(op, b.name, device)


def get_distill_kernels(backend, device=None, variant=None, caller="distillation", vocab_parallel=False):
    """(name of the backend chosen, its distillation kernels) for ``backend=`` on ``device``; created once. With a
    ``variant`` (``ms_kldiv._distill_math.Variant``) that the kernels cannot compute (their ``unsupported``), or
    ``vocab_parallel`` where they have no slice entry points (``states``; ``ms_kldiv.backends.base``), 'auto' gives
    way to the composite kernels (saying so once) and a named backend raises RuntimeError for ``caller``."""
    device = device or device_target()
    name, kernels = get_kernels("distillation", backend, device, caller)
    reason = None if variant is None else kernels.unsupported(variant)
    what = variant
    if reason is None and vocab_parallel and not hasattr(kernels, "states"):
        reason, what = "its kernels have no vocabulary-parallel entry points", "a vocabulary-parallel loss"
    if reason is None:
        return name, kernels
    if backend != "auto":
        raise RuntimeError(f"For '{caller}', backend {backend!r} cannot compute {what} on {device}: {reason}.")
    _warn_once((device, "distillation", name, what),
               f"ms_kldiv: backend 'auto' runs {what} on {device} with 'composite' because '{name}' cannot "
               f"({reason})")
    return get_kernels("distillation", "composite", device)


def backend_info(device=None, op="kl_div"):
    """What runs where: one dict per registered backend for ``op`` on ``device`` (default: current device
    target); ``op=None`` gives the rows of every op (see ``OPS``), one after the other.

    Keys: ``op``, ``name``, ``device``, ``available``, ``reason`` (why not, or None), ``preference`` (None if the
    backend does not target this device), ``auto`` (True for the one ``backend='auto'`` picks for this op),
    ``description``.
    """
    device = device or device_target()
    if device not in DEVICES:
        raise ValueError(f"For 'backend_info', 'device' must be None or one of {list(DEVICES)}, but got {device!r}.")
    if op is None:
        return [row for each in OPS for row in backend_info(device, each)]
    if op not in OPS:
        raise ValueError(f"For 'backend_info', 'op' must be None or one of {list(OPS)}, but got {op!r}.")
    try:
        chosen = resolve("auto", device, op, warn=False).name
    except RuntimeError:
        chosen = None
    rows = []
    for b in sorted((get(n, device) for n in _REGISTRY), key=lambda b: -b.preference.get(device, -1)):
        reason = b.unavailable_reason(device, op)
        rows.append({"op": op, "name": b.name, "device": device, "available": reason is None, "reason": reason,
                     "preference": b.preference.get(device), "auto": b.name == chosen,
                     "description": b.description})
    return rows


for _mod in _BUILTIN_MODULES:
    importlib.import_module(f"{__name__}.{_mod}")
