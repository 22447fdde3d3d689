"""The fused head's hard-label term in custom_ops/gpu/distill_cuda.cu (DistillHard; ABI:
custom_ops/common/distill_abi.h, math: custom_ops/common/distill_math.h) on the CUDA-on-CPU stand-in, against the
float64 reference (ms_kldiv.reference.hard_label_rows) and against libkldiv_cpu.so's DistillHard for the same calls:
both launch shapes (a warp per row up to 2048 classes, a block per row beyond), every dtype, label smoothing,
z-loss, soft cap and logit scale, -inf vocabulary padding, ignored rows (the incoming gradient passed through bit
for bit), a label outside the vocabulary and a NaN logit (NaN rows)."""
import numpy as np
import pytest

from _modules import build as _build
from _modules import reference as ref

import _sim
from _gpu_checks import TOL, close
from test_cuda_distill_sim import DTYPES

REASON = _sim.compiler_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"stand-in needs g++: {REASON}")

IGNORE = -100
# (z_loss, label_smoothing, softcap, logit_scale)
OPTIONS = {"plain": (0.0, 0.0, 0.0, 1.0), "smoothing-zloss": (1e-3, 0.1, 0.0, 1.0),
           "cap-smoothing": (0.0, 0.2, 5.0, 1.0), "scale-zloss": (0.01, 0.0, 0.0, 0.5)}
SHAPES = [(6, 37), (5, 2600), (4, 9001)]  # warp per row; block per row (several elements per thread)


def _hyper(options):
    z_loss, smoothing, cap, scale = options
    return np.array([1.0, 0.0, 0.0, 0.0, cap, scale, z_loss, smoothing, IGNORE], np.float64)


def _case(rows, vocab, seed, dtype):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(rows, vocab)) * 3.0
    s[:, -3:] = -np.inf
    s[:, 4::11] = -np.inf
    labels = rng.integers(0, vocab - 3, rows)
    labels[labels % 11 == 4] = 0
    labels[1], labels[2] = IGNORE, vocab + 2
    s[3, 7] = np.nan
    g = rng.uniform(0.5, 2.0, rows).astype(np.float32)
    ds = rng.normal(size=(rows, vocab)) * 1e-2
    return _sim.decode(_sim.encode(s, dtype), dtype), labels.astype(np.int32), g, \
        _sim.decode(_sim.encode(ds, dtype), dtype)


def _call(s, labels, g, ds, options, dtype):
    rows = s.shape[0]
    return dict(dtype=dtype, symbol="DistillHard",
                dtypes=[dtype, "int32", "float64", "float32", dtype, "float32", dtype], spec=5,
                arrays=[(_sim.encode(s, dtype), 0), (labels, 0), (_hyper(options), 0), (g, 0),
                        (_sim.encode(ds, dtype), 0), (np.empty(rows, np.float32), 0),
                        (_sim.encode(np.zeros_like(s), dtype), 0)])


def _run(calls, lib_path=None):
    out = _sim.run_calls(calls, lib_path)
    assert all(rc == 0 and live == 0 for rc, _, live in out), [(rc, live) for rc, _, live in out]
    return [arrays for _, arrays, _ in out]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_matches_reference_and_cpu_library(name):
    options = OPTIONS[name]
    cases, calls = [], []
    for dtype_id, dtype in DTYPES.items():
        for k, shape in enumerate(SHAPES):
            case = _case(*shape, seed=100 * k + len(name), dtype=dtype)
            cases.append((dtype_id, dtype, case))
            calls.append(_call(*case, options, dtype))
    cuda = _run(calls)
    cpu = _run(calls, _build.ensure_library("CPU"))
    for (dtype_id, dtype, (s, labels, g, ds)), (rows, d), (cpu_rows, cpu_d) in zip(cases, cuda, cpu):
        what = f"{name} {dtype_id} {s.shape}"
        d, cpu_d = _sim.decode(d, dtype), _sim.decode(cpu_d, dtype)
        want_rows, grad = ref.hard_label_rows(s, labels, *options, ignore_index=IGNORE)
        tol = max(TOL[dtype_id], 2e-6)
        close(rows, want_rows, tol, 1.0 + np.abs(want_rows), f"{what} rows")
        close(d, ds + g[:, None] * grad, tol, np.abs(ds) + g[:, None] * (np.abs(grad) + 1e-3), f"{what} d")
        assert rows[1] == 0.0 and np.array_equal(d[1], ds[1]), what  # ignored: the incoming gradient as it came
        assert np.isnan(rows[2]) and np.isnan(d[2]).all() and np.isnan(rows[3]), what
        padded = np.isneginf(s) & ~np.isnan(want_rows)[:, None]
        assert np.array_equal(d[padded], ds[padded]), what  # no probability, no smoothing share
        close(rows, cpu_rows, tol, 1.0 + np.abs(want_rows), f"{what} rows vs the CPU library")
        close(d, cpu_d, tol, np.abs(ds) + g[:, None] * (np.abs(grad) + 1e-3), f"{what} d vs the CPU library")
