/*
 * Optional C kernel for the packed schemes' hottest path: rows of a GPTQ (2, 3, 4, 8 bits; g_idx or not; v1
 * or v2 zero points) or AWQ (GEMM or GEMV order) weight, decoded in one pass straight into the caller's
 * float32 or float16 buffer.
 *
 * Why: the numpy path (gptq.py, awq.py, bits.py) makes several passes over each tile (split fields, widen,
 * subtract, multiply, round) through temporaries whose fresh pages cost more than the arithmetic; here each
 * output value is written once. Results must be bit-identical to the numpy path, which stays the reference
 * and the fallback:
 *
 * - value = (float)(q - z) * s in float32 (q - z is a small integer, s an exact float32 of the stored scale:
 *   the product is the numpy path's, and for a 16-bit scale it is exact);
 * - rounded once to the scale's storage type: F16 nearest-even with subnormals, overflow to infinity and NaN
 *   kept (numpy's float32 -> float16 conversion); BF16 nearest-even on the bits, NaN kept; F32 unchanged;
 * - a float16 output converts that float32 to float16 (nearest-even) as numpy's astype does.
 *
 * Each row's 2^bits possible values per group are computed once into a table when that is fewer than the
 * row's values; the inner loop then only extracts fields and copies table entries. The zero points (the v1
 * +1 already added), scales (as float32) and group indices come in as the per-layer arrays the numpy path
 * caches, so both paths read the same inputs. Built with -ffp-contract=off (nothing to fuse here, but the
 * project's kernels share the flags). The GIL is released while decoding; every index is checked against
 * the buffers before anything is read or written.
 *
 * Interface: dequantize_rows(mode, words, row_step, word_step, bits, in_features, phase, zeros, scales,
 * groups, g_idx, group_size, rounding, out, out_half, n_rows) and convert(src, dst, rounding, out_half) (the
 * per-value finishing step over float32 values, for tests). Word k of row r (of 8-row block r for AWQ GEMM)
 * is words[r * row_step + k * word_step]: the stored qweight is read as it is (its columns are the rows:
 * row_step 1, word_step the column count), without the transposed copy the numpy path needs.
 *
 * scaled_rows(codes, table, width, scales, scale_rows, groups, block_width, zeros, out, out_half, n_rows):
 * the scaled-codes layers (FP8, compressed-tensors int8: ckptfs/packed/scaled.py). Each byte of a row is a
 * code whose value is table[code] (256 float32: E4M3 decoded, or an int8's integer); value =
 * (table[code] - z) * s in float32 with the row's scale row scales[scale_rows[r] * groups + j / block_width]
 * (and zeros likewise, when given), then stored as float32 or converted to float16 (nearest-even).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/float_bits.h"
#include "../quant/nibble_pairs.h"
#include "../quant/scaled_rows.h"

#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static inline
#endif

enum { MODE_DENSE = 0, MODE_AWQ_GEMM = 1 };
enum { ROUND_NONE = 0, ROUND_F16 = 1, ROUND_BF16 = 2 };

/* AutoAWQ GEMM: output column 8c + j of a word is its nibble REVERSE_ORDER[j]. */
static const int AWQ_REVERSE_ORDER[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* float16 bits -> float32 bits (exact). */
static inline uint32_t f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return sign | 0x7f800000u | (m << 13);
    if (e) return sign | ((e + 112u) << 23) | (m << 13);
    return sign | bits_of((float)m * 0x1p-24f);                         /* zero or subnormal: exact */
}

/* The finished output bits of one float32 value: rounded to the scale's type, then as the output's type. */
static inline uint32_t finish(float v, int rounding, int out_half) {
    uint32_t u = bits_of(v);
    if (rounding == ROUND_F16) {
        /* zero, or a magnitude that stays a normal float16 once rounded (2^-14 <= |v| < 65520): rounding
         * the float32 mantissa to 10 bits on the bits is the same nearest-even rounding, without the
         * round trip through float16 bits */
        if (!out_half && ((u & 0x7fffffffu) - 0x38800000u < 0x477ff000u - 0x38800000u || !(u & 0x7fffffffu)))
            return (u + 0x0fffu + ((u >> 13) & 1u)) & 0xffffe000u;
        const uint16_t h = f32_to_f16(u);
        return out_half ? h : f16_to_f32(h);
    }
    if (rounding == ROUND_BF16 && (u & 0x7fffffffu) <= 0x7f800000u)
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return out_half ? f32_to_f16(u) : u;
}

