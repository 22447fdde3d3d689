// kldiv-cxxflags(any):
// The front end of the fused distillation kernels in libkldiv_cpu.so (ABI: custom_ops/common/distill_abi.h): checks
// the layout, then splits the rows over the library's pool and runs the ISA's row kernels (distill_kernels.inc).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../common/distill_abi.h"
#include "kldiv_cpu.h"

namespace {

using kldiv::cpu::DistillJob;

void task(void *ctx, int chunk, int nchunks) {
  const DistillJob &j = *static_cast<const DistillJob *>(ctx);
  kldiv::cpu::active_table()->distill_rows(&j, j.rows * chunk / nchunks, j.rows * (chunk + 1) / nchunks);
}

int run(int op, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream) {
  (void)stream;
  const bool forward = distill::is_forward(op);
  DistillJob j;
  if (!distill::rows_and_vocab(op, nparam, ndims, shapes, dtypes, &j.rows, &j.vocab)) return 1;
  j.dtype = kldiv::cpu::parse_dtype(dtypes[0]);
  if (j.dtype < 0 || j.dtype == kldiv::cpu::kF64) return 1;  // float64 takes the composite kernels
  kldiv::cpu::init_distill_job(static_cast<const double *>(params[2]), &j);
  j.s = params[0];
  j.t_logits = params[1];
  j.op = op;
  j.given = op == distill::kGiven ? static_cast<const float *>(params[3]) : nullptr;
  j.stats = static_cast<float *>(params[op == distill::kGiven ? 4 : 3]);
  j.dloss = forward ? nullptr : static_cast<const float *>(params[4]);
  j.ds = distill::ds_param(op) >= 0 ? params[distill::ds_param(op)] : nullptr;
  j.dt = distill::dt_param(op) >= 0 ? params[distill::dt_param(op)] : nullptr;
  if (j.rows == 0) return 0;
  if (j.vocab == 0) {  // no classes: every divergence is 0 (the gradients have no elements)
    if (forward) memset(j.stats, 0, sizeof(float) * distill::kStats * j.rows);
    for (int64_t r = 0; op != distill::kForward && r < j.rows; ++r) {  // a slice without classes has no mass
      float *row = j.stats + r * distill::kStats;
      const float *given = j.given ? j.given + r * distill::kStats : nullptr;
      for (int c : {distill::kLogZStudent, distill::kLogZTeacher, distill::kMaxStudent, distill::kMaxTeacher}) {
        row[c] = given ? given[c] : (c == distill::kLogZStudent || c == distill::kLogZTeacher ? -INFINITY : 0.0f);
      }
    }
    return 0;
  }
  kldiv::cpu::run_distill_job(j);
  return 0;
}

}  // namespace

namespace kldiv {
namespace cpu {

void init_distill_job(const double *hyper, DistillJob *j) {
  // (temperature, beta, divergence code, alpha, soft cap (0: none), logit scale)
  const double temperature = hyper[0], beta = hyper[1];
  j->inv_t = static_cast<float>(1.0 / temperature);
  j->t = static_cast<float>(temperature);
  j->t_sq = static_cast<float>(temperature * temperature);
  j->kind = distill::kind_of(beta, hyper[2]);
  j->mix = distill::mix_of<float>(j->kind, beta, hyper[3]);
  j->f = distill::transform_of(hyper[5], hyper[4]);
  j->beta = static_cast<float>(beta);
  j->log_beta = j->kind == 2 ? static_cast<float>(log(beta)) : 0.0f;
  j->log_1m_beta = j->kind == 2 ? static_cast<float>(log1p(-beta)) : 0.0f;
}

void run_distill_job(const DistillJob &j) {
  const int nchunks = threads_for(j.rows * j.vocab * 4);
  parallel_run(nchunks > j.rows ? static_cast<int>(j.rows) : nchunks, &task, const_cast<DistillJob *>(&j));
}

}  // namespace cpu
}  // namespace kldiv

DISTILL_DEFINE_EXPORTS(run)
DISTILL_DEFINE_SHARD_EXPORTS(run)

DISTILL_DEFINE_INFER_SHAPES
