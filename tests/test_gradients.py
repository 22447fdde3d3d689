"""Gradients: finite differences in float64 (first order against the op itself, second order including the
zero-mass terms where PyTorch gives NaN), both operands always differentiated, and the gradient APIs
(``ms.value_and_grad``, one operand at a time) in PyNative and compiled modes. Gradient values over shapes and
dtypes are checked against the reference in test_values (they come out of the same compiled graphs)."""
import functools

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

import ms_kldiv
from conftest import (REDUCTIONS, call_in_mode, graph_mode, loss_cell, make, reference, run, run_second_order,
                      to_numpy)

F64 = ms.float64
MODES = ("pynative", "jit", "graph")
H = 1e-6

# Finite differences need the loss to be smooth around each point: no target exactly at 0 (the kink of the
# zero-mass rule). Zero-mass terms are present (t = -0.5; t = -inf in log space, which stays -inf when
# perturbed, so its differences are exactly 0 as the SPEC's gradients are).
FD_CASES = {
    "prob-bcast": ([[-0.7, -1.6, -0.2], [-1.1, -0.4, -2.3]], [0.3, -0.5, 0.8], False),
    "logt-bcast": ([-0.9, -1.4, -0.3], [[-1.2, -np.inf, -0.6], [-2.0, -0.8, -np.inf]], True),
}


def _weights(x, t, seed=0):
    rng = np.random.default_rng(seed)
    bshape = np.broadcast_shapes(np.shape(x), np.shape(t))
    return rng.uniform(0.5, 1.5, bshape), 1.3


@functools.lru_cache(maxsize=None)
def _fd_first_order_cached(backend, case, reduction):
    """The differences do not depend on the mode being tested: compute them once per backend and case."""
    x, t, log_target = FD_CASES[case]
    w_none, w_red = _weights(x, t)
    return _fd_first_order(backend, x, t, reduction, log_target, w_none if reduction == "none" else w_red)


def _fd_first_order(backend, x, t, reduction, log_target, w):
    """Central differences of sum(kl_div(x, t) * w) using the op itself (PyNative, float64)."""
    def f(xa, ta):
        out = ms_kldiv.kl_div(ms.Tensor(xa, F64), ms.Tensor(ta, F64), reduction, log_target, backend=backend)
        return float(np.sum(to_numpy(out) * w))

    grads = []
    for which in (0, 1):
        base = [np.array(x, np.float64), np.array(t, np.float64)]
        g = np.zeros_like(base[which])
        for idx in np.ndindex(base[which].shape):
            plus = [a.copy() for a in base]
            minus = [a.copy() for a in base]
            plus[which][idx] += H
            minus[which][idx] -= H
            g[idx] = (f(*plus) - f(*minus)) / (2 * H)
        grads.append(g)
    return grads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(FD_CASES))
def test_first_order_matches_finite_differences(backend, mode, case):
    x, t, log_target = FD_CASES[case]
    w_none, w_red = _weights(x, t)
    xt, tt = make(x, F64)[0], make(t, F64)[0]
    results = run(mode, backend, xt, tt, log_target, w_none=make(w_none, F64)[0], w_red=make(w_red, F64)[0])
    for reduction in REDUCTIONS:
        fdx, fdt = _fd_first_order_cached(backend, case, reduction)
        res = results[reduction]
        np.testing.assert_allclose(to_numpy(res.dx), fdx, rtol=1e-6, atol=1e-7, err_msg=f"{reduction} d/dinput")
        np.testing.assert_allclose(to_numpy(res.dt), fdt, rtol=1e-6, atol=1e-7, err_msg=f"{reduction} d/dtarget")
        # The target gradient is the one MindSpore's own kl_div silently zeroes: make sure it is really there.
        assert np.any(to_numpy(res.dt) != 0), reduction


def _fd_second_order(x, t, reduction, log_target, w, v1, v2):
    """Central differences of g(x, t) = sum(dx * v1 + dt * v2), with the first-order gradients taken from
    the float64 reference (validated against the op and PyTorch elsewhere) so the check stays fast."""
    def g(xa, ta):
        dx, dt = reference(xa, ta, reduction, log_target, w)[1:3]
        return float(np.sum(dx * v1) + np.sum(dt * v2))

    out = []
    for which in (0, 1):
        base = [np.array(x, np.float64), np.array(t, np.float64)]
        d = np.zeros_like(base[which])
        for idx in np.ndindex(base[which].shape):
            plus = [a.copy() for a in base]
            minus = [a.copy() for a in base]
            plus[which][idx] += H
            minus[which][idx] -= H
            d[idx] = (g(*plus) - g(*minus)) / (2 * H)
        out.append(d)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(FD_CASES))
