"""Command line: ``python -m ms_kldiv.bench [--sizes 4K,1M] [--dtypes float32] [--reductions sum]
[--modes fwd,grad] [--rows aot,ops_jit,...] [--no-torch] [--no-context] [--json PATH] [--plot PATH]``;
``python -m ms_kldiv.bench fused-linear ...`` benchmarks the chunked distillation head, ``... distill ...`` the
fused distillation kernels, ``... sparse ...`` the stored-teacher loss (``--help`` after any)."""
import argparse
import importlib
import os
import platform
import sys
import time

from . import _args


def _size(text):
    """An element count: an integer, or a number with a K, M or G suffix (powers of 1024)."""
    s = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    try:
        n = int(float(s[:-1]) * mult) if s[-1:] in "KMG" else int(s)
    except (ValueError, OverflowError):  # OverflowError: 'inf'
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an element count (e.g. 4096, 4K, 1M)")
    return n


class _DropRecompileWarning:
    """Every ms.jit row and cell compiles its own ``f`` from the same source line (rows._mindspore_row), which MindSpore
    reports as the same function "compiled again": expected here, and it buried the tables."""

    @staticmethod
    def filter(record):
        return "has been compiled again" not in record.getMessage()


def _quiet_recompile_warnings():
    try:
        from mindspore import log as ms_log
        ms_log._get_logger().addFilter(_DropRecompileWarning())  # pylint: disable=protected-access
    except (ImportError, AttributeError):  # private API: if it moves, the warnings just show
        pass


#: Callables run before the rows are listed or timed (the study tool in benchmarks/ adds its rows here).
EXTRA_ROWS = []
#: The keys --rows, --ref and --paired-ref accept: those rows.register_default_rows adds (the study tool adds its own).
ROW_KEYS = ["aot", "aot_jit", "composite_jit", "akg_jit", "ops_jit", "ops", "torch"]
#: Subcommands: modules of this package with a main(argv).
SUBCOMMANDS = {"fused-linear": "fused_linear", "distill": "distill", "sparse": "sparse"}
DTYPES = ("float32", "float64", "float16", "bfloat16")
REDUCTIONS = ("none", "sum", "mean", "batchmean")
MODES = ("fwd", "grad")
DESCRIPTION = ("Time ms_kldiv's kl_div (each backend, PyNative and ms.jit) against MindSpore's ops.kl_div and torch's "
               "F.kl_div, per size, dtype, reduction and mode, back to back and in context.")
EPILOG = """subcommands (python -m ms_kldiv.bench SUBCOMMAND --help for each one's flags):
  distill       distillation from logits: the fused kernels against the compositions users write
  fused-linear  the chunked distillation head (FusedLinearDistillationLoss): compile time, step time, peak memory
  sparse        distillation from a stored teacher (sparse_distillation_loss) against its composition"""


