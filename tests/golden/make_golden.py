"""Regenerate ``kldiv_torch_golden.json``: PyTorch's kl_div values, gradients and second-order gradients.

    python tests/golden/make_golden.py      # needs torch 2.x (CPU is enough); the tests do not

Cases use strictly positive (or finite log-space) targets: where the SPEC's zero-mass rule applies PyTorch
returns NaN, and those cases are checked against ``ms_kldiv.reference`` and finite differences instead.
For every case and reduction the file holds, in float64:
    out            torch.nn.functional.kl_div(x, t, reduction, log_target)
    dx, dt         gradients of sum(out * w)   (w = w_none for 'none', the scalar w_red otherwise)
    gx, gt         gradients of sum(dx * v1 + dt * v2)   (second order, create_graph=True)
"""
import json
import os
import warnings

import numpy as np
import torch

REDUCTIONS = ("none", "mean", "batchmean", "sum")
# (name, input shape, target shape, log_target)
CASES = [
    ("same-prob", (3, 4), (3, 4), False),
    ("same-logt", (3, 4), (3, 4), True),
    ("bcast-prob", (2, 1, 3), (4, 3), False),
    ("bcast-logt", (4,), (3, 4), True),
    ("scalar-input-prob", (), (2, 3), False),
    ("scalar-target-logt", (2, 3), (), True),
]
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kldiv_torch_golden.json")


def torch_case(x, t, log_target, reduction, w, v1, v2):
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tt = torch.tensor(t, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'mean' warns that it is not the KL divergence
        out = torch.nn.functional.kl_div(xt, tt, reduction=reduction, log_target=log_target)
    dx, dt = torch.autograd.grad((out * torch.tensor(w)).sum(), (xt, tt), create_graph=True)
    gx, gt = torch.autograd.grad((dx * torch.tensor(v1)).sum() + (dt * torch.tensor(v2)).sum(), (xt, tt))
    return {k: v.detach().numpy().tolist() for k, v in
            (("out", out), ("dx", dx), ("dt", dt), ("gx", gx), ("gt", gt))}


def main():
    rng = np.random.default_rng(20240601)
    cases = []
    for name, xs, ts, log_target in CASES:
        x = rng.normal(-1.0, 1.0, xs)
        t = rng.normal(-1.0, 0.8, ts) if log_target else rng.uniform(0.05, 1.0, ts)
        bshape = np.broadcast_shapes(xs, ts)
        w_none = rng.uniform(0.5, 1.5, bshape)
        w_red = float(rng.uniform(0.5, 1.5))
        v1, v2 = rng.normal(size=xs), rng.normal(size=ts)
        results = {}
        for reduction in REDUCTIONS:
            w = w_none if reduction == "none" else np.asarray(w_red)
            results[reduction] = torch_case(x, t, log_target, reduction, w, v1, v2)
            for key in results[reduction]:
                assert np.all(np.isfinite(results[reduction][key])), (name, reduction, key)
        cases.append({"name": name, "log_target": log_target, "x_shape": list(xs), "t_shape": list(ts),
                      "x": x.tolist(), "t": t.tolist(), "w_none": w_none.tolist(), "w_red": w_red,
                      "v1": v1.tolist(), "v2": v2.tolist(), "results": results})
    doc = {"generator": "tests/golden/make_golden.py", "torch": torch.__version__, "dtype": "float64",
           "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} cases x {len(REDUCTIONS)} reductions (torch {torch.__version__})")


if __name__ == "__main__":
    main()
