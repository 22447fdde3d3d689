// CUDA-on-CPU stand-in: lets g++ compile a .cu file (whose launches go through KLDIV_LAUNCH, see
// ../kldiv_launch.cuh) and run its kernels on the host, checking what a GPU would not report.
//
// Model. Blocks of a grid run one after another; a block's threads are fibers (a register-only switch on
// x86-64, ucontext elsewhere: swapcontext's signal-mask syscall made it 20x slower) scheduled
// cooperatively (a fiber runs until it waits at a barrier or a warp operation, or returns).
//   * __syncthreads() is a real barrier; a thread that returns while others wait there, or a block where
//     nobody can proceed, is a hard error.
//   * warps of 32 lanes: the *_sync warp operations exchange values only among the lanes in the mask; each
//     lane waits until every mask lane arrived at the same call (same return address); a mask lane that
//     returned, waits elsewhere or does not exist is a hard error (divergence).
//   * __shared__ variables are static locals, so they live in the .bss of the library (CUDA forbids
//     initializers on them), where nothing else is touched by kernel code: every .bss byte a kernel
//     writes counts as shared memory. Per block, a read of a shared byte no thread of the block wrote, or
//     one written by another thread with no __syncthreads() between, is a hard error; bytes ever written
//     are poisoned (0xFF: NaN) at each block start as well.
//   * global memory: every load/store of the kernel translation unit is instrumented by
//     -fsanitize=kernel-address (callbacks below); inside a kernel an address must lie in a registered
//     allocation (cudaMalloc*, or cudasim_register from a harness), in the running fiber's stack or in
//     .bss (shared memory), else hard error.
//   * streams, events, async copies/memsets/allocations are immediate host operations.
// Hard errors print "cudasim: ..." with the kernel name, block and thread, and abort: run it in a child
// process. State and functions are inline (one copy per library), so several .cu files can share it.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#if defined(__x86_64__) && !defined(CUDASIM_UCONTEXT)
#define CUDASIM_FAST_SWITCH 1
#else
#define CUDASIM_FAST_SWITCH 0
#endif

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_sim_half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static
#define CUDART_VERSION CPU-stand-in
#define CUDASIM_API extern "C" __attribute__((visibility("default"), used)) inline
#define CUDASIM_NOASAN __attribute__((no_sanitize_address, noinline))

