/* Compiled form of protocol/codec.py's generated decoders and encoders (same wire format, same objects).
 *
 * codec.py turns each (message class, version) into a Plan: the fields in wire order, each with its slot
 * offset in the (slots) dataclass and an op (type, compact, nullable, element op, sub-plan), the defaults of the
 * fields this version does not carry, and the tagged fields. A Plan decodes straight into a new instance's slots
 * (no __init__ call) and encodes by reading them. The Python codec stays the reference and the fallback when this
 * extension is not built or KBROKER_PURE_PYTHON is set; tests/protocol runs its codec tests against both.
 *
 * Every read is bounds-checked against the frame: a hostile length or count raises DecodeError, never reads past
 * the buffer. Encoding checks each object's exact class before reading its slots.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

static PyObject *DecodeError;  /* protocol.primitives.DecodeError, set by configure() */
static PyObject *StructError;  /* struct.error: what the Python encoders raise for a value out of range */

enum {
    K_BOOL = 1, K_INT8, K_INT16, K_UINT16, K_INT32, K_INT64, K_FLOAT64, K_UUID,
    K_STRING, K_BYTES, K_RECORDS, K_ARRAY, K_STRUCT
};

typedef struct Op {
    int type;
    int compact;
    int nullable;
    Py_ssize_t min_item;
    struct Op *elem;  /* arrays: the element's op (owned) */
    PyObject *sub;    /* structs: the sub-Plan (owned reference) */
} Op;

typedef struct { Py_ssize_t offset; Op op; } Field;
typedef struct { Py_ssize_t offset; int kind; PyObject *value; } Default;  /* kind 0 const, 1 new list, 2 call */
typedef struct { uint64_t tag; Py_ssize_t offset; Op op; PyObject *dflt; } Tagged;

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    int flexible;
    Py_ssize_t nfields;
    Field *fields;
    Py_ssize_t ndefaults;
    Default *defaults;
    Py_ssize_t ntagged;
    Tagged *tagged;
    PyObject *name;  /* for error messages */
} Plan;

static PyTypeObject PlanType;

/* ------------------------------------------------------------------------------------------------ ops */

static void op_clear(Op *op)
{
    if (op->elem != NULL) {
        op_clear(op->elem);
        PyMem_Free(op->elem);
        op->elem = NULL;
    }
    Py_CLEAR(op->sub);
}

/* op tuple: (type, compact, nullable, min_item, elem_op | None, sub_plan | None) */
static int op_parse(PyObject *t, Op *op)
{
    memset(op, 0, sizeof(*op));
    PyObject *elem = NULL, *sub = NULL;
    int type, compact, nullable;
    Py_ssize_t min_item;
    if (!PyArg_ParseTuple(t, "iiinOO", &type, &compact, &nullable, &min_item, &elem, &sub))
        return -1;
    if (type < K_BOOL || type > K_STRUCT) {
        PyErr_Format(PyExc_ValueError, "unknown op type %d", type);
        return -1;
    }
    op->type = type;
    op->compact = compact;
    op->nullable = nullable;
    op->min_item = min_item;
    if (type == K_ARRAY) {
        op->elem = PyMem_Calloc(1, sizeof(Op));
        if (op->elem == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (op_parse(elem, op->elem) < 0)
            return -1;
    }
    if (type == K_STRUCT) {
        if (!PyObject_TypeCheck(sub, &PlanType)) {
            PyErr_SetString(PyExc_TypeError, "struct op needs a Plan");
            return -1;
        }
        Py_INCREF(sub);
        op->sub = sub;
    }
    return 0;
}

static Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *attr)
{
    PyObject *descr = PyDict_GetItemWithError(cls->tp_dict, attr);
    if (descr == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s has no slot %R", cls->tp_name, attr);
        return -1;
    }
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a slot", cls->tp_name, attr);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not an object slot", cls->tp_name, attr);
        return -1;
    }
    return m->offset;
}

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* ------------------------------------------------------------------------------------------------ decoding */

