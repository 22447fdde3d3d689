// Pieces shared by the DistillCustom and DistillCustomGrad AscendC kernels.
//
// Definitions (the float64 twin is ms_kldiv.reference.distillation_pointwise; ms_kldiv/_distill_math.py has the
// same closed forms in MindSpore ops). Per row, with s' = student / T and t' = teacher / T:
//   ls = s' - lse(s'), lt = t' - lse(t'), P_s = exp(ls), P_t = exp(lt)
//   beta = 0:      loss = T^2 KL(P_t || P_s)
//   beta = 1:      loss = T^2 KL(P_s || P_t)
//   0 < beta < 1:  loss = T^2 (beta KL(P_t || M) + (1 - beta) KL(P_s || M)),  M = beta P_t + (1 - beta) P_s,
//                  log M = logaddexp(lt + log beta, ls + log(1 - beta))
// Both KL cases are KL(P_a || P_b) with (a, b) = (teacher, student) or (student, teacher). Gradients, for an
// incoming row gradient g and c = g T:
//   KL:   d/db = c (P_b - P_a)                 d/da = c P_a (la - lb - K),  K = KL(P_a || P_b)
//   JSD:  d/ds = c (1 - beta) P_s (ls - log M - K_s)   d/dt = c beta P_t (lt - log M - K_t),
//         K_s = KL(P_s || M), K_t = KL(P_t || M)
// Zero mass: an element whose own probability is 0 (a -inf logit) contributes exactly 0 to every term where it
// is the weight, so those lanes are selected to 0 (their raw value is 0 * inf or NaN); where the weight is
// positive and the other side's log is -inf the term is +inf, as the math says.
//
// The other divergences (kind >= kTvd; custom_ops/common/distill_math.h has every formula, `class_terms`) read the
// row twice like the JSD and are written through the per-class term and a = P_s dD/dP_s, b = P_t dD/dP_t:
//   loss = T^2 sum(term),  d/ds = c (a - P_s sum(a)),  d/dt = c (b - P_t sum(b))
//   TVD        term = |P_s - P_t| / 2, a = P_s sgn(P_s - P_t) / 2, b = -P_t sgn(P_s - P_t) / 2
//   skew KL    KL(P || M), P = P_t, Q = P_s, M = alpha P + (1 - alpha) Q; skew RKL the same with P = P_s, Q = P_t:
//              P dD/dP = P (lp - log M) - alpha P^2 / M,  Q dD/dQ = -(1 - alpha) P Q / M  (both in log space)
//   symmetric  alpha KL(P_t || P_s) + (1 - alpha) KL(P_s || P_t): a = -alpha P_t + (1 - alpha) P_s (ls - lt),
//              b = alpha P_t (lt - ls) - (1 - alpha) P_s
// The logits' transform (softcap > 0: z -> cap tanh(scale z / cap), -inf kept, else z -> scale z) is applied as
// the tiles are loaded, before the temperature; the gradients of the raw logits are those of the transformed ones
// times its slope, scale sech^2(scale z / cap) (SoftCapTile).
#ifndef DISTILL_COMMON_H_
#define DISTILL_COMMON_H_

#include "kernel_operator.h"
#include "tile_io.h"

#ifndef KLDIV_TILING_FN
#define KLDIV_TILING_FN __aicore__ inline
#endif
#include "distill_tiling_plan.h"

