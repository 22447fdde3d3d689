// The exported ABI of the fused distillation kernels (in the same libraries as the KLDiv ABI, kldiv_abi.h),
// called by ms_kldiv/backends/distill.py through ops.Custom(func_type="aot"). Math: distill_math.h.
//
// Logits s (student) and t (teacher): one shape [..., V] (rank >= 1; rows = product of the leading dims), one
// dtype D in {"float32", "float16", "bfloat16"} (float64 goes to the composite path); hyper: float64 [6] =
// (temperature, beta, divergence code, alpha, soft cap (0: none), logit scale) (ms_kldiv._distill_math.hyper). Statistics: float32 [..., 8] (distill::Stat: row loss T^2 D, lse of the student's and the
// teacher's scaled logits, sum(a), sum(b), 3 unused).
//   DistillFwd         nparam 4: s, t, hyper, stats (out)
//   DistillBwd         nparam 7: s, t, hyper, stats, dloss (float32 [...]), d_student (out, D), d_teacher (out, D)
//   DistillBwdStudent  nparam 6: s, t, hyper, stats, dloss, d_student (out)  } compiled code uses these two, so
//   DistillBwdTeacher  nparam 6: s, t, hyper, stats, dloss, d_teacher (out)  } a frozen teacher's op is dropped
// Vocabulary-parallel pieces (each rank holds a contiguous slice of V; ms_kldiv/backends/vocab_parallel.py):
//   DistillStates      nparam 4: s, t, hyper, stats (out): only the normalizer columns (kLogZ*, kMax*) of the slice
//   DistillFwdGiven    nparam 5: s, t, hyper, states (in, [..., 8]), stats (out): the slice's sums (loss, sum(a),
//                      sum(b)) with the normalizers taken from `states` (the whole row's, merged across ranks), and
//                      those normalizer columns copied; the backward kernels then run on the merged stats unchanged.
// The fused head's hard-label term (ms_kldiv/fused_linear.py's chunk loop; math: distill_math.h, the hard-label term):
//   DistillHard        nparam 7: s [R, V], labels (int32 [R]; ignore_index: not counted), hyper (float64 [9]: the
//                      six above, then z-loss, label smoothing, ignore_index), g (float32 [R]: each row's gradient
//                      coefficient), ds (in, D [R, V]), rows (out, float32 [R]: each row's cross-entropy, 0 where not
//                      counted, NaN for a counted label outside [0, V)), d (out, D [R, V]) = ds + g d(rows)/ds: the
//                      gradient adds onto the soft term's, so the term needs no [R, V] buffer of its own.
// The gradients are those of sum_rows dloss[row] * loss[row]; a row with dloss == 0 (an ignored token) gets exact
// zeros without its logits being read. Return value 0, or 1 for a layout Python already excludes.
#pragma once

#include <stdint.h>
#include <string.h>

#include <vector>

#include "kldiv_abi.h"
#include "distill_math.h"

#define DISTILL_DECLARE_KERNEL(Fn) KLDIV_DECLARE_KERNEL(Fn)

namespace distill {
// The four entry points and where their gradient outputs are (-1: not written).
enum Op : int { kForward = 0, kBoth = 1, kStudent = 2, kTeacher = 3, kStates = 4, kGiven = 5 };
inline bool is_forward(int op) { return op == kForward || op == kStates || op == kGiven; }
inline int nparam_of(int op) { return op == kForward || op == kStates ? 4 : op == kGiven ? 5 : op == kBoth ? 7 : 6; }
inline int ds_param(int op) { return op == kBoth || op == kStudent ? 5 : -1; }
inline int dt_param(int op) { return op == kBoth ? 6 : op == kTeacher ? 5 : -1; }

// The call's rows and vocabulary; false for a layout Python already excludes (parameter count, shapes, dtypes).
// The logits' dtype itself is the device's to check.
inline bool rows_and_vocab(int op, int nparam, const int *ndims, int64_t *const *shapes, const char **dtypes,
                           int64_t *rows, int64_t *vocab) {
  if (nparam != nparam_of(op) || ndims[0] < 1 || ndims[0] != ndims[1]) return false;
  for (int d = 0; d < ndims[0]; ++d) {
    if (shapes[0][d] != shapes[1][d]) return false;
  }
  if (!dtypes[0] || !dtypes[1] || strcmp(dtypes[0], dtypes[1]) != 0 || strcmp(dtypes[2], "float64") != 0) return false;
  *vocab = shapes[0][ndims[0] - 1];
  *rows = 1;
  for (int d = 0; d + 1 < ndims[0]; ++d) *rows *= shapes[0][d];
  return true;
}

// The hard-label call's rows and vocabulary (DistillHard's layout above); false for a layout Python excludes.
constexpr int kHardParams = 7, kHardHyper = 9;
enum HardHyper : int { kHardZLoss = 6, kHardSmoothing = 7, kHardIgnoreIndex = 8 };
inline bool hard_rows_and_vocab(int nparam, const int *ndims, int64_t *const *shapes, const char **dtypes,
                                int64_t *rows, int64_t *vocab) {
  if (nparam != kHardParams || ndims[0] != 2 || ndims[1] != 1 || ndims[2] != 1 || ndims[3] != 1 || ndims[4] != 2)
    return false;
  *rows = shapes[0][0];
  *vocab = shapes[0][1];
  if (shapes[1][0] != *rows || shapes[2][0] != kHardHyper || shapes[3][0] != *rows || shapes[4][0] != *rows ||
      shapes[4][1] != *vocab)
    return false;
  return dtypes[0] && dtypes[4] && strcmp(dtypes[0], dtypes[4]) == 0 && strcmp(dtypes[1], "int32") == 0 &&
         strcmp(dtypes[2], "float64") == 0 && strcmp(dtypes[3], "float32") == 0;
}

// [..., V] -> [..., kStats]; a dynamic rank stays dynamic.
inline std::vector<int64_t> stats_shape(const int *ndims, int64_t *const *shapes) {
  if (ndims[0] < 1 || shapes[0][0] == -2) return {-2};
  std::vector<int64_t> out(shapes[0], shapes[0] + ndims[0]);
  out.back() = kStats;
  return out;
}
}  // namespace distill

