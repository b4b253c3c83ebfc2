/* Reads of stored bytes, and of values computed from them row by row, answered in C, on libfuse's own
 * threads, without the GIL (fuse/direct.py).
 *
 * A file whose bytes are ranges of local files, as they are (a tensor's NAME.raw, the checkpoint's own files,
 * a split GGUF set's merged model.gguf: its header held in memory, then each tensor's range of its shard,
 * zeros between them) needs no Python per request: the answer is a pread or two. Neither does the .npy of a
 * weight whose values are a closed form of its stored codes (FP8 or int8 codes times a scale per block,
 * quant/scaled_rows.h; 4-bit codes two a byte times a scale per block, quant/nibble_pairs.h): the answer is
 * a pread of the codes under the read and one pass over them. Python registers each such open file handle here at open (fh -> its segments: for each, where it
 * starts in the file, its length, and either a source descriptor with the offset there and the source's size
 * and mtime as pinned at open (and, for computed values, the program that computes them), or bytes in memory,
 * or zeros) and unregisters it at release; `direct_read`, installed in libfuse's
 * fuse_operations in place of mfusepy's read callback (fuse/binding.py), serves registered handles and hands
 * every other read, and any read it cannot finish cleanly, to that Python callback (a ctypes callback: it
 * takes the GIL itself).
 *
 * libfuse 3 and 2 have the same read signature:
 *   int read(const char *path, char *buf, size_t size, off_t offset, struct fuse_file_info *fi)
 * The offset of `fh` inside struct fuse_file_info differs between versions: it is mfusepy's (its ctypes
 * struct, `fuse_file_info.fh.offset`), given at install, never written down here.
 *
 * Guarantees kept from the Python path (sources/local.py): a read returns min(size, length - offset) bytes
 * exactly as the files were when pinned; after each pread the descriptor is fstat'ed, and a changed size or
 * mtime, a short read or an error sends the read to Python, which answers it (EIO, with its log line and
 * error counter); the chunks it touches are recorded in, or once the ctime moved compared with, the file's
 * served checksums (sources/served.py), and a chunk other than served before goes to Python too. A segment may be gated (a sealed file of the --cache-dir store whose MAC check is under way,
 * run ahead of the readers chunk by chunk: sources/remote/store/sparse_store.py): its bytes are read once the check has
 * passed them, and a read the check has not reached soon, or one of a file that failed it, goes to Python,
 * which checks each chunk it reads. Descriptors, memory and gates are Python's, held by it while the handle is
 * registered: each read holds a reference on its entry, and `unregister` returns only once no read uses the
 * entry, so Python never lets a descriptor (or the memory) go under a read of ours.
 *
 * The table is chained hash buckets under one rwlock, held only for a lookup, never during I/O.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

typedef int (*read_fn)(const char *, char *, size_t, off_t, void *);

#define BUCKETS 4096
#define KINDS 16

/* One segment as Python packs it (fuse/direct.py, SEGMENT = struct "<QQqqqqQQQ"). */
struct segment {
    uint64_t start;    /* where it starts in the mount's file */
    uint64_t length;
    int64_t fd;        /* >= 0: bytes [offset, offset + length) of this descriptor's file; -1: memory or zeros */
    int64_t offset;
    int64_t st_size;   /* the source file as pinned at open: a read checks it is still so */
    int64_t mtime_ns;
    uint64_t memory;   /* fd == -1: the address of `length` bytes (Python holds them), or 0 for zeros */
    uint64_t gate;     /* fd >= 0: 0, or the address of an int64 Python advances: how many bytes from the start of
                        * the file have been checked (a sealed store file under its check), -1 once it failed */
    uint64_t sums;     /* fd >= 0: 0, or the address of the source's served checksums (sources/served.py): an
                        * int64 ctime as pinned, an int64 chunk count n, n uint64 sums, n "recorded" bytes */
    uint64_t program;  /* fd >= 0: 0 (the file's bytes as they are), or the address of a struct program: the
                        * segment's bytes are values computed from codes at `offset` of the file */
};

