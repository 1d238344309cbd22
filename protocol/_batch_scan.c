/* Compiled form of protocol/records.py's scan_batches_py: the header pass of validate_batches over a Produce
 * payload (same checks in the same order, same messages, same summary; see that function).
 *
 * Per batch: the 61-byte header, batchLength against what remains, magic, the CRC-32C of attributes..end (the
 * SSE4.2 instruction where the CPU has it, a table elsewhere), recordsCount and lastOffsetDelta, the client rules
 * (records present, consecutive deltas, no control batches) and the codec. The records themselves are walked by
 * protocol/_record_walk.c afterwards, batch by batch in Python (a compressed batch must be inflated first). The
 * Python function stays the reference and the fallback when this extension is not built or KBROKER_PURE_PYTHON is
 * set; tests/protocol/test_batch_scan.py checks that both agree on generated and hostile payloads.
 *
 * configure(RecordBatchHeader)   once: the slot offsets of the header dataclass
 * scan(buf, from_client, replicated)
 *   -> ([(pos, RecordBatchHeader)], num_records, valid_bytes, first_ts, last_ts, max_ts, max_ts_batch, error)
 *   error: None, or (corrupt: bool, message): the first fault, after the batches before it (which the caller
 *   walks first, so the first failing batch decides the answer as in the one-pass Python loop).
 *
 * plain(buf, walk, compacted, check_ts, ts_low, ts_high) -> RecordBatchHeader | None
 *   the leader's fast path (protocol/records.py's plain_client_batch): see below.
 *
 * write_plain(buf, fd, position, base_offset, leader_epoch, since, interval, max_ts, max_ts_offset)
 *   -> (last_offset, since, indexed, max_ts, max_ts_offset)
 *   the same fast path's write (storage/leader_append.py's write_plain_py): see below.
 *
 * configure_metadata(BatchMetadata)   once: the slot offsets of storage/producer_state.py's BatchMetadata
 * next_batch(batches, base_sequence, last_offset_delta, first_offset, max_timestamp) -> BatchMetadata | None
 *   the same fast path's producer-state check (storage/leader_append.py's next_batch_py): see below.
 *
 * append_plain(buf, walk, compacted, check_ts, ts_low, ts_high, producers, fd, position, base_offset,
 *              leader_epoch, since, interval, max_ts, max_ts_offset, room, max_delta) -> tuple | None
 *   plain, the producer's checks, next_batch and write_plain in one call (storage/leader_append.py's
 *   append_plain_py): see below.
 *
 * Every read is bounds-checked against the buffer; headers are built straight into the dataclass's slots.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { HEADER_SIZE = 61, LOG_OVERHEAD = 12, BATCH_OVERHEAD = HEADER_SIZE - LOG_OVERHEAD, CRC_START = 21 };
enum { ATTR_COMPRESSION_MASK = 0x07, ATTR_CONTROL = 0x20, COMPRESSION_ZSTD = 4 };
enum { NFIELDS = 13 };
/* Batches from this size on are checked with the GIL released: below it, releasing costs more than it frees. */
enum { GIL_FREE_CRC = 64 * 1024 };

static const char *const FIELD_NAMES[NFIELDS] = {
    "base_offset", "batch_length", "partition_leader_epoch", "magic", "crc", "attributes", "last_offset_delta",
    "base_timestamp", "max_timestamp", "producer_id", "producer_epoch", "base_sequence", "records_count",
};

static PyTypeObject *header_cls;           /* RecordBatchHeader, set by configure() */
static Py_ssize_t field_offset[NFIELDS];  /* its slots, in FIELD_NAMES order */

/* ------------------------------------------------------------------------------------------------ CRC-32C */

static uint32_t crc_table[256];

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
}

