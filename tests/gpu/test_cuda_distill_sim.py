"""custom_ops/gpu/distill_cuda.cu (the fused distillation kernels of libkldiv_cuda.so) executed on the CUDA-on-CPU
stand-in through the distillation ABI (custom_ops/common/distill_abi.h), against the float64 reference
(ms_kldiv.reference: TRL's definition and its closed-form gradients, themselves checked by central differences
here) and against libkldiv_cpu.so's kernels for the same calls. Both launch shapes are covered (a warp per row for
small vocabularies, a block per row otherwise), with 128-bit and scalar loads (aligned and misaligned rows), every
dtype and divergence, ignored rows, masked classes, huge logits, empty shapes and determinism across grids and
schedules. The stand-in aborts on divergence, barrier, bounds and uninitialized-shared-memory errors, so each
passing case also shows none of those happened."""
import os

import numpy as np
import pytest

from _modules import reference as ref

import _sim
from _gpu_checks import ATOL, TOL, close, distill_magnitudes

REASON = _sim.compiler_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"stand-in needs g++: {REASON}")

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
STATS = 8
WARP_ROW_VOCAB = 2048  # distill_cuda.cu kWarpRowVocab: larger rows get a block each


def rounded(x, dtype):
    return _sim.decode(_sim.encode(x, dtype), dtype)


def abi_calls(es, et, hyper, stats, g, dtype, offset, **sim):
    """The ABI calls of one case: the forward alone (``stats`` None), else the three backward entry points."""
    base = dict(dtype=dtype, **sim)
    ins = [(es, offset), (et, offset), (hyper, 0)]
    types = [dtype, dtype, "float64", "float32"]
    if stats is None:
        lead = es.shape[:-1]
        return [dict(base, symbol="DistillFwd", dtypes=types, spec=3,
                     arrays=ins + [(np.empty(lead + (STATS,), np.float32), offset)])]
    ins += [(stats, offset), (g, offset)]
    types += ["float32"]
    return [dict(base, symbol="DistillBwd", dtypes=types + [dtype, dtype], spec=5,
                 arrays=ins + [(np.empty_like(es), offset), (np.empty_like(et), offset)]),
            dict(base, symbol="DistillBwdStudent", dtypes=types + [dtype], spec=5,
                 arrays=ins + [(np.empty_like(es), offset)]),
            dict(base, symbol="DistillBwdTeacher", dtypes=types + [dtype], spec=5,
                 arrays=ins + [(np.empty_like(et), offset)])]


def run_case(s, t, temperature, beta, dtype, dloss, offset=0, lib_path=None, **sim):
    """(stats, (ds, dt), ds alone, dt alone) from the library (the stand-in by default); the backward calls take
    the forward's own statistics."""
    es, et = _sim.encode(s, dtype), _sim.encode(t, dtype)
    # (temperature, beta, divergence code, alpha, soft cap, logit scale): the 'kl' family without a transform
    hyper = np.array([temperature, beta, 0.0, 0.0, 0.0, 1.0], np.float64)
    g = np.asarray(dloss, np.float32).reshape(s.shape[:-1])
    (rc, (stats,), live), = _sim.run_calls(abi_calls(es, et, hyper, None, g, dtype, offset, **sim), lib_path)
    assert rc == 0 and live == 0, (rc, live)
    out = _sim.run_calls(abi_calls(es, et, hyper, stats, g, dtype, offset, **sim), lib_path)
    assert [r[0] for r in out] == [0, 0, 0] and [r[2] for r in out] == [0, 0, 0], [(r[0], r[2]) for r in out]
    (_, (ds, dt), _), (_, (ds1,), _), (_, (dt1,), _) = out
    dec = lambda a: _sim.decode(a, dtype)  # noqa: E731
    return stats, (dec(ds), dec(dt)), dec(ds1), dec(dt1)


def logits(shape, seed, scale=3.0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=shape) * scale, rng.normal(size=shape) * scale, rng.normal(size=shape[:-1])


def check_case(s, t, temperature, beta, dtype_id, dloss, offset=0, **sim):
    dtype = DTYPES[dtype_id]
    s, t = rounded(s, dtype), rounded(t, dtype)
    stats, (ds, dt), ds1, dt1 = run_case(s, t, temperature, beta, dtype, dloss, offset, **sim)
    tol = TOL[dtype_id]
    # P of a far-off class can be a float32 subnormal: what it weights then has absolute, not relative, accuracy
    atol = max(ATOL[dtype_id], 2.0 ** -126)
    loss_mag, grad_mag = distill_magnitudes(s, t, temperature)
    exp_loss = ref.distillation_pointwise(s, t, temperature, beta).sum(axis=-1)
    close(stats[..., 0], exp_loss, max(tol, 1e-5), loss_mag, "row loss", 1e-30)
    eds, edt = ref.distillation_row_grads(s, t, temperature, beta, dloss)
    g = np.abs(np.asarray(dloss, np.float64))[..., None]
    close(ds, eds, max(tol, 2e-5), grad_mag * g, "d_student", atol)
    close(dt, edt, max(tol, 2e-5), grad_mag * g, "d_teacher", atol)
    # the single-gradient kernels compute the same values
    assert np.array_equal(ds1, ds, equal_nan=True) and np.array_equal(dt1, dt, equal_nan=True)
    return stats, ds, dt


