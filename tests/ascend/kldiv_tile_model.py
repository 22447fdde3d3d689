"""CPU stand-ins for the AscendC KlDivCustom / KlDivCustomGrad kernels, for tests that run without Ascend.

``Tiling`` loads ``op_kernel/kl_div_tiling_plan.h`` through a small C API (``tiling_capi.cpp``, compiled here
with g++ into a cache directory), so every tiling number below is the C++ one, not a Python restatement.

``forward`` / ``backward`` replay the kernels' loops in NumPy: the same core ranges and tiles, the same
float32 operations in the same order as ``op_kernel/kl_div_common.h`` (safe operands, Ln/Exp, Sub, Mul,
...), the accumulator tiles summed lane by lane over the tiles of a core (compensated), the compensated fold of
those tiles per core, and the core partials added in core order. One thing is modelled, not replayed: the AI
Core's Ln/Exp are taken as correctly rounded float32 (NumPy's).
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ASCEND_SRC = os.path.normpath(os.path.join(HERE, "..", "..", "custom_ops", "ascend"))  # the kernels run here
CAPI_SRC = os.path.join(HERE, "tiling_capi.cpp")
PLAN_HDR = os.path.join(ASCEND_SRC, "op_kernel", "kl_div_tiling_plan.h")

FORWARD_NONE, FORWARD_REDUCE, BACKWARD_NONE, BACKWARD_REDUCE = range(4)
REDUCTION_CODES = {"none": 0, "sum": 1, "mean": 2, "batchmean": 3}
IO_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
ASCEND910B_UB = 192 * 1024   # unified buffer per vector core of Atlas A2 (the tiling reads it from the platform)
ASCEND910B_AIV = 40           # vector cores of a 910B2/B3; the 910B1 has 48


def _cache_dir():
    base = os.environ.get("MS_KLDIV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ms_kldiv")
    path = os.path.join(base, "ascend_tiling")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        path = os.path.join(tempfile.gettempdir(), f"ms_kldiv-{os.getuid()}", "ascend_tiling")
        os.makedirs(path, exist_ok=True)
    return path


def compiler():
    return shutil.which(os.environ.get("CXX", "g++"))


def _prune(out):
    """Drop cached builds of older sources (same name before the hash); they are never loaded again."""
    stem = os.path.basename(out).rsplit("-", 1)[0]
    for name in os.listdir(os.path.dirname(out)):
        path = os.path.join(os.path.dirname(out), name)
        if name.rsplit("-", 1)[0] == stem and path != out and not name.endswith(".tmp"):
            try:
                os.remove(path)
            except OSError:
                pass


def build(source, shared=True):
    """Compile ``source`` (+ the plan header, which is hashed too) into the cache; returns the output path."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) on PATH")
    digest = hashlib.sha1()
    for path in (source, PLAN_HDR):
        with open(path, "rb") as f:
            digest.update(f.read())
    stem = os.path.splitext(os.path.basename(source))[0]
    out = os.path.join(_cache_dir(), f"{stem}-{digest.hexdigest()[:12]}" + (".so" if shared else ""))
    if not os.path.exists(out):
        tmp = out + f".{os.getpid()}.tmp"
        cmd = [cxx, "-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror"] + (["-shared", "-fPIC"] if shared else []) \
            + [source, "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr}")
        os.replace(tmp, out)
        _prune(out)
    return out


