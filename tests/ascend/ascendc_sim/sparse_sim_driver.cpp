// Runs the stored-teacher kernel sources (op_kernel/sparse_distill_custom*.cpp) on the CPU through the
// kernel_operator.h stand-in: one thread per vector core. Built once per IO dtype
// (-DDTYPE_STUDENT=float|half|bfloat16_t) by tests/ascend/sparse_sim.py and driven from Python with ctypes. Also
// exports the tiling plan (sparse_tiling_plan.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#define ASIM_TILING_TYPE SparseDistillCustomTilingData
#include "kernel_operator.h"
#include "../../../custom_ops/ascend/op_host/sparse_distill_custom_tiling.h"
using optiling::SparseDistillCustomTilingData;

#include "../../../custom_ops/ascend/op_kernel/sparse_distill_custom.cpp"
#include "../../../custom_ops/ascend/op_kernel/sparse_distill_custom_grad.cpp"

namespace {

std::atomic<uint32_t> g_maxUbUsed{0};
std::mutex g_errorLock;
std::string g_error;

// What SparseTilingCommon (op_host/sparse_distill_custom.cpp) computes, minus the CANN context plumbing.
bool FillTiling(uint64_t rows, uint64_t vocab, uint64_t k, float temperature, float ratio, float beta, int tail,
                uint32_t op, uint32_t cores, uint32_t ub, SparseDistillCustomTilingData* td,
                sparse_tiling::Plan* plan) {
  if (!sparse_tiling::MakePlan(rows, vocab, k, sizeof(DTYPE_STUDENT), op, cores, ub, plan)) return false;
  const uint32_t kind = sparse_tiling::KindOfBeta(beta);
  const double t = temperature, b = beta;
  td->set_rows(plan->rows);
  td->set_vocab(plan->vocab);
  td->set_baseRows(plan->baseRows);
  td->set_remRows(plan->remRows);
  td->set_usedCores(plan->usedCores);
  td->set_tileLength(plan->tileLength);
  td->set_ids(plan->ids);
  td->set_idLanes(plan->idLanes);
  td->set_kind(kind);
  td->set_tail(tail ? 1U : 0U);
  td->set_invTemperature(static_cast<float>(1.0 / t));
  td->set_temperature(static_cast<float>(t));
  td->set_tSquared(static_cast<float>(t * t));
  td->set_ratio(ratio);
  td->set_beta(static_cast<float>(b));
  td->set_logBeta(kind == sparse_tiling::kJSD ? static_cast<float>(std::log(b)) : 0.0f);
  td->set_log1mBeta(kind == sparse_tiling::kJSD ? static_cast<float>(std::log1p(-b)) : 0.0f);
  return true;
}

template <typename F>
void Launch(uint32_t blockDim, F body) {
  std::barrier<> bar(blockDim);
  std::vector<std::thread> threads;
  for (uint32_t c = 0; c < blockDim; ++c) {
    threads.emplace_back([&bar, &body, c, blockDim] {
      AscendC::CoreState st;
      st.blockIdx = c;
      st.blockNum = blockDim;
      st.barrier = &bar;
      AscendC::g_core = &st;
      try {
        body();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(g_errorLock);
        if (g_error.empty()) g_error = "core " + std::to_string(c) + ": " + e.what();
      }
      uint32_t seen = g_maxUbUsed.load();
      while (st.ubUsed > seen && !g_maxUbUsed.compare_exchange_weak(seen, st.ubUsed)) {
      }
    });
  }
  for (auto& t : threads) t.join();
}

// GM buffers 64 B aligned (device allocations are), so the stand-in can hold DataCopy to 32 B aligned addresses. A
// read past a tensor's end is caught by the bounds the kernel gives SetGlobalBuffer.
struct AlignedGm {
  explicit AlignedGm(size_t bytes) : p(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64))) {}
  ~AlignedGm() { std::free(p); }
  AlignedGm(const AlignedGm&) = delete;
  AlignedGm& operator=(const AlignedGm&) = delete;
  uint8_t* p;
};

}  // namespace