BETAS = [0.0, 1.0, 0.5, 0.1]


def test_reference_gradients_match_central_differences():
    """The closed forms the kernels are checked against, against the definition (masked classes included)."""
    s, t, g = logits((3, 6), 0, 2.0)
    s[0, 2] = t[0, 2] = -np.inf  # a padded class in both
    t[1, 4] = -np.inf            # the teacher rules a class out (reverse KL would be +inf there: forward/JSD only)
    for beta in BETAS:
        for temperature in (0.5, 2.0):
            sb, tb = (s, t) if beta != 1.0 else (s, np.where(np.isinf(t) & np.isfinite(s), 0.3, t))
            f = lambda a, b: (ref.distillation_pointwise(a, b, temperature, beta).sum(-1) * g).sum()  # noqa
            analytic = ref.distillation_row_grads(sb, tb, temperature, beta, g)
            for which in (0, 1):
                base = (sb, tb)[which]
                num = np.zeros_like(base)
                for idx in np.ndindex(base.shape):
                    if not np.isfinite(base[idx]):
                        continue
                    up, dn = base.copy(), base.copy()
                    up[idx] += 1e-6
                    dn[idx] -= 1e-6
                    num[idx] = (f(*((up, tb) if which == 0 else (sb, up)))
                                - f(*((dn, tb) if which == 0 else (sb, dn)))) / 2e-6
                np.testing.assert_allclose(analytic[which], num, rtol=1e-6, atol=1e-7, err_msg=f"{beta} {temperature}")


@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("shape, offset", [((5, 37), 0), ((2, 3, 64), 0), ((3, 2600), 0), ((2, 2600), 1)],
                         ids=["warp-row-tail", "warp-row-vec", "block-row-vec", "block-row-misaligned"])
def test_matches_float64_reference(shape, offset, beta, dtype_id):
    s, t, g = logits(shape, hash((shape, beta)) % 1000)
    g.reshape(-1)[0] = 0.0  # an ignored row
    temperature = 2.0 if beta in (0.0, 0.5) else 0.5
    _, ds, dt = check_case(s, t, temperature, beta, dtype_id, g, offset)
    first = (0,) * (len(shape) - 1)
    assert not np.signbit(ds[first]).any() and not ds[first].any() and not dt[first].any()  # exact +0


@pytest.mark.parametrize("dtype_id", list(DTYPES))
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("shape", [(6, 40), (3, 2600)])
def test_matches_cpu_library(shape, beta, dtype_id):
    """The stand-in's statistics and gradients and libkldiv_cpu.so's for the same ABI calls: maxima identical,
    the rest within the dtype's tolerance (their summation orders differ)."""
    from _modules import build as _build
    dtype = DTYPES[dtype_id]
    s, t, g = logits(shape, 7)
    s, t = rounded(s, dtype), rounded(t, dtype)
    sim = run_case(s, t, 1.5, beta, dtype, g)
    cpu = run_case(s, t, 1.5, beta, dtype, g, lib_path=_build.ensure_library("CPU"))
    np.testing.assert_array_equal(sim[0][..., 5:7], cpu[0][..., 5:7])
    np.testing.assert_allclose(sim[0][..., :5], cpu[0][..., :5], rtol=2e-6, atol=2e-6)
    _, grad_mag = distill_magnitudes(s, t, 1.5)
    for a, b, what in ((sim[1][0], cpu[1][0], "d_student"), (sim[1][1], cpu[1][1], "d_teacher")):
        close(a, b, 2 * max(TOL[dtype_id], 2e-5), grad_mag * np.abs(g)[..., None], what, 2 * ATOL[dtype_id])


