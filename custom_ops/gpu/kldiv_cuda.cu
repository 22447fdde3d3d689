// CUDA implementation of the ms_kldiv AOT ABI (custom_ops/common/kldiv_abi.h): libkldiv_cuda.so.
//
// Every formula comes from kldiv_math.h (kldiv::loss, kldiv::grads); this file only moves data.
//
// Geometry. The host collapses the broadcast of x and t into at most kMaxDims dims (size-1 dims dropped,
// adjacent dims merged when both operands stay linear across them) with per-operand element strides
// (0 where an operand is broadcast). Two paths:
//   * contiguous: both operands cover the whole broadcast shape -> flat index, 128-bit vector loads when
//     every pointer is 16-byte aligned (8 halves, 4 floats, 2 doubles per load), scalar tail;
//   * strided: linear index -> coordinates -> two offsets, all in int64.
//
// Reductions (forward Sum/Mean/Batchmean, and gradients summed back to a broadcast operand) are
// deterministic: a fixed grid (a function of the sizes only), double accumulators per thread, warp-shuffle
// then shared-memory tree per block, per-block partials written to a scratch buffer, and a second kernel
// that adds the partials in a fixed order. No atomics, so results are bitwise reproducible run to run.
// Scratch comes from cudaMallocAsync on the given stream (stream-ordered pool, cheap after the first call).
//
// Backward: one elementwise pass computes both gradients with one kldiv::grads call and writes those of
// operands that are not broadcast; each broadcast operand gets one segmented-reduction pass (kept
// coordinates x reduction coordinates) that recomputes kldiv::grads on the fly, so no broadcast-shaped
// temporary is ever materialized.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <vector>

#include "kldiv_abi.h"
#include "kldiv_device.cuh"
#include "kldiv_launch.cuh"
#include "kldiv_math.h"

namespace kldiv {
namespace cuda {

constexpr int kMaxDims = 8;
constexpr int kThreads = 256;
constexpr int kMaxReduceBlocks = 1024;  // partials per reduction (fixed: determinism independent of SM count)
constexpr int kMaxSplits = 256;         // blocks sharing one output element of a segmented reduction

// ------------------------------------------------------------------------------------------ geometry
struct Geometry {
  int ndim;                 // collapsed rank (0 for a single element)
  int64_t size[kMaxDims];   // collapsed broadcast shape
  int64_t xs[kMaxDims];     // element strides of x (0 = broadcast along this dim)
  int64_t ts[kMaxDims];     // element strides of t
  int64_t numel;
  bool contiguous;          // both operands cover the whole broadcast shape in order
};

__device__ __forceinline__ void offsets(const Geometry& g, int64_t i, int64_t* ox, int64_t* ot) {
  int64_t a = 0, b = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t c = i % g.size[d];
    i /= g.size[d];
    a += c * g.xs[d];
    b += c * g.ts[d];
  }
  *ox = a;
  *ot = b;
}

// Dims walked by one linear index, row-major: their sizes and the x, t and dout strides of each.
struct DimWalk {
  int n;
  int64_t size[kMaxDims], xs[kMaxDims], ts[kMaxDims], gs[kMaxDims];
  int64_t numel;

