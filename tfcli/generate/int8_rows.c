/* Row-wise int8 helpers for tfcli.generate.int8: built once per machine by that module with the system's C compiler
 * (plain C, no torch headers) and called through ctypes on tensors' memory. Each function does in one pass over a row
 * what torch does in several; the results are bit for bit those of the torch fallback in int8.py (the same IEEE
 * operations in the same order; compiled with -ffp-contract=off, never -ffast-math).
 * The loops are compiled for AVX-512, AVX2 and plain x86-64, the best one picked at load (GCC target_clones). */
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
