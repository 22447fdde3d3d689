"""The fused distillation kernels' sources (op_kernel/distill_custom*.cpp) run on the CPU through the AscendC stand-in
(ascendc_sim/), and their tiling plan (op_kernel/distill_tiling_plan.h), for tests that run without Ascend.

``DistillKernelSimulator(dtype)`` compiles ``ascendc_sim/distill_sim_driver.cpp`` (which includes the kernel sources)
for one IO dtype into the cache and calls it with ctypes: one thread per vector core, every UB allocation, DataCopy
alignment (GM addresses included), CompareScalar repeat size and SetFlag/WaitFlag pairing checked.
"""
import ctypes
import hashlib
import os
import subprocess

import numpy as np

import kldiv_tile_model as _km
from ms_kldiv import reference as _ref
from ms_kldiv._distill_math import DIVERGENCES, KL, Variant  # noqa: F401 - Variant for the test files

HERE = os.path.dirname(os.path.abspath(__file__))
SIM_DIR = os.path.join(HERE, "ascendc_sim")
_DEPS = [os.path.join(SIM_DIR, f) for f in ("distill_sim_driver.cpp", "kernel_operator.h",
                                            "register/tilingdata_base.h")] \
    + [os.path.join(_km.ASCEND_SRC, "op_kernel", f) for f in ("distill_custom.cpp", "distill_custom_grad.cpp",
                                                             "distill_common.h", "distill_tiling_plan.h", "tile_io.h",
                                                             "tiling_common.h")] \
    + [os.path.join(_km.ASCEND_SRC, "op_host", f) for f in ("distill_custom_tiling.h", "distill_hyper.h")]
_TYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16_t"}

FORWARD, BACKWARD_STUDENT, BACKWARD_BOTH = range(3)
FORWARD_KL, REVERSE_KL, JSD, TVD, SKEW_KL, SKEW_RKL, SYMMETRIC = range(7)
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
    out = os.path.join(_km._cache_dir(), f"distill_ascendc_sim_{dtype}-{digest.hexdigest()[:12]}.so")
    if not os.path.exists(out):
        tmp = out + f".{os.getpid()}.tmp"
        cmd = [cxx] + _km.SIM_FLAGS + ["-I", SIM_DIR, f"-DDTYPE_STUDENT={_TYPES[dtype]}",
                                       os.path.join(SIM_DIR, "distill_sim_driver.cpp"), "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr}")
        os.replace(tmp, out)
        _km._prune(out)
    return out


