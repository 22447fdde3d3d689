"""``python -m ms_kldiv.bench sparse``: distillation from a stored teacher (``sparse_distillation_loss``: K ids and
log-probabilities per row against the student's full-vocabulary logits), the fused kernels against the composition
a user writes, time and peak memory side by side.

Rows:

- ``fused``: ``ms_kldiv.sparse_distillation_loss(..., backend='auto')`` under ``ms.jit``.
- ``composition``: the same loss in MindSpore ops as a user writes it: ``ops.log_softmax`` over V in float32,
  ``ops.gather_elements`` at the ids, the tail bucket / renormalized teacher and the KL over the K (+ 1) buckets,
  differentiated by MindSpore, under ``ms.jit``.
- ``torch``: the same composition in torch (when torch is importable).
- ``read_once``: the time to read the student logits once, the memory-bandwidth yardstick of the forward (which
  must read every logit once): the fastest of numpy's ``max`` over the logits' bytes (bfloat16 as its uint16
  bit patterns) and MindSpore's ``ReduceMax`` (float32 only: MindSpore's CPU reductions have no bfloat16), each
  recorded; ``read_once_torch``: ``torch.amax`` over the same logits (when torch is importable).

Each (row, K, V, dtype, mode) runs in a child process of its own (modes: ``fwd``, the loss; ``grad``, value and
d/d(student logits)), after one call at 8 rows (the framework's first-use costs), so its peak memory is its own:
the resident set's high-water mark above the inputs over the calls after the first (what the first call left
resident, MindSpore's pool included, plus what later calls take); the first call's peak (compile, and MindSpore's
one-time copy of each new input tensor) is recorded too (``measure_steady``). Before any row of a
cell is timed, a ``check`` child computes the fused loss and the composition's on the cell's inputs and the cell is
not timed unless they agree. A row whose inputs and peak would exceed ``--max-gb`` (or the memory available) is not
run; the memory it would need (its peak per logit measured at a smaller V, else an estimate) is printed instead.

The table's ratios are the targets': peak memory above the inputs over one student-logits tensor (fused value+grad:
<= 1.1x), forward over read-once (fused: <= 1.3x) and the composition's value+grad over this row's (fused: >= 4x).
"""
import argparse
import gc
import json
import math
import os
import sys
import time

from . import _args
from ._process import _read_kb, _reset_peak, available_bytes, fmt_bytes, in_child, measure, print_row, rows_to_run, \
    save_records

KS = (1, 64, 256)
VOCABS = (32000, 151936)
ROWS = ("fused", "composition", "torch", "read_once", "read_once_torch")
#: The sizes run by default, and with --quick (the tests'); keys: the flags' names.
FULL = {"n": 4096, "ks": KS, "vocabs": VOCABS}
QUICK = {"n": 64, "ks": (1, 8), "vocabs": (512,)}
DESCRIPTION = ("Time distillation from a stored teacher (sparse_distillation_loss: K ids and log-probabilities per "
               "row), the fused kernels against the composition a user writes, with each row's peak memory, every "
               "cell checked before it is timed.")
#: Targets: peak above inputs / logits (fused value+grad), forward / read-once (fused), composition / fused (v+g).
TARGET_MEMORY, TARGET_FORWARD, TARGET_SPEEDUP = 1.1, 1.3, 4.0
#: Peak bytes above the inputs per logit assumed where none was measured yet in the run: the larger of float32's and
#: bfloat16's, measured at 4096 x 32000 (MindSpore 2.10, torch 2.13; benchmarks/results/sparse_latest.json).
_DEFAULT_PER_LOGIT = {("composition", "fwd"): 28, ("composition", "grad"): 49, ("torch", "fwd"): 8,
                      ("torch", "grad"): 13}
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
_WARMUP_ROWS = 8
#: Below this many logits (the tests' sizes) no warm-up call: the peaks mean nothing there anyway.
_WARMUP_MIN_LOGITS = 1 << 20


