/* Row scans and the solvers of the families with f = 0 below 0 (sparsemax,
 * entmax15, entmax α): block maxima, candidates, Newton (Halley for
 * α ≤ 1.5) from a lower bound, closed forms.  Included by kernels_impl.h
 * once per floating type.
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
static int64_t FN(compact)(T *val, cidx_t *idx, int64_t c, T lam)
{
    int64_t c2 = 0;
    for (int64_t j = 0; j < c; j++) {
        T v = val[j];
        cidx_t ix = idx[j];
        val[c2] = v;
        idx[c2] = ix;
        c2 += v > lam;
    }
    return c2;
}

/* G = Σ w^q and S = Σ w^{q−1} over w = (α−1)(v − λ) > 0, v in val[0..cp),
 * and pw[j] = w_j^q (0 off support); cp a multiple of PAD (no scalar
 * remainder).  w^q is POWQ: 2^{q log2 w} inline for float, e^{q log w} with
 * libmvec's vector exp and log for double; either way the relative error, a
 * few ulps times (1 + |log w^q|), is a few ulps of the p that matter
 * (w^q ≤ k; tiny w^q add tiny absolute errors).  The mask multiplies rather
 * than selects: with a select GCC sinks libmvec's calls into a branch, and
 * a loop with a branch around a call is not vectorised (the calls then run
 * scalar).  POWQ gets WPOS(w): for double 1 where w ≤ 0 (libmvec's log
 * takes a slow path for 0 and negatives), for float max(w, FLT_MIN)
 * (fast_log2f needs a normal w; the p lost is below FLT_MIN).
 *
 * G is summed in double on more than WIDE_SUMS candidates (wide = 1).  λ is
 * found where G = k, so G's rounding is λ's error, and a float lane's sum
 * of its n/PAD near-equal terms drifts by up to about n/PAD half-ulps: p
 * was off by 150–200 ulps on 32768 equal entries, by at most 5 on 1024.
 * Double rows gain nothing from a double G that way; so a wide row's G
 * is summed in blocks of WIDE_BLOCK, each block's sum then added to the
 * total: a lane adds WIDE_BLOCK/PAD terms and the total cp/WIDE_BLOCK,
 * where one lane added cp/PAD (p of double rows of 32768 equal entries was
 * off by up to 350 ulps).  S and R only size the step.
 * wide is a constant wherever the bodies are inlined, so each loop holds
 * one accumulator of G. */
#define WIDE_SUMS 1024
#define WIDE_BLOCK 256
static inline __attribute__((always_inline)) void FN(entmax_sums_body)(const T *val, int64_t cp, T lam, T am1, T q,
                                                                      T *pw, T *Gp, T *Sp, int wide)
{
    /* An opaque 1: with a literal, GCC rewrites log(w > 0 ? w : 1) as
     * (w > 0 ? log(w) : 0), and log then gets the 0s and negatives after all. */
    volatile T one_v = 1;
    T one = one_v;
    T G = 0, S = 0;
    double Gd = 0;
    for (int64_t b0 = 0; b0 < cp; b0 += wide ? WIDE_BLOCK : cp) {
        int64_t b1 = wide && b0 + WIDE_BLOCK < cp ? b0 + WIDE_BLOCK : cp;
        double Gb = 0;
#pragma omp simd reduction(+ : G, Gb, S)
        for (int64_t j = b0; j < b1; j++) {
            T w = am1 * (val[j] - lam);
            T on = w > 0;
            T w1 = WPOS(w, one);
            T wq = POWQ(w1, q) * on;
            pw[j] = wq;
            if (wide)
                Gb += wq;
            else
                G += wq;
            S += wq / w1;
        }
        Gd += Gb;
    }
    *Gp = wide ? (T)Gd : G;
    *Sp = S;
}

static void FN(entmax_sums)(const T *val, int64_t cp, T lam, T am1, T q, T *pw, T *Gp, T *Sp)
{
    if (cp > WIDE_SUMS)
        FN(entmax_sums_body)(val, cp, lam, am1, q, pw, Gp, Sp, 1);
    else
        FN(entmax_sums_body)(val, cp, lam, am1, q, pw, Gp, Sp, 0);
}

/* entmax_sums with R = Σ w^{q−2} too, for Halley's step (q ≥ 2, so w^{q−2}
 * stays bounded at the support's edge): w^{q−2} as POWQ, then w^{q−1} and
 * w^q by multiplying by w (no division), each a rounding more.  With rough
 * set, w^{q−2} is ROUGH's and pw is not written (entmax_sums3_rough); G
 * in double where wide, as in entmax_sums_body. */
static inline __attribute__((always_inline)) void FN(entmax_sums3_body)(const T *val, int64_t cp, T lam, T am1, T q,
                                                                       T *pw, T *Gp, T *Sp, T *Rp, int rough,
                                                                       int wide)
{
    volatile T one_v = 1; /* opaque: see entmax_sums */
    T one = one_v;
    T G = 0, S = 0, R = 0;
    double Gd = 0;
    for (int64_t b0 = 0; b0 < cp; b0 += wide ? WIDE_BLOCK : cp) {
        int64_t b1 = wide && b0 + WIDE_BLOCK < cp ? b0 + WIDE_BLOCK : cp;
        double Gb = 0;
#pragma omp simd reduction(+ : G, Gb, S, R)
        for (int64_t j = b0; j < b1; j++) {
            T w = am1 * (val[j] - lam);
            T on = w > 0;
            T w1 = WPOS(w, one);
            T w2 = (rough ? ROUGH(w1, q - 2) : POWQ(w1, q - 2)) * on;
            T w3 = w2 * w1, wq = w3 * w1;
            if (!rough) pw[j] = wq;
            if (wide)
                Gb += wq;
            else
                G += wq;
            S += w3;
            R += w2;
        }
        Gd += Gb;
    }
    *Gp = wide ? (T)Gd : G;
    *Sp = S;
    *Rp = R;
}

