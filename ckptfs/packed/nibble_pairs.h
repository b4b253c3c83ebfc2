/* A flat run of 4-bit codes, two a byte, times a scale per block of elements: NVFP4 (compressed-tensors and
 * ModelOpt), compressed-tensors MXFP4 and bitsandbytes NF4/FP4, whose values are the elements of the weight in
 * order whatever its rows (a bitsandbytes block may straddle two). fs/_direct.c computes a mount's .npy reads
 * of such views with it (fs/direct.py), packed/_bnb.c bitsandbytes' 4-bit rows for Python's decode calls.
 *
 * Element e lies in byte e / 2; `pairs` holds each byte's two values in element order (pairs[2 * byte +
 * e % 2]: the low nibble first for E2M1, the high first for bitsandbytes), as float32 (twice the value where
 * the scales are halved to stay finite: gpt-oss/MXFP4's E8M0_HALF form). Value e = pairs[...] * scale[e /
 * block] in float32, the scale being scales[k] (float32 per block: bitsandbytes' absmax, its nested form
 * already combined) or scale_table[scale_codes[k]] (a scale byte per block and its 256 combined float32
 * values: NVFP4's E4M3 / global, MXFP4's E8M0). That product is the one multiply of the layers' numpy paths
 * and kernels (packed/nvfp4.py, mxfp.py, bnb.py), so the bits are theirs; stored as float32, or rounded once to
 * float16 or bfloat16 by quant/float_bits.h. */
#ifndef CKPTFS_NIBBLE_PAIRS_H
#define CKPTFS_NIBBLE_PAIRS_H

#include <stdint.h>

#include "../quant/float_bits.h"
#include "scaled_rows.h"  /* ROW_OUT_* */

struct nibble_scales {
    const float *scales;         /* float32 per block, or NULL */
    const uint8_t *scale_codes;  /* a byte per block (with scale_table), or NULL */
    const float *scale_table;
    int64_t block;
    int64_t first_block;         /* the block scales[0] (scale_codes[0]) belongs to */
};

static inline __attribute__((always_inline)) void nibble_store(void *dst, int64_t i, float v, int out_type) {
    if (out_type == ROW_OUT_F32)
        ((float *)dst)[i] = v;
    else if (out_type == ROW_OUT_F16)
        ((uint16_t *)dst)[i] = f32_to_f16(bits_of(v));
    else
        ((uint16_t *)dst)[i] = f32_to_bf16(bits_of(v));
}

/* Values [e0, e1) into dst[0 .. e1 - e0); `bytes` points at the byte holding element e0 (byte e0 / 2). */
static inline __attribute__((always_inline)) void nibble_span(const uint8_t *restrict bytes, int64_t e0, int64_t e1,
                                                              const float *restrict pairs,
                                                              const struct nibble_scales *sc, void *restrict dst,
                                                              int out_type) {
    const uint8_t *base = bytes - e0 / 2;  /* base[e / 2] is element e's byte */
    for (int64_t b0 = e0; b0 < e1;) {
        const int64_t k = b0 / sc->block, end = (k + 1) * sc->block, b1 = end < e1 ? end : e1;
        const float sv = sc->scale_codes ? sc->scale_table[sc->scale_codes[k - sc->first_block]]
                                         : sc->scales[k - sc->first_block];
        int64_t e = b0;
        if (e & 1) {
            nibble_store(dst, e - e0, pairs[2 * base[e / 2] + 1] * sv, out_type);
            e++;
        }
        for (; e + 1 < b1; e += 2) {
            const unsigned byte = base[e / 2];
            nibble_store(dst, e - e0, pairs[2 * byte] * sv, out_type);
            nibble_store(dst, e - e0 + 1, pairs[2 * byte + 1] * sv, out_type);
        }
        if (e < b1)
            nibble_store(dst, e - e0, pairs[2 * base[e / 2]] * sv, out_type);
        b0 = b1;
    }
}

/* nibble_span with the output type a constant in each branch (the compiler specializes each loop). */
static inline void paired_nibbles(const uint8_t *bytes, int64_t e0, int64_t e1, const float *pairs,
                                  const struct nibble_scales *sc, void *dst, int out_type) {
    if (out_type == ROW_OUT_F32)
        nibble_span(bytes, e0, e1, pairs, sc, dst, ROW_OUT_F32);
    else if (out_type == ROW_OUT_F16)
        nibble_span(bytes, e0, e1, pairs, sc, dst, ROW_OUT_F16);
    else
        nibble_span(bytes, e0, e1, pairs, sc, dst, ROW_OUT_BF16);
}

#endif
