// The exported ABI of the ms_kldiv AOT kernel libraries: what ms_kldiv/backends/aot.py calls.
//
// One ABI, several libraries: the CPU build (custom_ops/cpu -> libkldiv_cpu.so) and the CUDA build
// (custom_ops/gpu -> libkldiv_cuda.so) export exactly the same symbols with the same meaning, so the
// Python side only picks a file by device target. aot.py builds the func string "<lib>:<Symbol>".
//
// ---------------------------------------------------------------------------------------------------
// Symbols.  Attributes are NOT passed at run time: each (reduction, target space) pair is its own
// symbol, because MindSpore caches PyNative shape inference per (func string, attributes) and because
// a C++ <Fn>InferShape cannot see Python attributes without MindSpore's internal AotExtra layout.
//
//   KLDivFwd<R><S>        forward           R in {None, Sum, Mean, Batchmean}, S in {Prob, Log}
//   KLDivBwd<R><S>        backward (both gradients in one pass)
//   KLDivBwdInput<R><S>   backward, d/dinput only   } Graph mode drops an op whose output is unused, so a
//   KLDivBwdTarget<R><S>  backward, d/dtarget only  } graph that needs only one gradient (distillation: a
//                         fixed teacher) computes only that one; d/dinput alone needs no log at all.
//                         (aot.py checks for them, so a library built before they existed still works.)
//   <Fn>InferShape        C++ shape inference for each symbol (dynamic shapes need it)
//
//   S = Prob: target holds probabilities (log_target=False); S = Log: log-probabilities (log_target=True).
//   e.g. KLDivFwdBatchmeanLog, KLDivBwdNoneProb, KLDivFwdSumProbInferShape.
//
// Kernel signature (MindSpore func_type="aot"):
//   extern "C" int Fn(int nparam, void **params, int *ndims, int64_t **shapes,
//                     const char **dtypes, void *stream, void *extra);
//   `stream` is the cudaStream_t on GPU, unused on CPU; `extra` is unused.
//
// Forward  KLDivFwd<R><S>: nparam == 3
//   params[0] input  x  (any rank incl. 0-d, dtype D)
//   params[1] target t  (any rank incl. 0-d, dtype D; broadcasts with x under NumPy rules)
//   params[2] out       R == None: broadcast shape of x and t, dtype D.
//                       otherwise: 0-d (ndims[2] == 0), dtype D, holding
//                         Sum:       sum of pointwise loss over the broadcast shape (0 when empty)
//                         Mean:      sum / numel(broadcast shape)        (NaN when empty)
//                         Batchmean: sum / x.shape[0], 1 for a 0-d x     (NaN when x.shape[0] == 0)
//   Reductions are ONE fused pass (no intermediate tensor); accumulation in double for float32/float64
//   (or an equally accurate blocked scheme), at least float for half types.
//
// Backward KLDivBwd<R><S>: nparam == 5
//   params[0] input  x, params[1] target t   (as in the forward)
//   params[2] dout     R == None: broadcast shape, dtype D.  otherwise: 0-d, dtype D.
//   params[3] dx       shape of x, dtype D:  sum over broadcast dims of  grad_input(x, t)  * g
//   params[4] dt       shape of t, dtype D:  sum over broadcast dims of  grad_target(x, t) * g
//   where g = dout (elementwise for None) times the reduction scale s
//   (s = 1 for None/Sum, 1/numel(broadcast) for Mean, 1/x.shape[0] (1 for 0-d x) for Batchmean),
//   applied per element BEFORE summing, so an empty broadcast gives exact zeros, never 0 * NaN.
//   Both gradients come from ONE pass over the broadcast index space (kldiv::grads).
//
// Single-gradient backward KLDivBwdInput<R><S> / KLDivBwdTarget<R><S>: nparam == 4
//   params[0..2] as in the backward; params[3] dx (shape of x) or dt (shape of t), defined as above.
//
// dtypes: D is one of the strings "float16", "bfloat16", "float32", "float64"; x, t, dout and all
//   outputs share it (Python promotes and casts before the call). Half types are loaded/stored natively
//   and computed in float; float32 is computed in float, float64 in double.
// Shapes: int64 dims, 64-bit element indexing; n == 0 is valid and writes nothing (reduced outputs get
//   the value the reduction defines for an empty sum). Broadcasting happens inside the kernel by strides;
//   no broadcast copy is ever materialized.
// Return value: 0 on success. Non-zero only for states Python already excludes (unknown dtype string,
//   wrong nparam, shapes that do not broadcast, an output shape that disagrees) — a non-zero return
//   poisons a GRAPH_MODE Cell for good, so never use it for data-dependent conditions (NaN, inf, empty).
//
// InferShape (needed for set_inputs with None dims):
//   extern "C" std::vector<int64_t>               KLDivFwd<R><S>InferShape(int *ndims, int64_t **shapes, void *extra);
//   extern "C" std::vector<std::vector<int64_t>>  KLDivBwd<R><S>InferShape(int *ndims, int64_t **shapes, void *extra);
//   Forward None: broadcast of shapes[0], shapes[1]; a -1 (unknown) dim broadcast with 1 stays -1, with
//   k > 1 gives k; if either input has dynamic rank (shapes[i][0] == -2) the result is {-2}.
//   Forward reduced: {} (0-d).
//   Backward: { shape of x, shape of t } (copies of shapes[0] and shapes[1]); BwdInput: shape of x;
//   BwdTarget: shape of t (these two use the forward's single-output InferShape signature).
//   The output dtype is given from Python (out_dtype function returning the input's dtype), not from C++.
//
// Library files (found by ms_kldiv/_build.py, looked up per device target by ms_kldiv/backends/aot.py):
//   CPU -> libkldiv_cpu.so   (g++ -std=c++17, custom_ops/cpu/*.cc)
//   GPU -> libkldiv_cuda.so  (nvcc, custom_ops/gpu/*.cu, sm_70..sm_90 + compute_90 PTX)
//   Each library also exports  extern "C" const char *KLDivLibInfo(void);  a one-line description
//   (ABI version, ISA / arch, threads) that backend_info() and the benchmark show.
#pragma once

