/* Hand a folder's names to libfuse's readdir filler in one C loop.
 *
 * libfuse's high-level readdir asks for every name of a folder through a filler callback; from Python each
 * call is a ctypes foreign call (about 5 us), so listing a folder of 282,000 names (a 94k-tensor checkpoint)
 * cost over a second per `ls`. Here a bytes object of NUL-terminated names is walked in C and the filler
 * called directly: for libfuse 3
 * int filler(void *buf, const char *name, const struct stat *st, off_t off, enum fuse_fill_dir_flags flags),
 * for libfuse 2 the same without flags. The GIL is held: the filler only copies into libfuse's buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

typedef int (*filler3_t)(void *, const char *, const void *, off_t, int);
typedef int (*filler2_t)(void *, const char *, const void *, off_t);

/* fill_from(filler_address, buf_address, names, libfuse_major, start) -> where the next call starts.
 *
 * The same walk in libfuse's offset mode: each name is handed over with the byte position of the next one
 * as its offset, starting at byte `start` of `names`, until libfuse's reply buffer is full (the filler
 * returns nonzero: that name was not added and is where the next READDIR starts). libfuse then asks again
 * with that offset instead of keeping one allocation per entry of the whole folder. */
static PyObject *fill_from(PyObject *self, PyObject *args) {
    unsigned long long filler_address, buf_address;
    const char *names;
    Py_ssize_t length, start;
    int major;
    if (!PyArg_ParseTuple(args, "KKy#in", &filler_address, &buf_address, &names, &length, &major, &start))
        return NULL;
    void *buf = (void *)(uintptr_t)buf_address;
    Py_ssize_t at = start < 0 ? 0 : start;
    while (at < length) {
        const char *name = names + at;
        size_t n = strnlen(name, (size_t)(length - at));
        if (at + (Py_ssize_t)n >= length)
            break;
        off_t next = (off_t)(at + (Py_ssize_t)n + 1);
        int full = major == 3 ? ((filler3_t)(uintptr_t)filler_address)(buf, name, NULL, next, 0)
                              : ((filler2_t)(uintptr_t)filler_address)(buf, name, NULL, next);
        if (full)
            break;
        at = (Py_ssize_t)next;
    }
    return PyLong_FromSsize_t(at);
}

static PyMethodDef methods[] = {
    {"fill_from", fill_from, METH_VARARGS,
     "fill_from(filler_address, buf_address, names, libfuse_major, start) -> where the next call starts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_listing", NULL, -1, methods};

PyMODINIT_FUNC PyInit__listing(void) { return PyModule_Create(&module); }
