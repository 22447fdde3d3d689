"""Chunked fused-linear distillation: a student's output head trained against a teacher without the N x V logits.

For an LLM student the logits are the largest tensor of a step (8192 tokens x 128K vocabulary is 4 GB in
float32, several times over once softmaxes and gradients are held). ``FusedLinearDistillationLoss`` takes the
hidden states and the head weights instead, and processes the rows in chunks: each chunk's logits come from
MindSpore's matmul (so Ascend's cube units and GPU BLAS do it), :func:`ms_kldiv.distillation_loss` gives the
chunk's loss and d(logits), and the chunk's contributions to d(hidden), d(weight) and d(bias) are accumulated
during the forward. Only one chunk of logits exists at a time; the backward scales the stored gradients.

The teacher's gradients (mutual learning, trainable teachers) are computed in the backward by a second chunked
pass, only where they are used: graph mode drops that work when nothing consumes the teacher's gradients
(frozen teacher); ``teacher_grad=False`` drops it in PyNative too.
"""
import mindspore as ms
from mindspore import Tensor, nn, ops

from . import _validation
from .backends import distill
from ._distill_math import cross_entropy_and_grad, loss_and_grads

_NAME = "FusedLinearDistillationLoss"
#: Default bound on one chunk's logits (student and teacher together), in bytes of float32.
CHUNK_BYTES = 64 * 2**20


