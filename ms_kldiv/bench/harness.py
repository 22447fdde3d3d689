"""Shared benchmark harness: rows (implementations) x sizes x modes, timed the same way, printed side by side.

Other backends add rows with :func:`add_row`; a row factory gets ``(n, dtype, reduction, mode)`` and returns a
zero-argument callable that runs ONE complete step, synchronized (result materialized on the host), or
``None`` when it does not apply (e.g. no gradient for a roofline). ``mode`` is ``'fwd'`` (forward value)
or ``'grad'`` (value and gradient w.r.t. input).
"""
import functools
import json
import math
import time

import numpy as np

DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 32 << 20)

_ROWS = []  # (key, label, factory, baseline?)


def add_row(key, label, factory):
    """Register an implementation row. ``key`` is what ``--rows`` selects; ``label`` is printed."""
    _ROWS[:] = [r for r in _ROWS if r[0] != key]
    _ROWS.append((key, label, factory))


def rows():
    return list(_ROWS)


@functools.lru_cache(maxsize=4)
def make_data(n, dtype="float32", seed=0):
    """log-probabilities x and probabilities t (about 1% zeros, exercising the zero-mass rule), as NumPy."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n, dtype=np.float32) - 3.0)
    t = rng.random(n, dtype=np.float32)
    t[rng.random(n) < 0.01] = 0.0
    np_dtype = {"float32": np.float32, "float64": np.float64, "float16": np.float16}.get(dtype, np.float32)
    return x.astype(np_dtype), t.astype(np_dtype)


def time_call(fn, min_time=0.25, max_reps=200, warmup=2, before=None):
    """Seconds per call of each repetition, over repetitions filling ``min_time`` (at least 3). ``before``: run
    (untimed) before each timed call, to time the call in context rather than back to back."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_time and len(times) < max_reps):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def paired_ratios(fns, ref, pairs=40, warmup=2, splits=None):
    """For each of ``fns``: its time over the time of ``ref`` in back-to-back pairs, their order alternating (each
    pair ~2 calls long).

    A pair's two calls see the same phase of a drifting machine; best-of-repetitions per row does not when one
    call lasts about as long as a phase of a shared machine's memory bandwidth, so the
    ratio of two bests moved between 0.84x and 1.56x from run to run where the pairs' median moved by 0.1-0.2.
    The rows' pairs take turns: pair i of every row comes before pair i + 1 of any. The ratio itself depends on
    the phase (a fused pass keeps up with a read less well while memory is fast), so rows paired one after the
    other could differ by the phase alone; taking turns, they see the same phases, and the differences between
    their ratios are their own.

    A function with a ``kernel_span`` attribute (a callable giving the start and end, in ``time.perf_counter``
    seconds, of the last kernel call that ran since it was last asked, or None) has each of its timed calls split
    in three: before the kernel started, the kernel, after it ended, each over the same pair's ``ref`` time.
    With ``splits`` (a list, one entry per function) they are appended there as (before, kernel, after) tuples;
    functions without the attribute get an empty list."""
    # the spans are read (two library calls per pair) only when someone asked for the splits
    spans = [getattr(fn, "kernel_span", None) if splits is not None else None for fn in fns]
    if splits is not None:
        splits[:] = [[] for _ in fns]
    for _ in range(warmup):
        for fn in fns:
            fn()
            ref()
    ratios = [[] for _ in fns]
    for i in range(pairs):
        for j, (fn, out) in enumerate(zip(fns, ratios)):
            first, second = (fn, ref) if i % 2 else (ref, fn)
            if spans[j]:
                spans[j]()  # forget any earlier call's span
            t0 = time.perf_counter()
            first()
            t1 = time.perf_counter()
            second()
            t2 = time.perf_counter()
            (s, e), b = ((t0, t1), t2 - t1) if i % 2 else ((t1, t2), t1 - t0)
            out.append((e - s) / b)
            span = spans[j]() if spans[j] else None
            if span and s <= span[0] <= span[1] <= e:
                splits[j].append(((span[0] - s) / b, (span[1] - span[0]) / b, (e - span[1]) / b))
    return ratios


def split_of_middle_pairs(split):
    """(before, kernel, after) averaged over the middle half of the pairs, ranked by their total: medians taken part by
    part need not add up to anything (at 32M under ms.jit they added up to 1.37 where the pairs' median was 1.68), these
    add up to the middle half's mean total, which sits near the pairs' median."""
    ranked = sorted(split, key=sum)
    q = len(ranked) // 4
    return [float(v) for v in np.mean(np.array(ranked[q:len(ranked) - q]), axis=0)]