  void push(int64_t sz, int64_t x, int64_t t, int64_t g) {
    size[n] = sz;
    xs[n] = x;
    ts[n] = t;
    gs[n] = g;
    numel *= sz;
    ++n;
  }
  // Adds the x, t and dout offsets of linear index i to *ox, *ot, *og.
  __device__ __forceinline__ void add_offsets(int64_t i, int64_t* ox, int64_t* ot, int64_t* og) const {
    for (int d = n - 1; d >= 0; --d) {
      const int64_t c = i % size[d];
      i /= size[d];
      *ox += c * xs[d];
      *ot += c * ts[d];
      *og += c * gs[d];
    }
  }
};

// A segmented reduction of one operand: `kept` dims index its own elements (in its memory order), `red`
// dims are summed over. Each carries strides into x, t and the broadcast space's dout.
struct Segments {
  DimWalk kept, red;
};

// ------------------------------------------------------------------------------------------ block sum
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block in a fixed order; the result is valid in thread 0.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double warp_part[kThreads / 32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_part[threadIdx.x] : 0.0;
  if (warp == 0) v = warp_sum(v);
  __syncthreads();  // warp_part may be reused by a following call
  return v;
}

// ------------------------------------------------------------------------------------------ forward
template <typename T, bool LT>
__global__ void fwd_none_contig(const T* __restrict__ x, const T* __restrict__ t, T* __restrict__ out,
                                int64_t n, bool vec) {
  using C = typename Compute<T>::type;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t done =
      for_each_packet_pair(x, t, n, i, stride, vec, [&](int64_t k, const Vec16<T>& a, const Vec16<T>& b) {
        Vec16<T> r;
#pragma unroll
        for (int j = 0; j < Vec16<T>::kN; ++j) r.v[j] = from_c<T>(loss<C>(to_c(a.v[j]), to_c(b.v[j]), LT));
        packet(out, k) = r;
      });
  for (int64_t k = done + i; k < n; k += stride) out[k] = from_c<T>(loss<C>(to_c(x[k]), to_c(t[k]), LT));
}

template <typename T, bool LT>
__global__ void fwd_none_strided(const T* __restrict__ x, const T* __restrict__ t, T* __restrict__ out,
                                 Geometry g) {
  using C = typename Compute<T>::type;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < g.numel; i += stride) {
    int64_t ox, ot;
    offsets(g, i, &ox, &ot);
    out[i] = from_c<T>(loss<C>(to_c(x[ox]), to_c(t[ot]), LT));
  }
}