# --------------------------------------------------------------------------------------------------------- inputs
def make_inputs(n, v, k, mode, seed=0):
    """(student logits float32 [n, v], teacher ids int32 [n, k], teacher values [n, k]): K distinct ids per row
    spread over the vocabulary from a random start, log-probabilities of a teacher that keeps part of its mass off
    them (float32, < 0), or counts >= 1 (int32) for 'sampled'."""
    import numpy as np
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, v), dtype=np.float32)
    logits *= 2.0
    k = min(k, v)
    ids = ((rng.integers(0, v, n)[:, None] + np.arange(k) * (v // k)) % v).astype(np.int32)
    if mode == "sampled":
        values = rng.integers(1, 5, (n, k)).astype(np.int32)
    else:
        z = rng.standard_normal((n, k + 1)) * 2.0
        z[:, -1] += 1.0  # the teacher's mass off its top K
        values = (z - np.log(np.exp(z).sum(-1, keepdims=True)))[:, :k].astype(np.float32)
    return logits, ids, values


# --------------------------------------------------------------------------------------------------- MindSpore rows
def ms_composition(mode, temperature, teacher_temperature, beta):
    """The loss as a user writes it in MindSpore ops ('batchmean'), a function of (student logits, ids, values):
    log_softmax over V in float32, gather at the ids, the buckets (the K ids, and the tail: every other class),
    the divergence over them. Constants are taken here: ``ms.jit`` parses the function's body."""
    import mindspore as ms
    from mindspore import ops
    ratio = teacher_temperature / temperature
    t_sq = temperature * temperature
    log_beta = math.log(beta) if beta > 0 else 0.0
    log_1m_beta = math.log(1 - beta) if beta < 1 else 0.0

    def divergence(log_r, log_q):
        """Row sums of the family (0: KL(q || r), 1: KL(r || q), between: generalized JSD) over buckets."""
        if beta == 0:
            return ops.sum(ops.exp(log_q) * (log_q - log_r), -1)
        if beta == 1:
            return ops.sum(ops.exp(log_r) * (log_r - log_q), -1)
        log_m = ops.logaddexp(log_q + log_beta, log_r + log_1m_beta)
        return ops.sum(beta * ops.exp(log_q) * (log_q - log_m) + (1 - beta) * ops.exp(log_r) * (log_r - log_m), -1)

    def composition(s, ids, values):
        x = ops.cast(s, ms.float32) / temperature
        log_p = ops.log_softmax(x, -1)
        log_r = ops.gather_elements(log_p, -1, ids)  # the student's log-probabilities at the ids
        log_r_tail = ops.log1p(-ops.sum(ops.exp(log_r), -1, keepdim=True))  # its mass off the ids
        values = ops.cast(values, ms.float32)
        if mode == "sampled":
            rows = divergence(log_r, ops.log(values / ops.sum(values, -1, keepdim=True)))
        elif mode == "renormalize":
            rows = divergence(log_r, ops.log_softmax(values * ratio, -1))
        else:  # 'tail': the teacher's missing mass is one more bucket
            y_tail = ratio * ops.log(-ops.expm1(ops.logsumexp(values, -1, True)))
            log_q = ops.log_softmax(ops.concat((values * ratio, y_tail), -1), -1)
            rows = divergence(ops.concat((log_r, log_r_tail), -1), log_q)
        if mode != "tail" and beta > 0:  # no teacher tail: the student's tail term of the JSD
            rows = rows - (1 - beta) * log_1m_beta * ops.exp(ops.squeeze(log_r_tail, -1))
        return ops.cast(ops.sum(rows) * t_sq / s.shape[0], s.dtype)
    return composition


def _ms_loss(row, mode, temperature, teacher_temperature, beta):
    import ms_kldiv

    def fused(s, ids, values):
        return ms_kldiv.sparse_distillation_loss(s, ids, values, mode=mode, temperature=temperature,
                                                 teacher_temperature=teacher_temperature, beta=beta,
                                                 reduction="batchmean", backend="auto")

    return fused if row == "fused" else ms_composition(mode, temperature, teacher_temperature, beta)


def _ms_tensors(arrays, dtype_name):
    import mindspore as ms
    logits, ids, values = arrays
    tensors = ms.Tensor(logits).astype(getattr(ms, dtype_name)), ms.Tensor(ids), ms.Tensor(values)
    ms.runtime.synchronize()  # the cast has run (PyNative is asynchronous): its float32 input can go
    return tensors


def _ms_step(row, which, tensors, opts):
    """A synchronized call of ``row`` ('fwd' or 'grad') on the MindSpore ``tensors``; returns the loss as float."""
    import mindspore as ms
    fn = _ms_loss(row, *opts)
    if which == "grad":
        fn = ms.value_and_grad(fn, grad_position=0)
    fn = ms.jit(fn)

    def step():
        out = fn(*tensors)
        if which == "grad":
            out[1].asnumpy()
            out = out[0]
        return float(out.astype(ms.float32).asnumpy())
    return step


# ------------------------------------------------------------------------------------------------------- torch row
def torch_composition(s, ids, values, mode, temperature, teacher_temperature, beta):
    """``ms_composition`` in torch."""
    import torch
    ratio = teacher_temperature / temperature
    log_p = torch.log_softmax(s.float() / temperature, -1)
    log_r = torch.gather(log_p, -1, ids.long())
    log_r_tail = torch.log1p(-torch.exp(log_r).sum(-1, keepdim=True))
    values = values.float()

    def divergence(lr, lq):
        if beta == 0:
            return (lq.exp() * (lq - lr)).sum(-1)
        if beta == 1:
            return (lr.exp() * (lr - lq)).sum(-1)
        lm = torch.logaddexp(lq + math.log(beta), lr + math.log(1 - beta))
        return (beta * lq.exp() * (lq - lm) + (1 - beta) * lr.exp() * (lr - lm)).sum(-1)

    if mode == "sampled":
        rows = divergence(log_r, torch.log(values / values.sum(-1, keepdim=True)))
    elif mode == "renormalize":
        rows = divergence(log_r, torch.log_softmax(values * ratio, -1))
    else:
        y_tail = ratio * torch.log(-torch.expm1(torch.logsumexp(values, -1, keepdim=True)))
        log_q = torch.log_softmax(torch.cat((values * ratio, y_tail), -1), -1)
        rows = divergence(torch.cat((log_r, log_r_tail), -1), log_q)
    if mode != "tail" and beta > 0:
        rows = rows - (1 - beta) * math.log(1 - beta) * log_r_tail.squeeze(-1).exp()
    return (rows.sum() * (temperature * temperature) / s.shape[0]).to(s.dtype)


def _torch_tensors(arrays, dtype_name):
    import torch
    logits, ids, values = arrays
    return torch.from_numpy(logits).to(getattr(torch, dtype_name)), torch.from_numpy(ids), torch.from_numpy(values)


def _torch_step(which, tensors, opts):
    import torch
    s, ids, values = tensors

    def step():
        if which == "fwd":
            with torch.no_grad():
                return float(torch_composition(s, ids, values, *opts))
        leaf = s.requires_grad_(True)
        loss = torch_composition(leaf, ids, values, *opts)
        loss.backward()
        leaf.grad = None  # as zero_grad(set_to_none=True): every step allocates its gradient
        leaf.requires_grad_(False)
        return float(loss.detach())
    return step


# --------------------------------------------------------------------------------------------------- read-once rows
def _read_once_steps(logits, dtype_name, torch_row):
    """{variant: a call reading the logits once} on the logits' own buffer (numpy's view of the MindSpore or
    torch tensor: the bytes the loss reads)."""
    import numpy as np
    if torch_row:
        import torch
        s = torch.from_numpy(logits).to(getattr(torch, dtype_name))
        return {"torch_amax": lambda: float(torch.amax(s))}
    import mindspore as ms
    from mindspore import ops
    s = ms.Tensor(logits).astype(getattr(ms, dtype_name))
    raw = s.asnumpy()
    raw = raw.view(np.uint16) if dtype_name == "bfloat16" else raw  # bfloat16: its bit patterns, read at SIMD speed
    steps = {"numpy_max": lambda: float(np.max(raw))}
    if dtype_name == "float32":
        reduce_max = ops.ReduceMax()

        def f(x):
            return reduce_max(x)
        g = ms.jit(f)
        steps["ms_reduce_max"] = lambda: float(g(s).asnumpy())
    steps["_keep"] = (s, raw)  # alive while timed
    return steps


# ------------------------------------------------------------------------------------------------------ one child
def measure_steady(step, repeats):
    """Like ``_process.measure``, with the peak split in two: (best seconds, the first call's extra seconds, the
    steady-state peak, the first call's peak), both bytes above the resident set before the first call (None where
    the OS cannot say). The steady-state peak is the high-water mark over the calls after the first: what the
    first call left resident (MindSpore's memory pool keeps a step's buffers) plus what any later call takes on
    top. The first call's peak adds what only the first call takes and gives back: the compile, and in MindSpore a
    transient copy of each input tensor the first time a graph takes it (one logits tensor, the same for every
    MindSpore row; not a cost of the loss)."""
    gc.collect()
    base = _read_kb("/proc/self/status", "VmRSS")
    ok = _reset_peak() and base is not None
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    first_peak = _read_kb("/proc/self/status", "VmHWM") - base if ok else None
    ok = ok and _reset_peak()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = _read_kb("/proc/self/status", "VmHWM") - base if ok else None
    return min(times), max(0.0, first - min(times)), peak, first_peak


def run_child(row, n, v, k, dtype_name, which, mode, temperature, teacher_temperature, beta, repeats):
    """One row in this process: its record (best seconds, first call's extra seconds, peak bytes above the inputs,
    the loss value)."""
    import numpy as np
    opts = (mode, temperature, teacher_temperature, beta)
    rec = {"row": row, "n": n, "v": v, "k": k, "dtype": dtype_name, "mode": which, "loss_mode": mode,
           "temperature": temperature, "teacher_temperature": teacher_temperature, "beta": beta,
           "logits_bytes": n * v * _ITEMSIZE[dtype_name]}
    if row == "check":  # ``which`` holds the rows checked
        return _check(rec, n, int(which), v, k, dtype_name, opts)
    if row in ("read_once", "read_once_torch"):
        logits = make_inputs(n, v, 1, "tail")[0]
        steps = _read_once_steps(logits, dtype_name, row == "read_once_torch")
        del logits
        variants = {}
        for name, step in steps.items():
            if name != "_keep":
                step()
                variants[name] = measure(step, repeats)[0]
        del steps
        best = min(variants, key=variants.get)
        rec.update(seconds=variants[best], variant=best, variants=variants, peak_bytes=None)
        return rec
    is_torch = row == "torch"
    if is_torch:
        import torch  # noqa: F401
    tensors_of = _torch_tensors if is_torch else _ms_tensors
    if n * v >= _WARMUP_MIN_LOGITS:  # the framework's first-use costs, kept out of the row's peak
        small = tensors_of(make_inputs(_WARMUP_ROWS, v, k, mode, seed=1), dtype_name)
        (_torch_step(which, small, opts) if is_torch else _ms_step(row, which, small, opts))()
        del small
    arrays = make_inputs(n, v, k, mode)
    tensors = tensors_of(arrays, dtype_name)
    del arrays
    step = _torch_step(which, tensors, opts) if is_torch else _ms_step(row, which, tensors, opts)
    value = []
    seconds, first_extra, peak, first_peak = measure_steady(lambda: value.append(step()), repeats)
    rec.update(seconds=seconds, first_call_extra_seconds=first_extra, peak_bytes=peak, first_call_peak_bytes=first_peak,
               value=value[0])
    if not np.isfinite(value[0]):
        rec["error"] = f"loss is {value[0]}"
    return rec


def _tolerance(dtype_name):
    return 1e-4 if dtype_name == "float32" else 1.6e-2  # the loss is returned in the logits' dtype


def _check(rec, n, n_check, v, k, dtype_name, opts):
    """The fused loss and the composition's on the cell's inputs (forward), before any row of the cell is timed: on
    all of them, or on their first ``n_check`` rows where the composition would not fit in memory on all."""
    arrays = make_inputs(n, v, k, opts[0])
    if n_check < n:
        arrays = tuple(a[:n_check].copy() for a in arrays)
    tensors = _ms_tensors(arrays, dtype_name)
    del arrays
    rec.update(mode="fwd", check_rows=n_check)
    fused = _ms_step("fused", "fwd", tensors, opts)()
    composition = _ms_step("composition", "fwd", tensors, opts)()
    tol = _tolerance(dtype_name)
    agree = abs(fused - composition) <= tol * max(abs(composition), 1e-6)
    rec.update(fused_value=fused, composition_value=composition, rtol=tol, agree=bool(agree))
    if not agree:
        rec["error"] = f"fused {fused!r} != composition {composition!r} (rtol {tol})"
    return rec


# --------------------------------------------------------------------------------------------------------- parent
def _needs(row, which, n, v, dtype_name, per_logit):
    """Bytes the row would hold: its inputs and its peak above them (per logit: measured, else estimated)."""
    logits = n * v * _ITEMSIZE[dtype_name]
    if row == "fused":
        above = logits if which == "grad" else 0
    elif row == "check":
        above = per_logit.get(("composition", "fwd", dtype_name), _DEFAULT_PER_LOGIT[("composition", "fwd")]) * n * v
    elif row.startswith("read_once"):
        above = 0
    else:
        above = per_logit.get((row, which, dtype_name), _DEFAULT_PER_LOGIT[(row, which)]) * n * v
    # float32 logits are generated first for every row (a bfloat16 row holds both while converting)
    return logits + above + (n * v * 4 if dtype_name != "float32" else 0)


def _limit(max_gb):
    avail = available_bytes()
    limit = max_gb * 2**30
    return min(limit, 0.85 * avail) if avail is not None else limit


def _note_row(cell, row, text):
    print_row(cell, row, text, "", "", "", "", "", "")


def _ratio(a, b, fmt="{:.2f}x"):
    return fmt.format(a / b) if a is not None and b else "-"


def _verdict(value, target, at_most):
    if value is None:
        return "-"
    ok = value <= target if at_most else value >= target
    return f"{value:.2f}x ({'met' if ok else 'missed'}, target {'<=' if at_most else '>='} {target}x)"


def run_cell(n, v, k, dtype_name, rows, args, per_logit, records):
    """Check, then time every row of one (K, V, dtype) cell; print its table rows; returns its targets."""
    opts = (args.mode, args.temperature, args.teacher_temperature, args.beta)
    child = lambda row, which: in_child(__name__, (row, n, v, k, dtype_name, which, *opts, args.repeats), row)  # noqa: E731
    limit = _limit(args.max_gb)
    cell = f"{k} | {v} | {dtype_name}"

    def skipped(row, which, need):
        return {"row": row, "n": n, "v": v, "k": k, "dtype": dtype_name, "mode": which, "loss_mode": args.mode,
                "skipped": True, "needs_bytes": need, "limit_bytes": limit}

    check_need = _needs("check", "fwd", n, v, dtype_name, per_logit)
    n_check = n
    while n_check > 1 and check_need > limit:  # the composition on fewer rows (the inputs are still made whole)
        n_check //= 2
        check_need = n * v * 4 + _needs("check", "fwd", n_check, v, dtype_name, per_logit)
    check = child("check", n_check) if check_need <= limit else skipped("check", "fwd", check_need)
    records.append(check)
    if check.get("skipped"):
        print(f"<!-- {cell}: the check would need {fmt_bytes(check_need)} (limit {fmt_bytes(limit)}): "
              f"cell not timed -->", flush=True)
        _note_row(cell, "check", f"not run: needs about {fmt_bytes(check_need)}")
        return None
    if "error" in check:
        _note_row(cell, "check", f"failed: {check['error']}")
        return None
    rows_checked = "" if n_check == n else f" on the first {n_check} rows (all would not fit)"
    print(f"<!-- {cell}: fused {check['fused_value']:.6g} == composition {check['composition_value']:.6g} "
          f"(rtol {check['rtol']:g}){rows_checked} before timing -->", flush=True)
    reference = check["fused_value"] if n_check == n else None  # else: the fused row's own value, below
    recs = {}
    for row in rows:
        for which in (("fwd",) if row.startswith("read_once") else ("fwd", "grad")):
            need = _needs(row, which, n, v, dtype_name, per_logit)
            rec = child(row, which) if need <= _limit(args.max_gb) else skipped(row, which, need)
            if reference is None and row == "fused" and "value" in rec:
                reference = rec["value"]
            if "value" in rec and reference is not None:  # every timed row computes the checked loss
                rec["agrees_with_fused"] = bool(abs(rec["value"] - reference)
                                                <= check["rtol"] * max(abs(reference), 1e-6))
                if not rec["agrees_with_fused"]:
                    rec.setdefault("error", f"loss {rec['value']!r} != the fused loss {reference!r}")
            records.append(rec)
            recs[(row, which)] = rec
            if rec.get("peak_bytes") and row in ("composition", "torch"):
                per_logit.setdefault((row, which, dtype_name), rec["peak_bytes"] / (n * v))
    reads = [r["seconds"] for (row, _), r in recs.items() if row.startswith("read_once") and r.get("seconds")]
    read = min(reads) if reads else None
    comp_grad = recs.get(("composition", "grad"), {}).get("seconds")
    logits = n * v * _ITEMSIZE[dtype_name]
    for row in rows:
        fwd, grad = recs.get((row, "fwd"), {}), recs.get((row, "grad"), {})
        for rec in (fwd, grad):
            if rec.get("error"):
                _note_row(cell, row, f"failed ({rec['mode']}): {rec['error']}")
        if row.startswith("read_once"):
            if fwd.get("seconds"):
                print_row(cell, row, f"{fwd['seconds']:.4f} ({fwd['variant']})", "", "", "",
                          _ratio(fwd["seconds"], read), "", "")
            continue

        def t(rec):
            if rec.get("skipped"):
                return f"not run: needs about {fmt_bytes(rec['needs_bytes'])}"
            return f"{rec['seconds']:.4f}" if rec.get("seconds") else "-"

        def mem(rec):
            return f"{fmt_bytes(rec['peak_bytes'])} ({rec['peak_bytes'] / logits:.2f}x)" \
                if rec.get("peak_bytes") is not None else "-"
        print_row(cell, row, t(fwd), t(grad), mem(fwd), mem(grad), _ratio(fwd.get("seconds"), read),
                  _ratio(comp_grad, grad.get("seconds")), f"{fwd['value']:.6g}" if "value" in fwd else "-")
    fused_fwd, fused_grad = recs.get(("fused", "fwd"), {}), recs.get(("fused", "grad"), {})
    targets = {"cell": cell, "read_once_seconds": read,
               "memory": fused_grad["peak_bytes"] / logits if fused_grad.get("peak_bytes") is not None else None,
               "forward": fused_fwd["seconds"] / read if fused_fwd.get("seconds") and read else None,
               "speedup": comp_grad / fused_grad["seconds"] if comp_grad and fused_grad.get("seconds") else None}
    records.append(dict(targets, row="targets", n=n, v=v, k=k, dtype=dtype_name, loss_mode=args.mode))
    return targets


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ms_kldiv.bench sparse", description=DESCRIPTION,
                                 formatter_class=_args.Formatter)
    counts = _args.comma_list(_args.number(int, low=1))
    ap.add_argument("--n", type=_args.number(int, low=1), default=None,
                    help=f"rows (tokens) of the logits; unset: {FULL['n']}, or {QUICK['n']} with --quick")
    ap.add_argument("--ks", type=counts, default=None,
                    help=f"teacher ids per row; unset: {_join(FULL['ks'])}, or {_join(QUICK['ks'])} with --quick")
    ap.add_argument("--vocabs", type=counts, default=None,
                    help=f"V values; unset: {_join(FULL['vocabs'])}, or {_join(QUICK['vocabs'])} with --quick")
    ap.add_argument("--ks-at-large", type=counts, default=None,
                    help="K values at the V values above the smallest (unset: --ks); e.g. 64 for a shorter run")
    ap.add_argument("--dtypes", type=_args.comma_list(_args.choice(tuple(_ITEMSIZE), "dtype")),
                    default="float32,bfloat16", help=f"student logits dtypes, any of {_join(_ITEMSIZE)}")
    ap.add_argument("--mode", default="tail", choices=("tail", "renormalize", "sampled"), help="the loss's mode")
    ap.add_argument("--temperature", type=_args.number(float, above=0), default=2.0, help="the loss's temperature")
    ap.add_argument("--teacher-temperature", type=_args.number(float, above=0), default=1.0,
                    help="the temperature the teacher's stored log-probabilities were taken at")
    ap.add_argument("--beta", type=_args.number(float, low=0, high=1), default=0.0,
                    help="the loss's beta (0: forward KL, 1: reverse KL, between: generalized JSD)")
    ap.add_argument("--rows", type=_args.comma_list(_args.choice(ROWS, "row")), default=",".join(ROWS),
                    help=f"rows to run, any of {_join(ROWS)}")
    ap.add_argument("--repeats", type=_args.number(int, low=1), default=3,
                    help="timed calls per row after the first (best is shown)")
    ap.add_argument("--max-gb", type=_args.number(float, above=0), default=10.0,
                    help="rows whose inputs and peak would exceed this (or 85%% of the available memory) are not "
                         "run; the memory they would need is printed instead")
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny sizes (the tests): {QUICK['n']} rows, K {_join(QUICK['ks'])}, V "
                         f"{_join(QUICK['vocabs'])} (unless given)")
    ap.add_argument("--json", default=None, help="write the records to this file")
    ap.add_argument("--child", nargs=11, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row, n, v, k, dtype_name, which, mode, temp, teacher_temp, beta, repeats = args.child
        rec = run_child(row, int(n), int(v), int(k), dtype_name, which, mode, float(temp), float(teacher_temp),
                        float(beta), int(repeats))
        print(json.dumps(rec), flush=True)
        return 0
    sizes = QUICK if args.quick else FULL
    for name, value in sizes.items():  # given flags win over --quick's sizes
        if getattr(args, name) is None:
            setattr(args, name, value)
    rows = rows_to_run(args.rows)
    rows = [r for r in rows if r != "read_once_torch" or "torch" in sys.modules or _torch_importable()]
    records, per_logit, summary = [], {}, []
    t0 = time.perf_counter()
    print(f"# sparse_distillation_loss, mode {args.mode!r}, T {args.temperature:g}, T0 "
          f"{args.teacher_temperature:g}, beta {args.beta:g}, {args.n} rows; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; torch {'run' if 'torch' in rows else 'not installed (or not asked): no torch rows'}")
    print("| K | V | dtype | row | fwd s | value+grad s | steady peak above inputs fwd (x logits) | steady peak above "
          "inputs v+g (x logits) | fwd / read-once | composition v+g / this v+g | loss |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    vocabs = sorted(args.vocabs)
    for v in vocabs:
        ks = args.ks if v == vocabs[0] or not args.ks_at_large else args.ks_at_large
        for k in ks:
            for dtype_name in args.dtypes:
                targets = run_cell(args.n, v, k, dtype_name, rows, args, per_logit, records)
                if targets:
                    summary.append(targets)
    print(f"\nTargets (fused row): peak above inputs / logits <= {TARGET_MEMORY}x (value+grad), forward / "
          f"read-once <= {TARGET_FORWARD}x, composition v+g / fused v+g >= {TARGET_SPEEDUP}x")
    for t in summary:
        print(f"- {t['cell']}: memory {_verdict(t['memory'], TARGET_MEMORY, True)}; forward "
              f"{_verdict(t['forward'], TARGET_FORWARD, True)}; speed-up {_verdict(t['speedup'], TARGET_SPEEDUP, False)}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    save_records(args.json, records)
    if args.json:
        print(f"wrote {args.json}")
    return 0


def _join(values):
    return ",".join(map(str, values))


def _torch_importable():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
