/* Native baselines for the RustConv benchmark, built at run time by
 * bench/native.py with `cc -O3 -march=native -fopenmp -shared -fPIC`.
 *
 * - bench_linear_scan: the plain C loop a user would write for
 *   y[c, t] = a[c, t] * y[c, t-1] + u[c, t] (y[c, -1] = x0[c]), OpenMP over
 *   channels, batch 1, contiguous [C, N] rows.
 * - bench_linear_scan_f64: the same recurrence in double precision, the
 *   accuracy reference where PyTorch eager did not finish.
 * - bench_copy_seconds: a multi-threaded memcpy over buffers much larger than
 *   the last-level cache; the caller turns the best time into a copy
 *   bandwidth counting read + write.
 *
 * The thread count is an argument and goes into each `num_threads` clause, so
 * it does not depend on OMP_NUM_THREADS or on which OpenMP runtime was loaded
 * first into the process.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void bench_linear_scan(const float *x0, const float *a, const float *u, float *y,
                       int64_t channels, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < channels; ++c) {
        const float *ac = a + c * n;
        const float *uc = u + c * n;
        float *yc = y + c * n;
        float s = x0[c];
        for (int64_t t = 0; t < n; ++t) {
            s = ac[t] * s + uc[t];
            yc[t] = s;
        }
    }
}

void bench_linear_scan_f64(const float *x0, const float *a, const float *u, double *y,
                           int64_t channels, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < channels; ++c) {
        double s = x0[c];
        for (int64_t t = 0; t < n; ++t) {
            s = (double)a[c * n + t] * s + (double)u[c * n + t];
            y[c * n + t] = s;
        }
    }
}

/* Each thread copies its own contiguous slice (the same split for the first
 * touch and for every repeat, so pages sit near the thread that copies them).
 * Returns the best wall time of `repeats` copies in seconds, or -1 if the
 * buffers cannot be allocated. */
double bench_copy_seconds(int64_t bytes, int threads, int repeats) {
    const int64_t align = 4096;
    int64_t size = (bytes + align - 1) / align * align;
    char *src = aligned_alloc(align, (size_t)size);
    char *dst = aligned_alloc(align, (size_t)size);
    if (!src || !dst) {
        free(src);
        free(dst);
        return -1.0;
    }
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t lo = size * id / nt, hi = size * (id + 1) / nt;
        memset(src + lo, 1, (size_t)(hi - lo));
        memset(dst + lo, 0, (size_t)(hi - lo));
    }
    double best = -1.0;
    for (int r = 0; r < repeats; ++r) {
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            int64_t lo = size * id / nt, hi = size * (id + 1) / nt;
            memcpy(dst + lo, src + lo, (size_t)(hi - lo));
        }
        double dt = omp_get_wtime() - t0;
        if (best < 0 || dt < best) best = dt;
    }
    /* Keep the copies observable so they are not optimised away. */
    volatile char sink = dst[size / 2];
    (void)sink;
    free(src);
    free(dst);
    return best;
}