#include <stdint.h>

#define KLDIV_ABI_VERSION 1

#ifdef __cplusplus
#include <vector>
#define KLDIV_EXPORT extern "C" __attribute__((visibility("default")))

#define KLDIV_DECLARE_KERNEL(Fn) \
  KLDIV_EXPORT int Fn(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, \
                      void *stream, void *extra)
#define KLDIV_DECLARE_FWD_INFER(Fn) \
  KLDIV_EXPORT std::vector<int64_t> Fn##InferShape(int *ndims, int64_t **shapes, void *extra)
#define KLDIV_DECLARE_BWD_INFER(Fn) \
  KLDIV_EXPORT std::vector<std::vector<int64_t>> Fn##InferShape(int *ndims, int64_t **shapes, void *extra)

// X-macro over the eight (reduction, space) variants: X(Reduction, Space, reduction_id, log_target).
#define KLDIV_FOR_EACH_VARIANT(X)  \
  X(None, Prob, 0, false)          \
  X(Sum, Prob, 1, false)           \
  X(Mean, Prob, 2, false)          \
  X(Batchmean, Prob, 3, false)     \
  X(None, Log, 0, true)            \
  X(Sum, Log, 1, true)             \
  X(Mean, Log, 2, true)            \
  X(Batchmean, Log, 3, true)