typedef struct {
    const uint8_t *b;
    Py_ssize_t len;
    PyObject *buf;   /* the frame object (records become memoryview slices of it) */
    PyObject *view;  /* memoryview(buf), made on the first records field */
} Reader;

static int need(Reader *r, Py_ssize_t pos, Py_ssize_t n)
{
    if (n < 0 || pos + n > r->len) {
        PyErr_Format(DecodeError, "truncated: %zd bytes needed at %zd of %zd", n, pos, r->len);
        return -1;
    }
    return 0;
}

static int read_uvarint(Reader *r, Py_ssize_t *pos, uint64_t *out)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (;;) {
        if (p >= r->len) {
            PyErr_SetString(DecodeError, "truncated varint");
            return -1;
        }
        uint8_t c = r->b[p++];
        result |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            break;
        shift += 7;
        if (shift > 28) {
            PyErr_SetString(DecodeError, "varint longer than 5 bytes");
            return -1;
        }
    }
    *pos = p;
    *out = result;
    return 0;
}

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* A length or count prefix: compact (uvarint of n+1) or classic (int16 for strings, int32 otherwise). */
static int read_length(Reader *r, Py_ssize_t *pos, int compact, int classic16, int nullable, const char *what,
                       int64_t *n)
{
    int64_t v;
    if (compact) {
        uint64_t u;
        if (read_uvarint(r, pos, &u) < 0)
            return -1;
        v = (int64_t)u - 1;
    } else if (classic16) {
        if (need(r, *pos, 2) < 0)
            return -1;
        v = (int16_t)be16(r->b + *pos);
        *pos += 2;
    } else {
        if (need(r, *pos, 4) < 0)
            return -1;
        v = (int32_t)be32(r->b + *pos);
        *pos += 4;
    }
    if (v < -1 || (v == -1 && !nullable)) {
        PyErr_Format(DecodeError, "invalid %s length %lld", what, (long long)v);
        return -1;
    }
    *n = v;
    return 0;
}

#define MAX_STRING_LENGTH 0x7fff

static PyObject *plan_decode_at(Plan *plan, Reader *r, Py_ssize_t *pos);

