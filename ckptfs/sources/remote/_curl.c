/* One range GET through libcurl with the GIL released, its body written straight into the caller's bytes
 * (sources/remote/curl.py).
 *
 * A cold remote read was bounded by the interpreter: urllib3 brings Python back for every socket read (a TLS
 * record, 16 KiB, over https://) and hands each piece over as a bytes object that is copied again. Here the
 * whole transfer runs in C: libcurl's receive buffer is copied once, by the write callback, into the bytes
 * objects the chain keeps (or a writable buffer the caller hands in), and Python is entered only for what
 * it decides: once when the answer's status and headers are in (`decide`: take the body (or, as (TAKE, n), a
 * body of n bytes, fewer than asked for: what an answer's headers say it holds), drop it, or raise
 * the answer's error, which ends the transfer with its body unread and its connection closed), and every
 * POLL_S while the transfer runs (`until`: the read's deadline, which an outage found meanwhile may cut;
 * Ctrl-C is seen there too).
 *
 * Each thread keeps one multi handle and one easy handle (its kept-alive connections); the transfer is
 * driven with curl_multi_poll in steps of at most STEP_MS, so the deadline, the stall timeout and `until`
 * are checked between steps without a signal or a thread of libcurl's. libcurl follows no redirect (its
 * default): the 3xx comes back with its headers and ckptfs follows it by its own rule. A body longer than
 * what was asked for ends the transfer (an error, never a truncation); a shorter one is reported as such. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define STEP_MS 50            /* longest single poll: how late a deadline or a stall may be noticed */
#define POLL_S 0.1            /* how often `until` is asked while a transfer runs */
#define DRAIN_MAX 65536       /* a dropped body (a redirect's) longer than this closes its connection */
#define HEADERS_MAX (1 << 20) /* response headers beyond this end the transfer */

enum { ABORT = 0, TAKE = 1, DRAIN = 2 };
/* codes beside libcurl's own (CURLcode >= 0) */
enum { E_DEADLINE = -1, E_STALL = -2, E_LONG = -3, E_SHORT = -4, E_HEADERS = -5 };

typedef struct {
    CURLM *multi;
    CURL *easy;
    unsigned generation;
} Handle;

static pthread_key_t handle_key;
static unsigned generation; /* bumped in a forked child: the parent's connections are not its own */
static uint64_t transfers, transferred; /* the module's counters (atomic) */

typedef struct {
    /* the request */
    PyObject *decide, *until;
    int own_parts;             /* the body goes into `parts` (bytes objects of `chunk` bytes but the last) */
    PyObject *parts;
    Py_ssize_t chunk;
    char *into;                /* or into the caller's buffer */
    size_t want;
    double stall, deadline, last, polled;
    /* the answer */
    int mode, decided, status, why;
    char reason[128];
    char *headers;             /* the final response's header lines, as received */
    size_t headers_len, headers_cap;
    size_t got, drained;
    PyObject *exc_type, *exc_value, *exc_tb;  /* an exception `decide` or `until` raised */
    PyThreadState *save;
} Transfer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic()'s clock on Linux: deadlines compare as they are */
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void drop_handle(void *p) {
    Handle *h = p;
    if (h == NULL)
        return;
    if (h->generation == generation) {
        curl_multi_remove_handle(h->multi, h->easy);
        curl_easy_cleanup(h->easy);
        curl_multi_cleanup(h->multi);
    } /* else a handle inherited across fork: its sockets are the parent's too; left as it is */
    free(h);
}

static void after_fork_child(void) { generation++; }

static Handle *thread_handle(void) {
    Handle *h = pthread_getspecific(handle_key);
    if (h != NULL && h->generation != generation) {
        free(h); /* leaked on purpose: see drop_handle */
        h = NULL;
        pthread_setspecific(handle_key, NULL);
    }
    if (h == NULL) {
        h = calloc(1, sizeof *h);
        if (h == NULL)
            return NULL;
        h->multi = curl_multi_init();
        h->easy = curl_easy_init();
        h->generation = generation;
        if (h->multi == NULL || h->easy == NULL) {
            if (h->easy) curl_easy_cleanup(h->easy);
            if (h->multi) curl_multi_cleanup(h->multi);
            free(h);
            return NULL;
        }
        pthread_setspecific(handle_key, h);
    }
    return h;
}

/* Python under the GIL from inside a transfer: the caller's thread state was saved when the GIL was let go. */
static void enter_python(Transfer *t) { PyEval_RestoreThread(t->save); }
static void leave_python(Transfer *t) { t->save = PyEval_SaveThread(); }