/* The two, each its own function with rough a constant: with rough read in
 * the loop GCC computed both powers, and inlined into the solver both
 * loops made its code slower.  The rough round's G only chooses where the
 * exact round is taken, and stays in float. */
static void FN(entmax_sums3)(const T *val, int64_t cp, T lam, T am1, T q, T *pw, T *Gp, T *Sp, T *Rp)
{
    if (cp > WIDE_SUMS)
        FN(entmax_sums3_body)(val, cp, lam, am1, q, pw, Gp, Sp, Rp, 0, 1);
    else
        FN(entmax_sums3_body)(val, cp, lam, am1, q, pw, Gp, Sp, Rp, 0, 0);
}

static void FN(entmax_sums3_rough)(const T *val, int64_t cp, T lam, T am1, T q, T *Gp, T *Sp, T *Rp)
{
    FN(entmax_sums3_body)(val, cp, lam, am1, q, NULL, Gp, Sp, Rp, 1, 0);
}

/* What the solvers need of α and k, found once per call rather than per row
 * and round (entmax α: pows and a cbrt):
 *   lam0  the family's lower bound of λ − max, where the top entry alone
 *         gives g = k: −k, −2√k, −k^{1/q}/(α−1);
 *   kq    k^{1/q} = k^{α−1} (entmax α);
 *   dmax1 the longest last step, over kq, whose third-order write (see
 *         solve_candidates) is exact: (1 − t)^q less its cubic Taylor
 *         polynomial is c4 (1 − ξ)^{q−4} t⁴ for some ξ in (0, t) (Lagrange),
 *         c4 = q(q−1)(q−2)(q−3)/24, at most 8 |c4| t⁴ for t ≤ ½ (q ≥ 1).
 *         That is below an ulp, for every p ≥ EPS·k (w ≥ (EPS k)^{1/q},
 *         t = aδ/w), when aδ ≤ (EPS k)^{1/q} min(½, (EPS/(8|c4|))^{1/4});
 *         smaller p err by at most about their own size times 8 |c4|, far
 *         below an ulp of k.  c4 = 0 (q = 1, 2, 3): the cubic is (1 − t)^q
 *         and t ≤ ½ is the only limit. */
typedef struct {
    T am1, q, kq, lam0;
    double dmax1;
} FN(zb_params);

/* pa for another k (the fused loss takes one k a row): kq and lam0 */
static FN(zb_params) FN(zb_params_with_k)(FN(zb_params) pa, int fam, T k)
{
    pa.kq = fam == 3 ? POW(k, pa.am1) : 0;
    pa.lam0 = fam == 1 ? -k : fam == 2 ? -2 * SQRT(k) : -pa.kq / pa.am1;
    return pa;
}

static FN(zb_params) FN(zb_params_of)(int fam, T k, T alpha)
{
    FN(zb_params) pa;
    pa.am1 = alpha - 1;
    pa.q = 1 / pa.am1;
    double q = pa.q, c4 = fabs(q * (q - 1) * (q - 2) * (q - 3) / 24), tmax = 0.5;
    if (fam == 3 && c4 > 0) {
        double t4 = pow((double)EPS / (8 * c4), 0.25);
        tmax = t4 < tmax ? t4 : tmax;
    }
    pa.dmax1 = fam == 3 ? pow((double)EPS, (double)pa.am1) * tmax / (double)pa.am1 : INFINITY;
    return FN(zb_params_with_k)(pa, fam, k);
}

/* Rounds at most of the solves on the block maxima (solve_zero_below):
 * the iterates climb to the subset's λ from below, so each is a bound, and
 * the rounds after these cost more than the few candidates they would keep
 * out of the gather.  Entmax α's round is dearer (a power per block, then a
 * scalar power) and its first step from the family's bound already lands
 * near the subset's λ: it takes one, and a second only where more than
 * STAGE0_WIDE blocks are in play, whose bound then keeps whole blocks out
 * of the gather. */
#define STAGE0_ROUNDS 2
#define STAGE0_WIDE 64

/* ---------------------------------------------------------------------------
 * Families with f(u) = 0 for u ≤ 0 (sparsemax, entmax15, entmax α ≤ 2).
 * g(λ) = Σ f(v − λ) is convex and decreasing, so Newton started at a lower
 * bound (g ≥ k there) climbs to λ without overshooting, and entries at or
 * below the current λ can be dropped for good: each round touches only the
 * surviving candidates (val, idx)[0..c), all > lam on entry.  One solver a
 * family; solve_candidates sends a row to its own.  Each returns λ, leaves
 * in (val, idx)[0..*c) every candidate with v > λ (and possibly a few at or
 * below λ, where f = 0) and adds its rounds to *it.
 */

/* sparsemax: the Newton step is the closed form on the current support
 * (Michelot); exact as soon as the support stops shrinking.  At most
 * `most` rounds: every iterate is a lower bound of λ. */
static T FN(solve_sparsemax)(T lam, T k, T *val, cidx_t *idx, int64_t *cp, int64_t *itp, int64_t most)
{
    int64_t c = *cp, it = 0;
    for (; it < 2 * c + 100 && it < most; it++) {
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < c; j++) s += val[j];
        T next = (s - k) / (T)c;
        int64_t c2 = FN(compact)(val, idx, c, next);
        if (c2 == 0) break; /* rounding guard: keep the last λ */
        lam = next;
        if (c2 == c) break;
        c = c2;
    }
    *cp = c;
    *itp += it + (it < most);
    return lam;
}

/* The closed form once more, from the λ it gave, on the same candidates.
 * From a bound far below the root, D² and c·r are both of size c²w² and
 * their difference (about 4ck) cancels: on a row of 32768 equal entries in
 * float32 p was off by 1.4e-3; where the step is long beside the w it
 * leaves, λ + δ cancels to them too (entmax15_ill says when).  At the root
 * the w are the support's own and the second step, of either sign, is well
 * conditioned: a candidate whose w it would not keep above 0 leaves λ as it
 * is. */