static PyObject *decode_value(const Op *op, Reader *r, Py_ssize_t *pos)
{
    const uint8_t *b = r->b;
    Py_ssize_t p = *pos;
    switch (op->type) {
    case K_BOOL:
        if (need(r, p, 1) < 0) return NULL;
        *pos = p + 1;
        return PyBool_FromLong(b[p] != 0);
    case K_INT8:
        if (need(r, p, 1) < 0) return NULL;
        *pos = p + 1;
        return PyLong_FromLong((int8_t)b[p]);
    case K_INT16:
        if (need(r, p, 2) < 0) return NULL;
        *pos = p + 2;
        return PyLong_FromLong((int16_t)be16(b + p));
    case K_UINT16:
        if (need(r, p, 2) < 0) return NULL;
        *pos = p + 2;
        return PyLong_FromLong(be16(b + p));
    case K_INT32:
        if (need(r, p, 4) < 0) return NULL;
        *pos = p + 4;
        return PyLong_FromLong((int32_t)be32(b + p));
    case K_INT64:
        if (need(r, p, 8) < 0) return NULL;
        *pos = p + 8;
        return PyLong_FromLongLong((int64_t)be64(b + p));
    case K_FLOAT64: {
        if (need(r, p, 8) < 0) return NULL;
        uint64_t u = be64(b + p);
        double d;
        memcpy(&d, &u, sizeof d);
        *pos = p + 8;
        return PyFloat_FromDouble(d);
    }
    case K_UUID:
        if (need(r, p, 16) < 0) return NULL;
        *pos = p + 16;
        return PyBytes_FromStringAndSize((const char *)b + p, 16);
    case K_STRING: {
        int64_t n;
        if (read_length(r, &p, op->compact, 1, op->nullable, "string", &n) < 0) return NULL;
        if (n < 0) {
            *pos = p;
            Py_RETURN_NONE;
        }
        if (n > MAX_STRING_LENGTH) {
            /* Kafka's generated readers refuse a string longer than an int16 could announce, compact or not */
            PyErr_Format(DecodeError, "string had invalid length %lld", (long long)n);
            return NULL;
        }
        if (n > r->len - p) {
            PyErr_Format(DecodeError, "string length %lld exceeds the %zd bytes left", (long long)n, r->len - p);
            return NULL;
        }
        PyObject *s = PyUnicode_DecodeUTF8((const char *)b + p, (Py_ssize_t)n, "strict");
        if (s == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                PyErr_NormalizeException(&type, &value, &tb);
                PyErr_Format(DecodeError, "string is not valid UTF-8: %S", value ? value : Py_None);
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(tb);
            }
            return NULL;
        }
        *pos = p + (Py_ssize_t)n;
        return s;
    }
    case K_BYTES:
    case K_RECORDS: {
        int64_t n;
        if (read_length(r, &p, op->compact, 0, op->nullable || op->type == K_RECORDS, "bytes", &n) < 0)
            return NULL;
        if (n < 0) {
            *pos = p;
            Py_RETURN_NONE;
        }
        if (n > r->len - p) {
            PyErr_Format(DecodeError, "bytes length %lld exceeds the %zd bytes left", (long long)n, r->len - p);
            return NULL;
        }
        *pos = p + (Py_ssize_t)n;
        if (op->type == K_BYTES)
            return PyBytes_FromStringAndSize((const char *)b + p, (Py_ssize_t)n);
        /* Records stay a zero-copy view of the frame (writable when the frame is: the produce path rewrites
         * base offsets in place). */
        if (r->view == NULL) {
            r->view = PyMemoryView_FromObject(r->buf);
            if (r->view == NULL) return NULL;
        }
        return PySequence_GetSlice(r->view, p, p + (Py_ssize_t)n);
    }
    case K_ARRAY: {
        int64_t n;
        if (read_length(r, &p, op->compact, 0, op->nullable, "array", &n) < 0) return NULL;
        if (n * op->min_item > r->len - p) {
            PyErr_Format(DecodeError, "array of %lld items cannot fit in %zd bytes", (long long)n, r->len - p);
            return NULL;
        }
        if (n < 0) {
            *pos = p;
            Py_RETURN_NONE;
        }
        PyObject *list = PyList_New((Py_ssize_t)n);
        if (list == NULL) return NULL;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *x = decode_value(op->elem, r, &p);
            if (x == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, i, x);
        }
        *pos = p;
        return list;
    }
    case K_STRUCT:
        if (op->nullable) {
            if (need(r, p, 1) < 0) return NULL;
            int8_t marker = (int8_t)b[p];
            p += 1;
            if (marker < 0) {
                *pos = p;
                Py_RETURN_NONE;
            }
        }
        {
            PyObject *o = plan_decode_at((Plan *)op->sub, r, &p);
            if (o != NULL) *pos = p;
            return o;
        }
    }
    PyErr_SetString(PyExc_SystemError, "bad op");
    return NULL;
}

static int set_slot(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject **slot = &SLOT(obj, off);
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
    return 0;
}

