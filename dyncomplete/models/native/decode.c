/* Decode-time kernels of the fast engine: int4 and int8 weight-only products and one whole llama/qwen2
 * decoder layer for short queries (decode steps and verification passes), in one call.
 *
 * Why: a PyTorch decode step of SmolLM2 issues about 500 small operator calls a token, and their
 * overhead was as large as the arithmetic. Here a layer is one call.
 *
 * Determinism: every row (position) is computed by the same sequence of floating-point operations
 * whatever the number of rows computed with it, so a verification pass gives each position
 * exactly what a one-token step gives (lossless speculative decoding). Row tiles never change a
 * row's own operations; compiled with -ffp-contract=off so that the compiler fuses nothing on
 * its own; reductions run in a fixed order.
 *
 * Weights: groups of GROUP input features with a bf16 scale and zero each, w = (q - 8) * scale +
 * zero with levels q in 0..15 (int4), or w = (q - 128) * scale + zero with q in 0..255 (int8), as
 * the model's dequantized weights (weights.py, quantize_levels) define it; laid out in blocks of 16
 * output features (see block_levels). Inputs are quantized to int8
 * per group before they multiply (see quantize_group). The products have three versions, for
 * AVX512-VNNI, for AVX2 (AMD Zen 2 and 3, Intel client cores; without it they ran about 20 times
 * slower) and portable C, which give the same bits (tests/test_native.py).
 * Activations: float32 inside a layer; hidden states, keys and values in bfloat16 (the model's
 * dtype and cache layout: keys (kv_heads, capacity / KEY_BLOCK, head_dim, KEY_BLOCK), values
 * (kv_heads, capacity, head_dim)).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VECTOR_512 1 /* attention, exp and SwiGLU in 512-bit vectors */
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define VECTOR_256 1 /* CPUs without AVX-512 (AMD Zen 2 and 3, Intel client cores): the same in 256-bit vectors */
#include <immintrin.h>
#endif

#define GROUP 32
/* Keys are stored in blocks of KEY_BLOCK positions, each block feature by feature (models/kv_cache.py):
 * the scores of a block's keys read one contiguous stretch, where keys stored (head_dim, capacity)
 * spread it over head_dim rows of the cache, which the memory fetched more slowly. */
#define KEY_BLOCK 32

/* Where feature i of the key at position p lies in one kv head's keys (d features a key). */
static inline size_t key_at(int i, int p, int d) {
    return (size_t)(p / KEY_BLOCK) * d * KEY_BLOCK + (size_t)i * KEY_BLOCK + p % KEY_BLOCK;
}
#define PRAGMA_UNROLL _Pragma("GCC unroll 8") /* tiles' loops: accumulators stay in registers */

typedef struct {
    const uint8_t *q;     /* (blocks, groups, RECORD_BYTES) levels, scales and zeros (see block_levels) */
    const uint16_t *bias; /* (out,) bf16 or NULL */
    int out, in;
    int bits; /* 4: two levels a byte; 8: one */
} linear_t;

typedef struct {
    const uint16_t *in_norm, *post_norm; /* (hidden,) bf16 */
    linear_t qkv, o, gate_up, down;
} layer_t;

typedef struct {
    int hidden, heads, kv_heads, head_dim, intermediate;
    float eps, scale;
} dims_t;

static inline float bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as PyTorch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#ifdef VECTOR_512
/* 16 bf16 values (those of mask m, zeros elsewhere) as floats. */
static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
/* 8 bf16 values as floats. */
static inline __m256 load_bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* The horizontal sum and max of 8 floats, in one fixed order. */
static inline float sum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

static inline float max8(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}
#endif

/* -- int4 products ------------------------------------------------------------------------- */

/* Inputs are quantized as llama.cpp quantizes them for its 4-bit products (Q8): per group of
 * GROUP features, int8 values and one float scale dx = max |x| / 127, with sum = dx * (the sum of
 * the group's int8 values). A product is then, per output feature and group,
 * w x = scale * dx * isum + (zero - 8 * scale) * sum, isum = sum(q * xq) an exact int32. */
#define BLOCK 16 /* output features a vector holds (float32 lanes) */
/* Floats of scratch per row of input: int8 values, dx and sum per group. */
#define INPUT_SCRATCH(in) ((in) / 4 + 2 * ((in) / GROUP))

typedef struct {
    int8_t *q;   /* (rows, in) */
    float *dx;   /* (rows, groups) */
    float *sums; /* (rows, groups) */
} qinput_t;

static qinput_t input_layout(int rows, int in, float *scratch) {
    int groups = in / GROUP;
    qinput_t qi = {(int8_t *)scratch, scratch + (size_t)rows * in / 4, scratch + (size_t)rows * (in / 4 + groups)};
    return qi;
}

/* Group g of row r of x into qi. The vector version runs the scalar one's operations: max |x|
 * (exact in any order), x * (127 / max) rounded to nearest even, an exact integer sum. */
static inline void quantize_group(const float *x, int r, int g, int in, qinput_t qi) {
    const float *p = x + (size_t)r * in + g * GROUP;
    int8_t *dst = qi.q + (size_t)r * in + g * GROUP;
#ifdef VECTOR_512
    __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    __m512i va = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv))); /* MXCSR: nearest even */
    __m512i vb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(va));
    _mm_storeu_si128((__m128i *)(dst + 16), _mm512_cvtepi32_epi8(vb));
    int total = _mm512_reduce_add_epi32(_mm512_add_epi32(va, vb));
#elif defined(VECTOR_256)
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(p + 8 * k);
    float amax = max8(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                    _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]))));
    float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    __m256i iv[4];
    for (int k = 0; k < 4; k++) iv[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(inv))); /* nearest even */
    /* to bytes: the packs interleave 128-bit lanes, the permutation puts the 32 values back in order */
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
    int total = _mm_cvtsi128_si32(_mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1)));
#else
    float amax = 0.f;
    for (int j = 0; j < GROUP; j++) amax = fmaxf(amax, fabsf(p[j]));
    float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    int total = 0;
    for (int j = 0; j < GROUP; j++) {
        int v = (int)nearbyintf(p[j] * inv);
        dst[j] = (int8_t)v;
        total += v;
    }
#endif
    int groups = in / GROUP;
    qi.dx[(size_t)r * groups + g] = dx;
    qi.sums[(size_t)r * groups + g] = dx * (float)total;
}

/* Weights (see pack_levels in __init__.py): blocks of BLOCK output features (the last padded
 * with zero scales), each group of a block one record: its levels, then a 32-bit word per feature,
 * the scale's bf16 in the low half and the zero's in the high half (so each is one shift or mask
 * from a float). One record is one stream from memory: a one-row tile over levels, scales and
 * zeros in three arrays read 12 streams at once, and was slower on AMD Zen 4
 * (docs/results/weight-streams). int4: each group's levels 256 bytes, four steps of 64 bytes,
 * step j holding for each feature 4 bytes, byte i = level 4j + i (low nibble) and level
 * 16 + 4j + i (high nibble). int8: each group 512 bytes, eight
 * steps of 64 bytes, step j holding for each feature levels 4j..4j + 3: the same order, with
 * the high nibbles' levels 256 bytes further on. So a vector of levels holds 4 inputs of 16
 * features, and a u8 x s8 dot product (VNNI) against 4 broadcast input values gives each
 * feature's lane its own exact partial sum: no lanes to add across, and the float steps of a
 * (feature, row) pair, group after group, are the same in a tile of any size and in the portable
 * loops below. Both formats run the same float steps on an exact integer sum; only the zero
 * point of the levels, ZERO_LEVEL, differs. */
#define GROUP_BYTES(BITS) (GROUP * BLOCK * (BITS) / 8)
#define RECORD_BYTES(BITS) (GROUP_BYTES(BITS) + 4 * BLOCK)
#define ZERO_LEVEL(BITS) ((BITS) == 4 ? 8.f : 128.f)
#define ZERO_HALF 0xffff0000u /* a word's zero, as the bits of a float */
static inline const uint8_t *block_levels(const linear_t *lin, int b, int g, int bits) {
    return lin->q + ((size_t)b * (lin->in / GROUP) + g) * RECORD_BYTES(bits);
}

static inline const uint32_t *block_words(const linear_t *lin, int b, int g, int bits) {
    return (const uint32_t *)(block_levels(lin, b, g, bits) + GROUP_BYTES(bits));
}

