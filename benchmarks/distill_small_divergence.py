"""How accurate the fused distillation kernels' float32 loss and gradients are when the student is close to its
teacher (small divergences: late training, high temperatures), against float64 (ms_kldiv.reference).

    PYTHONPATH=. python benchmarks/distill_small_divergence.py [--vocab 32000] [--rows 8] [--backend aot]

Teacher logits N(0, 3^2) per class; student = teacher + noise * N(0, 1) + 5 (an offset: logits are shift-free).
Prints, per noise, temperature and divergence, the loss and its relative error, the largest error of each
gradient relative to that gradient's largest element (the 'kl' family, whose float64 gradients the reference has),
and the loss of identical inputs (exactly 0 in float64) over T^2: the floor of D per row ('batchmean').
"""
import argparse

import numpy as np

import mindspore as ms

import ms_kldiv
from ms_kldiv import reference

KINDS = (("forward KL", {}), ("reverse KL", {"beta": 1.0}), ("JSD 0.5", {"beta": 0.5}), ("TVD", {"divergence": "tvd"}),
         ("skew KL 0.1", {"divergence": "skew_kl", "alpha": 0.1}),
         ("symmetric KL", {"divergence": "symmetric_kl", "alpha": 0.5}))


def reference_kwargs(kw):
    beta = kw.get("beta", 0.0)
    extra = {k: kw[k] for k in ("divergence", "alpha") if k in kw}
    return beta, extra


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--backend", default="aot")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    t = (rng.normal(size=(args.rows, args.vocab)) * 3).astype(np.float32)
    print(f"{'noise':>6s} {'T':>5s} {'divergence':14s} {'loss':>10s} {'rel err':>8s} {'d_s err':>8s} {'d_t err':>8s}"
          f" {'same: D/T^2':>12s}")
    for noise in (1.0, 0.1, 0.01):
        s = (t + noise * rng.normal(size=t.shape) + 5.0).astype(np.float32)
        for temperature in (1.0, 4.0, 20.0):
            for name, kw in KINDS:
                beta, extra = reference_kwargs(kw)

                def loss(a, b, kw=kw, temperature=temperature):
                    return ms_kldiv.distillation_loss(a, b, temperature, backend=args.backend, **kw)
                value, (ds, dt) = ms.value_and_grad(loss, grad_position=(0, 1))(ms.Tensor(s), ms.Tensor(t))
                exact = reference.distillation_loss(s, t, temperature, "batchmean", beta, **extra)
                err = ["-", "-"]
                if not extra:  # the float64 gradients of the 'kl' family (beta)
                    ref = reference.distillation_grads(s, t, temperature, "batchmean", beta)
                    err = [f"{np.abs(g.asnumpy() - r).max() / np.abs(r).max():.1e}" for g, r in zip((ds, dt), ref)]
                same = float(loss(ms.Tensor(t), ms.Tensor(t))) / temperature ** 2
                print(f"{noise:6g} {temperature:5g} {name:14s} {exact:10.3e} {abs(float(value) - exact) / exact:8.1e} "
                      f"{err[0]:>8s} {err[1]:>8s} {same:12.1e}", flush=True)


if __name__ == "__main__":
    main()
