// A 16-lane float type for AVX-512 (F, DQ, BW, VL), the twin of kldiv_simd_avx2.h's 8-lane one: the formulas of
// custom_ops/common/kldiv_math.h are instantiated on it (kldiv::loss<Lean16>, kldiv::grads<Lean16>), and its inline log
// is the same method with the same constants (kldiv_logf_table.h), evaluated by the same IEEE operations lane for lane,
// so each lane's log has the same bits as on AVX2 (1.54 ulp; the lean / exact flavours and the block checks are
// kldiv_simd_avx2.h's, see there). What the wider vectors buy: the kernels' float32 loops are bound by how many vector
// operations each element takes (docs/cpu_aot.md), and on cores with two 512-bit pipes an operation covers twice
// the lanes, which brings the forward from DRAM closer to the time it takes to read its bytes. Masks are mask
// registers: a compare is one instruction, a select one blend.
//
// Included only by isa_avx512.cc, inside that unit's own namespace.
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include <math.h>

#include <cmath>

#include "kldiv_logf_table.h"

extern "C" __m512 _ZGVeN16v_expf(__m512);  // glibc libmvec

namespace kldiv {
namespace simd_avx512 {

// A lane mask, stored negated where that is what one compare computes (as M8 in kldiv_simd_avx2.h: !(t <= 0)
// is `cmp NLE_UQ`, true for NaN).
struct M16 {
  __mmask16 k;
  bool inverted;  // the mask holds where k is 0
};

template <bool kExact>
struct Vec16 {
  __m512 v;
  Vec16() = default;
  Vec16(__m512 a) : v(a) {}                 // NOLINT: implicit on purpose
  Vec16(float s) : v(_mm512_set1_ps(s)) {}  // NOLINT: broadcast, so C(0) / C(1) in kldiv_math.h work
  static Vec16 load(const float* p) { return _mm512_loadu_ps(p); }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
};
using Lean16 = Vec16<false>;
using Exact16 = Vec16<true>;
// The names kldiv_kernels.inc uses.
using Lean = Lean16;
using Exact = Exact16;
constexpr int64_t kLanes = 16;

#define KLDIV_SIMD_FN static inline __attribute__((always_inline))
#define KLDIV_SIMD_T template <bool E> KLDIV_SIMD_FN

KLDIV_SIMD_T Vec16<E> operator+(Vec16<E> a, Vec16<E> b) { return _mm512_add_ps(a.v, b.v); }
KLDIV_SIMD_T Vec16<E> operator-(Vec16<E> a, Vec16<E> b) { return _mm512_sub_ps(a.v, b.v); }
KLDIV_SIMD_T Vec16<E> operator*(Vec16<E> a, Vec16<E> b) { return _mm512_mul_ps(a.v, b.v); }
KLDIV_SIMD_T Vec16<E> operator-(Vec16<E> a) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(INT32_MIN)));
}
KLDIV_SIMD_T M16 operator<=(Vec16<E> a, Vec16<E> b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_NLE_UQ), true}; }
KLDIV_SIMD_T M16 operator==(Vec16<E> a, Vec16<E> b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_NEQ_UQ), true}; }
KLDIV_SIMD_FN M16 operator!(M16 m) { return {m.k, !m.inverted}; }

// The lane-wise `m ? a : b` of kldiv_math.h: one blend (_mm512_mask_blend_ps(k, p, q) is k ? q : p).
KLDIV_SIMD_T Vec16<E> kselect(M16 m, Vec16<E> a, Vec16<E> b) {
  return m.inverted ? _mm512_mask_blend_ps(m.k, a.v, b.v) : _mm512_mask_blend_ps(m.k, b.v, a.v);
}
// As in kldiv_simd_avx2.h: the lean log takes t as it is; the exact one gets a harmless constant on lanes without mass.
KLDIV_SIMD_T Vec16<E> safe_target(M16 m, Vec16<E> t, bool log_target) {
  if (!E && !log_target) return t;
  return kselect(m, t, Vec16<E>(log_target ? 0.0f : 1.0f));
}

KLDIV_SIMD_T Vec16<E> mul_add(Vec16<E> a, Vec16<E> b, Vec16<E> c) { return _mm512_fmadd_ps(a.v, b.v, c.v); }

