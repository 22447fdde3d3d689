// How fast can this machine read the bytes a fused float32 kl_div forward must read (two arrays, once)? On 1..T
// threads, each reading a contiguous slice of both arrays with the library's read loop (kldiv_stream_read.h, what
// the benchmark's roofline times), with and without software prefetch, on 4 KB pages (what MindSpore's tensors get)
// and on 2 MB pages (MADV_HUGEPAGE). It answers whether a target like "10x faster than ops.kl_div at 32M" is reachable
// at all on a machine: no forward can beat the fastest read it prints (docs/cpu_aot.md, "Software prefetch").
//
//   g++ -O3 -std=c++17 -march=native -pthread -o /tmp/read_bandwidth benchmarks/cpu/read_bandwidth.cc -I custom_ops/cpu
//   /tmp/read_bandwidth [elements=33554432] [reps=20] [ops_kl_div_ms]   # medians; with ops_kl_div_ms, the best
//                                                                        # ratio any forward could reach
//   /tmp/read_bandwidth --check   # every configuration reads every element exactly once (exit status 1 if not)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "kldiv_stream_read.h"  // custom_ops/cpu (build with -I custom_ops/cpu)

namespace {

struct Config {
  int threads;
  int prefetch_bytes;  // 0: none; else one prefetch per 64-byte line, this far ahead
};

// One read of both arrays on `threads` threads (the calling one included); returns milliseconds, stores the sum.
// Starting the helper threads is timed too (tens of microseconds, under 1% of a 32M read). (Pinning each thread to
// its own CPU was tried: no faster on this VM, and noisier.)
double timed_read(const float* a, const float* b, int64_t n, const Config& c, double* sum) {
  std::vector<float> part(c.threads, 0.f);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> helpers;
  for (int t = 1; t < c.threads; ++t)
    helpers.emplace_back([&, t] {
      part[t] = kldiv::cpu::stream_read_slice(a, b, n * t / c.threads, n * (t + 1) / c.threads, c.prefetch_bytes);
    });
  part[0] = kldiv::cpu::stream_read_slice(a, b, 0, n / c.threads, c.prefetch_bytes);
  for (auto& h : helpers) h.join();
  const auto t1 = std::chrono::steady_clock::now();
  *sum = 0.0;
  for (float p : part) *sum += p;
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// n floats on their own pages: 2 MB aligned, asking for 2 MB pages when `huge` (it stays on 4 KB pages where
// transparent huge pages are off).
float* alloc_floats(int64_t n, bool huge) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float), align = size_t(2) << 20;
  void* p = mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  char* q = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + align - 1) & ~(align - 1));
  madvise(q, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return reinterpret_cast<float*>(q);
}

int max_threads() {
  const unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int>(std::min(h, 64u)) : 1;
}

// Without prefetch on 1, 2, 4, ... threads and on all; prefetch distances only on all threads, where they might pay.
std::vector<Config> configs() {
  const int all = max_threads();
  std::vector<Config> out;
  for (int t = 1; t < all; t *= 2) out.push_back({t, 0});
  for (int pf : {0, 512, 2048}) out.push_back({all, pf});
  return out;
}

int check() {
  // Counts of ones are exact in float (far below 2^24 per accumulator), so a skipped or doubled element shows.
  int bad = 0;
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(1000003)}) {
    for (bool huge : {false, true}) {
      float* a = alloc_floats(n, huge);
      float* b = alloc_floats(n, huge);
      int64_t expect = 0;
      for (int64_t i = 0; i < n; ++i) {
        a[i] = i % 3 == 0 ? 1.f : 0.f;
        b[i] = i % 5 == 0 ? 1.f : 0.f;
        expect += (i % 3 == 0) + (i % 5 == 0);
      }
      for (const Config& c : configs()) {
        double s = 0.0;
        timed_read(a, b, n, c, &s);
        const bool ok = s == static_cast<double>(expect);
        bad += !ok;
        printf("n=%lld pages=%s threads=%d prefetch=%d sum=%.0f expect=%lld %s\n", static_cast<long long>(n),
               huge ? "2M" : "4K", c.threads, c.prefetch_bytes, s, static_cast<long long>(expect), ok ? "ok" : "MISMATCH");
      }
    }
  }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--check") == 0) return check();
  const int64_t n = argc > 1 ? atoll(argv[1]) : int64_t(32) << 20;
  const int reps = argc > 2 ? atoi(argv[2]) : 20;
  const double ops_ms = argc > 3 ? atof(argv[3]) : 0.0;
  if (n < 1 || reps < 1) {
    fprintf(stderr, "usage: %s [elements>0] [reps>0] [ops_kl_div_ms] | --check\n", argv[0]);
    return 2;
  }
  const double gb = 2.0 * n * sizeof(float) / 1e9;
  printf("# two float32 arrays of %lld elements (%.0f MB read per call), median of %d reads\n",
         static_cast<long long>(n), gb * 1e3, reps);
  double best = 1e300;
  for (bool huge : {false, true}) {
    float* a = alloc_floats(n, huge);
    float* b = alloc_floats(n, huge);
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] = 1.f;  // first touch: the pages exist before timing
    for (const Config& c : configs()) {
      std::vector<double> ms;
      double s = 0.0;
      timed_read(a, b, n, c, &s);  // warm-up
      for (int r = 0; r < reps; ++r) ms.push_back(timed_read(a, b, n, c, &s));
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      best = std::min(best, med);
      printf("pages=%s threads=%d prefetch=%-4d median %8.3f ms  %6.1f GB/s  (%5.1f GB/s per thread)\n",
             huge ? "2M" : "4K", c.threads, c.prefetch_bytes, med, gb / med * 1e3, gb / med * 1e3 / c.threads);
    }
  }
  if (ops_ms > 0)
    printf("fastest read %.3f ms: no forward can be more than %.2fx faster than %.3f ms\n", best, ops_ms / best, ops_ms);
  return 0;
}
