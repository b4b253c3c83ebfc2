/* A flat run of 4-bit codes, two a byte, times a scale per block of elements: NVFP4 (compressed-tensors and
 * ModelOpt), compressed-tensors MXFP4 and bitsandbytes NF4/FP4, whose values are the elements of the weight in
 * order whatever its rows (a bitsandbytes block may straddle two). fuse/_direct.c computes a mount's .npy reads
 * of such views with it (fuse/direct.py), packed/_bnb.c and packed/_kernels.c the rows of Python's decode calls
 * (gpt-oss' block columns too, a row at a time).
 *
 * Element e lies in byte e / 2; `pairs` holds each byte's two values in element order (pairs[2 * byte +
 * e % 2]: the low nibble first for E2M1, the high first for bitsandbytes), as float32 (twice the value where
 * the scales are halved to stay finite: gpt-oss/MXFP4's E8M0_HALF form). Value e = pairs[...] * scale[e /
 * block] in float32, scales[k] being the block's float32 scale as its caller decoded it (bitsandbytes' absmax,
 * its nested form combined; NVFP4's E4M3 over the global scale; MXFP4's E8M0). That product is the one multiply of the layers' numpy paths
 * and kernels (packed/nvfp4.py, mxfp.py, bnb.py), so the bits are theirs; stored as float32, or rounded once to
 * float16 or bfloat16 by quant/float_bits.h. */
#ifndef CKPTFS_NIBBLE_PAIRS_H
#define CKPTFS_NIBBLE_PAIRS_H

#include <stdint.h>

#include "float_bits.h"
#include "scaled_rows.h"  /* ROW_OUT_* */

struct nibble_scales {
    const float *scales;         /* float32 per block */
    int64_t block;
    int64_t first_block;         /* the block scales[0] belongs to */
};

/* Values [e0, e1) as float32 into dst[0 .. e1 - e0); `bytes` points at the byte holding element e0 (byte
 * e0 / 2). */
static inline void nibble_span(const uint8_t *restrict bytes, int64_t e0, int64_t e1, const float *restrict pairs,
                               const struct nibble_scales *sc, float *restrict dst) {
    const uint8_t *base = bytes - e0 / 2;  /* base[e / 2] is element e's byte */
    for (int64_t b0 = e0; b0 < e1;) {
        const int64_t k = b0 / sc->block, end = (k + 1) * sc->block, b1 = end < e1 ? end : e1;
        const float sv = sc->scales[k - sc->first_block];
        int64_t e = b0;
        if (e & 1) {
            dst[e - e0] = pairs[2 * base[e / 2] + 1] * sv;
            e++;
        }
        for (; e + 1 < b1; e += 2) {
            const unsigned byte = base[e / 2];
            dst[e - e0] = pairs[2 * byte] * sv;
            dst[e - e0 + 1] = pairs[2 * byte + 1] * sv;
        }
        if (e < b1)
            dst[e - e0] = pairs[2 * base[e / 2]] * sv;
        b0 = b1;
    }
}

/* nibble_span into float32, or for a 16-bit output through a small float32 buffer converted in a loop of its
 * own (faster than converting each value as it is made). */
static inline void paired_nibbles(const uint8_t *bytes, int64_t e0, int64_t e1, const float *pairs,
                                  const struct nibble_scales *sc, void *dst, int out_type) {
    if (out_type == ROW_OUT_F32) {
        nibble_span(bytes, e0, e1, pairs, sc, (float *)dst);
        return;
    }
    enum { STEP = 256 };  /* even: each piece after the first starts on a byte */
    float buf[STEP];
    uint16_t *out = (uint16_t *)dst;
    for (int64_t a = e0; a < e1;) {
        const int64_t b = (a / STEP + 1) * STEP < e1 ? (a / STEP + 1) * STEP : e1;
        nibble_span(bytes + (a / 2 - e0 / 2), a, b, pairs, sc, buf);
        if (out_type == ROW_OUT_F16)
            for (int64_t i = 0; i < b - a; i++) out[a - e0 + i] = f32_to_f16(bits_of(buf[i]));
        else
            for (int64_t i = 0; i < b - a; i++) out[a - e0 + i] = f32_to_bf16(bits_of(buf[i]));
        a = b;
    }
}

#endif