// kldiv_simd_avx2.h's log_split / log_poly on 16 lanes. vpermps on 16 lanes reads the low 4 bits
// of n = 8e + k, so each 8-entry table is repeated in both halves of its register.
struct LogParts {
  __m512 head;      // e*ln2 + log c
  __m512 r, r2, q;  // log1p(r) = r + r2 * q
};
KLDIV_SIMD_FN __m512 table16(const float* t8) { return _mm512_broadcast_f32x8(_mm256_load_ps(t8)); }
KLDIV_SIMD_FN LogParts log_parts(__m512 x) {
  namespace lt = kldiv::logf_table;
  const __m512i ix = _mm512_castps_si512(x);
  const __m512i tmp = _mm512_sub_epi32(ix, _mm512_set1_epi32(lt::kOffsetBits));
  const __m512i n = _mm512_srai_epi32(tmp, lt::kShift);  // 8e + k
  const __m512 z = _mm512_castsi512_ps(
      _mm512_sub_epi32(ix, _mm512_and_si512(tmp, _mm512_set1_epi32(static_cast<int>(0xff800000u)))));
  LogParts p;
  p.head = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n), _mm512_set1_ps(lt::kLn2Over8),
                           _mm512_permutexvar_ps(n, table16(lt::kLogT)));
  p.r = _mm512_fmsub_ps(z, _mm512_permutexvar_ps(n, table16(lt::kInvC)), _mm512_set1_ps(1.0f));
  p.r2 = _mm512_mul_ps(p.r, p.r);
  const __m512 c01 = _mm512_fmadd_ps(_mm512_set1_ps(lt::kC1), p.r, _mm512_set1_ps(lt::kC0));
  const __m512 c23 = _mm512_fmadd_ps(_mm512_set1_ps(lt::kC3), p.r, _mm512_set1_ps(lt::kC2));
  p.q = _mm512_fmadd_ps(c23, p.r2, c01);
  return p;
}
KLDIV_SIMD_FN __m512 log_normal(__m512 x) {
  const LogParts p = log_parts(x);
  return _mm512_add_ps(p.head, _mm512_fmadd_ps(p.r2, p.q, p.r));
}
// Every input, as logf defines it (the same steps as kldiv_simd_avx2.h's log_any, with mask registers).
KLDIV_SIMD_FN __m512 log_any(__m512 x) {
  const __m512 zero = _mm512_setzero_ps();
  const __mmask16 sub = _mm512_cmp_ps_mask(x, _mm512_set1_ps(1.17549435e-38f), _CMP_LT_OQ) &
                        _mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ);
  const __m512 xn = _mm512_mask_mul_ps(x, sub, x, _mm512_set1_ps(8388608.0f));  // * 2^23
  __m512 y = _mm512_mask3_fmadd_ps(_mm512_set1_ps(-23.0f), _mm512_set1_ps(0.693147180559945f), log_normal(xn), sub);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), _mm512_set1_ps(-INFINITY));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), _mm512_set1_ps(NAN));
  return _mm512_mask_add_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ), x, x);
}

// kldiv_simd_avx2.h's LeanLogDomain: what the lean log gets wrong where its value is used.
template <bool kNaN>
struct LeanLogDomain {
  __m512i lo = _mm512_set1_epi32(-1);
  __m512i hi = _mm512_set1_epi32(INT32_MIN);
  inline void add(__m512 x) {
    __m512i b = _mm512_castps_si512(x);
    if (kNaN) b = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
    lo = _mm512_min_epu32(lo, _mm512_sub_epi32(b, _mm512_set1_epi32(1)));
    hi = _mm512_max_epi32(hi, b);
  }
  inline bool ok() const {
    const __mmask16 normal = _mm512_cmpeq_epi32_mask(_mm512_max_epu32(lo, _mm512_set1_epi32(0x7fffff)), lo);
    const __mmask16 finite = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(0x7f800000), hi);
    return (normal & finite) == 0xffff;
  }
};

// kldiv_simd_avx2.h's LeanSumCheck: whether a lean block total stands for the exact pass's (see there for the bound).
template <int kMaxTerms>
struct LeanSumCheck {
  static_assert(kMaxTerms <= 4096, "the 2^-80 threshold is sized for blocks of at most 4096 terms");
  __m512i top = _mm512_setzero_si512();  // unsigned maximum of the targets' bits
  inline void add(__m512 t) { top = _mm512_max_epu32(top, _mm512_castps_si512(t)); }
  inline bool ok(double total) const {
    if (!std::isfinite(total) || _mm512_movepi32_mask(top) != 0) return false;
    return std::fabs(total) >= 0x1p-80 || _mm512_test_epi32_mask(top, top) == 0;
  }
};

KLDIV_SIMD_T Vec16<E> klog(Vec16<E> a) { return E ? log_any(a.v) : log_normal(a.v); }
KLDIV_SIMD_T Vec16<E> kexp(Vec16<E> a) { return _ZGVeN16v_expf(a.v); }

// kldiv_simd_avx2.h's DoubleSum on 16 lanes: two vectors of 8 doubles.
struct DoubleSum {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  inline void add(__m512 v) {
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
  }
  inline double total() const { return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi)); }
};

#undef KLDIV_SIMD_T
#undef KLDIV_SIMD_FN

}  // namespace simd_avx512
}  // namespace kldiv
