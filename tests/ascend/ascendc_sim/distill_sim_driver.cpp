// Runs the distillation kernel sources (op_kernel/distill_custom*.cpp) on the CPU through the kernel_operator.h
// stand-in: one thread per vector core. Built once per IO dtype (-DDTYPE_STUDENT=float|half|bfloat16_t) by
// tests/distill_sim.py and driven from Python with ctypes. Also exports the tiling plan (distill_tiling_plan.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#define ASIM_TILING_TYPE DistillCustomTilingData
#include "kernel_operator.h"
#include "../../../custom_ops/ascend/op_host/distill_custom_tiling.h"
#include "../../../custom_ops/ascend/op_host/distill_hyper.h"
using optiling::DistillCustomTilingData;

#include "../../../custom_ops/ascend/op_kernel/distill_custom.cpp"
#include "../../../custom_ops/ascend/op_kernel/distill_custom_grad.cpp"

namespace {

std::atomic<uint32_t> g_maxUbUsed{0};
std::mutex g_errorLock;
std::string g_error;

// What DistillTilingCommon (op_host/distill_custom.cpp) computes, minus the CANN context plumbing: the same
// distill_hyper.h fills the attributes' fields.
bool FillTiling(uint64_t rows, uint64_t vocab, const distill_hyper::Attrs& attrs, uint32_t op, uint32_t cores,
                uint32_t ub, DistillCustomTilingData* td, distill_tiling::Plan* plan) {
  const uint32_t kind = distill_hyper::Validate(attrs);
  if (kind > distill_tiling::kSymmetric) return false;
  if (!distill_tiling::MakePlan(rows, vocab, sizeof(DTYPE_STUDENT), op, kind, cores, ub, plan, attrs.softcap > 0.0)) {
    return false;
  }
  td->set_rows(plan->rows);
  td->set_vocab(plan->vocab);
  td->set_baseRows(plan->baseRows);
  td->set_remRows(plan->remRows);
  td->set_usedCores(plan->usedCores);
  td->set_tileLength(plan->tileLength);
  td->set_teacherGrad(op == distill_tiling::kBackwardBoth ? 1U : 0U);
  distill_hyper::Fill(attrs, kind, td);
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

// GM buffers 64 B aligned (device allocations are), so the stand-in can hold DataCopy to 32 B aligned addresses.
struct AlignedGm {
  explicit AlignedGm(size_t bytes) : p(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64))) {}
  ~AlignedGm() { std::free(p); }
  AlignedGm(const AlignedGm&) = delete;
  AlignedGm& operator=(const AlignedGm&) = delete;
  uint8_t* p;
};

}  // namespace

