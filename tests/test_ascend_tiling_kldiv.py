"""The KLDiv operators' tiling (custom_ops/ascend/op_kernel/kl_div_tiling_plan.h), a NumPy replay of the
AscendC kernels' tile loops, and the kernel sources on the AscendC stand-in, run on the CPU: no Ascend device or
CANN toolkit is needed.

The tiling is the C++ header itself, compiled with g++ (a C++ self-test driver, and a C API loaded with ctypes
that the NumPy model reads its numbers from). The model follows the kernels' float32 operations in their
order and is checked against the float64 reference ``ms_kldiv.reference``. The distillation operators' tiling and
kernels are in test_ascend_tiling_distill.py; the stand-in's own API signatures in test_ascend_standin.py.
"""
import os
import subprocess

import numpy as np
import pytest

from ms_kldiv import reference as ref

from _ascend_common import CORES, UBS, model, needs_compiler

pytestmark = needs_compiler

IO = {"float32": 4, "float16": 2, "bfloat16": 2}
MODES = (model.FORWARD_NONE, model.FORWARD_REDUCE, model.BACKWARD_NONE, model.BACKWARD_REDUCE)
# Relative tolerance of the model against float64: float32 math with Ln/Exp rounding; half types are rounded
# once on output (the reference is evaluated on the already-rounded inputs).
TOL = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}


@pytest.fixture(scope="module")
def tiling():
    return model.Tiling()