static void keep_exception(Transfer *t) {
    if (t->exc_type == NULL)
        PyErr_Fetch(&t->exc_type, &t->exc_value, &t->exc_tb);
    else
        PyErr_Clear();
}

/* The headers as [(name lowercased, value)], from the lines kept. */
static PyObject *header_list(const Transfer *t) {
    PyObject *out = PyList_New(0);
    const char *p = t->headers, *end = t->headers + t->headers_len;
    while (out != NULL && p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        const char *colon = memchr(p, ':', (size_t)(line_end - p));
        if (colon != NULL && strncmp(p, "HTTP/", 5) != 0) {
            const char *v = colon + 1, *ve = line_end;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            PyObject *name = PyUnicode_DecodeLatin1(p, colon - p, NULL);
            PyObject *lower = name ? PyObject_CallMethod(name, "lower", NULL) : NULL;
            PyObject *value = PyUnicode_DecodeLatin1(v, ve - v, NULL);
            PyObject *pair = lower && value ? PyTuple_Pack(2, lower, value) : NULL;
            if (pair == NULL || PyList_Append(out, pair) < 0)
                Py_CLEAR(out);
            Py_XDECREF(pair);
            Py_XDECREF(value);
            Py_XDECREF(lower);
            Py_XDECREF(name);
        }
        p = line_end + 1;
    }
    return out;
}

/* The answer's status and headers are in: ask `decide(status, reason, headers)` what to do with its body. */
static int decide_body(Transfer *t) {
    enter_python(t);
    int mode = ABORT;
    PyObject *headers = header_list(t);
    PyObject *got = headers ? PyObject_CallFunction(t->decide, "isO", t->status, t->reason, headers) : NULL;
    if (got != NULL && PyTuple_Check(got)) {
        /* (TAKE, n): a body of exactly n bytes, fewer than asked for (an answer whose length only its
           headers say: an open's first range, cut short by a smaller file) */
        long m = -1;
        Py_ssize_t n = -1;
        if (PyTuple_GET_SIZE(got) == 2) {
            m = PyLong_AsLong(PyTuple_GET_ITEM(got, 0));
            n = PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 1));
        }
        if (PyErr_Occurred())
            keep_exception(t);
        else if (m != TAKE || n < 0 || (size_t)n > t->want) {
            PyErr_SetString(PyExc_ValueError, "decide: (TAKE, n) with 0 <= n <= the bytes asked for");
            keep_exception(t);
        } else {
            mode = TAKE;
            t->want = (size_t)n;
        }
    } else if (got != NULL) {
        long m = PyLong_AsLong(got);
        if (m == -1 && PyErr_Occurred())
            keep_exception(t);
        else
            mode = (int)m;
    } else {
        keep_exception(t);
    }
    if (mode == TAKE && t->own_parts) {
        /* the bytes objects the body is written into, allocated now that it is wanted: nobody else holds
           them until they are returned, so they are filled without the GIL */
        t->parts = PyList_New(0);
        for (size_t at = 0; t->parts != NULL && at < t->want; at += (size_t)t->chunk) {
            size_t n = t->want - at < (size_t)t->chunk ? t->want - at : (size_t)t->chunk;
            PyObject *part = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
            if (part == NULL || PyList_Append(t->parts, part) < 0) {
                Py_CLEAR(t->parts);
                keep_exception(t);
                mode = ABORT;
            }
            Py_XDECREF(part);
        }
    }
    Py_XDECREF(got);
    Py_XDECREF(headers);
    leave_python(t);
    return mode;
}

