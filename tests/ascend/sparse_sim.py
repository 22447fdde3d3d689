"""The stored-teacher kernels' sources (op_kernel/sparse_distill_custom*.cpp) run on the CPU through the AscendC
stand-in (ascendc_sim/), and their tiling plan (op_kernel/sparse_tiling_plan.h), for tests that run without Ascend.

``SparseKernelSimulator(dtype)`` compiles ``ascendc_sim/sparse_sim_driver.cpp`` (which includes the kernel sources)
for one IO dtype into the cache and calls it with ctypes: one thread per vector core, every UB allocation, DataCopy
alignment (GM addresses included), GM bounds, CompareScalar repeat size and SetFlag/WaitFlag pairing checked.
"""
import ctypes
import hashlib
import os
import subprocess

import numpy as np

import kldiv_tile_model as _km

HERE = os.path.dirname(os.path.abspath(__file__))
SIM_DIR = os.path.join(HERE, "ascendc_sim")
_DEPS = [os.path.join(SIM_DIR, f) for f in ("sparse_sim_driver.cpp", "kernel_operator.h",
                                            "register/tilingdata_base.h")] \
    + [os.path.join(_km.ASCEND_SRC, "op_kernel", f) for f in ("sparse_distill_custom.cpp",
                                                             "sparse_distill_custom_grad.cpp", "sparse_common.h",
                                                             "sparse_tiling_plan.h", "distill_common.h",
                                                             "distill_tiling_plan.h", "tile_io.h", "tiling_common.h")] \
    + [os.path.join(_km.ASCEND_SRC, "op_host", "sparse_distill_custom_tiling.h")]
_TYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16_t"}

FORWARD, BACKWARD = range(2)
FORWARD_KL, REVERSE_KL, JSD = range(3)
STATS = 8
LOSS, MAX, LOG_Z, LOG_Z_OFF, SUM_A, A_TAIL, LOG_Q = range(7)
ASCEND910B_UB = _km.ASCEND910B_UB
ASCEND910B_AIV = _km.ASCEND910B_AIV
quantize = _km.quantize
compiler = _km.compiler


def build(dtype):
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) on PATH")
    digest = hashlib.sha1(" ".join([dtype] + _km.SIM_FLAGS).encode())
    for path in _DEPS:
        with open(path, "rb") as f:
            digest.update(f.read())
    out = os.path.join(_km._cache_dir(), f"sparse_ascendc_sim_{dtype}-{digest.hexdigest()[:12]}.so")
    if not os.path.exists(out):
        tmp = out + f".{os.getpid()}.tmp"
        cmd = [cxx] + _km.SIM_FLAGS + ["-I", SIM_DIR, f"-DDTYPE_STUDENT={_TYPES[dtype]}",
                                       os.path.join(SIM_DIR, "sparse_sim_driver.cpp"), "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr}")
        os.replace(tmp, out)
        _km._prune(out)
    return out


_SIMS = {}


def simulator(dtype="float32"):
    """One SparseKernelSimulator per IO dtype per process (the library is loaded once)."""
    if dtype not in _SIMS:
        _SIMS[dtype] = SparseKernelSimulator(dtype)
    return _SIMS[dtype]


