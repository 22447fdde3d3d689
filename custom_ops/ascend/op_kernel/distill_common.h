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

constexpr float kPosInf = __builtin_inff();

// dst = float32(src) * invT: the scaled logits (Cast is exact for the half types).
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
// double-buffered queues, into float32 tiles of the scaled logits.
template <typename T>
struct LogitTiles {
  template <typename TilingData>
  __aicore__ inline void Init(TPipe& pipe, GM_ADDR first, GM_ADDR second, const TilingData& td) {
    vocab = td.vocab;
    tile = td.tileLength;
    kind = td.kind;
    invT = td.invTemperature;
    beta = td.beta;
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

  // The oldest loaded tile's logits divided by T, in float32, into firstBuf / secondBuf; frees its queue buffers.
  __aicore__ inline void Scaled(uint32_t count) {
    LocalTensor<T> fl = firstQue.template DeQue<T>();
    LocalTensor<T> sl = secondQue.template DeQue<T>();
    ScaledFloat(First(), fl, invT, count);
    ScaledFloat(Second(), sl, invT, count);
    firstQue.FreeTensor(fl);
    secondQue.FreeTensor(sl);
  }

  // The float32 tiles Scaled writes.
  __aicore__ inline LocalTensor<float> First() { return firstBuf.Get<float>(); }
  __aicore__ inline LocalTensor<float> Second() { return secondBuf.Get<float>(); }

  TQue<QuePosition::VECIN, distill_tiling::kBufferNum> firstQue, secondQue;
  TBuf<TPosition::VECCALC> firstBuf, secondBuf;
  GlobalTensor<T> firstGm, secondGm;
  uint64_t vocab = 0, rowStart = 0, rowCount = 0;
  uint32_t tile = 0, kind = 0;
  float invT = 1.0f, beta = 0.0f, logBeta = 0.0f, log1mBeta = 0.0f;
};

}  // namespace distill_kernel

#endif  // DISTILL_COMMON_H_
