/* Row-wise kernels of CPU decoding: built once per machine by tfcli.generate.native with the system's C compiler
 * (plain C, no torch headers) and called through ctypes on tensors' memory. The int8 helpers each do in one pass over
 * a row what torch does in several; their results are bit for bit those of the torch fallback in int8.py (the same
 * IEEE operations in the same order; compiled with -ffp-contract=off, never -ffast-math), and their loops are compiled
 * for AVX-512, AVX2 and plain x86-64, the best one picked at load (GCC target_clones). The fp32 linear layers at the
 * end have an AVX-512 and an AVX2 version, the same results bit for bit; the caller asks linear_rows_supported which
 * runs here. */
#include <math.h>
#include <stdint.h>
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

/* x (rows x cols, row stride ld) -> s[r] = max(max_j |x[r, j]|, 1e-30) / levels and q[r, j] = round(x[r, j] / s[r])
 * (half to even), |q| <= levels: as int8 into q8 when it is not null, else as float into qf. */
CLONES void quantize_rows(const float *x, int64_t rows, int64_t cols, int64_t ld, float levels, int8_t *q8,
                          float *qf, float *s) {
#pragma omp parallel for schedule(static) if (rows * cols >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ld;
        /* max |x|: for floats without their sign bit, the order of the values is that of the bits as unsigned
         * integers, and an integer max vectorises (a float max does not without -ffast-math) */
        uint32_t mb = 0;
        for (int64_t j = 0; j < cols; j++) {
            uint32_t b;
            memcpy(&b, xr + j, sizeof b);
            b &= 0x7fffffffu;
            mb = b > mb ? b : mb;
        }
        float m;
        memcpy(&m, &mb, sizeof m);
        float sr = (m > 1e-30f ? m : 1e-30f) / levels;
        s[r] = sr;
        if (q8) {
            int8_t *qr = q8 + r * cols;
            for (int64_t j = 0; j < cols; j++) qr[j] = (int8_t)nearbyintf(xr[j] / sr);
        } else {
            float *qr = qf + r * cols;
            for (int64_t j = 0; j < cols; j++) qr[j] = nearbyintf(xr[j] / sr);
        }
    }
}

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
            if (relu) v = v > 0.0f ? v : 0.0f;
            yr[j] = v;
        }
    }
}

/* fp32 linear layers (tfcli.generate.native.RowLinear): y (M x N) = x (M x K) W^T + b, then + res (row stride ldr;
 * may be null), then max(y, 0) when relu. wt is W in column blocks of 32 outputs (block c: K x 32, row k holding
 * input k's weights for outputs 32c..32c+31), zero past N up to a multiple of 64 outputs, b padded likewise (may be
 * null). Each output is one chain of fused multiply-adds over k = 0..K-1 starting from its bias, whatever tile it
 * falls in and whichever version runs, so a row's result is the same for any M, on AVX-512 and AVX2 alike. The tiles
 * are split over the OpenMP threads, column blocks outer so that a block of W is reused by the row blocks after it.
 * fmaf is explicit: the file is compiled with -ffp-contract=off.
 *
 * AVX-512: tiles of 8 rows x 32 outputs in 16 of its 32 registers, then for the last M % 8 rows one tile of each
 * smaller power of two. */
#define TILE(R, W)                                                                                                     \
    static inline __attribute__((always_inline)) void tile_##R##_##W(                                                  \
        const float *restrict x, int64_t K, const float *restrict wt, const float *restrict b,                        \
        const float *restrict res, int64_t ldr, int relu, float *restrict y, int64_t ldy, int64_t j0, int nj) {        \
        float acc[R][W];                                                                                               \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int j = 0; j < W; j++) acc[r][j] = b ? b[j0 + j] : 0.0f;                                              \
        const float *w = wt + j0 * K; /* the column block's K x W weights, one after the other */                    \
        for (int64_t k = 0; k < K; k++, w += W)                                                                        \
            for (int r = 0; r < R; r++) {                                                                              \
                const float xv = x[r * K + k];                                                                         \
                _Pragma("omp simd") for (int j = 0; j < W; j++) acc[r][j] = __builtin_fmaf(xv, w[j], acc[r][j]);      \
            }                                                                                                          \
        for (int r = 0; r < R; r++) {                                                                                  \
            if (res)                                                                                                   \
                for (int j = 0; j < nj; j++) acc[r][j] = acc[r][j] + res[r * ldr + j0 + j];                            \
            if (relu)                                                                                                  \
                for (int j = 0; j < W; j++) acc[r][j] = acc[r][j] > 0.0f ? acc[r][j] : 0.0f;                          \
            memcpy(y + r * ldy + j0, acc[r], sizeof(float) * nj);                                                      \
        }                                                                                                              \
    }
