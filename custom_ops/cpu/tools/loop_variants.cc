// Times the float32 lean-sum loop of the CPU kernel (kldiv_kernels.inc, run_sum with F8) against reordered forms
// of the same arithmetic, a form with a shorter chain and one with one FMA fewer, and a synthetic loop that shows
// what one core's vector unit sustains. The question it answers (docs/cpu_aot.md): is the loop at the core's
// limit, and what does it respond to: the number of operations, or the length of their chain?
// Every variant takes its log from kldiv_simd_avx2.h (log_split / log_poly / log_parts_sub), so nothing is restated,
// except the degree-2 polynomial, whose difference from log_poly is what it times.
//
//   g++ -O3 -std=c++17 -mavx2 -mfma -o /tmp/loop_variants custom_ops/cpu/tools/loop_variants.cc
//   /tmp/loop_variants           # table: medians of interleaved rounds, relative to the shipped loop
//   /tmp/loop_variants --check   # the variants compute the shipped loop's sum (exit status 1 if not)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "lean_sum_loop.h"

namespace {
using namespace kldiv_tools;

struct Front {
  __m256 t, x;
  LogParts p;  // head and r (log_split)
};
static inline __attribute__((always_inline)) Front front(const float* x, const float* t, int64_t i, Check& c) {
  Front f;
  f.t = _mm256_loadu_ps(t + i);
  f.x = _mm256_loadu_ps(x + i);
  c.add(f.t);
  f.p = log_split(f.t);
  return f;
}
static inline __attribute__((always_inline)) __m256 back(const Front& f, __m256 acc) {
  return _mm256_fmadd_ps(f.t, log_parts_sub(log_poly(f.p), f.x), acc);
}

// Software-pipelined: the loads, integer steps, lookups and r of vector i+1 are issued before the polynomial of i.
__attribute__((noinline)) float pipelined(const float* x, const float* t, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  Check c;
  Front a = front(x, t, 0, c);
  for (int64_t i = 8; i < n; i += 8) {
    const Front b = front(x, t, i, c);
    acc = back(a, acc);
    a = b;
  }
  const float s = hsum(back(a, acc));
  return c.ok(s) ? s : -1.0f;
}

// The loads of vector i+1 are issued (into registers) before vector i is computed.
__attribute__((noinline)) float loads_ahead(const float* x, const float* t, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  Check c;
  __m256 tn = _mm256_loadu_ps(t), xn = _mm256_loadu_ps(x);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 tv = tn, xv = xn;
    if (i + 8 < n) {
      tn = _mm256_loadu_ps(t + i + 8);
      xn = _mm256_loadu_ps(x + i + 8);
    }
    c.add(tv);
    acc = kldiv::accumulate_loss_term<F8>(acc, xv, tv).v;
  }
  const float s = hsum(acc);
  return c.ok(s) ? s : -1.0f;
}

// Two vectors per iteration into two accumulators (n a multiple of 16). Its sum rounds differently.
__attribute__((noinline)) float two_accumulators(const float* x, const float* t, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  Check c;
  for (int64_t i = 0; i < n; i += 16) {
    const Front a = front(x, t, i, c), b = front(x, t, i + 8, c);
    acc0 = back(a, acc0);
    acc1 = back(b, acc1);
  }
  const float s = hsum(_mm256_add_ps(acc0, acc1));
  return c.ok(s) ? s : -1.0f;
}

// The polynomial's part into a second accumulator: t * (r + head - y) into one, (t * r2) * q into the other. One
// operation more than the shipped loop (t * r2), and the chain from r to an accumulator 4 cycles shorter (q feeds
// the accumulating FMA directly instead of the FMA that adds r2 * q to the rest). Its sum rounds differently.
__attribute__((noinline)) float split_chain(const float* x, const float* t, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  Check c;
  for (int64_t i = 0; i < n; i += 8) {
    const Front f = front(x, t, i, c);
    const LogParts p = log_poly(f.p);
    acc0 = _mm256_fmadd_ps(f.t, _mm256_add_ps(p.r, _mm256_sub_ps(p.head, f.x)), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_mul_ps(f.t, p.r2), p.q, acc1);
  }
  const float s = hsum(_mm256_add_ps(acc0, acc1));
  return c.ok(s) ? s : -1.0f;
}

// Q of degree 2 instead of 3: one FMA fewer, chain as long. Its polynomial is written here, not taken from
// log_poly: other coefficients and one term fewer are the point. Timing only: with these Taylor coefficients its
// log is 49 ulp off at worst (x near 1.0625, where r = 1/16; degree 3 with the fitted Q: 1.54 ulp), and a degree-2
// minimax fit over |r| <= 1/16 would still leave ~5e-8 absolute by the Chebyshev estimate (not fitted), about ten
// ulp next to 1. That is why the kernel keeps degree 3. On the check's data its sum differs from the shipped one's
// at the 1e-7 level.
__attribute__((noinline)) float degree2(const float* x, const float* t, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  Check c;
  for (int64_t i = 0; i < n; i += 8) {
    const Front f = front(x, t, i, c);
    LogParts p = f.p;
    p.r2 = _mm256_mul_ps(p.r, p.r);
    const __m256 c01 = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 3), p.r, _mm256_set1_ps(-0.5f));
    p.q = _mm256_fmadd_ps(_mm256_set1_ps(-0.25f), p.r2, c01);
    acc = _mm256_fmadd_ps(f.t, log_parts_sub(p, f.x), acc);
  }
  const float s = hsum(acc);
  return c.ok(s) ? s : -1.0f;
}

