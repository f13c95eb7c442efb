/* CuPy's allocator hooks over C cores. */
#include "core.h"
/* ---------------------------------------------------------------------------------------- */
/* CuPy hooks: the malloc(size, device_id) and free(ptr, device_id) functions CuPy's
   PythonFunctionAllocator calls, in C, so no Python frame runs between CuPy and the core.    */

typedef struct {
    PyObject_HEAD
    PyObject *cores;      /* list: device id -> Core, or None until made */
    PyObject *get_stream; /* cupy.cuda.get_current_stream */
    PyObject *missing;    /* missing(device_id) -> Core, and puts it in the list */
} Hooks;

static PyObject *str_ptr; /* "ptr", interned */

static Core *hooks_core(Hooks *k, long device) {
    if (device >= 0 && device < PyList_GET_SIZE(k->cores)) {
        PyObject *c = PyList_GET_ITEM(k->cores, device);
        if (c != Py_None) return (Core *)c;
    }
    PyObject *r = PyObject_CallFunction(k->missing, "l", device);
    if (!r) return NULL;
    int ok = PyObject_TypeCheck(r, CoreType);
    Py_DECREF(r);
    if (!ok || device < 0 || device >= PyList_GET_SIZE(k->cores) ||
        PyList_GET_ITEM(k->cores, device) != r) {
        PyErr_SetString(PyExc_TypeError, "missing() must return the C core it put in the list");
        return NULL;
    }
    return (Core *)r; /* the list keeps it alive */
}

static PyObject *Hooks_malloc(Hooks *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "malloc(size, device_id)");
        return NULL;
    }
    long long size = PyLong_AsLongLong(args[0]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    long device = PyLong_AsLong(args[1]);
    if (device == -1 && PyErr_Occurred()) return NULL;
    if (size <= 0) {
        if (size == 0) return PyLong_FromLong(0);
        return PyErr_Format(PyExc_ValueError, "cannot allocate a negative size (%lld B)", size);
    }
    Core *c = hooks_core(k, device);
    if (!c) return NULL;
    /* get_stream gives the stream's pointer (CuPy's get_current_stream_ptr) or a Stream */
    PyObject *ptr_obj = PyObject_CallNoArgs(k->get_stream);
    if (!ptr_obj) return NULL;
    if (!PyLong_Check(ptr_obj)) {
        PyObject *stream_obj = ptr_obj;
        ptr_obj = PyObject_GetAttr(stream_obj, str_ptr);
        Py_DECREF(stream_obj);
        if (!ptr_obj) return NULL;
    }
    long long stream = PyLong_AsLongLong(ptr_obj);
    Py_DECREF(ptr_obj);
    if (stream == -1 && PyErr_Occurred()) return NULL;
    Py_INCREF(c); /* a callback inside malloc may drop the list's reference */
    core_lock(c);
    PyObject *r = core_malloc_locked(c, size, stream);
    core_unlock(c);
    Py_DECREF(c);
    return r;
}

static PyObject *Hooks_free(Hooks *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "free(ptr, device_id)");
        return NULL;
    }
    unsigned long long ptr = PyLong_AsUnsignedLongLong(args[0]);
    if (ptr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    long device = PyLong_AsLong(args[1]);
    if (device == -1 && PyErr_Occurred()) return NULL;
    if (ptr == 0) Py_RETURN_NONE;
    Core *c = hooks_core(k, device);
    if (!c) return NULL;
    Py_INCREF(c);
    int r = core_free_addr(c, ptr);
    Py_DECREF(c);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
}

static int Hooks_init(Hooks *k, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"cores", "get_stream", "missing", NULL};
    PyObject *cores, *get_stream, *missing;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO", kwlist, &PyList_Type, &cores,
                                     &get_stream, &missing))
        return -1;
    Py_INCREF(cores);
    Py_INCREF(get_stream);
    Py_INCREF(missing);
    Py_XSETREF(k->cores, cores);
    Py_XSETREF(k->get_stream, get_stream);
    Py_XSETREF(k->missing, missing);
    return 0;
}

static int Hooks_traverse(Hooks *k, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(k));
    Py_VISIT(k->cores);
    Py_VISIT(k->get_stream);
    Py_VISIT(k->missing);
    return 0;
}

static int Hooks_clear(Hooks *k) {
    Py_CLEAR(k->cores);
    Py_CLEAR(k->get_stream);
    Py_CLEAR(k->missing);
    return 0;
}

static void Hooks_dealloc(Hooks *k) {
    PyObject_GC_UnTrack(k);
    Hooks_clear(k);
    PyTypeObject *tp = Py_TYPE(k);
    tp->tp_free(k);
    Py_DECREF(tp);
}

static PyMethodDef Hooks_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))Hooks_malloc, METH_FASTCALL,
     "malloc(size, device_id) -> address, for cupy.cuda.memory.PythonFunctionAllocator"},
    {"free", (PyCFunction)(void (*)(void))Hooks_free, METH_FASTCALL, "free(ptr, device_id)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Hooks_slots[] = {
    {Py_tp_doc, "CuPy's allocator hooks over C cores, one per device."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, (void *)Hooks_init},
    {Py_tp_dealloc, (void *)Hooks_dealloc},
    {Py_tp_traverse, (void *)Hooks_traverse},
    {Py_tp_clear, (void *)Hooks_clear},
    {Py_tp_methods, Hooks_methods},
    {0, NULL},
};

static PyType_Spec Hooks_spec = {
    "jupyter_gpumem._native.Hooks", sizeof(Hooks), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    Hooks_slots,
};

int add_hooks_type(PyObject *module) {
    str_ptr = PyUnicode_InternFromString("ptr");
    if (!str_ptr) return -1;
    PyObject *hooks = PyType_FromSpec(&Hooks_spec);
    if (!hooks || PyModule_AddObject(module, "Hooks", hooks) < 0) {
        Py_XDECREF(hooks);
        return -1;
    }
    return 0;
}