class Tiling:
    """The C++ tiling plan, through ctypes."""

    def __init__(self):
        lib = ctypes.CDLL(build(CAPI_SRC))
        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        lib.kldiv_make_plan.argtypes = [u64, u32, u32, u32, u32, ctypes.POINTER(u64)]
        lib.kldiv_make_plan.restype = ctypes.c_int
        lib.kldiv_core_range.argtypes = [u64, u64, u32, u32, ctypes.POINTER(u64)]
        lib.kldiv_core_range.restype = None
        lib.kldiv_tile_count.argtypes = [u64, u32]
        lib.kldiv_tile_count.restype = u64
        lib.kldiv_compute_count.argtypes = [u32]
        lib.kldiv_compute_count.restype = u32
        lib.kldiv_tile_length.argtypes = [u32, u32, u32]
        lib.kldiv_tile_length.restype = u32
        lib.kldiv_bits_per_element.argtypes = [u32, u32]
        lib.kldiv_bits_per_element.restype = u32
        lib.kldiv_reduction_scale.argtypes = [u32, u64, u64]
        lib.kldiv_reduction_scale.restype = ctypes.c_float
        lib.kldiv_const.argtypes = [ctypes.c_int]
        lib.kldiv_const.restype = u32
        self.lib = lib
        names = ("core_align", "tile_align", "buffer_num", "max_tile", "min_elems_per_core", "ub_reserve_bytes",
                 "max_cores", "partial_stride_bytes", "api_ub_reserve_bytes")
        self.const = {name: lib.kldiv_const(i) for i, name in enumerate(names)}

    def plan(self, n, io, mode, cores=ASCEND910B_AIV, ub=ASCEND910B_UB):
        out = (ctypes.c_uint64 * 7)()
        if self.lib.kldiv_make_plan(n, io, mode, cores, ub, out):
            return None
        keys = ("total_length", "used_cores", "tile_length", "base_chunks", "rem_chunks", "ub_bytes_used",
                "workspace_bytes")
        return dict(zip(keys, (int(v) for v in out)))

    def core_range(self, plan, core):
        out = (ctypes.c_uint64 * 2)()
        self.lib.kldiv_core_range(plan["total_length"], plan["base_chunks"], plan["rem_chunks"], core, out)
        return int(out[0]), int(out[1])

    def tiles(self, plan, core):
        """[(offset in the tensor, valid elements, elements the vector instructions process)] of one core."""
        start, length = self.core_range(plan, core)
        tile = plan["tile_length"]
        res = []
        for i in range(self.lib.kldiv_tile_count(length, tile)):
            valid = min(tile, length - i * tile)
            res.append((start + i * tile, valid, int(self.lib.kldiv_compute_count(valid))))
        return res

    def tile_length(self, mode, io, ub):
        return int(self.lib.kldiv_tile_length(mode, io, ub))

    def bits_per_element(self, mode, io):
        return int(self.lib.kldiv_bits_per_element(mode, io))

    def reduction_scale(self, reduction, numel, first_dim):
        return np.float32(self.lib.kldiv_reduction_scale(REDUCTION_CODES[reduction], numel, first_dim))


# ----------------------------------------------------------------------------------------- dtype handling
def quantize(a, dtype):
    """float32 values of ``a`` rounded (to nearest even) to the IO dtype, returned as float32."""
    a = np.asarray(a, np.float32)
    if dtype == "float32":
        return a.copy()
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = a.view(np.uint32).astype(np.uint64)
        nan = np.isnan(a)
        u16, one = np.uint64(16), np.uint64(1)
        rounded = ((bits + np.uint64(0x7FFF) + ((bits >> u16) & one)) >> u16 << u16).astype(np.uint32)
        return np.where(nan, np.float32(np.nan), rounded.view(np.float32)).astype(np.float32)
    raise ValueError(dtype)


# ------------------------------------------------------------------------------------------ kernel math
# Mirrors op_kernel/kl_div_common.h operation by operation, in float32.
def _mass(tf, log_target):
    return ~(tf == -np.inf) if log_target else ~(tf <= 0)


def _safe(xf, tf, mask, log_target):
    ts = np.where(mask, tf, np.float32(0.0 if log_target else 1.0)).astype(np.float32)
    xs = np.where(mask, xf, np.float32(0.0)).astype(np.float32)
    return xs, ts


def _loss(xs, ts, log_target):
    with np.errstate(all="ignore"):
        if log_target:
            w = np.exp(ts)
            xs = ts - xs
            return w * xs
        w = np.log(ts)
        w = w - xs
        return w * ts


