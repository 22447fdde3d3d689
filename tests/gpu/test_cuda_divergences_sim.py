"""The distillation loss menu in custom_ops/gpu/distill_cuda.cu (divergences 'tvd', 'skew_kl', 'skew_rkl',
'symmetric_kl' and the 'kl' family, with the logits' transform: soft cap and logit scale) on the CUDA-on-CPU
stand-in, through the distillation ABI with the float64 [6] hyper input, against the float64 reference
(ms_kldiv.reference.distillation_pointwise for the loss; for the gradients its closed forms below, themselves checked
by central differences of it) and against libkldiv_cpu.so's kernels for the same calls. Both launch shapes (a warp
per row up to 2048 classes, a block per row beyond), 128-bit and scalar loads, every dtype, -inf vocabulary padding
and ignored rows (exact zeros). Every case of a test runs in one batch of calls (one child process for the forwards,
one for the backwards)."""
import os

import numpy as np
import pytest

from _modules import reference as ref

import _sim
from _gpu_checks import ATOL, TOL, close
from test_cuda_distill_sim import DTYPES, STATS, abi_calls, rounded

REASON = _sim.compiler_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"stand-in needs g++: {REASON}")

CODES = {"kl": 0, "tvd": 1, "skew_kl": 2, "skew_rkl": 3, "symmetric_kl": 4}  # ms_kldiv._distill_math.DIVERGENCES

# (divergence, beta, alpha, softcap, logit_scale)
VARIANTS = {
    "tvd": ("tvd", 0.0, 0.0, 0.0, 1.0),
    "skew_kl-0.1": ("skew_kl", 0.0, 0.1, 0.0, 1.0),
    "skew_kl-0.6": ("skew_kl", 0.0, 0.6, 0.0, 1.0),
    "skew_rkl-0.3": ("skew_rkl", 0.0, 0.3, 0.0, 1.0),
    "symmetric_kl-0.3": ("symmetric_kl", 0.0, 0.3, 0.0, 1.0),
    "fkl-cap3-scale0.5": ("kl", 0.0, 0.0, 3.0, 0.5),
    "rkl-scale2": ("kl", 1.0, 0.0, 0.0, 2.0),
    "jsd0.5-cap3-scale0.5": ("kl", 0.5, 0.0, 3.0, 0.5),
    "jsd0.1-scale2": ("kl", 0.1, 0.0, 0.0, 2.0),
    "tvd-cap3-scale0.5": ("tvd", 0.0, 0.0, 3.0, 0.5),
    "skew_rkl-0.6-cap3-scale0.5": ("skew_rkl", 0.0, 0.6, 3.0, 0.5),
    "symmetric_kl-0.3-scale2": ("symmetric_kl", 0.0, 0.3, 0.0, 2.0),
}

# (shape, element offset): warp per row with a scalar tail, warp per row with 128-bit loads, block per row with
# 128-bit loads, block per row misaligned (scalar loads)
# Warp and block rows, packets (offset 0) and single classes (offset 1); 9,000 classes give each thread of a block
# several of the forward's float partial sums (distill_cuda.cu kFlushEvery).
SHAPES = [((5, 37), 0), ((2, 3, 64), 0), ((3, 2600), 0), ((2, 2600), 1), ((2, 9000), 0), ((2, 9001), 1)]


def hyper_of(temperature, variant):
    div, beta, alpha, cap, scale = variant
    return np.array([temperature, beta, CODES[div], alpha, cap, scale], np.float64)


def ref_kwargs(variant):
    div, _, alpha, cap, scale = variant
    return dict(divergence=div, alpha=alpha, softcap=cap, logit_scale=scale)


def ref_loss(s, t, temperature, variant):
    return ref.distillation_pointwise(s, t, temperature, variant[1], **ref_kwargs(variant)).sum(axis=-1)


def slope(z, cap, scale):
    z = np.asarray(z, np.float64)
    if cap <= 0:
        return np.full(z.shape, scale)
    th = np.tanh(z * scale / cap)
    return scale * (1.0 - th * th)


