"""Chunked fused-linear distillation: a student's output head trained against a teacher without the N x V logits.

For an LLM student the logits are the largest tensor of a step (8192 tokens x 128K vocabulary is 4 GB in
float32, several times over once softmaxes and gradients are held). ``FusedLinearDistillationLoss`` takes the
hidden states and the head weights instead, and processes the rows in chunks: each chunk's logits come from
MindSpore's matmul (so Ascend's cube units and GPU BLAS do it), the distillation kernels chosen through the backend
registry give the chunk's loss and d(logits), and the chunk's contributions to d(hidden), d(weight) and d(bias) are
accumulated during the forward. Only one chunk of logits exists at a time; the backward scales the stored
gradients.

The chunks are the iterations of one compiled loop, ``ops.ForiLoop(unroll=False)`` (PyNative calls it compiled as
well), so that the graph holds one chunk's body whatever the number of chunks (an unrolled loop reaches
MindSpore's call-depth limit near a hundred chunks and compiles in time proportional to their number), and a
dynamic row count is chunked like a static one. Inside the loop a chunk's rows are gathered by index (a slice
with a loop-dependent start returns wrong rows in MindSpore's non-unrolled loops); the last chunk's indices past
the end repeat the last row and are masked out. Where the distillation kernels offer the whole pass as one op
(``fused_head``: the CPU library, ``ms_kldiv.backends.head``) that op takes the loop's place, with the same inputs
and outputs.

The teacher's gradients (mutual learning, trainable teachers) come from a second loop in a bprop that runs only
when they are used: the graph compiler drops it when nothing consumes them, PyNative does not call it for a teacher
cut from autodiff (a frozen teacher).
"""
import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.ops import constexpr

from . import _compat, _math, _validation
from ._compat import FullPrecisionCell, without_mixed_precision
from ._distill_math import KL, sliced_cross_entropy_and_grad, transform_slope, transformed, two_pass
from ._sparse_math import int32_ids
from .backends import check_name, compiled, device_target, get_distill_kernels, get_kernels
from .backends.distill import row_loss
from .backends.vocab_parallel import (SliceInfo, SlicedSparseKernels, VocabParallelKernels, gather_cell, sum_cell,
                                      vocab_group)

_NAME = "FusedLinearDistillationLoss"
#: Default rows per chunk. Each chunk's matmuls re-read both [V, H] weights, so a chunk of few rows is bound by that
#: read rather than by arithmetic, whatever V is; 256 rows is where more rows stop paying (docs/distillation.md).
CHUNK_ROWS = 256
#: Default bound on one chunk's logits (student and teacher together), in bytes of float32: fewer rows than
#: CHUNK_ROWS where the vocabulary is large.
CHUNK_BYTES = 256 * 2**20


