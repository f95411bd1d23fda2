/* Products whose left factor is a sparse map's P (rows of R × S, most
 * entries exactly 0): attention's P·V, and its backward's dP on the support,
 * dS·K, Pᵀ·dO and dSᵀ·Q.  A dense matrix product does S·E multiply-adds a
 * row whatever P holds; these do one pass over the row to list its nonzeros
 * (nonzeros) and E multiply-adds per nonzero, so a row of 2048 keys with
 * 150 in its support (entmax α = 1.3 on N(0, 1) scores) costs the pass and
 * a fourteenth of the arithmetic.  Exact: only terms with p = 0 are left
 * out, so only the order of the sums differs from the dense product (and a
 * value that is inf or NaN at a key of weight 0 no longer makes the row
 * NaN through 0·inf).  A NaN in P counts as a nonzero (NaN != 0) and
 * reaches the output.
 *
 * Every entry point takes G groups (batch × key/value heads) laid out one
 * after another: P (G, R, S), the right factor (G, ·, E) with its own group
 * stride (the keys' tensor may hold more rows than the S a causal chunk
 * sees), and splits the work between `threads` OpenMP threads: by rows
 * where each row writes its own output, by groups where rows scatter into
 * shared key rows (Pᵀ·X).  idx, PAD + S slots per thread, lists a row's
 * nonzeros. */

/* The columns j of row p[0..S) with p[j] != 0, in order, into idx; returns
 * how many.  A bit mask per 32 entries from a vector compare, then one store
 * per nonzero. */
static int64_t FN(nonzeros)(const T *p, int64_t S, cidx_t *idx)
{
    int64_t c = 0, whole = S / 32 * 32;
    for (int64_t j0 = 0; j0 < whole; j0 += 32) {
        uint32_t mask = 0;
#pragma omp simd reduction(| : mask)
        for (int j = 0; j < 32; j++) mask |= (uint32_t)(p[j0 + j] != 0) << j;
        for (; mask; mask &= mask - 1) idx[c++] = (cidx_t)(j0 + __builtin_ctz(mask));
    }
    for (int64_t j = whole; j < S; j++)
        if (p[j] != 0) idx[c++] = (cidx_t)j;
    return c;
}

/* A row of P·X is accumulated in registers: GCC's vectors of 64 bytes
 * (16 floats, 8 doubles; two AVX2 registers each where AVX-512 is
 * missing), PROD_VECS of them a pass over the row's nonzeros.  Written as
 * plain loops, GCC vectorised over the nonzeros instead, with gathers, and
 * kept the accumulators in memory. */
typedef T FN(vec) __attribute__((vector_size(64)));
#define VW ((int64_t)(64 / sizeof(T)))
#define PROD_VECS 4
#define PREFETCH 8

