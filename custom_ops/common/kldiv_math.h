// The pointwise KL-divergence math, declared once for every C++/CUDA kernel.
//
// Like PyTorch's derivatives.yaml, the forward formula and both derivatives sit side by side here;
// the CPU (custom_ops/cpu) and CUDA (custom_ops/gpu) kernels include this header and never restate a
// formula. The Python twin is ms_kldiv/reference.py (float64 NumPy), which the tests compare against.
//
// x = input (log-probabilities), t = target (probabilities, or log-probabilities if log_target).
// Zero-mass rule (see SPEC.md): a term whose target carries no mass contributes 0 to the loss and to
// both gradients, whatever x is (x = -inf included). "No mass" is t <= 0 (t == -inf with log_target).
// The test is written as !(t <= 0) so that a NaN target keeps its mass and propagates NaN.
//
// Compute type C is float or double; half types are widened to float by the caller.
#pragma once

#if defined(__CUDACC__)
#define KLDIV_HD __host__ __device__ __forceinline__
#else
#define KLDIV_HD inline
#endif

#include <math.h>

namespace kldiv {

KLDIV_HD float klog(float v) { return logf(v); }
KLDIV_HD double klog(double v) { return log(v); }
KLDIV_HD float kexp(float v) { return expf(v); }
KLDIV_HD double kexp(double v) { return exp(v); }

template <typename C>
KLDIV_HD bool has_mass(C t, bool log_target) {
  return log_target ? !(t == -static_cast<C>(INFINITY)) : !(t <= C(0));
}

// loss(x, t): t * (log t - x), or exp(t) * (t - x) with log_target.
template <typename C>
KLDIV_HD C loss(C x, C t, bool log_target) {
  if (!has_mass(t, log_target)) return C(0);
  return log_target ? kexp(t) * (t - x) : t * (klog(t) - x);
}

// d loss / d x:  -t, or -exp(t) with log_target.
template <typename C>
KLDIV_HD C grad_input(C x, C t, bool log_target) {
  (void)x;
  if (!has_mass(t, log_target)) return C(0);
  return log_target ? -kexp(t) : -t;
}

// d loss / d t:  log t + 1 - x, or exp(t) * (t - x + 1) with log_target.
template <typename C>
KLDIV_HD C grad_target(C x, C t, bool log_target) {
  if (!has_mass(t, log_target)) return C(0);
  return log_target ? kexp(t) * (t - x + C(1)) : klog(t) + C(1) - x;
}

// Both gradients in one evaluation (one exp/log), as the fused backward kernels want them.
template <typename C>
KLDIV_HD void grads(C x, C t, bool log_target, C* d_input, C* d_target) {
  if (!has_mass(t, log_target)) {
    *d_input = C(0);
    *d_target = C(0);
  } else if (log_target) {
    const C e = kexp(t);
    *d_input = -e;
    *d_target = e * (t - x + C(1));
  } else {
    *d_input = -t;
    *d_target = klog(t) + C(1) - x;
  }
}

}  // namespace kldiv
