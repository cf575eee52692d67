/* Row-wise kernels of CPU decoding: built once per machine by tfcli.generate.native with the system's C compiler
 * (plain C, no torch headers) and called through ctypes on tensors' memory. The int8 helpers each do in one pass over
 * a row what torch does in several; their results are bit for bit those of the torch fallback in int8.py (the same
 * IEEE operations in the same order; compiled with -ffp-contract=off, never -ffast-math), and their loops are compiled
 * for AVX-512, AVX2 and plain x86-64, the best one picked at load (GCC target_clones). The fp32 linear layers
 * after them have an AVX-512 and an AVX2 version, the same results bit for bit, and the attention one, for AVX2 (run
 * by AVX-512 CPUs too); the caller asks linear_rows_supported which runs here. Each computes a row's result in an
 * order that the number of rows and the batch's width never change. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* calls this large are split over torch's OpenMP threads (the library is linked to the libgomp torch loaded) */
#define PARALLEL_MIN 32768

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* max_j |x[j]| over n floats: for floats without their sign bit, the order of the values is that of the bits as
 * unsigned integers, and an integer max vectorises (a float max does not without -ffast-math) */
static inline __attribute__((always_inline)) float absmax(const float *x, int64_t n) {
    uint32_t mb = 0;
    for (int64_t j = 0; j < n; j++) {
        uint32_t b;
        memcpy(&b, x + j, sizeof b);
        b &= 0x7fffffffu;
        mb = b > mb ? b : mb;
    }
    float m;
    memcpy(&m, &mb, sizeof m);
    return m;
}

/* the scale of a row whose largest |value| is m: max(m, floor) / levels, or NaN where m is NaN or inf (the row's
 * values then quantised to 0: converting NaN to an integer is undefined) */
static inline float row_scale(float m, float floor, float levels) {
    return isfinite(m) ? (m > floor ? m : floor) / levels : NAN;
}

/* x (rows x cols, row stride ld) -> s[r] = max(max_j |x[r, j]|, 1e-30) / levels and q[r, j] = round(x[r, j] / s[r])
 * (half to even), |q| <= levels: as int8 into q8 when it is not null, else as float into qf. A row holding NaN or
 * inf gets s[r] NaN and q 0 (row_scale), so that what is made from it is NaN, never a number. */
CLONES void quantize_rows(const float *x, int64_t rows, int64_t cols, int64_t ld, float levels, int8_t *q8,
                          float *qf, float *s) {
#pragma omp parallel for schedule(static) if (rows * cols >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ld;
        const float m = absmax(xr, cols);
        float sr = row_scale(m, 1e-30f, levels);
        s[r] = sr;
        if (isnan(sr)) {
            if (q8) memset(q8 + r * cols, 0, cols);
            else memset(qf + r * cols, 0, sizeof(float) * cols);
        } else if (q8) {
            int8_t *qr = q8 + r * cols;
            for (int64_t j = 0; j < cols; j++) qr[j] = (int8_t)nearbyintf(xr[j] / sr);
        } else {
            float *qr = qf + r * cols;
            for (int64_t j = 0; j < cols; j++) qr[j] = nearbyintf(xr[j] / sr);
        }
    }
}

/* max(v, 0), NaN kept as torch's ReLU keeps it (a model that computes no numbers never turns into one that does),
 * +0 at -0; the vector forms are MAX(ZERO, v) + ZERO (MAX: the second operand where either is NaN) */
#define RELU(v) ((0.0f > (v) ? 0.0f : (v)) + 0.0f)

/* In place on y (rows x cols, contiguous): y = y * s[r], then + bias[j] (bias may be null), then + res[r, j] (res may
 * be null; row stride ld_res), then max(y, 0) when relu. */
CLONES void dequantize_rows(float *y, int64_t rows, int64_t cols, const float *s, const float *bias,
                            const float *res, int64_t ld_res, int relu) {
#pragma omp parallel for schedule(static) if (rows * cols >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        const float sr = s[r];
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j] * sr;
            if (bias) v = v + bias[j];
            if (res) v = v + res[r * ld_res + j];
            if (relu) v = RELU(v);
            yr[j] = v;
        }
    }
}

/* fp32 linear layers (tfcli.generate.native.RowLinear): y (M x N) = x (M x K) W^T + b, then + res (row stride ldr;
 * may be null), then max(y, 0) when relu. wt is W in column blocks of 32 outputs (block c: K x 32, row k holding
 * input k's weights for outputs 32c..32c+31), zero past N up to a multiple of 64 outputs, b padded likewise (may be
 * null). Each output is one chain of fused multiply-adds over k = 0..K-1 starting from its bias, whatever tile it
 * falls in and whichever version runs, so a row's result is the same for any M, on AVX-512 and AVX2 alike.
 *
 * A tile is R rows x V vectors of outputs, its R*V accumulators in registers: AVX-512 (32 registers of 16 floats)
 * tiles of 8 rows x 32 outputs, AVX2 (16 registers of 8) tiles of 3 rows x 32 (as many accumulators as 6 x 16,
 * with fewer loads a step of k and half the passes over the input rows), so that a step of k loads the
 * tile's weights once for all its rows and a column block's weights stay in the L1 cache while every row tile runs
 * over them; the last M % 8 (or M % 3) rows are one tile as wide as the accumulators allow, so that a step's few
 * rows still have enough independent chains to fill the FMA units. The tiles are split over the OpenMP threads,
 * column units outer. The accumulators are read at constant indices only (else GCC keeps them on the stack). */
/* A tile's results src[R][V] (vectors of LANES floats) into y: + res, then max(., 0) when relu; a tile of fewer
 * than LANES * V outputs (nj) through a buffer */
#define TILE_STORE(VEC, LANES, LOAD, ZERO, ADD, MAX, STORE, R, V, src)                                                \
    if (nj == LANES * V) { /* the whole tile: the residual and the ReLU on the registers */                          \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                            \
            _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) {                                                      \
                VEC a = src[r][v];                                                                                     \
                if (res) a = ADD(a, LOAD(res + r * ldr + j0 + LANES * v));                                             \
                if (relu) a = ADD(MAX(ZERO(), a), ZERO()); /* (RELU: NaN kept, +0 at -0) */                        \
                STORE(y + r * ldy + j0 + LANES * v, a);                                                                \
            }                                                                                                          \
        return;                                                                                                        \
    }                                                                                                                  \
    float out[R][LANES * V];                                                                                           \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                                \
        _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) STORE(out[r] + LANES * v, src[r][v]);                      \
    for (int r = 0; r < R; r++) {                                                                                      \
        if (res)                                                                                                       \
            for (int j = 0; j < nj; j++) out[r][j] = out[r][j] + res[r * ldr + j0 + j];                                \
        if (relu)                                                                                                      \
            for (int j = 0; j < nj; j++) out[r][j] = RELU(out[r][j]);                                                  \
        memcpy(y + r * ldy + j0, out[r], sizeof(float) * nj);                                                          \
    }

typedef void (*tile_fn)(const float *, int64_t, const float *, const float *, const float *, int64_t, int, float *,
                        int64_t, int64_t, int);

#define TILE(ISA, TARGET, VEC, LANES, LOAD, ZERO, BCAST, FMA, ADD, MAX, STORE, R, V)                                  \
    static __attribute__((target(TARGET))) void tile_##ISA##_##R(                                                     \
        const float *restrict x, int64_t K, const float *restrict wt, const float *restrict b,                        \
        const float *restrict res, int64_t ldr, int relu, float *restrict y, int64_t ldy, int64_t j0, int nj) {        \
        VEC acc[R][V];                                                                                                 \
        const float *w[V]; /* vector v: outputs j0 + LANES*v.., in column block (j0 + LANES*v) / 32 */                \
        _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) {                                                          \
            int64_t j = j0 + LANES * v;                                                                                \
            w[v] = wt + j / 32 * 32 * K + j % 32;                                                                      \
            VEC bv = b ? LOAD(b + j) : ZERO();                                                                         \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r][v] = bv;                                        \
        }                                                                                                              \
        for (int64_t k = 0; k < K; k++) {                                                                              \
            VEC wv[V];                                                                                                 \
            _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) wv[v] = LOAD(w[v] + 32 * k);                           \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                      \
                const VEC xv = BCAST(x + r * K + k);                                                                   \
                _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) acc[r][v] = FMA(xv, wv[v], acc[r][v]);             \
            }                                                                                                          \
        }                                                                                                              \
        TILE_STORE(VEC, LANES, LOAD, ZERO, ADD, MAX, STORE, R, V, acc);                                              \
    }