static uint32_t crc32c_table(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n--)
        crc = (crc >> 8) ^ crc_table[(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8); /* unaligned-safe; the instruction takes the bytes in memory order */
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#else
#define HAVE_HW_CRC 0
#endif

static int use_hw_crc;

static uint32_t crc32c(const uint8_t *p, size_t n, int hw)
{
#if HAVE_HW_CRC
    if (hw)
        return ~crc32c_hw(0xFFFFFFFFu, p, n);
#endif
    return ~crc32c_table(0xFFFFFFFFu, p, n);
}

/* ------------------------------------------------------------------------------------------------ scanning */

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

typedef struct {
    int64_t base_offset;
    int32_t batch_length;
    int32_t partition_leader_epoch;
    int8_t magic;
    uint32_t crc;
    int16_t attributes;
    int32_t last_offset_delta;
    int64_t base_timestamp;
    int64_t max_timestamp;
    int64_t producer_id;
    int16_t producer_epoch;
    int32_t base_sequence;
    int32_t records_count;
} Header;

static void parse(const uint8_t *p, Header *h)
{
    h->base_offset = (int64_t)be64(p);
    h->batch_length = (int32_t)be32(p + 8);
    h->partition_leader_epoch = (int32_t)be32(p + 12);
    h->magic = (int8_t)p[16];
    h->crc = be32(p + 17);
    h->attributes = (int16_t)be16(p + 21);
    h->last_offset_delta = (int32_t)be32(p + 23);
    h->base_timestamp = (int64_t)be64(p + 27);
    h->max_timestamp = (int64_t)be64(p + 35);
    h->producer_id = (int64_t)be64(p + 43);
    h->producer_epoch = (int16_t)be16(p + 51);
    h->base_sequence = (int32_t)be32(p + 53);
    h->records_count = (int32_t)be32(p + 57);
}

/* An instance of a slots dataclass with its n int fields set straight into their slots (offsets), as its
 * __init__ would set them; frozen dataclasses included (their __setattr__ only refuses later changes). */
static PyObject *slotted(PyTypeObject *cls, const Py_ssize_t *offsets, const long long *values, int n)
{
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (v == NULL) {
            Py_DECREF(obj);
            return NULL;
        }
        *(PyObject **)((char *)obj + offsets[i]) = v;
    }
    return obj;
}

static PyObject *header_object(const Header *h)
{
    const long long values[NFIELDS] = {
        h->base_offset, h->batch_length, h->partition_leader_epoch, h->magic, h->crc, h->attributes,
        h->last_offset_delta, h->base_timestamp, h->max_timestamp, h->producer_id, h->producer_epoch,
        h->base_sequence, h->records_count,
    };
    return slotted(header_cls, field_offset, values, NFIELDS);
}

/* The fault found at a batch: (corrupt, message). */
static PyObject *fault(int corrupt, const char *message)
{
    return Py_BuildValue("(Os)", corrupt ? Py_True : Py_False, message);
}

