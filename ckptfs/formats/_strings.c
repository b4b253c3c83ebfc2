/* The hot loop of opening a GGUF with a big vocabulary, in C (formats/gguf_values.py, ValueWalker.skip_strings).

   A GGUF string array is a run of (u64 length, bytes) pairs; only the lengths are read to find where it
   ends. A vocabulary of a quarter million tokens takes the Python loop far longer than this walk, which runs
   without the GIL for a long array (a prefetch's fetch threads go on meanwhile).

   skip(data, pos, count, big_endian) -> (pos, done): walks at most `count` strings from `pos` and stops
   early, before a string whose length field does not lie entirely within `data` (the caller loads more of
   the file, or reports a truncated one) or whose end would pass 2^62 (no file is that large: the caller
   reports it as running past the end). `done` strings were skipped; `pos` is where the next one starts. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LIMIT ((uint64_t)1 << 62)

static uint64_t load_u64(const unsigned char *p, int big_endian) {
    uint64_t v = 0;
    if (big_endian) {
        for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    } else {
        for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    }
    return v;
}

static PyObject *skip(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned long long pos, count;
    int big_endian;
    if (!PyArg_ParseTuple(args, "y*KKp", &view, &pos, &count, &big_endian)) return NULL;
    const unsigned char *data = view.buf;
    uint64_t n = (uint64_t)view.len, at = pos, done = 0;
    PyThreadState *saved = count > 4096 ? PyEval_SaveThread() : NULL;  /* a vocabulary, not a few names */
    while (done < count && at <= LIMIT && n >= 8 && at <= n - 8) {
        uint64_t length = load_u64(data + at, big_endian);
        if (length > LIMIT - at) break;  /* ends past any file */
        at += 8 + length;
        done++;
    }
    if (saved != NULL) PyEval_RestoreThread(saved);
    PyBuffer_Release(&view);
    return Py_BuildValue("KK", (unsigned long long)at, (unsigned long long)done);
}

static PyMethodDef methods[] = {
    {"skip", skip, METH_VARARGS, "skip(data, pos, count, big_endian) -> (pos, done)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_strings", NULL, -1, methods};

PyMODINIT_FUNC PyInit__strings(void) { return PyModule_Create(&module); }
