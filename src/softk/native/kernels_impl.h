/* One floating type's kernels (T, SUF, EXP, LOG, POW, SQRT, EPS are defined by
 * kernels.c).  Every row is handled on its own; the caller splits rows
 * between threads.
 *
 * Shifted coordinates: the solvers work with v = z − max(z) ≤ 0 and return
 * λ − max(z), so tolerances are relative to the data's spread, not to |max|.
 *
 * Row conventions (the same as softk.threshold.rows): −inf entries are
 * removed; a row with m ≤ k finite entries gets 1 on them (0 elsewhere); a row
 * holding NaN or +inf is NaN.
 */

/* max of the finite entries, how many are finite, and whether NaN/+inf occur. */
static T FN(row_scan)(const T *z, int64_t n, int64_t *count, int *bad)
{
    T m = -INFINITY;
    int64_t c = 0;
    int b = 0;
#pragma omp simd reduction(max : m) reduction(+ : c) reduction(| : b)
    for (int64_t i = 0; i < n; i++) {
        T v = z[i];
        m = v > m ? v : m;
        c += v > -INFINITY;
        b |= (v != v) | (v == INFINITY);
    }
    *count = c;
    *bad = b;
    return m;
}

static void FN(fill_conventions)(const T *z, T *p, int64_t n, int bad)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = bad ? (T)NAN : (z[i] > -INFINITY ? (T)1 : (T)0);
}

/* Keep the entries of (val, idx)[0..c) with val > lam, in order; returns how many. */
static int64_t FN(compact)(T *val, int64_t *idx, int64_t c, T lam)
{
    int64_t c2 = 0;
    for (int64_t j = 0; j < c; j++) {
        T v = val[j];
        int64_t ix = idx[j];
        val[c2] = v;
        idx[c2] = ix;
        c2 += v > lam;
    }
    return c2;
}

/* ---------------------------------------------------------------------------
 * Families with f(u) = 0 for u ≤ 0 (sparsemax, entmax15, entmax α ≤ 2).
 * g(λ) = Σ f(v − λ) is convex and decreasing, so Newton started at a lower
 * bound (g ≥ k there) climbs to λ without overshooting, and entries at or
 * below the current λ can be dropped for good: each round touches only the
 * surviving candidates (val, idx)[0..c), all > lam on entry.
 *   sparsemax: the Newton step is the closed form on the current support
 *              (Michelot); exact as soon as the support stops shrinking.
 *   entmax15:  the closed form (a quadratic) on the current support is tried
 *              first and accepted when no candidate falls below it (exact);
 *              otherwise a Newton step.
 *   entmax α:  Newton on h = g^{1/q} − k^{1/q}, q = 1/(α−1) ≥ 1 (convex, nearly
 *              linear), until the step is below a few ulps.
 * On return (val, idx)[0..*nval) holds every candidate with v > λ (and
 * possibly a few at λ, where f = 0).  Returns λ.
 */
