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

// A thread's share of the n element pairs (x[i], t[i]), i = first, first + step, ...: when `vec` (both arrays start
// on a 16-byte boundary) packet by packet first, vec_fn(k, packet k of x, packet k of t), each packet read with one
// load; then the elements no packet covered, elem_fn(i).
template <typename T, typename VecFn, typename ElemFn>
__device__ __forceinline__ void for_each_packet_pair(const T* x, const T* t, int64_t n, int64_t first, int64_t step,
                                                     bool vec, VecFn&& vec_fn, ElemFn&& elem_fn) {
  int64_t done = 0;
  if (vec) {
    const int64_t nv = n / Vec16<T>::kN;
    for (int64_t k = first; k < nv; k += step) {
      const Vec16<T> a = packet(x, k), b = packet(t, k);
      vec_fn(k, a, b);
    }
    done = nv * Vec16<T>::kN;
  }
  for (int64_t i = done + first; i < n; i += step) elem_fn(i);
}

}  // namespace cuda
}  // namespace kldiv
