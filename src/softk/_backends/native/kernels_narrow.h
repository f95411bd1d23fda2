/* Narrow rows (n ≤ NARROW_MAX) of the families with f = 0 below 0, of soft
 * top-k "exp" and of softmax: NARROW_LANES rows at a time, one row per
 * vector lane.
 * Included by kernels_impl.h once per floating type.
 *
 * A row's solve is a few rounds, each a sum over the row.  Solved one row at
 * a time (solve_zero_below), each round ends in a reduction across the
 * vector's lanes and a serial scalar step (a division, a square root, a
 * power), and on rows this short those cost more than the row's own
 * arithmetic.  Here the rows are transposed into columns, v[i][l] = z_l[i] −
 * max z_l, so a round is n vector operations whose sums are per lane, and
 * the scalar steps are vector operations over NARROW_LANES rows at once.
 *
 * The rounds are the row solvers' (solve_sparsemax, solve_entmax15, and for
 * entmax α Newton on h = g^{1/q} − k^{1/q} to 4 EPS), from the family's
 * lower bound pa->lam0, so each lane's λ is the row solver's: a lane that
 * stops keeps its λ while the others go on, and the group stops when every
 * lane has.  Entmax α near 1 (q > 8) needs entmax_near_softmax's second
 * solve and stays with the row code.
 */

#define NARROW_LANES 16
#define NARROW_MAX 256       /* the widest rows any family takes here (narrow_serves) */
#define NARROW_ALPHA_MAX 256 /* entmax α's where q ≥ NARROW_DENSE_Q, the length of its buffer of powers */
#define NARROW_ALPHA_SPARSE 128 /* entmax α's where q < NARROW_DENSE_Q */
#define NARROW_DENSE_Q 4

typedef T FN(column)[NARROW_LANES];

/* Per lane, the count c[l] and sum s[l] of the entries above t[l] (at or
 * above where inclusive, a constant at each call): Michelot's sets for
 * sparsemax, the saturated sets for "exp". */
static inline __attribute__((always_inline)) void FN(lane_count_sum)(FN(column) *v, int64_t n, const T *t,
                                                                     const int inclusive, T *c, T *s)
{
    for (int l = 0; l < NARROW_LANES; l++) s[l] = c[l] = 0;
    for (int64_t i = 0; i < n; i++) {
#pragma omp simd
        for (int l = 0; l < NARROW_LANES; l++) {
            T x = v[i][l];
            int on = inclusive ? x >= t[l] : x > t[l];
            s[l] += on ? x : 0;
            c[l] += on;
        }
    }
}

/* sparsemax: Michelot's rounds, λ ← (Σ_{v > λ} v − k) / #{v > λ}, until the
 * set stops shrinking (λ is then exact: it was computed from this set). */
static int64_t FN(narrow_sparsemax)(FN(column) *v, int64_t n, T k, T *lam, int *done)
{
    T cprev[NARROW_LANES];
    for (int l = 0; l < NARROW_LANES; l++) cprev[l] = -1;
    int64_t it = 0;
    for (; it < n + 2; it++) {
        T s[NARROW_LANES], c[NARROW_LANES];
        FN(lane_count_sum)(v, n, lam, 0, c, s);
        int live = 0;
#pragma omp simd reduction(| : live)
        for (int l = 0; l < NARROW_LANES; l++) {
            /* c = 0 only by rounding (solve_sparsemax's guard): keep λ */
            int stop = done[l] | (c[l] == cprev[l]) | !(c[l] > 0);
            T next = (s[l] - k) / c[l];
            lam[l] = stop ? lam[l] : next;
            cprev[l] = c[l];
            done[l] = stop;
            live |= !stop;
        }
        if (!live) break;
    }
    return it + 1;
}

/* entmax15: solve_entmax15's round per lane, on w = v − λ > 0: the closed
 * form on the set, accepted when its smallest w stays above the root's
 * shift, else Newton's step (from below: g is convex). */
