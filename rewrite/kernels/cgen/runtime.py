"""The C every artifact holds once, before its kernels: the runtime (the BLAS entry points handed over
at load time, the step runner) and the declarations of the vectorizable math functions."""
from __future__ import annotations

from .core import VERSION


# Math functions with vector variants in libmvec (declared `omp declare simd` below).
_MATH = ("exp", "log", "tanh", "sin", "cos", "erf", "expm1", "log1p", "pow")

RUNTIME = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
typedef int (*rw_kernel)(void **);
typedef void (*rw_sgemm_t)(const char *, const char *, const int *, const int *, const int *, const float *,
                           const float *, const int *, const float *, const int *, const float *, float *, const int *);
typedef void (*rw_dgemm_t)(const char *, const char *, const int *, const int *, const int *, const double *,
                           const double *, const int *, const double *, const int *, const double *, double *,
                           const int *);
typedef void (*rw_sgemm_compute_t)(int, int, int, int, int, int, const float *, int, const float *, int, float,
                                   float *, int);
static rw_sgemm_t rw_sgemm;
static rw_dgemm_t rw_dgemm;
static rw_sgemm_compute_t rw_sgemm_compute;
/* The BLAS entry points ATen uses, handed over by the loader: no link-time dependency on torch. */
int rw_init(void **symbols) {
  rw_sgemm = (rw_sgemm_t)symbols[0]; rw_dgemm = (rw_dgemm_t)symbols[1];
  rw_sgemm_compute = (rw_sgemm_compute_t)symbols[2];
  return %d;
}
/* Runs a table of steps: [kernel, n, p0 .. pn-1, kernel, n, ...]; returns 0 or (step + 1) | code << 32. */
long long rw_run(void **t, long long steps) {
  long long at = 0;
  for (long long i = 0; i < steps; i++) {
    rw_kernel k = (rw_kernel)t[at];
    long long n = (long long)(intptr_t)t[at + 1];
    int rc = k(t + at + 2);
    if (rc) return (i + 1) | ((long long)rc << 32);
    at += 2 + n;
  }
  return 0;
}
""" % VERSION

MATH_DECLARATIONS = "".join(
    f"#pragma omp declare simd notinbranch\nfloat {f}f(float{', float' if f == 'pow' else ''});\n"
    f"#pragma omp declare simd notinbranch\ndouble {f}(double{', double' if f == 'pow' else ''});\n" for f in _MATH)
