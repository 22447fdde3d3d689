"""The Ascend operators' tiling (custom_ops/ascend/op_kernel/kl_div_tiling_plan.h) and a NumPy replay of the
AscendC kernels' tile loops, run on the CPU: no Ascend device or CANN toolkit is needed.

The tiling is the C++ header itself, compiled with g++ (a C++ self-test driver, and a C API loaded with ctypes
that the NumPy model reads its numbers from). The model follows the kernels' float32 operations in their
order and is checked against the float64 reference ``ms_kldiv.reference``.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from ms_kldiv import reference as ref

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ascend"))
import kldiv_tile_model as model  # noqa: E402

pytestmark = pytest.mark.skipif(model.compiler() is None, reason="no C++ compiler (g++ or $CXX) to build the tiling")

IO = {"float32": 4, "float16": 2, "bfloat16": 2}
MODES = (model.FORWARD_NONE, model.FORWARD_REDUCE, model.BACKWARD_NONE, model.BACKWARD_REDUCE)
# 910B (192 KiB UB, 40 or 48 vector cores), a 256 KiB part, and small core counts.
UBS = (192 * 1024, 256 * 1024)
CORES = (1, 3, 40, 48)
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
    # work tiles, 1-bit mask, ReduceSum work) plus the fixed reserve.
    queues = {model.FORWARD_NONE: 3, model.FORWARD_REDUCE: 2, model.BACKWARD_NONE: 5, model.BACKWARD_REDUCE: 4}[mode]
    work = {model.FORWARD_NONE: 3, model.FORWARD_REDUCE: 4, model.BACKWARD_NONE: 5, model.BACKWARD_REDUCE: 4}[mode]
    bytes_ = (tiling.const["buffer_num"] * queues * io * tile + work * 4 * tile + tile // 8
              + (tile // 64 * 4 if mode == model.FORWARD_REDUCE else 0) + tiling.const["ub_reserve_bytes"])
    assert bytes_ <= usable
    # Maximal: one more tile step would not fit (unless the cap is what stopped it).
    if tile < tiling.const["max_tile"]:
        bigger = tile + align
        more = (tiling.const["buffer_num"] * queues * io * bigger + work * 4 * bigger + bigger // 8
                + (bigger // 64 * 4 if mode == model.FORWARD_REDUCE else 0) + tiling.const["ub_reserve_bytes"])
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


# --------------------------------------------------------------- the stand-in's signatures vs the real API
SIG_SRC = os.path.join(os.path.dirname(model.__file__), "api_signatures.cpp")


def _syntax_only(*defines):
    cmd = [model.compiler(), "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-I", model.SIM_DIR] \
        + [f"-D{d}" for d in defines] + [SIG_SRC]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_stand_in_declares_the_real_signatures():
    """Every stand-in call binds to a pointer typed from the asc-devkit declaration (API_CHECK.md)."""
    res = _syntax_only()
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("case", ["REJECT_DOUBLE_SCALAR", "REJECT_RVALUE_FREE", "REJECT_DOUBLE_DUPLICATE",
                                  "REJECT_MIXED_COMPARE"])
def test_stand_in_rejects_what_the_real_api_rejects(case):
    res = _syntax_only(case)
    assert res.returncode != 0, f"{case} compiled against the stand-in; the real API rejects it"
    assert "error" in res.stderr and "api_signatures.cpp" in res.stderr


# ---------------------------------------------------- fused distillation kernels (DistillCustom / DistillCustomGrad)
# op_kernel/distill_custom*.cpp compiled against the same stand-in (tests/ascend/distill_sim.py) and
# checked against the float64 reference ms_kldiv.reference.distillation_pointwise.
import distill_sim  # noqa: E402

BETAS = (0.0, 0.5, 1.0)
TEMPS = (0.5, 1.0, 2.0)


@pytest.fixture(scope="module")
def dsim32():
    return distill_sim.DistillKernelSimulator("float32")


_log_softmax = distill_sim.log_softmax_f64
distill_grads_f64 = distill_sim.reference_grads_f64


def _distill_mag(student, teacher, temperature, beta):
    """Per-element size of what the kernel adds up for a row's loss and gradients (|log p| weighted by both
    probabilities, plus the log-mixture for JSD): the float32 cancellation scale. 0 where both have no mass."""
    ls, lt = _log_softmax(student, temperature), _log_softmax(teacher, temperature)
    ps, pt = np.exp(ls), np.exp(lt)
    with np.errstate(all="ignore"):
        size = np.abs(np.where(np.isfinite(ls), ls, 0.0)) + np.abs(np.where(np.isfinite(lt), lt, 0.0)) + 1.0
    return (ps + pt) * size


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_distill_gradient_reference_is_the_derivative(beta, temperature):
    """The float64 closed-form gradients used below against central differences of the float64 loss."""
    rng = np.random.default_rng(3)
    s, t = rng.standard_normal((3, 5)) * 2, rng.standard_normal((3, 5)) * 2
    g = rng.uniform(0.5, 1.5, 3)
    ds, dt = distill_grads_f64(s, t, temperature, beta, g)

    def loss(s_, t_):
        return float((ref.distillation_pointwise(s_, t_, temperature, beta).sum(-1) * g).sum())

    eps = 1e-6
    for arr, got in ((s, ds), (t, dt)):
        fd = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + eps
            hi = loss(s, t)
            arr[i] = old - eps
            lo = loss(s, t)
            arr[i] = old
            fd[i] = (hi - lo) / (2 * eps)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


def _distill_inputs(rows, vocab, seed, scale=3.0):
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
    t = (rng.standard_normal((rows, vocab)) * scale + 0.5).astype(np.float32)
    return s, t


def _check_distill(sim, s, t, temperature, beta, cores, g=None, grad_rtol=2e-6, loss_rtol=2e-6, what=""):
    """Runs forward + backward (both gradients) on the stand-in and compares with float64. Returns the stats."""
    rows = s.shape[0]
    sq, tq = distill_sim.quantize(s, sim.dtype), distill_sim.quantize(t, sim.dtype)
    stats = sim.forward(sq, tq, temperature, beta, cores=cores)
    assert stats.shape == (rows, 8)
    exp_loss = ref.distillation_pointwise(sq, tq, temperature, beta).sum(-1)
    mag = _distill_mag(sq, tq, temperature, beta)
    row_mag = temperature ** 2 * mag.sum(-1)
    loss = stats[:, 0].astype(np.float64)
    assert not np.isnan(loss).any(), what
    fin = np.isfinite(exp_loss)
    assert np.array_equal(loss[~fin], exp_loss[~fin]), what  # +inf exactly where the math says
    err = np.abs(loss[fin] - exp_loss[fin])
    assert (err <= loss_rtol * row_mag[fin]).all(), (what, err.max(), (err / row_mag[fin]).max())
    # The saved log-sum-exps of the scaled rows.
    for col, z in ((1, sq), (2, tq)):
        lse = np.log(np.exp(z.astype(np.float64) / temperature - (z.max(-1, keepdims=True) / temperature)).sum(-1)) \
            + z.max(-1) / temperature
        np.testing.assert_allclose(stats[:, col], lse, rtol=1e-6, atol=1e-6, err_msg=what)

    rng = np.random.default_rng(rows)
    g = rng.uniform(0.5, 1.5, rows).astype(np.float32) if g is None else np.asarray(g, np.float32)
    ds, dt = sim.backward(sq, tq, stats, g, temperature, beta, teacher_grad=True, cores=cores)
    eds, edt = distill_grads_f64(sq, tq, temperature, beta, g)
    gmag = np.abs(g.astype(np.float64))[:, None] * temperature * mag
    tol_io = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[sim.dtype]
    # Probabilities below float32's normal range (e^-87) underflow in the kernel: an absolute floor; float16's own
    # subnormal spacing for its outputs.
    floor = 2.0 ** -24 if sim.dtype == "float16" else 1e-36
    for got, exp, name in ((ds, eds, "d_student"), (dt, edt, "d_teacher")):
        rows_ok = fin & (g != 0)
        e, gv = exp[rows_ok], got[rows_ok].astype(np.float64)
        bad = ~(np.abs(gv - e) <= grad_rtol * gmag[rows_ok] + tol_io * np.abs(e) + floor)
        assert not bad.any(), (what, name, int(bad.sum()), gv[bad][:3], e[bad][:3])
        assert (got[g == 0] == 0).all(), (what, name, "rows with g = 0 must be exact zeros")
    return stats, ds, dt


def _tiles(sim, op, kind, io=4):
    """The plan's tile length for a long row (what a 152K row is cut into)."""
    return sim.plan(4, 1 << 20, io, op, kind)["tile_length"]


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temperature", TEMPS)
def test_distill_kernel_float32_vocab_sizes(dsim32, beta, temperature):
    """V = 1, 7, forward tile - 1 and + 1, backward tile + 1 (ragged last tiles; V * 4 not a multiple of 32 B, so
    rows start inside 32 B blocks), rows not a multiple of the cores (7 rows on 3 cores, 41 on 40)."""
    kind = dsim32.kind_of_beta(beta)
    tf = _tiles(dsim32, distill_sim.FORWARD, kind)
    tb = _tiles(dsim32, distill_sim.BACKWARD_BOTH, kind)
    for vocab, rows, cores in ((1, 7, 3), (7, 41, 40), (tf - 1, 7, 3), (tf + 1, 5, 3), (tb + 1, 7, 40)):
        s, t = _distill_inputs(rows, vocab, seed=vocab + rows)
        _check_distill(dsim32, s, t, temperature, beta, cores, what=f"V={vocab} rows={rows} cores={cores}")


