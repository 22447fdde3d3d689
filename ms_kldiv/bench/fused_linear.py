"""``python -m ms_kldiv.bench fused-linear``: time and peak memory of one forward+backward of a student head trained
against a teacher, chunked (FusedLinearDistillationLoss) against the unchunked composition (logits of both heads,
then distillation_loss; ``composition_unfused``: the same with the loss as two log_softmax and kl_div, what
distillation_loss was before its fused kernel), and torch's unchunked composition when torch is importable. Each row runs in its own child process, so its peak memory (the kernel's high-water mark of the resident set,
reset after the inputs exist) is the row's alone."""
import argparse
import json
import os
import subprocess
import sys
import time

SIZES = ((4096, 1024, 32000), (1024, 2048, 151936))
ROWS = ("fused", "composition", "composition_unfused", "torch")


def _reset_peak():
    try:  # Linux: "5" resets VmHWM (the peak resident set) to the current resident set
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _vm(key):
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _inputs(n, h, v, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, h), dtype=np.float32), (rng.standard_normal((v, h), dtype=np.float32) * 0.02),
            rng.standard_normal((n, h), dtype=np.float32), (rng.standard_normal((v, h), dtype=np.float32) * 0.02))


def _ms_step(row, arrays, dtype_name, temperature, chunk_size, graph):
    import mindspore as ms
    from mindspore import nn, ops
    import ms_kldiv
    from ms_kldiv.distillation import _compose
    dtype = getattr(ms, dtype_name)
    tensors = [ms.Tensor(a).astype(dtype) for a in arrays]

    if row == "fused":
        loss_fn = ms_kldiv.FusedLinearDistillationLoss(temperature, chunk_size=chunk_size, teacher_grad=False)

        class Net(nn.Cell):
            def __init__(self):
                super().__init__()
                self.loss_fn = loss_fn

            def construct(self, hs, ws, ht, wt):
                return self.loss_fn(hs, ws, ht, wt)
    else:
        class Net(nn.Cell):
            def construct(self, hs, ws, ht, wt):
                s = ops.matmul(hs, ops.transpose(ws, (1, 0)))
                t = ops.stop_gradient(ops.matmul(ht, ops.transpose(wt, (1, 0))))
                if row == "composition_unfused":  # two log_softmax + kl_div, as before the fused kernel
                    return _compose(s, t, temperature, "batchmean", 0.0, None, -100, "aot", s.dtype)
                return ms_kldiv.distillation_loss(s, t, temperature)
    grad_fn = ms.value_and_grad(Net(), grad_position=(0, 1))
    if graph:
        grad_fn = ms.jit(grad_fn)

    def step():
        value, grads = grad_fn(*tensors)
        value.asnumpy()
        for g in grads:
            g.asnumpy()
    return step


def _torch_step(arrays, dtype_name, temperature):
    import torch
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    hs, ws, ht, wt = [torch.from_numpy(a).to(dtype) for a in arrays]
    hs.requires_grad_(True)
    ws.requires_grad_(True)

    def step():
        s = hs @ ws.T
        with torch.no_grad():
            t = ht @ wt.T
        loss = torch.nn.functional.kl_div(torch.log_softmax(s.float() / temperature, -1),
                                          torch.log_softmax(t.float() / temperature, -1), reduction="batchmean",
                                          log_target=True) * temperature ** 2
        loss.backward()
        hs.grad = None
        ws.grad = None
    return step


def run_child(row, n, h, v, dtype_name, repeats, chunk_size, temperature=2.0, graph=True):
    """One row in this process: (best seconds per forward+backward, peak bytes above the inputs)."""
    arrays = _inputs(n, h, v)
    step = _torch_step(arrays, dtype_name, temperature) if row == "torch" else \
        _ms_step(row, arrays, dtype_name, temperature, chunk_size, graph)
    import gc
    gc.collect()
    # The peak is taken from here, before the first step: MindSpore's memory pool keeps what a step allocated, so
    # after a warm-up the resident set no longer moves. (It includes the graph compile, the same for every row.)
    base = _vm("VmRSS")
    peak_ok = _reset_peak()
    step()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = _vm("VmHWM") - base if peak_ok else None
    return {"row": row, "n": n, "h": h, "v": v, "dtype": dtype_name, "seconds": min(times), "peak_bytes": peak}


def _child(args):
    cmd = [sys.executable, "-m", "ms_kldiv.bench.fused_linear", "--child", args[0]] + [str(a) for a in args[1:]]
    env = dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3"))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("{"):
            return json.loads(line)
    return {"row": args[0], "error": (proc.stderr or proc.stdout)[-400:].strip().splitlines()[-1:]}


def _fmt_bytes(b):
    return "-" if b is None else f"{b / 2**20:.0f} MB"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ms_kldiv.bench fused-linear", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join("x".join(map(str, s)) for s in SIZES),
                    help="N x H x V triples, comma-separated (default: %(default)s)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-size", type=int, default=0, help="rows per chunk (default: the loss's own choice)")
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row, n, h, v, dtype_name, repeats, chunk = args.child
        rec = run_child(row, int(n), int(h), int(v), dtype_name, int(repeats), int(chunk) or None)
        print(json.dumps(rec), flush=True)
        return 0
    rows = [r for r in args.rows.split(",") if r]
    if "torch" in rows:
        try:
            import torch  # noqa: F401
        except ImportError:
            rows.remove("torch")
    records = []
    print("| N x H x V | dtype | row | fwd+bwd s | peak above inputs | time vs composition | memory vs composition |")
    print("|---|---|---|---:|---:|---:|---:|")
    for size in args.sizes.split(","):
        n, h, v = (int(p) for p in size.split("x"))
        for dtype_name in args.dtypes.split(","):
            recs = {r: _child((r, n, h, v, dtype_name, args.repeats, args.chunk_size)) for r in rows}
            base = recs.get("composition", {})
            for r, rec in recs.items():
                records.append(rec)
                if "error" in rec:
                    print(f"| {size} | {dtype_name} | {r} | failed: {rec['error']} | | | |")
                    continue
                t_ratio = (f"{rec['seconds'] / base['seconds']:.2f}x" if base.get("seconds") else "-")
                m_ratio = (f"{rec['peak_bytes'] / base['peak_bytes']:.2f}x"
                           if base.get("peak_bytes") and rec["peak_bytes"] is not None else "-")
                print(f"| {size} | {dtype_name} | {r} | {rec['seconds']:.3f} | {_fmt_bytes(rec['peak_bytes'])} | "
                      f"{t_ratio} | {m_ratio} |", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
