/* The best copy this machine does into shared memory, for bench/large_objects.py.
 *
 *     copy_limit SIZE REPS [COUNT]
 *
 * Copies SIZE bytes from a private buffer into COUNT (default 1) consecutive
 * places of a warm (populated, written) shared mapping, REPS times per method,
 * and prints, per method, the best GiB/s over all COUNT copies: glibc memcpy,
 * rep movsb, SSE2 and AVX2 non-temporal (streaming) stores. COUNT > 1 is what
 * a batch of COUNT objects of SIZE bytes does: ten destinations of 100 MB
 * are not one destination written ten times (TLB and page walks). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void copy_memcpy(char *d, const char *s, size_t n) { memcpy(d, s, n); }

static void copy_movsb(char *d, const char *s, size_t n) {
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

/* Destinations are page-aligned; SIZE is a multiple of 128 or the tail is memcpy'd. */
static void copy_nt_sse2(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
    memcpy(d + i, s + i, n - i);
}

__attribute__((target("avx2"))) static void copy_nt_avx2(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    _mm_sfence();
    memcpy(d + i, s + i, n - i);
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: copy_limit SIZE REPS [COUNT]\n");
        return 2;
    }
    size_t n = strtoull(argv[1], NULL, 10);
    int reps = atoi(argv[2]);
    size_t count = argc == 4 ? strtoull(argv[3], NULL, 10) : 1;
    char *s = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    char *d = mmap(NULL, n * count, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (!s || d == MAP_FAILED) {
        perror("allocate");
        return 1;
    }
    memset(s, 1, n);
    memset(d, 0, n * count);
    struct {
        const char *name;
        void (*copy)(char *, const char *, size_t);
        int usable;
    } methods[] = {
        {"memcpy", copy_memcpy, 1},
        {"rep_movsb", copy_movsb, 1},
        {"nt_sse2", copy_nt_sse2, 1},
        {"nt_avx2", copy_nt_avx2, __builtin_cpu_supports("avx2")},
    };
    for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++) {
        if (!methods[k].usable) continue;
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = now();
            for (size_t c = 0; c < count; c++) methods[k].copy(d + c * n, s, n);
            t = now() - t;
            if (t < best) best = t;
        }
        printf("%s %.3f\n", methods[k].name, n * count / best / (1024.0 * 1024 * 1024));
    }
    return 0;
}