static T FN(solve_candidates)(int fam, T lam, T k, T alpha, T *val, int64_t *idx, int64_t c,
                              int64_t *nval, int64_t *iters)
{
    T am1 = alpha - 1, q = 1 / am1;
    int64_t it = 0;
    for (; it < 2 * c + 100; it++) {
        if (fam == 1) {
            T s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < c; j++) s += val[j];
            T next = (s - k) / (T)c;
            int64_t c2 = FN(compact)(val, idx, c, next);
            if (c2 == 0) break; /* rounding guard: keep the last λ */
            lam = next;
            if (c2 == c) break;
            c = c2;
        } else if (fam == 2) {
            T D = 0, G = 0; /* Σw, Σw², w = v − λ > 0 on the candidates */
#pragma omp simd reduction(+ : D, G)
            for (int64_t j = 0; j < c; j++) {
                T w = val[j] - lam;
                D += w;
                G += w * w;
            }
            T r = G - 4 * k; /* 4 (g(λ) − k) ≥ 0 */
            if (!(r > 0)) break;
            T disc = D * D - (T)c * r;
            if (disc >= 0) {
                T dc = r / (D + SQRT(disc)); /* smaller root of Σ(w − δ)² = 4k */
                int64_t above = 0;
#pragma omp simd reduction(+ : above)
                for (int64_t j = 0; j < c; j++) above += val[j] - lam > dc;
                if (above == c) {
                    lam += dc;
                    break;
                }
            }
            T next = lam + r / (2 * D);
            if (!(next > lam)) break;
            c = FN(compact)(val, idx, c, next);
            lam = next;
        } else {
            T G = 0, S = 0; /* Σw^q, Σw^{q−1}, w = (α−1)(v − λ) > 0 */
            /* Whole vectors only: a scalar pow in the loop's remainder costs
             * as much as a vector one, so pad with entries at λ (w = 0,
             * masked; pow gets 1 there, as its vector variants take a slow
             * path for 0).  val/idx have PAD spare slots. */
            int64_t cp = (c + PAD - 1) / PAD * PAD;
            for (int64_t j = c; j < cp; j++) val[j] = lam;
#pragma omp simd reduction(+ : G, S)
            for (int64_t j = 0; j < cp; j++) {
                T w = am1 * (val[j] - lam);
                T wq1 = POW(w > 0 ? w : 1, q - 1);
                G += w > 0 ? wq1 * w : 0;
                S += w > 0 ? wq1 : 0;
            }
            if (!(G > k)) break;
            T step = q * (POW(G, 1 / q) - POW(k, 1 / q)) * POW(G, 1 - 1 / q) / S;
            T next = lam + step;
            if (!(next > lam)) break;
            c = FN(compact)(val, idx, c, next);
            lam = next;
            if (step <= 4 * EPS * (1 + fabs((double)lam))) break;
        }
    }
    *nval = c;
    if (iters) *iters += it + 1;
    return lam;
}

/* Row scan with block maxima: bm[b] = max of z[b·B, (b+1)·B) (−inf if none is finite). */
#define BLK 32
static T FN(row_scan_blocks)(const T *z, int64_t n, T *bm, int64_t *count, int *bad)
{
    T m = -INFINITY;
    int64_t c = 0;
    int b = 0;
    for (int64_t i0 = 0, blk = 0; i0 < n; i0 += BLK, blk++) {
        int64_t end = i0 + BLK < n ? i0 + BLK : n;
        T bmax = -INFINITY;
#pragma omp simd reduction(max : bmax) reduction(+ : c) reduction(| : b)
        for (int64_t i = i0; i < end; i++) {
            T v = z[i];
            bmax = v > bmax ? v : bmax;
            c += v > -INFINITY;
            b |= (v != v) | (v == INFINITY);
        }
        bm[blk] = bmax;
        m = bmax > m ? bmax : m;
    }
    *count = c;
    *bad = b;
    return m;
}

/* λ − max(z) for a zero-below family, without sorting the row:
 * 1. the block maxima are entries of the row, and a subset's λ is a lower
 *    bound of the row's λ (fewer terms in g), so solving on them (from the
 *    family's bound: the top entry alone reaches k) gives a tight lower bound;
 * 2. only blocks whose maximum is above that bound can hold candidates: they
 *    are compacted into (val, idx) and solved exactly from the bound. */
