"""Two builds of libkldiv_cuda.so timed side by side on this CUDA device: the sources as they are (A) and the same
sources with extra nvcc flags (B), such as a kernel variant's -D switch.

    PYTHONPATH=. python benchmarks/gpu/compare_builds.py -DDISTILL_CUDA_FLUSH_EVERY=1 \\
        [--sizes 8192x131072,4096x32000] [--dtypes float32,bfloat16] [--rounds 2] [--json FILE]

Both libraries are built at once for this device's architecture only (``--arch 90`` builds them without a GPU and
stops). Then bench_distill.py runs on each in a process of its own, alternating A, B, A, B, ... so that a clock or
thermal drift reaches both; each op's time is the median over the rounds of bench_distill's medians. The table gives
A's and B's milliseconds and B / A (below 1: B is faster), then each divergence's fwd + bwd against forward KL's
under each build (the loss menu's 1.3x target).
"""
import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))


def medians(runs):
    """{case: {op: ms}} from a list of bench_distill --json results: each op's median over the runs."""
    return {case: {op: statistics.median(r[case][op] for r in runs) for op in runs[0][case]} for case in runs[0]}


def table(a, b):
    """Lines comparing medians a and b ({case: {op: ms}})."""
    lines = []
    for case in a:
        lines += ["", case, f"{'op':24s} {'A ms':>9s} {'B ms':>9s} {'B / A':>7s}"]
        for op, ms_a in a[case].items():
            ms_b = b[case][op]
            lines.append(f"{op:24s} {ms_a:9.3f} {ms_b:9.3f} {ms_b / ms_a:7.3f}")
        kinds = [op[:-4] for op in a[case] if op.endswith(" fwd") and f"{op[:-4]} bwd" in a[case]]
        if "fkl" in kinds:
            lines.append(f"{'fwd + bwd vs fkl':24s} {'A':>9s} {'B':>9s}")
            for kind in kinds:
                ra, rb = (sum(m[case][f"{kind} {p}"] for p in ("fwd", "bwd"))
                          / sum(m[case][f"fkl {p}"] for p in ("fwd", "bwd")) for m in (a, b))
                lines.append(f"{kind:24s} {ra:9.2f} {rb:9.2f}")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8192x131072,4096x32000")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--arch", help="build for this architecture (e.g. 90) and stop: a check without a GPU")
    p.add_argument("--json", help="also write both builds' medians here")
    p.epilog = "Every other argument is an nvcc flag of build B (A has none)."
    args, args.flags = p.parse_known_args(argv)
    if not args.flags:
        p.error("no nvcc flags for build B")
    from _harness import build_for_local_gpu
    with ThreadPoolExecutor(2) as pool:
        libs = list(pool.map(lambda flags: build_for_local_gpu(flags, args.arch), ([], args.flags)))
    try:
        print(f"A: {libs[0]}\nB: {libs[1]} ({' '.join(args.flags)})")
        if args.arch:
            return 0
        runs = ([], [])
        for r in range(args.rounds):
            for which, path in enumerate(libs):
                out = os.path.join(os.path.dirname(path), f"{r}.json")
                env = dict(os.environ, KLDIV_CUDA_LIB=path)
                subprocess.run([sys.executable, os.path.join(HERE, "bench_distill.py"), "--sizes", args.sizes,
                                "--dtypes", args.dtypes, "--reps", str(args.reps), "--json", out], env=env,
                               check=True, stdout=subprocess.DEVNULL if r or which else None)
                with open(out, encoding="utf-8") as f:
                    runs[which].append(json.load(f))
    finally:
        for path in libs:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    a, b = medians(runs[0]), medians(runs[1])
    print(f"\nB: {' '.join(args.flags)}; medians of {args.rounds} rounds")
    print("\n".join(table(a, b)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"flags": args.flags, "A": a, "B": b}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
