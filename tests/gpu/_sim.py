"""Runs custom_ops/gpu/*.cu on the CUDA-on-CPU stand-in (tests/gpu/standin/cuda_sim.h).

``build()`` compiles the .cu sources with g++ against the stand-in headers into a shared library cached in
``~/.cache/ms_kldiv/cudasim/<hash of sources, headers and flags>/`` (never in the working tree); it exports
the same ABI as libkldiv_cuda.so (custom_ops/common/kldiv_abi.h) plus the stand-in's harness hooks.

The stand-in aborts on a kernel error (divergence, barrier, bounds, poisoned shared read), so calls run in a
child process: ``run_calls(calls)`` sends a batch of ABI calls to one child and returns their outputs, or
raises ``SimError`` with the child's "cudasim: ..." message.

bfloat16 travels as uint16 bit patterns (NumPy has no bfloat16); see ``to_bf16_bits``/``bf16_bits_to_f64``.

``MS_KLDIV_CUDA_DEVICE=1`` runs the same calls on a real GPU instead (``libkldiv_cuda.so`` through the ctypes
harness, operands copied to torch CUDA tensors, in this process): every stand-in test then checks the device.
Stand-in-only tests (its own checks, kernels with planted bugs) skip there; grid and schedule choices
(``sms``, ``reverse``) are the device's own.
"""
import fcntl
import glob
import hashlib
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "custom_ops")
SIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin")
CXX = os.environ.get("CXX", "g++")
# Every load/store of the kernel TU calls the stand-in's bounds check (kernel-address instrumentation with
# callbacks only: no shadow memory, no ASan runtime). No -g: nothing here reads debug information, and it lengthens
# every compile (each .cu file and each planted bug, in every CI run).
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-gnu-unique",
         "-Wl,-Bsymbolic", "-fsanitize=kernel-address", "--param", "asan-instrumentation-with-call-threshold=0",
         "--param", "asan-stack=0", "--param", "asan-globals=0", "-Wno-unknown-pragmas"]
RED_NAMES = {"none": "None", "sum": "Sum", "mean": "Mean", "batchmean": "Batchmean"}
ON_DEVICE = os.environ.get("MS_KLDIV_CUDA_DEVICE") == "1"


class SimError(RuntimeError):
    """A hard error of the stand-in (its message starts with 'cudasim:'), or a crash of the child."""


