/* decode.c's attention on many shapes (heads per kv head 1-16, head_dim 32-128, 0-4,095 cached
 * keys, chains and trees of 1 and 3 rows), written to stdout as raw floats: build it against two
 * versions of decode.c and compare the outputs byte for byte, in each build and thread count.
 *
 *   gcc -O3 -march=native -fopenmp -ffp-contract=off -DSRC='"path/to/decode.c"' compare.c -o a -lm
 *   (-march=x86-64 and x86-64-v3 for the portable and AVX2 builds)
 *   OMP_NUM_THREADS=2 ./a > a.bin; ... cmp a.bin b.bin */
#include SRC
#include <stdio.h>
int main(void) {
    int shapes[][3] = {{14, 2, 64}, {9, 3, 64}, {12, 2, 128}, {16, 1, 64}, {8, 8, 64}, {6, 2, 32}};
    int starts[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 47, 100, 511, 1000, 4095};
    srand(1);
    for (int si = 0; si < 6; si++) {
        int H = shapes[si][0], KV = shapes[si][1], d = shapes[si][2];
        dims_t dm = {H * d, H, KV, d, 64, 1e-6f, 1.f / sqrtf(d)};
        for (int ti = 0; ti < 14; ti++)
            for (int rows = 1; rows <= 3; rows += 2)
                for (int tree = 0; tree < 2; tree++) {
                    int start = starts[ti], cap = start + rows + 37;
                    uint16_t *K = malloc((size_t)KV * d * cap * 2), *V = malloc((size_t)KV * d * cap * 2);
                    for (size_t i = 0; i < (size_t)KV * d * cap; i++) {
                        K[i] = f32_to_bf16((rand() % 2001) / 400.f - 2.5f);
                        V[i] = f32_to_bf16((rand() % 2001) / 1000.f - 1);
                    }
                    float *q = malloc(sizeof(float) * rows * H * d), *out = malloc(sizeof(float) * rows * H * d);
                    for (int i = 0; i < rows * H * d; i++) q[i] = (rand() % 2001) / 1000.f - 1;
                    int parent[3] = {-1, 0, 0}; /* rows 1 and 2 both children of row 0 */
                    attention(&dm, q, rows, start, tree ? parent : NULL, K, V, cap, out);
                    fwrite(out, sizeof(float), (size_t)rows * H * d, stdout);
                    free(K), free(V), free(q), free(out);
                }
    }
    return 0;
}