static T FN(solve_zero_below)(int fam, const T *z, const T *bm, T m, int64_t n, T k, T alpha,
                              T *val, int64_t *idx, int64_t *nval, int64_t *iters)
{
    T am1 = alpha - 1;
    T lam = fam == 1 ? -k : fam == 2 ? -2 * SQRT(k) : -POW(k, am1) / am1;
    int64_t nb = (n + BLK - 1) / BLK, c = 0, c2;
    if (nb > 1) {
        for (int64_t b = 0; b < nb; b++) {
            T v = bm[b] - m;
            val[c] = v;
            idx[c] = b;
            c += v > lam;
        }
        T sub = FN(solve_candidates)(fam, lam, k, alpha, val, idx, c, &c2, iters);
        /* keep a few ulps below the subset's λ: it is exact only up to rounding */
        sub -= 16 * EPS * (1 + fabs((double)sub));
        lam = sub > lam ? sub : lam;
        c = 0;
    }
    for (int64_t b = 0; b < nb; b++) {
        if (!(bm[b] - m > lam)) continue;
        int64_t i0 = b * BLK, end = i0 + BLK < n ? i0 + BLK : n;
        for (int64_t i = i0; i < end; i++) {
            T v = z[i] - m;
            val[c] = v;
            idx[c] = i;
            c += v > lam;
        }
    }
    return FN(solve_candidates)(fam, lam, k, alpha, val, idx, c, nval, iters);
}

/* entmax with α near 1 (q = 1/(α−1) > 8): λ ≈ −q is known only to eps·q, and
 * p = (a(v − λ))^q turns that absolute error of w ≈ 1 into q·eps relative
 * error of p (1e-3 in float32 at α = 1.0001).  Re-solve in μ = λ + q, where
 * w = 1 + x with x = a(v − μ) small: p = e^{q·log1p(x)} is exact to a few
 * ulps and tends to softmax as α → 1.  g(μ) is convex and decreasing, so
 * Newton started a little left of the root (g ≥ 1) climbs to it in one or
 * two steps from the λ solution.  Only these rows pay the extra passes
 * (scalar log1p: libmvec's vector log1p is not in every glibc).
 * Overwrites val[j] with p_j for the candidates. */
static void FN(entmax_near_softmax)(T lam, T am1, T *val, int64_t c)
{
    T q = 1 / am1;
    T mu = lam + q;
    mu -= 8 * EPS * (fabs((double)lam) + 1);
    for (int it = 0; it < 8; it++) {
        T G = 0, S = 0;
        for (int64_t j = 0; j < c; j++) {
            T x = am1 * (val[j] - mu);
            if (x > -1) {
                T l = (T)log1p((double)x);
                G += EXP(q * l);
                S += EXP((q - 1) * l);
            }
        }
        if (!(S > 0)) break;
        T step = (G - 1) / S;
        mu += step;
        if (fabs((double)step) <= 2 * EPS * (fabs((double)mu) + 1)) break;
    }
    for (int64_t j = 0; j < c; j++) {
        T x = am1 * (val[j] - mu);
        val[j] = x > -1 ? EXP(q * (T)log1p((double)x)) : 0;
    }
}

/* f(v − λ) on the candidates, written into a zeroed row. */
static void FN(write_zero_below)(int fam, T *p, int64_t n, T lam, T alpha, T *val,
                                 const int64_t *idx, int64_t c)
{
    T am1 = alpha - 1, q = 1 / am1;
    memset(p, 0, (size_t)n * sizeof(T));
    if (fam == 3 && q > 8) {
        FN(entmax_near_softmax)(lam, am1, val, c);
        for (int64_t j = 0; j < c; j++) p[idx[j]] = val[j];
        return;
    }
    int64_t cp = (c + PAD - 1) / PAD * PAD; /* whole vectors, as in solve_candidates */
    for (int64_t j = c; j < cp; j++) val[j] = lam;
#pragma omp simd
    for (int64_t j = 0; j < cp; j++) {
        T u = val[j] - lam;
        u = u > 0 ? u : 0;
        /* pow's vector variants take a slow scalar path for 0: feed them 1 there */
        val[j] = fam == 1 ? u : fam == 2 ? (T)0.25 * u * u : (u > 0 ? POW(am1 * (u > 0 ? u : 1), q) : 0);
    }
    for (int64_t j = 0; j < c; j++) p[idx[j]] = val[j];
}

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
 * does not hold; the caller then runs solve_exp. */