#if defined(VECTOR_512) && defined(__AVX512VNNI__)
/* NB blocks of features x NR rows from block b0 and row r0, levels of BITS bits. */
static inline __attribute__((always_inline)) void tile(const linear_t *lin, int b0, int NB, qinput_t qi, int r0,
                                                       int NR, float *out, int BITS) {
    int in = lin->in, groups = in / GROUP;
    __m512 acc[4][8];
    PRAGMA_UNROLL
    for (int c = 0; c < NB; c++)
        PRAGMA_UNROLL
        for (int r = 0; r < NR; r++) acc[c][r] = _mm512_setzero_ps();
    /* one or two rows: int4's high nibbles multiply in place, as 16 times their level (exact in
     * int32), and each row's sum is divided by 16 once a group, not the levels shifted each step */
    const int in_place = BITS == 4 && NR <= 2;
    const __m512i nibble = _mm512_set1_epi8(15), high = _mm512_set1_epi8((char)0xf0);
    for (int g = 0; g < groups; g++) {
        /* The records ahead, so that memory streams them while the rows compute. Four rows or
         * more: 16 groups ahead into L2 and 2 ahead into L1. Without prefetching the two took
         * turns (8 rows cost 1.9 one-row passes on AMD Zen 4, 1.6 with 8 groups ahead into L1);
         * the far L2 prefetch, likely more misses in flight than L1 holds, took a further 7-9%
         * off a 4- or 8-row Qwen pass (docs/results/two-level-prefetch). Fewer rows: 4 groups
         * ahead into L2 only, which kept more of the weights in flight (docs/results/l2-prefetch);
         * into L1 it slowed them. Past a block's last group, the next tile's blocks (NB on), which
         * such a tile reads next. */
        if (NR >= 4)
            PRAGMA_UNROLL
            for (int c = 0; c < NB; c++)
                for (int k = 0; k < RECORD_BYTES(BITS) / 64; k++) {
                    _mm_prefetch((const char *)block_levels(lin, b0 + c, g + 2, BITS) + 64 * k, _MM_HINT_T0);
                    _mm_prefetch((const char *)block_levels(lin, b0 + c, g + 16, BITS) + 64 * k, _MM_HINT_T2);
                }
        else
            PRAGMA_UNROLL
            for (int c = 0; c < NB; c++) {
                const uint8_t *ahead = g + 4 < groups ? block_levels(lin, b0 + c, g + 4, BITS)
                                                      : block_levels(lin, b0 + c + NB, g + 4 - groups, BITS);
                for (int k = 0; k < RECORD_BYTES(BITS) / 64; k++)
                    _mm_prefetch((const char *)ahead + 64 * k, _MM_HINT_T2);
            }
        __m512i lo_sum[4][8], hi_sum[4][8]; /* exact: the order of integer additions is free */
        PRAGMA_UNROLL
        for (int c = 0; c < NB; c++)
            PRAGMA_UNROLL
            for (int r = 0; r < NR; r++) lo_sum[c][r] = hi_sum[c][r] = _mm512_setzero_si512();
        PRAGMA_UNROLL
        for (int j = 0; j < 4; j++)
            PRAGMA_UNROLL
            for (int c = 0; c < NB; c++) {
                const uint8_t *at = block_levels(lin, b0 + c, g, BITS) + 64 * j;
                __m512i lo, hi;
                if (BITS == 4) {
                    __m512i v = _mm512_loadu_si512(at);
                    lo = _mm512_and_si512(v, nibble);
                    hi = in_place ? _mm512_and_si512(v, high) : _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
                } else {
                    lo = _mm512_loadu_si512(at), hi = _mm512_loadu_si512(at + 256);
                }
                PRAGMA_UNROLL
                for (int r = 0; r < NR; r++) {
                    const int8_t *px = qi.q + (size_t)(r0 + r) * in + g * GROUP + 4 * j;
                    int32_t a, b;
                    memcpy(&a, px, 4), memcpy(&b, px + 16, 4);
                    lo_sum[c][r] = _mm512_dpbusd_epi32(lo_sum[c][r], lo, _mm512_set1_epi32(a));
                    hi_sum[c][r] = _mm512_dpbusd_epi32(hi_sum[c][r], hi, _mm512_set1_epi32(b));
                }
            }
        PRAGMA_UNROLL
        for (int c = 0; c < NB; c++) {
            __m512i words = _mm512_loadu_si512(block_words(lin, b0 + c, g, BITS));
            __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
            __m512 zero = _mm512_fnmadd_ps(_mm512_set1_ps(ZERO_LEVEL(BITS)), s,
                                           _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32(ZERO_HALF))));
            PRAGMA_UNROLL
            for (int r = 0; r < NR; r++) {
                size_t rg = (size_t)(r0 + r) * groups + g;
                __m512i highs = in_place ? _mm512_srai_epi32(hi_sum[c][r], 4) : hi_sum[c][r];
                __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(lo_sum[c][r], highs));
                acc[c][r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(s, _mm512_set1_ps(qi.dx[rg])), acc[c][r]);
                acc[c][r] = _mm512_fmadd_ps(zero, _mm512_set1_ps(qi.sums[rg]), acc[c][r]);
            }
        }
    }
    PRAGMA_UNROLL
    for (int c = 0; c < NB; c++) {
        int n0 = (b0 + c) * BLOCK, left = lin->out - n0;
        __mmask16 m = left >= BLOCK ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        PRAGMA_UNROLL
        for (int r = 0; r < NR; r++) _mm512_mask_storeu_ps(out + (size_t)(r0 + r) * lin->out + n0, m, acc[c][r]);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
#define TILE_AVX2 1
/* 8 features' scales and (zero - zero_level * scale) from their words. */
static inline void scale_zero8(__m256i words, float zero_level, __m256 *s, __m256 *zero) {
    *s = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
    *zero = _mm256_fnmadd_ps(_mm256_set1_ps(zero_level), *s,
                             _mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32((int)ZERO_HALF))));
}
/* AVX2 without VNNI: a 256-bit vector of levels holds 4 inputs of 8 features (half a block). u8 x
 * s8 products summed in pairs (maddubs: at most 2 * 15 * 127 = 3810, so no saturation), the low and
 * high nibbles of the 4 steps added in 16 bits (at most 8 * 3810 = 30480 < 32767), then pairs to
 * 32 bits: each feature's exact isum, followed by the float steps of the portable loops. int8
 * levels q = ql + 16 qh go through the same nibble products twice: isum = sum(ql x) + 16 sum(qh x),
 * each half its own 16-bit sums. */
static inline __attribute__((always_inline)) void tile(const linear_t *lin, int b0, int NB, qinput_t qi, int r0,
                                                       int NR, float *out, int BITS) {
    int in = lin->in, groups = in / GROUP;
    __m256 acc[4][2][8];
    PRAGMA_UNROLL
    for (int c = 0; c < NB; c++)
        PRAGMA_UNROLL
        for (int r = 0; r < NR; r++) acc[c][0][r] = acc[c][1][r] = _mm256_setzero_ps();
    const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), sixteens = _mm256_set1_epi16(16);
    for (int g = 0; g < groups; g++) {
        __m256i sum[4][2][8], sum_high[4][2][8]; /* sum_high: int8's high nibbles */
        PRAGMA_UNROLL
        for (int c = 0; c < NB; c++)
            PRAGMA_UNROLL
            for (int r = 0; r < NR; r++)
                sum[c][0][r] = sum[c][1][r] = sum_high[c][0][r] = sum_high[c][1][r] = _mm256_setzero_si256();
        PRAGMA_UNROLL
        for (int j = 0; j < 4; j++)
            PRAGMA_UNROLL
            for (int c = 0; c < NB; c++)
                PRAGMA_UNROLL
                for (int h = 0; h < 2; h++) {
                    const uint8_t *at = block_levels(lin, b0 + c, g, BITS) + 64 * j + 32 * h;
                    __m256i v = _mm256_loadu_si256((const __m256i *)at), lo, hi, lo_high, hi_high;
                    if (BITS == 4) {
                        lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
                    } else {
                        __m256i w = _mm256_loadu_si256((const __m256i *)(at + 256));
                        lo = _mm256_and_si256(v, nibble), lo_high = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
                        hi = _mm256_and_si256(w, nibble), hi_high = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibble);
                    }
                    PRAGMA_UNROLL
                    for (int r = 0; r < NR; r++) {
                        const int8_t *px = qi.q + (size_t)(r0 + r) * in + g * GROUP + 4 * j;
                        int32_t a, b;
                        memcpy(&a, px, 4), memcpy(&b, px + 16, 4);
                        __m256i xa = _mm256_set1_epi32(a), xb = _mm256_set1_epi32(b);
                        sum[c][h][r] = _mm256_add_epi16(sum[c][h][r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa),
                                                                                       _mm256_maddubs_epi16(hi, xb)));
                        if (BITS == 8)
                            sum_high[c][h][r] = _mm256_add_epi16(
                                sum_high[c][h][r],
                                _mm256_add_epi16(_mm256_maddubs_epi16(lo_high, xa), _mm256_maddubs_epi16(hi_high, xb)));
                    }
                }
        PRAGMA_UNROLL
        for (int c = 0; c < NB; c++)
            PRAGMA_UNROLL
            for (int h = 0; h < 2; h++) {
                __m256i words = _mm256_loadu_si256((const __m256i *)(block_words(lin, b0 + c, g, BITS) + 8 * h));
                __m256 s, zero;
                scale_zero8(words, ZERO_LEVEL(BITS), &s, &zero);
                PRAGMA_UNROLL
                for (int r = 0; r < NR; r++) {
                    size_t rg = (size_t)(r0 + r) * groups + g;
                    __m256i whole = _mm256_madd_epi16(sum[c][h][r], ones);
                    if (BITS == 8) whole = _mm256_add_epi32(whole, _mm256_madd_epi16(sum_high[c][h][r], sixteens));
                    __m256 isum = _mm256_cvtepi32_ps(whole);
                    acc[c][h][r] = _mm256_fmadd_ps(isum, _mm256_mul_ps(s, _mm256_set1_ps(qi.dx[rg])), acc[c][h][r]);
                    acc[c][h][r] = _mm256_fmadd_ps(zero, _mm256_set1_ps(qi.sums[rg]), acc[c][h][r]);
                }
            }
    }
    PRAGMA_UNROLL
    for (int c = 0; c < NB; c++)
        PRAGMA_UNROLL
        for (int h = 0; h < 2; h++) {
            int n0 = (b0 + c) * BLOCK + 8 * h, left = lin->out - n0;
            PRAGMA_UNROLL
            for (int r = 0; r < NR; r++) {
                float *dst = out + (size_t)(r0 + r) * lin->out + n0;
                if (left >= 8) {
                    _mm256_storeu_ps(dst, acc[c][h][r]);
                } else if (left > 0) { /* the last block's padding features are not written */
                    float lanes[8];
                    _mm256_storeu_ps(lanes, acc[c][h][r]);
                    memcpy(dst, lanes, sizeof(float) * left);
                }
            }
        }
}
/* Several rows (prompts, verification passes, batches): a block x 4 rows a tile, the float
 * accumulators in `out` between groups. Each broadcast input feeds both halves of the block. The
 * group's products are written in assembly because the 8 integer sums, the 4 vectors of levels,
 * the 3 temporaries and the nibble mask need all 16 vector registers, and GCC's own schedule of
 * the same intrinsics spilled sums to the stack in every step. Each sum adds
 * the same integer products as `tile` (exact: no lane leaves int16, see above), so every
 * (feature, row) gets the float steps of `tile` in the same order; only for blocks whose 16
 * features all exist. */