using Variant = float (*)(const float*, const float*, int64_t);
struct Named {
  const char* name;
  Variant f;
  bool same_order;  // adds the terms in the shipped loop's order: must give its bits
};
const Named kVariants[] = {
    {"shipped", shipped, true},
    {"software-pipelined (front of i+1 before the polynomial of i)", pipelined, true},
    {"loads one vector ahead", loads_ahead, true},
    {"two vectors per iteration, two accumulators", two_accumulators, false},
    {"polynomial part into its own accumulator (+1 op, chain -4 cycles)", split_chain, false},
    {"Q of degree 2 (-1 FMA; not accurate enough to ship)", degree2, false},
};

// What the vector unit sustains: 8 independent FMA chains (2 per cycle at most: 4-cycle latency, two FMA units),
// optionally with 8 independent integer adds per iteration on top.
template <bool kInt>
__attribute__((noinline)) float synthetic(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m256i w_acc = _mm256_setzero_si256();
  const __m256 k = _mm256_set1_ps(1.0001f);
  const __m256i one = _mm256_set1_epi32(3);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(p + i);
    a0 = _mm256_fmadd_ps(v, k, a0), a1 = _mm256_fmadd_ps(v, k, a1), a2 = _mm256_fmadd_ps(v, k, a2);
    a3 = _mm256_fmadd_ps(v, k, a3), a4 = _mm256_fmadd_ps(v, k, a4), a5 = _mm256_fmadd_ps(v, k, a5);
    a6 = _mm256_fmadd_ps(v, k, a6), a7 = _mm256_fmadd_ps(v, k, a7);
    if (kInt) {
      __m256i w = _mm256_castps_si256(v);
      for (int j = 0; j < 8; ++j) {
        w = _mm256_add_epi32(w, one);
        asm("" : "+x"(w));  // keeps the 8 adds (GCC would fold them into one)
      }
      w_acc = _mm256_xor_si256(w_acc, w);
    }
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  return hsum(_mm256_add_ps(s, _mm256_castsi256_ps(w_acc)));
}

int check() {
  int bad = 0;
  for (int64_t n : {16, 1024, 4096, 65536}) {
    std::vector<float> x(n), t(n);
    fill_data(x, t, static_cast<uint32_t>(n));
    const float ref = shipped(x.data(), t.data(), n);
    for (const Named& v : kVariants) {
      const float s = v.f(x.data(), t.data(), n);
      const bool ok = v.same_order ? memcmp(&s, &ref, sizeof s) == 0 : std::fabs(s - ref) <= 1e-6f * std::fabs(ref);
      printf("n=%-6lld %-68s %.9g %s\n", static_cast<long long>(n), v.name, s, ok ? "ok" : "MISMATCH");
      bad += !ok;
    }
  }
  return bad ? 1 : 0;
}

// Median time per 8 elements over interleaved rounds, in units of 1/2.7 GHz (a dependent-add chain's estimate of
// this VM's clock; only ratios between rows matter).
void table() {
  const int kRounds = 40;
  printf("| loop (float32 lean sum, one core) | 2K elements (L1) | 32K elements (L2) |\n|---|---:|---:|\n");
  double base[2] = {0, 0};
  std::vector<std::vector<double>> med(std::size(kVariants), std::vector<double>(2));
  const int64_t sizes[2] = {2048, 32768};
  for (int s = 0; s < 2; ++s) {
    const int64_t n = sizes[s];
    std::vector<float> x(n), t(n);
    fill_data(x, t, 1);
    const int reps = static_cast<int>(4000000 / n);
    std::vector<std::vector<double>> units(std::size(kVariants));
    for (int round = 0; round < kRounds; ++round) {
      for (size_t v = 0; v < std::size(kVariants); ++v) {
        volatile float sink = 0;
        const double t0 = now();
        for (int r = 0; r < reps; ++r) sink = sink + kVariants[v].f(x.data(), t.data(), n);
        units[v].push_back((now() - t0) * 2.7e9 / (static_cast<double>(n) * reps / 8));
      }
    }
    for (size_t v = 0; v < std::size(kVariants); ++v) {
      std::sort(units[v].begin(), units[v].end());
      med[v][s] = units[v][units[v].size() / 2];
    }
    base[s] = med[0][s];
  }
  for (size_t v = 0; v < std::size(kVariants); ++v)
    printf("| %s | %.2f (%.2f units) | %.2f (%.2f units) |\n", kVariants[v].name, med[v][0] / base[0], med[v][0],
           med[v][1] / base[1], med[v][1]);
  std::vector<float> p(2048, 0.5f);
  const int reps = 2000;
  double best[2] = {1e30, 1e30};
  for (int round = 0; round < 15; ++round) {
    for (int k = 0; k < 2; ++k) {
      volatile float sink = 0;
      const double t0 = now();
      for (int r = 0; r < reps; ++r) sink = sink + (k ? synthetic<true> : synthetic<false>)(p.data(), 2048);
      best[k] = std::min(best[k], (now() - t0) * 2.7e9 / (2048.0 * reps / 8));
    }
  }
  printf("\nsynthetic, per iteration: 8 FMAs %.2f units; 8 FMAs + 8 integer adds %.2f units (17 vector ops)\n",
         best[0], best[1]);
  printf("the lean loop issues 18 vector ops per 8 elements (8 on the FMA units)\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--check") == 0) return check();
  table();
  return 0;
}
