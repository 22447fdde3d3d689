// CUDA implementation of the fused stored-teacher distillation ABI (custom_ops/common/sparse_abi.h), in
// libkldiv_cuda.so next to the KLDiv and distillation kernels. The per-row statistics and the gradient at the ids
// come from sparse_math.h, shared with the CPU kernels (custom_ops/cpu/sparse_kernels.inc); this file moves data.
//
// Rows of V student logits with K teacher ids each; a group of R threads owns a row and the groups stride over the
// rows: R = 32 (a warp, eight rows per block) for small vocabularies, R = 256 (the block) otherwise, as in
// distill_cuda.cu. A row is cut into units (a 16-byte packet of classes when every row starts 16-byte aligned and V
// is a whole number of packets, else one class); thread `lane` owns the units lane, lane + R, lane + 2R, ...
//
// Forward: one read of each row (two for a confident student's, below). The thread's units are visited in tiles of 64
// classes per thread; before a tile the thread scans the row's ids and sets one bit of a 64-bit register mask per id
// among its own classes of the tile (an id seen twice sets a bit already set: a repeated id; an id >= V: out of range;
// either makes the row bad). Then each class adds e^x to Z and, when its bit is clear, to Z_off: the tail's sum is
// formed directly, never as Z minus the ids' terms. Online maxima (raw units, so huge logits stay exact), double sums;
// the states merge across the group in a fixed order (warp shuffles, then the warps' states in shared memory), so
// results are bitwise reproducible and independent of the grid; no atomics, no scratch memory. A row whose Z_off comes
// out below kTailRescue (a confident student: its tail's terms may have underflowed) is read once more, its classes off
// the ids summed relative to their own maximum. Lane 0 then forms the row's statistics with sparse::row_stats (K
// gathers of the row).
// Backward: one write of each row (the tail and softmax terms), then every thread overwrites the id positions
// among its own classes with sparse::id_grad: the thread that wrote a class is the one that overwrites it, so
// program order puts the overwrite last without a barrier. A row with dloss == 0 gets exact zeros, its logits
// unread.
// The hyper input (temperature, ratio, beta, tail) stays in device memory and every block reads it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <cmath>

#include "sparse_abi.h"
#include "kldiv_device.cuh"
#include "kldiv_launch.cuh"

