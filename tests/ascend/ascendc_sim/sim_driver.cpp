// Runs the AscendC kernel sources (op_kernel/*.cpp) on the CPU through the kernel_operator.h stand-in in this
// directory: one thread per vector core. Built once per IO dtype (-DDTYPE_X=float|half|bfloat16_t) by
// kldiv_tile_model.py and driven from Python with ctypes.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "kernel_operator.h"
#include "../../../custom_ops/ascend/op_host/kl_div_custom_tiling.h"
using optiling::KlDivCustomTilingData;

#include "../../../custom_ops/ascend/op_kernel/kl_div_custom.cpp"
#include "../../../custom_ops/ascend/op_kernel/kl_div_custom_grad.cpp"

namespace {

std::atomic<uint32_t> g_maxUbUsed{0};
std::mutex g_errorLock;
std::string g_error;

// What KlDivTilingCommon (op_host/kl_div_custom.cpp) computes, minus the CANN context plumbing it needs.
bool FillTiling(uint64_t n, uint64_t firstDim, uint32_t reduction, bool logTarget, bool backward, uint32_t cores,
                KlDivCustomTilingData* td, kldiv_tiling::Plan* plan) {
  uint32_t mode;
  if (backward) {
    mode = reduction == kldiv_tiling::kNone ? kldiv_tiling::kBackwardNone : kldiv_tiling::kBackwardReduce;
  } else {
    mode = reduction == kldiv_tiling::kNone ? kldiv_tiling::kForwardNone : kldiv_tiling::kForwardReduce;
  }
  if (!kldiv_tiling::MakePlan(n, sizeof(DTYPE_X), mode, cores, AscendC::kSimUbBytes, plan)) return false;
  td->set_totalLength(plan->totalLength);
  td->set_baseChunks(plan->baseChunks);
  td->set_remChunks(plan->remChunks);
  td->set_usedCores(plan->usedCores);
  td->set_tileLength(plan->tileLength);
  td->set_logTarget(logTarget ? 1U : 0U);
  td->set_reduction(reduction);
  td->set_scale(kldiv_tiling::ReductionScale(reduction, n, firstDim));
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
        {
          std::lock_guard<std::mutex> lock(g_errorLock);
          if (g_error.empty()) g_error = "core " + std::to_string(c) + ": " + e.what();
        }
        bar.arrive_and_drop();  // the other cores must not wait for this one at SyncAll
      }
      uint32_t seen = g_maxUbUsed.load();
      while (st.ubUsed > seen && !g_maxUbUsed.compare_exchange_weak(seen, st.ubUsed)) {
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

extern "C" {

// First constraint violation of the last launch ("" if none).
const char* kldiv_sim_error() { return g_error.c_str(); }

// Largest UB footprint of any core in the last launch (to compare with the plan's ubBytesUsed).
uint32_t kldiv_sim_max_ub_used() { return g_maxUbUsed.load(); }

int kldiv_sim_forward(void* x, void* t, void* y, uint64_t n, uint64_t firstDim, uint32_t reduction, int logTarget,
                      uint32_t cores) {
  KlDivCustomTilingData td{};
  kldiv_tiling::Plan plan{};
  if (!FillTiling(n, firstDim, reduction, logTarget != 0, false, cores, &td, &plan)) return 1;
  std::vector<uint8_t> ws(plan.workspaceBytes + 32, 0xAB);  // garbage: the kernel must write before it reads
  g_maxUbUsed = 0;
  g_error.clear();
  Launch(plan.usedCores, [&] {
    kl_div_custom(static_cast<GM_ADDR>(x), static_cast<GM_ADDR>(t), static_cast<GM_ADDR>(y), ws.data(),
                  reinterpret_cast<GM_ADDR>(&td));
  });
  return g_error.empty() ? 0 : 2;
}

int kldiv_sim_backward(void* x, void* t, void* g, void* dx, void* dt, uint64_t n, uint64_t firstDim,
                       uint32_t reduction, int logTarget, uint32_t cores) {
  KlDivCustomTilingData td{};
  kldiv_tiling::Plan plan{};
  if (!FillTiling(n, firstDim, reduction, logTarget != 0, true, cores, &td, &plan)) return 1;
  std::vector<uint8_t> ws(32, 0xAB);
  g_maxUbUsed = 0;
  g_error.clear();
  Launch(plan.usedCores, [&] {
    kl_div_custom_grad(static_cast<GM_ADDR>(x), static_cast<GM_ADDR>(t), static_cast<GM_ADDR>(g),
                       static_cast<GM_ADDR>(dx), static_cast<GM_ADDR>(dt), ws.data(), reinterpret_cast<GM_ADDR>(&td));
  });
  return g_error.empty() ? 0 : 2;
}

}  // extern "C"
