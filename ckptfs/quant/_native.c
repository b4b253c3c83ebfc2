/*
 * Optional C kernels for the hottest GGML block types (legacy Q4_0..Q8_1, the K-quants, TQ1_0/TQ2_0) and
 * for BF16 -> float32.
 *
 * Why: the numpy decoders spend most of their time in per-block bookkeeping (numpy iterates 16- to
 * 64-element inner loops once per block) and in extra passes over the float32 output; one pass in C writes
 * each output value once. Results must be bit-identical to the numpy path (ckptfs/quant/legacy.py, kquants.py,
 * ternary.py, floats.py), which stays the reference and the fallback: every value is computed in float32 in the
 * same order (integer code -> float, then `scale * q`, then `- min` / `+ m`), and the module must be compiled
 * with -ffp-contract=off so that no multiply-add is fused into one rounding.
 *
 * Interface: dequantize(type_name: str, src: bytes-like, dst: writable float32 buffer, n_blocks: int).
 * The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "float_bits.h"

/* IEEE half -> float, exact for every pattern (subnormals normalized; inf/NaN keep sign and payload). */
static inline float half_to_float(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        uint32_t e = 113u;
        while (!(man & 0x400u)) { man <<= 1; e--; }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float float_at(const uint8_t *p) {
    uint32_t bits = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- legacy 32-element blocks ---- */

static void q4_0(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 18, y += 32) {
        const float d = half_to_float(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 15) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_1(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 20, y += 32) {
        const float d = half_to_float(x), m = half_to_float(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(qs[j] & 15) * d + m;
            y[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

/* Bit k of byte b, moved to bit 4 of byte k: the Q5 fifth bits of 8 elements in one copy (built at import). */
static uint8_t FIFTH_BITS[256][8];

static void init_fifth_bits(void) {
    for (int b = 0; b < 256; b++)
        for (int k = 0; k < 8; k++) FIFTH_BITS[b][k] = (uint8_t)(((b >> k) & 1) << 4);
}

/* Bit 4 of Q5 element E (0..31) is bit E of the little-endian u32 qh = bit E%8 of byte E/8. */
static inline void fifth_bits(const uint8_t *restrict qh, uint8_t *restrict high) {
    for (int m = 0; m < 4; m++) memcpy(high + 8 * m, FIFTH_BITS[qh[m]], 8);
}

static void q5_0(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    uint8_t high[32];
    for (Py_ssize_t i = 0; i < nb; i++, x += 22, y += 32) {
        const float d = half_to_float(x);
        const uint8_t *qs = x + 6;
        fifth_bits(x + 2, high);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(((qs[j] & 15) | high[j]) - 16) * d;
            y[j + 16] = (float)(((qs[j] >> 4) | high[j + 16]) - 16) * d;
        }
    }
}

static void q5_1(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    uint8_t high[32];
    for (Py_ssize_t i = 0; i < nb; i++, x += 24, y += 32) {
        const float d = half_to_float(x), m = half_to_float(x + 2);
        const uint8_t *qs = x + 8;
        fifth_bits(x + 4, high);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 15) | high[j]) * d + m;
            y[j + 16] = (float)((qs[j] >> 4) | high[j + 16]) * d + m;
        }
    }
}

static inline void q8_block(const uint8_t *restrict qs, float d, float *restrict y, int count) {
    for (int j = 0; j < count; j++) y[j] = (float)(int8_t)qs[j] * d;
}

static void q8_0(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 34, y += 32) q8_block(x + 2, half_to_float(x), y, 32);
}

static void q8_1(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 36, y += 32) q8_block(x + 4, half_to_float(x), y, 32);
}

/* ---- K-quants: 256-element super-blocks ---- */

static void q2_k(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 84, y += 256) {
        const uint8_t *scales = x, *qs = x + 16;
        const float d = half_to_float(x + 80), dmin = half_to_float(x + 82);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 2; k++) {
                    const uint8_t s = scales[8 * h + 2 * j + k];
                    const float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
                    const uint8_t *q = qs + 32 * h + 16 * k;
                    float *out = y + 128 * h + 32 * j + 16 * k;
                    for (int l = 0; l < 16; l++) out[l] = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
                }
    }
}

static void q3_k(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 110, y += 256) {
        const uint8_t *hmask = x, *qs = x + 32, *sc = x + 96;
        const float d = half_to_float(x + 108);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 2; k++) {
                    const int s = 8 * h + 2 * j + k;
                    const int six = ((sc[s % 8] >> (4 * (s / 8))) & 15) | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4);
                    const float dl = d * (float)(six - 32);
                    const uint8_t *q = qs + 32 * h + 16 * k, *hm = hmask + 16 * k;
                    float *out = y + 128 * h + 32 * j + 16 * k;
                    for (int l = 0; l < 16; l++) {
                        const int low = (q[l] >> (2 * j)) & 3;
                        const int hb = (hm[l] >> (4 * h + j)) & 1;
                        out[l] = dl * (float)(low - (hb ? 0 : 4));
                    }
                }
    }
}

