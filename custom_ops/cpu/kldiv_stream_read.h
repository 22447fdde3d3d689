// The streaming read: both float32 arrays read once over [lo, hi), the bytes a fused kl_div forward must read. The
// benchmark's roofline times it inside the library (KLDivStreamRead in kldiv_cpu.cc, on the library's pool), and
// benchmarks/cpu/read_bandwidth.cc times it outside (std::threads, 4 KB and 2 MB pages), so both measure the same loop.
#pragma once

#include <stdint.h>

namespace kldiv {
namespace cpu {

// Sums into 16 independent lanes (the compiler vectorizes them without reassociating). prefetch_bytes > 0: one
// software prefetch per 64-byte line of each array, that far ahead (the forward sum's setting, Args::prefetch).
inline float stream_read_slice(const float* __restrict a, const float* __restrict b, int64_t lo, int64_t hi,
                               int64_t prefetch_bytes) {
  constexpr int64_t kLine = 16;  // floats per 64-byte line
  const uintptr_t pf = static_cast<uintptr_t>(prefetch_bytes);
  float lanes[kLine] = {};
  int64_t i = lo;
  for (; i + kLine <= hi; i += kLine) {
    if (pf) {
      // Integer arithmetic: the address may lie past the array's end (fine for a prefetch, not for a pointer).
      __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(a + i) + pf), 0, 3);
      __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(b + i) + pf), 0, 3);
    }
    for (int64_t j = 0; j < kLine; ++j) lanes[j] += a[i + j] + b[i + j];
  }
  float s = 0.f;
  for (; i < hi; ++i) s += a[i] + b[i];
  for (int64_t j = 0; j < kLine; ++j) s += lanes[j];
  return s;
}

}  // namespace cpu
}  // namespace kldiv
