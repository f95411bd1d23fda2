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

/* Candidate indices: a row's candidates are gathered as (value, index)
 * pairs, and 4-byte indices halve what the gather stores.  Rows of the
 * zero-below families therefore hold at most CIDX_MAX entries; the entry
 * points refuse longer ones (softk sends them to its tensor code). */
typedef int32_t cidx_t;
#define CIDX_MAX INT32_MAX

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
                                        cidx_t *idx, int64_t c)
{
    __m128 vm = _mm_set1_ps(m), vl = _mm_set1_ps(lam);
    for (int g = 0; g < 32; g += 4) {
        __m128 v = _mm_sub_ps(_mm_loadu_ps(z + g), vm);
        int mask = _mm_movemask_ps(_mm_cmp_ps(v, vl, _CMP_GT_OQ));
        __m128i perm = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)LANES[mask]));
        _mm_storeu_ps(val + c, _mm_permutevar_ps(v, perm));
        _mm_storeu_si128((__m128i *)(idx + c), _mm_add_epi32(perm, _mm_set1_epi32((int)(i0 + g))));
        c += __builtin_popcount((unsigned)mask);
    }
    return c;
}
#if defined(__AVX512F__)
/* Which of the 16 floats at z the gather takes, z − m > lam, with v = z − m:
 * one function for gather_block_avx512 and place_block_avx512, so that the
 * two agree entry for entry. */
static inline __mmask16 taken16_avx512(const float *z, __m512 vm, __m512 vl, __m512 *v)
{
    *v = _mm512_sub_ps(_mm512_loadu_ps(z), vm);
    return _mm512_cmp_ps_mask(*v, vl, _CMP_GT_OQ);
}

/* The same for AVX-512: 16 entries at a time, the set lanes packed by the
 * compress instructions (into a register, then one unaligned store: a
 * compressing store to memory is slow on some cores).  Stores reach 15
 * slots past the last candidate: val and idx have PAD = 16 spare slots. */
static inline int64_t gather_block_avx512(const float *z, int64_t i0, float m, float lam, float *val,
                                          cidx_t *idx, int64_t c)
{
    __m512 vm = _mm512_set1_ps(m), vl = _mm512_set1_ps(lam);
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int g = 0; g < 32; g += 16) {
        __m512 v;
        __mmask16 mask = taken16_avx512(z + g, vm, vl, &v);
        _mm512_storeu_ps(val + c, _mm512_maskz_compress_ps(mask, v));
        __m512i at = _mm512_add_epi32(lanes, _mm512_set1_epi32((int)(i0 + g)));
        _mm512_storeu_si512((void *)(idx + c), _mm512_maskz_compress_epi32(mask, at));
        c += __builtin_popcount((unsigned)mask);
    }
    return c;
}
#define gather_block_avx2 gather_block_avx512

/* The set lanes of a compare's mask, counted in 64 bits: GCC counts an
 * __mmask16 with a 16-bit popcnt into the low word of the register that
 * held the running count, which merges with it and puts the count on the
 * loop's carried chain (a few cycles a group, in loops of one group's work
 * each). */
static inline int64_t popcount16(__mmask16 mask)
{
    uint64_t m = _cvtmask16_u32(mask);
    __asm__("" : "+r"(m)); /* opaque: else GCC narrows the count to 16 bits again */
    return __builtin_popcountll(m);
}

/* gather_block_avx512 without the indices, for entmax α's forward, which
 * needs none: the index half of the gather (its compress and its store,
 * which with c at any offset splits across two cache lines) cost as much
 * as the rest of it.  *taken gets the block's 32 compares, by which
 * place_taken_avx512 puts p back. */
static inline int64_t gather_vals_avx512(const float *z, float m, float lam, float *val, int64_t c,
                                         uint32_t *taken)
{
    __m512 vm = _mm512_set1_ps(m), vl = _mm512_set1_ps(lam);
    uint32_t both = 0;
    for (int g = 0; g < 32; g += 16) {
        __m512 v;
        __mmask16 mask = taken16_avx512(z + g, vm, vl, &v);
        _mm512_storeu_ps(val + c, _mm512_maskz_compress_ps(mask, v));
        c += popcount16(mask);
        both |= (uint32_t)_cvtmask16_u32(mask) << g;
    }
    *taken = both;
    return c;
}

/* place_block_avx512 from the masks gather_vals_avx512 kept (taken: the
 * block's 32 compares), without the row's entries: the same entries, as
 * they are the same compares. */
static inline int64_t place_taken_avx512(uint32_t taken, const float *pv, float *p, int64_t j)
{
    for (int g = 0; g < 32; g += 16) {
        __mmask16 mask = _cvtu32_mask16((taken >> g) & 0xffff);
        _mm512_storeu_ps(p + g, _mm512_maskz_expand_ps(mask, _mm512_loadu_ps(pv + j)));
        j += popcount16(mask);
    }
    return j;
}