typedef struct {
    int mode, bits, rounding, out_half, phase;
    Py_ssize_t in, row_step, word_step, groups, group_size, n_rows;
    const uint32_t *words;
    const int16_t *zeros;
    const float *scales;
    const int64_t *g_idx;       /* NULL: group i / group_size */
    void *out;
} Job;

/* Field i of a row whose word k is w[k * step]: dense (field i at bit bits * i of the row's words read as
 * one little-endian bit string) or AWQ GEMM (word i of the row's 8-row block, nibble `shift` / 4). `bits` is
 * a constant in each caller. */
ALWAYS_INLINE uint32_t field(const uint32_t *w, Py_ssize_t step, Py_ssize_t i, int bits, int awq,
                             unsigned shift) {
    if (awq) return (w[i * step] >> shift) & 15u;
    const uint32_t mask = (1u << bits) - 1u;
    if (32 % bits == 0) {
        const int per = 32 / bits;
        return (w[(i / per) * step] >> ((unsigned)(i % per) * (unsigned)bits)) & mask;
    }
    const uint64_t bit = (uint64_t)i * (uint64_t)bits;
    const Py_ssize_t k = (Py_ssize_t)(bit >> 5);
    const unsigned off = (unsigned)(bit & 31u);
    uint64_t window = w[k * step];
    if (off + (unsigned)bits > 32u) window |= (uint64_t)w[(k + 1) * step] << 32;
    return (uint32_t)(window >> off) & mask;
}

ALWAYS_INLINE void store(void *out, Py_ssize_t i, uint32_t value, int out_half) {
    if (out_half) ((uint16_t *)out)[i] = (uint16_t)value;
    else ((uint32_t *)out)[i] = value;
}

/* One output row r of the job. `table` has room for groups << bits entries (NULL: compute each value). */
ALWAYS_INLINE void decode_row(const Job *job, Py_ssize_t r, uint32_t *table, int bits, int awq, int out_half) {
    const Py_ssize_t in = job->in, groups = job->groups, gs = job->group_size;
    const int16_t *z = job->zeros + r * groups;
    const float *s = job->scales + r * groups;
    const int64_t *g_idx = job->g_idx;
    const int nq = 1 << bits, rounding = job->rounding;
    const Py_ssize_t step = job->word_step;
    const uint32_t *w;
    unsigned shift = 0;
    if (awq) {
        const Py_ssize_t row = job->phase + r;
        w = job->words + (row / 8) * job->row_step;
        shift = 4u * (unsigned)AWQ_REVERSE_ORDER[row % 8];
    } else {
        w = job->words + r * job->row_step;
    }
    void *out = (char *)job->out + r * in * (out_half ? 2 : 4);
    if (table) {
        for (Py_ssize_t g = 0; g < groups; g++)
            for (int q = 0; q < nq; q++)
                table[g * nq + q] = finish((float)(q - (int)z[g]) * s[g], rounding, out_half);
        if (g_idx) {
            for (Py_ssize_t i = 0; i < in; i++)
                store(out, i, table[g_idx[i] * nq + field(w, step, i, bits, awq, shift)], out_half);
        } else if (!awq && 32 % bits == 0 && gs % (32 / bits) == 0) {
            /* whole words per group: each word loaded once, its fields split by constant shifts */
            const int per = 32 / bits;
            const uint32_t mask = (1u << bits) - 1u;
            const Py_ssize_t full = in / per, group_words = gs / per;
            for (Py_ssize_t k0 = 0, g = 0; k0 < full; k0 += group_words, g++) {
                const uint32_t *t = table + g * nq;
                const Py_ssize_t k1 = k0 + group_words < full ? k0 + group_words : full;
                for (Py_ssize_t k = k0; k < k1; k++) {
                    const uint32_t x = w[k * step];
                    for (int j = 0; j < per; j++) store(out, k * per + j, t[(x >> (j * bits)) & mask], out_half);
                }
            }
            for (Py_ssize_t i = full * per; i < in; i++)
                store(out, i, table[(i / gs) * nq + field(w, step, i, bits, awq, shift)], out_half);
        } else {
            for (Py_ssize_t i0 = 0, g = 0; i0 < in; i0 += gs, g++) {
                const uint32_t *t = table + g * nq;
                const Py_ssize_t i1 = i0 + gs < in ? i0 + gs : in;
                for (Py_ssize_t i = i0; i < i1; i++)
                    store(out, i, t[field(w, step, i, bits, awq, shift)], out_half);
            }
        }
        return;
    }
    for (Py_ssize_t i = 0; i < in; i++) {
        const Py_ssize_t g = g_idx ? (Py_ssize_t)g_idx[i] : i / gs;
        const int q = (int)field(w, step, i, bits, awq, shift);
        store(out, i, finish((float)(q - (int)z[g]) * s[g], rounding, out_half), out_half);
    }
}