static PyObject *plan_decode_at(Plan *plan, Reader *r, Py_ssize_t *pos)
{
    if (Py_EnterRecursiveCall(" decoding a Kafka message"))
        return NULL;
    PyObject *obj = plan->cls->tp_alloc(plan->cls, 0);
    if (obj == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < plan->ndefaults; i++) {
        Default *d = &plan->defaults[i];
        PyObject *v;
        if (d->kind == 0) {
            v = Py_NewRef(d->value);
        } else if (d->kind == 1) {
            v = PyList_New(0);
        } else {
            v = PyObject_CallNoArgs(d->value);
        }
        if (v == NULL)
            goto fail;
        set_slot(obj, d->offset, v);
    }
    Py_ssize_t p = *pos;
    for (Py_ssize_t i = 0; i < plan->nfields; i++) {
        Field *f = &plan->fields[i];
        PyObject *v = decode_value(&f->op, r, &p);
        if (v == NULL)
            goto fail;
        set_slot(obj, f->offset, v);
    }
    if (plan->flexible) {
        uint64_t nt;
        if (read_uvarint(r, &p, &nt) < 0)
            goto fail;
        for (uint64_t k = 0; k < nt; k++) {
            uint64_t tag, sz;
            if (read_uvarint(r, &p, &tag) < 0 || read_uvarint(r, &p, &sz) < 0)
                goto fail;
            if ((int64_t)sz > r->len - p) {
                PyErr_SetString(DecodeError, "tagged field runs past the end of the frame");
                goto fail;
            }
            Py_ssize_t end = p + (Py_ssize_t)sz;
            for (Py_ssize_t j = 0; j < plan->ntagged; j++) {
                Tagged *t = &plan->tagged[j];
                if (t->tag != tag)
                    continue;
                PyObject *v = decode_value(&t->op, r, &p);
                if (v == NULL)
                    goto fail;
                set_slot(obj, t->offset, v);
                if (p != end) {
                    PyErr_SetString(DecodeError, "tagged field size does not match its value");
                    goto fail;
                }
                break;
            }
            p = end;
        }
    }
    *pos = p;
    Py_LeaveRecursiveCall();
    return obj;
fail:
    Py_LeaveRecursiveCall();
    Py_XDECREF(obj);
    return NULL;
}

static PyObject *Plan_decode(Plan *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode(buf, pos)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {view.buf, view.len, args[0], NULL};
    PyObject *obj = NULL;
    if (pos < 0 || pos > r.len) {
        PyErr_Format(DecodeError, "position %zd outside the %zd-byte frame", pos, r.len);
    } else {
        obj = plan_decode_at(self, &r, &pos);
    }
    Py_XDECREF(r.view);
    PyBuffer_Release(&view);
    if (obj == NULL)
        return NULL;
    PyObject *res = PyTuple_New(2);
    if (res == NULL) {
        Py_DECREF(obj);
        return NULL;
    }
    PyObject *p = PyLong_FromSsize_t(pos);
    if (p == NULL) {
        Py_DECREF(obj);
        Py_DECREF(res);
        return NULL;
    }
    PyTuple_SET_ITEM(res, 0, obj);
    PyTuple_SET_ITEM(res, 1, p);
    return res;
}

/* ------------------------------------------------------------------------------------------------ encoding */

typedef struct {
    char *b;
    Py_ssize_t len, cap;
    Py_ssize_t base;  /* len(out) before this encode: ext offsets are positions in out */
    PyObject *ext;    /* list or None */
} Writer;

static int grow(Writer *w, Py_ssize_t n)
{
    if (w->len + n <= w->cap)
        return 0;
    Py_ssize_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n)
        cap *= 2;
    char *nb = PyMem_Realloc(w->b, cap);
    if (nb == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    w->b = nb;
    w->cap = cap;
    return 0;
}

static inline int put(Writer *w, const void *data, Py_ssize_t n)
{
    if (grow(w, n) < 0) return -1;
    memcpy(w->b + w->len, data, n);
    w->len += n;
    return 0;
}

static inline int put_u8(Writer *w, uint8_t v) { return put(w, &v, 1); }
static inline int put_be16(Writer *w, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)(v >> 8), (uint8_t)v};
    return put(w, x, 2);
}
static inline int put_be32(Writer *w, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    return put(w, x, 4);
}
static inline int put_be64(Writer *w, uint64_t v)
{
    if (put_be32(w, (uint32_t)(v >> 32)) < 0) return -1;
    return put_be32(w, (uint32_t)v);
}
static int put_uvarint(Writer *w, uint64_t v)
{
    uint8_t x[10];
    int n = 0;
    while (v >= 0x80) {
        x[n++] = (uint8_t)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    x[n++] = (uint8_t)v;
    return put(w, x, n);
}

static int put_length(Writer *w, int compact, int classic16, Py_ssize_t n)
{
    if (compact)
        return put_uvarint(w, (uint64_t)(n + 1));
    if (classic16) {
        if (n > 32767) {
            PyErr_Format(StructError, "string of %zd bytes does not fit an int16 length", n);
            return -1;
        }
        return put_be16(w, (uint16_t)(int16_t)n);
    }
    if (n > INT32_MAX) {
        PyErr_Format(StructError, "%zd bytes do not fit an int32 length", n);
        return -1;
    }
    return put_be32(w, (uint32_t)(int32_t)n);
}

static int put_null(Writer *w, int compact, int classic16, int nullable, const char *what)
{
    if (!nullable) {
        PyErr_Format(PyExc_ValueError, "null %s in a non-nullable field", what);
        return -1;
    }
    if (compact)
        return put_u8(w, 0);
    return classic16 ? put_be16(w, 0xffff) : put_be32(w, 0xffffffffu);
}

static int int_in(PyObject *v, long long lo, long long hi, long long *out)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(StructError, "required argument is not an integer");
        return -1;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow || x < lo || x > hi) {
        PyErr_Format(StructError, "argument out of range");
        return -1;
    }
    *out = x;
    return 0;
}