static PyObject *scan(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(buf, from_client, replicated)");
        return NULL;
    }
    if (header_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure(RecordBatchHeader) first");
        return NULL;
    }
    int from_client = PyObject_IsTrue(args[1]);
    int replicated = PyObject_IsTrue(args[2]);
    if (from_client < 0 || replicated < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *b = view.buf;
    const Py_ssize_t end = view.len;
    PyObject *batches = PyList_New(0);
    PyObject *error = NULL;
    if (batches == NULL)
        goto fail;
    long long num_records = 0, first_ts = -1, last_ts = -1, max_ts = -1;
    Py_ssize_t max_ts_batch = -1, pos = 0;
    char msg[200];
    while (pos < end) {
        Py_ssize_t remaining = end - pos;
        Header h;
        if (remaining < HEADER_SIZE) {
            if (replicated)
                break;
            snprintf(msg, sizeof msg, "truncated batch header at position %zd: %zd bytes left", pos, remaining);
            error = fault(1, msg);
            break;
        }
        parse(b + pos, &h);
        if (h.batch_length < BATCH_OVERHEAD) {
            snprintf(msg, sizeof msg, "batch at position %zd has batchLength %d < %d", pos, (int)h.batch_length,
                     BATCH_OVERHEAD);
            error = fault(1, msg);
            break;
        }
        int64_t size = (int64_t)h.batch_length + LOG_OVERHEAD;
        if (size > remaining) {
            if (replicated)
                break;
            snprintf(msg, sizeof msg, "batch at position %zd claims %lld bytes but only %zd remain", pos,
                     (long long)size, remaining);
            error = fault(1, msg);
            break;
        }
        if (h.magic != 2) {
            snprintf(msg, sizeof msg, "batch at position %zd has unsupported magic %d", pos, (int)h.magic);
            error = fault(1, msg);
            break;
        }
        uint32_t actual;
        if (size >= GIL_FREE_CRC) {
            /* The buffer is exported (a bytearray cannot be resized meanwhile): other network threads run while
             * a large batch is checked. */
            Py_BEGIN_ALLOW_THREADS
            actual = crc32c(b + pos + CRC_START, (size_t)(size - CRC_START), use_hw_crc);
            Py_END_ALLOW_THREADS
        } else {
            actual = crc32c(b + pos + CRC_START, (size_t)(size - CRC_START), use_hw_crc);
        }
        if (actual != h.crc) {
            /* Python's {:#010x}: 0x and eight digits, also for zero (C's # flag drops the 0x there). */
            snprintf(msg, sizeof msg, "batch at position %zd has CRC 0x%08x, computed 0x%08x", pos,
                     (unsigned)h.crc, (unsigned)actual);
            error = fault(1, msg);
            break;
        }
        int32_t count = h.records_count;
        if (count < 0) {
            snprintf(msg, sizeof msg, "batch at position %zd has negative recordsCount %d", pos, (int)count);
            error = fault(0, msg);
            break;
        }
        if (h.last_offset_delta < 0) {
            snprintf(msg, sizeof msg, "batch at position %zd has negative lastOffsetDelta %d", pos,
                     (int)h.last_offset_delta);
            error = fault(0, msg);
            break;
        }
        if (from_client) {
            if (count == 0) {
                snprintf(msg, sizeof msg, "batch at position %zd has no records", pos);
                error = fault(0, msg);
                break;
            }
            if ((int64_t)h.last_offset_delta != (int64_t)count - 1) {
                snprintf(msg, sizeof msg, "batch at position %zd has lastOffsetDelta %d inconsistent with "
                         "recordsCount %d", pos, (int)h.last_offset_delta, (int)count);
                error = fault(0, msg);
                break;
            }
            if (h.attributes & ATTR_CONTROL) {
                error = fault(0, "clients are not allowed to write control records");
                break;
            }
        } else if ((int64_t)count > (int64_t)h.last_offset_delta + 1) {
            snprintf(msg, sizeof msg, "batch at position %zd has %d records for lastOffsetDelta %d", pos,
                     (int)count, (int)h.last_offset_delta);
            error = fault(0, msg);
            break;
        }
        int codec = h.attributes & ATTR_COMPRESSION_MASK;
        if (codec > COMPRESSION_ZSTD) {
            snprintf(msg, sizeof msg, "batch at position %zd uses unknown compression codec %d", pos, codec);
            error = fault(0, msg);
            break;
        }
        PyObject *header = header_object(&h);
        if (header == NULL)
            goto fail;
        PyObject *item = Py_BuildValue("(nN)", pos, header);
        if (item == NULL || PyList_Append(batches, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        num_records += count;
        if (first_ts == -1)
            first_ts = h.base_timestamp;
        last_ts = h.max_timestamp;
        if (h.max_timestamp > max_ts) {
            max_ts = h.max_timestamp;
            max_ts_batch = PyList_GET_SIZE(batches) - 1;
        }
        pos += (Py_ssize_t)size;
    }
    if (error == NULL) {
        if (PyErr_Occurred())
            goto fail;
        error = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NLnLLLnN)", batches, num_records, pos, first_ts, last_ts, max_ts, max_ts_batch, error);
fail:
    Py_XDECREF(batches);
    Py_XDECREF(error);
    PyBuffer_Release(&view);
    return NULL;
}

/* plain(buf, walk, compacted, check_ts, ts_low, ts_high) -> RecordBatchHeader | None: protocol/records.py's
 * plain_client_batch_py in one call. The header when buf is exactly one uncompressed, CreateTime, non-control
 * client batch (transactional or not: the caller judges the producer's transaction) that passes every check of scan (client rules) and whose records walk (protocol/_record_walk.c's
 * walk, passed in) finds sound with nothing to report; None for anything else, which the caller then sends the
 * general way (validate_batches), so no message is needed here. */
enum { ATTR_TIMESTAMP_TYPE = 0x08 };

static int as_int64(PyObject *o, long long *out)
{
    *out = PyLong_AsLongLong(o);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* protocol/_record_walk.c's walk as a C function (its _walk_api capsule), with the walk object it belongs to:
 * plain_check calls it directly when it is handed that walk, without a memoryview and an argument tuple to
 * build and parse (a third of a small batch's check). Looked up once; NULL when it cannot be. */
typedef PyObject *(*walk_body_fn)(const uint8_t *, Py_ssize_t, long long, int, long long, int, long long, int,
                                  long long, long long);
static walk_body_fn direct_walk;
static PyObject *direct_walk_obj;
static int direct_walk_looked_up;

static void look_up_direct_walk(void)
{
    direct_walk_looked_up = 1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *m = PyImport_ImportModule("kbroker.protocol._record_walk");
    PyObject *obj = m != NULL ? PyObject_GetAttrString(m, "walk") : NULL;
    walk_body_fn *api = obj != NULL ? PyCapsule_Import("kbroker.protocol._record_walk._walk_api", 0) : NULL;
    if (api != NULL) {
        direct_walk = api[0];
        direct_walk_obj = Py_NewRef(obj);
    }
    Py_XDECREF(obj);
    Py_XDECREF(m);
    PyErr_Clear(); /* without the capsule every walk is called as the object it is */
    PyErr_Restore(type, value, tb);
}

/* plain()'s test of the batch b[0:end] (its header parsed into *h): 1 when it is a plain client batch, 0 when
 * not, -1 with an exception (the walk raised). walk_args: (walk, compacted, check_ts, ts_low, ts_high). */
static int plain_check(const uint8_t *b, Py_ssize_t end, Header *h, PyObject *const *walk_args)
{
    if (end < HEADER_SIZE)
        return 0;
    parse(b, h);
    if (h->batch_length < BATCH_OVERHEAD || (int64_t)h->batch_length + LOG_OVERHEAD != (int64_t)end || h->magic != 2)
        return 0;
    if (h->records_count <= 0 || (int64_t)h->last_offset_delta != (int64_t)h->records_count - 1)
        return 0;
    if (h->attributes & (ATTR_COMPRESSION_MASK | ATTR_TIMESTAMP_TYPE | ATTR_CONTROL))
        return 0;
    uint32_t actual;
    if (end >= GIL_FREE_CRC) {
        Py_BEGIN_ALLOW_THREADS
        actual = crc32c(b + CRC_START, (size_t)(end - CRC_START), use_hw_crc);
        Py_END_ALLOW_THREADS
    } else {
        actual = crc32c(b + CRC_START, (size_t)(end - CRC_START), use_hw_crc);
    }
    if (actual != h->crc)
        return 0;
    if (!direct_walk_looked_up)
        look_up_direct_walk();
    if (direct_walk != NULL && walk_args[0] == direct_walk_obj) {
        /* walk's own argument conversion: need_keys and check_ts by truth, the bounds as int64s */
        const int need_keys = PyObject_IsTrue(walk_args[1]), check_ts = PyObject_IsTrue(walk_args[2]);
        long long low, high;
        if (need_keys < 0 || check_ts < 0 || as_int64(walk_args[3], &low) < 0 || as_int64(walk_args[4], &high) < 0)
            return -1;
        PyObject *found = direct_walk(b + HEADER_SIZE, end - HEADER_SIZE, h->records_count, 1,
                                      h->last_offset_delta, need_keys, h->base_timestamp, check_ts, low, high);
        if (found == NULL)
            return -1;
        const int sound = found == Py_None;
        Py_DECREF(found);
        return sound;
    }
    PyObject *body = PyMemoryView_FromMemory((char *)b + HEADER_SIZE, end - HEADER_SIZE, PyBUF_READ);
    if (body == NULL)
        return -1;
    PyObject *count = PyLong_FromLong(h->records_count);
    PyObject *lod = PyLong_FromLong(h->last_offset_delta);
    PyObject *base_ts = PyLong_FromLongLong(h->base_timestamp);
    PyObject *found = NULL;
    if (count != NULL && lod != NULL && base_ts != NULL) {
        PyObject *wargs[9] = {body, count, Py_True, lod, walk_args[1], base_ts, walk_args[2], walk_args[3],
                              walk_args[4]};
        found = PyObject_Vectorcall(walk_args[0], wargs, 9, NULL);
    }
    Py_XDECREF(count);
    Py_XDECREF(lod);
    Py_XDECREF(base_ts);
    /* The body points into buf without holding it: should the walk have kept a reference, the view is released
     * here, before buf is (release() refuses while the view is exported: then this call fails). */
    if (Py_REFCNT(body) > 1) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *released = PyObject_CallMethod(body, "release", NULL);
        if (released == NULL) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            Py_XDECREF(found);
            Py_DECREF(body);
            return -1;
        }
        Py_DECREF(released);
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(body);
    if (found == NULL)
        return -1;
    const int sound = found == Py_None;
    Py_DECREF(found);
    return sound;
}

static PyObject *plain(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "plain(buf, walk, compacted, check_ts, ts_low, ts_high)");
        return NULL;
    }
    if (header_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure(RecordBatchHeader) first");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Header h;
    const int ok = plain_check(view.buf, view.len, &h, args + 1);
    PyObject *result = ok < 0 ? NULL : ok ? header_object(&h) : Py_NewRef(Py_None);
    PyBuffer_Release(&view);
    return result;
}

/* write_plain(buf, fd, position, base_offset, leader_epoch, since, interval, max_ts, max_ts_offset)
 *   -> (last_offset, since, indexed, max_ts, max_ts_offset)
 * storage/leader_append.py's write_plain_py in one call: the leader's write of one batch that plain() passed. Sets
 * its baseOffset and (leader_epoch not None) partitionLeaderEpoch in buf, both outside the CRC; writes buf whole at
 * position of fd with the GIL released (a short write continues; on an error the file is cut back to position and
 * OSError raised); then the segment's index bookkeeping of LogSegment._index_batches for this one batch: the
 * segment's largest timestamp and its offset, whether the offset and time indexes get an entry at position (more
 * than interval bytes since the last), and the bytes since the last entry after it. */
enum { OFF_BATCH_LENGTH = 8, OFF_LEADER_EPOCH = 12, OFF_LAST_OFFSET_DELTA = 23, OFF_MAX_TIMESTAMP = 35 };

static inline void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}


/* write_plain()'s write: base_offset (and the leader epoch when has_epoch) set in b, then b[0:len] written at
 * position of fd with the GIL released (a short write continues; on an error the file is cut back to position).
 * 0, or the errno. */
static int write_batch(uint8_t *b, Py_ssize_t len, int fd, long long position, long long base_offset,
                       int has_epoch, long long epoch)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)base_offset >> (56 - 8 * i));
    if (has_epoch)
        put_be32(b + OFF_LEADER_EPOCH, (uint32_t)(int32_t)epoch);
    Py_ssize_t done = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < len) {
        ssize_t n = pwrite(fd, b + done, (size_t)(len - done), (off_t)(position + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        done += n;
    }
    if (err && ftruncate(fd, (off_t)position) < 0) {
        /* the next append overwrites the tail at position anyway */
    }
    Py_END_ALLOW_THREADS
    return err;
}

/* write_plain's and append_plain's numbers after the buffer: fd, position, base_offset, leader_epoch (None: no
 * epoch to set), since, interval, max_ts, max_ts_offset, converted and checked (fn names the caller in the error).
 * 0, or -1 with an exception. */
typedef struct {
    long long fd, position, base_offset, epoch, since, interval, max_ts, max_ts_offset;
    int has_epoch;
} WriteArgs;

static int write_args(PyObject *const *a, WriteArgs *w, const char *fn)
{
    w->epoch = -1;
    w->has_epoch = a[3] != Py_None;
    if (as_int64(a[0], &w->fd) < 0 || as_int64(a[1], &w->position) < 0 || as_int64(a[2], &w->base_offset) < 0 ||
        (w->has_epoch && as_int64(a[3], &w->epoch) < 0) || as_int64(a[4], &w->since) < 0 ||
        as_int64(a[5], &w->interval) < 0 || as_int64(a[6], &w->max_ts) < 0 || as_int64(a[7], &w->max_ts_offset) < 0)
        return -1;
    if (w->fd < 0 || w->fd > INT32_MAX || w->position < 0 || w->base_offset < 0 ||
        (w->has_epoch && (w->epoch < INT32_MIN || w->epoch > INT32_MAX))) {
        PyErr_Format(PyExc_ValueError, "%s: fd, position, base_offset or leader_epoch out of range", fn);
        return -1;
    }
    return 0;
}

/* LogSegment._index_batches for the one batch written (len bytes, last offset last): the segment's largest
 * timestamp and its offset, whether the indexes get an entry, and the bytes since the last entry after it. */
static int index_numbers(WriteArgs *w, long long last, long long batch_max_ts, Py_ssize_t len)
{
    if (batch_max_ts > w->max_ts) {
        w->max_ts = batch_max_ts;
        w->max_ts_offset = last;
    }
    const int indexed = w->since > w->interval;
    w->since = (indexed ? 0 : w->since) + len;
    return indexed;
}

static PyObject *write_plain(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "write_plain(buf, fd, position, base_offset, leader_epoch, since, interval, max_ts, "
                        "max_ts_offset)");
        return NULL;
    }
    WriteArgs w;
    if (write_args(args + 1, &w, "write_plain") < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    uint8_t *b = view.buf;
    const Py_ssize_t len = view.len;
    if (len < HEADER_SIZE || (int64_t)(int32_t)be32(b + OFF_BATCH_LENGTH) + LOG_OVERHEAD != (int64_t)len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "write_plain: buf is not one whole batch");
        return NULL;
    }
    const int64_t lod = (int32_t)be32(b + OFF_LAST_OFFSET_DELTA);
    if (w.base_offset > INT64_MAX - (lod > 0 ? lod : 0)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "write_plain: base_offset out of range");
        return NULL;
    }
    if (w.since <= w.interval && w.since > INT64_MAX - len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "write_plain: since out of range");
        return NULL;
    }
    const int err = write_batch(b, len, (int)w.fd, w.position, w.base_offset, w.has_epoch, w.epoch);
    if (err) {
        PyBuffer_Release(&view);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    const int64_t last = w.base_offset + lod;
    const int64_t batch_max_ts = (int64_t)be64(b + OFF_MAX_TIMESTAMP);
    PyBuffer_Release(&view);
    const int indexed = index_numbers(&w, last, batch_max_ts, len);
    return Py_BuildValue("(LLOLL)", (long long)last, w.since, indexed ? Py_True : Py_False, w.max_ts, w.max_ts_offset);
}

