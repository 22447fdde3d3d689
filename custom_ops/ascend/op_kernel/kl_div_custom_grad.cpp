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

    xGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(x) + start_, len_);
    tGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(target) + start_, len_);
    gGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dout) + (elementwise_ ? start_ : 0), elementwise_ ? len_ : 1);
    dxGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dx) + start_, len_);
    dtGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dt) + start_, len_);

    pipe_.InitBuffer(xQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(tQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    if (elementwise_) pipe_.InitBuffer(gQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(dxQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(dtQue_, kldiv_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(xsBuf_, tile_ * sizeof(float));
    pipe_.InitBuffer(tsBuf_, tile_ * sizeof(float));
    pipe_.InitBuffer(w1Buf_, tile_ * sizeof(float));
    pipe_.InitBuffer(w2Buf_, tile_ * sizeof(float));
    pipe_.InitBuffer(gBuf_, elementwise_ ? tile_ * sizeof(float) : 64);
    pipe_.InitBuffer(maskBuf_, tile_ / 8);

    if (!elementwise_) {
      // The one incoming gradient element, widened and scaled once per core.
      LocalTensor<T> g1 = xQue_.template AllocTensor<T>();
      LoadTile(g1, gGm_, 1);
      PipeBarrier<PIPE_ALL>();
      LocalTensor<float> gf = gBuf_.Get<float>();
      if constexpr (IsSameType<T, float>::value) {
        gScalar_ = g1.GetValue(0);
      } else {
        Cast(gf, g1, RoundMode::CAST_NONE, 1);
        PipeBarrier<PIPE_ALL>();
        gScalar_ = gf.GetValue(0);
      }
      xQue_.FreeTensor(g1);
      gScalar_ *= td.scale;
    }
  }

  __aicore__ inline void Process() {
    const uint64_t tiles = kldiv_tiling::TileCount(len_, tile_);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint64_t off = i * tile_;
      const uint32_t valid = static_cast<uint32_t>(len_ - off < tile_ ? len_ - off : tile_);
      CopyIn(off, valid);
      Compute(valid);
      CopyOut(off, valid);
    }
  }

 private:
  __aicore__ inline void CopyIn(uint64_t off, uint32_t valid) {
    LocalTensor<T> xl = xQue_.template AllocTensor<T>();
    LocalTensor<T> tl = tQue_.template AllocTensor<T>();
    LoadTile(xl, xGm_[off], valid);
    LoadTile(tl, tGm_[off], valid);
    xQue_.EnQue(xl);
    tQue_.EnQue(tl);
    if (elementwise_) {
      LocalTensor<T> gl = gQue_.template AllocTensor<T>();
      LoadTile(gl, gGm_[off], valid);
      gQue_.EnQue(gl);
    }
  }

  __aicore__ inline void Compute(uint32_t valid) {
    const uint32_t count = kldiv_tiling::ComputeCount(valid);
    LocalTensor<T> xl = xQue_.template DeQue<T>();
    LocalTensor<T> tl = tQue_.template DeQue<T>();
    LocalTensor<float> xs = xsBuf_.Get<float>();
    LocalTensor<float> ts = tsBuf_.Get<float>();
    LocalTensor<float> w1 = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();
    LocalTensor<uint8_t> mask = maskBuf_.Get<uint8_t>();

    LocalTensor<float> tf = AsFloat(tl, ts, count);
    MassMask(mask, tf, logTarget_, count);
    LocalTensor<float> xf = AsFloat(xl, xs, count);
    SafeOperands(xs, ts, xf, tf, mask, logTarget_, count);
    xQue_.FreeTensor(xl);
    tQue_.FreeTensor(tl);

    PointwiseGrads(w1, w2, xs, ts, mask, logTarget_, count);
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
    LocalTensor<T> dxl = dxQue_.template DeQue<T>();
    LocalTensor<T> dtl = dtQue_.template DeQue<T>();
    StoreTile(dxGm_[off], dxl, valid);
    StoreTile(dtGm_[off], dtl, valid);
    dxQue_.FreeTensor(dxl);
    dtQue_.FreeTensor(dtl);
  }

  TPipe pipe_;
  TQue<QuePosition::VECIN, kldiv_tiling::kBufferNum> xQue_, tQue_, gQue_;
  TQue<QuePosition::VECOUT, kldiv_tiling::kBufferNum> dxQue_, dtQue_;
  TBuf<TPosition::VECCALC> xsBuf_, tsBuf_, w1Buf_, w2Buf_, gBuf_, maskBuf_;
  GlobalTensor<T> xGm_, tGm_, gGm_, dxGm_, dtGm_;
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