static inline int FN(entmax15_ill)(T D, T disc, T dc, T wmin)
{
    /* the closed step lost digits: D² ≫ disc (their difference cancelled), or
     * the step is long beside the w it leaves (λ + δ cancels to them) */
    return (D * D > 16 * disc) | (dc > 16 * (wmin - dc));
}

static T FN(entmax15_polish)(T lam, T k, const T *val, int64_t c)
{
    /* in double: a float row's sums of c terms, whose error grew as c·eps;
     * in blocks of WIDE_BLOCK, for double rows (see entmax_sums_body) */
    double D = 0, G = 0;
    T wmin = INFINITY;
    for (int64_t b0 = 0; b0 < c; b0 += WIDE_BLOCK) {
        int64_t b1 = b0 + WIDE_BLOCK < c ? b0 + WIDE_BLOCK : c;
        double Db = 0, Gb = 0;
#pragma omp simd reduction(+ : Db, Gb) reduction(min : wmin)
        for (int64_t j = b0; j < b1; j++) {
            T w = val[j] - lam;
            Db += w;
            Gb += (double)w * w;
            wmin = w < wmin ? w : wmin;
        }
        D += Db;
        G += Gb;
    }
    double r = G - 4 * (double)k, disc = D * D - (double)c * r;
    if (!(disc >= 0 && D > 0)) return lam;
    double dc = r / (D + sqrt(disc));
    return wmin > dc ? lam + (T)dc : lam;
}

/* entmax15: the closed form (a quadratic) on the current support is tried
 * first and accepted when no candidate falls below it (exact): the smallest
 * candidate, found in the pass that sums, stays above it; otherwise a Newton
 * step, from below (g is convex).  At most `most` rounds: every iterate is a
 * lower bound of λ; a closed step that lost digits is taken once more
 * (entmax15_polish). */
static T FN(solve_entmax15)(T lam, T k, T *val, cidx_t *idx, int64_t *cp, int64_t *itp, int64_t most)
{
    int64_t c = *cp, it = 0;
    for (; it < 2 * c + 100 && it < most; it++) {
        T D = 0, G = 0, wmin = INFINITY; /* Σw, Σw², min w, w = v − λ > 0 on the candidates */
#pragma omp simd reduction(+ : D, G) reduction(min : wmin)
        for (int64_t j = 0; j < c; j++) {
            T w = val[j] - lam;
            D += w;
            G += w * w;
            wmin = w < wmin ? w : wmin;
        }
        T r = G - 4 * k; /* 4 (g(λ) − k) ≥ 0 */
        if (!(r > 0)) break;
        T disc = D * D - (T)c * r;
        if (disc >= 0) {
            T dc = r / (D + SQRT(disc)); /* smaller root of Σ(w − δ)² = 4k */
            if (wmin > dc) { /* every candidate stays above it */
                lam += dc;
                if (FN(entmax15_ill)(D, disc, dc, wmin)) lam = FN(entmax15_polish)(lam, k, val, c);
                break;
            }
        }
        T next = lam + r / (2 * D);
        if (!(next > lam)) break;
        c = FN(compact)(val, idx, c, next);
        lam = next;
    }
    *cp = c;
    *itp += it + (it < most);
    return lam;
}

/* w^q moved to (w − aδ)^q from w^q itself, to third order: w^q (1 − q t +
 * c2 t² − c3 t³), t = aδ/w, c2 = q(q − 1)/2, c3 = c2 (q − 2)/3, clamped at
 * 0 (t near 1 and beyond: p that small, or 0).  Exact to rounding for the
 * steps zb_params' dmax1 allows (solve_entmax_alpha's last round, the
 * narrow rows' write). */
static inline T FN(power_shifted)(T wq, T t, T q, T c2, T c3)
{
    T pj = wq * (1 + t * (t * (c2 - c3 * t) - q));
    return pj > 0 ? pj : (T)0;
}

/* The candidates' p at λ + step from their w^q at λ (pw, in place), to
 * third order (power_shifted): 0 where v ≤ λ + step.  The step is short
 * enough for that write to be exact (zb_params' dmax1); it may be negative,
 * back from a λ past the root.  Returns λ + step. */
static T FN(shift_powers)(const T *val, T *pw, int64_t cp, T lam, T step, T am1, T q, T one)
{
    T next = lam + step, ad = am1 * step, c2 = q * (q - 1) / 2, c3 = c2 * (q - 2) / 3, zero = 0;
#pragma omp simd
    for (int64_t j = 0; j < cp; j++) {
        T v = val[j], w = am1 * (v - lam);
        T pj = FN(power_shifted)(pw[j], ad / WPOS(w, one), q, c2, c3);
        pw[j] = v > next ? pj : zero;
    }
    return next;
}

/* Newton's step on h = g^{1/q} − k^{1/q} from G = g(λ) and S = −g′(λ)
 * (a·q = 1): q (G^{1/q} − k^{1/q}) G^{1−1/q} / S.  Near the root, where
 * |G/k − 1| ≤ 1/16 (every round but the first on most rows), it is q G e /
 * ((1 + e) S) with e = (G/k)^{1/q} − 1 from its binomial series in
 * d = (G − k)/k (G − k exact there), to d⁶: the terms left out are below
 * d⁶/7 ≤ 1e-8 of e.  That spares the round its scalar pow, and e keeps its
 * digits where G^{1/q} − k^{1/q} cancelled to a few of them. */
static inline T FN(h_newton_step)(T G, T S, T k, T am1, T q, T kq)
{
    T d = (G - k) / k;
    if (!(fabs((double)d) <= 1.0 / 16)) {
        T Gq = POW(G, am1); /* G^{1/q}; G^{1−1/q} = G / G^{1/q} */
        return q * (Gq - kq) * (G / Gq) / S;
    }
    T s = 1 + (am1 - 5) / 6 * d;
    s = 1 + (am1 - 4) / 5 * d * s;
    s = 1 + (am1 - 3) / 4 * d * s;
    s = 1 + (am1 - 2) / 3 * d * s;
    s = 1 + (am1 - 1) / 2 * d * s;
    T e = am1 * d * s;
    return q * G * e / ((1 + e) * S);
}

