// What the timing tools in this folder share: the kernel's float32 lean-sum loop as shipped (kldiv_kernels.inc,
// run_sum's lean pass on F8), a clock, and data like the benchmark's.
#pragma once
#include <stdint.h>
#include <time.h>

#include <random>
#include <vector>

#include "../kldiv_simd_avx2.h"
#include "../../common/kldiv_math.h"

namespace kldiv_tools {
using namespace kldiv::simd_avx2;
using Check = LeanSumCheck<1024>;

// The shipped loop: the kernel's own term, kldiv::accumulate_loss_term on F8, into one accumulator, the check
// alongside. -1 when the check sends the block to the exact pass (never on fill_data's data).
__attribute__((noinline)) inline float shipped(const float* x, const float* t, int64_t n) {
  F8 acc(0.0f);
  Check c;
  for (int64_t i = 0; i < n; i += 8) {
    const F8 tv = F8::load(t + i);
    c.add(tv.v);
    acc = kldiv::accumulate_loss_term<F8>(acc, F8::load(x + i), tv);
  }
  const float s = hsum(acc.v);
  return c.ok(s) ? s : -1.0f;
}

inline double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Like the benchmark's data: targets in (0, 1], inputs log-probability-like.
inline void fill_data(float* x, float* t, int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(1e-6f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    t[i] = u(g);
    x[i] = -2.0f * u(g);
  }
}
inline void fill_data(std::vector<float>& x, std::vector<float>& t, uint32_t seed) {
  fill_data(x.data(), t.data(), static_cast<int64_t>(t.size()), seed);
}
}  // namespace kldiv_tools
