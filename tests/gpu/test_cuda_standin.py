"""The CUDA-on-CPU stand-in itself (tests/gpu/standin): half/bfloat16 conversions bit-identical to NumPy
and a bit-level bfloat16 reference over all 65,536 patterns; warp operations against hand-computed
results; and deliberately broken kernels (tests/gpu/sim_cases/kernels.cu) each rejected with the right
error: a shuffle in a lane-dependent branch, an off-by-one tail, a missing __syncthreads before reading
shared memory, a read of unwritten shared memory, an out-of-bounds write, a barrier in a branch."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import _sim

REASON = _sim.compiler_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"stand-in needs g++: {REASON}")
HERE = os.path.dirname(os.path.abspath(__file__))
P = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731


@pytest.fixture(scope="module")
def convert():
    return ctypes.CDLL(_sim.build([os.path.join(HERE, "sim_cases", "convert.cu")]))


@pytest.fixture(scope="module")
def kernels_lib():
    return _sim.build([os.path.join(HERE, "sim_cases", "kernels.cu")])


def _call(lib, name, arr_in, out_dtype):
    out = np.empty(arr_in.shape, out_dtype)
    getattr(lib, name)(P(arr_in), P(out), ctypes.c_int64(arr_in.size))
    return out


def test_half_to_float_all_patterns(convert):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = _call(convert, "half_to_float", h, np.float32)
    exp = h.view(np.float16).astype(np.float32)
    nan = np.isnan(exp)
    assert np.array_equal(got.view(np.uint32)[~nan], exp.view(np.uint32)[~nan])
    assert np.isnan(got[nan]).all() and nan.sum() == 2046


def _float_candidates(values):
    """Every finite value of a 16-bit format, the midpoints between neighbours (ties), one float32 ulp on
    either side of each midpoint, and the edges of the range."""
    v = np.unique(values[np.isfinite(values)].astype(np.float64))
    mids = ((v[1:] + v[:-1]) / 2).astype(np.float32)
    edge = np.float32([65504, 65519.996, 65520, 1e5, -65520, 2.0 ** -25, 2.0 ** -26, -(2.0 ** -25), 3 * 2.0 ** -26,
                       np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45, 0.0, -0.0])
    return np.concatenate([v.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf)), edge]).astype(np.float32)


def test_float_to_half_round_to_nearest_even(convert):
    cand = _float_candidates(np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16))
    got = _call(convert, "float_to_half", cand, np.uint16)
    with np.errstate(over="ignore"):
        exp = cand.astype(np.float16).view(np.uint16)
    assert np.array_equal(got, exp), np.nonzero(got != exp)[0][:10]
    nan = _call(convert, "float_to_half", np.float32([np.nan, -np.nan]), np.uint16)
    assert list(nan) == [0x7FFF, 0x7FFF]  # the device's canonical NaN


def bf16_reference(f32):
    """Round-to-nearest-even float32 -> bfloat16 by bit manipulation (NaN -> canonical 0x7fff)."""
    u = f32.view(np.uint32).astype(np.uint64)
    r = ((u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
    return np.where(np.isnan(f32), np.uint16(0x7FFF), r)


def test_bfloat16_all_patterns(convert):
    b = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = _call(convert, "bf16_to_float", b, np.float32)
    assert np.array_equal(got.view(np.uint32), b.astype(np.uint32) << np.uint32(16))
    cand = _float_candidates(got)
    back = _call(convert, "float_to_bf16", cand, np.uint16)
    assert np.array_equal(back, bf16_reference(cand))
    try:
        import ml_dtypes
    except ImportError:
        return  # the bit-level reference above is the check
    exp = cand.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(back, exp), np.nonzero(back != exp)[0][:10]


_RUNNER = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
res = ctypes.c_double(0)
rc = lib.run_case(int(sys.argv[2]), ctypes.c_int64(int(sys.argv[3])), int(sys.argv[4]), ctypes.byref(res),
                  int(sys.argv[5]))
print(repr(res.value), rc)
"""