/* One row's solve_entmax_alpha as a state, so that the rounds of several rows
 * can alternate (entmax_alpha_rows): alpha_begin, then alpha_sums and
 * alpha_next in turn until done.  The fields are solve_entmax_alpha's
 * locals. */
typedef struct {
    T lam, lo, k, G, S, R;
    double prev; /* the previous round's step */
    T *val, *pw;
    int64_t c, cp, it;
    int final, halley, rough, r, have_p, done;
} FN(alpha_state);

static inline void FN(alpha_begin)(FN(alpha_state) *s, T lam, T k, const FN(zb_params) *pa, int final, T *val, T *pw,
                                   int64_t c)
{
    s->lam = s->lo = lam;
    s->k = k;
    s->prev = 0;
    s->val = val;
    s->pw = pw;
    s->c = c;
    s->it = 0;
    s->final = final;
    s->halley = final && pa->q >= 2;
    s->rough = s->halley && ROUGH_FIRST && pa->q <= 8 && c > 2 * PAD;
    s->have_p = 0;
    s->done = 0;
    /* Whole vectors only: a scalar call in the loop's remainder costs as much
     * as a vector one, so pad with −inf (w < 0, masked); val has PAD spare
     * slots. */
    s->cp = (c + PAD - 1) / PAD * PAD;
    for (int64_t j = c; j < s->cp; j++) val[j] = -INFINITY;
}

/* A round's sums at s->lam: G = Σw^q, S = Σw^{q−1} = −dG/dλ (a·q = 1), R =
 * Σw^{q−2} (Halley only), w = (α−1)(v − λ) > 0 */
static inline void FN(alpha_sums)(FN(alpha_state) *s, const FN(zb_params) *pa)
{
    T G = 0, S = 0, R = 0, am1 = pa->am1, q = pa->q;
    s->r = s->rough && s->it == 0; /* the rough round */
    if (s->r)
        FN(entmax_sums3_rough)(s->val, s->cp, s->lam, am1, q, &G, &S, &R);
    else if (s->halley)
        FN(entmax_sums3)(s->val, s->cp, s->lam, am1, q, s->pw, &G, &S, &R);
    else
        FN(entmax_sums)(s->val, s->cp, s->lam, am1, q, s->pw, &G, &S);
    s->G = G;
    s->S = S;
    s->R = R;
}

/* The rest of the round from its sums: the next λ, or done (s->done). */
static inline __attribute__((always_inline)) void FN(alpha_next)(FN(alpha_state) *s, const FN(zb_params) *pa)
{
    const T rtol = 4 * EPS;
    T am1 = pa->am1, q = pa->q, kq = pa->kq, k = s->k;
    volatile T one_v = 1; /* opaque: see entmax_sums */
    T one = one_v;
    T rough_rel = (T)(4 * ROUGH_REL(q - 2)); /* w^{q−2} is the power taken */
    T lam = s->lam, lo = s->lo, G = s->G, S = s->S, R = s->R, *val = s->val, *pw = s->pw;
    double prev = s->prev;
    int64_t c = s->c, cp = s->cp, it = s->it;
    int final = s->final, halley = s->halley, r = s->r;
    if (r && !(G > k * (1 + rough_rel))) goto more; /* near the root: the exact rounds from here */
    /* λ to a few ulps of 1 + |λ|, or where the support's spread is far
     * below 1, of |λ| + the spread: G/(aS) is the p-weighted mean of v − λ,
     * and an error δ in λ moves Σp by δ·aS/G of itself (rows of equal
     * entries near α = 2 have |λ| and every v − λ about n^{−a}: the
     * absolute tolerance left Σp thousands of ulps off).  Ordinary rows
     * keep the 1, which the sums' rounding allows in double too. */
    double spread = G > 0 && S > 0 ? (double)G / ((double)am1 * S) : 1.0;
    double tol = rtol * (fabs((double)lam) + (spread < 1.0 / 64 ? spread : 1.0));
    T step = FN(h_newton_step)(G, S, k, am1, q, kq);
    if (!(G > k)) {
        /* At the root, or past it.  Newton's iterates stay at or
         * below it (h is convex), so there G ≤ k is rounding and pw
         * holds p.  A Halley step may overshoot: within a sixteenth of
         * tol (as the prediction below) that is rounding too; further,
         * Newton from the right lands left of the root (convexity
         * again), or at the last lower bound where its step is not
         * finite, and Newton alone goes on.  Newton's own iterates
         * land past it too, by the rounding of G and of the step: on
         * a near-constant row by hundreds of ulps of p.  A step back
         * that power_shifted writes exactly is written (below);
         * a longer one is taken, as after Halley. */
        if (!(G > 0 && S > 0) && lam > lo) {
            /* past every candidate: a Halley step can land beyond the
             * row's top (q just above 2, where R ≈ the candidates'
             * count nearly doubles Newton's step); no step back is
             * defined there, so back to the last lower bound, and
             * Newton from it */
            lam = lo;
            halley = 0;
            prev = 0;
            goto more;
        }
        /* Newton's step back from the right lands short of the root
         * by about |h''/(2h')| step² (R is this round's only after a
         * Halley step, whose overshoot is a step's size; Newton's own
         * overshoot is rounding's, and its step back is exact to
         * rounding) */
        double back_err = halley ? fabs((double)((1 - am1) * (S / G - R / S))) / 2 * (double)step * step : 0;
        int near = 16 * (double)step >= -tol || (-step <= (double)kq * pa->dmax1 && 16 * back_err <= tol);
        if (!(G > 0 && S > 0) || (final ? near : !halley || 16 * (double)step >= -tol)) {
            if (final && G > 0 && S > 0 && step < 0 && -step <= (double)kq * pa->dmax1) {
                /* Past the root by the rounding of G and of the step
                 * that came here, which on a near-constant row is
                 * hundreds of ulps of p: p at λ + step (< 0) from this
                 * round's w^q, as the last round below writes it */
                lam = FN(shift_powers)(val, pw, cp, lam, step, am1, q, one);
            }
            s->have_p = 1;
            goto done;
        }
        T back = lam + step;
        lam = back >= lo ? back : lo;
        halley = 0;
        prev = 0;
        goto more;
    }
    lo = lam;
    int order = 2;
    if (halley) {
        /* Halley: step / (1 + step h''/(2h')), h''/h' = (1 − a)(S/G − R/S) ≤ 0
         * (Cauchy–Schwarz); far from the root, where that would more
         * than double Newton's step, Newton's */
        T den = 1 + step * (1 - am1) * (S / G - R / S) / 2;
        if (den > (T)0.5) {
            step /= den;
            order = 3;
        }
    }
    T next = lam + step;
    if (r) {
        next -= rough_rel * (G / S + 2 * step);
        lam = next > lam ? next : lam;
        prev = step;
        goto more;
    }
    if (!(next > lam)) {
        s->have_p = 1;
        goto done;
    }
    if (!final && it + 1 >= (c > STAGE0_WIDE ? 2 : 1)) { /* a lower bound wants λ alone */
        lam = next;
        goto done;
    }
    /* The error after this step is about C step^order, and C about
     * step / prev^order (the last two steps): where 16 times that
     * prediction is below tol, next is already λ to rounding, so
     * the round that would confirm it is skipped, provided the
     * write below stays exact at this step (zb_params). */
    double sd = step, pred = order == 3 ? sd * sd * sd * sd : sd * sd * sd;
    double prevo = order == 3 ? prev * prev * prev : prev * prev;
    int last = step <= tol || (prev > 0 && 16 * pred <= tol * prevo && step <= (double)kq * pa->dmax1);
    prev = step;
    if (last && !final) {
        lam = next;
        goto done;
    }
    if (last) {
        /* The last round: p at next = lam + step from this round's
         * w^q to third order (power_shifted), so the final write needs
         * no pow.  Where t ≥ 1 (v ≤ next) p is 0.  Entries at or below
         * next stay among the candidates, with p = 0. */
        lam = FN(shift_powers)(val, pw, cp, lam, step, am1, q, one);
        s->have_p = 1;
        goto done;
    }
    lam = next;
more:
    s->done = ++it >= 2 * c + 100;
    goto out;
done:
    s->done = 1;
out:
    s->lam = lam;
    s->lo = lo;
    s->prev = prev;
    s->it = it;
    s->halley = halley;
}