# ------------------------------------------------------------------------------------------------ plan
def test_cpp_selftest_driver():
    """The C++ driver walks every (core, tile) for ~1000 sizes x core counts x modes x dtypes x UB sizes."""
    exe = model.build(os.path.join(os.path.dirname(model.__file__), "tiling_selftest.cpp"), shared=False)
    res = subprocess.run([exe], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "ok"


SIZES = [0, 1, 7, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097, 65536 + 3, 1 << 20, (4 << 20) + 1, 32 << 20,
         (32 << 20) - 17, 123456789]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("cores", CORES)
def test_every_element_exactly_once(tiling, n, cores):
    for mode in MODES:
        for io in (2, 4):
            plan = tiling.plan(n, io, mode, cores)
            assert plan is not None
            assert 1 <= plan["used_cores"] <= cores
            owned = []
            for core in range(plan["used_cores"]):
                start, length = tiling.core_range(plan, core)
                # Core boundaries on 64-element (256 B of float32) boundaries: no two cores share a 32 B block.
                assert start % tiling.const["core_align"] == 0
                tiles = tiling.tiles(plan, core)
                assert sum(v for _, v, _ in tiles) == length
                for off, valid, count in tiles:
                    assert 0 < valid <= plan["tile_length"]
                    assert valid <= count <= plan["tile_length"] and count % tiling.const["core_align"] == 0
                    owned.append((off, valid))
            # Concatenated in (core, tile) order, the ranges are exactly [0, n).
            pos = 0
            for off, valid in owned:
                assert off == pos
                pos += valid
            assert pos == n


@pytest.mark.parametrize("n, cores, expected", [(0, 40, 1), (1, 40, 1), (4096, 40, 1), (4097, 40, 2),
                                                (100_000, 40, 25), (1 << 20, 40, 40), (1 << 20, 48, 48)])
def test_core_count_follows_work(tiling, n, cores, expected):
    """Small inputs do not wake every core; large ones use all of them."""
    assert tiling.plan(n, 4, model.FORWARD_NONE, cores)["used_cores"] == expected


@pytest.mark.parametrize("ub", UBS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", sorted(IO))
def test_tile_fills_but_fits_the_unified_buffer(tiling, ub, mode, dtype):
    io = IO[dtype]
    tile = tiling.tile_length(mode, io, ub)
    align = tiling.const["tile_align"]
    assert tile > 0 and tile % align == 0
    plan = tiling.plan(1 << 24, io, mode, 40, ub)
    usable = ub - tiling.const["api_ub_reserve_bytes"]   # the API's own top 8 KiB of UB
    assert plan["tile_length"] == tile and plan["ub_bytes_used"] <= usable
    # Buffers listed the way the kernels' InitBuffer calls allocate them (IO queues double-buffered, float32
    # work tiles (reducing: the accumulator and its correction among them), 1-bit mask) plus the fixed reserve.
    queues = {model.FORWARD_NONE: 3, model.FORWARD_REDUCE: 2, model.BACKWARD_NONE: 5, model.BACKWARD_REDUCE: 4}[mode]
    work = {model.FORWARD_NONE: 3, model.FORWARD_REDUCE: 5, model.BACKWARD_NONE: 5, model.BACKWARD_REDUCE: 4}[mode]
    bytes_ = (tiling.const["buffer_num"] * queues * io * tile + work * 4 * tile + tile // 8
              + tiling.const["ub_reserve_bytes"])
    assert bytes_ <= usable
    # Maximal: one more tile step would not fit (unless the cap is what stopped it).
    if tile < tiling.const["max_tile"]:
        bigger = tile + align
        more = (tiling.const["buffer_num"] * queues * io * bigger + work * 4 * bigger + bigger // 8
                + tiling.const["ub_reserve_bytes"])
        assert more > usable


def test_no_plan_reaches_the_api_reserve(tiling):
    """The AscendC library owns the top 8 KiB of the UB (TMP_UB_OFFSET); no plan's buffers may reach it, for any
    size, mode, dtype, core count or UB size, including UBs barely larger than both reserves."""
    api = tiling.const["api_ub_reserve_bytes"]
    assert api == 8192
    for ub in UBS + (64 * 1024, api + tiling.const["ub_reserve_bytes"] + 4096):
        for mode in MODES:
            for io in (2, 4):
                for n in (1, 5000, 1 << 24):
                    for cores in CORES:
                        plan = tiling.plan(n, io, mode, cores, ub)
                        if plan is None:
                            continue
                        assert plan["ub_bytes_used"] <= ub - api, (ub, mode, io, n, cores, plan)
    # Too small to hold both reserves and one tile: refused, not squeezed into the reserve.
    assert tiling.plan(100, 4, model.FORWARD_NONE, ub=api + tiling.const["ub_reserve_bytes"]) is None


def test_half_types_get_longer_tiles(tiling):
    for mode in MODES:
        assert tiling.tile_length(mode, 2, UBS[0]) > tiling.tile_length(mode, 4, UBS[0])


def test_plan_refuses_what_cannot_run(tiling):
    assert tiling.plan(100, 8, model.FORWARD_NONE) is None      # float64: no vector float64
    assert tiling.plan(100, 4, model.FORWARD_NONE, cores=0) is None
    assert tiling.plan(100, 4, model.FORWARD_NONE, ub=4096) is None  # UB smaller than the reserve


def test_workspace_one_slot_per_core_only_when_reducing(tiling):
    for n in (1, 5000, 1 << 22):
        p = tiling.plan(n, 4, model.FORWARD_REDUCE)
        assert p["workspace_bytes"] == p["used_cores"] * tiling.const["partial_stride_bytes"]
        assert p["used_cores"] * tiling.const["partial_stride_bytes"] <= tiling.const["ub_reserve_bytes"]
        for mode in (model.FORWARD_NONE, model.BACKWARD_NONE, model.BACKWARD_REDUCE):
            assert tiling.plan(n, 4, mode)["workspace_bytes"] == 0


@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "batchmean"])
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (0, 4)])
def test_reduction_scale_matches_reference(tiling, reduction, shape):
    n = int(np.prod(shape))
    first = shape[0] if shape else 1
    expected = ref.reduction_scale(reduction, shape, shape)
    got = tiling.reduction_scale(reduction, n, first)
    if np.isnan(expected):
        assert np.isnan(got)
    else:
        assert got == np.float32(expected)