/* A segment computed from stored codes (fuse/direct.py, PROGRAM = struct "<qqqqQQQQqqqqqqqqqqf4x"): `rows` rows of
 * `width` values each, as float32, float16 or bfloat16, computed from codes at `offset` of the segment's file.
 * The tables are Python's, held while registered.
 *
 * PROGRAM_SCALED (quant/scaled_rows.h): a code byte per value; row r's codes are the `width` bytes at
 * offset + r * width, its scale row (r / matrix_rows) * grid_rows + (r % matrix_rows) / block_height of
 * `scales` (and `zeros`), each `groups` float32 wide, one per `block_width` values; `table`: 256 float32.
 * PROGRAM_NIBBLES (quant/nibble_pairs.h): two 4-bit codes a byte, the values' elements in order from
 * `offset`; `table`: the 512 float32 pairs; a scale per `block_width` elements, `scale_rows` of them, read from
 * the same file at `scale_offset` with the codes a read needs (nothing of them is held): SCALE_F32, a
 * float32 each; SCALE_TABLE, a byte each worth scale_table[byte] (256 float32); SCALE_NESTED, a byte each
 * worth scale_table[byte] * scales[k / nested_block] + nested_offset in float32, multiply then add
 * (bitsandbytes' double quantization; `scales`: its `nested_count` float32 second-level scales). */
enum { PROGRAM_SCALED = 1, PROGRAM_NIBBLES = 2 };
enum { SCALE_F32 = 1, SCALE_TABLE = 2, SCALE_NESTED = 3 };

struct program {
    int64_t kind;
    int64_t out_type;       /* ROW_OUT_F32, ROW_OUT_F16, ROW_OUT_BF16 */
    int64_t rows;
    int64_t width;
    uint64_t table;
    uint64_t scales;
    uint64_t zeros;         /* PROGRAM_SCALED: 0, or float32 [scale_rows, groups] */
    uint64_t scale_table;   /* PROGRAM_NIBBLES: 0 (float32 scales), or 256 float32 (a scale byte per block) */
    int64_t scale_rows;
    int64_t groups;
    int64_t block_width;
    int64_t matrix_rows;
    int64_t grid_rows;
    int64_t block_height;
    int64_t scale_offset;   /* PROGRAM_NIBBLES: the file offset of block 0's scale */
    int64_t scale_kind;     /* SCALE_F32, SCALE_TABLE, SCALE_NESTED */
    int64_t nested_block;
    int64_t nested_count;
    float nested_offset;
};

/* Served checksums (sources/served.py): a sum of each SUM_CHUNK-byte chunk of a file, taken when a read first
 * touched it while the file's ctime was as pinned (its bytes then are the pinned bytes); once the ctime
 * differs (a chmod, or a rewrite that put the mtime back), each recorded chunk a read touches is compared
 * before it is served, and a mismatch is handed to Python (EIO, its log line). The sum (chunk_sum) is
 * served.py's, defined once for both C users in sources/chunk_sum.h. */
#include "../sources/chunk_sum.h"
#include "../quant/nibble_pairs.h"
#include "../quant/scaled_rows.h"

struct entry {
    uint64_t fh;
    int kind;
    uint64_t length;   /* the file's size as the mount shows it */
    atomic_int refs;   /* 1 for the table, 1 per read in progress */
    struct entry *next;
    size_t count;
    struct segment segments[];  /* contiguous, in order, covering [0, length) */
};

static struct entry *table[BUCKETS];
static pthread_rwlock_t table_lock = PTHREAD_RWLOCK_INITIALIZER;
static read_fn python_read;            /* mfusepy's callback: every read not served here */
static Py_ssize_t fh_offset = -1;
static atomic_ullong served_reads[KINDS], served_bytes[KINDS], handed_back, short_replies;
static atomic_long registered;

static void put(struct entry *e) {
    if (atomic_fetch_sub(&e->refs, 1) == 1) {
        free(e);
        atomic_fetch_sub(&registered, 1);
    }
}

/* Take `e` (out of the table already) out of use: wait until no read holds it (a read takes microseconds;
 * a release seldom finds one in progress), then drop the table's reference. */
static void retire(struct entry *e) {
    for (unsigned spins = 0; atomic_load(&e->refs) > 1; spins++) {
        if (spins < 1000)
            sched_yield();
        else
            usleep(100);
    }
    put(e);
}

static struct entry *get(uint64_t fh) {
    struct entry *e;
    pthread_rwlock_rdlock(&table_lock);
    for (e = table[fh % BUCKETS]; e != NULL; e = e->next)
        if (e->fh == fh) {
            atomic_fetch_add(&e->refs, 1);
            break;
        }
    pthread_rwlock_unlock(&table_lock);
    return e;
}