#define TILE512(R, V)                                                                                                  \
    TILE(avx512, "avx512f,avx2,fma", __m512, 16, _mm512_loadu_ps, _mm512_setzero_ps, _mm512_set1_ps_from,            \
         _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps, _mm512_storeu_ps, R, V)
#define TILE256(R, V)                                                                                                  \
    TILE(avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_broadcast_ss, _mm256_fmadd_ps,      \
         _mm256_add_ps, _mm256_max_ps, _mm256_storeu_ps, R, V)
#define _mm512_set1_ps_from(p) _mm512_set1_ps(*(p))
TILE512(1, 4)
TILE512(2, 4)
TILE512(3, 4)
TILE512(4, 4)
TILE512(5, 2)
TILE512(6, 2)
TILE512(7, 2)
TILE512(8, 2)
TILE256(1, 8)
TILE256(2, 4)
TILE256(3, 4)

/* by a tile's rows R (index R): its function and its outputs (a multiple of 16 that divides 64) */
static const tile_fn TILES_AVX512[9] = {0, tile_avx512_1, tile_avx512_2, tile_avx512_3, tile_avx512_4,
                                        tile_avx512_5, tile_avx512_6, tile_avx512_7, tile_avx512_8};
static const int WIDTH_AVX512[9] = {0, 64, 64, 64, 64, 32, 32, 32, 32};
static const tile_fn TILES_AVX2[4] = {0, tile_avx2_1, tile_avx2_2, tile_avx2_3};
static const int WIDTH_AVX2[4] = {0, 64, 32, 32};

/* the sum of eight lanes in a fixed order (the lanes of a sum split by j % 8) */
static inline float sum8(const float lane[8]) {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* lane l: sum8 of v[l]'s lanes, in sum8's order (hadd adds lanes 0 + 1 and 2 + 3, then those; the halves last) */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 sum8x8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* LayerNorm of one row of n: y = (x - mean) / sqrt(var + eps) * w + b, w and b at ln and ln + n; the sums in eight
 * lanes (element j in lane j % 8), the lanes added in a fixed order (AVX2: only linear_rows' callers run it) */
static __attribute__((target("avx2,fma"))) void norm_row(const float *x, float *y, int64_t n, const float *ln,
                                                         float eps) {
    const int64_t n8 = n / 8 * 8;
    float lane[8];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < n8; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + j));
    _mm256_storeu_ps(lane, acc);
    for (int64_t j = n8; j < n; j++) lane[j % 8] += x[j];
    const float mean = sum8(lane) / n;
    const __m256 mv = _mm256_set1_ps(mean);
    acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < n8; j += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + j), mv);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
    }
    _mm256_storeu_ps(lane, acc);
    for (int64_t j = n8; j < n; j++) lane[j % 8] += (x[j] - mean) * (x[j] - mean);
    const float rstd = 1.0f / sqrtf(sum8(lane) / n + eps);
    const __m256 rv = _mm256_set1_ps(rstd);
    for (int64_t j = 0; j < n8; j += 8) {
        const __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv), rv);
        _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_mul_ps(z, _mm256_loadu_ps(ln + j)), _mm256_loadu_ps(ln + n + j)));
    }
    for (int64_t j = n8; j < n; j++) y[j] = (x[j] - mean) * rstd * ln[j] + ln[n + j];
}

/* RMSNorm of one row of n, in place: x = x / sqrt(mean(x^2) + eps) * w (QK-norm's, on a head's query or key) */
static void rms_row(float *x, int64_t n, const float *w, float eps) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n; j++) lane[j % 8] += x[j] * x[j];
    const float rstd = 1.0f / sqrtf(sum8(lane) / n + eps);
    for (int64_t j = 0; j < n; j++) x[j] = x[j] * rstd * w[j];
}

/* M rows as tiles of RF rows, then the last M % RF rows as one tile; with a LayerNorm (ln: its weight then its
 * bias) on each input row first (norm 1: a pre-norm layer's, into xn, M x K) or on each output row last (norm 2: a
 * post-norm layer's, after the residual). The outputs are split into spans as wide as the widest tile (the last
 * rows' tile, or the full tiles' where M % RF is 0), one span a work item: every row tile runs over a span before
 * the next, the full tiles a column unit at a time (its weights in the L1 cache), then the last rows' tile (them
 * still in the L2), so that a call reads its weights from memory once, not once for the full tiles and again for
 * the last rows. */
static void linear_tiles(const tile_fn *tile, const int *width, int RF, const float *x, const float *wt,
                         const float *b, const float *res, int64_t ldr, int relu, float *y, int64_t M, int64_t K,
                         int64_t N, const float *ln, int norm, float eps, float *xn) {
    const int64_t full = M / RF;
    const int rest = (int)(M % RF);
    const int64_t span = width[rest ? rest : RF], spans = (N + span - 1) / span;
    const float *xt = norm == 1 ? xn : x; /* what the tiles read */
    const float *xr = xt + full * RF * K, *rr = res ? res + full * RF * ldr : 0; /* the last rows' */
    float *yr = y + full * RF * N;
#pragma omp parallel if (M * N * K >= 2 * PARALLEL_MIN)
    {
        if (norm == 1) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++) norm_row(x + r * K, xn + r * K, K, ln, eps);
        }
#pragma omp for schedule(static)
        for (int64_t s = 0; s < spans; s++) {
            const int64_t end = (s + 1) * span < N ? (s + 1) * span : N;
            for (int64_t j0 = s * span; j0 < end; j0 += width[RF]) {
                const int nj = end - j0 < width[RF] ? (int)(end - j0) : width[RF];
                for (int64_t t = 0; t < full; t++)
                    tile[RF](xt + t * RF * K, K, wt, b, res ? res + t * RF * ldr : 0, ldr, relu, y + t * RF * N, N,
                             j0, nj);
            }
            if (rest) tile[rest](xr, K, wt, b, rr, ldr, relu, yr, N, s * span, (int)(end - s * span));
        }
        if (norm == 2) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++) norm_row(y + r * N, y + r * N, N, ln, eps);
        }
    }
}

/* W's n rows (row-major, K wide) as `blocks` column blocks of 32 outputs, the layout linear_rows reads: output
 * row 32b + c's weight k at wt[(b*K + k)*32 + c], zero from row n on. A full block goes through 8 x 8 transposes
 * in registers (eight rows' eight weights in, eight outputs' rows out), the rest element by element. AVX2: the
 * caller runs it where linear_rows_supported (a copy; the same bytes on any CPU). */
__attribute__((target("avx2"))) void pack_blocks(const float *w, int64_t n, int64_t K, int64_t blocks, float *wt) {
#pragma omp parallel for schedule(static) if (blocks * K * 32 >= 16 * PARALLEL_MIN)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t rows = n - 32 * b < 0 ? 0 : n - 32 * b < 32 ? n - 32 * b : 32;
        const float *in = w + 32 * b * K;
        float *out = wt + b * K * 32;
        int64_t k0 = 0;
        if (rows == 32)
            for (; k0 + 8 <= K; k0 += 8)
                for (int c0 = 0; c0 < 32; c0 += 8) {
                    __m256 r[8], t[8];
                    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(in + (c0 + i) * K + k0);
                    for (int i = 0; i < 8; i += 2) {
                        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
                    }
                    for (int i = 0; i < 8; i += 4)
                        for (int h = 0; h < 2; h++) {
                            r[i + h] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0x44);
                            r[i + h + 2] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0xEE);
                        }
                    /* r[0..3]: columns 0, 2, 1, 3 of rows 0-3 (low lanes) and columns 4, 6, 5, 7 (high lanes);
                     * r[4..7] the same of rows 4-7 */
                    static const int col[4] = {0, 2, 1, 3};
                    for (int i = 0; i < 4; i++) {
                        _mm256_storeu_ps(out + (k0 + col[i]) * 32 + c0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                        _mm256_storeu_ps(out + (k0 + col[i] + 4) * 32 + c0,
                                         _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
                    }
                }
        for (int64_t k = k0; k < K; k++) {
            for (int64_t c = 0; c < rows; c++) out[k * 32 + c] = in[c * K + k];
            for (int64_t c = rows; c < 32; c++) out[k * 32 + c] = 0.0f;
        }
    }
}

void linear_rows(const float *x, const float *wt, const float *b, const float *res, int64_t ldr, int relu, float *y,
                 int64_t M, int64_t K, int64_t N, const float *ln, int norm, float eps, float *xn) {
    linear_tiles(TILES_AVX512, WIDTH_AVX512, 8, x, wt, b, res, ldr, relu, y, M, K, N, ln, norm, eps, xn);
}