def _grads(xs, ts, mask, log_target):
    with np.errstate(all="ignore"):
        if log_target:
            dx = np.exp(ts)
            dt = ts - xs
            dt = dt + np.float32(1)
            dt = dt * dx
            dx = dx * np.float32(-1)
        else:
            dx = ts * np.float32(-1)
            dt = np.log(ts)
            dt = dt + np.float32(1)
            dt = dt - xs
    return np.where(mask, dx, np.float32(0)), np.where(mask, dt, np.float32(0))


def _two_sum(a, b):
    """s + e == a + b exactly (Knuth), in float32, on scalars or arrays: the kernels' TwoSum."""
    with np.errstate(all="ignore"):  # inf - inf: the correction of an inf sum is NaN
        s = np.float32(a) + np.float32(b)
        bb = s - a
        return s, (a - (s - bb)) + (b - bb)


def _kahan_add(acc, comp, w):
    """One tile into the accumulator lanes (a lane's sum is acc - comp); comp reset where it is not below +inf."""
    with np.errstate(all="ignore"):  # inf - inf in comp, reset below
        y = w - comp
        s = acc + y
        comp[:] = (s - acc) - y
    acc[:] = s
    comp[~(comp < np.float32(np.inf))] = 0


def _fold(acc, comp):
    """A core's partial (sum, correction): the lanes folded in halves on 32 B (8-float) boundaries down to one
    block, each addition's rounding error into the correction, then that block's lanes one by one."""
    acc, comp = acc.copy(), comp.copy()
    n = acc.size
    while n > 8:
        half = 8 * ((n // 8 + 1) // 2)
        upper = n - half
        s, e = _two_sum(acc[:upper], acc[half:n])
        with np.errstate(all="ignore"):
            comp[:upper] = (comp[:upper] + comp[half:n]) - e
        acc[:upper] = s
        n = half
    total, err = np.float32(0), np.float32(0)
    for i in range(n):
        total, rounding = _two_sum(total, acc[i])
        with np.errstate(all="ignore"):
            err = np.float32(err + np.float32(rounding - comp[i]))
    return total, err


def _stale(count, valid, rng):
    """Lanes past the valid ones hold whatever the buffer held: model that with garbage."""
    return rng.standard_normal(count - valid).astype(np.float32) * np.float32(1e30)


def forward(tiling, x, t, reduction, log_target, dtype="float32", cores=ASCEND910B_AIV, ub=ASCEND910B_UB,
            first_dim=None):
    """KlDivCustom on same-shaped x, t (float arrays holding IO-dtype values). Returns float32 values of the
    IO dtype: x's shape for 'none', 0-d otherwise."""
    x = quantize(x, dtype)
    t = quantize(t, dtype)
    assert x.shape == t.shape
    shape = x.shape
    xf, tf = x.reshape(-1), t.reshape(-1)
    n = xf.size
    reduce = reduction != "none"
    plan = tiling.plan(n, IO_BYTES[dtype], FORWARD_REDUCE if reduce else FORWARD_NONE, cores, ub)
    assert plan is not None
    rng = np.random.default_rng(0)
    y = np.empty(n, np.float32)
    partials = []
    for core in range(plan["used_cores"]):
        acc = np.zeros(plan["tile_length"], np.float32)
        comp = np.zeros_like(acc)
        for off, valid, count in tiling.tiles(plan, core):
            xt = np.concatenate([xf[off:off + valid], _stale(count, valid, rng)])
            tt = np.concatenate([tf[off:off + valid], _stale(count, valid, rng)])
            mask = _mass(tt, log_target)
            xs, ts = _safe(xt, tt, mask, log_target)
            w = _loss(xs, ts, log_target)
            if reduce:
                _kahan_add(acc[:valid], comp[:valid], w[:valid])
            else:
                y[off:off + valid] = quantize(w[:valid], dtype)
        partials.append(_fold(acc, comp))
    if not reduce:
        return y.reshape(shape)
    total, err = np.float32(0), np.float32(0)
    with np.errstate(all="ignore"):
        for partial, correction in partials:
            total, rounding = _two_sum(total, partial)
            err = np.float32(err + np.float32(rounding + correction))
        if total - total == 0:  # an inf or NaN sum stands as it is (its correction is NaN)
            total = np.float32(total + err)
    if first_dim is None:
        first_dim = shape[0] if len(shape) else 1
    with np.errstate(all="ignore"):
        total = np.float32(total * tiling.reduction_scale(reduction, n, first_dim))
    return quantize(total, dtype).reshape(())


def backward(tiling, x, t, dout, reduction, log_target, dtype="float32", cores=ASCEND910B_AIV, ub=ASCEND910B_UB):
    """KlDivCustomGrad on same-shaped x, t; dout of x's shape ('none') or one element. Returns (dx, dt)."""
    x = quantize(x, dtype)
    t = quantize(t, dtype)
    g = quantize(dout, dtype)
    shape = x.shape
    xf, tf, gf = x.reshape(-1), t.reshape(-1), g.reshape(-1)
    n = xf.size
    elementwise = reduction == "none"
    plan = tiling.plan(n, IO_BYTES[dtype], BACKWARD_NONE if elementwise else BACKWARD_REDUCE, cores, ub)
    assert plan is not None
    if not elementwise:
        assert gf.size == 1
        first_dim = shape[0] if len(shape) else 1
        with np.errstate(all="ignore"):
            g_scalar = np.float32(gf[0] * tiling.reduction_scale(reduction, n, first_dim))
    rng = np.random.default_rng(0)
    dx = np.empty(n, np.float32)
    dt = np.empty(n, np.float32)
    for core in range(plan["used_cores"]):
        for off, valid, count in tiling.tiles(plan, core):
            xt = np.concatenate([xf[off:off + valid], _stale(count, valid, rng)])
            tt = np.concatenate([tf[off:off + valid], _stale(count, valid, rng)])
            mask = _mass(tt, log_target)
            xs, ts = _safe(xt, tt, mask, log_target)
            w1, w2 = _grads(xs, ts, mask, log_target)
            with np.errstate(all="ignore"):
                if elementwise:
                    gt = np.concatenate([gf[off:off + valid], _stale(count, valid, rng)])
                    w1, w2 = w1 * gt, w2 * gt
                else:
                    w1, w2 = w1 * g_scalar, w2 * g_scalar
            dx[off:off + valid] = quantize(w1[:valid], dtype)
            dt[off:off + valid] = quantize(w2[:valid], dtype)
    return dx.reshape(shape), dt.reshape(shape)


# ------------------------------------------------------------------------- the kernel sources on the CPU
SIM_DIR = os.path.join(HERE, "ascendc_sim")
_SIM_DEPS = [os.path.join(SIM_DIR, f) for f in ("sim_driver.cpp", "kernel_operator.h", "register/tilingdata_base.h")] \
    + [os.path.join(ASCEND_SRC, "op_kernel", f) for f in ("kl_div_custom.cpp", "kl_div_custom_grad.cpp",
                                                         "kl_div_common.h", "kl_div_tiling_plan.h", "tile_io.h",
                                                         "tiling_common.h")] \
    + [os.path.join(ASCEND_SRC, "op_host", "kl_div_custom_tiling.h")]
# Each stand-in library keeps its own copy of the stand-in's globals (inline variables such as AscendC::g_core):
# g++ would make them STB_GNU_UNIQUE, which the loader shares between the KLDiv and distillation libraries.
SIM_FLAGS = ["-std=c++20", "-O2", "-shared", "-fPIC", "-fno-gnu-unique", "-Wl,-Bsymbolic", "-Wall", "-Wextra",
             "-Werror", "-pthread"]
_SIM_TYPES = {"float32": ("float", np.float32), "float16": ("half", np.float16), "bfloat16": ("bfloat16_t", np.uint16)}


def build_simulator(dtype):
    """Compile op_kernel/*.cpp against the AscendC CPU stand-in (ascendc_sim/) for one IO dtype."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) on PATH")
    digest = hashlib.sha1(" ".join([dtype] + SIM_FLAGS).encode())
    for path in _SIM_DEPS:
        with open(path, "rb") as f:
            digest.update(f.read())
    out = os.path.join(_cache_dir(), f"kldiv_ascendc_sim_{dtype}-{digest.hexdigest()[:12]}.so")
    if not os.path.exists(out):
        tmp = out + f".{os.getpid()}.tmp"
        cmd = [cxx] + SIM_FLAGS + ["-I", SIM_DIR, f"-DDTYPE_X={_SIM_TYPES[dtype][0]}",
                                   os.path.join(SIM_DIR, "sim_driver.cpp"), "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr}")
        os.replace(tmp, out)
        _prune(out)
    return out


def _to_io(a, dtype):
    """Host buffer in the kernel's IO layout (bfloat16 as its 16 bits)."""
    q = quantize(a, dtype)
    if dtype == "bfloat16":
        return np.ascontiguousarray((q.view(np.uint32) >> np.uint32(16)).astype(np.uint16))
    return np.ascontiguousarray(q.astype(_SIM_TYPES[dtype][1]))


def _from_io(buf, dtype):
    if dtype == "bfloat16":
        return (buf.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return buf.astype(np.float32)


class KernelSimulator:
    """KlDivCustom / KlDivCustomGrad, the kernel source itself, executed by the CPU stand-in of AscendC."""

    def __init__(self, dtype):
        self.dtype = dtype
        lib = ctypes.CDLL(build_simulator(dtype))
        p, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
        lib.kldiv_sim_forward.argtypes = [p, p, p, u64, u64, u32, ctypes.c_int, u32]
        lib.kldiv_sim_forward.restype = ctypes.c_int
        lib.kldiv_sim_backward.argtypes = [p, p, p, p, p, u64, u64, u32, ctypes.c_int, u32]
        lib.kldiv_sim_backward.restype = ctypes.c_int
        lib.kldiv_sim_max_ub_used.restype = u32
        lib.kldiv_sim_error.restype = ctypes.c_char_p
        self.lib = lib

    def _check_rc(self, rc):
        if rc == 1:
            raise RuntimeError("the tiling refused the launch")
        if rc:
            raise RuntimeError(f"AscendC constraint violated: {self.lib.kldiv_sim_error().decode()}")

    @staticmethod
    def _ptr(a):
        return a.ctypes.data_as(ctypes.c_void_p)

    def max_ub_used(self):
        return int(self.lib.kldiv_sim_max_ub_used())

    def forward(self, x, t, reduction, log_target, cores=ASCEND910B_AIV):
        x = np.asarray(x, np.float32)
        shape = x.shape
        xb, tb = _to_io(x, self.dtype).reshape(-1), _to_io(t, self.dtype).reshape(-1)
        n = xb.size
        y = np.full(n if reduction == "none" else 1, 0xFFFF, np.uint16).view(xb.dtype) if xb.itemsize == 2 \
            else np.full(n if reduction == "none" else 1, np.nan, np.float32)  # NaN: unwritten elements show
        first = shape[0] if shape else 1
        rc = self.lib.kldiv_sim_forward(self._ptr(xb), self._ptr(tb), self._ptr(y), n, first,
                                        REDUCTION_CODES[reduction], int(log_target), cores)
        self._check_rc(rc)
        out = _from_io(y, self.dtype)
        return out.reshape(shape) if reduction == "none" else out.reshape(())

    def backward(self, x, t, dout, reduction, log_target, cores=ASCEND910B_AIV):
        x = np.asarray(x, np.float32)
        shape = x.shape
        xb, tb = _to_io(x, self.dtype).reshape(-1), _to_io(t, self.dtype).reshape(-1)
        gb = _to_io(dout, self.dtype).reshape(-1)
        n = xb.size
        dx = np.full(n, 0xFF, np.uint8).repeat(xb.itemsize).view(xb.dtype)
        dt = dx.copy()
        first = shape[0] if shape else 1
        rc = self.lib.kldiv_sim_backward(self._ptr(xb), self._ptr(tb), self._ptr(gb), self._ptr(dx), self._ptr(dt),
                                         n, first, REDUCTION_CODES[reduction], int(log_target), cores)
        self._check_rc(rc)
        return _from_io(dx, self.dtype).reshape(shape), _from_io(dt, self.dtype).reshape(shape)