/* ggml's get_scale_min_k4 for sub-block j of the 12 packed scale bytes. */
static inline void scale_min_k4(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void q4_k(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 144, y += 256) {
        const float d = half_to_float(x), dmin = half_to_float(x + 2);
        const uint8_t *scales = x + 4, *qs = x + 16;
        for (int c = 0; c < 4; c++)
            for (int t = 0; t < 2; t++) {
                int sc, mn;
                scale_min_k4(2 * c + t, scales, &sc, &mn);
                const float d1 = d * (float)sc, m1 = dmin * (float)mn;
                const uint8_t *q = qs + 32 * c;
                float *out = y + 64 * c + 32 * t;
                for (int l = 0; l < 32; l++) out[l] = d1 * (float)((q[l] >> (4 * t)) & 15) - m1;
            }
    }
}

static void q5_k(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 176, y += 256) {
        const float d = half_to_float(x), dmin = half_to_float(x + 2);
        const uint8_t *scales = x + 4, *qh = x + 16, *qs = x + 48;
        for (int c = 0; c < 4; c++)
            for (int t = 0; t < 2; t++) {
                int sc, mn;
                scale_min_k4(2 * c + t, scales, &sc, &mn);
                const float d1 = d * (float)sc, m1 = dmin * (float)mn;
                const uint8_t *q = qs + 32 * c;
                const int bit = 2 * c + t;
                float *out = y + 64 * c + 32 * t;
                for (int l = 0; l < 32; l++) {
                    const int v = ((q[l] >> (4 * t)) & 15) | (((qh[l] >> bit) & 1) << 4);
                    out[l] = d1 * (float)v - m1;
                }
            }
    }
}

static void q6_k(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 210, y += 256) {
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *scales = (const int8_t *)(x + 192);
        const float d = half_to_float(x + 208);
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < 4; r++) {
                const uint8_t *lo = ql + 64 * h + 32 * (r & 1), *hi = qh + 32 * h;
                const int shift = 4 * (r >> 1);
                float *out = y + 128 * h + 32 * r;
                for (int half = 0; half < 2; half++) {
                    const float s = d * (float)scales[8 * h + 2 * r + half];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        const int q = (((lo[l] >> shift) & 15) | (((hi[l] >> (2 * r)) & 3) << 4)) - 32;
                        out[l] = s * (float)q;
                    }
                }
            }
    }
}

static void q8_k(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 292, y += 256) q8_block(x + 4, float_at(x), y, 256);
}

/* ---- ternary types (docs/block-formats.md: y = (t - 1) * d, the small integer converted first) ---- */

/* Trit n of a TQ1_0 byte b: ((b * 3^n mod 256) * 3) >> 8, i.e. 0, 1, 2. */
static inline int trit(uint8_t b, uint8_t pow3) {
    const uint8_t scaled = (uint8_t)(b * pow3);
    return ((int)scaled * 3) >> 8;
}

static const uint8_t POW3[5] = {1, 3, 9, 27, 81};

/* Elements 32n + m: trit n of qs[m] (m < 32); 160 + 16n + m: trit n of qs[32 + m]; 240 + 4n + m: of qh[m]. */
static void tq1_0(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 54, y += 256) {
        const uint8_t *qs = x, *qh = x + 48;
        const float d = half_to_float(x + 52);
        for (int n = 0; n < 5; n++) {
            const uint8_t p = POW3[n];
            float *out = y + 32 * n;
            for (int m = 0; m < 32; m++) out[m] = (float)(trit(qs[m], p) - 1) * d;
        }
        for (int n = 0; n < 5; n++) {
            const uint8_t p = POW3[n];
            float *out = y + 160 + 16 * n;
            for (int m = 0; m < 16; m++) out[m] = (float)(trit(qs[32 + m], p) - 1) * d;
        }
        for (int n = 0; n < 4; n++) {
            const uint8_t p = POW3[n];
            float *out = y + 240 + 4 * n;
            for (int m = 0; m < 4; m++) out[m] = (float)(trit(qh[m], p) - 1) * d;
        }
    }
}

/* Element 128g + 32l + m: q = (qs[32g + m] >> 2l) & 3. */
static void tq2_0(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    for (Py_ssize_t i = 0; i < nb; i++, x += 66, y += 256) {
        const float d = half_to_float(x + 64);
        for (int g = 0; g < 2; g++)
            for (int l = 0; l < 4; l++) {
                const uint8_t *qs = x + 32 * g;
                float *out = y + 128 * g + 32 * l;
                for (int m = 0; m < 32; m++) out[m] = (float)(((qs[m] >> (2 * l)) & 3) - 1) * d;
            }
    }
}

