"""``python -m ms_kldiv.bench fused-linear``: compile time, step time and peak memory of one forward+backward of a
student head trained against a frozen teacher, chunked (FusedLinearDistillationLoss: ``fused`` in GRAPH_MODE,
``fused_pynative``; on CPU both run the head kernel, ``fused_loop`` is the same loss in GRAPH_MODE with the MindSpore
chunk loop that other devices run, ``MS_KLDIV_HEAD_KERNEL=0``) against what bounds it, run alone with the same chunks (``matmuls``: the chunk loop with its four
matmuls, both models' logits, d(hidden), d(weight), and no loss; ``kernels``: the chunk loop with the distillation
kernels alone on chunk-sized logits), the unchunked composition (logits of both heads, then distillation_loss;
``composition_unfused``: with the loss as two log_softmax and kl_div) and torch's unchunked composition when torch is
importable. Each row runs in its own child process, so its peak memory (the kernel's high-water mark of the resident
set, reset after the inputs exist) is the row's alone. Where the unchunked composition would not fit in memory it
is not run, and the memory it needs (its logits, their softmaxes and gradients: the row's bytes per N x V element
measured at the last size where it ran, else ``PEAK_PER_ELEMENT``) is printed instead.

The resident set also counts what the framework takes on a step's first call whatever the sizes (graph compile,
kernel objects, thread pools; more in GRAPH_MODE than in PyNative). Each head row is
therefore also run once at ``TINY`` and its peak there printed beside the row's and taken off it: the rest is the
head's own memory, what Liger's target (one weight gradient + 256 MB, from torch's allocator, which counts tensors
only) bounds."""
import argparse
import json
import os
import sys

from . import _args
from ._process import available_bytes, fmt_bytes, in_child, measure, print_row, rows_to_run, save_records

SIZES = ((4096, 1024, 32000), (8192, 1024, 131072), (4096, 1024, 262144))
ROWS = ("fused", "fused_pynative", "fused_loop", "matmuls", "kernels", "composition", "composition_unfused", "torch")
DTYPES = ("float32", "bfloat16", "float16")
DESCRIPTION = ("Time one forward+backward of a student head trained against a frozen teacher, chunked "
               "(FusedLinearDistillationLoss) against its unavoidable matmuls and kernels and the unchunked "
               "compositions, with compile time and peak memory, each row in a child process of its own.")
#: Rows that the head's time is compared against: together they are what the head cannot avoid doing.
FLOOR = ("matmuls", "kernels")
#: The head rows, and the N x H x V at which each is also run for the framework's first-call memory.
HEAD_ROWS = ("fused", "fused_pynative", "fused_loop")
TINY = (16, 64, 1024)
#: The unchunked rows' peak bytes per N x V element until a size has measured them (float32 at 4096 x 1024 x 32000:
#: 1.64 GB, 7.37 GB; torch's assumed): whether a row fits in memory is judged by them.
PEAK_PER_ELEMENT = {"composition": 13, "composition_unfused": 60, "torch": 20}


def _inputs(n, h, v, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, h), dtype=np.float32), (rng.standard_normal((v, h), dtype=np.float32) * 0.02),
            rng.standard_normal((n, h), dtype=np.float32), (rng.standard_normal((v, h), dtype=np.float32) * 0.02))


def _ms_step(row, arrays, dtype_name, temperature, chunk_size, hard_weight=0.0):
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops
    import ms_kldiv
    from ms_kldiv.distillation import _compose
    dtype = getattr(ms, dtype_name)
    tensors = [ms.Tensor(a).astype(dtype) for a in arrays]
    if row in ("matmuls", "kernels"):
        return _floor_step(row, tensors, temperature, chunk_size)

    if row.startswith("fused"):
        if row == "fused_loop":
            os.environ["MS_KLDIV_HEAD_KERNEL"] = "0"
        loss_fn = ms_kldiv.FusedLinearDistillationLoss(temperature, chunk_size=chunk_size, hard_weight=hard_weight)
        n, v = arrays[0].shape[0], arrays[1].shape[0]
        labels = ms.Tensor((np.arange(n, dtype=np.int64) * 7919 % v).astype(np.int32)) if hard_weight else None

        class Net(nn.Cell):
            def __init__(self):
                super().__init__()
                self.loss_fn = loss_fn

            def construct(self, hs, ws, ht, wt):
                return self.loss_fn(hs, ws, ops.stop_gradient(ht), ops.stop_gradient(wt), labels)
    else:
        from ms_kldiv.fused_linear import _matmul_t

        class Net(nn.Cell):
            def construct(self, hs, ws, ht, wt):
                # the logits as nn.Dense and MindFormers' lm_head make them (MatMul with transpose_b: no [H, V] copy)
                s = _matmul_t(hs, ws)
                t = ops.stop_gradient(_matmul_t(ht, wt))
                if row == "composition_unfused":  # two log_softmax + kl_div, as before the fused kernel
                    return _compose(s, t, temperature, "batchmean", 0.0, None, -100, "aot", s.dtype)
                return ms_kldiv.distillation_loss(s, t, temperature)
    grad_fn = ms.value_and_grad(Net(), grad_position=(0, 1))
    if row != "fused_pynative":
        grad_fn = ms.jit(grad_fn)

    def step():
        value, grads = grad_fn(*tensors)
        value.asnumpy()
        for g in grads:
            g.asnumpy()
    return step


