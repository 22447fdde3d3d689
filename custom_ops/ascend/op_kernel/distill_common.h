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

#ifndef KLDIV_TILING_FN
#define KLDIV_TILING_FN __aicore__ inline
#endif
#include "distill_tiling_plan.h"

namespace distill_kernel {

using namespace AscendC;

constexpr float kNegInf = -__builtin_inff();
constexpr float kPosInf = __builtin_inff();

// GM -> UB of `valid` elements at element offset `off` of a row-major [rows, V] tensor: DataCopy when the GM
// address and the length are whole 32 B blocks, else DataCopyPad (rows of odd V start anywhere in a block).
template <typename T>
__aicore__ inline void LoadRow(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint64_t off, uint32_t valid) {
  if ((off * sizeof(T)) % 32 == 0 && (valid * sizeof(T)) % 32 == 0) {
    DataCopy(dst, src[off], valid);
  } else {
    DataCopyExtParams params{1, static_cast<uint32_t>(valid * sizeof(T)), 0, 0, 0};
    DataCopyPadExtParams<T> pad{false, 0, 0, static_cast<T>(0)};
    DataCopyPad(dst, src[off], params, pad);
  }
}

// UB -> GM, writing exactly `valid` elements: a row boundary inside a 32 B block may be shared with the row of
// another core, which DataCopyPad leaves untouched.
template <typename T>
__aicore__ inline void StoreRow(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint64_t off, uint32_t valid) {
  if ((off * sizeof(T)) % 32 == 0 && (valid * sizeof(T)) % 32 == 0) {
    DataCopy(dst[off], src, valid);
  } else {
    DataCopyExtParams params{1, static_cast<uint32_t>(valid * sizeof(T)), 0, 0, 0};
    DataCopyPad(dst[off], src, params);
  }
}

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

}  // namespace distill_kernel

#endif  // DISTILL_COMMON_H_