/* A read of a gated file never waits for a check this far behind it: a read that far ahead (a jump to the
 * end of the file) is handed to Python, which checks the chunks it reads itself. */
#define GATE_AHEAD (64LL << 20)
/* ... nor for one that has not moved for this long (nanoseconds): a check starved of CPU. */
#define GATE_IDLE_NS 2000000000LL

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 1 when the file's bytes before `end` have been checked (at once for an ungated file); while its check runs
 * a little behind the read, wait for it; 0 when the check failed, is far behind or makes no progress. */
static int checked(const struct segment *s, int64_t end) {
    if (s->gate == 0)
        return 1;
    const _Atomic int64_t *gate = (const _Atomic int64_t *)(uintptr_t)s->gate;
    int64_t seen = atomic_load(gate);
    if (seen >= end)
        return 1;
    if (seen < 0 || end - seen > GATE_AHEAD)
        return 0;
    for (int64_t moved = monotonic_ns(); monotonic_ns() - moved < GATE_IDLE_NS;) {
        usleep(50);
        int64_t now = atomic_load(gate);
        if (now >= end)
            return 1;
        if (now < 0)
            return 0;
        if (now != seen) {
            seen = now;
            moved = monotonic_ns();
        }
    }
    return 0;
}

/* 1 when all `n` bytes at `at` of `fd` were read into buf. */
static int read_all(int fd, void *buf, size_t n, int64_t at) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, (char *)buf + done, n - done, (off_t)(at + (int64_t)done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return 0;
        done += (size_t)got;
    }
    return 1;
}