// Per-block partial sums of the loss (double), one per block.
template <typename T, bool LT>
__global__ void fwd_sum_partials(const T* __restrict__ x, const T* __restrict__ t, Geometry g, bool vec,
                                 double* __restrict__ partials) {
  using C = typename Compute<T>::type;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  double acc = 0.0;
  if (g.contiguous) {
    const int64_t done =
        for_each_packet_pair(x, t, g.numel, i, stride, vec, [&](int64_t, const Vec16<T>& a, const Vec16<T>& b) {
#pragma unroll
          for (int j = 0; j < Vec16<T>::kN; ++j) acc += (double)loss_term<C>(to_c(a.v[j]), to_c(b.v[j]), LT);
        });
    for (int64_t k = done + i; k < g.numel; k += stride) acc += (double)loss_term<C>(to_c(x[k]), to_c(t[k]), LT);
  } else {
    for (int64_t k = i; k < g.numel; k += stride) {
      int64_t ox, ot;
      offsets(g, k, &ox, &ot);
      acc += (double)loss_term<C>(to_c(x[ox]), to_c(t[ot]), LT);
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// out[0] = (sum of partials in index order) * scale, one block.
template <typename T>
__global__ void finalize_sum(const double* __restrict__ partials, int count, double scale, T* __restrict__ out) {
  double acc = 0.0;
  for (int k = threadIdx.x; k < count; k += blockDim.x) acc += partials[k];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = from_c<T>((typename Compute<T>::type)(acc * scale));
}

// ------------------------------------------------------------------------------------------ backward
// g = dout[i] * scale ('none') or dout[0] * scale (reductions).
template <typename T, bool LT, bool SCALAR_G>
__global__ void bwd_elementwise(const T* __restrict__ x, const T* __restrict__ t, const T* __restrict__ dout,
                                T* __restrict__ dx, T* __restrict__ dt, Geometry g, double scale, bool vec,
                                bool write_x, bool write_t) {
  using C = typename Compute<T>::type;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const C s = (C)scale;
  const C g0 = SCALAR_G ? to_c(dout[0]) * s : C(0);
  int64_t done = 0;
  if (vec && g.contiguous) {  // both written, no broadcast
    constexpr int V = Vec16<T>::kN;
    const int64_t nv = g.numel / V;
    for (int64_t k = i0; k < nv; k += stride) {
      const Vec16<T> a = packet(x, k), b = packet(t, k);
      Vec16<T> gg;
      if (!SCALAR_G) gg = packet(dout, k);
      Vec16<T> rx, rt;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        C di, dtg;
        grads<C>(to_c(a.v[j]), to_c(b.v[j]), LT, &di, &dtg);
        const C gj = SCALAR_G ? g0 : to_c(gg.v[j]) * s;
        rx.v[j] = from_c<T>(di * gj);
        rt.v[j] = from_c<T>(dtg * gj);
      }
      packet(dx, k) = rx;
      packet(dt, k) = rt;
    }
    done = nv * V;
  }
  for (int64_t k = done + i0; k < g.numel; k += stride) {
    int64_t ox = k, ot = k;
    if (!g.contiguous) offsets(g, k, &ox, &ot);
    C di, dtg;
    grads<C>(to_c(x[ox]), to_c(t[ot]), LT, &di, &dtg);
    const C gk = SCALAR_G ? g0 : to_c(dout[k]) * s;
    if (write_x) dx[ox] = from_c<T>(di * gk);
    if (write_t) dt[ot] = from_c<T>(dtg * gk);
  }
}

// Segmented reduction for one broadcast operand (WHICH_T: target, else input). Block (j, s) sums split s
// of element j's reduction set. splits == 1 writes the result; otherwise partials[j * splits + s].
template <typename T, bool LT, bool SCALAR_G, bool WHICH_T>
__global__ void bwd_reduce(const T* __restrict__ x, const T* __restrict__ t, const T* __restrict__ dout,
                           T* __restrict__ grad, Segments sg, double scale, int splits,
                           double* __restrict__ partials) {
  using C = typename Compute<T>::type;
  const C s = (C)scale;
  const C g0 = SCALAR_G ? to_c(dout[0]) * s : C(0);
  const int64_t per_split = (sg.red.numel + splits - 1) / splits;
  for (int64_t j = blockIdx.x; j < sg.kept.numel; j += gridDim.x) {
    int64_t bx = 0, bt = 0, bg = 0;
    sg.kept.add_offsets(j, &bx, &bt, &bg);
    const int64_t lo = (int64_t)blockIdx.y * per_split;
    const int64_t hi = lo + per_split < sg.red.numel ? lo + per_split : sg.red.numel;
    double acc = 0.0;
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
      int64_t ox = bx, ot = bt, og = bg;
      sg.red.add_offsets(r, &ox, &ot, &og);
      C di, dtg;
      grads<C>(to_c(x[ox]), to_c(t[ot]), LT, &di, &dtg);
      const C gr = SCALAR_G ? g0 : to_c(dout[og]) * s;
      acc += (double)((WHICH_T ? dtg : di) * gr);
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) {
      if (splits == 1) grad[j] = from_c<T>((C)acc);
      else partials[j * splits + blockIdx.y] = acc;
    }
  }
}

template <typename T>
__global__ void finalize_segments(const double* __restrict__ partials, int64_t kept, int splits,
                                  T* __restrict__ grad) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < kept; j += stride) {
    double acc = 0.0;
    for (int s = 0; s < splits; ++s) acc += partials[j * splits + s];
    grad[j] = from_c<T>((typename Compute<T>::type)acc);
  }
}

// ------------------------------------------------------------------------------------------ host side
struct Shape {
  int ndim;
  const int64_t* dims;
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
};

