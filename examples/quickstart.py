"""ms_kldiv quickstart: reproduce the documented values in PyNative and GRAPH_MODE, then train a small model.

Run:  python examples/quickstart.py
Exits non-zero if any documented value is not reproduced or the loss does not go down.
"""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

import ms_kldiv

F32 = ms.float32
ONEFLOW_X = [-0.9021705, 0.08798598, 1.04686249]
ONEFLOW_T = [1.22386942, -0.89729659, 0.01615712]
# (name, input, target, reduction, log_target, documented value)
DOCUMENTED = [
    ("mint example", [[0.5, 0.5], [0.4, 0.6]], [[0., 1.], [1., 0.]], "mean", False, -0.225),
    ("ops example", [0.2, 0.7, 0.1], [0., 1., 0.], "mean", False, -0.23333333),
    ("OneFlow 'none'", ONEFLOW_X, ONEFLOW_T, "none", False, [1.3514, 0.0000, -0.0836]),
    ("OneFlow 'mean'", ONEFLOW_X, ONEFLOW_T, "mean", False, 0.4226),
    ("OneFlow 'sum', log_target", ONEFLOW_X, ONEFLOW_T, "sum", True, 5.7801),
]


def reproduce_documented_values():
    ok = True
    for mode_name, mode in (("PyNative", ms.PYNATIVE_MODE), ("GRAPH_MODE", ms.GRAPH_MODE)):
        ms.set_context(mode=mode)
        print(f"\n{mode_name}: documented values (backend 'auto')")
        for name, x, t, reduction, log_target, expected in DOCUMENTED:
            loss = ms_kldiv.KLDivLoss(reduction=reduction, log_target=log_target)
            got = loss(Tensor(x, F32), Tensor(t, F32)).asnumpy()
            decimals = 8 if name in ("ops example",) else 4
            match = np.allclose(got, expected, atol=0.6 * 10 ** -decimals)
            ok &= match
            print(f"  {name:28s} {np.round(got, decimals)!s:32s} documented {expected}  {'OK' if match else 'MISMATCH'}")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return ok


def functional_and_jit():
    x = Tensor([[0.5, 0.5], [0.4, 0.6]], F32)
    t = Tensor([[0., 1.], [1., 0.]], F32)

    def loss_fn(x, t):  # graph mode differentiates functions without default arguments
        return ms_kldiv.kl_div(x, t, reduction="batchmean")

    @ms.jit
    def loss_and_grads(x, t):
        return ms.value_and_grad(loss_fn, grad_position=(0, 1))(x, t)

    value, (dx, dt) = loss_and_grads(x, t)
    print(f"\nfunctional under ms.jit: loss {value.asnumpy():.4f}")
    print(f"  d/dinput  {dx.asnumpy().tolist()}")
    print(f"  d/dtarget {dt.asnumpy().tolist()}   (MindSpore's own kl_div returns zeros here)")


class Student(nn.Cell):
    def __init__(self, n_in, n_classes):
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(n_in, 32), nn.ReLU(), nn.Dense(32, n_classes))

    def construct(self, x):
        return ops.log_softmax(self.body(x), axis=-1)


class WithKL(nn.Cell):
    def __init__(self, net, loss):
        super().__init__()
        self.net, self.loss = net, loss

    def construct(self, x, soft_labels):
        return self.loss(self.net(x), soft_labels)


def train_small_model(steps=200):
    """Fit soft labels (a teacher's distribution) with KLDivLoss('batchmean') in GRAPH_MODE."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    n, n_in, n_classes = 256, 16, 5
    feats = rng.standard_normal((n, n_in)).astype(np.float32)
    teacher_logits = feats @ rng.standard_normal((n_in, n_classes)).astype(np.float32)
    soft = np.exp(teacher_logits - teacher_logits.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    net = Student(n_in, n_classes)
    step = nn.TrainOneStepCell(WithKL(net, ms_kldiv.KLDivLoss(reduction="batchmean")),
                               nn.Adam(net.trainable_params(), learning_rate=1e-2))
    x, y = Tensor(feats), Tensor(soft.astype(np.float32))
    losses = [float(step(x, y).asnumpy()) for _ in range(steps)]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    print(f"\ntraining a small model with KLDivLoss('batchmean') in GRAPH_MODE ({steps} steps):")
    print(f"  KL(teacher || student): step 1 {losses[0]:.4f} -> step {steps} {losses[-1]:.4f}")
    return losses[-1] < 0.25 * losses[0]


def main():
    print("ms_kldiv", ms_kldiv.__version__, "on MindSpore", ms.__version__, "device", ms.get_context("device_target"))
    for row in ms_kldiv.backend_info():
        state = "available" if row["available"] else f"unavailable: {row['reason']}"
        print(f"  backend {row['name']:10s}{' (auto)' if row['auto'] else '       '} {state}")
    ok = reproduce_documented_values()
    functional_and_jit()
    ok &= train_small_model()
    print("\nall documented values reproduced, loss decreased" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