# ------------------------------------------------------------------------------------ kernel model
def _data(n, log_target, seed=0, special=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) - 1.0
    if log_target:
        t = (rng.standard_normal(n) - 1.5).astype(np.float32)
    else:
        t = rng.random(n).astype(np.float32)
    if special and n >= 8:
        # zero mass with x = -inf / NaN; NaN target; NaN input where the mass is positive
        no_mass = -np.inf if log_target else 0.0
        t[0], x[0] = no_mass, -np.inf
        t[1], x[1] = no_mass, np.nan
        t[2] = np.nan
        x[3] = np.nan
        if not log_target:
            t[4], x[4] = -0.5, -np.inf       # negative target: no mass either
        t[5] = -np.inf if log_target else 0.0
    return x, t


def _check(got, expected, dtype, what, mag=0.0):
    """NaN and inf positions exactly; finite values within TOL * (|expected| + mag), mag being the size of
    the terms that cancel (a float32 difference of two large terms is only accurate relative to them)."""
    got = np.asarray(got, np.float64)
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, what
    assert np.array_equal(np.isnan(got), np.isnan(expected)), f"{what}: NaN positions differ"
    fin = np.isfinite(expected)
    assert np.array_equal(got[~fin & ~np.isnan(expected)], expected[~fin & ~np.isnan(expected)]), what
    tol = TOL[dtype] * (np.abs(expected) + np.broadcast_to(np.abs(mag), expected.shape)) + 1e-30
    err = np.abs(got - expected)
    bad = fin & ~(err <= tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} off, first got {got[bad][0]!r} expected {expected[bad][0]!r}"


def _terms(x, t, log_target):
    """|first term| + |second term| of the pointwise loss (0 without mass): its cancellation scale."""
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    mass = ref.has_mass(t, log_target)
    ts, xs = np.where(mass, t, 1.0), np.where(mass, x, 0.0)
    with np.errstate(all="ignore"):
        m = np.exp(ts) * (np.abs(ts) + np.abs(xs)) if log_target else np.abs(ts) * (np.abs(np.log(ts)) + np.abs(xs))
    return np.where(mass & np.isfinite(m), m, 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4096 + 17, 70_001])
def test_model_forward_matches_reference(tiling, dtype, log_target, n):
    x, t = _data(n, log_target, seed=n, special=True)
    xq, tq = model.quantize(x, dtype), model.quantize(t, dtype)
    for reduction in ("none", "sum", "mean", "batchmean"):
        for cores in (1, 40):
            got = model.forward(tiling, xq, tq, reduction, log_target, dtype, cores=cores)
            expected = ref.kl_div(xq.astype(np.float64), tq.astype(np.float64), reduction, log_target)
            if reduction != "none":
                # A sum is rounded once on output; the error scale is the sum of |terms| (cancellation).
                expected = np.asarray(expected)
                mag = np.nansum(np.abs(ref.pointwise_loss(xq, tq, log_target))) \
                    * ref.reduction_scale(reduction, xq.shape, xq.shape)
                assert got.shape == ()
                if np.isnan(expected):
                    assert np.isnan(got)
                else:
                    assert abs(float(got) - float(expected)) <= TOL[dtype] * (abs(float(expected)) + mag), \
                        (reduction, cores, float(got), float(expected))
            else:
                if dtype != "float32":
                    expected = model.quantize(expected.astype(np.float32), dtype)
                _check(got, expected, dtype, f"{dtype} none", _terms(xq, tq, log_target))


@pytest.mark.parametrize("log_target", [False, True])
def test_model_zero_mass_is_exactly_zero(tiling, log_target):
    n = 300
    x = np.linspace(-50, 50, n).astype(np.float32)
    x[::7] = -np.inf
    x[::11] = np.nan
    t = np.full(n, -np.inf if log_target else 0.0, np.float32)
    if not log_target:
        t[::2] = -1.0
    assert np.all(model.forward(tiling, x, t, "none", log_target) == 0)
    assert model.forward(tiling, x, t, "sum", log_target) == 0
    dx, dt = model.backward(tiling, x, t, np.ones(n, np.float32), "none", log_target)
    assert np.all(dx == 0) and np.all(dt == 0)
    ex, et = ref.kl_div_grads(x, t, "none", log_target)
    assert np.all(ex == 0) and np.all(et == 0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "batchmean"])