extern "C" {

const char* sparse_sim_error() { return g_error.c_str(); }
uint32_t sparse_sim_max_ub_used() { return g_maxUbUsed.load(); }

// stats: float32 [rows, 8]. Returns 0, 1 (tiling refused) or 2 (a stand-in constraint was violated).
int sparse_sim_forward(const void* s, const int32_t* ids, const float* vals, float* stats, uint64_t rows,
                       uint64_t vocab, uint64_t k, float temperature, float ratio, float beta, int tail,
                       uint32_t cores, uint32_t ub) {
  SparseDistillCustomTilingData td{};
  sparse_tiling::Plan plan{};
  if (!FillTiling(rows, vocab, k, temperature, ratio, beta, tail, sparse_tiling::kForward, cores, ub, &td, &plan)) {
    return 1;
  }
  const size_t n = rows * vocab * sizeof(DTYPE_STUDENT), nk = rows * k * 4;
  const size_t ns = rows * sparse_tiling::kStatsStride * sizeof(float);
  AlignedGm gs(n), gi(nk), gv(nk), gst(ns);
  std::memcpy(gs.p, s, n);
  std::memcpy(gi.p, ids, nk);
  std::memcpy(gv.p, vals, nk);
  std::memset(gst.p, 0xFF, ns);  // NaN: a row the kernel does not write shows
  g_maxUbUsed = 0;
  g_error.clear();
  AscendC::g_checkGmAlign = true;
  Launch(plan.usedCores,
         [&] { sparse_distill_custom(gs.p, gi.p, gv.p, gst.p, nullptr, reinterpret_cast<GM_ADDR>(&td)); });
  std::memcpy(stats, gst.p, ns);
  return g_error.empty() ? 0 : 2;
}

int sparse_sim_backward(const void* s, const int32_t* ids, const float* vals, const float* stats, const float* dloss,
                        void* ds, uint64_t rows, uint64_t vocab, uint64_t k, float temperature, float ratio,
                        float beta, int tail, uint32_t cores, uint32_t ub) {
  SparseDistillCustomTilingData td{};
  sparse_tiling::Plan plan{};
  if (!FillTiling(rows, vocab, k, temperature, ratio, beta, tail, sparse_tiling::kBackward, cores, ub, &td, &plan)) {
    return 1;
  }
  const size_t n = rows * vocab * sizeof(DTYPE_STUDENT), nk = rows * k * 4;
  const size_t ns = rows * sparse_tiling::kStatsStride * sizeof(float);
  AlignedGm gs(n), gi(nk), gv(nk), gst(ns), gg(rows * sizeof(float)), gds(n);
  std::memcpy(gs.p, s, n);
  std::memcpy(gi.p, ids, nk);
  std::memcpy(gv.p, vals, nk);
  std::memcpy(gst.p, stats, ns);
  std::memcpy(gg.p, dloss, rows * sizeof(float));
  std::memset(gds.p, 0xFF, n);  // NaN: an element the kernel does not write shows
  g_maxUbUsed = 0;
  g_error.clear();
  AscendC::g_checkGmAlign = true;
  Launch(plan.usedCores, [&] {
    sparse_distill_custom_grad(gs.p, gi.p, gv.p, gst.p, gg.p, gds.p, nullptr, reinterpret_cast<GM_ADDR>(&td));
  });
  std::memcpy(ds, gds.p, n);
  return g_error.empty() ? 0 : 2;
}

// The plan: out[0..8] = rows, vocab, ids, idLanes, usedCores, tileLength, baseRows, remRows, ubBytesUsed.
int sparse_make_plan(uint64_t rows, uint64_t vocab, uint64_t k, uint32_t io, uint32_t op, uint32_t cores,
                     uint32_t ub, uint64_t* out) {
  sparse_tiling::Plan p{};
  if (!sparse_tiling::MakePlan(rows, vocab, k, io, op, cores, ub, &p)) return 1;
  const uint64_t v[] = {p.rows, p.vocab, p.ids, p.idLanes, p.usedCores, p.tileLength, p.baseRows, p.remRows,
                        p.ubBytesUsed};
  std::copy(v, v + 9, out);
  return 0;
}
void sparse_row_range(uint64_t baseRows, uint32_t remRows, uint32_t core, uint64_t* out) {
  sparse_tiling::RowRange(baseRows, remRows, core, &out[0], &out[1]);
}
uint64_t sparse_tile_count(uint64_t vocab, uint32_t tile) { return sparse_tiling::TileCount(vocab, tile); }
uint32_t sparse_kind_of_beta(float beta) { return sparse_tiling::KindOfBeta(beta); }
uint32_t sparse_const(int which) {
  switch (which) {
    case 0: return sparse_tiling::kTileAlign;
    case 1: return sparse_tiling::kComputeAlign;
    case 2: return sparse_tiling::kBufferNum;
    case 3: return sparse_tiling::kMaxTile;
    case 4: return sparse_tiling::kApiUbReserveBytes;
    case 5: return sparse_tiling::kUbReserveBytes;
    case 6: return sparse_tiling::kStatsStride;
    case 7: return sparse_tiling::kMaxIds;
    default: return 0;
  }
}

}  // extern "C"
