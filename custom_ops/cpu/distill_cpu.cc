// kldiv-cxxflags(any):
// The fused distillation kernels of libkldiv_cpu.so (ABI: custom_ops/common/distill_abi.h, math:
// custom_ops/common/distill_math.h). One row at a time per thread, rows split over the library's pool; scratch is
// O(1) per row, and only the outputs (the [rows, 8] statistics, the gradients) are written.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "../common/distill_abi.h"
#include "../common/kldiv_half.h"
#include "kldiv_cpu.h"
#include "kldiv_vecmath.h"
#include "../common/distill_math.h"

namespace {

using kldiv::Io;

// Elements per block of the online passes: the block's maxima are taken first, so the exponentials of a block
// share one base and vectorize; the double accumulators absorb the float terms once per block.
constexpr int64_t kBlock = 1024;

struct Hyper {
  float inv_t, t, t_sq;
  int kind;
  float beta, log_beta, log_1m_beta;
};

Hyper hyper_of(const double *h) {
  const double temperature = h[0], beta = h[1];
  Hyper p;
  p.inv_t = static_cast<float>(1.0 / temperature);
  p.t = static_cast<float>(temperature);
  p.t_sq = static_cast<float>(temperature * temperature);
  p.kind = distill::kind_of(beta);
  p.beta = static_cast<float>(beta);
  p.log_beta = p.kind == 2 ? static_cast<float>(log(beta)) : 0.0f;
  p.log_1m_beta = p.kind == 2 ? static_cast<float>(log1p(-beta)) : 0.0f;
  return p;
}

template <typename T>
float block_max(const T *v, int64_t n, float inv_t) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) {
    const float x = Io<T>::load(v, j) * inv_t;
    m = x > m ? x : m;
  }
  return m;
}

// log-sum-exp of one scaled row (the JSD's first pass).
template <typename T>
double row_lse(const T *v, int64_t V, float inv_t) {
  distill::Online o = distill::online_empty();
  for (int64_t b0 = 0; b0 < V; b0 += kBlock) {
    const int64_t n = V - b0 < kBlock ? V - b0 : kBlock;
    distill::online_rescale(&o, block_max(v + b0, n, inv_t));
    const float base = static_cast<float>(distill::safe_base(o.m));
    double z = 0.0;
#pragma omp simd reduction(+ : z)
    for (int64_t j = 0; j < n; ++j) z += expf(Io<T>::load(v + b0, j) * inv_t - base);
    o.z += z;
  }
  return distill::online_lse(o);
}