void linear_rows_avx2(const float *x, const float *wt, const float *b, const float *res, int64_t ldr, int relu,
                      float *y, int64_t M, int64_t K, int64_t N, const float *ln, int norm, float eps, float *xn) {
    linear_tiles(TILES_AVX2, WIDTH_AVX2, 3, x, wt, b, res, ldr, relu, y, M, K, N, ln, norm, eps, xn);
}

/* e^x for eight floats (AVX2): Cephes' expf (range reduction by ln 2 in two parts, a degree-6 polynomial), within
 * two ulp; exactly 0 below -87 (so at -inf: the masked slots of a softmax). */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 exp8(__m256 x) {
    const __m256 low = _mm256_set1_ps(-87.0f);
    const __m256 zero = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, low), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(1.9875691500e-4f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.3981999507e-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.3334519073e-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.1665795894e-2f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.6666665459e-1f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(5.0000001201e-1f));
    q = _mm256_fmadd_ps(q, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(q, _mm256_castsi256_ps(e)));
}

/* e^y for eight floats as SLEEF's expf_u10 computes it, the exp of torch's vectorised CPU kernels (AVX2 or AVX-512:
 * the same operations lane by lane): y - q ln 2 in two parts, q = rint(y / ln 2), a degree-6 polynomial, times
 * 2^(q/2) twice; 0 below -104, +inf above 100. Every step is one IEEE operation: the same bits on any CPU. */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 exp_sleef8(__m256 y) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504088896340736f)));
    const __m256 qf = _mm256_cvtepi32_ps(q), one = _mm256_set1_ps(1.0f);
    __m256 s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-0.693145751953125f), y);
    s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-1.428606765330187045e-06f), s);
    __m256 u = _mm256_set1_ps(0.000198527617612853646278381f);
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00139304355252534151077271f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00833336077630519866943359f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.0416664853692054748535156f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.166666671633720397949219f));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.5f));
    u = _mm256_add_ps(one, _mm256_fmadd_ps(_mm256_mul_ps(s, s), u, s));
    const __m256i half = _mm256_srai_epi32(q, 1), bias = _mm256_set1_epi32(127);
    const __m256i e1 = _mm256_slli_epi32(_mm256_add_epi32(half, bias), 23);
    const __m256i e2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(q, half), bias), 23);
    u = _mm256_mul_ps(_mm256_mul_ps(u, _mm256_castsi256_ps(e1)), _mm256_castsi256_ps(e2));
    u = _mm256_andnot_ps(_mm256_cmp_ps(y, _mm256_set1_ps(-104.0f), _CMP_LT_OQ), u);
    return _mm256_blendv_ps(u, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(_mm256_set1_ps(100.0f), y, _CMP_LT_OQ));
}

/* GELU, x/2 (1 + erf(x / sqrt 2)), as torch's vectorised CPU kernel computes it: erf(z) by Abramowitz and Stegun's
 * 7.1.26, sign(z) (1 - r(t) t e^(-z^2)), t = 1 / (1 + p|z|), r of degree 4, e^ by exp_sleef8 */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 gelu8(__m256 x) {
    const __m256 neg0 = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752440f));
    const __m256 sign = _mm256_and_ps(neg0, z), a = _mm256_xor_ps(sign, z);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
    __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(1.061405429f), t, _mm256_set1_ps(-1.453152027f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(1.421413741f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-0.284496736f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(0.254829592f));
    const __m256 e = _mm256_xor_ps(neg0, exp_sleef8(_mm256_xor_ps(neg0, _mm256_mul_ps(z, z))));
    const __m256 erf = _mm256_xor_ps(sign, _mm256_fmadd_ps(_mm256_mul_ps(e, t), r, one));
    return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)), _mm256_add_ps(one, erf));
}

/* SiLU, x / (1 + e^-x), as torch's vectorised CPU kernel computes it (e^ by exp_sleef8) */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 silu8(__m256 x) {
    const __m256 e = exp_sleef8(_mm256_xor_ps(_mm256_set1_ps(-0.0f), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* y = act(x) over n floats (y may be x), act 3 GELU (gelu8) or 4 SiLU (silu8), eight at a time (the last n % 8 in
 * a block of their own): a value's result never depends on its neighbours */
__attribute__((target("avx2,fma"))) void activate(const float *x, float *y, int64_t n, int act) {
    const int64_t n8 = n / 8 * 8;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (int64_t j = 0; j < n8; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        _mm256_storeu_ps(y + j, act == 3 ? gelu8(v) : silu8(v));
    }
    if (n8 < n) {
        float block[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(block, x + n8, sizeof(float) * (n - n8));
        const __m256 v = _mm256_loadu_ps(block);
        _mm256_storeu_ps(block, act == 3 ? gelu8(v) : silu8(v));
        memcpy(y + n8, block, sizeof(float) * (n - n8));
    }
}

/* the dot products of q (dh) with the eight keys k + at[l]*ks, each as eight lanes of fmaf chains over d summed by
 * sum8x8 (lane l: key at[l]'s): a key's result is the same in any lane, beside any other keys */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 dots_at(const float *q, const float *k,
                                                                                int64_t ks, const int64_t *at,
                                                                                int64_t dh) {
    __m256 lanes[8];
    for (int l = 0; l < 8; l++) lanes[l] = _mm256_setzero_ps();
    for (int64_t d0 = 0; d0 < dh; d0 += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d0);
        for (int l = 0; l < 8; l++) lanes[l] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + at[l] * ks + d0), lanes[l]);
    }
    return sum8x8(lanes);
}

/* the dot products of q (dh) with up to 64 keys transposed, key l's element d at k[d*kd + l], m of them real: each
 * one fmaf chain over d (eight keys in a register's lanes, nb = ceil(m/8) registers at once), into out[0 : 8*nb]
 * (0 past m) */
static inline __attribute__((always_inline, target("avx2,fma"))) void dots_transposed_nb(const float *q,
                                                                                         const float *k, int64_t kd,
                                                                                         int64_t dh, int m, int nb,
                                                                                         float *out) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i in[8];
    __m256 acc[8];
    for (int b = 0; b < nb; b++) {
        in[b] = _mm256_cmpgt_epi32(_mm256_set1_epi32(m - 8 * b), lane);
        acc[b] = _mm256_setzero_ps();
    }
    for (int64_t d = 0; d < dh; d++) {
        const __m256 qd = _mm256_set1_ps(q[d]);
        for (int b = 0; b < nb; b++)
            acc[b] = _mm256_fmadd_ps(qd, _mm256_maskload_ps(k + d * kd + 8 * b, in[b]), acc[b]);
    }
    for (int b = 0; b < nb; b++) _mm256_storeu_ps(out + 8 * b, acc[b]);
}

/* (nb, the registers in use, a constant in each call: the accumulators stay registers) */
static inline __attribute__((always_inline, target("avx2,fma"))) void dots_transposed(const float *q, const float *k,
                                                                                      int64_t kd, int64_t dh,
                                                                                      int64_t n, float *out) {
    const int m = n < 64 ? (int)n : 64;
    switch ((m + 7) / 8) {
    case 1: dots_transposed_nb(q, k, kd, dh, m, 1, out); break;
    case 2: dots_transposed_nb(q, k, kd, dh, m, 2, out); break;
    case 3: dots_transposed_nb(q, k, kd, dh, m, 3, out); break;
    case 4: dots_transposed_nb(q, k, kd, dh, m, 4, out); break;
    case 5: dots_transposed_nb(q, k, kd, dh, m, 5, out); break;
    case 6: dots_transposed_nb(q, k, kd, dh, m, 6, out); break;
    case 7: dots_transposed_nb(q, k, kd, dh, m, 7, out); break;
    default: dots_transposed_nb(q, k, kd, dh, m, 8, out); break;
    }
}

/* out (nv * 8 floats) = sum_s (p_s / sum) v_s[0 : nv*8] over the L slots in order (v_s at v + s*vs), the slots with
 * p_s = 0 skipped: each output one fmaf chain, held in a register */
static inline __attribute__((always_inline, target("avx2,fma"))) void weigh_values(const float *p, float sum,
                                                                                   int64_t L, const float *v,
                                                                                   int64_t vs, int nv, float *out) {
    __m256 acc[4];
    for (int u = 0; u < 4; u++) acc[u] = _mm256_setzero_ps();
    for (int64_t s = 0; s < L; s++) {
        if (p[s] == 0) continue;
        const __m256 w = _mm256_set1_ps(p[s] / sum);
        for (int u = 0; u < nv; u++) acc[u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + s * vs + 8 * u), acc[u]);
    }
    for (int u = 0; u < nv; u++) _mm256_storeu_ps(out + 8 * u, acc[u]);
}

