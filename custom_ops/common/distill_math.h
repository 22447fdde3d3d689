// Distillation from logits, declared once: the per-row statistics of the fused kernels and the two gradients.
//
// Rows of student logits s and teacher logits t over V classes, temperature T, x = s / T, y = t / T,
// log P_s = x - lse(x), log P_t = y - lse(y). The row loss is T^2 * D with
//   beta = 0:      D = KL(P_t || P_s)          = sum_j P_t,j (log P_t,j - log P_s,j)
//   beta = 1:      D = KL(P_s || P_t)
//   0 < beta < 1:  D = beta KL(P_t || M) + (1 - beta) KL(P_s || M),   M = beta P_t + (1 - beta) P_s
// (ms_kldiv/reference.py `distillation_pointwise` is the float64 twin; ms_kldiv/_distill_math.py the same closed
// forms in MindSpore ops). With a_j = (1 - beta) P_s,j (log P_s,j - log M_j), b_j = beta P_t,j (log P_t,j - log M_j)
// (beta = 0: a_j = -P_t,j; beta = 1: b_j = -P_s,j), the gradients of T^2 D are
//   d/ds_j = T (a_j - P_s,j sum(a)),   d/dt_j = T (b_j - P_t,j sum(b)),
// i.e. beta = 0: d/ds_j = T (P_s,j - P_t,j), d/dt_j = T P_t,j (log P_t,j - log P_s,j - D);
//      beta = 1: d/ds_j = T P_s,j (log P_s,j - log P_t,j - D), d/dt_j = T (P_t,j - P_s,j).
// A class with P = 0 (a -inf logit: a padded vocabulary entry) contributes exactly 0 to every sum and gradient
// term it weights; a class the student rules out while the teacher does not gives +inf under forward KL.
//
// Saved per row (the forward's output, what the backward reads): the row loss, the maxima of both raw rows and the
// log of their sums of exp((v - max) / T) (so log P = (v - max) / T - log Z, exact for huge logits: v - max is
// formed before the division), sum(a), sum(b). The forward KL / reverse KL value needs ONE read of each row: online
// softmax over blocks (running max and sum of exponentials of both rows, and the running weighted difference),
// rescaled when a maximum grows. The generalized JSD needs both normalizers before log M, so it reads each row twice.
#pragma once

#if defined(__CUDACC__)
#define DISTILL_HD __host__ __device__ __forceinline__
#else
#define DISTILL_HD static inline __attribute__((always_inline))
#endif

#include <math.h>

