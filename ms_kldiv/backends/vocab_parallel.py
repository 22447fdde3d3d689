"""Vocabulary parallelism: the distillation kernel contract over a vocabulary split across the ranks of a group.

Each rank holds a contiguous slice of the vocabulary of both models' logits ([R, V_r], the slices in rank order).
``VocabParallelKernels`` wraps the kernels of one backend (which must have the slice entry points of
``ms_kldiv.backends.base``: ``states``, ``forward_given``, ``backward_given``) and meets the same contract as they
do, so ``rows_op`` and the fused head use it unchanged. Its forward, per row:

1. ``states``: the slice's normalizers (base and log Z) of both models (one read of the slice);
2. one gather of the four normalizers of every rank (16 bytes per row per rank), merged exactly
   (``ms_kldiv._distill_math.merged_log_z``) into the whole row's, relative to this slice's bases;
3. ``forward_given``: the slice's sums (loss, sum(a), sum(b)) under the whole row's normalizers (one more read);
4. one SUM all-reduce of those three sums (12 bytes per row).

Every rank then holds the whole row's stats, so the backward is the backend's own backward kernel on its slice:
no collective at all. MindSpore's CPU collectives have SUM all-reduce on any group but all-gather on the world
group only; a gather on another group is then a SUM all-reduce of one-writer slots (exact: the other slots are
zeros). HCCL and NCCL gather directly.
"""
import functools

import mindspore as ms
from mindspore import nn, ops

from .._distill_math import BASE_S, BASE_T, KL, LOG_Z_S, LOG_Z_T, SUM_A, SUM_B, merged_log_z
from .._math import no_class_column
from .._sparse_math import sliced_row_stats, sliced_student_grad
from .composite import CompositeDistillKernels

#: Bytes a rank sends per row and per collective: the gathered normalizers (float32 x 4) and the summed sums.
GATHER_BYTES_PER_ROW, SUM_BYTES_PER_ROW = 16, 12


class VocabGroup:
    """A communication group whose ranks each hold one slice of the vocabulary: its name, size, this process's
    index in it and the collectives the loss uses."""

    def __init__(self, name):
        from mindspore import communication  # pylint: disable=import-outside-toplevel
        # (imported here: importing mindspore.communication sets up nothing, but a loss without a group never
        # needs it, and its import costs time at package import)
        self.name = name
        self.ranks = tuple(communication.get_process_group_ranks(name))
        self.size = len(self.ranks)
        self.index = self.ranks.index(communication.get_rank())
        world = name in (communication.GlobalComm.WORLD_COMM_GROUP, "hccl_world_group", "nccl_world_group",
                         "mccl_world_group")
        self.direct_gather = world or ms.get_context("device_target") != "CPU"

    def __repr__(self):
        return f"VocabGroup({self.name!r}, ranks={list(self.ranks)})"


@functools.lru_cache(maxsize=None)
def vocab_group(name):
    """The ``VocabGroup`` of a group name (created once per process)."""
    return VocabGroup(name)


class _Gather(nn.Cell):
    """x [R, C] of every rank of the group, in rank order: [size, R, C]."""

    def __init__(self, group):
        super().__init__()
        self.size = group.size
        self.direct = group.direct_gather
        if self.direct:
            self.gather = ops.AllGather(group.name)
        else:
            self.sum = ops.AllReduce(ops.ReduceOp.SUM, group.name)
            self.slot = ms.Tensor([[[i == group.index]] for i in range(group.size)], ms.bool_)

    def construct(self, x):
        if self.direct:
            # AllGather refuses an empty x (an empty batch): one zero row travels with it and is dropped
            padded = ops.concat((x, ops.zeros((1, x.shape[-1]), x.dtype)), 0)
            return ops.reshape(self.gather(padded), (self.size, -1, x.shape[-1]))[:, :-1]
        # one-writer slots: adding zeros is exact, and -inf / NaN in a slot stay what they are
        return self.sum(ops.where(self.slot, ops.expand_dims(x, 0), 0.0))


def _columns(x, index):
    """Columns ``index`` (a constant int32 Tensor) of a 2-D x: a gather, which works for any row count."""
    return ops.gather(x, index, 1)


def gather_cell(group):
    """A Cell: x [R, C] -> every rank's [group.size, R, C], in rank order."""
    return _Gather(group)


