"""The ``nn.Cell`` face of :func:`ms_kldiv.kl_div`."""
from mindspore import nn

from .. import _validation
from .._compat import FullPrecisionCell
from ..backends import compiled, get_op, resolve
from ..functional import promoted_operands


class KLDivLoss(FullPrecisionCell, nn.Cell):
    r"""
    Kullback-Leibler divergence loss, a drop-in for ``mindspore.mint.nn.KLDivLoss`` that runs on every
    device target, supports broadcasting and `log_target`, and differentiates both `input` and `target`.

    .. math::
        \ell(x, t) = t \cdot (\log t - x) \quad\text{or, with log_target,}\quad e^{t} \cdot (t - x)

    Terms with no target mass (:math:`t \le 0`, or :math:`t = -\infty` with `log_target`) contribute 0.

    Args:
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'batchmean'`` | ``'sum'``. Default: ``'mean'``.
        log_target (bool, optional): Whether `target` is given in log space. Default: ``False``.
        backend (str, optional): Implementation, as in :func:`ms_kldiv.kl_div`. Default: ``'auto'``.
        size_average, reduce (bool, optional): Deprecated PyTorch arguments; they override `reduction`.

    Inputs:
        - **input** (Tensor) - Log-probabilities, float16/bfloat16/float32/float64.
        - **target** (Tensor) - Probabilities (or log-probabilities), broadcastable with `input`.

    Outputs:
        Tensor of the promoted dtype: the broadcast shape for ``'none'``, else a 0-d Tensor.

    Raises:
        TypeError, ValueError, RuntimeError: As :func:`ms_kldiv.kl_div`; argument errors are raised by the
            constructor, input errors at the call (or at graph compile time).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import ms_kldiv
        >>> loss = ms_kldiv.KLDivLoss(reduction='mean')
        >>> x = ms.Tensor([0.2, 0.7, 0.1], ms.float32)
        >>> t = ms.Tensor([0., 1., 0.], ms.float32)
        >>> print(loss(x, t))
        -0.23333333
    """

    def __init__(self, reduction="mean", log_target=False, *, backend="auto", size_average=None, reduce=None):
        super().__init__()
        reduction = _validation.legacy_reduction(size_average, reduce, reduction, "KLDivLoss")
        _validation.check_reduction(reduction, log_target, "KLDivLoss")
        _validation.check_backend(backend, "KLDivLoss")
        self.reduction = reduction
        self.log_target = log_target
        self.backend = backend
        resolve(backend, caller="KLDivLoss")  # an unknown or unusable backend is named for this Cell, here
        # Resolved (and the primitives created) once, for the device target set at construction: one op for
        # PyNative calls and one for compiled graphs (see Backend.make_graph_op).
        self.op = get_op(backend, reduction, log_target)
        self.graph_op = get_op(backend, reduction, log_target, graph=True)

    def construct(self, input, target):
        op = self.graph_op if compiled(input) else self.op
        return op(*promoted_operands(input, target, "KLDivLoss"))

    def extend_repr(self):
        return f"reduction={self.reduction!r}, log_target={self.log_target}, backend={self.backend!r}"
