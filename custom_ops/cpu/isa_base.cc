// kldiv-cxxflags(any):
// The kernels for any x86-64 (SSE2; libmvec's SSE variants) or other architecture (scalar math calls).
#define KLDIV_ISA_NS isa_base
#define KLDIV_ISA_NAME "baseline"
#define KLDIV_TABLE_FN table_base
#include "kldiv_kernels.inc"
