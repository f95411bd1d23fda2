/* Su's sparse-softmax cross-entropy, fused (one floating type; included by
 * kernels.c after kernels_impl.h, whose row scans it uses):
 *
 *   ℓ(x; t) = log Σ_{i ∈ S} e^{s_i} − s_t,   s = x/τ,  S = the k largest entries,
 *   ∇_x ℓ = (softmax over S − e_t)/τ.
 *
 * Per row: the scan (max, #finite, NaN/+inf); the k-th largest value θ
 * found without sorting: the k-th largest block maximum is a lower bound of θ
 * (k distinct entries reach it), so only the blocks above it are gathered and
 * θ is selected among them (three-way quickselect, linear in the candidates
 * whatever the ties).  S is every entry above θ and, of the entries equal to
 * θ, the lowest-indexed ones (ties at the k-th place do not change ℓ).
 * ℓ = (m − x_t)/τ + log Σ_S e^{(x_i − m)/τ}, m the row maximum, so neither a
 * far offset nor a small τ rounds it.  The gradient row is zeroed and S and t
 * written.  Rows with at most k finite entries keep all of them; a row with
 * no finite entry, or holding NaN or +inf, is NaN (loss and gradient), as
 * cross-entropy is.  A row whose class index is ignore_index gives 0.
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

/* The k-th largest (k ≥ 1) of a[0..c), c ≥ k, reordering a. */
static T FN(kth_largest)(T *a, int64_t c, int64_t k)
{
    int64_t lo = 0, hi = c, want = k - 1; /* want: rank from the top */
    while (hi - lo > 1) {
        T x = a[lo], y = a[lo + (hi - lo) / 2], w = a[hi - 1];
        T pivot = x < y ? (y < w ? y : (x < w ? w : x)) : (x < w ? x : (y < w ? w : y)); /* median of three */
        int64_t gt = lo, i = lo, lt = hi; /* [lo, gt) > pivot, [gt, i) == pivot, [lt, hi) < pivot */
        while (i < lt) {
            T v = a[i];
            if (v > pivot) {
                a[i++] = a[gt];
                a[gt++] = v;
            } else if (v < pivot) {
                a[i] = a[--lt];
                a[lt] = v;
            } else {
                i++;
            }
        }
        if (want < gt) hi = gt;
        else if (want < lt) return pivot;
        else lo = lt;
    }
    return a[lo];
}

/* ℓ of one row; gr the gradient row or NULL.  Scratch: bm, bt (one slot per
 * block), cv, ci, ct (n slots each). */
static T FN(topk_ce_row)(const T *xr, int64_t n, int64_t k, int64_t tgt, T inv_tau, T *gr, T s, T *bm, T *bt,
                         T *cv, int64_t *ci, T *ct)
{
    int64_t count, c = 0, nb = (n + BLK - 1) / BLK;
    int bad;
    T m = FN(row_scan_blocks)(xr, n, bm, &count, &bad);
    if (bad || count == 0) {
        if (gr)
            for (int64_t i = 0; i < n; i++) gr[i] = (T)NAN;
        return (T)NAN;
    }
    T lb = -INFINITY; /* a lower bound of θ */
    if (count > k && nb >= k) {
        memcpy(bt, bm, (size_t)nb * sizeof(T));
        lb = FN(kth_largest)(bt, nb, k);
    }
    for (int64_t b = 0; b < nb; b++) {
        if (!(bm[b] >= lb)) continue;
        int64_t end = (b + 1) * BLK < n ? (b + 1) * BLK : n;
        for (int64_t i = b * BLK; i < end; i++) {
            T v = xr[i];
            cv[c] = v;
            ci[c] = i;
            c += v >= lb && v > -INFINITY;
        }
    }
    T theta = -INFINITY;
    int64_t ties = c; /* how many entries equal to θ join S */
    if (c > k) {
        memcpy(ct, cv, (size_t)c * sizeof(T));
        theta = FN(kth_largest)(ct, c, k);
        int64_t above = 0;
        for (int64_t j = 0; j < c; j++) above += cv[j] > theta;
        ties = k - above;
    }
    T sum = 0; /* over S, in index order; cv[j] becomes e^{(x − m)/τ} on S and 0 off it */
    for (int64_t j = 0; j < c; j++) {
        T v = cv[j];
        int in = v > theta || (v == theta && ties-- > 0);
        T e = in ? EXP((v - m) * inv_tau) : 0;
        cv[j] = e;
        sum += e;
    }
    if (gr) {
        memset(gr, 0, (size_t)n * sizeof(T));
        T pt = 0;
        for (int64_t j = 0; j < c; j++) {
            T p = cv[j] / sum;
            gr[ci[j]] = p * s;
            pt = ci[j] == tgt ? p : pt;
        }
        gr[tgt] = (pt - 1) * s;
    }
    return (m - xr[tgt]) * inv_tau + LOG(sum);
}

/* Rows [lo, hi) of one thread; their losses summed (double) into *sum.
 * Returns 0, or −1 when scratch memory could not be allocated. */
static int FN(topk_ce_rows)(const T *x, const int64_t *tidx, T *grad, T *loss, int64_t lo, int64_t hi, int64_t n,
                            int64_t k, T inv_tau, int64_t ignore_index, T s, double *sum)
{
    int64_t nb = (n + BLK - 1) / BLK;
    T *bm = (T *)malloc((size_t)(2 * nb) * sizeof(T)), *cv = (T *)malloc((size_t)(2 * n) * sizeof(T));
    int64_t *ci = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    int fail = !bm || !cv || !ci;
    double acc = 0;
    for (int64_t r = lo; r < hi && !fail; r++) {
        T *gr = grad ? grad + r * n : NULL, l = 0;
        if (tidx[r] == ignore_index) {
            if (gr) memset(gr, 0, (size_t)n * sizeof(T));
        } else {
            l = FN(topk_ce_row)(x + r * n, n, k, tidx[r], inv_tau, gr, s, bm, bm + nb, cv, ci, cv + n);
        }
        if (loss) loss[r] = l;
        acc += (double)l;
    }
    *sum = acc;
    free(bm);
    free(cv);
    free(ci);
    return fail ? -1 : 0;
}

/* The fused loss over rows, split between nthreads OpenMP threads; the
 * arguments as for softk_fy_loss_threads (kernels_loss.h), with k the
 * number of entries kept.  Returns 0; −1: no scratch memory; 1: a class
 * index outside [0, n) that is not ignore_index (nothing written). */
int FN(softk_topk_ce_threads)(const T *x, const int64_t *tidx, T *grad, T *loss, T *total, int64_t rows,
                              int64_t n, int64_t k, double inv_taud, int64_t ignore_index, int mean, int nthreads)
{
    int64_t nk = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = tidx[r];
        if (t == ignore_index) continue;
        if (t < 0 || t >= n) return 1;
        nk++;
    }
    T inv_tau = (T)inv_taud, s = inv_tau;
    if (mean && nk > 0) s = ((T)1 / (T)nk) * s;
    int nthr = nthreads > 0 ? nthreads : 1, rc = 0;
    double *part = (double *)calloc((size_t)nthr, sizeof(double));
    if (!part) return -1;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthr) reduction(| : rc)
#endif
    {
        int64_t lo, hi;
        int th = thread_rows(rows, &lo, &hi);
        if (hi > lo) rc |= FN(topk_ce_rows)(x, tidx, grad, loss, lo, hi, n, k, inv_tau, ignore_index, s, part + th);
    }
    double tot = sum_parts(part, nthr);
    if (total) *total = (T)(mean ? tot / (double)nk : tot);
    return rc ? -1 : 0;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
