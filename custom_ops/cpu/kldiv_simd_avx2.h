// An 8-lane float type for AVX2 + FMA, so that the formulas of custom_ops/common/kldiv_math.h are
// instantiated on whole vectors (kldiv::loss<F8>, kldiv::grads<F8>) instead of being restated here.
//
// Why not leave it to `omp simd` + libmvec: the kernels are bound by logf, and libmvec's _ZGVdN8v_logf
// is an out-of-line call (every live ymm register is spilled around it) with a 3.9 ulp maximum error.
// The inline log below is 1.54 ulp, and it comes in two flavours, chosen by the vector type:
//  * F8 (lean): exact for positive normal finite arguments, finite on every other bit pattern, no
//    per-vector test: targets without mass go in unmasked and their log is multiplied by 0 or selected
//    away. The kernels check a block's targets alongside (LeanLogDomain, 3-4 instructions per vector; for
//    sums LeanSumCheck, one) and run the block again with ExactF8 when a lane's log would be used but is
//    not exact (or, for sums, could move the total);
//  * ExactF8: every input as logf defines it (0, negative, subnormal, inf, NaN).
// Inline, the float32 forward takes fewer operations per element than through libmvec's calls (docs/cpu_aot.md).
//
// Included only by isa_avx2.cc, inside that unit's own namespace: these types and functions must never
// be merged with code compiled without -mavx2.
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include <math.h>

#include <cmath>

#include "kldiv_logf_table.h"

extern "C" __m256 _ZGVdN8v_expf(__m256);  // glibc libmvec

namespace kldiv {
namespace simd_avx2 {

// A lane mask. The comparison is stored negated when that is what the hardware computes in one instruction:
// kldiv_math.h writes the mass test as !(t <= 0), and a `cmp LE` followed by a NOT is three instructions
// where `cmp NLE_UQ` (true for NaN, as !(NaN <= 0) is) is one. `inverted` is a compile-time constant after
// inlining, so kselect's branch folds away.
struct M8 {
  __m256 v;
  bool inverted;  // the mask holds where v is all zeros
};

// 8 float lanes; kExact selects the log flavour (see above).
template <bool kExact>
struct Vec8 {
  __m256 v;
  Vec8() = default;
  Vec8(__m256 a) : v(a) {}                  // NOLINT: implicit on purpose
  Vec8(float s) : v(_mm256_set1_ps(s)) {}   // NOLINT: broadcast, so C(0) / C(1) in kldiv_math.h work
  static Vec8 load(const float* p) { return _mm256_loadu_ps(p); }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
};
using F8 = Vec8<false>;
using ExactF8 = Vec8<true>;
// The names kldiv_kernels.inc uses.
using Lean = F8;
using Exact = ExactF8;
constexpr int64_t kLanes = 8;

#define KLDIV_SIMD_FN static inline __attribute__((always_inline))
#define KLDIV_SIMD_T template <bool E> KLDIV_SIMD_FN

KLDIV_SIMD_T Vec8<E> operator+(Vec8<E> a, Vec8<E> b) { return _mm256_add_ps(a.v, b.v); }
KLDIV_SIMD_T Vec8<E> operator-(Vec8<E> a, Vec8<E> b) { return _mm256_sub_ps(a.v, b.v); }
KLDIV_SIMD_T Vec8<E> operator*(Vec8<E> a, Vec8<E> b) { return _mm256_mul_ps(a.v, b.v); }
KLDIV_SIMD_T Vec8<E> operator-(Vec8<E> a) { return _mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f)); }
// As the scalar operators: a <= b and a == b are false when a lane is NaN (so !(NaN <= 0) holds).
KLDIV_SIMD_T M8 operator<=(Vec8<E> a, Vec8<E> b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_NLE_UQ), true}; }
KLDIV_SIMD_T M8 operator==(Vec8<E> a, Vec8<E> b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_NEQ_UQ), true}; }
KLDIV_SIMD_FN M8 operator!(M8 m) { return {m.v, !m.inverted}; }

// The lane-wise `m ? a : b` of kldiv_math.h, in bit operations: with b == 0 (most uses) it folds to one
// AND/ANDNOT, and unlike blendv it needs no sign-bit mask (GCC re-derives one with an extra compare).
KLDIV_SIMD_T Vec8<E> kselect(M8 m, Vec8<E> a, Vec8<E> b) {
  return m.inverted ? _mm256_or_ps(_mm256_andnot_ps(m.v, a.v), _mm256_and_ps(m.v, b.v))
                    : _mm256_or_ps(_mm256_and_ps(m.v, a.v), _mm256_andnot_ps(m.v, b.v));
}
// Between t and a constant a blend is one instruction where the bit select is three.
// The lean log is finite on every bit pattern (see log_normal), so it takes t as it is: a lane without mass
// multiplies its log by 0 or is selected away (one blend less per vector).
KLDIV_SIMD_T Vec8<E> safe_target(M8 m, Vec8<E> t, bool log_target) {
  if (!E && !log_target) return t;
  const __m256 c = _mm256_set1_ps(log_target ? 0.0f : 1.0f);
  return m.inverted ? _mm256_blendv_ps(t.v, c, m.v) : _mm256_blendv_ps(c, t.v, m.v);
}

