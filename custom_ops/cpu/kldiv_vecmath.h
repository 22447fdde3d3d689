// Lets GCC vectorize logf/expf/log/exp inside `#pragma omp simd` loops without -ffast-math.
//
// glibc only announces its libmvec vector variants (_ZGVdN8v_logf, ...) to the compiler under
// __FAST_MATH__, and -ffast-math would also imply -ffinite-math-only, which breaks the inf/NaN
// semantics the SPEC requires (t = -inf masks, NaN propagation). libmvec itself handles inf, NaN, 0 and
// negative arguments exactly like the scalar functions (it falls back to them for special lanes), so we
// declare the same `omp declare simd` variants glibc would, and build with -fno-math-errno
// -fno-trapping-math -fopenmp-simd and link -lmvec. Elsewhere (no glibc x86-64) the loops stay scalar.
#pragma once

#include <math.h>

#if defined(__x86_64__) && defined(__GLIBC__) && !defined(KLDIV_NO_LIBMVEC)
#define KLDIV_HAVE_LIBMVEC 1
extern "C" {
#pragma omp declare simd notinbranch
float logf(float) noexcept;
#pragma omp declare simd notinbranch
float expf(float) noexcept;
#pragma omp declare simd notinbranch
double log(double) noexcept;
#pragma omp declare simd notinbranch
double exp(double) noexcept;
}
#else
#define KLDIV_HAVE_LIBMVEC 0
#endif