static int plan_encode_into(Plan *plan, PyObject *obj, Writer *w);

static int put_buffer(Writer *w, const Op *op, PyObject *v, int classic16)
{
    Py_buffer view;
    if (PyObject_GetBuffer(v, &view, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = put_length(w, op->compact, classic16, view.len);
    if (rc == 0)
        rc = put(w, view.buf, view.len);
    PyBuffer_Release(&view);
    return rc;
}

static int encode_value(const Op *op, PyObject *v, Writer *w)
{
    long long x;
    switch (op->type) {
    case K_BOOL: {
        int t = PyObject_IsTrue(v);
        if (t < 0) return -1;
        return put_u8(w, (uint8_t)t);
    }
    case K_INT8:
        if (int_in(v, -128, 127, &x) < 0) return -1;
        return put_u8(w, (uint8_t)(int8_t)x);
    case K_INT16:
        if (int_in(v, -32768, 32767, &x) < 0) return -1;
        return put_be16(w, (uint16_t)(int16_t)x);
    case K_UINT16:
        if (int_in(v, 0, 65535, &x) < 0) return -1;
        return put_be16(w, (uint16_t)x);
    case K_INT32:
        if (int_in(v, INT32_MIN, INT32_MAX, &x) < 0) return -1;
        return put_be32(w, (uint32_t)(int32_t)x);
    case K_INT64:
        if (int_in(v, INT64_MIN, INT64_MAX, &x) < 0) return -1;
        return put_be64(w, (uint64_t)x);
    case K_FLOAT64: {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        uint64_t u;
        memcpy(&u, &d, sizeof u);
        return put_be64(w, u);
    }
    case K_UUID: {
        if (!PyBytes_Check(v)) {
            PyErr_SetString(StructError, "argument for '16s' must be a bytes object");
            return -1;
        }
        uint8_t u[16] = {0};
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        memcpy(u, PyBytes_AS_STRING(v), n < 16 ? n : 16);
        return put(w, u, 16);
    }
    case K_STRING: {
        if (v == Py_None) return put_null(w, op->compact, 1, op->nullable, "string");
        if (!PyUnicode_Check(v)) {
            PyErr_Format(PyExc_TypeError, "string field holds %s", Py_TYPE(v)->tp_name);
            return -1;
        }
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL) return -1;
        if (put_length(w, op->compact, 1, n) < 0) return -1;
        return put(w, s, n);
    }
    case K_BYTES:
        if (v == Py_None) return put_null(w, op->compact, 0, op->nullable, "bytes");
        return put_buffer(w, op, v, 0);
    case K_RECORDS: {
        if (v == Py_None) return put_null(w, op->compact, 0, 1, "bytes");
        if (PyBytes_Check(v) || PyByteArray_Check(v) || PyMemoryView_Check(v))
            return put_buffer(w, op, v, 0);
        /* A file region (sent with sendfile): its length here, its bytes spliced in by the sender. */
        PyObject *size = PyObject_GetAttrString(v, "size");
        if (size == NULL) return -1;
        Py_ssize_t n = PyLong_AsSsize_t(size);
        Py_DECREF(size);
        if (n == -1 && PyErr_Occurred()) return -1;
        if (put_length(w, op->compact, 0, n) < 0) return -1;
        if (w->ext == Py_None) {
            PyObject *data = PyObject_CallMethod(v, "read_bytes", NULL);
            if (data == NULL) return -1;
            Py_buffer view;
            int rc = PyObject_GetBuffer(data, &view, PyBUF_SIMPLE);
            if (rc == 0) {
                rc = put(w, view.buf, view.len);
                PyBuffer_Release(&view);
            }
            Py_DECREF(data);
            return rc;
        }
        PyObject *entry = Py_BuildValue("(nO)", w->base + w->len, v);
        if (entry == NULL) return -1;
        int rc = PyList_Append(w->ext, entry);
        Py_DECREF(entry);
        return rc;
    }
    case K_ARRAY: {
        if (v == Py_None) return put_null(w, op->compact, 0, op->nullable, "array");
        PyObject *seq = PySequence_Fast(v, "array field must be a sequence");
        if (seq == NULL) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        int rc = put_length(w, op->compact, 0, n);
        /* Encoding an item may run Python code (__bool__, __float__, a file region's size or read_bytes, a
         * tagged default's __ne__) that changes this very list: take each item afresh with a reference of its
         * own, and refuse a list whose length no longer matches the count already written. */
        for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
            if (PySequence_Fast_GET_SIZE(seq) != n) {
                PyErr_SetString(PyExc_RuntimeError, "array field changed size during encoding");
                rc = -1;
                break;
            }
            PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
            rc = encode_value(op->elem, item, w);
            Py_DECREF(item);
        }
        if (rc == 0 && PySequence_Fast_GET_SIZE(seq) != n) {
            PyErr_SetString(PyExc_RuntimeError, "array field changed size during encoding");
            rc = -1;
        }
        Py_DECREF(seq);
        return rc;
    }
    case K_STRUCT:
        if (op->nullable) {
            if (v == Py_None) return put_u8(w, 0xff);
            if (put_u8(w, 1) < 0) return -1;
        }
        return plan_encode_into((Plan *)op->sub, v, w);
    }
    PyErr_SetString(PyExc_SystemError, "bad op");
    return -1;
}

