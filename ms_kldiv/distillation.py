"""Knowledge-distillation loss from raw logits, built on :func:`ms_kldiv.kl_div` (whichever backend is fastest).

Why a dedicated function: the usual hand-written version (``kl_div(log_softmax(s/T), softmax(t/T)) * T**2``)
has three traps that this one avoids. It feeds probabilities, whose logarithm the loss then recomputes less
accurately than ``log_softmax`` gives it (and in float16, probabilities below 6e-8 become 0); it uses 'mean',
which divides by the number of classes as well as the batch; and with MindSpore's ``ops.kl_div`` the teacher
gets no gradient, which silently breaks trainable teachers and mutual learning.
"""
import math

import mindspore as ms
from mindspore import Tensor, nn, ops

from . import _validation
from .functional import kl_div

_NAME = "distillation_loss"


def _check_temperature(temperature, name):
    # bool is an int subclass; True as a temperature is always a mistake.
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"For '{name}', 'temperature' must be a positive finite int or float, "
                        f"but got {type(temperature).__name__}: {temperature!r}.")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"For '{name}', 'temperature' must be a positive finite number, but got {temperature!r}.")


def _check_args(student_logits, teacher_logits, temperature, reduction, name):
    """All checks, before anything runs; returns the promoted dtype. Plain Python, so it also runs at graph
    compile time."""
    _check_temperature(temperature, name)
    _validation.check_reduction(reduction, True, name)
    for arg_name, value in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(value, Tensor):
            raise TypeError(f"For '{name}', '{arg_name}' must be a mindspore.Tensor, but got {type(value).__name__}.")
        if value.dtype not in _validation.FLOAT_DTYPES:
            raise TypeError(f"For '{name}', '{arg_name}' must have a floating dtype "
                            f"(float16, bfloat16, float32, float64), but got {value.dtype}.")
        if value.ndim < 1:
            raise ValueError(f"For '{name}', '{arg_name}' must have at least 1 dimension (the classes on the "
                             f"last axis), but got a 0-d Tensor.")
    _validation.kldiv_broadcast_shape(ops.shape(student_logits), ops.shape(teacher_logits), name,
                                      ("student_logits", "teacher_logits"))
    return _validation.promote(student_logits.dtype, teacher_logits.dtype)


def _log_probs(logits, temperature, compute_dtype):
    if logits.dtype != compute_dtype:
        logits = ops.cast(logits, compute_dtype)
    if temperature != 1:
        logits = logits / temperature
    if compute_dtype == ms.float64:
        # MindSpore's CPU LogSoftmax computes float64 at float32 accuracy (~3e-6 error, measured in 2.10).
        return _log_softmax_exact(logits)
    # log_softmax subtracts the row max, so large logits do not overflow, and -inf (masked) logits stay -inf.
    return ops.log_softmax(logits, -1)


def _log_softmax_exact(z):
    # The shift cancels in the gradient (softmax sums to 1), so it is a constant to autodiff; that also keeps
    # amax's tie-breaking gradient out of the picture.
    m = ops.stop_gradient(ops.amax(z, -1, True))
    shifted = z - m
    return shifted - ops.log(ops.sum(ops.exp(shifted), -1, keepdim=True))


def _distill(student_logits, teacher_logits, temperature, reduction, backend, dtype):
    # Half types: softmax in float16 loses most of the tail mass the student learns from, so compute in float32
    # (kl_div widens half types internally anyway) and cast the result back.
    compute_dtype = ms.float32 if dtype in _validation.HALF_DTYPES else dtype
    log_p_student = _log_probs(student_logits, temperature, compute_dtype)
    log_p_teacher = _log_probs(teacher_logits, temperature, compute_dtype)
    # A 1-D logits vector is a single distribution: a batch of one, so 'batchmean' is its sum.
    kl_reduction = "sum" if (reduction == "batchmean" and student_logits.ndim == 1) else reduction
    loss = kl_div(log_p_student, log_p_teacher, reduction=kl_reduction, log_target=True, backend=backend)
    if temperature != 1:
        loss = loss * (temperature * temperature)
    # kl_div returns compute_dtype; decided from the constants rather than loss.dtype, which a custom op's
    # Python type inference leaves unknown until run time in a dynamic-shape graph.
    if compute_dtype != dtype:
        loss = ops.cast(loss, dtype)
    return loss