ALWAYS_INLINE void decode_rows_as(const Job *job, uint32_t *table, int bits, int awq, int out_half) {
    for (Py_ssize_t r = 0; r < job->n_rows; r++) decode_row(job, r, table, bits, awq, out_half);
}

static void run(const Job *job, uint32_t *table) {
    const int h = job->out_half;
    if (job->mode == MODE_AWQ_GEMM) {
        if (h) decode_rows_as(job, table, 4, 1, 1); else decode_rows_as(job, table, 4, 1, 0);
        return;
    }
    switch (job->bits) {
    case 2: if (h) decode_rows_as(job, table, 2, 0, 1); else decode_rows_as(job, table, 2, 0, 0); break;
    case 3: if (h) decode_rows_as(job, table, 3, 0, 1); else decode_rows_as(job, table, 3, 0, 0); break;
    case 4: if (h) decode_rows_as(job, table, 4, 0, 1); else decode_rows_as(job, table, 4, 0, 0); break;
    default: if (h) decode_rows_as(job, table, 8, 0, 1); else decode_rows_as(job, table, 8, 0, 0); break;
    }
}

static int fail(const char *message) {
    PyErr_SetString(PyExc_ValueError, message);
    return 0;
}

/* Every index the job will touch lies inside its buffers (else a ValueError, nothing decoded). */
static int check(const Job *job, const Py_buffer *words, const Py_buffer *zeros, const Py_buffer *scales,
                 const Py_buffer *g_idx, const Py_buffer *out) {
    const Py_ssize_t n = job->n_rows, in = job->in;
    if (job->bits != 2 && job->bits != 3 && job->bits != 4 && job->bits != 8) return fail("bits must be 2, 3, 4 or 8");
    if (job->mode != MODE_DENSE && job->mode != MODE_AWQ_GEMM) return fail("unknown packing mode");
    if (job->mode == MODE_AWQ_GEMM && (job->bits != 4 || job->phase < 0 || job->phase > 7))
        return fail("AWQ GEMM packing is 4-bit with a phase 0..7");
    if (job->rounding < ROUND_NONE || job->rounding > ROUND_BF16) return fail("unknown rounding");
    if (n < 0 || in <= 0 || job->groups <= 0 || job->group_size <= 0) return fail("empty or negative shape");
    if (!job->g_idx && (in + job->group_size - 1) / job->group_size > job->groups)
        return fail("fewer groups than in_features / group_size");
    if (n > PY_SSIZE_T_MAX / in / 4 || job->groups > PY_SSIZE_T_MAX / 256 / 4) return fail("shape too large");
    if (job->row_step < 0 || job->word_step <= 0 || job->row_step > PY_SSIZE_T_MAX / 4 / (n + 8) ||
        job->word_step > PY_SSIZE_T_MAX / 4 / in)
        return fail("bad word steps");
    /* the last row (or 8-row block) and its last word, the highest index the job reads */
    const Py_ssize_t last_row = job->mode == MODE_AWQ_GEMM ? (job->phase + n - 1) / 8 : n - 1;
    const Py_ssize_t words_per_row = job->mode == MODE_AWQ_GEMM ? in : (in * job->bits + 31) / 32;
    if (n && words->len / 4 <= last_row * job->row_step + (words_per_row - 1) * job->word_step)
        return fail("words buffer too small");
    if (zeros->len / 2 < n * job->groups) return fail("zeros buffer too small");
    if (scales->len / 4 < n * job->groups) return fail("scales buffer too small");
    if (out->len / (job->out_half ? 2 : 4) < n * in) return fail("output buffer too small");
    if (job->g_idx) {
        if (g_idx->len / 8 < in) return fail("g_idx buffer too small");
        for (Py_ssize_t i = 0; i < in; i++)
            if (job->g_idx[i] < 0 || job->g_idx[i] >= job->groups) return fail("g_idx holds a group out of range");
    }
    return 1;
}

