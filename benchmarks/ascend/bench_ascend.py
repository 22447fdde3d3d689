"""Benchmark the KL-divergence implementations on an Ascend device, forward and backward.

Rows (all compiled with ``ms.jit``, fed device-resident tensors, timed to a device synchronize):
    aot        ms_kldiv 'aot'        AscendC KlDivCustom / KlDivCustomGrad (custom_ops/ascend)
    native     ms_kldiv 'native'     aclnnKlDiv value + ms_kldiv's gradients
    mint       mint.nn.functional.kl_div (MindSpore's own; its target gradient is zero)
    ops        ops.kl_div (MindSpore's older functional)
    composite  ms_kldiv 'composite'  plain MindSpore ops
Modes: 'fwd' (the value) and 'grad' (value and gradient w.r.t. input, the harness's definition; 'aot'
computes the target's gradient in the same launch). Ratios are printed against 'aot'.

    python benchmarks/ascend/bench_ascend.py [--sizes 4K,64K,1M,4M,32M] [--reductions sum,mean,none]
                                             [--dtypes float32,float16] [--modes fwd,grad] [--json out.json]

Timing, tables and JSON come from the shared harness (ms_kldiv.bench.harness).

Exit status: 0 after a run, and also 0 with a one-line "no Ascend device" message when there is nothing to
measure (no Ascend device or MindSpore Ascend runtime), so CI on CPU machines can call it; 2 for bad arguments.
"""
import argparse
import sys

DEFAULT_SIZES = "4K,64K,1M,4M,32M"


def _size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1]) * mult) if s[-1:] in "KMG" else int(s)


def ascend_unavailable():
    """None when MindSpore can run on an Ascend device here, else why not (one line)."""
    try:
        from mindspore.device_context import ascend
        if not ascend.is_available():
            return "MindSpore's Ascend runtime (CANN, driver, device) is not available on this machine"
    except Exception as err:  # noqa: BLE001 - an import or runtime failure means the same: not here
        return f"MindSpore's Ascend runtime cannot be loaded ({type(err).__name__}: {str(err).splitlines()[0]})"
    return None


def _rows(harness):
    import numpy as np
    import mindspore as ms
    from mindspore import mint, nn, ops
    import ms_kldiv

    np_dtypes = {"float32": np.float32, "float16": np.float16}

    class Value(nn.Cell):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def construct(self, x, t):
            return self.fn(x, t)

    class ValueAndGrad(nn.Cell):
        def __init__(self, fn):
            super().__init__()
            self.fn = Value(fn)
            self.vg = ms.value_and_grad(self.fn, grad_position=0)

        def construct(self, x, t):
            return self.vg(x, t)

    def factory_for(make_fn):
        def factory(n, dtype, reduction, mode):
            if dtype not in np_dtypes and dtype != "bfloat16":
                return None
            x_np, t_np = harness.make_data(n, "float32")
            ms_dtype = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}[dtype]
            x = ms.Tensor(x_np, ms.float32).astype(ms_dtype)
            t = ms.Tensor(t_np, ms.float32).astype(ms_dtype)
            fn = make_fn(reduction)
            cell = ms.jit(Value(fn) if mode == "fwd" else ValueAndGrad(fn))

            def step():
                cell(x, t)
                ms.runtime.synchronize()
            return step
        return factory

    def ours(backend):
        def make(reduction):
            return lambda x, t: ms_kldiv.kl_div(x, t, reduction, backend=backend)
        return make

    def mint_row(reduction):
        return lambda x, t: mint.nn.functional.kl_div(x, t, reduction=reduction)

    def ops_row(reduction):
        return lambda x, t: ops.kl_div(x, t, reduction=reduction)

    harness.add_row("aot", "ms_kldiv aot (AscendC)", factory_for(ours("aot")))
    harness.add_row("native", "ms_kldiv native (aclnn + our grads)", factory_for(ours("native")))
    harness.add_row("mint", "mint.nn.functional.kl_div", factory_for(mint_row))
    harness.add_row("ops", "ops.kl_div", factory_for(ops_row))
    harness.add_row("composite", "ms_kldiv composite", factory_for(ours("composite")))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--reductions", default="sum,mean,none")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--modes", default="fwd,grad")
    ap.add_argument("--rows", default=None, help="subset of aot,native,mint,ops,composite")
    ap.add_argument("--min-time", type=float, default=0.25)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    reason = ascend_unavailable()
    if reason is not None:
        print(f"bench_ascend: no Ascend device, nothing measured: {reason}.")
        return 0

    import mindspore as ms
    ms.set_device("Ascend")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    import ms_kldiv
    from ms_kldiv.bench import harness

    for row in ms_kldiv.backend_info("Ascend"):
        print(f"# {row['name']:10s} available={row['available']} auto={row['auto']}"
              + (f"  ({row['reason']})" if row["reason"] else ""))
    _rows(harness)
    results = harness.run(sizes=[_size(s) for s in args.sizes.split(",")], dtypes=args.dtypes.split(","),
                          reductions=args.reductions.split(","), modes=args.modes.split(","),
                          keys=args.rows.split(",") if args.rows else ["aot", "native", "mint", "ops", "composite"],
                          min_time=args.min_time)
    print(harness.table(results, ref_key="aot"))
    if args.json:
        harness.save_json(results, args.json, {"device": "Ascend", "mindspore": ms.__version__})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
