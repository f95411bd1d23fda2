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
 * solvers, kernels_topk_ce.h Su's sparse-softmax cross-entropy.  This file
 * declares the vector variants of expf/logf/powf that glibc's libmvec
 * provides, so GCC vectorises the loops that call them without -ffast-math
 * (which would break the inf/NaN row conventions); elsewhere the same code
 * compiles to scalar calls.  It also holds the AVX2 gather of float rows'
 * candidates (portable code elsewhere).
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

#if defined(__AVX2__)
#include <immintrin.h>
/* Candidates of one float block of 32 (z[j] − m > lam) appended to
 * (val, idx) from c, branch-free: 4 entries at a time, the set lanes moved
 * to the front by a permutation looked up from the compare's 4-bit mask
 * (LANES[mask]: the set lanes' numbers, one a byte), all 4 stored and c
 * advanced by the count.  Stores reach 3 slots past the last candidate:
 * val and idx have PAD spare slots.  Returns the new c. */
static const uint32_t LANES[16] = {0, 0x00, 0x01, 0x0100, 0x02, 0x0200, 0x0201, 0x020100,
                                   0x03, 0x0300, 0x0301, 0x030100, 0x0302, 0x030200, 0x030201, 0x03020100};
static inline int64_t gather_block_avx2(const float *z, int64_t i0, float m, float lam, float *val,
                                        int64_t *idx, int64_t c)
{
    __m128 vm = _mm_set1_ps(m), vl = _mm_set1_ps(lam);
    for (int g = 0; g < 32; g += 4) {
        __m128 v = _mm_sub_ps(_mm_loadu_ps(z + g), vm);
        int mask = _mm_movemask_ps(_mm_cmp_ps(v, vl, _CMP_GT_OQ));
        __m128i perm = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)LANES[mask]));
        _mm_storeu_ps(val + c, _mm_permutevar_ps(v, perm));
        __m128i at = _mm_add_epi32(perm, _mm_set1_epi32((int)g));
        __m256i at64 = _mm256_add_epi64(_mm256_cvtepi32_epi64(at), _mm256_set1_epi64x(i0));
        _mm256_storeu_si256((__m256i *)(idx + c), at64);
        c += __builtin_popcount((unsigned)mask);
    }
    return c;
}
#endif

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
#if defined(__AVX2__)
#define GATHER_AVX2 1 /* float rows gather with gather_block_avx2 */
#else
#define GATHER_AVX2 0
#endif
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
#undef GATHER_AVX2
#define GATHER_AVX2 0
#include "kernels_impl.h"
#include "kernels_loss.h"
#include "kernels_topk_ce.h"
