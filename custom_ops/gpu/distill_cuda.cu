// CUDA implementation of the fused distillation ABI (custom_ops/common/distill_abi.h), in libkldiv_cuda.so next to
// the KLDiv kernels. Every formula and the online-softmax state come from distill_math.h, shared with the CPU
// kernels; this file only moves data.
//
// Rows of V logits; a group of R threads owns a row and the groups stride over the rows: R = 32 (a warp, eight
// rows per block) for small vocabularies, R = 256 (the block) otherwise. 128-bit loads and stores when every row
// starts 16-byte aligned. Forward KL / reverse KL (kinds 0, 1): each thread keeps a distill::KlState of its
// elements (one read of each row), symmetric KL a distill::SymState (both directions from the same exponentials);
// every other kind (generalized JSD, TVD, skew KL / reverse KL) keeps both rows' log-sum-exp states, merges them,
// then sums distill::class_terms' term, a and b (two reads; the second pass's kind is a template argument and its
// exp, log and reciprocal the device's fast ones, as in the backward). States merge across the group in a fixed
// order (warp shuffles, then the warps' states in shared memory), so results are bitwise reproducible and
// independent of the grid; no atomics, no scratch memory.
// Backward: the same groups, one pass writing the gradient(s) from the saved statistics (distill::grads_mix, the
// kind a template argument).
// The logits' transform (logit scale, soft cap) is applied on load, so maxima, sums and terms are those of the
// transformed values, and the raw logits' gradients are multiplied by its slope; the kernels pick a kTf = true or
// false instantiation once per block, so the plain path carries none of it.
// The hyper input (float64 [6]: temperature, beta, divergence code, alpha, soft cap, logit scale; the old [2]
// layout (temperature, beta) is read as the 'kl' family without a transform) stays in device memory and every
// block reads it: the host never waits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <type_traits>

#include "distill_abi.h"
#include "kldiv_device.cuh"
#include "kldiv_launch.cuh"