def ref_grads(s, t, temperature, variant, dloss):
    """(d_student, d_teacher) of sum_rows dloss[row] * (row loss), float64, in closed form: with a = P_s dD/dP_s and
    b = P_t dD/dP_t (distill_math.h's class_terms), d/ds = T (a - P_s sum(a)) * slope(s), likewise for t."""
    div, beta, alpha, cap, scale = variant
    ls = ref.log_softmax(ref.transformed(s, cap, scale) / temperature)
    lt = ref.log_softmax(ref.transformed(t, cap, scale) / temperature)
    ps, pt = np.exp(ls), np.exp(lt)
    with np.errstate(all="ignore"):
        def kl(p, lp, lq):  # p (log p - log q), 0 where p is 0
            return np.where(p > 0, p * (lp - lq), 0.0)

        def log_mix(w_p, lp, lq):  # log(w_p p + (1 - w_p) q), w_p in (0, 1)
            return np.logaddexp(lp + np.log(w_p), lq + np.log1p(-w_p))

        if div == "kl" and beta == 0:
            a, b = -pt, kl(pt, lt, ls)
        elif div == "kl" and beta == 1:
            a, b = kl(ps, ls, lt), -ps
        elif div == "kl":
            lm = log_mix(beta, lt, ls)
            a, b = (1 - beta) * kl(ps, ls, lm), beta * kl(pt, lt, lm)
        elif div == "tvd":
            sg = np.sign(ps - pt)
            a, b = 0.5 * ps * sg, -0.5 * pt * sg
        elif div in ("skew_kl", "skew_rkl"):  # KL(P || alpha P + (1 - alpha) Q)
            (p, lp, q, lq) = (pt, lt, ps, ls) if div == "skew_kl" else (ps, ls, pt, lt)
            lm = log_mix(alpha, lp, lq)
            da_p = kl(p, lp, lm) - alpha * np.where(p > 0, np.exp(2 * lp - lm), 0.0)
            da_q = -(1 - alpha) * np.where(p > 0, np.exp(lp + lq - lm), 0.0)
            a, b = (da_q, da_p) if div == "skew_kl" else (da_p, da_q)
        else:  # symmetric_kl
            fwd, rev = kl(pt, lt, ls), kl(ps, ls, lt)
            a, b = -alpha * pt + (1 - alpha) * rev, alpha * fwd - (1 - alpha) * ps
        g = temperature * np.asarray(dloss, np.float64)[..., None]
        ds = g * (a - ps * a.sum(axis=-1, keepdims=True)) * slope(s, cap, scale)
        dt = g * (b - pt * b.sum(axis=-1, keepdims=True)) * slope(t, cap, scale)
    return np.where(ps > 0, ds, 0.0) + 0.0, np.where(pt > 0, dt, 0.0) + 0.0


def magnitudes(s, t, temperature, variant):
    """Sizes of the terms each result sums (of the transformed logits; the gradients times the slope)."""
    _, _, alpha, cap, scale = variant
    ls = ref.log_softmax(ref.transformed(s, cap, scale) / temperature)
    lt = ref.log_softmax(ref.transformed(t, cap, scale) / temperature)
    ps, pt = np.exp(ls), np.exp(lt)
    fin = lambda a: np.where(np.isfinite(a), np.abs(a), 0.0)  # noqa: E731
    size = 1.0 + fin(ls) + fin(lt)
    weight = (ps + pt) * size
    loss = temperature ** 2 * np.sum(weight, axis=-1)
    grad = temperature * (ps + pt) * (size + np.sum(weight, axis=-1, keepdims=True))
    if variant[0] == "tvd":  # the sign of P_s - P_t at near ties: either sign is within rounding of the inputs
        tie = (np.abs(ps - pt) <= 1e-4 * (ps + pt)).astype(np.float64)
        grad = grad + temperature * (ps + pt) * (tie + np.sum(tie * (ps + pt), axis=-1, keepdims=True))
    return loss, grad * np.abs(slope(s, cap, scale)), grad * np.abs(slope(t, cap, scale))