@pytest.mark.parametrize("beta", BETAS)
def test_distill_kernel_float32_qwen_vocab(dsim32, beta):
    """A 152,064-entry row (Qwen2's vocabulary): 27-55 tiles a row; 3 rows on 2 cores. Row 2's logits rise
    along the row, so both running maxima grow in every tile (every online rescale is exercised)."""
    s, t = _distill_inputs(3, 152064, seed=7)
    ramp = np.linspace(-30, 30, 152064, dtype=np.float32)
    s[2] += ramp
    t[2] += 1.1 * ramp
    for temperature in TEMPS:
        _check_distill(dsim32, s, t, temperature, beta, cores=2, what=f"152064 T={temperature}")


def test_distill_kernel_float32_largest_vocab(dsim32):
    """V = 262,144 (the largest the issue names): 47-74 tiles a row, ragged last tiles for most op/beta pairs."""
    s, t = _distill_inputs(2, 262144, seed=8)
    for beta in BETAS:
        _check_distill(dsim32, s, t, 1.0, beta, cores=2, what=f"262144 beta={beta}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("beta", BETAS)
def test_distill_kernel_half_inputs(dtype, beta):
    """float16/bfloat16 logits: float32 inside (the loss is float32 stats), gradients rounded once."""
    sim = distill_sim.DistillKernelSimulator(dtype)
    kind = sim.kind_of_beta(beta)
    tf = _tiles(sim, distill_sim.FORWARD, kind, io=2)
    for vocab, rows, cores in ((7, 9, 4), (tf + 1, 5, 3)):
        s, t = _distill_inputs(rows, vocab, seed=vocab)
        _check_distill(sim, s, t, 2.0, beta, cores, what=f"{dtype} V={vocab}")


@pytest.mark.parametrize("beta", BETAS)
def test_distill_kernel_masks(dsim32, beta):
    """-inf logits: shared by both (0), teacher-only, student-only (+inf where the weighting side has mass, exactly,
    never NaN), in one tile and across tiles; ignored rows (g = 0) give exact zero gradients."""
    kind = dsim32.kind_of_beta(beta)
    vocab = _tiles(dsim32, distill_sim.FORWARD, kind) * 2 + 77
    s, t = _distill_inputs(6, vocab, seed=11)
    s[0, ::5] = t[0, ::5] = -np.inf               # shared padding
    s[1, :vocab // 2] = t[1, :vocab // 2] = -np.inf  # a whole first tile masked in both: shifts start at 0
    t[2, 3::7] = -np.inf                          # teacher-only
    s[3, 5::11] = -np.inf                         # student-only
    s[4, -1] = -np.inf                            # student-only, in the last (ragged) tile
    t[5, 0] = -np.inf                             # teacher-only, first element
    g = np.array([1.0, 0.7, 1.3, 0.9, 1.1, 0.0], np.float32)  # row 5 ignored
    stats, ds, dt = _check_distill(dsim32, s, t, 1.5, beta, cores=4, g=g, what=f"masks beta={beta}")
    exp = ref.distillation_pointwise(s, t, 1.5, beta).sum(-1)
    inf_rows = {0.0: [3, 4], 1.0: [2, 5], 0.5: []}[beta]
    assert sorted(np.flatnonzero(np.isinf(stats[:, 0]))) == inf_rows
    assert sorted(np.flatnonzero(np.isinf(exp))) == inf_rows
    # In +inf rows, the gradient of the side whose formula stays finite: d/d(b) = T g (P_b - P_a).
    eds, edt = distill_grads_f64(s, t, 1.5, beta, g)
    for r in inf_rows:
        got, e = (ds[r], eds[r]) if beta == 0.0 else (dt[r], edt[r])
        if g[r]:
            np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-7)


def test_distill_kernel_large_logits_small_temperature(dsim32):
    """|z| ~ 1e4 and T = 0.05: no overflow, the KL terms are relative to the row maxima."""
    s, t = _distill_inputs(3, 1000, seed=5, scale=1.0)
    s = s * 1e4
    t = s + t * 10.0
    for beta in BETAS:
        stats = dsim32.forward(s, t, 0.05, beta, cores=2)
        assert np.isfinite(stats[:, :5]).all()
        _check_distill(dsim32, s, t, 0.05, beta, cores=2, loss_rtol=1e-5, grad_rtol=1e-5, what=f"large beta={beta}")


def test_distill_kernel_ignored_rows_never_read(dsim32):
    """g = 0 rows come back as exact zeros even when their stats are NaN (an ignored row's loss may be anything)."""
    s, t = _distill_inputs(4, 300, seed=2)
    for beta in BETAS:
        stats = dsim32.forward(s, t, 1.0, beta, cores=2)
        stats[1] = np.nan
        ds, dt = dsim32.backward(s, t, stats, np.array([1, 0, 1, 1], np.float32), 1.0, beta, cores=2)
        assert (ds[1] == 0).all() and (dt[1] == 0).all()
        assert np.isfinite(ds[[0, 2, 3]]).all() and np.isfinite(dt[[0, 2, 3]]).all()


def test_distill_kernel_frozen_teacher(dsim32):
    """teacher_grad=False: d_teacher is neither computed nor written; d_student is the same bits."""
    s, t = _distill_inputs(5, 9000, seed=4)
    for beta in BETAS:
        stats = dsim32.forward(s, t, 2.0, beta, cores=3)
        g = np.linspace(0.5, 1.5, 5).astype(np.float32)
        ds_both, _ = dsim32.backward(s, t, stats, g, 2.0, beta, teacher_grad=True, cores=3)
        ds_only, dt = dsim32.backward(s, t, stats, g, 2.0, beta, teacher_grad=False, cores=3)
        assert dt is None
        np.testing.assert_array_equal(ds_only, ds_both)


def test_distill_kernel_core_count_does_not_change_results(dsim32):
    """Rows are independent: the split over cores changes nothing, bit for bit."""
    s, t = _distill_inputs(13, 3000, seed=6)
    for beta in BETAS:
        a = dsim32.forward(s, t, 1.0, beta, cores=1)
        for cores in (2, 5, 13, 40):
            np.testing.assert_array_equal(dsim32.forward(s, t, 1.0, beta, cores=cores), a)


# -------------------------------------------------------------------------------------------- distill tiling
DISTILL_OPS = (distill_sim.FORWARD, distill_sim.BACKWARD_STUDENT, distill_sim.BACKWARD_BOTH)
DISTILL_KINDS = (distill_sim.FORWARD_KL, distill_sim.REVERSE_KL, distill_sim.JSD)


def _distill_bytes(sim, op, kind, io, tile):
    """The kernels' InitBuffer calls, listed: IO queues (double-buffered), float32 work tiles, the 1-bit mask,
    the forward's reduction work area, plus our fixed small buffers."""
    queues = {distill_sim.FORWARD: 2, distill_sim.BACKWARD_STUDENT: 3, distill_sim.BACKWARD_BOTH: 4}[op]
    work = 5 if kind == distill_sim.JSD else 4
    b = sim.const["buffer_num"] * queues * io * tile + work * 4 * tile + tile // 8
    if op == distill_sim.FORWARD:
        b += (tile // 32 + 64) * 4 + 64 * 4 + 32   # reduction work, scalar exchange, one stats row
    else:
        b += 32 + 32                               # one stats row, the row's gradient
    return b


@pytest.mark.parametrize("ub", UBS + (64 * 1024,))
def test_distill_tiles_fit_below_the_api_reserve(dsim32, ub):
    api = dsim32.const["api_ub_reserve_bytes"]
    assert api == 8192
    for op in DISTILL_OPS:
        for kind in DISTILL_KINDS:
            for io in (2, 4):
                plan = dsim32.plan(8, 1 << 20, io, op, kind, ub=ub)
                tile = plan["tile_length"]
                assert tile % dsim32.const["tile_align"] == 0 and 0 < tile <= dsim32.const["max_tile"]
                assert _distill_bytes(dsim32, op, kind, io, tile) <= plan["ub_bytes_used"] <= ub - api
                if tile < dsim32.const["max_tile"]:  # maximal: one more step would reach the reserve
                    bigger = tile + dsim32.const["tile_align"]
                    assert _distill_bytes(dsim32, op, kind, io, bigger) + dsim32.const["ub_reserve_bytes"] \
                        - (_distill_bytes(dsim32, op, kind, io, 0)) > ub - api
    # JSD needs one more work tile; a frozen teacher's backward one queue less; halves longer tiles.
    t = {(op, kind, io): dsim32.plan(1, 1 << 20, io, op, kind)["tile_length"]
         for op in DISTILL_OPS for kind in DISTILL_KINDS for io in (2, 4)}
    for io in (2, 4):
        assert t[(distill_sim.FORWARD, distill_sim.JSD, io)] < t[(distill_sim.FORWARD, distill_sim.FORWARD_KL, io)]
        assert t[(distill_sim.BACKWARD_STUDENT, distill_sim.FORWARD_KL, io)] \
            > t[(distill_sim.BACKWARD_BOTH, distill_sim.FORWARD_KL, io)]
    assert t[(distill_sim.FORWARD, distill_sim.FORWARD_KL, 2)] > t[(distill_sim.FORWARD, distill_sim.FORWARD_KL, 4)]
    assert dsim32.plan(1, 100, 4, distill_sim.FORWARD, distill_sim.FORWARD_KL, ub=api + 1024) is None


@pytest.mark.parametrize("rows", [0, 1, 7, 39, 40, 41, 1000, 12345])
@pytest.mark.parametrize("cores", CORES)
def test_distill_every_row_exactly_once(dsim32, rows, cores):
    plan = dsim32.plan(rows, 4096, 4, distill_sim.FORWARD, distill_sim.FORWARD_KL, cores=cores)
    assert plan["used_cores"] == max(1, min(rows, cores))
    pos = 0
    for core in range(plan["used_cores"]):
        start, length = dsim32.row_range(plan, core)
        assert start == pos and length in (rows // plan["used_cores"], rows // plan["used_cores"] + 1)
        pos += length
    assert pos == rows


@pytest.mark.parametrize("vocab", [1, 7, 255, 256, 257, 4095, 32000, 151936, 152064, 262144])
def test_distill_tile_counts(dsim32, vocab):
    """A row is covered by whole tiles plus one ragged tile; short rows get one tile no longer than needed."""
    for op in DISTILL_OPS:
        for kind in DISTILL_KINDS:
            for io in (2, 4):
                tile = dsim32.plan(3, vocab, io, op, kind)["tile_length"]
                full = _tiles(dsim32, op, kind, io)
                assert tile == min(full, -(-vocab // 256) * 256)
                n = dsim32.tile_count(vocab, tile)
                assert (n - 1) * tile < vocab <= n * tile
                last = vocab - (n - 1) * tile
                assert 0 < last <= dsim32.compute_count(last) <= tile
                assert dsim32.compute_count(last) % 64 == 0
    # 152,064 float32 entries: 608 KiB a row of each logit tensor, several times the whole UB.
    assert dsim32.tile_count(152064, _tiles(dsim32, distill_sim.FORWARD, distill_sim.FORWARD_KL)) > 20


def test_distill_kernel_ub_footprint_matches_the_plan(dsim32):
    """What the kernels' InitBuffer calls allocate on the stand-in is what the tiling budgeted, below the API's
    reserve (the stand-in also refuses any allocation reaching it)."""
    s, t = _distill_inputs(2, 1 << 16, seed=1)
    for beta in BETAS:
        kind = dsim32.kind_of_beta(beta)
        stats = dsim32.forward(s, t, 1.0, beta, cores=2)
        for op, run in ((distill_sim.FORWARD, lambda: dsim32.forward(s, t, 1.0, beta, cores=2)),
                        (distill_sim.BACKWARD_BOTH, lambda: dsim32.backward(s, t, stats, np.ones(2, np.float32), 1.0,
                                                                            beta, True, cores=2)),
                        (distill_sim.BACKWARD_STUDENT, lambda: dsim32.backward(s, t, stats, np.ones(2, np.float32),
                                                                               1.0, beta, False, cores=2))):
            run()
            plan = dsim32.plan(2, 1 << 16, 4, op, kind)
            used = dsim32.max_ub_used()
            assert _distill_bytes(dsim32, op, kind, 4, plan["tile_length"]) == used, (beta, op)
            assert used <= plan["ub_bytes_used"] <= distill_sim.ASCEND910B_UB - dsim32.const["api_ub_reserve_bytes"]