TILE(8, 32)
TILE(4, 32)
TILE(2, 32)
TILE(1, 32)

/* row block i of M rows in blocks of 8, then one of each smaller power of two that M % 8 needs -> (first row, rows) */
static inline __attribute__((always_inline)) void row_block(int64_t M, int64_t i, int64_t *r0, int *R) {
    int64_t full = M / 8;
    *r0 = i < full ? i * 8 : full * 8;
    *R = 8;
    if (i < full) return;
    int rest = (int)(M % 8);
    for (int size = 4; size >= 1; size /= 2)
        if (rest & size) {
            if (i == full) {
                *R = size;
                return;
            }
            *r0 += size;
            i--;
        }
}

/* AVX-512 */
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void linear_rows(const float *x, const float *wt, const float *b,
                                                                        const float *res, int64_t ldr, int relu,
                                                                        float *y, int64_t M, int64_t K,
                                                                        int64_t N) {
    const int W = 32;
    int64_t blocks = M / 8 + __builtin_popcount((unsigned)(M % 8)), cols = (N + W - 1) / W;
#pragma omp parallel for schedule(static) if (M * N * K >= 2 * PARALLEL_MIN)
    for (int64_t t = 0; t < blocks * cols; t++) {
        int64_t r0, j0 = t / blocks * W;
        int R;
        row_block(M, t % blocks, &r0, &R);
        int nj = N - j0 < W ? (int)(N - j0) : W;
        const float *xr = x + r0 * K, *rr = res ? res + r0 * ldr : 0;
        float *yr = y + r0 * N;
        float part[8 * 32]; /* the last column block, when N is not a multiple of W: its rows in full */
        float *out = nj < W ? part - j0 : yr;
        int64_t ldo = nj < W ? W : N;
        switch (R) {
        case 8: tile_8_32(xr, K, wt, b, rr, ldr, relu, out, ldo, j0, nj); break;
        case 4: tile_4_32(xr, K, wt, b, rr, ldr, relu, out, ldo, j0, nj); break;
        case 2: tile_2_32(xr, K, wt, b, rr, ldr, relu, out, ldo, j0, nj); break;
        default: tile_1_32(xr, K, wt, b, rr, ldr, relu, out, ldo, j0, nj);
        }
        if (nj < W)
            for (int r = 0; r < R; r++) memcpy(yr + r * N + j0, part + r * W, sizeof(float) * nj);
    }
}

/* AVX2 (16 registers): tiles of 6 rows x 16 outputs (12 accumulators; a step of k loads two vectors of weights
 * and broadcasts six inputs, so that a column block's half, K x 64 bytes, stays in the L1 cache while every row tile
 * runs over it), and for the last M % 6 rows one tile as wide as 12 accumulators allow (1 row: 64 outputs, 2: 32,
 * 3: 32, 4: 16, 5: 16), so that a step's few rows still have enough independent chains to fill the FMA units. */