#define ROW_PRODUCTS(R, ROW, A, C)                                                                     \
    "vpbroadcastd " A ROW ", %[a]\n\t"                                                               \
    "vpbroadcastd " C ROW ", %[c]\n\t"                                                               \
    "vpmaddubsw %[a], %[lo0], %[t]\n\t"                                                              \
    "vpaddw %[t], %[s0" #R "], %[s0" #R "]\n\t"                                                      \
    "vpmaddubsw %[a], %[lo1], %[a]\n\t"                                                              \
    "vpaddw %[a], %[s1" #R "], %[s1" #R "]\n\t"                                                      \
    "vpmaddubsw %[c], %[hi0], %[t]\n\t"                                                              \
    "vpaddw %[t], %[s0" #R "], %[s0" #R "]\n\t"                                                      \
    "vpmaddubsw %[c], %[hi1], %[c]\n\t"                                                              \
    "vpaddw %[c], %[s1" #R "], %[s1" #R "]\n\t"
/* step j: levels at 64 j (features 0-7) and 64 j + 32 (8-15); inputs 4 j.. and 16 + 4 j.. */
#define STEP_PRODUCTS(L0, L1, A, C)                                                                    \
    "vmovdqu " L0 "(%[lv]), %[lo0]\n\t"                                                              \
    "vpsrlw $4, %[lo0], %[hi0]\n\t"                                                                  \
    "vpand %[nib], %[lo0], %[lo0]\n\t"                                                               \
    "vpand %[nib], %[hi0], %[hi0]\n\t"                                                               \
    "vmovdqu " L1 "(%[lv]), %[lo1]\n\t"                                                              \
    "vpsrlw $4, %[lo1], %[hi1]\n\t"                                                                  \
    "vpand %[nib], %[lo1], %[lo1]\n\t"                                                               \
    "vpand %[nib], %[hi1], %[hi1]\n\t"                                                               \
    ROW_PRODUCTS(0, "(%[p0])", A, C) ROW_PRODUCTS(1, "(%[p0],%[in])", A, C)                              \
        ROW_PRODUCTS(2, "(%[p0],%[in],2)", A, C) ROW_PRODUCTS(3, "(%[p3])", A, C)
static void tile_rows4(const linear_t *lin, int b, qinput_t qi, int r0, float *out) { /* int4 */
    /* locals, not fields of *lin: the assembly's memory clobber would reload those every group */
    const int in = lin->in, groups = in / GROUP, width = lin->out;
    const uint8_t *records = block_levels(lin, b, 0, 4);
    const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    float *dst = out + (size_t)r0 * width + b * BLOCK;
    for (int r = 0; r < 4; r++)
        _mm256_storeu_ps(dst + (size_t)r * width, _mm256_setzero_ps()),
            _mm256_storeu_ps(dst + (size_t)r * width + 8, _mm256_setzero_ps());
    for (int g = 0; g < groups; g++) {
        const uint8_t *lv = records + (size_t)g * RECORD_BYTES(4);
        const uint32_t *words = (const uint32_t *)(lv + GROUP_BYTES(4));
        const int8_t *p0 = qi.q + (size_t)r0 * in + g * GROUP, *p3 = p0 + 3 * (size_t)in; /* rows 0 and 3 */
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00,
                s13 = s00, lo0, hi0, lo1, hi1, a, c, t;
        __asm__(STEP_PRODUCTS("0", "32", "0", "16") STEP_PRODUCTS("64", "96", "4", "20")
                    STEP_PRODUCTS("128", "160", "8", "24") STEP_PRODUCTS("192", "224", "12", "28")
                : [s00] "+x"(s00), [s01] "+x"(s01), [s02] "+x"(s02), [s03] "+x"(s03), [s10] "+x"(s10),
                  [s11] "+x"(s11), [s12] "+x"(s12), [s13] "+x"(s13), [lo0] "=&x"(lo0), [hi0] "=&x"(hi0),
                  [lo1] "=&x"(lo1), [hi1] "=&x"(hi1), [a] "=&x"(a), [c] "=&x"(c), [t] "=&x"(t)
                : [p0] "r"(p0), [p3] "r"(p3), [in] "r"((size_t)in), [lv] "r"(lv), [nib] "x"(nibble)
                : "memory"); /* reads the 4 rows' inputs and the group's levels */
        __m256i sum[2][4] = {{s00, s01, s02, s03}, {s10, s11, s12, s13}};
        PRAGMA_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256 s, zero;
            scale_zero8(_mm256_loadu_si256((const __m256i *)(words + 8 * h)), 8.f, &s, &zero);
            PRAGMA_UNROLL
            for (int r = 0; r < 4; r++) {
                size_t rg = (size_t)(r0 + r) * groups + g;
                float *acc = dst + (size_t)r * width + 8 * h;
                __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum[h][r], ones));
                __m256 y = _mm256_fmadd_ps(isum, _mm256_mul_ps(s, _mm256_set1_ps(qi.dx[rg])), _mm256_loadu_ps(acc));
                _mm256_storeu_ps(acc, _mm256_fmadd_ps(zero, _mm256_set1_ps(qi.sums[rg]), y));
            }
        }
    }
}
#else
/* Portable version (no AVX2): the same operations, feature by feature. */
static inline __attribute__((always_inline)) void tile(const linear_t *lin, int b0, int NB, qinput_t qi, int r0,
                                                       int NR, float *out, int BITS) {
    int in = lin->in, groups = in / GROUP;
    for (int c = 0; c < NB; c++)
        for (int f = 0; f < BLOCK && (b0 + c) * BLOCK + f < lin->out; f++)
            for (int r = r0; r < r0 + NR; r++) {
                float acc = 0.f;
                for (int g = 0; g < groups; g++) {
                    const uint8_t *q = block_levels(lin, b0 + c, g, BITS);
                    const int8_t *px = qi.q + (size_t)r * in + g * GROUP;
                    int isum = 0;
                    for (int j = 0; j < 4; j++)
                        for (int i = 0; i < 4; i++) {
                            uint8_t v = q[64 * j + 4 * f + i];
                            if (BITS == 4)
                                isum += (v & 15) * px[4 * j + i] + (v >> 4) * px[16 + 4 * j + i];
                            else
                                isum += v * px[4 * j + i] + q[256 + 64 * j + 4 * f + i] * px[16 + 4 * j + i];
                        }
                    size_t rg = (size_t)r * groups + g;
                    uint32_t word = block_words(lin, b0 + c, g, BITS)[f];
                    float s = bf16_to_f32((uint16_t)word);
                    acc = fmaf((float)isum, s * qi.dx[rg], acc);
                    acc = fmaf(fmaf(-ZERO_LEVEL(BITS), s, bf16_to_f32((uint16_t)(word >> 16))), qi.sums[rg], acc);
                }
                out[(size_t)r * lin->out + (b0 + c) * BLOCK + f] = acc;
            }
}
#endif

/* Rows r0..r0 + nr - 1 (nr <= 8) of the UNIT blocks from b0: few rows take several blocks a tile
 * (independent weight streams and accumulators), more rows one block, so that levels decoded
 * once serve up to 8 rows and the accumulators stay in registers. */
#define UNIT 4
#define TILE_R 8
static inline __attribute__((always_inline)) void unit_rows(const linear_t *lin, int b0, qinput_t qi, int r0, int nr,
                                                            float *out, int BITS) {
#ifdef TILE_AVX2
    /* 16 vector registers: `tile` holds at most 8 accumulators (2 per block and row); four rows
     * of a whole int4 block go through tile_rows4; int8's sums take twice the registers */
    if (BITS == 8) {
        if (nr == 1)
            for (int b = b0; b < b0 + UNIT; b += 2) tile(lin, b, 2, qi, r0, 1, out, 8);
        else
            for (int b = b0; b < b0 + UNIT; b++) {
                int r = r0;
                for (; r + 2 <= r0 + nr; r += 2) tile(lin, b, 1, qi, r, 2, out, 8);
                if (r < r0 + nr) tile(lin, b, 1, qi, r, 1, out, 8);
            }
        return;
    }
    switch (nr) {
    case 1: for (int b = b0; b < b0 + UNIT; b += 2) tile(lin, b, 2, qi, r0, 1, out, 4); break;
    case 2: for (int b = b0; b < b0 + UNIT; b += 2) tile(lin, b, 2, qi, r0, 2, out, 4); break;
    case 3: for (int b = b0; b < b0 + UNIT; b++) tile(lin, b, 1, qi, r0, 3, out, 4); break;
    default:
        for (int b = b0; b < b0 + UNIT; b++) {
            int whole = (b + 1) * BLOCK <= lin->out, r = r0;
            for (; r + 4 <= r0 + nr; r += 4)
                if (whole)
                    tile_rows4(lin, b, qi, r, out);
                else
                    tile(lin, b, 1, qi, r, 4, out, 4);
            switch (r0 + nr - r) {
            case 1: tile(lin, b, 1, qi, r, 1, out, 4); break;
            case 2: tile(lin, b, 1, qi, r, 2, out, 4); break;
            case 3: tile(lin, b, 1, qi, r, 3, out, 4); break;
            }
        }
    }
#else
    switch (nr) {
    case 1: tile(lin, b0, 4, qi, r0, 1, out, BITS); break;
    case 2: tile(lin, b0, 4, qi, r0, 2, out, BITS); break;
    case 3: for (int b = b0; b < b0 + UNIT; b += 2) tile(lin, b, 2, qi, r0, 3, out, BITS); break;
    case 4: for (int b = b0; b < b0 + UNIT; b += 2) tile(lin, b, 2, qi, r0, 4, out, BITS); break;
    case 5: for (int b = b0; b < b0 + UNIT; b++) tile(lin, b, 1, qi, r0, 5, out, BITS); break;
    case 6: for (int b = b0; b < b0 + UNIT; b++) tile(lin, b, 1, qi, r0, 6, out, BITS); break;
    case 7: for (int b = b0; b < b0 + UNIT; b++) tile(lin, b, 1, qi, r0, 7, out, BITS); break;
    default: for (int b = b0; b < b0 + UNIT; b++) tile(lin, b, 1, qi, r0, 8, out, BITS);
    }
#endif
}

/* Blocks b0..b1 - 1, every row: UNIT blocks at a time, the last ones (fewer) one at a time. */
static inline __attribute__((always_inline)) void block_products(const linear_t *lin, int b0, int b1, qinput_t qi,
                                                                 int rows, float *out, int BITS) {
    for (int u = b0; u < b1; u += UNIT)
        for (int r0 = 0; r0 < rows; r0 += TILE_R) {
            int nr = rows - r0 < TILE_R ? rows - r0 : TILE_R;
            if (b1 - u >= UNIT)
                unit_rows(lin, u, qi, r0, nr, out, BITS);
            else
                for (int b = u; b < b1; b++)
                    for (int r = r0; r < r0 + nr; r++) tile(lin, b, 1, qi, r, 1, out, BITS);
        }
}