/* Attention on the CPU (tfcli.generate.step: a decoding step's, and the encoder's), every row and head in one call.
 * Row i of n has r queries a head (its beams, or its positions); the H = H_kv * g query heads share H_kv key/value
 * heads, g each. For row i, key/value head h, query head a = h*g + c (c < g) and query j < r:
 *   y[i*r + j, a*dh : (a+1)*dh] = sum_s p_s v[i, h, s],   p = softmax_s(alpha * q[i, j, a] . k[i, h, s] + bias_s)
 * over the L slots s. q element d at q + i*qn + j*qr + a*qh + d; keys at k + i*kn + h*kh + s*ks + d*kd, transposed
 * when ks == 1 (a decoder's source keys), else by slot with kd == 1; values at v + i*vn + h*vh + s*vs + d; bias_s
 * at bias + i*bn + h*bh + j*bj + s. A slot's dot product is one fixed order over d for each layout (by slot: eight
 * lanes of fmaf chains, then their sum in a fixed order; transposed: one chain a slot), so the caller keeps each
 * attention's keys in one layout; the softmax and the sum over slots run over s in order, and a slot with bias -inf
 * (padding, or a slot a beam does not see) gives p_s = 0 exactly and is skipped: so a row's result depends on that
 * row alone, not on its batch's width or neighbours. dh a multiple of 8; y is (n*r) x (H*dh), contiguous. One
 * version, for AVX2 and FMA (AVX-512 CPUs run it too): the same results on both. */
__attribute__((target("avx2,fma"))) void attend_rows(const float *q, int64_t qn, int64_t qr, int64_t qh, const float *k,
                                                   int64_t kn, int64_t kh, int64_t ks, int64_t kd, const float *v,
                                                   int64_t vn, int64_t vh, int64_t vs, const float *bias, int64_t bn,
                                                   int64_t bh, int64_t bj, int64_t n, int64_t H_kv, int64_t g,
                                                   int64_t r, int64_t L, int64_t dh, float alpha, float *y) {
    const int64_t H = H_kv * g, Lp = (L + 7) / 8 * 8;
    /* a task (a row's query against a head) costs about (L + 8) * dh multiply-adds twice, and a few hundred cycles */
#pragma omp parallel for schedule(static) if (n * H * r * (L + 8) * dh >= PARALLEL_MIN)
    for (int64_t t = 0; t < n * H_kv * g * r; t++) {
        const int64_t j = t % r, c = t / r % g, h = t / (r * g) % H_kv, i = t / (r * g * H_kv);
        const float *qv = q + i * qn + j * qr + (h * g + c) * qh;
        const float *kh_ = k + i * kn + h * kh, *vh_ = v + i * vn + h * vh;
        const float *bs = bias + i * bn + h * bh + j * bj;
        float p[Lp > 0 ? Lp : 8];
        if (ks != 1) { /* by slot: each slot's eight lanes of fmaf chains over d, then sum8; the keys of slots under
                        * bias -inf (another beam's, padding) are not read: their p_s is -inf whatever the product */
            int64_t seen[Lp > 0 ? Lp : 8], ns = 0;
            for (int64_t s = 0; s < L; s++) {
                p[s] = -INFINITY;
                if (bs[s] != -INFINITY) seen[ns++] = s;
            }
            for (int64_t i = ns; i % 8; i++) seen[i] = ns ? seen[ns - 1] : 0; /* (a last group's spare lanes) */
            for (int64_t i0 = 0; i0 < ns; i0 += 8) {
                float dots[8];
                _mm256_storeu_ps(dots, dots_at(qv, kh_, ks, seen + i0, dh));
                for (int l = 0; l < 8 && i0 + l < ns; l++) p[seen[i0 + l]] = dots[l];
            }
        } else /* transposed: one fmaf chain over d a slot */
            for (int64_t s0 = 0; s0 < L; s0 += 64) dots_transposed(qv, kh_ + s0, kd, dh, L - s0, p + s0);
        for (int64_t s = 0; s < L; s++) p[s] = alpha * p[s] + bs[s];
        for (int64_t s = L; s < Lp; s++) p[s] = -INFINITY;
        __m256 mx = _mm256_set1_ps(-INFINITY);
        for (int64_t s0 = 0; s0 < Lp; s0 += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(p + s0));
        float lane[8];
        _mm256_storeu_ps(lane, mx);
        float m = lane[0];
        for (int l = 1; l < 8; l++) m = lane[l] > m ? lane[l] : m;
        /* p_s = e^(p_s - m), eight slots at a time (past L -inf: zeros), summed in eight lanes (slot s in lane s % 8,
         * so that zeros past a row's slots change no lane), the lanes in a fixed order */
        __m256 lanes = _mm256_setzero_ps();
        const __m256 mv = _mm256_set1_ps(m);
        for (int64_t s0 = 0; s0 < Lp; s0 += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + s0), mv));
            lanes = _mm256_add_ps(lanes, e);
            _mm256_storeu_ps(p + s0, e);
        }
        _mm256_storeu_ps(lane, lanes);
        const float sum = sum8(lane);
        /* y = sum_s (p_s / sum) v_s over s in order, 32 of d at a time */
        float *out = y + (i * r + j) * H * dh + (h * g + c) * dh;
        int64_t d0 = 0;
        for (; d0 + 32 <= dh; d0 += 32) weigh_values(p, sum, L, vh_ + d0, vs, 4, out + d0);
        if (d0 < dh) weigh_values(p, sum, L, vh_ + d0, vs, (int)(dh - d0) / 8, out + d0);
    }
}

/* A search's next tokens (tfcli.generate.search), for each of R rows of logits x (R x V, contiguous): the banned
 * tokens' logits set to -inf in x (the nb ids in ban, and eos in the rows where ban_eos[r] is set; ban_eos may be
 * null); the k largest logits left, with their ids, best first (of equal values the lower id first); and the
 * log-softmax's normaliser over every token, banned or not, norm[r] = m + log(sum_j e^(x_j - m)), m = max_j x_j (the
 * sum in eight lanes, token j in lane j % 8, the banned tokens' terms in one more block, the lanes added in a fixed
 * order). In the rows where after[r] is set (after may be null: a constrained search's rows whose last token ended a
 * constraint), no token j with cont[j] set is among the k (the normaliser is still over every token). The k best are
 * returned as log-probs x_j - norm[r] in values and ids (each R x k): the log-softmax's order
 * is the logits', so they are chosen on the logits and only they are normalised. Two passes over a row; its result
 * depends on that row alone. With norm null (a greedy search whose scores nobody reads) the second pass is skipped
 * and values holds the k best logits. Returns 0; 2 where a row's logits hold NaN or +inf (a model that computes no
 * numbers, whose log-softmax is NaN with or without the normaliser written out: no token is chosen from them); or
 * -1, having done nothing, unless 1 <= k <= 64 and nb <= 7 (the sizes of its buffers). */
