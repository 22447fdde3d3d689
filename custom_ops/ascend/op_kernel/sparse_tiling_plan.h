// Tiling plan for SparseDistillCustom / SparseDistillCustomGrad (distillation from a stored teacher: the student's
// logits [rows, V] against the teacher's K ids and values per row): how the rows are split over the vector cores,
// how a row's vocabulary is cut into UB tiles, and the UB the row's K ids take.
//
// No CANN dependency, as the other plans: the host tiling function, the kernels (which recompute each core's row
// range with the same function) and the CPU tests (tests/ascend/ascendc_sim/sparse_sim_driver.cpp) include it.
#ifndef SPARSE_ASCEND_TILING_PLAN_H_
#define SPARSE_ASCEND_TILING_PLAN_H_

#include "tiling_common.h"

namespace sparse_tiling {

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
// The row statistics (sparse::Stat of custom_ops/common/sparse_math.h): float32 [rows, kStatsStride].
constexpr uint32_t kStatsStride = 8;
enum StatsColumn : uint32_t { kLoss = 0, kMax = 1, kLogZ = 2, kLogZOff = 3, kSumA = 4, kATail = 5, kLogQ = 6 };
// The most ids a row may hold: the id lanes live in the UB next to the vocabulary tiles, and the reductions over
// them use the fixed part of the work area (kReduceWorkFixedFloats floats = 4096 lanes). Larger K is the Python
// layer's to route elsewhere.
constexpr uint32_t kMaxIds = 4000;

// The divergence: beta = 0 forward KL(q || r), beta = 1 reverse KL(r || q), else generalized JSD.
enum Kind : uint32_t { kForwardKL = 0, kReverseKL = 1, kJSD = 2 };
// Which kernel: the forward (stats) or the backward (d_student).
enum Op : uint32_t { kForward = 0, kBackward = 1 };

struct Plan {
  uint64_t rows;
  uint64_t vocab;
  uint32_t ids;          // K
  uint32_t idLanes;      // K + 1 (the tail bucket) rounded up to kComputeAlign
  uint32_t usedCores;    // blockDim of the launch, >= 1
  uint32_t tileLength;   // vocabulary elements per full tile, multiple of kTileAlign
  uint64_t baseRows;     // rows per core ...
  uint32_t remRows;      // ... plus one for cores [0, remRows)
  uint32_t ubBytesUsed;  // UB the kernel allocates at most for this plan, all of it below ub - kApiUbReserveBytes
};

KLDIV_TILING_FN uint32_t KindOfBeta(float beta) {
  return beta == 0.0f ? kForwardKL : (beta == 1.0f ? kReverseKL : kJSD);
}

// Lanes of the per-row id buffers: the K ids plus the tail bucket, whole 64-lane repeats.
KLDIV_TILING_FN uint32_t IdLanes(uint32_t k) { return ComputeCount(k + 1); }

// UB bits one vocabulary element of a tile costs (io = 2 for float16/bfloat16, 4 for float32):
//   forward:  the logits' input queue (double-buffered), the raw float32 tile and its exponentials, 1 bit of
//             select mask and 1 of reduction work (two floats per 64-lane repeat);
//   backward: the logits' input queue and the gradient's output queue (both double-buffered), three float32 work
//             tiles (x, the row term, the tail term).
KLDIV_TILING_FN uint32_t BitsPerElement(uint32_t op, uint32_t io) {
  return op == kForward ? (kBufferNum * io + 2 * 4) * 8 + 2 : (2 * kBufferNum * io + 3 * 4) * 8;
}

// UB bytes of the id lanes, forward and backward alike: seven 4-byte lanes (the row's ids (int32) and values; the
// forward: the logits at the ids, log-mixture, probabilities, a and the divergence term; the backward: the
// gathered logits and values of a tile's ids, log-mixture, probabilities and a) and a 1-bit mask per lane.
KLDIV_TILING_FN uint32_t IdBytes(uint32_t op, uint32_t lanes) {
  (void)op;
  return lanes * 7 * 4 + lanes / 8;
}

// Largest tile whose buffers fit the UB next to the id lanes (tiling_common.h FitTile) and no longer than the row
// needs; 0 if even one does not fit.
KLDIV_TILING_FN uint32_t TileLength(uint32_t op, uint32_t io, uint32_t ubBytes, uint64_t vocab, uint32_t lanes) {
  uint64_t tile = tiling_common::FitTile(ubBytes, kUbReserveBytes + IdBytes(op, lanes), BitsPerElement(op, io));
  const uint64_t need = (vocab + kTileAlign - 1) / kTileAlign * kTileAlign;
  if (need > 0 && need < tile) tile = need;
  return static_cast<uint32_t>(tile);
}

// UB the kernel's InitBuffer calls add up to, at most, for a tile length (each buffer rounded up to 32 B).
KLDIV_TILING_FN uint32_t UbBytesUsed(uint32_t op, uint32_t io, uint32_t tile, uint32_t lanes) {
  return tiling_common::TileUbBytes(tile, BitsPerElement(op, io), kUbReserveBytes + IdBytes(op, lanes));
}

// Fills *plan; false when the inputs cannot be tiled (unknown dtype size, no ids or more than kMaxIds, UB too
// small, no cores, bad op).
KLDIV_TILING_FN bool MakePlan(uint64_t rows, uint64_t vocab, uint64_t k, uint32_t io, uint32_t op,
                              uint32_t coreCount, uint32_t ubBytes, Plan* plan) {
  if ((io != 2 && io != 4) || op > kBackward || coreCount == 0 || k == 0 || k > kMaxIds) return false;
  const uint32_t lanes = IdLanes(static_cast<uint32_t>(k));
  const uint32_t tile = TileLength(op, io, ubBytes, vocab, lanes);
  if (tile == 0) return false;
  uint64_t cores = rows < coreCount ? rows : coreCount;
  if (cores == 0) cores = 1;  // no rows: one core starts and does nothing
  plan->rows = rows;
  plan->vocab = vocab;
  plan->ids = static_cast<uint32_t>(k);
  plan->idLanes = lanes;
  plan->usedCores = static_cast<uint32_t>(cores);
  plan->tileLength = tile;
  plan->baseRows = rows / cores;
  plan->remRows = static_cast<uint32_t>(rows % cores);
  plan->ubBytesUsed = UbBytesUsed(op, io, tile, lanes);
  return true;
}

// Rows [*start, *start + *len) of core `core`: cores before remRows take one extra row.
KLDIV_TILING_FN void RowRange(uint64_t baseRows, uint32_t remRows, uint32_t core, uint64_t* start, uint64_t* len) {
  const uint64_t extra = core < remRows ? core : remRows;
  *start = static_cast<uint64_t>(core) * baseRows + extra;
  *len = baseRows + (core < remRows ? 1 : 0);
}

}  // namespace sparse_tiling

#endif  // SPARSE_ASCEND_TILING_PLAN_H_
