"""The vocabulary-parallel entry points of custom_ops/gpu/distill_cuda.cu (DistillStates, DistillFwdGiven; ABI:
custom_ops/common/distill_abi.h) on the CUDA-on-CPU stand-in: on whole rows they reproduce DistillFwd's statistics,
and on uneven slices (one of them empty) with the normalizers merged across the "ranks" here (as
ms_kldiv._distill_math.merged_log_z does) the slices' sums add up to the whole rows' loss and sums; every call
gives what libkldiv_cpu.so gives for the same call. Warp-per-row and block-per-row launches, every kind of
divergence."""
import numpy as np
import pytest

from _modules import build as _build

import _sim
from test_cuda_distill_sim import STATS
from test_cuda_divergences_sim import VARIANTS, hyper_of

REASON = _sim.compiler_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"stand-in needs g++: {REASON}")
LOG_Z_S, LOG_Z_T, BASE_S, BASE_T = 1, 2, 5, 6


def _states_call(s, t, hyper):
    return dict(dtype="float32", symbol="DistillStates", dtypes=["float32", "float32", "float64", "float32"], spec=3,
                arrays=[(s, 0), (t, 0), (hyper, 0), (np.empty(s.shape[:-1] + (STATS,), np.float32), 0)])


def _given_call(s, t, hyper, states):
    return dict(dtype="float32", symbol="DistillFwdGiven",
                dtypes=["float32", "float32", "float64", "float32", "float32"], spec=4,
                arrays=[(s, 0), (t, 0), (hyper, 0), (states, 0), (np.empty(s.shape[:-1] + (STATS,), np.float32), 0)])


def _forward_call(s, t, hyper):
    call = _states_call(s, t, hyper)
    call["symbol"] = "DistillFwd"
    return call


def _run(calls, lib_path=None):
    out = _sim.run_calls(calls, lib_path)
    assert all(rc == 0 and live == 0 for rc, _, live in out), [(rc, live) for rc, _, live in out]
    return [arrays[0] for _, arrays, _ in out]


def _merged(states, temperature):
    """Each slice's stats with log Z of the whole row relative to its own base (merged_log_z in float64)."""
    out = []
    for st in states:
        m = st.astype(np.float64).copy()
        for lz, base in ((LOG_Z_S, BASE_S), (LOG_Z_T, BASE_T)):
            lse = [q[:, base] / temperature + q[:, lz] for q in states]
            m[:, lz] = np.logaddexp.reduce(np.stack(lse), axis=0) - st[:, base] / temperature
        out.append(m.astype(np.float32))
    return out


@pytest.mark.parametrize("vocab", [37, 2600], ids=["warp_per_row", "block_per_row"])
def test_slices_add_up_to_whole_rows(vocab):
    rng = np.random.default_rng(vocab)
    rows, temperature = 4, 1.5
    s = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    t = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    s[0, :3] = t[0, :3] = -np.inf  # masked in both
    bounds = [0, vocab // 3, vocab // 3, vocab]  # the second slice is empty
    cpu = _build.ensure_library("CPU")
    for name, variant in VARIANTS.items():
        hyper = hyper_of(temperature, variant)
        # the loss and the sums the backward reads (forward / reverse KL's one-pass forward leaves the other 0)
        cols = {0.0: [0, 4], 1.0: [0, 3]}.get(variant[1], [0, 3, 4]) if variant[0] == "kl" else [0, 3, 4]
        whole, whole_states = _run([_forward_call(s, t, hyper), _states_call(s, t, hyper)])
        np.testing.assert_allclose(whole_states[:, [1, 2, 5, 6]], whole[:, [1, 2, 5, 6]], rtol=1e-6, err_msg=name)
        given_whole, = _run([_given_call(s, t, hyper, whole_states)])
        np.testing.assert_allclose(given_whole[:, cols], whole[:, cols], rtol=2e-5, atol=2e-6, err_msg=name)
        parts = [(np.ascontiguousarray(s[:, a:b]), np.ascontiguousarray(t[:, a:b]))
                 for a, b in zip(bounds[:-1], bounds[1:])]
        states = _run([_states_call(ps, pt, hyper) for ps, pt in parts])
        assert np.all(states[1][:, [LOG_Z_S, LOG_Z_T]] == -np.inf), name  # the empty slice has no mass
        merged = _merged(states, temperature)
        sums = _run([_given_call(ps, pt, hyper, m) for (ps, pt), m in zip(parts, merged)])
        total = sum(x[:, cols].astype(np.float64) for x in sums)
        np.testing.assert_allclose(total, whole[:, cols], rtol=2e-5, atol=2e-6, err_msg=name)
        # the same calls on libkldiv_cpu.so
        cpu_states = _run([_states_call(ps, pt, hyper) for ps, pt in parts], cpu)
        cpu_sums = _run([_given_call(ps, pt, hyper, m) for (ps, pt), m in zip(parts, merged)], cpu)
        for got, want in zip(states + sums, cpu_states + cpu_sums):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=name)
