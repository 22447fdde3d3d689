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
// Compute type C is float or double (half types are widened to float by the caller), or a SIMD vector
// type with the same operators (custom_ops/cpu/kldiv_simd_avx2.h): masks then come from its comparison
// operators, `kselect` is its lane blend, and klog/kexp/safe_target/kselect are found by argument-dependent
// lookup. So the formulas below are written once for scalars, CUDA threads and CPU vectors alike.
#pragma once

#if defined(__CUDACC__)
#define KLDIV_HD __host__ __device__ __forceinline__
#else
// static: the CPU library compiles these once per ISA (baseline, AVX2, ...); internal linkage keeps the
// linker from merging an AVX2 copy into the baseline path (a SIGILL on older CPUs).
#define KLDIV_HD static inline __attribute__((always_inline))
#endif

#include <math.h>

// On x86-64 glibc the CPU kernels vectorize logf/expf/log/exp through libmvec (see
// custom_ops/cpu/kldiv_vecmath.h, included before this header there).

namespace kldiv {

KLDIV_HD float klog(float v) { return logf(v); }
KLDIV_HD double klog(double v) { return log(v); }
KLDIV_HD float kexp(float v) { return expf(v); }
KLDIV_HD double kexp(double v) { return exp(v); }

// `m ? a : b`, lane-wise for vector types.
template <typename C>
KLDIV_HD C kselect(bool m, C a, C b) { return m ? a : b; }

template <typename C>
KLDIV_HD auto has_mass(C t, bool log_target) {
  return log_target ? !(t == -static_cast<C>(INFINITY)) : !(t <= C(0));
}

#if defined(__CUDACC__)
template <typename C>
KLDIV_HD C safe_target(bool m, C t, bool log_target) { return m ? t : C(log_target ? 0 : 1); }
#else
// The target fed to log/exp on a lane with no mass: t itself, else a harmless 1 (0 in log space).
// Written as a bit-select on purpose: with a plain `m ? t : 1`, GCC rewrites log(m ? t : 1) into
// m ? log(t) : 0, so libmvec's vector logf still sees t <= 0 and takes its slow special-value path for the
// whole vector (a few zero targets then slow the whole forward down). Bit operations are not folded.
template <typename U, typename C>
static inline __attribute__((always_inline)) C bit_select(bool m, C a, C b) {
  U ua, ub;
  __builtin_memcpy(&ua, &a, sizeof(C));
  __builtin_memcpy(&ub, &b, sizeof(C));
  const U mask = U(0) - U(m);
  const U r = (ua & mask) | (ub & ~mask);
  C out;
  __builtin_memcpy(&out, &r, sizeof(C));
  return out;
}
static inline __attribute__((always_inline)) float safe_target(bool m, float t, bool log_target) {
  return bit_select<unsigned int>(m, t, log_target ? 0.0f : 1.0f);
}
static inline __attribute__((always_inline)) double safe_target(bool m, double t, bool log_target) {
  return bit_select<unsigned long long>(m, t, log_target ? 0.0 : 1.0);
}
#endif

// The value loss/grads hand to klog (kexp with log_target): the target, or a harmless constant on a lane
// without mass. Kernels whose log has a restricted domain check this (custom_ops/cpu/kldiv_simd_avx2.h).
template <typename C>
KLDIV_HD C log_argument(C t, bool log_target) { return safe_target(has_mass(t, log_target), t, log_target); }

// Every function below is branch-free: masked lanes are fed safe values (x=0; t=1, or t=0 for log_target,
// or t itself for a vector log that is finite on every bit pattern) and the result is selected afterwards
// or multiplied by a target masked to 0, so a SIMD or SIMT loop evaluates them without divergence and no
// lane ever computes 0 * inf. This gives exactly the piecewise definitions written in the comments.

// The summand of a reduction: loss(x, t) up to the sign of a zero (a term without mass may give -0).
// log_target=False: the masked target multiplies, so a term without mass is 0 * (finite - 0) and needs no
// select after the log (one instruction less per vector in the CPU kernels' float32 sums).
template <typename C>
KLDIV_HD C loss_term(C x, C t, bool log_target) {
  const auto m = has_mass(t, log_target);
  const C xs = kselect(m, x, C(0));
  const C ts = safe_target(m, t, log_target);
  if (log_target) return kselect(m, kexp(ts) * (ts - xs), C(0));
  return kselect(m, t, C(0)) * (klog(ts) - xs);
}

// log t - x, with log t whole before x joins. (Folding x into the CPU inline log's table term, ahead of its small
// parts, saved no operation and rounded those parts at x's magnitude with an error of one sign: with large x the terms
// of a sum were biased, 7e-5 relative for 4M terms of +-1000 cancelling to 6e5.)
template <typename C>
KLDIV_HD C klog_sub(C t, C x) { return klog(t) - x; }

// acc + loss_term(x, t, false), with target and input unmasked, for a kernel pass that re-runs a block exactly
// unless its total is finite and none of its targets has the sign bit set (the CPU kernels' lean float32 sums,
// LeanSumCheck), and whose klog is finite on every bit pattern. A target without mass is then +0, and its term
// 0 * finite = 0; with an infinite input it is 0 * inf = NaN, which sends the block to the exact pass.
// mul_add(a, b, c) is a * b + c, fused where the type fuses.
template <typename C>
KLDIV_HD C accumulate_loss_term(C acc, C x, C t) { return mul_add(t, klog_sub(t, x), acc); }

// loss(x, t): t * (log t - x), or exp(t) * (t - x) with log_target; +0 without mass.
template <typename C>
KLDIV_HD C loss(C x, C t, bool log_target) {
  const C v = loss_term(x, t, log_target);
  return log_target ? v : v + C(0);  // -0 + 0 == +0: an element output is +0 without mass, as specified
}

// d loss / d x:  -t, or -exp(t) with log_target; 0 without mass.
template <typename C>
KLDIV_HD C grad_input(C x, C t, bool log_target) {
  (void)x;
  const auto m = has_mass(t, log_target);
  const C ts = safe_target(m, t, log_target);
  const C v = log_target ? -kexp(ts) : -ts;
  return kselect(m, v, C(0));
}

// d loss / d t:  log t + 1 - x, or exp(t) * (t - x + 1) with log_target; 0 without mass.
template <typename C>
KLDIV_HD C grad_target(C x, C t, bool log_target) {
  const auto m = has_mass(t, log_target);
  const C ts = safe_target(m, t, log_target);
  const C xs = kselect(m, x, C(0));
  const C v = log_target ? kexp(ts) * (ts - xs + C(1)) : klog(ts) + C(1) - xs;
  return kselect(m, v, C(0));
}

// Both gradients in one evaluation (one exp/log), as the fused backward kernels want them.
template <typename C>
KLDIV_HD void grads(C x, C t, bool log_target, C* d_input, C* d_target) {
  const auto m = has_mass(t, log_target);
  const C ts = safe_target(m, t, log_target);
  const C xs = kselect(m, x, C(0));
  C di, dt;
  if (log_target) {
    const C e = kexp(ts);
    di = -e;
    dt = e * (ts - xs + C(1));
  } else {
    di = -ts;
    dt = klog(ts) + C(1) - xs;
  }
  *d_input = kselect(m, di, C(0));
  *d_target = kselect(m, dt, C(0));
}

}  // namespace kldiv