class DistillKernelSimulator:
    """DistillCustom / DistillCustomGrad, the kernel sources themselves, on the CPU stand-in of AscendC."""

    def __init__(self, dtype="float32"):
        self.dtype = dtype
        lib = ctypes.CDLL(build(dtype))
        p, u32, u64, f32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_float
        lib.distill_sim_forward.argtypes = [p, p, p, u64, u64, p, u32, u32]
        lib.distill_sim_forward.restype = ctypes.c_int
        lib.distill_sim_backward.argtypes = [p, p, p, p, p, p, u64, u64, p, ctypes.c_int, u32, u32]
        lib.distill_sim_backward.restype = ctypes.c_int
        lib.distill_sim_error.restype = ctypes.c_char_p
        lib.distill_sim_max_ub_used.restype = u32
        lib.distill_make_plan.argtypes = [u64, u64, u32, u32, u32, u32, u32, ctypes.c_int, ctypes.POINTER(u64)]
        lib.distill_make_plan.restype = ctypes.c_int
        lib.distill_row_range.argtypes = [u64, u32, u32, ctypes.POINTER(u64)]
        lib.distill_row_range.restype = None
        lib.distill_tile_count.argtypes = [u64, u32]
        lib.distill_tile_count.restype = u64
        lib.distill_compute_count.argtypes = [u32]
        lib.distill_compute_count.restype = u32
        lib.distill_kind_of_beta.argtypes = [f32]
        lib.distill_kind_of_beta.restype = u32
        lib.distill_kind_of.argtypes = [f32, u32]
        lib.distill_kind_of.restype = u32
        lib.distill_const.argtypes = [ctypes.c_int]
        lib.distill_const.restype = u32
        self.lib = lib
        names = ("tile_align", "compute_align", "buffer_num", "max_tile", "api_ub_reserve_bytes", "ub_reserve_bytes",
                 "stats_stride")
        self.const = {name: int(lib.distill_const(i)) for i, name in enumerate(names)}

    # ------------------------------------------------------------------------------------------ tiling
    def plan(self, rows, vocab, io, op, kind, cores=ASCEND910B_AIV, ub=ASCEND910B_UB, softcap=False):
        out = (ctypes.c_uint64 * 7)()
        if self.lib.distill_make_plan(rows, vocab, io, op, kind, cores, ub, int(softcap), out):
            return None
        keys = ("rows", "vocab", "used_cores", "tile_length", "base_rows", "rem_rows", "ub_bytes_used")
        return dict(zip(keys, (int(v) for v in out)))

    def row_range(self, plan, core):
        out = (ctypes.c_uint64 * 2)()
        self.lib.distill_row_range(plan["base_rows"], plan["rem_rows"], core, out)
        return int(out[0]), int(out[1])

    def tile_count(self, vocab, tile):
        return int(self.lib.distill_tile_count(vocab, tile))

    def compute_count(self, valid):
        return int(self.lib.distill_compute_count(valid))

    def kind_of_beta(self, beta):
        return int(self.lib.distill_kind_of_beta(beta))

    def kind_of(self, beta, variant=KL):
        return int(self.lib.distill_kind_of(beta, DIVERGENCES.index(variant.divergence)))

    # ------------------------------------------------------------------------------------------ kernels
    def max_ub_used(self):
        return int(self.lib.distill_sim_max_ub_used())

    def _check(self, rc):
        if rc == 1:
            raise RuntimeError("the tiling refused the launch")
        if rc:
            raise RuntimeError(f"AscendC constraint violated: {self.lib.distill_sim_error().decode()}")

    @staticmethod
    def _ptr(a):
        return a.ctypes.data_as(ctypes.c_void_p)

    @staticmethod
    def _hyper(temperature, beta, variant):
        """The operators' six attributes, float64 (the driver's `hyper`)."""
        v = variant or KL
        return np.array([temperature, beta, DIVERGENCES.index(v.divergence), v.alpha, v.softcap, v.logit_scale],
                        np.float64)

    def forward(self, student, teacher, temperature, beta, cores=ASCEND910B_AIV, ub=ASCEND910B_UB, variant=None):
        """float32 stats [..., 8] (loss, lse_s, lse_t, K1, K2, 0, 0, 0) of logits [..., V] (IO-dtype values);
        ``variant``: the divergence and the logits' transform (``ms_kldiv._distill_math.Variant``, default KL)."""
        s = np.asarray(student, np.float32)
        lead, vocab = s.shape[:-1], s.shape[-1]
        rows = int(np.prod(lead, dtype=np.int64))
        sb = _km._to_io(s, self.dtype).reshape(-1)
        tb = _km._to_io(np.asarray(teacher, np.float32), self.dtype).reshape(-1)
        stats = np.empty(rows * 8, np.float32)
        hyper = self._hyper(temperature, beta, variant)
        self._check(self.lib.distill_sim_forward(self._ptr(sb), self._ptr(tb), self._ptr(stats), rows, vocab,
                                                 self._ptr(hyper), cores, ub))
        return stats.reshape(lead + (8,))

    def backward(self, student, teacher, stats, dloss, temperature, beta, teacher_grad=True, cores=ASCEND910B_AIV,
                 ub=ASCEND910B_UB, variant=None):
        """(d_student, d_teacher or None) as float32 values of the IO dtype."""
        s = np.asarray(student, np.float32)
        shape = s.shape
        rows, vocab = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
        sb = _km._to_io(s, self.dtype).reshape(-1)
        tb = _km._to_io(np.asarray(teacher, np.float32), self.dtype).reshape(-1)
        st = np.ascontiguousarray(np.asarray(stats, np.float32).reshape(-1))
        g = np.ascontiguousarray(np.asarray(dloss, np.float32).reshape(-1))
        assert st.size == rows * 8 and g.size == rows
        ds = np.empty_like(sb)
        dt = np.empty_like(tb) if teacher_grad else np.empty(0, sb.dtype)
        hyper = self._hyper(temperature, beta, variant)
        self._check(self.lib.distill_sim_backward(self._ptr(sb), self._ptr(tb), self._ptr(st), self._ptr(g),
                                                  self._ptr(ds), self._ptr(dt), rows, vocab, self._ptr(hyper),
                                                  int(teacher_grad), cores, ub))
        d_s = _km._from_io(ds, self.dtype).reshape(shape)
        return d_s, (_km._from_io(dt, self.dtype).reshape(shape) if teacher_grad else None)


