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
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../common/kldiv_abi.h"
#include "kldiv_cpu.h"
#ifdef KLDIV_DIAGNOSTICS
#include "kldiv_stream_read.h"
#endif

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

// Work is split into chunks (more chunks than threads). Each participant of a run (the calling thread and
// the woken workers) owns a contiguous run of chunks and takes them in order, so that it reads one stream per
// operand and the hardware prefetchers follow it from one chunk into the next. (Handing chunks out round-robin
// from one shared counter made every thread jump at every chunk, and each jump cost time from DRAM: at 4M
// elements, 128 chunks of 32K, contiguous runs made the forward sum 6-11% faster; docs/cpu_aot.md, "Chunk
// layout".) A participant whose run is used up takes the upper half of the largest run left (its last chunk when
// one is left), so a late or preempted worker still costs only the chunks it has not started. Chunk boundaries
// depend only on the problem size, so reductions add the same partial sums in the same order whatever the thread
// count or timing.
class Pool {
 public:
  Pool(int nworkers, bool steer)
      : runs_(new std::atomic<uint64_t>[nworkers + 1]), last_cpu_(new std::atomic<int>[nworkers]) {
    for (int i = 0; i <= nworkers; ++i) runs_[i].store(0);
    for (int i = 0; i < nworkers; ++i) last_cpu_[i].store(-1);
    // Workers inherit this thread's CPUs; steering only ever narrows a worker to these minus one.
    CPU_ZERO(&allowed_);
    steer_ = steer && pthread_getaffinity_np(pthread_self(), sizeof(allowed_), &allowed_) == 0 &&
             CPU_COUNT(&allowed_) >= 2;
    for (int i = 0; i < nworkers; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int nchunks, TaskFn fn, void* ctx) {
    // MindSpore may launch kernels from several threads; one parallel region at a time.
    std::lock_guard<std::mutex> region(region_mu_);
    if (nchunks > kMaxChunks) {  // beyond the run bounds' 16 bits (threads_for gives at most 256): run them here
      for (int c = 0; c < nchunks; ++c) fn(ctx, c, nchunks);
      return;
    }
    const int parts = nchunks < size() ? nchunks : size();
    uint32_t gen;
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen = static_cast<uint32_t>(++generation_);
      fn_ = fn;
      ctx_ = ctx;
      nchunks_ = nchunks;
      parts_ = parts;
      done_.store(0);
      for (int s = 0; s < parts; ++s)
        runs_[s].store(pack(gen, static_cast<int64_t>(s) * nchunks / parts, static_cast<int64_t>(s + 1) * nchunks / parts));
      slots_.store(static_cast<uint64_t>(gen) << 32 | 1u);  // slot 0 is the caller's
    }
    if (steer_) steer_off(sched_getcpu());
    for (int i = 0; i < parts - 1; ++i) cv_.notify_one();
    work(gen, 0, parts, fn, ctx, nchunks);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_.load() == nchunks; });
  }

 private:
  static constexpr int kMaxChunks = 0xffff;
  // A run of chunks [lo, hi) of run `gen`, in one word so that its owner and thieves agree by compare-exchange.
  static uint64_t pack(uint32_t gen, int64_t lo, int64_t hi) {
    return static_cast<uint64_t>(gen) << 32 | static_cast<uint64_t>(lo) << 16 | static_cast<uint64_t>(hi);
  }
  static uint32_t gen_of(uint64_t v) { return static_cast<uint32_t>(v >> 32); }
  static int lo_of(uint64_t v) { return static_cast<int>((v >> 16) & 0xffffu); }
  static int hi_of(uint64_t v) { return static_cast<int>(v & 0xffffu); }

  // A worker's slot in run `gen`: its run of chunks (< parts), -1 when all are taken (it only steals), or -2
  // when that run is over.
  int claim_slot(uint32_t gen, int parts) {
    uint64_t v = slots_.load();
    do {
      if (gen_of(v) != gen) return -2;
    } while (!slots_.compare_exchange_weak(v, v + 1));
    const int s = static_cast<int>(v & 0xffffffffu);
    return s < parts ? s : -1;
  }

  // The next chunk of the participant's own run, or -1.
  int take_own(uint32_t gen, int slot) {
    if (slot < 0) return -1;
    uint64_t v = runs_[slot].load();
    for (;;) {
      if (gen_of(v) != gen || lo_of(v) >= hi_of(v)) return -1;
      if (runs_[slot].compare_exchange_weak(v, pack(gen, lo_of(v) + 1, hi_of(v)))) return lo_of(v);
    }
  }

  // A chunk from the largest run left: the upper half of that run (rounded up) becomes the thief's own, and its
  // first chunk is returned; -1 when no chunk is left.
  int steal(uint32_t gen, int slot, int parts) {
    for (;;) {
      int victim = -1, most = 0;
      uint64_t seen = 0;
      for (int s = 0; s < parts; ++s) {
        const uint64_t v = runs_[s].load();
        if (gen_of(v) != gen) return -1;  // the run is over
        if (hi_of(v) - lo_of(v) > most) {
          most = hi_of(v) - lo_of(v);
          victim = s;
          seen = v;
        }
      }
      if (victim < 0) return -1;
      const int lo = lo_of(seen), hi = hi_of(seen);
      const int mid = hi - (slot >= 0 ? (most + 1) / 2 : 1);  // a participant without a slot takes one chunk
      if (!runs_[victim].compare_exchange_strong(seen, pack(gen, lo, mid))) continue;
      // Our own run is empty, so no thief touches it; a stale copy of an earlier value cannot match this one.
      if (slot >= 0) runs_[slot].store(pack(gen, mid + 1, hi));
      return mid;
    }
  }

  // Runs chunks of run `gen` until none is left; a worker waking after its run ended takes none.
  void work(uint32_t gen, int slot, int parts, TaskFn fn, void* ctx, int nchunks) {
    for (;;) {
      int c = take_own(gen, slot);
      if (c < 0) c = steal(gen, slot, parts);
      if (c < 0) return;
      fn(ctx, c, nchunks);
      if (done_.fetch_add(1) + 1 == nchunks) {
        std::lock_guard<std::mutex> lk(mu_);
        done_cv_.notify_all();
      }
    }
  }

  // Keeps a worker from being woken onto the caller's CPU. Some schedulers wake a thread on the CPU it last ran on even
  // while that CPU is busy and another idles (the 2-vCPU VMs of docs/cpu_aot.md, "Steering the workers": MindSpore's
  // graph thread calling the kernel on our worker's last CPU left the worker queued behind it, and the caller did all
  // the chunks alone). So a worker last seen on the caller's CPU is allowed every CPU but that one before the wake-up:
  // one syscall, only on such a collision. Harmless where the scheduler would have moved it anyway, and a steered
  // worker that cannot run soon costs nothing but its chunks, which the caller takes over.
  void steer_off(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed_)) return;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (last_cpu_[i].load(std::memory_order_relaxed) != cpu) continue;
      cpu_set_t others = allowed_;
      CPU_CLR(cpu, &others);
      pthread_setaffinity_np(workers_[i].native_handle(), sizeof(others), &others);  // on failure: as before
      last_cpu_[i].store(-1, std::memory_order_relaxed);
    }
  }

  void loop(int index) {
    // Named, so that profilers and /proc/<pid>/task show whose time is whose (a thread inherits its creator's name).
    pthread_setname_np(pthread_self(), "kldiv_pool");
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      TaskFn fn = fn_;
      void* ctx = ctx_;
      const int nchunks = nchunks_, parts = parts_;
      lk.unlock();
      const uint32_t gen = static_cast<uint32_t>(seen);
      const int slot = claim_slot(gen, parts);
      if (slot != -2) work(gen, slot, parts, fn, ctx, nchunks);
      last_cpu_[index].store(sched_getcpu(), std::memory_order_relaxed);  // where it goes back to sleep
      lk.lock();
    }
  }

  std::vector<std::thread> workers_;
  std::unique_ptr<std::atomic<uint64_t>[]> runs_;  // per slot: the run of chunks its participant owns
  std::unique_ptr<std::atomic<int>[]> last_cpu_;    // per worker: the CPU it last went to sleep on, or -1
  cpu_set_t allowed_;
  bool steer_ = false;
  std::mutex region_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int nchunks_ = 0, parts_ = 0;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> slots_{0};  // generation << 32 | next slot to hand to a waking worker
  std::atomic<int> done_{0};
};