static inline FN(vec) FN(vload)(const T *x)
{
    FN(vec) v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* out[0..E) = Σ_t w[idx[t]] x[idx[t]·E + 0..E): one row of P·X over its
 * nonzeros, x's rows E long: PROD_VECS vectors of columns a pass, then one
 * vector, then the columns left one at a time. */
static void FN(row_times)(const T *w, const T *x, int64_t E, const cidx_t *idx, int64_t c, T *out)
{
    int64_t e0 = 0;
    for (; e0 + PROD_VECS * VW <= E; e0 += PROD_VECS * VW) {
        FN(vec) acc[PROD_VECS] = {0};
        for (int64_t t = 0; t < c; t++) {
            T pj = w[idx[t]];
            const T *xr = x + (int64_t)idx[t] * E + e0;
            const T *xf = x + (int64_t)idx[t + PREFETCH < c ? t + PREFETCH : t] * E + e0;
            for (int u = 0; u < PROD_VECS; u++) __builtin_prefetch(xf + u * VW);
            for (int u = 0; u < PROD_VECS; u++) acc[u] += pj * FN(vload)(xr + u * VW);
        }
        memcpy(out + e0, acc, sizeof acc);
    }
    for (; e0 + VW <= E; e0 += VW) {
        FN(vec) acc = {0};
        for (int64_t t = 0; t < c; t++) acc += w[idx[t]] * FN(vload)(x + (int64_t)idx[t] * E + e0);
        memcpy(out + e0, &acc, sizeof acc);
    }
    for (; e0 < E; e0++) {
        T acc = 0;
        for (int64_t t = 0; t < c; t++) acc += w[idx[t]] * x[(int64_t)idx[t] * E + e0];
        out[e0] = acc;
    }
}

/* a[0..E)·b[0..E): whole vectors into one, its lanes summed, then the rest */
static inline T FN(dot)(const T *a, const T *b, int64_t E)
{
    FN(vec) acc = {0};
    int64_t e = 0;
    for (; e + VW <= E; e += VW) acc += FN(vload)(a + e) * FN(vload)(b + e);
    T d = 0;
    for (int l = 0; l < VW; l++) d += acc[l];
    for (; e < E; e++) d += a[e] * b[e];
    return d;
}

/* The three products, one parallel scaffold (each thread its own idx):
 *   MM      out (G, R, E) = P·B, the G·R rows split between threads;
 *   SAMPLED out (G, R, S) = A·Bᵀ where P is nonzero, 0 elsewhere (A (G, R,
 *           E)), split by rows too;
 *   MM_T    out[g] += Pᵀ·A, A (G, R, E) and out's group g at out + g·bg:
 *           each nonzero an E-long axpy into its key's row, and the rows of
 *           a group scatter into the same key rows, so threads split groups.
 * B's group g is at b + g·bg, S rows of E. */
#ifndef PRODUCT_MODES /* once for both types */
#define PRODUCT_MODES
enum { MM, SAMPLED, MM_T };
#endif
static int FN(sparse_products)(int mode, const T *p, const T *a, const T *b, T *out, int64_t G, int64_t R, int64_t S,
                               int64_t E, int64_t bg, int threads)
{
    int rc = 0;
    if (mode == MM_T && threads > G) threads = (int)(G > 0 ? G : 1);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(| : rc)
#else
    (void)threads;
#endif
    {
        cidx_t *idx = malloc((size_t)(S + PAD) * sizeof(cidx_t));
        if (!idx) {
            rc = -1;
        } else {
            int64_t lo, hi;
            thread_rows(mode == MM_T ? G : G * R, &lo, &hi);
            if (mode == MM_T) { /* whole groups: rows lo·R to hi·R */
                lo *= R;
                hi *= R;
            }
            for (int64_t gr = lo; gr < hi; gr++) { /* row r = gr % R of group g = gr / R */
                const T *pr = p + gr * S, *ar = a + gr * E;
                int64_t c = FN(nonzeros)(pr, S, idx);
                if (mode == MM) {
                    FN(row_times)(pr, b + gr / R * bg, E, idx, c, out + gr * E);
                } else if (mode == SAMPLED) {
                    const T *bb = b + gr / R * bg;
                    T *o = out + gr * S;
                    memset(o, 0, (size_t)S * sizeof(T));
                    for (int64_t t = 0; t < c; t++) o[idx[t]] = FN(dot)(ar, bb + (int64_t)idx[t] * E, E);
                } else {
                    T *ob = out + gr / R * bg;
                    for (int64_t t = 0; t < c; t++) {
                        T pj = pr[idx[t]];
                        T *o = ob + (int64_t)idx[t] * E;
#pragma omp simd
                        for (int64_t e = 0; e < E; e++) o[e] += pj * ar[e];
                    }
                }
            }
            free(idx);
        }
    }
    return rc;
}

/* out (G, R, E) = P (G, R, S) · X, X's group g at x + g·xg (S rows of E). */
int FN(softk_sparse_mm)(const T *p, const T *x, T *out, int64_t G, int64_t R, int64_t S, int64_t E, int64_t xg,
                        int threads)
{
    return FN(sparse_products)(MM, p, NULL, x, out, G, R, S, E, xg, threads);
}

/* out (G, R, S): a[g, r]·b[g, j] where p[g, r, j] != 0, 0 elsewhere; A
 * (G, R, E) rows, B's group g at b + g·bg (S rows of E).  The backward's dP
 * = dO·Vᵀ on the support of P, all that the sparse maps' vector–Jacobian
 * product reads of it. */
int FN(softk_sparse_sampled)(const T *p, const T *a, const T *b, T *out, int64_t G, int64_t R, int64_t S,
                             int64_t E, int64_t bg, int threads)
{
    return FN(sparse_products)(SAMPLED, p, a, b, out, G, R, S, E, bg, threads);
}

/* acc[g, j] += Σ_r p[g, r, j] x[g, r] for P (G, R, S), X (G, R, E) and acc's
 * group g at acc + g·ag (S rows of E): Pᵀ·X added in place. */
int FN(softk_sparse_mm_t)(const T *p, const T *x, T *acc, int64_t G, int64_t R, int64_t S, int64_t E, int64_t ag,
                          int threads)
{
    return FN(sparse_products)(MM_T, p, x, NULL, acc, G, R, S, E, ag, threads);
}

#undef VW
#undef PROD_VECS