# ---------------------------------------------------------------------------------- float64 reference
def log_softmax_f64(z, temperature):
    return _ref.log_softmax(np.asarray(z, np.float64) / temperature)


def weighted_f64(p, x):
    """p * x with the zero-mass rule: 0 where p == 0 (x may be +-inf or NaN there)."""
    with np.errstate(all="ignore"):
        return np.where(p > 0, p * x, 0.0)


def reference_grads_f64(student, teacher, temperature, beta, g):
    """(d_student, d_teacher) of sum_rows g * loss_row in float64, closed form from the definition
    (tests/test_ascend_tiling_distill.py checks it against finite differences of the float64 loss)."""
    ls, lt = log_softmax_f64(student, temperature), log_softmax_f64(teacher, temperature)
    ps, pt = np.exp(ls), np.exp(lt)
    c = np.asarray(g, np.float64)[..., None] * temperature
    with np.errstate(all="ignore"):
        if beta in (0.0, 1.0):
            (la, pa), (lb, pb) = ((lt, pt), (ls, ps)) if beta == 0.0 else ((ls, ps), (lt, pt))
            k = weighted_f64(pa, la - lb).sum(-1, keepdims=True)
            d_b = c * (pb - pa)
            d_a = c * weighted_f64(pa, la - lb - k)
            return (d_b, d_a) if beta == 0.0 else (d_a, d_b)
        lm = np.logaddexp(lt + np.log(beta), ls + np.log1p(-beta))
        ks = weighted_f64(ps, ls - lm).sum(-1, keepdims=True)
        kt = weighted_f64(pt, lt - lm).sum(-1, keepdims=True)
        return c * (1 - beta) * weighted_f64(ps, ls - lm - ks), c * beta * weighted_f64(pt, lt - lm - kt)


def reference_variant_grads_f64(student, teacher, temperature, beta, variant, g):
    """(d_student, d_teacher) of sum_rows g * loss_row in float64 for any divergence and logits transform
    (``ms_kldiv.reference.distillation_pointwise``), closed form: with x = transformed(z), a = P_s dD/dP_s and
    b = P_t dD/dP_t (custom_ops/common/distill_math.h), d/dz_s = g T (a - P_s sum a) x'(z_s), likewise for t
    (tests/test_ascend_distill_menu.py checks it against central differences)."""
    v = variant or KL
    zs, zt = np.asarray(student, np.float64), np.asarray(teacher, np.float64)
    xs, xt = (_ref.transformed(z, v.softcap, v.logit_scale) for z in (zs, zt))
    if v.softcap > 0:
        slope_s, slope_t = (v.logit_scale * (1 - np.tanh(v.logit_scale * z / v.softcap) ** 2) for z in (zs, zt))
    else:
        slope_s = slope_t = v.logit_scale
    if v.divergence == "kl":
        ds, dt = reference_grads_f64(xs, xt, temperature, beta, g)
        return ds * slope_s, dt * slope_t
    ls, lt = log_softmax_f64(xs, temperature), log_softmax_f64(xt, temperature)
    ps, pt = np.exp(ls), np.exp(lt)
    al = v.alpha
    with np.errstate(all="ignore"):
        if v.divergence == "tvd":
            sg = np.sign(ps - pt)
            a, b = 0.5 * ps * sg, -0.5 * pt * sg
        elif v.divergence in ("skew_kl", "skew_rkl"):
            (lp, p, lq), t_weighs = ((lt, pt, ls), True) if v.divergence == "skew_kl" else ((ls, ps, lt), False)
            lm = lq if al == 0 else np.logaddexp(lp + np.log(al), lq + np.log1p(-al))
            kl = weighted_f64(p, lp - lm)
            da_p = kl - al * weighted_f64(p, np.exp(lp - lm))          # P^2 / M
            da_q = -(1 - al) * np.where(p > 0, np.exp(lp + lq - lm), 0.0)  # P Q / M
            a, b = (da_q, da_p) if t_weighs else (da_p, da_q)
        elif v.divergence == "symmetric_kl":
            fwd, rev = weighted_f64(pt, lt - ls), weighted_f64(ps, ls - lt)
            a = -al * pt + (1 - al) * rev
            b = al * fwd - (1 - al) * ps
        else:
            raise ValueError(v.divergence)
        c = np.asarray(g, np.float64)[..., None] * temperature
        ds = c * (a - ps * a.sum(-1, keepdims=True))
        dt = c * (b - pt * b.sum(-1, keepdims=True))
    return ds * slope_s, dt * slope_t
