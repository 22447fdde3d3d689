// C entry points over op_kernel/kl_div_tiling_plan.h for the CPU tests (ctypes). No CANN needed:
//   g++ -O2 -std=c++17 -shared -fPIC -Wall -Wextra -Werror tiling_capi.cpp -o libkldiv_tiling.so
// The NumPy tile model (kldiv_tile_model.py) reads every tiling number through these functions, so it cannot
// drift from what the host tiling function and the kernels compute.
#include "../../custom_ops/ascend/op_kernel/kl_div_tiling_plan.h"

using namespace kldiv_tiling;

extern "C" {

// out[0..6] = totalLength, usedCores, tileLength, baseChunks, remChunks, ubBytesUsed, workspaceBytes.
int kldiv_make_plan(uint64_t n, uint32_t io, uint32_t mode, uint32_t cores, uint32_t ub, uint64_t* out) {
  Plan p{};
  if (!MakePlan(n, io, mode, cores, ub, &p)) return 1;
  out[0] = p.totalLength;
  out[1] = p.usedCores;
  out[2] = p.tileLength;
  out[3] = p.baseChunks;
  out[4] = p.remChunks;
  out[5] = p.ubBytesUsed;
  out[6] = p.workspaceBytes;
  return 0;
}

void kldiv_core_range(uint64_t n, uint64_t baseChunks, uint32_t remChunks, uint32_t core, uint64_t* out) {
  CoreRange(n, baseChunks, remChunks, core, &out[0], &out[1]);
}

uint64_t kldiv_tile_count(uint64_t len, uint32_t tile) { return TileCount(len, tile); }
uint32_t kldiv_compute_count(uint32_t valid) { return ComputeCount(valid); }
uint32_t kldiv_tile_length(uint32_t mode, uint32_t io, uint32_t ub) { return TileLength(mode, io, ub); }
uint32_t kldiv_bits_per_element(uint32_t mode, uint32_t io) { return BitsPerElement(mode, io); }
float kldiv_reduction_scale(uint32_t reduction, uint64_t numel, uint64_t firstDim) {
  return ReductionScale(reduction, numel, firstDim);
}

// Constants, so that Python never restates them.
uint32_t kldiv_const(int which) {
  switch (which) {
    case 0: return kCoreAlign;
    case 1: return kTileAlign;
    case 2: return kBufferNum;
    case 3: return kMaxTile;
    case 4: return kMinElemsPerCore;
    case 5: return kUbReserveBytes;
    case 6: return kMaxCores;
    case 7: return kPartialStrideBytes;
    case 8: return kApiUbReserveBytes;
    default: return 0;
  }
}

}  // extern "C"
