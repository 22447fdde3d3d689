"""Prints the tables and the polynomial of the lean float32 log (custom_ops/cpu/kldiv_logf_table.h, used by log_normal in
kldiv_simd_avx2.h and kldiv_simd_avx512.h).

x = 2^e * z with z in [0.71875, 1.4375): z's bits are x's minus OFF's, wrapped into one binade, and the top 3
bits of that difference pick one of 8 intervals k of z. An arithmetic shift of the difference by 20 gives
n = 8e + k at once: the kernel takes k from its low 3 bits (vpermps) and e*ln2 as n * ln2/8, so one shift serves
both. Interval k has a float inv_c[k] ~ 1/c (c near its centre), and log_t[k] = log c - k * L8 rounded to float
(L8 = ln2/8 in float32); then r = z * inv_c - 1 is small (|r| <= 1/16) and
log x = (n * L8 + log_t[k]) + log1p(r), log1p(r) = r + r^2 * Q(r) with Q of degree 3.

* The interval holding 1 gets inv_c = 1 and log_t = -k L8 exactly: near 1 the first term is exactly 0 and the
  result is r + r^2 Q(r) with r = z - 1 exact.
* OFF puts that interval's upper end at 1.0625, so that in the intervals beside it |log x| is never much smaller
  than |r|: r carries a rounding error of half its own ulp, which would otherwise be amplified (with the
  interval split at 1.0234 the maximum error was 2.35 ulp instead of 1.54).
* Each other inv_c is the float, among a few thousand near 1/centre, for which both -log(inv_c) (what
  n * L8 + log_t[k] rounds to when e = 0) and log_t[k] are closest to floats, so the table adds almost no
  rounding error of its own.
Q is fitted by iteratively reweighted least squares towards the minimax of log1p's relative error over the r of
every interval, then rounded to float32; the printed error is of the rounded coefficients (the kernel's own
roundings come on top; tests/test_aot_kernel.py and the exhaustive sweep in docs/cpu_aot.md measure them).
Run: python tools/fit_logf.py
"""
import numpy as np

OFF = 0x3f380000  # bits of 0.71875


def _float(bits):
    return float(np.array([bits], np.uint32).view(np.float32)[0])


L8 = float(np.float32(np.log(2.0) / 8))  # ln2/8 in float32, as the kernel multiplies n by it


def _ulps_off(v):
    """How far float64 values lie from the nearest float32, in float32 ulps."""
    rounded = v.astype(np.float32)
    return np.abs(rounded - v) / np.spacing(np.abs(rounded)).astype(np.float64)


def tables():
    inv_c, log_t, r_lo, r_hi = [], [], [], []
    for k in range(8):
        lo, hi = _float(OFF + (k << 20)), _float(OFF + ((k + 1) << 20))
        if lo <= 1.0 < hi:
            ic = np.float32(1.0)
        else:
            centre = np.array([2.0 / (lo + hi)], np.float32).view(np.uint32)[0]
            cands = (centre + np.arange(-3000, 3001)).astype(np.uint32).view(np.float32)
            log_c = -np.log(cands.astype(np.float64))
            ic = cands[np.argmin(np.maximum(_ulps_off(log_c), _ulps_off(log_c - k * L8)))]
        inv_c.append(np.float32(ic))
        log_t.append(np.float32(-np.log(np.float64(ic)) - k * L8))
        r_lo.append(lo * np.float64(ic) - 1)
        r_hi.append(hi * np.float64(ic) - 1)
    return inv_c, log_t, min(r_lo), max(r_hi)


def fit(a, b, degree=3, iterations=40):
    r = np.linspace(a, b, 400001)
    r = r[r != 0]
    target = (np.log1p(r) - r) / r**2
    vander = np.vander(r, degree + 1, increasing=True)
    weight = np.abs(r)  # an error e in Q is an error r^2 e in log1p(r) ~ r: relative error |r| e
    coef = np.linalg.lstsq(vander * weight[:, None], target * weight, rcond=None)[0]
    for _ in range(iterations):
        residual = np.abs((vander @ coef - target) * weight)
        weight = weight * (1 + 20 * residual / residual.max())
        coef = np.linalg.lstsq(vander * weight[:, None], target * weight, rcond=None)[0]
    c32 = coef.astype(np.float32)
    approx = r + r**2 * (vander @ c32.astype(np.float64))
    return c32, np.max(np.abs(approx - np.log1p(r)) / np.abs(np.log1p(r)))


if __name__ == "__main__":
    inv_c, log_t, a, b = tables()
    print("inv_c =", ", ".join(f"{float(v)!r}f" for v in inv_c))
    print("log_t =", ", ".join(f"{float(v)!r}f" for v in log_t))
    print(f"L8 = {L8!r}f")
    c32, err = fit(a, b)
    for i, c in enumerate(c32):
        print(f"c{i} = {float(c)!r}f")
    print(f"r in [{a:.4f}, {b:.4f}]; max relative error of log1p there: {err:.3g}")