/* Functions named *_team run inside a parallel region, called by every thread of the team, and
 * end with the team in step (a barrier): a layer is one region, not one per product, attention
 * and row-wise step (each fork and join of the threads cost more than a barrier). */

/* x (rows, in) quantized into scratch (rows * INPUT_SCRATCH(in) floats), the groups split between the threads. */
static qinput_t quantize_team(const float *x, int rows, int in, float *scratch) {
    int groups = in / GROUP;
    qinput_t qi = input_layout(rows, in, scratch);
#pragma omp for schedule(static)
    for (int i = 0; i < rows * groups; i++) quantize_group(x, i / groups, i % groups, in, qi);
    return qi;
}

/* The same, every group on the calling thread alone (its own scratch), no barrier. */
static qinput_t quantize_alone(const float *x, int rows, int in, float *scratch) {
    int groups = in / GROUP;
    qinput_t qi = input_layout(rows, in, scratch);
    for (int i = 0; i < rows * groups; i++) quantize_group(x, i / groups, i % groups, in, qi);
    return qi;
}

/* out (rows, lin->out) = the quantized input qi times W^T + bias, float32. */
static void products_team(const linear_t *lin, qinput_t qi, int rows, float *out) {
    int blocks = (lin->out + BLOCK - 1) / BLOCK;
    /* each thread an equal share of the blocks (whole units left threads up to a unit apart:
     * SmolLM2's 36-block products ran 5 units against 4), their bias added where they were summed */
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int b0 = (int)((long)blocks * t / threads), b1 = (int)((long)blocks * (t + 1) / threads);
    if (lin->bits == 8)
        block_products(lin, b0, b1, qi, rows, out, 8);
    else
        block_products(lin, b0, b1, qi, rows, out, 4);
    int n1 = b1 * BLOCK < lin->out ? b1 * BLOCK : lin->out;
    if (lin->bias)
        for (int r = 0; r < rows; r++)
            for (int n = b0 * BLOCK; n < n1; n++) out[(size_t)r * lin->out + n] += bf16_to_f32(lin->bias[n]);
#pragma omp barrier
}

/* out (rows, lin->out) = x (rows, lin->in) W^T + bias, float32; scratch: rows * INPUT_SCRATCH(in). */
static void linear_team(const linear_t *lin, const float *x, int rows, float *scratch, float *out) {
    products_team(lin, quantize_team(x, rows, lin->in, scratch), rows, out);
}

static void linear_f32(const linear_t *lin, const float *x, int rows, float *scratch, float *out) {
#pragma omp parallel
    linear_team(lin, x, rows, scratch, out);
}

/* -- the layer ------------------------------------------------------------------------------ */

static void rms_norm(const float *x, int rows, int n, const uint16_t *weight, float eps, float *out) {
    for (int r = 0; r < rows; r++) {
        const float *p = x + (size_t)r * n;
        float ss = 0.f;
        for (int i = 0; i < n; i++) ss = fmaf(p[i], p[i], ss);
        float inv = 1.f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) out[(size_t)r * n + i] = p[i] * inv * bf16_to_f32(weight[i]);
    }
}

/* Rotary embedding of one head in place: x * cos + rotate_half(x) * sin (tables in bf16). */
static void rope(float *x, int d, const uint16_t *cos, const uint16_t *sin) {
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * bf16_to_f32(cos[i]) - b * bf16_to_f32(sin[i]);
        x[i + half] = b * bf16_to_f32(cos[i + half]) + a * bf16_to_f32(sin[i + half]);
    }
}

#define ATTEND_CASE(N) \
    case N: \
        attend_heads(q, N, K, V, prefix, tail, ntail, d, scale, scores, out); \
        break;
#ifdef VECTOR_512
/* exp(x) for 16 floats, x clamped to [-87, 88] (Cephes' expf: range reduction by ln 2 in two
 * parts, degree-6 polynomial; within 1 ulp of exp over that range, checked in steps of 0.001). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x), _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(y, n);
}

static inline __mmask16 tail_mask(int left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }

/* QG heads of one query row that share one kv head (K: its keys (see key_at), V: (capacity, d), bf16), over
 * keys 0..prefix-1 of the cache, then the slots tail[0..ntail-1] (a tree row's ancestors and
 * itself; a chain's row passes all its keys as the prefix): out (QG, d) = softmax(scale * q K) V
 * per head, over those keys in that order; q (QG, d); d a multiple of 32; scores: QG * (prefix + ntail) floats
 * of scratch. Each key and value vector is loaded once for the QG heads. A (head, key) score is the
 * same chain of fused multiply-adds in any lane, with any QG, or alone, and the softmax and the
 * values run over the keys packed in order: a tree's row gets the bits the same row gets in a
 * chain, and a head the bits it gets in a group of any size. */
static inline __attribute__((always_inline)) void attend_heads(const float *q, int QG, const uint16_t *K,
                                                               const uint16_t *V, int prefix, const int *tail,
                                                               int ntail, int d, float scale,
                                                               float *scores, float *out) {
    int n = prefix + ntail;
    __m512 mx[8];
    PRAGMA_UNROLL
    for (int h = 0; h < QG; h++) mx[h] = _mm512_set1_ps(-INFINITY);
    for (int j0 = 0; j0 < prefix; j0 += 32) { /* two independent 16-key chains per head */
        __m512 acc[8][2];
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
        __mmask16 m0 = tail_mask(prefix - j0), m1 = prefix - j0 > 16 ? tail_mask(prefix - j0 - 16) : 0;
        for (int i = 0; i < d; i++) {
            /* feature i of the keys 4 blocks ahead */
            _mm_prefetch((const char *)(K + key_at(i, j0 + 4 * KEY_BLOCK, d)), _MM_HINT_T0);
            __m512 k0 = load_bf16(K + key_at(i, j0, d), m0);
            __m512 k1 = load_bf16(K + key_at(i, j0, d) + 16, m1);
            PRAGMA_UNROLL
            for (int h = 0; h < QG; h++) {
                __m512 qi = _mm512_set1_ps(q[h * d + i]);
                acc[h][0] = _mm512_fmadd_ps(qi, k0, acc[h][0]);
                acc[h][1] = _mm512_fmadd_ps(qi, k1, acc[h][1]);
            }
        }
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) {
            __m512 s0 = _mm512_mul_ps(acc[h][0], _mm512_set1_ps(scale));
            __m512 s1 = _mm512_mul_ps(acc[h][1], _mm512_set1_ps(scale));
            _mm512_mask_storeu_ps(scores + (size_t)h * n + j0, m0, s0);
            _mm512_mask_storeu_ps(scores + (size_t)h * n + j0 + 16, m1, s1);
            mx[h] = _mm512_mask_max_ps(mx[h], m0, mx[h], s0);
            mx[h] = _mm512_mask_max_ps(mx[h], m1, mx[h], s1);
        }
    }
    /* The tail (a tree row's ancestors, slots apart), 16 keys at a time: their columns of K copied
     * side by side, so that each key's score is one chain of fused multiply-adds in a lane, as
     * above (one scalar chain a key was latency-bound). */
    uint16_t cols[d * 16];
    for (int t0 = 0; t0 < ntail; t0 += 16) {
        int m = ntail - t0 < 16 ? ntail - t0 : 16;
        for (int jj = 0; jj < 16; jj++)
            for (int i = 0; i < d; i++) cols[i * 16 + jj] = jj < m ? K[key_at(i, tail[t0 + jj], d)] : 0;
        __m512 acc[8];
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) acc[h] = _mm512_setzero_ps();
        for (int i = 0; i < d; i++) {
            __m512 k = load_bf16(cols + i * 16, 0xffff);
            PRAGMA_UNROLL
            for (int h = 0; h < QG; h++) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * d + i]), k, acc[h]);
        }
        __mmask16 live = tail_mask(m);
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) {
            __m512 sc = _mm512_mul_ps(acc[h], _mm512_set1_ps(scale));
            _mm512_mask_storeu_ps(scores + (size_t)h * n + prefix + t0, live, sc);
            mx[h] = _mm512_mask_max_ps(mx[h], live, mx[h], sc);
        }
    }
    float inv[8];
    for (int h = 0; h < QG; h++) {
        float *sc = scores + (size_t)h * n;
        __m512 vtop = _mm512_set1_ps(_mm512_reduce_max_ps(mx[h])), sum = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) {
            __mmask16 m = tail_mask(n - j);
            __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + j), vtop));
            _mm512_mask_storeu_ps(sc + j, m, e);
            sum = _mm512_mask_add_ps(sum, m, sum, e);
        }
        inv[h] = 1.f / _mm512_reduce_add_ps(sum);
    }
    if (d == 64 && QG <= 7) { /* each value row read whole, once: 28 accumulators, the probabilities
                                 * broadcast from memory (two 32-wide passes, each reading half of every
                                 * row, streamed the values from memory more slowly; the results'
                                 * values-one-pass) */
        __m512 acc[7][4];
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++)
            PRAGMA_UNROLL
            for (int k = 0; k < 4; k++) acc[h][k] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const uint16_t *row = V + (size_t)(j < prefix ? j : tail[j - prefix]) * d;
            PRAGMA_UNROLL
            for (int k = 0; k < 4; k++) {
                __m512 v = load_bf16(row + 16 * k, 0xffff);
                PRAGMA_UNROLL
                for (int h = 0; h < QG; h++)
                    acc[h][k] = _mm512_fmadd_ps(_mm512_set1_ps(scores[(size_t)h * n + j]), v, acc[h][k]);
            }
        }
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++)
            PRAGMA_UNROLL
            for (int k = 0; k < 4; k++)
                _mm512_storeu_ps(out + (size_t)h * d + 16 * k, _mm512_mul_ps(acc[h][k], _mm512_set1_ps(inv[h])));
        return;
    }
    for (int i0 = 0; i0 < d; i0 += 32) { /* 32-wide slices of the output, each value vector loaded once */
        __m512 acc[8][2];
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const uint16_t *row = V + (size_t)(j < prefix ? j : tail[j - prefix]) * d + i0;
            __m512 v0 = load_bf16(row, 0xffff), v1 = load_bf16(row + 16, 0xffff);
            PRAGMA_UNROLL
            for (int h = 0; h < QG; h++) {
                __m512 p = _mm512_set1_ps(scores[(size_t)h * n + j]);
                acc[h][0] = _mm512_fmadd_ps(p, v0, acc[h][0]);
                acc[h][1] = _mm512_fmadd_ps(p, v1, acc[h][1]);
            }
        }
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) {
            _mm512_storeu_ps(out + (size_t)h * d + i0, _mm512_mul_ps(acc[h][0], _mm512_set1_ps(inv[h])));
            _mm512_storeu_ps(out + (size_t)h * d + i0 + 16, _mm512_mul_ps(acc[h][1], _mm512_set1_ps(inv[h])));
        }
    }
}