// Broadcast shape (right-aligned) and per-operand strides before collapsing; false if they do not broadcast.
static bool broadcast(Shape a, Shape b, std::vector<int64_t>* size, std::vector<int64_t>* as,
                      std::vector<int64_t>* bs) {
  const int n = a.ndim > b.ndim ? a.ndim : b.ndim;
  size->assign(n, 1);
  as->assign(n, 0);
  bs->assign(n, 0);
  int64_t sa = 1, sb = 1;
  for (int d = n - 1; d >= 0; --d) {
    const int ia = d - (n - a.ndim), ib = d - (n - b.ndim);
    const int64_t da = ia >= 0 ? a.dims[ia] : 1, db = ib >= 0 ? b.dims[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    (*size)[d] = da == 1 ? db : da;
    (*as)[d] = da == 1 ? 0 : sa;
    (*bs)[d] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  return true;
}

static bool make_geometry(Shape x, Shape t, Geometry* g) {
  std::vector<int64_t> size, xs, ts;
  if (!broadcast(x, t, &size, &xs, &ts)) return false;
  // Drop size-1 dims, then merge d into d+1 where both operands stay linear (or both broadcast).
  std::vector<int64_t> s2, x2, t2;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 1) continue;
    if (!s2.empty()) {
      const size_t p = s2.size() - 1;
      const bool xl = x2[p] == xs[d] * size[d];
      const bool tl = t2[p] == ts[d] * size[d];
      if (xl && tl) {
        s2[p] *= size[d];
        x2[p] = xs[d];
        t2[p] = ts[d];
        continue;
      }
    }
    s2.push_back(size[d]);
    x2.push_back(xs[d]);
    t2.push_back(ts[d]);
  }
  if ((int)s2.size() > kMaxDims) return false;
  g->ndim = (int)s2.size();
  g->numel = 1;
  for (int d = 0; d < g->ndim; ++d) {
    g->size[d] = s2[d];
    g->xs[d] = x2[d];
    g->ts[d] = t2[d];
    g->numel *= s2[d];
  }
  for (int d = 0; d < (int)size.size(); ++d)
    if (size[d] == 0) g->numel = 0;
  g->contiguous = g->ndim == 0 || (g->ndim == 1 && g->xs[0] == 1 && g->ts[0] == 1);
  return true;
}

// Segments for summing the gradient back to operand `which` (0 = x, 1 = t): its non-broadcast dims are
// kept (in order), its broadcast dims reduced. Works on the collapsed geometry; the broadcast space's
// own (dout) strides are its row-major strides.
static Segments make_segments(const Geometry& g, int which) {
  Segments sg;
  sg.kept.n = sg.red.n = 0;
  sg.kept.numel = sg.red.numel = 1;
  int64_t gs = 1;
  int64_t gstr[kMaxDims];
  for (int d = g.ndim - 1; d >= 0; --d) {
    gstr[d] = gs;
    gs *= g.size[d];
  }
  for (int d = 0; d < g.ndim; ++d) {
    const int64_t own = which == 0 ? g.xs[d] : g.ts[d];
    (own != 0 ? sg.kept : sg.red).push(g.size[d], g.xs[d], g.ts[d], gstr[d]);
  }
  return sg;
}

static bool operand_broadcast(const Geometry& g, int which) {
  for (int d = 0; d < g.ndim; ++d)
    if ((which == 0 ? g.xs[d] : g.ts[d]) == 0) return true;
  return false;
}

static bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

static int grid_for(int64_t n, int max_blocks) {
  int64_t b = (n + kThreads * 4 - 1) / (kThreads * 4);
  if (b < 1) b = 1;
  return (int)(b < max_blocks ? b : max_blocks);
}

static int elementwise_grid(int64_t n) {
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (sms <= 0) sms = 80;
  }
  return grid_for(n, sms * 8);
}

static double reduction_scale(int reduction, const Geometry& g, Shape x) {
  switch (reduction) {
    case kMean:
      return g.numel ? 1.0 / (double)g.numel : NAN;
    case kBatchmean: {
      const int64_t b = x.ndim ? x.dims[0] : 1;
      return b ? 1.0 / (double)b : NAN;
    }
    default:
      return 1.0;
  }
}