def case_inputs(shape, seed, dtype):
    """Rounded logits with -inf vocabulary padding (the last 3 classes and every 11th, in both models) and the
    incoming row gradients, the first row ignored (0)."""
    rng = np.random.default_rng(seed)
    s, t = rng.normal(size=shape) * 3.0, rng.normal(size=shape) * 3.0
    s[..., -3:] = t[..., -3:] = -np.inf
    s[..., 5::11] = t[..., 5::11] = -np.inf
    g = rng.normal(size=shape[:-1])
    g.reshape(-1)[0] = 0.0
    return rounded(s, dtype), rounded(t, dtype), g


def run_batch(cases, lib_path=None, **sim):
    """cases: [(s, t, hyper, dloss, dtype, offset)] -> [(stats, (ds, dt), ds alone, dt alone)], every forward in one
    child process, every backward (three entry points each, on the forward's own statistics) in another."""
    fwd_calls = []
    for s, t, hyper, g, dtype, off in cases:
        fwd_calls += abi_calls(_sim.encode(s, dtype), _sim.encode(t, dtype), hyper, None, g, dtype, off, **sim)
    fwd = _sim.run_calls(fwd_calls, lib_path)
    assert all(rc == 0 and live == 0 for rc, _, live in fwd), [(rc, live) for rc, _, live in fwd]
    bwd_calls = []
    for (s, t, hyper, g, dtype, off), (_, (stats,), _) in zip(cases, fwd):
        bwd_calls += abi_calls(_sim.encode(s, dtype), _sim.encode(t, dtype), hyper, stats,
                               np.asarray(g, np.float32), dtype, off, **sim)
    bwd = _sim.run_calls(bwd_calls, lib_path)
    assert all(rc == 0 and live == 0 for rc, _, live in bwd), [(rc, live) for rc, _, live in bwd]
    out = []
    for k, (s, t, hyper, g, dtype, off) in enumerate(cases):
        (_, (ds, dt), _), (_, (ds1,), _), (_, (dt1,), _) = bwd[3 * k:3 * k + 3]
        dec = lambda a: _sim.decode(a, dtype)  # noqa: E731
        out.append((fwd[k][1][0], (dec(ds), dec(dt)), dec(ds1), dec(dt1)))
    return out


def test_reference_gradients_match_central_differences():
    """The closed forms the kernels are checked against, against the definition (padded classes included)."""
    rng = np.random.default_rng(0)
    s, t, g = rng.normal(size=(3, 6)) * 2.0, rng.normal(size=(3, 6)) * 2.0, rng.normal(size=3)
    s[:, 2] = t[:, 2] = -np.inf
    for name, variant in VARIANTS.items():
        for temperature in (0.7, 2.0):
            f = lambda a, b: (ref_loss(a, b, temperature, variant) * g).sum()  # noqa: E731
            analytic = ref_grads(s, t, temperature, variant, g)
            for which in (0, 1):
                base = (s, t)[which]
                num = np.zeros_like(base)
                for idx in np.ndindex(base.shape):
                    if not np.isfinite(base[idx]):
                        continue
                    up, dn = base.copy(), base.copy()
                    up[idx] += 1e-6
                    dn[idx] -= 1e-6
                    num[idx] = (f(*((up, t) if which == 0 else (s, up)))
                                - f(*((dn, t) if which == 0 else (s, dn)))) / 2e-6
                np.testing.assert_allclose(analytic[which], num, rtol=1e-6, atol=1e-7,
                                           err_msg=f"{name} T={temperature} {'st'[which]}")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_float64_reference(name):
    """Every dtype and launch shape of one variant: row loss, both gradients (and the single-gradient entry points'
    identical values), exact +0 for the ignored row, the padded classes' gradients exactly 0 (without a soft cap:
    with it a -inf logit is the finite -cap)."""
    variant = VARIANTS[name]
    temperature = 2.0 if variant[0] in ("kl", "skew_kl") else 0.7
    cases, inputs = [], []
    for dtype_id, dtype in DTYPES.items():
        for k, (shape, offset) in enumerate(SHAPES):
            s, t, g = case_inputs(shape, hash((name, k)) % 10000, dtype)
            cases.append((s, t, hyper_of(temperature, variant), g, dtype, offset))
            inputs.append((dtype_id, s, t, g))
    for (dtype_id, s, t, g), (stats, (ds, dt), ds1, dt1) in zip(inputs, run_batch(cases)):
        what = f"{name} {dtype_id} {s.shape}"
        tol = TOL[dtype_id]
        atol = max(ATOL[dtype_id], 2.0 ** -126)
        loss_mag, s_mag, t_mag = magnitudes(s, t, temperature, variant)
        close(stats[..., 0], ref_loss(s, t, temperature, variant), max(tol, 1e-5), loss_mag, f"{what} row loss",
              1e-30)
        eds, edt = ref_grads(s, t, temperature, variant, g)
        gm = np.abs(g)[..., None]
        close(ds, eds, max(tol, 2e-5), s_mag * gm, f"{what} d_student", atol)
        close(dt, edt, max(tol, 2e-5), t_mag * gm, f"{what} d_teacher", atol)
        assert np.array_equal(ds1, ds) and np.array_equal(dt1, dt), what
        first = (0,) * (s.ndim - 1)
        assert not np.signbit(ds[first]).any() and not ds[first].any() and not dt[first].any(), what
        if variant[3] == 0:
            pad = np.isinf(s)
            assert (ds[pad] == 0).all() and (dt[pad] == 0).all(), what


