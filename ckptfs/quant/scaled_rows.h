/* One row of a scaled-codes weight (packed/scaled.py: FP8 block/channel/tensor scales, compressed-tensors'
 * int8 and float schemes, fbgemm, ModelOpt FP8), the one home of that arithmetic for the two C paths that
 * decode it: packed/_kernels.c's scaled_rows (Python's decode calls) and fuse/_direct.c (a mount's .npy reads
 * answered in C, fuse/direct.py).
 *
 * Each byte of the row is a code whose value is table[code] (256 float32: E4M3/E5M2 decoded, or an int8's
 * integer); value j = (table[code_j] - z[j / bw]) * s[j / bw] in float32 with the row's scale row s (and zero
 * row z when there is one), else table[code_j] * s[j / bw]: the numpy path's operations in its order, built
 * with -ffp-contract=off. The value is stored as float32, or converted once to float16 (numpy's astype) or
 * bfloat16 (torch's .to on CPU) by quant/float_bits.h. */
#ifndef CKPTFS_SCALED_ROWS_H
#define CKPTFS_SCALED_ROWS_H

#include <stdint.h>

#include "float_bits.h"

enum { ROW_OUT_F32 = 0, ROW_OUT_F16 = 1, ROW_OUT_BF16 = 2 };

static inline void scaled_row(const uint8_t *restrict row, const float *restrict table, const float *restrict srow,
                              const float *restrict zrow, int64_t width, int64_t bw, void *restrict dst,
                              int out_type) {
    for (int64_t j0 = 0, g = 0; j0 < width; j0 += bw, g++) {
        const int64_t j1 = j0 + bw < width ? j0 + bw : width;
        const float sv = srow[g], zv = zrow ? zrow[g] : 0.0f;
        if (out_type == ROW_OUT_F32) {
            float *restrict o = (float *)dst;
            if (zrow)
                for (int64_t j = j0; j < j1; j++) o[j] = (table[row[j]] - zv) * sv;
            else
                for (int64_t j = j0; j < j1; j++) o[j] = table[row[j]] * sv;
        } else {
            uint16_t *restrict o = (uint16_t *)dst;
            const int half = out_type == ROW_OUT_F16;
            for (int64_t j = j0; j < j1; j++) {
                const uint32_t u = bits_of(zrow ? (table[row[j]] - zv) * sv : table[row[j]] * sv);
                o[j] = half ? f32_to_f16(u) : f32_to_bf16(u);
            }
        }
    }
}

#endif
