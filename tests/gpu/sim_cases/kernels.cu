// Kernels for the stand-in's own tests (tests/gpu/test_cuda_standin.py): a correct block sum and warp
// operations with known results, and deliberately broken copies that the stand-in must reject.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kldiv_launch.cuh"

#define EXPORT extern "C" __attribute__((visibility("default")))

constexpr int kThreads = 256;

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// mode 0: correct; 1: no __syncthreads() between the writes and the reads of warp_part;
// 2: reads 16 slots of which 8 were written (unwritten shared memory).
template <int MODE>
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double warp_part[kThreads / 16];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_part[warp] = v;
  if (MODE != 1) __syncthreads();
  const int nread = MODE == 2 ? kThreads / 16 : kThreads / 32;
  v = (int)threadIdx.x < nread ? warp_part[threadIdx.x] : 0.0;
  if (warp == 0) v = warp_sum(v);
  __syncthreads();
  return v;
}

// TAIL: 0 correct grid-stride loop, 1 off-by-one (k <= n).
template <int MODE, int TAIL>
__global__ void sum_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ partials) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  double acc = 0.0;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; TAIL ? k <= n : k < n; k += stride) acc += x[k];
  acc = block_sum<MODE>(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// A shuffle only the low half of the warp reaches.
__global__ void shfl_in_branch(float* out) {
  float v = (float)threadIdx.x;
  if ((threadIdx.x & 31) < 16) v += __shfl_down_sync(0xffffffffu, v, 8);
  out[threadIdx.x] = v;
}

// Half the block returns before a barrier the other half waits at.
__global__ void barrier_in_branch(float* out) {
  if (threadIdx.x < 128) {
    __syncthreads();
    out[threadIdx.x] = 1.0f;
  }
}

// One writes one element past the end.
__global__ void write_past_end(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = 0.0f;
}

// Warp operations with known results: out[7 * tid + k] for k = down, up, xor, idx, ballot, any, all.
__global__ void warp_ops(int* out) {
  const int t = threadIdx.x, lane = t & 31;
  int* o = out + 7 * t;
  o[0] = __shfl_down_sync(0xffffffffu, t, 5);
  o[1] = __shfl_up_sync(0xffffffffu, t, 3, 16);
  o[2] = __shfl_xor_sync(0xffffffffu, t, 9);
  o[3] = __shfl_sync(0xffffffffu, t, (lane * 7) & 31);
  o[4] = (int)__ballot_sync(0xffffffffu, (t % 3) == 0);
  o[5] = __any_sync(0xffffffffu, t == 40);
  o[6] = __all_sync(0xffffffffu, lane < 31);
}

// A mask naming only the even lanes: the odd ones skip it legally.
__global__ void partial_mask(int* out) {
  const int lane = threadIdx.x & 31;
  int v = lane;
  if (!(lane & 1)) v = __shfl_xor_sync(0x55555555u, v, 2);
  out[threadIdx.x] = v;
}

template <int MODE, int TAIL>
static int run_sum(int64_t n, int blocks, double* result) {
  float* x = nullptr;
  double* partials = nullptr;
  cudaMalloc((void**)&x, sizeof(float) * n);
  cudaMallocAsync((void**)&partials, sizeof(double) * blocks, nullptr);
  for (int64_t i = 0; i < n; ++i) x[i] = (float)(i % 7) - 2.5f;
  KLDIV_LAUNCH(blocks, kThreads, 0, nullptr, sum_kernel<MODE, TAIL>)(x, n, partials);
  double s = 0;
  for (int b = 0; b < blocks; ++b) s += partials[b];
  *result = s;
  cudaFree(x);
  cudaFreeAsync(partials, nullptr);
  return 0;
}

// case: 0 correct sum, 1 missing __syncthreads, 2 unwritten shared read, 3 off-by-one tail,
// 4 shuffle in a lane-dependent branch, 5 barrier in a branch, 6 write past the end.
extern "C" void cudasim_set_reverse(int);

EXPORT int run_case(int which, int64_t n, int blocks, double* result, int reverse) {
  cudasim_set_reverse(reverse);
  float* buf = nullptr;
  switch (which) {
    case 0: return run_sum<0, 0>(n, blocks, result);
    case 1: return run_sum<1, 0>(n, blocks, result);
    case 2: return run_sum<2, 0>(n, blocks, result);
    case 3: return run_sum<0, 1>(n, blocks, result);
    case 4:
      cudaMalloc((void**)&buf, sizeof(float) * 64);
      KLDIV_LAUNCH(1, 64, 0, nullptr, shfl_in_branch)(buf);
      return 0;
    case 5:
      cudaMalloc((void**)&buf, sizeof(float) * 256);
      KLDIV_LAUNCH(1, 256, 0, nullptr, barrier_in_branch)(buf);
      return 0;
    case 6:
      cudaMalloc((void**)&buf, sizeof(float) * 100);
      KLDIV_LAUNCH(1, 128, 0, nullptr, write_past_end)(buf, 100);
      return 0;
  }
  return 1;
}

EXPORT void run_warp_ops(int* host_out, int threads) {
  int* out = nullptr;
  cudaMalloc((void**)&out, sizeof(int) * 7 * threads);
  KLDIV_LAUNCH(1, threads, 0, nullptr, warp_ops)(out);
  cudaMemcpy(host_out, out, sizeof(int) * 7 * threads, cudaMemcpyDeviceToHost);
  cudaFree(out);
}

EXPORT void run_partial_mask(int* host_out) {
  int* out = nullptr;
  cudaMalloc((void**)&out, sizeof(int) * 64);
  KLDIV_LAUNCH(1, 64, 0, nullptr, partial_mask)(out);
  cudaMemcpy(host_out, out, sizeof(int) * 64, cudaMemcpyDeviceToHost);
  cudaFree(out);
}