__attribute__((target("avx2,fma"))) int best_next(float *x, int64_t R, int64_t V, const int64_t *ban, int64_t nb,
                                                const uint8_t *ban_eos, int64_t eos, const uint8_t *after,
                                                const uint8_t *cont, int64_t k, float *values, int64_t *ids,
                                                float *norm) {
    if (k < 1 || k > 64 || nb < 0 || nb > 7) return -1;
    int nan = 0;
#pragma omp parallel for schedule(static) if (R * V >= PARALLEL_MIN)
    for (int64_t r = 0; r < R; r++) {
        float *xr = x + r * V;
        float banned[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (int64_t b = 0; b < nb; b++) banned[b] = xr[ban[b]], xr[ban[b]] = -INFINITY;
        if (ban_eos && ban_eos[r]) banned[nb] = xr[eos], xr[eos] = -INFINITY; /* (twice banned: its -inf, no term) */
        /* pass 1: the max, and the k best so far (sorted, best first), a block of eight looked at only when one of
         * its values beats the k-th */
        float bv[64];
        int64_t bi[64];
        for (int64_t i = 0; i < k; i++) bv[i] = -INFINITY, bi[i] = 0;
        __m256 mv = _mm256_loadu_ps(banned), kth = _mm256_set1_ps(-INFINITY);
        __m256 unordered = _mm256_cmp_ps(mv, mv, _CMP_UNORD_Q); /* (lanes that met a NaN) */
        const uint8_t *skip = after && after[r] ? cont : NULL; /* (never chosen here; still in the normaliser) */
        float tail = -INFINITY;                                 /* (the max of a last part block, where skipped) */
        for (int64_t j0 = 0; j0 < V; j0 += 8) {
            const int64_t nj = V - j0 < 8 ? V - j0 : 8;
            if (nj == 8) {
                const __m256 v = _mm256_loadu_ps(xr + j0);
                mv = _mm256_max_ps(mv, v);
                unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                if (!_mm256_movemask_ps(_mm256_cmp_ps(v, kth, _CMP_GT_OQ))) continue;
            }
            for (int64_t j = j0; j < j0 + nj; j++) {
                const float val = xr[j];
                if (nj < 8 && val > tail) tail = val;
                if (nj < 8 && isnan(val)) unordered = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
                if (!(val > bv[k - 1]) || (skip && skip[j])) continue;
                int64_t p = k - 1;
                while (p > 0 && bv[p - 1] < val) bv[p] = bv[p - 1], bi[p] = bi[p - 1], p--;
                bv[p] = val, bi[p] = j;
            }
            kth = _mm256_set1_ps(bv[k - 1]);
        }
        float lane[8];
        _mm256_storeu_ps(lane, mv);
        float m = bv[0] > tail ? bv[0] : tail;
        for (int l = 0; l < 8; l++) m = lane[l] > m ? lane[l] : m;
        if (_mm256_movemask_ps(unordered) || m == INFINITY) { /* (+inf: the normaliser, and its log-probs, NaN) */
#pragma omp atomic write
            nan = 1;
            continue;
        }
        if (!norm) {
            for (int64_t i = 0; i < k; i++) values[r * k + i] = bv[i], ids[r * k + i] = bi[i];
            continue;
        }
        /* pass 2: sum_j e^(x_j - m), the banned tokens' -inf giving zeros; the last V % 8 tokens and the banned
         * ones each a block filled with -inf */
        const __m256 mb = _mm256_set1_ps(m);
        const int64_t V8 = V / 8 * 8;
        __m256 sums = exp8(_mm256_sub_ps(_mm256_loadu_ps(banned), mb));
        for (int64_t j = 0; j < V8; j += 8)
            sums = _mm256_add_ps(sums, exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + j), mb)));
        if (V8 < V) {
            float block[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
            memcpy(block, xr + V8, sizeof(float) * (V - V8));
            sums = _mm256_add_ps(sums, exp8(_mm256_sub_ps(_mm256_loadu_ps(block), mb)));
        }
        _mm256_storeu_ps(lane, sums);
        const float nr = m + logf(sum8(lane));
        norm[r] = nr;
        for (int64_t i = 0; i < k; i++) values[r * k + i] = bv[i] - nr, ids[r * k + i] = bi[i];
    }
    return nan ? 2 : 0;
}

/* e^x in double for x <= 0 (-inf: 0), in plain IEEE operations (rows.c is built without contraction into FMA), so
 * that its bits are the same on every CPU: libm's exp is chosen by instruction set. x = k ln2 + r, |r| <= ln2 / 2
 * (ln2 in two parts), e^r by its Taylor series to r^13 (a term below 2^-60 of the sum), times 2^k. Within about an
 * ulp of e^x. */
static double exp_det(double x) {
    if (!(x > -745.2)) return 0.0; /* (below e^-745.2 nothing is representable; -inf) */
    const double k = floor(x * 1.4426950408889634 + 0.5);
    const double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double e = 1.0 / 6227020800.0; /* 1/13! */
    static const double inv_fact[13] = {1.0,           1.0,           1.0 / 2,          1.0 / 6,
                                        1.0 / 24,      1.0 / 120,     1.0 / 720,        1.0 / 5040,
                                        1.0 / 40320,   1.0 / 362880,  1.0 / 3628800,    1.0 / 39916800,
                                        1.0 / 479001600};
    for (int i = 12; i >= 0; i--) e = e * r + inv_fact[i];
    return ldexp(e, (int)k);
}

/* The next token of each of R rows of logits x (R x V, contiguous; banned tokens -inf already), drawn from the
 * softmax over the row's tokens whose logit is at least lo[r] (the others: probability 0) by inverse transform with
 * the uniform u[r] in [0, 1): p_j = e^(x_j - m) / sum (m = mx[r], the row's max; the sum and the cumulative sum in
 * float64, token by token in order), and the first token whose cumulative probability exceeds u[r] times the
 * total (some token does: u < 1, and the last sum is the total, added up in the same order). Three passes over
 * the tokens kept: up to 64 of them are remembered with their e^(x_j - m), more (ties at lo) found and computed
 * again. The logits hold no NaN or +inf (best_next, which finds lo and mx, refuses those rows). Returns 0; 2 where a
 * row has no finite logit (every token banned: its softmax is NaN, and nothing is drawn). */
__attribute__((target("avx2"))) int draw_rows(const float *x, int64_t R, int64_t V, const float *lo, const float *mx,
                                               const double *u, int64_t *ids) {
    int empty = 0;
#pragma omp parallel for schedule(static) if (R * V >= PARALLEL_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * V;
        const float low = lo[r];
        const double m = mx[r];
        if (!(m > -INFINITY)) {
#pragma omp atomic write
            empty = 1;
            continue;
        }
        const __m256 lowv = _mm256_set1_ps(low);
        int64_t kept[64], nk = 0, overflow = 0;
        double e[64], sum = 0.0;
        for (int64_t j0 = 0; j0 < V; j0 += 8) { /* (a block of eight looked at only where one reaches lo) */
            const int64_t nj = V - j0 < 8 ? V - j0 : 8;
            if (nj == 8 && !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(xr + j0), lowv, _CMP_GE_OQ))) continue;
            for (int64_t j = j0; j < j0 + nj; j++) {
                if (!(xr[j] >= low)) continue;
                const double ej = exp_det((double)xr[j] - m);
                if (nk < 64) kept[nk] = j, e[nk++] = ej;
                else overflow = 1;
                sum += ej;
            }
        }
        const int64_t n = overflow ? V : nk; /* (overflow: every token again, the ones below lo skipped) */
        const double inv = 1.0 / sum;
        double total = 0.0;
        for (int64_t i = 0; i < n; i++) {
            if (!overflow) total += e[i] * inv;
            else if (xr[i] >= low) total += exp_det((double)xr[i] - m) * inv;
        }
        const double target = u[r] * total;
        double c = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t j = overflow ? i : kept[i];
            if (overflow && !(xr[j] >= low)) continue;
            c += (overflow ? exp_det((double)xr[j] - m) : e[i]) * inv;
            if (c > target) {
                ids[r] = j;
                break;
            }
        }
    }
    return empty ? 2 : 0;
}

/* One step of a constrained beam search's choice (tfcli.generate.search: `pick_by_banks`, whose torch form gives the
 * same integers): for each of n sentences, its M candidates (scores sorted best first, tokens, the beam of k each
 * came from) against its C phrases (con: n x C x (3 + L): the constraint each is a form of, the one it waits for,
 * its length, its tokens). Each candidate's progress in each phrase after its token (`advanced`: on where the token
 * is the phrase's next, again at 1 where it is its first, else 0; held at 0 where its beam's `ready` is 0; for good
 * once met), what that comes to (`constraint_state`: the phrases of unmet constraints, the tokens missing, the
 * bank), and the K continuing candidates by banks (each bank's best in turn, the fullest bank first; candidates
 * that end or score -inf last), in candidate order. Out: pick (n x K), missing (n x K), the picked candidates'
 * progress (n x K x C) and open phrases (n x K x C), and whether its token met a constraint (n x K). Returns -1
 * (nothing written) where K > M or scratch memory cannot be had. */
