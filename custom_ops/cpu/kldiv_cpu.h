// Internal interface between the CPU library's front end (kldiv_cpu.cc: ABI exports, shape handling, ISA choice;
// distill_cpu.cc) and its per-ISA kernel translation units (isa_*.cc including kldiv_kernels.inc). The thread pool
// is kldiv_pool.h's.
//
// Only plain structs and C function pointers cross this boundary: the ISA units are compiled with
// different -m flags, and any inline C++ template shared between them (std::function, std::vector, ...)
// could be merged by the linker into the wrong ISA's copy.
#pragma once

#include <stdint.h>

#include "kldiv_pool.h"  // parallel_run, threads_for
#include "../common/sparse_math.h"  // sparse::Hyper

namespace kldiv {
namespace cpu {

constexpr int kMaxDims = 32;

enum DType : int { kF16 = 0, kBF16 = 1, kF32 = 2, kF64 = 3 };

// The broadcast iteration space after merging adjacent dimensions that broadcast alike.
// Dimension nd-1 is innermost; its strides are 0 (broadcast) or 1 (contiguous).
struct Plan {
  int nd;
  int64_t size[kMaxDims];
  int64_t xs[kMaxDims];  // element stride of x in each dim (0 where x is broadcast)
  int64_t ts[kMaxDims];  // element stride of t
  int64_t n;             // elements of the broadcast shape
  int64_t nx, nt;        // elements of x and of t
  bool x_reduced, t_reduced;  // the operand is smaller than the broadcast shape (its gradient is summed)
};

struct Args {
  const Plan* plan;
  int dtype;        // DType
  bool log_target;
  int reduction;    // kldiv::Reduction
  double scale;     // reduction scale s (1, 1/numel, 1/batch, or NaN for an empty mean/batchmean)
  int want;         // backward: 1 = dx only, 2 = dt only, 3 = both in one pass
  const void* x;
  const void* t;
  const void* dout;  // backward only
  void* out;         // forward output
  void* dx;          // backward outputs
  void* dt;
  int64_t prefetch;  // bytes ahead the forward sum's float32 vector loop prefetches its operands; 0 = off
};

// One row of the head's hard-label term (distill_math.h; distill_kernels.inc's hard_row): its cross-entropy is
// returned and d = ds + coef * its gradient written (d may be ds). s, ds, d: `v` elements of DType `dtype`.
struct HardOptions {
  double z_loss, smoothing;
  distill::Transform f;
};
struct HardRow {
  const void* s;
  const void* ds;
  void* d;
  int dtype;
  int64_t v, label;
  float coef;
  const HardOptions* o;
};

// One call of the fused distillation kernels (custom_ops/common/distill_abi.h; distill_kernels.inc).
struct DistillJob {
  int dtype;              // DType (not kF64)
  int64_t rows, vocab;
  float inv_t, t, t_sq;   // 1/T, T, T^2
  int kind;               // distill::kind_of(beta, divergence code)
  float beta, log_beta, log_1m_beta;
  distill::Mix<float> mix;     // class_terms' constants
  distill::Transform f;        // soft cap / scale of both models' logits
  const void* s;
  const void* t_logits;
  int op;                 // distill::Op: which export (forward, a backward, or a vocabulary-parallel piece)
  float* stats;           // forward output / backward input, [rows, distill::kStats]
  const float* given;     // kGiven: the merged normalizers, [rows, distill::kStats]
  const float* dloss;     // backward only (null: forward)
  void* ds;               // backward outputs (either may be null, not both)
  void* dt;
};

// One call of the fused stored-teacher kernels (custom_ops/common/sparse_abi.h; sparse_kernels.inc).
struct SparseJob {
  int dtype;              // DType of the student logits (not kF64)
  int64_t rows, vocab, k;
  sparse::Hyper h;
  const void* s;
  const int32_t* ids;     // [rows, k], negative: padding
  const float* vals;      // [rows, k]
  float* stats;           // forward output / backward input, [rows, sparse::kStats]
  const float* dloss;     // backward only (null: forward)
  void* ds;               // backward output
};

struct KernelTable {
  const char* isa;
  void (*forward)(const Args*);
  void (*backward)(const Args*);
  void (*distill_rows)(const DistillJob*, int64_t r0, int64_t r1);  // rows [r0, r1) of a distillation call
  void (*sparse_rows)(const SparseJob*, int64_t r0, int64_t r1);    // rows [r0, r1) of a stored-teacher call
  double (*hard_row)(const HardRow*);                                // one row of the head's hard-label term
};

// distill_cpu.cc, for the front ends that run the distillation kernels (distill_cpu.cc, head_cpu.cc): a job's
// constants from the kernels' float64 hyper (temperature, beta, divergence code, alpha, soft cap, logit scale),
// and its rows split over the pool.
void init_distill_job(const double* hyper, DistillJob* j);
void run_distill_job(const DistillJob& j);

// hard_cpu.cc, for the front ends that compute the head's hard-label term (hard_cpu.cc's DistillHard, head_cpu.cc):
// its options from a float64 hyper (the soft cap and logit scale at 4 and 5, the others where given), and one
// float32 row's cross-entropy, its gradient times coef added onto d in place.
HardOptions hard_options(const double* hyper, int z_loss_at, int smoothing_at);
double hard_row(const float* s, int64_t v, int64_t label, const HardOptions& o, float coef, float* d);

// The table picked for this CPU (once, from cpuid; MS_KLDIV_ISA forces one).
const KernelTable* active_table();
// The DType of a MindSpore dtype name ("float32", ...), -1 for any other (front ends only: kldiv_cpu.cc).
int parse_dtype(const char* s);
// Args::prefetch for this CPU (once; MS_KLDIV_PREFETCH=<bytes> sets it).
int64_t prefetch_bytes();

// kldiv_diagnostics.cc, in the diagnostics build only: the front end records the span of each call that returned 0
// (KLDivTakeLastSpan). Declared unconditionally: a unit whose text (headers included) never names the diagnostics
// macro compiles without it, and its object is shared with the product build (ms_kldiv/_build.py).
int64_t monotonic_ns();
void record_span(int64_t start_ns, int64_t end_ns);

const KernelTable* table_base();
const KernelTable* table_avx2();
const KernelTable* table_avx512();

}  // namespace cpu
}  // namespace kldiv