@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_masked_classes_and_huge_logits(beta):
    """-inf in both rows (a padded vocabulary) contributes exactly 0; the student ruling out a class the teacher
    keeps gives +inf under forward KL; |logits| ~ 1e4 at T = 0.05 stay exact (maxima in raw units)."""
    s, t, g = logits((4, 300), 3)
    s[:, ::7] = t[:, ::7] = -np.inf
    s[1], t[1] = s[1] * 3e3, t[1] * 3e3  # huge logits, T = 0.05 below: |z| ~ 2e5
    stats, ds, dt = check_case(s, t, 0.05, beta, "f32", g)
    assert (ds[:, ::7] == 0).all() and (dt[:, ::7] == 0).all()
    if beta == 0.0:
        s2 = s.copy()
        s2[2, 3] = -np.inf  # the teacher keeps class 3 of row 2
        st2 = run_case(rounded(s2, "float32"), rounded(t, "float32"), 0.05, beta, "float32", g)[0]
        assert st2[2, 0] == np.inf and np.isfinite(st2[[0, 1, 3], 0]).all()


def test_deterministic_across_grids_and_schedules():
    """Bitwise the same statistics and gradients whatever the SM count (grid) and the order blocks and warps
    run in: each row is reduced by its own group in a fixed order."""
    s, t, g = logits((9, 2600), 11)
    outs = [run_case(rounded(s, "float32"), rounded(t, "float32"), 1.0, beta, "float32", g, sms=sms, reverse=rev)
            for beta in (0.0, 0.5) for sms, rev in ((1, False), (3, True), (7, False))]
    for k in range(0, 6, 3):
        for other in outs[k + 1:k + 3]:
            assert np.array_equal(outs[k][0], other[0])
            assert all(np.array_equal(a, b) for a, b in zip(outs[k][1], other[1]))


def test_empty_shapes_and_rejected_layouts():
    hyper = np.array([1.0, 0.0])
    empty_rows = np.zeros((0, 5), np.float32)
    no_classes = np.zeros((3, 0), np.float32)
    stats0, stats3 = np.empty((0, STATS), np.float32), np.empty((3, STATS), np.float32)
    types = ["float32", "float32", "float64", "float32"]
    calls = [dict(symbol="DistillFwd", dtype="float32", dtypes=types, spec=3,
                  arrays=[(empty_rows, 0), (empty_rows, 0), (hyper, 0), (stats0, 0)]),
             dict(symbol="DistillFwd", dtype="float32", dtypes=types, spec=3,
                  arrays=[(no_classes, 0), (no_classes, 0), (hyper, 0), (stats3, 0)]),
             dict(symbol="DistillFwd", dtype="float32", dtypes=types, spec=3,  # shapes differ
                  arrays=[(np.zeros((3, 4), np.float32), 0), (np.zeros((3, 5), np.float32), 0), (hyper, 0),
                          (stats3, 0)]),
             dict(symbol="DistillFwd", dtype="float32", dtypes=["float32", "float16", "float64", "float32"],
                  spec=3, arrays=[(np.zeros((3, 4), np.float32), 0), (np.zeros((3, 4), np.float16), 0),
                                  (hyper, 0), (stats3, 0)])]
    out = _sim.run_calls(calls)
    assert [r[0] for r in out] == [0, 0, 1, 1]
    assert (out[1][1][0] == 0).all()  # no classes: every divergence is 0


# Deliberate bugs in a copy of distill_cuda.cu, each caught by the stand-in through the ordinary ABI calls.
MUTATIONS = {
    "tail_off_by_one": ("for (int64_t k = done + lane; k < vocab; k += R) {\n    f(",
                        "for (int64_t k = done + lane; k <= vocab; k += R) {\n    f(", "out-of-bounds"),
    "missing_syncthreads": ("if (lane == 0) part[warp] = v;\n    __syncthreads();",
                            "if (lane == 0) part[warp] = v;", "shared memory"),
    "shuffle_in_lane_branch": ("for (int o = 16; o > 0; o >>= 1) merge(&v, shfl(v, o));\n  if (R > 32) {",
                               "if ((threadIdx.x & 31) < 16) for (int o = 16; o > 0; o >>= 1) merge(&v, shfl(v, o));\n"
                               "  if (R > 32) {", "divergence"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutated_kernel_is_caught(name, tmp_path):
    old, new, message = MUTATIONS[name]
    with open(os.path.join(_sim.SRC, "gpu", "distill_cuda.cu"), encoding="utf-8") as f:
        text = f.read()
    assert text.count(old) == 1, f"mutation {name} no longer matches distill_cuda.cu"
    mutated = tmp_path / "distill_cuda.cu"
    mutated.write_text(text.replace(old, new), encoding="utf-8")
    lib = _sim.build([str(mutated)])
    s, t, g = logits((2, 2600), 5)
    with pytest.raises(_sim.SimError, match=message):
        run_case(rounded(s, "float32"), rounded(t, "float32"), 1.0, 0.5, "float32", g, 1, lib_path=lib)
