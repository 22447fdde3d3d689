// Times the fused float32 forward sum from DRAM on several threads under two ways of handing a problem's chunks to
// the threads, each call paired with a streaming read of the same buffers (docs/cpu_aot.md, "Threads"):
//   round-robin  chunk i goes to whichever thread asks next (one shared counter: the library's pool until
//                2026-11-22), so every thread jumps ahead at every chunk;
//   contiguous   each thread owns a run of consecutive chunks and walks it in order (the library's pool now, which
//                also lets a thread whose run is used up take half of another's).
// The chunks, their partial sums and the order of adding those are the same either way; only who computes which
// chunk when differs. The loop inside a chunk is the kernel's (blocks of 1024 of the shipped lean-sum loop, block
// totals in double). The buffers get 4 KB pages, like MindSpore's tensors.
//
//   g++ -O3 -std=c++17 -mavx2 -mfma -pthread -o /tmp/chunk_layout custom_ops/cpu/tools/chunk_layout.cc
//   /tmp/chunk_layout [rounds] [threads]   # 32M elements: per round, the median over 24 pairs of time / read time
//   /tmp/chunk_layout --check              # every layout gives the one-thread sum, bit for bit (exit status 1 if not)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "lean_sum_loop.h"

namespace {
using namespace kldiv_tools;

// One chunk as the kernel computes it.
double chunk_sum(const float* x, const float* t, int64_t b, int64_t e) {
  double s = 0.0;
  for (int64_t i = b; i < e; i += 1024) s += shipped(x + i, t + i, std::min<int64_t>(1024, e - i));
  return s;
}
// One chunk of the streaming read (what KLDivStreamRead does per chunk).
double chunk_read(const float* x, const float* t, int64_t b, int64_t e) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t i = b; i < e; i += 16) {
    a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(t + i)));
    a1 = _mm256_add_ps(a1, _mm256_add_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(t + i + 8)));
  }
  return hsum(_mm256_add_ps(a0, a1));
}
typedef double (*ChunkFn)(const float*, const float*, int64_t, int64_t);

enum Layout { kRoundRobin, kContiguous };

// Runs fn over n / chunk chunks on `threads` threads (the caller is one of them); the sum of the partials in order.
double run(Layout layout, ChunkFn fn, const float* x, const float* t, int64_t n, int64_t chunk, int threads) {
  const int nchunks = static_cast<int>(n / chunk);
  std::vector<double> partial(nchunks);
  std::atomic<int> next{0};
  auto work = [&](int id) {
    if (layout == kRoundRobin) {
      for (int c; (c = next.fetch_add(1)) < nchunks;) partial[c] = fn(x, t, c * chunk, (c + 1) * chunk);
    } else {
      for (int c = id * nchunks / threads; c < (id + 1) * nchunks / threads; ++c)
        partial[c] = fn(x, t, c * chunk, (c + 1) * chunk);
    }
  };
  std::vector<std::thread> helpers;
  for (int id = 1; id < threads; ++id) helpers.emplace_back(work, id);
  work(0);
  for (auto& h : helpers) h.join();
  double s = 0.0;
  for (double p : partial) s += p;
  return s;
}

struct Variant {
  const char* name;
  Layout layout;
  int64_t chunk;
};
// 128K elements: the library's chunk at 32M (256 chunks); 32K: its chunk up to 8M elements (kGrain).
const Variant kVariants[] = {
    {"round-robin, chunks of 128K", kRoundRobin, 1 << 17},
    {"contiguous,  chunks of 128K", kContiguous, 1 << 17},
    {"round-robin, chunks of 32K", kRoundRobin, 1 << 15},
    {"contiguous,  chunks of 32K", kContiguous, 1 << 15},
};

float* buffer(int64_t n) {
  void* p = aligned_alloc(4096, static_cast<size_t>(n) * sizeof(float));
  if (!p) abort();
  madvise(p, static_cast<size_t>(n) * sizeof(float), MADV_NOHUGEPAGE);
  return static_cast<float*>(p);
}

int check() {
  int bad = 0;
  const int64_t n = 1 << 20;
  float* x = buffer(n);
  float* t = buffer(n);
  fill_data(x, t, n, 7);
  for (const int64_t chunk : {int64_t(1) << 12, int64_t(1) << 15}) {
    const double one = run(kContiguous, chunk_sum, x, t, n, chunk, 1);
    for (const Layout layout : {kRoundRobin, kContiguous}) {
      for (int threads : {2, 3}) {
        const double s = run(layout, chunk_sum, x, t, n, chunk, threads);
        bad += s != one;
        printf("%-11s chunks of %-6lld threads=%d  %.17g %s\n", layout == kRoundRobin ? "round-robin" : "contiguous",
               static_cast<long long>(chunk), threads, s, s == one ? "ok" : "MISMATCH");
      }
    }
  }
  free(x);
  free(t);
  return bad ? 1 : 0;
}

void table(int rounds, int threads) {
  const int64_t n = int64_t(1) << 25;
  float* x = buffer(n);
  // Some slack between the two arrays: exactly 128 MB apart, this VM's fused pass ran 1.3-2x slower (docs).
  float* t_mem = buffer(n + 3 * 1024);
  float* t = t_mem + 3 * 1024;
  fill_data(x, t, n, 1);
  printf("32M float32 elements, %d threads; per round, median over 24 pairs of (layout's time / read's time)\n", threads);
  for (int r = 0; r < rounds; ++r) {
    for (const Variant& v : kVariants) {
      std::vector<double> ratio, kt, rt;
      // Seconds of one call of `fn` over the buffers in `layout`.
      auto timed = [&](Layout layout, ChunkFn fn, int64_t chunk) {
        const double t0 = now();
        run(layout, fn, x, t, n, chunk, threads);
        return now() - t0;
      };
      for (int i = 0; i < 24; ++i) {
        double a, b;
        if (i & 1) {
          a = timed(v.layout, chunk_sum, v.chunk);
          b = timed(kContiguous, chunk_read, 1 << 17);
        } else {
          b = timed(kContiguous, chunk_read, 1 << 17);
          a = timed(v.layout, chunk_sum, v.chunk);
        }
        ratio.push_back(a / b);
        kt.push_back(a);
        rt.push_back(b);
      }
      std::sort(ratio.begin(), ratio.end());
      std::sort(kt.begin(), kt.end());
      std::sort(rt.begin(), rt.end());
      printf("round %d  %-30s %.3fx  (quartiles %.3f-%.3f)  sum %.2f ms, read %.2f ms (medians)\n", r + 1, v.name,
             ratio[12], ratio[6], ratio[18], kt[12] * 1e3, rt[12] * 1e3);
      fflush(stdout);
    }
  }
  free(x);
  free(t_mem);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--check") == 0) return check();
  table(argc > 1 ? atoi(argv[1]) : 3, argc > 2 ? atoi(argv[2]) : 2);
  return 0;
}
