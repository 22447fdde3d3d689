"""The standard rows: ms_kldiv backends, MindSpore's ops.kl_div, torch, and the streaming roofline.

Every row runs one synchronized step: MindSpore results are brought to the host with ``asnumpy()`` (a 0-d
copy for reduced outputs), so asynchronous dispatch cannot hide work.
"""
import functools
import time

from .harness import add_row, make_data

_MS_DTYPES = {}


def _ms():
    import mindspore as ms
    return ms


@functools.lru_cache(maxsize=1)
def _tensors(n, dtype):
    """The inputs of one cell, shared by its MindSpore rows and the roofline rows: the same buffers, so that no
    row gains or loses by where its copy landed (on this VM the fused forward from DRAM ran 1.3-2x slower on
    some pairs of buffers than on others, the streaming read did not; docs/cpu_aot.md)."""
    ms = _ms()
    x, t = make_data(n, "float32" if dtype == "bfloat16" else dtype)
    dt = {"float32": ms.float32, "float64": ms.float64, "float16": ms.float16, "bfloat16": ms.bfloat16}[dtype]
    return ms.Tensor(x).astype(dt), ms.Tensor(t).astype(dt)


def _sync(v):
    if isinstance(v, (tuple, list)):
        for e in v:
            _sync(e)
    else:
        v.asnumpy()


def _mindspore_row(loss, jit, split=False):
    """A MindSpore row: ``loss(a, b, reduction)`` timed eagerly or under ms.jit, forward or value+grad(input).
    ``split``: the loss runs the CPU library's kernel, whose clock can split the row's paired calls."""
    def factory(n, dtype, reduction, mode):
        ms = _ms()
        x, t = _tensors(n, dtype)

        def f(a, b):
            return loss(a, b, reduction)

        if mode == "grad":
            f = ms.value_and_grad(f, grad_position=0)
        if jit:
            f = ms.jit(f)
        step = lambda: _sync(f(x, t))  # noqa: E731
        return _with_span(step) if split else step
    return factory


def _with_span(step):
    """``step`` with the library's span reader attached (harness.paired_ratios), when there is one."""
    span = _library_span()
    if span is not None:
        step.kernel_span = span
    return step


def ms_kldiv_row(backend, jit):
    import ms_kldiv

    def loss(a, b, reduction):
        return ms_kldiv.kl_div(a, b, reduction=reduction, backend=backend)
    return _mindspore_row(loss, jit, split=backend == "aot")


def ms_ops_row(jit):
    from mindspore import ops

    def loss(a, b, reduction):
        return ops.kl_div(a, b, reduction=reduction)
    return _mindspore_row(loss, jit)


def torch_factory(n, dtype, reduction, mode):
    import torch
    import torch.nn.functional as F
    x, t = make_data(n, "float32")
    tdt = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16}[dtype]
    xt, tt = torch.from_numpy(x).to(tdt), torch.from_numpy(t).to(tdt)
    if mode == "fwd":
        def step():
            with torch.no_grad():
                F.kl_div(xt, tt, reduction=reduction).item() if reduction != "none" else F.kl_div(xt, tt, reduction=reduction)
        return step
    xg = xt.clone().requires_grad_(True)

    def step():
        xg.grad = None
        loss = F.kl_div(xg, tt, reduction=reduction)
        (loss if reduction != "none" else loss.sum()).backward()
        loss.item() if reduction != "none" else None
    return step


def _cpu_library():
    """Path of the CPU kernel library (built once if needed); a row that needs it fails with the reason it is missing."""
    from ms_kldiv.backends import get as get_backend
    path, reason = get_backend("aot", "CPU").library("CPU")
    if reason:
        raise RuntimeError(reason)
    return path


@functools.lru_cache(maxsize=1)
def _library_span():
    """``KLDivTakeLastSpan`` of the CPU library as (start, end) in ``time.perf_counter`` seconds, or None once taken;
    None instead of a function where perf_counter is not the library's clock (CLOCK_MONOTONIC) or the library is
    missing. The harness then splits the aot rows' paired calls into before / kernel / after."""
    import ctypes
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        take = ctypes.CDLL(_cpu_library()).KLDivTakeLastSpan
    except (RuntimeError, OSError, AttributeError):
        return None
    take.restype = ctypes.c_int
    take.argtypes = [ctypes.c_void_p]
    buf = (ctypes.c_int64 * 2)()

    def span():
        return (buf[0] * 1e-9, buf[1] * 1e-9) if take(buf) else None
    return span