// This library's .bss (linker-defined; -Wl,-Bsymbolic binds them to the library's own).
extern "C" char __bss_start[];
extern "C" char _end[];

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace cudasim {

#if CUDASIM_FAST_SWITCH
// cudasim_switch(save, to): push the callee-saved registers and the SSE/x87 control words, store the stack
// pointer in *save, load `to`, pop and return into the other context.
// Local to each translation unit (several .cu files may include this header).
extern "C" __attribute__((visibility("hidden"))) void cudasim_switch(void** save, void* to);
asm(R"(
  .text
  .local cudasim_switch
  .type cudasim_switch, @function
cudasim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cudasim_switch, .-cudasim_switch
)");
#endif

constexpr int kWarp = 32;
constexpr size_t kStack = 64 * 1024;

enum State { kReady, kAtBarrier, kAtWarpOp, kDone };
enum WarpOp { kShflDown, kShflUp, kShflXor, kShflIdx, kBallot, kAny, kAll };

struct Fiber {
#if CUDASIM_FAST_SWITCH
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  char* stack = nullptr;
  State state = kReady;
  uint3 tid;
  int linear = 0;
  // pending warp operation
  const void* site = nullptr;
  WarpOp op = kShflDown;
  unsigned mask = 0;
  uint64_t value = 0;
  int param = 0, width = 32;
  uint64_t result = 0;
};

struct Sim {
  std::map<uintptr_t, size_t> allocs;  // base -> bytes
  std::vector<Fiber> fibers;
#if CUDASIM_FAST_SWITCH
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  Fiber* cur = nullptr;
  const char* kernel = nullptr;
  bool in_kernel = false;
  bool checking = false;
  uintptr_t params = 0;
  size_t params_size = 0;
  int nthreads = 0, done = 0, at_barrier = 0;
  uint3 block;
  uint32_t epoch = 0;  // barrier generation within the block
  std::vector<int32_t> sh_writer;  // per .bss byte: writing thread in this block, -1 unwritten
  std::vector<uint32_t> sh_epoch;
  std::vector<uint8_t> sh_ever;    // per .bss byte: ever written by a kernel (poisoned at block start)
  int sms = 2;
  bool reverse = false;  // resume ready threads from the last one down (another legal schedule)
  void (*entry)(void*) = nullptr;
  void* entry_arg = nullptr;
};

inline Sim g;
// The built-in variables, one struct so the bounds check can let kernels read it.
struct Builtins {
  uint3 threadIdx, blockIdx;
  dim3 blockDim, gridDim;
};
inline Builtins bi;

[[noreturn]] inline void fail(const char* what) {
  fprintf(stderr, "cudasim: %s", what);
  if (g.in_kernel && g.cur)
    fprintf(stderr, " [kernel %s, block (%u,%u,%u), thread (%u,%u,%u)]", g.kernel, g.block.x, g.block.y, g.block.z,
            g.cur->tid.x, g.cur->tid.y, g.cur->tid.z);
  else if (g.in_kernel)
    fprintf(stderr, " [kernel %s, block (%u,%u,%u)]", g.kernel, g.block.x, g.block.y, g.block.z);
  fprintf(stderr, "\n");
  fflush(stderr);
  abort();
}

// The stand-in's own code (instrumented std:: containers included) is not checked.
struct SimCode {
  bool was;
  __attribute__((no_sanitize_address, always_inline)) SimCode() : was(g.checking) { g.checking = true; }
  __attribute__((no_sanitize_address, always_inline)) ~SimCode() { g.checking = was; }
};

CUDASIM_NOASAN inline void to_scheduler(Fiber* f) {
#if CUDASIM_FAST_SWITCH
  cudasim_switch(&f->sp, g.sched_sp);
#else
  swapcontext(&f->ctx, &g.sched);
#endif
}

CUDASIM_NOASAN inline void yield_to_scheduler() {
  Fiber* f = g.cur;
  to_scheduler(f);
  bi.threadIdx = f->tid;  // the scheduler ran others meanwhile
}

// ------------------------------------------------------------------------------------------ memory checks
inline size_t shared_bytes() { return (size_t)(_end - __bss_start); }

CUDASIM_NOASAN inline void check_access(uintptr_t a, size_t n, bool store) {
  if (!g.in_kernel || !g.cur || g.checking) return;  // host code, or the checker's own std:: calls
  SimCode guard;
  char buf[512];
  const uintptr_t sh = (uintptr_t)__bss_start;
  if (a >= sh && a + n <= sh + shared_bytes()) {
    for (size_t i = a - sh; i < a - sh + n; ++i) {
      if (store) {
        g.sh_writer[i] = g.cur->linear;
        g.sh_epoch[i] = g.epoch;
        g.sh_ever[i] = 1;
      } else if (g.sh_writer[i] < 0) {
        snprintf(buf, sizeof buf, "read of unwritten shared memory (.bss byte %zu)", i);
        fail(buf);
      } else if (g.sh_writer[i] != g.cur->linear && g.sh_epoch[i] == g.epoch) {
        snprintf(buf, sizeof buf,
                 "shared memory race: byte %zu written by thread %d and read by thread %d with no "
                 "__syncthreads() between",
                 i, g.sh_writer[i], g.cur->linear);
        fail(buf);
      }
    }
    return;
  }
  // the launch's argument tuple, read while the kernel's parameters are initialized (constant bank on a GPU)
  if (!store && a >= (uintptr_t)&bi && a + n <= (uintptr_t)&bi + sizeof bi) return;
  if (!store && a >= g.params && a + n <= g.params + g.params_size) return;
  const uintptr_t st = (uintptr_t)g.cur->stack;
  if (a >= st && a + n <= st + kStack) return;
  auto it = g.allocs.upper_bound(a);
  if (it != g.allocs.begin()) {
    --it;
    if (a >= it->first && a + n <= it->first + it->second) return;
  }
  const char* where = "";
  for (auto& f : g.fibers)
    if (a >= (uintptr_t)f.stack && a < (uintptr_t)f.stack + kStack) where = ", in another thread's stack";
  snprintf(buf, sizeof buf, "out-of-bounds %s of %zu bytes at %p (no registered allocation holds it%s)",
           store ? "write" : "read", n, (void*)a, where);
  fail(buf);
}

// ------------------------------------------------------------------------------------------ scheduling
CUDASIM_NOASAN inline void release_barrier() {
  for (auto& f : g.fibers)
    if (f.state == kAtBarrier) f.state = kReady;
  g.at_barrier = 0;
  ++g.epoch;
}

CUDASIM_NOASAN inline void fiber_main() {
  Fiber* f = g.cur;
  bi.threadIdx = f->tid;
  g.checking = false;
  g.entry(g.entry_arg);
  g.checking = true;
  f->state = kDone;
  ++g.done;
  if (g.at_barrier) {
    char buf[256];
    snprintf(buf, sizeof buf, "thread returned while %d thread(s) wait at __syncthreads()", g.at_barrier);
    fail(buf);
  }
  // A warp mate waiting for this lane can never be released.
  const int w = f->linear / kWarp, lane = f->linear % kWarp;
  for (int l = 0; l < kWarp; ++l) {
    const int i = w * kWarp + l;
    if (i >= g.nthreads) break;
    const Fiber& o = g.fibers[i];
    if (o.state == kAtWarpOp && (o.mask >> lane & 1u)) {
      char buf[256];
      snprintf(buf, sizeof buf,
               "divergence: lane %d returned while lane %d waits at a warp operation whose mask 0x%08x names it",
               lane, l, o.mask);
      fail(buf);
    }
  }
  to_scheduler(f);  // never resumed
}

CUDASIM_NOASAN inline void diagnose_deadlock() {
  char buf[1024];
  for (auto& f : g.fibers) {
    if (f.state != kAtWarpOp) continue;
    const int w = f.linear / kWarp;
    for (int l = 0; l < kWarp; ++l) {
      if (!(f.mask >> l & 1u)) continue;
      const int i = w * kWarp + l;
      const Fiber& o = g.fibers[i];
      if (o.state == kAtWarpOp && o.site == f.site) continue;
      g.cur = &f;
      snprintf(buf, sizeof buf,
               "divergence: warp operation with mask 0x%08x waits for lane %d (thread %d), which %s", f.mask, l, i,
               o.state == kAtBarrier ? "waits at __syncthreads()" : "waits at a different warp operation");
      fail(buf);
    }
  }
  g.cur = nullptr;
  snprintf(buf, sizeof buf, "deadlock: %d of %d threads wait at __syncthreads(), the others elsewhere", g.at_barrier,
           g.nthreads - g.done);
  fail(buf);
}

CUDASIM_NOASAN inline void run_block(uint3 b, dim3 grid, dim3 block) {
  g.block = b;
  bi.blockIdx = b;
  g.nthreads = (int)(block.x * block.y * block.z);
  if (g.fibers.size() < (size_t)g.nthreads) g.fibers.resize(g.nthreads);
  g.done = g.at_barrier = 0;
  g.epoch = 0;
  const size_t sb = shared_bytes();
  if (g.sh_ever.size() != sb) g.sh_ever.assign(sb, 0);
  for (size_t i = 0; i < sb; ++i)
    if (g.sh_ever[i]) __bss_start[i] = (char)0xFF;
  g.sh_writer.assign(sb, -1);
  g.sh_epoch.assign(sb, 0);
  for (int i = 0; i < g.nthreads; ++i) {
    Fiber& f = g.fibers[i];
    if (!f.stack) f.stack = static_cast<char*>(malloc(kStack));
    f.state = kReady;
    f.linear = i;
    f.tid = uint3{(unsigned)(i % block.x), (unsigned)(i / block.x % block.y), (unsigned)(i / (block.x * block.y))};
#if CUDASIM_FAST_SWITCH
    // Initial frame, popped by cudasim_switch: control words, six registers, then fiber_main as the return
    // address (16-byte aligned slot, so fiber_main starts with the stack alignment of a called function).
    uintptr_t top = ((uintptr_t)f.stack + kStack - 64) & ~(uintptr_t)15;
    void** sp = reinterpret_cast<void**>(top);
    sp[1] = nullptr;  // fake return address of fiber_main
    sp[0] = reinterpret_cast<void*>(&fiber_main);
    for (int r = 1; r <= 6; ++r) sp[-r] = nullptr;
    uint32_t cw[2] = {0x1F80u, 0x037Fu};  // default MXCSR and x87 control word
    memcpy(&sp[-7], cw, 8);
    f.sp = &sp[-7];
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
#endif
  }
  (void)grid;
  while (g.done < g.nthreads) {
    bool progress = false;
    for (int k = 0; k < g.nthreads; ++k) {
      Fiber& f = g.fibers[g.reverse ? g.nthreads - 1 - k : k];
      if (f.state != kReady) continue;
      progress = true;
      g.cur = &f;
#if CUDASIM_FAST_SWITCH
      cudasim_switch(&g.sched_sp, f.sp);
#else
      swapcontext(&g.sched, &f.ctx);
#endif
      g.cur = nullptr;
    }
    if (!progress) diagnose_deadlock();
  }
  bi.threadIdx = uint3{0, 0, 0};
}

template <typename... P> struct Launch {
  void (*kernel)(P...);
  const char* name;
  dim3 grid, block;
  template <typename... A> void operator()(A&&... a) {
    std::tuple<P...> args(std::forward<A>(a)...);
    run(&args);
  }
  CUDASIM_NOASAN static void thunk(void* p) {
    auto* self = static_cast<std::pair<Launch*, std::tuple<P...>*>*>(p);
    std::apply(self->first->kernel, *self->second);
  }
  CUDASIM_NOASAN void run(std::tuple<P...>* args) {
    if (block.x * block.y * block.z == 0 || block.x * block.y * block.z > 1024 || grid.x == 0 || grid.y == 0 ||
        grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
      char buf[256];
      snprintf(buf, sizeof buf, "invalid launch of %s: grid (%u,%u,%u), block (%u,%u,%u)", name, grid.x, grid.y,
               grid.z, block.x, block.y, block.z);
      fail(buf);
    }
    std::pair<Launch*, std::tuple<P...>*> ctx(this, args);
    g.kernel = name;
    g.entry = &Launch::thunk;
    g.entry_arg = &ctx;
    g.params = (uintptr_t)args;
    g.params_size = sizeof(*args);
    bi.gridDim = grid;
    bi.blockDim = block;
    g.in_kernel = true;
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) run_block(uint3{x, y, z}, grid, block);
    g.in_kernel = false;
  }
};

