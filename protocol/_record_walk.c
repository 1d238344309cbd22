/* Compiled form of protocol/record_walk.py's walk_records (same checks, same findings; see that module).
 *
 * The structural walk is the produce path's only per-record work. In Python it costs ~0.7-1 us per record,
 * three to five times everything else the broker spends on a produced message; here it is a few ns. The
 * Python function stays the reference and the fallback when this extension is not built
 * (`python setup.py build_ext --inplace`); tests/protocol/test_record_walk.py checks that both agree.
 *
 * walk(body, count, consecutive, last_offset_delta, need_keys, base_timestamp, check_ts, ts_low, ts_high)
 *   -> None (sound, nothing to report) | str (the first structural fault) | (keyless, [(index, ts)])
 *
 * _walk_api: a capsule holding walk's body as a C function (walk_body below), for protocol/_batch_scan.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { RD_OK = 0, RD_EOF = -1, RD_LONG = -2 };

/* Unsigned varint of at most 10 bytes (max_shift 63: Kafka's readVarlong, the timestamp delta) or 5 (max_shift
 * 28: readVarint, every other record field); *wide is set when it does not fit 64 bits, or 32 for a 5-byte one
 * (Java keeps the low 32 bits of such a fifth byte; refused here, as in protocol/record_walk.py). */
static inline int rd(const uint8_t *b, Py_ssize_t end, Py_ssize_t *p, uint64_t *out, int *wide, int max_shift)
{
    uint64_t r = 0;
    int shift = 0;
    Py_ssize_t q = *p;
    for (;;) {
        if (q >= end)
            return RD_EOF;
        uint8_t c = b[q++];
        if (shift == 63 && (c & 0x7f) > 1)
            *wide = 1;
        r |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            if (max_shift < 63 && r > UINT32_MAX)
                *wide = 1;
            *p = q;
            *out = r;
            return RD_OK;
        }
        shift += 7;
        if (shift > max_shift)
            return RD_LONG;
    }
}

static inline int64_t unzigzag(uint64_t raw) { return (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1); }

/* Advance *p by n bytes; past the end it parks one byte beyond `end` so every later read fails. */
static inline void skip(Py_ssize_t *p, uint64_t n, Py_ssize_t end)
{
    if (n > (uint64_t)(end - *p))
        *p = end + 1;
    else
        *p += (Py_ssize_t)n;
}

#define READ_UP_TO(dst, max_shift)                                  \
    do {                                                           \
        int _r = rd(b, end, &p, &(dst), &wide, max_shift);         \
        if (_r == RD_EOF) goto eof;                                \
        if (_r == RD_LONG || wide) goto structure;                 \
    } while (0)
#define READ(dst) READ_UP_TO(dst, 28)
#define READ_LONG(dst) READ_UP_TO(dst, 63)

/* walk() over b[0:end] once its arguments are parsed: the same result (a new reference), or NULL with an
 * exception. Also what the _walk_api capsule gives other extensions (protocol/_batch_scan.c's plain), which then
 * walk a batch without a memoryview, an argument tuple and their parsing. */
