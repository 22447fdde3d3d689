// libkldiv_cpu.so front end: the ABI of custom_ops/common/kldiv_abi.h on top of the per-ISA kernels.
//
// Here: dtype parsing, broadcast planning (merge dims, strides 0 for broadcast dims, 64-bit sizes),
// C++ shape inference for dynamic shapes, and the choice of ISA (once, from cpuid). The thread pool is
// kldiv_pool.cc's; the diagnostics exports (-DKLDIV_DIAGNOSTICS) are kldiv_diagnostics.cc's.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "../common/kldiv_abi.h"
#include "kldiv_cpu.h"

namespace kldiv {
namespace cpu {
namespace {

// Software prefetch distance (bytes ahead) for the forward sum's float32 vector loop (Args::prefetch). On Intel
// cores a single core reads DRAM below the socket's bandwidth (the hardware prefetchers keep too few lines in flight),
// and prefetching a few lines ahead lets the sum read closer to it. The backward and the 'none' pass keep write
// streams in flight, where more reads cost rather than help, and on AMD cores it made the sum slower.
// Hence the sum only, by default on Intel only; MS_KLDIV_PREFETCH=<bytes> sets it (0 = off). docs/cpu_aot.md,
// "Software prefetch".
int64_t default_prefetch() {
  const char* v = getenv("MS_KLDIV_PREFETCH");
  if (v && *v) {
    char* end = nullptr;
    const long long r = strtoll(v, &end, 10);
    if (end && *end == '\0' && r >= 0 && r <= (1 << 20)) return r;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) return 2048;
#endif
  return 0;
}

// The widest ISA the CPU (and, for AVX-512, the OS: libgcc checks XCR0) supports, unless MS_KLDIV_ISA names a
// narrower one this CPU also runs: 'baseline', 'avx2' (tests compare the units; a user may prefer AVX2 on CPUs whose
// clock drops under 512-bit code).
const KernelTable* pick_table() {
  const char* force = getenv("MS_KLDIV_ISA");
  const bool want_base = force && strcmp(force, "baseline") == 0;
  const bool want_avx2 = force && strcmp(force, "avx2") == 0;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (want_base) return table_base();
  if (avx512 && !want_avx2) return table_avx512();
  if (avx2) return table_avx2();
#else
  (void)want_base;
  (void)want_avx2;
#endif
  return table_base();
}

const KernelTable* table() {
  static const KernelTable* t = pick_table();
  return t;
}

int64_t numel(int nd, const int64_t* shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= shape[i];
  return n;
}

// Broadcast x (ndx, shx) with t (ndt, sht) into *bshape / *bnd and build the merged iteration Plan.
bool make_plan(int ndx, const int64_t* shx, int ndt, const int64_t* sht, Plan* p, int64_t* bshape, int* bnd) {
  if (ndx < 0 || ndt < 0 || ndx > kMaxDims || ndt > kMaxDims) return false;
  const int nd = ndx > ndt ? ndx : ndt;
  int64_t sx[kMaxDims], st[kMaxDims], bx[kMaxDims], bt[kMaxDims];
  for (int d = 0; d < nd; ++d) {
    const int ix = d - (nd - ndx), it = d - (nd - ndt);
    sx[d] = ix >= 0 ? shx[ix] : 1;
    st[d] = it >= 0 ? sht[it] : 1;
    if (sx[d] < 0 || st[d] < 0) return false;
    if (sx[d] != st[d] && sx[d] != 1 && st[d] != 1) return false;
    bshape[d] = sx[d] == 1 ? st[d] : sx[d];
  }
  *bnd = nd;
  // Row-major element strides of each operand in its own storage; 0 where it is broadcast.
  int64_t cx = 1, ct = 1;
  for (int d = nd - 1; d >= 0; --d) {
    bx[d] = (sx[d] == 1) ? 0 : cx;
    bt[d] = (st[d] == 1) ? 0 : ct;
    cx *= sx[d];
    ct *= st[d];
  }
  p->n = numel(nd, bshape);
  p->nx = numel(ndx, shx);
  p->nt = numel(ndt, sht);
  p->x_reduced = p->nx != p->n;
  p->t_reduced = p->nt != p->n;
  p->nd = 0;
  if (p->n == 0) {  // nothing to iterate; the kernels only write the reduced outputs
    p->nd = 1;
    p->size[0] = 0;
    p->xs[0] = p->ts[0] = 0;
    return true;
  }
  for (int d = 0; d < nd; ++d) {
    if (bshape[d] == 1) continue;  // size-1 dims carry no iteration
    if (p->nd > 0) {
      const int q = p->nd - 1;
      if (p->xs[q] == bx[d] * bshape[d] && p->ts[q] == bt[d] * bshape[d]) {  // contiguous continuation
        p->size[q] *= bshape[d];
        p->xs[q] = bx[d];
        p->ts[q] = bt[d];
        continue;
      }
    }
    p->size[p->nd] = bshape[d];
    p->xs[p->nd] = bx[d];
    p->ts[p->nd] = bt[d];
    ++p->nd;
  }
  if (p->nd == 0) {  // a single element
    p->nd = 1;
    p->size[0] = 1;
    p->xs[0] = p->ts[0] = 0;
  }
  return true;
}

double scale_for(int reduction, int64_t n, int ndx, const int64_t* shx) {
  switch (reduction) {
    case kMean: return n ? 1.0 / static_cast<double>(n) : NAN;
    case kBatchmean: {
      const int64_t b = ndx ? shx[0] : 1;
      return b ? 1.0 / static_cast<double>(b) : NAN;
    }
    default: return 1.0;
  }
}

// want: kForward, or the backward's gradients (kWantDx / kWantDt / kWantBoth; see kldiv_abi.h).
int run(int want, int reduction, bool log_target, int nparam, void** params, int* ndims, int64_t** shapes,
        const char** dtypes) {
#ifdef KLDIV_DIAGNOSTICS
  const int64_t start = monotonic_ns();
#endif
  const bool fwd = want == kForward;
  if (nparam != nparam_for(want) || !params || !ndims || !shapes || !dtypes) return 1;
  const int dtype = parse_dtype(dtypes[0]);
  if (dtype < 0) return 2;
  for (int i = 1; i < nparam; ++i) {
    if (parse_dtype(dtypes[i]) != dtype) return 2;
  }
  Plan plan;
  int64_t bshape[kMaxDims];
  int bnd = 0;
  if (!make_plan(ndims[0], shapes[0], ndims[1], shapes[1], &plan, bshape, &bnd)) return 3;
  // The output / dout must be what shape inference promised.
  const int io = 2;
  if (reduction == kNone) {
    if (ndims[io] != bnd) return 4;
    for (int d = 0; d < bnd; ++d) {
      if (shapes[io][d] != bshape[d]) return 4;
    }
  } else if (numel(ndims[io], shapes[io]) != 1) {
    return 4;
  }
  const int ix = dx_param(want), it = dt_param(want);
  if (ix >= 0 && numel(ndims[ix], shapes[ix]) != plan.nx) return 4;
  if (it >= 0 && numel(ndims[it], shapes[it]) != plan.nt) return 4;
  Args a;
  a.plan = &plan;
  a.dtype = dtype;
  a.log_target = log_target;
  a.reduction = reduction;
  a.scale = scale_for(reduction, plan.n, ndims[0], shapes[0]);
  a.prefetch = prefetch_bytes();
  a.x = params[0];
  a.t = params[1];
  if (fwd) {
    a.dout = nullptr;
    a.want = kForward;
    a.out = params[2];
    a.dx = a.dt = nullptr;
    table()->forward(&a);
  } else {
    a.dout = params[2];
    a.out = nullptr;
    a.want = want;
    a.dx = ix >= 0 ? params[ix] : nullptr;
    a.dt = it >= 0 ? params[it] : nullptr;
    table()->backward(&a);
  }
#ifdef KLDIV_DIAGNOSTICS
  record_span(start, monotonic_ns());
#endif
  return 0;
}

}  // namespace

const KernelTable* active_table() { return table(); }

int parse_dtype(const char* s) {
  if (!s) return -1;
  if (strcmp(s, "float32") == 0) return kF32;
  if (strcmp(s, "float16") == 0) return kF16;
  if (strcmp(s, "bfloat16") == 0) return kBF16;
  if (strcmp(s, "float64") == 0) return kF64;
  return -1;
}

int64_t prefetch_bytes() {
  static const int64_t bytes = default_prefetch();
  return bytes;
}

}  // namespace cpu
}  // namespace kldiv