static PyObject *dequantize_rows(PyObject *self, PyObject *args) {
    Job job;
    Py_buffer words, zeros, scales, g_idx = {0}, out;
    PyObject *g_obj;
    (void)self;
    memset(&job, 0, sizeof job);
    if (!PyArg_ParseTuple(args, "iy*nniniy*y*nOniw*in", &job.mode, &words, &job.row_step, &job.word_step,
                          &job.bits, &job.in, &job.phase, &zeros, &scales, &job.groups, &g_obj, &job.group_size,
                          &job.rounding, &out, &job.out_half, &job.n_rows))
        return NULL;
    PyObject *result = NULL;
    int have_g = g_obj != Py_None;
    if (have_g && PyObject_GetBuffer(g_obj, &g_idx, PyBUF_C_CONTIGUOUS) < 0) {
        have_g = -1;
    } else {
        job.words = (const uint32_t *)words.buf;
        job.zeros = (const int16_t *)zeros.buf;
        job.scales = (const float *)scales.buf;
        job.g_idx = have_g ? (const int64_t *)g_idx.buf : NULL;
        job.out = out.buf;
        job.out_half = job.out_half != 0;
        if (check(&job, &words, &zeros, &scales, &g_idx, &out)) {
            const Py_ssize_t entries = job.groups << job.bits;
            uint32_t *table = NULL;
            /* a table pays off when a row has more values than (groups x 2^bits) possible ones */
            if (entries <= job.in && !(table = malloc((size_t)entries * sizeof *table))) {
                PyErr_NoMemory();
            } else {
                Py_BEGIN_ALLOW_THREADS
                run(&job, table);
                Py_END_ALLOW_THREADS
                free(table);
                result = Py_None;
                Py_INCREF(result);
            }
        }
    }
    if (have_g == 1) PyBuffer_Release(&g_idx);
    PyBuffer_Release(&words);
    PyBuffer_Release(&zeros);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *convert(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int rounding, out_half;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*ii", &src, &dst, &rounding, &out_half)) return NULL;
    PyObject *result = NULL;
    const Py_ssize_t n = src.len / 4;
    if (rounding < ROUND_NONE || rounding > ROUND_BF16) {
        PyErr_SetString(PyExc_ValueError, "unknown rounding");
    } else if (dst.len / (out_half ? 2 : 4) < n) {
        PyErr_SetString(PyExc_ValueError, "output buffer too small");
    } else {
        const float *x = (const float *)src.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) store(dst.buf, i, finish(x[i], rounding, out_half != 0), out_half != 0);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyObject *scaled_rows(PyObject *self, PyObject *args) {
    Py_buffer codes, table, scales, srows, zeros = {0}, out;
    Py_ssize_t width, groups, bw, n;
    PyObject *z_obj;
    int out_half;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*ny*y*nnOw*in", &codes, &table, &width, &scales, &srows, &groups, &bw,
                          &z_obj, &out, &out_half, &n))
        return NULL;
    PyObject *result = NULL;
    int have_z = z_obj != Py_None;
    if (have_z && PyObject_GetBuffer(z_obj, &zeros, PyBUF_C_CONTIGUOUS) < 0) {
        have_z = -1;
    } else if (width <= 0 || groups <= 0 || bw <= 0 || n < 0 || groups > (width + bw - 1) / bw
               || groups * bw < width) {
        PyErr_SetString(PyExc_ValueError, "block geometry does not fit the row width");
    } else if (table.len != 256 * 4 || codes.len < n * width || srows.len / 8 < n
               || out.len / (out_half ? 2 : 4) < n * width || (have_z && zeros.len != scales.len)) {
        PyErr_SetString(PyExc_ValueError, "a buffer is too small for the rows");
    } else {
        const Py_ssize_t rows_of_scales = scales.len / 4 / groups;
        const int64_t *sr = (const int64_t *)srows.buf;
        int ok = 1;
        for (Py_ssize_t r = 0; r < n; r++)
            if (sr[r] < 0 || sr[r] >= rows_of_scales) ok = 0;
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "a scale row is out of range");
        } else {
            const uint8_t *c = (const uint8_t *)codes.buf;
            const float *t = (const float *)table.buf, *s = (const float *)scales.buf;
            const float *z = have_z ? (const float *)zeros.buf : NULL;
            const int out_type = out_half ? ROW_OUT_F16 : ROW_OUT_F32, item = out_half ? 2 : 4;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t r = 0; r < n; r++)
                scaled_row(c + r * width, t, s + sr[r] * groups, z ? z + sr[r] * groups : NULL, width, bw,
                           (char *)out.buf + r * width * item, out_type);
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    if (have_z == 1) PyBuffer_Release(&zeros);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&table);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&srows);
    PyBuffer_Release(&out);
    return result;
}

