"""``python -m ms_kldiv.bench distill``: distillation from logits, the fused kernels against the compositions users
write, time and peak memory side by side. Each (row, size, dtype, beta, mode) runs in its own child process under
``ms.jit``, so its peak memory (the resident set's high-water mark above the inputs, compile included) is its own.

Rows: ``fused`` (``distillation_loss``, the fused kernels), ``composition`` (the same loss as two log-softmaxes and
``kl_div``, what ``distillation_loss`` did before the kernels), ``ms_ops`` (``ops.kl_div(ops.log_softmax(s/T),
ops.softmax(t/T))`` written the obvious way; forward KL only), ``torch`` (torch's composition, when importable) and
``stream`` (``kl_div`` 'sum' on the same two tensors: the streaming kernel that runs at the machine's read bandwidth,
i.e. reading both logits once, plus writing one gradient for value+grad: the roofline), and with ``--divergences``
one ``fused-<divergence>`` row per other divergence of the loss menu (``jsd``: beta 0.5 of the ``kl`` family,
``tvd``, ``skew_kl``, ``skew_rkl``, ``symmetric_kl``; in the beta 0 cells), timed against ``fused`` (forward KL) in
the same process, the calls alternating (``(paired)``: the median ratio of the pairs). Modes: ``fwd`` (the loss),
``grad`` (value and the student's gradient, teacher frozen), ``step`` (one GRAPH_MODE ``TrainOneStepCell`` step of
a Dense H -> V student head distilled from fixed teacher logits; fused and composition rows).
"""
import argparse
import json
import sys

from ._process import fmt_bytes, in_child, measure, print_row, rows_to_run, save_records

SIZES = ("4096x32000", "1024x151936", "256x262144")
ROWS = ("fused", "composition", "ms_ops", "torch", "stream")
DIVERGENCES = ("jsd", "tvd", "skew_kl", "skew_rkl", "symmetric_kl")
STEP_HIDDEN = 256


def _ms_fn(row, temperature, beta, mode):
    import mindspore as ms
    from mindspore import ops
    import ms_kldiv
    from ms_kldiv.distillation import _compose

    def loss(s, t):
        t = ops.stop_gradient(t)
        if row == "fused":
            return ms_kldiv.distillation_loss(s, t, temperature, beta=beta, backend="aot")
        if row == "fused-jsd":  # the generalized JSD of the 'kl' family at beta 0.5
            return ms_kldiv.distillation_loss(s, t, temperature, beta=0.5, backend="aot")
        if row.startswith("fused-"):
            return ms_kldiv.distillation_loss(s, t, temperature, backend="aot", divergence=row[len("fused-"):])
        if row == "composition":
            return _compose(s, t, temperature, "batchmean", beta, None, -100, "aot", s.dtype)
        if row == "ms_ops":
            s32, t32 = ops.cast(s, ms.float32), ops.cast(t, ms.float32)
            return ops.kl_div(ops.log_softmax(s32 / temperature, -1), ops.softmax(t32 / temperature, -1),
                              "batchmean") * (temperature * temperature)
        return ms_kldiv.kl_div(s, t, "sum", log_target=True, backend="aot")  # stream

    if mode == "fwd":
        return ms.jit(loss)
    grad = ms.jit(ms.value_and_grad(loss))
    return lambda s, t: grad(s, t)[1]


def _ms_step_fn(row, temperature, beta, n, v):
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    import ms_kldiv
    from ms_kldiv.distillation import _compose

    class Student(nn.Cell):
        def __init__(self):
            super().__init__()
            self.head = nn.Dense(STEP_HIDDEN, v)

        def construct(self, x, teacher_logits):
            s = self.head(x)
            if row == "fused":
                return ms_kldiv.distillation_loss(s, teacher_logits, temperature, beta=beta, backend="aot")
            return _compose(s, teacher_logits, temperature, "batchmean", beta, None, -100, "aot", s.dtype)

    net = Student()
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=0.1))
    x = ms.Tensor(np.random.default_rng(1).standard_normal((n, STEP_HIDDEN), dtype=np.float32))
    ms.set_context(mode=ms.GRAPH_MODE)
    return lambda s, t: step(x, t)


def _torch_fn(temperature, beta, mode, dtype_name):
    import torch
    import torch.nn.functional as F

    def loss(s, t):
        ls = F.log_softmax(s.float() / temperature, -1)
        lt = F.log_softmax(t.float() / temperature, -1)
        if beta == 0:
            kl = F.kl_div(ls, lt, reduction="batchmean", log_target=True)
        elif beta == 1:
            kl = F.kl_div(lt, ls, reduction="batchmean", log_target=True)
        else:
            lm = torch.logsumexp(torch.stack([lt + torch.log(torch.tensor(beta)),
                                              ls + torch.log1p(torch.tensor(-beta))]), 0)
            kl = beta * F.kl_div(lm, lt, reduction="batchmean", log_target=True) + \
                (1 - beta) * F.kl_div(lm, ls, reduction="batchmean", log_target=True)
        return kl * temperature * temperature

    def run(s, t):
        if mode == "fwd":
            with torch.no_grad():
                return loss(s, t)
        s = s.detach().requires_grad_(True)
        loss(s, t).backward()
        return s.grad
    return run


