// Diagnostics for the benchmark's studies and the pool's tests: only in libkldiv_cpu_diag.so (-DKLDIV_DIAGNOSTICS,
// built by ms_kldiv._build.ensure_library(_build.DIAGNOSTICS)); the production library exports the ABI alone, and
// this unit compiles to nothing there.
#include <stdint.h>
#include <time.h>

#include <atomic>

#include "../common/kldiv_abi.h"
#include "kldiv_cpu.h"
#include "kldiv_stream_read.h"

#ifdef KLDIV_DIAGNOSTICS

namespace {
// Start and end of the last call (CLOCK_MONOTONIC ns), for KLDivTakeLastSpan: two clock reads per call, so only in
// the diagnostics build.
std::atomic<int64_t> g_span_start{0}, g_span_end{0};
}  // namespace

namespace kldiv {
namespace cpu {
int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void record_span(int64_t start_ns, int64_t end_ns) {
  g_span_start.store(start_ns);
  g_span_end.store(end_ns);
}
}  // namespace cpu
}  // namespace kldiv

// The start and end of the last kernel call that returned 0 (CLOCK_MONOTONIC, ns, in out[0] and out[1]); returns 1,
// or 0 when no call ended since the last take (out untouched). The benchmark brackets a timed MindSpore call with the
// same clock and splits it into what came before the kernel, the kernel, and what came after (docs/cpu_aot.md, "Where
// a call's time goes"). With calls on several threads at once, it is one of the latest.
KLDIV_EXPORT int KLDivTakeLastSpan(int64_t* out) {
  const int64_t end = g_span_end.exchange(0);
  if (!end || !out) return 0;
  out[0] = g_span_start.load();
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
  ReadCtx c{a, b, n, kldiv::cpu::prefetch_bytes(), {}};
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
