// The constants of the CPU kernels' inline float32 log, shared by every vector width (kldiv_simd_avx2.h,
// kldiv_simd_avx512.h), which evaluate the same operations lane for lane and so give the same bits.
// The method is described at log_split in kldiv_simd_avx2.h; tools/fit_logf.py prints these values.
#pragma once

#include <stdint.h>

namespace kldiv {
namespace logf_table {

constexpr int32_t kOffsetBits = 0x3f380000;  // bits of 0.71875: z = x / 2^e lies in [0.71875, 1.4375)
constexpr int kShift = 20;                   // (bits(x) - kOffsetBits) >> kShift == 8e + k, k the interval
constexpr float kLn2Over8 = 0.08664339780807495f;  // ln2/8 in float32 (L8)
// 1/c and log c - k ln2/8 of interval k (8 intervals: the low 3 bits of 8e + k index them)
alignas(32) constexpr float kInvC[8] = {1.3335720300674438f, 1.2306362390518188f, 1.1429083347320557f,
                                        1.0670031309127808f, 1.0f, 0.888969898223877f, 0.7998793721199036f,
                                        0.7273896932601929f};
alignas(32) constexpr float kLogT[8] = {-0.28786107897758484f, -0.2941747009754181f, -0.3068629801273346f,
                                        -0.3247841000556946f, -0.3465735912322998f, -0.315525084733963f,
                                        -0.29656603932380676f, -0.2882108688354492f};
// Q(r) = c0 + c1 r + c2 r^2 + c3 r^3, log1p(r) = r + r^2 Q(r) for |r| <= 1/16
constexpr float kC0 = -0.4999997615814209f, kC1 = 0.3333420157432556f, kC2 = -0.2505364716053009f,
                kC3 = 0.19638898968696594f;

}  // namespace logf_table
}  // namespace kldiv