class SparseKernelSimulator:
    """SparseDistillCustom / SparseDistillCustomGrad, the kernel sources themselves, on the CPU stand-in of AscendC."""

    def __init__(self, dtype="float32"):
        self.dtype = dtype
        lib = ctypes.CDLL(build(dtype))
        p, u32, u64, f32, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_float, ctypes.c_int
        lib.sparse_sim_forward.argtypes = [p, p, p, p, u64, u64, u64, f32, f32, f32, i, u32, u32]
        lib.sparse_sim_forward.restype = i
        lib.sparse_sim_backward.argtypes = [p, p, p, p, p, p, u64, u64, u64, f32, f32, f32, i, u32, u32]
        lib.sparse_sim_backward.restype = i
        lib.sparse_sim_error.restype = ctypes.c_char_p
        lib.sparse_sim_max_ub_used.restype = u32
        lib.sparse_make_plan.argtypes = [u64, u64, u64, u32, u32, u32, u32, ctypes.POINTER(u64)]
        lib.sparse_make_plan.restype = i
        lib.sparse_row_range.argtypes = [u64, u32, u32, ctypes.POINTER(u64)]
        lib.sparse_row_range.restype = None
        lib.sparse_tile_count.argtypes = [u64, u32]
        lib.sparse_tile_count.restype = u64
        lib.sparse_kind_of_beta.argtypes = [f32]
        lib.sparse_kind_of_beta.restype = u32
        lib.sparse_const.argtypes = [i]
        lib.sparse_const.restype = u32
        self.lib = lib
        names = ("tile_align", "compute_align", "buffer_num", "max_tile", "api_ub_reserve_bytes", "ub_reserve_bytes",
                 "stats_stride", "max_ids")
        self.const = {name: int(lib.sparse_const(k)) for k, name in enumerate(names)}

    # ------------------------------------------------------------------------------------------ tiling
    def plan(self, rows, vocab, k, io, op, cores=ASCEND910B_AIV, ub=ASCEND910B_UB):
        out = (ctypes.c_uint64 * 9)()
        if self.lib.sparse_make_plan(rows, vocab, k, io, op, cores, ub, out):
            return None
        keys = ("rows", "vocab", "ids", "id_lanes", "used_cores", "tile_length", "base_rows", "rem_rows",
                "ub_bytes_used")
        return dict(zip(keys, (int(v) for v in out)))

    def row_range(self, plan, core):
        out = (ctypes.c_uint64 * 2)()
        self.lib.sparse_row_range(plan["base_rows"], plan["rem_rows"], core, out)
        return int(out[0]), int(out[1])

    def tile_count(self, vocab, tile):
        return int(self.lib.sparse_tile_count(vocab, tile))

    def kind_of_beta(self, beta):
        return int(self.lib.sparse_kind_of_beta(beta))

    # ------------------------------------------------------------------------------------------ kernels
    def max_ub_used(self):
        return int(self.lib.sparse_sim_max_ub_used())

    def _check(self, rc):
        if rc == 1:
            raise RuntimeError("the tiling refused the launch")
        if rc:
            raise RuntimeError(f"AscendC constraint violated: {self.lib.sparse_sim_error().decode()}")

    @staticmethod
    def _ptr(a):
        return a.ctypes.data_as(ctypes.c_void_p)

    @staticmethod
    def _ids_values(ids, values, rows):
        ids = np.asarray(ids, np.int32)
        ids = np.ascontiguousarray(ids.reshape(rows, ids.shape[-1]))
        vals = np.ascontiguousarray(np.asarray(values, np.float32).reshape(ids.shape))
        return ids, vals

    def forward(self, student, ids, values, temperature=1.0, ratio=1.0, beta=0.0, tail=False, cores=ASCEND910B_AIV,
                ub=ASCEND910B_UB):
        """float32 stats [..., 8] (sparse::Stat) of logits [..., V] (IO-dtype values), ids/values [..., K]."""
        s = np.asarray(student, np.float32)
        lead, vocab = s.shape[:-1], s.shape[-1]
        rows = int(np.prod(lead, dtype=np.int64))
        k = np.asarray(ids).shape[-1]
        sb = _km._to_io(s, self.dtype).reshape(-1)
        idb, vb = self._ids_values(ids, values, rows)
        stats = np.empty(rows * STATS, np.float32)
        self._check(self.lib.sparse_sim_forward(self._ptr(sb), self._ptr(idb), self._ptr(vb), self._ptr(stats), rows,
                                                vocab, k, temperature, ratio, beta, int(bool(tail)), cores, ub))
        return stats.reshape(lead + (STATS,))

    def backward(self, student, ids, values, stats, dloss, temperature=1.0, ratio=1.0, beta=0.0, tail=False,
                 cores=ASCEND910B_AIV, ub=ASCEND910B_UB):
        """d_student as float32 values of the IO dtype, the logits' shape."""
        s = np.asarray(student, np.float32)
        shape = s.shape
        rows, vocab = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
        k = np.asarray(ids).shape[-1]
        sb = _km._to_io(s, self.dtype).reshape(-1)
        idb, vb = self._ids_values(ids, values, rows)
        st = np.ascontiguousarray(np.asarray(stats, np.float32).reshape(-1))
        g = np.ascontiguousarray(np.asarray(dloss, np.float32).reshape(-1))
        assert st.size == rows * STATS and g.size == rows
        ds = np.empty_like(sb)
        self._check(self.lib.sparse_sim_backward(self._ptr(sb), self._ptr(idb), self._ptr(vb), self._ptr(st),
                                                 self._ptr(g), self._ptr(ds), rows, vocab, k, temperature, ratio,
                                                 beta, int(bool(tail)), cores, ub))
        return _km._from_io(ds, self.dtype).reshape(shape)


