"""What a backend is, and the contracts its ops meet.

A backend registers one instance of a ``Backend`` subclass (see ``ms_kldiv.backends.register``) and declares in
``ops`` which of the package's ops it implements. The dispatcher asks it, per op, whether it can run on the
current device target and, if so, for that op's implementation:

``'kl_div'`` -- ``make_op(reduction, log_target)`` / ``make_graph_op(...)``: an op called once per (backend,
    reduction, log_target, device). It receives two Tensors of the same floating dtype (already promoted) whose
    shapes broadcast (already checked) and returns the broadcast-shaped loss for 'none' and a 0-d Tensor
    otherwise, in that dtype; it implements the zero-mass rule, 'batchmean' dividing by ``input.shape[0]`` (1 for
    a 0-d input), and is differentiable in both operands (gradients summed back to each operand's shape and
    dtype) to second order, in PyNative, GRAPH_MODE and under ``ms.jit``.

``'distillation'`` -- ``distill_kernels(device)``: an object with the distillation kernel contract below, used by
    ``distillation_loss``/``DistillationLoss`` (through ``ms_kldiv.backends.distill.rows_op``, which adds the
    autodiff) and by ``FusedLinearDistillationLoss`` (which calls the kernels chunk by chunk). For student and
    teacher logits of one shape [R, V] (V >= 1) and one dtype from ``kernels.dtypes``:

    - ``forward(temperature, beta, variant=KL)`` -> Cell ``(s, t) -> float32 stats [R, STATS]``; column 0 is each
      row's loss (T^2 times the divergence of ``beta`` and ``variant``: ``ms_kldiv._distill_math.Variant``, the
      divergence of the loss menu and the logits' transform), the other columns are whatever the backward reads;
      a row whose student has no distribution (NaN, +inf, every logit -inf) has a NaN loss or, for the kinds of
      ``_distill_math.two_pass``, a non-finite column ``LOG_Z_S`` (the student's log-normalizer), from which
      ``rows_op`` and the fused head mark it NaN;
    - ``backward(temperature, beta, teacher_grad, variant=KL)`` -> Cell ``(s, t, stats, dloss) -> (d_student,
      d_teacher)`` for the float32 incoming gradient ``dloss`` [R] of the row losses; rows with ``dloss == 0`` get
      exact zeros whatever their logits hold; d_teacher is a one-element placeholder when ``teacher_grad`` is False;
    - optionally ``backward_teacher(temperature, beta, variant=KL)`` -> Cell ``(s, t, stats, dloss) -> d_teacher``;
    - ``unsupported(variant)`` -> None, or why these kernels cannot compute ``variant`` (the API then takes the
      composite kernels under ``backend='auto'`` and raises for a named backend).
    - optionally ``fused_head(student, temperature, beta, variant, ignore_index, hard_weight, soft_weight,
      hard_options, chunk_size, chunk_bytes, mark, chunk_cap)`` -> a Cell that runs one whole pass of
      ``FusedLinearDistillationLoss`` (``student``: the loss and the student's gradients, else the teacher's) with
      the chunk loop's inputs and outputs (``ms_kldiv.fused_linear._ChunkLoop``), or None where these kernels have
      no such op here (the head then runs its MindSpore chunk loop around ``forward`` / ``backward``);
    - optionally ``hard(variant, z_loss, label_smoothing, ignore_index)`` -> a Cell ``(s [R, V], labels int32 [R],
      g float32 [R], ds [R, V]) -> (rows float32 [R], d [R, V])``: the fused head's hard-label term
      (``ms_kldiv._distill_math.cross_entropy_and_grad`` on the student's logits under ``variant``'s transform):
      each row's cross-entropy (0 where the label is ``ignore_index``, NaN for a counted label outside [0, V)) and
      ``ds`` plus ``g`` times its gradient, in ``s``'s dtype (added onto the soft term's gradient: no buffer of its
      own). Kernels without it (AscendC) leave the term to the composite kernels' ``hard``;
    - optionally, for vocabulary parallelism (``ms_kldiv.backends.vocab_parallel``; kernels without them are
      composite-only there), on a rank's slice [R, V_r] of both logits: ``states(temperature, variant)`` -> Cell
      ``(s, t) -> stats`` holding only the slice's normalizers (columns ``LOG_Z_*`` / ``BASE_*`` of
      ``ms_kldiv._distill_math``); ``forward_given(temperature, beta, variant)`` -> Cell ``(s, t, stats) -> stats``:
      the slice's loss, sum(a) and sum(b) under the whole row's normalizers given in ``stats`` (copied through);
      ``backward_given`` / ``backward_teacher_given``: as ``backward`` / ``backward_teacher``, reading every
      normalizer and sum from the stats (the whole row's, merged across the ranks).

``'sparse_distillation'`` -- ``sparse_kernels(device)``: the stored-teacher kernels, used by
    ``sparse_distillation_loss``/``SparseDistillationLoss`` (through ``ms_kldiv.backends.sparse.rows_op``). For
    student logits s [..., V] (V >= 1, a dtype from ``kernels.dtypes``), the teacher's int32 ids [..., K]
    (negative: padding) and float32 values [..., K] of the same leading shape (log-probabilities, or log-counts),
    with (temperature, ratio = T0 / T, beta, tail) fixed per Cell (the math: ``ms_kldiv._sparse_math``):

    - ``forward(temperature, ratio, beta, tail)`` -> Cell ``(s, ids, values) -> stats [..., SPARSE_STATS]``
      (float32; float64 for float64 logits where the kernels take them); column 0 is each row's loss, NaN for a
      row with an id >= V or a repeated id;
    - ``backward(temperature, ratio, beta, tail)`` -> Cell ``(s, ids, values, stats, dloss) -> d_student`` for the
      incoming gradient ``dloss`` [...] (the stats' dtype); rows with ``dloss == 0`` get exact zeros.
"""

#: The ops a backend can implement, in the order ``backend_info(op=None)`` lists them.
OPS = ("kl_div", "distillation", "sparse_distillation")


class Backend:
    #: name users pass as ``backend=...``
    name = None
    #: one line for ``backend_info()``
    description = ""
    #: device target -> preference in 'auto' (higher wins); devices not listed are not supported
    preference = {}
    #: the ops this backend implements (see OPS)
    ops = ("kl_div",)

    def unavailable_reason(self, device, op="kl_div"):
        """None when ``op`` can run on ``device``, else a sentence saying why not."""
        if op not in self.ops:
            return f"backend '{self.name}' does not implement {op}"
        if device not in self.preference:
            return f"backend '{self.name}' does not support device target {device!r}"
        return None

    def make_op(self, reduction, log_target):
        raise NotImplementedError

    def make_graph_op(self, reduction, log_target):
        """The op for graph mode (GRAPH_MODE Cells, ``ms.jit``); by default the same as ``make_op``.

        A backend may give graph mode an op whose backward is split into parts that the graph compiler drops
        when their result is unused (the 'aot' backend: one op per gradient)."""
        return self.make_op(reduction, log_target)

    def distill_kernels(self, device):
        """The distillation kernels (contract above) on ``device``; called only when available."""
        raise NotImplementedError

    def sparse_kernels(self, device):
        """The stored-teacher kernels (contract above) on ``device``; called only when available."""
        raise NotImplementedError

    def kernels(self, op, device):
        """The kernels of ``op`` (not 'kl_div') on ``device``."""
        return self.sparse_kernels(device) if op == "sparse_distillation" else self.distill_kernels(device)
