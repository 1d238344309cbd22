/* The Produce request's common case in one call each way (broker/produce_codec.py holds the Python references).
 *
 * decode(frame, pos, version)
 *   -> (transactional_id, acks, timeout_ms, [(name, [(index, records), ...]), ...], producer) or None
 *   A Produce v3-v11 body at frame[pos:] whose every partition carries records that pass Kafka's
 *   ProduceRequest.validateRecords (one magic-2 batch, zstd from v7); records are memoryview slices of the frame,
 *   as the generated decoder makes them. producer: (producer_id, producer_epoch) of the transactional batches, all
 *   of one producer and each the first batch of its records, or None when no batch header handle_produce's
 *   transactional scans read is transactional. None for anything else (malformed, null records or names, a
 *   refusal, transactional headers of two producers or after a partition's first batch): the caller then takes
 *   the general path, which decides the answer or the error. Trailing bytes are ignored, as the general path does.
 *
 * decode_frame(frame)
 *   -> (correlation_id, version, client_id, transactional_id, acks, timeout_ms, topics, producer) or None
 *   A whole Produce v3-v11 request frame (without its size): the request header (api key 0; client id, a classic
 *   nullable string in every header version; the tagged fields of header v2 from v9) and then decode's body, in
 *   one call and without a RequestHeader. None for any other api key or version, a header that does not decode,
 *   and whatever decode answers None for: the caller takes the general path, which decides.
 *
 * encode_response(correlation_id, version, throttle_ms, [(name, [(index, error_code, base_offset,
 *                 log_append_time_ms, log_start_offset, error_message, record_errors), ...]), ...]) -> bytearray
 *   The size-prefixed ProduceResponse v3-v11 frame the generated encoder writes for the same values, with the
 *   tagged current leader and node endpoints at their defaults. record_errors: None or [(batch_index, message)].
 *
 * Every read is bounds-checked against the buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { MIN_VERSION = 3, MAX_VERSION = 11, FLEXIBLE_VERSION = 9, ZSTD_VERSION = 7, RECORD_ERRORS_VERSION = 8,
       LOG_START_VERSION = 5 };
enum { LOG_OVERHEAD = 12, HEADER_SIZE = 61, SIZE_AT = 8, MAGIC_AT = 16, ATTRIBUTES_AT = 21, TXN_BYTE_AT = 22 };
enum { RECORD_OVERHEAD_V0 = 14, ATTR_COMPRESSION_MASK = 0x07, COMPRESSION_ZSTD = 4, ATTR_TRANSACTIONAL = 0x10 };
enum { MAX_STRING_LENGTH = 0x7fff };

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* ------------------------------------------------------------------------------------------------ decode */

typedef struct {
    const uint8_t *b;
    Py_ssize_t len;
    int flexible;
} Reader;

/* All readers return 0 on success, -1 when the bytes are not the common case (no Python error set). */

static int read_uvarint(const Reader *r, Py_ssize_t *pos, uint64_t *out)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (;;) {
        if (p >= r->len)
            return -1;
        uint8_t c = r->b[p++];
        result |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            break;
        shift += 7;
        if (shift > 28)
            return -1;
    }
    *pos = p;
    *out = result;
    return 0;
}

/* A length prefix: compact (uvarint of n+1) or classic (int16 for strings, int32 otherwise); -1 is null. */
static int read_length(const Reader *r, Py_ssize_t *pos, int classic16, int64_t *n)
{
    if (r->flexible) {
        uint64_t u;
        if (read_uvarint(r, pos, &u) < 0)
            return -1;
        *n = (int64_t)u - 1;
    } else if (classic16) {
        if (r->len - *pos < 2)
            return -1;
        *n = (int16_t)be16(r->b + *pos);
        *pos += 2;
    } else {
        if (r->len - *pos < 4)
            return -1;
        *n = (int32_t)be32(r->b + *pos);
        *pos += 4;
    }
    return *n < -1 ? -1 : 0;
}