/* entmax α: on h = g^{1/q} − k^{1/q}, q = 1/(α−1) ≥ 1 (convex, nearly
 * linear), Newton's step, or Halley's in the row's own solve (final = 1)
 * where q ≥ 2, until the step is below 4 EPS (1 + |λ|) or predicted to
 * leave λ there; a lower bound (final = 0, see solve_zero_below) takes one
 * Newton step from below, or two on more than STAGE0_WIDE candidates.
 * The row's own solve is two rounds of powers where it goes well: one from
 * the bound, one that lands on λ and whose powers, shifted, are p.  The
 * first only chooses where the second is taken, so for float (ROUGH_FIRST,
 * 2 ≤ q ≤ 8) its powers are rough_powf's, and its step is pulled back by
 * four times their error's effect on it (ε G/S + 2 ε step, ε = ROUGH_REL),
 * to stay a lower bound.  A row already within that of its root at the
 * bound goes to the exact rounds, and one of at most 2 PAD candidates
 * (peaked rows, whose bound is often the root) takes no rough round, which
 * would save it less than the exact round it may add.  Every round after
 * is exact, and a step that lands past the root anyway is undone by them
 * (below), so the rough round's error reaches neither λ nor p.  (Double
 * rows keep exact rounds: their third-order write is exact only for far
 * shorter last steps, zb_params' dmax1 about 1e-8 at α = 1.3, than the
 * pulled-back step leaves, which would cost them a round.)  No
 * compaction (the sums mask entries at or below λ): a compaction, a store
 * per entry whose address depends on the previous compare, cost more than
 * the few entries it drops save in later rounds.  *have_p = 1 says pw[j]
 * holds candidate j's p at the λ returned. */
static T FN(solve_entmax_alpha)(T lam, T k, const FN(zb_params) *pa, int final, T *val, T *pw, int64_t c,
                                int *have_p, int64_t *itp)
{
    FN(alpha_state) s;
    FN(alpha_begin)(&s, lam, k, pa, final, val, pw, c);
    while (!s.done) {
        FN(alpha_sums)(&s, pa);
        FN(alpha_next)(&s, pa);
    }
    *have_p = s.have_p;
    *itp += s.it + 1;
    return s.lam;
}

/* λ on the candidates (val, idx)[0..c): the row's own (final = 1), or a lower
 * bound from the block maxima (final = 0: STAGE0_ROUNDS, STAGE0_WIDE). */
static T FN(solve_candidates)(int fam, T lam, T k, const FN(zb_params) *pa, int final, T *val, cidx_t *idx,
                              T *pw, int64_t c, int64_t *nval, int *have_p, int64_t *iters)
{
    int64_t it = 0;
    *have_p = 0;
    *nval = c;
    int64_t most = final ? INT64_MAX : STAGE0_ROUNDS;
    if (fam == 1)
        lam = FN(solve_sparsemax)(lam, k, val, idx, nval, &it, most);
    else if (fam == 2)
        lam = FN(solve_entmax15)(lam, k, val, idx, nval, &it, most);
    else
        lam = FN(solve_entmax_alpha)(lam, k, pa, final, val, pw, c, have_p, &it);
    if (iters) *iters += it;
    return lam;
}

/* Row scan with block maxima: bm[b] = max of z[b·B, (b+1)·B) (−inf if none
 * is finite).  The finite and bad entries are counted per lane across the
 * whole blocks and reduced once at the end: reduced per block (as the
 * maxima must be), they cost more than the maxima. */