int constrained_pick(int64_t n, int64_t M, int64_t K, int64_t k, int64_t C, int64_t L, const float *scores,
                     const int64_t *tok, const int64_t *beam, int64_t eos, const int64_t *con, const int64_t *prog,
                     const uint8_t *ready, const uint8_t *open, int alternatives, int64_t *pick, int64_t *missing,
                     int64_t *next_prog, uint8_t *next_open, uint8_t *fresh) {
    if (K > M) return -1;
    const int64_t W3 = 3 + L, banks = C * L + 1;
    int64_t *cp = malloc(sizeof(int64_t) * (M * C + 3 * M + banks)), *bank = cp + M * C, *miss = bank + M;
    int64_t *key = miss + M, *count = key + M;
    uint8_t *op = malloc((size_t)(M * C > 0 ? M * C : 1));
    if (!cp || !op) {
        free(cp), free(op);
        return -1;
    }
    for (int64_t s = 0; s < n; s++) {
        const int64_t *cs = con + s * C * W3;
        for (int64_t m = 0; m < M; m++) {
            const int64_t row = s * k + beam[s * M + m], t = tok[s * M + m];
            int64_t *np = cp + m * C;
            for (int64_t c = 0; c < C; c++) {
                const int64_t p = prog[row * C + c], len = cs[c * W3 + 2], *ph = cs + c * W3 + 3;
                int64_t v = p;
                if (p < len) {
                    v = ph[p] == t ? p + 1 : ph[0] == t ? 1 : 0;
                    if (ready && !ready[row * C + c]) v = 0;
                }
                np[c] = v;
            }
            int64_t whole = 0, part = 0, lack = 0;
            for (int64_t c = 0; c < C; c++) {
                const int64_t len = cs[c * W3 + 2], group = cs[c * W3];
                int done = np[c] >= len, first = 1;
                int64_t credit = done ? len : 0, shortest = len;
                if (alternatives)
                    for (int64_t d = 0; d < C; d++) {
                        if (cs[d * W3] != group) continue;
                        const int64_t dl = cs[d * W3 + 2];
                        first &= d >= c;
                        if (np[d] >= dl) done = 1, credit = dl > credit ? dl : credit;
                        shortest = dl < shortest ? dl : shortest;
                    }
                op[m * C + c] = (uint8_t)!done;
                if (first) whole += credit, lack += done ? 0 : shortest;
                if (!done && np[c] > part) part = np[c];
            }
            bank[m] = whole + part < banks ? whole + part : banks - 1;
            miss[m] = lack;
        }
        for (int64_t b = 0; b < banks; b++) count[b] = 0;
        for (int64_t m = 0; m < M; m++) {
            const int ok = tok[s * M + m] != eos && scores[s * M + m] > -INFINITY;
            key[m] = ok ? count[bank[m]]++ * banks + (banks - 1 - bank[m]) : M * banks + m;
        }
        /* the K smallest keys (all different), then in candidate order */
        int64_t *out = pick + s * K;
        for (int64_t j = 0; j < K; j++) {
            int64_t best = -1;
            for (int64_t m = 0; m < M; m++)
                if (key[m] >= 0 && (best < 0 || key[m] < key[best])) best = m;
            out[j] = best;
            key[best] = -1;
        }
        for (int64_t j = 1; j < K; j++)
            for (int64_t i = j; i > 0 && out[i - 1] > out[i]; i--) {
                const int64_t x = out[i];
                out[i] = out[i - 1], out[i - 1] = x;
            }
        for (int64_t j = 0; j < K; j++) {
            const int64_t m = out[j], row = s * k + beam[s * M + m], o = (s * K + j) * C;
            uint8_t met = 0;
            missing[s * K + j] = miss[m];
            for (int64_t c = 0; c < C; c++) {
                next_prog[o + c] = cp[m * C + c], next_open[o + c] = op[m * C + c];
                met |= open[row * C + c] && !op[m * C + c];
            }
            fresh[s * K + j] = met;
        }
    }
    free(cp), free(op);
    return 0;
}

/* A decoder's layers for one step (tfcli.generate.step: IncrementalDecoder), all in one call: what the step runs
 * through RowLinear and attend_rows one call at a time (the same functions in the same order, so the same bits),
 * without a Python-level operator between them. A linear layer as RowLinear holds it (its LayerNorm folded in): */
typedef struct {
    const float *wt, *b, *ln; /* the weights in column blocks, the bias (or null), LayerNorm weight | bias (or null) */
    int64_t K, N;
    int32_t act;  /* 0 none, 1 ReLU, 2 ReLU^2 (both exact: the same bits as torch's), 3 GELU, 4 SiLU (activate) */
    int32_t norm; /* 0 none, 1 on the input rows, 2 on the output rows */
    float eps;
} linear_t;

/* One layer: its linear layers (cross_q and cross_out unused without a source), QK-norm's RMSNorm gains (d_head
 * each; null without it), and the batch's memory: self-attention keys | values (n, H_kv, slots, 2*d_head), the
 * source keys transposed (n, H_kv, d_head, S) and values (n, H_kv, S, d_head), each row at its stride. */
typedef struct {
    linear_t qkv, self_out, cross_q, cross_out, w1, w2;
    const float *q_norm, *k_norm, *cross_q_norm;
    float qk_eps;
    float *kv;
    const float *mem_kt, *mem_v; /* null: no source (a language model) */
} layer_t;

static void linear_call(const tile_fn *tile, const int *width, int RF, const linear_t *f, const float *x,
                        const float *res, float *y, int64_t M, float *xn) {
    const int64_t n = M * f->N;
    linear_tiles(tile, width, RF, x, f->wt, f->b, res, f->N, f->act == 1 || f->act == 2, y, M, f->K, f->N, f->ln,
                 f->norm, f->eps, xn);
    if (f->act == 2)
        for (int64_t j = 0; j < n; j++) y[j] = y[j] * y[j];
    if (f->act == 3 || f->act == 4) activate(y, y, n, f->act);
}

/* x (M x D, M = n*r: r new positions or beams a row) -> the last layer's output, in place. The r positions are
 * written at slots start..start+r-1 of the self-attention memory and attend to its first L slots under bias
 * (row i, query j, slot s at bias + i*bn + j*bj + s: 0 or -inf), and to the source's S slots under mem_bias
 * ((n, H_kv, S): 0 or -inf). work: M x (3*D + D + 2*D_kv + d_ff) floats of scratch. */
static void layers_run(const tile_fn *tile, const int *width, int RF, const layer_t *layers, int64_t n_layers,
                       float *x, float *work, int64_t n, int64_t r, int64_t H, int64_t H_kv, int64_t dh,
                       int64_t slots, int64_t start, int64_t L, const float *bias, int64_t bn, int64_t bj,
                       const float *mem_bias, int64_t S, float scale) {
    const int64_t M = n * r, D = H * dh, Dkv = H_kv * dh, Nq = D + 2 * Dkv, g = H / H_kv, F = layers[0].w1.N;
    const int64_t kn = H_kv * slots * 2 * dh, kh = slots * 2 * dh; /* the self-attention memory's strides */
    float *cur = x, *nxt = work, *qkv = work + M * D, *att = qkv + M * Nq, *hid = att + M * D, *xn = hid + M * F;
    float *swap;
    for (int64_t l = 0; l < n_layers; l++) {
        const layer_t *ly = layers + l;
        linear_call(tile, width, RF, &ly->qkv, cur, 0, qkv, M, xn);
        for (int64_t m = 0; m < M; m++) {
            float *row = qkv + m * Nq;
            if (ly->q_norm)
                for (int64_t a = 0; a < H; a++) rms_row(row + a * dh, dh, ly->q_norm, ly->qk_eps);
            if (ly->k_norm)
                for (int64_t h = 0; h < H_kv; h++) rms_row(row + D + h * dh, dh, ly->k_norm, ly->qk_eps);
            for (int64_t h = 0; h < H_kv; h++) { /* position m % r of row m / r: key | value at its slot */
                float *slot = ly->kv + m / r * kn + h * kh + (start + m % r) * 2 * dh;
                memcpy(slot, row + D + h * dh, sizeof(float) * dh);
                memcpy(slot + dh, row + D + Dkv + h * dh, sizeof(float) * dh);
            }
        }
        attend_rows(qkv, r * Nq, Nq, dh, ly->kv, kn, kh, 2 * dh, 1, ly->kv + dh, kn, kh, 2 * dh, bias, bn, 0, bj, n,
                    H_kv, g, r, L, dh, scale, att);
        linear_call(tile, width, RF, &ly->self_out, att, cur, nxt, M, xn);
        swap = cur, cur = nxt, nxt = swap;
        if (ly->mem_kt) {
            linear_call(tile, width, RF, &ly->cross_q, cur, 0, qkv, M, xn);
            if (ly->cross_q_norm)
                for (int64_t a = 0; a < M * H; a++) rms_row(qkv + a * dh, dh, ly->cross_q_norm, ly->qk_eps);
            attend_rows(qkv, r * D, D, dh, ly->mem_kt, H_kv * dh * S, dh * S, 1, S, ly->mem_v, H_kv * S * dh, S * dh,
                        dh, mem_bias, H_kv * S, S, 0, n, H_kv, g, r, S, dh, scale, att);
            linear_call(tile, width, RF, &ly->cross_out, att, cur, nxt, M, xn);
            swap = cur, cur = nxt, nxt = swap;
        }
        linear_call(tile, width, RF, &ly->w1, cur, 0, hid, M, xn);
        linear_call(tile, width, RF, &ly->w2, hid, cur, nxt, M, xn);
        swap = cur, cur = nxt, nxt = swap;
    }
    if (cur != x) memcpy(x, cur, sizeof(float) * M * D);
}

