"""Tolerances and comparisons shared by the GPU tests (real device and CUDA-on-CPU stand-in)."""
import numpy as np

from _modules import reference as ref

# Relative tolerance per dtype against the float64 reference of the rounded inputs (halves: computed in
# float, rounded once on output; one more rounding where a broadcast gradient is summed back).
TOL = {"f64": 1e-12, "f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
# One unit in the last place of the dtype's subnormals: a correctly rounded tiny result (a 'mean' gradient
# of a 1000-element half tensor) is that far from the exact value whatever the relative tolerance.
ATOL = {"f64": 2.0 ** -1074, "f32": 2.0 ** -149, "f16": 2.0 ** -24, "bf16": 2.0 ** -133}


def close(actual, expected, tol, mag=None, what="", atol=1e-300):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), f"{what}: NaN positions differ"
    inf = np.isinf(expected)
    assert np.array_equal(actual[inf], expected[inf]), f"{what}: infinities differ"
    fin = ~(np.isnan(expected) | inf)
    scale = np.abs(expected) if mag is None else np.abs(expected) + np.abs(mag)
    err = np.abs(actual - expected)
    bad = fin & ~(err <= tol * scale + atol)
    assert not bad.any(), f"{what}: {bad.sum()} elements off, max err {err[fin].max():.3g}"


def term_magnitudes(xv, tv, log_target):
    """Pointwise magnitudes of the terms the kernels round: loss = t * (log t - x) and d/dt = log t - x + 1
    cancel when log t ~ x, so their error scales with |t| (|log t| + |x|), not with the result."""
    with np.errstate(all="ignore"):
        if log_target:
            p, lt = np.exp(tv), np.abs(tv)
        else:
            p, lt = np.abs(tv), np.abs(np.log(np.where(tv > 0, tv, 1.0)))
        loss = p * (lt + np.abs(xv))
        dt = (p if log_target else 1.0) * (lt + np.abs(xv) + 1.0)
        dx = p
    fix = lambda a: np.where(np.isfinite(a), a, 0.0)
    return fix(loss), fix(dx), fix(np.broadcast_to(dt, np.broadcast_shapes(xv.shape, tv.shape)))


def sample(rng, shape, log_target, zero_mass=0.1):
    x = np.log(rng.uniform(0.01, 1.0, size=shape))
    t = rng.uniform(0.0, 1.0, size=shape)
    if zero_mass:
        t = np.where(rng.uniform(size=shape) < zero_mass, 0.0, t)
    if log_target:
        with np.errstate(divide="ignore"):
            t = np.log(t)
    return x, t


def distill_magnitudes(s, t, temperature):
    """Sizes of the terms a distillation row's loss and gradients sum (per row, per class): rounding errors
    scale with them, not with the result, which cancels."""
    ls = ref.log_softmax(np.asarray(s, np.float64) / temperature)
    lt = ref.log_softmax(np.asarray(t, np.float64) / temperature)
    ps, pt = np.exp(ls), np.exp(lt)
    fin = lambda a: np.where(np.isfinite(a), np.abs(a), 0.0)  # noqa: E731
    size = 1.0 + fin(ls) + fin(lt)
    loss = temperature ** 2 * np.sum((ps + pt) * size, axis=-1)
    grad = temperature * (ps + pt) * (size + np.sum((ps + pt) * size, axis=-1, keepdims=True))
    return loss, grad
