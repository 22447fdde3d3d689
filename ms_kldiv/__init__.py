"""ms_kldiv: a correct, fast Kullback-Leibler divergence loss for MindSpore on Ascend, GPU and CPU.

Usage::

    loss_fn = ms_kldiv.KLDivLoss(reduction='batchmean', log_target=True)   # nn.Cell
    loss = ms_kldiv.kl_div(input, target, reduction='mean')                # functional form
    ms_kldiv.backend_info(op=None)                                         # what runs on this device, and why
"""
from ._compat import check_mindspore as _check_mindspore
from ._env import check_settings as _check_settings, keep_cwd_clean as _keep_cwd_clean

_check_mindspore()  # an unsupported MindSpore fails here, with the supported range, not inside a kernel
_keep_cwd_clean()
_check_settings()

from . import backends  # noqa: E402
from .distillation import DistillationLoss, distillation_loss  # noqa: E402
from .functional import kl_div  # noqa: E402
from .fused_linear import FusedLinearDistillationLoss  # noqa: E402
from . import nn  # noqa: E402
from .nn import KLDivLoss  # noqa: E402
from .sparse_distillation import SparseDistillationLoss, sparse_distillation_loss  # noqa: E402

__version__ = "0.1.0"
__all__ = ["kl_div", "KLDivLoss", "nn", "distillation_loss", "DistillationLoss", "FusedLinearDistillationLoss",
           "sparse_distillation_loss", "SparseDistillationLoss", "backend_names", "backend_info"]


def backend_names():
    """Names accepted by ``backend=`` (besides ``'auto'``), whether or not they can run here."""
    return backends.names()


def backend_info(device=None, op="kl_div"):
    """One dict per backend for ``op`` on `device` (default: MindSpore's current device target): whether it is
    available, why not, its preference, and which one ``backend='auto'`` picks. ``op``: ``'kl_div'`` (kl_div,
    KLDivLoss), ``'distillation'`` (distillation_loss, DistillationLoss, FusedLinearDistillationLoss) or None for
    the rows of every op."""
    return backends.backend_info(device, op)