KLDIV_SIMD_T Vec8<E> mul_add(Vec8<E> a, Vec8<E> b, Vec8<E> c) { return _mm256_fmadd_ps(a.v, b.v, c.v); }

// log(x) for positive normal finite x: x = 2^e * z with z in [0.71875, 1.4375), split into 8 intervals k by the top 3
// significand bits of bits(x) - bits(0.71875). One arithmetic shift of that difference gives n = 8e + k: vpermps
// reads k from its low 3 bits, and n * ln2/8 + log_t[k] (log_t[k] = log c - k ln2/8) is e*ln2 + log c, so the
// same shift serves both. Each interval has a float c whose log is tabulated that way, and z = c (1 + r) with
// |r| <= 1/16, so log x = e*ln2 + log c + log1p(r), log1p(r) = r + r^2 * Q(r) with Q of degree 3. The two tables
// live in registers (one vpermps each), which leaves 7 multiply/FMA operations where a single polynomial over
// [-1/3, 1/3) needed 11. The interval holding 1 has c = 1 exactly (the table term is then exactly 0, r = z - 1:
// full relative accuracy near 1) and reaches up to 1.0625, so that next to it |log x| is never much smaller than
// |r| (r's rounding would otherwise show: 2.35 ulp with the split at 1.0234). Each other c is the float near the
// interval's centre for which log c and log_t are closest to floats. tools/fit_logf.py prints the
// tables and Q, which kldiv_logf_table.h holds (shared with kldiv_simd_avx512.h). Max error 1.54 ulp over every
// positive normal float, against float64 (libmvec: 3.9 ulp); tests/test_aot_kernel.py sweeps it. On any other bit
// pattern (0, negative, subnormal, inf, NaN) the result is wrong but finite: z always lands in [0.71875, 1.4375) and
// n in [-2048, 2047] (|n ln2/8| <= 178), which lets the kernels feed it targets without mass unmasked.
struct LogParts {
  __m256 head;  // e*ln2 + log c
  __m256 r, r2, q;  // log1p(r) = r + r2 * q
};
// log_parts in two steps: head and r (log_split), then the polynomial (log_poly).
KLDIV_SIMD_FN LogParts log_split(__m256 x) {
  namespace lt = kldiv::logf_table;
  const __m256i ix = _mm256_castps_si256(x);
  const __m256i tmp = _mm256_sub_epi32(ix, _mm256_set1_epi32(lt::kOffsetBits));  // bits of 0.71875
  const __m256i n = _mm256_srai_epi32(tmp, lt::kShift);                          // 8e + k
  const __m256 z = _mm256_castsi256_ps(
      _mm256_sub_epi32(ix, _mm256_and_si256(tmp, _mm256_set1_epi32(static_cast<int>(0xff800000u)))));
  LogParts p;
  p.head = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), _mm256_set1_ps(lt::kLn2Over8),
                           _mm256_permutevar8x32_ps(_mm256_load_ps(lt::kLogT), n));
  p.r = _mm256_fmsub_ps(z, _mm256_permutevar8x32_ps(_mm256_load_ps(lt::kInvC), n), _mm256_set1_ps(1.0f));
  return p;
}
KLDIV_SIMD_FN LogParts log_poly(LogParts p) {
  namespace lt = kldiv::logf_table;
  p.r2 = _mm256_mul_ps(p.r, p.r);
  const __m256 c01 = _mm256_fmadd_ps(_mm256_set1_ps(lt::kC1), p.r, _mm256_set1_ps(lt::kC0));
  const __m256 c23 = _mm256_fmadd_ps(_mm256_set1_ps(lt::kC3), p.r, _mm256_set1_ps(lt::kC2));
  p.q = _mm256_fmadd_ps(c23, p.r2, c01);  // Estrin: two FMA levels, not three
  return p;
}
KLDIV_SIMD_FN LogParts log_parts(__m256 x) { return log_poly(log_split(x)); }
KLDIV_SIMD_FN __m256 log_normal(__m256 x) {
  const LogParts p = log_parts(x);
  return _mm256_add_ps(p.head, _mm256_fmadd_ps(p.r2, p.q, p.r));
}
// Every input, as logf defines it: subnormals are scaled into the normal range first, then
// 0 -> -inf, negative -> NaN, +inf -> +inf, NaN -> NaN.
KLDIV_SIMD_FN __m256 log_any(__m256 x) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 sub = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ),
                                   _mm256_cmp_ps(x, zero, _CMP_GT_OQ));
  const __m256 xn = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), sub);  // * 2^23
  __m256 y = _mm256_fmadd_ps(_mm256_and_ps(sub, _mm256_set1_ps(-23.0f)), _mm256_set1_ps(0.693147180559945f),
                             log_normal(xn));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(-INFINITY), _mm256_cmp_ps(x, zero, _CMP_EQ_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(NAN), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_NLT_UQ));
}