static int64_t ctime_of(const struct stat *st) {
    return (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

/* 1 when every chunk the `n` bytes at `at` of the file touch is as served before (recorded now when the ctime
 * is as pinned, compared when it is not); a chunk the read covers only in part is read whole from `fd` into
 * a scratch buffer, and the file must then still have ctime `ctime_ns`. 0 on a mismatch, a failed read, a
 * ctime that moved meanwhile: Python answers (sources/served.py does the same). */
static int served(uint64_t sums, int fd, int64_t size, const char *buf, size_t n, int64_t at, int64_t ctime_ns) {
    static __thread unsigned char scratch[SUM_CHUNK];
    const int64_t *head = (const int64_t *)(uintptr_t)sums;
    int64_t chunks = head[1];
    uint64_t *recorded = (uint64_t *)(uintptr_t)(sums + 16);
    _Atomic uint8_t *have = (_Atomic uint8_t *)(uintptr_t)(sums + 16 + 8 * (uint64_t)chunks);
    int changed = ctime_ns != head[0], edges = 0;
    int64_t end = at + (int64_t)n;
    for (int64_t k = at / SUM_CHUNK; k * SUM_CHUNK < end && k < chunks; k++) {
        int known = atomic_load_explicit(&have[k], memory_order_acquire);
        if (known && !changed)
            continue;
        int64_t start = k * SUM_CHUNK;
        size_t length = size - start < SUM_CHUNK ? (size_t)(size - start) : SUM_CHUNK;  /* the last: shorter */
        const unsigned char *bytes;
        if (start >= at && start + (int64_t)length <= end) {
            bytes = (const unsigned char *)buf + (start - at);
        } else {  /* an edge: the whole chunk read again */
            if (!read_all(fd, scratch, length, start))
                return 0;
            bytes = scratch;
            edges = 1;
        }
        uint64_t got = chunk_sum(bytes, length);
        if (known && got != recorded[k])
            return 0;
        if (!known) {
            recorded[k] = got;
            atomic_store_explicit(&have[k], 1, memory_order_release);
        }
    }
    struct stat st;
    return !edges || (fstat(fd, &st) == 0 && ctime_of(&st) == ctime_ns);
}

/* 1 when `n` bytes at `at` of the segment's file were read completely and the file is still as pinned. */
static int read_file(const struct segment *s, char *buf, size_t n, int64_t at) {
    int fd = (int)s->fd;
    if (!checked(s, at + (int64_t)n) || !read_all(fd, buf, n, at))
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return 0;
    int64_t mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if ((int64_t)st.st_size != s->st_size || mtime_ns != s->mtime_ns)
        return 0;
    return s->sums == 0 || served(s->sums, fd, s->st_size, buf, n, at, ctime_of(&st));
}

/* A buffer of this thread's that grows to what it is asked for (NULL when memory runs out); freed with the
 * thread (libfuse's workers come and go). */
struct scratch {
    void *data;
    size_t size;
};
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

enum { SCRATCHES = 3 };  /* a thread's buffers: codes, stored scales, scales as float32 (or a cut row) */

static void scratch_free(void *p) {
    struct scratch *s = p;
    for (int i = 0; i < SCRATCHES; i++)
        free(s[i].data);
    free(s);
}

static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

static void *scratch_of(int which, size_t size) {
    pthread_once(&scratch_once, scratch_init);
    struct scratch *pair = pthread_getspecific(scratch_key);
    if (pair == NULL) {
        if ((pair = calloc(SCRATCHES, sizeof *pair)) == NULL || pthread_setspecific(scratch_key, pair) != 0) {
            free(pair);
            return NULL;
        }
    }
    struct scratch *s = &pair[which];
    if (s->size < size) {
        void *grown = realloc(s->data, size);
        if (grown == NULL)
            return NULL;
        s->data = grown;
        s->size = size;
    }
    return s->data;
}

static int64_t item_of(const struct program *p) { return p->out_type == ROW_OUT_F32 ? 4 : 2; }

/* Bytes [within, within + n) of a PROGRAM_SCALED segment's values into buf: the codes of the rows they touch
 * read (with every check of read_file), the rows wholly inside computed in place, the (at most two) rows the
 * range cuts computed into a scratch row and copied. 1 on success. */
static int read_scaled(const struct segment *s, char *buf, size_t n, uint64_t within) {
    const struct program *p = (const struct program *)(uintptr_t)s->program;
    const int64_t width = p->width, row_bytes = width * item_of(p);
    const int64_t r0 = (int64_t)within / row_bytes, r1 = ((int64_t)(within + n) + row_bytes - 1) / row_bytes;
    uint8_t *codes = scratch_of(0, (size_t)((r1 - r0) * width));
    if (codes == NULL || !read_file(s, (char *)codes, (size_t)((r1 - r0) * width), s->offset + r0 * width))
        return 0;
    const float *table = (const float *)(uintptr_t)p->table, *scales = (const float *)(uintptr_t)p->scales;
    const float *zeros = (const float *)(uintptr_t)p->zeros;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t srow = (r / p->matrix_rows) * p->grid_rows + (r % p->matrix_rows) / p->block_height;
        const int64_t lo = r * row_bytes, hi = lo + row_bytes;
        const int64_t a = lo > (int64_t)within ? lo : (int64_t)within;
        const int64_t b = hi < (int64_t)(within + n) ? hi : (int64_t)(within + n);
        char *place = buf + (a - (int64_t)within);
        char *row = (a == lo && b == hi) ? place : scratch_of(1, (size_t)row_bytes);
        if (row == NULL)
            return 0;
        scaled_row(codes + (r - r0) * width, table, scales + srow * p->groups, zeros ? zeros + srow * p->groups : NULL,
                   width, p->block_width, row, (int)p->out_type);
        if (row != place)
            memcpy(place, row + (a - lo), (size_t)(b - a));
    }
    return 1;
}

/* Bytes [within, within + n) of a PROGRAM_NIBBLES segment's values into buf: the code bytes of the elements
 * they touch read (with every check of read_file), the elements wholly inside computed in place, an element
 * the range cuts (an odd offset) computed alone and its bytes copied. 1 on success. */
static int read_nibbles(const struct segment *s, char *buf, size_t n, uint64_t within) {
    const struct program *p = (const struct program *)(uintptr_t)s->program;
    const int64_t item = item_of(p), a = (int64_t)within, b = a + (int64_t)n;
    const int64_t e0 = a / item, e1 = (b + item - 1) / item, first = e0 / 2, bytes = (e1 + 1) / 2 - first;
    uint8_t *codes = scratch_of(0, (size_t)bytes);
    if (codes == NULL || !read_file(s, (char *)codes, (size_t)bytes, s->offset + first))
        return 0;
    /* the scales of the blocks [k0, k1] under the read, as float32 */
    const int64_t k0 = e0 / p->block_width, k1 = (e1 - 1) / p->block_width, count = k1 - k0 + 1;
    const int64_t size = p->scale_kind == SCALE_F32 ? 4 : 1;
    uint8_t *stored = scratch_of(1, (size_t)(count * size));
    float *scales = scratch_of(2, (size_t)count * sizeof(float));
    if (stored == NULL || scales == NULL
        || !read_file(s, (char *)stored, (size_t)(count * size), p->scale_offset + k0 * size))
        return 0;
    const float *table = (const float *)(uintptr_t)p->scale_table, *nested = (const float *)(uintptr_t)p->scales;
    if (p->scale_kind == SCALE_F32) {
        memcpy(scales, stored, (size_t)count * sizeof(float));
    } else if (p->scale_kind == SCALE_TABLE) {
        for (int64_t i = 0; i < count; i++)
            scales[i] = table[stored[i]];
    } else {
        for (int64_t i = 0; i < count; i++) {
            const float scaled = table[stored[i]] * nested[(k0 + i) / p->nested_block];
            scales[i] = scaled + p->nested_offset;
        }
    }
    const struct nibble_scales sc = {scales, p->block_width, k0};
    const float *pairs = (const float *)(uintptr_t)p->table;
    int64_t w0 = (a + item - 1) / item, w1 = b / item;  /* the elements wholly inside */
    if (w1 < w0)
        w1 = w0;
    if (w0 < w1)
        paired_nibbles(codes + (w0 / 2 - first), w0, w1, pairs, &sc, buf + (w0 * item - a), (int)p->out_type);
    for (int64_t e = e0; e < e1; e = e < e1 - 1 ? e1 - 1 : e1) {  /* the first and the last element */
        if (e >= w0 && e < w1)
            continue;
        char one[4];
        paired_nibbles(codes + (e / 2 - first), e, e + 1, pairs, &sc, one, (int)p->out_type);
        const int64_t lo = e * item > a ? e * item : a, hi = (e + 1) * item < b ? (e + 1) * item : b;
        memcpy(buf + (lo - a), one + (lo - e * item), (size_t)(hi - lo));
    }
    return 1;
}

static int read_computed(const struct segment *s, char *buf, size_t n, uint64_t within) {
    const struct program *p = (const struct program *)(uintptr_t)s->program;
    return p->kind == PROGRAM_SCALED ? read_scaled(s, buf, n, within) : read_nibbles(s, buf, n, within);
}

/* Whether a program fits the segment it computes: its values are the segment's bytes, its codes lie inside
 * the pinned file, every row's scale row lies inside the scales. */
static int program_fits(const struct segment *s) {
    const struct program *p = (const struct program *)(uintptr_t)s->program;
    if (p->out_type < ROW_OUT_F32 || p->out_type > ROW_OUT_BF16 || p->rows <= 0 || p->width <= 0 || p->table == 0
        || p->scale_rows <= 0 || p->block_width <= 0)
        return 0;
    if (p->width > INT64_MAX / 4 / p->rows || (uint64_t)(p->rows * p->width * item_of(p)) != s->length)
        return 0;
    const int64_t values = p->rows * p->width;
    if (p->kind == PROGRAM_NIBBLES) {  /* a scale for every block of the run; the run and the scales in the file */
        const int64_t size = p->scale_kind == SCALE_F32 ? 4 : 1;
        if (p->scale_kind < SCALE_F32 || p->scale_kind > SCALE_NESTED || p->scale_offset < 0
            || (p->scale_kind != SCALE_F32 && p->scale_table == 0)
            || (p->scale_kind == SCALE_NESTED && (p->scales == 0 || p->nested_block <= 0
                || (p->scale_rows - 1) / p->nested_block >= p->nested_count)))
            return 0;
        return p->zeros == 0 && (values + p->block_width - 1) / p->block_width <= p->scale_rows
               && s->offset + (values + 1) / 2 <= s->st_size && p->scale_offset + p->scale_rows * size <= s->st_size;
    }
    if (p->kind != PROGRAM_SCALED || p->scales == 0 || p->groups <= 0 || p->scale_table != 0 || p->matrix_rows <= 0
        || p->grid_rows <= 0
        || p->block_height <= 0 || p->rows % p->matrix_rows != 0)
        return 0;
    if (p->groups * p->block_width < p->width || (p->groups - 1) * p->block_width >= p->width)
        return 0;
    if ((p->matrix_rows - 1) / p->block_height >= p->grid_rows
        || (p->rows / p->matrix_rows) * p->grid_rows > p->scale_rows)
        return 0;
    return s->offset + values <= s->st_size;
}

/* Bytes [offset, offset + n) of the entry's file into buf (n > 0, inside the file); 1 on success. */
static int read_segments(const struct entry *e, char *buf, size_t n, uint64_t offset) {
    size_t lo = 0, hi = e->count;  /* the last segment starting at or before offset */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->segments[mid].start <= offset)
            lo = mid;
        else
            hi = mid;
    }
    size_t done = 0;
    for (size_t i = lo; done < n && i < e->count; i++) {
        const struct segment *s = &e->segments[i];
        uint64_t within = offset + done - s->start;
        size_t take = (size_t)(s->length - within);
        if (take > n - done)
            take = n - done;
        if (s->program != 0) {
            if (!read_computed(s, buf + done, take, within))
                return 0;
        } else if (s->fd >= 0) {
            if (!read_file(s, buf + done, take, s->offset + (int64_t)within))
                return 0;
        } else if (s->memory != 0) {
            memcpy(buf + done, (const char *)(uintptr_t)s->memory + within, take);
        } else {
            memset(buf + done, 0, take);
        }
        done += take;
    }
    return done == n;
}