/* Rows of E2M1 nibbles (two a byte, low first) times a float32 scale per group of `group` values:
 * value j of row r is pairs[2 * byte + j % 2] * scales[r * scale_step + j / group], where byte is
 * codes[r * code_step + j / 2] (a row's bytes may lie apart: gpt-oss' block columns). Values [first,
 * first + width) of each row are written, row by row (out[r * width + j - first]: contiguous rows of whole
 * groups only, which are one flat run of nibbles computed by nibble_pairs.h, the home of that product for
 * every C path) or, with `transpose`, as the columns of the output (out[(j - first) * n + r]: gpt-oss' view is the stored matrices transposed, and
 * a read that cuts a 32-row block column decodes only the view rows it serves, starting inside the block at
 * any nibble; output rows `out_step` apart, so that ranges of stored rows are decoded by calls of their own,
 * on several cores, into one output). The pairs table already holds each nibble's float32 value (or twice it), so the one multiply
 * per value is the numpy path's.
 *
 * Speed: each group's scale is loaded once and its values are a branch-free loop of table loads and
 * multiplies (no division per value, the output type and direction chosen once per call; an odd first or
 * last value of a span is the only one taken alone). Transposed, see fp4_quads and fp4_columns. */
enum { FP4_RB = 32, FP4_CB = 128, FP4_AHEAD = 16 };
#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#define FP4_SSE 1
#else
#define FP4_SSE 0
#endif
#if defined(__GNUC__)
#define FP4_PREFETCH(p) __builtin_prefetch(p)
#else
#define FP4_PREFETCH(p) ((void)(p))
#endif

typedef struct {
    const uint8_t *codes;
    const float *pairs, *scales;
    Py_ssize_t code_step, scale_step, first, width, group, n, out_step;
} Fp4Job;

/* Transposed, a stored row's values go to as many output rows, a cache line of codes and one of scales
 * per view row's worth: the rows FP4_AHEAD on are fetched while this one decodes (their lines are far
 * apart, beyond what the hardware prefetchers follow). b0, b1: the first and last byte of the values, g0:
 * their first group (no division per row). */
ALWAYS_INLINE void fp4_fetch_row(const Fp4Job *job, Py_ssize_t r, Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t g0) {
    const uint8_t *c = job->codes + r * job->code_step;
    FP4_PREFETCH(c + b0);
    FP4_PREFETCH(c + b1);
    FP4_PREFETCH(job->scales + r * job->scale_step + g0);
}