namespace sparse {
namespace cuda {

using kldiv::cuda::from_c;
using kldiv::cuda::kFlushEvery;
using kldiv::cuda::kLazyRescale;
using kldiv::cuda::packet;
using kldiv::cuda::to_c;
using kldiv::cuda::Vec16;

constexpr int kThreads = 256;
constexpr int64_t kWarpRowVocab = 2048;  // up to this many classes a warp owns a row
constexpr int64_t kMaxBlocks = 65535 * 8;
constexpr int kTileBits = 64;  // classes per thread per tile of the forward (one bit each in a register mask)

// ------------------------------------------------------------------------------------------ row state
// The running state of (part of) a row: raw maximum, sums of exp((s - m) / T) over all classes and over the classes
// off the ids, and whether the row is bad (1) or not (0). Doubles only, so it shuffles field by field.
struct Sums {
  double m, z, z_off, bad;
};

__device__ __forceinline__ Sums sums_empty() { return Sums{-INFINITY, 0.0, 0.0, 0.0}; }

// Moves the state to the maximum m_new (>= the current one; NaN or unchanged: left as is).
__device__ __forceinline__ void sums_rescale(Sums *s, double m_new, double inv_t) {
  if (!(m_new > s->m)) return;
  const double f = s->m == -INFINITY ? 0.0 : exp((s->m - m_new) * inv_t);
  s->z *= f;
  s->z_off *= f;
  s->m = m_new;
}

__device__ __forceinline__ void sums_merge(Sums *a, Sums b, double inv_t) {
  const double m = distill::max_of(a->m, b.m);
  sums_rescale(a, m, inv_t);
  sums_rescale(&b, m, inv_t);
  a->z += b.z;
  a->z_off += b.z_off;
  a->bad = a->bad > b.bad ? a->bad : b.bad;
}

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

// ------------------------------------------------------------------------------------------ ownership
// Units of E classes (E = the packet size with 128-bit loads, else 1); thread `lane` of R owns units u with
// u % R == lane. A forward tile starts at unit u0 (a multiple of R * kTileBits / E) and holds kTileBits / E units
// of each thread: unit u0 + lane + m R is bits m E .. m E + E - 1 of the thread's mask.
//
// The mask of this thread's classes among the row's ids in the tile at u0. Sets *bad for an id >= V or an id met
// twice (every thread scans every id, so each repeated id is seen by its owner).
template <int R, int E>
__device__ __forceinline__ uint64_t tile_mask(const int32_t *ids, int64_t k, int64_t vocab, int64_t u0, int lane,
                                              bool *bad) {
  constexpr int64_t kUnits = (int64_t)R * (kTileBits / E);
  const int64_t lo = u0 * E, hi = (u0 + kUnits) * E;
  uint64_t mask = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t id = ids[i];
    if (id < 0) continue;  // padding
    if (id >= vocab) {
      *bad = true;
      continue;
    }
    if (id < lo || id >= hi) continue;
    const int64_t w = id / E - u0;
    if (w % R != lane) continue;
    const uint64_t bit = uint64_t{1} << ((w / R) * E + id % E);
    if (mask & bit) *bad = true;
    mask |= bit;
  }
  return mask;
}

// ------------------------------------------------------------------------------------------ forward
// A confident student's tail (kTailRescue, kLogMinDouble: sparse_math.h): a thread's terms are float32 exponentials
// relative to its base, which sits on an id once the thread has met one above its other classes, so its later classes
// off the ids underflow and were lost; rows under kTailRescue sum the classes off the ids once more, relative to their
// own maximum (the CPU kernels' off_ids_log_z).

// One sweep of this thread's classes of the row, into a state of its own (not yet merged across the group).
// kOffOnly = false: every class into z and the classes off the ids into z_off too, m the maximum of all (the forward's
// read). kOffOnly = true: only the classes off the ids, into z_off relative to their own maximum m (the rescue's read).
template <int R, bool kVec, bool kOffOnly, typename T>
__device__ __forceinline__ Sums sweep(const T *s, const int32_t *ids, int64_t vocab, int64_t k, float inv_t,
                                      int lane) {
  constexpr int E = kVec ? Vec16<T>::kN : 1;
  constexpr int U = kTileBits / E;  // units per thread per tile
  const int64_t units = vocab / E;  // kVec: V is a whole number of packets
  Sums st = sums_empty();
  float base = 0.0f, lazy_above = -INFINITY, m = -INFINITY;  // the exponents' base, kLazyRescale's bound, the max
  const float lazy = kLazyRescale / inv_t;  // in logit units
  float z_part = 0.0f, z_off_part = 0.0f;  // the sums since the last flush (kFlushEvery)
  int pending = 0;
  bool bad = false;
  const auto flush = [&] {
    st.z += z_part;
    st.z_off += z_off_part;
    z_part = z_off_part = 0.0f;
    pending = 0;
  };
  auto add = [&](float v, bool on_id) {
    if constexpr (kOffOnly) {
      if (on_id) return;  // neither the maximum nor the sums: the tail's own
    }
    m = v > m ? v : m;
    if (v > lazy_above) {
      flush();
      sums_rescale(&st, v, inv_t);
      base = v;
      lazy_above = v + lazy;
    }
    const float e = expf((v - base) * inv_t);
    if constexpr (!kOffOnly) z_part += e;
    z_off_part += on_id ? 0.0f : e;
    if (++pending == kFlushEvery) flush();
  };
  for (int64_t u0 = 0; u0 < units; u0 += (int64_t)R * U) {
    const uint64_t mask = tile_mask<R, E>(ids, k, vocab, u0, lane, &bad);
#pragma unroll 4
    for (int m = 0; m < U; ++m) {
      const int64_t u = u0 + lane + (int64_t)m * R;
      if (u >= units) break;
      if constexpr (kVec) {
        const Vec16<T> p = packet(s, u);
#pragma unroll
        for (int e = 0; e < E; ++e) add(to_c(p.v[e]), (mask >> (m * E + e)) & 1u);
      } else {
        add(to_c(s[u]), (mask >> m) & 1u);
      }
    }
  }
  flush();
  sums_rescale(&st, m, inv_t);  // to the true maximum
  st.bad = bad ? 1.0 : 0.0;
  return st;
}

template <int R, bool kVec, typename T>
__device__ __forceinline__ void forward_row(const T *s, const int32_t *ids, const float *vals, int64_t vocab,
                                            int64_t k, const Hyper &h, int lane, Sums *part, float *stats) {
  const double inv_t_d = h.inv_t;
  const auto merge = [inv_t_d](Sums *a, Sums b) { sums_merge(a, b, inv_t_d); };
  const Sums st = group_reduce<R>(sweep<R, kVec, false>(s, ids, vocab, k, h.inv_t, lane), merge, sums_empty(), part);
  const double base = distill::safe_base(st.m);
  double log_z_off;
  // The group's merged state is the same in each of its threads, so the whole group (with R > 32 the block, whose
  // barriers group_reduce needs) takes this branch or none does.
  if (st.z_off < kTailRescue) {
    const Sums off = group_reduce<R>(sweep<R, kVec, true>(s, ids, vocab, k, h.inv_t, lane), merge, sums_empty(), part);
    const double hi = (off.m - base) * inv_t_d;  // the tail's maximum relative to the row's
    log_z_off = off.m == -INFINITY || hi < kLogMinDouble ? -INFINITY : hi + log(off.z_off);
  } else {
    log_z_off = log(st.z_off);
  }
  if (lane == 0) {
    const auto x_at = [&](int64_t c) { return (static_cast<double>(to_c(s[c])) - base) * h.inv_t; };
    row_stats(h, ids, vals, k, base, log(st.z), log_z_off, st.bad != 0.0, x_at, stats);
  }
}

// No __launch_bounds__, as distill_cuda.cu (a cap of 64 registers spilled there).
template <typename T, int R>
__global__ void sparse_fwd(const T *__restrict__ s, const int32_t *__restrict__ ids, const float *__restrict__ vals,
                           const double *__restrict__ hyper, float *__restrict__ stats, int64_t rows, int64_t vocab,
                           int64_t k, bool vec) {
  __shared__ Sums part[kThreads / 32];
  const Hyper h = hyper_of(hyper);
  constexpr int kGroups = kThreads / R;
  const int lane = threadIdx.x % R;
  for (int64_t row = (int64_t)blockIdx.x * kGroups + threadIdx.x / R; row < rows; row += (int64_t)gridDim.x * kGroups) {
    const T *sr = s + row * vocab;
    const int32_t *ir = ids + row * k;
    const float *vr = vals + row * k;
    if (vec)
      forward_row<R, true>(sr, ir, vr, vocab, k, h, lane, part, stats + row * kStats);
    else
      forward_row<R, false>(sr, ir, vr, vocab, k, h, lane, part, stats + row * kStats);
  }
}

// ------------------------------------------------------------------------------------------ backward
// One row's gradient, g = dloss[row] != 0.
template <int R, bool kVec, typename T>
__device__ __forceinline__ void backward_row(const T *s, const int32_t *ids, const float *vals, int64_t vocab,
                                             int64_t k, const Hyper &h, const float *st, float g, int lane, T *ds) {
  constexpr int E = kVec ? Vec16<T>::kN : 1;
  const int64_t units = vocab / E;
  const float g_t = g * h.t, base = st[kMax], lz = st[kLogZ], lz_off = st[kLogZOff];
  const float c_all = -g_t * st[kSumA], c_tail = g_t * st[kATail];
  const bool no_tail = lz_off == -INFINITY;  // no class off the ids has mass: no tail term
  const float inv_t = h.inv_t;
  auto grad = [&](float v) {
    const float x = (v - base) * inv_t;
    return no_tail ? c_all * expf(x - lz) : c_tail * expf(x - lz_off) + c_all * expf(x - lz);
  };
  for (int64_t u = lane; u < units; u += R) {
    if constexpr (kVec) {
      const Vec16<T> p = packet(s, u);
      Vec16<T> r;
#pragma unroll
      for (int e = 0; e < E; ++e) r.v[e] = from_c<T>(grad(to_c(p.v[e])));
      packet(ds, u) = r;
    } else {
      ds[u] = from_c<T>(grad(to_c(s[u])));
    }
  }
  // the ids among this thread's classes: written above by this thread, overwritten now
  for (int64_t i = 0; i < k; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= vocab || (id / E) % R != lane) continue;
    const double x = (static_cast<double>(to_c(s[id])) - base) * h.inv_t;
    ds[id] = from_c<T>(id_grad(h, st, x, vals[i], g_t));
  }
}