def _floor_step(row, tensors, temperature, chunk_size):
    """The head's unavoidable work run alone in the head's own chunk loop (compiled, one ops.ForiLoop): its four
    matmuls per chunk with the logits standing in for d(logits), or its distillation kernels (forward and the
    student's backward) on one chunk's logits per iteration."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops
    from ms_kldiv.backends import get_distill_kernels
    from ms_kldiv.fused_linear import _matmul_t, _t_matmul, default_chunk_size
    hs, ws, ht, wt = (ops.cast(t, ms.float32) for t in tensors)
    n, v = hs.shape[0], ws.shape[0]
    chunk = chunk_size or default_chunk_size(n, v)
    chunks = (n + chunk - 1) // chunk
    offsets = ms.Tensor(np.arange(chunk, dtype=np.int32))
    kernels = get_distill_kernels("auto")[1]

    class Matmuls(nn.Cell):
        def construct(self, i, carry):
            hs, ws, ht, wt, offsets, dh, dw = carry
            idx = ops.minimum(offsets + i * offsets.shape[0], hs.shape[0] - 1)
            h_c = ops.gather(hs, idx, 0)
            s_c = _matmul_t(h_c, ws)
            t_c = _matmul_t(ops.gather(ht, idx, 0), wt)
            d = s_c - t_c
            return (hs, ws, ht, wt, offsets, ops.tensor_scatter_add(dh, ops.expand_dims(idx, 1), ops.matmul(d, ws)),
                    dw + _t_matmul(d, h_c))

    class Kernels(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fwd = kernels.forward(temperature, 0.0)
            self.bwd = kernels.backward(temperature, 0.0, False)

        def construct(self, i, carry):
            s_c, t_c, g, acc = carry
            stats = self.fwd(s_c, t_c)
            ds = self.bwd(s_c, t_c, stats, g)[0]
            return s_c, t_c, g, acc + stats[0, 0] + ds[0, 0]

    if row == "matmuls":
        body, carry = Matmuls(), (hs, ws, ht, wt, offsets, ops.zeros_like(hs), ops.zeros_like(ws))
    else:
        rng = np.random.default_rng(1)
        s_c, t_c = (ms.Tensor(rng.standard_normal((chunk, v), dtype=np.float32)) for _ in range(2))
        body, carry = Kernels(), (s_c, t_c, ops.ones((chunk,), ms.float32), ops.zeros((), ms.float32))

    @ms.jit
    def run(*carry):
        return ops.ForiLoop()(0, chunks, body, carry, unroll=False)

    def step():
        for out in run(*carry)[-2:]:
            out.asnumpy()
    return step


def _torch_step(arrays, dtype_name, temperature):
    import torch
    hs, ws, ht, wt = [torch.from_numpy(a).to(getattr(torch, dtype_name)) for a in arrays]
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


def run_child(row, n, h, v, dtype_name, repeats, chunk_size, hard_weight=0.0, temperature=2.0):
    """One row in this process: best seconds per forward+backward, the first call's extra seconds (graph compile),
    peak bytes above the inputs."""
    arrays = _inputs(n, h, v)
    step = _torch_step(arrays, dtype_name, temperature) if row == "torch" else \
        _ms_step(row, arrays, dtype_name, temperature, chunk_size, hard_weight if row in HEAD_ROWS else 0.0)
    seconds, compile_seconds, peak = measure(step, repeats)
    return {"row": row, "n": n, "h": h, "v": v, "dtype": dtype_name, "seconds": seconds,
            "compile_seconds": compile_seconds, "peak_bytes": peak,
            "hard_weight": hard_weight if row in HEAD_ROWS else 0.0}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ms_kldiv.bench fused-linear", description=DESCRIPTION,
                                 formatter_class=_args.Formatter)
    ap.add_argument("--sizes", type=_args.comma_list(_args.dims("N", "H", "V")),
                    default=",".join("x".join(map(str, s)) for s in SIZES), help="N x H x V triples, comma-separated")
    ap.add_argument("--dtypes", type=_args.comma_list(_args.choice(DTYPES, "dtype")), default="float32,bfloat16",
                    help=f"hidden states' and weights' dtypes, any of {','.join(DTYPES)}")
    ap.add_argument("--rows", type=_args.comma_list(_args.choice(ROWS, "row")), default=",".join(ROWS),
                    help=f"rows to run, any of {','.join(ROWS)}")
    ap.add_argument("--repeats", type=_args.number(int, low=1), default=2, help="timed steps per row after the first")
    ap.add_argument("--chunk-size", type=_args.number(int, low=0), default=0,
                    help="rows per chunk (0: the loss's own choice)")
    ap.add_argument("--hard-weight", type=_args.number(float, low=0), default=0.0,
                    help="the head rows' hard_weight (the cross-entropy of fixed labels beside the distillation "
                         "loss; the other rows stay without it)")
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", nargs=8, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row, n, h, v, dtype_name, repeats, chunk, hard = args.child
        rec = run_child(row, int(n), int(h), int(v), dtype_name, int(repeats), int(chunk) or None, float(hard))
        print(json.dumps(rec), flush=True)
        return 0
    rows = rows_to_run(args.rows)
    records = []
    per_element = dict(PEAK_PER_ELEMENT)  # each unchunked row's peak bytes per N x V element, updated once measured
    fixed = {}  # (row, dtype) -> the row's peak at TINY: the framework's first-call memory
    print("| N x H x V | dtype | row | compile s | fwd+bwd s | peak above inputs | first call at TINY "
          "| head's own peak | time vs matmuls + kernels |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for n, h, v in args.sizes:
        size = f"{n}x{h}x{v}"
        for dtype_name in args.dtypes:
            recs = {}
            for r in rows:
                if r in per_element:  # an unchunked row: run only where its estimated peak fits
                    need = n * v * per_element[r]
                    avail = available_bytes()
                    if avail is not None and need > 0.8 * avail:
                        recs[r] = {"row": r, "n": n, "h": h, "v": v, "dtype": dtype_name, "skipped": True,
                                   "needs_bytes": need}
                        continue
                recs[r] = in_child(__name__, (r, n, h, v, dtype_name, args.repeats, args.chunk_size,
                                              args.hard_weight), r)
                if r in HEAD_ROWS and recs[r].get("peak_bytes") is not None:
                    if (r, dtype_name) not in fixed:
                        fixed[r, dtype_name] = in_child(__name__, (r, *TINY, dtype_name, 1, 0, args.hard_weight),
                                                        r).get("peak_bytes")
                    if fixed[r, dtype_name] is not None:
                        recs[r]["first_call_bytes"] = fixed[r, dtype_name]
                        recs[r]["own_peak_bytes"] = max(0, recs[r]["peak_bytes"] - fixed[r, dtype_name])
                if r in per_element and recs[r].get("peak_bytes"):
                    per_element[r] = recs[r]["peak_bytes"] / (n * v)
            floor = sum(recs[r]["seconds"] for r in FLOOR if recs.get(r, {}).get("seconds")) \
                if all(recs.get(r, {}).get("seconds") for r in FLOOR) else None
            for r, rec in recs.items():
                records.append(rec)
                if rec.get("skipped") or "error" in rec:
                    why = f"not run: needs about {fmt_bytes(rec['needs_bytes'])}" if rec.get("skipped") else \
                        f"failed: {rec['error']}"
                    print_row(size, dtype_name, r, "", why, "", "", "", "")
                    continue
                ratio = f"{rec['seconds'] / floor:.2f}x" if floor else "-"
                print_row(size, dtype_name, r, f"{rec['compile_seconds']:.1f}", f"{rec['seconds']:.3f}",
                          fmt_bytes(rec['peak_bytes']), fmt_bytes(rec.get('first_call_bytes')),
                          fmt_bytes(rec.get('own_peak_bytes')), ratio)
    save_records(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
