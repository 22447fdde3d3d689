"""custom_ops/gpu/kldiv_cuda.cu executed on the CUDA-on-CPU stand-in (tests/gpu/standin), through the
same ABI as libkldiv_cuda.so, against the float64 reference: the GPU matrix of test_cuda_kernels.py at
small sizes (every reduction x target space x dtype x broadcast pattern, empty, NaN/inf/zero mass,
misaligned views, determinism). The stand-in aborts the child on divergence, barrier, bounds or
poisoned-shared-memory errors, so every case passing also means none of those happened.

The stand-in reports 2 SMs (grids of at most 16 blocks for elementwise kernels), so grid-stride loops run
several rounds at these sizes. The fuller matrix (larger sizes, more SM counts) runs with MS_KLDIV_SLOW=1.
"""
import os

import numpy as np
import pytest

from _modules import reference as ref

import _sim
from _gpu_checks import ATOL, TOL, close, sample, term_magnitudes

REASON = _sim.compiler_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"stand-in needs g++: {REASON}")
SLOW = os.environ.get("MS_KLDIV_SLOW") == "1"
slow_only = pytest.mark.skipif(not SLOW, reason="fuller stand-in matrix: run with MS_KLDIV_SLOW=1")

DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16"}
REDUCTIONS = ("none", "sum", "mean", "batchmean")


def rounded(x, dtype):
    return _sim.decode(_sim.encode(x, dtype), dtype)


def case_calls(xv, tv, dtype, log_target, offset=0, sms=2, seed=0, reductions=REDUCTIONS):
    """ABI calls for every reduction: forward, both-gradient backward, each single-gradient backward."""
    bshape = np.broadcast_shapes(xv.shape, tv.shape)
    rng = np.random.default_rng(seed)
    x, t = _sim.encode(xv, dtype), _sim.encode(tv, dtype)
    calls, meta = [], []
    for reduction in reductions:
        w = rounded(rng.normal(size=bshape) if reduction == "none" else np.asarray(rng.normal()), dtype)
        wd = _sim.encode(w, dtype)
        out = np.empty(bshape if reduction == "none" else (), x.dtype)
        base = dict(dtype=dtype, sms=sms)
        calls.append(dict(base, symbol=_sim.symbol("Fwd", reduction, log_target),
                          arrays=[(x, offset), (t, offset), (out, offset)], spec=2))
        calls.append(dict(base, symbol=_sim.symbol("Bwd", reduction, log_target),
                          arrays=[(x, offset), (t, offset), (wd, offset), (np.empty_like(x), offset),
                                  (np.empty_like(t), offset)], spec=3))
        calls.append(dict(base, symbol=_sim.symbol("BwdInput", reduction, log_target),
                          arrays=[(x, offset), (t, offset), (wd, offset), (np.empty_like(x), offset)], spec=3))
        calls.append(dict(base, symbol=_sim.symbol("BwdTarget", reduction, log_target),
                          arrays=[(x, offset), (t, offset), (wd, offset), (np.empty_like(t), offset)], spec=3))
        meta.append((reduction, w))
    return calls, meta


def check_case(x, t, dtype_id, log_target, offset=0, sms=2, reductions=REDUCTIONS):
    dtype = DTYPES[dtype_id]
    xv, tv = rounded(np.asarray(x, np.float64), dtype), rounded(np.asarray(t, np.float64), dtype)
    calls, meta = case_calls(xv, tv, dtype, log_target, offset, sms, reductions=reductions)
    results = _sim.run_calls(calls)
    bshape = np.broadcast_shapes(xv.shape, tv.shape)
    tol = TOL[dtype_id]
    for k, (reduction, w) in enumerate(meta):
        (rc0, (out,), live0), (rc1, (dx, dt), live1), (rc2, (dx1,), _), (rc3, (dt1,), _) = results[4 * k: 4 * k + 4]
        assert (rc0, rc1, rc2, rc3) == (0, 0, 0, 0), (reduction, rc0, rc1, rc2, rc3)
        assert live0 == 0 and live1 == 0, "scratch allocations leaked"
        exp = ref.kl_div(xv, tv, reduction, log_target)
        loss_m, pdx, pdt = term_magnitudes(xv, tv, log_target)
        loss_m = np.broadcast_to(loss_m, bshape)
        s = ref.reduction_scale(reduction, xv.shape, bshape)
        mag = loss_m if reduction == "none" else loss_m.sum() * abs(s)
        close(_sim.decode(out, dtype), exp, tol, mag, f"{reduction} value", ATOL[dtype_id])
        ex, et = ref.kl_div_grads(xv, tv, reduction, log_target, dout=w)
        g = np.abs(np.broadcast_to(w, bshape)) * (abs(s) if np.isfinite(s) else 1.0)
        mx = ref.sum_to(np.abs(pdx) * g, xv.shape)
        mt = ref.sum_to(np.abs(pdt) * g, tv.shape)
        close(_sim.decode(dx, dtype), ex, tol, mx, f"{reduction} d/dinput", ATOL[dtype_id])
        close(_sim.decode(dt, dtype), et, tol, mt, f"{reduction} d/dtarget", ATOL[dtype_id])
        close(_sim.decode(dx1, dtype), ex, tol, mx, f"{reduction} d/dinput alone", ATOL[dtype_id])
        close(_sim.decode(dt1, dtype), et, tol, mt, f"{reduction} d/dtarget alone", ATOL[dtype_id])


