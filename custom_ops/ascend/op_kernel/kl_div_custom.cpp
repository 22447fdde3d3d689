// KlDivCustom forward kernel (AscendC, vector cores).
//
// Each core takes the contiguous range CoreRange() gives it (kl_div_tiling_plan.h) and walks it in tiles
// of tileLength elements through a double-buffered CopyIn -> Compute -> CopyOut pipeline, so the MTE2 load
// of tile i+1 and the MTE3 store of tile i-1 overlap the vector work on tile i. Everything is computed in
// float32; float16/bfloat16 are widened on load and rounded (to nearest even) on store.
//
// Reduced modes: the vector unit has no float64, so the sum is compensated instead. Each lane of a float32
// accumulator tile sums its column of tiles in order with Kahan's correction kept in a second tile; at the end
// the core folds both tiles in halves, each addition's rounding error (TwoSum) going into the correction, and
// writes its partial as a (sum, correction) pair to its own 32 B slot of the workspace. After SyncAll, core 0
// adds the pairs in core order the same way, scales, and writes the 0-d result. Terms of both signs that cancel
// stay at their own rounding, not at float32's of the sum of their magnitudes. No atomics, so the result is
// deterministic run to run for a given core count.
#include "kl_div_common.h"

using namespace AscendC;
using namespace kldiv_kernel;

constexpr uint32_t kBlockFloats = 32 / sizeof(float);  // one 32 B block

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
      pipe_.InitBuffer(compBuf_, tile_ * sizeof(float));
      // The final pass reads every core's 32 B slot; usedCores <= kMaxCores keeps this inside the reserve.
      pipe_.InitBuffer(partialBuf_, usedCores_ * kldiv_tiling::kPartialStrideBytes);
      pipe_.InitBuffer(outBuf_, 32);
    }
  }

  __aicore__ inline void Process() {
    if (reduce_) {
      acc_ = accBuf_.Get<float>();
      comp_ = compBuf_.Get<float>();
      Duplicate(acc_, 0.0f, tile_);
      Duplicate(comp_, 0.0f, tile_);
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
      // Only the valid lanes: the lanes past a ragged tail hold stale operands. xs and ts are free now.
      // Kahan: the lane's sum is acc - comp.
      Sub(w, w, comp_, valid);      // y = term - comp
      Add(xs, acc_, w, valid);      // s = acc + y
      Sub(ts, xs, acc_, valid);
      Sub(comp_, ts, w, valid);     // comp = (s - acc) - y
      Adds(acc_, xs, 0.0f, valid);  // acc = s
      // Once a lane's sum is inf or NaN, comp is NaN (inf - inf): reset to 0 so that an inf sum stays inf,
      // as without the correction. CompareScalar works on whole repeats: count lanes (those past valid are
      // comp's earlier, finite values).
      CompareScalar(in_.mask, comp_, kPosInf, CMPMODE::LT, count);
      Select(comp_, in_.mask, comp_, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
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

  // s + e == a + b exactly (Knuth's TwoSum: no ordering of |a|, |b| needed), on `count` lanes; s, bb, e are
  // scratch tiles distinct from a and b.
  __aicore__ inline static void TwoSum(const LocalTensor<float>& s, const LocalTensor<float>& e,
                                       const LocalTensor<float>& bb, const LocalTensor<float>& a,
                                       const LocalTensor<float>& b, uint32_t count) {
    Add(s, a, b, count);
    Sub(bb, s, a, count);
    Sub(e, s, bb, count);
    Sub(e, a, e, count);    // a - (s - bb)
    Sub(bb, b, bb, count);  // b - bb
    Add(e, e, bb, count);
  }

  __aicore__ inline static void TwoSum(float a, float b, float* s, float* e) {
    *s = a + b;
    const float bb = *s - a;
    *e = (a - (*s - bb)) + (b - bb);
  }

  __aicore__ inline void FinishReduction() {
    // This core's partial: fold the lanes in halves (a lane's value is acc - comp throughout) down to one
    // 32 B block, then add that block's lanes on the scalar unit. Halves start on 32 B boundaries.
    LocalTensor<float> s = wBuf_.Get<float>();
    LocalTensor<float> e = in_.xs;
    LocalTensor<float> bb = in_.ts;
    uint32_t n = tile_;
    while (n > kBlockFloats) {
      const uint32_t half = kBlockFloats * ((n / kBlockFloats + 1) / 2);
      const uint32_t upper = n - half;  // <= half
      TwoSum(s, e, bb, acc_, acc_[half], upper);
      Add(comp_, comp_, comp_[half], upper);
      Sub(comp_, comp_, e, upper);
      Adds(acc_, s, 0.0f, upper);
      n = half;
    }
    PipeBarrier<PIPE_ALL>();
    float sum = 0.0f, err = 0.0f;
    for (uint32_t i = 0; i < n; ++i) {
      float rounding;
      TwoSum(sum, acc_.GetValue(i), &sum, &rounding);
      err += rounding - comp_.GetValue(i);
    }
    LocalTensor<float> slot = outBuf_.Get<float>();
    Duplicate(slot, 0.0f, kBlockFloats);
    PipeBarrier<PIPE_ALL>();
    slot.SetValue(0, sum);
    slot.SetValue(1, err);
    PipeBarrier<PIPE_ALL>();
    DataCopy(wsGm_[core_ * (kldiv_tiling::kPartialStrideBytes / sizeof(float))], slot, kBlockFloats);
    PipeBarrier<PIPE_ALL>();

    SyncAll();
    if (core_ != 0) return;

    // Deterministic final pass: the (sum, correction) pairs added in core order on the scalar unit.
    LocalTensor<float> partials = partialBuf_.Get<float>();
    const uint32_t stride = kldiv_tiling::kPartialStrideBytes / sizeof(float);
    DataCopy(partials, wsGm_, usedCores_ * stride);
    PipeBarrier<PIPE_ALL>();
    float total = 0.0f, correction = 0.0f;
    for (uint32_t c = 0; c < usedCores_; ++c) {
      float rounding;
      TwoSum(total, partials.GetValue(c * stride), &total, &rounding);
      correction += rounding + partials.GetValue(c * stride + 1);
    }
    // A sum that is inf or NaN is the answer as it stands (its correction is NaN).
    if (total - total == 0.0f) total += correction;
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
  TBuf<TPosition::VECCALC> wBuf_, accBuf_, compBuf_, partialBuf_, outBuf_;
  GlobalTensor<T> yGm_;
  GlobalTensor<float> wsGm_;
  LocalTensor<float> acc_, comp_;
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