/* The last string decoded from the same bytes, per kind (topic names, client ids): a producer's requests repeat
 * them, and the cached object saves the UTF-8 decode and allocation (about 700 instructions each). Module state,
 * used with the GIL held, as the module's other statics. */
enum { CACHED_STRING_MAX = 64 };
typedef struct {
    PyObject *s;
    Py_ssize_t n;
    char b[CACHED_STRING_MAX];
} StringCache;
static StringCache name_cache, client_id_cache;

static PyObject *decode_utf8(StringCache *c, const char *b, Py_ssize_t n)
{
    if (c != NULL && c->s != NULL && c->n == n && memcmp(c->b, b, (size_t)n) == 0)
        return Py_NewRef(c->s);
    PyObject *s = PyUnicode_DecodeUTF8(b, n, "strict");
    if (s != NULL && c != NULL && n <= CACHED_STRING_MAX) {
        Py_XSETREF(c->s, Py_NewRef(s));
        c->n = n;
        memcpy(c->b, b, (size_t)n);
    }
    return s;
}

/* A string; *out is None for null (the caller decides whether null is allowed). NULL return with an error set
 * only on memory failure; -1 without error for bytes that are not a valid string. cache: NULL or the kind's. */
static int read_string(const Reader *r, Py_ssize_t *pos, PyObject **out, StringCache *cache)
{
    int64_t n;
    Py_ssize_t p = *pos;
    *out = NULL;
    if (read_length(r, &p, 1, &n) < 0)
        return -1;
    if (n < 0) {
        *pos = p;
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (n > MAX_STRING_LENGTH || n > r->len - p)
        return -1;
    PyObject *s = decode_utf8(cache, (const char *)r->b + p, (Py_ssize_t)n);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return -2;
        PyErr_Clear();
        return -1;
    }
    *pos = p + (Py_ssize_t)n;
    *out = s;
    return 0;
}

static int skip_tagged(const Reader *r, Py_ssize_t *pos)
{
    if (!r->flexible)
        return 0;
    uint64_t count;
    Py_ssize_t p = *pos;
    if (read_uvarint(r, &p, &count) < 0)
        return -1;
    for (uint64_t k = 0; k < count; k++) {
        uint64_t tag, size;
        if (read_uvarint(r, &p, &tag) < 0 || read_uvarint(r, &p, &size) < 0)
            return -1;
        if ((int64_t)size > r->len - p)
            return -1;
        p += (Py_ssize_t)size;
    }
    *pos = p;
    return 0;
}

/* The producer of the request's transactional batches: found is 0 until one is seen. */
typedef struct {
    int found;
    int64_t id;
    int16_t epoch;
} Producer;

enum { PRODUCER_ID_AT = 43, PRODUCER_EPOCH_AT = 51 };

/* Kafka's ProduceRequest.validateRecords passes (broker/produce_validation.py), and of the batch headers the
 * transactional scans of handle_produce read only the first may be transactional, from the request's one
 * producer (noted in txn). */
