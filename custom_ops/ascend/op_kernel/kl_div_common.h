// Pieces shared by the KlDivCustom and KlDivCustomGrad AscendC kernels.
//
// The pointwise math MIRRORS custom_ops/common/kldiv_math.h (the single source of the formulas for the
// C++/CUDA kernels), which AscendC cannot include: keep the two in step.
//   loss:       t * (log t - x)          | log_target: exp(t) * (t - x)
//   d/dinput:   -t                       | -exp(t)
//   d/dtarget:  log t + 1 - x            | exp(t) * (t - x + 1)
//   zero mass:  every term is 0 where !(t > 0 or t is NaN) | where t == -inf, whatever x is.
// "Has mass" is !(t <= 0) (resp. !(t == -inf)): a NaN target keeps its mass and propagates NaN.
// Lanes without mass get safe operands (t = 1 resp. 0, x = 0), which make the loss exactly 0 with no
// select afterwards and keep inf/NaN of x out of those lanes; the gradients are selected to 0 explicitly.
#ifndef KL_DIV_COMMON_H_
#define KL_DIV_COMMON_H_

#include "kernel_operator.h"

#define KLDIV_TILING_FN __aicore__ inline
#include "kl_div_tiling_plan.h"

namespace kldiv_kernel {

using namespace AscendC;

constexpr float kNegInf = -__builtin_inff();

// Copies `valid` elements GM -> UB; DataCopy moves whole 32 B blocks only, so a ragged tail uses DataCopyPad.
template <typename T>
__aicore__ inline void LoadTile(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t valid) {
  if ((valid * sizeof(T)) % 32 == 0) {
    DataCopy(dst, src, valid);
  } else {
    DataCopyExtParams params{1, static_cast<uint32_t>(valid * sizeof(T)), 0, 0, 0};
    DataCopyPadExtParams<T> pad{false, 0, 0, static_cast<T>(0)};
    DataCopyPad(dst, src, params, pad);
  }
}

// Copies `valid` elements UB -> GM without touching the bytes after them (they belong to no one or,
// never, to another core: core ranges are 256 B aligned).
template <typename T>
__aicore__ inline void StoreTile(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t valid) {
  if ((valid * sizeof(T)) % 32 == 0) {
    DataCopy(dst, src, valid);
  } else {
    DataCopyExtParams params{1, static_cast<uint32_t>(valid * sizeof(T)), 0, 0, 0};
    DataCopyPad(dst, src, params);
  }
}

// float32 view of an IO tile: the tile itself for float, else a Cast into `scratch` (exact for half types).
template <typename T>
__aicore__ inline LocalTensor<float> AsFloat(const LocalTensor<T>& src, const LocalTensor<float>& scratch,
                                             uint32_t count) {
  if constexpr (IsSameType<T, float>::value) {
    return src;
  } else {
    Cast(scratch, src, RoundMode::CAST_NONE, count);
    return scratch;
  }
}

// float32 -> IO dtype, round to nearest even; for float a plain UB copy would be wasted, so callers
// compute float results straight into the output tile instead (see the kernels).
template <typename T>
__aicore__ inline void FromFloat(const LocalTensor<T>& dst, const LocalTensor<float>& src, uint32_t count) {
  if constexpr (IsSameType<T, float>::value) {
    Adds(dst, src, 0.0f, count);
  } else {
    Cast(dst, src, RoundMode::CAST_RINT, count);
  }
}

// Bit i of `mask` = target i has mass. CompareScalar gives the "no mass" test (t <= 0, or t == -inf), whose
// result is false for NaN; Not flips it, so NaN targets keep their mass as in kldiv_math.h.
// count must be a multiple of 64 (CompareScalar works in whole 256 B repeats): see ComputeCount().
__aicore__ inline void MassMask(const LocalTensor<uint8_t>& mask, const LocalTensor<float>& t, bool logTarget,
                                uint32_t count) {
  if (logTarget) {
    CompareScalar(mask, t, kNegInf, CMPMODE::EQ, count);
  } else {
    CompareScalar(mask, t, 0.0f, CMPMODE::LE, count);
  }
  LocalTensor<uint16_t> bits = mask.ReinterpretCast<uint16_t>();
  Not(bits, bits, count / 16);
}

// ts = mass ? t : safe_t;  xs = mass ? x : 0  (safe_t = 1, or 0 with log_target: both give loss 0).
__aicore__ inline void SafeOperands(const LocalTensor<float>& xs, const LocalTensor<float>& ts,
                                    const LocalTensor<float>& x, const LocalTensor<float>& t,
                                    const LocalTensor<uint8_t>& mask, bool logTarget, uint32_t count) {
  Select(ts, mask, t, logTarget ? 0.0f : 1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
  Select(xs, mask, x, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
}

// w = loss(xs, ts). Clobbers xs (log_target only).
__aicore__ inline void PointwiseLoss(const LocalTensor<float>& w, const LocalTensor<float>& xs,
                                     const LocalTensor<float>& ts, bool logTarget, uint32_t count) {
  if (logTarget) {
    Exp(w, ts, count);
    Sub(xs, ts, xs, count);
    Mul(w, w, xs, count);
  } else {
    Ln(w, ts, count);
    Sub(w, w, xs, count);
    Mul(w, w, ts, count);
  }
}

// (dx, dt) = both derivatives of the loss at (xs, ts), 0 where there is no mass.
__aicore__ inline void PointwiseGrads(const LocalTensor<float>& dx, const LocalTensor<float>& dt,
                                      const LocalTensor<float>& xs, const LocalTensor<float>& ts,
                                      const LocalTensor<uint8_t>& mask, bool logTarget, uint32_t count) {
  if (logTarget) {
    Exp(dx, ts, count);            // e
    Sub(dt, ts, xs, count);
    Adds(dt, dt, 1.0f, count);
    Mul(dt, dt, dx, count);        // e * (t - x + 1)
    Muls(dx, dx, -1.0f, count);    // -e
  } else {
    Muls(dx, ts, -1.0f, count);    // -t
    Ln(dt, ts, count);
    Adds(dt, dt, 1.0f, count);
    Sub(dt, dt, xs, count);        // log t + 1 - x
  }
  Select(dx, mask, dx, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
  Select(dt, mask, dt, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
}

}  // namespace kldiv_kernel

#endif  // KL_DIV_COMMON_H_