def parser(prog="python -m ms_kldiv.bench", description=DESCRIPTION, epilog=EPILOG, row_keys=None):
    """The main benchmark's argument parser; ``row_keys``: the valid row keys (default: ROW_KEYS)."""
    row_keys = ROW_KEYS if row_keys is None else row_keys
    row = _args.choice(row_keys, "row")

    def row_or_none(key):
        return row(key) if key else ""
    ap = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog, formatter_class=_args.Formatter)
    ap.add_argument("--sizes", type=_args.comma_list(_size), default="4K,64K,1M,4M,32M",
                    help="element counts, e.g. 4K,1M,32M")
    ap.add_argument("--dtypes", type=_args.comma_list(_args.choice(DTYPES, "dtype")), default="float32",
                    help=f"any of {','.join(DTYPES)}")
    ap.add_argument("--reductions", type=_args.comma_list(_args.choice(REDUCTIONS, "reduction")), default="sum",
                    help=f"any of {','.join(REDUCTIONS)}")
    ap.add_argument("--modes", type=_args.comma_list(_args.choice(MODES, "mode")), default="fwd,grad",
                    help="fwd (forward), grad (value + grad(input))")
    ap.add_argument("--rows", type=_args.comma_list(row, allow_empty=True), default="",
                    help=f"row keys to run, empty for all (of {','.join(row_keys)}; --list: with their labels)")
    ap.add_argument("--list", action="store_true", help="list the row keys and exit")
    ap.add_argument("--no-torch", action="store_true", help="do not import torch (no torch row, no second OpenMP)")
    ap.add_argument("--min-time", type=_args.number(float, low=0), default=0.25,
                    help="seconds of repetitions per row and cell")
    ap.add_argument("--rounds", type=_args.number(int, low=1), default=3,
                    help="the rows of a cell take turns this many times (drift on a shared machine hits all)")
    ap.add_argument("--stat", choices=("min", "median"), default="min",
                    help="statistic shown (both are in the JSON); min is robust to other load on the machine")
    ap.add_argument("--ref", type=row, default="aot", help="row the ratios are taken against")
    ap.add_argument("--paired-ref", type=row_or_none, default="",
                    help="also time --paired-rows in alternating pairs with this row (which cancels a drifting "
                         "machine's phases); empty for none")
    ap.add_argument("--paired-rows", type=_args.comma_list(row), default="aot,aot_jit",
                    help="rows timed in pairs with --paired-ref")
    ap.add_argument("--no-context", action="store_true",
                    help="time calls back to back only (by default each row is also timed in context: every call "
                         "preceded by other work, as in a training step)")
    ap.add_argument("--json", default=None, help="write results as JSON here")
    ap.add_argument("--plot", default=None, help="write a PNG plot here (needs matplotlib)")
    return ap


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(f"{__package__}.{SUBCOMMANDS[argv[0]]}").main(argv[1:])
    ap = parser()
    return run(ap.parse_args(argv), ap)


def run(args, ap):
    """Register the rows, then list them (``--list``) or time them and print the tables; ``ap``: the parser whose
    ``args`` these are, for the errors only known once the rows are registered."""
    from .rows import register_default_rows  # imports torch first when wanted, then MindSpore
    if not args.no_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    import mindspore as ms
    import ms_kldiv
    from . import harness

    ms.set_context(mode=ms.PYNATIVE_MODE)
    _quiet_recompile_warnings()
    register_default_rows(with_torch=not args.no_torch)
    for extra in EXTRA_ROWS:
        extra()
    if args.list:
        for key, label, _ in harness.rows():
            print(f"{key:15s} {label}")
        return 0
    # a known key whose row was not registered here (torch: not importable, or --no-torch) would drop out silently
    registered = [key for key, _, _ in harness.rows()]
    asked = {"--rows": args.rows, "--ref": [args.ref], "--paired-ref": [args.paired_ref] if args.paired_ref else [],
             "--paired-rows": args.paired_rows if args.paired_ref else []}
    for flag, keys in asked.items():
        for key in keys:
            if key not in registered:
                ap.error(f"argument {flag}: row {key!r} is not available here (torch not importable, or "
                         f"--no-torch); available: {', '.join(registered)}")
    from ms_kldiv.backends import get as get_backend
    lib = get_backend("aot", "CPU").info("CPU")
    meta = {"load_average": os.getloadavg(), "machine": platform.machine(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "mindspore": ms.__version__, "torch_loaded": "torch" in sys.modules, "aot_library": lib,
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"# ms_kldiv benchmark  ({meta['cpus']} CPUs, MindSpore {meta['mindspore']}, "
          f"torch {'loaded' if meta['torch_loaded'] else 'not loaded'}, load average "
          f"{meta['load_average'][0]:.1f})\n# aot: {lib}")
    t0 = time.perf_counter()
    results = harness.run(sizes=args.sizes, dtypes=args.dtypes, reductions=args.reductions, modes=args.modes,
                          keys=args.rows or None, min_time=args.min_time, rounds=args.rounds,
                          paired_ref=args.paired_ref or None, paired_keys=tuple(args.paired_rows),
                          context=None if args.no_context else _other_work())
    print(harness.table(results, ref_key=args.ref, stat="ms" if args.stat == "min" else "ms_median"))
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    if args.json:
        harness.save_json(results, args.json, meta)
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {args.plot}" if harness.plot(results, args.plot) else "matplotlib not importable: no plot")
    return 0


def _other_work():
    from .rows import OtherWork
    return OtherWork()


if __name__ == "__main__":
    sys.exit(main())
