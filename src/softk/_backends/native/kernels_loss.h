/* The fused Fenchel–Young loss for one floating type (T, SUF, EXP, LOG, POW,
 * SQRT are defined by kernels.c; included after kernels_impl.h, whose row
 * scans and solvers it calls).  Per row: λ exactly as the forward finds it
 * (the same functions, in the same order, so p is the forward's to the bit),
 * then one pass that writes the gradient s·(p − y) and sums the loss
 *
 *   L = Σ_i F(u_i) − ⟨u, y⟩ + Ω(y),   u = z − λ,  F' = f,  Ω(y) = Σ ψ(y_i),
 *
 * (Φ(z) = Σ F(z_i − λ) + kλ and ⟨z, y⟩ = ⟨u, y⟩ + kλ, Σy = k: the kλ cancel).
 * u is formed as (z − ref) − λ' with λ = ref + λ' as the solver carries it,
 * so it keeps its precision far from the origin.  F from (u, p):
 *   softmax   F = p, and Σ p = k exactly (summing p would add n roundings);
 *   sparsemax ½ (u)_+²;  entmax15 p (u)_+ / 3;  entmax α p ((α−1)u)_+ / α;
 *   exp       p below saturation, 1 + u on saturated entries.
 * A class-index target t reads ⟨u, y⟩ = u_t and Ω(e_t) = ψ(1).  For the
 * zero-below families (p = 0 off the candidates) with a class index, F is
 * summed over the solver's candidates and the gradient row is the forward's
 * p row (zeroed, candidates scattered) scaled in place: no further pass.
 *
 * Row conventions, as on the unfused path: a row with at most k finite
 * entries has p = 1 on them and λ = its finite maximum, F(u) replaced by
 * u − ψ(1) on the finite entries; a target weighting a −inf class gives +inf
 * (−u·y = +inf); a row holding NaN or +inf gives NaN (loss and gradient);
 * exact L ≥ 0, so rounding below 0 is clamped.  A row whose class index is
 * ignore_index skips everything: loss 0, gradient 0.
 *
 * Targets are checked on the way (the caller raises softk's message):
 * class indices in [0, n) or ignore_index (before any row is touched); a
 * dense row finite, ≥ 0, ≤ 1 for the capped families, summing to k within
 * k·tol (summed in T by the vector lanes: rounding far inside tol, which is
 * at least n ulps of float32).
 */

/* No trapping math here: GCC otherwise will not if-convert (so not
 * vectorise) loops with a floating compare-and-select, and the loss passes
 * are all compare-and-select.  Values are unchanged (inf and NaN keep their
 * IEEE meaning; only floating-point exception flags are not modelled).  The
 * forward's helpers called from here keep their own options. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

static inline T FN(psi_one)(int fam, T alpha)
{
    return fam == 0 || fam == 4 ? (T)-1 : fam == 1 ? (T)0.5 : fam == 2 ? (T)4 / 3 : 1 / (alpha * (alpha - 1));
}

/* ψ(y), 0 at y = 0 (the same formulas as Family.psi).  log and pow never
 * see 0 (their vector variants take a slow scalar path there, 10× slower):
 * they get ``one`` instead, a 1 the compiler cannot see (see fy_pass), as
 * it would otherwise fold log(1) = 0 and call log(y) on every lane. */
static inline T FN(psi)(int fam, T y, T alpha, T one)
{
    if (fam == 0 || fam == 4) return y * LOG(y > 0 ? y : one) - y;
    if (fam == 1) return (T)0.5 * y * y;
    if (fam == 2) return y * SQRT(y) / (T)0.75;
    return POW(y > 0 ? y : one, alpha) * (T)(y > 0) / (alpha * (alpha - 1));
}

/* F(u) given p = f(u) (the same formulas as Family.F). */
static inline T FN(F)(int fam, T u, T p, T alpha)
{
    T w = u > 0 ? u : 0;
    if (fam == 0) return p;
    if (fam == 1) return (T)0.5 * w * w;
    if (fam == 2) return p * w / 3;
    if (fam == 3) return p * ((alpha - 1) * w) / alpha;
    return p < 1 ? p : 1 + u;
}

