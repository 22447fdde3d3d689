// One launch syntax for nvcc and for the CUDA-on-CPU stand-in (tests/gpu/standin/cuda_sim.h, compiled by g++):
//   KLDIV_LAUNCH(grid, block, smem, stream, kernel<T, ...>)(args...);
// The kernel comes last so a template argument list's commas need no parentheses.
#pragma once

#ifdef __CUDACC__
#define KLDIV_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#else
#define KLDIV_LAUNCH(grid, block, smem, stream, ...) \
  ::cudasim::launch(#__VA_ARGS__, grid, block, smem, stream, &__VA_ARGS__)
#endif