/* A reply of `got` bytes where `want` were due (the size asked, up to the end of the file): a shorter one
 * before the end of the file would make the kernel shrink the file's size, so it is never sent: counted
 * (short_replies, 0 unless there is a bug) and answered EIO. An error passes as it is. */
static int whole(int got, size_t want) {
    if (got >= 0 && (size_t)got != want) {
        atomic_fetch_add(&short_replies, 1);
        return -EIO;
    }
    return got;
}

static int direct_read(const char *path, char *buf, size_t size, off_t offset, void *fi) {
    struct entry *e = NULL;
    if (fi != NULL && offset >= 0 && size <= INT32_MAX) {
        uint64_t fh;
        memcpy(&fh, (const char *)fi + fh_offset, sizeof fh);
        e = get(fh);
    }
    if (e == NULL)
        return python_read(path, buf, size, offset, fi);
    size_t n = 0;
    if ((uint64_t)offset < e->length) {
        uint64_t left = e->length - (uint64_t)offset;
        n = left < size ? (size_t)left : size;
    }
    int ok = n == 0 || read_segments(e, buf, n, (uint64_t)offset);
    int kind = e->kind;
    put(e);
    if (!ok) {
        atomic_fetch_add(&handed_back, 1);
        return whole(python_read(path, buf, size, offset, fi), n);
    }
    atomic_fetch_add(&served_reads[kind], 1);
    atomic_fetch_add(&served_bytes[kind], n);
    return whole((int)n, n);
}

