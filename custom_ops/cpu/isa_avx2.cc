// kldiv-cxxflags(x86_64): -mavx2 -mfma -mf16c
// The kernels for x86-64 CPUs with AVX2 and FMA: float32 through the 8-lane type of kldiv_simd_avx2.h,
// the other dtypes through `omp simd` loops with libmvec (_ZGVdN8v_logf and friends).
// Only called after kldiv_cpu.cc checked the CPU supports these instructions.
#if defined(__x86_64__)
#define KLDIV_ISA_NS isa_avx2
#define KLDIV_ISA_NAME "avx2"
#define KLDIV_TABLE_FN table_avx2
#define KLDIV_SIMD_NS simd_avx2
#include "kldiv_simd_avx2.h"
#include "kldiv_kernels.inc"
#else
#include "kldiv_cpu.h"
namespace kldiv { namespace cpu { const KernelTable* table_avx2() { return nullptr; } } }
#endif