#define LAYERS_ARGS                                                                                                    \
    const layer_t *layers, int64_t n_layers, float *x, float *work, int64_t n, int64_t r, int64_t H, int64_t H_kv,    \
        int64_t dh, int64_t slots, int64_t start, int64_t L, const float *bias, int64_t bn, int64_t bj,               \
        const float *mem_bias, int64_t S, float scale
#define LAYERS_PASS layers, n_layers, x, work, n, r, H, H_kv, dh, slots, start, L, bias, bn, bj, mem_bias, S, scale

void decode_layers(LAYERS_ARGS) { layers_run(TILES_AVX512, WIDTH_AVX512, 8, LAYERS_PASS); }

void decode_layers_avx2(LAYERS_ARGS) { layers_run(TILES_AVX2, WIDTH_AVX2, 3, LAYERS_PASS); }

/* the structs' layout as this compiler lays them out, for the caller to hold its own against (tfcli.generate.native):
 * sizeof linear_t, sizeof layer_t, offsetof linear_t.eps, offsetof layer_t.kv, offsetof layer_t.mem_v */
void struct_layout(int64_t *out) {
    out[0] = (int64_t)sizeof(linear_t), out[1] = (int64_t)sizeof(layer_t);
    out[2] = (int64_t)offsetof(linear_t, eps), out[3] = (int64_t)offsetof(layer_t, kv);
    out[4] = (int64_t)offsetof(layer_t, mem_v);
}

/* int8 linear layers (tfcli.generate.int8, engine "rows"): y (M x N) = (float)(q W^T)[r, j] * ws[j] * s[r], then
 * + b[j] (b may be null), + res[r, j] (may be null; row stride ldr), max(y, 0) when relu: the operations, in their
 * order, of fbgemm's path through int8.py (fbgemm's float output, then dequantize_rows), so the same bits. q and s
 * are quantize_rows' of x, taken in the call (into xq, M x 4*K4 bytes, and s). W (int8, |w| <= 127) comes packed in
 * blocks of 64 outputs: block c, group k4 of four inputs, holds the 64 outputs' four weights each (byte
 * 256*(c*K4 + k4) + 4*o + i: output 64c + o, input 4*k4 + i), zero past N (to a multiple of 64) and past K (to a
 * multiple of 4); cs[j] = sum_k W[j, k]. A row goes in as u = q + 64 (1..127: the instructions multiply unsigned
 * by signed bytes), so a sum is sum u w - 64 cs[j], exact in 32 bits. AVX-512 VNNI (vpdpbusd: four products into
 * a lane) runs tiles of up to 6 rows x 64 outputs; AVX2 (vpmaddubsw: pairs into 16 bits, at most 2 * 127 * 127 <
 * 2^15, never saturated; vpmaddwd: into 32) tiles of up to 2 rows x 32 outputs. */
typedef void (*i8tile_fn)(const uint8_t *, int64_t, const int8_t *, const int32_t *, const float *, const float *,
                          const float *, const float *, int64_t, int, float *, int64_t, int64_t, int);

#define I8TILE(ISA, TARGET, VEC, IVEC, LANES, LOADI, BCAST, DOT, CVT, LOAD, SET1, ZERO, MUL, ADD, MAX, STORE, SUBI,  \
               SHLI, R, V)                                                                                           \
    static __attribute__((target(TARGET))) void i8tile_##ISA##_##R(                                                   \
        const uint8_t *restrict xq, int64_t K4, const int8_t *restrict wp, const int32_t *restrict cs,               \
        const float *restrict ws, const float *restrict s, const float *restrict b, const float *restrict res,       \
        int64_t ldr, int relu, float *restrict y, int64_t ldy, int64_t j0, int nj) {                                 \
        IVEC acc[R][V];                                                                                               \
        const int8_t *w[V]; /* vector v: outputs j0 + LANES*v.., in block (j0 + LANES*v) / 64 */                     \
        _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) {                                                         \
            const int64_t j = j0 + LANES * v;                                                                         \
            w[v] = wp + j / 64 * 256 * K4 + j % 64 * 4;                                                               \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r][v] = (IVEC){0};                                \
        }                                                                                                             \
        for (int64_t k = 0; k < K4; k++) {                                                                            \
            IVEC wv[V];                                                                                               \
            _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) wv[v] = LOADI(w[v] + 256 * k);                        \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                     \
                int32_t four;                                                                                         \
                memcpy(&four, xq + r * 4 * K4 + 4 * k, 4);                                                            \
                const IVEC xv = BCAST(four);                                                                          \
                _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) acc[r][v] = DOT(acc[r][v], xv, wv[v]);            \
            }                                                                                                         \
        }                                                                                                             \
        VEC f[R][V]; /* (float)(sum) * ws[j] * s[r] + b[j] */                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                         \
            const VEC sr = SET1(s[r]);                                                                                \
            _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) {                                                     \
                const int64_t j = j0 + LANES * v;                                                                     \
                const IVEC sum = SUBI(acc[r][v], SHLI(LOADI(cs + j), 6));                                             \
                f[r][v] = MUL(MUL(CVT(sum), LOAD(ws + j)), sr);                                                       \
                if (b) f[r][v] = ADD(f[r][v], LOAD(b + j));                                                           \
            }                                                                                                         \
        }                                                                                                             \
        TILE_STORE(VEC, LANES, LOAD, ZERO, ADD, MAX, STORE, R, V, f);                                                \
    }
#define LOADI512(p) _mm512_loadu_si512((const void *)(p))
/* acc + the sums of four u8 x s8 products (vpdpbusd), in inline assembly: GCC's intrinsic copies and spills the
 * accumulators every step */
static inline __attribute__((always_inline, target("avx512f,avx512vnni"))) __m512i dot512(__m512i acc, __m512i x,
                                                                                          __m512i w) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
    return acc;
}
#define DOT512(acc, x, w) dot512(acc, x, w)
#define SET1PS512(v) _mm512_set1_ps(v)
#define I8TILE512(R)                                                                                                  \
    I8TILE(avx512, "avx512f,avx512bw,avx512vnni,avx2,fma", __m512, __m512i, 16, LOADI512, _mm512_set1_epi32, DOT512, \
           _mm512_cvtepi32_ps, _mm512_loadu_ps, SET1PS512, _mm512_setzero_ps, _mm512_mul_ps, _mm512_add_ps,          \
           _mm512_max_ps, _mm512_storeu_ps, _mm512_sub_epi32, _mm512_slli_epi32, R, 4)
#define LOADI256(p) _mm256_loadu_si256((const __m256i *)(p))
/* acc + the sums of four u8 x s8 products (pairs in 16 bits, then pairs of those in 32), in inline assembly, as
 * dot512 */
static inline __attribute__((always_inline, target("avx2"))) __m256i dot256(__m256i acc, __m256i x, __m256i w) {
    __m256i t;
    __asm__("vpmaddubsw %3, %2, %1\n\tvpmaddwd %4, %1, %1\n\tvpaddd %1, %0, %0"
            : "+x"(acc), "=&x"(t)
            : "x"(x), "x"(w), "x"(_mm256_set1_epi16(1)));
    return acc;
}
#define DOT256(acc, x, w) dot256(acc, x, w)
#define SET1PS256(v) _mm256_set1_ps(v)
#define I8TILE256(R)                                                                                                  \
    I8TILE(avx2, "avx2,fma", __m256, __m256i, 8, LOADI256, _mm256_set1_epi32, DOT256, _mm256_cvtepi32_ps,            \
           _mm256_loadu_ps, SET1PS256, _mm256_setzero_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_max_ps,               \
           _mm256_storeu_ps, _mm256_sub_epi32, _mm256_slli_epi32, R, 4)
I8TILE512(1)
I8TILE512(2)
I8TILE512(3)
I8TILE512(4)
I8TILE512(5)
I8TILE512(6)
I8TILE256(1)
I8TILE256(2)

static const i8tile_fn I8TILES_AVX512[7] = {0, i8tile_avx512_1, i8tile_avx512_2, i8tile_avx512_3, i8tile_avx512_4,
                                            i8tile_avx512_5, i8tile_avx512_6};
