/* Does the int4 weights' layout limit a one-token step? decode.c's VNNI one-row tile (4 blocks
 * of 16 features, a group of 32 inputs at a time) over Qwen2.5-Coder-0.5B's shapes (24 layers
 * and the head, 309 MB a step, far more than the caches), its weights stored
 *   apart:  levels (blocks, groups, 256 B), scales and zeros two arrays (blocks, groups, 16) bf16,
 *           as decode.c read them before 2026-12-07: 12 streams a tile;
 *   record: each group of a block one 320-byte record, its levels, then a 32-bit word per
 *           feature (scale | zero << 16): 4 streams a tile; and the high nibbles multiplied in
 *           place (16 times their level), their sum shifted once a group: decode.c since then;
 *   read:   the records' bytes summed in the tile's order, no products (what memory gives).
 * Every round runs the three in turn (32 steps each); the ratios pair a round's runs.
 * gcc -O2 -march=native -fopenmp -ffp-contract=off streams.c -o streams && ./streams ROUNDS */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GROUP 32
#define BLOCK 16
#define NB 4
enum { APART, RECORD, READ, LAYOUTS };
static const char *NAMES[LAYOUTS] = {"apart", "record", "read only"};

typedef struct {
    int out, in, blocks, groups;
    uint8_t *levels;          /* apart */
    uint16_t *scales, *zeros; /* apart */
    uint8_t *records;         /* record */
} mat_t;

static void fill(void *p, size_t n, unsigned seed) {
    uint32_t *u = p;
    for (size_t i = 0; i < n / 4; i++) { seed = seed * 1664525u + 1013904223u; u[i] = seed & 0x3f803f80u; }
}

static mat_t make(int out, int in) {
    mat_t m = {out, in, (out + BLOCK - 1) / BLOCK, in / GROUP};
    size_t bg = (size_t)m.blocks * m.groups;
    m.levels = aligned_alloc(64, bg * 256), fill(m.levels, bg * 256, 1);
    m.scales = aligned_alloc(64, bg * 32), fill(m.scales, bg * 32, 2);
    m.zeros = aligned_alloc(64, bg * 32), fill(m.zeros, bg * 32, 3);
    m.records = aligned_alloc(64, bg * 320);
    for (size_t i = 0; i < bg; i++) {
        memcpy(m.records + 320 * i, m.levels + 256 * i, 256);
        uint16_t *words = (uint16_t *)(m.records + 320 * i + 256);
        for (int f = 0; f < BLOCK; f++) words[2 * f] = m.scales[16 * i + f], words[2 * f + 1] = m.zeros[16 * i + f];
    }
    return m;
}

static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __attribute__((always_inline)) void tile(const mat_t *m, int b0, const int8_t *x, const float *dx,
                                                       const float *sums, float *out, int record) {
    __m512 acc[NB];
    for (int c = 0; c < NB; c++) acc[c] = _mm512_setzero_ps();
    const __m512i nibble = _mm512_set1_epi8(15), high = _mm512_set1_epi8((char)0xf0);
    for (int g = 0; g < m->groups; g++) {
        __m512i lo_sum[NB], hi_sum[NB];
        for (int c = 0; c < NB; c++) lo_sum[c] = hi_sum[c] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++)
            for (int c = 0; c < NB; c++) {
                size_t i = (size_t)(b0 + c) * m->groups + g;
                __m512i v = _mm512_loadu_si512((record ? m->records + 320 * i : m->levels + 256 * i) + 64 * j);
                __m512i lo = _mm512_and_si512(v, nibble);
                __m512i hi = record ? _mm512_and_si512(v, high) : _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
                int32_t a, b;
                memcpy(&a, x + g * GROUP + 4 * j, 4), memcpy(&b, x + g * GROUP + 16 + 4 * j, 4);
                lo_sum[c] = _mm512_dpbusd_epi32(lo_sum[c], lo, _mm512_set1_epi32(a));
                hi_sum[c] = _mm512_dpbusd_epi32(hi_sum[c], hi, _mm512_set1_epi32(b));
            }
        for (int c = 0; c < NB; c++) {
            size_t i = (size_t)(b0 + c) * m->groups + g;
            __m512 s, z;
            if (record) {
                __m512i w = _mm512_loadu_si512(m->records + 320 * i + 256);
                s = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                z = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
                hi_sum[c] = _mm512_srai_epi32(hi_sum[c], 4);
            } else {
                s = load_bf16(m->scales + 16 * i), z = load_bf16(m->zeros + 16 * i);
            }
            __m512 zero = _mm512_fnmadd_ps(_mm512_set1_ps(8.f), s, z);
            __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(lo_sum[c], hi_sum[c]));
            acc[c] = _mm512_fmadd_ps(isum, _mm512_mul_ps(s, _mm512_set1_ps(dx[g])), acc[c]);
            acc[c] = _mm512_fmadd_ps(zero, _mm512_set1_ps(sums[g]), acc[c]);
        }
    }
    for (int c = 0; c < NB; c++) _mm512_storeu_ps(out + (size_t)(b0 + c) * BLOCK, acc[c]);
}

