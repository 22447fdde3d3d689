// One launch spelling for every CUDA kernel of this package, so the same .cu file runs under nvcc on a GPU
// and under the CUDA-on-CPU stand-in (custom_ops/gpu/sim) with g++:
//     KLDIV_LAUNCH((kernel<T, LT>), grid, block, shared_bytes, stream)(args...);
// The kernel is parenthesised so template arguments with commas survive the macro.
#pragma once

#ifdef KLDIV_CUDA_SIM
#include "sim/cuda_sim.h"
#define KLDIV_LAUNCH(kernel, grid, block, shmem, stream) \
  ::cuda_sim::launcher(kernel, #kernel, (grid), (block), (shmem), (stream))
#else
#define KLDIV_LAUNCH(kernel, grid, block, shmem, stream) kernel<<<(grid), (block), (shmem), (stream)>>>
#endif
