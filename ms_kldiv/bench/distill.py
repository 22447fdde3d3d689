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
the same process, the calls alternating (``(paired)``: the median ratio of the pairs, shown beside that median
pair's two times). Modes: ``fwd`` (the loss), ``grad`` (value and the student's gradient, teacher frozen), ``step``
(one GRAPH_MODE ``TrainOneStepCell`` step of a Dense H -> V student head distilled from fixed teacher logits; fused
and composition rows).
"""
import argparse
import json
import sys

from . import _args
from ._process import fmt_bytes, in_child, measure, print_row, rows_to_run, save_records

SIZES = ("4096x32000", "1024x151936", "256x262144")
ROWS = ("fused", "composition", "ms_ops", "torch", "stream")
DIVERGENCES = ("jsd", "tvd", "skew_kl", "skew_rkl", "symmetric_kl")
DTYPES = ("float32", "bfloat16", "float16")
MODES = ("fwd", "grad", "step")
DESCRIPTION = ("Time distillation from logits, the fused kernels against the compositions users write, with each "
               "row's peak memory, every (row, size, dtype, beta, mode) in a child process of its own.")
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
        s, t = (torch.from_numpy(a).to(getattr(torch, dtype_name)) for a in arrays)
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
    differences between divergences on a shared machine. The ratio is the median of the pairs' ratios; the two
    calls of that median pair are recorded too, for a table whose time and ratio agree."""
    import time
    from . import harness
    warmup = 1
    times = {"row": [], "ref": []}

    def timed(step, out):
        def call():
            start = time.perf_counter()
            sync(step(s, t))
            out.append(time.perf_counter() - start)
        return call
    ratios = harness.paired_ratios([timed(fn, times["row"])], timed(ref, times["ref"]), pairs=max(5, 3 * repeats),
                                   warmup=warmup)[0]
    median = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
    return {"paired_ratio": ratios[median], "paired_ref_seconds": min(times["ref"]),
            # each call of a pair appends its time: pair i's calls are the (warmup + i)-th
            "paired_median_seconds": times["row"][warmup + median],
            "paired_median_ref_seconds": times["ref"][warmup + median]}


def table_row(rec, fused):
    """A record's cells from 'seconds' on: (seconds, peak above inputs, x logits, fused s, time vs fused), where the
    ratio is the time over 'fused s'. For a ``(paired)`` row both times are the two calls of its median pair (the
    ratio's own), not its separate best (``seconds`` in the record) and the fused row's, which ran in other
    processes."""
    mult = f"{rec['peak_bytes'] / rec['logits_bytes']:.2f}" if rec["peak_bytes"] is not None else "-"
    peak = fmt_bytes(rec["peak_bytes"], 2**20, "MB")
    if "paired_ratio" in rec:
        return (f"{rec['paired_median_seconds']:.4f}", peak, mult, f"{rec['paired_median_ref_seconds']:.4f}",
                f"{rec['paired_ratio']:.2f}x (paired)")
    ref = fused.get("seconds")
    return (f"{rec['seconds']:.4f}", peak, mult, f"{ref:.4f}" if ref else "-",
            f"{rec['seconds'] / ref:.2f}x" if ref else "-")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ms_kldiv.bench distill", description=DESCRIPTION,
                                 formatter_class=_args.Formatter)
    ap.add_argument("--sizes", type=_args.comma_list(_args.dims("rows", "V")), default=",".join(SIZES),
                    help="rows x V, comma-separated")
    ap.add_argument("--dtypes", type=_args.comma_list(_args.choice(DTYPES, "dtype")), default="float32,bfloat16",
                    help=f"logits dtypes, any of {','.join(DTYPES)}")
    ap.add_argument("--betas", type=_args.comma_list(_args.number(float, low=0, high=1)), default="0,0.5",
                    help="the loss's beta values (0: forward KL, 1: reverse KL, between: generalized JSD)")
    ap.add_argument("--modes", type=_args.comma_list(_args.choice(MODES, "mode")), default="fwd,grad,step",
                    help="fwd (the loss), grad (value + d/dstudent), step (a training step)")
    ap.add_argument("--rows", type=_args.comma_list(_args.choice(ROWS, "row")), default=",".join(ROWS),
                    help=f"rows to run, any of {','.join(ROWS)}")
    ap.add_argument("--divergences", type=_args.comma_list(_args.choice(("kl",) + DIVERGENCES, "divergence"),
                                                           allow_empty=True), default=",".join(DIVERGENCES),
                    help="also time these divergences of the fused loss against forward KL (beta 0 cells, fwd and "
                         "grad; 'jsd': beta 0.5; '' for none)")
    ap.add_argument("--repeats", type=_args.number(int, low=1), default=3, help="timed calls per row after the first")
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row, n, v, dtype_name, beta, mode, repeats = args.child
        print(json.dumps(run_child(row, int(n), int(v), dtype_name, float(beta), mode, int(repeats))), flush=True)
        return 0
    rows = rows_to_run(args.rows)
    records = []
    print("| rows x V | dtype | beta | mode | row | seconds | peak above inputs | x logits | fused s "
          "| time vs fused |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|")
    for n, v in args.sizes:
        for dtype_name in args.dtypes:
            for beta in args.betas:
                for mode in args.modes:
                    cell_rows = [r for r in rows if (mode != "step" or r in ("fused", "composition"))
                                 and not (r == "ms_ops" and beta != 0) and not (r == "stream" and beta != 0)]
                    if beta == 0 and mode != "step" and "fused" in cell_rows:
                        cell_rows += [f"fused-{d}" for d in args.divergences if d != "kl"]
                    recs = {r: in_child(__name__, (r, n, v, dtype_name, beta, mode, args.repeats), r) for r in cell_rows}
                    fused = recs.get("fused", {})
                    for r, rec in recs.items():
                        records.append(rec)
                        key = (f"{n}x{v}", dtype_name, f"{beta:g}", mode, r)
                        if "error" in rec:
                            print_row(*key, f"failed: {rec['error']}", "", "", "", "")
                            continue
                        print_row(*key, *table_row(rec, fused))
    if any("paired_ratio" in r for r in records):
        print("\n(paired): the time and fused s of the median pair of alternating calls in the row's own process, "
              "whose ratio is shown; the row's separate best time is its record's 'seconds'")
    save_records(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
