"""Bandwidth of libkldiv_cuda.so's kernels vs a device-to-device copy and torch's GPU kl_div.

    PYTHONPATH=. python benchmarks/gpu/bench_bandwidth.py [--n 33554432] [--dtype float32] [--reps 50]

Effective bandwidth = bytes the op must move at least once / median time (CUDA events, after warm-up):
    forward 'none'  : read x, t; write out           3 n elements
    forward 'sum'   : read x, t                      2 n
    backward 'none' : read x, t, dout; write dx, dt  5 n
    backward 'sum'  : read x, t; write dx, dt        4 n
    copy            : read n, write n                2 n   (torch's clone: the practical ceiling)
torch rows time F.kl_div (forward, and forward+backward through autograd for both gradients) with the
same byte counts, so the GB/s columns compare work done per second.
"""
import argparse
import os
import sys

# the ctypes harness of the GPU tests
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests", "gpu"))

from _harness import backward, forward, lib, timed, torch_cuda_reason  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 25)
    p.add_argument("--dtype", default="float32", choices=["float16", "bfloat16", "float32", "float64"])
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args(argv)
    reason = torch_cuda_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    import torch
    import torch.nn.functional as F
    dtype = getattr(torch, args.dtype)
    n = args.n
    esize = torch.empty((), dtype=dtype).element_size()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.log_softmax(torch.randn(n, device="cuda", generator=g), 0).to(dtype)
    t = torch.softmax(torch.randn(n, device="cuda", generator=g), 0).to(dtype)
    dout = torch.ones(n, device="cuda", dtype=dtype)
    one = torch.ones((), device="cuda", dtype=dtype)

    def torch_fwd_bwd(red):
        xr = x.detach().requires_grad_()
        tr = t.detach().requires_grad_()
        out = F.kl_div(xr, tr, reduction=red)
        (out.sum() if red == "none" else out).backward()

    rows = [
        ("copy (torch clone)", 2, lambda: x.clone()),
        ("kldiv fwd none", 3, lambda: forward(x, t, "none", False)),
        ("kldiv fwd sum", 2, lambda: forward(x, t, "sum", False)),
        ("kldiv bwd none", 5, lambda: backward(x, t, dout, "none", False)),
        ("kldiv bwd sum", 4, lambda: backward(x, t, one, "sum", False)),
        ("torch kl_div fwd none", 3, lambda: F.kl_div(x, t, reduction="none")),
        ("torch kl_div fwd sum", 2, lambda: F.kl_div(x, t, reduction="sum")),
        ("torch kl_div fwd+bwd none", 3 + 5, lambda: torch_fwd_bwd("none")),
        ("torch kl_div fwd+bwd sum", 2 + 4, lambda: torch_fwd_bwd("sum")),
        ("kldiv fwd+bwd none", 3 + 5, lambda: (forward(x, t, "none", False), backward(x, t, dout, "none", False))),
        ("kldiv fwd+bwd sum", 2 + 4, lambda: (forward(x, t, "sum", False), backward(x, t, one, "sum", False))),
    ]
    print(f"device: {torch.cuda.get_device_name()}  n={n}  dtype={args.dtype}  torch {torch.__version__}")
    print(f"library: {lib().KLDivLibInfo().decode()}")
    print(f"{'op':28s} {'ms':>9s} {'GB/s':>9s}")
    for name, elems, fn in rows:
        sec = timed(fn, args.reps)
        print(f"{name:28s} {sec * 1e3:9.3f} {elems * n * esize / sec / 1e9:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