def compiler_reason():
    """None when g++ can build the stand-in here (or the calls run on the device), else why not."""
    if ON_DEVICE:
        return None
    try:
        subprocess.run([CXX, "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"no C++ compiler ({CXX}): {e}"
    return None


def _cache_root():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ms_kldiv", "cudasim")


def build(sources=None, extra_flags=()):
    """Path of the stand-in library built from ``sources`` (default: custom_ops/gpu/*.cu)."""
    if ON_DEVICE:
        import pytest
        pytest.skip("a stand-in build (its own checks, planted bugs): MS_KLDIV_CUDA_DEVICE=1 runs the device")
    sources = sorted(os.path.abspath(p) for p in (sources or glob.glob(os.path.join(SRC, "gpu", "*.cu"))))
    headers = sorted(glob.glob(os.path.join(SRC, "common", "*.h")) + glob.glob(os.path.join(SRC, "gpu", "*.cuh"))
                     + glob.glob(os.path.join(SIM, "*.h")))
    flags = FLAGS + list(extra_flags)
    h = hashlib.sha256(repr((CXX, flags)).encode())
    ver = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout
    h.update(ver.encode())
    for p in sources + headers:
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as f:
            h.update(f.read())
    out_dir = os.path.join(_cache_root(), h.hexdigest()[:20])
    out = os.path.join(out_dir, "libkldiv_cudasim.so")
    if os.path.exists(out):
        return out
    os.makedirs(out_dir, exist_ok=True)
    # One build per variant however many test processes ask for it at once: the others wait for it.
    with open(os.path.join(out_dir, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(out):
            _compile_and_link(sources, flags, out_dir, out)
    return out


def _compile_and_link(sources, flags, out_dir, out):
    """The sources compiled side by side (the package build's scheduler: one process per CPU, the largest source
    first, as it takes most of the time), then linked under a temporary name and renamed."""
    from ms_kldiv import _build
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        include = ["-I", SIM, "-I", os.path.join(SRC, "common"), "-I", os.path.join(SRC, "gpu")]
        sources = sorted(sources, key=os.path.getsize, reverse=True)
        objs = [os.path.join(tmp, f"{i}.o") for i in range(len(sources))]
        try:
            _build._run_parallel([[CXX, *flags, *include, "-x", "c++", "-c", src, "-o", obj]
                                  for src, obj in zip(sources, objs)], tmp)
            _build._run([CXX, *flags, *objs, "-o", os.path.join(tmp, "lib.so")], tmp)
        except _build.BuildError as e:
            raise RuntimeError(f"stand-in build failed:\n{e}") from None
        os.replace(os.path.join(tmp, "lib.so"), out)


# ---------------------------------------------------------------------------------------------- child side
_CHILD = r"""
import ctypes, pickle, sys
import numpy as np
lib_path, calls = pickle.load(sys.stdin.buffer)
lib = ctypes.CDLL(lib_path)
sim = hasattr(lib, "cudasim_register")  # else another library of the same ABI (the CPU one)
if sim:
    lib.cudasim_register.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.cudasim_unregister.argtypes = [ctypes.c_void_p]
results = []
for call in calls:
    symbol, arrays, dtype, spec = call["symbol"], call["arrays"], call["dtype"], call.get("spec")
    if symbol == "__info__":
        lib.KLDivLibInfo.restype = ctypes.c_char_p
        results.append(lib.KLDivLibInfo().decode())
        continue
    if sim:
        lib.cudasim_set_sms(call.get("sms", 2))
        lib.cudasim_set_reverse(int(call.get("reverse", False)))
    # Each operand in its own buffer with an optional element offset; only the operand's bytes are
    # registered, so the kernel may touch nothing else.
    bufs, views = [], []
    for a, off in arrays:
        a = np.asarray(a)
        base = np.empty(a.size + off + 8, a.dtype)
        v = base[off:off + a.size].reshape(a.shape)
        v[...] = a
        bufs.append(base)
        views.append(v)
    n = len(views)
    for v in views:
        if v.nbytes and sim:
            lib.cudasim_register(ctypes.c_void_p(v.ctypes.data), v.nbytes)
    params = (ctypes.c_void_p * n)(*[v.ctypes.data for v in views])
    ndims = (ctypes.c_int * n)(*[v.ndim for v in views])
    shp = [(ctypes.c_int64 * max(v.ndim, 1))(*v.shape) for v in views]
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shp])
    dtypes = (ctypes.c_char_p * n)(*[d.encode() for d in call.get("dtypes") or [dtype] * n])
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    rc = fn(ctypes.c_int(n), params, ndims, shapes, dtypes, ctypes.c_void_p(0), ctypes.c_void_p(0))
    for v in views:
        if v.nbytes and sim:
            lib.cudasim_unregister(ctypes.c_void_p(v.ctypes.data))
    leaked = lib.cudasim_live_allocations() if sim else 0
    results.append((rc, [v.copy() for v in views[spec:]], leaked))
sys.stdout.buffer.write(pickle.dumps(results))
"""


def run_calls(calls, lib_path=None, timeout=600):
    """Run a batch of ABI calls in one child process.

    Each call: dict(symbol=..., dtype='float32'|..., arrays=[(ndarray, element_offset), ...], spec=k) where
    arrays are the inputs then the outputs (outputs' contents are ignored: they are filled with garbage
    first) and k is the index of the first output; ``dtypes`` (one name per array) overrides ``dtype`` where the
    operands differ (the distillation ABI's float64 hyper-parameters and float32 statistics).
    Returns [(rc, [outputs], live_allocations)].
    """
    if ON_DEVICE and lib_path is None:
        return _run_on_device(calls)
    lib_path = lib_path or build()
    prepared = []
    for c in calls:
        c = dict(c)
        if "arrays" in c:
            c["arrays"] = [(_garbage(a) if i >= c.get("spec", len(c["arrays"])) else a, off)
                           for i, (a, off) in enumerate(c["arrays"])]
        prepared.append(c)
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps((lib_path, prepared)),
                          capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")
        raise SimError(err[-3000:] or f"child exited with {proc.returncode}")
    return pickle.loads(proc.stdout)


def _run_on_device(calls):
    """``run_calls`` on the GPU: the same operands, offsets and garbage-filled outputs, as torch CUDA tensors."""
    import torch
    import _harness
    as_torch = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}
    results = []
    for call in calls:
        if call["symbol"] == "__info__":
            results.append(_harness.lib().KLDivLibInfo().decode())
            continue
        names = call.get("dtypes") or [call["dtype"]] * len(call["arrays"])
        spec = call.get("spec", len(call["arrays"]))
        views = []
        for (a, off), name in zip(call["arrays"], names):
            a = np.array(a, order="C")  # (np.ascontiguousarray would make a 0-d operand 1-d)
            host = torch.from_numpy(a.view(np.int16) if name == "bfloat16" else a).reshape(-1)
            if name == "bfloat16":
                host = host.view(torch.bfloat16)
            base = torch.empty(a.size + off + 8, dtype=as_torch[name], device="cuda")
            view = base[off:off + a.size]
            view.copy_(host)
            views.append(view.view(a.shape))
        rc = _harness.call(call["symbol"], views, names)
        torch.cuda.synchronize()
        outs = []
        for v, name in zip(views[spec:], names[spec:]):
            v = v.cpu()
            outs.append(v.view(torch.int16).numpy().view(np.uint16) if name == "bfloat16" else v.numpy())
        results.append((rc, outs, 0))
    return results


def _garbage(a):
    """Outputs start as NaN-like bytes, so an element the kernel does not write shows."""
    a = np.asarray(a)
    out = np.empty(a.shape, a.dtype)
    out.reshape(-1).view(np.uint8)[:] = 0xFF
    return out


# ---------------------------------------------------------------------------------------------- dtypes
def to_bf16_bits(x):
    """float64 -> bfloat16 bit patterns (via float32, round to nearest even)."""
    u = np.atleast_1d(np.asarray(x, np.float64).astype(np.float32)).view(np.uint32).astype(np.uint64)
    u = u.reshape(np.shape(x))
    c = lambda v: np.uint64(v)
    nan = (u & c(0x7FFFFFFF)) > c(0x7F800000)
    r = ((u + c(0x7FFF) + ((u >> c(16)) & c(1))) >> c(16)).astype(np.uint16)
    return np.where(nan, np.uint16(0x7FFF), r).astype(np.uint16)


def bf16_bits_to_f64(b):
    b = np.asarray(b, np.uint16)
    u = np.atleast_1d(b).astype(np.uint32) << np.uint32(16)
    return u.view(np.float32).astype(np.float64).reshape(b.shape)


NP_DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def encode(x, dtype):
    """float64 values -> the array the library sees for ``dtype``."""
    if dtype == "bfloat16":
        return to_bf16_bits(x)
    return np.asarray(x, np.float64).astype(NP_DTYPES[dtype])


def decode(a, dtype):
    return bf16_bits_to_f64(a) if dtype == "bfloat16" else np.asarray(a).astype(np.float64)


def symbol(kind, reduction, log_target):
    return f"KLDiv{kind}{RED_NAMES[reduction]}{'Log' if log_target else 'Prob'}"