namespace distill {

// Columns of the saved statistics (float32, [rows, kStats]); the AscendC kernel uses the same width.
enum Stat : int {
  kLoss = 0, kLogZStudent = 1, kLogZTeacher = 2, kSumA = 3, kSumB = 4, kMaxStudent = 5, kMaxTeacher = 6, kStats = 8
};

// Running log-sum-exp state of one raw row: max m (raw units) and sum of exp((v - m) / T). Empty: m = -inf, z = 0.
struct Online {
  double m, z;
};

DISTILL_HD Online online_empty() { return Online{-INFINITY, 0.0}; }

// Exponent base that is never -inf (a row masked so far has z = 0 and every exp(v - base) = 0 anyway).
DISTILL_HD double safe_base(double m) { return m == -INFINITY ? 0.0 : m; }

// Moves state `o` to the new maximum `m_new` (>= o.m); returns the factor the sums were scaled by.
DISTILL_HD double online_rescale(Online *o, double m_new, double inv_t) {
  if (!(m_new > o->m)) return 1.0;  // unchanged (or NaN: the NaN reaches the sums through exp)
  const double f = o->m == -INFINITY ? 0.0 : exp((o->m - m_new) * inv_t);
  o->z *= f;
  o->m = m_new;
  return f;
}

// Forward KL / reverse KL of one row from its single-pass sums: P = softmax(p / T) weights the difference (teacher
// for beta = 0, student for beta = 1), Q is the other, and w = sum_j exp((p_j - m_p) / T) ((p_j - m_p) - (q_j - m_q))
// is kept relative to the running maxima (kl_shift_sum moves it when they grow), so no O(lse) terms cancel.
DISTILL_HD double kl_from_sums(Online p, Online q, double w, double inv_t) {
  return w * inv_t / p.z - log(p.z) + log(q.z);
}

// w after the maxima moved by dp (P's) and dq (Q's), P's sum having been scaled by f and being z_p before.
DISTILL_HD double kl_shift_sum(double w, double f, double z_p, double dp, double dq) {
  return z_p > 0.0 ? f * (w + (dq - dp) * z_p) : 0.0;
}

// The single-pass forward KL / reverse KL state of (part of) a row: P's and Q's running log-sum-exp and the
// weighted difference w of kl_from_sums.
struct KlState {
  Online p, q;
  double w;
};

DISTILL_HD KlState kl_empty() { return KlState{online_empty(), online_empty(), 0.0}; }

// Moves the state to the maxima (mp, mq) (each >= the current one, or NaN/unchanged: then left as is).
DISTILL_HD void kl_move(KlState *s, double mp, double mq, double inv_t) {
  const double zp_before = s->p.z, bp_before = safe_base(s->p.m), bq_before = safe_base(s->q.m);
  const double f = online_rescale(&s->p, mp, inv_t);
  online_rescale(&s->q, mq, inv_t);
  s->w = kl_shift_sum(s->w, f, zp_before, safe_base(s->p.m) - bp_before, safe_base(s->q.m) - bq_before);
}

DISTILL_HD double max_of(double a, double b) { return b > a ? b : a; }

// a := the state of a's elements and b's (parallel reductions; the order of merges fixes the rounding).
DISTILL_HD void kl_merge(KlState *a, KlState b, double inv_t) {
  const double mp = max_of(a->p.m, b.p.m), mq = max_of(a->q.m, b.q.m);
  kl_move(a, mp, mq, inv_t);
  kl_move(&b, mp, mq, inv_t);
  a->p.z += b.p.z;
  a->q.z += b.q.z;
  a->w += b.w;
}

// Symmetric KL in one pass: forward KL's state (P = teacher, Q = student) and the reverse direction's weighted
// difference w_q = sum_j exp((q_j - m_q) / T) ((q_j - m_q) - (p_j - m_p)) against the same maxima, so
// KL(P_s || P_t) = kl_from_sums(q, p, w_q) and every exponential serves both directions.
struct SymState {
  KlState k;
  double w_q;
};

DISTILL_HD SymState sym_empty() { return SymState{kl_empty(), 0.0}; }

// kl_move for both directions.
DISTILL_HD void sym_move(SymState *s, double mp, double mq, double inv_t) {
  const double zp_before = s->k.p.z, zq_before = s->k.q.z;
  const double bp_before = safe_base(s->k.p.m), bq_before = safe_base(s->k.q.m);
  const double fp = online_rescale(&s->k.p, mp, inv_t), fq = online_rescale(&s->k.q, mq, inv_t);
  const double dp = safe_base(s->k.p.m) - bp_before, dq = safe_base(s->k.q.m) - bq_before;
  s->k.w = kl_shift_sum(s->k.w, fp, zp_before, dp, dq);
  s->w_q = kl_shift_sum(s->w_q, fq, zq_before, dq, dp);
}

DISTILL_HD void sym_merge(SymState *a, SymState b, double inv_t) {
  const double mp = max_of(a->k.p.m, b.k.p.m), mq = max_of(a->k.q.m, b.k.q.m);
  sym_move(a, mp, mq, inv_t);
  sym_move(&b, mp, mq, inv_t);
  a->k.p.z += b.k.p.z;
  a->k.q.z += b.k.q.z;
  a->k.w += b.k.w;
  a->w_q += b.w_q;
}

// alpha KL(P_t || P_s) + (1 - alpha) KL(P_s || P_t) and class_terms' a = -alpha P_t + (1 - alpha) P_s (log P_s -
// log P_t), b its mirror image, summed over the row (sum P = 1), from the row's SymState.
DISTILL_HD void sym_result(const SymState &s, double alpha, double inv_t, double *d, double *sum_a, double *sum_b) {
  const double fwd = kl_from_sums(s.k.p, s.k.q, s.k.w, inv_t), rev = kl_from_sums(s.k.q, s.k.p, s.w_q, inv_t);
  *d = alpha * fwd + (1.0 - alpha) * rev;
  *sum_a = (1.0 - alpha) * rev - alpha;
  *sum_b = alpha * fwd - (1.0 - alpha);
}

DISTILL_HD void online_merge(Online *a, Online b, double inv_t) {
  const double m = max_of(a->m, b.m);
  online_rescale(a, m, inv_t);
  online_rescale(&b, m, inv_t);
  a->z += b.z;
}

// The JSD terms a_j, b_j of one class from the two log-probabilities (C: float or double).
template <typename C>
DISTILL_HD void jsd_terms(C log_ps, C log_pt, C log_beta, C log_1m_beta, C beta, C *a, C *b) {
  const C ps = exp(log_ps), pt = exp(log_pt);
  const C u = log_pt + log_beta, v = log_ps + log_1m_beta;
  const C hi = u > v ? u : v;
  const C log_m = (ps == 0 && pt == 0) ? C(0) : hi + log(exp(u - hi) + exp(v - hi));
  *a = ps > 0 ? (C(1) - beta) * ps * (log_ps - log_m) : C(0);
  *b = pt > 0 ? beta * pt * (log_pt - log_m) : C(0);
}

// The gradients of one class, scaled by g_t = (incoming gradient of the row loss) * T.
template <typename C>
DISTILL_HD void grads(int kind, C log_ps, C log_pt, C sum_a, C sum_b, C log_beta, C log_1m_beta, C beta, C g_t,
                      C *ds, C *dt) {
  const C ps = exp(log_ps), pt = exp(log_pt);
  if (kind == 0) {  // forward KL: sum_b = D
    *ds = g_t * (ps - pt);
    *dt = pt > 0 ? g_t * pt * (log_pt - log_ps - sum_b) : C(0);
  } else if (kind == 1) {  // reverse KL: sum_a = D
    *ds = ps > 0 ? g_t * ps * (log_ps - log_pt - sum_a) : C(0);
    *dt = g_t * (pt - ps);
  } else {
    C a, b;
    jsd_terms(log_ps, log_pt, log_beta, log_1m_beta, beta, &a, &b);
    *ds = g_t * (a - ps * sum_a);
    *dt = g_t * (b - pt * sum_b);
  }
}

// 0: forward KL, 1: reverse KL, 2: generalized JSD (the 'kl' family, by beta).
DISTILL_HD int kind_of(double beta) { return beta == 0.0 ? 0 : beta == 1.0 ? 1 : 2; }

// The other divergences (hyper[2] = the code, hyper[3] = alpha; ms_kldiv/_distill_math.py DIVERGENCES):
//   kTvd        D = 1/2 sum |P_s - P_t|                          a = 1/2 P_s sgn(P_s - P_t),  b = -1/2 P_t sgn(..)
//   kSkewKl     D = KL(P_t || M), M = alpha P_t + (1-alpha) P_s  a = -(1-alpha) P_s P_t / M,
//                                                                b = P_t (log P_t - log M) - alpha P_t^2 / M
//   kSkewRkl    D = KL(P_s || M'), M' = alpha P_s + (1-alpha) P_t (the mirror image)
//   kSymmetric  D = alpha KL(P_t || P_s) + (1-alpha) KL(P_s || P_t)
// Like the JSD, TVD and the skews read each row twice in the forward (both normalizers first) and use class_terms;
// kSymmetric's forward reads it once (SymState: both KL directions, each a one-pass sum).
enum Kind : int { kFwdKl = 0, kRevKl = 1, kJsd = 2, kTvd = 3, kSkewKl = 4, kSkewRkl = 5, kSymmetric = 6 };

// The kind of (beta, divergence code, alpha): code 0 is the 'kl' family.
DISTILL_HD int kind_of(double beta, double code) { return code == 0.0 ? kind_of(beta) : 2 + static_cast<int>(code); }

// The per-call constants class_terms needs: the mixture's weights (JSD: beta, 1 - beta; skew: alpha, 1 - alpha)
// and their logs, alpha itself.
template <typename C>
struct Mix {
  C w_t, w_s, log_w_t, log_w_s, alpha;
};

template <typename C>
DISTILL_HD Mix<C> mix_of(int kind, double beta, double alpha) {
  Mix<C> m;
  const double wt = kind == kJsd ? beta : kind == kSkewKl ? alpha : kind == kSkewRkl ? 1.0 - alpha : 0.0;
  m.w_t = static_cast<C>(wt);
  m.w_s = static_cast<C>(1.0 - wt);
  m.log_w_t = static_cast<C>(wt > 0.0 ? log(wt) : -INFINITY);
  m.log_w_s = static_cast<C>(wt < 1.0 ? log1p(-wt) : -INFINITY);
  m.alpha = static_cast<C>(alpha);
  return m;
}

// The smallest normal value: below it a mixture takes its log-space bound (mix_parts), and a vector log meets no
// subnormal lane.
DISTILL_HD float min_normal(float) { return 1.17549435e-38f; }
DISTILL_HD double min_normal(double) { return 2.2250738585072014e-308; }

// log x for a positive normal x, inline: on the CPU a call to the vector library's logf in the mixture's loop costs
// about as much as the rest of the class's work. x = 2^k m with m in [sqrt(1/2), sqrt(2)) from the bits, log x =
// k ln 2 + log1p(m - 1), log1p by the degree-8 minimax polynomial of Cephes' logf, k ln 2 in two parts (exact high
// part): within 0.82 ulp of log x over the normal floats.
DISTILL_HD double log_normal(double x) { return log(x); }
DISTILL_HD float log_normal(float x) {
#if defined(__CUDACC__)
  return logf(x);
#else
  unsigned int ix;
  __builtin_memcpy(&ix, &x, 4);
  ix += 0x3f800000u - 0x3f3504f3u;  // the exponent field now counts from sqrt(1/2)
  const float k = static_cast<float>(static_cast<int>(ix >> 23) - 127);
  ix = (ix & 0x007fffffu) + 0x3f3504f3u;
  float m;
  __builtin_memcpy(&m, &ix, 4);
  const float r = m - 1.0f, r2 = r * r;
  float p = 7.0376836292e-2f;
  p = p * r - 1.1514610310e-1f;
  p = p * r + 1.1676998740e-1f;
  p = p * r - 1.2420140846e-1f;
  p = p * r + 1.4249322787e-1f;
  p = p * r - 1.6668057665e-1f;
  p = p * r + 2.0000714765e-1f;
  p = p * r - 2.4999993993e-1f;
  p = p * r + 3.3333331174e-1f;
  const float tail = r * r2 * p - 2.12194440e-4f * k - 0.5f * r2;
  return (r + tail) + 0.693359375f * k;
#endif
}

// 1 / x for a positive normal x, inline: a vector division takes several times a multiply's throughput. A first
// guess from the bits (4 correct bits), then three Newton steps (each doubles them): within 2 ulp.
DISTILL_HD double reciprocal_normal(double x) { return 1.0 / x; }
DISTILL_HD float reciprocal_normal(float x) {
#if defined(__CUDACC__)
  return 1.0f / x;
#else
  unsigned int ix;
  __builtin_memcpy(&ix, &x, 4);
  ix = 0x7ef311c7u - ix;
  float y;
  __builtin_memcpy(&y, &ix, 4);
  y = y * (2.0f - x * y);
  y = y * (2.0f - x * y);
  return y * (2.0f - x * y);
#endif
}

// The per-class exp, log and reciprocal of class_terms and grads_mix. kFast (the CUDA backward and the second pass
// of the two-pass forward): on the device the special-function unit's approximations (__expf: relative error about
// (2 + 1.2 |x|) 2^-23; __logf: about 2^-22 absolute; __fdividef: 2 ulp), a few instructions each for the accurate
// functions' dozen or more, which made those loops compute-bound on an H200. Without kFast, and off the device, the
// accurate functions: the normalizers (log Z, shared by every kind and by the vocabulary-parallel pieces) keep them.
template <bool kFast>
DISTILL_HD double class_exp(double x) { return exp(x); }
template <bool kFast>
DISTILL_HD float class_exp(float x) {
#if defined(__CUDA_ARCH__)
  if (kFast) return __expf(x);
#endif
  return exp(x);
}
template <bool kFast>
DISTILL_HD double class_log(double x) { return log_normal(x); }
template <bool kFast>
DISTILL_HD float class_log(float x) {
#if defined(__CUDA_ARCH__)
  if (kFast) return __logf(x);
#endif
  return log_normal(x);
}
template <bool kFast>
DISTILL_HD double class_reciprocal(double x) { return reciprocal_normal(x); }
template <bool kFast>
DISTILL_HD float class_reciprocal(float x) {
#if defined(__CUDA_ARCH__)
  if (kFast) return __fdividef(1.0f, x);
#endif
  return reciprocal_normal(x);
}

// The mixture of one class from both probabilities and log-probabilities: log M, M = w_t P_t + w_s P_s, and the
// shares w_t P_t / M, w_s P_s / M; one log and one reciprocal (the JSD reads no share, so it keeps only the log).
// Where M is below the normal range, log M is max(log(w_t P_t), log(w_s P_s)), which is within log 2 of it (and exact
// when a weight is 0, the skews at alpha 0 or 1: so a class only the weighted model keeps gives +inf there, and one
// neither keeps -inf); such a class weighs at most min_normal / w into any term, where the bound's error is lost.
// (Plain out-parameters, no struct: a struct local keeps GCC's `omp simd` loops from vectorizing.)
template <bool kFast = false, typename C>
DISTILL_HD void mix_parts(C ps, C pt, C log_ps, C log_pt, const Mix<C> &m, C *log_m, C *share_t, C *share_s) {
  const C mt = m.w_t * pt, ms = m.w_s * ps, mix = mt + ms;
  const bool small = mix < min_normal(mix);  // not for NaN: the log of a NaN mixture is NaN (safe - safe)
  const C safe = small ? C(1) : mix, inv = class_reciprocal<kFast>(safe);
  const C u = log_pt + m.log_w_t, v = log_ps + m.log_w_s;
  const bool t_hi = u > v;
  *log_m = small ? (t_hi ? u : v) : class_log<kFast>(safe) + (safe - safe);
  *share_t = small ? (t_hi ? C(1) : C(0)) : mt * inv;
  *share_s = small ? (t_hi ? C(0) : C(1)) : ms * inv;
}

// One class's divergence term and its a = P_s dD/dP_s, b = P_t dD/dP_t (constants dropped: they cancel in the
// softmax's backward), for every kind, from the log-probabilities, the probabilities ps = exp(log_ps), pt = exp(log_pt)
// (from a buffer of exponentials, or computed once for the gradients too) and, for kJsd and the skews, the
// mixture's parts (mix_parts); classes without mass in the distribution a term weights add 0. The skew terms'
// P Q / M and P^2 / M are P times a share over its weight, w_q P Q / M = P share_q, w_p P^2 / M = P share_p (no
// division by a weight, which may be 0).
template <typename C>
DISTILL_HD void class_terms_mixed(int kind, C log_ps, C log_pt, C ps, C pt, const Mix<C> &m, C log_m, C share_t,
                                  C share_s, C *term, C *a, C *b) {
  if (kind == kFwdKl) {  // (the vocabulary-parallel forward takes every kind through here)
    *b = pt > 0 ? pt * (log_pt - log_ps) : C(0);
    *a = -pt;
    *term = *b;
  } else if (kind == kRevKl) {
    *a = ps > 0 ? ps * (log_ps - log_pt) : C(0);
    *b = -ps;
    *term = *a;
  } else if (kind == kTvd) {
    const C d = ps - pt, sg = d > 0 ? C(1) : d < 0 ? C(-1) : C(0);
    *term = C(0.5) * (d > 0 ? d : -d);
    *a = C(0.5) * ps * sg;
    *b = C(-0.5) * pt * sg;
  } else if (kind == kSymmetric) {
    const C fwd = pt > 0 ? pt * (log_pt - log_ps) : C(0), rev = ps > 0 ? ps * (log_ps - log_pt) : C(0);
    *term = m.alpha * fwd + (C(1) - m.alpha) * rev;
    *a = -m.alpha * pt + (C(1) - m.alpha) * rev;
    *b = m.alpha * fwd - (C(1) - m.alpha) * ps;
  } else if (kind == kJsd) {
    *a = ps > 0 ? m.w_s * ps * (log_ps - log_m) : C(0);
    *b = pt > 0 ? m.w_t * pt * (log_pt - log_m) : C(0);
    *term = *a + *b;
  } else {  // kSkewKl, kSkewRkl: the weighted distribution P against M, Q the other one
    const bool t_weighs = kind == kSkewKl;
    const C lp = t_weighs ? log_pt : log_ps, p = t_weighs ? pt : ps;
    const C share_p = t_weighs ? share_t : share_s, share_q = t_weighs ? share_s : share_t;
    const C kl = p > 0 ? p * (lp - log_m) : C(0);
    const C da_p = p > 0 ? kl - p * share_p : C(0), da_q = p > 0 ? -(p * share_q) : C(0);
    *term = kl;
    *a = t_weighs ? da_q : da_p;
    *b = t_weighs ? da_p : da_q;
  }
}

// class_terms_mixed with the mixture from mix_parts (the probabilities exps of the log-probabilities).
template <bool kFast = false, typename C>
DISTILL_HD void class_terms(int kind, C log_ps, C log_pt, const Mix<C> &m, C *term, C *a, C *b) {
  const C ps = class_exp<kFast>(log_ps), pt = class_exp<kFast>(log_pt);
  C log_m = C(0), share_t = C(0), share_s = C(0);
  const bool mixed = kind == kJsd || kind == kSkewKl || kind == kSkewRkl;
  if (mixed) mix_parts<kFast>(ps, pt, log_ps, log_pt, m, &log_m, &share_t, &share_s);
  class_terms_mixed(kind, log_ps, log_pt, ps, pt, m, log_m, share_t, share_s, term, a, b);
}

// grads_mix for the same kinds from ps, pt and the mixture's parts (class_terms_mixed), scaled by g_t.
template <typename C>
DISTILL_HD void grads_p(int kind, C log_ps, C log_pt, C ps, C pt, C sum_a, C sum_b, const Mix<C> &m, C log_m,
                        C share_t, C share_s, C g_t, C *ds, C *dt) {
  C term, a, b;
  class_terms_mixed(kind, log_ps, log_pt, ps, pt, m, log_m, share_t, share_s, &term, &a, &b);
  *ds = g_t * (a - ps * sum_a);
  *dt = g_t * (b - pt * sum_b);
}

// The logits' transform applied to both models before the temperature: z -> cap tanh(scale z / cap) (cap > 0, -inf
// kept), or scale z without a cap; slope is its derivative, which scales the gradients of the raw logits.
struct Transform {
  float scale, cap, inv_cap;
  bool active;
};

DISTILL_HD Transform transform_of(double scale, double cap) {
  Transform f;
  f.scale = static_cast<float>(scale);
  f.cap = static_cast<float>(cap);
  f.inv_cap = cap > 0.0 ? static_cast<float>(1.0 / cap) : 0.0f;
  f.active = scale != 1.0 || cap > 0.0;
  return f;
}

// A masked class (-inf) stays masked: cap tanh(-inf) would give it the finite logit -cap (its slope is 0 there).
DISTILL_HD float transform_apply(const Transform &f, float z) {
  if (!(f.cap > 0.0f)) return f.scale * z;
  return z == -INFINITY ? z : f.cap * tanhf(f.scale * z * f.inv_cap);
}

DISTILL_HD float transform_slope(const Transform &f, float z) {
  if (!(f.cap > 0.0f)) return f.scale;
  const float th = tanhf(f.scale * z * f.inv_cap);
  return f.scale * (1.0f - th * th);
}

// transform_apply and transform_slope of one logit from a single tanhf (the same expressions, so the same values).
DISTILL_HD void transform_apply_and_slope(const Transform &f, float z, float *x, float *slope) {
  if (f.cap > 0.0f) {
    const float th = tanhf(f.scale * z * f.inv_cap);
    *x = z == -INFINITY ? z : f.cap * th;  // a masked class stays masked (transform_apply)
    *slope = f.scale * (1.0f - th * th);
  } else {
    *x = f.scale * z;
    *slope = f.scale;
  }
}

// The gradients of one class for any kind (class_terms), scaled by g_t; kinds 0 and 1 in their closed forms.
template <bool kFast = false, typename C>
DISTILL_HD void grads_mix(int kind, C log_ps, C log_pt, C sum_a, C sum_b, const Mix<C> &m, C g_t, C *ds, C *dt) {
  const C ps = class_exp<kFast>(log_ps), pt = class_exp<kFast>(log_pt);
  if (kind == kFwdKl) {
    *ds = g_t * (ps - pt);
    *dt = pt > 0 ? g_t * pt * (log_pt - log_ps - sum_b) : C(0);
  } else if (kind == kRevKl) {
    *ds = ps > 0 ? g_t * ps * (log_ps - log_pt - sum_a) : C(0);
    *dt = g_t * (pt - ps);
  } else {
    C term, a, b;
    class_terms<kFast>(kind, log_ps, log_pt, m, &term, &a, &b);
    *ds = g_t * (a - ps * sum_a);
    *dt = g_t * (b - pt * sum_b);
  }
}

// ------------------------------------------------------------------------------------------ the hard-label term
// The fused head's cross-entropy of the hard labels on one row of the student's (transformed) logits z
// (ms_kldiv._distill_math.cross_entropy_and_grad is the MindSpore twin): with lse = log sum_j exp(z_j), eps the label
// smoothing, spread over the F classes with a finite logit, and zeta the z-loss coefficient,
//   loss          = (1 - eps) (lse - z_label) + eps (lse - sum_finite z / F) + zeta lse^2
//   d loss / dz_j = p_j (1 + 2 zeta lse) - eps [z_j finite] / F - (1 - eps) [j = label],   p_j = exp(z_j - lse).
// One read of the row gathers what the loss and the gradient need (HardState); a second writes the gradient.
struct HardState {
  Online o;                   // running max and sum of exp(z - max) (temperature 1)
  double sum_finite, finite;  // the finite logits' sum and count
  double nan;                 // > 0: a logit was NaN
};

DISTILL_HD HardState hard_empty() { return HardState{online_empty(), 0.0, 0.0, 0.0}; }

DISTILL_HD void hard_add(HardState *h, float z) {
  if (z != z) {
    h->nan += 1.0;
    return;
  }
  if (z > h->o.m) online_rescale(&h->o, z, 1.0);
  if (z > -INFINITY) {
    h->o.z += static_cast<double>(expf(z - static_cast<float>(h->o.m)));
    h->sum_finite += z;
    h->finite += 1.0;
  }
}

DISTILL_HD void hard_merge(HardState *a, HardState b) {
  online_merge(&a->o, b.o, 1.0);
  a->sum_finite += b.sum_finite;
  a->finite += b.finite;
  a->nan += b.nan;
}

// The row's log-normalizer: NaN if a logit was NaN or +inf (the sum then holds inf - inf), -inf when every class
// is masked (the loss is then NaN: no distribution).
DISTILL_HD double hard_lse(const HardState &h) {
  if (h.nan > 0.0) return NAN;
  return h.o.m == -INFINITY ? -INFINITY : h.o.m + log(h.o.z);
}

DISTILL_HD double hard_loss(const HardState &h, double lse, double z_label, double eps, double zeta) {
  double loss = lse - z_label;
  if (eps > 0.0) loss = (1.0 - eps) * loss - eps * (h.sum_finite / h.finite - lse);
  return loss + zeta * lse * lse;
}

// What the gradient of one class needs from its row (float: the per-class work stays in single precision).
struct HardCoefs {
  float lse, p_coef, uniform, hot;
};

DISTILL_HD HardCoefs hard_coefs(const HardState &h, double lse, double eps, double zeta) {
  HardCoefs c;
  c.lse = static_cast<float>(lse);
  c.p_coef = static_cast<float>(1.0 + 2.0 * zeta * lse);
  c.uniform = eps > 0.0 ? static_cast<float>(eps / h.finite) : 0.0f;
  c.hot = static_cast<float>(1.0 - eps);
  return c;
}

DISTILL_HD float hard_grad(const HardCoefs &c, float z, bool label) {
  float g = expf(z - c.lse) * c.p_coef - (z > -INFINITY ? c.uniform : 0.0f);
  return label ? g - c.hot : g;
}

}  // namespace distill
