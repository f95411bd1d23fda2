/* softk's compiled CPU kernels: forward p = f(z − λ) with Σp = k, and the
 * backward from the saved p, for the families that dominate real use:
 *
 *   0 softmax   f = e^u            (uncapped: p = k · softmax)
 *   1 sparsemax f = (u)_+
 *   2 entmax15  f = ((u)_+ / 2)^2
 *   3 entmax α  f = ((α−1) u)_+^{1/(α−1)}, 1 < α ≤ 2
 *   4 exp       f = min(1, e^u)    (soft top-k)
 *
 * The algorithm is in kernels_impl.h, compiled once for float and once for
 * double; kernels_loss.h adds the fused Fenchel–Young losses on top of its
 * solvers, kernels_topk_ce.h Su's sparse-softmax cross-entropy.  This file only declares the vector variants of expf/logf/powf that
 * glibc's libmvec provides, so GCC vectorises the loops that call them
 * without -ffast-math (which would break the inf/NaN row conventions).
 * Elsewhere the same code compiles to scalar calls.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__)
#define SIMD_DECL __attribute__((__simd__("notinbranch")))
SIMD_DECL float expf(float);
SIMD_DECL float logf(float);
SIMD_DECL float powf(float, float);
SIMD_DECL double exp(double);
SIMD_DECL double log(double);
SIMD_DECL double pow(double, double);
#endif

/* Inside a parallel region: this thread's share [*lo, *hi) of `rows` (the
 * whole range without OpenMP), and its index. */
static inline int thread_rows(int64_t rows, int64_t *lo, int64_t *hi)
{
    int t = 0, nt = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    nt = omp_get_num_threads();
#endif
    *lo = rows * t / nt;
    *hi = rows * (t + 1) / nt;
    return t;
}

/* The sum of the per-thread partial sums, in thread order (deterministic),
 * and the buffer freed. */
static inline double sum_parts(double *part, int nthreads)
{
    double tot = 0;
    for (int t = 0; t < nthreads; t++) tot += part[t];
    free(part);
    return tot;
}

/* Candidate buffers are processed in whole chunks of PAD entries (one or two
 * vectors) so no pow/exp falls into a scalar remainder loop. */
#define PAD 16

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SUF)

#define T float
#define SUF f32
#define EXP expf
#define LOG logf
#define POW powf
#define SQRT sqrtf
#define EPS FLT_EPSILON
#include "kernels_impl.h"
#include "kernels_loss.h"
#include "kernels_topk_ce.h"
#undef T
#undef SUF
#undef EXP
#undef LOG
#undef POW
#undef SQRT
#undef EPS

#define T double
#define SUF f64
#define EXP exp
#define LOG log
#define POW pow
#define SQRT sqrt
#define EPS DBL_EPSILON
#include "kernels_impl.h"
#include "kernels_loss.h"
#include "kernels_topk_ce.h"