/* ------------------------------------------------------------------------------------------------ producers */

enum { META_FIELDS = 5, INT32_WRAP = 0x7FFFFFFF };
static const char *const META_NAMES[META_FIELDS] = {
    "first_seq", "last_seq", "first_offset", "last_offset", "max_timestamp",
};
static PyTypeObject *metadata_cls;             /* BatchMetadata, set by configure_metadata() */
static Py_ssize_t meta_offset[META_FIELDS];   /* its slots, in META_NAMES order */

/* The offsets of cls's object slots named in names: 0, or -1 with TypeError when one is not such a slot. */
static int slot_offsets(PyTypeObject *type, const char *const *names, int n, Py_ssize_t *out)
{
    for (int i = 0; i < n; i++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, names[i]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, names[i]);
            return -1;
        }
        out[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    return 0;
}

/* configure() and configure_metadata(): keep cls in *kept and its slots' offsets. */
static PyObject *configure_class(PyObject *cls, const char *const *names, int n, Py_ssize_t *offsets,
                                 PyTypeObject **kept)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "configure: a class");
        return NULL;
    }
    if (slot_offsets((PyTypeObject *)cls, names, n, offsets) < 0)
        return NULL;
    Py_XSETREF(*kept, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyObject *configure_metadata(PyObject *mod, PyObject *cls)
{
    return configure_class(cls, META_NAMES, META_FIELDS, meta_offset, &metadata_cls);
}

/* Field i of a BatchMetadata as an int64: 0, or -1 with an exception (an unset slot, a value that is no int64). */
static int meta_field(PyObject *m, int i, long long *out)
{
    PyObject *v = *(PyObject **)((char *)m + meta_offset[i]);
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(m)->tp_name, META_NAMES[i]);
        return -1;
    }
    return as_int64(v, out);
}

