"""The CPU PyNative fast path (ms_kldiv.backends.aot.HostCall): PyNative calls that autograd does not record
run the exported forward kernel directly on the tensors' host memory instead of through ops.Custom.

It must give exactly what the primitive gives (same symbol, same inputs), be taken only when nothing is
being differentiated, wait for the ops that produce its inputs, and never change a gradient. Values are
also checked against the float64 reference (the whole suite's PyNative value checks run through it too:
conftest's ``run`` computes values outside ``ms.grad``)."""
import os
import sys

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_kldiv
from ms_kldiv import reference as ref
from ms_kldiv.backends import get_op
from ms_kldiv.backends.aot import HostCall
from conftest import DTYPES, DTYPE_IDS, assert_close, make, reference, to_numpy
import _procs

AOT = {r["name"]: r for r in ms_kldiv.backend_info()}.get("aot", {})
# async_dispatch: the host call reads tensors that the default dispatch may still be computing (tests/conftest.py)
pytestmark = [pytest.mark.skipif(not AOT.get("available"), reason=f"aot backend unavailable: {AOT.get('reason')}"),
              pytest.mark.async_dispatch]

SHAPES = [((6, 7), (6, 7)), ((), ()), ((4,), ()), ((4, 1, 5), (3, 1)), ((), (3, 2)), ((0, 3), (3,)), ((70000,), (70000,))]


class _Spy:
    """Counts the direct kernel calls of a HostCall."""

    def __init__(self, op):
        self.op, self.fn, self.calls = op, op._fn, 0

    def __enter__(self):
        def counted(*args):
            self.calls += 1
            return self.fn(*args)
        self.op._fn = counted
        return self

    def __exit__(self, *exc):
        self.op._fn = self.fn


def _data(xs, ts, log_target, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs) - 2.0
    t = rng.random(ts)
    if t.size >= 2:
        t.flat[0] = 0.0
        t.flat[1] = -1.0
    if log_target:
        with np.errstate(divide="ignore"):
            t = np.log(np.where(t > 0, t, 0.0))
    return x, t


@pytest.mark.isa_independent
def test_cpu_pynative_op_is_a_host_call():
    op = get_op("aot", "sum", False)
    assert isinstance(op, HostCall)
    assert get_op("aot", "sum", False, graph=True) is not op  # compiled code gets the primitive


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("reduction", ref.REDUCTIONS)
@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
@pytest.mark.parametrize("xs,ts", SHAPES, ids=[f"{a}-{b}" for a, b in SHAPES])
def test_same_bits_as_the_primitive_and_close_to_reference(dtype, reduction, log_target, xs, ts):
    x, t = _data(xs, ts, log_target)
    xt, xv = make(x, dtype)
    tt, tv = make(t, dtype)
    op = get_op("aot", reduction, log_target)
    with _Spy(op) as spy:
        out = ms_kldiv.kl_div(xt, tt, reduction, log_target, backend="aot")
    assert spy.calls == 1
    prim = op.prim(xt, tt)
    assert out.dtype == prim.dtype == dtype and out.shape == prim.shape
    np.testing.assert_array_equal(to_numpy(out), to_numpy(prim))
    exp = reference(xv, tv, reduction, log_target)
    assert_close(to_numpy(out), exp.out, dtype, exp.out_mag, what=f"{reduction} {xs} vs {ts}")


def test_waits_for_the_ops_producing_its_inputs():
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((512, 256)) - 2, rng.random((512, 256))
    xt, tt = ms.Tensor(x, ms.float32), ms.Tensor(t, ms.float32)
    op = get_op("aot", "none", False)
    e = np.exp(3 * t.astype(np.float32))
    bv = e / e.sum(-1, keepdims=True)
    for _ in range(5):  # produced asynchronously by a chain of PyNative ops, then used at once
        a = (xt * 2.0 + 1.0) - 1.0
        b = ops.softmax(tt * 3.0, axis=-1)
        with _Spy(op) as spy:
            out = ms_kldiv.kl_div(a, b, "none", backend="aot")
        assert spy.calls == 1
        exp = reference(2 * x.astype(np.float32), bv, "none", False)
        assert_close(to_numpy(out), exp.out, ms.float32, exp.out_mag)


def test_non_contiguous_inputs():
    rng = np.random.default_rng(2)
    x, t = rng.standard_normal((8, 6)) - 2, rng.random((6, 8))
    xt, tt = ms.Tensor(x, ms.float32), ms.Tensor(t, ms.float32)
    tv = ops.transpose(tt, (1, 0))  # a strided view in PyNative
    xs = xt[:, ::2]
    out = ms_kldiv.kl_div(xs, tv[:, ::2], "none", backend="aot")
    exp = reference(x.astype(np.float32)[:, ::2], t.astype(np.float32).T[:, ::2], "none", False)
    assert_close(to_numpy(out), exp.out, ms.float32, exp.out_mag)
    for sl in [(slice(3, None),), (slice(1, None), slice(2, None)), (slice(None), 5)]:  # views with an offset
        out = ms_kldiv.kl_div(xt[sl], xt[sl] * 0 + tt.T[sl], "sum", backend="aot")
        exp = reference(x.astype(np.float32)[sl], t.astype(np.float32).T[sl], "sum", False)
        assert_close(to_numpy(out), exp.out, ms.float32, exp.out_mag, what=str(sl))


@pytest.mark.parametrize("how", ["grad", "value_and_grad", "cell_grad", "train_step"])
def test_autograd_gets_the_primitive(how):
    rng = np.random.default_rng(3)
    x, t = rng.standard_normal((5, 4)) - 2, rng.random((5, 4))
    xt, tt = ms.Tensor(x, ms.float32), ms.Tensor(t, ms.float32)
    op = get_op("aot", "batchmean", False)
    loss = ms_kldiv.KLDivLoss("batchmean")
    expected_dx = ref.kl_div_grads(x, t, "batchmean", False)[0]

    def f(a, b):
        return ms_kldiv.kl_div(a, b, "batchmean")

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.full((5, 4), 0.0 if how == "train_step" else 1.0, np.float32)))

        def construct(self, a, b):
            return loss(a * self.w, b)

    with _Spy(op) as spy:
        if how == "grad":
            dx = ms.grad(f)(xt, tt)
        elif how == "value_and_grad":
            _, dx = ms.value_and_grad(f)(xt, tt)
        elif how == "cell_grad":
            net = Net()
            dx = ops.GradOperation()(net)(xt, tt)
        else:
            net = Net()
            step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=1.0))
            step(xt, tt)
            dx = ms.Tensor(-net.w.asnumpy())  # w = 0 - 1.0 * dL/dw exactly; dL/dw = dL/da * x
            expected_dx = expected_dx * x
    assert spy.calls == 0
    assert_close(to_numpy(dx), expected_dx, ms.float32)


@pytest.mark.isa_independent
def test_environment_switch_turns_it_off():
    code = ("import ms_kldiv\nfrom ms_kldiv.backends import get_op\nfrom ms_kldiv.backends.aot import HostCall\n"
            "print(type(get_op('aot', 'sum', False)).__name__)")
    env = dict(os.environ, MS_KLDIV_HOST_CALL="0")
    out = _procs.run([sys.executable, "-c", code], 300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] != "HostCall"