/* Values [j0, j1) of row r (0 <= j0 <= j1, the row's own value indices) into dst[0 .. j1 - j0). */
ALWAYS_INLINE void fp4_span(const Fp4Job *job, Py_ssize_t r, Py_ssize_t j0, Py_ssize_t j1, float *restrict dst) {
    const uint8_t *row = job->codes + r * job->code_step;
    const struct nibble_scales scale = {job->scales + r * job->scale_step, job->group, 0};
    nibble_span(row + j0 / 2, j0, j1, job->pairs, &scale, dst);
}

/* The stored-row positions [lo, hi) of a band of rb rows whose first value would go to out[base]: those
 * inside [0, out_len) (a window's first and last output rows are cut, every other row is whole). */
ALWAYS_INLINE void fp4_clip(Py_ssize_t base, Py_ssize_t rb, Py_ssize_t out_len, Py_ssize_t *lo, Py_ssize_t *hi) {
    *lo = base < 0 ? -base : 0;
    *hi = out_len - base < rb ? out_len - base : rb;
}

/* Transposed: value j of stored row r goes to out[(j - first) * out_step + r + offset] when that index lies
 * in [0, out_len): an output of whole rows (offset 0), a part of one (offset: the part's first stored row),
 * or a window of the view's values cut anywhere (a read that is not whole view rows, written in place:
 * the cut rows' other values are decoded and dropped, never written). The portable way (and the last
 * n % 4 rows of fp4_quads' calls): per band of FP4_RB stored rows and FP4_CB values, the values are decoded
 * row-major into `buf`, then written out FP4_RB contiguous values per output row. */
ALWAYS_INLINE void fp4_columns(const Fp4Job *job, void *out, int half, Py_ssize_t offset, Py_ssize_t out_len) {
    float buf[FP4_RB * FP4_CB];
    const Py_ssize_t n = job->n, width = job->width, first = job->first, step = job->out_step;
    for (Py_ssize_t r0 = 0; r0 < n; r0 += FP4_RB) {
        const Py_ssize_t rb = r0 + FP4_RB < n ? FP4_RB : n - r0;
        for (Py_ssize_t j0 = 0; j0 < width; j0 += FP4_CB) {
            const Py_ssize_t cb = j0 + FP4_CB < width ? FP4_CB : width - j0, g_first = (first + j0) / job->group;
            for (Py_ssize_t i = 0; i < rb; i++) {
                if (r0 + i + FP4_AHEAD < n)
                    fp4_fetch_row(job, r0 + i + FP4_AHEAD, (first + j0) / 2, (first + j0 + cb - 1) / 2, g_first);
                fp4_span(job, r0 + i, first + j0, first + j0 + cb, buf + i * cb);
            }
            for (Py_ssize_t j = 0; j < cb; j++) {
                const Py_ssize_t base = (j0 + j) * step + r0 + offset;
                Py_ssize_t lo, hi;
                fp4_clip(base, rb, out_len, &lo, &hi);
                if (half) {
                    uint16_t *o = (uint16_t *)out + base;
                    for (Py_ssize_t i = lo; i < hi; i++) o[i] = f32_to_f16(bits_of(buf[i * cb + j]));
                } else {
                    float *o = (float *)out + base;
                    for (Py_ssize_t i = lo; i < hi; i++) o[i] = buf[i * cb + j];
                }
            }
        }
    }
}

#if FP4_SSE
/* 4 values of stored row c (j even): two bytes' pairs from the table (the bytes in one load: x86 is
 * little-endian). */
ALWAYS_INLINE __m128 fp4_four(const float *t, const uint8_t *c, Py_ssize_t j) {
    uint16_t w;
    memcpy(&w, c + j / 2, 2);
    return _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(t + 2 * (w & 255))),
                        (const __m64 *)(t + 2 * (w >> 8)));
}

/* out[base .. base + 4) = v, of which only the indices in [0, out_len) (a window's cut ends). */
ALWAYS_INLINE void fp4_put4(float *out, Py_ssize_t base, Py_ssize_t out_len, __m128 v) {
    if (base >= 0 && base + 4 <= out_len) {
        _mm_storeu_ps(out + base, v);
    } else {
        float four[4];
        _mm_storeu_ps(four, v);
        for (Py_ssize_t q = 0; q < 4; q++)
            if (base + q >= 0 && base + q < out_len) out[base + q] = four[q];
    }
}

