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
 * Every read is bounds-checked against the buffer; headers are built straight into the dataclass's slots.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

static PyObject *header_object(const Header *h)
{
    PyObject *obj = header_cls->tp_alloc(header_cls, 0);
    if (obj == NULL)
        return NULL;
    long long values[NFIELDS] = {
        h->base_offset, h->batch_length, h->partition_leader_epoch, h->magic, h->crc, h->attributes,
        h->last_offset_delta, h->base_timestamp, h->max_timestamp, h->producer_id, h->producer_epoch,
        h->base_sequence, h->records_count,
    };
    for (int i = 0; i < NFIELDS; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (v == NULL) {
            Py_DECREF(obj);
            return NULL;
        }
        *(PyObject **)((char *)obj + field_offset[i]) = v;
    }
    return obj;
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
    const uint8_t *b = view.buf;
    const Py_ssize_t end = view.len;
    PyObject *result = NULL;
    Header h;
    if (end < HEADER_SIZE)
        goto none;
    parse(b, &h);
    if (h.batch_length < BATCH_OVERHEAD || (int64_t)h.batch_length + LOG_OVERHEAD != (int64_t)end || h.magic != 2)
        goto none;
    if (h.records_count <= 0 || (int64_t)h.last_offset_delta != (int64_t)h.records_count - 1)
        goto none;
    if (h.attributes & (ATTR_COMPRESSION_MASK | ATTR_TIMESTAMP_TYPE | ATTR_CONTROL))
        goto none;
    uint32_t actual;
    if (end >= GIL_FREE_CRC) {
        Py_BEGIN_ALLOW_THREADS
        actual = crc32c(b + CRC_START, (size_t)(end - CRC_START), use_hw_crc);
        Py_END_ALLOW_THREADS
    } else {
        actual = crc32c(b + CRC_START, (size_t)(end - CRC_START), use_hw_crc);
    }
    if (actual != h.crc)
        goto none;
    PyObject *body = PyMemoryView_FromMemory((char *)b + HEADER_SIZE, end - HEADER_SIZE, PyBUF_READ);
    if (body == NULL)
        goto done;
    PyObject *count = PyLong_FromLong(h.records_count);
    PyObject *lod = PyLong_FromLong(h.last_offset_delta);
    PyObject *base_ts = PyLong_FromLongLong(h.base_timestamp);
    PyObject *found = NULL;
    if (count != NULL && lod != NULL && base_ts != NULL) {
        PyObject *wargs[9] = {body, count, Py_True, lod, args[2], base_ts, args[3], args[4], args[5]};
        found = PyObject_Vectorcall(args[1], wargs, 9, NULL);
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
            goto done;
        }
        Py_DECREF(released);
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(body);
    if (found == NULL)
        goto done;
    if (found != Py_None) {
        Py_DECREF(found);
        goto none;
    }
    Py_DECREF(found);
    result = header_object(&h);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return result;
}

static PyObject *configure(PyObject *mod, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "configure(RecordBatchHeader): a class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    for (int i = 0; i < NFIELDS; i++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, FIELD_NAMES[i]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, FIELD_NAMES[i]);
            return NULL;
        }
        field_offset[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    Py_XSETREF(header_cls, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
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
    {"crc32c", crc, METH_VARARGS,
     "crc32c(buf, table=False): CRC-32C as scan computes it (table: the portable code, not the instruction)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kbroker.protocol._batch_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__batch_scan(void)
{
    crc_table_init();
#if HAVE_HW_CRC
    __builtin_cpu_init();
    use_hw_crc = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module);
}