namespace kldiv {
enum Reduction : int { kNone = 0, kSum = 1, kMean = 2, kBatchmean = 3 };

// What an exported kernel computes: the forward, or which gradients of the backward (bit 0: d/dinput,
// bit 1: d/dtarget). It fixes the parameter layout: x, t, then out (forward) or dout and the gradients.
enum Want : int { kForward = 0, kWantDx = 1, kWantDt = 2, kWantBoth = 3 };
inline int nparam_for(int want) { return want == kForward ? 3 : want == kWantBoth ? 5 : 4; }
inline int dx_param(int want) { return (want & kWantDx) ? 3 : -1; }  // -1: not computed
inline int dt_param(int want) { return want == kWantBoth ? 4 : want == kWantDt ? 3 : -1; }

// Shape inference, host code shared by both libraries. Forward 'none': NumPy broadcast of x and t; an
// unknown dim (-1) broadcast with 1 stays unknown, with k > 1 it must be k; dynamic rank (-2) stays so.
inline std::vector<int64_t> broadcast_infer(const int *ndims, int64_t *const *shapes) {
  for (int i = 0; i < 2; ++i) {
    if (ndims[i] > 0 && shapes[i][0] == -2) return {-2};
  }
  const int nd = ndims[0] > ndims[1] ? ndims[0] : ndims[1];
  std::vector<int64_t> out(nd);
  for (int d = 0; d < nd; ++d) {
    const int ix = d - (nd - ndims[0]), it = d - (nd - ndims[1]);
    const int64_t a = ix >= 0 ? shapes[0][ix] : 1;
    const int64_t b = it >= 0 ? shapes[1][it] : 1;
    out[d] = (a == 1 || (a == -1 && b != 1)) ? b : a;  // equal, b == 1, or a mismatch Python rejected: a
  }
  return out;
}

// The gradient of operand i (0: input, 1: target) has that operand's shape.
inline std::vector<int64_t> operand_shape(const int *ndims, int64_t *const *shapes, int i) {
  return std::vector<int64_t>(shapes[i], shapes[i] + ndims[i]);
}
}  // namespace kldiv

// One kernel symbol: RUN<log_target>(want, reduction, nparam, params, ndims, shapes, dtypes, stream).
#define KLDIV_DEFINE_KERNEL(NAME, RUN, WANT, RID, LT)                                                      \
  KLDIV_DECLARE_KERNEL(NAME) {                                                                             \
    (void)extra;                                                                                           \
    return RUN<LT>(WANT, RID, nparam, params, ndims, shapes, dtypes, stream);                              \
  }

// Defines every exported symbol of one variant, so both libraries export the same ABI by construction.
// RUN is the library's entry point (see KLDIV_DEFINE_KERNEL).
#define KLDIV_DEFINE_EXPORTS(RUN, R, S, RID, LT)                                                           \
  KLDIV_DEFINE_KERNEL(KLDivFwd##R##S, RUN, kldiv::kForward, RID, LT)                                       \
  KLDIV_DEFINE_KERNEL(KLDivBwd##R##S, RUN, kldiv::kWantBoth, RID, LT)                                      \
  KLDIV_DEFINE_KERNEL(KLDivBwdInput##R##S, RUN, kldiv::kWantDx, RID, LT)                                   \
  KLDIV_DEFINE_KERNEL(KLDivBwdTarget##R##S, RUN, kldiv::kWantDt, RID, LT)                                  \
  KLDIV_DECLARE_FWD_INFER(KLDivFwd##R##S) {                                                                \
    (void)extra;                                                                                           \
    if (RID != kldiv::kNone) return std::vector<int64_t>();                                                \
    return kldiv::broadcast_infer(ndims, shapes);                                                          \
  }                                                                                                        \
  KLDIV_DECLARE_BWD_INFER(KLDivBwd##R##S) {                                                                \
    (void)extra;                                                                                           \
    return {kldiv::operand_shape(ndims, shapes, 0), kldiv::operand_shape(ndims, shapes, 1)};               \
  }                                                                                                        \
  KLDIV_DECLARE_FWD_INFER(KLDivBwdInput##R##S) {                                                           \
    (void)extra;                                                                                           \
    return kldiv::operand_shape(ndims, shapes, 0);                                                         \
  }                                                                                                        \
  KLDIV_DECLARE_FWD_INFER(KLDivBwdTarget##R##S) {                                                          \
    (void)extra;                                                                                           \
    return kldiv::operand_shape(ndims, shapes, 1);                                                         \
  }

KLDIV_EXPORT const char *KLDivLibInfo(void);
#endif
