/*
 * Optional C kernel for bitsandbytes views (packed/bnb.py): NF4/FP4 blocks and LLM.int8 rows decoded in one
 * pass straight into the caller's float32 buffer.
 *
 * Why: the numpy path makes a lookup pass, a scaling pass and a copy over every tile (slower than the mount's
 * stream of the stored codes: docs/performance.md); here each value is written once.
 * Results are bit-identical to the numpy path, which stays the reference and the fallback:
 *
 * - 4-bit: value = table[code] * absmax[block] in float32. With double quantization the block scale is
 *   decoded here as bitsandbytes computes it: absmax = nested_map[absmax_code] * nested_absmax[block /
 *   nested_blocksize], then + offset (two float32 roundings: no fused multiply-add). The codes are read high
 *   nibble first, two a byte, by quant/nibble_pairs.h (the one home of that product, which a mount's reads
 *   in C compute with too).
 * - LLM.int8: value = ((float)w * scb[row]) * 7.874015718698502e-3f, two float32 multiplies in that order.
 *
 * Built with -ffp-contract=off (no fused multiply-add may merge the int8 path's two products). The GIL is
 * released while decoding; every index is checked against the buffers before anything is read or written.
 *
 * Interface: dequantize_4bit(codes, table, absmax, blocksize, skip, count, out, nested_map, nested_absmax,
 * nested_blocksize, first_block, offset): elements [skip, skip + count) of the run of blocks that `codes`
 * starts (element j in nibble j of the bytes, high first; block j / blocksize scaled by absmax[j / blocksize])
 * into out[0, count). absmax is float32, or with nested_map (not None) uint8 codes of the blocks from
 * first_block on. dequantize_int8(weights, scb, rows, in_features, out).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../quant/nibble_pairs.h"

static const float INT8_RECIPROCAL = 7.874015718698502e-3f; /* bitsandbytes' 1/127 constant as float32 */

static int fail(const char *message) {
    PyErr_SetString(PyExc_ValueError, message);
    return 0;
}

typedef struct {
    const float *map, *absmax;      /* NULL map: the block scales are float32 */
    Py_ssize_t blocksize, first;
    float offset;
} Nested;

static void run_4bit(const uint8_t *codes, const float *table, const void *absmax, Py_ssize_t blocksize,
                     Py_ssize_t skip, Py_ssize_t count, float *out, const Nested *nested) {
    const Py_ssize_t end = skip + count;
    float pairs[512];  /* each byte's two values, high nibble first */
    for (int b = 0; b < 256; b++) {
        pairs[2 * b] = table[b >> 4];
        pairs[2 * b + 1] = table[b & 15];
    }
    for (Py_ssize_t k = skip / blocksize; k * blocksize < end; k++) {
        float a;
        if (nested->map) {
            const float scaled = nested->map[((const uint8_t *)absmax)[k]] *
                                 nested->absmax[(nested->first + k) / nested->blocksize];
            a = scaled + nested->offset;
        } else {
            a = ((const float *)absmax)[k];
        }
        const Py_ssize_t j = k * blocksize > skip ? k * blocksize : skip;
        const Py_ssize_t hi = (k + 1) * blocksize < end ? (k + 1) * blocksize : end;
        const struct nibble_scales scale = {&a, blocksize, k};
        paired_nibbles(codes + j / 2, j, hi, pairs, &scale, out + (j - skip), ROW_OUT_F32);
    }
}

static PyObject *dequantize_4bit(PyObject *self, PyObject *args) {
    Py_buffer codes, table, absmax, out, map = {0}, nested_absmax = {0};
    PyObject *map_obj, *nested_obj;
    Py_ssize_t blocksize, skip, count;
    Nested nested = {0};
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*nnnw*OOnnf", &codes, &table, &absmax, &blocksize, &skip, &count, &out,
                          &map_obj, &nested_obj, &nested.blocksize, &nested.first, &nested.offset))
        return NULL;
    PyObject *result = NULL;
    int ok = 1, have_map = 0, have_nested = 0;
    if (map_obj != Py_None) {
        if (PyObject_GetBuffer(map_obj, &map, PyBUF_C_CONTIGUOUS) < 0) ok = 0;
        else have_map = 1;
        if (ok && PyObject_GetBuffer(nested_obj, &nested_absmax, PyBUF_C_CONTIGUOUS) < 0) ok = 0;
        else if (ok) have_nested = 1;
    }
    const Py_ssize_t last_block = count && blocksize > 0 ? (skip + count - 1) / blocksize : 0;
    if (ok) {
        if (blocksize <= 0 || skip < 0 || count < 0) ok = fail("negative or empty geometry");
        else if (skip > PY_SSIZE_T_MAX / 2 - count) ok = fail("range too large");
        else if (table.len < 16 * 4) ok = fail("table buffer too small");
        else if (count && codes.len <= (skip + count - 1) / 2) ok = fail("codes buffer too small");
        else if (count && absmax.len / (have_map ? 1 : 4) <= last_block) ok = fail("absmax buffer too small");
        else if (out.len / 4 < count) ok = fail("output buffer too small");
        else if (have_map && (map.len < 256 * 4 || nested.blocksize <= 0 || nested.first < 0 ||
                              nested.first > PY_SSIZE_T_MAX / 2 - last_block ||
                              (count && nested_absmax.len / 4 <= (nested.first + last_block) / nested.blocksize)))
            ok = fail("nested scales do not cover the blocks");
    }
    if (ok) {
        nested.map = have_map ? (const float *)map.buf : NULL;
        nested.absmax = have_map ? (const float *)nested_absmax.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        if (count) run_4bit((const uint8_t *)codes.buf, (const float *)table.buf, absmax.buf, blocksize, skip,
                            count, (float *)out.buf, &nested);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    if (have_map) PyBuffer_Release(&map);
    if (have_nested) PyBuffer_Release(&nested_absmax);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&table);
    PyBuffer_Release(&absmax);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *dequantize_int8(PyObject *self, PyObject *args) {
    Py_buffer weights, scb, out;
    Py_ssize_t rows, in;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*nnw*", &weights, &scb, &rows, &in, &out)) return NULL;
    PyObject *result = NULL;
    int ok = 1;
    if (rows < 0 || in <= 0 || rows > PY_SSIZE_T_MAX / 4 / in) ok = fail("negative, empty or too large shape");
    else if (weights.len < rows * in) ok = fail("weights buffer too small");
    else if (scb.len / 4 < rows) ok = fail("SCB buffer too small");
    else if (out.len / 4 < rows * in) ok = fail("output buffer too small");
    if (ok) {
        const int8_t *w = (const int8_t *)weights.buf;
        const float *s = (const float *)scb.buf;
        float *o = (float *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < rows; r++) {
            const float scale = s[r];
            for (Py_ssize_t i = 0; i < in; i++) {
                const float scaled = (float)w[r * in + i] * scale;
                o[r * in + i] = scaled * INT8_RECIPROCAL;
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&weights);
    PyBuffer_Release(&scb);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef METHODS[] = {
    {"dequantize_4bit", dequantize_4bit, METH_VARARGS,
     "dequantize_4bit(codes, table, absmax, blocksize, skip, count, out, nested_map, nested_absmax, "
     "nested_blocksize, first_block, offset): NF4/FP4 elements into float32 out."},
    {"dequantize_int8", dequantize_int8, METH_VARARGS,
     "dequantize_int8(weights, scb, rows, in_features, out): LLM.int8 rows into float32 out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_bnb", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__bnb(void) { return PyModule_Create(&MODULE); }
