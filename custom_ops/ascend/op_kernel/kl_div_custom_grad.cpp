// KlDivCustomGrad kernel (AscendC, vector cores): both gradients of the KL-divergence loss in one pass.
//
//   dx = g * d loss/d x,  dtarget = g * d loss/d t,  g = dout (elementwise, 'none') or dout[0] * scale.
//
// Same core split and double-buffered tile pipeline as the forward (kl_div_tiling_plan.h); x, target and
// dout are read once and dx, dtarget written once, so it moves 5 (resp. 4) tensors' bytes, the minimum.
#include "kl_div_common.h"

using namespace AscendC;
using namespace kldiv_kernel;

template <typename T>
class KlDivBackward {
 public:
  __aicore__ inline KlDivBackward() {}

  __aicore__ inline void Init(GM_ADDR x, GM_ADDR target, GM_ADDR dout, GM_ADDR dx, GM_ADDR dt,
                              const KlDivCustomTilingData& td) {
    tile_ = td.tileLength;
    logTarget_ = td.logTarget != 0;
    elementwise_ = td.reduction == kldiv_tiling::kNone;
    kldiv_tiling::CoreRange(td.totalLength, td.baseChunks, td.remChunks, static_cast<uint32_t>(GetBlockIdx()),
                            &start_, &len_);

    in_.Init(pipe_, x, target, start_, len_, tile_);
    gGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dout) + (elementwise_ ? start_ : 0), elementwise_ ? len_ : 1);
    dxGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dx) + start_, len_);
    dtGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dt) + start_, len_);
    if (elementwise_) pipe_.InitBuffer(gQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(dxQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(dtQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(w1Buf_, tile_ * sizeof(float));
    pipe_.InitBuffer(w2Buf_, tile_ * sizeof(float));
    pipe_.InitBuffer(gBuf_, elementwise_ ? tile_ * sizeof(float) : 64);

    if (!elementwise_) {
      // The one incoming gradient element, widened and scaled once per core.
      LocalTensor<T> g1 = in_.xQue.template AllocTensor<T>();
      LoadTile(g1, gGm_, 0, 1);
      PipeBarrier<PIPE_ALL>();
      LocalTensor<float> gf = gBuf_.Get<float>();
      if constexpr (IsSameType<T, float>::value) {
        gScalar_ = g1.GetValue(0);
      } else {
        Cast(gf, g1, RoundMode::CAST_NONE, 1);
        PipeBarrier<PIPE_ALL>();
        gScalar_ = gf.GetValue(0);
      }
      in_.xQue.FreeTensor(g1);
      gScalar_ *= td.scale;
    }
  }

  __aicore__ inline void Process() {
    in_.ForEachTile(this);
  }

 private:
  friend struct OperandTiles<T>;

  // The tile's dout, when elementwise (in_ loads x and target).
  __aicore__ inline void CopyIn(uint64_t off, uint32_t valid) {
    if (elementwise_) LoadToQueue(gQue_, gGm_, off, valid);
  }

  __aicore__ inline void Compute(uint32_t valid) {
    const uint32_t count = kldiv_tiling::ComputeCount(valid);
    in_.Operands(logTarget_, count);
    LocalTensor<float> w1 = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();
    PointwiseGrads(w1, w2, in_.xs, in_.ts, in_.mask, logTarget_, count);
    if (elementwise_) {
      LocalTensor<T> gl = gQue_.template DeQue<T>();
      LocalTensor<float> gf = AsFloat(gl, gBuf_.Get<float>(), count);
      Mul(w1, w1, gf, count);
      Mul(w2, w2, gf, count);
      gQue_.FreeTensor(gl);
    } else {
      Muls(w1, w1, gScalar_, count);
      Muls(w2, w2, gScalar_, count);
    }

    LocalTensor<T> dxl = dxQue_.template AllocTensor<T>();
    LocalTensor<T> dtl = dtQue_.template AllocTensor<T>();
    FromFloat(dxl, w1, count);
    FromFloat(dtl, w2, count);
    dxQue_.EnQue(dxl);
    dtQue_.EnQue(dtl);
  }

  __aicore__ inline void CopyOut(uint64_t off, uint32_t valid) {
    StoreFromQueue(dxGm_, dxQue_, off, valid);
    StoreFromQueue(dtGm_, dtQue_, off, valid);
  }

  TPipe pipe_;
  OperandTiles<T> in_;
  TQue<QuePosition::VECIN, kldiv_tiling::kBufferNum> gQue_;
  TQue<QuePosition::VECOUT, kldiv_tiling::kBufferNum> dxQue_, dtQue_;
  TBuf<TPosition::VECCALC> w1Buf_, w2Buf_, gBuf_;
  GlobalTensor<T> gGm_, dxGm_, dtGm_;
  uint64_t start_ = 0, len_ = 0;
  uint32_t tile_ = 0;
  float gScalar_ = 1.0f;
  bool logTarget_ = false, elementwise_ = true;
};

extern "C" __global__ __aicore__ void kl_div_custom_grad(GM_ADDR x, GM_ADDR target, GM_ADDR dout, GM_ADDR dx,
                                                         GM_ADDR dtarget, GM_ADDR workspace, GM_ADDR tiling) {
  (void)workspace;
  GET_TILING_DATA(td, tiling);
  if (TILING_KEY_IS(1)) {
    KlDivBackward<DTYPE_X> op;
    op.Init(x, target, dout, dx, dtarget, td);
    op.Process();
  }
}