/* The loss pass over one row: gr[i] = (p_i − y_i)·s (when gr), and the row's
 * terms of L except the class-index ones.  p_i = pr[i]·pm; pr may alias gr
 * (read first).  sumF: add F(u_i) (active rows) or u_i − ψ(1) (filled rows) on the
 * finite entries.  dense: subtract u·y − ψ(y) and check y (its sum into ysum, a bad entry into ybad).
 * Inlined with constant fam/dense, so each variant is its own vector loop. */
static inline __attribute__((always_inline)) T FN(fy_pass)(
    const int fam, const int dense, const int sumF, const T *zr, const T *pr, T pm,
    const T *yr, T *gr, int64_t n, T c, T t, T alpha, int active, T s, T ycap, T *ysum, int *ybad)
{
    T acc = 0, ys = 0, bad = 0, psi1 = FN(psi_one)(fam, alpha), one = 1; /* bad counts in T: one vector width */
#if defined(__GNUC__) && defined(__x86_64__)
    __asm__("" : "+x"(one)); /* an opaque 1: the guard of psi's log/pow stays a guard */
#endif
#pragma omp simd reduction(+ : acc, ys, bad)
    for (int64_t i = 0; i < n; i++) {
        T zi = zr[i], u = (zi - c) - t, p = pr[i] * pm;
        T term = 0, y = 0;
        if (sumF) term = zi > -INFINITY ? (active ? FN(F)(fam, u, p, alpha) : u - psi1) : 0;
        if (dense) {
            y = yr[i];
            term -= (y != 0 ? u * y : 0) - FN(psi)(fam, y, alpha, one);
            ys += y;
            bad += (y >= 0 && y <= ycap && y < INFINITY) ? 0 : 1;
        }
        if (gr) gr[i] = (p - y) * s;
        acc += term;
    }
    if (dense) {
        *ysum = ys;
        *ybad |= bad > 0;
    }
    return acc;
}

#define FY_PASS(dense_, sumF_)                                                                           \
    switch (fam) {                                                                                       \
    case 0: acc += FN(fy_pass)(0, dense_, sumF_, zr, pr, pm, yr, gr, n, ref, lam, alpha, active, s, ycap,   \
                               &ys, ybad); break;                                                        \
    case 1: acc += FN(fy_pass)(1, dense_, sumF_, zr, pr, pm, yr, gr, n, ref, lam, alpha, active, s, ycap,   \
                               &ys, ybad); break;                                                        \
    case 2: acc += FN(fy_pass)(2, dense_, sumF_, zr, pr, pm, yr, gr, n, ref, lam, alpha, active, s, ycap,   \
                               &ys, ybad); break;                                                        \
    case 3: acc += FN(fy_pass)(3, dense_, sumF_, zr, pr, pm, yr, gr, n, ref, lam, alpha, active, s, ycap,   \
                               &ys, ybad); break;                                                        \
    default: acc += FN(fy_pass)(4, dense_, sumF_, zr, pr, pm, yr, gr, n, ref, lam, alpha, active, s, ycap,  \
                                &ys, ybad); break;                                                       \
    }

/* L of one row (see the top of the file).  tgt: the class index, or −1 with
 * a dense row yr.  gr: the gradient row, or NULL (then prow is scratch for
 * p).  val/idx/bm: the forward's scratch (bm NULL for softmax and exp).
 * np: the row's p from narrow_rows, as the forward writes it, with its λ
 * as nref + nlam (fy_rows solves narrow rows a group at a time), or NULL. */