static PyObject *get_slot(Plan *plan, PyObject *obj, Py_ssize_t off)
{
    PyObject *v = SLOT(obj, off);
    if (v == NULL)
        PyErr_Format(PyExc_AttributeError, "%U instance has an unset field", plan->name);
    return v;
}

static int plan_encode_into(Plan *plan, PyObject *obj, Writer *w)
{
    if (Py_TYPE(obj) != plan->cls) {
        PyErr_Format(PyExc_TypeError, "expected %U, got %s", plan->name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (Py_EnterRecursiveCall(" encoding a Kafka message"))
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < plan->nfields; i++) {
        Field *f = &plan->fields[i];
        PyObject *v = get_slot(plan, obj, f->offset);
        if (v == NULL) {
            rc = -1;
            break;
        }
        /* a reference of our own: encoding may run code that assigns the field */
        Py_INCREF(v);
        rc = encode_value(&f->op, v, w);
        Py_DECREF(v);
    }
    if (rc == 0 && plan->flexible) {
        /* Tagged fields that differ from their default, each as (tag, size, value). */
        Py_ssize_t count = 0;
        Writer tw = {NULL, 0, 0, 0, Py_None};
        Py_ssize_t *ends = NULL;
        uint64_t *tags = NULL;
        if (plan->ntagged) {
            ends = PyMem_Calloc(plan->ntagged, sizeof(Py_ssize_t));
            tags = PyMem_Calloc(plan->ntagged, sizeof(uint64_t));
            if (ends == NULL || tags == NULL) {
                PyErr_NoMemory();
                rc = -1;
            }
        }
        for (Py_ssize_t j = 0; rc == 0 && j < plan->ntagged; j++) {
            Tagged *t = &plan->tagged[j];
            PyObject *v = get_slot(plan, obj, t->offset);
            if (v == NULL) {
                rc = -1;
                break;
            }
            Py_INCREF(v);
            int differs = PyObject_RichCompareBool(v, t->dflt, Py_NE);
            if (differs < 0 || (differs && encode_value(&t->op, v, &tw) < 0)) {
                Py_DECREF(v);
                rc = -1;
                break;
            }
            Py_DECREF(v);
            if (!differs)
                continue;
            tags[count] = t->tag;
            ends[count] = tw.len;
            count++;
        }
        if (rc == 0)
            rc = put_uvarint(w, (uint64_t)count);
        Py_ssize_t start = 0;
        for (Py_ssize_t k = 0; rc == 0 && k < count; k++) {
            Py_ssize_t n = ends[k] - start;
            rc = put_uvarint(w, tags[k]);
            if (rc == 0) rc = put_uvarint(w, (uint64_t)n);
            if (rc == 0) rc = put(w, tw.b + start, n);
            start = ends[k];
        }
        PyMem_Free(tw.b);
        PyMem_Free(ends);
        PyMem_Free(tags);
    }
    Py_LeaveRecursiveCall();
    return rc;
}

static PyObject *Plan_encode(Plan *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyByteArray_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode(obj, out: bytearray, ext: list | None)");
        return NULL;
    }
    PyObject *out = args[1];
    PyObject *ext = args[2];
    if (ext != Py_None && !PyList_Check(ext)) {
        PyErr_SetString(PyExc_TypeError, "ext must be a list or None");
        return NULL;
    }
    Writer w = {NULL, 0, 0, PyByteArray_GET_SIZE(out), ext};
    int rc = plan_encode_into(self, args[0], &w);
    if (rc == 0 && w.len) {
        Py_ssize_t old = PyByteArray_GET_SIZE(out);
        rc = PyByteArray_Resize(out, old + w.len);
        if (rc == 0)
            memcpy(PyByteArray_AS_STRING(out) + old, w.b, w.len);
    }
    PyMem_Free(w.b);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------------ Plan */

/* Plan(cls, name, flexible, fields, defaults, tagged)
 *   fields:   ((attr, op), ...) in wire order
 *   defaults: ((attr, kind, value), ...) kind 0 const value, 1 new list, 2 value() (a fresh struct)
 *   tagged:   ((tag, attr, op, default), ...) */
static int Plan_init(Plan *self, PyObject *args, PyObject *kw)
{
    PyObject *cls, *name, *fields, *defaults, *tagged;
    int flexible;
    if (!PyArg_ParseTuple(args, "O!UpO!O!O!", &PyType_Type, &cls, &name, &flexible, &PyTuple_Type, &fields,
                          &PyTuple_Type, &defaults, &PyTuple_Type, &tagged))
        return -1;
    if (self->cls != NULL) {
        PyErr_SetString(PyExc_TypeError, "Plan is immutable");
        return -1;
    }
    PyTypeObject *t = (PyTypeObject *)cls;
    self->cls = (PyTypeObject *)Py_NewRef(cls);
    self->name = Py_NewRef(name);
    self->flexible = flexible;
    self->nfields = PyTuple_GET_SIZE(fields);
    self->fields = PyMem_Calloc(self->nfields ? self->nfields : 1, sizeof(Field));
    self->ndefaults = PyTuple_GET_SIZE(defaults);
    self->defaults = PyMem_Calloc(self->ndefaults ? self->ndefaults : 1, sizeof(Default));
    self->ntagged = PyTuple_GET_SIZE(tagged);
    self->tagged = PyMem_Calloc(self->ntagged ? self->ntagged : 1, sizeof(Tagged));
    if (!self->fields || !self->defaults || !self->tagged) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->nfields; i++) {
        PyObject *attr, *op;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "UO!", &attr, &PyTuple_Type, &op))
            return -1;
        if ((self->fields[i].offset = slot_offset(t, attr)) < 0 || op_parse(op, &self->fields[i].op) < 0)
            return -1;
    }
    for (Py_ssize_t i = 0; i < self->ndefaults; i++) {
        PyObject *attr, *value;
        int kind;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(defaults, i), "UiO", &attr, &kind, &value))
            return -1;
        if ((self->defaults[i].offset = slot_offset(t, attr)) < 0)
            return -1;
        self->defaults[i].kind = kind;
        self->defaults[i].value = Py_NewRef(value);
    }
    for (Py_ssize_t i = 0; i < self->ntagged; i++) {
        PyObject *attr, *op, *dflt;
        unsigned long long tag;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(tagged, i), "KUO!O", &tag, &attr, &PyTuple_Type, &op, &dflt))
            return -1;
        self->tagged[i].tag = tag;
        self->tagged[i].dflt = Py_NewRef(dflt);
        if ((self->tagged[i].offset = slot_offset(t, attr)) < 0 || op_parse(op, &self->tagged[i].op) < 0)
            return -1;
    }
    return 0;
}

