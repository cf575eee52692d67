/* Row-wise kernels of CPU decoding: built once per machine by tfcli.generate.native with the system's C compiler
 * (plain C, no torch headers) and called through ctypes on tensors' memory. The int8 helpers each do in one pass over
 * a row what torch does in several; their results are bit for bit those of the torch fallback in int8.py (the same
 * IEEE operations in the same order; compiled with -ffp-contract=off, never -ffast-math), and their loops are compiled
 * for AVX-512, AVX2 and plain x86-64, the best one picked at load (GCC target_clones). The fp32 linear layers at the
 * end are for AVX-512 only; the caller asks linear_rows_supported first. */
#include <math.h>
#include <stdint.h>
#include <string.h>

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
 * input k's weights for outputs 32c..32c+31, zero past N), b padded likewise (may be null). Each output is one chain
 * of fused multiply-adds over k = 0..K-1 starting from its bias, whatever tile it falls in, so a row's result is the
 * same for any M. Tiles of 8 rows x 32 outputs are held in 16 of AVX-512's 32 registers, then for the last M % 8 rows
 * one tile of each smaller power of two; the tiles are split over the OpenMP threads, column blocks outer so that a
 * block of W is reused by the row blocks after it. fmaf is explicit: the file is compiled with -ffp-contract=off.
 * AVX-512 only: with AVX2's 16 registers the tiles that fit lost to oneDNN on many rows. */
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

/* whether this CPU runs linear_rows (AVX-512 F and VL, FMA) */
int linear_rows_supported(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}