static int FN(exp_stored)(const T *z, T *p, T m, int64_t n, T k, int64_t *iters)
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
    for (int64_t i = 0; i < n; i++) {
        T e = p[i] * inv;
        p[i] = e < 1 ? e : 1;
    }
    return 1;
}

/* ---------------------------------------------------------------------------
 * Forward over rows [0, rows).  scratch: 2n slots (values, indices) per call.
 * Returns 0, or −1 when scratch memory could not be allocated.
 */
int FN(softk_forward)(int fam, const T *z, T *p, int64_t rows, int64_t n, double kd,
                      double alphad, int64_t *max_iters)
{
    T k = (T)kd, alpha = (T)alphad;
    T *val = NULL;
    int64_t *idx = NULL;
    T *bm = NULL;
    if (fam >= 1 && fam <= 3) {
        val = (T *)malloc((size_t)(n + PAD) * sizeof(T));
        idx = (int64_t *)malloc((size_t)(n + PAD) * sizeof(int64_t));
        bm = (T *)malloc((size_t)((n + BLK - 1) / BLK) * sizeof(T));
        if (!val || !idx || !bm) {
            free(val);
            free(idx);
            free(bm);
            return -1;
        }
    }
    int64_t worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        const T *zr = z + r * n;
        T *pr = p + r * n;
        int64_t count, iters = 0;
        int bad;
        T m = bm ? FN(row_scan_blocks)(zr, n, bm, &count, &bad) : FN(row_scan)(zr, n, &count, &bad);
        if (bad || (double)count <= kd) {
            FN(fill_conventions)(zr, pr, n, bad);
            continue;
        }
        if (fam == 0) {
            T scale = k / FN(store_exp)(zr, pr, m, n);
#pragma omp simd
            for (int64_t i = 0; i < n; i++) pr[i] *= scale;
            iters = 1;
        } else if (fam == 4 && FN(exp_stored)(zr, pr, m, n, k, &iters)) {
            /* done: the common case, one exp per entry */
        } else if (fam == 4) {
            T ref, lam = FN(solve_exp)(zr, m, n, k, &ref, &iters);
#pragma omp simd
            for (int64_t i = 0; i < n; i++) {
                T e = EXP((zr[i] - ref) - lam);
                pr[i] = e < 1 ? e : 1;
            }
        } else {
            int64_t c;
            T lam = FN(solve_zero_below)(fam, zr, bm, m, n, k, alpha, val, idx, &c, &iters);
            FN(write_zero_below)(fam, pr, n, lam, alpha, val, idx, c);
        }
        worst = iters > worst ? iters : worst;
    }
    free(val);
    free(idx);
    free(bm);
    if (max_iters) *max_iters = worst;
    return 0;
}

/* d = f′(u) read off p (the same formulas as Family.d_from_p), NaN kept. */
static inline T FN(slope)(int fam, T pi, T e)
{
    if (fam == 0) return pi;
    if (fam == 1) return pi > 0 ? (T)1 : (pi == pi ? (T)0 : pi);
    if (fam == 2) return SQRT(pi);
    if (fam == 3) return pi > 0 ? POW(pi > 0 ? pi : 1, e) : (pi == pi ? (T)0 : pi);
    return pi < 1 ? pi : (pi == pi ? (T)0 : pi);
}

/* Backward: dx = d ⊙ (g − Σ(d⊙g)/Σd) / τ with d = f′(u) read off p
 * (0 where Σd = 0, NaN where p is NaN).
 * Dense families (softmax, exp): two passes, d recomputed (no d buffer).
 * Zero-below families: d = 0 where p = 0, so the row is read once to find
 * the support (16-wide chunks with no nonzero are skipped), the gradient row
 * is zeroed, and only the support's g and dx are touched.
 * scratch: 2 (n + PAD) slots for the zero-below families, else unused.
 * Returns 0, or −1 when scratch memory could not be allocated. */