// Forward of one row: writes the row's statistics (distill::Stat).
template <typename T>
void forward_row(const T *s, const T *t, int64_t V, const Hyper &h, float *stats) {
  for (int k = 0; k < distill::kStats; ++k) stats[k] = 0.0f;
  double lse_s, lse_t, sum_a = 0.0, sum_b = 0.0, d;
  if (h.kind != 2) {
    // One read: P weights the difference (teacher for forward KL, student for reverse KL), Q is the other.
    const T *p = h.kind == 0 ? t : s, *q = h.kind == 0 ? s : t;
    distill::Online op = distill::online_empty(), oq = distill::online_empty();
    double w = 0.0;
    for (int64_t b0 = 0; b0 < V; b0 += kBlock) {
      const int64_t n = V - b0 < kBlock ? V - b0 : kBlock;
      w *= distill::online_rescale(&op, block_max(p + b0, n, h.inv_t));
      distill::online_rescale(&oq, block_max(q + b0, n, h.inv_t));
      const float bp = static_cast<float>(distill::safe_base(op.m)), bq = static_cast<float>(distill::safe_base(oq.m));
      double zp = 0.0, zq = 0.0, ww = 0.0;
#pragma omp simd reduction(+ : zp, zq, ww)
      for (int64_t j = 0; j < n; ++j) {
        const float vp = Io<T>::load(p + b0, j) * h.inv_t, vq = Io<T>::load(q + b0, j) * h.inv_t;
        const float ep = expf(vp - bp), eq = expf(vq - bq);
        zp += ep;
        zq += eq;
        ww += ep > 0.0f ? ep * (vp - vq) : 0.0f;  // a class without P mass adds 0, whatever Q says
      }
      op.z += zp;
      oq.z += zq;
      w += ww;
    }
    d = distill::kl_from_sums(op, oq, w);
    const double lse_p = distill::online_lse(op), lse_q = distill::online_lse(oq);
    lse_t = h.kind == 0 ? lse_p : lse_q;
    lse_s = h.kind == 0 ? lse_q : lse_p;
    (h.kind == 0 ? sum_b : sum_a) = d;
  } else {
    lse_s = row_lse(s, V, h.inv_t);
    lse_t = row_lse(t, V, h.inv_t);
    const float ls = static_cast<float>(lse_s), lt = static_cast<float>(lse_t);
#pragma omp simd reduction(+ : sum_a, sum_b)
    for (int64_t j = 0; j < V; ++j) {
      float a, b;
      distill::jsd_terms(Io<T>::load(s, j) * h.inv_t - ls, Io<T>::load(t, j) * h.inv_t - lt, h.log_beta,
                         h.log_1m_beta, h.beta, &a, &b);
      sum_a += a;
      sum_b += b;
    }
    d = sum_a + sum_b;
  }
  stats[distill::kLoss] = static_cast<float>(static_cast<double>(h.t_sq) * d);
  stats[distill::kLseStudent] = static_cast<float>(lse_s);
  stats[distill::kLseTeacher] = static_cast<float>(lse_t);
  stats[distill::kSumA] = static_cast<float>(sum_a);
  stats[distill::kSumB] = static_cast<float>(sum_b);
}

// Backward of one row: d_student (and d_teacher when dt is not null) from the saved statistics.
template <typename T>
void backward_row(const T *s, const T *t, int64_t V, const Hyper &h, const float *stats, float g, T *ds, T *dt) {
  if (g == 0.0f) {  // an ignored row (or a zero incoming gradient): exact zeros, the logits are not read
    if (ds) memset(static_cast<void *>(ds), 0, sizeof(T) * V);
    if (dt) memset(static_cast<void *>(dt), 0, sizeof(T) * V);
    return;
  }
  const float ls = stats[distill::kLseStudent], lt = stats[distill::kLseTeacher];
  const float sa = stats[distill::kSumA], sb = stats[distill::kSumB], g_t = g * h.t;
  if (ds && dt) {
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) {
      float a, b;
      distill::grads(h.kind, Io<T>::load(s, j) * h.inv_t - ls, Io<T>::load(t, j) * h.inv_t - lt, sa, sb,
                     h.log_beta, h.log_1m_beta, h.beta, g_t, &a, &b);
      Io<T>::store(ds, j, a);
      Io<T>::store(dt, j, b);
    }
  } else if (dt) {
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) {
      float a, b;
      distill::grads(h.kind, Io<T>::load(s, j) * h.inv_t - ls, Io<T>::load(t, j) * h.inv_t - lt, sa, sb,
                     h.log_beta, h.log_1m_beta, h.beta, g_t, &a, &b);
      Io<T>::store(dt, j, b);
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) {
      float a, b;
      distill::grads(h.kind, Io<T>::load(s, j) * h.inv_t - ls, Io<T>::load(t, j) * h.inv_t - lt, sa, sb,
                     h.log_beta, h.log_1m_beta, h.beta, g_t, &a, &b);
      Io<T>::store(ds, j, a);
    }
  }
}

struct Job {
  int dtype;
  int64_t rows, V;
  Hyper h;
  const void *s, *t;
  float *stats;       // forward output / backward input
  const float *dloss;  // backward only
  void *ds, *dt;       // backward outputs (either may be null, not both)
};

