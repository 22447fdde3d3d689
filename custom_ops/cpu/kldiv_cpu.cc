// libkldiv_cpu.so front end: the ABI of custom_ops/common/kldiv_abi.h on top of the per-ISA kernels.
//
// Here: dtype parsing, broadcast planning (merge dims, strides 0 for broadcast dims, 64-bit sizes),
// C++ shape inference for dynamic shapes, the choice of ISA (once, from cpuid), and the thread pool.
//
// Threads: a small pool of std::threads owned by this library rather than OpenMP, because MindSpore,
// torch and numpy each may load their own OpenMP runtime into the process and two runtimes competing for
// the same cores (busy-waiting workers) slowed an OpenMP kernel from 0.02 ms to 12 ms per call. Our
// workers sleep on a condition variable between calls, so they never spin against anyone else's.
// Small problems run on the calling thread (no wake-up cost at all).
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "../common/kldiv_abi.h"
#include "kldiv_cpu.h"

namespace kldiv {
namespace cpu {
namespace {

// Below this many elements one thread wins (a pool wake-up costs ~10-30 us); above, each thread gets at
// least kGrain elements. Overridable for experiments with MS_KLDIV_PARALLEL_MIN.
constexpr int64_t kDefaultParallelMin = 1 << 16;
constexpr int64_t kGrain = 1 << 15;

int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long r = strtol(v, &end, 10);
  return (end && *end == '\0' && r > 0) ? static_cast<int>(r) : fallback;
}

int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int c = CPU_COUNT(&set);
    if (c > 0) return c;
  }
  const unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int>(h) : 1;
}

// Work is split into chunks (more chunks than threads) that the calling thread and the woken workers
// take from a shared counter: on a loaded machine (other processes on our cores) a late or preempted
// worker then costs its one chunk, not a whole static share. Chunk boundaries depend only on the problem
// size, so reductions add the same partial sums in the same order whatever the thread count or timing.
class Pool {
 public:
  explicit Pool(int nworkers) {
    for (int i = 0; i < nworkers; ++i) workers_.emplace_back([this] { loop(); });
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int nchunks, TaskFn fn, void* ctx) {
    // MindSpore may launch kernels from several threads; one parallel region at a time.
    std::lock_guard<std::mutex> region(region_mu_);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen = ++generation_;
      fn_ = fn;
      ctx_ = ctx;
      nchunks_ = nchunks;
      done_.store(0);
      counter_.store(gen << 32);
    }
    const int wake = (nchunks < size() ? nchunks : size()) - 1;
    for (int i = 0; i < wake; ++i) cv_.notify_one();
    work(gen, fn, ctx, nchunks);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_.load() == nchunks; });
  }

 private:
  // Takes chunks of run `gen` until none is left; a worker waking after its run ended takes none.
  void work(uint64_t gen, TaskFn fn, void* ctx, int nchunks) {
    for (;;) {
      uint64_t v = counter_.load();
      int c;
      do {
        if ((v >> 32) != gen || static_cast<int>(v & 0xffffffffu) >= nchunks) return;
        c = static_cast<int>(v & 0xffffffffu);
      } while (!counter_.compare_exchange_weak(v, v + 1));
      fn(ctx, c, nchunks);
      if (done_.fetch_add(1) + 1 == nchunks) {
        std::lock_guard<std::mutex> lk(mu_);
        done_cv_.notify_all();
      }
    }
  }

  void loop() {
    // Named, so that profilers and /proc/<pid>/task show whose time is whose (a thread inherits its creator's name).
    pthread_setname_np(pthread_self(), "kldiv_pool");
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      TaskFn fn = fn_;
      void* ctx = ctx_;
      const int nchunks = nchunks_;
      lk.unlock();
      work(seen, fn, ctx, nchunks);
      lk.lock();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex region_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int nchunks_ = 0;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> counter_{0};
  std::atomic<int> done_{0};
};

std::mutex g_pool_mu;
Pool* g_pool = nullptr;  // created on first parallel call; deliberately never destroyed (exit order)
int g_max_threads = 0;
int64_t g_parallel_min = kDefaultParallelMin;

void init_limits() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_max_threads = env_int("MS_KLDIV_NUM_THREADS", available_cpus());
    g_parallel_min = env_int("MS_KLDIV_PARALLEL_MIN", static_cast<int>(kDefaultParallelMin));
    // A forked child has no pool threads: forget the parent's pool (leaked, its threads do not exist).
    pthread_atfork(nullptr, nullptr, [] { g_pool = nullptr; });
  });
}

Pool* pool() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) g_pool = new Pool(g_max_threads - 1);
  return g_pool;
}

