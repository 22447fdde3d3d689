// DistillCustom forward kernel (AscendC, vector cores): per row of student and teacher logits [rows, V], the
// distillation loss and the row statistics the backward needs, with no [rows, V] intermediate.
//
// Rows are split over the cores (distill_tiling_plan.h RowRange); a row is walked in vocabulary tiles through
// double-buffered queues (a 152K row does not fit in the UB). Everything is float32 inside.
//
// KL (beta 0 or 1), one read of the row: KL(P_a || P_b) kept online. With running shifts m_a, m_b (the running
// maxima of a' and b', 0 while a side has seen only -inf) and u = a' - m_a, v = b' - m_b:
//   S_a = sum e^u,  S_b = sum e^v,  B = sum e^u (u - v)   (terms with e^u = 0, i.e. a' = -inf, are 0)
// When a shift grows by d_a (d_b), S_a *= e^-d_a, S_b *= e^-d_b and B = e^-d_a (B - (d_a - d_b) S_a), exact
// algebra; B = +inf (b' = -inf where a has mass) stays +inf. At the row's end
//   lse_a = m_a + ln S_a,  lse_b = m_b + ln S_b,  K = B / S_a - ln S_a + ln S_b.
// The terms u - v are bounded by the logits' spread within the row, not by their size, so logits of 1e4 cost no
// accuracy.
//
// JSD (0 < beta < 1): log M needs both normalisers, so the row is read twice: pass 1 the online max and sum-exp
// of both sides, pass 2 the two KL terms against M. The other divergences (TVD, skew KL, skew reverse KL,
// symmetric KL; distill_common.h) read it twice the same way, pass 2 summing each class's term, a and b.
//
// Output: float32 stats [rows, 8]: loss (T^2 times the divergence), lse_student, lse_teacher, K1, K2, 0, 0, 0
// (KL: K1 = K; JSD: K1 = K_s, K2 = K_t; the other divergences: K1 = sum(a), K2 = sum(b)). lse and K are of the
// scaled (transformed, then divided by T) logits, what the backward reads.
#include "distill_common.h"

using namespace AscendC;
using namespace distill_kernel;

template <typename T>
class DistillForward {
 public:
  __aicore__ inline DistillForward() {}