static PyObject *walk_body(const uint8_t *b, Py_ssize_t end, long long count, int consecutive,
                           long long last_offset_delta, int need_keys, long long base_ts, int check_ts,
                           long long ts_low, long long ts_high)
{
    Py_ssize_t p = 0;
    PyObject *keyless = NULL, *bad_ts = NULL, *result = NULL;
    int64_t prev_delta = -1;
    int wide = 0;
    long long i;
    for (i = 0; i < count; i++) {
        uint64_t raw;
        READ(raw);
        if ((raw & 1) || (raw >> 1) > (uint64_t)(end - p)) {
            result = PyUnicode_FromFormat("Invalid record size: expected %lld bytes in record payload, but "
                                          "instead the buffer has only %zd remaining bytes.",
                                          (long long)unzigzag(raw), end - p);
            goto done;
        }
        const Py_ssize_t start = p, rec_end = p + (Py_ssize_t)(raw >> 1);
        p += 1; /* attributes, ignored as in Kafka */
        const Py_ssize_t ts_start = p;
        READ_LONG(raw);
        if (check_ts || p - ts_start >= 3) {
            int64_t ts;
            if (__builtin_add_overflow((int64_t)base_ts, unzigzag(raw), &ts)) {
                result = PyUnicode_FromFormat("Record %lld has timestamp delta %lld outside the 64-bit range", i,
                                              (long long)unzigzag(raw));
                goto done;
            }
            if (check_ts && (ts < ts_low || ts > ts_high) && ts != -1) {
                if (bad_ts == NULL && (bad_ts = PyList_New(0)) == NULL)
                    goto fail;
                PyObject *pair = Py_BuildValue("(LL)", i, (long long)ts);
                if (pair == NULL || PyList_Append(bad_ts, pair) < 0) {
                    Py_XDECREF(pair);
                    goto fail;
                }
                Py_DECREF(pair);
            }
        }
        READ(raw);
        if (consecutive) {
            if (raw != (uint64_t)i << 1) {
                result = PyUnicode_FromFormat("Record %lld has offset delta %lld: a batch's records must have "
                                              "deltas 0, 1, 2...", i, (long long)unzigzag(raw));
                goto done;
            }
        } else {
            int64_t delta = unzigzag(raw);
            if (delta <= prev_delta || delta > last_offset_delta) {
                result = PyUnicode_FromFormat("Record %lld has offset delta %lld after %lld, batch ends at %lld",
                                              i, (long long)delta, (long long)prev_delta, last_offset_delta);
                goto done;
            }
            prev_delta = delta;
        }
        READ(raw); /* key */
        if (raw & 1) {
            if (raw != 1) {
                result = PyUnicode_FromFormat("Record %lld has key size %lld", i, (long long)unzigzag(raw));
                goto done;
            }
            if (need_keys) {
                if (keyless == NULL && (keyless = PyList_New(0)) == NULL)
                    goto fail;
                PyObject *index = PyLong_FromLongLong(i);
                if (index == NULL || PyList_Append(keyless, index) < 0) {
                    Py_XDECREF(index);
                    goto fail;
                }
                Py_DECREF(index);
            }
        } else {
            skip(&p, raw >> 1, end);
        }
        READ(raw); /* value */
        if (raw & 1) {
            if (raw != 1) {
                result = PyUnicode_FromFormat("Record %lld has value size %lld", i, (long long)unzigzag(raw));
                goto done;
            }
        } else {
            skip(&p, raw >> 1, end);
        }
        READ(raw); /* header count */
        if (raw & 1) {
            result = PyUnicode_FromFormat("Found invalid number of record headers %lld", (long long)unzigzag(raw));
            goto done;
        }
        uint64_t n_headers = raw >> 1;
        if (n_headers) {
            /* Each header takes at least two bytes: a lying count cannot make this loop long. */
            if (p > rec_end || n_headers > (uint64_t)((rec_end - p) / 2)) {
                result = PyUnicode_FromFormat("Record %lld claims %llu headers in %zd bytes", i,
                                              (unsigned long long)n_headers, rec_end - p);
                goto done;
            }
            for (uint64_t h = 0; h < n_headers; h++) {
                READ(raw);
                if (raw & 1) {
                    result = PyUnicode_FromString("Invalid negative header key size");
                    goto done;
                }
                skip(&p, raw >> 1, end);
                READ(raw);
                if (raw & 1) {
                    if (raw != 1) {
                        result = PyUnicode_FromFormat("Invalid header value size %lld", (long long)unzigzag(raw));
                        goto done;
                    }
                } else {
                    skip(&p, raw >> 1, end);
                }
                if (p > rec_end)
                    break;
            }
        }
        if (p != rec_end) {
            result = PyUnicode_FromFormat("Invalid record size: expected to read %zd bytes in record payload, but "
                                          "instead read %zd", rec_end - start, p - start);
            goto done;
        }
    }
    if (p != end) {
        result = PyUnicode_FromString("Incorrect declared batch size, records still remaining in file");
        goto done;
    }
    if (keyless == NULL && bad_ts == NULL) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (keyless == NULL && (keyless = PyList_New(0)) == NULL)
        goto fail;
    if (bad_ts == NULL && (bad_ts = PyList_New(0)) == NULL)
        goto fail;
    result = PyTuple_Pack(2, keyless, bad_ts);
    goto done;
eof:
    result = PyUnicode_FromString("Incorrect declared batch size, premature EOF reached");
    goto done;
structure:
    result = PyUnicode_FromString("Found invalid record structure");
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(keyless);
    Py_XDECREF(bad_ts);
    return result;
}

static PyObject *walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    long long count, last_offset_delta, base_ts, ts_low, ts_high;
    int consecutive, need_keys, check_ts;
    if (!PyArg_ParseTuple(args, "y*LpLpLpLL", &view, &count, &consecutive, &last_offset_delta, &need_keys,
                          &base_ts, &check_ts, &ts_low, &ts_high))
        return NULL;
    PyObject *result = walk_body((const uint8_t *)view.buf, view.len, count, consecutive, last_offset_delta,
                                 need_keys, base_ts, check_ts, ts_low, ts_high);
    PyBuffer_Release(&view);
    return result;
}

/* The capsule's function, kept in a struct so that its type is named in one place (protocol/_batch_scan.c). */
typedef PyObject *(*walk_body_fn)(const uint8_t *, Py_ssize_t, long long, int, long long, int, long long, int,
                                  long long, long long);
static walk_body_fn walk_api[1] = {walk_body};

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "Structural walk over the records of one batch body (see protocol.record_walk)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kbroker.protocol._record_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_walk(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *api = PyCapsule_New((void *)walk_api, "kbroker.protocol._record_walk._walk_api", NULL);
    if (api == NULL || PyModule_AddObject(m, "_walk_api", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
