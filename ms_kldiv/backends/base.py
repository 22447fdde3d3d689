"""What a backend is, and the contract every backend's op meets.

A backend registers one instance of a ``Backend`` subclass (see ``ms_kldiv.backends.register``). The
dispatcher asks it whether it can run on the current device target and, if so, for an op:

    op = backend.make_op(reduction, log_target)     # called once per (backend, reduction, log_target, device)
    out = op(input, target)                          # (make_graph_op: the same, for compiled code)

The op receives two Tensors of the same floating dtype (already promoted) whose shapes broadcast (already
checked). It returns the broadcast-shaped loss for 'none' and a 0-d Tensor otherwise, in that dtype; it
implements the zero-mass rule, 'batchmean' dividing by ``input.shape[0]`` (1 for a 0-d input), and is
differentiable in both operands (gradients summed back to each operand's shape and dtype) to second order,
in PyNative, GRAPH_MODE and under ``ms.jit``.
"""


class Backend:
    #: name users pass as ``backend=...``
    name = None
    #: one line for ``backend_info()``
    description = ""
    #: device target -> preference in 'auto' (higher wins); devices not listed are not supported
    preference = {}

    def unavailable_reason(self, device):
        """None when the op can run on ``device``, else a sentence saying why not."""
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
