"""Ascend backends: 'aot' (our AscendC operators) and 'native' (MindSpore's aclnn KLDiv with our gradient).

Both register for the 'Ascend' device target only. Importing this module, registering, and asking
``backend_info()`` on CPU or GPU touch nothing Ascend-specific; the AscendC primitives are created in
``make_op``, which only runs once ``resolve`` found the backend usable on Ascend.

'aot' (preference 100) calls ``KlDivCustom`` / ``KlDivCustomGrad`` from ``custom_ops/ascend`` through
``ops.Custom(..., func_type="aot")``. It is available when that custom-op package is installed: found through
``ASCEND_CUSTOM_OPP_PATH`` or in ``$ASCEND_OPP_PATH/vendors``. The kernels take one shape and one dtype, so
this layer broadcasts first (MindSpore's BroadcastTo gradient then sums each gradient back to its operand's
shape), sends float64 and empty tensors to the composite backend (the vector units have no float64), and
supplies the second-order gradient in plain ops.

The same package's DistillCustom/DistillCustomGrad (distillation from logits) and SparseDistillCustom/
SparseDistillCustomGrad (from a stored teacher's ids and values) serve 'distillation' and 'sparse_distillation';
each op is available once the installed package registers its operators (``distill_ops_installed``,
``sparse_ops_installed``): a package built before them runs the op elsewhere, with the reason in ``backend_info``.

'native' (preference 50) takes the value from MindSpore's ``KLDiv`` primitive (aclnnKlDiv, the kernel behind
``mint.nn.functional.kl_div``) and supplies both gradients itself: MindSpore's own bprop returns zero for the
target. aclnn follows PyTorch where the SPEC does not (NaN for negative targets, NaN for t = 0 with
x = -inf, 'batchmean' over the broadcast shape), so lanes without target mass get safe operands (t = 1 or
0, x = 0), whose loss is exactly 0 under either convention, and the reduction scale is applied here. float64,
which aclnnKlDiv does not take, and empty tensors go to composite.
"""
import functools
import glob
import json
import os

import mindspore as ms
from mindspore import nn, ops
from mindspore.ops import constexpr

from .. import _distill_math, _math
from .._distill_math import STATS as DISTILL_STATS
from . import distill, register
from .base import Backend
from .common import KLDivWrapper, PointwiseCore, custom_reg_info
from .composite import CompositeSparseKernels, composite_op

__all__ = ["AscendAotBackend", "AscendNativeBackend", "find_custom_opp", "AscendCKernels", "NativeKernel",
           "aot_op", "native_op", "AscendCDistillKernels", "distill_rows_op", "distill_ops_installed",
           "AscendCSparseKernels", "sparse_ops_installed"]

OP_NAME = "KlDivCustom"
GRAD_OP_NAME = "KlDivCustomGrad"
VENDOR = "ms_kldiv"
# The header MindSpore reads to build the aclnn call for a Custom named OP_NAME (see _custom_ops_utils).
_ACLNN_HEADER = "aclnn_kl_div_custom.h"