def sum_cell(group):
    """A Cell: x -> its SUM over the ranks of ``group``."""
    return ops.AllReduce(ops.ReduceOp.SUM, group.name)


class SliceInfo(nn.Cell):
    """x [..., V_r] (or a head's weight [V_r, H] with ``axis=0``) -> int32 [2]: this rank's first vocabulary column
    and the whole vocabulary, from every rank's slice size gathered at run time (slices may be uneven)."""

    def __init__(self, group, axis=-1):
        super().__init__()
        self.gather = gather_cell(group)
        self.axis = axis
        self.below = ms.Tensor([[[r < group.index]] for r in range(group.size)], ms.bool_)

    def construct(self, x):
        # a slice of the shape, not an integer index (as in ms_kldiv._sparse_math.sliced_support)
        width = ops.dyn_shape(x)[self.axis:] if self.axis == -1 else ops.dyn_shape(x)[self.axis:self.axis + 1]
        sizes = self.gather(ops.reshape(ops.cast(width, ms.float32), (1, 1)))
        return ops.cast(ops.stack((ops.sum(ops.where(self.below, sizes, 0.0)), ops.sum(sizes))), ms.int32)


class _SliceForward(nn.Cell):
    """(s, t) -> the whole row's stats [R, STATS] for this rank's slices [R, V_r] of both logits."""

    def __init__(self, kernels, group, temperature, beta, variant):
        super().__init__()
        self.states = kernels.states(temperature, variant)
        self.given = kernels.forward_given(temperature, beta, variant)
        self.gather = gather_cell(group)
        self.sum = sum_cell(group)
        self.temperature = temperature
        self.normalizers = ms.Tensor([BASE_S, LOG_Z_S, BASE_T, LOG_Z_T], ms.int32)
        self.bases = ms.Tensor([BASE_S, BASE_T], ms.int32)
        self.sums = ms.Tensor([0, SUM_A, SUM_B], ms.int32)  # the loss and the row sums
        # the primitive: the functional ops.zeros_like in a Cell that has a bprop fails graph compilation when the
        # differentiated function has an input it does not use ("The func graph is empty ... zeros_like")
        self.zeros_like = ops.ZerosLike()

    def construct(self, s, t):
        states = self.states(s, t)
        log_z_s, log_z_t = merged_log_z(states, self.gather(_columns(states, self.normalizers)), self.temperature)
        zero = self.zeros_like(ops.expand_dims(log_z_s, -1))
        base_s, base_t = ops.split(_columns(states, self.bases), 1, -1)
        log_z_s, log_z_t = ops.expand_dims(log_z_s, -1), ops.expand_dims(log_z_t, -1)
        # (assembled by concatenation: a product with a 0/1 mask would turn an inf normalizer into NaN elsewhere)
        merged = ops.concat((zero, log_z_s, log_z_t, zero, zero, base_s, base_t, zero), -1)
        loss, sum_a, sum_b = ops.split(self.sum(_columns(self.given(s, t, merged), self.sums)), 1, -1)
        return ops.concat((loss, log_z_s, log_z_t, sum_a, sum_b, base_s, base_t, zero), -1)


class _ByWidth(nn.Cell):
    """A forward Cell of the backend's kernels on a slice with classes, the composite kernels' on a slice without:
    compiled custom kernels gave NaN stats for empty inputs (and their backward's empty gradients a NaN loss
    elsewhere in the graph). Chosen at compile time: a slice's width is static."""

    def __init__(self, kernel, composite):
        super().__init__()
        self.kernel, self.composite = kernel, composite

    def construct(self, s, t):
        if s.shape[-1] == 0:
            return self.composite(s, t)
        return self.kernel(s, t)


class _GradByWidth(_ByWidth):
    """``_ByWidth`` for a backward Cell."""

    def construct(self, s, t, stats, dloss):
        if s.shape[-1] == 0:
            return self.composite(s, t, stats, dloss)
        return self.kernel(s, t, stats, dloss)