template <typename... P>
Launch<P...> launch(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t, void (*k)(P...)) {
  if (smem) fail("dynamic shared memory is not supported by the stand-in");
  return Launch<P...>{k, name, grid, block};
}

// ------------------------------------------------------------------------------------------ warp operations
template <typename T> inline uint64_t bits(T v) {
  static_assert(sizeof(T) <= 8, "warp operations exchange at most 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T> inline T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}

CUDASIM_NOASAN inline uint64_t warp_op(const void* site, WarpOp op, unsigned mask, uint64_t value, int param,
                                       int width) {
  SimCode guard;
  Fiber* f = g.cur;
  if (!g.in_kernel || !f) fail("warp operation outside a kernel");
  const int w = f->linear / kWarp, lane = f->linear % kWarp;
  char buf[256];
  if (!(mask >> lane & 1u)) {
    snprintf(buf, sizeof buf, "warp operation by lane %d whose mask 0x%08x does not name it", lane, mask);
    fail(buf);
  }
  const int nlanes = g.nthreads - w * kWarp < kWarp ? g.nthreads - w * kWarp : kWarp;
  if (nlanes < kWarp && (mask >> nlanes)) {
    snprintf(buf, sizeof buf, "warp operation mask 0x%08x names lanes past the block's %d-lane last warp", mask,
             nlanes);
    fail(buf);
  }
  if (width <= 0 || width > kWarp || (width & (width - 1))) fail("warp operation width not a power of 2 <= 32");
  f->site = site;
  f->op = op;
  f->mask = mask;
  f->value = value;
  f->param = param;
  f->width = width;
  f->state = kAtWarpOp;
  Fiber* lanes = &g.fibers[w * kWarp];
  bool all = true;
  for (int l = 0; l < kWarp && all; ++l) {
    if (!(mask >> l & 1u)) continue;
    const Fiber& o = lanes[l];
    if (o.state == kDone) {
      snprintf(buf, sizeof buf, "divergence: warp operation mask 0x%08x names lane %d, which has returned", mask, l);
      fail(buf);
    }
    all = o.state == kAtWarpOp && o.site == site;
    if (all && (o.mask != mask || o.op != op)) {
      snprintf(buf, sizeof buf, "divergence: lanes %d and %d meet at one warp operation with masks 0x%08x, 0x%08x",
               lane, l, mask, o.mask);
      fail(buf);
    }
  }
  if (all) {
    unsigned vote = 0;
    for (int l = 0; l < kWarp; ++l)
      if ((mask >> l & 1u) && lanes[l].value) vote |= 1u << l;
    for (int l = 0; l < kWarp; ++l) {
      if (!(mask >> l & 1u)) continue;
      Fiber& o = lanes[l];
      const int base = l & ~(o.width - 1);
      int src = l;
      switch (op) {
        case kShflDown: src = (l - base) + o.param < o.width ? l + o.param : l; break;
        case kShflUp: src = (l - base) - o.param >= 0 ? l - o.param : l; break;
        case kShflXor: src = (l ^ o.param) - base < o.width && (l ^ o.param) >= base ? l ^ o.param : l; break;
        case kShflIdx: src = base + (o.param & (o.width - 1)); break;
        default: break;
      }
      if (op <= kShflIdx) {
        if (!(mask >> src & 1u)) {
          g.cur = &o;
          snprintf(buf, sizeof buf, "shuffle reads lane %d, which the mask 0x%08x does not name", src, mask);
          fail(buf);
        }
        o.result = lanes[src].value;
      } else if (op == kBallot) {
        o.result = vote;
      } else if (op == kAny) {
        o.result = vote != 0;
      } else {
        o.result = vote == mask;
      }
      o.state = kReady;
    }
    f->state = kReady;  // keep running this lane: the others resume in scheduler order
    return f->result;
  }
  yield_to_scheduler();
  return f->result;
}

}  // namespace cudasim

#define threadIdx (::cudasim::bi.threadIdx)
#define blockIdx (::cudasim::bi.blockIdx)
#define blockDim (::cudasim::bi.blockDim)
#define gridDim (::cudasim::bi.gridDim)

#define CUDASIM_SITE __builtin_return_address(0)

CUDASIM_NOASAN inline void __syncthreads() {
  using namespace cudasim;
  SimCode guard;
  Fiber* f = g.cur;
  if (!g.in_kernel || !f) fail("__syncthreads() outside a kernel");
  if (g.done) {
    char buf[128];
    snprintf(buf, sizeof buf, "__syncthreads() reached after %d thread(s) of the block returned", g.done);
    fail(buf);
  }
  f->state = kAtBarrier;
  if (++g.at_barrier == g.nthreads) {
    release_barrier();
    return;
  }
  yield_to_scheduler();
}

template <typename T> CUDASIM_NOASAN inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int w = 32) {
  return cudasim::from_bits<T>(cudasim::warp_op(CUDASIM_SITE, cudasim::kShflDown, mask, cudasim::bits(v), (int)d, w));
}
template <typename T> CUDASIM_NOASAN inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int w = 32) {
  return cudasim::from_bits<T>(cudasim::warp_op(CUDASIM_SITE, cudasim::kShflUp, mask, cudasim::bits(v), (int)d, w));
}
template <typename T> CUDASIM_NOASAN inline T __shfl_xor_sync(unsigned mask, T v, int m, int w = 32) {
  return cudasim::from_bits<T>(cudasim::warp_op(CUDASIM_SITE, cudasim::kShflXor, mask, cudasim::bits(v), m, w));
}
template <typename T> CUDASIM_NOASAN inline T __shfl_sync(unsigned mask, T v, int src, int w = 32) {
  return cudasim::from_bits<T>(cudasim::warp_op(CUDASIM_SITE, cudasim::kShflIdx, mask, cudasim::bits(v), src, w));
}
CUDASIM_NOASAN inline unsigned __ballot_sync(unsigned mask, int p) {
  return (unsigned)cudasim::warp_op(CUDASIM_SITE, cudasim::kBallot, mask, p != 0, 0, 32);
}
CUDASIM_NOASAN inline int __any_sync(unsigned mask, int p) {
  return (int)cudasim::warp_op(CUDASIM_SITE, cudasim::kAny, mask, p != 0, 0, 32);
}
CUDASIM_NOASAN inline int __all_sync(unsigned mask, int p) {
  return (int)cudasim::warp_op(CUDASIM_SITE, cudasim::kAll, mask, p != 0, 0, 32);
}