const KernelTable* pick_table() {
  const char* force = getenv("MS_KLDIV_ISA");
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (force && strcmp(force, "baseline") == 0) return table_base();
  if (avx2) return table_avx2();
#else
  (void)force;
#endif
  return table_base();
}

const KernelTable* table() {
  static const KernelTable* t = pick_table();
  return t;
}

int parse_dtype(const char* s) {
  if (!s) return -1;
  if (strcmp(s, "float32") == 0) return kF32;
  if (strcmp(s, "float16") == 0) return kF16;
  if (strcmp(s, "bfloat16") == 0) return kBF16;
  if (strcmp(s, "float64") == 0) return kF64;
  return -1;
}

int64_t numel(int nd, const int64_t* shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= shape[i];
  return n;
}

// Broadcast x (ndx, shx) with t (ndt, sht) into *bshape / *bnd and build the merged iteration Plan.
bool make_plan(int ndx, const int64_t* shx, int ndt, const int64_t* sht, Plan* p, int64_t* bshape, int* bnd) {
  if (ndx < 0 || ndt < 0 || ndx > kMaxDims || ndt > kMaxDims) return false;
  const int nd = ndx > ndt ? ndx : ndt;
  int64_t sx[kMaxDims], st[kMaxDims], bx[kMaxDims], bt[kMaxDims];
  for (int d = 0; d < nd; ++d) {
    const int ix = d - (nd - ndx), it = d - (nd - ndt);
    sx[d] = ix >= 0 ? shx[ix] : 1;
    st[d] = it >= 0 ? sht[it] : 1;
    if (sx[d] < 0 || st[d] < 0) return false;
    if (sx[d] != st[d] && sx[d] != 1 && st[d] != 1) return false;
    bshape[d] = sx[d] == 1 ? st[d] : sx[d];
  }
  *bnd = nd;
  // Row-major element strides of each operand in its own storage; 0 where it is broadcast.
  int64_t cx = 1, ct = 1;
  for (int d = nd - 1; d >= 0; --d) {
    bx[d] = (sx[d] == 1) ? 0 : cx;
    bt[d] = (st[d] == 1) ? 0 : ct;
    cx *= sx[d];
    ct *= st[d];
  }
  p->n = numel(nd, bshape);
  p->nx = numel(ndx, shx);
  p->nt = numel(ndt, sht);
  p->x_reduced = p->nx != p->n;
  p->t_reduced = p->nt != p->n;
  p->nd = 0;
  if (p->n == 0) {  // nothing to iterate; the kernels only write the reduced outputs
    p->nd = 1;
    p->size[0] = 0;
    p->xs[0] = p->ts[0] = 0;
    return true;
  }
  for (int d = 0; d < nd; ++d) {
    if (bshape[d] == 1) continue;  // size-1 dims carry no iteration
    if (p->nd > 0) {
      const int q = p->nd - 1;
      if (p->xs[q] == bx[d] * bshape[d] && p->ts[q] == bt[d] * bshape[d]) {  // contiguous continuation
        p->size[q] *= bshape[d];
        p->xs[q] = bx[d];
        p->ts[q] = bt[d];
        continue;
      }
    }
    p->size[p->nd] = bshape[d];
    p->xs[p->nd] = bx[d];
    p->ts[p->nd] = bt[d];
    ++p->nd;
  }
  if (p->nd == 0) {  // a single element
    p->nd = 1;
    p->size[0] = 1;
    p->xs[0] = p->ts[0] = 0;
  }
  return true;
}

double scale_for(int reduction, int64_t n, int ndx, const int64_t* shx) {
  switch (reduction) {
    case kMean: return n ? 1.0 / static_cast<double>(n) : NAN;
    case kBatchmean: {
      const int64_t b = ndx ? shx[0] : 1;
      return b ? 1.0 / static_cast<double>(b) : NAN;
    }
    default: return 1.0;
  }
}

