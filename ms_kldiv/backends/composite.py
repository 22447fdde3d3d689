"""Backend 'composite': plain MindSpore ops, runs on every device target in every mode.

The pointwise math is ``ms_kldiv._math`` (the twin of ``custom_ops/common/kldiv_math.h``); the core's bprop
gives both gradients of the SPEC's table, and being plain ops that bprop is itself differentiable, which gives
second-order gradients. ``KLDivWrapper`` does the broadcasting and casts around it.
"""
import mindspore as ms

from . import register
from .base import Backend
from .common import KLDivWrapper, PointwiseCore


def composite_op(reduction, log_target, acc_dtype=None):
    """The composite op for one (reduction, log_target); sums accumulate in ``acc_dtype`` (default float64,
    float32 on Ascend, whose vector units have no float64)."""
    if acc_dtype is None:
        acc_dtype = ms.float32 if ms.get_context("device_target") == "Ascend" else ms.float64
    return KLDivWrapper(PointwiseCore(reduction != "none", log_target, acc_dtype), reduction)


class CompositeBackend(Backend):
    name = "composite"
    description = "plain MindSpore ops (runs on every device target)"
    preference = {"CPU": 0, "GPU": 0, "Ascend": 0}

    def unavailable_reason(self, device):
        return None

    def make_op(self, reduction, log_target):
        return composite_op(reduction, log_target)


register(CompositeBackend())