static const i8tile_fn I8TILES_AVX2[3] = {0, i8tile_avx2_1, i8tile_avx2_2};

/* quantize_rows' s and q of one row of K, as u = q + 64 into 4*K4 bytes (zero past K) */
static inline __attribute__((always_inline)) void quantize_u8(const float *xr, int64_t K, int64_t K4, float levels,
                                                               uint8_t *u, float *s) {
    const float m = absmax(xr, K);
    const float sr = row_scale(m, 1e-30f, levels);
    *s = sr;
    if (isnan(sr)) memset(u, 64, K);
    else
        for (int64_t j = 0; j < K; j++) u[j] = (uint8_t)((int)nearbyintf(xr[j] / sr) + 64);
    for (int64_t j = K; j < 4 * K4; j++) u[j] = 0;
}

/* the rows in tiles of RF, then the last M % RF as one tile, over spans of 64 outputs (a block of W: every row tile
 * runs over it while it is in the caches), the spans split over the OpenMP threads */
#define I8LINEAR(NAME, TARGET, TILES, RF, WIDTH)                                                                      \
    __attribute__((target(TARGET))) void NAME(const float *x, int64_t M, int64_t K, int64_t N, float levels,         \
                                              const int8_t *wp, const int32_t *cs, const float *ws, const float *b,  \
                                              const float *res, int64_t ldr, int relu, float *y, uint8_t *xq,        \
                                              float *s) {                                                             \
        const int64_t K4 = (K + 3) / 4, full = M / RF, spans = (N + 63) / 64;                                         \
        const int rest = (int)(M % RF);                                                                               \
        _Pragma("omp parallel if (M * N * K >= 8 * PARALLEL_MIN)") {                                                  \
            _Pragma("omp for schedule(static)") for (int64_t r = 0; r < M; r++)                                       \
                quantize_u8(x + r * K, K, K4, levels, xq + r * 4 * K4, s + r);                                        \
            _Pragma("omp for schedule(static)") for (int64_t c = 0; c < spans; c++) {                                 \
                const int64_t end = (c + 1) * 64 < N ? (c + 1) * 64 : N;                                              \
                for (int64_t j0 = c * 64; j0 < end; j0 += WIDTH) {                                                    \
                    const int nj = end - j0 < WIDTH ? (int)(end - j0) : WIDTH;                                        \
                    for (int64_t t = 0; t <= full; t++) {                                                             \
                        const int R = t < full ? RF : rest;                                                           \
                        if (R)                                                                                        \
                            TILES[R](xq + t * RF * 4 * K4, K4, wp, cs, ws, s + t * RF, b,                             \
                                     res ? res + t * RF * ldr : 0, ldr, relu, y + t * RF * N, N, j0, nj);             \
                    }                                                                                                 \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
    }
I8LINEAR(linear_int8, "avx512f,avx512bw,avx512vnni,avx2,fma", I8TILES_AVX512, 6, 64)
I8LINEAR(linear_int8_avx2, "avx2,fma", I8TILES_AVX2, 2, 32)

/* One row of W quantised (ws, its scale, given): q_k = round(w_k / ws) half to even into row (when not null) and into
 * block (linear_int8's layout: q_k at block[k / 4 * 256 + k % 4], when not null); returns the sum of the q_k. The
 * vector versions do the same IEEE operations (a division, a rounding to nearest even; the conversions of integers
 * up to 127 are exact): the same bytes. */
static inline __attribute__((always_inline)) int32_t quantize_tail(const float *w, int64_t k, int64_t K, float ws,
                                                                   int8_t *row, int8_t *block) {
    int32_t sum = 0;
    for (; k < K; k++) {
        const int8_t q = (int8_t)nearbyintf(w[k] / ws);
        sum += q;
        if (row) row[k] = q;
        if (block) block[k / 4 * 256 + k % 4] = q;
    }
    return sum;
}

#if defined(__x86_64__)
static __attribute__((target("avx512f"))) int32_t quantize_row_avx512(const float *w, int64_t K, float ws,
                                                                        int8_t *row, int8_t *block) {
    const __m512 s = _mm512_set1_ps(ws);
    __m512i acc = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(w + k), s),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i q = _mm512_cvtps_epi32(r);
        acc = _mm512_add_epi32(acc, q);
        const __m128i b = _mm512_cvtepi32_epi8(q);
        if (row) _mm_storeu_si128((__m128i *)(row + k), b);
        if (block) {
            int32_t g[4];
            _mm_storeu_si128((__m128i *)g, b);
            for (int i = 0; i < 4; i++) memcpy(block + (k / 4 + i) * 256, g + i, 4);
        }
    }
    return _mm512_reduce_add_epi32(acc) + quantize_tail(w, k, K, ws, row, block);
}

static __attribute__((target("avx2"))) int32_t quantize_row_avx2(const float *w, int64_t K, float ws, int8_t *row,
                                                                  int8_t *block) {
    const __m256 s = _mm256_set1_ps(ws);
    __m256i acc = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(w + k), s),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i q = _mm256_cvtps_epi32(r);
        acc = _mm256_add_epi32(acc, q);
        const __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        const __m128i b = _mm_packs_epi16(h, h); /* (|q| <= 127: no saturation) */
        int32_t g[4];
        _mm_storeu_si128((__m128i *)g, b);
        if (row) memcpy(row + k, g, 8);
        if (block) {
            memcpy(block + k / 4 * 256, g, 4);
            memcpy(block + (k / 4 + 1) * 256, g + 1, 4);
        }
    }
    int32_t lane[8];
    _mm256_storeu_si256((__m256i *)lane, acc);
    int32_t sum = 0;
    for (int i = 0; i < 8; i++) sum += lane[i];
    return sum + quantize_tail(w, k, K, ws, row, block);
}
#endif

/* W's rows quantised as tfcli.generate.int8.quantize_weight does (the same IEEE operations: the same bytes): for
 * each of its N rows (row stride ldw), ws = max(max_k |w_k|, 1e-12) / 127 and q_k = round(w_k / ws), half to even;
 * written as plain rows into wq (N x K) where it is not null, and into wp in linear_int8's blocks (the first row
 * a multiple of 64 into the whole matrix; rows past N and inputs past K left as they are: zero) with cs, the sum
 * of each row's q, where wp is not null. isa: 2 AVX-512, 1 AVX2, 0 plain C (the same bytes). A row holding NaN or
 * inf: ws NaN and q 0 (row_scale). */
CLONES void quantize_weight(const float *w, int64_t N, int64_t K, int64_t ldw, int8_t *wq, int8_t *wp, int32_t *cs,
                            float *ws, int isa) {
    const int64_t K4 = (K + 3) / 4;
    int32_t (*row_fn)(const float *, int64_t, float, int8_t *, int8_t *) = 0; /* isa 0: the loop, inlined here */
#if defined(__x86_64__)
    if (isa == 2) row_fn = quantize_row_avx512;
    if (isa == 1) row_fn = quantize_row_avx2;
#endif
#pragma omp parallel for schedule(static) if (N * K >= PARALLEL_MIN)
    for (int64_t j = 0; j < N; j++) {
        const float *wr = w + j * ldw;
        const float m = absmax(wr, K);
        const float sj = row_scale(m, 1e-12f, 127.0f);
        ws[j] = sj;
        int8_t *row = wq ? wq + j * K : 0, *block = wp ? wp + j / 64 * 256 * K4 + j % 64 * 4 : 0;
        if (isnan(sj)) { /* (NaN or inf in the row: zeros, and the scale says so) */
            for (int64_t k = 0; k < K; k++) {
                if (row) row[k] = 0;
                if (block) block[k / 4 * 256 + k % 4] = 0;
            }
            if (cs) cs[j] = 0;
            continue;
        }
        const int32_t sum = row_fn ? row_fn(wr, K, sj, row, block) : quantize_tail(wr, 0, K, sj, row, block);
        if (cs) cs[j] = sum;
    }
}

/* which version of linear_int8 this CPU runs: 2 AVX-512 with VNNI (linear_int8), 1 AVX2 (linear_int8_avx2), 0 neither */
int linear_int8_supported(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") ? 2 : 1;
#else
    return 0;
#endif
}

/* which version of linear_rows this CPU runs: 2 AVX-512 (F and FMA: linear_rows), 1 AVX2 and FMA
 * (linear_rows_avx2), 0 neither */
int linear_rows_supported(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    return __builtin_cpu_supports("avx512f") ? 2 : 1;
#else
    return 0;
#endif
}