/* The inverse of gather_block_avx512, for write_zero_below: the block's 32
 * entries of p written whole, the candidates' p (pv[j], pv[j + 1], ... in
 * the gather's order) at the entries the gather took (the same compare, so
 * the same entries) and 0 at the others, 16 at a time by the expand
 * instruction.  Loads reach 15 slots past the last candidate: pv has PAD
 * spare slots.  Returns the new j.  Where the candidates are many (entmax α
 * with α well below 2), a row written this way costs less than zeroing it
 * and storing each candidate's p at its index. */
static inline int64_t place_block_avx512(const float *z, float m, float lam, const float *pv, float *p, int64_t j)
{
    __m512 vm = _mm512_set1_ps(m), vl = _mm512_set1_ps(lam);
    for (int g = 0; g < 32; g += 16) {
        __m512 v;
        __mmask16 mask = taken16_avx512(z + g, vm, vl, &v);
        _mm512_storeu_ps(p + g, _mm512_maskz_expand_ps(mask, _mm512_loadu_ps(pv + j)));
        j += __builtin_popcount((unsigned)mask);
    }
    return j;
}

/* 16 rows of 16 floats (src, row stride ss) stored transposed, dst[j·ds +
 * r] = src[r·ss + j]: interleaves of pairs, of pairs of pairs, then two
 * shuffles of 128-bit lanes.  The narrow rows' transposes into and out of
 * columns (kernels_narrow.h), where copying element by element cost as
 * much as solving cheap rows. */
static inline void transpose16_avx512(const float *src, int64_t ss, float *dst, int64_t ds)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ss);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(t[i + j]), b = _mm512_castps_pd(t[i + j + 2]);
            r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
    for (int j = 0; j < 16; j++) _mm512_storeu_ps(dst + j * ds, r[j]);
}
#endif
#endif

/* w^q for float w > 0 as 2^{q log2 w}, inline and branch-free so that GCC
 * vectorises the loops that call it with no call at all: libmvec's expf and
 * logf are calls, which spill the loop's registers around them, and two
 * transcendentals where one log2 and one exp2 share their range reductions.
 * Both are accurate to about 1 ulp (see fast_log2f, fast_exp2f); w^q then
 * carries the rounding of q·log2 w, a few ulps times (1 + |log2 w^q|), as
 * e^{q log w} did.  Results below FLT_MIN flush to 0 (an absolute error
 * below 1.2e-38), those from 2^127.5 up are inf (p ≤ k never comes near).
 * Float only: double keeps libm's vector exp and log. */
static inline int32_t f2i(float x)
{
    int32_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}

static inline float i2f(int32_t i)
{
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}

/* For normal x > 0: f and e with x = 2^e (1 + f), 1 + f in [√½, √2), f
 * exact (fast_log2f, rough_powf). */
static inline float log2_reduce(float x, int32_t *e)
{
    int32_t i = f2i(x) - 0x3f3504f3; /* bits of √½: 1 + f lands in [√½, √2) */
    *e = i >> 23;
    return i2f(f2i(x) - (*e << 23)) - 1.0f;
}

/* For |y| < 2^22: f and n with y = n + f, n = round(y), |f| ≤ ½, n then
 * clamped to [−127, 128], so that pow2i(n) is 0 at −127 and inf at 128
 * (fast_exp2f, rough_powf).  The clamp is on the integer: float selects
 * there kept GCC from vectorising. */
static inline float exp2_reduce(float y, int32_t *n)
{
    float t = y + 12582912.0f; /* 1.5·2^23: rounds y to an integer in t's low bits */
    int32_t k = f2i(t) - 0x4b400000;
    float f = y - (t - 12582912.0f);
    k = k > -127 ? k : -127;
    *n = k < 128 ? k : 128;
    return f;
}

/* 2^n from its bits, n in [−127, 128] (exp2_reduce) */
static inline float pow2i(int32_t n)
{
    return i2f((n + 127) << 23);
}

/* log2 x for normal x > 0: x = 2^e (1 + f) with 1 + f in [√½, √2), and
 * log(1 + f) = f + c, c = s (f²/2 + R(s²)) − f²/2, s = f/(2 + f), R the
 * float log's polynomial from fdlibm: f is exact and c is small (|c| < f/5),
 * so the roundings of s and c cost a fraction of an ulp; log2 = (f + c)/ln 2
 * with 1/ln 2 split in two, then + e: under 1 ulp in all. */
static inline float fast_log2f(float x)
{
    int32_t e;
    float f = log2_reduce(x, &e);
    float s = f / (2.0f + f), z = s * s, hf = 0.5f * f * f;
    float R = z * fmaf(fmaf(fmaf(0.24279078841f, z, 0.28498786688f), z, 0.40000972152f), z, 0.66666662693f);
    float c = fmaf(s, hf + R, -hf);
    const float ivln2hi = 1.4426950216f, ivln2lo = 1.9259629911e-8f; /* 1/ln 2 = hi + lo */
    return (float)e + fmaf(f, ivln2hi, fmaf(c, ivln2hi, fmaf(f, ivln2lo, c * ivln2lo)));
}

/* 2^y for |y| < 2^22: y = n + f (exp2_reduce), 2^f = 1 + f P(f) with P
 * fitted to 1e-8 relative, times 2^n (pow2i: 0 below 2^-126, inf from
 * 2^127.5). */