static inline __m512i read_tile(const mat_t *m, int b0, __m512i total) {
    for (int g = 0; g < m->groups; g++)
        for (int c = 0; c < NB; c++) {
            const uint8_t *r = m->records + 320 * ((size_t)(b0 + c) * m->groups + g);
            for (int k = 0; k < 5; k++) total = _mm512_add_epi32(total, _mm512_loadu_si512(r + 64 * k));
        }
    return total;
}

static volatile int sink;

static void product(const mat_t *m, const int8_t *x, const float *dx, const float *sums, float *out, int layout) {
#pragma omp parallel
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int b0 = m->blocks * t / n, b1 = m->blocks * (t + 1) / n;
        __m512i total = _mm512_setzero_si512();
        for (int b = b0; b + NB <= b1; b += NB) {
            if (layout == READ) total = read_tile(m, b, total);
            else if (layout == APART) tile(m, b, x, dx, sums, out, 0);
            else tile(m, b, x, dx, sums, out, 1);
        }
        if (layout == READ) sink += _mm512_reduce_add_epi32(total);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b) { double d = *(const double *)a - *(const double *)b; return (d > 0) - (d < 0); }

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15, steps = 32, layers = 24;
    int shapes[4][2] = {{1152, 896}, {896, 896}, {9728, 896}, {896, 4864}}; /* qkv, o, gate_up, down */
    int count = 4 * layers + 1;
    mat_t *mats = malloc(sizeof(mat_t) * count);
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < 4; k++) mats[4 * l + k] = make(shapes[k][0], shapes[k][1]);
    mats[4 * layers] = make(151936, 896);
    size_t bytes = 0;
    for (int i = 0; i < count; i++) bytes += (size_t)mats[i].blocks / NB * NB * mats[i].groups * 320;
    int8_t *x = aligned_alloc(64, 4864);
    fill(x, 4864, 7);
    float *dx = malloc(4 * 152), *sums = malloc(4 * 152), *out = aligned_alloc(64, 4 * 151936 + 64);
    for (int g = 0; g < 152; g++) dx[g] = 0.01f, sums[g] = 0.1f;
    double *ms = malloc(sizeof(double) * LAYOUTS * rounds), ratio[LAYOUTS][256];
    printf("%.0f MB a step, %d threads, %d rounds of %d steps\n", bytes / 1e6, omp_get_max_threads(), rounds, steps);
    for (int r = 0; r < rounds; r++) {
        for (int layout = 0; layout < LAYOUTS; layout++) {
            double t0 = now();
            for (int s = 0; s < steps; s++)
                for (int i = 0; i < count; i++) product(&mats[i], x, dx, sums, out, layout);
            ms[layout * rounds + r] = (now() - t0) * 1e3 / steps;
        }
        for (int layout = 0; layout < LAYOUTS; layout++) ratio[layout][r] = ms[layout * rounds + r] / ms[r];
    }
    for (int layout = 0; layout < LAYOUTS; layout++) {
        double *t = ms + layout * rounds;
        qsort(t, rounds, sizeof(double), cmp);
        qsort(ratio[layout], rounds, sizeof(double), cmp);
        printf("%-9s median %.2f ms a step (%.2f-%.2f), %.1f GB/s; against apart in its round: median %.3f (%.3f-%.3f)\n",
               NAMES[layout], t[rounds / 2], t[0], t[rounds - 1], bytes / t[rounds / 2] / 1e6, ratio[layout][rounds / 2],
               ratio[layout][0], ratio[layout][rounds - 1]);
    }
    return 0;
}