// ------------------------------------------------------------------------------------------ runtime API
inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = malloc(n ? n : 1);
  if (!*p) return cudaErrorMemoryAllocation;
  memset(*p, 0xFF, n);  // fresh device memory is garbage, not zeros
  cudasim::g.allocs[(uintptr_t)*p] = n;
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  auto it = cudasim::g.allocs.find((uintptr_t)p);
  if (it == cudasim::g.allocs.end()) cudasim::fail("cudaFree of a pointer cudaMalloc did not return");
  cudasim::g.allocs.erase(it);
  free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  cudasim::g.in_kernel = true;  // check the range like a kernel store would
  cudasim::Fiber f{};
  cudasim::g.cur = &f;
  cudasim::check_access((uintptr_t)p, n, true);
  cudasim::g.cur = nullptr;
  cudasim::g.in_kernel = false;
  memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) { return cudaMemsetAsync(p, v, n); }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
  memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k) { return cudaMemcpyAsync(d, s, n, k); }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrMultiProcessorCount ? cudasim::g.sms : 0;
  return cudaSuccess;
}
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }

// ------------------------------------------------------------------------------------------ harness hooks
// Host buffers the harness hands to the kernels count as device allocations.
CUDASIM_API void cudasim_register(void* p, size_t n) { cudasim::g.allocs[(uintptr_t)p] = n; }
CUDASIM_API void cudasim_unregister(void* p) { cudasim::g.allocs.erase((uintptr_t)p); }
CUDASIM_API void cudasim_set_sms(int n) { cudasim::g.sms = n; }
CUDASIM_API void cudasim_set_reverse(int r) { cudasim::g.reverse = r != 0; }
CUDASIM_API int cudasim_live_allocations(void) { return (int)cudasim::g.allocs.size(); }

