// The CPU library's thread pool (kldiv_pool.h): a small pool of std::threads owned by this library rather than
// OpenMP, because MindSpore, torch and numpy each may load their own OpenMP runtime into the process, and two
// runtimes competing for the same cores starve each other: each one's busy-waiting workers take the cores the
// other's need. Our workers sleep on a condition variable between calls, so they never spin against anyone else's.
// Small problems run on the calling thread (no wake-up cost at all).
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kldiv_pool.h"

namespace kldiv {
namespace cpu {
namespace {

// Below this many elements one thread wins (waking the pool costs more than the work saves); above, each thread
// gets at least kGrain elements. Overridable for experiments with MS_KLDIV_PARALLEL_MIN.
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
// from one shared counter made every thread jump at every chunk, and every jump starts a new stream from DRAM
// that the prefetchers must find again; docs/cpu_aot.md, "Chunk layout".) A participant whose run is used up takes
// the upper half of the largest run left (its last chunk when one is left), so a late or preempted worker still
// costs only the chunks it has not started. Chunk boundaries depend only on the problem size, so reductions add the
// same partial sums in the same order whatever the thread count or timing.
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

Pool* pool() {
  const PoolLimits& lim = pool_limits();
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) g_pool = new Pool(lim.max_threads - 1, lim.steer);
  return g_pool;
}

}  // namespace

const PoolLimits& pool_limits() {
  static const PoolLimits lim = [] {
    PoolLimits l;
    l.max_threads = env_int("MS_KLDIV_NUM_THREADS", available_cpus());
    l.parallel_min = env_int("MS_KLDIV_PARALLEL_MIN", static_cast<int>(kDefaultParallelMin));
    const char* steer = getenv("MS_KLDIV_STEER_WORKERS");
    l.steer = !(steer && strcmp(steer, "0") == 0);
    // A forked child has no pool threads: forget the parent's pool (leaked, its threads do not exist).
    pthread_atfork(nullptr, nullptr, [] { g_pool = nullptr; });
    return l;
  }();
  return lim;
}

void parallel_run(int nthreads, TaskFn fn, void* ctx) {
  if (nthreads <= 1) {
    fn(ctx, 0, 1);
    return;
  }
  pool()->run(nthreads, fn, ctx);
}

int threads_for(int64_t work) {
  if (work < pool_limits().parallel_min) return 1;
  // Chunks, not threads, and independent of the thread count (MS_KLDIV_NUM_THREADS=1 just runs them all
  // on the calling thread): the same input always gives the same partial sums in the same order.
  int64_t c = work / kGrain;
  if (c > 256) c = 256;
  return c < 2 ? 2 : static_cast<int>(c);
}

}  // namespace cpu
}  // namespace kldiv