// want: kForward, or the backward's gradients (kWantDx / kWantDt / kWantBoth; see kldiv_abi.h).
int run(int want, int reduction, bool log_target, int nparam, void** params, int* ndims, int64_t** shapes,
        const char** dtypes) {
  const bool fwd = want == kForward;
  if (nparam != nparam_for(want) || !params || !ndims || !shapes || !dtypes) return 1;
  const int dtype = parse_dtype(dtypes[0]);
  if (dtype < 0) return 2;
  for (int i = 1; i < nparam; ++i) {
    if (parse_dtype(dtypes[i]) != dtype) return 2;
  }
  Plan plan;
  int64_t bshape[kMaxDims];
  int bnd = 0;
  if (!make_plan(ndims[0], shapes[0], ndims[1], shapes[1], &plan, bshape, &bnd)) return 3;
  // The output / dout must be what shape inference promised.
  const int io = 2;
  if (reduction == kNone) {
    if (ndims[io] != bnd) return 4;
    for (int d = 0; d < bnd; ++d) {
      if (shapes[io][d] != bshape[d]) return 4;
    }
  } else if (numel(ndims[io], shapes[io]) != 1) {
    return 4;
  }
  const int ix = dx_param(want), it = dt_param(want);
  if (ix >= 0 && numel(ndims[ix], shapes[ix]) != plan.nx) return 4;
  if (it >= 0 && numel(ndims[it], shapes[it]) != plan.nt) return 4;
  init_limits();
  Args a;
  a.plan = &plan;
  a.dtype = dtype;
  a.log_target = log_target;
  a.reduction = reduction;
  a.scale = scale_for(reduction, plan.n, ndims[0], shapes[0]);
  a.x = params[0];
  a.t = params[1];
  if (fwd) {
    a.dout = nullptr;
    a.want = kForward;
    a.out = params[2];
    a.dx = a.dt = nullptr;
    table()->forward(&a);
  } else {
    a.dout = params[2];
    a.out = nullptr;
    a.want = want;
    a.dx = ix >= 0 ? params[ix] : nullptr;
    a.dt = it >= 0 ? params[it] : nullptr;
    table()->backward(&a);
  }
  return 0;
}

}  // namespace

void parallel_run(int nthreads, TaskFn fn, void* ctx) {
  if (nthreads <= 1) {
    fn(ctx, 0, 1);
    return;
  }
  pool()->run(nthreads, fn, ctx);
}

int threads_for(int64_t work) {
  init_limits();
  if (work < g_parallel_min) return 1;
  // Chunks, not threads, and independent of the thread count (MS_KLDIV_NUM_THREADS=1 just runs them all
  // on the calling thread): the same input always gives the same partial sums in the same order.
  int64_t c = work / kGrain;
  if (c > 256) c = 256;
  return c < 2 ? 2 : static_cast<int>(c);
}

}  // namespace cpu
}  // namespace kldiv

// ------------------------------------------------------------------------------------------ the exports
namespace kldiv {
namespace cpu {
template <bool LT>
int run_export(int want, int reduction, int nparam, void** params, int* ndims, int64_t** shapes,
               const char** dtypes, void* stream) {
  (void)stream;  // CPU: unused
  return run(want, reduction, LT, nparam, params, ndims, shapes, dtypes);
}
}  // namespace cpu
}  // namespace kldiv

#define KLDIV_CPU_EXPORTS(R, S, RID, LT) KLDIV_DEFINE_EXPORTS(kldiv::cpu::run_export, R, S, RID, LT)
KLDIV_FOR_EACH_VARIANT(KLDIV_CPU_EXPORTS)

KLDIV_EXPORT const char* KLDivLibInfo(void) {
  static char info[160];
  static std::once_flag once;
  std::call_once(once, [] {
    kldiv::cpu::init_limits();
    snprintf(info, sizeof(info), "libkldiv_cpu abi=%d isa=%s threads=%d libmvec=%d", KLDIV_ABI_VERSION,
             kldiv::cpu::table()->isa, kldiv::cpu::g_max_threads,
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(KLDIV_NO_LIBMVEC)
             1
#else
             0
#endif
    );
  });
  return info;
}

// The streaming roofline the benchmark compares against: read `n` elements of two float32 arrays once
// (the bytes a fused kl_div forward must read), on the same threads and pool as the kernels.
namespace {
struct ReadCtx {
  const float* a;
  const float* b;
  int64_t n;
  double partial[256];
};

void read_task(void* vctx, int tid, int nth) {
  ReadCtx* c = static_cast<ReadCtx*>(vctx);
  const int64_t q = c->n / nth, r = c->n % nth;
  const int64_t b = q * tid + (tid < r ? tid : r), e = b + q + (tid < r ? 1 : 0);
  // Local restrict pointers: loads through the context struct keep GCC from vectorizing the loop.
  const float* __restrict a = c->a;
  const float* __restrict bb = c->b;
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = b; i < e; ++i) s += a[i] + bb[i];
  c->partial[tid] = s;
}
}  // namespace

KLDIV_EXPORT double KLDivStreamRead(const float* a, const float* b, int64_t n) {
  ReadCtx c{a, b, n, {}};
  int nth = kldiv::cpu::threads_for(n);
  if (nth > 256) nth = 256;
  kldiv::cpu::parallel_run(nth, &read_task, &c);
  double s = 0.0;
  for (int i = 0; i < nth; ++i) s += c.partial[i];
  return s;
}