def test_model_backward_matches_reference(tiling, dtype, log_target, reduction):
    x, t = _data(7 * 719, log_target, seed=3, special=True)   # 5033 elements: a ragged tail on the last core
    x, t = x.reshape(-1, 7), t.reshape(-1, 7)
    xq, tq = model.quantize(x, dtype), model.quantize(t, dtype)
    rng = np.random.default_rng(5)
    dout = model.quantize(rng.standard_normal(x.shape) if reduction == "none" else rng.standard_normal(()), dtype)
    dx, dt = model.backward(tiling, xq, tq, dout, reduction, log_target, dtype, cores=40)
    ex, et = ref.kl_div_grads(xq, tq, reduction, log_target, dout=dout)
    for got, exp, name in ((dx, ex, "dx"), (dt, et, "dt")):
        if dtype != "float32":
            exp = model.quantize(exp.astype(np.float32), dtype)
        mag = _terms(xq, tq, log_target) * np.abs(dout) * ref.reduction_scale(reduction, x.shape, x.shape)
        _check(got, exp, dtype, f"{dtype} {reduction} {name}", mag)


@pytest.mark.parametrize("cores", [40, 48])
def test_model_float32_sum_accuracy_4m(tiling, cores):
    """SPEC: a float32 sum over millions of elements within 1e-6 relative of float64 (the kernel sums each
    lane of the accumulator over a core's tiles, folds per core, and adds the core partials)."""
    rng = np.random.default_rng(11)
    n = 4 << 20
    x = np.log(rng.dirichlet(np.ones(16), n // 16)).reshape(-1).astype(np.float32)
    t = rng.dirichlet(np.ones(16), n // 16).reshape(-1).astype(np.float32)
    sim = model.KernelSimulator("float32")
    for log_target, tt in ((False, t), (True, np.log(t).astype(np.float32))):
        expected = float(ref.kl_div(x, tt, "sum", log_target))
        for how, got in (("replay", model.forward(tiling, x, tt, "sum", log_target, cores=cores)),
                         ("kernel source", sim.forward(x, tt, "sum", log_target, cores=cores))):
            got = float(got)
            assert abs(got - expected) <= 1e-6 * abs(expected), (how, log_target, got, expected)


@pytest.mark.skipif(not os.environ.get("MS_KLDIV_SLOW"), reason="32M-element replay takes ~10 s and ~3 GB: "
                    "set MS_KLDIV_SLOW=1 to run it")
def test_model_float32_sum_accuracy_32m(tiling):
    rng = np.random.default_rng(12)
    n = 32 << 20
    x = np.log(rng.dirichlet(np.ones(32), n // 32)).reshape(-1).astype(np.float32)
    t = rng.dirichlet(np.ones(32), n // 32).reshape(-1).astype(np.float32)
    expected = float(ref.kl_div(x, t, "sum", False))
    for how, got in (("replay", model.forward(tiling, x, t, "sum", False)),
                     ("kernel source", model.KernelSimulator("float32").forward(x, t, "sum", False))):
        got = float(got)
        assert abs(got - expected) <= 1e-6 * abs(expected), (how, got, expected)


def test_model_is_deterministic_and_core_count_only_changes_rounding(tiling):
    x, t = _data(100_000, False, seed=9)
    a = model.forward(tiling, x, t, "sum", False, cores=40)
    b = model.forward(tiling, x, t, "sum", False, cores=40)
    c = model.forward(tiling, x, t, "sum", False, cores=7)
    assert a == b
    expected = float(ref.kl_div(x, t, "sum", False))
    assert abs(float(c) - expected) <= 1e-6 * abs(expected)


# ------------------------------------------------------------------ the kernel sources, executed on the CPU
# op_kernel/*.cpp compiled with g++ against a CPU stand-in of the AscendC API (tests/ascend/ascendc_sim):
# one thread per vector core, SyncAll a barrier, UB allocations, DataCopy alignment and CompareScalar repeat
# sizes checked. This runs the real kernel code paths (core split, queues, tails, masks, fused reduction with
# the workspace and the final pass); only the API underneath is simulated.
@pytest.fixture(scope="module", params=["float32", "float16", "bfloat16"])
def sim(request):
    return model.KernelSimulator(request.param)


@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("n, cores", [(1, 40), (65, 40), (4096 + 17, 40), (70_001, 40), (70_001, 48), (9000, 1)])
def test_kernel_source_forward(tiling, sim, log_target, n, cores):
    dtype = sim.dtype
    x, t = _data(n, log_target, seed=n + cores, special=True)
    xq, tq = model.quantize(x, dtype), model.quantize(t, dtype)
    for reduction in ("none", "sum", "mean", "batchmean"):
        got = sim.forward(xq, tq, reduction, log_target, cores=cores)
        replay = model.forward(tiling, xq, tq, reduction, log_target, dtype, cores=cores)
        expected = ref.kl_div(xq, tq, reduction, log_target)
        what = f"{dtype} {reduction} n={n} cores={cores}"
        if reduction == "none":
            if dtype != "float32":
                expected = model.quantize(expected.astype(np.float32), dtype)
            _check(got, expected, dtype, what, _terms(xq, tq, log_target))
            _check(got, replay, dtype, what + " vs replay", _terms(xq, tq, log_target))
        else:
            assert got.shape == ()
            mag = np.nansum(_terms(xq, tq, log_target)) * ref.reduction_scale(reduction, xq.shape, xq.shape)
            _check(got, expected, dtype, what, mag)
            # Same operations in the same order as the replay: equal up to libm-vs-NumPy log/exp rounding.
            _check(got, replay, dtype, what + " vs replay", mag * 1e-3)


def _cancelling(log_target, dtype):
    """4M terms of about +-1000 in rows of one sign cancelling to about 4e4 (1e5 times below the sum of |term|),
    as test_aot_kernel.py's CPU case: the operands in the IO dtype and the float64 terms of the values they hold."""
    rng = np.random.default_rng(17)
    p = rng.uniform(0.5, 1.0, (2048, 2048))
    mag = rng.uniform(900.0, 1100.0, (1024, 2048))
    term = rng.permutation(np.concatenate([mag, -rng.permutation(mag)])) + 0.01
    x = model.quantize((np.log(p) - term / p).astype(np.float32), dtype)
    t = model.quantize((np.log(p) if log_target else p).astype(np.float32), dtype)
    return x, t, ref.kl_div(x.astype(np.float64), t.astype(np.float64), "none", log_target)


@pytest.mark.parametrize("log_target", [False, True])
def test_kernel_source_sum_of_cancelling_terms(tiling, sim, log_target):
    """The reduced forward compensates its float32 sums (Kahan lanes, a TwoSum fold, (sum, correction) core
    partials): the error stays at the terms' own rounding, sqrt(sum term^2) * 2^-24 times a few, however far the
    total is below the sum of |term|. Plain float32 lanes and folds gave ~117 such units here, and the per-core
    fold of partials near 3e7 alone dozens."""
    dtype = sim.dtype
    x, t, terms = _cancelling(log_target, dtype)
    rounding = np.sqrt(np.sum(terms * terms)) * 2.0**-24
    out_eps = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]  # the output's own rounding
    for reduction, scale in (("sum", 1.0), ("mean", 1.0 / terms.size), ("batchmean", 1.0 / terms.shape[0])):
        want = float(np.sum(terms)) * scale
        runs = [("kernel source", sim.forward(x, t, reduction, log_target))]
        if dtype == "float32" and reduction == "sum":
            runs.append(("replay", model.forward(tiling, x, t, reduction, log_target, dtype)))
        for how, got in runs:
            err = abs(float(got) - want)
            assert err <= 8 * rounding * scale + out_eps * abs(want), (how, reduction, float(got), want,
                                                                        err / (rounding * scale))


@pytest.mark.parametrize("log_target", [False, True])
def test_kernel_source_infinite_sums(tiling, sim, log_target):
    """The correction of an inf sum is NaN (inf - inf): it must neither turn +inf into NaN nor outlive the tile
    where it appears; +inf and -inf terms together give NaN, as the float64 sum does."""
    n = 70_001  # several tiles per core and a ragged tail
    x, t = _data(n, log_target, seed=5)
    x[n // 3] = -np.inf          # a term of +inf in the middle of a core's range
    x[n - 1] = -np.inf           # and in the ragged tail
    both = x.copy()
    both[n // 2] = np.inf        # t * (log t - inf): -inf
    for xx in (x, both):
        xq, tq = model.quantize(xx, sim.dtype), model.quantize(t, sim.dtype)
        expected = float(ref.kl_div(xq, tq, "sum", log_target))
        for how, got in (("kernel source", sim.forward(xq, tq, "sum", log_target)),
                         ("replay", model.forward(tiling, xq, tq, "sum", log_target, sim.dtype))):
            got = float(got)
            assert got == expected or (np.isnan(got) and np.isnan(expected)), (how, got, expected)


@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "batchmean"])
def test_kernel_source_backward(sim, log_target, reduction):
    dtype = sim.dtype
    x, t = _data(7 * 1441, log_target, seed=21, special=True)      # 10087 elements: 3 cores, ragged tail
    x, t = x.reshape(-1, 7), t.reshape(-1, 7)
    xq, tq = model.quantize(x, dtype), model.quantize(t, dtype)
    rng = np.random.default_rng(8)
    dout = model.quantize(rng.standard_normal(x.shape) if reduction == "none" else rng.standard_normal(()), dtype)
    dx, dt = sim.backward(xq, tq, dout, reduction, log_target)
    ex, et = ref.kl_div_grads(xq, tq, reduction, log_target, dout=dout)
    mag = _terms(xq, tq, log_target) * np.abs(dout) * ref.reduction_scale(reduction, x.shape, x.shape)
    for got, exp, name in ((dx, ex, "dx"), (dt, et, "dt")):
        if dtype != "float32":
            exp = model.quantize(exp.astype(np.float32), dtype)
        _check(got, exp, dtype, f"{dtype} {reduction} {name}", mag)


def test_kernel_ub_footprint_matches_the_plan(tiling, sim):
    """The InitBuffer calls of the kernels stay within what the tiling budgeted (and the budget is tight)."""
    io = IO[sim.dtype]
    n = 1 << 20
    x, t = _data(n, False, seed=1)
    for mode, run in ((model.FORWARD_NONE, lambda: sim.forward(x, t, "none", False)),
                      (model.FORWARD_REDUCE, lambda: sim.forward(x, t, "sum", False)),
                      (model.BACKWARD_NONE, lambda: sim.backward(x, t, np.ones(n, np.float32), "none", False)),
                      (model.BACKWARD_REDUCE, lambda: sim.backward(x, t, np.float32(1), "mean", False))):
        run()
        plan = tiling.plan(n, io, mode)
        used = sim.max_ub_used()
        assert used <= plan["ub_bytes_used"] <= model.ASCEND910B_UB - tiling.const["api_ub_reserve_bytes"], \
            (mode, used, plan)
        assert used >= plan["ub_bytes_used"] - tiling.const["ub_reserve_bytes"] - 1024, (mode, used, plan)


def test_kernel_reduction_is_deterministic(sim):
    x, t = _data(300_000, False, seed=2)
    a = sim.forward(x, t, "sum", False)
    assert all(sim.forward(x, t, "sum", False) == a for _ in range(3))