/* G heads sharing one kv head, in groups of up to 8 (each group with a constant size, so that its
 * accumulators stay in registers). */
static void attend(const float *q, int G, const uint16_t *K, const uint16_t *V, int prefix, const int *tail,
                   int ntail, int d, float scale, float *scores, float *out) {
    for (int g0 = 0; g0 < G; g0 += 8, q += 8 * d, out += 8 * d) {
        switch (G - g0 < 8 ? G - g0 : 8) {
            ATTEND_CASE(1) ATTEND_CASE(2) ATTEND_CASE(3) ATTEND_CASE(4) ATTEND_CASE(5) ATTEND_CASE(6)
            ATTEND_CASE(7) ATTEND_CASE(8)
        }
    }
}
#elif defined(VECTOR_256)
/* exp(x) for 8 floats: exp16's steps, with 2^n built in the exponent bits (n in -126..127). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* Lanes 0..left-1 (left < 8 takes a tail). */
static inline __m256i lanes_below(int left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* attend_heads of the 512-bit version in 8-float vectors, the same order of operations: a
 * (head, key) score is one chain of fused multiply-adds in whichever lane its key falls, and the
 * softmax runs over the keys packed in order. */
static inline __attribute__((always_inline)) void attend_heads(const float *q, int QG, const uint16_t *K,
                                                               const uint16_t *V, int prefix, const int *tail,
                                                               int ntail, int d, float scale,
                                                               float *scores, float *out) {
    int n = prefix + ntail, full = prefix - prefix % 16;
    float top[4];
    __m256 mx[4];
    PRAGMA_UNROLL
    for (int h = 0; h < QG; h++) mx[h] = _mm256_set1_ps(-INFINITY);
    for (int j0 = 0; j0 < full; j0 += 16) { /* two independent 8-key chains per head */
        __m256 acc[4][2];
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
        for (int i = 0; i < d; i++) {
            _mm_prefetch((const char *)(K + key_at(i, j0 + 4 * KEY_BLOCK, d)), _MM_HINT_T0);
            __m256 k0 = load_bf16x8(K + key_at(i, j0, d)), k1 = load_bf16x8(K + key_at(i, j0, d) + 8);
            PRAGMA_UNROLL
            for (int h = 0; h < QG; h++) {
                __m256 qi = _mm256_set1_ps(q[h * d + i]);
                acc[h][0] = _mm256_fmadd_ps(qi, k0, acc[h][0]);
                acc[h][1] = _mm256_fmadd_ps(qi, k1, acc[h][1]);
            }
        }
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) {
            __m256 s0 = _mm256_mul_ps(acc[h][0], _mm256_set1_ps(scale)), s1 = _mm256_mul_ps(acc[h][1], _mm256_set1_ps(scale));
            _mm256_storeu_ps(scores + (size_t)h * n + j0, s0);
            _mm256_storeu_ps(scores + (size_t)h * n + j0 + 8, s1);
            mx[h] = _mm256_max_ps(mx[h], _mm256_max_ps(s0, s1));
        }
    }
    /* The last keys of the prefix, then the tail, 8 at a time: their columns of K copied side by
     * side, so that each key's score is one chain of fused multiply-adds in a lane, as above (one
     * scalar chain a key was latency-bound: in a prompt's chunk, most of the attention's time). */
    uint16_t cols[d * 8];
    for (int j0 = full; j0 < n; j0 += 8) {
        int m = n - j0 < 8 ? n - j0 : 8;
        for (int jj = 0; jj < 8; jj++) {
            int j = j0 + jj, slot = j < prefix ? j : jj < m ? tail[j - prefix] : -1;
            for (int i = 0; i < d; i++) cols[i * 8 + jj] = slot < 0 ? 0 : K[key_at(i, slot, d)];
        }
        __m256 acc[4];
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) acc[h] = _mm256_setzero_ps();
        for (int i = 0; i < d; i++) {
            __m256 k = load_bf16x8(cols + i * 8);
            PRAGMA_UNROLL
            for (int h = 0; h < QG; h++) acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(q[h * d + i]), k, acc[h]);
        }
        __m256i live = lanes_below(m);
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) {
            __m256 sc = _mm256_mul_ps(acc[h], _mm256_set1_ps(scale));
            _mm256_maskstore_ps(scores + (size_t)h * n + j0, live, sc);
            mx[h] = _mm256_max_ps(mx[h], _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, _mm256_castsi256_ps(live)));
        }
    }
    float inv[4];
    for (int h = 0; h < QG; h++) {
        float *sc = scores + (size_t)h * n;
        top[h] = max8(mx[h]);
        __m256 vtop = _mm256_set1_ps(top[h]), sum = _mm256_setzero_ps();
        for (int j = 0; j < n; j += 8) {
            __m256i m = lanes_below(n - j);
            __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(sc + j, m), vtop));
            _mm256_maskstore_ps(sc + j, m, e);
            sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
        }
        inv[h] = 1.f / sum8(sum);
    }
    for (int i0 = 0; i0 < d; i0 += 16) { /* 16-wide slices of the output, each value vector loaded once */
        __m256 acc[4][2];
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const uint16_t *row = V + (size_t)(j < prefix ? j : tail[j - prefix]) * d + i0;
            __m256 v0 = load_bf16x8(row), v1 = load_bf16x8(row + 8);
            PRAGMA_UNROLL
            for (int h = 0; h < QG; h++) {
                __m256 p = _mm256_set1_ps(scores[(size_t)h * n + j]);
                acc[h][0] = _mm256_fmadd_ps(p, v0, acc[h][0]);
                acc[h][1] = _mm256_fmadd_ps(p, v1, acc[h][1]);
            }
        }
        PRAGMA_UNROLL
        for (int h = 0; h < QG; h++) {
            _mm256_storeu_ps(out + (size_t)h * d + i0, _mm256_mul_ps(acc[h][0], _mm256_set1_ps(inv[h])));
            _mm256_storeu_ps(out + (size_t)h * d + i0 + 8, _mm256_mul_ps(acc[h][1], _mm256_set1_ps(inv[h])));
        }
    }
}

/* G heads sharing one kv head, in groups of up to 4 (16 vector registers). */
static void attend(const float *q, int G, const uint16_t *K, const uint16_t *V, int prefix, const int *tail,
                   int ntail, int d, float scale, float *scores, float *out) {
    for (int g0 = 0; g0 < G; g0 += 4, q += 4 * d, out += 4 * d) {
        switch (G - g0 < 4 ? G - g0 : 4) {
            ATTEND_CASE(1) ATTEND_CASE(2) ATTEND_CASE(3) ATTEND_CASE(4)
        }
    }
}
#else
static void attend_head(const float *q, const uint16_t *K, const uint16_t *V, int prefix, const int *tail, int ntail,
                        int d, float scale, float *scores, float *out) {
    int n = prefix + ntail;
    for (int j = 0; j < n; j++) scores[j] = 0.f;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < n; j++)
            scores[j] += q[i] * bf16_to_f32(K[key_at(i, j < prefix ? j : tail[j - prefix], d)]);
    float mx = -INFINITY, sum = 0.f;
    for (int j = 0; j < n; j++) mx = fmaxf(mx, scores[j] *= scale);
    for (int j = 0; j < n; j++) sum += scores[j] = expf(scores[j] - mx);
    for (int i = 0; i < d; i++) out[i] = 0.f;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < d; i++) out[i] += scores[j] * bf16_to_f32(V[(size_t)(j < prefix ? j : tail[j - prefix]) * d + i]);
    for (int i = 0; i < d; i++) out[i] /= sum;
}

static void attend(const float *q, int G, const uint16_t *K, const uint16_t *V, int prefix, const int *tail,
                   int ntail, int d, float scale, float *scores, float *out) {
    for (int h = 0; h < G; h++) attend_head(q + h * d, K, V, prefix, tail, ntail, d, scale, scores, out + h * d);
}
#endif

/* SiLU(gate) * up over n features. */
static void swiglu(const float *gate, const float *up, int n, float *out) {
    int i = 0;
#ifdef VECTOR_512
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(e, _mm512_set1_ps(1.f))),
                                                _mm512_loadu_ps(up + i)));
    }
#elif defined(VECTOR_256)
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(e, _mm256_set1_ps(1.f))),
                                                _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; i++) out[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
}

/* Attention of rows in cache slots start, start + 1, ...: each row sees the slots before start
 * and, among the step's rows, itself and its ancestors; parent[r] is row r's parent row (-1: none,
 * the first row) or parent == NULL for a chain (row r - 1). q: row r's heads (heads, d) float32 at
 * q + r * q_stride. */
