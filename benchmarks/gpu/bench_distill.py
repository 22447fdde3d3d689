"""libkldiv_cuda.so's distillation kernels at LLM sizes vs torch's eager loss, on a CUDA device (torch only).

    PYTHONPATH=. python benchmarks/gpu/bench_distill.py [--sizes 4096x32000,8192x131072] [--dtypes float32,bfloat16]
        [--json FILE]

For each size and dtype: the fused forward (``DistillFwd``: one row's statistics) and backward (``DistillBwd``:
both gradients) of every divergence, median of CUDA-event timings after warm-up, with

- GB/s: the bytes the kernels must move at least once (forward reads s and t; backward reads s and t and writes
  ds and dt), against a device-to-device copy of the same bytes, the ceiling;
- x fkl: time relative to forward KL (the cost of the divergence's extra math);
- the stored-teacher kernels (``SparseFwd``/``SparseBwd``, top-64 teacher) on the same student;
- torch's eager forward KL (log_softmax of both, ``F.kl_div(log_target=True)``, float32 math, autograd for both
  gradients) and its peak memory above the inputs: what a TRL-style loss costs without fusion.

``--json FILE`` also writes every fused timing, {"ROWSxVOCAB DTYPE": {"OP PART": ms}} (compare_builds.py reads it).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests", "gpu"))

from _harness import call, lib, timed, torch_cuda_reason  # noqa: E402

STATS = 8  # the distillation ABI's per-row statistics (custom_ops/common/distill_abi.h)
CODES = {"kl": 0, "tvd": 1, "skew_kl": 2, "skew_rkl": 3, "symmetric_kl": 4}
# name: (divergence, beta, alpha)
VARIANTS = {"fkl": ("kl", 0.0, 0.0), "rkl": ("kl", 1.0, 0.0), "jsd": ("kl", 0.5, 0.0), "tvd": ("tvd", 0.0, 0.0),
            "skew_kl": ("skew_kl", 0.0, 0.1), "skew_rkl": ("skew_rkl", 0.0, 0.1),
            "symmetric_kl": ("symmetric_kl", 0.0, 0.5)}
TOP_K = 64
DEVICE = "cuda"  # (a CPU run of the same calls through libkldiv_cpu.so only checks the argument layouts)


def bench_size(rows, vocab, dtype_name, reps, temperature=2.0):
    import torch
    import torch.nn.functional as F
    dtype = getattr(torch, dtype_name)
    esize = torch.empty((), dtype=dtype).element_size()
    g = torch.Generator(device=DEVICE).manual_seed(0)
    s = (torch.randn(rows, vocab, device=DEVICE, generator=g) * 3).to(dtype)
    t = (torch.randn(rows, vocab, device=DEVICE, generator=g) * 3).to(dtype)
    dloss = torch.full((rows,), 1.0 / rows, device=DEVICE)
    stats = torch.empty(rows, STATS, device=DEVICE)
    ds, dt = torch.empty_like(s), torch.empty_like(t)
    n_bytes = rows * vocab * esize
    print(f"\n{rows} x {vocab} {dtype_name} (T = {temperature}): one tensor {n_bytes / 2**30:.2f} GiB")
    copy = timed(lambda: s.clone(), reps)
    print(f"{'op':34s} {'ms':>9s} {'GB/s':>8s} {'of copy':>8s} {'x fkl':>7s}")
    print(f"{'copy (torch clone)':34s} {copy * 1e3:9.3f} {2 * n_bytes / copy / 1e9:8.0f}")
    base, fused, times = {}, {}, {"copy": copy * 1e3}
    for name, (div, beta, alpha) in VARIANTS.items():
        hyper = torch.tensor([temperature, beta, CODES[div], alpha, 0.0, 1.0], dtype=torch.float64, device=DEVICE)

        def fwd(hyper=hyper):
            assert call("DistillFwd", [s, t, hyper, stats]) == 0

        def bwd(hyper=hyper):
            assert call("DistillBwd", [s, t, hyper, stats, dloss, ds, dt]) == 0
        fused[name] = (fwd, bwd)
        fwd()
        for part, fn, moved in (("fwd", fwd, 2), ("bwd", bwd, 4)):
            sec = timed(fn, reps)
            times[f"{name} {part}"] = sec * 1e3
            base.setdefault(part, sec)
            print(f"{name + ' ' + part:34s} {sec * 1e3:9.3f} {moved * n_bytes / sec / 1e9:8.0f} "
                  f"{(moved / 2) * copy / sec:8.2f} {sec / base[part]:7.2f}")

    ids = torch.randperm(vocab, device=DEVICE, generator=g)[:TOP_K].expand(rows, TOP_K).contiguous().to(torch.int32)
    vals = torch.randn(rows, TOP_K, device=DEVICE, generator=g)
    sparse_hyper = torch.tensor([temperature, 1.0, 0.0, 0.0], dtype=torch.float64, device=DEVICE)
    sparse_ds = torch.empty_like(s)

    def sparse_fwd():
        assert call("SparseFwd", [s, ids, vals, sparse_hyper, stats],
                    [dtype_name, "int32", "float32", "float64", "float32"]) == 0

    def sparse_bwd():
        assert call("SparseBwd", [s, ids, vals, sparse_hyper, stats, dloss, sparse_ds],
                    [dtype_name, "int32", "float32", "float64", "float32", "float32", dtype_name]) == 0
    sparse_fwd()
    for part, fn, moved in (("fwd", sparse_fwd, 1), ("bwd", sparse_bwd, 2)):
        sec = timed(fn, reps)
        times[f"stored top-{TOP_K} {part}"] = sec * 1e3
        print(f"{'stored top-' + str(TOP_K) + ' ' + part:34s} {sec * 1e3:9.3f} {moved * n_bytes / sec / 1e9:8.0f} "
              f"{(moved / 2) * copy / sec:8.2f}")

    def torch_fkl():
        sr = s.detach().requires_grad_()
        tr = t.detach().requires_grad_()
        lp = F.log_softmax(sr.float() / temperature, -1)
        lq = F.log_softmax(tr.float() / temperature, -1)
        F.kl_div(lp, lq, reduction="batchmean", log_target=True).backward()
    ours = timed(lambda: (fused["fkl"][0](), fused["fkl"][1]()), reps)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated()
    try:
        eager = timed(torch_fkl, max(3, reps // 4))
        peak = (torch.cuda.max_memory_allocated() - held) / 2**30
        print(f"{'torch eager fkl fwd+bwd':34s} {eager * 1e3:9.3f}   (fused fkl fwd+bwd {ours * 1e3:.3f} ms: "
              f"{eager / ours:.2f}x faster; torch peak {peak:.2f} GiB above the inputs, fused 0 + ds, dt)")
    except torch.cuda.OutOfMemoryError:
        print("torch eager fkl fwd+bwd: out of memory")
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4096x32000,8192x131072")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", help="also write the fused timings (ms) to this file")
    args = p.parse_args(argv)
    reason = torch_cuda_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    import torch
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"library: {lib().KLDivLibInfo().decode()}")
    results = {}
    for size in args.sizes.split(","):
        rows, vocab = (int(v) for v in size.split("x"))
        for dtype_name in args.dtypes.split(","):
            results[f"{size} {dtype_name}"] = bench_size(rows, vocab, dtype_name, args.reps)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