// C++ shape inference of the three kernels (dynamic row counts under Cell.set_inputs need it).
#define DISTILL_DEFINE_INFER_SHAPES                                                                       \
  KLDIV_DECLARE_FWD_INFER(DistillFwd) {                                                                   \
    (void)extra;                                                                                          \
    return distill::stats_shape(ndims, shapes);                                                           \
  }                                                                                                       \
  KLDIV_DECLARE_BWD_INFER(DistillBwd) {                                                                   \
    (void)extra;                                                                                          \
    return {std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]),                                        \
            std::vector<int64_t>(shapes[1], shapes[1] + ndims[1])};                                       \
  }                                                                                                       \
  KLDIV_DECLARE_FWD_INFER(DistillBwdStudent) {                                                            \
    (void)extra;                                                                                          \
    return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);                                         \
  }                                                                                                       \
  KLDIV_DECLARE_FWD_INFER(DistillBwdTeacher) {                                                            \
    (void)extra;                                                                                          \
    return std::vector<int64_t>(shapes[1], shapes[1] + ndims[1]);                                         \
  }                                                                                                       \
  KLDIV_DECLARE_FWD_INFER(DistillStates) {                                                                \
    (void)extra;                                                                                          \
    return distill::stats_shape(ndims, shapes);                                                           \
  }                                                                                                       \
  KLDIV_DECLARE_FWD_INFER(DistillFwdGiven) {                                                              \
    (void)extra;                                                                                          \
    return distill::stats_shape(ndims, shapes);                                                           \
  }                                                                                                       \
  KLDIV_DECLARE_BWD_INFER(DistillHard) {                                                                  \
    (void)extra;                                                                                          \
    const std::vector<int64_t> logits(shapes[0], shapes[0] + ndims[0]);                                   \
    return {ndims[0] == 2 ? std::vector<int64_t>{shapes[0][0]} : std::vector<int64_t>{-2}, logits};      \
  }

// One export: kernel Fn calling run(op, nparam, params, ndims, shapes, dtypes, stream) of the device's front end.
#define DISTILL_DEFINE_EXPORT(Fn, run, op)                                                                \
  DISTILL_DECLARE_KERNEL(Fn) {                                                                            \
    (void)extra;                                                                                          \
    return run(op, nparam, params, ndims, shapes, dtypes, stream);                                        \
  }

// The four exports.
#define DISTILL_DEFINE_EXPORTS(run)                                                                       \
  DISTILL_DEFINE_EXPORT(DistillFwd, run, distill::kForward)                                               \
  DISTILL_DEFINE_EXPORT(DistillBwd, run, distill::kBoth)                                                  \
  DISTILL_DEFINE_EXPORT(DistillBwdStudent, run, distill::kStudent)                                        \
  DISTILL_DEFINE_EXPORT(DistillBwdTeacher, run, distill::kTeacher)

// The hard-label export: Fn(nparam, params, ndims, shapes, dtypes, stream) of the device's front end.
#define DISTILL_DEFINE_HARD_EXPORT(run)                                                                   \
  DISTILL_DECLARE_KERNEL(DistillHard) {                                                                   \
    (void)extra;                                                                                          \
    return run(nparam, params, ndims, shapes, dtypes, stream);                                            \
  }

// The vocabulary-parallel exports (CPU and CUDA libraries; without them, e.g. AscendC, the composite kernels serve).
#define DISTILL_DEFINE_SHARD_EXPORTS(run)                                                                 \
  DISTILL_DEFINE_EXPORT(DistillStates, run, distill::kStates)                                             \
  DISTILL_DEFINE_EXPORT(DistillFwdGiven, run, distill::kGiven)
