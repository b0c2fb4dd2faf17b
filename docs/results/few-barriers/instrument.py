"""4ac4159's decode.c with every barrier of a layer call timed per thread (rdtsc), for timed.py:
  git show 4ac4159:dyncomplete/models/native/decode.c > /tmp/p/old.c
  python docs/results/few-barriers/instrument.py /tmp/p/old.c /tmp/p/timed.c
  gcc -O3 -march=native -fopenmp -ffp-contract=off -shared -fPIC /tmp/p/timed.c -o /tmp/p/lib_timed.so -lm
Each `omp for` gets `nowait` and a timed barrier after it (the same synchronisation)."""
import sys

src = open(sys.argv[1]).read()


def rep(old, new):
    global src
    assert src.count(old) >= 1, old[:80]
    src = src.replace(old, new, 1)


rep('#define GROUP 32', '''
#include <x86intrin.h>
static unsigned long long T_work[32][2], T_wait[32][2], T_last[2];
void timers_dump(double *out) { for (int s = 0; s < 32; s++) for (int t = 0; t < 2; t++) { out[(s*2+t)*2] = T_work[s][t]; out[(s*2+t)*2+1] = T_wait[s][t]; T_work[s][t] = T_wait[s][t] = 0; } }
#define TB(site) do { int _t = omp_get_thread_num(); unsigned long long _a = __rdtsc(); T_work[site][_t] += _a - T_last[_t]; _Pragma("omp barrier") unsigned long long _b = __rdtsc(); T_wait[site][_t] += _b - _a; T_last[_t] = _b; } while (0)
#define GROUP 32''')
rep('static void linear_team(const linear_t *lin, const float *x, int rows, float *scratch, float *out) {',
    'static void linear_team_s(const linear_t *lin, const float *x, int rows, float *scratch, float *out, int site) {')
rep('''#pragma omp for schedule(static)
    for (int i = 0; i < rows * groups; i++) quantize_group(x, i / groups, i % groups, lin->in, qi);''',
    '''#pragma omp for schedule(static) nowait
    for (int i = 0; i < rows * groups; i++) quantize_group(x, i / groups, i % groups, lin->in, qi);
    TB(site);''')
rep('''            for (int n = b0 * BLOCK; n < n1; n++) out[(size_t)r * lin->out + n] += bf16_to_f32(lin->bias[n]);
#pragma omp barrier
}''', '''            for (int n = b0 * BLOCK; n < n1; n++) out[(size_t)r * lin->out + n] += bf16_to_f32(lin->bias[n]);
    TB(site + 1);
}
#define linear_team(a, b, c, d, e) linear_team_s(a, b, c, d, e, 30)''')
rep('''#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
        for (long i = (long)r * Hd; i < (long)(r + 1) * Hd; i++) h[i] = bf16_to_f32(hidden[i]);
        rms_norm(h + (size_t)r * Hd, 1, Hd, ly->in_norm, dm->eps, x + (size_t)r * Hd);
    }
    linear_t product = skip ? feature_range(&ly->qkv, skip, width) : ly->qkv;
    linear_team(&product, x, rows, scratch, qkv);
#pragma omp for schedule(static)''', '''#pragma omp for schedule(static) nowait
    for (int r = 0; r < rows; r++) {
        for (long i = (long)r * Hd; i < (long)(r + 1) * Hd; i++) h[i] = bf16_to_f32(hidden[i]);
        rms_norm(h + (size_t)r * Hd, 1, Hd, ly->in_norm, dm->eps, x + (size_t)r * Hd);
    }
    TB(0);
    linear_t product = skip ? feature_range(&ly->qkv, skip, width) : ly->qkv;
    linear_team_s(&product, x, rows, scratch, qkv, 1);
#pragma omp for schedule(static) nowait''')
rep('''                seg[s].values[((size_t)k * cap + pos) * d + j] = f32_to_bf16(row[key0 + (KV + k) * d + j]);
            }
    }
}''', '''                seg[s].values[((size_t)k * cap + pos) * d + j] = f32_to_bf16(row[key0 + (KV + k) * d + j]);
            }
    }
    TB(3);
}''')
rep('''#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) memcpy(q + (size_t)r * H * d, qkv + (size_t)r * nqkv, sizeof(float) * H * d);''',
    '''#pragma omp for schedule(static) nowait
    for (int r = 0; r < rows; r++) memcpy(q + (size_t)r * H * d, qkv + (size_t)r * nqkv, sizeof(float) * H * d);
    TB(4);''')
rep('''    free(tail);
    free(scores);
}''', '''    free(tail);
    free(scores);
    TB(5);
}''')
rep('''#pragma omp for schedule(static)
    for (int task = 0; task < rows * KV * parts; task++) {''', '''#pragma omp for schedule(static) nowait
    for (int task = 0; task < rows * KV * parts; task++) {''')
rep('''    linear_team(&ly->o, att, rows, scratch, x);
    /* the row-wise steps between products, a row a thread */
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
        for (long i = (long)r * Hd; i < (long)(r + 1) * Hd; i++) h[i] += x[i];
        rms_norm(h + (size_t)r * Hd, 1, Hd, ly->post_norm, dm->eps, x + (size_t)r * Hd);
    }
    linear_team(&ly->gate_up, x, rows, scratch, gu);''', '''    linear_team_s(&ly->o, att, rows, scratch, x, 6);
    /* the row-wise steps between products, a row a thread */
#pragma omp for schedule(static) nowait
    for (int r = 0; r < rows; r++) {
        for (long i = (long)r * Hd; i < (long)(r + 1) * Hd; i++) h[i] += x[i];
        rms_norm(h + (size_t)r * Hd, 1, Hd, ly->post_norm, dm->eps, x + (size_t)r * Hd);
    }
    TB(8);
    linear_team_s(&ly->gate_up, x, rows, scratch, gu, 9);''')
rep('''#pragma omp barrier
    linear_team(&ly->down, act, rows, scratch, x);
#pragma omp for schedule(static)
    for (long i = 0; i < (long)rows * Hd; i++) out[i] = f32_to_bf16(h[i] + x[i]);
}''', '''    TB(11);
    linear_team_s(&ly->down, act, rows, scratch, x, 12);
#pragma omp for schedule(static) nowait
    for (long i = 0; i < (long)rows * Hd; i++) out[i] = f32_to_bf16(h[i] + x[i]);
    TB(14);
}''')
rep('''                    const int *capacity, const uint16_t *cos, const uint16_t *sin, float *ws) {
#pragma omp parallel
    for''', '''                    const int *capacity, const uint16_t *cos, const uint16_t *sin, float *ws) {
#pragma omp parallel
    { T_last[omp_get_thread_num()] = __rdtsc();
    for''')
rep('''        layer_team(dm, layers[i], i == 0 ? hidden : out, out, &seg, 1, cos, sin, ws);
    }
}''', '''        layer_team(dm, layers[i], i == 0 ? hidden : out, out, &seg, 1, cos, sin, ws);
    }
    TB(15); }
}''')
open(sys.argv[2], "w").write(src)