static int64_t FN(narrow_entmax15)(FN(column) *v, int64_t n, T k, T *lam, int *done)
{
    int64_t it = 0;
    for (; it < 2 * n + 100; it++) {
        T D[NARROW_LANES], G[NARROW_LANES], c[NARROW_LANES], wmin[NARROW_LANES];
        for (int l = 0; l < NARROW_LANES; l++) {
            D[l] = G[l] = c[l] = 0;
            wmin[l] = INFINITY;
        }
        for (int64_t i = 0; i < n; i++) {
#pragma omp simd
            for (int l = 0; l < NARROW_LANES; l++) {
                T w = v[i][l] - lam[l];
                int on = w > 0;
                T wo = on ? w : 0;
                D[l] += wo;
                G[l] += wo * wo;
                c[l] += on;
            }
        }
        /* The smallest w in a loop of its own: in the loop above, GCC's
         * jump threading and partial redundancy elimination turn it into
         * a branch, and that loop then runs scalar. */
        for (int64_t i = 0; i < n; i++) {
#pragma omp simd
            for (int l = 0; l < NARROW_LANES; l++) {
                T w = v[i][l] - lam[l];
                T wm = w > 0 ? w : (T)INFINITY;
                wmin[l] = wm < wmin[l] ? wm : wmin[l];
            }
        }
        int live = 0;
#pragma omp simd reduction(| : live)
        for (int l = 0; l < NARROW_LANES; l++) {
            T r = G[l] - 4 * k; /* 4 (g(λ) − k) ≥ 0 */
            T disc = D[l] * D[l] - c[l] * r;
            T dc = r / (D[l] + SQRT(disc > 0 ? disc : 0)); /* smaller root of Σ(w − δ)² = 4k */
            int closed = (disc >= 0) & (wmin[l] > dc);
            T next = lam[l] + r / (2 * D[l]);
            /* after a closed step, the closed form once more from its λ, of
             * either sign (see entmax15_polish): then the lane is done.  Every
             * lane takes it: a per-lane test of whether the step was
             * ill-conditioned (entmax15_ill) made GCC leave these loops
             * scalar, 4 times the time at 16 entries */
            int polish = done[l] == 2;
            int stop = (done[l] == 1) | (!polish & !(r > 0));
            int go = !stop & !polish & !closed & (next > lam[l]);
            int take = !stop & (closed & (D[l] > 0) | go);
            int again = !stop & !polish & closed;
            T to = closed ? lam[l] + dc : next;
            lam[l] = take ? to : lam[l];
            done[l] = go ? 0 : again ? 2 : 1;
            live |= done[l] != 1;
        }
        if (!live) break;
    }
    return it + 1;
}

/* entmax α (q ≤ 8): Newton on h = g^{1/q} − k^{1/q} (convex, nearly
 * linear), as solve_entmax_alpha, until the step is below 4 EPS (1 + |λ|),
 * or the error after it is predicted to be (from the last two steps, as
 * solve_entmax_alpha predicts it) and power_shifted's write is exact for
 * it, or g(λ) ≤ k (the root, to rounding) or λ stops moving.  Each round
 * leaves w^q in pw, and a lane that stops keeps the λ of its last round
 * with the step it did not take in dl[l] (0 where it stopped at the root),
 * so that narrow_rows writes p from pw without a pass of powers.  (A lane
 * that has stopped recomputes the same pw in the rounds its neighbours
 * still take.)  Halley's step, which the row solve takes where q ≥ 2, cost
 * more here than the round it saves in some lanes: a group takes as many
 * rounds as its slowest lane. */