/* install(python_read_address, fh_offset) -> the address of direct_read (to put in fuse_operations). */
static PyObject *install(PyObject *self, PyObject *args) {
    unsigned long long address;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "Kn", &address, &offset))
        return NULL;
    if (address == 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "install needs the Python read callback and fh's offset");
        return NULL;
    }
    python_read = (read_fn)(uintptr_t)address;
    fh_offset = offset;
    return PyLong_FromVoidPtr((void *)direct_read);
}

/* register(fh, kind, length, segments) -> False when fh is registered already. `segments`: packed struct
 * segment records, contiguous from 0 to `length`. Their descriptors and memory must stay valid until
 * unregister(fh) has returned. */
static PyObject *register_handle(PyObject *self, PyObject *args) {
    unsigned long long fh, length;
    int kind;
    Py_buffer packed;
    if (!PyArg_ParseTuple(args, "KiKy*", &fh, &kind, &length, &packed))
        return NULL;
    size_t count = (size_t)packed.len / sizeof(struct segment);
    struct entry *e = NULL;
    const char *problem = NULL;
    if (kind < 0 || kind >= KINDS)
        problem = "register: bad kind";
    else if (count == 0 || (size_t)packed.len != count * sizeof(struct segment))
        problem = "register: segments must be whole records";
    else if ((e = malloc(sizeof *e + count * sizeof(struct segment))) == NULL) {
        PyBuffer_Release(&packed);
        return PyErr_NoMemory();
    } else {
        memcpy(e->segments, packed.buf, count * sizeof(struct segment));
        uint64_t at = 0;
        for (size_t i = 0; i < count && problem == NULL; i++) {
            const struct segment *s = &e->segments[i];
            if (s->start != at || s->length == 0 || (s->fd >= 0 && (s->offset < 0 || s->fd > INT32_MAX)))
                problem = "register: segments must be contiguous, non-empty, with valid descriptors";
            else if (s->program != 0 && (s->fd < 0 || !program_fits(s)))
                problem = "register: a computed segment's program does not fit it";
            at += s->length;
        }
        if (problem == NULL && at != length)
            problem = "register: segments must cover the file exactly";
    }
    PyBuffer_Release(&packed);
    if (problem != NULL) {
        free(e);
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    e->fh = fh;
    e->kind = kind;
    e->length = length;
    e->count = count;
    e->next = NULL;
    atomic_init(&e->refs, 1);
    int added = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&table_lock);
    for (struct entry *at = table[fh % BUCKETS]; at != NULL; at = at->next)
        if (at->fh == fh)
            added = 0;
    if (added) {
        e->next = table[fh % BUCKETS];
        table[fh % BUCKETS] = e;
        atomic_fetch_add(&registered, 1);
    }
    pthread_rwlock_unlock(&table_lock);
    Py_END_ALLOW_THREADS
    if (!added)
        free(e);
    return PyBool_FromLong(added);
}