class VocabParallelKernels:
    """The distillation kernel contract (``ms_kldiv.backends.base``) of ``kernels`` over vocabulary slices spread
    across ``group`` (a ``VocabGroup``); an empty slice (a rank with no classes) takes the composite kernels. First
    order only: the gradient of its backward is NaN (``second_order``)."""

    second_order = False

    def __init__(self, kernels, group):
        self.kernels = kernels
        self.group = group
        self.dtypes = kernels.dtypes
        composite = isinstance(kernels, CompositeDistillKernels)
        self.empty_slice_kernels = None if composite else CompositeDistillKernels(ms.get_context("device_target"))

    def unsupported(self, variant):
        return self.kernels.unsupported(variant)

    def forward(self, temperature, beta, variant=KL):
        """Cell (s, t) [R, V_r] (2-D: the callers flatten) -> the whole rows' stats [R, STATS]."""
        forward = _SliceForward(self.kernels, self.group, temperature, beta, variant)
        if self.empty_slice_kernels is None:
            return forward
        return _ByWidth(forward, _SliceForward(self.empty_slice_kernels, self.group, temperature, beta, variant))

    def backward(self, temperature, beta, teacher_grad, variant=KL):
        return self._by_width(lambda k: k.backward_given(temperature, beta, teacher_grad, variant))

    def backward_teacher(self, temperature, beta, variant=KL):
        return self._by_width(lambda k: k.backward_teacher_given(temperature, beta, variant))

    def _by_width(self, make):
        """A backward Cell of these kernels, with the composite one for an empty slice (``_ByWidth``)."""
        kernel = make(self.kernels)
        return kernel if self.empty_slice_kernels is None else _GradByWidth(kernel, make(self.empty_slice_kernels))


# ------------------------------------------------------------------------------------------- stored teachers
class _InFloat32(nn.Cell):
    """A collective applied to float32 (MindSpore's CPU collectives have no float64), the result cast back."""

    def __init__(self, collective):
        super().__init__()
        self.collective = collective

    def construct(self, x):
        return ops.cast(self.collective(ops.cast(x, ms.float32)), x.dtype)


class _SparseSliceForward(nn.Cell):
    def __init__(self, group, temperature, ratio, beta, tail, acc_dtype):
        super().__init__()
        self.args = (temperature, ratio, beta, tail)
        self.acc_dtype = acc_dtype
        self.info = SliceInfo(group)
        self.gather, self.total = _InFloat32(gather_cell(group)), _InFloat32(sum_cell(group))

    def operand(self, s, ids):
        """s in the math's dtype, and the slice's width where s is empty (None otherwise): an empty slice takes one
        -inf column (no mass, no id), as the gathers and scatters over the classes need one (shaped after the ids'
        first column: the row count may be known at run time only)."""
        x = ops.cast(s, self.acc_dtype)
        if s.shape[-1] != 0:
            return x, None
        return no_class_column(ids[..., :1], self.acc_dtype), 0

    def construct(self, s, ids, values):
        x, width = self.operand(s, ids)
        stats = sliced_row_stats(x, ids, values, *self.args, self.info(s), self.gather, self.total, width)
        return ops.cast(stats, ms.float32)


class _SparseSliceBackward(_SparseSliceForward):
    def construct(self, s, ids, values, stats, dloss):
        x, width = self.operand(s, ids)
        # computed for an empty slice too: its collectives pair with the other ranks'; its value is then unused
        d = sliced_student_grad(x, ids, values, *self.args, dloss, self.info(s), self.gather, self.total, width)
        return ops.cast(d if width is None else ops.zeros_like(s), s.dtype)


class SlicedSparseKernels:
    """The stored-teacher kernel contract (``ms_kldiv.backends.base``) on this rank's slice [R, V_r] of the student's
    logits, the ids global: MindSpore ops, in float64 where the device has it (MindSpore's float32 CPU exp and log
    are several ulp off) with float32 collectives; one gather of 4 floats and a SUM of K + 1 per row in the forward
    and again in the backward (which recomputes the buckets)."""

    dtypes = (ms.float16, ms.bfloat16, ms.float32)

    def __init__(self, group):
        self.group = group
        self.acc_dtype = ms.float32 if ms.get_context("device_target") == "Ascend" else ms.float64

    def forward(self, temperature, ratio, beta, tail):
        return _SparseSliceForward(self.group, temperature, ratio, beta, tail, self.acc_dtype)

    def backward(self, temperature, ratio, beta, tail):
        return _SparseSliceBackward(self.group, temperature, ratio, beta, tail, self.acc_dtype)