std::mutex g_pool_mu;
Pool* g_pool = nullptr;  // created on first parallel call; deliberately never destroyed (exit order)
int g_max_threads = 0;
int64_t g_parallel_min = kDefaultParallelMin;
bool g_steer = true;
int64_t g_prefetch = 0;

// Software prefetch distance (bytes ahead) for the forward sum's float32 vector loop (Args::prefetch). On the Intel
// VM we measure on, a single core reads DRAM below the socket's bandwidth (the hardware prefetchers keep too few lines
// in flight), and 2 KB ahead made the 32M forward sum ~13% faster (1.06 -> 0.91 of the read without it; 1 KB ahead
// 0.95, 4 KB 0.93). It made the backward slower (32M, d/dinput alone 1.34 -> 1.57) and did little for 'none' (1.70 -> 1.65):
// with write streams in flight, more reads cost. On an AMD VM, earlier trials of prefetch in the sum were slower.
// Hence the sum only, by default on Intel only; MS_KLDIV_PREFETCH=<bytes> sets it (0 = off). docs/cpu_aot.md,
// "Software prefetch".
int64_t default_prefetch() {
  const char* v = getenv("MS_KLDIV_PREFETCH");
  if (v && *v) {
    char* end = nullptr;
    const long long r = strtoll(v, &end, 10);
    if (end && *end == '\0' && r >= 0 && r <= (1 << 20)) return r;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) return 2048;
#endif
  return 0;
}

