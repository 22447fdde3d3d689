// TilingData of KlDivCustom and KlDivCustomGrad (host -> kernel). The numbers themselves come from
// op_kernel/kl_div_tiling_plan.h, which has no CANN dependency and is unit-tested on the CPU.
#ifndef KL_DIV_CUSTOM_TILING_H_
#define KL_DIV_CUSTOM_TILING_H_
#include "register/tilingdata_base.h"

namespace optiling {
// 64-bit fields first: the generated struct is packed in declaration order and the kernel reads it as-is.
BEGIN_TILING_DATA_DEF(KlDivCustomTilingData)
  TILING_DATA_FIELD_DEF(uint64_t, totalLength);  // elements of x (== target, == dx, == dtarget)
  TILING_DATA_FIELD_DEF(uint64_t, baseChunks);   // kCoreAlign-element chunks per core
  TILING_DATA_FIELD_DEF(uint32_t, remChunks);    // cores [0, remChunks) carry one extra chunk
  TILING_DATA_FIELD_DEF(uint32_t, usedCores);    // == blockDim
  TILING_DATA_FIELD_DEF(uint32_t, tileLength);   // elements per full tile
  TILING_DATA_FIELD_DEF(uint32_t, logTarget);    // 0 | 1
  TILING_DATA_FIELD_DEF(uint32_t, reduction);    // kldiv_tiling::Reduction
  TILING_DATA_FIELD_DEF(float, scale);           // 1, 1/numel ('mean') or 1/x.shape[0] ('batchmean')
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(KlDivCustom, KlDivCustomTilingData)
REGISTER_TILING_DATA_CLASS(KlDivCustomGrad, KlDivCustomTilingData)
}  // namespace optiling
#endif  // KL_DIV_CUSTOM_TILING_H_