static int plain_records(const uint8_t *d, Py_ssize_t len, long version, Producer *txn)
{
    if (len < LOG_OVERHEAD)
        return 0;
    int64_t size = (int32_t)be32(d + SIZE_AT);
    if (size < RECORD_OVERHEAD_V0 || len < MAGIC_AT + 1)
        return 0;
    if (d[MAGIC_AT] != 2 || size + LOG_OVERHEAD > len)
        return 0;
    if (version < ZSTD_VERSION && (be16(d + ATTRIBUTES_AT) & ATTR_COMPRESSION_MASK) == COMPRESSION_ZSTD)
        return 0;
    Py_ssize_t first = (Py_ssize_t)(size + LOG_OVERHEAD);
    Py_ssize_t remaining = len - first;
    if (remaining >= LOG_OVERHEAD) {
        int64_t size2 = (int32_t)be32(d + first + SIZE_AT);
        if (size2 < RECORD_OVERHEAD_V0)
            return 0; /* corrupt */
        if (remaining >= MAGIC_AT + 1) {
            int8_t magic2 = (int8_t)d[first + MAGIC_AT];
            if (magic2 < 0 || magic2 > 2 || size2 + LOG_OVERHEAD <= remaining)
                return 0; /* corrupt, or a second batch */
        }
    }
    Py_ssize_t pos = 0;
    while (len - pos >= HEADER_SIZE) {
        if (d[pos + MAGIC_AT] == 2 && (d[pos + TXN_BYTE_AT] & ATTR_TRANSACTIONAL)) {
            if (pos != 0)
                return 0;
            int64_t id = (int64_t)be64(d + PRODUCER_ID_AT);
            int16_t epoch = (int16_t)be16(d + PRODUCER_EPOCH_AT);
            if (txn->found && (txn->id != id || txn->epoch != epoch))
                return 0; /* a second producer: INVALID_PRODUCER_ID_MAPPING, the general path's answer */
            txn->found = 1;
            txn->id = id;
            txn->epoch = epoch;
        }
        int64_t s = (int32_t)be32(d + pos + SIZE_AT);
        if (s <= 0)
            break;
        pos += (Py_ssize_t)(s + LOG_OVERHEAD);
    }
    return 1;
}

/* The partitions of one topic; NULL with no error set: not the common case. */
static PyObject *decode_partitions(const Reader *r, Py_ssize_t *pos, PyObject *view, long version, Producer *txn)
{
    int64_t n;
    Py_ssize_t p = *pos;
    /* each partition takes at least 8 bytes (index, records length): a count that cannot fit allocates nothing */
    if (read_length(r, &p, 0, &n) < 0 || n < 0 || n > (r->len - p) / 5)
        return NULL;
    PyObject *parts = PyList_New((Py_ssize_t)n);
    if (parts == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        if (r->len - p < 4)
            goto no;
        int32_t index = (int32_t)be32(r->b + p);
        p += 4;
        int64_t size;
        if (read_length(r, &p, 0, &size) < 0 || size < 0 || size > r->len - p)
            goto no;
        if (!plain_records(r->b + p, (Py_ssize_t)size, version, txn))
            goto no;
        PyObject *records = PySequence_GetSlice(view, p, p + (Py_ssize_t)size);
        if (records == NULL)
            goto fail;
        p += (Py_ssize_t)size;
        if (skip_tagged(r, &p) < 0) {
            Py_DECREF(records);
            goto no;
        }
        PyObject *item = PyTuple_New(2), *index_obj = PyLong_FromLong(index);
        if (item == NULL || index_obj == NULL) {
            Py_XDECREF(item);
            Py_XDECREF(index_obj);
            Py_DECREF(records);
            goto fail;
        }
        PyTuple_SET_ITEM(item, 0, index_obj);
        PyTuple_SET_ITEM(item, 1, records);
        PyList_SET_ITEM(parts, i, item);
    }
    *pos = p;
    return parts;
no:
    Py_DECREF(parts);
    return NULL;
fail:
    Py_DECREF(parts);
    return NULL;
}

/* What decode returns of a body, owned references; 0 on success, -1 not the common case (no error set), -2 a
 * Python error. */
typedef struct {
    PyObject *txn_id, *topics;
    int16_t acks;
    int32_t timeout_ms;
    Producer txn;
} Body;