// -fsanitize=kernel-address callbacks (the _noabort names: kernel-address recovers by default).
#define CUDASIM_ASAN(N)                                                                                   \
  CUDASIM_API CUDASIM_NOASAN void __asan_load##N##_noabort(uintptr_t a) { cudasim::check_access(a, N, false); } \
  CUDASIM_API CUDASIM_NOASAN void __asan_store##N##_noabort(uintptr_t a) { cudasim::check_access(a, N, true); } \
  CUDASIM_API CUDASIM_NOASAN void __asan_load##N(uintptr_t a) { cudasim::check_access(a, N, false); }           \
  CUDASIM_API CUDASIM_NOASAN void __asan_store##N(uintptr_t a) { cudasim::check_access(a, N, true); }
CUDASIM_ASAN(1)
CUDASIM_ASAN(2)
CUDASIM_ASAN(4)
CUDASIM_ASAN(8)
CUDASIM_ASAN(16)
CUDASIM_API CUDASIM_NOASAN void __asan_loadN_noabort(uintptr_t a, size_t n) { cudasim::check_access(a, n, false); }
CUDASIM_API CUDASIM_NOASAN void __asan_storeN_noabort(uintptr_t a, size_t n) { cudasim::check_access(a, n, true); }
CUDASIM_API CUDASIM_NOASAN void __asan_loadN(uintptr_t a, size_t n) { cudasim::check_access(a, n, false); }
CUDASIM_API CUDASIM_NOASAN void __asan_storeN(uintptr_t a, size_t n) { cudasim::check_access(a, n, true); }
CUDASIM_API CUDASIM_NOASAN void __asan_handle_no_return(void) {}
CUDASIM_API CUDASIM_NOASAN void __asan_before_dynamic_init(const char*) {}
CUDASIM_API CUDASIM_NOASAN void __asan_after_dynamic_init(void) {}