static void attention_team(const dims_t *dm, const float *q, long q_stride, int rows, int start, const int *parent,
                           const uint16_t *keys, const uint16_t *values, int capacity, float *out) {
    int H = dm->heads, d = dm->head_dim, G = dm->heads / dm->kv_heads;
    /* Each thread an equal share of the (kv head, row, head) triples in that order, a run of
     * heads that share a kv head and a row in one pass: a kv head's keys and values are read by
     * one thread, or two where a share ends inside it (SmolLM2, 3 kv heads of 3 heads, one row:
     * 4 and 5 heads), and a thread's rows read the same keys and values, all but the first from
     * its own caches (ordered row first, every thread read every kv head from memory, and a
     * verification pass over a long cache cost a one-token step's attention again per row). */
    int t = omp_get_thread_num(), threads = omp_get_num_threads(), items = rows * H;
    int i0 = (int)((long)items * t / threads), i1 = (int)((long)items * (t + 1) / threads);
    float *scores = malloc(sizeof(float) * (size_t)(G < 8 ? G : 8) * (start + rows));
    int *tail = malloc(sizeof(int) * (size_t)rows);
    for (int i = i0; i < i1;) {
        int kv = i / (rows * G), r = i / G % rows, g = i % G, n = G - g < i1 - i ? G - g : i1 - i;
        /* a chain's row r sees the contiguous slots 0..start + r: all of them the prefix, so that
         * a prompt's chunk scores its own keys in whole vectors (a key's score has the same bits
         * in a vector or in the tail) */
        int ntail = 0, prefix = parent ? start : start + r + 1;
        if (parent) {
            for (int a = r; a >= 0; a = parent[a]) tail[ntail++] = a; /* r, its parent, ... */
            for (int j = 0; j < ntail / 2; j++) { /* oldest first */
                int swap = tail[j];
                tail[j] = tail[ntail - 1 - j], tail[ntail - 1 - j] = swap;
            }
            for (int j = 0; j < ntail; j++) tail[j] += start;
        }
        int h0 = kv * G + g;
        attend(q + (size_t)r * q_stride + (size_t)h0 * d, n, keys + (size_t)kv * d * capacity,
               values + (size_t)kv * capacity * d, prefix, tail, ntail, d, dm->scale, scores,
               out + ((size_t)r * H + h0) * d);
        i += n;
    }
    free(tail);
    free(scores);
#pragma omp barrier
}

/* Rows up to FEW_ROWS (decode steps, short verification passes, small batches) take a layer's
 * row-wise steps on every thread at once, each thread in a copy of its own: the residual stream,
 * the normed inputs and the quantized inputs of the products that read them. The threads then
 * meet only where one needs what another computed (7 barriers a layer, not 15), and the residual
 * stream goes from layer to layer in each thread's copy. More rows split those steps between the
 * threads. Either way each value is the same chain of operations: the same bits. */
#define FEW_ROWS 8
#define MAX_TEAM 16 /* threads with a copy of their own; a larger team splits the row-wise steps */

/* Floats of the scratch the threads share for `rows` rows. */
static long shared_floats(const dims_t *dm, int rows) {
    long qkv = (long)(dm->heads + 2 * dm->kv_heads) * dm->head_dim;
    long hd = (long)dm->heads * dm->head_dim, widest = dm->intermediate > dm->hidden ? dm->intermediate : dm->hidden;
    widest = widest > hd ? widest : hd;
    return rows * (3L * dm->hidden + qkv + hd + 3L * dm->intermediate + INPUT_SCRATCH(widest));
}

/* Floats of one thread's copy for `rows` (<= FEW_ROWS) rows: residual, normed input, quantized input. */
static long own_floats(const dims_t *dm, int rows) {
    long hd = (long)dm->heads * dm->head_dim, widest = dm->hidden > hd ? dm->hidden : hd;
    return rows * (2L * dm->hidden + INPUT_SCRATCH(widest));
}

/* Floats of scratch `layer_forward` needs for `rows` rows. */
long workspace_floats(const dims_t *dm, int rows) {
    return shared_floats(dm, rows) + MAX_TEAM * own_floats(dm, rows < FEW_ROWS ? rows : FEW_ROWS);
}

/* One sequence's rows in a layer call: `rows` new tokens in cache slots start, start + 1, ... of
 * its own cache (keys (kv_heads, capacity / KEY_BLOCK, head_dim, KEY_BLOCK), values (kv_heads, capacity,
 * head_dim) bf16);
 * parent: the rows' tree (see attention; NULL for a chain). */
typedef struct {
    int rows, start;
    const int *parent;
    uint16_t *keys, *values;
    int capacity;
} segment_t;

/* Output features first..first + count - 1 of `lin` (first a multiple of BLOCK) as a product of
 * their own: each feature gets the bits the whole product gives it, as a block's arithmetic never
 * depends on the blocks beside it. */
static linear_t feature_range(const linear_t *lin, int first, int count) {
    linear_t part = *lin;
    size_t skipped = (size_t)(first / BLOCK) * (lin->in / GROUP); /* (block, group) pairs before it */
    part.q += skipped * RECORD_BYTES(lin->bits);
    if (part.bias) part.bias += first;
    part.out = count;
    return part;
}

/* Rotary embedding of the queries and keys in qkv (rows, width), then each segment's keys and
 * values written in its cache slots; a task a (row, head), split between the threads. skip: the
 * leading query features qkv lacks (see project_qkv_team). */
static void rope_store_team(const dims_t *dm, const segment_t *seg, int rows, const uint16_t *cos,
                            const uint16_t *sin, float *qkv, int skip) {
    int H = dm->heads, KV = dm->kv_heads, d = dm->head_dim;
    int width = (H + 2 * KV) * d - skip, key0 = H * d - skip, first = skip ? H : 0, heads = H + KV - first;
#pragma omp for schedule(static)
    for (int task = 0; task < rows * heads; task++) {
        int r = task / heads, k = first + task % heads;
        float *row = qkv + (size_t)r * width;
        rope(row + k * d - skip, d, cos + (size_t)r * d, sin + (size_t)r * d);
        if (k < H) continue;
        int s = 0, i = r; /* row r is row i of segment s */
        while (i >= seg[s].rows) i -= seg[s++].rows;
        int kv = k - H, pos = seg[s].start + i, cap = seg[s].capacity;
        for (int j = 0; j < d; j++) {
            seg[s].keys[(size_t)kv * d * cap + key_at(j, pos, d)] = f32_to_bf16(row[key0 + kv * d + j]);
            seg[s].values[((size_t)kv * cap + pos) * d + j] = f32_to_bf16(row[key0 + (KV + kv) * d + j]);
        }
    }
}

/* The first half of a layer: hidden (rows, hidden) bf16 -> h (its float copy), the input norm,
 * queries, keys and values with rotary embedding in qkv (rows, (H + 2 KV) d); each segment's
 * keys and values written in its cache slots. cos/sin: the rows' rotary rows (rows, head_dim).
 * Without `queries` (keys and values projected for skipped layers) the fused product skips the
 * queries' features where they fill whole blocks: qkv then holds (rows, 2 KV d), the same bits. */
static void project_qkv_team(const dims_t *dm, const layer_t *ly, const uint16_t *hidden, const segment_t *seg,
                             int segs, const uint16_t *cos, const uint16_t *sin, float *h, float *x, float *qkv,
                             float *scratch, int queries) {
    int Hd = dm->hidden, H = dm->heads, KV = dm->kv_heads, d = dm->head_dim;
    int skip = !queries && (H * d) % BLOCK == 0 ? H * d : 0; /* leading features not computed */
    int width = (H + 2 * KV) * d - skip, rows = 0;
    for (int s = 0; s < segs; s++) rows += seg[s].rows;
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
        for (long i = (long)r * Hd; i < (long)(r + 1) * Hd; i++) h[i] = bf16_to_f32(hidden[i]);
        rms_norm(h + (size_t)r * Hd, 1, Hd, ly->in_norm, dm->eps, x + (size_t)r * Hd);
    }
    linear_t product = skip ? feature_range(&ly->qkv, skip, width) : ly->qkv;
    linear_team(&product, x, rows, scratch, qkv);
    rope_store_team(dm, seg, rows, cos, sin, qkv, skip);
}

/* One decoder layer for the segments' rows, in order: hidden (rows, hidden) bf16 in, out (rows,
 * hidden) bf16 (in place is safe); cos/sin: the rotary rows of the tokens' positions (rows,
 * head_dim) bf16 (a chain's are start, start + 1, ...; a tree's, start + depth). The products run
 * on every row at once; attention reads each segment's own cache. carried: this thread ran the
 * layer before in this parallel region, for the same rows (with FEW_ROWS rows or fewer, its copy
 * of the residual stream then holds this layer's input, and hidden is not read). */
static void layer_team(const dims_t *dm, const layer_t *ly, const uint16_t *hidden, uint16_t *out,
                       const segment_t *seg, int segs, const uint16_t *cos, const uint16_t *sin, float *ws,
                       int carried) {
    int Hd = dm->hidden, H = dm->heads, KV = dm->kv_heads, d = dm->head_dim, I = dm->intermediate;
    int nqkv = (H + 2 * KV) * d, rows = 0, t = omp_get_thread_num(), threads = omp_get_num_threads();
    for (int s = 0; s < segs; s++) rows += seg[s].rows;
    float *h = ws, *x = h + (size_t)rows * Hd, *y = x + (size_t)rows * Hd, *qkv = y + (size_t)rows * Hd;
    float *att = qkv + (size_t)rows * nqkv, *gu = att + (size_t)rows * H * d, *act = gu + (size_t)rows * 2 * I;
    float *scratch = act + (size_t)rows * I;
    int own = rows <= FEW_ROWS && threads <= MAX_TEAM;
    float *mine = NULL; /* this thread's quantized inputs */
    if (own) {
        h = ws + shared_floats(dm, rows) + t * own_floats(dm, rows);
        x = h + (size_t)rows * Hd, mine = x + (size_t)rows * Hd;
    }
    /* the input norm and the queries, keys and values */
    if (own) {
        if (!carried)
            for (long i = 0; i < (long)rows * Hd; i++) h[i] = bf16_to_f32(hidden[i]);
        rms_norm(h, rows, Hd, ly->in_norm, dm->eps, x);
        products_team(&ly->qkv, quantize_alone(x, rows, Hd, mine), rows, qkv);
        rope_store_team(dm, seg, rows, cos, sin, qkv, 0);
    } else {
        project_qkv_team(dm, ly, hidden, seg, segs, cos, sin, h, x, qkv, scratch, 1);
    }
    /* attention, the queries read in place in qkv */
    for (int s = 0, r = 0; s < segs; r += seg[s].rows, s++)
        attention_team(dm, qkv + (size_t)r * nqkv, nqkv, seg[s].rows, seg[s].start, seg[s].parent, seg[s].keys,
                       seg[s].values, seg[s].capacity, att + (size_t)r * H * d);
    qinput_t qi = own ? quantize_alone(att, rows, H * d, mine) : quantize_team(att, rows, H * d, scratch);
    products_team(&ly->o, qi, rows, y);
    /* the residual and the post-attention norm */
    if (own) {
        for (long i = 0; i < (long)rows * Hd; i++) h[i] += y[i];
        rms_norm(h, rows, Hd, ly->post_norm, dm->eps, x);
        qi = quantize_alone(x, rows, Hd, mine);
    } else {
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            for (long i = (long)r * Hd; i < (long)(r + 1) * Hd; i++) h[i] += y[i];
            rms_norm(h + (size_t)r * Hd, 1, Hd, ly->post_norm, dm->eps, x + (size_t)r * Hd);
        }
        qi = quantize_team(x, rows, Hd, scratch);
    }
    products_team(&ly->gate_up, qi, rows, gu);
    /* SwiGLU and the down product's quantized input, a task a (row, group) */
    qi = input_layout(rows, I, scratch);