# ------------------------------------------------------------------------------------------ detection
def _vendor_dirs():
    """Candidate installed vendor directories, in the order CANN and MindSpore search them."""
    dirs = [p for p in os.environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if p]
    opp = os.environ.get("ASCEND_OPP_PATH")
    if opp:
        vendors = os.path.join(opp, "vendors")
        names = []
        config = os.path.join(vendors, "config.ini")
        if os.path.isfile(config):
            with open(config, encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition("=")
                    if key.strip().lower() == "load_priority":
                        names += [v.strip() for v in value.split(",") if v.strip()]
        names.append(VENDOR)
        dirs += [os.path.join(vendors, n) for n in dict.fromkeys(names)]
    return dirs


def _registers(vendor_dir, *op_names):
    """True if one of the vendor directory's operator info files declares every operator in ``op_names``."""
    for path in glob.glob(os.path.join(vendor_dir, "op_impl", "ai_core", "tbe", "config", "*", "aic-*-ops-info.json")):
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if all(name in info for name in op_names):
            return True
    return False


def _has_op(vendor_dir):
    """True if the vendor directory registers both operators and ships the aclnn header of the forward."""
    return (os.path.isfile(os.path.join(vendor_dir, "op_api", "include", _ACLNN_HEADER))
            and _registers(vendor_dir, OP_NAME, GRAD_OP_NAME))


@functools.lru_cache(maxsize=8)
def _find_custom_opp(custom_opp_path, opp_path):
    del custom_opp_path, opp_path  # cache key only: the search reads the environment
    searched = _vendor_dirs()
    for d in searched:
        if _has_op(d):
            return d, tuple(searched)
    return None, tuple(searched)


def find_custom_opp():
    """(vendor directory holding KlDivCustom and KlDivCustomGrad, or None; the directories searched)."""
    return _find_custom_opp(os.environ.get("ASCEND_CUSTOM_OPP_PATH"), os.environ.get("ASCEND_OPP_PATH"))


# ---------------------------------------------------------------------------------- AscendC kernels
def _same_shape(x, *_):
    return x


def _scalar_shape(*_):
    return []


def _first_dtype(x, *_):
    return x


def _grad_shapes(x, t, *_):  # also the dtypes: (dx like x, dtarget like target)
    return x, t


def _reg_info(name, inputs, outputs):
    from mindspore.ops import DataType
    return custom_reg_info(name, "Ascend", inputs, outputs, required=True,
                           attrs=(("reduction", "str"), ("log_target", "bool")),
                           formats=(DataType.F32_Default, DataType.F16_Default, DataType.BF16_Default))


class _KernelForward(nn.Cell):
    """KlDivCustom with its attributes bound. The attributes travel as trailing scalar arguments, which
    MindSpore's AscendC path maps onto the aclnn call after the tensors, in reg_info order."""

    def __init__(self, reduction, log_target):
        super().__init__()
        self.reduction = reduction
        self.log_target = log_target
        self.op = ops.Custom(OP_NAME, out_shape=_same_shape if reduction == "none" else _scalar_shape,
                             out_dtype=_first_dtype, func_type="aot",
                             reg_info=_reg_info(OP_NAME, ("x", "target"), ("y",)))

    def construct(self, x, t):
        return self.op(x, t, self.reduction, self.log_target)


class _KernelBackward(nn.Cell):
    """KlDivCustomGrad with its attributes bound: (x, t, dout) -> (dx, dtarget)."""

    def __init__(self, reduction, log_target):
        super().__init__()
        self.reduction = reduction
        self.log_target = log_target
        self.op = ops.Custom(GRAD_OP_NAME, out_shape=_grad_shapes, out_dtype=_grad_shapes,
                             func_type="aot",
                             reg_info=_reg_info(GRAD_OP_NAME, ("x", "target", "dout"), ("dx", "dtarget")))

    def construct(self, x, t, g):
        return self.op(x, t, g, self.reduction, self.log_target)


class AscendCKernels:
    """Factory of the two kernel Cells. The CPU tests substitute an object with the same two methods whose
    Cells run the NumPy model of the kernels (tests/ascend/kldiv_tile_model.py).

    Contract (same-shaped, same-dtype x and t; float16, bfloat16 or float32):
      forward(reduction, log_target)(x, t) -> loss for 'none', else the 0-d sum times scale;
      backward(reduction, log_target)(x, t, dout) -> (dx, dt), the pointwise derivatives times dout
      (elementwise for 'none', the one element of a 0-d dout otherwise) times scale;
      scale = 1 ('none', 'sum'), 1/numel ('mean'), 1/x.shape[0] ('batchmean').
    """

    def forward(self, reduction, log_target):
        return _KernelForward(reduction, log_target)

    def backward(self, reduction, log_target):
        return _KernelBackward(reduction, log_target)


# Picked in __init__: a Python branch inside a Cell with a bprop breaks grad-of-jit.
def _identity(v):
    return v


def _sum_all(v):
    return ops.sum(v)


class _AotGradCore(nn.Cell):
    """The backward kernel, differentiable once more (its own bprop, in plain ops, hence differentiable
    again): second-order gradients of the loss."""

    def __init__(self, kernels, reduction, log_target):
        super().__init__()
        self.kernel = kernels.backward(reduction, log_target)
        math_fns = _math.pointwise(log_target)
        self.grads_fn, self.second_fn = math_fns.grads, math_fns.second
        self.scale = _math.scale_fn(reduction)
        self.fold_g = _identity if reduction == "none" else _sum_all

    def construct(self, x, t, g):
        return self.kernel(x, t, g)

    def bprop(self, x, t, g, out, dout):
        f32 = ms.float32
        cx, ct = dout
        xf = ops.cast(x, f32)
        s = self.scale(xf, xf)
        tf = ops.cast(t, f32)
        px, pt = self.grads_fn(xf, tf)
        gx, gt, gg = _math.vjp_grads(px, pt, self.second_fn(xf, tf), ops.cast(g, f32) * s,
                                     ops.cast(cx, f32), ops.cast(ct, f32))
        gg = ops.reshape(self.fold_g(gg * s), g.shape)
        return ops.cast(gx, x.dtype), ops.cast(gt, t.dtype), ops.cast(gg, g.dtype)


class _AotCore(nn.Cell):
    """The forward kernel with the backward kernel as its gradient (both gradients in one launch)."""

    def __init__(self, kernels, reduction, log_target):
        super().__init__()
        self.kernel = kernels.forward(reduction, log_target)
        self.grad = _AotGradCore(kernels, reduction, log_target)

    def construct(self, x, t):
        return self.kernel(x, t)

    def bprop(self, x, t, out, dout):
        return self.grad(x, t, dout)


def aot_op(reduction, log_target, kernels=None, fallback=None):
    """The 'aot' op on Ascend: KLDivWrapper around the AscendC kernels, which take one shape and a half or
    float32 dtype and apply the reduction scale themselves. float64 (the vector units have none), empty and
    dynamic shapes (no Python shape inference for the kernels) go to ``fallback`` (default: composite).
    'batchmean' divides by the input's first dimension before broadcasting (SPEC), which the kernel cannot see
    once the input is broadcast: that case reduces with 'sum' and the wrapper divides."""
    kernels = kernels or AscendCKernels()
    return KLDivWrapper(_AotCore(kernels, reduction, log_target), reduction,
                        fallback=fallback if fallback is not None else composite_op(reduction, log_target),
                        fallback_float64=True, fallback_dynamic_or_empty=True, widen_halves="to_broadcast",
                        core_scales=True,
                        core_sum=_AotCore(kernels, "sum", log_target) if reduction == "batchmean" else None)


# ------------------------------------------------------------------------------------- native (aclnn)
def _native_primitive():
    """MindSpore's KLDiv primitive (aclnnKlDiv). Not ``mint.nn.functional.kl_div`` itself: that wrapper
    branches in Python on the reduction, which breaks grad-of-jit inside a Cell with a bprop."""
    try:
        from mindspore.ops.auto_generate.gen_ops_prim import KLDiv
        prim = KLDiv()
        return lambda x, t, reduction, log_target: prim(x, t, reduction, log_target)
    except ImportError:  # a later MindSpore may move it; the public wrapper is right for 'none'/'sum'
        from mindspore import mint
        return mint.nn.functional.kl_div


class NativeKernel:
    """Source of the value function; the CPU tests substitute one (aclnn does not exist there)."""

    def __call__(self):
        return _native_primitive()


class _NativeCore(PointwiseCore):
    """aclnn's value of 'none' or 'sum' on safe operands (lanes without target mass get t = 1 or 0, x = 0, whose
    loss is exactly 0 under aclnn's and the SPEC's conventions alike), with the SPEC's gradient table."""

    def __init__(self, kl_div_fn, summed, log_target):
        super().__init__(summed, log_target)
        self.kl_div = kl_div_fn
        self.reduction = "sum" if summed else "none"
        self.log_target = log_target

    def value(self, x, t):
        _, xs, ts = self.safe_fn(x, t)
        return self.kl_div(xs, ts, self.reduction, self.log_target)


def native_op(reduction, log_target, kernel=None, fallback=None):
    """The 'native' op on Ascend: aclnnKlDiv for the value, our gradients, SPEC scaling. Half types run in
    float32, as the SPEC asks (aclnn's internal precision for them is not documented), widened before
    broadcasting so the broadcast gradients are summed back in float32 too; float64 (which aclnnKlDiv does not
    take), empty and dynamic shapes go to ``fallback`` (default: composite)."""
    core = _NativeCore((kernel or NativeKernel())(), reduction != "none", log_target)
    return KLDivWrapper(core, reduction,
                        fallback=fallback if fallback is not None else composite_op(reduction, log_target),
                        fallback_float64=True, fallback_dynamic_or_empty=True)


# ------------------------------------------------------------------------- distillation (DistillCustom)
DISTILL_OP_NAME = "DistillCustom"
DISTILL_GRAD_OP_NAME = "DistillCustomGrad"


def distill_ops_installed():
    """True if the installed vendor package (see ``find_custom_opp``) also registers the distillation operators
    (packages built before they existed do not)."""
    found, _ = find_custom_opp()
    return found is not None and _registers(found, DISTILL_OP_NAME, DISTILL_GRAD_OP_NAME)


def _distill_reg_info(name, inputs, outputs, attrs, io_pattern):
    """reg_info with per-position dtypes: logits and gradients in the IO dtype, stats and dloss float32."""
    from mindspore.ops import DataType
    formats = tuple(tuple(io if is_io else DataType.F32_Default for is_io in io_pattern)
                    for io in (DataType.F32_Default, DataType.F16_Default, DataType.BF16_Default))
    return custom_reg_info(name, "Ascend", inputs, outputs, formats=formats, attrs=attrs, required=True)


def _stats_shape(s, *_):
    return list(s[:-1]) + [DISTILL_STATS]


def _stats_dtype(*_):
    return ms.float32


#: The distillation operators' attributes after (temperature, beta), in declaration order
#: (custom_ops/ascend/distill_custom.json): what ``_distill_math.Variant`` says, the divergence as its code.
_DISTILL_VARIANT_ATTRS = (("divergence", "int"), ("alpha", "float"), ("softcap", "float"), ("logit_scale", "float"))


def _variant_attrs(variant):
    """(divergence code, alpha, softcap, logit_scale) of ``variant`` as the operators take them."""
    variant = variant if variant is not None else _distill_math.KL
    return (_distill_math.DIVERGENCES.index(variant.divergence), float(variant.alpha), float(variant.softcap),
            float(variant.logit_scale))


class _DistillKernelForward(nn.Cell):
    """DistillCustom with its attributes bound: (student, teacher) -> float32 stats [..., 8]."""

    def __init__(self, temperature, beta, variant=None):
        super().__init__()
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.divergence, self.alpha, self.softcap, self.logit_scale = _variant_attrs(variant)
        self.op = ops.Custom(DISTILL_OP_NAME, out_shape=_stats_shape, out_dtype=_stats_dtype, func_type="aot",
                             reg_info=_distill_reg_info(DISTILL_OP_NAME, ("student", "teacher"), ("stats",),
                                                        (("temperature", "float"), ("beta", "float"))
                                                        + _DISTILL_VARIANT_ATTRS,
                                                        (True, True, False)))

    def construct(self, student, teacher):
        return self.op(student, teacher, self.temperature, self.beta, self.divergence, self.alpha, self.softcap,
                       self.logit_scale)


class _DistillKernelBackward(nn.Cell):
    """DistillCustomGrad: (student, teacher, stats, dloss) -> (d_student, d_teacher); d_teacher is a one-element
    placeholder the kernel never writes when ``teacher_grad`` is False (MindSpore cannot copy 0-element outputs)."""

    def __init__(self, temperature, beta, teacher_grad, variant=None):
        super().__init__()
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.teacher_grad = bool(teacher_grad)
        self.divergence, self.alpha, self.softcap, self.logit_scale = _variant_attrs(variant)
        if teacher_grad:
            out_shape = lambda s, t, *_: (s, t)  # noqa: E731
        else:
            out_shape = lambda s, t, *_: (s, [1])  # noqa: E731
        self.op = ops.Custom(DISTILL_GRAD_OP_NAME, out_shape=out_shape, out_dtype=lambda s, t, *_: (s, t),
                             func_type="aot",
                             reg_info=_distill_reg_info(DISTILL_GRAD_OP_NAME,
                                                        ("student", "teacher", "stats", "dloss"),
                                                        ("d_student", "d_teacher"),
                                                        (("temperature", "float"), ("beta", "float"))
                                                        + _DISTILL_VARIANT_ATTRS + (("teacher_grad", "bool"),),
                                                        (True, True, False, False, True, True)))

    def construct(self, student, teacher, stats, dloss):
        return self.op(student, teacher, stats, dloss, self.temperature, self.beta, self.divergence, self.alpha,
                       self.softcap, self.logit_scale, self.teacher_grad)


class AscendCDistillKernels:
    """Factory of the two distillation kernel Cells; the CPU tests substitute one whose Cells run the kernel
    sources on the AscendC stand-in (tests/ascend/distill_sim.py).

    Contract (student and teacher of one shape [..., V] and one dtype: float32, float16 or bfloat16; V >= 1):
      forward(temperature, beta, variant)(s, t) -> float32 stats [..., 8]; stats[..., 0] is each row's loss
      (T^2 times the divergence of beta and ``variant``: every divergence of ``_distill_math.DIVERGENCES``, on the
      logits transformed by the variant's softcap / logit_scale), the rest is what the backward reads;
      backward(temperature, beta, teacher_grad, variant)(s, t, stats, dloss) -> (d_student, d_teacher), dloss
      float32 [...]; rows with dloss == 0 get exact zeros; d_teacher is a one-element placeholder when teacher_grad
      is False.
    """

    dtypes = (ms.float16, ms.bfloat16, ms.float32)

    def unsupported(self, variant):
        """Why the AscendC operators cannot compute ``variant`` (None: they can: every divergence and transform)."""
        return None

    def forward(self, temperature, beta, variant=None):
        return _DistillKernelForward(temperature, beta, variant)

    def backward(self, temperature, beta, teacher_grad, variant=None):
        return _DistillKernelBackward(temperature, beta, teacher_grad, variant)


def distill_rows_op(temperature=1.0, beta=0.0, teacher_grad=True, kernels=None, variant=None):
    """Cell (student, teacher) -> float32 per-row distillation loss [...] on the AscendC kernels, differentiable
    for both logits (one backward launch writes both gradients; with ``teacher_grad=False`` the teacher gets
    zeros and the kernel does no teacher work).

    The caller (``ms_kldiv.distillation``) applies ignored rows and the reduction to the row losses (O(rows)
    work): ``where(keep, rows, 0)`` makes their incoming gradient 0, which the kernel turns into exact zero
    gradients without reading those rows. Second order goes through plain MindSpore ops (the closed-form
    gradients of ``ms_kldiv._distill_math``, differentiated). The caller routes what the kernels do not take:
    float64 logits (no float64 on the vector units), V == 0 or no rows, shapes that differ (broadcasting), and a
    package without the distillation operators (``distill_ops_installed()``). ``variant``: the divergence and the
    logits' transform (``ms_kldiv._distill_math.Variant``, default the 'kl' family on the raw logits)."""
    return distill.rows_op(kernels or AscendCDistillKernels(), temperature, beta, teacher_grad,
                           variant=variant if variant is not None else _distill_math.KL)


# ------------------------------------------------------------ stored-teacher distillation (SparseDistillCustom)
SPARSE_OP_NAME = "SparseDistillCustom"
SPARSE_GRAD_OP_NAME = "SparseDistillCustomGrad"
#: The most teacher ids per row the kernels take (custom_ops/ascend/op_kernel/sparse_tiling_plan.h kMaxIds): the
#: id lanes live in the unified buffer next to the vocabulary tiles. More go to the composite kernels.
SPARSE_MAX_IDS = 4000


def sparse_ops_installed():
    """True if the installed vendor package (see ``find_custom_opp``) also registers the stored-teacher operators
    (packages built before they existed do not)."""
    found, _ = find_custom_opp()
    return found is not None and _registers(found, SPARSE_OP_NAME, SPARSE_GRAD_OP_NAME)


def _sparse_reg_info(name, inputs, outputs, kinds):
    """reg_info with per-position dtypes, ``kinds`` one letter a position: 'io' the logits' dtype (float32, float16,
    bfloat16), 'i' int32, 'f' float32."""
    from mindspore.ops import DataType
    fixed = {"i": DataType.I32_Default, "f": DataType.F32_Default}
    formats = tuple(tuple(io if kind == "io" else fixed[kind] for kind in kinds)
                    for io in (DataType.F32_Default, DataType.F16_Default, DataType.BF16_Default))
    return custom_reg_info(name, "Ascend", inputs, outputs, formats=formats, required=True,
                           attrs=(("temperature", "float"), ("ratio", "float"), ("beta", "float"), ("tail", "bool")))


def _sparse_fallback_fn(s_shape, ids_shape):
    """True where the AscendC kernels are not launched: no rows (known at compile time) or more than SPARSE_MAX_IDS
    ids a row. Unknown dims (None or negative) launch them."""
    rows = 1
    for d in tuple(s_shape)[:-1]:
        if d is None or d < 0:
            rows = None
            break
        rows *= d
    k = tuple(ids_shape)[-1] if len(ids_shape) else None
    return rows == 0 or (k is not None and k > SPARSE_MAX_IDS)


_sparse_fallback = constexpr(_sparse_fallback_fn, check=False)


class _SparseKernelForward(nn.Cell):
    """SparseDistillCustom with its attributes bound: (s, ids int32, values float32) -> float32 stats [..., 8].
    No rows, or more ids a row than the kernels hold, take ``fallback`` (the composite kernels' forward; the
    backward makes the same choice from the same shapes, so it gets the stats it expects)."""

    def __init__(self, hyper, fallback):
        super().__init__()
        temperature, ratio, beta, tail = hyper
        self.temperature = float(temperature)
        self.ratio = float(ratio)
        self.beta = float(beta)
        self.tail = bool(tail)
        self.fallback = fallback
        self.op = ops.Custom(SPARSE_OP_NAME, out_shape=_stats_shape, out_dtype=_stats_dtype, func_type="aot",
                             reg_info=_sparse_reg_info(SPARSE_OP_NAME, ("student", "ids", "values"), ("stats",),
                                                       ("io", "i", "f", "f")))

    def construct(self, s, ids, values):
        if _sparse_fallback(ops.shape(s), ops.shape(ids)):
            return self.fallback(s, ids, values)
        return self.op(s, ids, values, self.temperature, self.ratio, self.beta, self.tail)


class _SparseKernelBackward(nn.Cell):
    """SparseDistillCustomGrad: (s, ids, values, stats, dloss) -> d_student (the logits' shape and dtype)."""

    def __init__(self, hyper, fallback):
        super().__init__()
        temperature, ratio, beta, tail = hyper
        self.temperature = float(temperature)
        self.ratio = float(ratio)
        self.beta = float(beta)
        self.tail = bool(tail)
        self.fallback = fallback
        self.op = ops.Custom(SPARSE_GRAD_OP_NAME, out_shape=_first_dtype, out_dtype=_first_dtype, func_type="aot",
                             reg_info=_sparse_reg_info(SPARSE_GRAD_OP_NAME,
                                                       ("student", "ids", "values", "stats", "dloss"),
                                                       ("d_student",), ("io", "i", "f", "f", "f", "io")))

    def construct(self, s, ids, values, stats, dloss):
        if _sparse_fallback(ops.shape(s), ops.shape(ids)):
            return self.fallback(s, ids, values, stats, dloss)
        return self.op(s, ids, values, stats, dloss, self.temperature, self.ratio, self.beta, self.tail)


class AscendCSparseKernels:
    """Factory of the two stored-teacher kernel Cells (contract: ``ms_kldiv.backends.base``, 'sparse_distillation');
    the CPU tests substitute one whose Cells run the kernel sources on the AscendC stand-in
    (tests/ascend/sparse_sim.py).

    Contract (student logits [..., V] in float32, float16 or bfloat16, V >= 1; ids int32 [..., K], negative:
    padding; values float32 [..., K]; one leading shape):
      forward(temperature, ratio, beta, tail)(s, ids, values) -> float32 stats [..., 8] (sparse::Stat of
      custom_ops/common/sparse_math.h); stats[..., 0] is each row's loss, NaN for a row with an id >= V, a repeated
      id or no teacher distribution;
      backward(temperature, ratio, beta, tail)(s, ids, values, stats, dloss) -> d_student, dloss float32 [...];
      rows with dloss == 0 get exact zeros.
    float64 logits are not in ``dtypes`` (no float64 on the vector units): the caller takes the composite kernels.
    No rows, or more than SPARSE_MAX_IDS ids a row, run the composite kernels inside the Cells.
    """

    dtypes = (ms.float16, ms.bfloat16, ms.float32)

    def __init__(self, fallback=None):
        self.fallback = fallback or CompositeSparseKernels("Ascend")

    def forward(self, temperature, ratio, beta, tail):
        hyper = (temperature, ratio, beta, tail)
        return _SparseKernelForward(hyper, self.fallback.forward(*hyper))

    def backward(self, temperature, ratio, beta, tail):
        hyper = (temperature, ratio, beta, tail)
        return _SparseKernelBackward(hyper, self.fallback.backward(*hyper))


# ------------------------------------------------------------------------------------------- backends
class AscendAotBackend(Backend):
    name = "aot"
    description = "AscendC operators KlDivCustom/KlDivCustomGrad (custom_ops/ascend), fused forward and backward"
    preference = {"Ascend": 100}
    ops = ("kl_div", "distillation", "sparse_distillation")

    def unavailable_reason(self, device, op="kl_div"):
        reason = super().unavailable_reason(device, op)
        if reason is not None:
            return reason
        found, searched = find_custom_opp()
        if found is None:
            where = ", ".join(searched) if searched else "ASCEND_CUSTOM_OPP_PATH and ASCEND_OPP_PATH are unset"
            return (f"the AscendC custom-op package ({OP_NAME}, {GRAD_OP_NAME}) is not installed; build and install "
                    f"it with custom_ops/ascend/build.sh --install, or point ASCEND_CUSTOM_OPP_PATH at its "
                    f"vendors/{VENDOR} directory (searched: {where})")
        if op == "distillation" and not distill_ops_installed():
            return (f"the installed AscendC package ({found}) predates the distillation operators "
                    f"({DISTILL_OP_NAME}, {DISTILL_GRAD_OP_NAME}); rebuild it with custom_ops/ascend/build.sh --install")
        if op == "sparse_distillation" and not sparse_ops_installed():
            return (f"the installed AscendC package ({found}) predates the stored-teacher operators "
                    f"({SPARSE_OP_NAME}, {SPARSE_GRAD_OP_NAME}); rebuild it with custom_ops/ascend/build.sh --install")
        return None

    def make_op(self, reduction, log_target):
        return aot_op(reduction, log_target)

    def distill_kernels(self, device):
        return AscendCDistillKernels()

    def sparse_kernels(self, device):
        return AscendCSparseKernels()


class AscendNativeBackend(Backend):
    name = "native"
    description = "MindSpore's aclnnKlDiv for the value, with both gradients (MindSpore's gives 0 for target)"
    preference = {"Ascend": 50}

    def make_op(self, reduction, log_target):
        return native_op(reduction, log_target)


register(AscendAotBackend())
register(AscendNativeBackend())
