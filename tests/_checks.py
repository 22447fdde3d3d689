"""Data and checking helpers of the test suite: Tensors whose exact values are known, the float64 reference
with the error scale of each value, and the comparisons. See conftest.py's docstring for the whole API."""
import re
from collections import namedtuple

import numpy as np

import mindspore as ms
from mindspore import nn, ops

from ms_kldiv import reference as ref

DTYPES = (ms.float64, ms.float32, ms.float16, ms.bfloat16)
DTYPE_IDS = ("f64", "f32", "f16", "bf16")
# Relative error allowed, relative to |expected| + the magnitude of the summed terms. Half types are computed
# in float32 and rounded once on output (and once more where a broadcast gradient is summed back).
TOL = {ms.float64: 1e-12, ms.float32: 1e-5, ms.float16: 2e-3, ms.bfloat16: 1.6e-2}
# A result in a dtype's subnormal range has a fixed absolute spacing (its smallest subnormal): no relative
# tolerance applies there.
SUBNORMAL_SPACING = {ms.float64: 2.0**-1074, ms.float32: 2.0**-149, ms.float16: 2.0**-24, ms.bfloat16: 2.0**-133}


def distill_abi_kernels(text):
    """The kernels distill_abi.h / sparse_abi.h / head_abi.h list in their tables (their DECLARE macros make the
    exports, each with InferShape)."""
    return set(re.findall(r"^//\s+((?:Distill|Sparse|Head)\w+)\s+nparam", text, flags=re.M))


def cpu_isa():
    from ms_kldiv import _build
    return _build.library_isa(_build.ensure_library("CPU"))


def dense(rng, n_in, n_out, std=0.3):
    """An ``nn.Dense`` with weights drawn from ``rng`` (normal, ``std``) and zero bias: MindSpore's default init is
    unseeded, and tests that train from it pass or fail with the draw."""
    layer = nn.Dense(n_in, n_out)
    layer.weight.set_data(ms.Tensor(rng.normal(0, std, (n_out, n_in)), ms.float32))
    layer.bias.set_data(ms.Tensor(np.zeros(n_out), ms.float32))
    return layer


def to_numpy(tensor):
    if tensor.dtype == ms.bfloat16:
        tensor = ops.cast(tensor, ms.float32)
    return np.asarray(tensor.asnumpy(), dtype=np.float64)


def make(a, dtype):
    """A Tensor of ``dtype`` holding ``a``, and the float64 values it actually holds after rounding."""
    a = np.asarray(a, dtype=np.float64)
    if dtype == ms.bfloat16:
        tensor = ms.Tensor(a.astype(np.float32), ms.bfloat16)
    else:
        tensor = ms.Tensor(a.astype(ms.dtype_to_nptype(dtype)), dtype)
    return tensor, to_numpy(tensor)


Expected = namedtuple("Expected", "out dx dt out_mag dx_mag dt_mag")


def reference(x, t, reduction, log_target, w=None):
    """Float64 reference of value and weighted gradients, with the error scales of each (see module doc)."""
    x = np.asarray(x, np.float64)
    t = np.asarray(t, np.float64)
    out = ref.kl_div(x, t, reduction, log_target)
    dx, dt = ref.kl_div_grads(x, t, reduction, log_target, dout=w)
    loss_mag, pdx_mag, pdt_mag = _term_magnitudes(x, t, log_target)
    s = abs(ref.reduction_scale(reduction, x.shape, loss_mag.shape))
    g = np.ones(loss_mag.shape) if w is None else np.abs(np.broadcast_to(np.asarray(w, np.float64), loss_mag.shape))
    with np.errstate(all="ignore"):
        out_mag = loss_mag if reduction == "none" else np.asarray(loss_mag.sum() * s)
        dx_mag = ref.sum_to(pdx_mag * g * s, x.shape)
        dt_mag = ref.sum_to(pdt_mag * g * s, t.shape)
    return Expected(out, dx, dt, out_mag, dx_mag, dt_mag)