template <typename T, bool LT>
static int forward(int reduction, void** params, int* ndims, int64_t** shapes, cudaStream_t stream) {
  const Shape xs{ndims[0], shapes[0]}, tsh{ndims[1], shapes[1]};
  Geometry g;
  if (!make_geometry(xs, tsh, &g)) return 2;
  const T* x = static_cast<const T*>(params[0]);
  const T* t = static_cast<const T*>(params[1]);
  T* out = static_cast<T*>(params[2]);
  if (reduction == kNone) {
    const bool vec = g.contiguous && aligned16(x) && aligned16(t) && aligned16(out);
    if (Shape{ndims[2], shapes[2]}.numel() != g.numel) return 3;
    if (g.numel == 0) return 0;
    if (g.contiguous)
      KLDIV_LAUNCH(elementwise_grid(g.numel), kThreads, 0, stream, fwd_none_contig<T, LT>)(x, t, out, g.numel, vec);
    else
      KLDIV_LAUNCH(elementwise_grid(g.numel), kThreads, 0, stream, fwd_none_strided<T, LT>)(x, t, out, g);
    return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
  }
  const double scale = reduction_scale(reduction, g, xs);
  const int blocks = g.numel ? grid_for(g.numel, kMaxReduceBlocks) : 0;
  double* partials = nullptr;
  if (blocks) {
    if (cudaMallocAsync(reinterpret_cast<void**>(&partials), sizeof(double) * blocks, stream) != cudaSuccess)
      return 5;
    KLDIV_LAUNCH(blocks, kThreads, 0, stream, fwd_sum_partials<T, LT>)(x, t, g, g.contiguous && aligned16(x) && aligned16(t),
                                                             partials);
  }
  KLDIV_LAUNCH(1, kThreads, 0, stream, finalize_sum<T>)(partials, blocks, scale, out);
  if (partials) cudaFreeAsync(partials, stream);
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
}

template <typename T, bool LT, bool SCALAR_G, bool WHICH_T>
static int reduce_operand(const T* x, const T* t, const T* dout, T* grad, const Geometry& g, double scale,
                          cudaStream_t stream) {
  const Segments sg = make_segments(g, WHICH_T ? 1 : 0);
  if (sg.kept.numel == 0) return 0;
  // Enough blocks to fill the GPU: many kept elements -> one block each (grid-stride), few -> split each
  // element's reduction set over up to kMaxSplits blocks and add the partials in a second, ordered pass.
  int64_t splits = 1;
  if (sg.kept.numel < 4096) {
    splits = (sg.red.numel + kThreads * 16 - 1) / (kThreads * 16);
    const int64_t cap = (int64_t)kMaxSplits < 65535 ? kMaxSplits : 65535;
    if (splits > cap) splits = cap;
    if (splits < 1) splits = 1;
  }
  const int64_t gx = sg.kept.numel < 65535 * 8 ? sg.kept.numel : 65535 * 8;
  dim3 grid((unsigned)(gx < 2147483647 ? gx : 2147483647), (unsigned)splits);
  double* partials = nullptr;
  if (splits > 1) {
    if (cudaMallocAsync(reinterpret_cast<void**>(&partials), sizeof(double) * sg.kept.numel * splits, stream) !=
        cudaSuccess)
      return 5;
  }
  KLDIV_LAUNCH(grid, kThreads, 0, stream, bwd_reduce<T, LT, SCALAR_G, WHICH_T>)(x, t, dout, grad, sg, scale, (int)splits,
                                                                      partials);
  if (splits > 1) {
    KLDIV_LAUNCH(grid_for(sg.kept.numel, 4096), kThreads, 0, stream, finalize_segments<T>)(partials, sg.kept.numel,
                                                                                 (int)splits, grad);
    cudaFreeAsync(partials, stream);
  }
  return 0;
}