extern "C" {

const char* distill_sim_error() { return g_error.c_str(); }
uint32_t distill_sim_max_ub_used() { return g_maxUbUsed.load(); }

// stats: float32 [rows, 8]. Returns 0, 1 (tiling refused) or 2 (a stand-in constraint was violated).
// hyper: temperature, beta, divergence code, alpha, softcap, logit_scale (the operators' attributes).
int distill_sim_forward(const void* s, const void* t, float* stats, uint64_t rows, uint64_t vocab, const double* hyper,
                        uint32_t cores, uint32_t ub) {
  DistillCustomTilingData td{};
  distill_tiling::Plan plan{};
  const distill_hyper::Attrs attrs{hyper[0], hyper[1], static_cast<int64_t>(hyper[2]), hyper[3], hyper[4], hyper[5]};
  if (!FillTiling(rows, vocab, attrs, distill_tiling::kForward, cores, ub, &td, &plan)) return 1;
  const size_t n = rows * vocab * sizeof(DTYPE_STUDENT), ns = rows * distill_tiling::kStatsStride * sizeof(float);
  AlignedGm gs(n), gt(n), gst(ns);
  std::memcpy(gs.p, s, n);
  std::memcpy(gt.p, t, n);
  std::memset(gst.p, 0xFF, ns);  // NaN: a row the kernel does not write shows
  g_maxUbUsed = 0;
  g_error.clear();
  AscendC::g_checkGmAlign = true;
  Launch(plan.usedCores, [&] { distill_custom(gs.p, gt.p, gst.p, nullptr, reinterpret_cast<GM_ADDR>(&td)); });
  std::memcpy(stats, gst.p, ns);
  return g_error.empty() ? 0 : 2;
}

int distill_sim_backward(const void* s, const void* t, const float* stats, const float* dloss, void* ds, void* dt,
                         uint64_t rows, uint64_t vocab, const double* hyper, int teacherGrad, uint32_t cores,
                         uint32_t ub) {
  DistillCustomTilingData td{};
  distill_tiling::Plan plan{};
  const uint32_t op = teacherGrad ? distill_tiling::kBackwardBoth : distill_tiling::kBackwardStudent;
  const distill_hyper::Attrs attrs{hyper[0], hyper[1], static_cast<int64_t>(hyper[2]), hyper[3], hyper[4], hyper[5]};
  if (!FillTiling(rows, vocab, attrs, op, cores, ub, &td, &plan)) return 1;
  const size_t n = rows * vocab * sizeof(DTYPE_STUDENT), ns = rows * distill_tiling::kStatsStride * sizeof(float);
  AlignedGm gs(n), gt(n), gst(ns), gg(rows * sizeof(float)), gds(n), gdt(teacherGrad ? n : 0);
  std::memcpy(gs.p, s, n);
  std::memcpy(gt.p, t, n);
  std::memcpy(gst.p, stats, ns);
  std::memcpy(gg.p, dloss, rows * sizeof(float));
  std::memset(gds.p, 0xFF, n);  // NaN: an element the kernel does not write shows
  if (teacherGrad) std::memset(gdt.p, 0xFF, n);
  g_maxUbUsed = 0;
  g_error.clear();
  AscendC::g_checkGmAlign = true;
  Launch(plan.usedCores, [&] {
    distill_custom_grad(gs.p, gt.p, gst.p, gg.p, gds.p, teacherGrad ? gdt.p : nullptr, nullptr,
                        reinterpret_cast<GM_ADDR>(&td));
  });
  std::memcpy(ds, gds.p, n);
  if (teacherGrad) std::memcpy(dt, gdt.p, n);
  return g_error.empty() ? 0 : 2;
}

// The plan: out[0..6] = rows, vocab, usedCores, tileLength, baseRows, remRows, ubBytesUsed.
int distill_make_plan(uint64_t rows, uint64_t vocab, uint32_t io, uint32_t op, uint32_t kind, uint32_t cores,
                      uint32_t ub, int softcap, uint64_t* out) {
  distill_tiling::Plan p{};
  if (!distill_tiling::MakePlan(rows, vocab, io, op, kind, cores, ub, &p, softcap != 0)) return 1;
  const uint64_t v[] = {p.rows, p.vocab, p.usedCores, p.tileLength, p.baseRows, p.remRows, p.ubBytesUsed};
  std::copy(v, v + 7, out);
  return 0;
}
void distill_row_range(uint64_t baseRows, uint32_t remRows, uint32_t core, uint64_t* out) {
  distill_tiling::RowRange(baseRows, remRows, core, &out[0], &out[1]);
}
uint64_t distill_tile_count(uint64_t vocab, uint32_t tile) { return distill_tiling::TileCount(vocab, tile); }
uint32_t distill_compute_count(uint32_t valid) { return distill_tiling::ComputeCount(valid); }
uint32_t distill_kind_of_beta(float beta) { return distill_tiling::KindOfBeta(beta); }
uint32_t distill_kind_of(float beta, uint32_t code) { return distill_tiling::KindOf(beta, code); }
uint32_t distill_const(int which) {
  switch (which) {
    case 0: return distill_tiling::kTileAlign;
    case 1: return distill_tiling::kComputeAlign;
    case 2: return distill_tiling::kBufferNum;
    case 3: return distill_tiling::kMaxTile;
    case 4: return distill_tiling::kApiUbReserveBytes;
    case 5: return distill_tiling::kUbReserveBytes;
    case 6: return distill_tiling::kStatsStride;
    default: return 0;
  }
}

}  // extern "C"