def run_child(row, n, v, dtype_name, beta, mode, repeats, temperature=2.0):
    """One cell in this process: (best seconds, peak bytes above the inputs)."""
    import numpy as np
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((n, v), dtype=np.float32) * 2 for _ in range(2)]
    if row == "torch":
        import torch
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
        s, t = (torch.from_numpy(a).to(dtype) for a in arrays)
        fn = _torch_fn(temperature, beta, mode, dtype_name)
        sync = lambda out: out  # noqa: E731
    else:
        import mindspore as ms
        s, t = (ms.Tensor(a).astype(getattr(ms, dtype_name)) for a in arrays)
        fn = _ms_step_fn(row, temperature, beta, n, v) if mode == "step" else _ms_fn(row, temperature, beta, mode)
        sync = lambda out: out.asnumpy()  # noqa: E731
    del arrays
    seconds, _, peak = measure(lambda: sync(fn(s, t)), repeats)
    rec = {"row": row, "n": n, "v": v, "dtype": dtype_name, "beta": beta, "mode": mode, "seconds": seconds,
           "peak_bytes": peak, "logits_bytes": n * v * (4 if dtype_name == "float32" else 2)}
    if row.startswith("fused-"):
        rec.update(_paired_with_forward_kl(fn, _ms_fn("fused", temperature, 0.0, mode), s, t, sync, repeats))
    return rec


def _paired_with_forward_kl(fn, ref, s, t, sync, repeats):
    """A divergence's time against forward KL's measured in the same process, in back-to-back pairs of alternating
    order (harness.paired_ratios): separate processes' times of a ~50 ms call drift apart by more than the
    differences between divergences on a shared machine. The ratio is the median of the pairs' ratios."""
    import time
    from . import harness
    ref_times = []

    def timed_ref():
        start = time.perf_counter()
        sync(ref(s, t))
        ref_times.append(time.perf_counter() - start)
    ratios = harness.paired_ratios([lambda: sync(fn(s, t))], timed_ref, pairs=max(5, 3 * repeats), warmup=1)[0]
    return {"paired_ratio": sorted(ratios)[len(ratios) // 2], "paired_ref_seconds": min(ref_times)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ms_kldiv.bench distill", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(SIZES), help="rows x V, comma-separated (default: %(default)s)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--betas", default="0,0.5")
    ap.add_argument("--modes", default="fwd,grad,step", help="fwd, grad (value + d/dstudent), step (training step)")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--divergences", default=",".join(DIVERGENCES),
                    help="also time these divergences of the fused loss against forward KL (beta 0 cells, fwd and "
                         "grad; 'jsd': beta 0.5; '' for none; default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row, n, v, dtype_name, beta, mode, repeats = args.child
        print(json.dumps(run_child(row, int(n), int(v), dtype_name, float(beta), mode, int(repeats))), flush=True)
        return 0
    rows = rows_to_run(args.rows)
    records = []
    print("| rows x V | dtype | beta | mode | row | seconds | peak above inputs | x logits | time vs fused |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|")
    for size in args.sizes.split(","):
        n, v = (int(p) for p in size.split("x"))
        for dtype_name in args.dtypes.split(","):
            for beta in (float(b) for b in args.betas.split(",")):
                for mode in args.modes.split(","):
                    cell_rows = [r for r in rows if (mode != "step" or r in ("fused", "composition"))
                                 and not (r == "ms_ops" and beta != 0) and not (r == "stream" and beta != 0)]
                    if beta == 0 and mode != "step" and "fused" in cell_rows:
                        cell_rows += [f"fused-{d}" for d in args.divergences.split(",") if d and d != "kl"]
                    recs = {r: in_child(__name__, (r, n, v, dtype_name, beta, mode, args.repeats), r) for r in cell_rows}
                    fused = recs.get("fused", {})
                    for r, rec in recs.items():
                        records.append(rec)
                        key = (size, dtype_name, f"{beta:g}", mode, r)
                        if "error" in rec:
                            print_row(*key, f"failed: {rec['error']}", "", "", "")
                            continue
                        if "paired_ratio" in rec:
                            ratio = f"{rec['paired_ratio']:.2f}x (paired)"
                        else:
                            ratio = f"{rec['seconds'] / fused['seconds']:.2f}x" if fused.get("seconds") else "-"
                        mult = (f"{rec['peak_bytes'] / rec['logits_bytes']:.2f}" if rec["peak_bytes"] is not None
                                else "-")
                        print_row(*key, f"{rec['seconds']:.4f}", fmt_bytes(rec['peak_bytes'], 2**20, 'MB'), mult, ratio)
    save_records(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
