/* float32 -> 16-bit float conversions on the bits, one home for the C extensions that write float16 or
 * bfloat16 (packed/_kernels.c, quant/scaled_rows.h, quant/_native.c, fuse/_direct.c through scaled_rows.h).
 * Each matches what the Python side's reference does, bit for bit (the tests compare them). */
#ifndef CKPTFS_FLOAT_BITS_H
#define CKPTFS_FLOAT_BITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

/* float32 bits -> float16 bits, round to nearest even; subnormals, overflow to infinity; a NaN keeps its sign
 * and top payload bits and stays a NaN (numpy's npy_floatbits_to_halfbits). */
static inline uint16_t f32_to_f16(uint32_t f) {
    const uint32_t sign = (f >> 16) & 0x8000u, a = f & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        uint32_t nan = 0x7c00u + ((a & 0x7fffffu) >> 13);
        if (nan == 0x7c00u) nan++;
        return (uint16_t)(sign | nan);
    }
    if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00u);          /* >= 2^16: infinity */
    if (a >= 0x38800000u) {                                             /* normal float16 range */
        const uint32_t r = (a + 0x0fffu + ((a >> 13) & 1u)) >> 13;      /* a carry may reach 0x7c00 = inf */
        return (uint16_t)(sign | (r - 0x1c000u));
    }
    if (a <= 0x33000000u) return (uint16_t)sign;                        /* <= 2^-25: rounds to zero */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;        /* subnormal: units of 2^-24 */
    const unsigned shift = 126u - e;                                    /* 14..24 */
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* float32 bits -> bfloat16 bits, round to nearest even; every NaN -> 0xFFFF (what torch writes on CPU, and
 * hffolder/safetensors_view.py's bfloat16_bits). */
static inline uint16_t f32_to_bf16(uint32_t b) {
    const uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    return (uint16_t)(((b & 0x7FFFFFFFu) > 0x7F800000u) ? 0xFFFFu : r);
}

#endif
