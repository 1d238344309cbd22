/* Compiled form of protocol/framing.py's split_py: the complete request frames at the front of a connection's
 * receive buffer, in one call per read instead of a Python loop per frame (same frames, same stopping point; see
 * that function). tests/protocol/test_framing.py checks that both agree; the Python function stays the reference
 * and the fallback when this extension is not built or KBROKER_PURE_PYTHON is set.
 *
 * split(buf, start, end, max_request) -> ([bytearray], start)
 *   each frame a private, writable copy of the bytes after its int32 size; start: where the first frame that is
 *   incomplete or whose size is outside [8, max_request] begins (end when there is none). The caller handles that
 *   one as before (a large request's own buffer, closing on a bad size, a SASL token's shorter frames).
 *
 * Every read is bounds-checked against the buffer and [start, end].
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *split(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "split(buf, start, end, max_request)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    long long max_request = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *frames = NULL;
    if (start < 0 || end < start || end > view.len) {
        PyErr_Format(PyExc_ValueError, "split: [%zd, %zd) is not within a buffer of %zd bytes", start, end,
                     view.len);
        goto fail;
    }
    frames = PyList_New(0);
    if (frames == NULL)
        goto fail;
    const uint8_t *b = view.buf;
    while (end - start >= 4) {
        const uint8_t *p = b + start;
        int32_t size = (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
        if (size < 8 || (long long)size > max_request || (Py_ssize_t)size > end - start - 4)
            break;
        PyObject *frame = PyByteArray_FromStringAndSize((const char *)p + 4, size);
        if (frame == NULL)
            goto fail;
        int rc = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (rc < 0)
            goto fail;
        start += 4 + (Py_ssize_t)size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", frames, start);
fail:
    Py_XDECREF(frames);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split", (PyCFunction)(void (*)(void))split, METH_FASTCALL,
     "split(buf, start, end, max_request) -> ([bytearray], start)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kbroker.protocol._frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
