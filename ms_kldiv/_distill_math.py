"""Distillation from logits, value and both gradients in closed form, in MindSpore ops: what a fused kernel computes
for a block of rows, written once for the chunked head (``ms_kldiv.fused_linear``), which needs d(logits) without
autodiff (its chunks run inside a Cell's forward, where MindSpore records no gradient).

For rows of student logits s and teacher logits t, P_s = softmax(s/T), P_t = softmax(t/T), the loss is
T^2 * D_beta summed over the rows (``ms_kldiv.reference.distillation_pointwise`` is the float64 twin):

    beta = 0:      D = KL(P_t || P_s)
    beta = 1:      D = KL(P_s || P_t)
    0 < beta < 1:  D = beta KL(P_t || M) + (1 - beta) KL(P_s || M),  M = beta P_t + (1 - beta) P_s

With u = the pointwise terms that depend on P_s through P_s itself (a = P_s * dD/dP_s, written below per case), the
softmax's Jacobian gives d(T^2 D)/ds = T (a - P_s sum(a)), and likewise for t with b = P_t * dD/dP_t:

    beta = 0:      a = -P_t (so d/ds = T (P_s - P_t)),         b = P_t (log P_t - log P_s)
    beta = 1:      a = P_s (log P_s - log P_t),                b = -P_s (d/dt = T (P_t - P_s))
    0 < beta < 1:  a = (1 - beta) P_s (log P_s - log M),       b = beta P_t (log P_t - log M)

Entries with P = 0 (a -inf logit, a padded vocabulary entry) contribute exactly 0 to every term.
"""
import math

import mindspore as ms
from mindspore import ops
from mindspore.ops import constexpr

from .functional import kl_div

_NEG_INF = float("-inf")


@constexpr
def _constants(temperature, beta):
    # In Python, at full precision: graph mode holds float constants (and their arithmetic) as float32.
    logs = (math.log(beta), math.log1p(-beta)) if 0 < beta < 1 else (0.0, 0.0)
    return tuple(ms.Tensor(v, ms.float64) for v in (1.0 / temperature, temperature, temperature * temperature,
                                                     beta, 1.0 - beta) + logs)


def _pointwise_kl(log_q, log_p):
    """p (log p - log q) elementwise, exactly 0 where p is 0: kl_div's pointwise loss in log space (its fastest
    backend, with the zero-mass rule)."""
    return kl_div(log_q, log_p, reduction="none", log_target=True)


def _log_softmax_plain(z):
    # Plain ops, differentiable to any order (MindSpore's LogSoftmaxGrad has no bprop); the shift is a constant.
    shifted = z - ops.stop_gradient(ops.amax(z, -1, True))
    return shifted - ops.log(ops.sum(ops.exp(shifted), -1, keepdim=True))


def loss_and_grads(student, teacher, temperature, beta, keep, want_teacher, differentiable=False):
    """(T^2 * sum over kept rows of D_beta, d/d student, d/d teacher or None) for 2-D logits [R, V] in one float
    dtype; ``keep`` is a [R] bool mask of counted rows. ``differentiable``: the gradients will be differentiated
    again (the fused kernels' second order), so the log-softmax is written in plain ops."""
    inv_t, t_lin, t_sq, w_t, w_s, log_w_t, log_w_s = [ops.cast(v, student.dtype)
                                                       for v in _constants(temperature, beta)]
    log_softmax = _log_softmax_plain if differentiable else (lambda z: ops.log_softmax(z, -1))
    log_ps = log_softmax(student * inv_t)
    log_pt = log_softmax(teacher * inv_t)
    ps, pt = ops.exp(log_ps), ops.exp(log_pt)
    rows = ops.expand_dims(ops.cast(keep, student.dtype), -1)
    if beta == 0:
        b = _pointwise_kl(log_ps, log_pt)
        terms, d_student = b, t_lin * (ps - pt)
    elif beta == 1:
        a = _pointwise_kl(log_pt, log_ps)
        terms, d_student = a, t_lin * (a - ps * ops.sum(a, -1, keepdim=True))
        b = -ps
    else:
        both = ops.logical_and(ps == 0, pt == 0)
        x = ops.where(both, 0.0, log_pt) + log_w_t
        y = ops.where(both, 0.0, log_ps) + log_w_s
        m = ops.maximum(x, y)
        log_m = ops.where(both, _NEG_INF, m + ops.log(ops.exp(x - m) + ops.exp(y - m)))
        a = w_s * _pointwise_kl(log_m, log_ps)
        b = w_t * _pointwise_kl(log_m, log_pt)
        terms, d_student = a + b, t_lin * (a - ps * ops.sum(a, -1, keepdim=True))
    loss = t_sq * ops.sum(ops.sum(terms, -1) * ops.cast(keep, student.dtype))
    d_teacher = t_lin * (b - pt * ops.sum(b, -1, keepdim=True)) * rows if want_teacher else None
    return loss, d_student * rows, d_teacher


def cross_entropy_and_grad(logits, labels, keep):
    """(sum over kept rows of -log softmax(logits)[label], its gradient): the hard-label term."""
    log_p = ops.log_softmax(logits, -1)
    hit = ops.logical_and(ops.expand_dims(keep, 1),
                          ops.arange(logits.shape[-1], dtype=labels.dtype) == ops.expand_dims(labels, 1))
    loss = -ops.sum(ops.where(hit, log_p, 0.0))
    grad = (ops.exp(log_p) - ops.cast(hit, logits.dtype)) * ops.expand_dims(ops.cast(keep, logits.dtype), -1)
    return loss, grad
