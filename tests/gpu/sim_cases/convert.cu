// Host-side access to the stand-in's __half / __nv_bfloat16 conversions, for the exhaustive tests.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT void half_to_float(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = __half2float(__half{in[i]});
}
EXPORT void float_to_half(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = __float2half_rn(in[i]).x;
}
EXPORT void bf16_to_float(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = __bfloat162float(__nv_bfloat16{in[i]});
}
EXPORT void float_to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = __float2bfloat16_rn(in[i]).x;
}