# ---------------------------------------------------------------------------------- float64 reference
def _bucket_a(log_r, log_q, beta):
    """a = r dD/dr of each bucket (sparse_math.h `bucket`), float64; 0 where the weighting probability is 0."""
    r, q = np.exp(log_r), np.exp(log_q)
    with np.errstate(all="ignore"):
        if beta == 0.0:
            return -q
        if beta == 1.0:
            return np.where(r > 0, r * (log_r - log_q), 0.0)
        lm = np.logaddexp(log_q + np.log(beta), log_r + np.log1p(-beta))
        return np.where(r > 0, (1 - beta) * r * (log_r - lm), 0.0)


def reference_grads_f64(student, ids, values, mode="renormalize", temperature=1.0, teacher_temperature=1.0, beta=0.0,
                        g=None, magnitude=False):
    """d/d student of sum_rows g * T^2 D_row (``ms_kldiv.reference.sparse_distillation_rows``) in float64, closed form
    (tests/test_ascend_sparse.py checks it against central differences of the float64 loss). ``magnitude``: also
    the size of the two terms each element is the difference of (|tail term| + p |A|, at the ids |a| + p |A|), the
    scale of float32 cancellation."""
    from ms_kldiv import reference as ref
    s = np.asarray(student, np.float64)
    ids = np.asarray(ids)
    log_r, log_q = ref.sparse_support(s, ids, values, mode, temperature, teacher_temperature)
    a = _bucket_a(log_r, log_q, beta)
    big_a = a.sum(-1, keepdims=True)
    ls = ref.log_softmax(s / temperature)
    p = np.exp(ls)
    valid = ids >= 0
    off = np.ones(s.shape[:-1] + (s.shape[-1] + 1,), bool)
    np.put_along_axis(off, np.where(valid, ids, s.shape[-1]), False, -1)
    off = off[..., :-1]
    off &= log_r[..., -1:] > -np.inf  # no tail bucket (no mass off the ids in float64): no tail term
    # (a row of infinite loss, as reverse KL of a student tail against no teacher tail, has an infinite A and NaN
    # gradients: quietly, the checks skip rows whose loss is not finite)
    with np.errstate(all="ignore"):
        tail = np.where(off, a[..., -1:] * np.exp(ls - log_r[..., -1:]), 0.0)
        grad = tail - p * big_a
        mag = np.abs(tail) + p * np.abs(big_a)
        p_ids = np.where(valid, np.take_along_axis(p, np.where(valid, ids, 0), -1), 0.0)
        at_ids = a[..., :-1] - p_ids * big_a
        mag_ids = np.abs(a[..., :-1]) + p_ids * np.abs(big_a)
    lead = np.indices(ids.shape[:-1])
    for i in range(ids.shape[-1]):
        sel = valid[..., i]
        idx = tuple(x[sel] for x in lead) + (ids[..., i][sel],)
        grad[idx] = at_ids[..., i][sel]
        mag[idx] = mag_ids[..., i][sel]
    gg = np.ones(s.shape[:-1]) if g is None else np.asarray(g, np.float64)
    scale = temperature * gg[..., None]
    return (scale * grad, np.abs(scale) * mag) if magnitude else scale * grad
