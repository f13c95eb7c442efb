/* CuPy's allocator hooks over C cores. */
#include "core.h"
/* ---------------------------------------------------------------------------------------- */
/* CuPy hooks: the malloc(size, device_id) and free(ptr, device_id) functions CuPy's
   PythonFunctionAllocator calls, in C, so no Python frame runs between CuPy and the core.
   alloc(size) is a whole CuPy allocator (what cupy.cuda.set_allocator takes): see
   Note [The size CuPy sees].                                                                 */

/* Note [The size CuPy sees]: CuPy code reads `memptr.mem.size` as the usable size of the
   allocation; CuPy's own pool reports its rounded block size there (a test of cupy.percentile
   fills all of it). PythonFunctionAllocator stores the requested size, and nothing it calls can
   change that, so alloc() builds the memory object itself: a PythonFunctionAllocatorMemory made
   with size 0 (so it calls no malloc), then given the core's pointer and the rounded size
   (round_size of the request) through its public `ptr` and `size`, and wrapped in a
   MemoryPointer. Its destructor calls free(ptr, device_id), as for PythonFunctionAllocator's.
   This is no slower than PythonFunctionAllocator.malloc: the two attribute stores replace a
   Python-level call of malloc(size, device_id). Requested bytes in the stats stay the request. */

typedef struct {
    PyObject_HEAD
    PyObject *cores;      /* list: device id -> Core, or None until made */
    PyObject *get_stream; /* cupy.cuda.get_current_stream */
    PyObject *missing;    /* missing(device_id) -> Core, and puts it in the list */
    /* for alloc(), or NULL: */
    PyObject *get_device; /* cupy.cuda.device.get_device_id */
    PyObject *memory;     /* cupy.cuda.memory.PythonFunctionAllocatorMemory */
    PyObject *pointer;    /* cupy.cuda.memory.MemoryPointer */
    PyObject *free_fn;    /* this object's free method, made on first use */
} Hooks;

static PyObject *str_ptr;  /* "ptr", interned */
static PyObject *str_size; /* "size", interned */
static PyObject *str_free; /* "free", interned */
static PyObject *zero;     /* 0 */

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

/* Run device's core for size (> 0) bytes on CuPy's current stream: the address, or NULL with
   an exception. *rounded (if given) gets the block size the core rounded the request to. */