#define BLK 32
static T FN(row_scan_blocks)(const T *z, int64_t n, T *bm, int64_t *count, int *bad)
{
    T m = -INFINITY;
    int64_t whole = n / BLK, c = 0;
    int32_t cnt[BLK] = {0}, bd[BLK] = {0}; /* a lane counts at most 2^31 − 1 blocks */
    int b = 0;
    for (int64_t blk = 0; blk < whole; blk++) {
        const T *s = z + blk * BLK;
        T bmax = -INFINITY;
#pragma omp simd reduction(max : bmax)
        for (int l = 0; l < BLK; l++) {
            T v = s[l];
            bmax = v > bmax ? v : bmax;
            cnt[l] += v > -INFINITY;
            bd[l] |= (v != v) | (v == INFINITY);
        }
        bm[blk] = bmax;
        m = bmax > m ? bmax : m;
    }
    if (whole * BLK < n) {
        T bmax = -INFINITY;
        for (int64_t i = whole * BLK; i < n; i++) {
            T v = z[i];
            bmax = v > bmax ? v : bmax;
            c += v > -INFINITY;
            b |= (v != v) | (v == INFINITY);
        }
        bm[whole] = bmax;
        m = bmax > m ? bmax : m;
    }
#pragma omp simd reduction(+ : c) reduction(| : b)
    for (int l = 0; l < BLK; l++) {
        c += cnt[l];
        b |= bd[l];
    }
    *count = c;
    *bad = b;
    return m;
}

/* Where solve_zero_below's gather took the candidates from: the row z, its
 * block maxima bm and max m, the bound lam it compared against and the
 * number of blocks it took, so that place_candidates can put their p back
 * by the same compares. */
typedef struct {
    const T *z, *bm;
    T m, lam;
    int64_t blocks;
    int reframed; /* sparsemax, entmax15: val holds z − b, and t is λ in that frame (reframe) */
    T t;
    int indexed; /* idx holds the candidates' indices (else place_candidates re-finds them) */
} FN(gathered);

/* Sparsemax and entmax15 on a wide support far below the max: λ − max is
 * found to an ulp of its own size, which moves Σp by −dΣp/dλ times it: the
 * support's size c for sparsemax (Σp off by 3.7e-4 on 8192 entries with λ
 * near −½, where the entries are about 1e-4), Σ(v − λ)/2 over it for
 * entmax15.  Where that error, about −dΣp/dλ |λ| EPS / 2, would exceed
 * 8 EPS k, λ is solved again in the frame of b = the threshold rounded (z
 * − b exact for z near b), as t = λ − b from a few ulps below it, and p is
 * written as (z − b) − t; other rows keep the frame of the max. */
static void FN(reframe)(int fam, T lam, T k, T *val, cidx_t *idx, int64_t *nval, int64_t *iters,
                        FN(gathered) *from)
{
    int64_t c = *nval;
    from->reframed = 0;
    if (fam > 2) return;
    T slope = 0; /* the support's size (sparsemax), Σ (v − λ)/2 over it (entmax15) */
#pragma omp simd reduction(+ : slope)
    for (int64_t j = 0; j < c; j++) slope += val[j] > lam ? (fam == 1 ? 1 : (val[j] - lam) / 2) : 0;
    if (!((double)slope * fabs((double)lam) > 16 * (double)k)) return;
    T b = from->m + lam;
    for (int64_t j = 0; j < c; j++) val[j] = from->z[idx[j]] - b;
    /* λ − b is within the roundings of b and of λ (the candidates' own v = z − m
     * included): a few ulps of |m| + |λ| */
    T t0 = -(T)(16 * EPS) * (fabs(from->m) + fabs(lam) + 1);
    c = FN(compact)(val, idx, c, t0);
    int64_t it = 0;
    T t = fam == 1 ? FN(solve_sparsemax)(t0, k, val, idx, &c, &it, INT64_MAX)
                   : FN(solve_entmax15)(t0, k, val, idx, &c, &it, INT64_MAX);
    *iters += it;
    *nval = c;
    from->reframed = 1;
    from->t = t;
}

/* λ − max(z) for a zero-below family, without sorting the row:
 * 1. the block maxima are entries of the row, and a subset's λ is a lower
 *    bound of the row's λ (fewer terms in g), so solving on them (from the
 *    family's bound: the top entry alone reaches k) gives a tight lower bound;
 * 2. only blocks whose maximum is above that bound can hold candidates: they
 *    are compacted into (val, idx) and solved exactly from the bound.
 * val has 2 (n + PAD) slots, idx n + PAD.  For entmax α, *have_p = 1 says
 * that val[n + PAD + j] already holds candidate j's p (the solver's last
 * round computes it; write_zero_below then takes it).  *from says where
 * the candidates came from.  need_idx = 0 (entmax α only, whose solve
 * neither reads nor reorders idx) lets float rows with AVX-512 skip the
 * candidates' indices in the gather: place_candidates then finds them again
 * by the compares the gather keeps in idx instead.  gather_zero_below is the bound and the gather
 * (it returns the bound and sets *ncand); solve_zero_below adds the solve. */
/* Step 1's subset: the block maxima above lam (the family's bound), as v =
 * bm − m in val (their block in idx); returns how many. */
static inline int64_t FN(block_maxima)(const T *bm, T m, int64_t nb, T lam, T *val, cidx_t *idx)
{
    int64_t c = 0;
    for (int64_t b = 0; b < nb; b++) {
        T v = bm[b] - m;
        val[c] = v;
        idx[c] = (cidx_t)b;
        c += v > lam;
    }
    return c;
}

/* The gather's bound from the subset's λ, sub: a few ulps below it (it is
 * exact only up to rounding), and never below the family's bound lam. */
static inline T FN(bound_below)(T sub, T lam)
{
    sub -= 16 * EPS * (1 + fabs((double)sub));
    return sub > lam ? sub : lam;
}