void init_limits() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_max_threads = env_int("MS_KLDIV_NUM_THREADS", available_cpus());
    g_parallel_min = env_int("MS_KLDIV_PARALLEL_MIN", static_cast<int>(kDefaultParallelMin));
    const char* steer = getenv("MS_KLDIV_STEER_WORKERS");
    g_steer = !(steer && strcmp(steer, "0") == 0);
    g_prefetch = default_prefetch();
    // A forked child has no pool threads: forget the parent's pool (leaked, its threads do not exist).
    pthread_atfork(nullptr, nullptr, [] { g_pool = nullptr; });
  });
}

Pool* pool() {
  init_limits();
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) g_pool = new Pool(g_max_threads - 1, g_steer);
  return g_pool;
}

// The widest ISA the CPU (and, for AVX-512, the OS: libgcc checks XCR0) supports, unless MS_KLDIV_ISA names a
// narrower one this CPU also runs: 'baseline', 'avx2' (tests compare the units; a user may prefer AVX2 on CPUs whose
// clock drops under 512-bit code).
const KernelTable* pick_table() {
  const char* force = getenv("MS_KLDIV_ISA");
  const bool want_base = force && strcmp(force, "baseline") == 0;
  const bool want_avx2 = force && strcmp(force, "avx2") == 0;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (want_base) return table_base();
  if (avx512 && !want_avx2) return table_avx512();
  if (avx2) return table_avx2();
#else
  (void)want_base;
  (void)want_avx2;
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

#ifdef KLDIV_DIAGNOSTICS
int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Start and end of the last call (CLOCK_MONOTONIC ns), for KLDivTakeLastSpan: two clock reads per call, so only in
// the diagnostics build.
std::atomic<int64_t> g_span_start{0}, g_span_end{0};
#endif

// want: kForward, or the backward's gradients (kWantDx / kWantDt / kWantBoth; see kldiv_abi.h).
int run(int want, int reduction, bool log_target, int nparam, void** params, int* ndims, int64_t** shapes,
        const char** dtypes) {
#ifdef KLDIV_DIAGNOSTICS
  const int64_t start = monotonic_ns();
#endif
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
  a.prefetch = g_prefetch;
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
#ifdef KLDIV_DIAGNOSTICS
  g_span_start.store(start);
  g_span_end.store(monotonic_ns());
#endif
  return 0;
}

}  // namespace