static inline float fast_exp2f(float y)
{
    int32_t n;
    float f = exp2_reduce(y, &n);
    float P = fmaf(fmaf(fmaf(fmaf(fmaf(0.00015370710752904415f, f, 0.001339985290542245f), f,
                                  0.009618373587727547f), f, 0.05550329014658928f), f, 0.24022647738456726f),
                   f, 0.6931471824645996f);
    return fmaf(f, P, 1.0f) * pow2i(n);
}

/* max(w, FLT_MIN) as an integer max of the bits (floats ≥ 0 order as their
 * bits; negatives and −inf, as int32, are below FLT_MIN's): what
 * fast_log2f may take, from any w; a float select here kept GCC from
 * vectorising the loops around it. */
static inline float fast_wposf(float w)
{
    int32_t b = f2i(w), lo = f2i(FLT_MIN);
    return i2f(b > lo ? b : lo);
}

/* w^q for w ≥ FLT_MIN (see fast_wposf). */
static inline float fast_powf(float w, float q)
{
    return fast_exp2f(q * fast_log2f(w));
}

/* w^q for w ≥ FLT_MIN within ROUGH_REL(q) relative wherever the result is
 * normal (|q| ≤ 6), for a round whose sums only choose the next λ
 * (solve_entmax_alpha's first): log2 as f P(f) on fast_log2f's reduced
 * mantissa, P of degree 5 fitted to 2.2e-6 absolute (no division), and 2^y
 * by a degree-4 polynomial fitted to 2.6e-6 relative.  The error is the
 * log's fit times |q| ln 2, the rounding of y = q log2 w (up to 2^-24 |y|,
 * |y| ≤ 126) times ln 2, and the exp's fit: ROUGH_REL bounds it with a
 * margin, and tests/backends/test_native_fastmath.py measures it. */
#define ROUGH_REL(q) (2e-6 * fabs((double)(q)) + 1e-5)
static inline float rough_powf(float w, float q)
{
    int32_t e, n;
    float f = log2_reduce(w, &e);
    float P = fmaf(fmaf(fmaf(fmaf(fmaf(-0.2065851092f, f, 0.3221529722f), f, -0.3674909472f), f, 0.4793482125f), f,
                        -0.7211318016f),
                   f, 1.4427134991f);
    float g = exp2_reduce(q * fmaf(f, P, (float)e), &n);
    float E = fmaf(fmaf(fmaf(fmaf(0.0095702754f, g, 0.0559178814f), g, 0.2402474135f), g, 0.6931217909f), g,
                   0.9999992847f);
    return E * pow2i(n);
}

/* The functions above on n floats, for the tests (which: 0 log2, 1 exp2,
 * 2 w^q, 3 rough w^q). */
void softk_fastmath_f32(int which, const float *x, float *y, int64_t n, double q)
{
    float qf = (float)q;
    for (int64_t i = 0; i < n; i++)
        y[i] = which == 0   ? fast_log2f(x[i])
               : which == 1 ? fast_exp2f(x[i])
               : which == 2 ? fast_powf(x[i], qf)
                            : rough_powf(x[i], qf);
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
#define POWQ(w, q) fast_powf((w), (q))
#define ROUGH(w, q) rough_powf((w), (q)) /* the first round of the α row solve (solve_entmax_alpha) */
#define ROUGH_FIRST 1
#define WPOS(w, one) fast_wposf(w)
#if defined(__AVX2__)
#define GATHER_AVX2 1 /* float rows gather with gather_block_avx2 */
#else
#define GATHER_AVX2 0
#endif
#if defined(__AVX512F__)
#define TRANSPOSE16 1 /* float narrow rows transpose with transpose16_avx512 */
#define PLACE_AVX512 1 /* entmax α's float rows write p with place_block_avx512 */
#else
#define TRANSPOSE16 0
#define PLACE_AVX512 0
#endif
#include "kernels_impl.h"
#include "kernels_loss.h"
#include "kernels_topk_ce.h"
#include "kernels_products.h"
#undef T
#undef SUF
#undef EXP
#undef LOG
#undef POW
#undef SQRT
#undef EPS
#undef POWQ
#undef ROUGH
#undef ROUGH_FIRST
#undef WPOS

#define T double
#define SUF f64
#define EXP exp
#define LOG log
#define POW pow
#define SQRT sqrt
#define EPS DBL_EPSILON
#define POWQ(w, q) exp((q) * log(w))
#define ROUGH(w, q) POWQ(w, q)
#define ROUGH_FIRST 0 /* a rough round's pulled-back step would cost double rows a round (see solve_entmax_alpha) */
#define WPOS(w, one) ((w) > 0 ? (w) : (one))
#undef GATHER_AVX2
#define GATHER_AVX2 0
#undef TRANSPOSE16
#define TRANSPOSE16 0
#undef PLACE_AVX512
#define PLACE_AVX512 0
#include "kernels_impl.h"
#include "kernels_loss.h"
#include "kernels_topk_ce.h"
#include "kernels_products.h"