def _term_magnitudes(x, t, log_target):
    """Pointwise sums of the absolute values of what each formula adds up (t*log t and t*x, ...): the scale
    of the rounding error, which can exceed the result where log t is close to x."""
    mass, xs, ts = ref.safe_operands(x, t, log_target)
    xs = np.abs(xs)
    with np.errstate(all="ignore"):
        if log_target:
            e = np.exp(ts)
            loss, dx, dt = e * (np.abs(ts) + xs), e, e * (np.abs(ts) + xs + 1)
        else:
            # + 1: vectorized float32 log kernels are accurate to ~eps absolute (not relative) near t = 1.
            loss, dx, dt = np.abs(ts) * (np.abs(np.log(ts)) + xs + 1), np.abs(ts), np.abs(np.log(ts)) + 1 + xs
    return tuple(np.where(mass & np.isfinite(m), m, 0.0) for m in (loss, dx, dt))


def assert_close(actual, expected, dtype, mag=None, what=""):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    if not np.array_equal(nan_a, nan_e):
        i = tuple(np.argwhere(nan_a != nan_e)[0])
        raise AssertionError(f"{what}: NaN mismatch at {np.argwhere(nan_a != nan_e)[:5].tolist()}; "
                             f"first: got {actual[i]!r}, expected {expected[i]!r}")
    inf_e = np.isinf(expected)
    assert np.array_equal(actual[inf_e], expected[inf_e]), f"{what}: infinities differ"
    fin = ~(nan_e | inf_e)
    assert np.all(np.isfinite(actual[fin])), f"{what}: non-finite where the reference is finite"
    scale = np.abs(expected) if mag is None else np.abs(expected) + np.abs(np.broadcast_to(mag, expected.shape))
    tol = TOL[dtype] * scale + 4 * SUBNORMAL_SPACING[dtype]
    err = np.abs(actual - expected)
    bad = fin & ~(err <= tol)
    if np.any(bad):
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what} ({dtype}): {int(bad.sum())} of {bad.size} elements off; first at {i}: "
                             f"got {actual[i]!r}, expected {expected[i]!r}, tol {tol[i]:.3g}")


def check_outcomes(results, x, t, log_target, w_none, w_red, dtype, grads=True, x_dtype=None, t_dtype=None,
                   what=""):
    """Check ``run``'s result; ``x, t, w_*`` are the float64 values the Tensors hold, ``dtype`` the promoted
    dtype, ``x_dtype``/``t_dtype`` the operands' own dtypes (default: ``dtype``)."""
    x = np.asarray(x, np.float64)
    t = np.asarray(t, np.float64)
    x_dtype = x_dtype or dtype
    t_dtype = t_dtype or dtype
    bshape = np.broadcast_shapes(x.shape, t.shape)
    for reduction, res in results.items():
        w = (np.ones(bshape) if w_none is None else w_none) if reduction == "none" else \
            (1.0 if w_red is None else w_red)
        exp = reference(x, t, reduction, log_target, w)
        tag = f"{what} reduction={reduction!r} log_target={log_target}"
        assert res.out.dtype == dtype, f"{tag}: output dtype {res.out.dtype} != {dtype}"
        assert tuple(res.out.shape) == (bshape if reduction == "none" else ()), \
            f"{tag}: output shape {res.out.shape}"
        assert_close(to_numpy(res.out), exp.out, dtype, exp.out_mag, f"{tag} value")
        if not grads:
            continue
        for name, g, e, m, shape, dt in (("d/dinput", res.dx, exp.dx, exp.dx_mag, x.shape, x_dtype),
                                         ("d/dtarget", res.dt, exp.dt, exp.dt_mag, t.shape, t_dtype)):
            assert tuple(g.shape) == shape, f"{tag} {name}: shape {g.shape} != operand's {shape}"
            assert g.dtype == dt, f"{tag} {name}: dtype {g.dtype} != operand's {dt}"
            # Summing a broadcast gradient back in the operand's half dtype adds one rounding per term.
            assert_close(to_numpy(g), e, dt, m, f"{tag} {name}")


def central_differences(f, a, h=1e-6):
    """d f / d a by central differences on every finite element of the float64 array ``a`` (small inputs only)."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        if not np.isfinite(a[i]):
            continue
        ap, am = a.copy(), a.copy()
        ap[i] += h
        am[i] -= h
        g[i] = (f(ap) - f(am)) / (2 * h)
    return g