#pragma omp for schedule(static)
    for (int task = 0; task < rows * (I / GROUP); task++) {
        int r = task / (I / GROUP), g = task % (I / GROUP);
        const float *gate = gu + (size_t)r * 2 * I + g * GROUP;
        swiglu(gate, gate + I, GROUP, act + (size_t)r * I + g * GROUP);
        quantize_group(act, r, g, I, qi);
    }
    products_team(&ly->down, qi, rows, y);
    if (own) { /* each thread the whole residual stream, its share of out */
        long f0 = (long)Hd * t / threads, f1 = (long)Hd * (t + 1) / threads;
        for (int r = 0; r < rows; r++)
            for (long i = (long)r * Hd; i < (long)(r + 1) * Hd; i++) {
                uint16_t v = f32_to_bf16(h[i] + y[i]);
                h[i] = bf16_to_f32(v);
                if (i - (long)r * Hd >= f0 && i - (long)r * Hd < f1) out[i] = v;
            }
    } else {
#pragma omp for schedule(static)
        for (long i = 0; i < (long)rows * Hd; i++) out[i] = f32_to_bf16(h[i] + y[i]);
    }
}

static void layer_forward(const dims_t *dm, const layer_t *ly, const uint16_t *hidden, uint16_t *out,
                          const segment_t *seg, int segs, const uint16_t *cos, const uint16_t *sin, float *ws) {
#pragma omp parallel
    layer_team(dm, ly, hidden, out, seg, segs, cos, sin, ws, 0);
}

/* One sequence's segment at layer i of a call's tables. */
static segment_t one_segment(int rows, int start, const int *parent, uint16_t *const *keys, uint16_t *const *values,
                             const int *capacity, int i) {
    segment_t s = {rows, start, parent, keys[i], values[i], capacity[i]};
    return s;
}

/* Floats of scratch `linear_bf16` needs. */
long linear_workspace_floats(int in, int out, int rows) { return (long)rows * (in + out + INPUT_SCRATCH(in)); }

/* A product on bf16 rows (the LM head, or a linear outside a layer): out (rows, out) bf16;
 * ws: rows * (in + out + INPUT_SCRATCH(in)) floats. */
void linear_bf16(const linear_t *lin, const uint16_t *x, int rows, uint16_t *out, float *ws) {
    float *xf = ws, *y = xf + (size_t)rows * lin->in, *scratch = y + (size_t)rows * lin->out;
    for (long i = 0; i < (long)rows * lin->in; i++) xf[i] = bf16_to_f32(x[i]);
    linear_f32(lin, xf, rows, scratch, y);
    for (long i = 0; i < (long)rows * lin->out; i++) out[i] = f32_to_bf16(y[i]);
}

/* Layers first..first + n - 1 in a row (LayeredModel.forward and verification passes): the same
 * as n calls of layer_forward, each layer's output rounded to bf16 as there, in one parallel
 * region; keys, values and capacity per layer. */
void layers_forward(const dims_t *dm, const layer_t *const *layers, int n, const uint16_t *hidden, uint16_t *out,
                    int rows, int start, const int *parent, uint16_t *const *keys, uint16_t *const *values,
                    const int *capacity, const uint16_t *cos, const uint16_t *sin, float *ws) {
#pragma omp parallel
    for (int i = 0; i < n; i++) { /* a layer reads its input whole before it writes: in place is safe */
        segment_t seg = one_segment(rows, start, parent, keys, values, capacity, i);
        layer_team(dm, layers[i], i == 0 ? hidden : out, out, &seg, 1, cos, sin, ws, i > 0);
    }
}

/* Continuous batching: layers first..first + n - 1 for the rows of `segs` sequences at once, each
 * a chain of seg_rows[s] tokens in its own cache at slots seg_start[s], ...; its key and value
 * buffers and capacity at layer i at [s * n + i] of keys, values and capacity. Rows in segment
 * order in hidden, out, cos and sin. Every row goes through the operations a call of its sequence
 * alone would give it (the products' row tiles change no row's arithmetic), so each sequence gets
 * the same bits whatever shares its batch. */
#define MAX_SEGMENTS 256
void layers_forward_batch(const dims_t *dm, const layer_t *const *layers, int n, const uint16_t *hidden,
                          uint16_t *out, int segs, const int *seg_rows, const int *seg_start, uint16_t *const *keys,
                          uint16_t *const *values, const int *capacity, const uint16_t *cos, const uint16_t *sin,
                          float *ws) {
    if (segs > MAX_SEGMENTS) segs = MAX_SEGMENTS; /* the binding refuses more */
#pragma omp parallel
    {
        segment_t seg[MAX_SEGMENTS]; /* each thread's own copy of layer i's table */
        for (int i = 0; i < n; i++) {
            for (int s = 0; s < segs; s++)
                seg[s] = one_segment(seg_rows[s], seg_start[s], NULL, keys + (size_t)s * n, values + (size_t)s * n,
                                     capacity + (size_t)s * n, i);
            layer_team(dm, layers[i], i == 0 ? hidden : out, out, seg, segs, cos, sin, ws, i > 0);
        }
    }
}

/* Keys and values of layers first..first + n - 1 for `rows` tokens, all computed from the same
 * hidden states (early exit's propagation: the layers a token skipped get keys and values from
 * its exit hidden state); no attention, no MLP. Arguments as layers_forward's. */
void layers_project_kv(const dims_t *dm, const layer_t *const *layers, int n, const uint16_t *hidden, int rows,
                       int start, uint16_t *const *keys, uint16_t *const *values, const int *capacity,
                       const uint16_t *cos, const uint16_t *sin, float *ws) {
    int Hd = dm->hidden, nqkv = (dm->heads + 2 * dm->kv_heads) * dm->head_dim;
    float *h = ws, *x = h + (size_t)rows * Hd, *qkv = x + (size_t)rows * Hd, *scratch = qkv + (size_t)rows * nqkv;
#pragma omp parallel
    for (int i = 0; i < n; i++) {
        segment_t seg = one_segment(rows, start, NULL, keys, values, capacity, i);
        project_qkv_team(dm, layers[i], hidden, &seg, 1, cos, sin, h, x, qkv, scratch, 0);
    }
}

/* -- exit decisions inside the layer loop (early exit) ------------------------------------- */

/* A hidden-state exit policy's network at one check layer: features of the token's hidden state,
 * dense layers with an activation between them, and P(exit) from the last one's output (one
 * logit: its sigmoid; two, (continue, exit): the softmax's second). n == 0: the check exits
 * without deciding (`static`). Float32 weights (out, in) row-major, as PyTorch holds them. */
#define MAX_DENSE 4
#define MAX_WIDTH 4096 /* features and dense widths a check's scratch holds */
enum { FEATURES_FINAL_NORM, FEATURES_UNIT_RMS_DEPTH };
enum { ACTIVATION_RELU, ACTIVATION_TANH };

typedef struct {
    const float *weight, *bias;
    int out, in;
} dense_t;

typedef struct {
    int features;   /* FEATURES_FINAL_NORM: the model's final norm, rounded as the model rounds it
                       (the ICSE'24 classifier); FEATURES_UNIT_RMS_DEPTH: unit root mean square,
                       then the depth e / L (the PPO agent) */
    int activation; /* between dense layers */
    int n;
    dense_t dense[MAX_DENSE];
} exit_net_t;

typedef struct {
    int checks;
    const int *layers;      /* ascending: exit layer e is checked after layers 0..e-1 */
    const exit_net_t *nets; /* one per check */
    float threshold;        /* a check exits when P(exit) > threshold */
    const uint16_t *final_norm;
} exit_plan_t;

static float dot(const float *a, const float *b, int n) {
    int i = 0;
    float total = 0.f;
#ifdef VECTOR_512
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    total = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) total = fmaf(a[i], b[i], total);
    return total;
}

/* One hidden state (bf16, n features) as floats into x; returns 1 / its root mean square (eps
 * added to the mean), the sum of squares in order, one fused multiply-add a feature. */
static float inverse_rms(const uint16_t *hidden, int n, float eps, float *x) {
    float ss = 0.f;
    for (int i = 0; i < n; i++) {
        x[i] = bf16_to_f32(hidden[i]);
        ss = fmaf(x[i], x[i], ss);
    }
    return 1.f / sqrtf(ss / (float)n + eps);
}

/* The model's final norm of one hidden state (bf16, n features) into x: normalised in float32,
 * rounded to bf16, then times the weight rounded again (the model's order of roundings). The
 * values of `FastEngine.final_norm`. */
static void final_norm_row(const uint16_t *hidden, int n, const uint16_t *weight, float eps, float *x) {
    float inv = inverse_rms(hidden, n, eps, x);
    for (int i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(x[i] * inv)) * bf16_to_f32(weight[i])));
}

/* The final norm of `rows` hidden states (rows, hidden) bf16: out (rows, hidden) bf16. */
void final_norm_bf16(const dims_t *dm, const uint16_t *weight, const uint16_t *hidden, int rows, uint16_t *out) {
    float x[MAX_WIDTH];
    for (int r = 0; r < rows; r++) {
        final_norm_row(hidden + (size_t)r * dm->hidden, dm->hidden, weight, dm->eps, x);
        for (int i = 0; i < dm->hidden; i++) out[(size_t)r * dm->hidden + i] = f32_to_bf16(x[i]);
    }
}