/* Transposed float32 with SSE (fp4_columns' meaning), stored rows 4 at a time (the first n & ~3; the rest
 * go to fp4_columns): the 4 rows' values j .. j + 3 (one group's, two bytes a row: 4 vectors), times their
 * scales, are transposed in registers into the 4 output rows' values of those stored rows, one 16-byte store
 * each: no scratch, 2 table loads, 1 multiply and 1 store per 4 values. A span's odd first value, and a
 * group's last 2 or 1, go the same way with 1 or 2 of the 4 output rows stored. The same products as
 * fp4_span (the multiply is IEEE float32 either way). float16 stays with fp4_columns: its conversion, one
 * value at a time, is what costs there. */
static Py_ssize_t fp4_quads(const Fp4Job *job, float *out, Py_ssize_t offset, Py_ssize_t out_len) {
    const Py_ssize_t n = job->n & ~(Py_ssize_t)3, first = job->first, end = first + job->width;
    const Py_ssize_t step = job->out_step, group = job->group, cs = job->code_step, ss = job->scale_step;
    const float *t = job->pairs;
    const Py_ssize_t g_first = first / group;
    for (Py_ssize_t r = 0; r < n; r += 4) {
        const uint8_t *c0 = job->codes + r * cs, *c1 = c0 + cs, *c2 = c1 + cs, *c3 = c2 + cs;
        const float *s0 = job->scales + r * ss;
        for (Py_ssize_t a = r + FP4_AHEAD; a < r + FP4_AHEAD + 4 && a < job->n; a++)
            fp4_fetch_row(job, a, first / 2, (end - 1) / 2, g_first);
        for (Py_ssize_t g0 = first, g = g_first; g0 < end; g++) {
            const Py_ssize_t g1 = (g + 1) * group < end ? (g + 1) * group : end;
            const __m128 k0 = _mm_set1_ps(s0[g]), k1 = _mm_set1_ps(s0[ss + g]);
            const __m128 k2 = _mm_set1_ps(s0[2 * ss + g]), k3 = _mm_set1_ps(s0[3 * ss + g]);
            for (Py_ssize_t j = g0; j < g1;) {
                __m128 v0, v1, v2, v3;
                Py_ssize_t m;
                if ((j & 1) || j + 1 == g1) {  /* one value: a high nibble first or a low nibble last */
                    const Py_ssize_t h = j & 1;
                    v0 = _mm_load_ss(t + 2 * c0[j / 2] + h);
                    v1 = _mm_load_ss(t + 2 * c1[j / 2] + h);
                    v2 = _mm_load_ss(t + 2 * c2[j / 2] + h);
                    v3 = _mm_load_ss(t + 2 * c3[j / 2] + h);
                    m = 1;
                } else if (j + 4 <= g1) {
                    v0 = fp4_four(t, c0, j);
                    v1 = fp4_four(t, c1, j);
                    v2 = fp4_four(t, c2, j);
                    v3 = fp4_four(t, c3, j);
                    m = 4;
                } else {  /* a group's last two values */
                    v0 = _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(t + 2 * c0[j / 2]));
                    v1 = _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(t + 2 * c1[j / 2]));
                    v2 = _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(t + 2 * c2[j / 2]));
                    v3 = _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(t + 2 * c3[j / 2]));
                    m = 2;
                }
                v0 = _mm_mul_ps(v0, k0);
                v1 = _mm_mul_ps(v1, k1);
                v2 = _mm_mul_ps(v2, k2);
                v3 = _mm_mul_ps(v3, k3);
                _MM_TRANSPOSE4_PS(v0, v1, v2, v3);
                const Py_ssize_t base = (j - first) * step + r + offset;
                fp4_put4(out, base, out_len, v0);
                if (m > 1) fp4_put4(out, base + step, out_len, v1);
                if (m > 2) {
                    fp4_put4(out, base + 2 * step, out_len, v2);
                    fp4_put4(out, base + 3 * step, out_len, v3);
                }
                j += m;
            }
            g0 = g1;
        }
    }
    return n;
}
#endif