/* next_batch()'s check once its numbers are in range: a new BatchMetadata, None, or NULL with an exception. */
static PyObject *next_meta(PyObject *batches, long long base_seq, long long lod, long long first_offset,
                           long long max_ts)
{
    PyObject *seq = PySequence_Fast(batches, "next_batch: batches must be a sequence");
    if (seq == NULL)
        return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!Py_IS_TYPE(items[i], metadata_cls)) {
            PyErr_Format(PyExc_TypeError, "next_batch: batches hold %s, not %s", Py_TYPE(items[i])->tp_name,
                         metadata_cls->tp_name);
            goto fail;
        }
    }
    long long last_seq = -1; /* NO_SEQUENCE: a producer without retained batches */
    if (n > 0 && meta_field(items[n - 1], 1, &last_seq) < 0)
        goto fail;
    /* base_seq - 1, not last_seq + 1: a snapshot's last_seq may be INT64_MAX (found by the sanitized fuzz) */
    if (base_seq < 0 || !(base_seq - 1 == last_seq || (base_seq == 0 && last_seq == INT32_WRAP))) {
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    /* Python's %, never negative: (base + lod) mod 2^31 */
    long long last = (base_seq + lod) % ((long long)INT32_WRAP + 1);
    if (last < 0)
        last += (long long)INT32_WRAP + 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long f, l;
        if (meta_field(items[i], 0, &f) < 0 || meta_field(items[i], 1, &l) < 0)
            goto fail;
        if (f == base_seq && l == last) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
    }
    Py_DECREF(seq);
    const long long values[META_FIELDS] = {base_seq, last, first_offset, first_offset + lod, max_ts};
    return slotted(metadata_cls, meta_offset, values, META_FIELDS);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* next_batch(batches, base_sequence, last_offset_delta, first_offset, max_timestamp) -> BatchMetadata | None
 * storage/leader_append.py's next_batch_py in one call: the metadata a producer's entry gains (after the write) for
 * its next batch, when the batch's base sequence follows the entry's last (batches: its retained BatchMetadata,
 * oldest first; sequences wrap from Int32 max to 0) and its sequence range is none of the retained batches'; None
 * for anything else (a gap, a retry, no sequence), which the general path then answers. The batches' fields are
 * int64s (they come from batch headers and snapshots). */
