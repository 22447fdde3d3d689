// Tiling plan for KlDivCustom / KlDivCustomGrad: how the elements are split over the vector cores and into
// tiles that fit the unified buffer (UB).
//
// This header has NO CANN dependency on purpose. Three parties include it and must agree to the element:
//   * op_host/kl_div_custom.cpp   (host tiling function, fills the TilingData),
//   * op_kernel/*.cpp             (the AscendC kernels recompute each core's range with the same function),
//   * tests/ascend/tiling_capi.cpp (a C API loaded with ctypes by the CPU unit tests and the NumPy tile model).
// The kernels define KLDIV_TILING_FN as `__aicore__ inline` before including it; everyone else gets `inline`.
#ifndef KLDIV_ASCEND_TILING_PLAN_H_
#define KLDIV_ASCEND_TILING_PLAN_H_

#include "tiling_common.h"

namespace kldiv_tiling {

using tiling_common::ComputeCount;  // rounded up to kCoreAlign
using tiling_common::kApiUbReserveBytes;
using tiling_common::kBufferNum;
using tiling_common::kMaxTile;
using tiling_common::kTileAlign;
using tiling_common::TileCount;  // of a core's range

// Core boundaries fall on multiples of 64 elements: 256 B of float32 (one full vector repeat of the compute
// type) and a whole number of 32 B blocks for every IO dtype, so no two cores ever write the same 32 B block.
constexpr uint32_t kCoreAlign = tiling_common::kComputeAlign;
// Below this many elements per core, starting one more core costs more than it saves.
constexpr uint32_t kMinElemsPerCore = 4096;
// UB kept out of the tile budget for our own small buffers: the per-core partial, the final pass over all
// cores' partials (<= kMaxCores * 32 B); 2080 B at most.
constexpr uint32_t kUbReserveBytes = 4096;
constexpr uint32_t kMaxCores = 64;
constexpr uint32_t kPartialStrideBytes = 32;  // one 32 B block of workspace per core partial sum

enum Mode : uint32_t {
  kForwardNone = 0,      // KlDivCustom, reduction='none'
  kForwardReduce = 1,    // KlDivCustom, 'sum' | 'mean' | 'batchmean'
  kBackwardNone = 2,     // KlDivCustomGrad, dout has the operands' shape
  kBackwardReduce = 3,   // KlDivCustomGrad, dout is one element
};

enum Reduction : uint32_t { kNone = 0, kSum = 1, kMean = 2, kBatchMean = 3 };

struct Plan {
  uint64_t totalLength;   // elements of x (== target's, the Python layer broadcasts first)
  uint32_t usedCores;     // blockDim of the launch, >= 1
  uint32_t tileLength;    // elements per full tile, multiple of kTileAlign
  uint64_t baseChunks;    // kCoreAlign-chunks per core ...
  uint32_t remChunks;     // ... plus one for cores [0, remChunks)
  uint32_t ubBytesUsed;   // UB the kernel may allocate for this plan (tile buffers + our reserve), all of it
                          // below ub - kApiUbReserveBytes
  uint32_t workspaceBytes;  // user workspace: one partial per core for the reducing modes, else 0
};

// UB bytes one element of a tile costs, times 8 (the select mask is 1 bit per element).
// io = bytes of the IO dtype (2 for float16/bfloat16, 4 for float32); everything is computed in float32.
KLDIV_TILING_FN uint32_t BitsPerElement(uint32_t mode, uint32_t io) {
  const uint32_t f32 = 4;
  uint32_t queues = 0;  // double-buffered GM<->UB staging, IO dtype
  uint32_t work = 0;    // single float32 work buffers
  switch (mode) {
    case kForwardNone:    queues = 3; work = 3; break;  // in: x, t; out: y | xs, ts, w
    case kForwardReduce:  queues = 2; work = 5; break;  // in: x, t | xs, ts, w, acc, comp
    case kBackwardNone:   queues = 5; work = 5; break;  // in: x, t, dout; out: dx, dt | xs, ts, w1, w2, g
    default:              queues = 4; work = 4; break;  // in: x, t; out: dx, dt | xs, ts, w1, w2
  }
  const uint32_t bytes = kBufferNum * queues * io + work * f32;
  return bytes * 8 + 1;  // + 1 bit of select mask
}

// Largest tile whose buffers fit the UB (tiling_common.h FitTile); 0 if even one does not.
KLDIV_TILING_FN uint32_t TileLength(uint32_t mode, uint32_t io, uint32_t ubBytes) {
  return tiling_common::FitTile(ubBytes, kUbReserveBytes, BitsPerElement(mode, io));
}

// UB bytes the kernel's InitBuffer calls add up to for a tile length.
KLDIV_TILING_FN uint32_t UbBytesUsed(uint32_t mode, uint32_t io, uint32_t tile) {
  return tiling_common::TileUbBytes(tile, BitsPerElement(mode, io), kUbReserveBytes);
}

// Fills *plan; returns false when the inputs cannot be tiled (unknown dtype size, UB too small, no cores).
KLDIV_TILING_FN bool MakePlan(uint64_t n, uint32_t io, uint32_t mode, uint32_t coreCount, uint32_t ubBytes,
                              Plan* plan) {
  if ((io != 2 && io != 4) || mode > kBackwardReduce || coreCount == 0) return false;
  const uint32_t tile = TileLength(mode, io, ubBytes);
  if (tile == 0) return false;
  const uint64_t chunks = (n + kCoreAlign - 1) / kCoreAlign;
  uint64_t cores = (n + kMinElemsPerCore - 1) / kMinElemsPerCore;
  if (cores > coreCount) cores = coreCount;
  if (cores > kMaxCores) cores = kMaxCores;
  if (cores > chunks) cores = chunks;
  if (cores == 0) cores = 1;  // n == 0: one core still runs (it writes the reduced value)
  plan->totalLength = n;
  plan->usedCores = static_cast<uint32_t>(cores);
  plan->tileLength = tile;
  plan->baseChunks = chunks / cores;
  plan->remChunks = static_cast<uint32_t>(chunks % cores);
  plan->ubBytesUsed = UbBytesUsed(mode, io, tile);
  const bool reduce = (mode == kForwardReduce);
  plan->workspaceBytes = reduce ? static_cast<uint32_t>(cores) * kPartialStrideBytes : 0;
  return true;
}

// Element range [*start, *start + *len) of core `core`. Cores before remChunks carry one extra chunk; the
// last core's range stops at n, which is the only place a length is not a multiple of kCoreAlign.
KLDIV_TILING_FN void CoreRange(uint64_t n, uint64_t baseChunks, uint32_t remChunks, uint32_t core,
                               uint64_t* start, uint64_t* len) {
  const uint64_t extra = core < remChunks ? core : remChunks;
  const uint64_t firstChunk = static_cast<uint64_t>(core) * baseChunks + extra;
  const uint64_t chunks = baseChunks + (core < remChunks ? 1 : 0);
  uint64_t s = firstChunk * kCoreAlign;
  uint64_t e = s + chunks * kCoreAlign;
  if (s > n) s = n;
  if (e > n) e = n;
  *start = s;
  *len = e - s;
}

// The factor the reduced sum is multiplied by, from the shape the operator sees (numel, first dim).
// 0/0 is NaN as in PyTorch ('mean' of an empty tensor, 'batchmean' with a zero first dimension).
KLDIV_TILING_FN float ReductionScale(uint32_t reduction, uint64_t numel, uint64_t firstDim) {
  if (reduction == kMean) return numel ? 1.0f / static_cast<float>(numel) : __builtin_nanf("");
  if (reduction == kBatchMean) return firstDim ? 1.0f / static_cast<float>(firstDim) : __builtin_nanf("");
  return 1.0f;
}

}  // namespace kldiv_tiling

#endif  // KLDIV_ASCEND_TILING_PLAN_H_
