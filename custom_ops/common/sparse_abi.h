// The exported ABI of the fused stored-teacher distillation kernels (in the same libraries as kldiv_abi.h), called
// by ms_kldiv/backends/sparse.py through ops.Custom(func_type="aot"). Math: sparse_math.h.
//
// Student logits s [..., V] (rank >= 1; rows = product of the leading dims), dtype D in {"float32", "float16",
// "bfloat16"}; the teacher's ids int32 [..., K] (negative: padding) and values float32 [..., K] of the same leading
// shape; hyper: float64 [4] = (temperature, T0 / T, beta, tail). Statistics: float32 [..., 8] (sparse::Stat).
//   SparseFwd  nparam 5: s, ids, values, hyper, stats (out)
//   SparseBwd  nparam 7: s, ids, values, hyper, stats, dloss (float32 [...]), d_student (out, D)
// The gradient is that of sum_rows dloss[row] * loss[row]; a row with dloss == 0 gets exact zeros without its
// logits being read. Return value 0, or 1 for a layout Python already excludes.
#pragma once

#include <stdint.h>
#include <string.h>

#include <vector>

#include "kldiv_abi.h"
#include "sparse_math.h"

namespace sparse {
// The call's rows, vocabulary and ids per row; false for a layout Python already excludes.
inline bool layout(bool forward, int nparam, const int *ndims, int64_t *const *shapes, const char **dtypes,
                   int64_t *rows, int64_t *vocab, int64_t *k) {
  if (nparam != (forward ? 5 : 7) || ndims[0] < 1 || ndims[1] != ndims[0] || ndims[2] != ndims[0]) return false;
  for (int d = 0; d + 1 < ndims[0]; ++d) {
    if (shapes[1][d] != shapes[0][d] || shapes[2][d] != shapes[0][d]) return false;
  }
  if (shapes[1][ndims[0] - 1] != shapes[2][ndims[0] - 1]) return false;
  if (!dtypes[1] || strcmp(dtypes[1], "int32") != 0 || !dtypes[2] || strcmp(dtypes[2], "float32") != 0 ||
      !dtypes[3] || strcmp(dtypes[3], "float64") != 0) {
    return false;
  }
  *vocab = shapes[0][ndims[0] - 1];
  *k = shapes[1][ndims[0] - 1];
  *rows = 1;
  for (int d = 0; d + 1 < ndims[0]; ++d) *rows *= shapes[0][d];
  return true;
}

// [..., V] -> [..., kStats]; a dynamic rank stays dynamic.
inline std::vector<int64_t> stats_shape(const int *ndims, int64_t *const *shapes) {
  if (ndims[0] < 1 || shapes[0][0] == -2) return {-2};
  std::vector<int64_t> out(shapes[0], shapes[0] + ndims[0]);
  out.back() = kStats;
  return out;
}
}  // namespace sparse

// C++ shape inference (dynamic row counts under Cell.set_inputs need it).
#define SPARSE_DEFINE_INFER_SHAPES                                                                        \
  KLDIV_DECLARE_FWD_INFER(SparseFwd) {                                                                    \
    (void)extra;                                                                                          \
    return sparse::stats_shape(ndims, shapes);                                                            \
  }                                                                                                       \
  KLDIV_DECLARE_FWD_INFER(SparseBwd) {                                                                    \
    (void)extra;                                                                                          \
    return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);                                         \
  }

// The two exports, each calling run(forward, nparam, params, ndims, shapes, dtypes, stream) of the front end.
#define SPARSE_DEFINE_EXPORTS(run)                                                                        \
  KLDIV_DECLARE_KERNEL(SparseFwd) {                                                                       \
    (void)extra;                                                                                          \
    return run(true, nparam, params, ndims, shapes, dtypes, stream);                                      \
  }                                                                                                       \
  KLDIV_DECLARE_KERNEL(SparseBwd) {                                                                       \
    (void)extra;                                                                                          \
    return run(false, nparam, params, ndims, shapes, dtypes, stream);                                     \
  }