static int64_t FN(narrow_entmax_alpha)(FN(column) *v, FN(column) *pw, int64_t n, T k, const FN(zb_params) *pa,
                                       T *lam, T *dl, int *done)
{
    T am1 = pa->am1, q = pa->q, kq = pa->kq;
    T lastmax = (T)((double)kq * pa->dmax1); /* the longest step power_shifted writes exactly */
    volatile T one_v = 1; /* opaque: see entmax_sums */
    T one = one_v;
    T prev[NARROW_LANES]; /* each lane's previous step */
    for (int l = 0; l < NARROW_LANES; l++) dl[l] = prev[l] = 0;
    int64_t it = 0;
    for (; it < 2 * n + 100; it++) {
        T G[NARROW_LANES], S[NARROW_LANES];
        for (int l = 0; l < NARROW_LANES; l++) G[l] = S[l] = 0;
        for (int64_t i = 0; i < n; i++) {
#pragma omp simd
            for (int l = 0; l < NARROW_LANES; l++) {
                T w = am1 * (v[i][l] - lam[l]);
                T on = w > 0;
                T w1 = WPOS(w, one);
                T wq = POWQ(w1, q) * on;
                pw[i][l] = wq;
                G[l] += wq;
                S[l] += wq / w1;
            }
        }
        int live = 0;
#pragma omp simd reduction(| : live)
        for (int l = 0; l < NARROW_LANES; l++) {
            T g = G[l] > 0 ? G[l] : one;
            T Gq = POW(g, am1); /* G^{1/q} */
            T step = q * (Gq - kq) * (g / Gq) / S[l];
            T next = lam[l] + step;
            T tol = 4 * EPS * (1 + (lam[l] < 0 ? -lam[l] : lam[l]));
            T pv = prev[l];
            int last = (step <= tol) | ((pv > 0) & (16 * step * step * step <= tol * pv * pv) & (step <= lastmax));
            /* past the root (g ≤ k), by the rounding of G and of the step
             * that came here (hundreds of ulps of p on near-constant rows):
             * a step back that power_shifted writes exactly is written as a
             * forward one is; a longer one is taken (Newton from the right
             * lands left of the root: h is convex) */
            int past = !done[l] & !(G[l] > k) & (G[l] > 0) & (step < 0) & (next < lam[l]);
            int back = past & (-step <= lastmax);
            int move = !done[l] & ((G[l] > k) & (next > lam[l]) | past & !back);
            int go = move & (!last | past);
            lam[l] = go ? next : lam[l];
            dl[l] = (move & !go) | back ? step : dl[l];
            prev[l] = step;
            done[l] = !go;
            live |= go;
        }
        if (!live) break;
    }
    return it + 1;
}

/* softmax: e = e^v stored in v; t[l] = Σ e (no rounds). */
static int64_t FN(narrow_softmax)(FN(column) *v, int64_t n, T *t)
{
    for (int l = 0; l < NARROW_LANES; l++) t[l] = 0;
    for (int64_t i = 0; i < n; i++) {
#pragma omp simd
        for (int l = 0; l < NARROW_LANES; l++) {
            T e = EXP(v[i][l]);
            v[i][l] = e;
            t[l] += e;
        }
    }
    return 1;
}

/* soft top-k "exp": exp_stored's rounds per lane, on e = e^v stored in v:
 * with t = e^λ, t ← (S − Σ_{e ≥ t} e) / (k − #{e ≥ t}) from t = S/k, until
 * the saturated set stops growing (λ exact) or t > 1 (nothing saturates).
 * A lane where exp_stored would give up (k or more saturated, or the
 * saturated part over half of S) is flagged in fb[l]: narrow_rows solves
 * that row with solve_exp, as the row code does. */
static int64_t FN(narrow_exp)(FN(column) *v, int64_t n, T k, T *t, int *fb, int *done)
{
    T S[NARROW_LANES], prev[NARROW_LANES];
    FN(narrow_softmax)(v, n, S); /* e = e^v in v, S = Σ e */
    for (int l = 0; l < NARROW_LANES; l++) prev[l] = 0;
    for (int l = 0; l < NARROW_LANES; l++) {
        t[l] = S[l] / k;
        fb[l] = 0;
        done[l] |= !(t[l] <= 1);
    }
    int64_t it = 0;
    for (; it < (int64_t)k + 3; it++) {
        T ns[NARROW_LANES], ss[NARROW_LANES];
        FN(lane_count_sum)(v, n, t, 1, ns, ss);
        int live = 0;
#pragma omp simd reduction(| : live)
        for (int l = 0; l < NARROW_LANES; l++) {
            int stop = done[l] | (ns[l] == prev[l]);
            int bail = !stop & ((ns[l] >= k) | (ss[l] > S[l] / 2));
            T tn = (S[l] - ss[l]) / (k - ns[l]);
            int go = !stop & !bail;
            t[l] = go ? tn : t[l];
            prev[l] = go ? ns[l] : prev[l];
            fb[l] |= bail;
            go &= tn <= 1;
            done[l] = !go;
            live |= go;
        }
        if (!live) break;
    }
    return it + 1;
}

