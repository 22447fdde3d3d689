// Host-side float16 / bfloat16 <-> float conversions for the CPU kernels.
//
// Written as integer bit manipulation with selects instead of _Float16 or F16C intrinsics so that the
// same code compiles for every ISA the CPU library is built for and still vectorizes inside an
// `omp simd` loop. Rounding is to nearest-even, as IEEE-754 and MindSpore's own casts do; inf and NaN
// are preserved (a NaN stays a quiet NaN), overflow rounds to inf, tiny values to subnormals or zero.
// (CUDA code uses __half / __nv_bfloat16 instead.)
#pragma once

#include <stdint.h>
#include <string.h>

namespace kldiv {

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };

#define KLDIV_HALF_FN static inline __attribute__((always_inline))

KLDIV_HALF_FN float bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
KLDIV_HALF_FN uint32_t float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

// float16 -> float: moving exponent and mantissa into float position and scaling by 2^112 (the bias
// difference) is exact for normals; inf/NaN then get the all-ones exponent back. A float16 subnormal would be a
// float subnormal before the scaling, which a thread that treats subnormal operands as zero (MXCSR DAZ: MindSpore's
// graph runtime sets it) reads as 0: it is converted from its integer mantissa instead (m 2^-24, exact).
KLDIV_HALF_FN float f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t normal = float_to_bits(bits_to_float(em << 13) * 0x1p112f);
  const uint32_t tiny = float_to_bits((float)(int32_t)em * 0x1p-24f);
  const uint32_t scaled = em < 0x400u ? tiny : normal;
  const uint32_t special = em >= 0x7c00u ? 0x7f800000u : 0u;
  return bits_to_float(sign | scaled | special);
}

// float -> float16, round to nearest even.
KLDIV_HALF_FN uint16_t float_to_f16(float v) {
  uint32_t f = float_to_bits(v);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  // |v| >= 65536 (or inf/NaN): inf, or a quiet NaN.
  const uint32_t big = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // |v| < 2^-14: the float adder does the subnormal rounding for us (adding 0.5 aligns the mantissa).
  const uint32_t small = float_to_bits(bits_to_float(f) + 0.5f) - 0x3f000000u;
  // normal range: rebias the exponent and round to nearest even on the 13 dropped bits.
  const uint32_t normal = (f + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
  const uint32_t o = f >= 0x47800000u ? big : (f < 0x38800000u ? small : normal);
  return (uint16_t)(o | (sign >> 16));
}

KLDIV_HALF_FN float bf16_to_float(uint16_t h) { return bits_to_float((uint32_t)h << 16); }

// float -> bfloat16, round to nearest even; NaN stays a quiet NaN of the same sign.
KLDIV_HALF_FN uint16_t float_to_bf16(float v) {
  const uint32_t f = float_to_bits(v);
  const bool nan = (f & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
  return (uint16_t)(nan ? ((f >> 16) | 0x40u) : rounded);
}

// Uniform load/store used by the kernels: storage type T, compute type C. In an anonymous namespace so
// that each ISA translation unit of the CPU library keeps its own copy (see kldiv_math.h's KLDIV_HD).
namespace {
template <typename T> struct Io;
template <> struct Io<float> {
  using C = float;
  KLDIV_HALF_FN float load(const float* p, int64_t i) { return p[i]; }
  KLDIV_HALF_FN void store(float* p, int64_t i, float v) { p[i] = v; }
};
template <> struct Io<double> {
  using C = double;
  KLDIV_HALF_FN double load(const double* p, int64_t i) { return p[i]; }
  KLDIV_HALF_FN void store(double* p, int64_t i, double v) { p[i] = v; }
};
template <> struct Io<f16> {
  using C = float;
  KLDIV_HALF_FN float load(const f16* p, int64_t i) { return f16_to_float(p[i].bits); }
  KLDIV_HALF_FN void store(f16* p, int64_t i, float v) { p[i].bits = float_to_f16(v); }
};
template <> struct Io<bf16> {
  using C = float;
  KLDIV_HALF_FN float load(const bf16* p, int64_t i) { return bf16_to_float(p[i].bits); }
  KLDIV_HALF_FN void store(bf16* p, int64_t i, float v) { p[i].bits = float_to_bf16(v); }
};
}  // namespace

}  // namespace kldiv