static PyObject *next_batch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "next_batch(batches, base_sequence, last_offset_delta, first_offset, max_timestamp)");
        return NULL;
    }
    if (metadata_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_metadata(BatchMetadata) first");
        return NULL;
    }
    long long base_seq, lod, first_offset, max_ts;
    if (as_int64(args[1], &base_seq) < 0 || as_int64(args[2], &lod) < 0 || as_int64(args[3], &first_offset) < 0 ||
        as_int64(args[4], &max_ts) < 0)
        return NULL;
    if (base_seq > INT32_MAX || lod < INT32_MIN || lod > INT32_MAX || first_offset < 0 ||
        first_offset > INT64_MAX - INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "next_batch: base_sequence, last_offset_delta or first_offset out of range");
        return NULL;
    }
    return next_meta(args[0], base_seq, lod, first_offset, max_ts);
}

/* append_plain(buf, walk, compacted, check_ts, ts_low, ts_high, producers, fd, position, base_offset, leader_epoch,
 *              since, interval, max_ts, max_ts_offset, room, max_delta)
 *   -> (last_offset, since, indexed, max_ts, max_ts_offset, batch_max_ts, records_count, entry, added) | None
 * storage/leader_append.py's append_plain_py in one call: plain(), the producer's checks and next_batch(), then
 * write_plain(), for the leader's common append (Log._append_plain) of a batch that is not transactional into the
 * active segment without a roll. None, with nothing written or changed, when any step declines: not a plain batch,
 * a transactional one, more than room bytes or a last offset delta above max_delta (the segment would roll), a
 * producer unknown in producers (a dict by producer id) or at another epoch or inside a transaction, a batch out of
 * sequence or a retry. On success buf is written (its base offset and leader epoch set) and entry (the producer's,
 * None without a producer id) is returned with the BatchMetadata it gains; the caller updates both. */