/* Step 2: the candidates of the blocks whose maximum is above lam, into
 * (val, idx) from 0; returns how many, and says in *from where they came
 * from. */
static inline __attribute__((always_inline)) int64_t FN(gather_blocks)(int fam, const T *z, const T *bm, T m,
                                                                       int64_t n, T lam, T *val, cidx_t *idx,
                                                                       FN(gathered) *from, int need_idx)
{
    int64_t nb = (n + BLK - 1) / BLK, c = 0;
    from->z = z;
    from->bm = bm;
    from->m = m;
    from->lam = lam;
    from->blocks = 0;
    from->indexed = !(PLACE_AVX512 && fam == 3 && !need_idx);
    for (int64_t b = 0; b < nb; b++) {
        if (!(bm[b] - m > lam)) continue;
        from->blocks++;
        int64_t i0 = b * BLK, end = i0 + BLK < n ? i0 + BLK : n;
        if (end - i0 == BLK) {
            /* A whole block: float rows with AVX2 or AVX-512 gather
             * branch-free (see gather_block_avx2 and gather_block_avx512 in
             * kernels.c); otherwise a bit mask of the
             * candidates (a vectorised compare), then one store per
             * candidate, not per entry: where most blocks hold a few
             * candidates (wide supports), a compaction over every entry
             * cost more than the solve. */
#if PLACE_AVX512
            if (!from->indexed) { /* idx keeps each block's compares instead (place_candidates) */
                c = gather_vals_avx512(z + i0, m, lam, val, c, (uint32_t *)idx + b);
                continue;
            }
#endif
#if GATHER_AVX2
            c = gather_block_avx2(z + i0, i0, m, lam, val, idx, c);
            continue;
#endif
            uint32_t mask = 0;
#pragma omp simd reduction(| : mask)
            for (int j = 0; j < BLK; j++) mask |= (uint32_t)(z[i0 + j] - m > lam) << j;
            for (; mask; mask &= mask - 1) {
                int j = __builtin_ctz(mask);
                val[c] = z[i0 + j] - m;
                idx[c] = (cidx_t)(i0 + j);
                c++;
            }
            continue;
        }
        for (int64_t i = i0; i < end; i++) {
            T v = z[i] - m;
            val[c] = v;
            if (from->indexed) idx[c] = (cidx_t)i;
            c += v > lam;
        }
    }
    from->reframed = 0;
    return c;
}

static inline __attribute__((always_inline)) T FN(gather_zero_below)(int fam, const T *z, const T *bm, T m,
                                                                     int64_t n, T k, const FN(zb_params) *pa,
                                                                     T *val, cidx_t *idx, int64_t *ncand,
                                                                     int64_t *iters, FN(gathered) *from,
                                                                     int need_idx)
{
    int dummy;
    T lam = pa->lam0;
    int64_t nb = (n + BLK - 1) / BLK, c2;
    if (nb > 1) {
        int64_t c = FN(block_maxima)(bm, m, nb, lam, val, idx);
        /* the solves stop early here (STAGE0_ROUNDS, STAGE0_WIDE):
         * every iterate from the left is a lower bound, and the last digits
         * of the subset's λ barely change which entries pass it, while each
         * round costs a pass over the blocks (a power per block for entmax
         * α) */
        T sub = FN(solve_candidates)(fam, lam, k, pa, 0, val, idx, val + n + PAD, c, &c2, &dummy, iters);
        lam = FN(bound_below)(sub, lam);
    }
    *ncand = FN(gather_blocks)(fam, z, bm, m, n, lam, val, idx, from, need_idx);
    return lam;
}

static inline __attribute__((always_inline)) T FN(solve_zero_below)(int fam, const T *z, const T *bm, T m, int64_t n,
                                                                    T k, const FN(zb_params) *pa,
                              T *val, cidx_t *idx, int64_t *nval, int *have_p, int64_t *iters, FN(gathered) *from,
                              int need_idx)
{
    int64_t c;
    T lam = FN(gather_zero_below)(fam, z, bm, m, n, k, pa, val, idx, &c, iters, from, need_idx);
    lam = FN(solve_candidates)(fam, lam, k, pa, 1, val, idx, val + n + PAD, c, nval, have_p, iters);
    FN(reframe)(fam, lam, k, val, idx, nval, iters, from);
    return lam;
}

/* entmax with α near 1 (q = 1/(α−1) > 8): λ ≈ −q is known only to eps·q, and
 * p = (a(v − λ))^q turns that absolute error of w ≈ 1 into q·eps relative
 * error of p (1e-3 in float32 at α = 1.0001).  Re-solve in μ = λ + q, where
 * w = 1 + x with x = a(v − μ) small: p = e^{q·log1p(x)} is exact to a few
 * ulps and tends to softmax as α → 1.  g(μ) is convex and decreasing, so
 * Newton started a little left of the root (g ≥ 1) climbs to it from the λ
 * solution, in one or two steps unless α is within a few ulps of 1.
 * log1p(x) = log(u) + (x − (u − 1))/u with u = 1 + x rounded: the second
 * term restores what rounding u dropped (to first order, which is all of it
 * that matters), and log has vector variants where log1p may not.
 * Entries with x ≤ −1 (p = 0) and the padding are masked as in entmax_sums.
 * entmax_near_softmax overwrites val[j] with p_j for the candidates (val
 * has PAD spare slots; pw, n + PAD slots, is its scratch).  k = 1: entmax
 * α maps onto the simplex, and softk passes it no other k. */
