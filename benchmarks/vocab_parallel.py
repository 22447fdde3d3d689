"""Vocabulary-parallel distillation: one process on the whole vocabulary against tp ranks each on its slice.

    python benchmarks/vocab_parallel.py --json OUT.json                     # tp = 1
    msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8120 --join=True \\
          --log_dir=$(mktemp -d) benchmarks/vocab_parallel.py --json OUT.json   # tp = 2 (rank 0 writes)

Per size (rows x V), float32 logits, forward KL, value + both gradients of ``ms_kldiv.distillation_loss`` (PyNative):
the best of ``--repeats`` calls, each rank's peak resident memory above what it held before the first call, and the
bytes each rank sends per call (the gather of 4 float32 normalizers per row and the SUM of 3 float32 per row). On
a CPU machine the ranks share its cores, so tp = 2 shows the collectives' cost, not a speed-up.
"""
import argparse
import json
import os
import resource
import time

import numpy as np

import ms_kldiv  # first: keeps MindSpore's compiler files out of the working directory
import mindspore as ms

from ms_kldiv.backends.vocab_parallel import GATHER_BYTES_PER_ROW, SUM_BYTES_PER_ROW


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4096x32000,1024x151936")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    group, rank, size = None, 0, 1
    if os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED"):
        from mindspore.communication import GlobalComm, get_group_size, get_rank, init
        init()
        group, rank, size = GlobalComm.WORLD_COMM_GROUP, get_rank(), get_group_size()
    records = []
    for spec in args.sizes.split(","):
        rows, vocab = (int(v) for v in spec.split("x"))
        lo, hi = vocab * rank // size, vocab * (rank + 1) // size
        rng = np.random.default_rng(rank)
        s = ms.Tensor(rng.standard_normal((rows, hi - lo), np.float32))
        t = ms.Tensor(rng.standard_normal((rows, hi - lo), np.float32))
        grad = ms.value_and_grad(lambda a, b: ms_kldiv.distillation_loss(a, b, 2.0, vocab_parallel_group=group),
                                 grad_position=(0, 1))
        base = _rss_mb()
        best = float("inf")
        for _ in range(args.repeats + 1):  # the first call compiles and builds
            start = time.perf_counter()
            value, (gs, gt) = grad(s, t)
            ms.runtime.synchronize()  # (asnumpy() would copy the gradient into the peak)
            best = min(best, time.perf_counter() - start)
        del gs, gt
        sent = (GATHER_BYTES_PER_ROW + SUM_BYTES_PER_ROW) * rows if group is not None else 0
        records.append({"rows": rows, "vocab": vocab, "tp": size, "rank": rank, "slice": hi - lo,
                        "seconds": best, "peak_mb_above_start": _peak_mb() - base, "bytes_sent_per_call": sent,
                        "loss": float(value)})
        print(f"tp={size} rank {rank}: {rows} x {vocab} (slice {hi - lo}): value+grad {best * 1e3:.1f} ms, peak "
              f"{_peak_mb() - base:.0f} MB above start, {sent / 1024:.0f} KiB sent per call", flush=True)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
