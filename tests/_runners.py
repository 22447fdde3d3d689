"""How the suite executes a case: the modes, the Cells that compute values and first/second-order gradients of
several reductions in one compiled graph, and the functions that run them. See conftest.py's docstring."""
import contextlib
from collections import namedtuple

import numpy as np

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv import reference as ref

from _checks import make

REDUCTIONS = ref.REDUCTIONS
MODES = ("pynative", "jit", "graph", "pynative_cell")
COMPILED_MODES = ("jit", "graph")


@contextlib.contextmanager
def graph_mode():
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=previous)


def _wide(v):
    return ops.cast(v, ms.float32) if v.dtype in (ms.float16, ms.bfloat16) else v


class FunctionalLoss(nn.Cell):
    """``ms_kldiv.kl_div`` as a Cell, so the functional can be compiled with ``ms.jit``."""

    def __init__(self, backend, reduction, log_target):
        super().__init__()
        self.backend = backend
        self.reduction = reduction
        self.log_target = log_target

    def construct(self, x, t):
        return ms_kldiv.kl_div(x, t, self.reduction, self.log_target, backend=self.backend)


class Weighted(nn.Cell):
    """sum(loss(x, t) * w): w injects an arbitrary incoming gradient (sensitivity). Multiplied and summed in
    float32 at least: MindSpore's CPU ReduceSum has no bfloat16 kernel, nor (before 2.9) does its Mul. The
    widening is exact, so the op still receives bf16(w) as its incoming gradient."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, x, t, w):
        return (_wide(self.loss(x, t)) * _wide(w)).sum()


class FirstOrder(nn.Cell):
    """sum(dx * v1 + dt * v2) for the gradients of ``Weighted``: its gradient is the second order."""

    def __init__(self, weighted):
        super().__init__()
        self.weighted = weighted

    def construct(self, x, t, w, v1, v2):
        dx, dt = ms.grad(self.weighted, grad_position=(0, 1))(x, t, w)
        return (_wide(dx) * _wide(v1)).sum() + (_wide(dt) * _wide(v2)).sum()


class AllReductions(nn.Cell):
    """Value (and gradients) for several reductions in one Cell: one compile serves all of them."""

    def __init__(self, losses, reductions, grads):
        super().__init__()
        self.losses = nn.CellList(losses)
        self.weighted = nn.CellList([Weighted(l) for l in losses])
        self.is_none = tuple(r == "none" for r in reductions)
        self.grads = grads
        self.n = len(losses)

    def construct(self, x, t, w_none, w_red):
        res = ()
        for i in range(self.n):
            out = self.losses[i](x, t)
            if self.grads:
                w = w_none if self.is_none[i] else w_red
                dx, dt = ms.grad(self.weighted[i], grad_position=(0, 1))(x, t, w)
                res = res + ((out, dx, dt),)
            else:
                res = res + ((out,),)
        return res


class AllSecondOrders(nn.Cell):
    """Value, first- and second-order gradients for several reductions, in one compiled graph."""

    def __init__(self, losses, reductions):
        super().__init__()
        self.losses = nn.CellList(losses)
        self.weighted = nn.CellList([Weighted(l) for l in losses])
        self.first = nn.CellList([FirstOrder(w) for w in self.weighted])
        self.is_none = tuple(r == "none" for r in reductions)
        self.n = len(losses)

    def construct(self, x, t, w_none, w_red, v1, v2):
        res = ()
        for i in range(self.n):
            w = w_none if self.is_none[i] else w_red
            out = self.losses[i](x, t)
            dx, dt = ms.grad(self.weighted[i], grad_position=(0, 1))(x, t, w)
            gx, gt = ms.grad(self.first[i], grad_position=(0, 1))(x, t, w, v1, v2)
            res = res + ((out, dx, dt, gx, gt),)
        return res


_CELLS = {}


def _cached(key, factory):
    if key not in _CELLS:
        _CELLS[key] = factory()
    return _CELLS[key]


def loss_cell(kind, backend, reduction, log_target):
    def factory():
        if kind == "cell":
            return ms_kldiv.KLDivLoss(reduction, log_target, backend=backend)
        return FunctionalLoss(backend, reduction, log_target)
    return _cached(("loss", kind, backend, reduction, log_target), factory)


def _kind(mode):
    return "cell" if mode in ("graph", "pynative_cell") else "functional"


def call_in_mode(mode, cell, *args):
    if mode == "jit":
        return _cached(("jit", id(cell)), lambda: ms.jit(cell))(*args)
    if mode == "graph":
        with graph_mode():
            return cell(*args)
    return cell(*args)


def _ones_like_out(x, t, dtype):
    shape = np.broadcast_shapes(tuple(x.shape), tuple(t.shape))
    return make(np.ones(shape), dtype)[0], make(1.0, dtype)[0]


Outcome = namedtuple("Outcome", "out dx dt")


def run(mode, backend, x, t, log_target=False, reductions=REDUCTIONS, grads=True, w_none=None, w_red=None):
    assert mode in MODES, mode
    reductions = tuple(reductions)
    if w_none is None or w_red is None:
        ones_none, ones_red = _ones_like_out(x, t, x.dtype)
        w_none = ones_none if w_none is None else w_none
        w_red = ones_red if w_red is None else w_red
    kind = _kind(mode)
    cell = _cached(("all", kind, backend, log_target, reductions, grads), lambda: AllReductions(
        [loss_cell(kind, backend, r, log_target) for r in reductions], reductions, grads))
    res = call_in_mode(mode, cell, x, t, w_none, w_red)
    return {r: Outcome(*(tuple(o) + (None, None))[:3]) for r, o in zip(reductions, res)}


def run_second_order(mode, backend, x, t, log_target, w_none, w_red, v1, v2, reductions=REDUCTIONS):
    assert mode in MODES, mode
    reductions = tuple(reductions)
    kind = _kind(mode)
    cell = _cached(("second", kind, backend, log_target, reductions), lambda: AllSecondOrders(
        [loss_cell(kind, backend, r, log_target) for r in reductions], reductions))
    res = call_in_mode(mode, cell, x, t, w_none, w_red, v1, v2)
    return {r: SecondOrder(*g) for r, g in zip(reductions, res)}


SecondOrder = namedtuple("SecondOrder", "out dx dt gx gt")
