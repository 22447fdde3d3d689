// DistillCustomGrad kernel (AscendC, vector cores): d_student and, when asked, d_teacher of the per-row
// distillation loss, in one read of each logit row, from the row statistics the forward saved (lse of both scaled
// rows and the row's KL terms, distill_custom.cpp) and the incoming per-row gradient g (float32 [rows]).
//
// Same row split and vocabulary tiles as the forward. A row with g == 0 (an ignored row, or one whose loss is not
// used) gets exact zeros without reading its logits, whatever its statistics hold (an ignored row's may be NaN).
// Formulas: distill_common.h. float32 inside, gradients rounded once to the IO dtype. With a logits transform the
// gradients are those of the transformed logits times its slope: the scale (folded into c) and, with a soft cap,
// sech^2 of each element, kept by the tile loader (SoftCapTile) in the slope tiles.
#include "distill_common.h"

using namespace AscendC;
using namespace distill_kernel;

template <typename T>
class DistillBackward {
 public:
  __aicore__ inline DistillBackward() {}

  __aicore__ inline void Init(GM_ADDR student, GM_ADDR teacher, GM_ADDR stats, GM_ADDR dloss, GM_ADDR dStudent,
                              GM_ADDR dTeacher, const DistillCustomTilingData& td) {
    temperature_ = td.temperature;
    gradScale_ = td.gradScale;
    teacherGrad_ = td.teacherGrad != 0;
    in_.Init(pipe_, student, teacher, td);
    const uint64_t n = td.rows * in_.vocab;
    statsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(stats), td.rows * distill_tiling::kStatsStride);
    gGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(dloss), td.rows);
    dsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dStudent), n);
    if (teacherGrad_) dtGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(dTeacher), n);
    pipe_.InitBuffer(dsQue_, distill_tiling::kBufferNum, in_.tile * sizeof(T));
    if (teacherGrad_) pipe_.InitBuffer(dtQue_, distill_tiling::kBufferNum, in_.tile * sizeof(T));
    pipe_.InitBuffer(w1Buf_, in_.tile * sizeof(float));
    pipe_.InitBuffer(w2Buf_, in_.tile * sizeof(float));
    if (in_.kind >= distill_tiling::kJSD) pipe_.InitBuffer(w3Buf_, in_.tile * sizeof(float));
    if (in_.softcap) {
      pipe_.InitBuffer(slopeSBuf_, in_.tile * sizeof(float));
      if (teacherGrad_) pipe_.InitBuffer(slopeTBuf_, in_.tile * sizeof(float));
      slopeS_ = slopeSBuf_.Get<float>();
      if (teacherGrad_) slopeT_ = slopeTBuf_.Get<float>();
      in_.UseCapTemps(w1Buf_.Get<float>(), w2Buf_.Get<float>());
      in_.KeepSlopes(true, slopeS_, teacherGrad_, slopeT_);
    }
    pipe_.InitBuffer(maskBuf_, in_.tile / 8);
    pipe_.InitBuffer(statBuf_, distill_tiling::kStatsStride * sizeof(float));
    pipe_.InitBuffer(gBuf_, 8 * sizeof(float));
  }

  __aicore__ inline void Process() {
    for (uint64_t r = 0; r < in_.rowCount; ++r) Row(in_.rowStart + r);
  }

 private:
  __aicore__ inline void Row(uint64_t row) {
    // The row's statistics (one 32 B block) and its incoming gradient (4 bytes).
    LocalTensor<float> st = statBuf_.Get<float>();
    LocalTensor<float> g1 = gBuf_.Get<float>();
    DataCopy(st, statsGm_[row * distill_tiling::kStatsStride], distill_tiling::kStatsStride);
    LoadTile(g1, gGm_, row, 1);  // 4 bytes: DataCopyPad
    SetFlag<HardEvent::MTE2_S>(0);
    WaitFlag<HardEvent::MTE2_S>(0);
    const float g = g1.GetValue(0);
    lseS_ = st.GetValue(distill_tiling::kLseStudent);
    lseT_ = st.GetValue(distill_tiling::kLseTeacher);
    k1_ = st.GetValue(distill_tiling::kK1);
    k2_ = st.GetValue(distill_tiling::kK2);
    c_ = g * temperature_ * gradScale_;
    const bool zero = g == 0.0f;

    const uint64_t tiles = distill_tiling::TileCount(in_.vocab, in_.tile);
    // Tile i + 1 is loaded before tile i is computed (the input queues are kBufferNum = 2 deep), so the load
    // overlaps the vector work.
    if (!zero) in_.Prefetch(row, 0, tiles);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint32_t valid = in_.Valid(i);
      const uint32_t count = distill_tiling::ComputeCount(valid);
      if (zero) {
        ZeroTile(count);
      } else {
        in_.Prefetch(row, i + 1, tiles);
        Compute(count);
      }
      CopyOut(row * in_.vocab + i * in_.tile, valid);
    }
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
    in_.Scaled(count);
    LocalTensor<float> ls = in_.First();
    LocalTensor<float> lt = in_.Second();
    Adds(ls, ls, -lseS_, count);
    Adds(lt, lt, -lseT_, count);

    LocalTensor<float> w1 = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();
    LocalTensor<uint8_t> mask = maskBuf_.Get<uint8_t>();
    LocalTensor<T> dsl = dsQue_.template AllocTensor<T>();
    LocalTensor<T> dtl;
    if (teacherGrad_) dtl = dtQue_.template AllocTensor<T>();

    if (in_.kind == distill_tiling::kJSD) {
      LocalTensor<float> w3 = w3Buf_.Get<float>();
      LogMixture(w1, ls, lt, w2, w3, in_.logBeta, in_.log1mBeta, count);  // w1 = log M
      // d_s = c (1 - beta) P_s (ls - log M - K_s)
      KlLanes(w3, w2, ls, w1, k1_, mask, count);
      Out(true, dsl, dtl, w3, c_ * (1.0f - in_.beta), count);
      if (teacherGrad_) {  // d_t = c beta P_t (lt - log M - K_t)
        KlLanes(w3, w2, lt, w1, k2_, mask, count);
        Out(false, dsl, dtl, w3, c_ * in_.beta, count);
      }
    } else if (in_.kind > distill_tiling::kJSD) {
      MenuGrads(ls, lt, dsl, dtl, mask, count);
    } else {
      // KL(P_a || P_b): d/db = c (P_b - P_a), d/da = c P_a (la - lb - K).
      const bool aIsStudent = in_.kind == distill_tiling::kReverseKL;
      LocalTensor<float> la = aIsStudent ? ls : lt;
      LocalTensor<float> lb = aIsStudent ? lt : ls;
      const bool wantA = aIsStudent || teacherGrad_;
      const bool wantB = !aIsStudent || teacherGrad_;
      if (wantA) {
        KlLanes(w2, w1, la, lb, k1_, mask, count);  // w1 = P_a
        Out(aIsStudent, dsl, dtl, w2, c_, count);
      } else {
        Exp(w1, la, count);  // P_a
      }
      if (wantB) {
        Exp(w2, lb, count);
        Sub(w2, w2, w1, count);
        Out(!aIsStudent, dsl, dtl, w2, c_, count);
      }
    }
    dsQue_.EnQue(dsl);
    if (teacherGrad_) dtQue_.EnQue(dtl);
  }

  // The gradient lanes w of the student's (or the teacher's) transformed logits, times c and the soft cap's slope,
  // into that output's tile (w is clobbered).
  __aicore__ inline void Out(bool student, const LocalTensor<T>& dsl, const LocalTensor<T>& dtl,
                             const LocalTensor<float>& w, float c, uint32_t count) {
    if (in_.softcap) Mul(w, w, student ? slopeS_ : slopeT_, count);
    ScaleOut(student ? dsl : dtl, w, c, count);
  }

  // The other divergences: d/ds = c (a - P_s sum(a)), d/dt = c (b - P_t sum(b)) (distill_common.h), with
  // sum(a) = k1_, sum(b) = k2_. ls, lt: the log-probabilities (clobbered).
  __aicore__ inline void MenuGrads(const LocalTensor<float>& ls, const LocalTensor<float>& lt, const LocalTensor<T>& dsl,
                                   const LocalTensor<T>& dtl, const LocalTensor<uint8_t>& mask, uint32_t count) {
    LocalTensor<float> w1 = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();
    LocalTensor<float> w3 = w3Buf_.Get<float>();
    const float alpha = in_.alpha;
    if (in_.kind == distill_tiling::kTvd) {
      Exp(w1, ls, count);  // P_s
      Exp(w2, lt, count);  // P_t
      Sub(ls, w1, w2, count);
      Sign(w3, ls, mask, count);
      Muls(ls, w3, 0.5f, count);  // a / P_s - sum(a)
      Adds(ls, ls, -k1_, count);
      Mul(ls, ls, w1, count);
      Out(true, dsl, dtl, ls, c_, count);
      if (teacherGrad_) {
        Muls(lt, w3, -0.5f, count);  // b / P_t - sum(b)
        Adds(lt, lt, -k2_, count);
        Mul(lt, lt, w2, count);
        Out(false, dsl, dtl, lt, c_, count);
      }
    } else if (in_.kind == distill_tiling::kSymmetric) {
      SymmetricLanes(w1, w2, w3, ls, lt, 1.0f - alpha, alpha, k1_, mask, count);
      Out(true, dsl, dtl, w1, c_, count);
      if (teacherGrad_) {
        SymmetricLanes(w1, w2, w3, lt, ls, alpha, 1.0f - alpha, k2_, mask, count);
        Out(false, dsl, dtl, w1, c_, count);
      }
    } else {  // skew KL (P = P_t, Q = P_s) / skew reverse KL (P = P_s, Q = P_t), M = alpha P + (1 - alpha) Q
      const bool tWeighs = in_.kind == distill_tiling::kSkewKl;
      const LocalTensor<float>& lp = tWeighs ? lt : ls;
      const LocalTensor<float>& lq = tWeighs ? ls : lt;
      const float sumP = tWeighs ? k2_ : k1_, sumQ = tWeighs ? k1_ : k2_;
      const float logWp = tWeighs ? in_.logBeta : in_.log1mBeta, logWq = tWeighs ? in_.log1mBeta : in_.logBeta;
      LogMix(w1, ls, lt, w2, w3, in_.logBeta, in_.log1mBeta, count);  // log M
      if (tWeighs || teacherGrad_) {  // Q (the student for skew KL): -(1 - alpha) P Q / M - Q sum
        PowLanes(w2, lp, lq, w1, logWq, mask, count);
        Muls(w2, w2, -1.0f, count);
        Exp(w3, lq, count);
        Muls(w3, w3, -sumQ, count);
        Add(w3, w3, w2, count);
        Out(tWeighs, dsl, dtl, w3, c_, count);
      }
      if (!tWeighs || teacherGrad_) {  // P (the student for skew RKL): P (lp - log M - sum) - alpha P^2 / M
        PowLanes(w2, lp, lp, w1, logWp, mask, count);
        Muls(w2, w2, -1.0f, count);
        KlLanes(w3, lq, lp, w1, sumP, mask, count);  // lq is free now: P there
        Add(w3, w3, w2, count);
        Out(!tWeighs, dsl, dtl, w3, c_, count);
      }
    }
  }

  // w = self P_x (lx - ly) - other P_y - sum P_x: the symmetric KL's a - P_s sum(a) (x = s) or b - P_t sum(b)
  // (x = t). p, o: temporaries.
  __aicore__ inline void SymmetricLanes(const LocalTensor<float>& w, const LocalTensor<float>& p,
                                        const LocalTensor<float>& o, const LocalTensor<float>& lx,
                                        const LocalTensor<float>& ly, float self, float other, float sum,
                                        const LocalTensor<uint8_t>& mask, uint32_t count) {
    KlLanes(w, p, lx, ly, 0.0f, mask, count);  // P_x (lx - ly), P_x
    Muls(w, w, self, count);
    Muls(p, p, -sum, count);
    Add(w, w, p, count);
    Exp(o, ly, count);
    Muls(o, o, -other, count);
    Add(w, w, o, count);
  }

  __aicore__ inline void CopyOut(uint64_t off, uint32_t valid) {
    StoreFromQueue(dsGm_, dsQue_, off, valid);
    if (teacherGrad_) StoreFromQueue(dtGm_, dtQue_, off, valid);
  }

  TPipe pipe_;
  LogitTiles<T> in_;  // first = student, second = teacher
  TQue<QuePosition::VECOUT, distill_tiling::kBufferNum> dsQue_, dtQue_;
  TBuf<TPosition::VECCALC> w1Buf_, w2Buf_, w3Buf_, slopeSBuf_, slopeTBuf_, maskBuf_, statBuf_, gBuf_;
  LocalTensor<float> slopeS_, slopeT_;  // the soft cap's slopes of the student's and the teacher's tile
  GlobalTensor<T> dsGm_, dtGm_;
  GlobalTensor<float> statsGm_, gGm_;
  float temperature_ = 1.0f, gradScale_ = 1.0f;
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