@pytest.mark.parametrize("divergence", ["skew_kl", "skew_rkl"])
def test_skew_with_alpha_zero(divergence):
    """alpha = 0 (the mixture is the other model alone): a class only the weighted model keeps gives +inf, as in
    the reference; where the other model's log-probability is -150 (its probability underflows float32) the row loss
    and both gradients are the reference's."""
    variant = (divergence, 0.0, 0.0, 0.0, 1.0)
    kept = np.array([[0.0, 1.0, 2.0, 3.0] * 10, [0.5, 0.1, -1.0, 2.0] * 10])
    other = kept.copy()
    other[0, 3] = -np.inf
    other[1, 3] = -300.0
    s, t = (other, kept) if divergence == "skew_kl" else (kept, other)
    g = np.array([1.0, 0.8])
    ((stats, (ds, dt), _, _),) = run_batch([(s, t, hyper_of(2.0, variant), g, DTYPES["f32"], 0)])
    expected = ref_loss(s, t, 2.0, variant)
    assert stats[0, 0] == np.inf == expected[0]
    np.testing.assert_allclose(stats[1, 0], expected[1], rtol=2e-6)
    eds, edt = ref_grads(s[1:], t[1:], 2.0, variant, g[1:])
    np.testing.assert_allclose(ds[1:], eds, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(dt[1:], edt, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("dtype_id", ["f32", "bf16"])
def test_matches_cpu_library(dtype_id):
    """The stand-in's statistics and gradients and libkldiv_cpu.so's for the same ABI calls, every variant, both
    launch shapes: maxima equal (within one float rounding of the transform, whose tanhf the CPU may vectorize),
    the rest within the dtype's tolerance (their summation orders differ)."""
    from _modules import build as _build
    dtype = DTYPES[dtype_id]
    cases, inputs = [], []
    for name, variant in VARIANTS.items():
        for k, shape in enumerate([(6, 40), (3, 2600)]):
            s, t, g = case_inputs(shape, 100 + k, dtype)
            cases.append((s, t, hyper_of(1.5, variant), g, dtype, 0))
            inputs.append((name, variant, s, t, g))
    sim = run_batch(cases)
    cpu = run_batch(cases, lib_path=_build.ensure_library("CPU"))
    for (name, variant, s, t, g), a, b in zip(inputs, sim, cpu):
        what = f"{name} {s.shape}"
        if variant[3] == 0 and variant[4] in (1.0, 2.0):  # exact transforms: the same maxima bit for bit
            np.testing.assert_array_equal(a[0][..., 5:7], b[0][..., 5:7], err_msg=what)
        else:
            np.testing.assert_allclose(a[0][..., 5:7], b[0][..., 5:7], rtol=3e-7, atol=0, err_msg=what)
        np.testing.assert_allclose(a[0][..., :5], b[0][..., :5], rtol=2e-5, atol=2e-6, err_msg=what)
        _, s_mag, t_mag = magnitudes(s, t, 1.5, variant)
        gm = np.abs(g)[..., None]
        tol = 2 * max(TOL[dtype_id], 2e-5)
        close(a[1][0], b[1][0], tol, s_mag * gm, f"{what} d_student", 2 * ATOL[dtype_id])
        close(a[1][1], b[1][1], tol, t_mag * gm, f"{what} d_teacher", 2 * ATOL[dtype_id])


@pytest.mark.slow
def test_per_class_double_sums_build_agrees():
    """distill_cuda.cu built with DISTILL_CUDA_FLUSH_EVERY=1 (each term added to the double sums at once: the
    kernel the H200 figures in docs/gpu.md were measured on, kept to compare the two on a device) gives the default
    build's statistics and gradients within float32 rounding, every variant, packets and single classes."""
    per_class = _sim.build([os.path.join(_sim.SRC, "gpu", "distill_cuda.cu")], ["-DDISTILL_CUDA_FLUSH_EVERY=1"])
    cases = []
    for k, (name, variant) in enumerate(VARIANTS.items()):
        for shape, offset in [((3, 40), 0), ((2, 9000), 0), ((2, 9001), 1)]:
            s, t, g = case_inputs(shape, 200 + k, "float32")
            cases.append((s, t, hyper_of(1.5, variant), g, "float32", offset))
    for case, a, b in zip(cases, run_batch(cases), run_batch(cases, lib_path=per_class)):
        np.testing.assert_array_equal(a[0][..., 5:7], b[0][..., 5:7])  # the maxima take no sums
        np.testing.assert_allclose(a[0][..., :5], b[0][..., :5], rtol=1e-5, atol=1e-6)
        for x, y in zip(a[1], b[1]):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_deterministic_across_grids_and_schedules():
    """Bitwise the same statistics and gradients whatever the SM count and the order blocks and warps run in, for
    the two-pass kinds and the transform (block per row and warp per row)."""
    variants = [VARIANTS["tvd-cap3-scale0.5"], VARIANTS["skew_kl-0.6"], VARIANTS["fkl-cap3-scale0.5"]]
    for shape in [(9, 2600), (20, 100)]:
        s, t, g = case_inputs(shape, 11, "float32")
        cases = [(s, t, hyper_of(1.0, v), g, "float32", 0) for v in variants]
        outs = [run_batch(cases, sms=sms, reverse=rev) for sms, rev in ((1, False), (3, True), (7, False))]
        for other in outs[1:]:
            for a, b in zip(outs[0], other):
                assert np.array_equal(a[0], b[0])
                assert all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))


def test_old_hyper_layout_and_bad_lengths():
    """hyper float64 [2] = (temperature, beta) is the 'kl' family without a transform, bitwise as [6] with the
    neutral (code 0, alpha 0, soft cap 0, logit scale 1); another length is refused (return value 1)."""
    s, t, g = case_inputs((4, 2600), 3, "float32")
    old = run_batch([(s, t, np.array([1.5, beta]), g, "float32", 0) for beta in (0.0, 0.5)])
    new = run_batch([(s, t, np.array([1.5, beta, 0.0, 0.0, 0.0, 1.0]), g, "float32", 0) for beta in (0.0, 0.5)])
    for a, b in zip(old, new):
        assert np.array_equal(a[0], b[0]) and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
    es = _sim.encode(s, "float32")
    calls = abi_calls(es, es, np.array([1.5, 0.0, 0.0]), None, g, "float32", 0)
    calls += abi_calls(es, es, np.array([1.5, 0.0, 0.0]), np.zeros(s.shape[:-1] + (STATS,), np.float32),
                       np.asarray(g, np.float32), "float32", 0)
    assert [r[0] for r in _sim.run_calls(calls)] == [1, 1, 1, 1]