namespace distill_kernel {

using namespace AscendC;

using namespace tile_io;

constexpr float kFloatMax = 3.40282346638528859812e+38f;  // FLT_MAX

// dst = float32(src) * invT: the scaled logits (Cast is exact for the half types). invT: 1/T, with the logits'
// scale folded in (or scale / cap, before the soft cap).
template <typename T>
__aicore__ inline void ScaledFloat(const LocalTensor<float>& dst, const LocalTensor<T>& src, float invT,
                                   uint32_t count) {
  if constexpr (IsSameType<T, float>::value) {
    Muls(dst, src, invT, count);
  } else {
    Cast(dst, src, RoundMode::CAST_NONE, count);
    Muls(dst, dst, invT, count);
  }
}

// out = IO dtype of (w * c); w is clobbered for the half types (rounded once, to nearest even, from float32).
template <typename T>
__aicore__ inline void ScaleOut(const LocalTensor<T>& out, const LocalTensor<float>& w, float c, uint32_t count) {
  if constexpr (IsSameType<T, float>::value) {
    Muls(out, w, c, count);
  } else {
    Muls(w, w, c, count);
    Cast(out, w, RoundMode::CAST_RINT, count);
  }
}

// w = w where x != -inf, else 0 (x is the log-probability, or the scaled logit, that weights the term).
__aicore__ inline void ZeroWhereNoMass(const LocalTensor<float>& w, const LocalTensor<float>& x,
                                       const LocalTensor<uint8_t>& mask, uint32_t count) {
  CompareScalar(mask, x, kNegInf, CMPMODE::NE, count);
  Select(w, mask, w, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
}

// w = P (l - lm - k) with P = exp(l) (left in p), 0 where l = -inf (P = 0 weights the term away): the lanes of
// KL(P || M)'s sum (k = 0), or of its gradient (k = that KL).
__aicore__ inline void KlLanes(const LocalTensor<float>& w, const LocalTensor<float>& p, const LocalTensor<float>& l,
                               const LocalTensor<float>& lm, float k, const LocalTensor<uint8_t>& mask,
                               uint32_t count) {
  Exp(p, l, count);
  Sub(w, l, lm, count);
  if (k != 0.0f) Adds(w, w, -k, count);  // adding -0 would change no lane
  Mul(w, p, w, count);
  ZeroWhereNoMass(w, l, mask, count);
}

// lm = logaddexp(lt + logBeta, ls + log1mBeta) = max + log(1 + exp(min - max)); uses w2, w3. NaN where both ls
// and lt are -inf: every term there is selected to 0 afterwards.
__aicore__ inline void LogMixture(const LocalTensor<float>& lm, const LocalTensor<float>& ls,
                                  const LocalTensor<float>& lt, const LocalTensor<float>& w2,
                                  const LocalTensor<float>& w3, float logBeta, float log1mBeta, uint32_t count) {
  Adds(lm, lt, logBeta, count);
  Adds(w2, ls, log1mBeta, count);
  Max(w3, lm, w2, count);
  Min(lm, lm, w2, count);
  Sub(lm, lm, w3, count);
  Exp(lm, lm, count);
  Adds(lm, lm, 1.0f, count);
  Ln(lm, lm, count);
  Add(lm, lm, w3, count);
}

// log(w_t P_t + w_s P_s) (lm) for the mixture weights' logs, any of them -inf (a weight of 0: the other model's
// log-probability itself, so a class only that model rules out is -inf, not NaN); uses w2, w3.
__aicore__ inline void LogMix(const LocalTensor<float>& lm, const LocalTensor<float>& ls, const LocalTensor<float>& lt,
                              const LocalTensor<float>& w2, const LocalTensor<float>& w3, float logWt, float logWs,
                              uint32_t count) {
  if (logWt == kNegInf) {
    Adds(lm, ls, logWs, count);
  } else if (logWs == kNegInf) {
    Adds(lm, lt, logWt, count);
  } else {
    LogMixture(lm, ls, lt, w2, w3, logWt, logWs, count);
  }
}

// w = exp(lw + lp + lx - lm): w_p P X / M of the skew divergences (lw = log w_p, the weight of P in M), in log
// space: exact where M is tiny, and never above X since w_p P <= M (a weight of 0, lw = -inf, gives 0 where
// multiplying by it after the exp would meet an overflowed P^2 / M); 0 where P has no mass.
__aicore__ inline void PowLanes(const LocalTensor<float>& w, const LocalTensor<float>& lp, const LocalTensor<float>& lx,
                                const LocalTensor<float>& lm, float lw, const LocalTensor<uint8_t>& mask,
                                uint32_t count) {
  Sub(w, lp, lm, count);
  if (lw != 0.0f) Adds(w, w, lw, count);  // adding 0 would change no lane
  Add(w, w, lx, count);
  Exp(w, w, count);
  ZeroWhereNoMass(w, lp, mask, count);
}

// sg = sgn(d): +1, -1, or 0 where d == 0 (the sign TVD's gradient takes; the subgradient 0 at a tie).
__aicore__ inline void Sign(const LocalTensor<float>& sg, const LocalTensor<float>& d, const LocalTensor<uint8_t>& mask,
                            uint32_t count) {
  Duplicate(sg, 1.0f, count);
  CompareScalar(mask, d, 0.0f, CMPMODE::GT, count);
  Select(sg, mask, sg, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
  CompareScalar(mask, d, 0.0f, CMPMODE::NE, count);
  Select(sg, mask, sg, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
}

// The soft cap of a tile in place: x holds u = scale z / cap and becomes tanh(u) * post (post = cap / T). With
// e = exp(-2|u|) (no overflow for any u), tanh|u| = (1 - e) / (1 + e), and tanh(u) = max(min(u, tanh|u|), -tanh|u|)
// (|tanh u| <= |u|; the clamp keeps a tiny u itself, more accurate than 1 - e there). u = -inf (a padded entry,
// a masked class) stays -inf, as in distill_math.h transform_apply: the clamp alone would give -post, mass for a
// class that has none. So m = min(u, -FLT_MAX) + FLT_MAX (exactly 0 for a finite u or +inf, -inf for u = -inf; no
// Compare / Select, so no mask tile) is added back after the clamp: finite lanes are unchanged (x + 0),
// -post + -inf = -inf, and u = +inf gives post (u - max(u, -FLT_MAX) would be inf - inf = NaN there).
// With withSlope, slope = sech^2(u) = 4 e / (1 + e)^2, the cap's derivative (times scale, which the caller folds
// into its gradient factor); 0 at u = -inf (e = 0), so a masked class's gradient stays 0. e, w: temporaries.
__aicore__ inline void SoftCapTile(const LocalTensor<float>& x, const LocalTensor<float>& e, const LocalTensor<float>& w,
                                   float post, bool withSlope, const LocalTensor<float>& slope, uint32_t count) {
  Abs(e, x, count);
  Muls(e, e, -2.0f, count);
  Exp(e, e, count);
  Adds(w, e, 1.0f, count);  // 1 + e
  if (withSlope) {
    Mul(slope, w, w, count);
    Div(slope, e, slope, count);
    Muls(slope, slope, 4.0f, count);
  }
  Muls(e, e, -1.0f, count);
  Adds(e, e, 1.0f, count);  // 1 - e
  Div(e, e, w, count);      // tanh|u|
  Duplicate(w, -kFloatMax, count);
  Min(w, x, w, count);
  Adds(w, w, kFloatMax, count);  // m: 0, or -inf where u = -inf
  Min(x, x, e, count);
  Muls(e, e, -1.0f, count);
  Max(x, x, e, count);
  Muls(x, x, post, count);
  Add(x, x, w, count);      // -inf stays -inf
}

// Scalar reads of vector results: the scalar unit waits for the vector pipe.
__aicore__ inline void VectorToScalar() {
  SetFlag<HardEvent::V_S>(0);
  WaitFlag<HardEvent::V_S>(0);
}
__aicore__ inline void ScalarToVector() {
  SetFlag<HardEvent::S_V>(0);
  WaitFlag<HardEvent::S_V>(0);
}

// What both kernels read the same way: the parameters of the tiling data they share, the core's rows, and two
// [rows, V] logit tensors (the first and the second operand) walked row by row in vocabulary tiles through
// double-buffered queues, into float32 tiles of the transformed logits divided by T. With a soft cap, the kernel
// lends two work tiles for it (UseCapTemps) and, for a backward, the tiles to keep the slopes in (KeepSlopes).
template <typename T>
struct LogitTiles {
  template <typename TilingData>
  __aicore__ inline void Init(TPipe& pipe, GM_ADDR first, GM_ADDR second, const TilingData& td) {
    vocab = td.vocab;
    tile = td.tileLength;
    kind = td.kind;
    preScale = td.preScale;
    postScale = td.postScale;
    softcap = td.softcap != 0;
    beta = td.beta;
    alpha = td.alpha;
    logBeta = td.logBeta;
    log1mBeta = td.log1mBeta;
    distill_tiling::RowRange(td.baseRows, td.remRows, static_cast<uint32_t>(GetBlockIdx()), &rowStart, &rowCount);
    firstGm.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(first), td.rows * vocab);
    secondGm.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(second), td.rows * vocab);
    pipe.InitBuffer(firstQue, distill_tiling::kBufferNum, tile * sizeof(T));
    pipe.InitBuffer(secondQue, distill_tiling::kBufferNum, tile * sizeof(T));
    pipe.InitBuffer(firstBuf, tile * sizeof(float));
    pipe.InitBuffer(secondBuf, tile * sizeof(float));
  }

  // Elements of tile i of a row.
  __aicore__ inline uint32_t Valid(uint64_t i) const {
    const uint64_t off = i * tile;
    return static_cast<uint32_t>(vocab - off < tile ? vocab - off : tile);
  }

  // Tile i of a row, scaled, in firstBuf / secondBuf (the load of tile i + 1 is started first: Prefetch); returns
  // its element count.
  __aicore__ inline uint32_t Next(uint64_t row, uint64_t i, uint64_t tiles) {
    Prefetch(row, i + 1, tiles);
    const uint32_t valid = Valid(i);
    Scaled(distill_tiling::ComputeCount(valid));
    return valid;
  }

  // Tile i of a row into the queues, if the row has one. The walks load tile i + 1 before computing tile i, so
  // the load overlaps the vector work (and the scalar waits for reduction results) of tile i: the queues are
  // kBufferNum = 2 deep.
  __aicore__ inline void Prefetch(uint64_t row, uint64_t i, uint64_t tiles) {
    if (i >= tiles) return;
    LoadToQueue(firstQue, firstGm, row * vocab + i * tile, Valid(i));
    LoadToQueue(secondQue, secondGm, row * vocab + i * tile, Valid(i));
  }

  // Work tiles the soft cap may use (the kernel's, free whenever Scaled runs).
  __aicore__ inline void UseCapTemps(const LocalTensor<float>& a, const LocalTensor<float>& b) {
    capA = a;
    capB = b;
  }

  // Where Scaled keeps the cap's slope of each operand's tile (a backward's; only with softcap).
  __aicore__ inline void KeepSlopes(bool first, const LocalTensor<float>& firstSlope, bool second,
                                    const LocalTensor<float>& secondSlope) {
    slopeFirst = first;
    slopeSecond = second;
    firstSlopeT = firstSlope;
    secondSlopeT = secondSlope;
  }

  // The oldest loaded tile's logits, transformed and divided by T, in float32, into firstBuf / secondBuf (and the
  // slopes, KeepSlopes); frees its queue buffers.
  __aicore__ inline void Scaled(uint32_t count) {
    LocalTensor<T> fl = firstQue.template DeQue<T>();
    LocalTensor<T> sl = secondQue.template DeQue<T>();
    ScaledFloat(First(), fl, preScale, count);
    ScaledFloat(Second(), sl, preScale, count);
    firstQue.FreeTensor(fl);
    secondQue.FreeTensor(sl);
    if (softcap) {
      SoftCapTile(First(), capA, capB, postScale, slopeFirst, firstSlopeT, count);
      SoftCapTile(Second(), capA, capB, postScale, slopeSecond, secondSlopeT, count);
    }
  }

  // The float32 tiles Scaled writes.
  __aicore__ inline LocalTensor<float> First() { return firstBuf.Get<float>(); }
  __aicore__ inline LocalTensor<float> Second() { return secondBuf.Get<float>(); }

  TQue<QuePosition::VECIN, distill_tiling::kBufferNum> firstQue, secondQue;
  TBuf<TPosition::VECCALC> firstBuf, secondBuf;
  GlobalTensor<T> firstGm, secondGm;
  uint64_t vocab = 0, rowStart = 0, rowCount = 0;
  LocalTensor<float> capA, capB, firstSlopeT, secondSlopeT;
  uint32_t tile = 0, kind = 0;
  bool softcap = false, slopeFirst = false, slopeSecond = false;
  // preScale, postScale: the transform and 1/T (DistillCustomTilingData); logBeta, log1mBeta: the log-mixture's
  // log w_t, log w_s (JSD and the skew divergences).
  float preScale = 1.0f, postScale = 1.0f, beta = 0.0f, alpha = 0.0f, logBeta = 0.0f, log1mBeta = 0.0f;
};

}  // namespace distill_kernel

#endif  // DISTILL_COMMON_H_
