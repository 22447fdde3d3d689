// Distillation from a stored (sparse) teacher, declared once: the per-row statistics of the fused kernels and the
// student's gradient. ms_kldiv/_sparse_math.py is the same closed form in MindSpore ops; ms_kldiv/reference.py
// `sparse_support` the float64 definition.
//
// Per row: student logits s [V], x = (s - max) / T (so huge logits stay exact), the teacher's K ids (negative:
// padding) and float32 values v (log-probabilities at temperature T0, or log-counts). Both models become
// distributions over K + 1 buckets, the ids and the tail (every class off the ids):
//   log r_i = x[id_i] - log Z,   log r_tail = log Z_off - log Z     (Z = sum_j e^x_j, Z_off = the same off the ids)
//   y_i = ratio v_i,  y_tail = ratio log(1 - sum_i e^v_i) ('tail' mode; -inf otherwise or when Z_off = 0),
//   log q = y - log Q, Q = sum e^y over the K + 1,                   ratio = T0 / T
// and the row loss is T^2 D_beta(q, r) over the buckets (distill_math.h's family). With a_u = r_u dD/dr_u per
// bucket (forward KL: -q_u; reverse KL: r_u (log r_u - log q_u); JSD: (1 - beta) r_u (log r_u - log M_u)) and
// A = sum_u a_u, the gradient of g T^2 D is
//   d/ds_j = g T (a_j - p_j A)                          for j among the ids
//          = g T (a_tail e^(x_j - log Z_off) - p_j A)   off the ids   (p_j = e^(x_j - log Z))
// which never divides by r_tail. A row with an id >= V or a repeated id has NaN loss and gradient.
#pragma once

#include "distill_math.h"