static void fp4_run(const Fp4Job *job, void *out, int half, int transpose, Py_ssize_t offset, Py_ssize_t out_len) {
    if (transpose) {
        Py_ssize_t done = 0;
#if FP4_SSE
        if (!half) done = fp4_quads(job, (float *)out, offset, out_len);
#endif
        if (done < job->n) {  /* the rows fp4_quads leaves (all of them without SSE, or for float16) */
            Fp4Job rest = *job;
            rest.codes += done * job->code_step;
            rest.scales += done * job->scale_step;
            rest.n -= done;
            if (half) fp4_columns(&rest, out, 1, offset + done, out_len);
            else fp4_columns(&rest, out, 0, offset + done, out_len);
        }
    } else {  /* contiguous rows (fp4_rows checks it): one flat run of nibbles, nibble_pairs.h */
        const struct nibble_scales scale = {job->scales, job->group, 0};
        paired_nibbles(job->codes, 0, job->n * job->width, job->pairs, &scale, out, half ? ROW_OUT_F16 : ROW_OUT_F32);
    }
}

static PyObject *fp4_rows(PyObject *self, PyObject *args) {
    Py_buffer codes, pairs, scales, out;
    Py_ssize_t code_step, scale_step, first, width, group, n, out_step, offset;
    int out_half, transpose;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*y*nnnnw*inpnn", &codes, &code_step, &pairs, &scales, &scale_step, &first,
                          &width, &group, &out, &out_half, &n, &transpose, &out_step, &offset))
        return NULL;
    PyObject *result = NULL;
    /* the bytes and groups a row's values [first, first + width) lie in; the values out must hold: n rows of
     * `width` (transposed, every write is clipped to out instead: `width` output rows `out_step` apart, the
     * part's rows at columns offset .. offset + n of them, of which out may hold any window) */
    const Py_ssize_t bytes = (first + width + 1) / 2, groups = group > 0 ? (first + width + group - 1) / group : 0;
    const Py_ssize_t needed = transpose ? 0 : n * width, out_len = out.len / (out_half ? 2 : 4);
    if (width <= 0 || first < 0 || group <= 0 || group % 2 || n < 0 || code_step < bytes || scale_step < groups
        || (transpose && out_step < n)
        || (!transpose && (first || width % 2 || code_step * 2 != width || scale_step * group != width))) {
        PyErr_SetString(PyExc_ValueError, "row geometry does not fit");
    } else if (pairs.len != 512 * 4 || (n && (codes.len < (n - 1) * code_step + bytes
               || scales.len / 4 < (n - 1) * scale_step + groups || out_len < needed))) {
        PyErr_SetString(PyExc_ValueError, "a buffer is too small for the rows");
    } else {
        const Fp4Job job = {(const uint8_t *)codes.buf, (const float *)pairs.buf, (const float *)scales.buf,
                            code_step, scale_step, first, width, group, n, out_step};
        Py_BEGIN_ALLOW_THREADS
        fp4_run(&job, out.buf, out_half != 0, transpose, offset, out_len);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&codes);
    PyBuffer_Release(&pairs);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef METHODS[] = {
    {"fp4_rows", fp4_rows, METH_VARARGS,
     "fp4_rows(codes, code_step, pairs, scales, scale_step, first, width, group, out, out_half, n_rows, "
     "transpose, out_step, offset): values [first, first + width) of rows of E2M1 nibbles times a scale per group "
     "into out (or, transposed, its columns: value j of row r at out[(j - first) * out_step + r + offset] where "
     "that lies inside out)."},
    {"scaled_rows", scaled_rows, METH_VARARGS,
     "scaled_rows(codes, table, width, scales, scale_rows, groups, block_width, zeros, out, out_half, n_rows): "
     "rows of a scaled-codes weight (FP8, int8) into out."},
    {"dequantize_rows", dequantize_rows, METH_VARARGS,
     "dequantize_rows(mode, words, row_step, word_step, bits, in_features, phase, zeros, scales, groups, "
     "g_idx, group_size, rounding, out, out_half, n_rows): decode n_rows rows of a packed weight into out."},
    {"convert", convert, METH_VARARGS,
     "convert(src_float32, dst, rounding, out_half): the kernel's per-value rounding and output conversion."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&MODULE); }