/* Whether rows of n entries of family fam go to narrow_rows: up to the
 * width where the row code catches up, which is where its own rounds are
 * cheap (softmax's one pass, "exp"'s compares on the stored e) or the lanes'
 * rounds are dear (entmax α's powers, from a far starting bound), and
 * entmax α only with q ≤ 8.  The lanes' rounds take a power per entry, the
 * row solve's one per candidate: where q ≥ NARROW_DENSE_Q (α ≤ 1.25) the
 * supports are dense, the row solve has about as many candidates as
 * entries, and the lanes keep ahead to twice the width. */
static inline int FN(narrow_serves)(int fam, int64_t n, const FN(zb_params) *pa)
{
    if (fam == 1 || fam == 2) return n <= NARROW_MAX;
    if (fam == 3) return n <= (pa->q >= NARROW_DENSE_Q ? NARROW_ALPHA_MAX : NARROW_ALPHA_SPARSE) && pa->q <= 8;
    if (fam == 4) return n <= 64;
    return fam == 0 && n <= 128;
}

/* Rows [0, nr) of z, nr ≤ NARROW_LANES, n ≤ NARROW_MAX (narrow_serves): p, and
 * when mo is not NULL each row's λ as a reference entry mo[l] (the max, or
 * for "exp" solve_exp's ref) plus lo[l]; returns the largest number of
 * rounds.  Lanes from nr on hold rows of zeros, solved and not written. */
