// What the two tiling plans (kl_div_tiling_plan.h, distill_tiling_plan.h) share: the tile and buffer constants of
// the AscendC kernels and how a tile length follows from the UB a tile element costs.
//
// No CANN dependency, as the plans: the kernels define KLDIV_TILING_FN as `__aicore__ inline` before including a
// plan; everyone else gets `inline`.
#ifndef KLDIV_ASCEND_TILING_COMMON_H_
#define KLDIV_ASCEND_TILING_COMMON_H_

#ifndef KLDIV_TILING_FN
#define KLDIV_TILING_FN inline
#include <stdint.h>
#endif

namespace tiling_common {

// Tiles are multiples of 256 elements so that the 1-bit-per-element select mask (tile / 8 bytes) is itself a
// whole number of 32 B blocks.
constexpr uint32_t kTileAlign = 256;
// A tile of `valid` elements is computed on `valid` rounded up to 64 lanes: one 256 B float32 repeat, the unit
// CompareScalar works in. The lanes past `valid` hold stale data; they are never stored and never summed.
constexpr uint32_t kComputeAlign = 64;
constexpr uint32_t kBufferNum = 2;    // double buffering of every GM<->UB queue
constexpr uint32_t kMaxTile = 16384;  // beyond this, bigger tiles buy nothing and cost tail latency
// The top 8 KiB of the UB belong to the AscendC library on Atlas A2 and 310P: it writes its own temporaries
// there (Select's scalar block, for one), impl/basic_api/utils/kernel_utils_constants.h TMP_UB_OFFSET.
constexpr uint32_t kApiUbReserveBytes = 8192;

// Largest tile (multiple of kTileAlign, <= kMaxTile) whose buffers, `bitsPerElement` UB bits per element, fit in
// ubBytes less the library's reserve and `reserveBytes` of the kernel's own small buffers; 0 if even one does not.
KLDIV_TILING_FN uint32_t FitTile(uint32_t ubBytes, uint32_t reserveBytes, uint32_t bitsPerElement) {
  if (ubBytes <= kApiUbReserveBytes + reserveBytes) return 0;
  const uint64_t budgetBits = static_cast<uint64_t>(ubBytes - kApiUbReserveBytes - reserveBytes) * 8;
  uint64_t tile = budgetBits / bitsPerElement;
  tile -= tile % kTileAlign;
  return static_cast<uint32_t>(tile > kMaxTile ? kMaxTile : tile);
}

// UB bytes the kernel's InitBuffer calls add up to for a tile length (each buffer rounded up to 32 B): the tile
// buffers plus the reserve.
KLDIV_TILING_FN uint32_t TileUbBytes(uint32_t tile, uint32_t bitsPerElement, uint32_t reserveBytes) {
  return static_cast<uint32_t>((static_cast<uint64_t>(tile) * bitsPerElement + 7) / 8) + reserveBytes;
}

// Tiles of a range of `len` elements; the last one holds len - (tiles - 1) * tile elements.
KLDIV_TILING_FN uint64_t TileCount(uint64_t len, uint32_t tile) { return (len + tile - 1) / tile; }

// Elements the vector instructions of a tile of `valid` elements process: rounded up to kComputeAlign.
KLDIV_TILING_FN uint32_t ComputeCount(uint32_t valid) {
  return (valid + kComputeAlign - 1) / kComputeAlign * kComputeAlign;
}

}  // namespace tiling_common

#endif  // KLDIV_ASCEND_TILING_COMMON_H_
