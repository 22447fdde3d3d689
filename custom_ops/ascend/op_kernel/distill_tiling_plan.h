// Tiling plan for DistillCustom / DistillCustomGrad (distillation from logits, fused): how the rows are split
// over the vector cores and how a row's vocabulary is cut into tiles that fit the unified buffer (UB).
//
// No CANN dependency, as kl_div_tiling_plan.h: the host tiling function, the kernels (which recompute each core's
// row range with the same function) and the CPU tests (through tests/ascend/ascendc_sim/distill_sim_driver.cpp) include it.
#ifndef DISTILL_ASCEND_TILING_PLAN_H_
#define DISTILL_ASCEND_TILING_PLAN_H_

#include "tiling_common.h"

namespace distill_tiling {

using tiling_common::ComputeCount;
using tiling_common::kApiUbReserveBytes;
using tiling_common::kBufferNum;
using tiling_common::kComputeAlign;
using tiling_common::kMaxTile;
using tiling_common::kTileAlign;
using tiling_common::TileCount;  // of one row

// Our small buffers: scalar exchange (256 B), one stats row (32 B), the row's incoming gradient (32 B) and the
// fixed part of the reduction work area (256 B).
constexpr uint32_t kUbReserveBytes = 1024;
constexpr uint32_t kScalarFloats = 64;
constexpr uint32_t kReduceWorkFixedFloats = 64;
// The row-statistics output is float32 [rows, kStatsStride]: one 32 B block per row, so cores never share a block.
constexpr uint32_t kStatsStride = 8;
enum StatsColumn : uint32_t { kLoss = 0, kLseStudent = 1, kLseTeacher = 2, kK1 = 3, kK2 = 4 };

// The divergence (custom_ops/common/distill_math.h distill::Kind, the same numbers): the 'kl' family by beta
// (beta = 0 forward KL(P_t || P_s), beta = 1 reverse KL(P_s || P_t), else the generalized JSD), then the other
// divergences by their code (ms_kldiv/_distill_math.py DIVERGENCES: kind = 2 + code).
enum Kind : uint32_t {
  kForwardKL = 0, kReverseKL = 1, kJSD = 2, kTvd = 3, kSkewKl = 4, kSkewRkl = 5, kSymmetric = 6
};
constexpr uint32_t kDivergences = 5;  // codes 0 ('kl') .. 4 ('symmetric_kl')
// Which kernel: the forward (row loss + stats), the backward writing d_student only, or both gradients.
enum Op : uint32_t { kForward = 0, kBackwardStudent = 1, kBackwardBoth = 2 };

struct Plan {
  uint64_t rows;
  uint64_t vocab;
  uint32_t usedCores;    // blockDim of the launch, >= 1
  uint32_t tileLength;   // vocabulary elements per full tile, multiple of kTileAlign
  uint64_t baseRows;     // rows per core ...
  uint32_t remRows;      // ... plus one for cores [0, remRows)
  uint32_t ubBytesUsed;  // UB the kernel allocates at most for this plan, all of it below ub - kApiUbReserveBytes
};

KLDIV_TILING_FN uint32_t KindOfBeta(float beta) {
  return beta == 0.0f ? kForwardKL : (beta == 1.0f ? kReverseKL : kJSD);
}

// The kind of (beta, divergence code); kDivergences + 2 (out of range, refused by MakePlan) for a bad code.
KLDIV_TILING_FN uint32_t KindOf(float beta, uint32_t code) {
  return code == 0 ? KindOfBeta(beta) : (code < kDivergences ? 2 + code : 2 + kDivergences);
}

// Single float32 work tiles the kernels allocate: the two scaled logit rows plus two (KL) or three (the two-pass
// kinds: the log-mixture, TVD's sign, the symmetric KL's other model need one more) temporaries; with a soft cap,
// the backward keeps the cap's slope of each logit row it differentiates (one, or two with d_teacher).
KLDIV_TILING_FN uint32_t WorkBuffers(uint32_t kind, uint32_t op = kForward, bool softcap = false) {
  const uint32_t slopes = !softcap || op == kForward ? 0 : (op == kBackwardBoth ? 2 : 1);
  return (kind >= kJSD ? 5 : 4) + slopes;
}

// GM<->UB queues (each kBufferNum deep, IO dtype): both logit rows in; the gradients out.
KLDIV_TILING_FN uint32_t Queues(uint32_t op) { return op == kForward ? 2 : (op == kBackwardStudent ? 3 : 4); }

// UB bits one vocabulary element of a tile costs (io = 2 for float16/bfloat16, 4 for float32).
KLDIV_TILING_FN uint32_t BitsPerElement(uint32_t op, uint32_t kind, uint32_t io, bool softcap = false) {
  const uint32_t bytes = kBufferNum * Queues(op) * io + WorkBuffers(kind, op, softcap) * 4;
  // + 1 bit of select mask; the forward's reductions (ReduceMax keeps value and index per 64-lane repeat) need
  // two floats per 64 elements: 1 more bit per element.
  return bytes * 8 + 1 + (op == kForward ? 1 : 0);
}

// Largest tile whose buffers fit the UB (tiling_common.h FitTile) and no longer than the row needs; 0 if even one
// does not fit.
KLDIV_TILING_FN uint32_t TileLength(uint32_t op, uint32_t kind, uint32_t io, uint32_t ubBytes, uint64_t vocab,
                                    bool softcap = false) {
  uint64_t tile = tiling_common::FitTile(ubBytes, kUbReserveBytes, BitsPerElement(op, kind, io, softcap));
  // A short row does not need a long tile: the smallest aligned tile that holds it.
  const uint64_t need = (vocab + kTileAlign - 1) / kTileAlign * kTileAlign;
  if (need > 0 && need < tile) tile = need;
  return static_cast<uint32_t>(tile);
}

// UB the kernel's InitBuffer calls add up to, at most, for a tile length (each buffer rounded up to 32 B).
KLDIV_TILING_FN uint32_t UbBytesUsed(uint32_t op, uint32_t kind, uint32_t io, uint32_t tile, bool softcap = false) {
  return tiling_common::TileUbBytes(tile, BitsPerElement(op, kind, io, softcap), kUbReserveBytes);
}

// Fills *plan; false when the inputs cannot be tiled (unknown dtype size, UB too small, no cores, bad op/kind).
// softcap: the logits are soft-capped (the backward keeps the cap's slopes).
KLDIV_TILING_FN bool MakePlan(uint64_t rows, uint64_t vocab, uint32_t io, uint32_t op, uint32_t kind,
                              uint32_t coreCount, uint32_t ubBytes, Plan* plan, bool softcap = false) {
  if ((io != 2 && io != 4) || op > kBackwardBoth || kind > kSymmetric || coreCount == 0) return false;
  const uint32_t tile = TileLength(op, kind, io, ubBytes, vocab, softcap);
  if (tile == 0) return false;
  uint64_t cores = rows < coreCount ? rows : coreCount;
  if (cores == 0) cores = 1;  // no rows: one core starts and does nothing (the Python layer never launches it)
  plan->rows = rows;
  plan->vocab = vocab;
  plan->usedCores = static_cast<uint32_t>(cores);
  plan->tileLength = tile;
  plan->baseRows = rows / cores;
  plan->remRows = static_cast<uint32_t>(rows % cores);
  plan->ubBytesUsed = UbBytesUsed(op, kind, io, tile, softcap);
  return true;
}

// Rows [*start, *start + *len) of core `core`: cores before remRows take one extra row.
KLDIV_TILING_FN void RowRange(uint64_t baseRows, uint32_t remRows, uint32_t core, uint64_t* start, uint64_t* len) {
  const uint64_t extra = core < remRows ? core : remRows;
  *start = static_cast<uint64_t>(core) * baseRows + extra;
  *len = baseRows + (core < remRows ? 1 : 0);
}

}  // namespace distill_tiling

#endif  // DISTILL_ASCEND_TILING_PLAN_H_