static int decode_body(PyObject *view, const Reader *rd, Py_ssize_t start, long version, Body *out)
{
    Reader r = *rd;
    r.flexible = version >= FLEXIBLE_VERSION;
    Py_ssize_t p = start;
    PyObject *txn_id = NULL, *topics = NULL;
    Producer txn = {0, 0, 0};
    int rc = read_string(&r, &p, &txn_id, NULL);
    if (rc == -2)
        goto fail;
    if (rc < 0 || r.len - p < 6)
        goto no;
    int16_t acks = (int16_t)be16(r.b + p);
    int32_t timeout_ms = (int32_t)be32(r.b + p + 2);
    p += 6;
    int64_t n;
    /* each topic takes at least 6 bytes (name length, partition count) */
    if (read_length(&r, &p, 0, &n) < 0 || n < 0 || n > (r.len - p) / 2)
        goto no;
    topics = PyList_New((Py_ssize_t)n);
    if (topics == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        PyObject *name;
        rc = read_string(&r, &p, &name, &name_cache);
        if (rc == -2)
            goto fail;
        if (rc < 0)
            goto no;
        if (name == Py_None) {
            Py_DECREF(name);
            goto no;
        }
        PyObject *parts = decode_partitions(&r, &p, view, version, &txn);
        if (parts == NULL) {
            Py_DECREF(name);
            if (PyErr_Occurred())
                goto fail;
            goto no;
        }
        if (skip_tagged(&r, &p) < 0) {
            Py_DECREF(name);
            Py_DECREF(parts);
            goto no;
        }
        PyObject *topic = PyTuple_Pack(2, name, parts);
        Py_DECREF(name);
        Py_DECREF(parts);
        if (topic == NULL)
            goto fail;
        PyList_SET_ITEM(topics, i, topic);
    }
    if (skip_tagged(&r, &p) < 0)
        goto no;
    out->txn_id = txn_id;
    out->topics = topics;
    out->acks = acks;
    out->timeout_ms = timeout_ms;
    out->txn = txn;
    return 0;
no:
    Py_XDECREF(txn_id);
    Py_XDECREF(topics);
    return -1;
fail:
    Py_XDECREF(txn_id);
    Py_XDECREF(topics);
    return -2;
}

/* The frame argument as a memoryview over a contiguous byte buffer (NULL with TypeError otherwise). */
static PyObject *byte_view(PyObject *frame, const char *fn)
{
    PyObject *view = PyMemoryView_FromObject(frame);
    if (view == NULL)
        return NULL;
    Py_buffer *buf = PyMemoryView_GET_BUFFER(view);
    if (!PyBuffer_IsContiguous(buf, 'C') || buf->itemsize != 1) {
        Py_DECREF(view);
        PyErr_Format(PyExc_TypeError, "%s: frame must be a contiguous byte buffer", fn);
        return NULL;
    }
    return view;
}

static PyObject *producer_or_none(const Producer *txn)
{
    if (!txn->found)
        return Py_NewRef(Py_None);
    return Py_BuildValue("(Lh)", (long long)txn->id, txn->epoch);
}

static PyObject *decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(frame, pos, version)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long version = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (version < MIN_VERSION || version > MAX_VERSION)
        Py_RETURN_NONE;
    PyObject *view = byte_view(args[0], "decode");
    if (view == NULL)
        return NULL;
    Py_buffer *buf = PyMemoryView_GET_BUFFER(view);
    if (start < 0 || start > buf->len) {
        Py_DECREF(view);
        Py_RETURN_NONE;
    }
    Reader r = {(const uint8_t *)buf->buf, buf->len, 0};
    Body body;
    int rc = decode_body(view, &r, start, version, &body);
    Py_DECREF(view);
    if (rc == -2)
        return NULL;
    if (rc < 0)
        Py_RETURN_NONE;
    PyObject *producer = producer_or_none(&body.txn);
    if (producer == NULL) {
        Py_DECREF(body.txn_id);
        Py_DECREF(body.topics);
        return NULL;
    }
    return Py_BuildValue("(NhiNN)", body.txn_id, body.acks, body.timeout_ms, body.topics, producer);
}

/* decode_frame(frame): the request header (Produce's: api key 0, v1 header before v9, v2 with its tagged fields
 * from v9) and the body in one call. */
