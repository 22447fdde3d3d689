// TilingData of SparseDistillCustom and SparseDistillCustomGrad (host -> kernel). The numbers come from
// op_kernel/sparse_tiling_plan.h, which has no CANN dependency and is unit-tested on the CPU.
#ifndef SPARSE_DISTILL_CUSTOM_TILING_H_
#define SPARSE_DISTILL_CUSTOM_TILING_H_
#include "register/tilingdata_base.h"

namespace optiling {
// 64-bit fields first: the generated struct is packed in declaration order and the kernel reads it as-is.
BEGIN_TILING_DATA_DEF(SparseDistillCustomTilingData)
  TILING_DATA_FIELD_DEF(uint64_t, rows);            // leading dims flattened
  TILING_DATA_FIELD_DEF(uint64_t, vocab);           // last dim of the logits
  TILING_DATA_FIELD_DEF(uint64_t, baseRows);        // rows per core; cores [0, remRows) take one more
  TILING_DATA_FIELD_DEF(uint32_t, remRows);
  TILING_DATA_FIELD_DEF(uint32_t, usedCores);       // == blockDim
  TILING_DATA_FIELD_DEF(uint32_t, tileLength);      // vocabulary elements per full tile
  TILING_DATA_FIELD_DEF(uint32_t, ids);             // K: last dim of ids and values
  TILING_DATA_FIELD_DEF(uint32_t, idLanes);         // K + 1 rounded up to 64 lanes
  TILING_DATA_FIELD_DEF(uint32_t, kind);            // sparse_tiling::Kind (from beta)
  TILING_DATA_FIELD_DEF(uint32_t, tail);            // 1: the teacher keeps its missing mass as a tail bucket
  TILING_DATA_FIELD_DEF(float, invTemperature);     // 1 / T, rounded once from double
  TILING_DATA_FIELD_DEF(float, temperature);
  TILING_DATA_FIELD_DEF(float, tSquared);
  TILING_DATA_FIELD_DEF(float, ratio);              // T0 / T: the teacher's logits are ratio * values
  TILING_DATA_FIELD_DEF(float, beta);
  TILING_DATA_FIELD_DEF(float, logBeta);            // log(beta), log1p(-beta): JSD only, from double
  TILING_DATA_FIELD_DEF(float, log1mBeta);
END_TILING_DATA_DEF;

REGISTER_TILING_DATA_CLASS(SparseDistillCustom, SparseDistillCustomTilingData)
REGISTER_TILING_DATA_CLASS(SparseDistillCustomGrad, SparseDistillCustomTilingData)
}  // namespace optiling
#endif  // SPARSE_DISTILL_CUSTOM_TILING_H_
