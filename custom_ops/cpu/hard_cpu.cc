// kldiv-cxxflags(any):
// The fused head's hard-label term on CPU: DistillHard (ABI: custom_ops/common/distill_abi.h; math: distill_math.h,
// the hard-label term) and the row function the one-op head (head_cpu.cc) calls for the same term.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../common/distill_abi.h"
#include "kldiv_cpu.h"

namespace kldiv {
namespace cpu {

double hard_row(const float *s, int64_t v, int64_t label, const HardOptions &o, float coef, float *d) {
  const HardRow r{s, d, d, kF32, v, label, coef, &o};
  return active_table()->hard_row(&r);
}

HardOptions hard_options(const double *hyper, int z_loss_at, int smoothing_at) {
  return HardOptions{hyper[z_loss_at], hyper[smoothing_at], distill::transform_of(hyper[5], hyper[4])};
}

}  // namespace cpu
}  // namespace kldiv

namespace {

struct HardJob {
  const void *s, *ds;
  void *d;
  const int32_t *labels;
  const float *g;
  float *loss;  // [rows]
  int64_t rows, v, ignore_index;
  int dtype;
  kldiv::cpu::HardOptions o;
};

void hard_task(void *ctx, int part, int parts) {
  const HardJob &k = *static_cast<const HardJob *>(ctx);
  const int64_t size = k.dtype == kldiv::cpu::kF32 ? 4 : 2, bytes = k.v * size;
  const kldiv::cpu::KernelTable *table = kldiv::cpu::active_table();
  for (int64_t r = k.rows * part / parts; r < k.rows * (part + 1) / parts; ++r) {
    const char *ds = static_cast<const char *>(k.ds) + r * bytes;
    char *d = static_cast<char *>(k.d) + r * bytes;
    if (k.labels[r] == k.ignore_index) {  // not counted: loss 0, the soft gradient unchanged
      k.loss[r] = 0.0f;
      memcpy(d, ds, bytes);
      continue;
    }
    const kldiv::cpu::HardRow row{static_cast<const char *>(k.s) + r * bytes, ds, d, k.dtype, k.v, k.labels[r],
                                  k.g[r], &k.o};
    k.loss[r] = static_cast<float>(table->hard_row(&row));
  }
}

int run_hard(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream) {
  (void)stream;
  int64_t rows, v;
  if (!distill::hard_rows_and_vocab(nparam, ndims, shapes, dtypes, &rows, &v)) return 1;
  const int dtype = kldiv::cpu::parse_dtype(dtypes[0]);
  if (dtype < 0 || dtype == kldiv::cpu::kF64) return 1;  // float64 takes the composite kernels
  const double *hyper = static_cast<const double *>(params[2]);
  HardJob k{params[0], params[4], params[6], static_cast<const int32_t *>(params[1]),
            static_cast<const float *>(params[3]), static_cast<float *>(params[5]), rows, v,
            static_cast<int64_t>(hyper[distill::kHardIgnoreIndex]), dtype,
            kldiv::cpu::hard_options(hyper, distill::kHardZLoss, distill::kHardSmoothing)};
  if (rows == 0) return 0;
  const int parts = kldiv::cpu::threads_for(rows * v * 4);
  kldiv::cpu::parallel_run(parts > rows ? static_cast<int>(rows) : parts, &hard_task, &k);
  return 0;
}

}  // namespace

DISTILL_DEFINE_HARD_EXPORT(run_hard)