def distillation_loss(student_logits, teacher_logits, temperature=1.0, reduction="batchmean", *, backend="auto"):
    r"""
    Knowledge-distillation loss (Hinton et al., 2015) from raw logits: the temperature-scaled KL divergence
    from the teacher's distribution to the student's, over the last axis.

    .. math::
        \begin{aligned}
        q &= \operatorname{softmax}(z_{teacher} / T), \qquad
        \log p = \operatorname{log\_softmax}(z_{student} / T) \\
        \ell &= T^2 \sum_{c} q_c \,(\log q_c - \log p_c)
              = T^2 \cdot \mathrm{KL}(q \,\|\, p)
        \end{aligned}

    Soft-target gradients shrink as :math:`1/T^2`; the :math:`T^2` factor keeps their scale roughly independent
    of :math:`T`, so the loss can be mixed with a cross-entropy term without retuning the weight. Both
    log-distributions come from a numerically stable ``log_softmax`` and are passed to :func:`ms_kldiv.kl_div`
    with ``log_target=True``, so the teacher's log-probabilities are used as computed and the fastest
    available backend does the work.

    Gradients flow to **both** `student_logits` and `teacher_logits` (trainable teachers, mutual learning).
    Call ``ops.stop_gradient`` on the teacher logits for classic distillation from a frozen teacher.

    Masked classes (logit :math:`-\infty`, e.g. padded vocabulary entries):

    - masked in the teacher: :math:`q_c = 0`, so the class contributes exactly 0 to the loss and to both
      gradients, whatever the student says;
    - masked in both: 0, with no NaN in the loss or the gradients;
    - masked only in the student while the teacher gives it mass: the loss is :math:`+\infty`, as the
      mathematics says (the student rules out an outcome the teacher considers possible); the gradient
      reaching the teacher is then not finite either. Mask both sides the same way.

    A row whose logits are all :math:`-\infty` has no distribution and gives NaN.

    Args:
        student_logits (Tensor): Logits of the student, classes on the last axis. float16, bfloat16, float32
            or float64, at least 1-D.
        teacher_logits (Tensor): Logits of the teacher, broadcastable with `student_logits`.
        temperature (Union[int, float], optional): Softmax temperature :math:`T > 0`. Default: ``1.0``.
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'batchmean'`` | ``'sum'``, as in
            :func:`ms_kldiv.kl_div`. ``'batchmean'`` (the KL divergence per sample) divides the sum by
            ``student_logits.shape[0]``; a 1-D `student_logits` is one sample. ``'mean'`` also divides by the
            number of classes. Default: ``'batchmean'``.
        backend (str, optional): Implementation of the KL divergence, as in :func:`ms_kldiv.kl_div`.
            Default: ``'auto'``.

    Returns:
        Tensor of the promoted dtype of the two logits: the broadcast shape for ``'none'``, else 0-d.
        float16/bfloat16 logits are computed in float32 and the result is cast back.

    Raises:
        TypeError: If a logits argument is not a floating-point Tensor, `temperature` is not an int or float,
            or `reduction` is not a str.
        ValueError: If `temperature` is not positive and finite, `reduction` or `backend` is unknown, a logits
            Tensor is 0-d, or the shapes do not broadcast.
        RuntimeError: If the requested `backend` cannot run on the current device target.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import ms_kldiv
        >>> student = ms.Tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], ms.float32)
        >>> teacher = ms.Tensor([[2.0, 1.0, 0.0], [0.5, -2.0, 4.0]], ms.float32)
        >>> loss = ms_kldiv.distillation_loss(student, teacher, temperature=2.0)
        >>> print(loss.shape, loss.dtype, f"{float(loss):.4f}")
        () Float32 0.2661
    """
    dtype = _check_args(student_logits, teacher_logits, temperature, reduction, _NAME)
    return _distill(student_logits, teacher_logits, temperature, reduction, backend, dtype)


class DistillationLoss(nn.Cell):
    r"""
    The ``nn.Cell`` form of :func:`ms_kldiv.distillation_loss`:
    :math:`T^2 \cdot \mathrm{KL}(\operatorname{softmax}(z_t/T) \,\|\, \operatorname{softmax}(z_s/T))`.

    Args:
        temperature (Union[int, float], optional): Softmax temperature :math:`T > 0`. Default: ``1.0``.
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'batchmean'`` | ``'sum'``. Default: ``'batchmean'``.
        backend (str, optional): Implementation, as in :func:`ms_kldiv.kl_div`. Default: ``'auto'``.

    Inputs:
        - **student_logits** (Tensor) - Logits of the student, classes on the last axis.
        - **teacher_logits** (Tensor) - Logits of the teacher, broadcastable with `student_logits`.

    Outputs:
        Tensor of the promoted dtype: the broadcast shape for ``'none'``, else a 0-d Tensor.

    Raises:
        TypeError, ValueError: As :func:`ms_kldiv.distillation_loss`; argument errors are raised by the
            constructor, input errors at the call (or at graph compile time).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, temperature=1.0, reduction="batchmean", *, backend="auto"):
        super().__init__()
        _check_temperature(temperature, "DistillationLoss")
        _validation.check_reduction(reduction, True, "DistillationLoss")
        self.temperature = float(temperature)
        self.reduction = reduction
        self.backend = backend

    def construct(self, student_logits, teacher_logits):
        dtype = _check_args(student_logits, teacher_logits, self.temperature, self.reduction, "DistillationLoss")
        return _distill(student_logits, teacher_logits, self.temperature, self.reduction, self.backend, dtype)

    def extend_repr(self):
        return f"temperature={self.temperature}, reduction={self.reduction!r}, backend={self.backend!r}"
