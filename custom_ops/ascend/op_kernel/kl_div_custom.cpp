// KlDivCustom forward kernel (AscendC, vector cores).
//
// Each core takes the contiguous range CoreRange() gives it (kl_div_tiling_plan.h) and walks it in tiles
// of tileLength elements through a double-buffered CopyIn -> Compute -> CopyOut pipeline, so the MTE2 load
// of tile i+1 and the MTE3 store of tile i-1 overlap the vector work on tile i. Everything is computed in
// float32; float16/bfloat16 are widened on load and rounded (to nearest even) on store.
//
// Reduced modes: each lane of a float32 accumulator tile sums its column of tiles in order; at the end the
// core folds the accumulator with ReduceSum and writes its partial to its own 32 B slot of the workspace.
// After SyncAll, core 0 adds the partials in core order, scales, and writes the 0-d result. No atomics, so
// the result is deterministic run to run for a given core count.
#include "kl_div_common.h"

using namespace AscendC;
using namespace kldiv_kernel;

template <typename T>
class KlDivForward {
 public:
  __aicore__ inline KlDivForward() {}

  __aicore__ inline void Init(GM_ADDR x, GM_ADDR target, GM_ADDR y, GM_ADDR workspace,
                              const KlDivCustomTilingData& td) {
    n_ = td.totalLength;
    tile_ = td.tileLength;
    usedCores_ = td.usedCores;
    logTarget_ = td.logTarget != 0;
    reduce_ = td.reduction != kldiv_tiling::kNone;
    scale_ = td.scale;
    core_ = static_cast<uint32_t>(GetBlockIdx());
    kldiv_tiling::CoreRange(n_, td.baseChunks, td.remChunks, core_, &start_, &len_);

    in_.Init(pipe_, x, target, start_, len_, tile_);
    // 'none': y is elementwise; reduced: y is the one-element result, written by core 0 only.
    yGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(y) + (reduce_ ? 0 : start_), reduce_ ? 1 : len_);
    wsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace),
                          usedCores_ * kldiv_tiling::kPartialStrideBytes / sizeof(float));
    if (!reduce_) pipe_.InitBuffer(yQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(wBuf_, tile_ * sizeof(float));
    if (reduce_) {
      pipe_.InitBuffer(accBuf_, tile_ * sizeof(float));
      pipe_.InitBuffer(reduceWorkBuf_, (tile_ / 64 + 8) * sizeof(float));
      // The final pass reads every core's 32 B slot; usedCores <= kMaxCores keeps this inside the reserve.
      pipe_.InitBuffer(partialBuf_, usedCores_ * kldiv_tiling::kPartialStrideBytes);
      pipe_.InitBuffer(outBuf_, 32);
    }
  }

  __aicore__ inline void Process() {
    if (reduce_) {
      acc_ = accBuf_.Get<float>();
      Duplicate(acc_, 0.0f, tile_);
    }
    in_.ForEachTile(this);
    if (reduce_) FinishReduction();
  }

 private:
  friend struct OperandTiles<T>;

  __aicore__ inline void CopyIn(uint64_t, uint32_t) {}  // x and target only: in_ loads them

  __aicore__ inline void Compute(uint32_t valid) {
    const uint32_t count = kldiv_tiling::ComputeCount(valid);
    in_.Operands(logTarget_, count);
    LocalTensor<float> xs = in_.xs;
    LocalTensor<float> ts = in_.ts;
    LocalTensor<float> w = wBuf_.Get<float>();

    if (reduce_) {
      PointwiseLoss(w, xs, ts, logTarget_, count);
      // Only the valid lanes: the lanes past a ragged tail hold stale operands.
      Add(acc_, acc_, w, valid);
      return;
    }
    LocalTensor<T> yl = yQue_.template AllocTensor<T>();
    if constexpr (IsSameType<T, float>::value) {
      PointwiseLoss(yl, xs, ts, logTarget_, count);
    } else {
      PointwiseLoss(w, xs, ts, logTarget_, count);
      FromFloat(yl, w, count);
    }
    yQue_.EnQue(yl);
  }

  __aicore__ inline void CopyOut(uint64_t off, uint32_t valid) {
    if (!reduce_) StoreFromQueue(yGm_, yQue_, off, valid);  // reduced: the tile only went into acc_
  }

  __aicore__ inline void FinishReduction() {
    // This core's partial: fold the accumulator lanes (an empty range contributes its zeros).
    LocalTensor<float> w = wBuf_.Get<float>();
    LocalTensor<float> work = reduceWorkBuf_.Get<float>();
    ReduceSum(w, acc_, work, tile_);
    LocalTensor<float> slot = outBuf_.Get<float>();
    PipeBarrier<PIPE_ALL>();
    const float partial = w.GetValue(0);
    Duplicate(slot, 0.0f, 8);
    PipeBarrier<PIPE_ALL>();
    slot.SetValue(0, partial);
    PipeBarrier<PIPE_ALL>();
    DataCopy(wsGm_[core_ * (kldiv_tiling::kPartialStrideBytes / sizeof(float))], slot, 8);
    PipeBarrier<PIPE_ALL>();

    SyncAll();
    if (core_ != 0) return;

    // Deterministic final pass: partials added in core order on the scalar unit.
    LocalTensor<float> partials = partialBuf_.Get<float>();
    const uint32_t stride = kldiv_tiling::kPartialStrideBytes / sizeof(float);
    DataCopy(partials, wsGm_, usedCores_ * stride);
    PipeBarrier<PIPE_ALL>();
    float total = 0.0f;
    for (uint32_t c = 0; c < usedCores_; ++c) total += partials.GetValue(c * stride);
    total *= scale_;

    LocalTensor<float> res = outBuf_.Get<float>();
    res.SetValue(0, total);
    PipeBarrier<PIPE_ALL>();
    if constexpr (IsSameType<T, float>::value) {
      StoreTile(yGm_, res, 0, 1);
    } else {
      LocalTensor<T> resT = wBuf_.Get<T>();
      Cast(resT, res, RoundMode::CAST_RINT, 1);
      PipeBarrier<PIPE_ALL>();
      StoreTile(yGm_, resT, 0, 1);
    }
    PipeBarrier<PIPE_ALL>();
  }

  TPipe pipe_;
  OperandTiles<T> in_;
  TQue<QuePosition::VECOUT, kldiv_tiling::kBufferNum> yQue_;
  TBuf<TPosition::VECCALC> wBuf_, accBuf_, reduceWorkBuf_, partialBuf_, outBuf_;
  GlobalTensor<T> yGm_;
  GlobalTensor<float> wsGm_;
  LocalTensor<float> acc_;
  uint64_t n_ = 0, start_ = 0, len_ = 0;
  uint32_t tile_ = 0, usedCores_ = 1, core_ = 0;
  float scale_ = 1.0f;
  bool logTarget_ = false, reduce_ = false;
};

extern "C" __global__ __aicore__ void kl_div_custom(GM_ADDR x, GM_ADDR target, GM_ADDR y, GM_ADDR workspace,
                                                    GM_ADDR tiling) {
  GET_TILING_DATA(td, tiling);
  GM_ADDR userWs = GetUserWorkspace(workspace);
  if (TILING_KEY_IS(1)) {
    KlDivForward<DTYPE_X> op;
    op.Init(x, target, y, userWs, td);
    op.Process();
  }
}
