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

#include "kernels_rows.h"
#include "kernels_exp.h"
#include "kernels_narrow.h"

/* The rounds of live α solves, in turn: every live row's sums, then every
 * live row's step, until all are done. */
static void FN(alpha_rounds)(FN(alpha_state) *st, int live, const FN(zb_params) *pa)
{
    for (int busy = live > 0; busy;) {
        for (int i = 0; i < live; i++)
            if (!st[i].done) FN(alpha_sums)(&st[i], pa);
        busy = 0;
        for (int i = 0; i < live; i++)
            if (!st[i].done) {
                FN(alpha_next)(&st[i], pa);
                busy |= !st[i].done;
            }
    }
}

/* Entmax α's rows (of the row solve) ALPHA_ROWS at a time: their scans,
 * the rounds of their bounds on the block maxima in turn (alpha_rounds),
 * their gathers, the rounds of their solves in turn, then their writes.
 * Each round ends in a serial chain (the sums' reductions, a scalar step
 * and the checks around it) that the row's next round waits on; with the
 * other rows' rounds in between, the core works through their vector loops
 * meanwhile.  Each row's λ and p are those gather_zero_below,
 * solve_zero_below and write_zero_below give it alone.  val, idx and bm
 * hold ALPHA_ROWS rows' scratch (softk_forward's sizes, that many times).  Returns the
 * most rounds a row took. */
/* rows solved together: three hid a little more of the serial chains than two
 * on N(0, 1) rows of 1024, four no more */
#define ALPHA_ROWS 3
/* Rows up to this wide gather values alone (gather_zero_below's need_idx =
 * 0): wider rows' candidates are few a block over many blocks, where
 * putting p back block by block cost more than the indices saved, so they
 * keep them */
#define ALPHA_VALS_MAX 4096
static int64_t FN(entmax_alpha_rows)(const T *z, T *p, int64_t rows, int64_t n, double kd, T alpha,
                                     const FN(zb_params) *pa, T *val, cidx_t *idx, T *bm)
{
    T k = (T)kd;
    int64_t nb = (n + BLK - 1) / BLK, worst = 0, r = 0;
    while (r < rows) {
        FN(alpha_state) st[ALPHA_ROWS];
        FN(gathered) from[ALPHA_ROWS];
        int64_t row[ALPHA_ROWS], iters[ALPHA_ROWS];
        T m[ALPHA_ROWS];
        int live = 0;
        for (; r < rows && live < ALPHA_ROWS; r++) {
            const T *zr = z + r * n;
            T *v = val + live * 2 * (n + PAD);
            int64_t count;
            int bad;
            m[live] = FN(row_scan_blocks)(zr, n, bm + live * nb, &count, &bad);
            if (bad || (double)count <= kd) {
                FN(fill_conventions)(zr, p + r * n, n, bad);
                continue;
            }
            iters[live] = 0;
            /* a lone block: the family's bound (gather_zero_below) */
            int64_t c = nb > 1 ? FN(block_maxima)(bm + live * nb, m[live], nb, pa->lam0, v, idx + live * (n + PAD)) : 0;
            FN(alpha_begin)(&st[live], pa->lam0, k, pa, 0, v, v + n + PAD, c);
            st[live].done = nb <= 1;
            row[live++] = r;
        }
        FN(alpha_rounds)(st, live, pa);
        for (int i = 0; i < live; i++) {
            T lam = pa->lam0;
            if (nb > 1) {
                iters[i] += st[i].it + 1;
                lam = FN(bound_below)(st[i].lam, lam);
            }
            T *v = val + i * 2 * (n + PAD);
            int64_t c = FN(gather_blocks)(3, z + row[i] * n, bm + i * nb, m[i], n, lam, v, idx + i * (n + PAD),
                                          &from[i], n > ALPHA_VALS_MAX);
            FN(alpha_begin)(&st[i], lam, k, pa, 1, v, v + n + PAD, c);
        }
        FN(alpha_rounds)(st, live, pa);
        for (int i = 0; i < live; i++) {
            iters[i] += st[i].it + 1;
            FN(write_zero_below)(3, p + row[i] * n, n, st[i].lam, alpha, st[i].val, idx + i * (n + PAD), st[i].c,
                                 st[i].have_p ? st[i].pw : NULL, &from[i]);
            worst = iters[i] > worst ? iters[i] : worst;
        }
    }
    return worst;
}

/* ---------------------------------------------------------------------------
 * Forward over rows [0, rows).  scratch: values (2 (n + PAD) slots, see solve_zero_below), indices and block maxima per call.
 * Returns 0, −1 when scratch memory could not be allocated, or −3 for rows
 * of a zero-below family longer than CIDX_MAX (nothing written).
 */