const KernelTable* active_table() { return table(); }

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
    snprintf(info, sizeof(info), "libkldiv_cpu abi=%d isa=%s threads=%d steer=%d prefetch=%lld libmvec=%d",
             KLDIV_ABI_VERSION, kldiv::cpu::table()->isa, kldiv::cpu::g_max_threads, kldiv::cpu::g_steer ? 1 : 0,
             static_cast<long long>(kldiv::cpu::g_prefetch),
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(KLDIV_NO_LIBMVEC)
             1
#else
             0
#endif
    );
  });
  return info;
}

// ---------------------------------------------------------------------------------------------------------------
// Diagnostics for the benchmark's studies and the pool's tests: only in libkldiv_cpu_diag.so (-DKLDIV_DIAGNOSTICS,
// built by ms_kldiv._build.ensure_library("CPU", diagnostics=True)); the production library exports the ABI alone.
#ifdef KLDIV_DIAGNOSTICS
// The start and end of the last kernel call that returned 0 (CLOCK_MONOTONIC, ns, in out[0] and out[1]); returns 1,
// or 0 when no call ended since the last take (out untouched). The benchmark brackets a timed MindSpore call with the
// same clock and splits it into what came before the kernel, the kernel, and what came after (docs/cpu_aot.md, "Where
// a call's time goes"). With calls on several threads at once, it is one of the latest.
KLDIV_EXPORT int KLDivTakeLastSpan(int64_t* out) {
  const int64_t end = kldiv::cpu::g_span_end.exchange(0);
  if (!end || !out) return 0;
  out[0] = kldiv::cpu::g_span_start.load();
  out[1] = end;
  return 1;
}

// The streaming roofline the benchmark compares against: read `n` elements of two float32 arrays once
// (the bytes a fused kl_div forward must read), on the same threads and pool as the kernels, with the same
// software prefetch as the forward sum (so that it stays the fastest read we know: docs/cpu_aot.md).
namespace {
struct ReadCtx {
  const float* a;
  const float* b;
  int64_t n;
  int64_t prefetch;
  double partial[256];
};

void read_task(void* vctx, int tid, int nth) {
  ReadCtx* c = static_cast<ReadCtx*>(vctx);
  const int64_t q = c->n / nth, r = c->n % nth;
  const int64_t b = q * tid + (tid < r ? tid : r), e = b + q + (tid < r ? 1 : 0);
  c->partial[tid] = kldiv::cpu::stream_read_slice(c->a, c->b, b, e, c->prefetch);
}
}  // namespace

KLDIV_EXPORT double KLDivStreamRead(const float* a, const float* b, int64_t n) {
  int nth = kldiv::cpu::threads_for(n);  // (reads the limits first)
  if (nth > 256) nth = 256;
  ReadCtx c{a, b, n, kldiv::cpu::g_prefetch, {}};
  kldiv::cpu::parallel_run(nth, &read_task, &c);
  double s = 0.0;
  for (int i = 0; i < nth; ++i) s += c.partial[i];
  return s;
}

// For tests of the pool: `runs` parallel runs of `nchunks` chunks, each chunk spinning for a time that grows with
// its index (so that the participants owning the first runs of chunks finish first and take from the others);
// returns how many chunks did not run exactly once (0 when the pool is right).
namespace {
struct PoolCheckCtx {
  std::atomic<int> count[256];
};
void pool_check_task(void* vctx, int chunk, int nchunks) {
  PoolCheckCtx* c = static_cast<PoolCheckCtx*>(vctx);
  volatile unsigned spin = 0;
  for (int i = 0; i < chunk * 50; ++i) spin = spin + 1;  // later chunks longer: the first runs finish first
  if (chunk >= 0 && chunk < nchunks && chunk < 256) c->count[chunk].fetch_add(1);
}
}  // namespace

KLDIV_EXPORT int KLDivPoolCheck(int nchunks, int runs) {
  if (nchunks < 1 || nchunks > 256) return -1;
  int bad = 0;
  for (int r = 0; r < runs; ++r) {
    PoolCheckCtx c;
    for (auto& k : c.count) k.store(0);
    kldiv::cpu::parallel_run(nchunks, &pool_check_task, &c);
    for (int i = 0; i < nchunks; ++i) bad += c.count[i].load() != 1;
  }
  return bad;
}
#endif  // KLDIV_DIAGNOSTICS
