// kldiv-cxxflags(x86_64): -mavx2 -mfma -mf16c -mavx512f -mavx512dq -mavx512bw -mavx512vl -mprefer-vector-width=512
// The kernels for x86-64 CPUs with AVX-512 (F, DQ, BW, VL; Skylake-SP and later Xeons, Ice Lake and later, Zen 4):
// float32 through the 16-lane type of kldiv_simd_avx512.h, the other dtypes through `omp simd` loops on 512-bit
// vectors with libmvec's AVX-512 variants (_ZGVeN16v_logf and friends).
// Only called after kldiv_cpu.cc checked that the CPU and the OS support these instructions.
#if defined(__x86_64__)
#define KLDIV_ISA_NS isa_avx512
#define KLDIV_ISA_NAME "avx512"
#define KLDIV_TABLE_FN table_avx512
#define KLDIV_SIMD_NS simd_avx512
#include "kldiv_simd_avx512.h"
#include "kldiv_kernels.inc"
#else
#include "kldiv_cpu.h"
namespace kldiv { namespace cpu { const KernelTable* table_avx512() { return nullptr; } } }
#endif