static int Plan_traverse(Plan *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cls);
    for (Py_ssize_t i = 0; self->fields && i < self->nfields; i++)
        Py_VISIT(self->fields[i].op.sub);
    for (Py_ssize_t i = 0; self->defaults && i < self->ndefaults; i++)
        Py_VISIT(self->defaults[i].value);
    for (Py_ssize_t i = 0; self->tagged && i < self->ntagged; i++) {
        Py_VISIT(self->tagged[i].op.sub);
        Py_VISIT(self->tagged[i].dflt);
    }
    return 0;
}

static int Plan_clear(Plan *self)
{
    Py_CLEAR(self->cls);
    Py_CLEAR(self->name);
    if (self->fields) {
        for (Py_ssize_t i = 0; i < self->nfields; i++)
            op_clear(&self->fields[i].op);
        PyMem_Free(self->fields);
        self->fields = NULL;
    }
    if (self->defaults) {
        for (Py_ssize_t i = 0; i < self->ndefaults; i++)
            Py_CLEAR(self->defaults[i].value);
        PyMem_Free(self->defaults);
        self->defaults = NULL;
    }
    if (self->tagged) {
        for (Py_ssize_t i = 0; i < self->ntagged; i++) {
            op_clear(&self->tagged[i].op);
            Py_CLEAR(self->tagged[i].dflt);
        }
        PyMem_Free(self->tagged);
        self->tagged = NULL;
    }
    return 0;
}

