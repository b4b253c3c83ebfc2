/* The served checksums of Python's reads of local files (sources/served.py), summed in C.
 *
 * Every chunk a mount streams through Python (a decoded view's reads of its stored parts) is summed once, at
 * its first read; in numpy that cost half of such a stream's CPU (a frombuffer, an xor, a multiply and a sum
 * per 8 KiB piece, each a few microseconds of Python around it). Here it is one loop without the GIL. A chunk
 * a read covers only in part is read whole for its sum: `chunk_sum_fd` does that pread into a buffer of its
 * thread and sums it, so the check allocates nothing whatever the read's size. The sum itself is
 * sources/chunk_sum.h, the same as the mount's C read path (fuse/_direct.c) records and compares. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <unistd.h>

#include "chunk_sum.h"

/* chunk_sum(data) -> the sum of `data` (any contiguous buffer). */
static PyObject *chunk_sum_py(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    uint64_t sum;
    Py_BEGIN_ALLOW_THREADS
    sum = chunk_sum((const unsigned char *)data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(sum);
}

/* chunk_sum_fd(fd, start, length) -> the sum of the `length` bytes (at most SUM_CHUNK) at `start` of `fd`'s
 * file, or None when the file holds fewer there. OSError when the read fails. */
static PyObject *chunk_sum_fd(PyObject *self, PyObject *args) {
    static __thread unsigned char scratch[SUM_CHUNK];
    int fd;
    long long start;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "iLn", &fd, &start, &length))
        return NULL;
    if (start < 0 || length < 0 || length > SUM_CHUNK) {
        PyErr_SetString(PyExc_ValueError, "chunk_sum_fd: a chunk of at most SUM_CHUNK bytes at an offset >= 0");
        return NULL;
    }
    size_t done = 0;
    int error = 0;
    uint64_t sum = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < (size_t)length) {
        ssize_t got = pread(fd, scratch + done, (size_t)length - done, (off_t)(start + (long long)done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            error = errno;
        if (got <= 0)
            break;
        done += (size_t)got;
    }
    if (!error && done == (size_t)length)
        sum = chunk_sum(scratch, done);
    Py_END_ALLOW_THREADS
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (done != (size_t)length)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(sum);
}

static PyMethodDef methods[] = {
    {"chunk_sum", chunk_sum_py, METH_VARARGS, "chunk_sum(data) -> the served-checksum sum of data"},
    {"chunk_sum_fd", chunk_sum_fd, METH_VARARGS,
     "chunk_sum_fd(fd, start, length) -> the sum of those bytes of fd's file, None when it holds fewer"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sums", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sums(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "SUM_CHUNK", SUM_CHUNK) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