template <typename T, int R>
__global__ void sparse_bwd(const T *__restrict__ s, const int32_t *__restrict__ ids, const float *__restrict__ vals,
                           const double *__restrict__ hyper, const float *__restrict__ stats,
                           const float *__restrict__ dloss, T *__restrict__ ds, int64_t rows, int64_t vocab, int64_t k,
                           bool vec) {
  const Hyper h = hyper_of(hyper);
  constexpr int kGroups = kThreads / R;
  const int lane = threadIdx.x % R;
  for (int64_t row = (int64_t)blockIdx.x * kGroups + threadIdx.x / R; row < rows; row += (int64_t)gridDim.x * kGroups) {
    T *dsr = ds + row * vocab;
    const float g = dloss[row];
    if (g == 0.0f) {  // an ignored row (or a zero incoming gradient): exact zeros, the logits are not read
      if (vec) {
        Vec16<T> z;
#pragma unroll
        for (int e = 0; e < Vec16<T>::kN; ++e) z.v[e] = from_c<T>(0.0f);
        for (int64_t u = lane; u < vocab / Vec16<T>::kN; u += R) packet(dsr, u) = z;
      } else {
        for (int64_t c = lane; c < vocab; c += R) dsr[c] = from_c<T>(0.0f);
      }
      continue;
    }
    const T *sr = s + row * vocab;
    const int32_t *ir = ids + row * k;
    const float *vr = vals + row * k;
    const float *st = stats + row * kStats;
    if (vec)
      backward_row<R, true>(sr, ir, vr, vocab, k, h, st, g, lane, dsr);
    else
      backward_row<R, false>(sr, ir, vr, vocab, k, h, st, g, lane, dsr);
  }
}