template <typename T>
void run_rows(const Job &j, int64_t r0, int64_t r1) {
  const T *s = static_cast<const T *>(j.s), *t = static_cast<const T *>(j.t);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t off = r * j.V;
    if (j.dloss == nullptr) {
      forward_row(s + off, t + off, j.V, j.h, j.stats + r * distill::kStats);
    } else {
      backward_row(s + off, t + off, j.V, j.h, j.stats + r * distill::kStats, j.dloss[r],
                   j.ds ? static_cast<T *>(j.ds) + off : nullptr, j.dt ? static_cast<T *>(j.dt) + off : nullptr);
    }
  }
}

void task(void *ctx, int chunk, int nchunks) {
  const Job &j = *static_cast<const Job *>(ctx);
  const int64_t r0 = j.rows * chunk / nchunks, r1 = j.rows * (chunk + 1) / nchunks;
  switch (j.dtype) {
    case kldiv::cpu::kF32: run_rows<float>(j, r0, r1); break;
    case kldiv::cpu::kF16: run_rows<kldiv::f16>(j, r0, r1); break;
    case kldiv::cpu::kBF16: run_rows<kldiv::bf16>(j, r0, r1); break;
    default: break;
  }
}

int parse_dtype(const char *s) {
  if (!s) return -1;
  if (strcmp(s, "float32") == 0) return kldiv::cpu::kF32;
  if (strcmp(s, "float16") == 0) return kldiv::cpu::kF16;
  if (strcmp(s, "bfloat16") == 0) return kldiv::cpu::kBF16;
  return -1;
}

enum Op : int { kForward = 0, kBoth = 1, kStudent = 2, kTeacher = 3 };

// Shared by the exports: checks the layout (distill_abi.h) and runs the rows on the pool.
int run(int op, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  const bool forward = op == kForward;
  const int expected = forward ? 4 : (op == kBoth ? 7 : 6);
  if (nparam != expected || ndims[0] < 1 || ndims[0] != ndims[1]) return 1;
  for (int d = 0; d < ndims[0]; ++d) {
    if (shapes[0][d] != shapes[1][d]) return 1;
  }
  Job j;
  j.dtype = parse_dtype(dtypes[0]);
  if (j.dtype < 0 || parse_dtype(dtypes[1]) != j.dtype || strcmp(dtypes[2], "float64") != 0) return 1;
  j.V = shapes[0][ndims[0] - 1];
  j.rows = 1;
  for (int d = 0; d + 1 < ndims[0]; ++d) j.rows *= shapes[0][d];
  j.h = hyper_of(static_cast<const double *>(params[2]));
  j.s = params[0];
  j.t = params[1];
  j.stats = static_cast<float *>(params[3]);
  j.dloss = forward ? nullptr : static_cast<const float *>(params[4]);
  j.ds = op == kBoth || op == kStudent ? params[5] : nullptr;
  j.dt = op == kBoth ? params[6] : op == kTeacher ? params[5] : nullptr;
  if (j.rows == 0) return 0;
  if (j.V == 0) {  // no classes: every divergence is 0 (the gradients have no elements)
    if (forward) memset(j.stats, 0, sizeof(float) * distill::kStats * j.rows);
    return 0;
  }
  const int nchunks = kldiv::cpu::threads_for(j.rows * j.V * 4);
  kldiv::cpu::parallel_run(nchunks > j.rows ? static_cast<int>(j.rows) : nchunks, &task, &j);
  return 0;
}

}  // namespace

DISTILL_DECLARE_KERNEL(DistillFwd) {
  (void)stream;
  (void)extra;
  return run(kForward, nparam, params, ndims, shapes, dtypes);
}

DISTILL_DECLARE_KERNEL(DistillBwd) {
  (void)stream;
  (void)extra;
  return run(kBoth, nparam, params, ndims, shapes, dtypes);
}

DISTILL_DECLARE_KERNEL(DistillBwdStudent) {
  (void)stream;
  (void)extra;
  return run(kStudent, nparam, params, ndims, shapes, dtypes);
}

DISTILL_DECLARE_KERNEL(DistillBwdTeacher) {
  (void)stream;
  (void)extra;
  return run(kTeacher, nparam, params, ndims, shapes, dtypes);
}

DISTILL_DEFINE_INFER_SHAPES