// want: which gradients (kWantDx / kWantDt / kWantBoth of kldiv_abi.h, which also gives their params).
template <typename T, bool LT>
static int backward(int want, int reduction, void** params, int* ndims, int64_t** shapes, cudaStream_t stream) {
  const Shape xs{ndims[0], shapes[0]}, tsh{ndims[1], shapes[1]};
  Geometry g;
  if (!make_geometry(xs, tsh, &g)) return 2;
  const T* x = static_cast<const T*>(params[0]);
  const T* t = static_cast<const T*>(params[1]);
  const T* dout = static_cast<const T*>(params[2]);
  T* dx = dx_param(want) >= 0 ? static_cast<T*>(params[dx_param(want)]) : nullptr;
  T* dt = dt_param(want) >= 0 ? static_cast<T*>(params[dt_param(want)]) : nullptr;
  const double scale = reduction == kNone ? 1.0 : reduction_scale(reduction, g, xs);
  const int64_t nx = xs.numel(), nt = tsh.numel();
  if (g.numel == 0) {
    // Nothing contributes: exact zeros (never 0 * NaN from an empty mean's scale).
    if (dx && nx) cudaMemsetAsync(dx, 0, sizeof(T) * nx, stream);
    if (dt && nt) cudaMemsetAsync(dt, 0, sizeof(T) * nt, stream);
    return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
  }
  const bool bx = operand_broadcast(g, 0), bt = operand_broadcast(g, 1);
  const bool scalar_g = reduction != kNone;
  const bool write_x = dx && !bx, write_t = dt && !bt;  // stored elementwise; the others are reduced below
  if (write_x || write_t) {
    // The 128-bit path stores both gradients; with one wanted the grid-stride loop stores just that one.
    const bool vec = write_x && write_t && g.contiguous && aligned16(x) && aligned16(t) && aligned16(dx) &&
                     aligned16(dt) && (scalar_g || aligned16(dout));
    if (scalar_g)
      KLDIV_LAUNCH(elementwise_grid(g.numel), kThreads, 0, stream, bwd_elementwise<T, LT, true>)(
          x, t, dout, dx, dt, g, scale, vec, write_x, write_t);
    else
      KLDIV_LAUNCH(elementwise_grid(g.numel), kThreads, 0, stream, bwd_elementwise<T, LT, false>)(
          x, t, dout, dx, dt, g, scale, vec, write_x, write_t);
  }
  int rc = 0;
  if (dx && bx) rc |= scalar_g ? reduce_operand<T, LT, true, false>(x, t, dout, dx, g, scale, stream)
                               : reduce_operand<T, LT, false, false>(x, t, dout, dx, g, scale, stream);
  if (dt && bt) rc |= scalar_g ? reduce_operand<T, LT, true, true>(x, t, dout, dt, g, scale, stream)
                               : reduce_operand<T, LT, false, true>(x, t, dout, dt, g, scale, stream);
  if (rc) return rc;
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 4;
}

// want: kForward, or the backward's gradients (kldiv_abi.h).
template <bool LT>
static int dispatch(int want, int reduction, int nparam, void** params, int* ndims, int64_t** shapes,
                    const char** dtypes, void* stream) {
  const bool bwd = want != kForward;
  if (nparam != nparam_for(want)) return 1;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const char* d = dtypes[0];
  if (!strcmp(d, "float32"))
    return bwd ? backward<float, LT>(want, reduction, params, ndims, shapes, s) : forward<float, LT>(reduction, params, ndims, shapes, s);
  if (!strcmp(d, "float64"))
    return bwd ? backward<double, LT>(want, reduction, params, ndims, shapes, s) : forward<double, LT>(reduction, params, ndims, shapes, s);
  if (!strcmp(d, "float16"))
    return bwd ? backward<__half, LT>(want, reduction, params, ndims, shapes, s) : forward<__half, LT>(reduction, params, ndims, shapes, s);
  if (!strcmp(d, "bfloat16"))
    return bwd ? backward<__nv_bfloat16, LT>(want, reduction, params, ndims, shapes, s)
               : forward<__nv_bfloat16, LT>(reduction, params, ndims, shapes, s);
  return 1;
}

}  // namespace cuda
}  // namespace kldiv

// ---------------------------------------------------------------------------------------------- exports
#define KLDIV_CUDA_EXPORT(R, S, RID, LT) KLDIV_DEFINE_EXPORTS(kldiv::cuda::dispatch, R, S, RID, LT)
KLDIV_FOR_EACH_VARIANT(KLDIV_CUDA_EXPORT)

#define KLDIV_STR2(...) #__VA_ARGS__
#define KLDIV_STR(...) KLDIV_STR2(__VA_ARGS__)
#ifdef __CUDA_ARCH_LIST__
#define KLDIV_ARCHS KLDIV_STR(__CUDA_ARCH_LIST__)
#else
#define KLDIV_ARCHS "unknown"
#endif

KLDIV_EXPORT const char* KLDivLibInfo(void) {
  return "ms_kldiv CUDA kernels, ABI " KLDIV_STR(KLDIV_ABI_VERSION) ", CUDA " KLDIV_STR(CUDART_VERSION)
         ", archs " KLDIV_ARCHS ", deterministic two-stage reductions, 128-bit loads";
}