#define TILE2(R, V)                                                                                                    \
    static inline __attribute__((always_inline, target("avx2,fma"))) void tile2_##R##_##V(                            \
        const float *restrict x, int64_t K, const float *restrict wt, const float *restrict b,                        \
        const float *restrict res, int64_t ldr, int relu, float *restrict y, int64_t ldy, int64_t j0, int nj) {        \
        __m256 acc[R][V];                                                                                              \
        const float *w[V]; /* vector v: outputs j0 + 8v.., in column block (j0 + 8v) / 32 */                          \
        for (int v = 0; v < V; v++) {                                                                                  \
            int64_t j = j0 + 8 * v;                                                                                    \
            w[v] = wt + j / 32 * 32 * K + j % 32;                                                                      \
            __m256 bv = b ? _mm256_loadu_ps(b + j) : _mm256_setzero_ps();                                              \
            for (int r = 0; r < R; r++) acc[r][v] = bv;                                                                \
        }                                                                                                              \
        for (int64_t k = 0; k < K; k++) {                                                                              \
            __m256 wv[V];                                                                                              \
            _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) wv[v] = _mm256_loadu_ps(w[v] + 32 * k);                \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                      \
                const __m256 xv = _mm256_broadcast_ss(x + r * K + k);                                                  \
                _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) acc[r][v] = _mm256_fmadd_ps(xv, wv[v], acc[r][v]); \
            }                                                                                                          \
        }                                                                                                              \
        float out[R][8 * V];                                                                                           \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                            \
            _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) _mm256_storeu_ps(out[r] + 8 * v, acc[r][v]);          \
        for (int r = 0; r < R; r++) {                                                                                  \
            if (res)                                                                                                   \
                for (int j = 0; j < nj; j++) out[r][j] = out[r][j] + res[r * ldr + j0 + j];                            \
            if (relu)                                                                                                  \
                for (int j = 0; j < nj; j++) out[r][j] = out[r][j] > 0.0f ? out[r][j] : 0.0f;                          \
            memcpy(y + r * ldy + j0, out[r], sizeof(float) * nj);                                                      \
        }                                                                                                              \
    }
TILE2(6, 2)
TILE2(5, 2)
TILE2(4, 2)
TILE2(3, 4)
TILE2(2, 4)
TILE2(1, 8)

__attribute__((target("avx2,fma"))) void linear_rows_avx2(const float *x, const float *wt, const float *b,
                                                        const float *res, int64_t ldr, int relu, float *y, int64_t M,
                                                        int64_t K, int64_t N) {
    static const int width[6] = {0, 64, 32, 32, 16, 16}; /* the last tile's outputs, by its rows */
    const int64_t Np = (N + 63) / 64 * 64, full = M / 6, u6 = Np / 16;
    const int rest = (int)(M % 6), wr = width[rest];
    const int64_t items = full * u6 + (rest ? Np / wr : 0);
#pragma omp parallel for schedule(static) if (M * N * K >= 2 * PARALLEL_MIN)
    for (int64_t t = 0; t < items; t++) {
        int64_t r0, j0;
        int R;
        if (t < full * u6) { /* a 6-row tile: column units outer */
            j0 = t / full * 16;
            r0 = t % full * 6;
            R = 6;
        } else {
            j0 = (t - full * u6) * wr;
            r0 = full * 6;
            R = rest;
        }
        if (j0 >= N) continue;
        int nj = N - j0 < 64 ? (int)(N - j0) : 64;
        const float *xr = x + r0 * K, *rr = res ? res + r0 * ldr : 0;
        float *yr = y + r0 * N;
        switch (R) {
        case 6: tile2_6_2(xr, K, wt, b, rr, ldr, relu, yr, N, j0, nj < 16 ? nj : 16); break;
        case 5: tile2_5_2(xr, K, wt, b, rr, ldr, relu, yr, N, j0, nj < 16 ? nj : 16); break;
        case 4: tile2_4_2(xr, K, wt, b, rr, ldr, relu, yr, N, j0, nj < 16 ? nj : 16); break;
        case 3: tile2_3_4(xr, K, wt, b, rr, ldr, relu, yr, N, j0, nj < 32 ? nj : 32); break;
        case 2: tile2_2_4(xr, K, wt, b, rr, ldr, relu, yr, N, j0, nj < 32 ? nj : 32); break;
        default: tile2_1_8(xr, K, wt, b, rr, ldr, relu, yr, N, j0, nj);
        }
    }
}