def run(sizes=DEFAULT_SIZES, dtypes=("float32",), reductions=("sum",), modes=("fwd", "grad"), keys=None,
        min_time=0.25, rounds=3, settle=0.05, paired_ref=None, paired_keys=(), context=None, log=print):
    """Time every selected row; returns a list of result dicts (``ms`` is None where a row does not apply).

    The rows of one cell (size, dtype, reduction, mode) take turns: ``rounds`` rounds, in each of which every
    row runs back to back for its share of ``min_time``. On a shared machine whose speed drifts (memory
    bandwidth taken by neighbours comes and goes over seconds) every row then sees the same slow and fast
    phases, so the ratios hold better than when each row is timed once, one after the other. Runs of one row
    stay consecutive, and each turn starts after ``settle`` idle seconds: OpenMP runtimes and MindSpore's
    pipeline threads busy-wait a while after their work, and a row must not be timed against the previous
    row's spinning threads. With ``paired_ref``, each row in ``paired_keys`` is also timed in alternating pairs with
    that row, the rows' pairs taking turns (``paired_ratios``); ``paired`` is then the median of the pairs' ratios,
    ``paired_q`` its quartiles. With ``context`` (a callable: the other work of a training step), each row is also
    timed with ``context`` run before every call, in turns like the rounds: ``ms_context`` is the best of those."""
    results = []
    selected = [r for r in _ROWS if keys is None or r[0] in keys]
    for dtype in dtypes:
        for reduction in reductions:
            for mode in modes:
                for n in sizes:
                    cells = []
                    for key, label, factory in selected:
                        rec = {"row": key, "label": label, "n": int(n), "dtype": dtype, "reduction": reduction,
                               "mode": mode, "ms": None, "ms_median": None, "error": None}
                        fn = None
                        try:
                            fn = factory(n, dtype, reduction, mode)
                        except Exception as e:  # a row that fails is reported, not fatal
                            rec["error"] = _error(e)
                        cells.append((rec, fn, []))
                    # Large cells: the same time budget, so fast rows still get ~20 samples of which the best
                    # counts (the slowest peers at the largest sizes get the minimum of 3).
                    big = n >= (8 << 20)
                    budget = min_time / rounds
                    max_reps = max(1, (60 if big else 200) // rounds)
                    # Back to back, then (with ``context``) each call after the other work; rows take turns.
                    for before in (None, context) if context is not None else (None,):
                        for r in range(rounds):
                            for rec, fn, samples in cells:
                                if fn is None or rec["error"]:
                                    continue
                                time.sleep(settle)
                                try:
                                    got = time_call(fn, min_time=budget, max_reps=max_reps,
                                                    warmup=(2 if r == 0 else 1) if before is None else 0, before=before)
                                except Exception as e:
                                    rec["error"] = _error(e)
                                    continue
                                if before is None:
                                    samples += got
                                else:
                                    rec["ms_context"] = min([1e3 * min(got)] + [rec.get("ms_context") or math.inf])
                    ref_fn = next((fn for rec, fn, _ in cells if rec["row"] == paired_ref and not rec["error"]), None)
                    paired = [(rec, fn) for rec, fn, _ in cells
                              if ref_fn is not None and fn is not None and not rec["error"] and rec["row"] in paired_keys]
                    if paired:
                        time.sleep(settle)
                        try:
                            splits = []
                            all_ratios = paired_ratios([fn for _, fn in paired], ref_fn, splits=splits)
                            for (rec, _), ratios, split in zip(paired, all_ratios, splits):
                                rec["paired_ref"] = paired_ref
                                rec["paired"] = float(np.median(ratios))
                                rec["paired_q"] = [float(q) for q in np.percentile(ratios, [25, 75])]
                                rec["paired_pairs"] = len(ratios)
                                if split:
                                    rec["paired_split"] = split_of_middle_pairs(split)
                                    rec["paired_split_pairs"] = len(split)
                        except Exception as e:  # the rows' best-of numbers from the rounds stand
                            for rec, _ in paired:
                                rec["paired_error"] = _error(e)
                            if log:
                                log(f"  [paired n={n} {mode}] {_error(e)}")
                    for rec, fn, samples in cells:
                        if samples and not rec["error"]:
                            rec["ms"], rec["ms_median"] = 1e3 * float(np.min(samples)), 1e3 * float(np.median(samples))
                        results.append(rec)
                        if log and rec["error"]:
                            log(f"  [{rec['row']} n={n} {mode}] {rec['error']}")
    return results


def _error(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def _fmt_n(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _row_table(out, caption, sizes, keys, labels, cell, fmt):
    """``caption``, then a line per row with any cell in ``cell`` ((row, n) -> record): ``fmt(record)`` per size."""
    out.append(caption)
    out.append("| row | " + " | ".join(_fmt_n(n) for n in sizes) + " |")
    out.append("|---|" + "---:|" * len(sizes))
    for k in keys:
        vals = [cell.get((k, n)) for n in sizes]
        if any(vals):
            out.append(f"| {labels[k]} | " + " | ".join("-" if not v else fmt(v) for v in vals) + " |")


def table(results, ref_key="aot", ratio_keys=None, stat="ms"):
    """Markdown table per (dtype, reduction, mode): ms per call per row, then the ratio other/ref.

    ``stat`` is ``'ms'`` (best of the repetitions, the default: like ``timeit``, the least disturbed by
    other processes on a shared machine) or ``'ms_median'``."""
    out = []
    groups = []
    for r in results:
        g = (r["dtype"], r["reduction"], r["mode"])
        if g not in groups:
            groups.append(g)
    for g in groups:
        rs = [r for r in results if (r["dtype"], r["reduction"], r["mode"]) == g]
        sizes = sorted({r["n"] for r in rs})
        keys = []
        for r in rs:
            if r["row"] not in keys:
                keys.append(r["row"])
        labels = {r["row"]: r["label"] for r in rs}
        cell = {(r["row"], r["n"]): r[stat] for r in rs}
        out.append(f"\n### {g[2]} ({'forward' if g[2] == 'fwd' else 'value + grad(input)'}), {g[0]}, "
                   f"reduction={g[1]!r}: ms per call ({'best of repetitions' if stat == 'ms' else 'median'})\n")
        out.append("| row | " + " | ".join(_fmt_n(n) for n in sizes) + " |")
        out.append("|---|" + "---:|" * len(sizes))
        for k in keys:
            vals = [cell.get((k, n)) for n in sizes]
            if all(v is None for v in vals):
                continue
            out.append(f"| {labels[k]} | " + " | ".join("-" if v is None else f"{v:.4g}" for v in vals) + " |")
        if any((ref_key, n) in cell for n in sizes):
            out.append(f"\nratio (row time / {labels.get(ref_key, ref_key)} time; >1 means {ref_key} is faster):\n")
            out.append("| row | " + " | ".join(_fmt_n(n) for n in sizes) + " |")
            out.append("|---|" + "---:|" * len(sizes))
            for k in keys:
                if k == ref_key or (ratio_keys and k not in ratio_keys):
                    continue
                vals = []
                for n in sizes:
                    a, b = cell.get((k, n)), cell.get((ref_key, n))
                    vals.append("-" if not a or not b else f"{a / b:.3g}x")
                if any(v != "-" for v in vals):
                    out.append(f"| {labels[k]} | " + " | ".join(vals) + " |")
        context = {(r["row"], r["n"]): r for r in rs if r.get("ms_context")}
        if context:
            _row_table(out, "\nin context (each call preceded by other work, as in a training step: a pass over 64 MB "
                       "and a small MindSpore op, not timed): ms per call, and the ratio to "
                       f"{labels.get(ref_key, ref_key)} in context:\n", sizes, keys, labels, context,
                       lambda v: f"{v['ms_context']:.4g}" + (
                           f" ({v['ms_context'] / context[(ref_key, v['n'])]['ms_context']:.3g}x)"
                           if (ref_key, v["n"]) in context and v["row"] != ref_key else ""))
        paired = {(r["row"], r["n"]): r for r in rs if r.get("paired")}
        if paired:
            first = next(iter(paired.values()))
            ref = first["paired_ref"]
            _row_table(out, f"\npaired with {labels.get(ref, ref)}: median of the time ratios of {first['paired_pairs']} "
                       "back-to-back pairs (quartiles), which cancels the machine's drift; the rows' pairs take "
                       "turns, so the rows see the same phases:\n", sizes, keys, labels, paired,
                       lambda v: f"{v['paired']:.3g}x ({v['paired_q'][0]:.3g}-{v['paired_q'][1]:.3g})")
            split = {key: r for key, r in paired.items() if r.get("paired_split")}
            if split:
                _row_table(out, "\nthe same pairs split by the kernel library's clock: before the kernel started + the "
                           f"kernel + after it ended, each over the {labels.get(ref, ref)}'s time (means over the middle "
                           "half of the pairs ranked by their total, so the parts add up to about the median above):\n",
                           sizes, keys, labels, split, lambda v: " + ".join(f"{p:.3f}" for p in v["paired_split"]))
    return "\n".join(out)


def save_json(results, path, meta=None):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"meta": meta or {}, "results": results}, f, indent=1)


def plot(results, path):
    """Time per call vs size, one panel per mode (solid: back to back; dashed: in context, when measured); returns
    False when matplotlib is not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    modes = sorted({r["mode"] for r in results})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rs = [r for r in results if r["mode"] == mode and r["ms"]]
        for key in dict.fromkeys(r["row"] for r in rs):
            pts = sorted((r["n"], r["ms"]) for r in rs if r["row"] == key)
            line, = ax.loglog([p[0] for p in pts], [p[1] for p in pts], marker="o",
                              label=next(r["label"] for r in rs if r["row"] == key))
            ctx = sorted((r["n"], r["ms_context"]) for r in rs if r["row"] == key and r.get("ms_context"))
            if ctx:
                ax.loglog([p[0] for p in ctx], [p[1] for p in ctx], linestyle="--", marker=".",
                          color=line.get_color())
        title = "forward" if mode == "fwd" else "value + grad(input)"
        if any(r.get("ms_context") for r in rs):
            title += " (solid: back to back, dashed: in context)"
        ax.set_title(title)
        ax.set_xlabel("elements")
        ax.set_ylabel("ms per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def geomean(vals):
    vals = [v for v in vals if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None
