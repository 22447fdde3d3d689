"""Prints the polynomial of the lean float32 log in custom_ops/cpu/kldiv_simd_avx2.h.

log x = e*ln2 + log1p(f) with f = m - 1 in [-1/3, 1/3) (m the significand rescaled into [2/3, 4/3)), and
log1p(f) = f + f^2 * Q(f). Q (degree 7) is fitted by iteratively reweighted least squares towards the
minimax of the relative error of log1p, then rounded to float32; the printed error is of the rounded
coefficients. Run: python custom_ops/cpu/tools/fit_logf.py
"""
import numpy as np


def fit(degree=7, iterations=30):
    f = np.linspace(2 / 3 - 1, 4 / 3 - 1, 400001)
    f = f[f != 0]
    target = (np.log1p(f) - f) / f**2
    vander = np.vander(f, degree + 1, increasing=True)
    weight = np.abs(f)  # an error e in Q is an error f^2 e in log1p(f) ~ f: relative error |f| e
    coef = np.linalg.lstsq(vander * weight[:, None], target * weight, rcond=None)[0]
    for _ in range(iterations):
        residual = np.abs((vander @ coef - target) * weight)
        weight = weight * (1 + 20 * residual / residual.max())
        coef = np.linalg.lstsq(vander * weight[:, None], target * weight, rcond=None)[0]
    c32 = coef.astype(np.float32)
    approx = f + f**2 * (vander @ c32.astype(np.float64))
    return c32, np.max(np.abs(approx - np.log1p(f)) / np.abs(np.log1p(f)))


if __name__ == "__main__":
    c32, err = fit()
    for i, c in enumerate(c32):
        print(f"c{i} = {float(c)!r}f")
    print(f"max relative error of log1p on [-1/3, 1/3): {err:.3g}")