int FN(softk_backward)(int fam, const T *p, const T *g, T *dx, int64_t rows, int64_t n,
                       double inv_taud, double alphad)
{
    T inv_tau = (T)inv_taud, e = (T)(2 - alphad);
    int64_t *sidx = NULL;
    T *dv = NULL;
    if (fam >= 1 && fam <= 3) {
        sidx = (int64_t *)malloc((size_t)(n + PAD) * sizeof(int64_t));
        dv = (T *)malloc((size_t)(n + PAD) * sizeof(T));
        if (!sidx || !dv) {
            free(sidx);
            free(dv);
            return -1;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const T *pr = p + r * n, *gr = g + r * n;
        T *out = dx + r * n;
        T sd = 0, sdg = 0;
        if (!sidx) {
#pragma omp simd reduction(+ : sd, sdg)
            for (int64_t i = 0; i < n; i++) {
                T d = FN(slope)(fam, pr[i], e);
                sd += d;
                sdg += d * gr[i];
            }
            T coef = sd > 0 ? sdg / sd : 0;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) out[i] = FN(slope)(fam, pr[i], e) * (gr[i] - coef) * inv_tau;
            continue;
        }
        int64_t c = 0;
        for (int64_t i0 = 0; i0 < n; i0 += PAD) {
            int64_t end = i0 + PAD < n ? i0 + PAD : n;
            int hit = 0;
#pragma omp simd reduction(| : hit)
            for (int64_t i = i0; i < end; i++) hit |= pr[i] != 0; /* NaN counts: it must spread */
            if (!hit) continue;
            for (int64_t i = i0; i < end; i++) {
                sidx[c] = i;
                c += pr[i] != 0;
            }
        }
        memset(out, 0, (size_t)n * sizeof(T));
        int64_t cp = (c + PAD - 1) / PAD * PAD; /* whole vectors for pow */
        for (int64_t j = 0; j < c; j++) dv[j] = pr[sidx[j]];
        for (int64_t j = c; j < cp; j++) dv[j] = 0;
#pragma omp simd
        for (int64_t j = 0; j < cp; j++) dv[j] = FN(slope)(fam, dv[j], e);
        for (int64_t j = 0; j < c; j++) {
            sd += dv[j];
            sdg += dv[j] * gr[sidx[j]];
        }
        T coef = sd > 0 ? sdg / sd : 0;
        for (int64_t j = 0; j < c; j++) out[sidx[j]] = dv[j] * (gr[sidx[j]] - coef) * inv_tau;
    }
    free(sidx);
    free(dv);
    return 0;
}

/* Rows split between nthreads OpenMP threads (one contiguous block each).
 * Built with -fopenmp, this shares the process's libgomp (torch's own on
 * Linux, same soname) and so its thread pool; without OpenMP it is serial. */
int FN(softk_forward_threads)(int fam, const T *z, T *p, int64_t rows, int64_t n, double kd,
                              double alphad, int64_t *max_iters, int nthreads)
{
    int rc = 0;
    int64_t worst = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(| : rc) reduction(max : worst)
#endif
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        int64_t lo = rows * t / nt, hi = rows * (t + 1) / nt, it = 0;
        if (hi > lo) rc |= FN(softk_forward)(fam, z + lo * n, p + lo * n, hi - lo, n, kd, alphad, &it);
        worst = it > worst ? it : worst;
    }
    if (max_iters) *max_iters = worst;
    return rc;
}

int FN(softk_backward_threads)(int fam, const T *p, const T *g, T *dx, int64_t rows, int64_t n,
                               double inv_taud, double alphad, int nthreads)
{
    int rc = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(| : rc)
#endif
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        int64_t lo = rows * t / nt, hi = rows * (t + 1) / nt;
        if (hi > lo) rc |= FN(softk_backward)(fam, p + lo * n, g + lo * n, dx + lo * n, hi - lo, n, inv_taud, alphad);
    }
    return rc;
}
