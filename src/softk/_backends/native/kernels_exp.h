/* The soft top-k "exp" solver (and softmax's store): λ from the saturated
 * set, carried relative to an entry of the row.  Included by kernels_impl.h
 * once per floating type.
 */

/* ---------------------------------------------------------------------------
 * Soft top-k "exp", f = min(1, e^u): g(λ) = #{z ≥ λ} + e^{−λ} Σ_{z<λ} e^z.
 * λ0 = lse(z) − log k is an upper bound (every min(1, ·) ≤ its second
 * argument).  From above, λ ← lse_{z<λ}(z) − log(k − #{z ≥ λ}) is Newton in
 * μ = e^{−λ} on a concave increasing function: it never overshoots, the
 * saturated set only grows, and λ is exact once that set stops growing (at
 * most k + 1 rounds; one or two on typical rows).
 * λ is carried as ref + ℓ with ref an entry of the row (the max, then the
 * largest unsaturated entry) and ℓ = O(log n): with a saturated outlier
 * (z = [1e6, 0, 1], k = 2) λ − max(z) ≈ −1e6 would keep only 1/16 of λ's
 * fraction in float32, while z − ref and ℓ are exact to a few ulps of the
 * entries that p depends on.  Returns ℓ, sets *ref.
 */
static T FN(solve_exp)(const T *z, T m, int64_t n, T k, T *ref, int64_t *iters)
{
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += EXP(z[i] - m);
    T r = m, lam = LOG(s) - LOG(k);
    int64_t prev = 0, it = 1;
    for (; it < (int64_t)k + 3; it++) {
        if (lam > 0 && r == m) break; /* every z ≤ m < λ: nothing saturates */
        T mu = -INFINITY;
        int64_t nsat = 0;
#pragma omp simd reduction(max : mu) reduction(+ : nsat)
        for (int64_t i = 0; i < n; i++) {
            T v = z[i] - r;
            nsat += v >= lam;
            mu = (v < lam && z[i] > mu) ? z[i] : mu;
        }
        if (nsat == prev || nsat >= (int64_t)k) break;
        T u = 0;
#pragma omp simd reduction(+ : u)
        for (int64_t i = 0; i < n; i++) {
            T e = EXP(z[i] - mu);
            u += z[i] - r < lam ? e : 0;
        }
        r = mu;
        lam = LOG(u) - LOG(k - (T)nsat);
        prev = nsat;
    }
    if (iters) *iters = it;
    *ref = r;
    return lam;
}

/* p = min(1, e^{(z − ref) − ℓ}) from solve_exp's λ = ref + ℓ; p = 1 only
 * where u > 0 (saturated, f′ = 0), at most BELOW_ONE where u ≤ 0.  The top
 * entry of a row whose others lie far below has u ≈ −e^{−gap}, which λ's
 * rounding makes 0 and e^u rounds to 1, while f′ there is 1: the backward
 * reads f′ off p, and a 1 would zero the whole row's gradient (at k = 1
 * this map is softmax, which never saturates).  Not inlined: the forward
 * and the fused loss (kernels_loss.h) run the same vector code, so their p
 * agree to the bit. */
#define BELOW_ONE (1 - EPS / 2) /* the largest T below 1 */
static __attribute__((noinline)) void FN(exp_write)(const T *z, T *p, int64_t n, T ref, T lam)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        T u = (z[i] - ref) - lam, e = EXP(u);
        p[i] = u <= 0 ? (e < BELOW_ONE ? e : BELOW_ONE) : 1;
    }
}

/* p_i = e^{z_i − m}; returns Σ p_i (softmax and the "exp" fast path). */
static T FN(store_exp)(const T *z, T *p, T m, int64_t n)
{
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) {
        T e = EXP(z[i] - m);
        p[i] = e;
        s += e;
    }
    return s;
}

/* The same iteration on e_i = e^{v_i} stored in p, with threshold t = e^{λ}:
 * the unsaturated sum is S − Σ_{e ≥ t} e, no second exp.  Safe while the
 * saturated part is at most half of S (the subtraction then loses at most a
 * factor 2 in relative precision, and S − S_sat ≥ 1/2 cannot be dominated by
 * underflowed entries).  Returns 0, leaving p to be overwritten, when that
 * does not hold; the caller then runs solve_exp.  *thr (when not NULL) gets
 * t = e^{λ − m}, which the fused loss (kernels_loss.h) needs for λ. */
static int FN(exp_stored)(const T *z, T *p, T m, int64_t n, T k, int64_t *iters, T *thr)
{
    T s = FN(store_exp)(z, p, m, n);
    T t = s / k;
    int64_t prev = 0;
    *iters = 1;
    for (int64_t it = 0; t <= 1 && it < (int64_t)k + 3; it++) { /* t > 1: nothing saturates */
        int64_t nsat = 0;
        T ssat = 0;
#pragma omp simd reduction(+ : nsat, ssat)
        for (int64_t i = 0; i < n; i++) {
            T e = p[i];
            nsat += e >= t;
            ssat += e >= t ? e : 0;
        }
        if (nsat == prev) break;
        if (nsat >= (int64_t)k || ssat > s / 2) return 0;
        t = (s - ssat) / (k - (T)nsat);
        prev = nsat;
        *iters += 1;
    }
    T inv = 1 / t;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) { /* 1 only above t (u > 0), as in exp_write */
        T e = p[i] * inv;
        p[i] = p[i] <= t ? (e < BELOW_ONE ? e : BELOW_ONE) : 1;
    }
    if (thr) *thr = t;
    return 1;
}
