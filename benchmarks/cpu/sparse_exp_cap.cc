// What caps the stored-teacher forward (custom_ops/cpu/sparse_kernels.inc) on this CPU: its target is "forward <=
// 1.3x one read of the student logits" (python -m ms_kldiv.bench sparse, row read_once), and the forward must take
// one exponential per logit. At [rows, V] (default 4096 x 32000), on 1 and 2 threads, best of `reps`:
//   read          max over the logits (one read; float32, and bfloat16 as its 16-bit patterns widened)
//   exp L1        one inline exp per element (the kernel's 2^x: degree-5 polynomial + vscalefps) over a block kept
//                 in L1, as many elements as the logits: the arithmetic alone, no memory traffic
//   libmvec L1    the same with glibc's _ZGVeN16v_expf
//   read+exp      the kernel's loop alone: per 1024-element block, the exponentials of (x - block max), the next
//                 block's max taken in the same loop, a prefetch two blocks ahead (no ids, no statistics)
// read+exp / read is the best forward / read-once ratio this machine gives the kernel's method (docs/stored_teacher.md).
//
//   g++ -O3 -std=c++17 -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma -pthread \
//       -o /tmp/sparse_exp_cap benchmarks/cpu/sparse_exp_cap.cc -lmvec
//   /tmp/sparse_exp_cap [rows=4096] [V=32000] [reps=5]
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <thread>
#include <vector>

extern "C" __m512 _ZGVeN16v_expf(__m512);

static int64_t R = 4096, V = 32000;
static volatile float sink;

static inline __m512 exp2_16(__m512 x) {  // sparse_kernels.inc's sparse_exp2_16
  x = _mm512_max_ps(_mm512_set1_ps(-151.0f), x);
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(x, magic), magic);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3275768518e-03f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6755352843e-03f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5507154458e-02f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022119874e-01f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314696574e-01f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0000000716e+00f));
  return _mm512_scalef_ps(p, n);
}
template <class T> static inline __m512 ld(const T *p);
template <> inline __m512 ld<float>(const float *p) { return _mm512_loadu_ps(p); }
template <> inline __m512 ld<uint16_t>(const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

enum Mode { kRead, kExpL1, kLibmvecL1, kReadExp };

template <class T, Mode M>
static void work(const T *s, int64_t r0, int64_t r1) {
  const __m512 scale = _mm512_set1_ps(0.72134752f);  // log2(e) / T at T = 2
  __m512 acc = _mm512_setzero_ps();
  const int64_t B = 1024;
  for (int64_t r = r0; r < r1; ++r) {
    const T *row = s + r * V;
    if (M == kRead) {
      for (int64_t c = 0; c + 16 <= V; c += 16) acc = _mm512_max_ps(ld(row + c), acc);
    } else if (M == kExpL1 || M == kLibmvecL1) {
      for (int64_t b = 0; b + B <= V; b += B) {
        __m512 z0 = _mm512_setzero_ps(), z1 = z0;
        for (int64_t c = 0; c < B; c += 32) {
          const __m512 x0 = _mm512_mul_ps(_mm512_sub_ps(ld(s + c), acc), scale);
          const __m512 x1 = _mm512_mul_ps(_mm512_sub_ps(ld(s + c + 16), acc), scale);
          z0 = _mm512_add_ps(z0, M == kExpL1 ? exp2_16(x0) : _ZGVeN16v_expf(x0));
          z1 = _mm512_add_ps(z1, M == kExpL1 ? exp2_16(x1) : _ZGVeN16v_expf(x1));
        }
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_add_ps(z0, z1), _mm512_set1_ps(1e-30f)));
      }
    } else {
      __m512 m = _mm512_set1_ps(-INFINITY);
      for (int64_t c = 0; c + 16 <= (V < B ? V : B); c += 16) m = _mm512_max_ps(ld(row + c), m);
      for (int64_t b = 0; b + B <= V; b += B) {
        const int64_t n1 = V - b - B < 0 ? 0 : (V - b - B > B ? B : V - b - B);
        const __m512 bm = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        __m512 z0 = _mm512_setzero_ps(), z1 = z0, m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
        const T *x = row + b, *nx = row + b + B;
        int64_t c = 0;
        for (; c + 32 <= n1; c += 32) {
          __builtin_prefetch(reinterpret_cast<const void *>(reinterpret_cast<uintptr_t>(nx + c) + B * sizeof(T)));
          if (sizeof(T) == 4)
            __builtin_prefetch(reinterpret_cast<const void *>(reinterpret_cast<uintptr_t>(nx + c + 16) + B * sizeof(T)));
          m0 = _mm512_max_ps(ld(nx + c), m0);
          m1 = _mm512_max_ps(ld(nx + c + 16), m1);
          z0 = _mm512_add_ps(z0, exp2_16(_mm512_mul_ps(_mm512_sub_ps(ld(x + c), bm), scale)));
          z1 = _mm512_add_ps(z1, exp2_16(_mm512_mul_ps(_mm512_sub_ps(ld(x + c + 16), bm), scale)));
        }
        for (int64_t q = c; q + 16 <= n1; q += 16) m0 = _mm512_max_ps(ld(nx + q), m0);
        for (; c + 16 <= B; c += 16) z0 = _mm512_add_ps(z0, exp2_16(_mm512_mul_ps(_mm512_sub_ps(ld(x + c), bm), scale)));
        m = _mm512_max_ps(m0, m1);
        acc = _mm512_add_ps(acc, _mm512_add_ps(z0, z1));
      }
    }
  }
  sink = _mm512_reduce_add_ps(acc);
}

template <class T, Mode M>
static double best_ms(const T *s, int nt, int reps) {
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for (int i = 1; i < nt; ++i) th.emplace_back(work<T, M>, s, R * i / nt, R * (i + 1) / nt);
    work<T, M>(s, 0, R / nt);
    for (auto &t : th) t.join();
    const double d = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best = d < best ? d : best;
  }
  return best;
}

template <class T>
static void report(const char *name, const T *s, int nt, int reps) {
  const double read = best_ms<T, kRead>(s, nt, reps), l1 = best_ms<T, kExpL1>(s, nt, reps),
               mvec = best_ms<T, kLibmvecL1>(s, nt, reps), both = best_ms<T, kReadExp>(s, nt, reps);
  printf("%-8s %d thread(s): read %7.1f ms | exp L1 %7.1f ms | libmvec L1 %7.1f ms | read+exp %7.1f ms = %.2fx read\n",
         name, nt, read, l1, mvec, both, both / read);
}

int main(int argc, char **argv) {
  if (argc > 1) R = atoll(argv[1]);
  if (argc > 2) V = atoll(argv[2]);
  V = V / 1024 * 1024;  // whole blocks: every mode reads the same elements
  const int reps = argc > 3 ? atoi(argv[3]) : 5;
  float *s = static_cast<float *>(aligned_alloc(64, R * V * 4));
  uint16_t *h = static_cast<uint16_t *>(aligned_alloc(64, R * V * 2));
  for (int64_t i = 0; i < R * V; ++i) {
    s[i] = static_cast<float>((i * 2654435761u) % 1000) * 0.004f - 2.0f;
    uint32_t u;
    __builtin_memcpy(&u, &s[i], 4);
    h[i] = static_cast<uint16_t>(u >> 16);
  }
  printf("[%lld, %lld] (V rounded down to whole 1024-blocks)\n", (long long)R, (long long)V);
  for (int nt = 1; nt <= 2; ++nt) {
    report("float32", s, nt, reps);
    report("bfloat16", h, nt, reps);
  }
  free(s);
  free(h);
  return 0;
}