namespace distill {
namespace cuda {

using kldiv::cuda::for_each_packet_pair;
using kldiv::cuda::kLazyRescale;
using kldiv::cuda::from_c;
using kldiv::cuda::packet;
using kldiv::cuda::to_c;
using kldiv::cuda::Vec16;

constexpr int kThreads = 256;
constexpr int64_t kWarpRowVocab = 2048;  // up to this many classes a warp owns a row
constexpr int64_t kMaxBlocks = 65535 * 8;

struct Hyper {
  float inv_t, t, t_sq;
  int kind;
  Mix<float> mix;
  Transform f;
};

// `nhyper`: the hyper input's length (6; 2 for the old (temperature, beta) layout).
__device__ __forceinline__ Hyper read_hyper(const double *hyper, int nhyper) {
  const double temperature = hyper[0], beta = hyper[1];
  const bool full = nhyper >= 6;
  const double code = full ? hyper[2] : 0.0, alpha = full ? hyper[3] : 0.0;
  Hyper h;
  h.inv_t = (float)(1.0 / temperature);
  h.t = (float)temperature;
  h.t_sq = (float)(temperature * temperature);
  h.kind = kind_of(beta, code);
  h.mix = mix_of<float>(h.kind, beta, alpha);
  h.f = transform_of(full ? hyper[5] : 1.0, full ? hyper[4] : 0.0);
  return h;
}

// A loaded logit as the kernels use it: raw, or transformed (kTf).
template <bool kTf>
__device__ __forceinline__ float value(const Transform &f, float z) {
  return kTf ? transform_apply(f, z) : z;
}

// fn(std::integral_constant<int, K>()) for the runtime `kind` if it is one of kKinds, else for kOther: the kind
// becomes a template argument (one loop per kind, no per-class test of it) at the cost of one test per row.
template <int kOther, int... kKinds, typename Fn>
__device__ __forceinline__ void with_kind(int kind, Fn &&fn) {
  const bool listed = ((kind == kKinds ? (fn(std::integral_constant<int, kKinds>()), true) : false) || ...);
  if (!listed) fn(std::integral_constant<int, kOther>());
}

// ------------------------------------------------------------------------------------------ group reductions
struct Normalizers {  // the two-pass kinds' first pass: both rows' running log-sum-exp
  Online s, t;
};
struct Sums {  // the two-pass kinds' second pass: the divergence, sum(a), sum(b)
  double term, a, b;
};

// A state made of doubles, shuffled field by field: from lane + o (down), or from lane 0 (o < 0).
template <typename S>
__device__ __forceinline__ S shfl(S v, int o) {
  constexpr int kFields = sizeof(S) / sizeof(double);
  static_assert(sizeof(S) == kFields * sizeof(double), "a state is a run of doubles");
  double f[kFields];
  memcpy(f, &v, sizeof(S));
#pragma unroll
  for (int i = 0; i < kFields; ++i)
    f[i] = o < 0 ? __shfl_sync(0xffffffffu, f[i], 0) : __shfl_down_sync(0xffffffffu, f[i], o);
  memcpy(&v, f, sizeof(S));
  return v;
}

// The state of the whole group (R threads), in every thread of it; `empty` is the merge's identity. `part` is
// shared memory for R / 32 states; with R > 32 every thread of the block must call this (it synchronizes).
template <int R, typename S, typename Merge>
__device__ __forceinline__ S group_reduce(S v, Merge merge, S empty, S *part) {
  for (int o = 16; o > 0; o >>= 1) merge(&v, shfl(v, o));
  if (R > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < R / 32 ? part[lane] : empty;
    for (int o = 16; o > 0; o >>= 1) merge(&v, shfl(v, o));
    __syncthreads();  // every warp has read part: the next call may overwrite it
  }
  return shfl(v, -1);
}

// ------------------------------------------------------------------------------------------ element loops
// The forward loops sum their per-class terms in float and add them to the row's double state every kFlushEvery
// classes (a packet's end) and before a base moves, as the stored-teacher forward does (kldiv_device.cuh says why).
// DISTILL_CUDA_FLUSH_EVERY=1 builds the per-class double sums (each term added at once), to compare the two on a
// device (benchmarks/gpu/compare_builds.py).
#ifndef DISTILL_CUDA_FLUSH_EVERY
#define DISTILL_CUDA_FLUSH_EVERY kldiv::cuda::kFlushEvery
#endif
constexpr int kFlushEvery = DISTILL_CUDA_FLUSH_EVERY;
static_assert(kFlushEvery == 1 || kFlushEvery % 8 == 0, "whole packets (4 or 8 classes) between flushes");

// f(s_j, t_j) for this thread's elements of one row (lane of R), in float (raw logits); flush() after every
// kFlushEvery of them and after the last.
template <int R, typename T, typename F, typename Flush>
__device__ __forceinline__ void for_each_pair(const T *s, const T *t, int64_t vocab, int lane, bool vec, F &&f,
                                              Flush &&flush) {
  constexpr int kN = Vec16<T>::kN;
  int pending = 0;  // classes since the last flush
  const int64_t done =
      for_each_packet_pair(s, t, vocab, lane, R, vec, [&](int64_t, const Vec16<T> &a, const Vec16<T> &b) {
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          f(to_c(a.v[j]), to_c(b.v[j]));
          if (kFlushEvery == 1) flush();
        }
        if (kFlushEvery > 1 && (pending += kN) == kFlushEvery) {
          flush();
          pending = 0;
        }
      });
  for (int64_t k = done + lane; k < vocab; k += R) {
    f(to_c(s[k]), to_c(t[k]));
    if (++pending == kFlushEvery) {
      flush();
      pending = 0;
    }
  }
  flush();
}

// ------------------------------------------------------------------------------------------ forward
// The one-pass kinds' row state: forward / reverse KL's KlState, symmetric KL's SymState (kSym).
template <bool kSym> struct OnePass {
  using State = KlState;
  __device__ static KlState empty() { return kl_empty(); }
  __device__ static KlState &kl(State &s) { return s; }
  __device__ static void move(State *s, double mp, double mq, double inv_t) { kl_move(s, mp, mq, inv_t); }
  __device__ static void merge(State *a, State b, double inv_t) { kl_merge(a, b, inv_t); }
};
template <> struct OnePass<true> {
  using State = SymState;
  __device__ static SymState empty() { return sym_empty(); }
  __device__ static KlState &kl(State &s) { return s.k; }
  __device__ static void move(State *s, double mp, double mq, double inv_t) { sym_move(s, mp, mq, inv_t); }
  __device__ static void merge(State *a, State b, double inv_t) { sym_merge(a, b, inv_t); }
};

// One row, forward KL, reverse KL or (kSym) symmetric KL: P = softmax(p / T) weights the difference, Q is the other
// (kl_from_sums); the teacher is P but for reverse KL; symmetric KL adds the reverse direction's sum (SymState).
template <int R, bool kTf, bool kSym, typename T>
__device__ __forceinline__ void forward_kl_row(const T *s, const T *t, int64_t vocab, const Hyper &h, int lane,
                                               bool vec, typename OnePass<kSym>::State *part, float *stats) {
  using Pass = OnePass<kSym>;
  typename Pass::State st = Pass::empty();
  KlState &k = Pass::kl(st);
  float bp = 0.0f, bq = 0.0f;                     // the exponents' bases: safe_base(k.p.m), safe_base(k.q.m)
  float lp = -INFINITY, lq = -INFINITY;           // a class above these moves the bases (kLazyRescale)
  float mp = -INFINITY, mq = -INFINITY;           // the true maxima
  const float lazy = kLazyRescale / h.inv_t;     // in logit units
  const bool p_is_teacher = h.kind != kRevKl;
  float zp = 0.0f, zq = 0.0f, w = 0.0f, w_q = 0.0f;  // the sums since the last flush (kFlushEvery)
  const auto flush = [&] {
    k.p.z += zp;
    k.q.z += zq;
    k.w += w;
    if constexpr (kSym) st.w_q += w_q;
    zp = zq = w = w_q = 0.0f;
  };
  for_each_pair<R>(s, t, vocab, lane, vec, [&](float zs, float zt) {
    const float vs = value<kTf>(h.f, zs), vt = value<kTf>(h.f, zt);
    const float vp = p_is_teacher ? vt : vs, vq = p_is_teacher ? vs : vt;
    mp = vp > mp ? vp : mp;
    mq = vq > mq ? vq : mq;
    if (vp > lp || vq > lq) {
      flush();
      Pass::move(&st, max_of(k.p.m, vp), max_of(k.q.m, vq), h.inv_t);
      bp = (float)safe_base(k.p.m);
      bq = (float)safe_base(k.q.m);
      lp = (float)k.p.m + lazy;
      lq = (float)k.q.m + lazy;
    }
    const float dp = vp - bp, dq = vq - bq;
    const float ep = expf(dp * h.inv_t), eq = expf(dq * h.inv_t);
    zp += ep;
    zq += eq;
    w += ep > 0.0f ? ep * (dp - dq) : 0.0f;  // a class without P mass adds 0, whatever Q says
    if constexpr (kSym) w_q += eq > 0.0f ? eq * (dq - dp) : 0.0f;
  }, flush);
  Pass::move(&st, mp, mq, h.inv_t);  // to the true maxima (a no-op where a base already is one)
  const double inv_t = h.inv_t;
  st = group_reduce<R>(st, [inv_t](typename Pass::State *a, typename Pass::State b) { Pass::merge(a, b, inv_t); },
                       Pass::empty(), part);
  if (lane == 0) {
    const Online os = p_is_teacher ? k.q : k.p, ot = p_is_teacher ? k.p : k.q;
    if constexpr (kSym) {
      double sym, sum_a, sum_b;
      sym_result(st, h.mix.alpha, h.inv_t, &sym, &sum_a, &sum_b);
      stats[kLoss] = (float)((double)h.t_sq * sym);
      stats[kSumA] = (float)sum_a;
      stats[kSumB] = (float)sum_b;
    } else {
      const double d = kl_from_sums(k.p, k.q, k.w, h.inv_t);
      stats[kLoss] = (float)((double)h.t_sq * d);
      stats[kSumA] = p_is_teacher ? 0.0f : (float)d;
      stats[kSumB] = p_is_teacher ? (float)d : 0.0f;
    }
    stats[kLogZStudent] = (float)log(os.z);
    stats[kLogZTeacher] = (float)log(ot.z);
    stats[kMaxStudent] = (float)safe_base(os.m);
    stats[kMaxTeacher] = (float)safe_base(ot.m);
    stats[7] = 0.0f;
  }
}

// One row of a two-pass kind (generalized JSD, TVD, skew KL / reverse KL, symmetric KL): both normalizers first
// (log M and the probabilities need them), then the sums of class_terms' term, a and b.
// Both rows' normalizers (the two-pass kinds' first pass): base (raw units) and log Z.
template <int R, bool kTf, typename T>
__device__ __forceinline__ void forward_normalizers(const T *s, const T *t, int64_t vocab, const Hyper &h, int lane,
                                                    bool vec, Normalizers *norm_part, float *ms_out, float *mt_out,
                                                    float *lzs_out, float *lzt_out) {
  const Normalizers none{online_empty(), online_empty()};
  Normalizers o = none;
  float bs = 0.0f, bt = 0.0f;                     // the exponents' bases
  float ls = -INFINITY, lt = -INFINITY;           // a class above these moves a base (kLazyRescale)
  float ms = -INFINITY, mt = -INFINITY;           // the true maxima
  const float lazy = kLazyRescale / h.inv_t;
  float zs_part = 0.0f, zt_part = 0.0f;  // the sums since the last flush (kFlushEvery)
  const auto flush = [&] {
    o.s.z += zs_part;
    o.t.z += zt_part;
    zs_part = zt_part = 0.0f;
  };
  for_each_pair<R>(s, t, vocab, lane, vec, [&](float zs, float zt) {
    const float vs = value<kTf>(h.f, zs), vt = value<kTf>(h.f, zt);
    ms = vs > ms ? vs : ms;
    mt = vt > mt ? vt : mt;
    if (vs > ls || vt > lt) flush();
    if (vs > ls) {
      online_rescale(&o.s, vs, h.inv_t);
      bs = vs;
      ls = vs + lazy;
    }
    if (vt > lt) {
      online_rescale(&o.t, vt, h.inv_t);
      bt = vt;
      lt = vt + lazy;
    }
    zs_part += expf((vs - bs) * h.inv_t);
    zt_part += expf((vt - bt) * h.inv_t);
  }, flush);
  online_rescale(&o.s, ms, h.inv_t);  // to the true maxima
  online_rescale(&o.t, mt, h.inv_t);
  const double inv_t = h.inv_t;
  o = group_reduce<R>(o, [inv_t](Normalizers *a, Normalizers b) {
        online_merge(&a->s, b.s, inv_t);
        online_merge(&a->t, b.t, inv_t);
      }, none, norm_part);
  *ms_out = (float)safe_base(o.s.m);
  *mt_out = (float)safe_base(o.t.m);
  *lzs_out = (float)log(o.s.z);
  *lzt_out = (float)log(o.t.z);
}

// The sums of class_terms' term, a and b over one row, from both normalizers (the second pass), into its stats.
// kKind: the kind, or -1 to read it from h.
template <int R, bool kTf, int kKind, typename T>
__device__ __forceinline__ void forward_sums(const T *s, const T *t, int64_t vocab, const Hyper &h, int lane,
                                             bool vec, Sums *sum_part, float *stats, float ms, float mt, float lzs,
                                             float lzt) {
  Sums sums{0.0, 0.0, 0.0};
  const int kind = kKind >= 0 ? kKind : h.kind;
  float term_part = 0.0f, a_part = 0.0f, b_part = 0.0f;  // the sums since the last flush (kFlushEvery)
  const auto flush = [&] {
    sums.term += term_part;
    sums.a += a_part;
    sums.b += b_part;
    term_part = a_part = b_part = 0.0f;
  };
  for_each_pair<R>(s, t, vocab, lane, vec, [&](float zs, float zt) {
    float term, a, b;
    class_terms<true>(kind, (value<kTf>(h.f, zs) - ms) * h.inv_t - lzs, (value<kTf>(h.f, zt) - mt) * h.inv_t - lzt,
                      h.mix, &term, &a, &b);
    term_part += term;
    a_part += a;
    b_part += b;
  }, flush);
  sums = group_reduce<R>(sums, [](Sums *x, Sums y) {
           x->term += y.term;
           x->a += y.a;
           x->b += y.b;
         }, Sums{0.0, 0.0, 0.0}, sum_part);
  if (lane == 0) {
    const double d = sums.term;
    stats[kLoss] = (float)((double)h.t_sq * d);
    stats[kLogZStudent] = lzs;
    stats[kLogZTeacher] = lzt;
    stats[kSumA] = (float)sums.a;
    stats[kSumB] = (float)sums.b;
    stats[kMaxStudent] = ms;
    stats[kMaxTeacher] = mt;
    stats[7] = 0.0f;
  }
}

// The vocabulary-parallel pieces (distill_abi.h) are this row function's halves: op kStates stops after the
// normalizers, op kGiven takes them from `given` (the whole row's, merged across ranks) and skips the first pass.
template <int R, bool kTf, typename T>
__device__ __forceinline__ void forward_terms_row(const T *s, const T *t, int64_t vocab, const Hyper &h, int lane,
                                                  bool vec, Normalizers *norm_part, Sums *sum_part,
                                                  float *stats, int op, const float *given) {
  float ms, mt, lzs, lzt;
  if (op == kGiven) {
    ms = given[kMaxStudent];
    mt = given[kMaxTeacher];
    lzs = given[kLogZStudent];
    lzt = given[kLogZTeacher];
  } else {
    forward_normalizers<R, kTf>(s, t, vocab, h, lane, vec, norm_part, &ms, &mt, &lzs, &lzt);
    if (op == kStates) {
      if (lane == 0) {
        for (int c = 0; c < kStats; ++c) stats[c] = 0.0f;
        stats[kLogZStudent] = lzs;
        stats[kLogZTeacher] = lzt;
        stats[kMaxStudent] = ms;
        stats[kMaxTeacher] = mt;
      }
      return;
    }
  }
  // One loop per two-pass kind: with the kind read per class, its branches and registers weighed on every kind.
  // The one-pass kinds come here only as vocabulary-parallel pieces (kGiven), through the generic loop (-1).
  with_kind<-1, kJsd, kTvd, kSkewKl, kSkewRkl>(h.kind, [&](auto kind) {
    forward_sums<R, kTf, decltype(kind)::value>(s, t, vocab, h, lane, vec, sum_part, stats, ms, mt, lzs, lzt);
  });
}

// The rows of one block, with or without the transform (kTf); kSym: the symmetric KL forward's kernel, else every
// other call's.
template <int R, bool kTf, bool kSym, typename T>
__device__ __forceinline__ void forward_rows(const T *s, const T *t, float *stats, int64_t rows, int64_t vocab,
                                             bool vec, const Hyper &h, KlState *kl_part, SymState *sym_part,
                                             Normalizers *norm_part, Sums *sum_part, int op, const float *given) {
  constexpr int kGroups = kThreads / R;
  const int lane = threadIdx.x % R;
  const bool one_pass = op == kForward && (h.kind == kFwdKl || h.kind == kRevKl);
  for (int64_t row = (int64_t)blockIdx.x * kGroups + threadIdx.x / R; row < rows; row += (int64_t)gridDim.x * kGroups) {
    const int64_t off = row * vocab;
    if constexpr (kSym)
      forward_kl_row<R, kTf, true>(s + off, t + off, vocab, h, lane, vec, sym_part, stats + row * kStats);
    else if (one_pass)
      forward_kl_row<R, kTf, false>(s + off, t + off, vocab, h, lane, vec, kl_part, stats + row * kStats);
    else
      forward_terms_row<R, kTf>(s + off, t + off, vocab, h, lane, vec, norm_part, sum_part, stats + row * kStats,
                                op, given ? given + row * kStats : nullptr);
  }
}

// The forward is a pair of kernels, launched one after the other: kSym = true runs symmetric KL's forward (one pass,
// SymState), kSym = false every other call; each returns at once on the other's calls (the divergence is in device
// memory, where the host does not look). One kernel with both paths needed more registers, which slowed the
// bfloat16 forward of the other kinds by up to a third on an H200.
// No __launch_bounds__: with it nvcc capped these kernels at 64 registers and spilled; they need more.
template <typename T, int R, bool kSym>
__global__ void distill_fwd(const T *__restrict__ s, const T *__restrict__ t, const double *__restrict__ hyper,
                            int nhyper, float *__restrict__ stats, int64_t rows, int64_t vocab, bool vec, int op,
                            const float *__restrict__ given) {
  const Hyper h = read_hyper(hyper, nhyper);
  if ((op == kForward && h.kind == kSymmetric) != kSym) return;
  __shared__ KlState kl_part[kSym ? 1 : kThreads / 32];
  __shared__ SymState sym_part[kSym ? kThreads / 32 : 1];
  __shared__ Normalizers norm_part[kSym ? 1 : kThreads / 32];
  __shared__ Sums sum_part[kSym ? 1 : kThreads / 32];
  if (h.f.active)
    forward_rows<R, true, kSym>(s, t, stats, rows, vocab, vec, h, kl_part, sym_part, norm_part, sum_part, op, given);
  else
    forward_rows<R, false, kSym>(s, t, stats, rows, vocab, vec, h, kl_part, sym_part, norm_part, sum_part, op,
                                 given);
}

// ------------------------------------------------------------------------------------------ backward
// The gradients of one row (ds / dt null: not wanted), g_t = dloss[row] * T; with kTf those of the raw logits
// (the transformed values' gradients times the transform's slope).
template <int R, int kKind, bool kTf, typename T>
__device__ __forceinline__ void backward_row(const T *s, const T *t, int64_t vocab, const Hyper &h,
                                             const float *st, float g_t, int lane, bool vec, T *ds, T *dt) {
  const float ms = st[kMaxStudent], mt = st[kMaxTeacher], lzs = st[kLogZStudent], lzt = st[kLogZTeacher];
  const float sa = st[kSumA], sb = st[kSumB];
  auto one = [&](float zs, float zt, float *gs, float *gt) {
    float vs = zs, vt = zt, ks = 1.0f, kt = 1.0f;
    if (kTf) {
      transform_apply_and_slope(h.f, zs, &vs, &ks);
      transform_apply_and_slope(h.f, zt, &vt, &kt);
    }
    grads_mix<true>(kKind, (vs - ms) * h.inv_t - lzs, (vt - mt) * h.inv_t - lzt, sa, sb, h.mix, g_t, gs, gt);
    if (kTf) {
      *gs *= ks;
      *gt *= kt;
    }
  };
  const int64_t done =
      for_each_packet_pair(s, t, vocab, lane, R, vec, [&](int64_t k, const Vec16<T> &a, const Vec16<T> &b) {
        Vec16<T> rs, rt;
#pragma unroll
        for (int j = 0; j < Vec16<T>::kN; ++j) {
          float gs, gt;
          one(to_c(a.v[j]), to_c(b.v[j]), &gs, &gt);
          rs.v[j] = from_c<T>(gs);
          rt.v[j] = from_c<T>(gt);
        }
        if (ds) packet(ds, k) = rs;
        if (dt) packet(dt, k) = rt;
      });
  for (int64_t k = done + lane; k < vocab; k += R) {
    float gs, gt;
    one(to_c(s[k]), to_c(t[k]), &gs, &gt);
    if (ds) ds[k] = from_c<T>(gs);
    if (dt) dt[k] = from_c<T>(gt);
  }
}

// One row's gradients for the call's kind (a template argument: one formula per instantiation).
template <int R, bool kTf, typename T>
__device__ __forceinline__ void backward_kind(const T *s, const T *t, int64_t vocab, const Hyper &h,
                                              const float *st, float g_t, int lane, bool vec, T *ds, T *dt) {
  with_kind<kSymmetric, kFwdKl, kRevKl, kJsd, kTvd, kSkewKl, kSkewRkl>(h.kind, [&](auto kind) {
    backward_row<R, decltype(kind)::value, kTf>(s, t, vocab, h, st, g_t, lane, vec, ds, dt);
  });
}

template <typename T, int R>
__global__ void distill_bwd(const T *__restrict__ s, const T *__restrict__ t, const double *__restrict__ hyper,
                            int nhyper, const float *__restrict__ stats, const float *__restrict__ dloss,
                            T *__restrict__ ds, T *__restrict__ dt, int64_t rows, int64_t vocab, bool vec) {
  const Hyper h = read_hyper(hyper, nhyper);
  constexpr int kGroups = kThreads / R;
  const int lane = threadIdx.x % R;
  for (int64_t row = (int64_t)blockIdx.x * kGroups + threadIdx.x / R; row < rows; row += (int64_t)gridDim.x * kGroups) {
    const int64_t off = row * vocab;
    T *dsr = ds ? ds + off : nullptr, *dtr = dt ? dt + off : nullptr;
    const float g = dloss[row];
    if (g == 0.0f) {  // an ignored row (or a zero incoming gradient): exact zeros, the logits are not read
      for (int64_t k = lane; k < vocab; k += R) {
        if (dsr) dsr[k] = from_c<T>(0.0f);
        if (dtr) dtr[k] = from_c<T>(0.0f);
      }
      continue;
    }
    const float *st = stats + row * kStats;
    const float g_t = g * h.t;
    if (h.f.active)
      backward_kind<R, true>(s + off, t + off, vocab, h, st, g_t, lane, vec, dsr, dtr);
    else
      backward_kind<R, false>(s + off, t + off, vocab, h, st, g_t, lane, vec, dsr, dtr);
  }
}

// ------------------------------------------------------------------------------------------ the hard-label term
// DistillHard (the fused head's cross-entropy of the hard labels, distill_math.h): the same row groups; one read
// gathers the row's HardState (merged across the group in a fixed order, as above), a second writes
// d = ds + g * gradient. Scalar loads strided by the group's lanes (coalesced): this term is not the head's hot path.
template <int R, bool kTf, typename T>
__device__ __forceinline__ void hard_row(const T *s, const T *ds, T *d, int64_t vocab, int64_t label,
                                         const Transform &f, double eps, double zeta, float coef, int lane,
                                         HardState *part, float *loss) {
  HardState h = hard_empty();
  for (int64_t k = lane; k < vocab; k += R) hard_add(&h, value<kTf>(f, to_c(s[k])));
  h = group_reduce<R>(h, [](HardState *a, HardState b) { hard_merge(a, b); }, hard_empty(), part);
  const double lse = hard_lse(h);
  const HardCoefs c = hard_coefs(h, lse, eps, zeta);
  for (int64_t k = lane; k < vocab; k += R) {
    float x = to_c(s[k]), slope = 1.0f;
    if (kTf) transform_apply_and_slope(f, x, &x, &slope);
    d[k] = from_c<T>(to_c(ds[k]) + coef * (hard_grad(c, x, k == label) * slope));
  }
  if (lane == 0) *loss = (float)hard_loss(h, lse, value<kTf>(f, to_c(s[label])), eps, zeta);
}

template <typename T, int R>
__global__ void distill_hard(const T *__restrict__ s, const int32_t *__restrict__ labels,
                             const double *__restrict__ hyper, const float *__restrict__ g, const T *__restrict__ ds,
                             float *__restrict__ loss, T *__restrict__ d, int64_t rows, int64_t vocab) {
  const Transform f = transform_of(hyper[5], hyper[4]);
  const double zeta = hyper[kHardZLoss], eps = hyper[kHardSmoothing];
  const int64_t ignore_index = (int64_t)hyper[kHardIgnoreIndex];
  __shared__ HardState part[R > 32 ? R / 32 : 1];
  constexpr int kGroups = kThreads / R;
  const int lane = threadIdx.x % R;
  for (int64_t row = (int64_t)blockIdx.x * kGroups + threadIdx.x / R; row < rows; row += (int64_t)gridDim.x * kGroups) {
    const int64_t off = row * vocab, label = labels[row];
    if (label == ignore_index || label < 0 || label >= vocab) {
      // not counted: loss 0, the soft gradient unchanged; a counted label outside [0, V): NaN, not a silent mean
      const bool counted = label != ignore_index;
      for (int64_t k = lane; k < vocab; k += R) d[off + k] = counted ? from_c<T>(NAN) : ds[off + k];
      if (lane == 0) loss[row] = counted ? NAN : 0.0f;
      continue;
    }
    if (f.active)
      hard_row<R, true>(s + off, ds + off, d + off, vocab, label, f, eps, zeta, g[row], lane, part, loss + row);
    else
      hard_row<R, false>(s + off, ds + off, d + off, vocab, label, f, eps, zeta, g[row], lane, part, loss + row);
  }
}

// ------------------------------------------------------------------------------------------ host side
static bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

static int64_t blocks_for(int64_t rows, int groups) {
  const int64_t b = (rows + groups - 1) / groups;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

template <typename T, int R>
static int launch(int op, void **params, int nhyper, int64_t rows, int64_t vocab, cudaStream_t stream) {
  const T *s = static_cast<const T *>(params[0]), *t = static_cast<const T *>(params[1]);
  const double *hyper = static_cast<const double *>(params[2]);
  float *stats = static_cast<float *>(params[op == kGiven ? 4 : 3]);
  const int64_t blocks = blocks_for(rows, kThreads / R);
  const bool rows_aligned = (vocab * (int64_t)sizeof(T)) % 16 == 0 && aligned16(s) && aligned16(t);
  if (is_forward(op)) {
    const float *given = op == kGiven ? static_cast<const float *>(params[3]) : nullptr;
    KLDIV_LAUNCH((unsigned)blocks, kThreads, 0, stream, distill_fwd<T, R, false>)(s, t, hyper, nhyper, stats, rows,
                                                                                  vocab, rows_aligned, op, given);
    if (op == kForward)
      KLDIV_LAUNCH((unsigned)blocks, kThreads, 0, stream, distill_fwd<T, R, true>)(s, t, hyper, nhyper, stats, rows,
                                                                                   vocab, rows_aligned, op, given);
  } else {
    T *ds = ds_param(op) >= 0 ? static_cast<T *>(params[ds_param(op)]) : nullptr;
    T *dt = dt_param(op) >= 0 ? static_cast<T *>(params[dt_param(op)]) : nullptr;
    const bool vec = rows_aligned && (!ds || aligned16(ds)) && (!dt || aligned16(dt));
    KLDIV_LAUNCH((unsigned)blocks, kThreads, 0, stream, distill_bwd<T, R>)(
        s, t, hyper, nhyper, stats, static_cast<const float *>(params[4]), ds, dt, rows, vocab, vec);
  }
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
}

template <typename T>
static int launch_for_vocab(int op, void **params, int nhyper, int64_t rows, int64_t vocab, cudaStream_t stream) {
  return vocab <= kWarpRowVocab ? launch<T, 32>(op, params, nhyper, rows, vocab, stream)
                                : launch<T, kThreads>(op, params, nhyper, rows, vocab, stream);
}

static int run(int op, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream) {
  int64_t rows, vocab;
  if (!rows_and_vocab(op, nparam, ndims, shapes, dtypes, &rows, &vocab)) return 1;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (rows == 0) return 0;
  if (vocab == 0 && op != kStates && op != kGiven) {  // no classes: every divergence is 0 (no gradient elements)
    if (op == kForward) cudaMemsetAsync(params[3], 0, sizeof(float) * kStats * rows, s);
    return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
  }  // (a slice without classes still has normalizers: no mass, log Z = -inf; the kernels' empty loops give them)
  // the hyper input's length: 6, or 2 (the old layout); anything else is a layout Python excludes
  const int nhyper = ndims[2] == 1 ? (int)shapes[2][0] : -1;
  if (nhyper != 6 && nhyper != 2) return 1;
  if (!strcmp(dtypes[0], "float32")) return launch_for_vocab<float>(op, params, nhyper, rows, vocab, s);
  if (!strcmp(dtypes[0], "float16")) return launch_for_vocab<__half>(op, params, nhyper, rows, vocab, s);
  if (!strcmp(dtypes[0], "bfloat16")) return launch_for_vocab<__nv_bfloat16>(op, params, nhyper, rows, vocab, s);
  return 1;
}

template <typename T, int R>
static int launch_hard(void **params, int64_t rows, int64_t vocab, cudaStream_t stream) {
  KLDIV_LAUNCH((unsigned)blocks_for(rows, kThreads / R), kThreads, 0, stream, distill_hard<T, R>)(
      static_cast<const T *>(params[0]), static_cast<const int32_t *>(params[1]),
      static_cast<const double *>(params[2]), static_cast<const float *>(params[3]), static_cast<const T *>(params[4]),
      static_cast<float *>(params[5]), static_cast<T *>(params[6]), rows, vocab);
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
}

template <typename T>
static int launch_hard_for_vocab(void **params, int64_t rows, int64_t vocab, cudaStream_t stream) {
  return vocab <= kWarpRowVocab ? launch_hard<T, 32>(params, rows, vocab, stream)
                                : launch_hard<T, kThreads>(params, rows, vocab, stream);
}

static int run_hard(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream) {
  int64_t rows, vocab;
  if (!hard_rows_and_vocab(nparam, ndims, shapes, dtypes, &rows, &vocab)) return 1;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (rows == 0) return 0;
  if (!strcmp(dtypes[0], "float32")) return launch_hard_for_vocab<float>(params, rows, vocab, s);
  if (!strcmp(dtypes[0], "float16")) return launch_hard_for_vocab<__half>(params, rows, vocab, s);
  if (!strcmp(dtypes[0], "bfloat16")) return launch_hard_for_vocab<__nv_bfloat16>(params, rows, vocab, s);
  return 1;
}

}  // namespace cuda
}  // namespace distill

DISTILL_DEFINE_EXPORTS(distill::cuda::run)
DISTILL_DEFINE_HARD_EXPORT(distill::cuda::run_hard)
DISTILL_DEFINE_SHARD_EXPORTS(distill::cuda::run)

DISTILL_DEFINE_INFER_SHAPES