/* unregister(fh) -> whether fh was registered; returns once no read uses its descriptors or memory. */
static PyObject *unregister_handle(PyObject *self, PyObject *args) {
    unsigned long long fh;
    if (!PyArg_ParseTuple(args, "K", &fh))
        return NULL;
    struct entry *found = NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&table_lock);
    for (struct entry **at = &table[fh % BUCKETS]; *at != NULL; at = &(*at)->next)
        if ((*at)->fh == fh) {
            found = *at;
            *at = found->next;
            break;
        }
    pthread_rwlock_unlock(&table_lock);
    if (found != NULL)
        retire(found);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(found != NULL);
}

/* counters() -> ([(reads, bytes) per kind slot], reads handed back to Python, entries alive, short replies
 * refused) */
static PyObject *counters(PyObject *self, PyObject *unused) {
    PyObject *kinds = PyList_New(KINDS);
    if (kinds == NULL)
        return NULL;
    for (int i = 0; i < KINDS; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)atomic_load(&served_reads[i]),
                                       (unsigned long long)atomic_load(&served_bytes[i]));
        if (pair == NULL) {
            Py_DECREF(kinds);
            return NULL;
        }
        PyList_SET_ITEM(kinds, i, pair);
    }
    return Py_BuildValue("(NKlK)", kinds, (unsigned long long)atomic_load(&handed_back),
                         (long)atomic_load(&registered), (unsigned long long)atomic_load(&short_replies));
}

/* chunk_sum(data) -> the served-checksum sum of `data` (the value sources/served.py computes; for tests). */
static PyObject *chunk_sum_py(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    uint64_t sum = chunk_sum((const unsigned char *)data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(sum);
}

static PyMethodDef methods[] = {
    {"chunk_sum", chunk_sum_py, METH_VARARGS, "chunk_sum(data) -> the served-checksum sum of data"},
    {"install", install, METH_VARARGS,
     "install(python_read_address, fh_offset) -> address of the C read callback"},
    {"register", register_handle, METH_VARARGS,
     "register(fh, kind, length, segments) -> False when fh is registered already"},
    {"unregister", unregister_handle, METH_VARARGS,
     "unregister(fh) -> whether it was registered; returns once no read uses it"},
    {"counters", counters, METH_NOARGS,
     "counters() -> ([(reads, bytes) per kind slot], reads handed back to Python, entries alive, short replies)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_direct", NULL, -1, methods};

PyMODINIT_FUNC PyInit__direct(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "KINDS", KINDS) != 0 ||
        PyModule_AddIntConstant(m, "PROGRAM_SIZE", (long)sizeof(struct program)) != 0 ||
        PyModule_AddIntConstant(m, "SEGMENT_SIZE", (long)sizeof(struct segment)) != 0 ||
        PyModule_AddIntConstant(m, "SUM_CHUNK", SUM_CHUNK) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
