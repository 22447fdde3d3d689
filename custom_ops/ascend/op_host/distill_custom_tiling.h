// TilingData of DistillCustom and DistillCustomGrad (host -> kernel). The numbers come from
// op_kernel/distill_tiling_plan.h, which has no CANN dependency and is unit-tested on the CPU.
#ifndef DISTILL_CUSTOM_TILING_H_
#define DISTILL_CUSTOM_TILING_H_
#include "register/tilingdata_base.h"

namespace optiling {
// 64-bit fields first: the generated struct is packed in declaration order and the kernel reads it as-is.
BEGIN_TILING_DATA_DEF(DistillCustomTilingData)
  TILING_DATA_FIELD_DEF(uint64_t, rows);            // leading dims flattened
  TILING_DATA_FIELD_DEF(uint64_t, vocab);           // last dim
  TILING_DATA_FIELD_DEF(uint64_t, baseRows);        // rows per core; cores [0, remRows) take one more
  TILING_DATA_FIELD_DEF(uint32_t, remRows);
  TILING_DATA_FIELD_DEF(uint32_t, usedCores);       // == blockDim
  TILING_DATA_FIELD_DEF(uint32_t, tileLength);      // vocabulary elements per full tile
  TILING_DATA_FIELD_DEF(uint32_t, kind);            // distill_tiling::Kind (from beta and the divergence code)
  TILING_DATA_FIELD_DEF(uint32_t, teacherGrad);     // backward: 1 = write d_teacher too
  TILING_DATA_FIELD_DEF(uint32_t, softcap);         // 1 = the logits are soft-capped (cap tanh(scale z / cap))
  TILING_DATA_FIELD_DEF(float, invTemperature);     // 1 / T, rounded once from double
  TILING_DATA_FIELD_DEF(float, temperature);
  TILING_DATA_FIELD_DEF(float, tSquared);
  TILING_DATA_FIELD_DEF(float, beta);
  TILING_DATA_FIELD_DEF(float, logBeta);            // the log-mixture's log(w_t), log(w_s): JSD (beta, 1 - beta),
  TILING_DATA_FIELD_DEF(float, log1mBeta);          // skew KL (alpha, 1 - alpha), skew RKL (1 - alpha, alpha)
  TILING_DATA_FIELD_DEF(float, alpha);              // skew: the mixture's weight of P; symmetric: forward KL share
  // The logits' transform folded with 1/T (op_host/distill_hyper.h): x = z * preScale without a cap; with one,
  // u = z * preScale = scale z / cap, x = tanh(u) * postScale (postScale = cap / T). The raw logits' gradients are
  // the transformed ones' times gradScale (the scale), times sech^2(u) with a cap.
  TILING_DATA_FIELD_DEF(float, preScale);
  TILING_DATA_FIELD_DEF(float, postScale);
  TILING_DATA_FIELD_DEF(float, gradScale);
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(DistillCustom, DistillCustomTilingData)
REGISTER_TILING_DATA_CLASS(DistillCustomGrad, DistillCustomTilingData)
}  // namespace optiling
#endif  // DISTILL_CUSTOM_TILING_H_