def default_chunk_size(rows, vocab):
    """Rows per chunk so that a chunk's student and teacher logits take at most ``CHUNK_BYTES`` in float32."""
    return max(1, min(rows, CHUNK_BYTES // max(1, 2 * 4 * vocab)))


# The transposes as MatMul flags: ops.transpose would copy a [V, H] weight (or a chunk's [rows, V] gradient) every
# chunk, which cost more than the product itself.
_matmul_t = ops.MatMul(transpose_b=True)   # a @ b^T
_t_matmul = ops.MatMul(transpose_a=True)   # a^T @ b


class _FusedCore(nn.Cell):
    """(hidden states and heads of both models, labels, counted rows) -> (loss, the gradients of every input).

    Inputs are 2-D hidden states [N, H], weights [V, H], biases [V] (zeros when absent), labels [N] int32 and the
    number of counted rows. The rows go through in chunks: a chunk's logits come from MindSpore's matmul, the
    loss and d(logits) from the fused distillation kernels (``kernels``; None: the closed forms of
    ``_distill_math`` in MindSpore ops), and the chunk's contributions to the heads'
    gradients are accumulated at once, so one chunk of logits is alive at a time. This Cell's bprop hands out the
    stored gradients times the incoming gradient; its forward is not differentiated (in PyNative MindSpore runs a
    custom-bprop Cell's forward without recording it), which is what keeps the chunks' tensors from being held.
    """

    def __init__(self, temperature, beta, ignore_index, hard_weight, soft_weight, chunk_size, teacher_grad,
                 teacher_logits=False, kernels=None):
        super().__init__()
        self.fused = kernels is not None
        if self.fused:
            self.kernel_rows = kernels.forward(temperature, beta)
            self.kernel_student = kernels.backward(temperature, beta, False)
            self.kernel_teacher = kernels.backward_teacher(temperature, beta)
        self.temperature = temperature
        self.ignore_index = ignore_index
        self.beta = beta
        self.hard_weight = hard_weight
        self.soft_weight = soft_weight
        self.chunk_size = chunk_size
        self.teacher_grad = teacher_grad and not teacher_logits
        # The teacher given as logits [N, V] in place of its hidden states (its weight and bias are unused).
        self.teacher_logits = teacher_logits

    def _chunks(self, rows, vocab):
        if not isinstance(rows, int) or rows < 0:
            # A dynamic row count in graph mode: the compiler cannot unroll an unknown number of chunks, so the
            # rows are one chunk (same values and gradients; the memory saving needs static shapes or PyNative).
            return ((0, None),)
        size = self.chunk_size if self.chunk_size is not None else default_chunk_size(rows, vocab)
        return tuple((i, min(i + size, rows)) for i in range(0, rows, size))

    def construct(self, hs, ws, bs, ht, wt, bt, labels, count):
        f32 = ms.float32
        hs, ws, bs, ht, wt, bt = (v if v.dtype == f32 else ops.cast(v, f32) for v in (hs, ws, bs, ht, wt, bt))
        keep_all = labels != self.ignore_index
        # Scaled per chunk (a chunk's d(logits) is smaller than the [V, H] sums it feeds)
        scale = 1.0 / ops.maximum(count, 1.0)
        loss = ops.zeros((), f32)
        dhs, dht = (), ()
        dws, dbs = ops.zeros(ws.shape, f32), ops.zeros(bs.shape, f32)
        dwt, dbt = ops.zeros((), f32), ops.zeros((), f32)  # [V, H] / [V] once the teacher's gradients are wanted
        for lo, hi in self._chunks(hs.shape[0], ws.shape[0]):
            # Each chunk starts after the previous one is folded in: otherwise graph mode may run the chunks'
            # independent first steps together and hold every chunk's logits at once.
            hs_c, ht_c, keep = ops.depend(hs[lo:hi], dws), ops.depend(ht[lo:hi], dws), keep_all[lo:hi]
            s_c = _matmul_t(hs_c, ws) + bs
            t_c = ht_c if self.teacher_logits else _matmul_t(ht_c, wt) + bt
            if self.fused:
                # the kernels' incoming row gradient is the keep mask: ignored rows get exact zeros, unread
                stats, g = self.kernel_rows(s_c, t_c), ops.cast(keep, f32)
                soft = ops.sum(ops.where(keep, stats[:, 0], 0.0))
                ds = self.kernel_student(s_c, t_c, stats, g)[0]
                dt = self.kernel_teacher(s_c, t_c, stats, g) if self.teacher_grad else None
            else:
                soft, ds, dt = loss_and_grads(s_c, t_c, self.temperature, self.beta, keep, self.teacher_grad)
            loss = loss + soft * self.soft_weight
            ds = ds * (self.soft_weight * scale)
            if self.hard_weight != 0:
                hard, dce = cross_entropy_and_grad(s_c, ops.where(keep, labels[lo:hi], 0), keep)
                loss = loss + hard * self.hard_weight
                ds = ds + dce * (self.hard_weight * scale)
            dhs = dhs + (ops.matmul(ds, ws),)
            dws = dws + _t_matmul(ds, hs_c)
            dbs = dbs + ops.sum(ds, 0)
            if self.teacher_grad:
                dt = dt * (self.soft_weight * scale)
                dht = dht + (ops.matmul(dt, wt),)
                dwt = dwt + _t_matmul(dt, ht_c)
                dbt = dbt + ops.sum(dt, 0)
        dh_s = ops.concat(dhs, 0) if dhs else ops.zeros(hs.shape, f32)
        # (without teacher gradients these stay 0-d zeros: no [V, H] buffer is held for them)
        dh_t = ops.concat(dht, 0) if dht else ops.zeros((), f32)
        return loss * scale, dh_s, dws, dbs, dh_t, dwt, dbt

    def bprop(self, hs, ws, bs, ht, wt, bt, labels, count, out, dout):
        g = dout[0]
        _, dh_s, dw_s, db_s, dh_t, dw_t, db_t = out
        grads = (ops.cast(dh_s * g, hs.dtype), ops.cast(dw_s * g, ws.dtype), ops.cast(db_s * g, bs.dtype))
        if self.teacher_grad:
            grads += (ops.cast(dh_t * g, ht.dtype), ops.cast(dw_t * g, wt.dtype), ops.cast(db_t * g, bt.dtype))
        else:
            grads += (ops.zeros_like(ht), ops.zeros_like(wt), ops.zeros_like(bt))
        return grads + (ops.zeros_like(labels), ops.zeros_like(count))


class FusedLinearDistillationLoss(nn.Cell):
    r"""
    Distillation loss of a student's output head against a teacher's, computed chunk by chunk from the hidden
    states so that the N x V logits never exist.

    The soft term equals :func:`ms_kldiv.distillation_loss` of the two heads' logits with ``'batchmean'``::

        distillation_loss(student_hidden @ W_s^T + b_s, teacher_hidden @ W_t^T + b_t, temperature, 'batchmean',
                          beta=beta, labels=labels, ignore_index=ignore_index)

    and the optional hard term is the cross-entropy of the student's logits against `labels` (same ignored rows,
    mean over the counted rows). The loss is ``soft_weight * soft + hard_weight * hard``.

    Args:
        temperature (float, optional): Softmax temperature :math:`T > 0`. Default: ``1.0``.
        beta (float, optional): 0 forward KL, 1 reverse KL, in between the generalized Jensen-Shannon
            divergence, as in :func:`ms_kldiv.distillation_loss`. Default: ``0.0``.
        ignore_index (int, optional): Label value of rows that contribute nothing. Default: ``-100``.
        hard_weight (float, optional): Weight of the cross-entropy against `labels`. Default: ``0.0``.
        soft_weight (float, optional): Weight of the distillation term. Default: ``1.0``.
        chunk_size (int, optional): Rows per chunk. Default: ``None``, chosen so that one chunk's logits of
            both models take at most 64 MB in float32.
        teacher_grad (bool, optional): ``None`` (default) gives the teacher's hidden states, weight and bias
            their gradients, computed only when used (graph mode drops the work for a frozen teacher; PyNative
            always does it); ``False`` declares the teacher frozen (its gradients are zeros, no work).
        backend (str, optional): How a chunk's loss and d(logits) are computed: ``'aot'`` (the fused
            distillation kernels of the CPU library: no chunk x V temporaries besides the logits and their
            gradient), ``'composite'`` (closed forms in MindSpore ops, every device), ``'auto'`` (``'aot'`` where it
            runs, else ``'composite'``). Default: ``'auto'``.

    Inputs:
        - **student_hidden** (Tensor) - ``[N, H_s]`` or ``[B, S, H_s]``, float16/bfloat16/float32.
        - **student_weight** (Tensor) - ``[V, H_s]``, the head's weight as ``nn.Dense`` stores it.
        - **teacher_hidden** (Tensor) - ``[N, H_t]`` or ``[B, S, H_t]``.
        - **teacher_weight** (Tensor) - ``[V, H_t]``.
        - **labels** (Tensor, optional) - integer labels of the leading shape; required when ``hard_weight != 0``.
        - **student_bias**, **teacher_bias** (Tensor, optional) - ``[V]``; ``-inf`` entries mask vocabulary
          columns (padded vocabularies).

    Outputs:
        0-d float32 Tensor.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, temperature=1.0, *, beta=0.0, ignore_index=-100, hard_weight=0.0, soft_weight=1.0,
                 chunk_size=None, teacher_grad=None, backend="auto"):
        super().__init__()
        _validation.check_temperature(temperature, _NAME)
        _validation.check_number(beta, "beta", _NAME, 0.0, 1.0)
        _validation.check_number(hard_weight, "hard_weight", _NAME)
        _validation.check_number(soft_weight, "soft_weight", _NAME)
        _validation.check_int(ignore_index, "ignore_index", _NAME)
        if backend not in ("auto", "aot", "composite"):
            raise ValueError(f"For '{_NAME}', 'backend' must be 'auto', 'aot' or 'composite', but got {backend!r}.")
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise ValueError(f"For '{_NAME}', 'chunk_size' must be None or a positive int, but got {chunk_size!r}.")
        if teacher_grad not in (None, False, True):
            raise TypeError(f"For '{_NAME}', 'teacher_grad' must be None or a bool, but got {teacher_grad!r}.")
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.ignore_index = ignore_index
        self.hard_weight = float(hard_weight)
        self.soft_weight = float(soft_weight)
        self.chunk_size = chunk_size
        self.teacher_grad = teacher_grad is not False
        kernels = _kernels(backend)
        self.backend = "composite" if kernels is None else "aot"
        args = (self.temperature, self.beta, ignore_index, self.hard_weight, self.soft_weight, chunk_size)
        self.core = _FusedCore(*args, self.teacher_grad, kernels=kernels)
        self.core_from_logits = _FusedCore(*args, False, teacher_logits=True, kernels=kernels)

    def construct(self, student_hidden, student_weight, teacher_hidden, teacher_weight, labels=None,
                  student_bias=None, teacher_bias=None):
        _check_inputs(student_hidden, student_weight, teacher_hidden, teacher_weight, labels, student_bias,
                      teacher_bias, self.hard_weight, _NAME)
        return self._run(self.core, student_hidden, student_weight, student_bias, _rows(teacher_hidden),
                         teacher_weight, teacher_bias, labels)

    def from_teacher_logits(self, student_hidden, student_weight, teacher_logits, labels=None, student_bias=None):
        """The same loss with the teacher given as logits ``[N, V]`` (or ``[B, S, V]``) instead of its hidden
        states and head; the teacher is frozen (no gradient). Under GRAPH_MODE call it from a Cell's construct."""
        name = f"{_NAME}.from_teacher_logits"
        _check_inputs(student_hidden, student_weight, teacher_logits, None, labels, student_bias, None,
                      self.hard_weight, name)
        logits = ops.stop_gradient(_rows(teacher_logits))
        unused = ops.zeros((1, 1), ms.float32)
        return self._run(self.core_from_logits, student_hidden, student_weight, student_bias, logits, unused,
                         ops.zeros((1,), ms.float32), labels)

    def _run(self, core, student_hidden, student_weight, student_bias, teacher_rows, teacher_weight, teacher_bias,
             labels):
        hs = _rows(student_hidden)
        vocab = student_weight.shape[0]
        if labels is None:
            labels = ops.zeros((hs.shape[0],), ms.int32)
            count = ops.cast(ops.reshape(ops.dyn_shape(hs)[:1], ()), ms.float32)
        else:
            labels = ops.cast(ops.reshape(labels, (-1,)), ms.int32)
            count = ops.sum(ops.cast(labels != self.ignore_index, ms.float32))
        bs = ops.zeros((vocab,), student_weight.dtype) if student_bias is None else student_bias
        bt = ops.zeros((vocab,), teacher_weight.dtype) if teacher_bias is None else teacher_bias
        return core(hs, student_weight, bs, teacher_rows, teacher_weight, bt, labels, count)[0]

    def extend_repr(self):
        return (f"temperature={self.temperature}, beta={self.beta}, ignore_index={self.ignore_index}, "
                f"hard_weight={self.hard_weight}, soft_weight={self.soft_weight}, chunk_size={self.chunk_size}, "
                f"backend={self.backend!r}")


def _kernels(backend):
    """The fused distillation kernels for ``backend`` on the current device, or None for the composite math."""
    device = ms.get_context("device_target")
    if backend == "composite" or device not in ("CPU", "GPU"):
        if backend == "aot":
            raise RuntimeError(f"For '{_NAME}', backend 'aot' runs on CPU and GPU only; use 'auto' or 'composite'.")
        return None
    kernels = distill.aot_kernels(device)
    if kernels is None and backend == "aot":
        raise RuntimeError(f"For '{_NAME}', backend 'aot' needs the {device} kernel library, which is not available "
                           "(see ms_kldiv.backend_info()).")
    return kernels


def _rows(hidden):
    return ops.reshape(hidden, (-1, hidden.shape[-1])) if hidden.ndim != 2 else hidden


def _check_inputs(hs, ws, ht, wt, labels, bs, bt, hard_weight, name):
    """Every argument check, before anything runs. ``wt`` None: ``ht`` holds the teacher's logits."""
    tensors = (("student_hidden", hs), ("student_weight", ws), ("teacher_hidden" if wt is not None else
                                                                  "teacher_logits", ht))
    for arg, value in tensors + ((("teacher_weight", wt),) if wt is not None else ()):
        if not isinstance(value, Tensor):
            raise TypeError(f"For '{name}', '{arg}' must be a mindspore.Tensor, but got {type(value).__name__}.")
        if value.dtype not in _validation.FLOAT_DTYPES:
            raise TypeError(f"For '{name}', '{arg}' must have a floating dtype, but got {value.dtype}.")
    vocab = ws.shape[0] if ws.ndim == 2 else None
    if ws.ndim != 2 or (wt is not None and wt.ndim != 2):
        raise ValueError(f"For '{name}', the head weights must be 2-D [V, H], but got {ws.shape}"
                         f"{'' if wt is None else f' and {wt.shape}'}.")
    if hs.ndim < 2 or ht.ndim < 2:
        raise ValueError(f"For '{name}', hidden states must be [N, H] or [B, S, H], but got {hs.shape}, {ht.shape}.")
    if hs.shape[-1] != ws.shape[1]:
        raise ValueError(f"For '{name}', 'student_hidden' {hs.shape} does not match 'student_weight' {ws.shape}.")
    if wt is not None and (ht.shape[-1] != wt.shape[1] or wt.shape[0] != vocab):
        raise ValueError(f"For '{name}', 'teacher_hidden' {ht.shape} and 'teacher_weight' {wt.shape} do not "
                         f"match each other or the student's vocabulary ({vocab}).")
    if wt is None and ht.shape[-1] != vocab:
        raise ValueError(f"For '{name}', 'teacher_logits' {ht.shape} must end in the vocabulary size {vocab}.")
    if hs.shape[:-1] != ht.shape[:-1]:
        raise ValueError(f"For '{name}', student and teacher rows differ: {hs.shape[:-1]} vs {ht.shape[:-1]}.")
    for arg, value in (("student_bias", bs), ("teacher_bias", bt)):
        if value is not None and (not isinstance(value, Tensor) or value.dtype not in _validation.FLOAT_DTYPES
                                  or tuple(value.shape) != (vocab,)):
            raise ValueError(f"For '{name}', '{arg}' must be a floating Tensor of shape ({vocab},).")
    if labels is None:
        if hard_weight != 0:
            raise ValueError(f"For '{name}', 'labels' are required when 'hard_weight' is not 0.")
    else:
        if not isinstance(labels, Tensor) or labels.dtype not in (ms.int32, ms.int64):
            raise TypeError(f"For '{name}', 'labels' must be an int32 or int64 Tensor.")
        if tuple(labels.shape) != tuple(hs.shape[:-1]):
            raise ValueError(f"For '{name}', 'labels' must have shape {tuple(hs.shape[:-1])}, "
                             f"but got {tuple(labels.shape)}.")
