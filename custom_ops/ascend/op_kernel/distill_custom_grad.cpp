// DistillCustomGrad kernel (AscendC, vector cores): d_student and, when asked, d_teacher of the per-row
// distillation loss, in one read of each logit row, from the row statistics the forward saved (lse of both scaled
// rows and the row's KL terms, distill_custom.cpp) and the incoming per-row gradient g (float32 [rows]).
//
// Same row split and vocabulary tiles as the forward. A row with g == 0 (an ignored row, or one whose loss is not
// used) gets exact zeros without reading its logits, whatever its statistics hold (an ignored row's may be NaN).
// Formulas: distill_common.h. float32 inside, gradients rounded once to the IO dtype.
#include "distill_common.h"

using namespace AscendC;
using namespace distill_kernel;

template <typename T>
class DistillBackward {
 public:
  __aicore__ inline DistillBackward() {}

  __aicore__ inline void Init(GM_ADDR student, GM_ADDR teacher, GM_ADDR stats, GM_ADDR dloss, GM_ADDR dStudent,
                              GM_ADDR dTeacher, const DistillCustomTilingData& td) {
    vocab_ = td.vocab;
    tile_ = td.tileLength;
    kind_ = td.kind;
    invT_ = td.invTemperature;
    temperature_ = td.temperature;
    beta_ = td.beta;
    logBeta_ = td.logBeta;
    log1mBeta_ = td.log1mBeta;
    teacherGrad_ = td.teacherGrad != 0;
    distill_tiling::RowRange(td.baseRows, td.remRows, static_cast<uint32_t>(GetBlockIdx()), &rowStart_, &rowCount_);

    const uint64_t n = td.rows * vocab_;
    sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(student), n);
    tGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(teacher), n);
    statsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(stats), td.rows * distill_tiling::kStatsStride);
    gGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(dloss), td.rows);
    dsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dStudent), n);
    if (teacherGrad_) dtGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dTeacher), n);

    pipe_.InitBuffer(sQue_, distill_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(tQue_, distill_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(dsQue_, distill_tiling::kBufferNum, tile_ * sizeof(T));
    if (teacherGrad_) pipe_.InitBuffer(dtQue_, distill_tiling::kBufferNum, tile_ * sizeof(T));
    pipe_.InitBuffer(sBuf_, tile_ * sizeof(float));
    pipe_.InitBuffer(tBuf_, tile_ * sizeof(float));
    pipe_.InitBuffer(w1Buf_, tile_ * sizeof(float));
    pipe_.InitBuffer(w2Buf_, tile_ * sizeof(float));
    if (kind_ == distill_tiling::kJSD) pipe_.InitBuffer(w3Buf_, tile_ * sizeof(float));
    pipe_.InitBuffer(maskBuf_, tile_ / 8);
    pipe_.InitBuffer(statBuf_, distill_tiling::kStatsStride * sizeof(float));
    pipe_.InitBuffer(gBuf_, 8 * sizeof(float));
  }

  __aicore__ inline void Process() {
    for (uint64_t r = 0; r < rowCount_; ++r) Row(rowStart_ + r);
  }

 private:
  __aicore__ inline void Row(uint64_t row) {
    // The row's statistics (one 32 B block) and its incoming gradient (4 bytes).
    LocalTensor<float> st = statBuf_.Get<float>();
    LocalTensor<float> g1 = gBuf_.Get<float>();
    DataCopy(st, statsGm_[row * distill_tiling::kStatsStride], distill_tiling::kStatsStride);
    DataCopyExtParams params{1, static_cast<uint32_t>(sizeof(float)), 0, 0, 0};
    DataCopyPadExtParams<float> pad{false, 0, 0, 0.0f};
    DataCopyPad(g1, gGm_[row], params, pad);
    SetFlag<HardEvent::MTE2_S>(0);
    WaitFlag<HardEvent::MTE2_S>(0);
    const float g = g1.GetValue(0);
    lseS_ = st.GetValue(distill_tiling::kLseStudent);
    lseT_ = st.GetValue(distill_tiling::kLseTeacher);
    k1_ = st.GetValue(distill_tiling::kK1);
    k2_ = st.GetValue(distill_tiling::kK2);
    c_ = g * temperature_;
    const bool zero = g == 0.0f;

    const uint64_t tiles = distill_tiling::TileCount(vocab_, tile_);
    // Tile i + 1 is loaded before tile i is computed (the input queues are kBufferNum = 2 deep), so the load
    // overlaps the vector work.
    if (!zero) Prefetch(row, 0, tiles);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint32_t valid = Valid(i);
      const uint32_t count = distill_tiling::ComputeCount(valid);
      if (zero) {
        ZeroTile(count);
      } else {
        Prefetch(row, i + 1, tiles);
        Compute(count);
      }
      CopyOut(row * vocab_ + i * tile_, valid);
    }
  }

  __aicore__ inline uint32_t Valid(uint64_t i) const {
    const uint64_t off = i * tile_;
    return static_cast<uint32_t>(vocab_ - off < tile_ ? vocab_ - off : tile_);
  }

  __aicore__ inline void Prefetch(uint64_t row, uint64_t i, uint64_t tiles) {
    if (i < tiles) CopyIn(row * vocab_ + i * tile_, Valid(i));
  }

  __aicore__ inline void CopyIn(uint64_t off, uint32_t valid) {
    LocalTensor<T> sl = sQue_.template AllocTensor<T>();
    LocalTensor<T> tl = tQue_.template AllocTensor<T>();
    LoadRow(sl, sGm_, off, valid);
    LoadRow(tl, tGm_, off, valid);
    sQue_.EnQue(sl);
    tQue_.EnQue(tl);
  }

  __aicore__ inline void ZeroTile(uint32_t count) {
    LocalTensor<float> w = w1Buf_.Get<float>();
    Duplicate(w, 0.0f, count);
    LocalTensor<T> dsl = dsQue_.template AllocTensor<T>();
    ScaleOut(dsl, w, 1.0f, count);
    dsQue_.EnQue(dsl);
    if (teacherGrad_) {
      LocalTensor<T> dtl = dtQue_.template AllocTensor<T>();
      ScaleOut(dtl, w, 1.0f, count);
      dtQue_.EnQue(dtl);
    }
  }

  __aicore__ inline void Compute(uint32_t count) {
    LocalTensor<T> sl = sQue_.template DeQue<T>();
    LocalTensor<T> tl = tQue_.template DeQue<T>();
    LocalTensor<float> ls = sBuf_.Get<float>();
    LocalTensor<float> lt = tBuf_.Get<float>();
    ScaledFloat(ls, sl, invT_, count);
    ScaledFloat(lt, tl, invT_, count);
    sQue_.FreeTensor(sl);
    tQue_.FreeTensor(tl);
    Adds(ls, ls, -lseS_, count);
    Adds(lt, lt, -lseT_, count);

    LocalTensor<float> w1 = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();
    LocalTensor<uint8_t> mask = maskBuf_.Get<uint8_t>();
    LocalTensor<T> dsl = dsQue_.template AllocTensor<T>();
    LocalTensor<T> dtl;
    if (teacherGrad_) dtl = dtQue_.template AllocTensor<T>();

    if (kind_ == distill_tiling::kJSD) {
      LocalTensor<float> w3 = w3Buf_.Get<float>();
      LogMixture(w1, ls, lt, w2, w3, logBeta_, log1mBeta_, count);  // w1 = log M
      // d_s = c (1 - beta) P_s (ls - log M - K_s)
      Exp(w2, ls, count);
      Sub(w3, ls, w1, count);
      Adds(w3, w3, -k1_, count);
      Mul(w3, w2, w3, count);
      ZeroWhereNoMass(w3, ls, mask, count);
      ScaleOut(dsl, w3, c_ * (1.0f - beta_), count);
      if (teacherGrad_) {  // d_t = c beta P_t (lt - log M - K_t)
        Exp(w2, lt, count);
        Sub(w3, lt, w1, count);
        Adds(w3, w3, -k2_, count);
        Mul(w3, w2, w3, count);
        ZeroWhereNoMass(w3, lt, mask, count);
        ScaleOut(dtl, w3, c_ * beta_, count);
      }
    } else {
      // KL(P_a || P_b): d/db = c (P_b - P_a), d/da = c P_a (la - lb - K).
      const bool aIsStudent = kind_ == distill_tiling::kReverseKL;
      LocalTensor<float> la = aIsStudent ? ls : lt;
      LocalTensor<float> lb = aIsStudent ? lt : ls;
      const bool wantA = aIsStudent || teacherGrad_;
      const bool wantB = !aIsStudent || teacherGrad_;
      Exp(w1, la, count);  // P_a
      if (wantB) {
        Exp(w2, lb, count);
        Sub(w2, w2, w1, count);
        ScaleOut(aIsStudent ? dtl : dsl, w2, c_, count);
      }
      if (wantA) {
        Sub(w2, la, lb, count);
        Adds(w2, w2, -k1_, count);
        Mul(w2, w1, w2, count);
        ZeroWhereNoMass(w2, la, mask, count);
        ScaleOut(aIsStudent ? dsl : dtl, w2, c_, count);
      }
    }
    dsQue_.EnQue(dsl);
    if (teacherGrad_) dtQue_.EnQue(dtl);
  }

  __aicore__ inline void CopyOut(uint64_t off, uint32_t valid) {
    LocalTensor<T> dsl = dsQue_.template DeQue<T>();
    StoreRow(dsGm_, dsl, off, valid);
    dsQue_.FreeTensor(dsl);
    if (teacherGrad_) {
      LocalTensor<T> dtl = dtQue_.template DeQue<T>();
      StoreRow(dtGm_, dtl, off, valid);
      dtQue_.FreeTensor(dtl);
    }
  }

  TPipe pipe_;
  TQue<QuePosition::VECIN, distill_tiling::kBufferNum> sQue_, tQue_;
  TQue<QuePosition::VECOUT, distill_tiling::kBufferNum> dsQue_, dtQue_;
  TBuf<TPosition::VECCALC> sBuf_, tBuf_, w1Buf_, w2Buf_, w3Buf_, maskBuf_, statBuf_, gBuf_;
  GlobalTensor<T> sGm_, tGm_, dsGm_, dtGm_;
  GlobalTensor<float> statsGm_, gGm_;
  uint64_t vocab_ = 0, rowStart_ = 0, rowCount_ = 0;
  uint32_t tile_ = 0, kind_ = 0;
  float invT_ = 1.0f, temperature_ = 1.0f, beta_ = 0.0f, logBeta_ = 0.0f, log1mBeta_ = 0.0f;
  float lseS_ = 0.0f, lseT_ = 0.0f, k1_ = 0.0f, k2_ = 0.0f, c_ = 0.0f;
  bool teacherGrad_ = false;
};

// d_teacher is a one-element placeholder when teacher_grad is false (InferShape): nothing is written to it then.
extern "C" __global__ __aicore__ void distill_custom_grad(GM_ADDR student, GM_ADDR teacher, GM_ADDR stats,
                                                          GM_ADDR dloss, GM_ADDR dStudent, GM_ADDR dTeacher,
                                                          GM_ADDR workspace, GM_ADDR tiling) {
  (void)workspace;
  GET_TILING_DATA(td, tiling);
  if (TILING_KEY_IS(1)) {
    DistillBackward<DTYPE_STUDENT> op;
    op.Init(student, teacher, stats, dloss, dStudent, dTeacher, td);
    op.Process();
  }
}
