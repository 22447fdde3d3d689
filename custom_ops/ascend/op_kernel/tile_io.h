// GM <-> UB tile transfers and the tile-queue plumbing every AscendC kernel here (kl_div_custom*.cpp,
// distill_custom*.cpp) uses: a tile of `valid` elements at element offset `off` of a GlobalTensor.
#ifndef KLDIV_TILE_IO_H_
#define KLDIV_TILE_IO_H_

#include "kernel_operator.h"

namespace tile_io {

using namespace AscendC;

constexpr float kNegInf = -__builtin_inff();
constexpr float kPosInf = __builtin_inff();

// DataCopy moves whole 32 B blocks between 32 B aligned addresses only; any other transfer takes DataCopyPad.
template <typename T>
__aicore__ inline bool WholeBlocks(uint64_t off, uint32_t valid) {
  return (off * sizeof(T)) % 32 == 0 && (valid * sizeof(T)) % 32 == 0;
}

// GM -> UB: `valid` elements into dst.
template <typename T>
__aicore__ inline void LoadTile(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint64_t off, uint32_t valid) {
  if (WholeBlocks<T>(off, valid)) {
    DataCopy(dst, src[off], valid);
  } else {
    DataCopyExtParams params{1, static_cast<uint32_t>(valid * sizeof(T)), 0, 0, 0};
    DataCopyPadExtParams<T> pad{false, 0, 0, static_cast<T>(0)};
    DataCopyPad(dst, src[off], params, pad);
  }
}

// UB -> GM: exactly `valid` elements, leaving the rest of a partial 32 B block alone (it may belong to another
// core's range or row).
template <typename T>
__aicore__ inline void StoreTile(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint64_t off, uint32_t valid) {
  if (WholeBlocks<T>(off, valid)) {
    DataCopy(dst[off], src, valid);
  } else {
    DataCopyExtParams params{1, static_cast<uint32_t>(valid * sizeof(T)), 0, 0, 0};
    DataCopyPad(dst[off], src, params);
  }
}

// A tile loaded from src into a buffer of the input queue `que`, and queued for the vector unit.
template <typename T, typename Que>
__aicore__ inline void LoadToQueue(Que& que, const GlobalTensor<T>& src, uint64_t off, uint32_t valid) {
  LocalTensor<T> tile = que.template AllocTensor<T>();
  LoadTile(tile, src, off, valid);
  que.EnQue(tile);
}

// The oldest tile of the output queue `que` stored to dst, and its buffer freed.
template <typename T, typename Que>
__aicore__ inline void StoreFromQueue(const GlobalTensor<T>& dst, Que& que, uint64_t off, uint32_t valid) {
  LocalTensor<T> tile = que.template DeQue<T>();
  StoreTile(dst, tile, off, valid);
  que.FreeTensor(tile);
}

}  // namespace tile_io

#endif  // KLDIV_TILE_IO_H_
