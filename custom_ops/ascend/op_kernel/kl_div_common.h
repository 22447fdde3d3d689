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
#include "tile_io.h"

#define KLDIV_TILING_FN __aicore__ inline
#include "kl_div_tiling_plan.h"

namespace kldiv_kernel {

using namespace AscendC;

using namespace tile_io;

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

// x and target of a core's range (kl_div_tiling_plan.h CoreRange), read tile by tile through double-buffered
// queues into the float32 operands both kernels compute on. The kernel drives it with ForEachTile.
template <typename T>
struct OperandTiles {
  __aicore__ inline void Init(TPipe& pipe, GM_ADDR x, GM_ADDR target, uint64_t start, uint64_t len, uint32_t tile) {
    len_ = len;
    tile_ = tile;
    xGm.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(x) + start, len);
    tGm.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(target) + start, len);
    pipe.InitBuffer(xQue, kldiv_tiling::kBufferNum, tile * sizeof(T));
    pipe.InitBuffer(tQue, kldiv_tiling::kBufferNum, tile * sizeof(T));
    pipe.InitBuffer(xsBuf, tile * sizeof(float));
    pipe.InitBuffer(tsBuf, tile * sizeof(float));
    pipe.InitBuffer(maskBuf, tile / 8);
  }

  // Every tile of the range in order: x and target are loaded (and kernel->CopyIn(off, valid) loads the kernel's
  // own inputs), then kernel->Compute(valid) and kernel->CopyOut(off, valid) run. With two buffers per queue the
  // loads of one tile and the stores of the one before overlap the vector work.
  template <typename Kernel>
  __aicore__ inline void ForEachTile(Kernel* kernel) {
    const uint64_t tiles = kldiv_tiling::TileCount(len_, tile_);
    for (uint64_t i = 0; i < tiles; ++i) {
      const uint64_t off = i * tile_;
      const uint32_t valid = static_cast<uint32_t>(len_ - off < tile_ ? len_ - off : tile_);
      LoadToQueue(xQue, xGm, off, valid);
      LoadToQueue(tQue, tGm, off, valid);
      kernel->CopyIn(off, valid);
      kernel->Compute(valid);
      kernel->CopyOut(off, valid);
    }
  }

  // The oldest loaded tile, on `count` lanes: mask = its mass bits, xs / ts = its safe float32 operands
  // (SafeOperands). Frees the tile's queue buffers.
  __aicore__ inline void Operands(bool logTarget, uint32_t count) {
    LocalTensor<T> xl = xQue.template DeQue<T>();
    LocalTensor<T> tl = tQue.template DeQue<T>();
    xs = xsBuf.Get<float>();
    ts = tsBuf.Get<float>();
    mask = maskBuf.Get<uint8_t>();
    LocalTensor<float> tf = AsFloat(tl, ts, count);
    MassMask(mask, tf, logTarget, count);
    LocalTensor<float> xf = AsFloat(xl, xs, count);
    SafeOperands(xs, ts, xf, tf, mask, logTarget, count);
    xQue.FreeTensor(xl);
    tQue.FreeTensor(tl);
  }

  TQue<QuePosition::VECIN, kldiv_tiling::kBufferNum> xQue, tQue;
  TBuf<TPosition::VECCALC> xsBuf, tsBuf, maskBuf;
  GlobalTensor<T> xGm, tGm;
  LocalTensor<float> xs, ts;
  LocalTensor<uint8_t> mask;
  uint64_t len_ = 0;
  uint32_t tile_ = 0;
};

}  // namespace kldiv_kernel

#endif  // KL_DIV_COMMON_H_