static PyObject *str_producer_epoch, *str_current_txn_first_offset, *str_batch_metadata;

enum { ATTR_TRANSACTIONAL = 0x10 };

/* An attribute of entry as an int64 (is_none: it is None instead): 0, or -1 with an exception. */
static int entry_int(PyObject *entry, PyObject *name, long long *out, int *is_none)
{
    PyObject *v = PyObject_GetAttr(entry, name);
    if (v == NULL)
        return -1;
    *is_none = v == Py_None;
    const int r = *is_none ? 0 : as_int64(v, out);
    Py_DECREF(v);
    return r;
}

static PyObject *append_plain(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError,
                        "append_plain(buf, walk, compacted, check_ts, ts_low, ts_high, producers, fd, position, "
                        "base_offset, leader_epoch, since, interval, max_ts, max_ts_offset, room, max_delta)");
        return NULL;
    }
    if (metadata_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_metadata(BatchMetadata) first");
        return NULL;
    }
    if (!PyDict_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "append_plain: producers must be a dict");
        return NULL;
    }
    WriteArgs w;
    long long room, max_delta;
    if (write_args(args + 7, &w, "append_plain") < 0)
        return NULL;
    if (w.base_offset > INT64_MAX - INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "append_plain: fd, position, base_offset or leader_epoch out of range");
        return NULL;
    }
    if (as_int64(args[15], &room) < 0 || as_int64(args[16], &max_delta) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    uint8_t *b = view.buf;
    const Py_ssize_t len = view.len;
    PyObject *result = NULL, *entry = NULL, *added = NULL;
    if (w.since <= w.interval && w.since > INT64_MAX - len) {
        PyErr_SetString(PyExc_ValueError, "append_plain: since out of range");
        goto done;
    }
    Header h;
    const int ok = plain_check(b, len, &h, args + 1);
    if (ok < 0)
        goto done;
    if (!ok || h.attributes & ATTR_TRANSACTIONAL || len > room || h.last_offset_delta > max_delta)
        goto none;
    if (h.producer_id >= 0) {
        PyObject *pid = PyLong_FromLongLong(h.producer_id);
        if (pid == NULL)
            goto done;
        entry = PyDict_GetItemWithError(args[6], pid);
        Py_DECREF(pid);
        if (entry == NULL) {
            if (PyErr_Occurred())
                goto done;
            goto none;
        }
        Py_INCREF(entry);
        long long entry_epoch = 0;
        int is_none;
        if (entry_int(entry, str_producer_epoch, &entry_epoch, &is_none) < 0)
            goto done;
        if (is_none || entry_epoch != h.producer_epoch)
            goto none;
        long long txn_first;
        if (entry_int(entry, str_current_txn_first_offset, &txn_first, &is_none) < 0)
            goto done;
        if (!is_none)
            goto none;
        PyObject *batches = PyObject_GetAttr(entry, str_batch_metadata);
        if (batches == NULL)
            goto done;
        added = next_meta(batches, h.base_sequence, h.last_offset_delta, w.base_offset, h.max_timestamp);
        Py_DECREF(batches);
        if (added == NULL)
            goto done;
        if (added == Py_None)
            goto none;
    }
    const int err = write_batch(b, len, (int)w.fd, w.position, w.base_offset, w.has_epoch, w.epoch);
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    const long long last = w.base_offset + h.last_offset_delta;
    const int indexed = index_numbers(&w, last, h.max_timestamp, len);
    /* the tuple built item by item: Py_BuildValue's format parsing costs a tenth of this call */
    PyObject *items[9] = {
        PyLong_FromLongLong(last), PyLong_FromLongLong(w.since), Py_NewRef(indexed ? Py_True : Py_False),
        PyLong_FromLongLong(w.max_ts), PyLong_FromLongLong(w.max_ts_offset), PyLong_FromLongLong(h.max_timestamp),
        PyLong_FromLong(h.records_count), Py_NewRef(entry ? entry : Py_None), Py_NewRef(added ? added : Py_None),
    };
    result = PyTuple_New(9);
    for (int i = 0; i < 9; i++) {
        if (items[i] == NULL || result == NULL) {
            for (int j = i; j < 9; j++)
                Py_XDECREF(items[j]);
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, i, items[i]);
    }
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(entry);
    Py_XDECREF(added);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *configure(PyObject *mod, PyObject *cls)
{
    return configure_class(cls, FIELD_NAMES, NFIELDS, field_offset, &header_cls);
}

static PyObject *crc(PyObject *mod, PyObject *args)
{
    Py_buffer view;
    int table = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &table))
        return NULL;
    uint32_t c = crc32c(view.buf, (size_t)view.len, use_hw_crc && !table);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_O, "configure(RecordBatchHeader)"},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(buf, from_client, replicated) -> (batches, num_records, valid_bytes, first_ts, last_ts, max_ts, "
     "max_ts_batch, error)"},
    {"plain", (PyCFunction)(void (*)(void))plain, METH_FASTCALL,
     "plain(buf, walk, compacted, check_ts, ts_low, ts_high) -> RecordBatchHeader | None"},
    {"write_plain", (PyCFunction)(void (*)(void))write_plain, METH_FASTCALL,
     "write_plain(buf, fd, position, base_offset, leader_epoch, since, interval, max_ts, max_ts_offset) -> "
     "(last_offset, since, indexed, max_ts, max_ts_offset)"},
    {"configure_metadata", configure_metadata, METH_O, "configure_metadata(BatchMetadata)"},
    {"next_batch", (PyCFunction)(void (*)(void))next_batch, METH_FASTCALL,
     "next_batch(batches, base_sequence, last_offset_delta, first_offset, max_timestamp) -> BatchMetadata | None"},
    {"append_plain", (PyCFunction)(void (*)(void))append_plain, METH_FASTCALL,
     "append_plain(buf, walk, compacted, check_ts, ts_low, ts_high, producers, fd, position, base_offset, "
     "leader_epoch, since, interval, max_ts, max_ts_offset, room, max_delta) -> (last_offset, since, indexed, "
     "max_ts, max_ts_offset, batch_max_ts, records_count, entry, added) | None"},
    {"crc32c", crc, METH_VARARGS,
     "crc32c(buf, table=False): CRC-32C as scan computes it (table: the portable code, not the instruction)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kbroker.protocol._batch_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__batch_scan(void)
{
    crc_table_init();
    str_producer_epoch = PyUnicode_InternFromString("producer_epoch");
    str_current_txn_first_offset = PyUnicode_InternFromString("current_txn_first_offset");
    str_batch_metadata = PyUnicode_InternFromString("batch_metadata");
    if (str_producer_epoch == NULL || str_current_txn_first_offset == NULL || str_batch_metadata == NULL)
        return NULL;
#if HAVE_HW_CRC
    __builtin_cpu_init();
    use_hw_crc = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module);
}