static T FN(fy_row)(int fam, const T *zr, int64_t n, T k, T alpha, const FN(zb_params) *pa, int64_t tgt,
                    const T *yr, T *gr, T *prow, T s, T ycap, double tol, T *val, cidx_t *idx, T *bm, int *ybad,
                    const T *np, T nref, T nlam)
{
    T *pr = gr ? gr : prow;
    int64_t count, iters = 0, c = 0;
    int bad;
    T m = bm ? FN(row_scan_blocks)(zr, n, bm, &count, &bad) : FN(row_scan)(zr, n, &count, &bad);
    int active = !(bad || (double)count <= (double)k), sparse = 0, narrow = 0;
    T ref = m, lam = 0, pm = 1, acc = 0, ys = 0, psi1 = FN(psi_one)(fam, alpha);
    if (!active) {
        FN(fill_conventions)(zr, pr, n, bad);
        ref = count > 0 && !bad ? m : 0;
    } else if (np) { /* softmax: Σ F = k; "exp": F summed in the pass below; else F where p > 0 */
        memcpy(pr, np, (size_t)n * sizeof(T));
        ref = nref;
        lam = nlam;
        narrow = fam >= 1 && fam <= 3;
        if (fam == 0) acc = k;
        if (narrow)
            for (int64_t i = 0; i < n; i++)
                if (pr[i] > 0) acc += FN(F)(fam, (zr[i] - ref) - lam, pr[i], alpha);
    } else if (fam == 0) {
        T sum = FN(store_exp)(zr, pr, m, n);
        pm = k / sum; /* the forward's p = e·(k/Σe) */
        lam = LOG(sum) - LOG(k);
        acc = k; /* Σ F(u) = Σ p = k */
    } else if (fam == 4) {
        T thr;
        if (FN(exp_stored)(zr, pr, m, n, k, &iters, &thr))
            lam = LOG(thr);
        else {
            lam = FN(solve_exp)(zr, m, n, k, &ref, &iters);
            FN(exp_write)(zr, pr, n, ref, lam); /* the forward's own p */
        }
    } else {
        int have_p;
        FN(gathered) from;
        FN(zb_params) pk = FN(zb_params_with_k)(*pa, fam, k); /* k may differ by row */
        lam = FN(solve_zero_below)(fam, zr, bm, m, n, k, &pk, val, idx, &c, &have_p, &iters, &from, 1);
        FN(write_zero_below)(fam, pr, n, lam, alpha, val, idx, c, have_p ? val + n + PAD : NULL, &from); /* val[j] = p of candidate j */
        for (int64_t j = 0; j < c; j++) acc += FN(F)(fam, (zr[idx[j]] - m) - lam, val[j], alpha);
        sparse = yr == NULL;
    }
    T loss;
    if (yr) {
        if (active && fam != 4) FY_PASS(1, 0) else FY_PASS(1, 1)
        *ybad |= !((ys - (double)k) <= tol * (double)k && ((double)k - ys) <= tol * (double)k);
        loss = acc;
    } else {
        T pt = pr[tgt] * pm, ut = (zr[tgt] - ref) - lam;
        if (sparse) {
            if (gr && s != 1)
                for (int64_t j = 0; j < c; j++) gr[idx[j]] *= s;
        } else if (active && (fam == 0 || narrow)) { /* Σ F is in acc */
            if (gr) FY_PASS(0, 0)
        } else {
            FY_PASS(0, 1)
        }
        if (gr) gr[tgt] = (pt - 1) * s;
        /* p = e_t exactly (a sparse map's one-hot at the target): L is 0,
         * where the sum below would leave an ulp of its cancellation. */
        loss = (sparse || narrow) && pt == 1 ? 0 : acc - ut + psi1;
    }
    loss = loss < 0 ? 0 : loss; /* exact L ≥ 0; NaN stays NaN */
    return bad ? (T)NAN : loss;
}
#undef FY_PASS

/* Rows [lo, hi) of one thread, with its own scratch: loss[r] (when loss)
 * and their sum in double into *sum.  Returns 0, or −1 when scratch memory
 * could not be allocated. */
