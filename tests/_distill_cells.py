"""Cells that run distillation_loss for the edge and fuzz tests: the value and both gradients of every reduction
in one graph, cached so that a configuration compiles once (per shape, or once with ``set_inputs`` dims unknown)."""
import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

import ms_kldiv
from ms_kldiv.distillation import DistillationLoss

from _runners import graph_mode

REDUCTIONS = ("none", "sum", "mean", "batchmean", "tokenmean")


class Loss(nn.Cell):
    """distillation_loss (kind 'functional') or DistillationLoss (kind 'cell'), labels an input."""

    def __init__(self, kind, temperature, reduction, beta, backend):
        super().__init__()
        self.kind, self.temperature, self.reduction, self.beta, self.backend = \
            kind, temperature, reduction, beta, backend
        self.cell = DistillationLoss(temperature, reduction, beta=beta, backend=backend)

    def construct(self, s, t, labels):
        if self.kind == "cell":
            return self.cell(s, t, labels)
        return ms_kldiv.distillation_loss(s, t, self.temperature, self.reduction, beta=self.beta, labels=labels,
                                          backend=self.backend)


class Weighted(nn.Cell):
    """sum(loss * w): w of the student's shape for 'none', 0-d otherwise."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, s, t, labels, w):
        return (self.loss(s, t, labels) * w).sum()


class AllReductions(nn.Cell):
    """((value, d_student, d_teacher) for each of REDUCTIONS) in one graph."""

    def __init__(self, kind, temperature, beta, backend):
        super().__init__()
        self.losses = nn.CellList([Loss(kind, temperature, r, beta, backend) for r in REDUCTIONS])
        self.weighted = nn.CellList([Weighted(loss) for loss in self.losses])
        self.is_none = tuple(r == "none" for r in REDUCTIONS)

    def construct(self, s, t, labels, w_none, w_red):
        res = ()
        for i in range(len(REDUCTIONS)):
            w = w_none if self.is_none[i] else w_red
            ds, dt = ms.grad(self.weighted[i], grad_position=(0, 1))(s, t, labels, w)
            res = res + ((self.losses[i](s, t, labels), ds, dt),)
        return res


class NoLabels(nn.Cell):
    """AllReductions without the labels input (a graph input cannot be None under set_inputs)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def construct(self, s, t, w_none, w_red):
        return self.inner(s, t, None, w_none, w_red)


_CELLS = {}


def all_reductions_cell(mode, backend, temperature, beta, labels, kind=None, specs=None, key=None):
    """The cached Cell for these settings (mode 'pynative', 'graph' or 'jit'); ``specs``: set_inputs for it."""
    kind = kind or ("functional" if mode == "jit" else "cell")
    full_key = (mode, backend, temperature, beta, labels, kind, key)
    if full_key not in _CELLS:
        inner = AllReductions(kind, temperature, beta, backend)
        cell = inner if labels else NoLabels(inner)
        if specs is not None:
            cell.set_inputs(*specs)
        _CELLS[full_key] = ms.jit(cell) if mode == "jit" else cell
    return _CELLS[full_key]


def run_all(mode, backend, s, t, labels=None, temperature=2.0, beta=0.0, w_none=None, w_red=1.0,
            dtype=ms.float32, kind=None, key=None):
    """{reduction: (value, d_student, d_teacher)} as MindSpore Tensors (``key``: all_reductions_cell's)."""
    cell = all_reductions_cell(mode, backend, temperature, beta, labels is not None, kind, key=key)
    if w_none is None:
        w_none = np.ones(np.shape(s))
    args = [Tensor(np.asarray(s), dtype), Tensor(np.asarray(t), dtype)]
    if labels is not None:
        args.append(Tensor(np.asarray(labels, np.int32)))
    args += [Tensor(np.asarray(w_none), dtype), Tensor(np.asarray(w_red), dtype)]
    if mode == "graph":
        with graph_mode():
            res = cell(*args)
    else:
        res = cell(*args)
    return dict(zip(REDUCTIONS, res))
