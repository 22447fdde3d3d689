"""The standard rows: ms_kldiv backends, MindSpore's ops.kl_div and torch.

Every row runs one synchronized step: MindSpore results are brought to the host with ``asnumpy()`` (a 0-d
copy for reduced outputs), so asynchronous dispatch cannot hide work.
"""
import functools

from .harness import add_row, make_data

_MS_DTYPES = {}


def _ms():
    import mindspore as ms
    return ms


@functools.lru_cache(maxsize=1)
def _tensors(n, dtype):
    """The inputs of one cell, shared by its MindSpore rows and the roofline rows: the same buffers, so that no
    row gains or loses by where its copy landed (a fused forward from DRAM can run slower on
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


#: A function giving the CPU kernel's last span, set by the study tool (benchmarks/kldiv_roofline.py), which runs
#: the library built with diagnostics; None in the user-facing benchmark.
kernel_span = None


def _with_span(step):
    """``step`` with the library's span reader attached (harness.paired_ratios), when there is one."""
    if kernel_span is not None:
        step.kernel_span = kernel_span
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


def _tensor_memory(n, dtype):
    """The MindSpore rows' input buffers as NumPy arrays (on CPU ``asnumpy()`` shares the tensor's memory)."""
    if dtype == "bfloat16":  # no NumPy dtype: a float32 copy of the values
        return make_data(n, "float32")
    x, t = _tensors(n, dtype)
    xa, ta = x.asnumpy(), t.asnumpy()
    if xa.ctypes.data != x.asnumpy().ctypes.data:  # a copy after all: then any copy will do
        return make_data(n, dtype)
    return xa, ta


class OtherWork:
    """What a training step does between two loss calls, run before each in-context call (not timed): a pass over
    a buffer larger than the last-level cache and a small synchronized MindSpore op. Back-to-back calls keep the
    inputs in cache and MindSpore's threads awake; a real step pays for neither."""

    def __init__(self, nbytes=64 << 20):
        import numpy as np
        ms = _ms()
        self.buf = np.ones(nbytes // 4, np.float32)
        self.a = ms.Tensor(np.ones(16, np.float32))

    def __call__(self):
        import numpy as np
        np.add(self.buf, 1.0, out=self.buf)
        (self.a * 2).asnumpy()


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