static int FN(fy_rows)(int fam, const T *z, const int64_t *tidx, const T *ty, const T *krow, T *grad, T *loss,
                       int64_t lo, int64_t hi, int64_t n, T k, T alpha, int64_t ignore_index, T s, T ycap,
                       double tol, int *ybad, double *sum)
{
    double acc = 0;
    T *val = NULL, *bm = NULL, *prow = NULL;
    cidx_t *idx = NULL;
    int fail = 0;
    if (fam >= 1 && fam <= 3) {
        val = (T *)malloc((size_t)(2 * (n + PAD)) * sizeof(T)); /* see solve_zero_below */
        idx = (cidx_t *)malloc((size_t)(n + PAD) * sizeof(cidx_t));
        bm = (T *)malloc((size_t)((n + BLK - 1) / BLK) * sizeof(T));
        fail = !val || !idx || !bm;
    }
    if (!grad) fail |= !(prow = (T *)malloc((size_t)n * sizeof(T)));
    FN(zb_params) pa = FN(zb_params_of)(fam, k, alpha);
    /* Narrow rows with one k: p as the forward finds it, a group of NARROW_LANES
     * rows at a time (rows ignored by their index are solved too, unused). */
    int narrow = !krow && FN(narrow_serves)(fam, n, &pa);
    T np[narrow ? NARROW_LANES * n : 1], nm[NARROW_LANES], nlam[NARROW_LANES];
    for (int64_t r = lo; r < hi && !fail; r++) {
        T *gr = grad ? grad + r * n : NULL;
        int64_t tgt = tidx ? tidx[r] : -1;
        int64_t lane = (r - lo) % NARROW_LANES;
        T l = 0;
        if (narrow && lane == 0)
            FN(narrow_rows)(fam, z + r * n, np, hi - r < NARROW_LANES ? (int)(hi - r) : NARROW_LANES, n, k, &pa, nm, nlam);
        if (tidx && tgt == ignore_index) {
            if (gr) memset(gr, 0, (size_t)n * sizeof(T));
        } else {
            l = FN(fy_row)(fam, z + r * n, n, krow ? krow[r] : k, alpha, &pa, tgt, ty ? ty + r * n : NULL, gr, prow,
                           s, ycap, tol, val, idx, bm, ybad, narrow ? np + lane * n : NULL, nm[lane], nlam[lane]);
        }
        if (loss) loss[r] = l;
        acc += (double)l;
    }
    *sum = acc;
    free(val);
    free(idx);
    free(bm);
    free(prow);
    return fail ? -1 : 0;
}

/* The fused loss over rows, split between nthreads OpenMP threads.
 * z (rows, n); exactly one of tidx (rows,) class indices and ty (rows, n)
 * dense targets; krow (rows,) one k per row or NULL (then kd); grad (rows, n)
 * or NULL; loss (rows,) per row or NULL; total (one value) or NULL: the sum
 * of the rows' losses, divided by #rows kept when mean (summed in double,
 * each thread's rows in order, then the threads in order).  The gradient is
 * scaled by inv_tau, and by 1/#kept when mean.  tol < 0: dense rows are not
 * checked.  Returns 0; −1: no scratch memory; −3: rows of a zero-below
 * family longer than CIDX_MAX (nothing written); 1: a class index outside
 * [0, n) that is not ignore_index (nothing written); 2: a dense row that is
 * not a point of the map's domain. */
int FN(softk_fy_loss_threads)(int fam, const T *z, const int64_t *tidx, const T *ty, const T *krow, T *grad,
                              T *loss, T *total, int64_t rows, int64_t n, double kd, double alphad, double inv_taud,
                              int64_t ignore_index, int mean, double tol, int capped, int nthreads)
{
    int64_t nk = rows;
    if (fam >= 1 && fam <= 3 && n > CIDX_MAX) return -3;
    if (tidx) {
        nk = 0;
        for (int64_t r = 0; r < rows; r++) {
            int64_t t = tidx[r];
            if (t == ignore_index) continue;
            if (t < 0 || t >= n) return 1;
            nk++;
        }
    }
    T s = (T)inv_taud;
    if (mean && nk > 0) s = ((T)1 / (T)nk) * s; /* the unfused path's 1/#kept, then 1/τ */
    T ycap = capped ? (T)1 : (T)INFINITY;
    int check = tol >= 0;
    if (!check) tol = INFINITY, ycap = (T)INFINITY;
    double *part = (double *)calloc((size_t)(nthreads > 0 ? nthreads : 1), sizeof(double));
    if (!part) return -1;
    int rc = 0, ybad = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(| : rc, ybad)
#endif
    {
        int64_t lo, hi;
        int th = thread_rows(rows, &lo, &hi);
        if (hi > lo)
            rc |= FN(fy_rows)(fam, z, tidx, ty, krow, grad, loss, lo, hi, n, (T)kd, (T)alphad, ignore_index, s,
                              ycap, tol, &ybad, part + th);
    }
    double tot = sum_parts(part, nthreads > 0 ? nthreads : 1);
    if (total) *total = (T)(mean ? tot / (double)nk : tot);
    return rc ? -1 : (ybad && check ? 2 : 0);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