/* A decoding step's attention (tfcli.generate.step), every row and head in one call. Row i of n has r queries a
 * head (its beams, or its new positions); the H = H_kv * g query heads share H_kv key/value heads, g each. For row
 * i, key/value head h, query head a = h*g + c (c < g) and query j < r:
 *   y[i*r + j, a*dh : (a+1)*dh] = sum_s p_s v[i, h, s],   p = softmax_s(alpha * q[i, j, a] . k[i, h, s] + bias_s)
 * over the L slots s. q element d at q + i*qn + j*qr + a*qh + d; keys at k + (i*H_kv + h)*kb + s*ks + d*kd,
 * transposed when ks == 1 (the source's), else by slot with kd == 1 (the step's own); values at v + (i*H_kv + h)*vb
 * + s*vs + d; bias_s at bias + (i*H_kv + h) / bdiv * bb + j*bj + s. A slot's dot product is one fixed order over d
 * for each layout (by slot: eight lanes of fmaf chains, then their sum in a fixed order; transposed: one chain a
 * slot), so the caller keeps each attention's keys in one layout; the softmax and the sum over slots run over s in
 * order, and a slot with bias -inf (padding, or a slot a beam does not see) gives p_s = 0 exactly and is skipped:
 * so a row's result depends on that row alone, not on its batch's width or neighbours. dh a multiple of 8; y is
 * (n*r) x (H*dh), contiguous. One version, for AVX2 and FMA (AVX-512 CPUs run it too): the same results on both. */
__attribute__((target("avx2,fma"))) void attend_rows(const float *q, int64_t qn, int64_t qr, int64_t qh, const float *k,
                                                   int64_t kb, int64_t ks, int64_t kd, const float *v, int64_t vb,
                                                   int64_t vs, const float *bias, int64_t bdiv, int64_t bb, int64_t bj,
                                                   int64_t n, int64_t H_kv, int64_t g, int64_t r, int64_t L,
                                                   int64_t dh, float alpha, float *y) {
    const int64_t H = H_kv * g;
#pragma omp parallel for schedule(static) if (n * H * r * L * dh >= 4 * PARALLEL_MIN)
    for (int64_t t = 0; t < n * H_kv * g * r; t++) {
        const int64_t j = t % r, c = t / r % g, h = t / (r * g) % H_kv, i = t / (r * g * H_kv), b = i * H_kv + h;
        const float *qv = q + i * qn + j * qr + (h * g + c) * qh, *kh = k + b * kb, *vh = v + b * vb;
        const float *bs = bias + b / bdiv * bb + j * bj;
        float p[L > 0 ? L : 1];
        if (ks != 1) {
            for (int64_t s = 0; s < L; s++) {
                const float *ksv = kh + s * ks;
                float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int64_t d0 = 0; d0 < dh; d0 += 8)
#pragma omp simd
                    for (int l = 0; l < 8; l++) lane[l] = __builtin_fmaf(qv[d0 + l], ksv[d0 + l], lane[l]);
                float dot = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
                p[s] = alpha * dot + bs[s];
            }
        } else {
            int64_t s0 = 0;
            for (; s0 + 8 <= L; s0 += 8) {
                float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int64_t d = 0; d < dh; d++)
#pragma omp simd
                    for (int l = 0; l < 8; l++) lane[l] = __builtin_fmaf(qv[d], kh[d * kd + (s0 + l) * ks], lane[l]);
                for (int l = 0; l < 8; l++) p[s0 + l] = alpha * lane[l] + bs[s0 + l];
            }
            for (int64_t s = s0; s < L; s++) {
                float dot = 0;
                for (int64_t d = 0; d < dh; d++) dot = __builtin_fmaf(qv[d], kh[d * kd + s * ks], dot);
                p[s] = alpha * dot + bs[s];
            }
        }
        float m = -INFINITY, sum = 0;
        for (int64_t s = 0; s < L; s++) m = p[s] > m ? p[s] : m;
        for (int64_t s = 0; s < L; s++) {
            p[s] = expf(p[s] - m);
            sum += p[s];
        }
        float *out = y + (i * r + j) * H * dh + (h * g + c) * dh;
        for (int64_t d = 0; d < dh; d++) out[d] = 0;
        for (int64_t s = 0; s < L; s++) {
            if (p[s] == 0) continue;
            const float w = p[s] / sum, *vsv = vh + s * vs;
#pragma omp simd
            for (int64_t d = 0; d < dh; d++) out[d] = __builtin_fmaf(w, vsv[d], out[d]);
        }
    }
}

/* which version of linear_rows this CPU runs: 2 AVX-512 (F, VL and FMA: linear_rows), 1 AVX2 and FMA
 * (linear_rows_avx2), 0 neither */
int linear_rows_supported(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") ? 2 : 1;
#else
    return 0;
#endif
}
