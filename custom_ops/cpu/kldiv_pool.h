// The CPU library's thread pool (kldiv_pool.cc), shared by the KL kernels (kldiv_kernels.inc), the distillation
// front end (distill_cpu.cc) and the diagnostics (kldiv_diagnostics.cc).
//
// Plain C functions only: the ISA units include this header under different -m flags (see kldiv_cpu.h).
#pragma once

#include <stdint.h>

namespace kldiv {
namespace cpu {

// Runs fn(ctx, chunk, nchunks) for every chunk in [0, nchunks) on the library pool; returns when all are done.
typedef void (*TaskFn)(void* ctx, int tid, int nthreads);
void parallel_run(int nthreads, TaskFn fn, void* ctx);
// Chunks to split `work` element-operations into (1 below the parallel threshold); parallel_run hands
// them to the pool dynamically.
int threads_for(int64_t work);

// The pool's settings, read once from the environment: MS_KLDIV_NUM_THREADS (default: the CPUs this process may
// run on), MS_KLDIV_PARALLEL_MIN and MS_KLDIV_STEER_WORKERS (0: never steer a worker off the caller's CPU).
struct PoolLimits {
  int max_threads;
  int64_t parallel_min;
  bool steer;
};
const PoolLimits& pool_limits();

}  // namespace cpu
}  // namespace kldiv