def test_second_order_matches_finite_differences(backend, mode, case):
    """ms.grad of ms.grad, zero-mass terms included (PyTorch is NaN there; the SPEC says 0)."""
    x, t, log_target = FD_CASES[case]
    w_none, w_red = _weights(x, t, 1)
    rng = np.random.default_rng(2)
    v1, v2 = rng.normal(size=np.shape(x)), rng.normal(size=np.shape(t))
    args = [make(a, F64)[0] for a in (x, t, w_none, w_red, v1, v2)]
    results = run_second_order(mode, backend, args[0], args[1], log_target, *args[2:])
    no_mass = np.isneginf(t) if log_target else np.asarray(t) <= 0
    for reduction in REDUCTIONS:
        w = w_none if reduction == "none" else w_red
        fgx, fgt = _fd_second_order(x, t, reduction, log_target, w, v1, v2)
        res = results[reduction]
        gx, gt = to_numpy(res.gx), to_numpy(res.gt)
        assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gt)), reduction
        np.testing.assert_allclose(gx, fgx, rtol=1e-6, atol=1e-7, err_msg=f"{reduction} second order, input")
        np.testing.assert_allclose(gt, fgt, rtol=1e-6, atol=1e-7, err_msg=f"{reduction} second order, target")
        assert np.all(gt[no_mass] == 0), f"{reduction}: zero-mass target's second-order gradient must be 0"


class _ValueAndGrad(nn.Cell):
    """value_and_grad w.r.t. both operands, and grad w.r.t. the target alone, of one loss Cell."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, x, t):
        value, (dx, dt) = ms.value_and_grad(self.loss, grad_position=(0, 1))(x, t)
        dt_only = ms.grad(self.loss, grad_position=1)(x, t)
        dx_only = ms.grad(self.loss, grad_position=0)(x, t)
        return value, dx, dt, dx_only, dt_only


@pytest.mark.parametrize("mode", ("pynative", "jit", "graph"))
@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
def test_value_and_grad_and_single_operand(backend, mode, log_target):
    rng = np.random.default_rng(4)
    x = rng.normal(-1.0, 1.0, (4, 5))
    t = rng.normal(-1.0, 1.0, (5,)) if log_target else rng.uniform(0.05, 1.0, (5,))
    xt, xv = make(x, ms.float32)
    tt, tv = make(t, ms.float32)
    kind = "cell" if mode == "graph" else "functional"
    value, dx, dt, dx_only, dt_only = call_in_mode(
        mode, _ValueAndGrad(loss_cell(kind, backend, "batchmean", log_target)), xt, tt)
    exp = reference(xv, tv, "batchmean", log_target)
    np.testing.assert_allclose(to_numpy(value), exp.out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(dx), exp.dx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(dt), exp.dt, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(dx_only), to_numpy(dx))
    if backend == "composite":
        # the broadcast target's gradient is MindSpore's own autodiff of the broadcast (a ReduceSum), in two separately
        # differentiated graphs: seen 1 and 2 ulp apart (3.9e-7) on CPU under load; ms_kldiv's kernels sum
        # deterministically
        np.testing.assert_allclose(to_numpy(dt_only), to_numpy(dt), rtol=1e-6, atol=0)
    else:
        np.testing.assert_array_equal(to_numpy(dt_only), to_numpy(dt))
    assert dt.shape == (5,) and dx.shape == (4, 5)


def test_grad_of_graph_cell_outside_construct(backend):
    """``ms.grad`` applied from outside to a KLDivLoss Cell while the context is GRAPH_MODE (the common
    training-loop form), not only grads taken inside a compiled construct."""
    rng = np.random.default_rng(6)
    xt, xv = make(rng.normal(size=(3, 4)), F64)
    tt, tv = make(rng.uniform(0.1, 1.0, (3, 4)), F64)
    loss = ms_kldiv.KLDivLoss("sum", backend=backend)
    with graph_mode():
        dx, dt = ms.grad(loss, grad_position=(0, 1))(xt, tt)
    exp = reference(xv, tv, "sum", False)
    np.testing.assert_allclose(to_numpy(dx), exp.dx, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(dt), exp.dt, rtol=1e-12)