// ------------------------------------------------------------------------------------------ host side
static bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

static int64_t blocks_for(int64_t rows, int groups) {
  const int64_t b = (rows + groups - 1) / groups;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

template <typename T, int R>
static int launch(bool forward, void **params, int64_t rows, int64_t vocab, int64_t k, cudaStream_t stream) {
  const T *s = static_cast<const T *>(params[0]);
  const int32_t *ids = static_cast<const int32_t *>(params[1]);
  const float *vals = static_cast<const float *>(params[2]);
  const double *hyper = static_cast<const double *>(params[3]);
  float *stats = static_cast<float *>(params[4]);
  const int64_t blocks = blocks_for(rows, kThreads / R);
  // packets only when every row starts on a 16-byte boundary (V a whole number of packets)
  const bool rows_aligned = vocab % Vec16<T>::kN == 0 && aligned16(s);
  if (forward) {
    KLDIV_LAUNCH((unsigned)blocks, kThreads, 0, stream, sparse_fwd<T, R>)(s, ids, vals, hyper, stats, rows, vocab, k,
                                                                          rows_aligned);
  } else {
    T *ds = static_cast<T *>(params[6]);
    KLDIV_LAUNCH((unsigned)blocks, kThreads, 0, stream, sparse_bwd<T, R>)(
        s, ids, vals, hyper, stats, static_cast<const float *>(params[5]), ds, rows, vocab, k,
        rows_aligned && aligned16(ds));
  }
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
}

template <typename T>
static int launch_for_vocab(bool forward, void **params, int64_t rows, int64_t vocab, int64_t k, cudaStream_t stream) {
  return vocab <= kWarpRowVocab ? launch<T, 32>(forward, params, rows, vocab, k, stream)
                                : launch<T, kThreads>(forward, params, rows, vocab, k, stream);
}

static int run(bool forward, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
               void *stream) {
  int64_t rows, vocab, k;
  if (!layout(forward, nparam, ndims, shapes, dtypes, &rows, &vocab, &k)) return 1;
  const char *d = dtypes[0];
  const int dtype = !d ? -1 : !strcmp(d, "float32") ? 0 : !strcmp(d, "float16") ? 1 : !strcmp(d, "bfloat16") ? 2 : -1;
  if (dtype < 0) return 1;
  if (rows == 0 || vocab == 0) return 0;  // Python refuses V = 0; no rows: nothing to write (as the CPU library)
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (dtype == 0) return launch_for_vocab<float>(forward, params, rows, vocab, k, st);
  if (dtype == 1) return launch_for_vocab<__half>(forward, params, rows, vocab, k, st);
  return launch_for_vocab<__nv_bfloat16>(forward, params, rows, vocab, k, st);
}

}  // namespace cuda
}  // namespace sparse

SPARSE_DEFINE_EXPORTS(sparse::cuda::run)

SPARSE_DEFINE_INFER_SHAPES