static size_t on_header(char *data, size_t size, size_t n, void *userdata) {
    Transfer *t = userdata;
    size_t len = size * n;
    t->last = now_s();
    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) { /* a new response (after a 1xx): its own headers only */
        t->headers_len = 0;
        t->status = 0;
        t->reason[0] = 0;
        const char *sp = memchr(data, ' ', len);
        if (sp != NULL && (size_t)(sp - data) + 4 <= len) {
            t->status = atoi(sp + 1);
            const char *r = sp + 4, *re = data + len;
            while (r < re && *r == ' ') r++;
            while (re > r && (re[-1] == '\r' || re[-1] == '\n' || re[-1] == ' ')) re--;
            size_t rl = (size_t)(re - r) < sizeof t->reason - 1 ? (size_t)(re - r) : sizeof t->reason - 1;
            memcpy(t->reason, r, rl);
            t->reason[rl] = 0;
        }
    }
    if ((len == 2 && data[0] == '\r' && data[1] == '\n') || (len == 1 && data[0] == '\n')) {
        if (t->status >= 200 && !t->decided) {
            t->decided = 1;
            t->mode = decide_body(t); /* a body dropped (ABORT) ends the transfer at its first byte */
            return t->exc_type != NULL ? 0 : len;
        }
        return len;
    }
    if (t->headers_len + len > t->headers_cap) {
        size_t cap = t->headers_cap ? t->headers_cap * 2 : 4096;
        while (cap < t->headers_len + len) cap *= 2;
        if (cap > HEADERS_MAX) {
            t->why = E_HEADERS;
            return 0;
        }
        char *grown = realloc(t->headers, cap);
        if (grown == NULL)
            return 0;
        t->headers = grown;
        t->headers_cap = cap;
    }
    memcpy(t->headers + t->headers_len, data, len);
    t->headers_len += len;
    return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *userdata) {
    Transfer *t = userdata;
    size_t len = size * n;
    t->last = now_s();
    if (t->mode == DRAIN) {
        t->drained += len;
        return t->drained > DRAIN_MAX ? 0 : len;
    }
    if (t->mode != TAKE)
        return 0; /* the body is not wanted: the transfer ends, its connection closed */
    if (len > t->want - t->got) {
        t->why = E_LONG;
        return 0;
    }
    if (t->own_parts) {
        size_t done = 0;
        while (done < len) {
            size_t at = t->got + done;
            size_t index = at / (size_t)t->chunk, offset = at % (size_t)t->chunk;
            PyObject *part = PyList_GET_ITEM(t->parts, (Py_ssize_t)index);
            size_t room = (size_t)PyBytes_GET_SIZE(part) - offset;
            size_t step = len - done < room ? len - done : room;
            memcpy(PyBytes_AS_STRING(part) + offset, data + done, step);
            done += step;
        }
    } else {
        memcpy(t->into + t->got, data, len);
    }
    t->got += len;
    return len;
}

/* Ask `until()` for the deadline (an outage found meanwhile cuts it) and let a signal (Ctrl-C) through. */
static int poll_python(Transfer *t) {
    enter_python(t);
    int ok = 1;
    if (t->until != Py_None) {
        PyObject *got = PyObject_CallNoArgs(t->until);
        double d = got ? PyFloat_AsDouble(got) : -1.0;
        if (got == NULL || (d == -1.0 && PyErr_Occurred())) {
            keep_exception(t);
            ok = 0;
        } else {
            t->deadline = d;
        }
        Py_XDECREF(got);
    }
    if (ok && PyErr_CheckSignals() < 0) {
        keep_exception(t);
        ok = 0;
    }
    leave_python(t);
    return ok;
}

static int set_options(CURL *easy, Transfer *t, const char *url, struct curl_slist *headers, int fresh,
                       const char *cainfo, const char *capath, const char *proxy, const char *sigv4,
                       const char *user, const char *password, char *errbuf) {
    curl_easy_reset(easy); /* keeps the live connections, TLS sessions and DNS cache */
    CURLcode c = CURLE_OK;
#define SET(opt, value) if (c == CURLE_OK) c = curl_easy_setopt(easy, opt, value)
    SET(CURLOPT_URL, url);
    SET(CURLOPT_HTTPHEADER, headers);
    SET(CURLOPT_ERRORBUFFER, errbuf);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_FOLLOWLOCATION, 0L);
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    SET(CURLOPT_BUFFERSIZE, (long)(256 << 10)); /* a receive buffer that stays in cache for its copy out */
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, (void *)t);
    SET(CURLOPT_WRITEFUNCTION, on_body);
    SET(CURLOPT_WRITEDATA, (void *)t);
    SET(CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_PROXY, proxy); /* "" is no proxy, not the environment's: the proxy is the caller's to say */
    long connect_ms = (long)(t->stall * 1000.0);
    SET(CURLOPT_CONNECTTIMEOUT_MS, connect_ms > 0 ? connect_ms : 1L);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    if (fresh) {
        SET(CURLOPT_FRESH_CONNECT, 1L);
        SET(CURLOPT_FORBID_REUSE, 1L);
    }
    if (cainfo != NULL) {
        SET(CURLOPT_CAINFO, cainfo);
    } else if (capath != NULL) {
        SET(CURLOPT_CAINFO, (char *)NULL); /* the folder replaces the default bundle, not adds to it */
    }
    if (capath != NULL)
        SET(CURLOPT_CAPATH, capath);
    if (sigv4 != NULL) { /* AWS Signature V4 ("aws:amz:REGION:s3") with the key id and secret the caller resolved:
                            libcurl signs the request line, Host, x-amz-date and the headers given */
        SET(CURLOPT_AWS_SIGV4, sigv4);
        SET(CURLOPT_USERNAME, user != NULL ? user : "");
        SET(CURLOPT_PASSWORD, password != NULL ? password : "");
    }
