"""The functional API: validation, then dispatch to the backend chosen for the current device target."""
from mindspore import ops

from . import _validation
from .backends import compiled, get_op


def kl_div(input, target, reduction="mean", log_target=False, *, backend="auto", size_average=None, reduce=None):
    r"""
    Computes the Kullback-Leibler divergence loss between `input` (log-probabilities) and `target`.

    .. math::
        \ell(x, t) = t \cdot (\log t - x) \quad\text{or, with log_target,}\quad e^{t} \cdot (t - x)

    Terms whose target carries no probability mass (:math:`t \le 0`, or :math:`t = -\infty` with
    `log_target`) contribute exactly 0 to the loss and to both gradients, whatever `input` is.

    Args:
        input (Tensor): Log-probabilities. float16, bfloat16, float32 or float64.
        target (Tensor): Probabilities (or log-probabilities if `log_target`); broadcastable with `input`.
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'batchmean'`` | ``'sum'``. ``'batchmean'``
            divides the sum by ``input.shape[0]`` and is the mathematical KL divergence. Default: ``'mean'``.
        log_target (bool, optional): Whether `target` is given in log space. Default: ``False``.
        backend (str, optional): ``'auto'`` (fastest available on this device), ``'composite'``, ``'aot'``,
            ``'akg'`` or another name from :func:`ms_kldiv.backend_names`. Default: ``'auto'``.
        size_average, reduce (bool, optional): Deprecated PyTorch arguments; they override `reduction`.

    Returns:
        Tensor of the promoted dtype of `input` and `target`: the broadcast shape for ``'none'``, else 0-d.

    Raises:
        TypeError: If `input` or `target` is not a floating-point Tensor, `reduction` is not a str, or
            `log_target` is not a bool.
        ValueError: If `reduction` or `backend` is unknown, or the shapes do not broadcast.
        RuntimeError: If the requested `backend` cannot run on the current device target.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import ms_kldiv
        >>> x = ms.Tensor([[0.5, 0.5], [0.4, 0.6]], ms.float32)
        >>> t = ms.Tensor([[0., 1.], [1., 0.]], ms.float32)
        >>> print(ms_kldiv.kl_div(x, t, reduction='mean'))
        -0.225
    """
    reduction = _validation.legacy_reduction(size_average, reduce, reduction)
    _checked_options(reduction, log_target, backend)
    op = get_op(backend, reduction, log_target, compiled(input))
    return op(*promoted_operands(input, target))


_checked_tensors = _validation.on_host(_validation.check_tensors)


@_validation.on_host
def _checked_options(reduction, log_target, backend):
    _validation.check_reduction(reduction, log_target)
    _validation.check_backend(backend)


def promoted_operands(input, target, name="kl_div"):
    """Checked operands, both cast to their promoted float dtype (what every backend op receives)."""
    dtype = _checked_tensors(_validation.described(input), _validation.described(target), name)
    if input.dtype != dtype:
        input = ops.cast(input, dtype)
    if target.dtype != dtype:
        target = ops.cast(target, dtype)
    return input, target