int FN(softk_forward)(int fam, const T *z, T *p, int64_t rows, int64_t n, double kd,
                      double alphad, int64_t *max_iters)
{
    T k = (T)kd, alpha = (T)alphad;
    FN(zb_params) pa = FN(zb_params_of)(fam, k, alpha);
    if (FN(narrow_serves)(fam, n, &pa)) {
        int64_t worst = 0;
        for (int64_t r = 0; r < rows; r += NARROW_LANES) {
            int nr = rows - r < NARROW_LANES ? (int)(rows - r) : NARROW_LANES;
            int64_t it = FN(narrow_rows)(fam, z + r * n, p + r * n, nr, n, k, &pa, NULL, NULL);
            worst = it > worst ? it : worst;
        }
        if (max_iters) *max_iters = worst;
        return 0;
    }
    T *val = NULL;
    cidx_t *idx = NULL;
    T *bm = NULL;
    if (fam >= 1 && fam <= 3) {
        if (n > CIDX_MAX) return -3;
        size_t sets = fam == 3 ? ALPHA_ROWS : 1; /* entmax α: ALPHA_ROWS rows' (entmax_alpha_rows) */
        val = (T *)malloc(sets * (size_t)(2 * (n + PAD)) * sizeof(T)); /* see solve_zero_below */
        idx = (cidx_t *)malloc(sets * (size_t)(n + PAD) * sizeof(cidx_t));
        bm = (T *)malloc(sets * (size_t)((n + BLK - 1) / BLK) * sizeof(T));
        if (!val || !idx || !bm) {
            free(val);
            free(idx);
            free(bm);
            return -1;
        }
    }
    int64_t worst = 0;
    if (fam == 3) {
        worst = FN(entmax_alpha_rows)(z, p, rows, n, kd, alpha, &pa, val, idx, bm);
        rows = 0;
    }
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
        } else if (fam == 4 && FN(exp_stored)(zr, pr, m, n, k, &iters, NULL)) {
            /* done: the common case, one exp per entry */
        } else if (fam == 4) {
            T ref, lam = FN(solve_exp)(zr, m, n, k, &ref, &iters);
            FN(exp_write)(zr, pr, n, ref, lam);
        } else {
            int64_t c;
            int have_p;
            FN(gathered) from;
            T lam = FN(solve_zero_below)(fam, zr, bm, m, n, k, &pa, val, idx, &c, &have_p, &iters, &from, 0);
            FN(write_zero_below)(fam, pr, n, lam, alpha, val, idx, c, have_p ? val + n + PAD : NULL, &from);
        }
        worst = iters > worst ? iters : worst;
    }
    free(val);
    free(idx);
    free(bm);
    if (max_iters) *max_iters = worst;
    return 0;
}

/* d = f′(u) read off p (the same formulas as Family.d_from_p), NaN kept:
 * + (p − p) is 0, or NaN where p is NaN, without a branch.  Entmax α's
 * p^{2−α} as w^q in entmax_sums (the mask multiplied; a select around the
 * call kept loops scalar); one: an opaque 1 (see entmax_sums). */
static inline __attribute__((always_inline)) T FN(slope)(const int fam, T pi, T e, T one)
{
    if (fam == 0) return pi;
    if (fam == 1) return (T)(pi > 0) + (pi - pi);
    if (fam == 2) return SQRT(pi);
    if (fam == 3) return POWQ(WPOS(pi, one), e) * (T)(pi > 0) + (pi - pi);
    return pi < 1 ? pi : (pi == pi ? (T)0 : pi);
}

/* The backward in two dense passes, d read off p on every entry: softmax's
 * and "exp"'s rows, and the zero-below families' up to DENSE_BACKWARD_MAX
 * entries (on rows this short, finding the support first, below, costs more
 * than the entries it skips); d recomputed in the second pass.  Entmax α on
 * rows up to DENSE_BLOCK entries: d for a block of whole rows at once in one
 * flat loop, so that rows shorter than a vector fill it and its powers run
 * in whole vectors (for the other families' cheap d, storing it cost more
 * than computing it twice), then each row's sums and dx from d.  Inlined with
 * a constant fam (dense_backward_of), so each family's loops are vector
 * loops of their own: with fam chosen inside, GCC computed every family's
 * slope on every entry, or left the loops scalar. */
