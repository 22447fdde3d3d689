"""Calls libkldiv_cuda.so's AOT entry points directly with ctypes on torch CUDA tensors.

This is how MindSpore calls them (``int Fn(int nparam, void **params, int *ndims, int64_t **shapes,
const char **dtypes, void *stream, void *extra)``), minus MindSpore: the kernels can be verified on any
CUDA machine with torch, whatever CUDA version MindSpore's GPU plugin was built for.

Library lookup: ``$KLDIV_CUDA_LIB``, else the one ms_kldiv._build finds (installed or cached), else a
single-architecture build for the local GPU into a temporary directory.
"""
import ctypes
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "custom_ops")
RED_NAMES = {"none": "None", "sum": "Sum", "mean": "Mean", "batchmean": "Batchmean"}
_LIB = None


def torch_cuda_reason():
    """None when torch with a usable CUDA device is here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda})"
    return None


def build_for_local_gpu(extra_flags=(), arch=None):
    """A single-architecture libkldiv_cuda.so in a new temporary directory: for this GPU (or ``arch``, e.g. "90"),
    with ``extra_flags`` added to the package build's nvcc flags."""
    from _modules import build as _build
    nvcc = _build._nvcc() or shutil.which("nvcc")
    if not nvcc:
        raise RuntimeError("no libkldiv_cuda.so found and no nvcc to build one")
    if arch is None:
        import torch
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}{minor}"
    out_dir = tempfile.mkdtemp(prefix="kldiv_cuda_")
    out = os.path.join(out_dir, "libkldiv_cuda.so")
    flags = [f for f in _build.NVCC_FLAGS if not f.startswith("-gencode")] + list(extra_flags)
    cus = sorted(os.path.join(SRC, "gpu", f) for f in os.listdir(os.path.join(SRC, "gpu")) if f.endswith(".cu"))
    cmd = [nvcc, *flags, f"-gencode=arch=compute_{arch},code=sm_{arch}", "-I", os.path.join(SRC, "common"),
           "-I", os.path.join(SRC, "gpu"), *cus, "-o", out]
    subprocess.run(cmd, cwd=out_dir, check=True)
    return out


def library_path():
    env = os.environ.get("KLDIV_CUDA_LIB")
    if env:
        return env
    try:
        from _modules import build as _build
        found = _build.find_library("GPU")
        if found:
            return found
    except Exception:  # noqa: BLE001 - any lookup problem means: build one
        pass
    return build_for_local_gpu()


def lib():
    global _LIB
    if _LIB is None:
        _LIB = ctypes.CDLL(library_path())
        _LIB.KLDivLibInfo.restype = ctypes.c_char_p
    return _LIB


def _dtype_name(tensor):
    import torch
    return {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
            torch.float64: "float64"}[tensor.dtype]


def call(symbol, tensors, dtype_names=None):
    """Run ``symbol`` on CUDA tensors (inputs then outputs) on torch's current stream; the ABI's dtype strings are
    ``dtype_names`` or the tensors' own."""
    import torch
    n = len(tensors)
    params = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
    ndims = (ctypes.c_int * n)(*[t.dim() for t in tensors])
    shape_arrays = [(ctypes.c_int64 * max(t.dim(), 1))(*t.shape) for t in tensors]
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(
        *[ctypes.cast(a, ctypes.POINTER(ctypes.c_int64)) for a in shape_arrays])
    names = [name.encode() for name in dtype_names or [_dtype_name(t) for t in tensors]]
    dtypes = (ctypes.c_char_p * n)(*names)
    on_gpu = any(t.is_cuda for t in tensors)  # else: the CPU library, same ABI, no stream
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream if on_gpu else 0)
    fn = getattr(lib(), symbol)
    fn.restype = ctypes.c_int
    rc = fn(ctypes.c_int(n), params, ndims, shapes, dtypes, stream, ctypes.c_void_p(0))
    return rc


def forward(x, t, reduction, log_target):
    import torch
    shape = torch.broadcast_shapes(x.shape, t.shape) if reduction == "none" else ()
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    sym = f"KLDivFwd{RED_NAMES[reduction]}{'Log' if log_target else 'Prob'}"
    rc = call(sym, [x.contiguous(), t.contiguous(), out])
    assert rc == 0, f"{sym} returned {rc}"
    return out


def backward(x, t, dout, reduction, log_target):
    import torch
    dx = torch.empty_like(x)
    dt = torch.empty_like(t)
    sym = f"KLDivBwd{RED_NAMES[reduction]}{'Log' if log_target else 'Prob'}"
    rc = call(sym, [x.contiguous(), t.contiguous(), dout.contiguous(), dx, dt])
    assert rc == 0, f"{sym} returned {rc}"
    return dx, dt


def backward_one(x, t, dout, reduction, log_target, which):
    """The single-gradient backward (which: 'input' -> d/dinput, 'target' -> d/dtarget)."""
    import torch
    grad = torch.empty_like(x if which == "input" else t)
    sym = f"KLDivBwd{which.capitalize()}{RED_NAMES[reduction]}{'Log' if log_target else 'Prob'}"
    rc = call(sym, [x.contiguous(), t.contiguous(), dout.contiguous(), grad])
    assert rc == 0, f"{sym} returned {rc}"
    return grad


def timed(fn, reps):
    """Median seconds of ``fn()`` on the current stream by CUDA events, after 3 warm-up calls (the benchmarks')."""
    import statistics
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def to_f64(tensor):
    import torch
    return tensor.detach().to("cpu", torch.float64).numpy()