static void Plan_dealloc(Plan *self)
{
    PyObject_GC_UnTrack(self);
    Plan_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Plan_repr(Plan *self)
{
    return PyUnicode_FromFormat("<Plan %U>", self->name ? self->name : Py_None);
}

static PyMethodDef Plan_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))Plan_decode, METH_FASTCALL, "decode(buf, pos) -> (obj, new pos)"},
    {"encode", (PyCFunction)(void (*)(void))Plan_encode, METH_FASTCALL, "encode(obj, out, ext) -> None"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kbroker.protocol._codec.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_traverse = (traverseproc)Plan_traverse,
    .tp_clear = (inquiry)Plan_clear,
    .tp_repr = (reprfunc)Plan_repr,
    .tp_methods = Plan_methods,
};

/* configure(DecodeError): the exception class decoding raises */
static PyObject *configure(PyObject *mod, PyObject *err)
{
    if (!PyType_Check(err) || !PyType_IsSubtype((PyTypeObject *)err, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "configure needs an exception class");
        return NULL;
    }
    Py_XSETREF(DecodeError, Py_NewRef(err));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_O, "configure(DecodeError)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "kbroker.protocol._codec", "Compiled Kafka protocol codec (see protocol/codec.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__codec(void)
{
    if (PyType_Ready(&PlanType) < 0)
        return NULL;
    PyObject *struct_mod = PyImport_ImportModule("struct");
    if (struct_mod == NULL)
        return NULL;
    StructError = PyObject_GetAttrString(struct_mod, "error");
    Py_DECREF(struct_mod);
    if (StructError == NULL)
        return NULL;
    DecodeError = Py_NewRef(PyExc_ValueError);
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