/* Floats of scratch `final_logits` needs. */
long logits_workspace_floats(int in, int rows) { return (long)rows * (in + INPUT_SCRATCH(in)); }

/* A step's logits in one call: the final norm of `rows` hidden states (rows, hidden) bf16, then the
 * LM head's product, each logit rounded to bf16 as the head's bf16 output is and stored widened:
 * logits (rows, head->out) float32, the values of `linear_bf16` on `final_norm_bf16`'s rows.
 * ws: logits_workspace_floats(hidden, rows) floats. */
static void logits_team(const dims_t *dm, const uint16_t *weight, const linear_t *head, const uint16_t *hidden,
                        int rows, float *logits, float *ws) {
    float *x = ws, *scratch = ws + (size_t)rows * dm->hidden;
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++)
        final_norm_row(hidden + (size_t)r * dm->hidden, dm->hidden, weight, dm->eps, x + (size_t)r * dm->hidden);
    linear_team(head, x, rows, scratch, logits);
#pragma omp for schedule(static)
    for (long i = 0; i < (long)rows * head->out; i++) logits[i] = bf16_to_f32(f32_to_bf16(logits[i]));
}

void final_logits(const dims_t *dm, const uint16_t *weight, const linear_t *head, const uint16_t *hidden, int rows,
                  float *logits, float *ws) {
#pragma omp parallel
    logits_team(dm, weight, head, hidden, rows, logits, ws);
}

/* LayeredModel.forward and forward_batch in one parallel region: `segs` sequences, each a chain of
 * seg_rows[s] token ids (in segment order in ids) at its cache slots seg_start[s], ..., its
 * layers' buffers and capacities at keys[s][i], values[s][i] and capacity[s][i]; the rows'
 * rotary angles copied from cos and sin (tables from position 0) into row_cos and row_sin (rows x
 * head_dim bf16 each); then final_logits of the `logit_rows` rows listed in logit_row, gathered
 * into picked (logit_rows x hidden bf16). The bits of layers_forward_batch and final_logits. */
void forward_chains(const dims_t *dm, const layer_t *const *layers, int n, const uint16_t *embedding, const int *ids,
                    int segs, const int *seg_rows, const int *seg_start, uint16_t *const *const *keys,
                    uint16_t *const *const *values, const int *const *capacity, const uint16_t *cos,
                    const uint16_t *sin, float *ws, uint16_t *hidden, uint16_t *out, uint16_t *row_cos,
                    uint16_t *row_sin, const uint16_t *norm_weight, const linear_t *head, int logit_rows,
                    const int *logit_row, uint16_t *picked, float *logits, float *head_ws) {
    int Hd = dm->hidden, d = dm->head_dim;
    if (segs > MAX_SEGMENTS) segs = MAX_SEGMENTS; /* the binding refuses more */
    for (int s = 0, r = 0; s < segs; s++)
        for (int j = 0; j < seg_rows[s]; j++, r++) {
            memcpy(hidden + (size_t)r * Hd, embedding + (size_t)ids[r] * Hd, sizeof(uint16_t) * Hd);
            memcpy(row_cos + (size_t)r * d, cos + (size_t)(seg_start[s] + j) * d, sizeof(uint16_t) * d);
            memcpy(row_sin + (size_t)r * d, sin + (size_t)(seg_start[s] + j) * d, sizeof(uint16_t) * d);
        }
#pragma omp parallel
    {
        segment_t seg[MAX_SEGMENTS]; /* each thread's own copy of layer i's table */
        for (int i = 0; i < n; i++) {
            for (int s = 0; s < segs; s++)
                seg[s] = one_segment(seg_rows[s], seg_start[s], NULL, keys[s], values[s], capacity[s], i);
            layer_team(dm, layers[i], i == 0 ? hidden : out, out, seg, segs, row_cos, row_sin, ws, i > 0);
        }
#pragma omp barrier /* with few rows each thread wrote its share of out after the last barrier */
#pragma omp for schedule(static)
        for (int k = 0; k < logit_rows; k++)
            memcpy(picked + (size_t)k * Hd, out + (size_t)logit_row[k] * Hd, sizeof(uint16_t) * Hd);
        logits_team(dm, norm_weight, head, picked, logit_rows, logits, head_ws);
    }
}

/* P(exit) of one hidden state (bf16, dm->hidden) at exit layer e of L. */
float exit_probability(const dims_t *dm, const exit_net_t *net, const uint16_t *final_norm, const uint16_t *hidden,
                       int e, int L) {
    float a[MAX_WIDTH + 1], b[MAX_WIDTH + 1], *x = a, *y = b;
    int n = dm->hidden;
    if (net->features == FEATURES_FINAL_NORM) {
        final_norm_row(hidden, n, final_norm, dm->eps, x);
    } else {
        float inv = inverse_rms(hidden, n, 1e-6f, x);
        for (int i = 0; i < n; i++) x[i] *= inv;
        x[n++] = (float)e / (float)L;
    }
    for (int k = 0; k < net->n; k++) {
        const dense_t *dl = &net->dense[k];
        for (int o = 0; o < dl->out; o++) {
            float v = dot(dl->weight + (size_t)o * dl->in, x, dl->in) + dl->bias[o];
            if (k + 1 < net->n) v = net->activation == ACTIVATION_RELU ? fmaxf(v, 0.f) : tanhf(v);
            y[o] = v;
        }
        float *t = x;
        x = y, y = t;
    }
    return net->dense[net->n - 1].out == 1 ? 1.f / (1.f + expf(-x[0])) : 1.f / (1.f + expf(x[0] - x[1]));
}

/* One early-exit step in one call: all L layers for `rows` rows in cache slots first, first + 1,
 * ..., deciding after the plan's check layers whether the last row (the new token) exits there.
 * The rows before it are positions that exited earlier and still lack layers resume[r]..L-1
 * (kv=catchup; resume never increases along rows, the last row's is 0): row r joins at layer
 * resume[r], with hidden[r] its state there, so that every layer runs once for the suffix of rows
 * it lacks, as `layers_forward` would run it. Keys, values and capacity: all L layers'.
 * hidden (rows, hidden) bf16, in place: each row's state after the last layer it ran.
 * propagate (one row only): the layers the token skips get keys and values projected from its
 * exit state (`layers_project_kv`). Returns the exit layer, L where the token went through. */
int layers_forward_exit(const dims_t *dm, const layer_t *const *layers, int L, uint16_t *hidden, int rows, int first,
                        const int *resume, const exit_plan_t *plan, int propagate, uint16_t *const *keys,
                        uint16_t *const *values, const int *capacity, const uint16_t *cos, const uint16_t *sin,
                        float *ws) {
    int Hd = dm->hidden, d = dm->head_dim, a = rows - 1, c = 0;
    uint16_t *last = hidden + (size_t)(rows - 1) * Hd;
    for (int j = 0; j < L; j++) {
        while (a > 0 && resume[a - 1] <= j) a--;
        uint16_t *h = hidden + (size_t)a * Hd;
        segment_t seg = one_segment(rows - a, first + a, NULL, keys, values, capacity, j);
        layer_forward(dm, layers[j], h, h, &seg, 1, cos + (size_t)a * d, sin + (size_t)a * d, ws);
        int e = j + 1;
        while (c < plan->checks && plan->layers[c] < e) c++;
        if (e == L || c == plan->checks || plan->layers[c] != e) continue;
        const exit_net_t *net = &plan->nets[c];
        if (net->n == 0 || exit_probability(dm, net, plan->final_norm, last, e, L) > plan->threshold) {
            if (propagate)
                layers_project_kv(dm, layers + e, L - e, last, 1, first + rows - 1, keys + e, values + e, capacity + e,
                                  cos + (size_t)(rows - 1) * d, sin + (size_t)(rows - 1) * d, ws);
            return e;
        }
    }
    return L;
}

/* Keys of n positions moved to other slots and rotated (serve/chunk_reuse.py's cache reuse), in
 * every layer: layer l's keys (heads kv heads of src_cap[l] or dst_cap[l] positions, see key_at) from
 * slot `from` of src[l] to slot `to` of dst[l], each head's feature j paired with j + d / 2 and
 * turned by the angle whose cos and sin are cos[j], sin[j]. The bits of rotary.rotate_keys in
 * PyTorch: each product, difference and sum rounded in float32, then to bf16. */
void rotate_keys_bf16(int layers, int heads, int d, int n, const uint16_t *const *src, const int *src_cap, int from,
                      uint16_t *const *dst, const int *dst_cap, int to, const float *cos, const float *sin) {
    int half = d / 2;
    for (int l = 0; l < layers; l++)
        for (int h = 0; h < heads; h++)
            for (int j = 0; j < half; j++) {
                const uint16_t *in = src[l] + (size_t)h * d * src_cap[l];
                uint16_t *o = dst[l] + (size_t)h * d * dst_cap[l];
                float c = cos[j], s = sin[j];
                /* runs of positions that stay in one block at both ends: a feature's positions
                 * there are contiguous, so the loop over them vectorizes */
                for (int p = 0; p < n;) {
                    int a = (from + p) % KEY_BLOCK, b = (to + p) % KEY_BLOCK;
                    int run = KEY_BLOCK - (a > b ? a : b);
                    run = run < n - p ? run : n - p;
                    const uint16_t *x1 = in + key_at(j, from + p, d), *x2 = in + key_at(j + half, from + p, d);
                    uint16_t *y1 = o + key_at(j, to + p, d), *y2 = o + key_at(j + half, to + p, d);
                    for (int k = 0; k < run; k++) {
                        float v1 = bf16_to_f32(x1[k]), v2 = bf16_to_f32(x2[k]);
                        float x1c = v1 * c, x2s = v2 * s, x2c = v2 * c, x1s = v1 * s;
                        y1[k] = f32_to_bf16(x1c - x2s);
                        y2[k] = f32_to_bf16(x2c + x1s);
                    }
                    p += run;
                }
            }
}