namespace sparse {

// Columns of the saved statistics (float32, [rows, kStats]).
enum Stat : int { kLoss = 0, kMax = 1, kLogZ = 2, kLogZOff = 3, kSumA = 4, kATail = 5, kLogQ = 6, kStats = 8 };

// The hyperparameters of one call, from the float64 `hyper` input (temperature, ratio, beta, tail).
struct Hyper {
  float inv_t, t, t_sq;
  double ratio, beta, log_beta, log_1m_beta;
  int kind;  // distill::kind_of(beta)
  bool tail;
};

// A confident student's tail: a kernel's sweep sums Z_off as float32 exponentials relative to a maximum that sits on
// an id, so from a logit gap of ~87 T (flushed; ~103 T otherwise) the tail's terms underflow and are lost. Under this
// bound for Z_off (relative to the row's maximum) they may be all of it, above it they are below float rounding: rows
// under it sum the classes off the ids once more, relative to their own maximum.
constexpr double kTailRescue = 0x1p-64;
// log of the smallest positive double: a tail further below the row's maximum has no mass in the float64 definition
// (ms_kldiv.reference), which then has no tail.
constexpr double kLogMinDouble = -745.1332191019412;

DISTILL_HD Hyper hyper_of(const double *h) {
  Hyper o;
  o.t = static_cast<float>(h[0]);
  o.inv_t = static_cast<float>(1.0 / h[0]);
  o.t_sq = static_cast<float>(h[0] * h[0]);
  o.ratio = h[1];
  o.beta = h[2];
  o.kind = distill::kind_of(h[2]);
  o.log_beta = o.kind == 2 ? log(h[2]) : 0.0;
  o.log_1m_beta = o.kind == 2 ? log1p(-h[2]) : 0.0;
  o.tail = h[3] != 0.0;
  return o;
}

// The divergence term of one bucket and its a (see above), double.
DISTILL_HD void bucket(const Hyper &h, double log_r, double log_q, double *term, double *a) {
  if (h.kind == 0) {
    const double q = exp(log_q);
    *term = q > 0.0 ? q * (log_q - log_r) : 0.0;
    *a = -q;
  } else if (h.kind == 1) {
    const double r = exp(log_r);
    *term = r > 0.0 ? r * (log_r - log_q) : 0.0;
    *a = *term;
  } else {
    double b;
    distill::jsd_terms(log_r, log_q, h.log_beta, h.log_1m_beta, h.beta, a, &b);
    *term = *a + b;
  }
}

// log(e^a + e^b), exact for -inf operands.
DISTILL_HD double log_add(double a, double b) {
  const double hi = a > b ? a : b;
  if (hi == -INFINITY) return -INFINITY;
  return hi + log(exp(a - hi) + exp(b - hi));
}

// The teacher's tail logit y_tail (-inf without a tail) from its values; Z_off = 0 drops the tail.
DISTILL_HD double teacher_tail(const Hyper &h, const int32_t *ids, const float *vals, int64_t k, double log_z_off) {
  if (!h.tail || log_z_off == -INFINITY) return -INFINITY;
  double kept = -INFINITY;
  for (int64_t i = 0; i < k; ++i) {
    if (ids[i] >= 0) kept = log_add(kept, vals[i]);
  }
  return h.ratio * log(-expm1(kept < 0.0 ? kept : 0.0));
}

// log Q: the teacher's normalizer over the K + 1 buckets.
DISTILL_HD double teacher_log_norm(const Hyper &h, const int32_t *ids, const float *vals, int64_t k, double y_tail) {
  double lq = y_tail;
  for (int64_t i = 0; i < k; ++i) {
    if (ids[i] >= 0) lq = log_add(lq, h.ratio * vals[i]);
  }
  return lq;
}

// row_stats (below) with the teacher's y_tail and log Q given (teacher_tail / teacher_log_norm, or the same values formed
// otherwise: the CPU kernels take each log-sum-exp with one log instead of one per id).
template <typename XAt>
DISTILL_HD void row_stats_given_teacher(const Hyper &h, const int32_t *ids, const float *vals, int64_t k, double m,
                                        double log_z, double log_z_off, bool bad, XAt x_at, double y_tail,
                                        double log_q_norm, float *stats) {
  bad = bad || !(log_q_norm > -INFINITY);  // no teacher distribution (every id padding, no tail): NaN, as dense
  double d = 0.0, big_a = 0.0, term, a = 0.0;
  for (int64_t i = 0; i < k && !bad; ++i) {
    if (ids[i] < 0) continue;
    bucket(h, x_at(ids[i]) - log_z, h.ratio * vals[i] - log_q_norm, &term, &a);
    d += term;
    big_a += a;
  }
  double a_tail = 0.0;
  if (log_z_off != -INFINITY) {
    bucket(h, log_z_off - log_z, y_tail - log_q_norm, &term, &a_tail);
    d += term;
    big_a += a_tail;
  }
  stats[kLoss] = bad ? NAN : static_cast<float>(static_cast<double>(h.t_sq) * d);
  stats[kMax] = static_cast<float>(m);
  stats[kLogZ] = static_cast<float>(log_z);
  stats[kLogZOff] = static_cast<float>(log_z_off);
  stats[kSumA] = bad ? NAN : static_cast<float>(big_a);
  stats[kATail] = static_cast<float>(a_tail);
  stats[kLogQ] = static_cast<float>(log_q_norm);
  stats[7] = 0.0f;
}

// The row's statistics from its sums (m: the raw max) and a loader of x at a class: x_at(j) = (s_j - m) / T.
// `bad`: an id out of range or repeated.
template <typename XAt>
DISTILL_HD void row_stats(const Hyper &h, const int32_t *ids, const float *vals, int64_t k, double m, double log_z,
                          double log_z_off, bool bad, XAt x_at, float *stats) {
  const double y_tail = teacher_tail(h, ids, vals, k, log_z_off);
  const double log_q_norm = teacher_log_norm(h, ids, vals, k, y_tail);
  row_stats_given_teacher(h, ids, vals, k, m, log_z, log_z_off, bad, x_at, y_tail, log_q_norm, stats);
}

// The gradient at one of the ids, scaled by g_t = g * T.
DISTILL_HD float id_grad(const Hyper &h, const float *stats, double x, float value, float g_t) {
  const double log_r = x - stats[kLogZ];
  double term, a;
  bucket(h, log_r, h.ratio * value - stats[kLogQ], &term, &a);
  return static_cast<float>(g_t * (a - exp(log_r) * stats[kSumA]));
}

}  // namespace sparse
