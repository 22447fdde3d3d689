"""Shared by the fused-head tests: a small case, the unchunked composition in float64 and its central-difference
gradients, and running a head under value_and_grad in PyNative or GRAPH_MODE."""
import numpy as np

import mindspore as ms
from mindspore import nn

from ms_kldiv.reference import distillation_loss as distillation_reference

from _checks import central_differences
from _runners import graph_mode

N, H_S, H_T, V = 10, 6, 5, 13
IGNORE = -100


def case(seed=0, padded=False, labels_ignored=(1, 4), rows=N):
    rng = np.random.default_rng(seed)
    c = dict(hs=rng.normal(size=(rows, H_S)), ws=rng.normal(size=(V, H_S)) * 0.5, bs=rng.normal(size=V) * 0.1,
             ht=rng.normal(size=(rows, H_T)), wt=rng.normal(size=(V, H_T)) * 0.5, bt=rng.normal(size=V) * 0.1)
    labels = rng.integers(0, V - 2 if padded else V, rows)
    labels[list(labels_ignored)] = IGNORE
    c["labels"] = labels
    if padded:  # the last two vocabulary entries are padding in both models
        c["bs"][-2:] = -np.inf
        c["bt"][-2:] = -np.inf
    return c


def log_softmax(z):
    m = np.max(np.where(np.isfinite(z), z, -np.inf), -1, keepdims=True)
    with np.errstate(invalid="ignore"):
        out = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
    return out


def reference_loss(c, temperature, beta, hard_weight, soft_weight, labels=True):
    """The unchunked composition in float64: logits of both heads, the distillation loss ('batchmean' over the
    counted rows) and the cross-entropy of the student's logits (mean over the same rows)."""
    s = c["hs"] @ c["ws"].T + c["bs"]
    t = c["ht"] @ c["wt"].T + c["bt"]
    rows = s.shape[0]
    lab = c["labels"] if labels else np.zeros(rows, np.int64)
    keep = lab != IGNORE if labels else np.ones(rows, bool)
    soft = distillation_reference(s, t, temperature, "sum", beta=beta, labels=lab if labels else None,
                                  ignore_index=IGNORE)
    ce = -log_softmax(s)[np.arange(rows), np.where(keep, lab, 0)]
    total = soft_weight * soft + hard_weight * np.sum(np.where(keep, ce, 0.0))
    return total / max(int(keep.sum()), 1)


central = central_differences


NAMES = ("hs", "ws", "ht", "wt", "bs", "bt")


def reference_grads(c, *args):
    out = {}
    for name in NAMES:
        def f(a, name=name):
            return reference_loss({**c, name: a}, *args)
        out[name] = central(f, c[name])
    return out


class Net(nn.Cell):
    def __init__(self, loss_fn):
        super().__init__()
        self.loss_fn = loss_fn

    def construct(self, hs, ws, ht, wt, labels, bs, bt):
        return self.loss_fn(hs, ws, ht, wt, labels, bs, bt)


def tensors(c, dtype=ms.float32):
    return [ms.Tensor(c[k], dtype) for k in ("hs", "ws", "ht", "wt")], ms.Tensor(c["labels"], ms.int32), \
        [ms.Tensor(c[k], dtype) for k in ("bs", "bt")]


def value_and_grads(net, c, mode):
    (hs, ws, ht, wt), labels, (bs, bt) = tensors(c)
    grad_fn = ms.value_and_grad(net, grad_position=(0, 1, 2, 3, 5, 6))
    if mode == "graph":
        with graph_mode():
            value, grads = grad_fn(hs, ws, ht, wt, labels, bs, bt)
    else:
        value, grads = grad_fn(hs, ws, ht, wt, labels, bs, bt)
    return float(value.asnumpy()), dict(zip(NAMES, (g.asnumpy().astype(np.float64) for g in grads)))
