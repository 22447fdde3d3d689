// Device-side dtype plumbing shared by the CUDA kernels (kldiv_cuda.cu, distill_cuda.cu): the compute type of
// each storage type, conversions (round to nearest even on the way back), and 128-bit load/store packets.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kldiv {
namespace cuda {

template <typename T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };

__device__ __forceinline__ float to_c(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_c(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_c(float v) { return v; }
__device__ __forceinline__ double to_c(double v) { return v; }

template <typename T> __device__ __forceinline__ T from_c(typename Compute<T>::type v);
template <> __device__ __forceinline__ __half from_c<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_c<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ float from_c<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_c<double>(double v) { return v; }

template <typename T> struct alignas(16) Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

// Packet k of an array that starts on a 16-byte boundary (the front ends check that before they pick a vector path).
template <typename T> __device__ __forceinline__ const Vec16<T>& packet(const T* p, int64_t k) {
  return reinterpret_cast<const Vec16<T>*>(p)[k];
}
template <typename T> __device__ __forceinline__ Vec16<T>& packet(T* p, int64_t k) {
  return reinterpret_cast<Vec16<T>*>(p)[k];
}

// The packet part of a thread's share of n element pairs (x[i], t[i]), i = first, first + step, ...: when `vec`
// (both arrays start on a 16-byte boundary), vec_fn(k, packet k of x, packet k of t) for its packets, each read with
// one load. Returns how many leading elements the packets cover (0 without `vec`): the caller's scalar loop takes
// the rest, from that index plus `first`.
template <typename T, typename VecFn>
__device__ __forceinline__ int64_t for_each_packet_pair(const T* x, const T* t, int64_t n, int64_t first,
                                                        int64_t step, bool vec, VecFn&& vec_fn) {
  if (!vec) return 0;
  const int64_t nv = n / Vec16<T>::kN;
  for (int64_t k = first; k < nv; k += step) {
    const Vec16<T> a = packet(x, k), b = packet(t, k);
    vec_fn(k, a, b);
  }
  return nv * Vec16<T>::kN;
}

// A row loop's per-class sums run in float and are added to its double state every this many classes (and before
// its base moves): for a loop with little other work per class (the stored-teacher forward) the float-to-double
// conversions per class were a large part of it; 16 float additions keep a partial sum within 16 ulp of its terms.
constexpr int kFlushEvery = 16;
// Online softmax loops move their exponents' base (a double rescale of the sums) only when a class exceeds it by
// more than this many exponent units, and once more to the true maximum after the loop: moving it at every new
// maximum made a warp rescale for some lane in most steps (divergent double exps dominated the forward). Terms
// stay below e^16, far from float overflow, and the stats keep the true maximum.
constexpr float kLazyRescale = 16.0f;

}  // namespace cuda
}  // namespace kldiv