/* ---- bfloat16: the top half of a float32 (one "block" per value) ---- */

static void bf16(const uint8_t *restrict x, float *restrict y, Py_ssize_t nb) {
    Py_ssize_t i = 0;
    for (; i + 16 <= nb; i += 16)                   /* a fixed-length inner loop: gcc -O2 vectorizes it */
        for (int k = 0; k < 16; k++) {
            const uint32_t bits = ((uint32_t)x[2 * (i + k)] | ((uint32_t)x[2 * (i + k) + 1] << 8)) << 16;
            memcpy(y + i + k, &bits, sizeof bits);
        }
    for (; i < nb; i++) {
        const uint32_t bits = ((uint32_t)x[2 * i] | ((uint32_t)x[2 * i + 1] << 8)) << 16;
        memcpy(y + i, &bits, sizeof bits);
    }
}

typedef void (*kernel_fn)(const uint8_t *, float *, Py_ssize_t);

static const struct {
    const char *name;
    Py_ssize_t block_bytes, block_elements;
    kernel_fn fn;
} KERNELS[] = {
    {"Q4_0", 18, 32, q4_0}, {"Q4_1", 20, 32, q4_1}, {"Q5_0", 22, 32, q5_0}, {"Q5_1", 24, 32, q5_1},
    {"Q8_0", 34, 32, q8_0}, {"Q8_1", 36, 32, q8_1},
    {"Q2_K", 84, 256, q2_k}, {"Q3_K", 110, 256, q3_k}, {"Q4_K", 144, 256, q4_k}, {"Q5_K", 176, 256, q5_k},
    {"Q6_K", 210, 256, q6_k}, {"Q8_K", 292, 256, q8_k},
    {"TQ1_0", 54, 256, tq1_0}, {"TQ2_0", 66, 256, tq2_0}, {"BF16", 2, 1, bf16},
};
#define N_KERNELS (sizeof KERNELS / sizeof KERNELS[0])

static PyObject *dequantize(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer src, dst;
    Py_ssize_t nb;
    (void)self;
    if (!PyArg_ParseTuple(args, "sy*w*n", &name, &src, &dst, &nb)) return NULL;
    PyObject *result = NULL;
    size_t k = 0;
    while (k < N_KERNELS && strcmp(KERNELS[k].name, name) != 0) k++;
    if (k == N_KERNELS) {
        PyErr_Format(PyExc_KeyError, "no native kernel for %s", name);
    } else if (nb < 0 || src.len < nb * KERNELS[k].block_bytes ||
               dst.len < nb * KERNELS[k].block_elements * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "buffer too small for the number of blocks");
    } else {
        Py_BEGIN_ALLOW_THREADS
        KERNELS[k].fn((const uint8_t *)src.buf, (float *)dst.buf, nb);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* ---- float32 -> bfloat16 bits, rounded to nearest even; NaN -> 0xFFFF (what torch writes on CPU) ---- */

static void to_bf16(const uint32_t *restrict x, uint16_t *restrict y, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)                    /* fixed-length inner loop: vectorized at -O2 */
        for (int k = 0; k < 16; k++) y[i + k] = f32_to_bf16(x[i + k]);
    for (; i < n; i++) y[i] = f32_to_bf16(x[i]);
}

static PyObject *encode_bf16(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*n", &src, &dst, &n)) return NULL;
    PyObject *result = NULL;
    if (n < 0 || src.len < n * 4 || dst.len < n * 2) {
        PyErr_SetString(PyExc_ValueError, "buffer too small for the number of values");
    } else {
        Py_BEGIN_ALLOW_THREADS
        to_bf16((const uint32_t *)src.buf, (uint16_t *)dst.buf, n);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyObject *types(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    PyObject *out = PyTuple_New(N_KERNELS);
    if (!out) return NULL;
    for (size_t k = 0; k < N_KERNELS; k++) {
        PyObject *s = PyUnicode_FromString(KERNELS[k].name);
        if (!s) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, k, s);
    }
    return out;
}

static PyMethodDef METHODS[] = {
    {"dequantize", dequantize, METH_VARARGS,
     "dequantize(type_name, src, dst, n_blocks): decode n_blocks little-endian blocks into float32 dst."},
    {"types", types, METH_NOARGS, "Names of the storage types with a native kernel."},
    {"encode_bf16", encode_bf16, METH_VARARGS,
     "encode_bf16(src, dst, n): n float32 values of src as bfloat16 bits into dst (nearest even; NaN 0xFFFF)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    init_fifth_bits();
    return PyModule_Create(&MODULE);
}