#undef SET
    if (c != CURLE_OK)
        snprintf(errbuf, CURL_ERROR_SIZE, "%s", curl_easy_strerror(c));
    return c == CURLE_OK;
}

static char *get_kwlist[] = {"url", "headers", "want", "decide", "until", "deadline", "stall", "fresh",
                             "cainfo", "capath", "proxy", "into", "chunk", "sigv4", "user", "password", NULL};

/* get(url, headers, want, decide, until, deadline, stall, fresh=False, cainfo=None, capath=None, proxy="",
 *     into=None, chunk=0, sigv4=None, user=None, password=None) -> (code, message, got, parts) -- see _curl.pyi. */
static PyObject *get(PyObject *self, PyObject *args, PyObject *kwargs) {
    const char *url, *cainfo = NULL, *capath = NULL, *proxy = "", *sigv4 = NULL, *user = NULL, *password = NULL;
    PyObject *header_seq, *decide, *until, *into = Py_None;
    Py_ssize_t want, chunk = 0;
    double deadline, stall;
    int fresh = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOnOOdd|pzzsOnzzz", get_kwlist, &url, &header_seq,
                                     &want, &decide, &until, &deadline, &stall, &fresh, &cainfo, &capath, &proxy,
                                     &into, &chunk, &sigv4, &user, &password))
        return NULL;
    if (want < 0 || !PyCallable_Check(decide) || (until != Py_None && !PyCallable_Check(until))) {
        PyErr_SetString(PyExc_ValueError, "get: want >= 0, decide callable, until callable or None");
        return NULL;
    }
    Py_buffer view = {0};
    int have_view = 0;
    if (into != Py_None) {
        if (PyObject_GetBuffer(into, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        have_view = 1;
        if (view.len != want) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "get: the buffer must hold exactly `want` bytes");
            return NULL;
        }
    } else if (chunk <= 0) {
        PyErr_SetString(PyExc_ValueError, "get: chunk > 0 when no buffer is given");
        return NULL;
    }
    struct curl_slist *headers = NULL;
    PyObject *seq = PySequence_Fast(header_seq, "get: headers must be a sequence of 'Name: value' strings");
    if (seq == NULL)
        goto fail_early;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *line = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        struct curl_slist *more = line ? curl_slist_append(headers, line) : NULL;
        if (more == NULL) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            Py_DECREF(seq);
            goto fail_early;
        }
        headers = more;
    }
    Py_DECREF(seq);
    Handle *h = thread_handle();
    if (h == NULL) {
        PyErr_SetString(PyExc_MemoryError, "libcurl: cannot make a handle");
        goto fail_early;
    }

    Transfer t = {0};
    t.decide = decide;
    t.until = until;
    t.own_parts = !have_view;
    t.into = have_view ? view.buf : NULL;
    t.chunk = chunk;
    t.want = (size_t)want;
    t.stall = stall;
    t.deadline = deadline;
    char errbuf[CURL_ERROR_SIZE];
    errbuf[0] = 0;
    int code = CURLE_OK;
    if (!set_options(h->easy, &t, url, headers, fresh, cainfo, capath, proxy, sigv4, user, password, errbuf)) {
        code = CURLE_FAILED_INIT;
    } else {
        __atomic_add_fetch(&transfers, 1, __ATOMIC_RELAXED);
        t.save = PyEval_SaveThread();
        double start = now_s();
        t.last = t.polled = start;
        curl_multi_add_handle(h->multi, h->easy);
        for (;;) {
            int running = 0;
            CURLMcode mc = curl_multi_perform(h->multi, &running);
            if (mc != CURLM_OK) {
                snprintf(errbuf, sizeof errbuf, "%s", curl_multi_strerror(mc));
                code = CURLE_FAILED_INIT;
                break;
            }
            if (!running || t.exc_type != NULL || t.why != 0)
                break;
            double now = now_s();
            if (now - t.polled >= POLL_S) {
                t.polled = now;
                if (!poll_python(&t))
                    break;
            }
            if (now >= t.deadline) {
                t.why = E_DEADLINE;
                break;
            }
            if (now - t.last >= t.stall) {
                t.why = E_STALL;
                break;
            }
            double left = t.deadline - now, quiet = t.stall - (now - t.last), next = POLL_S - (now - t.polled);
            double wait = left < quiet ? left : quiet;
            wait = wait < next ? wait : next;
            int ms = (int)(wait * 1000.0) + 1;
            curl_multi_poll(h->multi, NULL, 0, ms < STEP_MS ? ms : STEP_MS, NULL);
        }
        int queued;
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(h->multi, &queued)) != NULL)
            if (msg->msg == CURLMSG_DONE && code == CURLE_OK)
                code = msg->data.result;
        curl_multi_remove_handle(h->multi, h->easy); /* mid-body: the transfer ends and its connection closes */
        PyEval_RestoreThread(t.save);
        __atomic_add_fetch(&transferred, t.got, __ATOMIC_RELAXED);
    }
    /* the handle outlives this call (its connections are kept): it must not point at this call's stack or
       at the header list freed below, which libcurl would write to (an error met while a kept connection is
       closed, at the next call or when the thread ends) */
    curl_easy_setopt(h->easy, CURLOPT_ERRORBUFFER, (char *)NULL);
    curl_easy_setopt(h->easy, CURLOPT_HTTPHEADER, (struct curl_slist *)NULL);
    curl_slist_free_all(headers);
    free(t.headers);
    if (have_view)
        PyBuffer_Release(&view);
    if (t.exc_type != NULL) {
        Py_XDECREF(t.parts);
        PyErr_Restore(t.exc_type, t.exc_value, t.exc_tb);
        return NULL;
    }
    if (t.why != 0)
        code = t.why; /* ours first: libcurl reports them as a write error or nothing */
    else if (code == CURLE_OK && t.mode == TAKE && t.got < t.want)
        code = E_SHORT;
    const char *message = errbuf[0] ? errbuf : (code > 0 ? curl_easy_strerror((CURLcode)code) : "");
    PyObject *parts = t.parts ? t.parts : Py_NewRef(Py_None);
    return Py_BuildValue("isnN", code, message, (Py_ssize_t)t.got, parts);

