"""ms_kldiv in every execution style: functional (PyNative), under ms.jit, a Cell in GRAPH_MODE, dynamic batch sizes.

Every number printed is compared with ms_kldiv.reference, a float64 NumPy implementation of the same contract.

Run:  python examples/functional_and_graph.py
"""
import time

import numpy as np

import ms_kldiv  # first: keeps MindSpore's compiler files out of the working directory
import mindspore as ms
from mindspore import Tensor, nn, ops
from ms_kldiv import reference

C = 6


def log_softmax_np(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def batch(rng, n):
    """(log-probabilities, probabilities) of two random distributions over C classes, float32."""
    x = log_softmax_np(rng.standard_normal((n, C)) * 2).astype(np.float32)
    t = np.exp(log_softmax_np(rng.standard_normal((n, C)) * 2)).astype(np.float32)
    return x, t


def err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def functional_pynative(rng):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, t = batch(rng, 4)
    worst = 0.0
    for reduction in ("none", "mean", "batchmean", "sum"):
        out = ms_kldiv.kl_div(Tensor(x), Tensor(t), reduction=reduction)
        worst = max(worst, err(out.asnumpy(), reference.kl_div(x, t, reduction)))
    gx, gt = ms.grad(lambda a, b: ms_kldiv.kl_div(a, b, "batchmean"), grad_position=(0, 1))(Tensor(x), Tensor(t))
    ex, et = reference.kl_div_grads(x, t, "batchmean")
    print(f"functional, PyNative: 4 reductions, max error {worst:.1e}; "
          f"d/dinput error {err(gx.asnumpy(), ex):.1e}, d/dtarget error {err(gt.asnumpy(), et):.1e} "
          f"(target gradient norm {np.linalg.norm(gt.asnumpy()):.4f})")


def functional_jit(rng):
    ms.set_context(mode=ms.PYNATIVE_MODE)

    @ms.jit
    def step(x, log_t):
        # log_target=True: the target is given in log space, as log_softmax produces it
        return ms.value_and_grad(lambda a, b: ms_kldiv.kl_div(a, b, "batchmean", log_target=True),
                                 grad_position=(0, 1))(x, log_t)

    x, t = batch(rng, 5)
    log_t = np.log(t)
    loss, (gx, gt) = step(Tensor(x), Tensor(log_t))
    ex, et = reference.kl_div_grads(x, log_t, "batchmean", log_target=True)
    print(f"functional under ms.jit (value_and_grad, log_target=True): loss {float(loss.asnumpy()):.6f}, "
          f"error {err(loss.asnumpy(), reference.kl_div(x, log_t, 'batchmean', True)):.1e}; "
          f"gradient errors {err(gx.asnumpy(), ex):.1e} / {err(gt.asnumpy(), et):.1e}")


class Student(nn.Cell):
    """A linear classifier whose output distribution is fitted to a target distribution with KLDivLoss."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, C)
        self.loss = ms_kldiv.KLDivLoss(reduction="batchmean")

    def construct(self, feats, target):
        return self.loss(ops.log_softmax(self.fc(feats), -1), target)


def cell_graph_mode(rng):
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = Student()
    feats = rng.standard_normal((32, 8)).astype(np.float32)
    _, t = batch(rng, 32)
    before = float(net(Tensor(feats), Tensor(t)).asnumpy())
    w = net.fc.weight.asnumpy().astype(np.float64)
    b = net.fc.bias.asnumpy().astype(np.float64)
    expected = reference.kl_div(log_softmax_np(feats @ w.T + b), t, "batchmean")
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=1.0))
    for _ in range(50):
        step(Tensor(feats), Tensor(t))
    after = float(net(Tensor(feats), Tensor(t)).asnumpy())
    print(f"Cell in GRAPH_MODE: loss {before:.5f} (error vs reference {abs(before - expected):.1e}), "
          f"after 50 SGD steps {after:.5f}")


def dynamic_batch(rng):
    ms.set_context(mode=ms.GRAPH_MODE)
    loss = ms_kldiv.KLDivLoss(reduction="batchmean")
    # One compiled graph for every batch size: the batch dimension is declared unknown.
    loss.set_inputs(Tensor(shape=[None, C], dtype=ms.float32), Tensor(shape=[None, C], dtype=ms.float32))
    sizes, worst = (3, 7, 16, 1), 0.0
    start = time.time()
    try:
        for n in sizes:
            x, t = batch(rng, n)
            worst = max(worst, err(loss(Tensor(x), Tensor(t)).asnumpy(), reference.kl_div(x, t, "batchmean")))
    except Exception as e:  # noqa: BLE001 -- report which backend cannot, then keep going
        backend = [b["name"] for b in ms_kldiv.backend_info() if b["auto"]][0]
        print(f"dynamic batch sizes (set_inputs [None, {C}]): NOT SUPPORTED by backend '{backend}': "
              f"{type(e).__name__}: {str(e).splitlines()[0]}")
        return
    print(f"dynamic batch sizes (set_inputs [None, {C}]): batches {sizes} through one graph, "
          f"max error vs reference {worst:.1e} ({time.time() - start:.2f} s)")

    dist = ms_kldiv.distillation.DistillationLoss(temperature=2.0)
    dist.set_inputs(Tensor(shape=[None, C], dtype=ms.float32), Tensor(shape=[None, C], dtype=ms.float32))
    worst = 0.0
    for n in (2, 9):
        s, te = (rng.standard_normal((n, C)) * 3).astype(np.float32), (rng.standard_normal((n, C)) * 3).astype(np.float32)
        exp = 4.0 * reference.kl_div(log_softmax_np(s / 2.0), log_softmax_np(te / 2.0), "batchmean", True)
        worst = max(worst, err(dist(Tensor(s), Tensor(te)).asnumpy(), exp))
    print(f"dynamic batch sizes, DistillationLoss(T=2): batches (2, 9), max error vs reference {worst:.1e}")


def main():
    start = time.time()
    print("backends on this device: " + ", ".join(
        f"{b['name']}{' (auto)' if b['auto'] else ''}{'' if b['available'] else ' unavailable'}"
        for b in ms_kldiv.backend_info()))
    rng = np.random.default_rng(0)
    functional_pynative(rng)
    functional_jit(rng)
    cell_graph_mode(rng)
    dynamic_batch(rng)
    print(f"elapsed: {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