def run_case(lib, which, n=5000, blocks=3, reverse=False):
    return subprocess.run([sys.executable, "-c", _RUNNER, lib, str(which), str(n), str(blocks), str(int(reverse))],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_correct_block_sum_runs_clean(kernels_lib, reverse):
    n = 5000
    proc = run_case(kernels_lib, 0, n, reverse=reverse)
    assert proc.returncode == 0, proc.stderr
    got = float(proc.stdout.split()[0])
    exp = float(np.sum(np.arange(n) % 7 - 2.5))
    assert got == exp


# A missing __syncthreads shows either way the threads are scheduled: in thread order warp 0 reads slots the
# later warps have not written yet; in reverse order it reads slots written by other threads in the same
# barrier interval.
@pytest.mark.parametrize("which, reverse, message", [
    (1, False, "read of unwritten shared memory"),  # missing __syncthreads before reading shared memory
    (1, True, "shared memory race"),
    (2, False, "read of unwritten shared memory"),
    (3, False, "out-of-bounds read of 4 bytes"),    # off-by-one tail of a grid-stride loop
    (4, False, "divergence"),                       # shuffle in a lane-dependent branch
    (4, True, "divergence"),
    (5, False, "wait at __syncthreads()"),          # barrier in a branch
    (6, False, "out-of-bounds write of 4 bytes"),
])
def test_broken_kernel_is_caught(kernels_lib, which, reverse, message):
    proc = run_case(kernels_lib, which, reverse=reverse)
    assert proc.returncode != 0, f"case {which} ran clean: {proc.stdout}"
    assert "cudasim: " in proc.stderr and message in proc.stderr, proc.stderr[-2000:]
    assert "kernel " in proc.stderr and "thread (" in proc.stderr, proc.stderr[-2000:]


def test_two_translation_units_share_the_stand_in():
    """Several .cu files in one stand-in library (as custom_ops/gpu/*.cu are built) share one state: a
    kernel of one file runs clean and the other file's conversions are there."""
    lib = _sim.build([os.path.join(HERE, "sim_cases", "kernels.cu"), os.path.join(HERE, "sim_cases", "convert.cu")])
    proc = run_case(lib, 0)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.split()[0]) == float(np.sum(np.arange(5000) % 7 - 2.5))
    proc = run_case(lib, 6)
    assert "out-of-bounds write" in proc.stderr, proc.stderr
    assert hasattr(ctypes.CDLL(lib), "float_to_bf16")


_WARP = r"""
import ctypes, sys, numpy as np
lib = ctypes.CDLL(sys.argv[1])
out = np.zeros(7 * int(sys.argv[2]), np.int32)
lib.run_warp_ops(out.ctypes.data_as(ctypes.c_void_p), int(sys.argv[2]))
pm = np.zeros(64, np.int32)
lib.run_partial_mask(pm.ctypes.data_as(ctypes.c_void_p))
sys.stdout.write(",".join(map(str, list(out) + list(pm))))
"""


def test_warp_operations(kernels_lib):
    threads = 64
    proc = subprocess.run([sys.executable, "-c", _WARP, kernels_lib, str(threads)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    vals = np.array(proc.stdout.split(","), np.int64)
    got, pm = vals[:7 * threads].reshape(threads, 7), vals[7 * threads:]
    for t in range(threads):
        lane, base = t & 31, t & ~31
        down = t + 5 if lane + 5 < 32 else t
        up = t - 3 if (lane & 15) >= 3 else t
        xor = base + (lane ^ 9)
        idx = base + ((lane * 7) & 31)
        ballot = sum(1 << l for l in range(32) if (base + l) % 3 == 0)
        ballot = ballot - (1 << 32) if ballot >= 1 << 31 else ballot
        any_ = int(base <= 40 < base + 32)
        assert list(got[t]) == [down, up, xor, idx, ballot, any_, 0], (t, list(got[t]))
    for t in range(64):
        lane = t & 31
        assert pm[t] == (lane ^ 2 if lane % 2 == 0 else lane), (t, pm[t])


# Deliberate bugs in a copy of the real kldiv_cuda.cu, each caught through the ordinary ABI calls.
MUTATIONS = {
    "tail_off_by_one": ("for (int64_t k = done + i; k < n; k += stride) out[k]",
                        "for (int64_t k = done + i; k <= n; k += stride) out[k]", "out-of-bounds"),
    "shuffle_in_lane_branch": ("if (warp == 0) v = warp_sum(v);", "if (lane < 16) v = warp_sum(v);", "divergence"),
    "missing_syncthreads": ("if (lane == 0) warp_part[warp] = v;\n  __syncthreads();",
                            "if (lane == 0) warp_part[warp] = v;", "shared memory"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutated_real_kernel_is_caught(name, tmp_path):
    old, new, message = MUTATIONS[name]
    src = os.path.join(_sim.SRC, "gpu", "kldiv_cuda.cu")
    with open(src, encoding="utf-8") as f:
        text = f.read()
    assert text.count(old) == 1, f"mutation {name} no longer matches kldiv_cuda.cu"
    mutated = tmp_path / "kldiv_cuda.cu"
    mutated.write_text(text.replace(old, new), encoding="utf-8")
    lib = _sim.build([str(mutated)])
    x = np.log(np.linspace(0.1, 1.0, 1001)).astype(np.float32)
    t = np.linspace(1.0, 0.0, 1001).astype(np.float32)
    fwd = lambda red, out: dict(symbol=_sim.symbol("Fwd", red, False), dtype="float32",  # noqa: E731
                                arrays=[(x, 1), (t, 1), (out, 1)], spec=2)
    with pytest.raises(_sim.SimError, match=message):
        _sim.run_calls([fwd("none", np.empty(1001, np.float32)), fwd("sum", np.zeros((), np.float32))], lib)
    # the unmutated source runs the same calls clean
    ok = _sim.run_calls([fwd("none", np.empty(1001, np.float32)), fwd("sum", np.zeros((), np.float32))])
    assert [r[0] for r in ok] == [0, 0]