// ------------------------------------------------------------------------------------------ the exports
namespace kldiv {
namespace cpu {
template <bool LT>
int run_export(int want, int reduction, int nparam, void** params, int* ndims, int64_t** shapes,
               const char** dtypes, void* stream) {
  (void)stream;  // CPU: unused
  return run(want, reduction, LT, nparam, params, ndims, shapes, dtypes);
}
}  // namespace cpu
}  // namespace kldiv

#define KLDIV_CPU_EXPORTS(R, S, RID, LT) KLDIV_DEFINE_EXPORTS(kldiv::cpu::run_export, R, S, RID, LT)
KLDIV_FOR_EACH_VARIANT(KLDIV_CPU_EXPORTS)

KLDIV_EXPORT const char* KLDivLibInfo(void) {
  static char info[160];
  static std::once_flag once;
  std::call_once(once, [] {
    const kldiv::cpu::PoolLimits& pool = kldiv::cpu::pool_limits();
    snprintf(info, sizeof(info), "libkldiv_cpu abi=%d isa=%s threads=%d steer=%d prefetch=%lld libmvec=%d",
             KLDIV_ABI_VERSION, kldiv::cpu::table()->isa, pool.max_threads, pool.steer ? 1 : 0,
             static_cast<long long>(kldiv::cpu::prefetch_bytes()),
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(KLDIV_NO_LIBMVEC)
             1
#else
             0
#endif
    );
  });
  return info;
}