static T FN(near_softmax_sums)(const T *val, int64_t cp, T mu, T am1, T q, T *pw, T *Sp)
{
    volatile T zero_v = 0; /* opaque: see entmax_sums */
    T zero = zero_v;
    /* double, as entmax_sums_body's where wide (Σp = 1 is the equation), in
     * its blocks of WIDE_BLOCK */
    double G = 0;
    T S = 0;
    for (int64_t b0 = 0; b0 < cp; b0 += WIDE_BLOCK) {
        int64_t b1 = b0 + WIDE_BLOCK < cp ? b0 + WIDE_BLOCK : cp;
        double Gb = 0;
#pragma omp simd reduction(+ : Gb, S)
        for (int64_t j = b0; j < b1; j++) {
            T x = am1 * (val[j] - mu);
            T on = x > -1;
            T xs = x > -1 ? x : zero;
            T u = 1 + xs;
            T l = LOG(u) + (xs - (u - 1)) / u;
            T p = EXP(q * l) * on;
            pw[j] = p;
            Gb += p;
            S += p / u; /* u^{q−1} */
        }
        G += Gb;
    }
    *Sp = S;
    return (T)G;
}

static void FN(entmax_near_softmax)(T lam, T am1, T *val, int64_t c, T *pw)
{
    T q = 1 / am1, S;
    T mu = lam + q;
    mu -= 8 * EPS * (fabs((double)lam) + 1);
    int64_t cp = (c + PAD - 1) / PAD * PAD;
    for (int64_t j = c; j < cp; j++) val[j] = -INFINITY; /* x = −inf: masked */
    /* The start lies 8·eps·|λ| left of the root, and |λ| ≈ q: within an ulp
     * of α = 1 that is up to about 8 units of z, where g ≈ e^{μ* − μ} and
     * each Newton step moves about 1; so up to 40 steps (one or two where
     * q·eps is small, as for every α the lanes do not take). */
    for (int it = 0; it < 40; it++) {
        T G = FN(near_softmax_sums)(val, cp, mu, am1, q, pw, &S);
        if (!(S > 0)) break;
        T step = (G - 1) / S;
        mu += step;
        if (fabs((double)step) <= 2 * EPS * (fabs((double)mu) + 1)) break;
    }
    FN(near_softmax_sums)(val, cp, mu, am1, q, pw, &S);
    for (int64_t j = 0; j < c; j++) val[j] = pw[j];
}

/* The candidates' p, val[0..c), into the row p, 0 elsewhere: the row
 * zeroed, then each candidate's p stored at its index, or, where the
 * candidates are many (PLACE_DENSE a block taken on average: entmax α with
 * α well below 2) or the gather kept no indices (from->indexed = 0), the
 * blocks the gather took written whole by the inverse of its AVX-512
 * gather (place_block_avx512, or place_taken_avx512 from the compares
 * the gather kept where it kept no indices), which costs less than that
 * many single stores; the row is then zeroed first only where the gather
 * skipped a block.  Only entmax α keeps its candidates in the gather's order (its
 * solve does not compact them), and only float rows with AVX-512 gather
 * that way. */
#define PLACE_DENSE 8
static void FN(place_candidates)(int fam, T *p, int64_t n, const T *val, const cidx_t *idx, int64_t c,
                                 const FN(gathered) *from)
{
#if PLACE_AVX512
    if (fam == 3 && (c >= PLACE_DENSE * from->blocks || !from->indexed)) {
        if (from->blocks < (n + BLK - 1) / BLK) memset(p, 0, (size_t)n * sizeof(T));
        const T *z = from->z;
        T m = from->m, lam = from->lam;
        int64_t j = 0;
        for (int64_t i0 = 0; i0 < n; i0 += BLK) {
            if (!(from->bm[i0 / BLK] - m > lam)) continue;
            if (i0 + BLK <= n) {
                if (!from->indexed)
                    j = place_taken_avx512(((const uint32_t *)idx)[i0 / BLK], val, p + i0, j);
                else
                    j = place_block_avx512(z + i0, m, lam, val, p + i0, j);
                continue;
            }
            for (int64_t i = i0; i < n; i++) { /* the gather's partial block */
                int on = z[i] - m > lam;
                p[i] = on ? val[j] : 0;
                j += on;
            }
        }
        return;
    }
#else
    (void)from;
#endif
    memset(p, 0, (size_t)n * sizeof(T));
    for (int64_t j = 0; j < c; j++) p[idx[j]] = val[j];
}

/* f(v − λ) on the candidates, written into the row (place_candidates); val[j]
 * becomes p of candidate j, except where entmax α's p come from the solver
 * and the gather kept no indices (the forward, which reads only the row:
 * p is placed from pw itself).  pw: entmax α's p from the solver
 * (solve_zero_below's *have_p), or NULL; it has PAD slots past c, as
 * place_block_avx512 reads. */
static void FN(write_zero_below)(int fam, T *p, int64_t n, T lam, T alpha, T *val, const cidx_t *idx, int64_t c,
                                 const T *pw, const FN(gathered) *from)
{
    T am1 = alpha - 1, q = 1 / am1;
    if (from->reframed) lam = from->t; /* val holds z − b (reframe) */
    if (fam == 3 && q > 8) {
        FN(entmax_near_softmax)(lam, am1, val, c, val + n + PAD);
    } else if (fam == 3 && pw && !from->indexed) {
        FN(place_candidates)(fam, p, n, pw, idx, c, from);
        return;
    } else if (fam == 3 && pw) {
        for (int64_t j = 0; j < c; j++) val[j] = pw[j];
    } else {
        int64_t cp = (c + PAD - 1) / PAD * PAD; /* whole vectors, as in solve_candidates */
        for (int64_t j = c; j < cp; j++) val[j] = lam;
        if (fam == 3) { /* vectorised as in entmax_sums (mask multiplied, log gets 1 off support) */
            volatile T one_v = 1;
            T one = one_v;
#pragma omp simd
            for (int64_t j = 0; j < cp; j++) {
                T w = am1 * (val[j] - lam);
                T on = w > 0;
                T w1 = w > 0 ? w : one;
                val[j] = EXP(q * LOG(w1)) * on;
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < cp; j++) {
                T u = val[j] - lam;
                u = u > 0 ? u : 0;
                val[j] = fam == 1 ? u : (T)0.25 * u * u;
            }
        }
    }
    FN(place_candidates)(fam, p, n, val, idx, c, from);
}
