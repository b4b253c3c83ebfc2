/* Hand a folder's names to libfuse's readdir filler in one C loop.
 *
 * libfuse's high-level readdir asks for every name of a folder through a filler callback; from Python each
 * call is a ctypes foreign call (about 5 us), so listing a folder of 282,000 names (a 94k-tensor checkpoint)
 * cost over a second per `ls`. fill(filler_address, buf_address, names, libfuse_major) walks a bytes object
 * of NUL-terminated names and calls the filler directly: for libfuse 3
 * int filler(void *buf, const char *name, const struct stat *st, off_t off, enum fuse_fill_dir_flags flags),
 * for libfuse 2 the same without flags. Returns how many names were handed over (the filler may stop early
 * when libfuse's buffer is full). The GIL is held: the filler only copies into libfuse's buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

typedef int (*filler3_t)(void *, const char *, const void *, off_t, int);
typedef int (*filler2_t)(void *, const char *, const void *, off_t);

static PyObject *fill(PyObject *self, PyObject *args) {
    unsigned long long filler_address, buf_address;
    const char *names;
    Py_ssize_t length;
    int major;
    if (!PyArg_ParseTuple(args, "KKy#i", &filler_address, &buf_address, &names, &length, &major))
        return NULL;
    void *buf = (void *)(uintptr_t)buf_address;
    Py_ssize_t count = 0, at = 0;
    while (at < length) {
        const char *name = names + at;
        size_t n = strnlen(name, (size_t)(length - at));
        if (at + (Py_ssize_t)n >= length)  /* the last name must be NUL-terminated too */
            break;
        int full = major == 3 ? ((filler3_t)(uintptr_t)filler_address)(buf, name, NULL, 0, 0)
                              : ((filler2_t)(uintptr_t)filler_address)(buf, name, NULL, 0);
        if (full)
            break;
        count++;
        at += (Py_ssize_t)n + 1;
    }
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS, "fill(filler_address, buf_address, names, libfuse_major) -> names handed over"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_listing", NULL, -1, methods};

PyMODINIT_FUNC PyInit__listing(void) { return PyModule_Create(&module); }