def roofline_factory(n, dtype, reduction, mode):
    """Time to read the bytes a fused forward must read, with the library's own threads (float32 only)."""
    if mode != "fwd" or dtype != "float32":
        return None
    import ctypes
    fn = ctypes.CDLL(_cpu_library()).KLDivStreamRead
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x, t = _tensor_memory(n, "float32")
    return lambda: fn(x.ctypes.data, t.ctypes.data, n)


def kernel_factory(n, dtype, reduction, mode):
    """The aot forward kernel alone: the exported symbol called through ctypes on the MindSpore rows' buffers, as
    the PyNative host call does, without MindSpore's call around it. With the roofline it splits the aot rows'
    time into what the kernel takes and what MindSpore's call adds."""
    if mode != "fwd" or dtype == "bfloat16":  # (bfloat16: no NumPy dtype to hand the kernel its own buffers)
        return None
    from ms_kldiv.backends.aot import HostCall, symbol
    call = HostCall(None, _cpu_library(), symbol("Fwd", reduction, False), reduction)
    x, t = _tensor_memory(n, dtype)
    return _with_span(lambda: call.run(x, t))


def numpy_read_factory(n, dtype, reduction, mode):
    """Single-threaded NumPy sum over the same bytes, a second reading of the roofline."""
    if mode != "fwd":
        return None
    x, t = _tensor_memory(n, dtype)
    return lambda: (x.sum(), t.sum())


def _add(a, b):
    return a + b


@functools.lru_cache(maxsize=1)
def _jit_add():
    import numpy as np
    ms = _ms()
    a, b = ms.Tensor(np.ones(4, np.float32)), ms.Tensor(np.ones(4, np.float32))
    f = ms.jit(_add)
    return lambda: _sync(f(a, b))


def jit_floor_factory(n, dtype, reduction, mode):
    """MindSpore's launch floor: an ms.jit call of ``a + b`` on 4 elements, synchronized like the other rows.

    Right after the streaming read its time is what any ms.jit call pays there, whatever it computes: MindSpore's
    threads went to sleep while the read ran and are woken one after the other (on this VM the 4-element call took
    0.18-0.32 ms back to back and 1.2-1.9 ms after 7 ms of sleep). Paired with the read, it is the part of the ms.jit
    row's ratio that no kernel can take away (docs/cpu_aot.md, "The ms.jit launch floor")."""
    return _jit_add() if mode == "fwd" else None


def _tensor_memory(n, dtype):
    """The MindSpore rows' input buffers as NumPy arrays (on CPU ``asnumpy()`` shares the tensor's memory)."""
    if dtype == "bfloat16":  # no NumPy dtype: a float32 copy of the values
        return make_data(n, "float32")
    x, t = _tensors(n, dtype)
    xa, ta = x.asnumpy(), t.asnumpy()
    if xa.ctypes.data != x.asnumpy().ctypes.data:  # a copy after all: then any copy will do
        return make_data(n, dtype)
    return xa, ta


def register_default_rows(with_torch=True):
    add_row("aot", "ms_kldiv aot (PyNative)", ms_kldiv_row("aot", jit=False))
    add_row("aot_jit", "ms_kldiv aot (ms.jit)", ms_kldiv_row("aot", jit=True))
    add_row("composite_jit", "ms_kldiv composite (ms.jit)", ms_kldiv_row("composite", jit=True))
    add_row("akg_jit", "ms_kldiv akg (ms.jit)", ms_kldiv_row("akg", jit=True))
    add_row("ops_jit", "mindspore ops.kl_div (ms.jit)", ms_ops_row(jit=True))
    add_row("ops", "mindspore ops.kl_div (PyNative)", ms_ops_row(jit=False))
    if with_torch:
        try:
            import torch  # noqa: F401  (imported here, before timing: its OpenMP runtime is then loaded)
            add_row("torch", "torch F.kl_div", torch_factory)
        except ImportError:
            pass
    add_row("aot_kernel", "ms_kldiv aot kernel alone (ctypes)", kernel_factory)
    add_row("roofline", "stream read (C++, same threads)", roofline_factory)
    add_row("numpy_read", "stream read (numpy sum, 1 thread)", numpy_read_factory)
    add_row("jit_floor", "ms.jit launch floor (a + b, 4 elements)", jit_floor_factory)