static PyObject *hooks_core_malloc(Hooks *k, long device, long long size, int64_t *rounded) {
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
    if (rounded && r) *rounded = round_size(size, c->divisions); /* size <= MAX_ALLOC_SIZE */
    core_unlock(c);
    Py_DECREF(c);
    return r;
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
    return hooks_core_malloc(k, device, size, NULL);
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

/* Give a block the caller will never see back to its core, keeping the pending exception. */
static void hooks_undo_malloc(Hooks *k, long device, PyObject *addr) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    unsigned long long ptr = PyLong_AsUnsignedLongLong(addr);
    Core *c = PyErr_Occurred() ? NULL : hooks_core(k, device);
    if (c) {
        Py_INCREF(c);
        core_free_addr(c, ptr);
        Py_DECREF(c);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

static PyObject *Hooks_alloc(Hooks *k, PyObject *size_obj) {
    if (!k->memory) {
        PyErr_SetString(PyExc_TypeError,
                        "alloc() needs the Hooks made with get_device, memory and pointer");
        return NULL;
    }
    long long size = PyLong_AsLongLong(size_obj);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (size < 0)
        return PyErr_Format(PyExc_ValueError, "cannot allocate a negative size (%lld B)", size);
    if (!k->free_fn) {
        k->free_fn = PyObject_GetAttr((PyObject *)k, str_free);
        if (!k->free_fn) return NULL;
    }
    PyObject *device_obj = PyObject_CallNoArgs(k->get_device);
    if (!device_obj) return NULL;
    long device = PyLong_AsLong(device_obj);
    if (device == -1 && PyErr_Occurred()) {
        Py_DECREF(device_obj);
        return NULL;
    }
    PyObject *addr = NULL, *rounded_obj = NULL, *mem = NULL, *pointer = NULL;
    int64_t rounded = 0;
    if (size > 0) {
        addr = hooks_core_malloc(k, device, size, &rounded);
        if (!addr) goto done;
        rounded_obj = PyLong_FromLongLong(rounded);
        if (!rounded_obj) goto undo;
    }
    /* size 0: the memory object calls no malloc; ptr and size are set below */
    PyObject *margs[4] = {zero, Py_None, k->free_fn, device_obj};
    mem = PyObject_Vectorcall(k->memory, margs, 4, NULL);
    if (!mem) goto undo;
    if (addr) {
        if (PyObject_SetAttr(mem, str_size, rounded_obj) < 0) goto undo;
        if (PyObject_SetAttr(mem, str_ptr, addr) < 0) goto undo;
        Py_CLEAR(addr); /* mem owns the block now: its destructor frees it */
    }
    PyObject *pargs[2] = {mem, zero};
    pointer = PyObject_Vectorcall(k->pointer, pargs, 2, NULL);
    goto done;
undo:
    if (addr) hooks_undo_malloc(k, device, addr);
done:
    Py_XDECREF(mem);
    Py_XDECREF(addr);
    Py_XDECREF(rounded_obj);
    Py_DECREF(device_obj);
    return pointer;
}

static int Hooks_init(Hooks *k, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"cores", "get_stream", "missing", "get_device", "memory", "pointer",
                             NULL};
    PyObject *cores, *get_stream, *missing;
    PyObject *get_device = Py_None, *memory = Py_None, *pointer = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO|$OOO", kwlist, &PyList_Type, &cores,
                                     &get_stream, &missing, &get_device, &memory, &pointer))
        return -1;
    int given = (get_device != Py_None) + (memory != Py_None) + (pointer != Py_None);
    if (given != 0 && given != 3) {
        PyErr_SetString(PyExc_TypeError, "give all of get_device, memory and pointer, or none");
        return -1;
    }
    Py_INCREF(cores);
    Py_INCREF(get_stream);
    Py_INCREF(missing);
    Py_XSETREF(k->cores, cores);
    Py_XSETREF(k->get_stream, get_stream);
    Py_XSETREF(k->missing, missing);
    if (given) {
        Py_INCREF(get_device);
        Py_INCREF(memory);
        Py_INCREF(pointer);
        Py_XSETREF(k->get_device, get_device);
        Py_XSETREF(k->memory, memory);
        Py_XSETREF(k->pointer, pointer);
    } else {
        Py_CLEAR(k->get_device);
        Py_CLEAR(k->memory);
        Py_CLEAR(k->pointer);
    }
    return 0;
}

static int Hooks_traverse(Hooks *k, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(k));
    Py_VISIT(k->cores);
    Py_VISIT(k->get_stream);
    Py_VISIT(k->missing);
    Py_VISIT(k->get_device);
    Py_VISIT(k->memory);
    Py_VISIT(k->pointer);
    Py_VISIT(k->free_fn);
    return 0;
}

static int Hooks_clear(Hooks *k) {
    Py_CLEAR(k->cores);
    Py_CLEAR(k->get_stream);
    Py_CLEAR(k->missing);
    Py_CLEAR(k->get_device);
    Py_CLEAR(k->memory);
    Py_CLEAR(k->pointer);
    Py_CLEAR(k->free_fn);
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
    {"alloc", (PyCFunction)Hooks_alloc, METH_O,
     "alloc(size) -> MemoryPointer whose mem.size is the rounded block size, for "
     "cupy.cuda.set_allocator (Note [The size CuPy sees] in hooks.c)"},
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
    str_size = PyUnicode_InternFromString("size");
    str_free = PyUnicode_InternFromString("free");
    zero = PyLong_FromLong(0);
    if (!str_ptr || !str_size || !str_free || !zero) return -1;
    PyObject *hooks = PyType_FromSpec(&Hooks_spec);
    if (!hooks || PyModule_AddObject(module, "Hooks", hooks) < 0) {
        Py_XDECREF(hooks);
        return -1;
    }
    return 0;
}
