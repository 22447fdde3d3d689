// Exhaustive-ish CPU check of kl_div_tiling_plan.h without Python: every element of every size below is
// owned by exactly one (core, tile), core starts are kCoreAlign-aligned, and the tile buffers fit the UB.
// Exit code 0 = all good; otherwise the first failure is printed. Built and run by tests/test_ascend_tiling_kldiv.py.
#include <cstdio>
#include <vector>

#include "../../custom_ops/ascend/op_kernel/kl_div_tiling_plan.h"

using namespace kldiv_tiling;

static int Fail(const char* what, uint64_t n, uint32_t cores, uint32_t mode, uint32_t io) {
  std::printf("FAIL %s: n=%llu cores=%u mode=%u io=%u\n", what, static_cast<unsigned long long>(n), cores, mode, io);
  return 1;
}

static int Check(uint64_t n, uint32_t io, uint32_t mode, uint32_t coreCount, uint32_t ub) {
  Plan p{};
  if (!MakePlan(n, io, mode, coreCount, ub, &p)) return Fail("MakePlan refused", n, coreCount, mode, io);
  if (p.usedCores < 1 || p.usedCores > coreCount) return Fail("usedCores out of range", n, coreCount, mode, io);
  if (p.tileLength == 0 || p.tileLength % kTileAlign) return Fail("tile not aligned", n, coreCount, mode, io);
  if (p.ubBytesUsed > ub - kApiUbReserveBytes) return Fail("UB overflow into the API reserve", n, coreCount, mode, io);
  uint64_t next = 0;
  for (uint32_t c = 0; c < p.usedCores; ++c) {
    uint64_t s = 0, len = 0;
    CoreRange(n, p.baseChunks, p.remChunks, c, &s, &len);
    if (s != next) return Fail("gap or overlap between cores", n, coreCount, mode, io);
    if (s % kCoreAlign) return Fail("core start not aligned", n, coreCount, mode, io);
    if (s + len != n && len % kCoreAlign) return Fail("ragged length before the last element", n, coreCount, mode, io);
    uint64_t covered = 0;
    const uint64_t tiles = TileCount(len, p.tileLength);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint64_t off = i * p.tileLength;
      const uint64_t valid = len - off < p.tileLength ? len - off : p.tileLength;
      if (valid == 0 || ComputeCount(static_cast<uint32_t>(valid)) > p.tileLength) {
        return Fail("tile overrun", n, coreCount, mode, io);
      }
      covered += valid;
    }
    if (covered != len) return Fail("tiles do not cover the core", n, coreCount, mode, io);
    next = s + len;
  }
  if (next != n) return Fail("cores do not cover n", n, coreCount, mode, io);
  return 0;
}

int main() {
  const uint32_t ubs[] = {192 * 1024, 256 * 1024, 64 * 1024};
  const uint32_t coreCounts[] = {1, 2, 7, 20, 40, 48};
  std::vector<uint64_t> sizes;
  for (uint64_t n = 0; n <= 300; ++n) sizes.push_back(n);
  const uint64_t bases[] = {4096, 65536, 1u << 20, 4u << 20, 32u << 20, 1000003, 123456789};
  for (uint64_t b : bases) {
    for (int64_t d = -65; d <= 65; d += 13) sizes.push_back(static_cast<uint64_t>(static_cast<int64_t>(b) + d));
  }
  int failures = 0;
  for (uint32_t ub : ubs)
    for (uint32_t cores : coreCounts)
      for (uint32_t mode = 0; mode <= kBackwardReduce; ++mode)
        for (uint32_t io : {2u, 4u})
          for (uint64_t n : sizes) failures += Check(n, io, mode, cores, ub);
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
