// kldiv-cxxflags(any):
// The front end of the fused stored-teacher kernels in libkldiv_cpu.so (ABI: custom_ops/common/sparse_abi.h):
// checks the layout, then splits the rows over the library's pool and runs the ISA's row kernels
// (sparse_kernels.inc).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../common/sparse_abi.h"
#include "kldiv_cpu.h"

namespace {

using kldiv::cpu::SparseJob;

void task(void *ctx, int chunk, int nchunks) {
  const SparseJob &j = *static_cast<const SparseJob *>(ctx);
  kldiv::cpu::active_table()->sparse_rows(&j, j.rows * chunk / nchunks, j.rows * (chunk + 1) / nchunks);
}

int run(bool forward, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream) {
  (void)stream;
  SparseJob j;
  if (!sparse::layout(forward, nparam, ndims, shapes, dtypes, &j.rows, &j.vocab, &j.k)) return 1;
  j.dtype = kldiv::cpu::parse_dtype(dtypes[0]);
  if (j.dtype < 0 || j.dtype == kldiv::cpu::kF64) return 1;  // float64 takes the composite kernels
  j.h = sparse::hyper_of(static_cast<const double *>(params[3]));
  j.s = params[0];
  j.ids = static_cast<const int32_t *>(params[1]);
  j.vals = static_cast<const float *>(params[2]);
  j.stats = static_cast<float *>(params[4]);
  j.dloss = forward ? nullptr : static_cast<const float *>(params[5]);
  j.ds = forward ? nullptr : params[6];
  if (j.rows == 0 || j.vocab == 0) return 0;  // Python refuses V = 0; no rows: nothing to write
  const int nchunks = kldiv::cpu::threads_for(j.rows * j.vocab * 4);
  kldiv::cpu::parallel_run(nchunks > j.rows ? static_cast<int>(j.rows) : nchunks, &task, &j);
  return 0;
}

}  // namespace

SPARSE_DEFINE_EXPORTS(run)

SPARSE_DEFINE_INFER_SHAPES