  __aicore__ inline void Init(GM_ADDR student, GM_ADDR teacher, GM_ADDR stats, const DistillCustomTilingData& td) {
    tSquared_ = td.tSquared;
    // KL(P_a || P_b): a = teacher for forward KL, the student for reverse KL. JSD reads them as (s, t) = (b, a).
    const bool aIsStudent = td.kind == distill_tiling::kReverseKL;
    in_.Init(pipe_, aIsStudent ? student : teacher, aIsStudent ? teacher : student, td);
    statsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(stats), td.rows * distill_tiling::kStatsStride);
    pipe_.InitBuffer(w1Buf_, in_.tile * sizeof(float));
    pipe_.InitBuffer(w2Buf_, in_.tile * sizeof(float));
    if (in_.kind >= distill_tiling::kJSD) pipe_.InitBuffer(w3Buf_, in_.tile * sizeof(float));
    pipe_.InitBuffer(maskBuf_, in_.tile / 8);
    pipe_.InitBuffer(workBuf_, (in_.tile / 32 + distill_tiling::kReduceWorkFixedFloats) * sizeof(float));
    pipe_.InitBuffer(scalarBuf_, distill_tiling::kScalarFloats * sizeof(float));
    pipe_.InitBuffer(statBuf_, distill_tiling::kStatsStride * sizeof(float));
    mask_ = maskBuf_.Get<uint8_t>();
    work_ = workBuf_.Get<float>();
    sc_ = scalarBuf_.Get<float>();
    in_.UseCapTemps(w1Buf_.Get<float>(), w2Buf_.Get<float>());
  }

  __aicore__ inline void Process() {
    for (uint64_t r = 0; r < in_.rowCount; ++r) {
      const uint64_t row = in_.rowStart + r;
      if (in_.kind == distill_tiling::kJSD) {
        JsdRow(row);
      } else if (in_.kind > distill_tiling::kJSD) {
        MenuRow(row);
      } else {
        KlRow(row);
      }
    }
  }

 private:
  // Slots of scalarBuf_ (32 B apart, so every vector result starts a block).
  static constexpr uint32_t kMaxA = 0, kMaxB = 8, kSumA = 16, kSumB = 24, kTerm = 32, kExp = 40, kExtra = 48;

  // Online max and sum-exp of both sides over one tile (and, for KL, the running B). Updates the members.
  __aicore__ inline void OnlineTile(uint32_t valid, uint32_t count, bool withTerm) {
    LocalTensor<float> a = in_.First();
    LocalTensor<float> b = in_.Second();
    LocalTensor<float> w1 = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();

    ReduceMax(sc_[kMaxA], a, work_, valid);
    ReduceMax(sc_[kMaxB], b, work_, valid);
    VectorToScalar();
    const float tileMaxA = sc_.GetValue(kMaxA);
    const float tileMaxB = sc_.GetValue(kMaxB);
    // Shifts: the running maxima, 0 while only -inf was seen (exp(-inf - 0) = 0 keeps those sums exactly 0).
    if (tileMaxA > maxA_) maxA_ = tileMaxA;
    if (tileMaxB > maxB_) maxB_ = tileMaxB;
    const float newShiftA = maxA_ == kNegInf ? 0.0f : maxA_;
    const float newShiftB = maxB_ == kNegInf ? 0.0f : maxB_;
    const float dA = newShiftA - shiftA_;
    const float dB = newShiftB - shiftB_;
    shiftA_ = newShiftA;
    shiftB_ = newShiftB;
    sc_.SetValue(kExp, -dA);
    sc_.SetValue(kExp + 1, -dB);
    ScalarToVector();
    Exp(sc_[kExp], sc_[kExp], 8);

    Adds(a, a, -newShiftA, count);  // u
    Adds(b, b, -newShiftB, count);  // v
    Exp(w1, a, count);
    ReduceSum(sc_[kSumA], w1, work_, valid);
    Exp(w2, b, count);
    ReduceSum(sc_[kSumB], w2, work_, valid);
    if (withTerm) {
      Sub(w2, a, b, count);
      ZeroWhereNoMass(w2, a, mask_, count);
      Mul(w2, w1, w2, count);
      ReduceSum(sc_[kTerm], w2, work_, valid);
    }
    VectorToScalar();
    const float fA = sc_.GetValue(kExp);
    const float fB = sc_.GetValue(kExp + 1);
    if (withTerm && termB_ != kPosInf) {
      termB_ = fA * (termB_ - (dA - dB) * sumA_) + sc_.GetValue(kTerm);
    } else if (withTerm) {
      termB_ = kPosInf + sc_.GetValue(kTerm);  // stays +inf (NaN only if a NaN logit made the tile's term NaN)
    }
    sumA_ = sumA_ * fA + sc_.GetValue(kSumA);
    sumB_ = sumB_ * fB + sc_.GetValue(kSumB);
  }

  __aicore__ inline void ResetRow() {
    maxA_ = kNegInf;
    maxB_ = kNegInf;
    shiftA_ = 0.0f;
    shiftB_ = 0.0f;
    sumA_ = 0.0f;
    sumB_ = 0.0f;
    termB_ = 0.0f;
  }

  // (ln sumA_, ln sumB_) through the vector unit (the scalar unit has no logarithm).
  __aicore__ inline void LogSums(float* lnA, float* lnB) {
    sc_.SetValue(kExp, sumA_);
    sc_.SetValue(kExp + 1, sumB_);
    ScalarToVector();
    Ln(sc_[kExp], sc_[kExp], 8);
    VectorToScalar();
    *lnA = sc_.GetValue(kExp);
    *lnB = sc_.GetValue(kExp + 1);
  }

  // One walk over the row: the online max and sum-exp of both sides (and, withTerm, KL's running B) from zero.
  __aicore__ inline void OnlineRow(uint64_t row, uint64_t tiles, bool withTerm) {
    ResetRow();
    in_.Prefetch(row, 0, tiles);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint32_t valid = in_.Next(row, i, tiles);
      OnlineTile(valid, distill_tiling::ComputeCount(valid), withTerm);
    }
  }

  __aicore__ inline void KlRow(uint64_t row) {
    OnlineRow(row, distill_tiling::TileCount(in_.vocab, in_.tile), true);
    float lnA = 0.0f, lnB = 0.0f;
    LogSums(&lnA, &lnB);
    const float k = termB_ / sumA_ - lnA + lnB;
    const float lseA = shiftA_ + lnA;
    const float lseB = shiftB_ + lnB;
    const bool aIsStudent = in_.kind == distill_tiling::kReverseKL;
    WriteStats(row, tSquared_ * k, aIsStudent ? lseA : lseB, aIsStudent ? lseB : lseA, k, 0.0f);
  }

  __aicore__ inline void JsdRow(uint64_t row) {
    // Pass 1: both normalisers. a = teacher, b = student here.
    const uint64_t tiles = distill_tiling::TileCount(in_.vocab, in_.tile);
    OnlineRow(row, tiles, false);
    float lnT = 0.0f, lnS = 0.0f;
    LogSums(&lnT, &lnS);
    const float lseT = shiftA_ + lnT;
    const float lseS = shiftB_ + lnS;

    // Pass 2: K_s = sum P_s (ls - lm), K_t = sum P_t (lt - lm).
    LocalTensor<float> lt = in_.First();
    LocalTensor<float> ls = in_.Second();
    LocalTensor<float> lm = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();
    LocalTensor<float> w3 = w3Buf_.Get<float>();
    float ks = 0.0f, kt = 0.0f;
    in_.Prefetch(row, 0, tiles);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint32_t valid = in_.Next(row, i, tiles);
      const uint32_t count = distill_tiling::ComputeCount(valid);
      Adds(lt, lt, -lseT, count);
      Adds(ls, ls, -lseS, count);
      LogMixture(lm, ls, lt, w2, w3, in_.logBeta, in_.log1mBeta, count);
      KlLanes(w3, w2, ls, lm, 0.0f, mask_, count);
      ReduceSum(sc_[kSumA], w3, work_, valid);
      KlLanes(w3, w2, lt, lm, 0.0f, mask_, count);
      ReduceSum(sc_[kSumB], w3, work_, valid);
      VectorToScalar();
      ks += sc_.GetValue(kSumA);
      kt += sc_.GetValue(kSumB);
    }
    WriteStats(row, tSquared_ * (in_.beta * kt + (1.0f - in_.beta) * ks), lseS, lseT, ks, kt);
  }

  // The other divergences: pass 1 both normalisers (as the JSD), pass 2 the sums of each class's term, a and b.
  __aicore__ inline void MenuRow(uint64_t row) {
    const uint64_t tiles = distill_tiling::TileCount(in_.vocab, in_.tile);
    OnlineRow(row, tiles, false);  // a = teacher, b = student
    float lnT = 0.0f, lnS = 0.0f;
    LogSums(&lnT, &lnS);
    const float lseT = shiftA_ + lnT;
    const float lseS = shiftB_ + lnS;

    LocalTensor<float> lt = in_.First();
    LocalTensor<float> ls = in_.Second();
    float total = 0.0f, sumA = 0.0f, sumB = 0.0f;
    in_.Prefetch(row, 0, tiles);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint32_t valid = in_.Next(row, i, tiles);
      const uint32_t count = distill_tiling::ComputeCount(valid);
      Adds(lt, lt, -lseT, count);
      Adds(ls, ls, -lseS, count);
      MenuTile(ls, lt, valid, count, &total, &sumA, &sumB);
    }
    WriteStats(row, tSquared_ * total, lseS, lseT, sumA, sumB);
  }

  // One tile's sums of the class terms, a and b (distill_common.h) added to *total, *sumA, *sumB. ls, lt: the
  // log-probabilities (clobbered).
  __aicore__ inline void MenuTile(const LocalTensor<float>& ls, const LocalTensor<float>& lt, uint32_t valid,
                                  uint32_t count, float* total, float* sumA, float* sumB) {
    LocalTensor<float> w1 = w1Buf_.Get<float>();
    LocalTensor<float> w2 = w2Buf_.Get<float>();
    LocalTensor<float> w3 = w3Buf_.Get<float>();
    const float alpha = in_.alpha;
    if (in_.kind == distill_tiling::kTvd) {
      Exp(w1, ls, count);   // P_s
      Exp(w2, lt, count);   // P_t
      Sub(ls, w1, w2, count);
      Sign(w3, ls, mask_, count);
      Abs(lt, ls, count);
      ReduceSum(sc_[kTerm], lt, work_, valid);
      Mul(ls, w1, w3, count);
      ReduceSum(sc_[kSumA], ls, work_, valid);
      Mul(lt, w2, w3, count);
      ReduceSum(sc_[kSumB], lt, work_, valid);
      VectorToScalar();
      *total += 0.5f * sc_.GetValue(kTerm);
      *sumA += 0.5f * sc_.GetValue(kSumA);
      *sumB -= 0.5f * sc_.GetValue(kSumB);
    } else if (in_.kind == distill_tiling::kSymmetric) {
      KlLanes(w1, w2, lt, ls, 0.0f, mask_, count);  // P_t (lt - ls), P_t
      ReduceSum(sc_[kTerm], w1, work_, valid);
      ReduceSum(sc_[kSumB], w2, work_, valid);
      KlLanes(w1, w3, ls, lt, 0.0f, mask_, count);  // P_s (ls - lt), P_s
      ReduceSum(sc_[kSumA], w1, work_, valid);
      ReduceSum(sc_[kExtra], w3, work_, valid);
      VectorToScalar();
      const float fwd = sc_.GetValue(kTerm), rev = sc_.GetValue(kSumA);
      *total += alpha * fwd + (1.0f - alpha) * rev;
      *sumA += (1.0f - alpha) * rev - alpha * sc_.GetValue(kSumB);
      *sumB += alpha * fwd - (1.0f - alpha) * sc_.GetValue(kExtra);
    } else {  // skew KL (P = P_t) / skew reverse KL (P = P_s) against M = alpha P + (1 - alpha) Q
      const bool tWeighs = in_.kind == distill_tiling::kSkewKl;
      const LocalTensor<float>& lp = tWeighs ? lt : ls;
      const LocalTensor<float>& lq = tWeighs ? ls : lt;
      // the weights' logs: w_t's is logBeta (skew KL: w_p = alpha; skew reverse KL: w_q = 1 - alpha)
      const float logWp = tWeighs ? in_.logBeta : in_.log1mBeta, logWq = tWeighs ? in_.log1mBeta : in_.logBeta;
      LogMix(w1, ls, lt, w2, w3, in_.logBeta, in_.log1mBeta, count);  // log M
      KlLanes(w3, w2, lp, w1, 0.0f, mask_, count);                     // P (lp - log M)
      ReduceSum(sc_[kTerm], w3, work_, valid);
      PowLanes(w2, lp, lq, w1, logWq, mask_, count);  // w_q P Q / M
      ReduceSum(sc_[kSumA], w2, work_, valid);
      PowLanes(w2, lp, lp, w1, logWp, mask_, count);  // w_p P^2 / M
      ReduceSum(sc_[kSumB], w2, work_, valid);
      VectorToScalar();
      const float kl = sc_.GetValue(kTerm);
      const float dp = kl - sc_.GetValue(kSumB), dq = -sc_.GetValue(kSumA);
      *total += kl;
      *sumA += tWeighs ? dq : dp;
      *sumB += tWeighs ? dp : dq;
    }
  }

  __aicore__ inline void WriteStats(uint64_t row, float loss, float lseS, float lseT, float k1, float k2) {
    LocalTensor<float> st = statBuf_.Get<float>();
    st.SetValue(distill_tiling::kLoss, loss);
    st.SetValue(distill_tiling::kLseStudent, lseS);
    st.SetValue(distill_tiling::kLseTeacher, lseT);
    st.SetValue(distill_tiling::kK1, k1);
    st.SetValue(distill_tiling::kK2, k2);
    for (uint32_t i = distill_tiling::kK2 + 1; i < distill_tiling::kStatsStride; ++i) st.SetValue(i, 0.0f);
    SetFlag<HardEvent::S_MTE3>(0);
    WaitFlag<HardEvent::S_MTE3>(0);
    DataCopy(statsGm_[row * distill_tiling::kStatsStride], st, distill_tiling::kStatsStride);
    // The next row's SetValue must not overwrite the block before it left.
    SetFlag<HardEvent::MTE3_S>(0);
    WaitFlag<HardEvent::MTE3_S>(0);
  }

  TPipe pipe_;
  LogitTiles<T> in_;  // first = a, second = b
  TBuf<TPosition::VECCALC> w1Buf_, w2Buf_, w3Buf_, maskBuf_, workBuf_, scalarBuf_, statBuf_;
  GlobalTensor<float> statsGm_;
  LocalTensor<uint8_t> mask_;
  LocalTensor<float> work_, sc_;  // the reductions' work area; scalarBuf_, the scalar exchange
  float tSquared_ = 1.0f;
  float maxA_ = kNegInf, maxB_ = kNegInf, shiftA_ = 0.0f, shiftB_ = 0.0f, sumA_ = 0.0f, sumB_ = 0.0f, termB_ = 0.0f;
};

extern "C" __global__ __aicore__ void distill_custom(GM_ADDR student, GM_ADDR teacher, GM_ADDR stats,
                                                     GM_ADDR workspace, GM_ADDR tiling) {
  (void)workspace;
  GET_TILING_DATA(td, tiling);
  if (TILING_KEY_IS(1)) {
    DistillForward<DTYPE_STUDENT> op;
    op.Init(student, teacher, stats, td);
    op.Process();
  }
}