fail_early:
    curl_slist_free_all(headers);
    if (have_view)
        PyBuffer_Release(&view);
    return NULL;
}

static PyObject *counters(PyObject *self, PyObject *unused) {
    return Py_BuildValue("KK", (unsigned long long)__atomic_load_n(&transfers, __ATOMIC_RELAXED),
                         (unsigned long long)__atomic_load_n(&transferred, __ATOMIC_RELAXED));
}

static PyObject *version(PyObject *self, PyObject *unused) { return PyUnicode_FromString(curl_version()); }

static PyMethodDef methods[] = {
    {"get", (PyCFunction)(void (*)(void))get, METH_VARARGS | METH_KEYWORDS,
     "One GET with the GIL released, its body into bytes parts or the given buffer."},
    {"counters", counters, METH_NOARGS, "(transfers, body bytes) of this process."},
    {"version", version, METH_NOARGS, "libcurl's version string."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_curl", NULL, -1, methods};

PyMODINIT_FUNC PyInit__curl(void) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        PyErr_SetString(PyExc_ImportError, "libcurl: global initialisation failed");
        return NULL;
    }
    if (pthread_key_create(&handle_key, drop_handle) != 0 || pthread_atfork(NULL, NULL, after_fork_child) != 0) {
        PyErr_SetString(PyExc_ImportError, "libcurl: cannot keep per-thread handles");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "TAKE", TAKE) < 0 || PyModule_AddIntConstant(m, "DRAIN", DRAIN) < 0 ||
        PyModule_AddIntConstant(m, "ABORT", ABORT) < 0 || PyModule_AddIntConstant(m, "E_DEADLINE", E_DEADLINE) < 0 ||
        PyModule_AddIntConstant(m, "E_STALL", E_STALL) < 0 || PyModule_AddIntConstant(m, "E_LONG", E_LONG) < 0 ||
        PyModule_AddIntConstant(m, "E_SHORT", E_SHORT) < 0 || PyModule_AddIntConstant(m, "E_HEADERS", E_HEADERS) < 0 ||
        PyModule_AddIntConstant(m, "E_TLS_VERIFY", CURLE_PEER_FAILED_VERIFICATION) < 0 ||
        PyModule_AddIntConstant(m, "E_TLS_CACERT", CURLE_SSL_CACERT_BADFILE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