static int64_t FN(narrow_rows)(int fam, const T *z, T *p, int nr, int64_t n, T k, const FN(zb_params) *pa, T *mo,
                               T *lo)
{
    FN(column) v[NARROW_MAX], pw[NARROW_ALPHA_MAX];
    T m[NARROW_LANES], lam[NARROW_LANES], dl[NARROW_LANES], cnt[NARROW_LANES];
    int bad[NARROW_LANES], conv[NARROW_LANES], done[NARROW_LANES], fb[NARROW_LANES];
    int ni = (int)n;
    for (int l = 0; l < NARROW_LANES; l++) {
        m[l] = -INFINITY;
        cnt[l] = 0;
        bad[l] = 0;
    }
    /* The transpose: a whole group of float rows with AVX-512 by blocks of
     * 16 columns (transpose16_avx512), the rest as plain copies, a row at a
     * time (loaded inside the scan below, each column took a masked gather,
     * which cost more). */
    int i0 = 0;
#if TRANSPOSE16
    if (nr == NARROW_LANES)
        for (; i0 + 16 <= ni; i0 += 16) transpose16_avx512(z + i0, ni, &v[i0][0], NARROW_LANES);
#endif
    for (int l = 0; l < NARROW_LANES; l++) {
        const T *zl = z + l * ni;
        if (l < nr)
            for (int i = i0; i < ni; i++) v[i][l] = zl[i];
        else
            for (int i = i0; i < ni; i++) v[i][l] = 0;
    }
    for (int i = 0; i < ni; i++) {
#pragma omp simd
        for (int l = 0; l < NARROW_LANES; l++) {
            T x = v[i][l];
            m[l] = x > m[l] ? x : m[l];
            cnt[l] += x > -INFINITY;
            bad[l] |= (x != x) | (x == INFINITY);
        }
    }
    for (int l = 0; l < NARROW_LANES; l++) {
        conv[l] = bad[l] | (cnt[l] <= k); /* NaN, +inf, or at most k finite entries: fill_conventions */
        done[l] = conv[l];
        lam[l] = pa->lam0;
    }
    for (int i = 0; i < ni; i++) {
#pragma omp simd
        for (int l = 0; l < NARROW_LANES; l++) v[i][l] -= m[l];
    }
    for (int l = 0; l < NARROW_LANES; l++) fb[l] = 0;
    int64_t it = fam == 0   ? FN(narrow_softmax)(v, n, lam)
                 : fam == 1 ? FN(narrow_sparsemax)(v, n, k, lam, done)
                 : fam == 2 ? FN(narrow_entmax15)(v, n, k, lam, done)
                 : fam == 3 ? FN(narrow_entmax_alpha)(v, pw, n, k, pa, lam, dl, done)
                            : FN(narrow_exp)(v, n, k, lam, fb, done);
    /* p = f(v − λ).  Entmax α: p at λ + δ (δ = dl, the step not taken)
     * from pw = w^q at λ (power_shifted, as solve_entmax_alpha's last round
     * writes it), exact to rounding for δ up to k^{1/q} dmax1 (zb_params),
     * the longest step a lane stops with; 0 where v ≤ λ + δ. */
    if (fam == 3) {
        T am1 = pa->am1, q = pa->q, c2 = q * (q - 1) / 2, c3 = c2 * (q - 2) / 3, zero = 0;
        volatile T one_v = 1; /* opaque: see entmax_sums */
        T one = one_v;
        for (int i = 0; i < ni; i++) {
#pragma omp simd
            for (int l = 0; l < NARROW_LANES; l++) {
                T x = v[i][l] - lam[l];
                T pj = FN(power_shifted)(pw[i][l], am1 * dl[l] / WPOS(am1 * x, one), q, c2, c3);
                pw[i][l] = x > dl[l] ? pj : zero;
            }
        }
        for (int l = 0; l < NARROW_LANES; l++) lam[l] += dl[l];
    } else if (fam == 0) { /* p = e·(k/Σe), as softk_forward; λ − max = log Σe − log k */
        T scale[NARROW_LANES];
        for (int l = 0; l < NARROW_LANES; l++) scale[l] = k / lam[l];
        for (int i = 0; i < ni; i++) {
#pragma omp simd
            for (int l = 0; l < NARROW_LANES; l++) v[i][l] *= scale[l];
        }
        for (int l = 0; l < NARROW_LANES; l++) lam[l] = LOG(lam[l]) - LOG(k);
    } else if (fam == 4) { /* p = min(1, e/t), 1 only above t, as exp_stored; λ − max = log t */
        T inv[NARROW_LANES];
        for (int l = 0; l < NARROW_LANES; l++) inv[l] = 1 / lam[l];
        for (int i = 0; i < ni; i++) {
#pragma omp simd
            for (int l = 0; l < NARROW_LANES; l++) {
                T e = v[i][l] * inv[l];
                v[i][l] = v[i][l] <= lam[l] ? (e < BELOW_ONE ? e : BELOW_ONE) : 1;
            }
        }
        for (int l = 0; l < NARROW_LANES; l++) lam[l] = LOG(lam[l]);
    } else {
        for (int i = 0; i < ni; i++) {
#pragma omp simd
            for (int l = 0; l < NARROW_LANES; l++) {
                T u = v[i][l] - lam[l];
                u = u > 0 ? u : 0;
                v[i][l] = fam == 1 ? u : (T)0.25 * u * u;
            }
        }
    }
    FN(column) *pv = fam == 3 ? pw : v;
    i0 = 0; /* back to rows, as into columns; the rows below replace theirs */
#if TRANSPOSE16
    if (nr == NARROW_LANES)
        for (; i0 + 16 <= ni; i0 += 16) transpose16_avx512(&pv[i0][0], NARROW_LANES, p + i0, ni);
#endif
    for (int l = 0; l < nr; l++) {
        T *pr = p + l * n;
        if (conv[l]) {
            FN(fill_conventions)(z + l * n, pr, n, bad[l]);
            continue;
        }
        if (fb[l]) { /* "exp" where exp_stored gives up: the row code's solve */
            int64_t its;
            T ref, ell = FN(solve_exp)(z + l * n, m[l], n, k, &ref, &its);
            FN(exp_write)(z + l * n, pr, n, ref, ell);
            m[l] = ref;
            lam[l] = ell;
            it = its + 1 > it ? its + 1 : it;
            continue;
        }
        for (int i = i0; i < ni; i++) pr[i] = pv[i][l];
    }
    if (mo)
        for (int l = 0; l < nr; l++) {
            mo[l] = m[l];
            lo[l] = lam[l];
        }
    return it;
}
