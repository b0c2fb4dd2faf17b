/* decode.c's attention alone, for one query row over a cache of `start` keys in every layer:
 * each layer's keys and values in buffers of their own, visited in turn as a decode step visits
 * them (so that at 4,096 keys they come from memory), or one layer again and again (from cache).
 *
 *   gcc -O3 -march=native -fopenmp -ffp-contract=off -I dyncomplete/models/native \
 *       docs/results/zen4-limits/attention.c -o /tmp/attention -lm
 *   OMP_NUM_THREADS=2 /tmp/attention LAYERS HEADS KV_HEADS START REPEATS
 *   (Qwen2.5-Coder-0.5B: 24 14 2; SmolLM2-135M: 30 9 3; head_dim 64) */
#include "decode.c"
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 6) return fprintf(stderr, "usage: %s LAYERS HEADS KV_HEADS START REPEATS\n", argv[0]), 2;
    int L = atoi(argv[1]), H = atoi(argv[2]), KV = atoi(argv[3]), d = 64, start = atoi(argv[4]), cap = start + 256;
    int reps = atoi(argv[5]);
    dims_t dm = {H * d, H, KV, d, 4 * H * d, 1e-6f, 0.125f};
    uint16_t **K = malloc(sizeof(void *) * L), **V = malloc(sizeof(void *) * L);
    for (int l = 0; l < L; l++) {
        K[l] = aligned_alloc(64, (size_t)KV * d * cap * 2), V[l] = aligned_alloc(64, (size_t)KV * d * cap * 2);
        for (size_t i = 0; i < (size_t)KV * d * cap; i++) {
            K[l][i] = f32_to_bf16((rand() % 1000) / 500.f - 1);
            V[l][i] = f32_to_bf16((rand() % 1000) / 500.f - 1);
        }
    }
    float *q = malloc(sizeof(float) * H * d), *out = malloc(sizeof(float) * H * d);
    for (int i = 0; i < H * d; i++) q[i] = (rand() % 1000) / 500.f - 1;
    for (int round = 0; round < 2; round++) {
        double t0 = now();
        for (int r = 0; r < reps; r++)
            for (int l = 0; l < L; l++) attention(&dm, q, 1, start, NULL, K[l], V[l], cap, out);
        double dt = (now() - t0) / reps, bytes = (double)L * KV * d * (start + 1) * 2 * 2;
        printf("%d layers, %d heads, %d kv heads, %d keys: %.3f ms a step, keys and values read at %.1f GB/s\n", L, H,
               KV, start, dt * 1e3, bytes / dt / 1e9);
    }
    return 0;
}