enum { HEADER_FIXED = 8, PRODUCE_KEY = 0 };

static PyObject *decode_frame(PyObject *self, PyObject *frame)
{
    (void)self;
    PyObject *view = byte_view(frame, "decode_frame");
    if (view == NULL)
        return NULL;
    Py_buffer *buf = PyMemoryView_GET_BUFFER(view);
    Reader r = {(const uint8_t *)buf->buf, buf->len, 0};
    PyObject *client_id = NULL, *producer = NULL;
    if (r.len < HEADER_FIXED || be16(r.b) != PRODUCE_KEY)
        goto no;
    long version = (int16_t)be16(r.b + 2);
    if (version < MIN_VERSION || version > MAX_VERSION)
        goto no;
    int32_t correlation_id = (int32_t)be32(r.b + 4);
    Py_ssize_t p = HEADER_FIXED;
    /* the client id is a classic nullable string in every header version */
    int rc = read_string(&r, &p, &client_id, &client_id_cache);
    if (rc == -2)
        goto fail;
    if (rc < 0)
        goto no;
    if (version >= FLEXIBLE_VERSION) {
        r.flexible = 1;
        if (skip_tagged(&r, &p) < 0)
            goto no;
        r.flexible = 0;
    }
    Body body;
    rc = decode_body(view, &r, p, version, &body);
    if (rc == -2)
        goto fail;
    if (rc < 0)
        goto no;
    producer = producer_or_none(&body.txn);
    if (producer == NULL) {
        Py_DECREF(body.txn_id);
        Py_DECREF(body.topics);
        goto fail;
    }
    Py_DECREF(view);
    /* the tuple built item by item: Py_BuildValue's format parsing costs as much as the rest of the packing */
    PyObject *out = PyTuple_New(8);
    PyObject *ints[4] = {PyLong_FromLong(correlation_id), PyLong_FromLong(version), PyLong_FromLong(body.acks),
                         PyLong_FromLong(body.timeout_ms)};
    PyObject *items[8] = {ints[0], ints[1], client_id, body.txn_id, ints[2], ints[3], body.topics, producer};
    if (out == NULL || ints[0] == NULL || ints[1] == NULL || ints[2] == NULL || ints[3] == NULL) {
        Py_XDECREF(out);
        for (int i = 0; i < 8; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (int i = 0; i < 8; i++)
        PyTuple_SET_ITEM(out, i, items[i]);
    return out;
no:
    Py_XDECREF(client_id);
    Py_DECREF(view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(client_id);
    Py_DECREF(view);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ encode */

typedef struct {
    uint8_t *b;
    Py_ssize_t len, cap;
    int flexible;
} Writer;

static int grow(Writer *w, Py_ssize_t n)
{
    if (w->len + n <= w->cap)
        return 0;
    Py_ssize_t cap = w->cap * 2;
    while (cap < w->len + n)
        cap *= 2;
    uint8_t *b = PyMem_Realloc(w->b, (size_t)cap);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    w->b = b;
    w->cap = cap;
    return 0;
}

static int put_be(Writer *w, uint64_t v, int bytes)
{
    if (grow(w, bytes) < 0)
        return -1;
    for (int i = bytes - 1; i >= 0; i--) {
        w->b[w->len + i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
    w->len += bytes;
    return 0;
}

static int put_uvarint(Writer *w, uint64_t v)
{
    if (grow(w, 10) < 0)
        return -1;
    while (v >= 0x80) {
        w->b[w->len++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    w->b[w->len++] = (uint8_t)v;
    return 0;
}

/* A length prefix (n = -1: null), compact or classic (int16 for strings, int32 otherwise). */
static int put_length(Writer *w, Py_ssize_t n, int classic16)
{
    if (w->flexible)
        return put_uvarint(w, (uint64_t)(n + 1));
    return classic16 ? put_be(w, (uint16_t)(int16_t)n, 2) : put_be(w, (uint32_t)(int32_t)n, 4);
}

static int put_string(Writer *w, PyObject *s, int nullable)
{
    if (s == Py_None && nullable)
        return put_length(w, -1, 1);
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "encode_response: a string field holds a non-string");
        return -1;
    }
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL)
        return -1;
    if (n > MAX_STRING_LENGTH) {
        PyErr_SetString(PyExc_ValueError, "encode_response: string longer than 32767 bytes");
        return -1;
    }
    if (put_length(w, n, 1) < 0 || grow(w, n) < 0)
        return -1;
    memcpy(w->b + w->len, u, (size_t)n);
    w->len += n;
    return 0;
}

static int item_int(PyObject *tuple, Py_ssize_t i, long long lo, long long hi, long long *out)
{
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_OverflowError, "encode_response: %lld out of range", v);
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *checked_list(PyObject *o, const char *what)
{
    if (!PyList_Check(o)) {
        PyErr_Format(PyExc_TypeError, "encode_response: %s must be a list", what);
        return NULL;
    }
    return o;
}

static PyObject *checked_tuple(PyObject *o, Py_ssize_t n, const char *what)
{
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != n) {
        PyErr_Format(PyExc_TypeError, "encode_response: %s must be a tuple of %zd", what, n);
        return NULL;
    }
    return o;
}

static int put_record_errors(Writer *w, PyObject *errors)
{
    if (errors == Py_None)
        return put_length(w, 0, 0);
    if (checked_list(errors, "record_errors") == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(errors);
    if (put_length(w, n, 0) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(errors, i);
        long long index;
        if (checked_tuple(e, 2, "a record error") == NULL)
            return -1;
        Py_INCREF(e); /* the list may be changed by the conversions below */
        int rc = item_int(e, 0, INT32_MIN, INT32_MAX, &index) < 0 || put_be(w, (uint32_t)(int32_t)index, 4) < 0
                 || put_string(w, PyTuple_GET_ITEM(e, 1), 1) < 0 || (w->flexible && put_uvarint(w, 0) < 0);
        Py_DECREF(e);
        if (rc)
            return -1;
        if (PyList_GET_SIZE(errors) != n) {
            PyErr_SetString(PyExc_RuntimeError, "encode_response: record_errors changed while encoded");
            return -1;
        }
    }
    return 0;
}

static int put_partition(Writer *w, PyObject *part, long version)
{
    long long index, code, base, append_time, log_start;
    if (checked_tuple(part, 7, "a partition answer") == NULL)
        return -1;
    if (item_int(part, 0, INT32_MIN, INT32_MAX, &index) < 0 || item_int(part, 1, INT16_MIN, INT16_MAX, &code) < 0
        || item_int(part, 2, INT64_MIN, INT64_MAX, &base) < 0
        || item_int(part, 3, INT64_MIN, INT64_MAX, &append_time) < 0
        || item_int(part, 4, INT64_MIN, INT64_MAX, &log_start) < 0)
        return -1;
    if (put_be(w, (uint32_t)(int32_t)index, 4) < 0 || put_be(w, (uint16_t)(int16_t)code, 2) < 0
        || put_be(w, (uint64_t)base, 8) < 0 || put_be(w, (uint64_t)append_time, 8) < 0
        || (version >= LOG_START_VERSION && put_be(w, (uint64_t)log_start, 8) < 0))
        return -1;
    if (version >= RECORD_ERRORS_VERSION) {
        if (put_record_errors(w, PyTuple_GET_ITEM(part, 6)) < 0 || put_string(w, PyTuple_GET_ITEM(part, 5), 1) < 0)
            return -1;
    }
    return w->flexible ? put_uvarint(w, 0) : 0; /* the current leader stays at its default: not written */
}

static int put_topics(Writer *w, PyObject *topics, long version)
{
    if (checked_list(topics, "topics") == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(topics);
    if (put_length(w, n, 0) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *topic = PyList_GET_ITEM(topics, i);
        if (checked_tuple(topic, 2, "a topic answer") == NULL)
            return -1;
        Py_INCREF(topic);
        int rc = put_string(w, PyTuple_GET_ITEM(topic, 0), 0);
        PyObject *parts = rc < 0 ? NULL : checked_list(PyTuple_GET_ITEM(topic, 1), "partition answers");
        if (parts != NULL) {
            Py_ssize_t m = PyList_GET_SIZE(parts);
            rc = put_length(w, m, 0);
            for (Py_ssize_t j = 0; rc == 0 && j < m; j++) {
                PyObject *part = PyList_GET_ITEM(parts, j);
                Py_INCREF(part);
                rc = put_partition(w, part, version);
                Py_DECREF(part);
                if (rc == 0 && PyList_GET_SIZE(parts) != m) {
                    PyErr_SetString(PyExc_RuntimeError, "encode_response: a list changed while encoded");
                    rc = -1;
                }
            }
            if (rc == 0 && w->flexible)
                rc = put_uvarint(w, 0);
        } else {
            rc = -1;
        }
        Py_DECREF(topic);
        if (rc < 0)
            return -1;
        if (PyList_GET_SIZE(topics) != n) {
            PyErr_SetString(PyExc_RuntimeError, "encode_response: a list changed while encoded");
            return -1;
        }
    }
    return 0;
}

static PyObject *encode_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "encode_response(correlation_id, version, throttle_ms, topics)");
        return NULL;
    }
    long long correlation_id = PyLong_AsLongLong(args[0]);
    long version = PyLong_AsLong(args[1]);
    long long throttle = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (version < MIN_VERSION || version > MAX_VERSION) {
        PyErr_Format(PyExc_ValueError, "encode_response: Produce v%ld is not encoded here", version);
        return NULL;
    }
    if (correlation_id < INT32_MIN || correlation_id > INT32_MAX || throttle < INT32_MIN || throttle > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "encode_response: int32 out of range");
        return NULL;
    }
    Writer w = {PyMem_Malloc(256), 0, 256, version >= FLEXIBLE_VERSION};
    if (w.b == NULL)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    if (put_be(&w, 0, 4) < 0 || put_be(&w, (uint32_t)(int32_t)correlation_id, 4) < 0
        || (w.flexible && put_uvarint(&w, 0) < 0) || put_topics(&w, args[3], version) < 0
        || put_be(&w, (uint32_t)(int32_t)throttle, 4) < 0 || (w.flexible && put_uvarint(&w, 0) < 0))
        goto done;
    uint32_t size = (uint32_t)(w.len - 4);
    w.b[0] = (uint8_t)(size >> 24);
    w.b[1] = (uint8_t)(size >> 16);
    w.b[2] = (uint8_t)(size >> 8);
    w.b[3] = (uint8_t)size;
    out = PyByteArray_FromStringAndSize((const char *)w.b, w.len);
done:
    PyMem_Free(w.b);
    return out;
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "decode(frame, pos, version) -> (transactional_id, acks, timeout_ms, [(name, [(index, records)])], "
     "(producer_id, producer_epoch) | None) | None"},
    {"decode_frame", (PyCFunction)decode_frame, METH_O,
     "decode_frame(frame) -> (correlation_id, version, client_id, transactional_id, acks, timeout_ms, "
     "[(name, [(index, records)])], (producer_id, producer_epoch) | None) | None"},
    {"encode_response", (PyCFunction)(void (*)(void))encode_response, METH_FASTCALL,
     "encode_response(correlation_id, version, throttle_ms, [(name, [(index, error_code, base_offset, "
     "log_append_time_ms, log_start_offset, error_message, record_errors)])]) -> bytearray"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kbroker.protocol._produce", NULL, -1, methods};

PyMODINIT_FUNC PyInit__produce(void) { return PyModule_Create(&module); }