def default_chunk_size(rows, vocab, chunk_bytes=None):
    """Rows per chunk (``rows`` < 0: unknown until run time). ``chunk_bytes`` given: as many rows as keep a chunk's
    student and teacher logits within it in float32; by default ``CHUNK_ROWS``, fewer where their logits would
    exceed ``CHUNK_BYTES``."""
    by_bytes = max(1, (CHUNK_BYTES if chunk_bytes is None else chunk_bytes) // max(1, 2 * 4 * vocab))
    size = by_bytes if chunk_bytes is not None else min(CHUNK_ROWS, by_bytes)
    return size if rows < 0 else max(1, min(rows, size))


# The transposes as MatMul flags: ops.transpose would copy a [V, H] weight (or a chunk's [rows, V] gradient) every
# chunk, which cost more than the product itself.
_matmul_t = ops.MatMul(transpose_b=True)   # a @ b^T
_t_matmul = ops.MatMul(transpose_a=True)   # a^T @ b


class _ChunkStep(nn.Cell):
    """One chunk of rows, the body of the chunk loop: ``(i, carry) -> carry``.

    The carry is (inputs..., accumulators...): hidden states [N, H], weights [V, H], biases [V] (0-d: none) of both
    models (the teacher's hidden states are its logits [N, V] when ``teacher_logits``), labels [N] int32, the 0-d scale
    1 / counted rows, ``0..C-1`` (int32 [C]: C, the rows per chunk, is its static length); then the loss, the
    gradients of the six tensors and each row's loss [N] (unweighted and unscaled: the weights' gradient is
    scale * row loss), a 0-d zero for those not computed.
    ``student`` / ``teacher``: which gradients this pass computes (the loss comes with the student's)."""

    def __init__(self, kernels, temperature, beta, ignore_index, hard_weight, soft_weight, student, teacher,
                 teacher_logits, stored=None, variant=KL, hard_options=(0.0, 0.0), group=None, hard_kernels=None):
        super().__init__()
        self.sliced = group is not None  # this rank holds a slice of the vocabulary (vocab_parallel_group)
        self.ignore_index = ignore_index
        self.hard_weight = hard_weight
        self.variant = variant
        self.z_loss, self.label_smoothing = hard_options
        if student and hard_weight != 0:
            if self.sliced:  # the whole rows' cross-entropy from the slices (collectives: MindSpore ops)
                self.gather, self.total = gather_cell(group), sum_cell(group)
                self.transformed = variant.softcap > 0 or variant.logit_scale != 1.0
                # the soft cap in float64 where it runs (MindSpore's float32 CPU tanh is up to 1e-4 off)
                self.wide = ms.float64 if variant.softcap > 0 and device_target() == "CPU" else None
            else:
                self.kernel_hard = hard_kernels.hard(variant, self.z_loss, self.label_smoothing, ignore_index)
        self.soft_weight = soft_weight
        self.student = student
        self.teacher = teacher
        self.teacher_logits = teacher_logits
        # stored: (ratio, tail) of a stored teacher, whose ids and values take the places of hidden states and weight
        self.stored = stored is not None
        self.mark = not self.stored and two_pass(beta, variant)  # rows without a distribution: NaN (row_loss)
        if self.stored:
            self.kernel_rows = kernels.forward(temperature, stored[0], beta, stored[1])
            self.kernel_student = kernels.backward(temperature, stored[0], beta, stored[1])
            return
        self.kernel_rows = kernels.forward(temperature, beta, variant)
        if student:
            self.kernel_student = _StudentOnly(kernels.backward(temperature, beta, False, variant))
        if teacher:
            self.kernel_teacher = (kernels.backward_teacher(temperature, beta, variant)
                                   if hasattr(kernels, "backward_teacher")
                                   else _TeacherOnly(kernels, temperature, beta, variant))

    def construct(self, i, carry):
        hs, ws, bs, ht, wt, bt, labels, weights, scale, offsets, vocab = carry[:11]
        loss, dhs, dws, dbs, dht, dwt, dbt, lrows = carry[11:]
        rows = ops.cast(ops.dyn_shape(labels)[0], ms.int32)
        idx = offsets + i * offsets.shape[0]
        inside = idx < rows
        idx = ops.minimum(idx, rows - 1)  # the last chunk's overhang repeats the last row, masked out by keep
        label = ops.gather(labels, idx, 0)
        keep = ops.logical_and(inside, label != self.ignore_index)
        rows_kept = ops.expand_dims(keep, 1)
        # Rows not counted are zeroed before the matmuls: their NaN or inf must not reach any gradient (0 * NaN).
        hs_c = ops.where(rows_kept, ops.gather(hs, idx, 0), 0.0)
        s_c = _plus_bias(_matmul_t(hs_c, ws), bs)
        if self.sliced:
            # the chunk's collectives after the slice sizes' gather on every rank: an empty slice's sizes are
            # constants, and its graph has no data path that would keep that gather first
            s_c = ops.depend(s_c, vocab)
        if self.stored:  # the teacher: ids [N, K] (padding for rows not counted) and values [N, K]
            ht_c = ops.where(rows_kept, ops.gather(ht, idx, 0), -1)
            teacher_c = (ht_c, ops.gather(wt, idx, 0))
        else:
            ht_c = ops.where(rows_kept, ops.gather(ht, idx, 0), 0.0)
            teacher_c = (ht_c if self.teacher_logits else _plus_bias(_matmul_t(ht_c, wt), bt),)
        # the kernels' incoming row gradient is the row's weight (0 for rows not counted: exact zeros, unread)
        g = ops.where(keep, ops.gather(weights, idx, 0), 0.0)
        stats = self.kernel_rows(s_c, *teacher_c)
        at = ops.expand_dims(idx, 1)
        if self.student:
            soft = ops.where(keep, row_loss(stats, self.mark), 0.0)
            loss = loss + ops.sum(soft * g) * (self.soft_weight * scale)
            rows_c = soft * self.soft_weight
            ds = self.kernel_student(s_c, *teacher_c, stats, g) * (self.soft_weight * scale)
            if self.hard_weight != 0 and self.sliced:  # vocab: (this slice's first column, the whole vocabulary)
                z = transformed(s_c, self.variant, self.wide) if self.transformed else s_c
                # its collectives after the soft term's on every rank (an empty slice has no data path between)
                z = ops.depend(z, stats)
                hard, dce = sliced_cross_entropy_and_grad(z, ops.where(keep, label, 0), keep, g, self.z_loss,
                                                          self.label_smoothing, vocab[0], vocab[1], self.gather,
                                                          self.total)
                if self.transformed:
                    dce = dce * transform_slope(s_c, self.variant, self.wide)
                ds = ds + dce * (self.hard_weight * scale)
            elif self.hard_weight != 0:  # its gradient added onto the soft term's in the kernel
                hard, ds = self.kernel_hard(s_c, ops.where(keep, label, self.ignore_index),
                                            g * (self.hard_weight * scale), ds)
            if self.hard_weight != 0:
                loss = loss + ops.sum(hard * g) * (self.hard_weight * scale)
                rows_c = rows_c + hard * self.hard_weight
            dhs = ops.tensor_scatter_add(dhs, at, ops.matmul(ds, ws))
            dws = dws + _t_matmul(ds, hs_c)
            dbs = _bias_grad(dbs, ds)
            # (the last chunk's overhang adds its zeros onto the last row)
            lrows = ops.tensor_scatter_add(lrows, at, rows_c)
        if self.teacher:
            dt = self.kernel_teacher(s_c, *teacher_c, stats, g) * (self.soft_weight * scale)
            dht = ops.tensor_scatter_add(dht, at, ops.matmul(dt, wt))
            dwt = dwt + _t_matmul(dt, ht_c)
            dbt = _bias_grad(dbt, dt)
        return (hs, ws, bs, ht, wt, bt, labels, weights, scale, offsets, vocab, loss, dhs, dws, dbs, dht, dwt, dbt,
                lrows)


def _plus_bias(logits, bias):
    """A head's logits plus its bias; a 0-d bias stands for none (no pass over the chunk's logits). BiasAdd, not a
    broadcasting ``+``: with that, MindSpore's CPU loop body held ~16 more chunk-sized buffers (both float32 here)."""
    return logits if bias.ndim == 0 else ops.bias_add(logits, bias)


def _bias_grad(acc, d_logits):
    """The bias gradient accumulated over the chunks; nothing for an absent (0-d) bias."""
    return acc if acc.ndim == 0 else acc + ops.sum(d_logits, 0)


class _StudentOnly(nn.Cell):
    """d(student) alone from a backward kernel that also returns a teacher placeholder."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def construct(self, s, t, stats, dloss):
        return self.kernel(s, t, stats, dloss)[0]


class _TeacherOnly(nn.Cell):
    """d(teacher) from kernels without a teacher-only backward (the AscendC pair): the full backward's second output."""

    def __init__(self, kernels, temperature, beta, variant=KL):
        super().__init__()
        self.kernel = kernels.backward(temperature, beta, True, variant)

    def construct(self, s, t, stats, dloss):
        return self.kernel(s, t, stats, dloss)[1]


@constexpr(check=False)
def _chunk_plan(shape, vocab, chunk_size, chunk_bytes):
    """(0..C-1 as an int32 Tensor, the number of chunks or -1 when the row count is dynamic) for hidden states of
    ``shape``; computed at compile time in graph mode, where an unknown row count arrives as None or -1."""
    rows = shape[0] if shape[0] is not None and shape[0] >= 0 else -1
    chunk = chunk_size if chunk_size is not None else default_chunk_size(rows, vocab, chunk_bytes)
    chunk = chunk if rows < 0 else max(1, min(rows, chunk))
    return Tensor(np.arange(chunk, dtype=np.int32)), (-1 if rows < 0 else (rows + chunk - 1) // chunk)


class _ChunkLoop(nn.Cell):
    """One pass of the chunk loop (``_ChunkStep`` as its body) over the inputs of ``_FusedCore``: (loss, d hs, d ws,
    d bs, d ht, d wt, d bt, row losses), a 0-d zero for what this pass does not compute (no [V, H] buffer is held for
    it)."""

    def __init__(self, step, chunk_size, chunk_bytes, group=None):
        super().__init__()
        self.step = step
        self.student, self.teacher = step.student, step.teacher  # which accumulators the carry holds
        self.chunk_size, self.chunk_bytes = chunk_size, chunk_bytes
        self.sliced = group is not None
        if self.sliced and chunk_size is None:
            # every rank must run the same chunks (each runs collectives): rows only, not this rank's slice width
            self.chunk_size = CHUNK_ROWS
        if self.sliced:  # each rank's d(hidden) is its slice's part: the group sums them
            self.total, self.slice_info = sum_cell(group), SliceInfo(group, axis=0)

    def construct(self, hs, ws, bs, ht, wt, bt, labels, weights, count):
        f32 = ms.float32
        hs, ws, bs, ht, wt, bt = _carried(hs), _carried(ws), _carried(bs), _carried(ht), _carried(wt), _carried(bt)
        offsets, chunks = _chunk_plan(ops.shape(hs), ws.shape[0], self.chunk_size, self.chunk_bytes)
        if chunks < 0:  # rows known at run time only
            chunk = offsets.shape[0]
            chunks = (ops.cast(ops.dyn_shape(hs)[0], ms.int32) + (chunk - 1)) // chunk
        zero = ops.zeros((), f32)
        student = (ops.zeros_like(hs), ops.zeros_like(ws), ops.zeros_like(bs)) if self.student else (zero,) * 3
        teacher = (ops.zeros_like(ht), ops.zeros_like(wt), ops.zeros_like(bt)) if self.teacher else (zero,) * 3
        # the 0-d scale: 1 / the counted rows' weights (0 when they sum to 0: nothing is counted; NaN for a bad count)
        scale = _math.over_count(ops.ones_like(count), count)
        vocab = self._vocab(ws)
        rows = ops.zeros_like(weights) if self.student else zero
        carry = (hs, ws, bs, ht, wt, bt, labels, weights, scale, offsets, vocab, zero) + student + teacher + (rows,)
        out = ops.ForiLoop()(0, chunks, self.step, carry, unroll=False)[11:]
        if not self.sliced:
            return out
        loss, dhs, dws, dbs, dht, dwt, dbt, rows = out
        dhs = self.total(dhs) if self.student else dhs
        # (after the student's: two collectives with no data path between them could start in either order)
        dht = self.total(ops.depend(dht, dhs)) if self.teacher else dht
        return loss, dhs, dws, dbs, dht, dwt, dbt, rows

    def _vocab(self, ws):
        """int32 [2]: this rank's first vocabulary column and the whole vocabulary (``SliceInfo``)."""
        if self.sliced:
            return self.slice_info(ws)
        size = ops.cast(ops.reshape(ops.dyn_shape(ws)[:1], (1,)), ms.float32)
        return ops.cast(ops.concat((size * 0.0, size)), ms.int32)


class _CompiledLoop(nn.Cell):
    """A pass (chunk loop or head kernel) compiled for PyNative callers: one graph (the same ``ops.ForiLoop`` as in
    graph mode) instead of a Python loop dispatching each chunk's ops one by one, which cost more than the matmuls
    themselves; the head kernel too runs faster from a graph than as a PyNative op (there its threads compete with
    MindSpore's dispatch threads). The first call compiles for its shapes; once the row count changes, the graph is
    compiled once more with the rows dynamic (``set_inputs``), so that a variable-length training loop does not
    compile per length."""

    def __init__(self, loop):
        super().__init__()
        self.loop = loop
        self.signatures = {}  # per signature (``_signature``): its first call's shapes; the inputs made dynamic
        self.inputs_set = None  # the (signature, dynamic inputs) set_inputs was last given

    def __call__(self, *args):
        # A view (a padded teacher vocabulary sliced, a tied embedding's transpose) is copied first: once recompiled
        # with the rows dynamic, MindSpore read a non-contiguous input as if it were contiguous.
        args = tuple(v if v.is_contiguous() else v.contiguous() for v in args)
        key = _signature(args)
        first, dynamic = self.signatures.setdefault(key, (tuple(v.shape for v in args), ()))
        if not dynamic and args[0].shape[:1] != first[0][:1]:
            # the inputs whose first dimension changed with the rows (the stored teacher's ids and values too)
            dynamic = tuple(k for k, (v, f) in enumerate(zip(args, first)) if v.shape[:1] != f[:1])
            self.signatures[key] = (first, dynamic)
        # a call with another signature (e.g. without a bias) is another graph: inputs left over from one of them
        # crashed MindSpore. (A static signature's row count is its first call's: another one makes it dynamic.)
        if (key, dynamic) != self.inputs_set:
            self.inputs_set = (key, dynamic)
            self.set_inputs(*(Tensor(shape=[None] + list(v.shape[1:]) if k in dynamic else v.shape, dtype=v.dtype)
                              for k, v in enumerate(args)))
        return super().__call__(*args)

    @ms.jit
    def construct(self, hs, ws, bs, ht, wt, bt, labels, weights, count):
        return self.loop(hs, ws, bs, ht, wt, bt, labels, weights, count)


def _signature(args):
    """What a compiled loop's graph depends on besides the row count: each input's dtype, rank and shape after the
    first dimension (and the first dimension of 0-d / row-less inputs such as the weights, as far as a first call
    shows)."""
    rows = args[0].shape[:1]
    return tuple((v.dtype, v.shape[1:] if v.shape[:1] == rows else v.shape) for v in args)


def _carried(v):
    """A loop input in float32: cast, or (float32 / int32 already) reshaped to its own shape, which makes a
    Parameter (a model's head weight) a plain value without a copy: a Parameter in a loop's carry fails to compile
    under TrainOneStepCell."""
    if v.dtype in (ms.float32, ms.int32) and v.ndim:
        return ops.reshape(v, (-1,) + v.shape[1:])
    return ops.cast(v, ms.float32)


# Graph code below spells out each tensor rather than use a comprehension: graph mode parses a comprehension into an
# iterator loop of helper graphs, each compiled (docs/mindspore-notes.md).
def _snapshot(x, copies_bfloat16):
    """A copy of a weight or bias (a 0-d stand-in for none stays as it is). ``copies_bfloat16`` False (CPU):
    MindSpore's CPU has no bfloat16 Identity, and no bfloat16 Assign either, so no optimizer in the graph can update
    such a weight: it needs no copy. (A float32 round trip is no copy: the compiler folds the cast pair away.)"""
    if x.ndim == 0 or (x.dtype == ms.bfloat16 and not copies_bfloat16):
        return x
    return ops.deepcopy(x)


def _cut(*tensors):
    return tuple(map(ops.stop_gradient, tensors))


class _Unrecorded(nn.Cell):
    """The compiled chunk loop called from PyNative: MindSpore's PyNative autograd records a plain Cell's ops (and
    would differentiate the compiled loop) even on inputs cut from autodiff, but runs the forward of a Cell with a
    bprop without recording it. (Compiled code calls the loop directly: there a loop inside a Cell with a bprop
    fails to compile.)"""

    def __init__(self, loop):
        super().__init__()
        self.compiled_loop = _CompiledLoop(loop)

    def construct(self, hs, ws, bs, ht, wt, bt, labels, weights, count):
        return self.compiled_loop(hs, ws, bs, ht, wt, bt, labels, weights, count)

    def bprop(self, hs, ws, bs, ht, wt, bt, labels, weights, count, out, dout):
        return (_discarded(hs), _discarded(ws), _discarded(bs), _discarded(ht), _discarded(wt), _discarded(bt),
                _discarded(labels), _discarded(weights), _discarded(count))


class _FusedCore(nn.Cell):
    """(hidden states and heads of both models, labels, weights, counted rows) -> the loss, differentiable for the six
    tensors.

    Inputs are 2-D hidden states [N, H], weights [V, H], biases [V] (zeros when absent), labels [N] int32 and the
    number of counted rows. The chunk loop runs on inputs cut from autodiff (it computes the gradients itself:
    MindSpore then neither records the chunks' tensors in PyNative nor differentiates the loop in graph mode, which
    it cannot do for a loop inside a Cell with a bprop) and a Cell with a bprop hands its gradients to autodiff. The
    teacher's gradients come from a second loop inside another bprop, which runs only when they are used: graph
    mode drops it when nothing consumes them, PyNative does not call it for a teacher cut from autodiff (a frozen
    teacher). PyNative runs the same compiled loops as graph mode (``_CompiledLoop``).
    """

    def __init__(self, kernels, temperature, beta, ignore_index, hard_weight, soft_weight, chunk_size, chunk_bytes,
                 teacher_grad, teacher_logits=False, stored=None, variant=KL, hard_options=(0.0, 0.0), group=None,
                 hard_kernels=None):
        super().__init__()
        # (called from the loss's methods too, i.e. inside the caller's cell: mixed precision stops here)
        without_mixed_precision(self)
        self.teacher_grad = teacher_grad and not teacher_logits and stored is None
        self.copies_bfloat16 = device_target() != "CPU"  # (_snapshot)
        args = (kernels, temperature, beta, ignore_index, hard_weight, soft_weight)

        head = getattr(kernels, "fused_head", None)
        whole = head is not None and not teacher_logits and stored is None and group is None

        def chunk_loop(student, teacher):
            kernel = whole and head(student, temperature, beta, variant, ignore_index, hard_weight, soft_weight,
                                    hard_options, chunk_size, chunk_bytes, two_pass(beta, variant), CHUNK_ROWS)
            if kernel:  # the whole pass in one kernel (CPU: ms_kldiv/backends/head.py)
                return kernel
            return _ChunkLoop(_ChunkStep(*args, student, teacher, teacher_logits, stored, variant, hard_options,
                                         group, hard_kernels), chunk_size, chunk_bytes, group)

        self.student_loop = chunk_loop(True, False)
        self.student_loop_pynative = _Unrecorded(self.student_loop)
        self.with_gradients = _WithGradients()
        if self.teacher_grad:
            self.teacher_gradients = _TeacherGradients(chunk_loop(False, True))

    def construct(self, hs, ws, bs, ht, wt, bt, labels, weights, count):
        weights_in, count_in = weights, count
        inputs = _cut(hs, ws, bs, ht, wt, bt, labels, weights, count)
        loop = self.student_loop if compiled(hs) else self.student_loop_pynative
        hs_, ws_, bs_, ht_, wt_, bt_, labels, weights, count = inputs
        snap_ws, snap_bs = ws_, bs_
        if self.teacher_grad and compiled(hs):
            # The teacher's pass runs in the backward and reads the student's weight and bias; an optimizer in the
            # same graph may update them first (it waits only for the student's gradients, from this pass): that
            # pass reads a copy made before this one. (A frozen teacher still pays the copy: teacher_grad=False
            # skips it. PyNative runs the optimizer after the backward.)
            snap_ws, snap_bs = _snapshot(ws_, self.copies_bfloat16), _snapshot(bs_, self.copies_bfloat16)
            inputs = (hs_, ops.depend(ws_, snap_ws), ops.depend(bs_, snap_bs)) + inputs[3:]
        out = loop(*inputs)
        loss = self.with_gradients(hs, ws, bs, ht_, wt_, bt_, weights_in, count_in,
                                   *_cut(out[0], out[1], out[2], out[3], out[7]))
        if not self.teacher_grad:
            return loss
        # the teacher's pass after the student's: else the optimizer may update the teacher from its gradients
        # before the student's pass has read the teacher's weights
        return loss + self.teacher_gradients(ops.depend(hs_, loss), snap_ws, snap_bs, ht, wt, bt, labels, weights,
                                             count)


class _TeacherGradients(nn.Cell):
    """A zero added to the loss whose bprop gives the teacher's hidden states, weight and bias their gradients from
    a second chunk loop (compiled code). Its other inputs are cut from autodiff, so when the teacher's gradients are
    unused (a frozen teacher) nothing uses this bprop's results and the graph compiler drops the whole loop (it does
    not drop part of a call's results when the called graph holds a loop)."""

    def __init__(self, teacher_loop):
        super().__init__()
        self.teacher_loop = teacher_loop
        self.teacher_loop_pynative = _CompiledLoop(teacher_loop)
        self.first_order = _FirstOrderScale()

    def construct(self, hs, ws, bs, ht, wt, bt, labels, weights, count):
        # depends on the teacher's tensors: a constant output would be folded away with its bprop
        return ops.depend(ops.depend(ops.depend(ops.zeros((), ms.float32), ht), wt), bt)

    def bprop(self, hs, ws, bs, ht, wt, bt, labels, weights, count, out, dout):
        loop = self.teacher_loop if compiled(hs) else self.teacher_loop_pynative
        _, _, _, _, dh_t, dw_t, db_t, _ = loop(hs, ws, bs, *_cut(ht, wt, bt), labels, weights, count)
        return ((_discarded(hs), _discarded(ws), _discarded(bs))
                + _scaled(self.first_order, (dh_t, dw_t, db_t), dout, (ht, wt, bt))
                + (_discarded(labels), _discarded(weights), _discarded(count)))


class _WithGradients(nn.Cell):
    """(the six tensors, the row weights and the count the means divide by, the loss, the student's gradients and
    each row's loss computed by the chunk loop) -> the loss, whose bprop is the given gradients times the incoming
    gradient, zeros for the teacher's (``_TeacherGradients`` gives theirs), and for the weights and the count those
    of loss = scale * sum(weight * row loss), scale = 1 / count: scale * row loss and -scale * loss (the caller's
    count is a sum of the counted rows' weights, or the caller's ``num_items_in_batch``: autodiff goes on from
    there)."""

    def __init__(self):
        super().__init__()
        self.first_order = _FirstOrderScale()

    def construct(self, hs, ws, bs, ht, wt, bt, weights, count, loss, dh_s, dw_s, db_s, rows):
        return loss

    def bprop(self, hs, ws, bs, ht, wt, bt, weights, count, loss, dh_s, dw_s, db_s, rows, out, dout):
        grads = _scaled(self.first_order, (dh_s, dw_s, db_s), dout, (hs, ws, bs))
        scale = _math.over_count(ops.ones_like(count), count)
        # (through _FirstOrderScale: both depend on the hidden states and heads, and a second differentiation would
        # take them for constants)
        d_weights = ops.cast(self.first_order(rows * scale, dout, hs, ws, bs), weights.dtype)
        d_count = ops.cast(self.first_order(-loss * scale, dout, hs, ws, bs), count.dtype)
        return grads + (_discarded(ht), _discarded(wt), _discarded(bt), d_weights, d_count, _discarded(loss),
                        _discarded(dh_s), _discarded(dw_s), _discarded(db_s), _discarded(rows))


def _scaled(first_order, grads, dout, primals):
    """A bprop's ``grad * dout`` for each of ``grads``, in the dtype of its primal (``first_order``: a
    ``_FirstOrderScale``). PyNative runs each op on its own, so there a ``dout`` of 1 (the loss differentiated
    directly) and a cast to the same dtype are skipped: each would copy a weight-sized gradient (reading ``dout``
    waits for it: once per bprop)."""
    if compiled(dout):  # (three gradients: a head's hidden states, weight and bias)
        return (ops.cast(first_order(grads[0], dout, *primals), primals[0].dtype),
                ops.cast(first_order(grads[1], dout, *primals), primals[1].dtype),
                ops.cast(first_order(grads[2], dout, *primals), primals[2].dtype))
    one = float(dout.asnumpy()) == 1.0
    return (_as_dtype(first_order, grads[0], dout, one, primals, 0),
            _as_dtype(first_order, grads[1], dout, one, primals, 1),
            _as_dtype(first_order, grads[2], dout, one, primals, 2))


def _as_dtype(first_order, g, dout, one, primals, k):
    """PyNative's ``g * dout`` in the dtype of ``primals[k]`` (``_scaled``)."""
    g = first_order.unscaled(g, *primals) if one else first_order(g, dout, *primals)
    return g if g.dtype == primals[k].dtype else ops.cast(g, primals[k].dtype)


class _FirstOrderScale(nn.Cell):
    """``g * dout`` for a gradient ``g`` that the chunk pass computed from one model's hidden states, weight and bias
    ``h``, ``w``, ``b``, whose own derivative is NaN (towards each of them): the head is first order, and
    differentiating its gradients again (a Hessian-vector product, a gradient penalty) saw them as constants: 0,
    silently. (NaN, not a raise: graph mode builds this bprop even when nobody differentiates twice.) Only a second
    differentiation runs the bprop; the first pays nothing."""

    def __init__(self):
        super().__init__()
        self.unscaled = _FirstOrderGradient()

    def construct(self, g, dout, h, w, b):
        return g * dout

    def bprop(self, g, dout, h, w, b, out, d_out):
        return _nan_like(g), _nan_like(dout), _nan_like(h), _nan_like(w), _nan_like(b)


class _FirstOrderGradient(nn.Cell):
    """``_FirstOrderScale`` for a ``dout`` of 1 in PyNative: ``g`` itself (no weight-sized product)."""

    def construct(self, g, h, w, b):
        return g

    def bprop(self, g, h, w, b, out, d_out):
        return _nan_like(g), _nan_like(h), _nan_like(w), _nan_like(b)


def _nan_like(x):
    return ops.fill(x.dtype, x.shape, float("nan"))


def _discarded(v):
    """A bprop's gradient of an input cut from autodiff (MindSpore drops it). PyNative makes what the bprop returns,
    so there it is a 0-d zero where MindSpore takes one for any shape (``_compat.BPROP_TAKES_0D_GRADIENTS``), not a
    zeros tensor of a weight's size; compiled code drops unused zeros itself. (MindSpore 2.7's PyNative CPU
    ``ZerosLike`` has no bfloat16 kernel: those are made in float32 and cast.)"""
    if compiled(v):
        return ops.zeros_like(v)
    if _compat.BPROP_TAKES_0D_GRADIENTS:
        return ops.zeros((), v.dtype)
    if v.dtype != ms.bfloat16:
        return ops.zeros_like(v)
    return ops.cast(ops.zeros(v.shape, ms.float32), v.dtype)


class FusedLinearDistillationLoss(FullPrecisionCell, nn.Cell):
    r"""
    Distillation loss of a student's output head against a teacher's, computed chunk by chunk from the hidden
    states so that the N x V logits never exist.

    The soft term is per counted token: it equals :func:`ms_kldiv.distillation_loss` of the two heads' logits with
    ``'tokenmean'`` (for ``[N, H]`` hidden states also ``'batchmean'``; for ``[B, S, H]`` without labels
    ``'batchmean'`` would divide by ``B``)::

        distillation_loss(student_hidden @ W_s^T + b_s, teacher_hidden @ W_t^T + b_t, temperature, 'tokenmean',
                          beta=beta, labels=labels, ignore_index=ignore_index)

    and the optional hard term is the cross-entropy of the student's logits against `labels` (same ignored rows,
    mean over the counted rows). The loss is ``soft_weight * soft + hard_weight * hard``.

    Args:
        temperature (float, optional): Softmax temperature :math:`T > 0`. Default: ``1.0``.
        beta (float, optional): 0 forward KL, 1 reverse KL, in between the generalized Jensen-Shannon
            divergence, as in :func:`ms_kldiv.distillation_loss`. Default: ``0.0``.
        ignore_index (int, optional): Label value of rows that contribute nothing. Default: ``-100``.
        hard_weight (float, optional): Weight (>= 0) of the cross-entropy against `labels`; its labels must be in
            [0, V) or `ignore_index` (PyNative raises ValueError; compiled code gives a NaN loss). Default: ``0.0``.
        soft_weight (float, optional): Weight (>= 0) of the distillation term. Default: ``1.0``.
        chunk_size (int, optional): Rows per chunk. Default: ``None``: from ``chunk_bytes``.
        chunk_bytes (int, optional): Memory budget, in bytes, for one chunk's logits of both models in float32 (the
            chunk's own temporaries are a small multiple of it; the gradient buffers of the weights come on top):
            the rows per chunk are as many as fit. Default: ``None``: 256 rows, fewer where their logits would
            exceed 256 MB (V > 131,072); in the CPU head kernel as many rows as fit 128 MB, at least 128, but
            with float32 weights never over 192 MB (96 rows at V = 262,144); with `vocab_parallel_group` 256 rows
            (every rank must run the same chunks; ``chunk_bytes`` is refused there). Give ``chunk_size`` or
            ``chunk_bytes``, not both.
        teacher_grad (bool, optional): ``None`` (default) gives the teacher's hidden states, weight and bias
            their gradients, computed only when used (a second pass over the chunks, in the backward; a frozen
            teacher's costs no pass, but in compiled code one copy of the student's weight and bias, which that pass
            reads: an optimizer in the same graph may update the weights before it runs); ``False`` declares the
            teacher frozen (its gradients are zeros, no work).
        backend (str, optional): Which distillation kernels compute a chunk's loss and d(logits), chosen as for
            every op (``ms_kldiv.backend_info(op='distillation')``): ``'aot'`` (the fused kernels: C++ on CPU, CUDA
            on GPU, AscendC on Ascend; no chunk x V temporaries besides the logits and their gradient),
            ``'composite'`` (closed forms in MindSpore ops, every device), ``'auto'`` (the best that runs here).
            Default: ``'auto'``.
        stored_mode (str, optional): For :meth:`from_teacher_topk` (a stored teacher): ``'tail'``,
            ``'renormalize'`` or ``'sampled'``, as `mode` of :func:`ms_kldiv.sparse_distillation_loss`.
            Default: ``'tail'``.
        teacher_temperature (float, optional): For :meth:`from_teacher_topk`: the temperature the stored
            log-probabilities were taken at. Default: ``1.0``.
        vocab_parallel_group (str, optional): A communication group whose ranks each hold a contiguous slice of the
            vocabulary (tensor parallelism): the weights and biases are then this rank's slices ``[V_r, H]`` /
            ``[V_r]``, the hidden states the same on every rank; the loss is the whole vocabulary's and d(hidden) is
            summed over the group (docs/vocab_parallel.md); :meth:`from_teacher_topk`'s ids stay global.
            Default: ``None``.

    Inputs:
        - **student_hidden** (Tensor) - ``[N, H_s]`` or ``[B, S, H_s]``, float16/bfloat16/float32.
        - **student_weight** (Tensor) - ``[V, H_s]``, the head's weight as ``nn.Dense`` stores it.
        - **teacher_hidden** (Tensor) - ``[N, H_t]`` or ``[B, S, H_t]``.
        - **teacher_weight** (Tensor) - ``[V, H_t]``.
        - **labels** (Tensor, optional) - integer labels of the leading shape; required when ``hard_weight != 0``.
        - **student_bias**, **teacher_bias** (Tensor, optional) - ``[V]``; ``-inf`` entries mask vocabulary
          columns (padded vocabularies).
        - **weights** (Tensor, optional) - per-token float weights of the leading shape, ``>= 0``: each token's
          loss is multiplied by its weight and the mean divides by the counted tokens' weights; differentiable (a
          learned weighting).
        - **num_items_in_batch** (Union[int, float, Tensor], optional) - the count the means divide by instead of
          the counted tokens here (e.g. the whole global batch's, across data-parallel ranks and accumulation steps).

    Outputs:
        0-d float32 Tensor.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, temperature=1.0, *, beta=0.0, ignore_index=-100, hard_weight=0.0, soft_weight=1.0,
                 chunk_size=None, chunk_bytes=None, teacher_grad=None, backend="auto", stored_mode="tail",
                 teacher_temperature=1.0, divergence="kl", alpha=None, softcap=None, logit_scale=1.0, z_loss=0.0,
                 label_smoothing=0.0, vocab_parallel_group=None):
        super().__init__()
        _validation.check_vocab_parallel(vocab_parallel_group, "tokenmean", _NAME)
        self.vocab_parallel_group = vocab_parallel_group
        self.whole_vocab = vocab_parallel_group is None  # (a rank's slice may be empty)
        _validation.check_temperature(temperature, _NAME)
        _validation.check_number(beta, "beta", _NAME, 0.0, 1.0)
        _validation.check_number(hard_weight, "hard_weight", _NAME, 0.0)
        _validation.check_number(soft_weight, "soft_weight", _NAME, 0.0)
        _validation.check_ignore_index(ignore_index, _NAME)
        # (rows are counted in int32; a byte budget past 2^62 is no budget and would overflow the kernels' int64)
        for arg, value, high in (("chunk_size", chunk_size, 2**31 - 1), ("chunk_bytes", chunk_bytes, 2**62)):
            if value is not None and not _validation.is_integer(value):
                raise TypeError(f"For '{_NAME}', '{arg}' must be None or a positive int, but got "
                                f"{type(value).__name__}: {value!r}.")
            if value is not None and not 1 <= value <= high:
                raise ValueError(f"For '{_NAME}', '{arg}' must lie in [1, {high}], but got {value!r}.")
        if chunk_size is not None and chunk_bytes is not None:
            raise ValueError(f"For '{_NAME}', give 'chunk_size' (rows) or 'chunk_bytes' (a memory budget), not both.")
        if vocab_parallel_group is not None and chunk_bytes is not None:
            raise ValueError(f"For '{_NAME}', 'chunk_bytes' sizes chunks by each rank's own slice width, so uneven "
                             f"slices would run different chunks on different ranks; with 'vocab_parallel_group' "
                             f"give 'chunk_size' (rows; default {CHUNK_ROWS}).")
        if teacher_grad is not None and not isinstance(teacher_grad, bool):
            raise TypeError(f"For '{_NAME}', 'teacher_grad' must be None or a bool, but got {teacher_grad!r}.")
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.ignore_index = int(ignore_index)
        self.hard_weight = float(hard_weight)
        self.soft_weight = float(soft_weight)
        chunk_size = None if chunk_size is None else int(chunk_size)
        chunk_bytes = None if chunk_bytes is None else int(chunk_bytes)
        self.chunk_size = chunk_size
        self.chunk_bytes = chunk_bytes
        self.teacher_grad = teacher_grad is not False
        self.variant = _validation.check_variant(divergence, alpha, softcap, logit_scale, self.beta, _NAME)
        _validation.check_number(z_loss, "z_loss", _NAME, 0.0)
        _validation.check_number(label_smoothing, "label_smoothing", _NAME, 0.0, 1.0)
        self.z_loss, self.label_smoothing = float(z_loss), float(label_smoothing)
        group = None if vocab_parallel_group is None else vocab_group(vocab_parallel_group)
        self.backend, kernels = _kernels_for(backend, self.variant, group is not None)
        # the hard-label term of the chunk loop: these kernels', else the composite ones' (one op either way)
        hard_kernels = kernels if hasattr(kernels, "hard") else get_kernels("distillation", "composite")[1]
        if group is not None:
            kernels = VocabParallelKernels(kernels, group)
        args = (kernels, self.temperature, self.beta, self.ignore_index, self.hard_weight, self.soft_weight, chunk_size,
                self.chunk_bytes)
        hard_options = (self.z_loss, self.label_smoothing)
        options = dict(variant=self.variant, hard_options=hard_options, group=group, hard_kernels=hard_kernels)
        self.core = _FusedCore(*args, self.teacher_grad, **options)
        self.core_from_logits = _FusedCore(*args, False, teacher_logits=True, **options)
        # the stored-teacher head (from_teacher_topk): its options are checked when it is used
        self.stored_mode, self.teacher_temperature = stored_mode, teacher_temperature
        self._stored_error = _stored_options_error(stored_mode, teacher_temperature, self.beta, self.variant)
        self.core_from_stored = None
        if self._stored_error is None:
            try:  # each rank's slice of the vocabulary: the stored teacher's sliced kernels (global ids)
                stored_kernels = (get_kernels("sparse_distillation", self.backend, caller=_NAME)[1] if group is None
                                  else SlicedSparseKernels(group))
            except RuntimeError as e:  # raised when from_teacher_topk is called
                self._stored_error = ("RuntimeError", str(e))
            else:
                ratio = 1.0 if stored_mode == "sampled" else float(teacher_temperature) / self.temperature
                self.core_from_stored = _FusedCore(stored_kernels, *args[1:], False,
                                                   stored=(ratio, stored_mode == "tail"), hard_options=hard_options,
                                                   group=group, hard_kernels=hard_kernels)

    def construct(self, student_hidden, student_weight, teacher_hidden, teacher_weight, labels=None,
                  student_bias=None, teacher_bias=None, weights=None, num_items_in_batch=None):
        _check_inputs(student_hidden, student_weight, teacher_hidden, teacher_weight, labels, student_bias,
                      teacher_bias, self.hard_weight, _NAME, self.whole_vocab)
        return self._run(self.core, student_hidden, student_weight, student_bias, _rows(teacher_hidden),
                         teacher_weight, teacher_bias, labels, weights, num_items_in_batch)

    def from_teacher_logits(self, student_hidden, student_weight, teacher_logits, labels=None, student_bias=None,
                            weights=None, num_items_in_batch=None):
        """The same loss with the teacher given as logits ``[N, V]`` (or ``[B, S, V]``) instead of its hidden
        states and head; the teacher is frozen (no gradient). Under GRAPH_MODE call it from a Cell's construct."""
        name = f"{_NAME}.from_teacher_logits"
        _check_inputs(student_hidden, student_weight, teacher_logits, None, labels, student_bias, None,
                      self.hard_weight, name, self.whole_vocab, teacher_is_logits=True)
        logits = ops.stop_gradient(_rows(teacher_logits))
        unused = ops.zeros((1, 1), ms.float32)
        return self._run(self.core_from_logits, student_hidden, student_weight, student_bias, logits, unused,
                         ops.zeros((), ms.float32), labels, weights, num_items_in_batch)

    def from_teacher_topk(self, student_hidden, student_weight, teacher_ids, teacher_values, labels=None,
                          student_bias=None, weights=None, num_items_in_batch=None):
        """The same loss against a stored teacher: per row K ids ``[N, K]`` / ``[B, S, K]`` (int32/int64, negative =
        padding) and their values (log-probabilities; counts for ``stored_mode='sampled'``), the soft term being
        :func:`ms_kldiv.sparse_distillation_loss` with ``mode=stored_mode``, ``teacher_temperature``, ``beta``
        and ``'tokenmean'``. Chunked as the dense head: no N x V tensor. The teacher gets no gradient. Under
        GRAPH_MODE call it from a Cell's construct."""
        name = f"{_NAME}.from_teacher_topk"
        if self._stored_error is not None:
            _raise_deferred(*self._stored_error)
        _check_inputs(student_hidden, student_weight, student_hidden, None, labels, student_bias, None,
                      self.hard_weight, name, self.whole_vocab, teacher_is_logits=True, vocab_check=False)
        d = _validation.described
        _checked_stored_teacher(d(teacher_ids), d(teacher_values), ops.shape(student_hidden)[:-1], self.stored_mode,
                                name)
        if not compiled(teacher_ids):
            # (with a vocabulary split across ranks no rank knows V here: an id past it makes its row NaN)
            vocab = student_weight.shape[0] if self.vocab_parallel_group is None else 2**62
            _validation.check_stored_data(teacher_ids, teacher_values, vocab, self.stored_mode,
                                          labels, self.ignore_index, name)
        ids = int32_ids(_rows(teacher_ids))
        values = ops.cast(_rows(teacher_values), ms.float32)
        if self.stored_mode == "sampled":
            values = ops.log(values)
        return self._run(self.core_from_stored, student_hidden, student_weight, student_bias, ops.stop_gradient(ids),
                         ops.stop_gradient(values), ops.zeros((), ms.float32), labels, weights, num_items_in_batch)

    def _run(self, core, student_hidden, student_weight, student_bias, teacher_rows, teacher_weight, teacher_bias,
             labels, weights=None, num_items=None):
        d = _validation.described
        _checked_run_inputs(d(student_hidden), d(weights), d(num_items))
        hs = _rows(student_hidden)
        vocab = student_weight.shape[0]
        if weights is not None and not compiled(weights):
            _validation.check_weights_data(weights, _NAME)
        if num_items is not None and not compiled(hs):
            _validation.check_num_items_data(num_items, _NAME)
        if labels is None:
            # from a float32 slice that autodiff does not enter: MindSpore's CPU slice (2.7) and its gradient have no
            # bfloat16 kernels
            labels = ops.cast(ops.zeros_like(ops.cast(ops.stop_gradient(hs), ms.float32)[:, 0]), ms.int32)
            count = ops.cast(ops.reshape(ops.dyn_shape(hs)[:1], ()), ms.float32)
        else:
            if self.hard_weight != 0 and not compiled(labels) and self.vocab_parallel_group is None:
                # before the cast to int32, which would wrap an int64 label into range (or onto ignore_index);
                # with a vocabulary split across ranks a label outside the whole vocabulary makes the loss NaN
                _check_label_range(labels, vocab, self.ignore_index)
            labels = _int32_labels(ops.reshape(labels, (-1,)))
            count = ops.sum(ops.cast(labels != self.ignore_index, ms.float32))
        if weights is None:
            weights = ops.ones_like(ops.cast(labels, ms.float32))
        else:
            # the counted rows' weights sum to the count the means divide by
            weights = _math.checked_weights(ops.reshape(weights, (-1,)), ms.float32)
            count = ops.sum(ops.where(labels != self.ignore_index, weights, 0.0))
        if num_items is not None:  # the caller's count: the whole global batch's tokens (docs/vocab_parallel.md)
            count = ops.cast(num_items, ms.float32)
        # an absent bias is a 0-d zero: the chunk loop then neither adds it nor accumulates its gradient
        bs = ops.zeros((), ms.float32) if student_bias is None else student_bias
        bt = ops.zeros((), ms.float32) if teacher_bias is None else teacher_bias
        return core(hs, student_weight, bs, teacher_rows, teacher_weight, bt, labels, weights, count)

    def extend_repr(self):
        return (f"temperature={self.temperature}, beta={self.beta}, ignore_index={self.ignore_index}, "
                f"hard_weight={self.hard_weight}, soft_weight={self.soft_weight}, chunk_size={self.chunk_size}, "
                f"backend={self.backend!r}")


@_validation.on_host
def _raise_deferred(kind, message):
    """A stored-teacher configuration's error, raised when from_teacher_topk is used: on the host (graph code
    cannot raise an exception object kept on the Cell: MindSpore failed converting it)."""
    raise {"TypeError": TypeError, "ValueError": ValueError}.get(kind, RuntimeError)(message)


@_validation.on_host
def _checked_stored_teacher(teacher_ids, teacher_values, lead, mode, name):
    """``_validation.check_stored_teacher`` on the host (in graph code its messages were re-quoted into a raise)."""
    _validation.check_stored_teacher(teacher_ids, teacher_values, lead, mode, name)


def _stored_options_error(mode, teacher_temperature, beta, variant):
    """(the kind, the message) of the error of a stored-teacher configuration that cannot work, or None (raised by
    from_teacher_topk)."""
    if variant != KL:
        return "ValueError", (f"For '{_NAME}.from_teacher_topk', a stored teacher takes the 'kl' family (beta) "
                              f"without a logits transform; got {variant}.")
    try:
        _validation.check_stored_options(mode, teacher_temperature, beta, _NAME)
    except (TypeError, ValueError) as e:
        return type(e).__name__, str(e)
    return None


def _kernels_for(backend, variant, vocab_parallel=False):
    """(backend chosen, its distillation kernels for ``variant``); a bad ``backend=`` is named for this Cell."""
    check_name(backend, _NAME)
    return get_distill_kernels(backend, variant=variant, caller=_NAME, vocab_parallel=vocab_parallel)


def _check_label_range(labels, vocab, ignore_index):
    """PyNative: labels of the hard term outside [0, V) (other than ``ignore_index``) are an error, as in torch's
    cross-entropy. (Compiled code cannot raise at run time: there such a label makes the loss NaN.)"""
    values = labels.asnumpy()
    bad = values[(values != ignore_index) & ((values < 0) | (values >= vocab))]
    if bad.size:
        raise ValueError(f"For '{_NAME}', 'labels' must be in [0, {vocab}) or equal 'ignore_index' "
                         f"({ignore_index}), but got {bad[:5].tolist()}.")


def _int32_labels(labels):
    """The labels as the kernels take them: outside int32 int32's largest (past any vocabulary: a NaN loss where the
    hard term counts it, as any label out of range in compiled code), not wrapped into range or onto
    ``ignore_index``."""
    return _math.narrowed_to_int32(labels, 2**31 - 1)


def _rows(hidden):
    return ops.reshape(hidden, (-1, hidden.shape[-1])) if hidden.ndim != 2 else hidden


def _check_inputs(hs, ws, ht, wt, labels, bs, bt, hard_weight, name, whole_vocab, teacher_is_logits=False,
                  vocab_check=True):
    """Every argument check, before anything runs. ``teacher_is_logits``: ``ht`` holds the teacher's logits;
    ``whole_vocab``: the weights hold every class (not a rank's slice, which may be empty)."""
    d = _validation.described
    _checked_inputs(d(hs), d(ws), d(ht), d(wt), d(labels), d(bs), d(bt), hard_weight, name, whole_vocab,
                    teacher_is_logits, vocab_check)


@_validation.on_host
def _checked_run_inputs(student_hidden, weights, num_items):
    _validation.check_num_items(num_items, "tokenmean", _NAME)
    if weights is not None:
        _validation.check_weights(weights, _validation.shape_of(student_hidden)[:-1], _NAME)


@_validation.on_host
def _checked_inputs(hs, ws, ht, wt, labels, bs, bt, hard_weight, name, whole_vocab, teacher_is_logits, vocab_check):
    """_check_inputs on the host. The shapes are checked on their static form (``ops.shape``: -1 for a dynamic
    dimension) at compile time: a check on a dynamic dimension's run-time value would leave a raise in the graph."""
    is_tensor, shape_of = _validation.is_tensor, _validation.shape_of
    tensors = (("student_hidden", hs), ("student_weight", ws),
               ("teacher_logits" if teacher_is_logits else "teacher_hidden", ht))
    for arg, value in tensors + (() if teacher_is_logits else (("teacher_weight", wt),)):
        if not is_tensor(value):
            raise TypeError(f"For '{name}', '{arg}' must be a mindspore.Tensor, but got {type(value).__name__}.")
        if value.dtype not in _validation.FLOAT_DTYPES:
            raise TypeError(f"For '{name}', '{arg}' must have a floating dtype, but got {value.dtype}.")
    for arg, value in (("student_bias", bs), ("teacher_bias", bt)):
        if value is not None and (not is_tensor(value) or value.dtype not in _validation.FLOAT_DTYPES):
            raise TypeError(f"For '{name}', '{arg}' must be a floating Tensor of shape (V,), but got "
                            f"{value.dtype if is_tensor(value) else type(value).__name__}.")
    if labels is not None and (not is_tensor(labels) or labels.dtype not in (ms.int32, ms.int64)):
        raise TypeError(f"For '{name}', 'labels' must be an int32 or int64 Tensor.")
    _check_shapes(shape_of(hs), shape_of(ws), shape_of(ht), None if teacher_is_logits else shape_of(wt),
                  None if labels is None else shape_of(labels), None if bs is None else shape_of(bs),
                  None if bt is None else shape_of(bt), hard_weight != 0, name, whole_vocab, vocab_check)


@constexpr(check=False)
def _check_shapes(hs, ws, ht, wt, labels, bs, bt, hard, name, whole_vocab, vocab_check):
    """The shape checks of ``_check_inputs`` on static shapes (``wt`` None: ``ht`` is the teacher's logits)."""
    hs, ws, ht = tuple(hs), tuple(ws), tuple(ht)
    vocab = ws[0] if len(ws) == 2 else None
    if len(ws) != 2 or (wt is not None and len(wt) != 2):
        raise ValueError(f"For '{name}', the head weights must be 2-D [V, H], but got {ws}"
                         f"{'' if wt is None else f' and {tuple(wt)}'}.")
    if len(hs) < 2 or len(ht) < 2:
        raise ValueError(f"For '{name}', hidden states must be [N, H] or [B, S, H], but got {hs}, {ht}.")
    if whole_vocab and vocab == 0:
        raise ValueError(f"For '{name}', 'student_weight' {ws} has no classes (V = 0).")
    if ws[1] == 0 or (wt is not None and tuple(wt)[1] == 0):
        raise ValueError(f"For '{name}', the hidden size must be at least 1, but the head weights are {ws}"
                         f"{'' if wt is None else f' and {tuple(wt)}'}.")
    if hs[-1] != ws[1]:
        raise ValueError(f"For '{name}', 'student_hidden' {hs} does not match 'student_weight' {ws}.")
    if wt is not None and (ht[-1] != wt[1] or wt[0] != vocab):
        raise ValueError(f"For '{name}', 'teacher_hidden' {ht} and 'teacher_weight' {tuple(wt)} do not "
                         f"match each other or the student's vocabulary ({vocab}).")
    if wt is None and vocab_check and ht[-1] != vocab:
        raise ValueError(f"For '{name}', 'teacher_logits' {ht} must end in the vocabulary size {vocab}.")
    if hs[:-1] != ht[:-1]:
        raise ValueError(f"For '{name}', student and teacher rows differ: {hs[:-1]} vs {ht[:-1]}.")
    for arg, shape in (("student_bias", bs), ("teacher_bias", bt)):
        if shape is not None and tuple(shape) != (vocab,):
            raise ValueError(f"For '{name}', '{arg}' must be a floating Tensor of shape ({vocab},).")
    if labels is None:
        if hard:
            raise ValueError(f"For '{name}', 'labels' are required when 'hard_weight' is not 0.")
    elif tuple(labels) != hs[:-1]:
        raise ValueError(f"For '{name}', 'labels' must have shape {hs[:-1]}, but got {tuple(labels)}.")