#define DENSE_BACKWARD_MAX 1024
#define DENSE_BLOCK 2048
static inline __attribute__((always_inline)) void FN(dense_backward)(const int fam, const T *p, const T *g, T *dx,
                                                                     int64_t rows, int64_t n, T inv_tau, T e, T one)
{
    if (fam != 3 || n > DENSE_BLOCK) {
        for (int64_t r = 0; r < rows; r++) {
            const T *pr = p + r * n, *gr = g + r * n;
            T *out = dx + r * n;
            T sd = 0, sdg = 0;
#pragma omp simd reduction(+ : sd, sdg)
            for (int64_t i = 0; i < n; i++) {
                T d = FN(slope)(fam, pr[i], e, one);
                sd += d;
                sdg += d * gr[i];
            }
            T coef = sd > 0 ? sdg / sd : 0;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) out[i] = FN(slope)(fam, pr[i], e, one) * (gr[i] - coef) * inv_tau;
        }
        return;
    }
    T d[DENSE_BLOCK];
    int64_t per = DENSE_BLOCK / n;
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        int64_t nr = rows - r0 < per ? rows - r0 : per, m = nr * n;
        const T *pb = p + r0 * n;
#pragma omp simd
        for (int64_t i = 0; i < m; i++) d[i] = FN(slope)(fam, pb[i], e, one);
        for (int64_t r = 0; r < nr; r++) {
            const T *dr = d + r * n, *gr = g + (r0 + r) * n;
            T *out = dx + (r0 + r) * n;
            T sd = 0, sdg = 0;
#pragma omp simd reduction(+ : sd, sdg)
            for (int64_t i = 0; i < n; i++) {
                sd += dr[i];
                sdg += dr[i] * gr[i];
            }
            T coef = sd > 0 ? sdg / sd : 0;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) out[i] = dr[i] * (gr[i] - coef) * inv_tau;
        }
    }
}

static void FN(dense_backward_of)(int fam, const T *p, const T *g, T *dx, int64_t rows, int64_t n, T inv_tau, T e,
                                  T one)
{
    switch (fam) {
    case 0: FN(dense_backward)(0, p, g, dx, rows, n, inv_tau, e, one); break;
    case 1: FN(dense_backward)(1, p, g, dx, rows, n, inv_tau, e, one); break;
    case 2: FN(dense_backward)(2, p, g, dx, rows, n, inv_tau, e, one); break;
    case 3: FN(dense_backward)(3, p, g, dx, rows, n, inv_tau, e, one); break;
    default: FN(dense_backward)(4, p, g, dx, rows, n, inv_tau, e, one); break;
    }
}

/* d on a support's values dv[0..cp) in place, fam constant (see dense_backward). */
static inline __attribute__((always_inline)) void FN(support_slopes)(const int fam, T *dv, int64_t cp, T e, T one)
{
#pragma omp simd
    for (int64_t j = 0; j < cp; j++) dv[j] = FN(slope)(fam, dv[j], e, one);
}

/* Backward: dx = d ⊙ (g − Σ(d⊙g)/Σd) / τ with d = f′(u) read off p
 * (0 where Σd = 0, NaN where p is NaN).
 * Dense families (softmax, exp), and zero-below ones on rows up to
 * DENSE_BACKWARD_MAX: dense_backward.  Wider rows of a zero-below family:
 * d = 0 where p = 0, so the row is read once to find the support (16-wide
 * chunks with no nonzero are skipped), the gradient row is zeroed, and only
 * the support's g and dx are touched.
 * scratch: 2 (n + PAD) slots for the wider zero-below rows, else unused.
 * Returns 0, or −1 when scratch memory could not be allocated. */
int FN(softk_backward)(int fam, const T *p, const T *g, T *dx, int64_t rows, int64_t n,
                       double inv_taud, double alphad)
{
    T inv_tau = (T)inv_taud, e = (T)(2 - alphad);
    volatile T one_v = 1; /* opaque: see entmax_sums */
    T one = one_v;
    if (!(fam >= 1 && fam <= 3) || n <= DENSE_BACKWARD_MAX) {
        FN(dense_backward_of)(fam, p, g, dx, rows, n, inv_tau, e, one);
        return 0;
    }
    int64_t *sidx = (int64_t *)malloc((size_t)(n + PAD) * sizeof(int64_t));
    T *dv = (T *)malloc((size_t)(n + PAD) * sizeof(T));
    if (!sidx || !dv) {
        free(sidx);
        free(dv);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        const T *pr = p + r * n, *gr = g + r * n;
        T *out = dx + r * n;
        T sd = 0, sdg = 0;
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
        if (fam == 1)
            FN(support_slopes)(1, dv, cp, e, one);
        else if (fam == 2)
            FN(support_slopes)(2, dv, cp, e, one);
        else
            FN(support_slopes)(3, dv, cp, e, one);
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
    if (fam >= 1 && fam <= 3 && n > CIDX_MAX) return -3;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(| : rc) reduction(max : worst)
#endif
    {
        int64_t lo, hi, it = 0;
        thread_rows(rows, &lo, &hi);
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
        int64_t lo, hi;
        thread_rows(rows, &lo, &hi);
        if (hi > lo) rc |= FN(softk_backward)(fam, p + lo * n, g + lo * n, dx + lo * n, hi - lo, n, inv_taud, alphad);
    }
    return rc;
}