// Whether a lean pass computed what the exact one would have. The lean log is finite on every bit pattern and
// exact on positive normal floats; a lane with t <= 0 has no mass and its log is multiplied by 0 or selected
// away. Left are positive subnormals (bits 1..0x7fffff: the unsigned minimum of bits - 1 stays >= 0x7fffff
// otherwise, +0 wrapping to the top), +inf (bits 0x7f800000: the signed maximum, which negative lanes never
// raise), and NaN targets. A forward term multiplies its log by t, so a NaN target is NaN anyway and only
// +NaN is caught (with +inf); a gradient uses the log itself (kNaN): the sign bit is dropped first, so NaN of
// either sign is caught, and negative subnormals and -inf go to the exact pass too (harmless: rare, and the
// exact pass is always right). Three or four instructions per vector. (Sums check less: LeanSumCheck.)
template <bool kNaN>
struct LeanLogDomain {
  __m256i lo = _mm256_set1_epi32(-1);
  __m256i hi = _mm256_set1_epi32(INT32_MIN);
  inline void add(__m256 x) {
    __m256i b = _mm256_castps_si256(x);
    if (kNaN) b = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
    lo = _mm256_min_epu32(lo, _mm256_sub_epi32(b, _mm256_set1_epi32(1)));
    hi = _mm256_max_epi32(hi, b);
  }
  inline bool ok() const {
    const __m256i normal = _mm256_cmpeq_epi32(_mm256_max_epu32(lo, _mm256_set1_epi32(0x7fffff)), lo);
    const __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f800000), hi);
    return _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_and_si256(normal, finite))) == 0xff;
  }
};

// Whether a lean block total of accumulate_loss_term (kldiv_math.h) stands for the exact pass's, for at most kMaxTerms
// terms. The lean terms weigh each target by itself, so a target with the sign bit set (negative, -0, -NaN) sends the
// block to the exact pass, which weighs it by 0; so do non-finite totals (inf/NaN in a target, or an infinite input).
// The lean log is exact on positive normal targets; on a positive subnormal one it is finite but wrong by at most 282
// (|n ln2/8| <= 178 above, the true log >= -104), so that term is off by at most 282 * FLT_MIN = 3.4e-36. A total of
// magnitude >= 2^-80 (8.3e-25) is therefore within kMaxTerms * 3.4e-36 / 2^-80 relative of the exact one (4e-9 for 1024
// terms: below float32 rounding), and a block whose targets are all +0 sums to an exact 0; what is left goes to the
// exact pass. One unsigned max of the bits per vector covers all of it, and takes the place of masking the weight.
template <int kMaxTerms>
struct LeanSumCheck {
  static_assert(kMaxTerms <= 4096, "the 2^-80 threshold is sized for blocks of at most 4096 terms");
  __m256i top = _mm256_setzero_si256();  // unsigned maximum of the targets' bits: sign bit set when any target's is
  inline void add(__m256 t) { top = _mm256_max_epu32(top, _mm256_castps_si256(t)); }
  inline bool ok(double total) const {
    if (!std::isfinite(total) || _mm256_movemask_ps(_mm256_castsi256_ps(top)) != 0) return false;
    return std::fabs(total) >= 0x1p-80 || _mm256_testz_si256(top, top);
  }
};

KLDIV_SIMD_T Vec8<E> klog(Vec8<E> a) { return E ? log_any(a.v) : log_normal(a.v); }
KLDIV_SIMD_T Vec8<E> kexp(Vec8<E> a) { return _ZGVdN8v_expf(a.v); }

// A float32 sum accumulated in double: each vector of short float partials (kldiv_kernels.inc's runs of kRun terms)
// is widened into two vectors of 4 doubles (one conversion each; the upper half takes one extract). A long float32
// partial rounds at its own magnitude, which for terms of both signs can be far above the total's: then the sum is
// off by the partials' rounding, not the terms'.
struct DoubleSum {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  inline void add(__m256 v) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  inline double total() const {
    const __m256d s = _mm256_add_pd(lo, hi);
    const __m128d s1 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s1, _mm_unpackhi_pd(s1, s1)));
  }
};

#undef KLDIV_SIMD_T
#undef KLDIV_SIMD_FN

}  // namespace simd_avx2
}  // namespace kldiv
