// __half and __nv_bfloat16 of the CUDA stand-in: storage types with the conversions kernels use, rounding
// float -> half/bfloat16 to nearest even (subnormals, overflow to inf). A NaN converts to the canonical
// NaN the device returns (0x7fff for both types).
#pragma once

#include <stdint.h>
#include <string.h>

struct __half {
  uint16_t x;
};
struct __nv_bfloat16 {
  uint16_t x;
};

namespace cudasim {
static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
}  // namespace cudasim

static inline float __half2float(__half h) {
  const uint32_t s = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu;
  if (e == 0x1f) return cudasim::u2f(s | 0x7f800000u | (m << 13));
  if (e) return cudasim::u2f(s | ((e + 112) << 23) | (m << 13));
  // subnormal (or zero): exact in float
  const float v = (float)m * cudasim::u2f(0x33800000u);  // m * 2^-24
  return s ? -v : v;
}

static inline __half __float2half_rn(float f) {
  const uint32_t u = cudasim::f2u(f);
  const uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return __half{0x7fff};
  if (a >= 0x477ff000u) return __half{(uint16_t)(s | 0x7c00u)};  // rounds to >= 65520: inf
  if (a >= 0x38800000u) {                                         // normal half range (>= 2^-14)
    const uint32_t r = a - (112u << 23);                          // rebias exponent 127 -> 15
    const uint32_t q = r >> 13, rem = r & 0x1fffu;
    const uint32_t h = q + (rem > 0x1000u || (rem == 0x1000u && (q & 1u)));
    return __half{(uint16_t)(s | h)};
  }
  if (a < 0x33000000u) return __half{s};  // below 2^-25: rounds to zero (2^-25 itself is a tie to even 0)
  // subnormal half: value = m * 2^-24, m = round(a / 2^-24)
  const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // a = mant * 2^(e-150); m = mant >> (126 - e) ... exact shift below
  const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  const uint32_t h = q + (rem > half || (rem == half && (q & 1u)));
  return __half{(uint16_t)(s | h)};
}

static inline float __bfloat162float(__nv_bfloat16 b) { return cudasim::u2f((uint32_t)b.x << 16); }

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t u = cudasim::f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fff};
  return __nv_bfloat16{(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