@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("xs, ts", [((33, 17), (33, 17)), ((4, 1, 3), (5, 3)), ((3, 1), (3, 4097))])
def test_matches_cpu_library(xs, ts, dtype_id, log_target):
    """The stand-in's results and libkldiv_cpu.so's, through the same ABI calls, agree within the dtype's
    tolerance (their summation orders differ, so not bit for bit)."""
    from _modules import build as _build
    dtype = DTYPES[dtype_id]
    x, t = operands(xs, ts, log_target, 3)
    xv, tv = rounded(x, dtype), rounded(t, dtype)
    calls, meta = case_calls(xv, tv, dtype, log_target)
    sim = _sim.run_calls(calls)
    cpu = _sim.run_calls(calls, lib_path=_build.ensure_library("CPU"))
    loss_m, pdx, pdt = term_magnitudes(xv, tv, log_target)
    bshape = np.broadcast_shapes(xv.shape, tv.shape)
    for k, (call, a, b) in enumerate(zip(calls, sim, cpu)):
        assert a[0] == b[0] == 0, (call["symbol"], a[0], b[0])
        reduction = meta[k // 4][0]
        s = ref.reduction_scale(reduction, xv.shape, bshape)
        s = abs(s) if np.isfinite(s) else 1.0
        w = np.abs(np.broadcast_to(meta[k // 4][1], bshape))
        for j, (u, v) in enumerate(zip(a[1], b[1])):
            if k % 4 == 0:
                m = np.broadcast_to(loss_m, bshape) if reduction == "none" else loss_m.sum() * s
            else:
                which = "t" if (k % 4 == 3 or j == 1) else "x"
                pm = pdt if which == "t" else pdx
                m = ref.sum_to(np.broadcast_to(pm, bshape) * w * s, (tv if which == "t" else xv).shape)
            close(_sim.decode(u, dtype), _sim.decode(v, dtype), 2 * TOL[dtype_id], m,
                  f"{call['symbol']} output {j}: stand-in vs CPU library", 2 * ATOL[dtype_id])


def operands(xs, ts, log_target, seed):
    rng = np.random.default_rng(seed)
    bshape = np.broadcast_shapes(xs, ts)
    x, t = sample(rng, bshape, log_target)
    pick = lambda a, s: a[tuple(slice(0, n) for n in (1,) * (len(bshape) - len(s)) + s)].reshape(s) \
        if s else np.asarray(a.reshape(-1)[0])
    return pick(x, xs), pick(t, ts)


BROADCASTS = [
    ((), ()), ((7,), ()), ((), (7,)), ((4, 5), (4, 5)), ((4, 1, 3), (5, 3)), ((1, 5), (3, 1)),
    ((5,), (2, 3, 5)), ((2, 3, 4, 5), (3, 1, 5)), ((33, 17), (33, 17)), ((1,), (6,)),
    ((8, 100), (100,)),              # a shared target row: segmented reduction, one block per kept element
    ((3, 1), (3, 4097)),             # few kept elements, long reduction: split + ordered finalize
]


@pytest.mark.parametrize("log_target", [False, True], ids=["prob", "logt"])
@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("xs, ts", BROADCASTS, ids=[f"{a}x{b}" for a, b in BROADCASTS])
def test_broadcast_patterns(xs, ts, dtype_id, log_target):
    x, t = operands(xs, ts, log_target, sum(xs) * 31 + sum(ts))
    check_case(x, t, dtype_id, log_target)


@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("xs, ts", [((0,), (0,)), ((2, 0), (0,)), ((0, 3), (3,)), ((1, 3), (0, 3))])
def test_empty(xs, ts, dtype_id):
    """'sum' of nothing is 0, 'mean' NaN, 'batchmean' NaN only when input.shape[0] == 0; gradients 0."""
    check_case(np.zeros(xs), np.zeros(ts), dtype_id, False)


@pytest.mark.parametrize("dtype_id", list(DTYPES))
def test_zero_mass_and_nan(dtype_id):
    inf, nan = np.inf, np.nan
    x = [0.5, -inf, inf, -2.0, -inf, 1e4, -0.7, nan, 0.3, nan]
    t = [0.0, 0.0, 0.0, -0.5, -inf, -3.0, 0.25, 0.5, nan, 0.0]
    check_case(x, t, dtype_id, False)
    tl = [-inf, -inf, -inf, -inf, -inf, -1.5, 0.0, -0.5, nan, -inf]
    check_case(x, tl, dtype_id, True)


@pytest.mark.parametrize("dtype_id", ["f32", "f16", "f64"])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_misaligned_views(dtype_id, offset):
    """Operands that start off a 16-byte boundary take the scalar path; only the operands' own bytes are
    registered with the stand-in, so a vector load past a view's end would abort."""
    x, t = sample(np.random.default_rng(offset), (1027 + offset,), False)
    check_case(x, t, dtype_id, False, offset=offset)


def test_deterministic():
    """No atomics: repeated runs, other SM counts (which change only elementwise grids) and the reverse
    thread schedule give bit-identical reductions."""
    x, t = sample(np.random.default_rng(9), (20_001,), False)
    xb, tb = x[:6000].reshape(60, 100), t[:100]
    xv, tv = _sim.encode(x, "float32"), _sim.encode(t, "float32")
    fwd = dict(symbol="KLDivFwdSumProb", dtype="float32", arrays=[(xv, 0), (tv, 0), (np.zeros((), np.float32), 0)],
               spec=2)
    xbv, tbv = _sim.encode(xb, "float32"), _sim.encode(tb, "float32")
    bwd = dict(symbol="KLDivBwdTargetNoneProb", dtype="float32",
               arrays=[(xbv, 0), (tbv, 0), (np.ones(xb.shape, np.float32), 0), (np.zeros(100, np.float32), 0)],
               spec=3)
    calls = [dict(fwd), dict(fwd), dict(bwd), dict(bwd), dict(fwd, sms=7), dict(bwd, sms=7),
             dict(fwd, reverse=True), dict(bwd, reverse=True)]
    r = _sim.run_calls(calls)
    r2 = _sim.run_calls(calls[:1])
    outs = [res[1][0].tobytes() for res in r]
    assert outs[0] == outs[1] == outs[4] == outs[6] == r2[0][1][0].tobytes()
    assert outs[2] == outs[3] == outs[5] == outs[7]
    close(r[0][1][0], ref.kl_div(xv.astype(np.float64), tv.astype(np.float64), "sum"), 1e-6)


def test_lib_info():
    info = _sim.run_calls([dict(symbol="__info__", arrays=[], dtype="")])[0]
    assert "ABI 1" in info and "CUDA" in info and ("stand-in" in info) != _sim.ON_DEVICE, info


@slow_only
@pytest.mark.parametrize("sms", [1, 80])
@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("xs, ts", [((70_001,), (70_001,)), ((16, 1, 257), (3, 257)), ((2, 1), (2, 70_000)),
                                     ((300, 40), (40,))])
def test_larger_sizes_slow(xs, ts, dtype_id, sms):
    x, t = operands(xs, ts, False, 5)
    check_case(x, t, dtype_id, False, sms=sms)


@slow_only
def test_index_space_past_2_31_slow():
    """A broadcast index space of 46,341^2 > 2^31 elements from two small operands (strided path, 64-bit
    linear indices and offsets): the forward sum against its float64 closed form
    sum_ij t_j (log t_j - x_i) = n_x sum_j t_j log t_j - (sum_j t_j)(sum_i x_i)."""
    n = 46_341
    assert n * n > 2 ** 31
    rng = np.random.default_rng(11)
    x = rounded(np.log(rng.uniform(0.05, 1.0, (n, 1))), "float32")
    t = rounded(rng.uniform(0.05, 1.0, (1, n)), "float32")
    call = dict(symbol="KLDivFwdSumProb", dtype="float32", sms=1,
                arrays=[(_sim.encode(x, "float32"), 0), (_sim.encode(t, "float32"), 0),
                        (np.zeros((), np.float32), 0)], spec=2)
    (rc, (out,), _), = _sim.run_calls([call], timeout=1800)
    assert rc == 0
    exp = n * np.sum(t * np.log(t)) - np.sum(t) * np.sum(x)
    assert abs(float(out) - exp) <= 1e-5 * abs(exp), (float(out), exp)
