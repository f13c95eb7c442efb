/* The alloc/free pair PyTorch's CUDAPluggableAllocator calls, over the C cores: one cache for
   CuPy and PyTorch. torch_entry_points() gives their addresses, for
   torch._C._cuda_customAllocator(alloc, free); they are also exported by name, for
   torch.cuda.memory.CUDAPluggableAllocator(path of this module, name, name). */
#include "core.h"

/* Note [Calls without the GIL]: PyTorch calls alloc(size, device, stream) and
 * free(ptr, size, device, stream) from whichever thread allocates: the Python thread running an
 * op (it holds the GIL), autograd's device threads during backward() (the thread that called
 * backward() waits in the engine with the GIL released: they do not hold it), and other C++
 * threads. CUDAPluggableAllocator holds none of its own locks while it calls them (it takes its
 * metadata mutex after alloc returns and lets go of it before it calls free). PyGILState_Check()
 * tells the two cases apart (the PyGILState API assumes one interpreter; so does PyTorch).
 *
 * The cached path. A hit (core_malloc_cached) and a plain free (core_free_cached) run under the
 * core's lock alone, whoever calls: pure C, no Python object, only raw memory (Note [Block structs
 * are raw memory] in core.h), and they check before they change anything that they can finish.
 * A thread with the GIL takes the lock with core_lock (it waits with the GIL released); a thread
 * without it with core_lock_nogil (a plain wait).
 *
 * The slow path: everything else. A miss that needs a segment from the device, the retry ladder
 * and the out-of-memory report, history events (the clock, the recorder, the stack walk), a free
 * whose block holds a stack or needs a bigger pool buffer, a request above MAX_ALLOC_SIZE, and a
 * device's first call (missing(device) makes and binds its core). It takes the GIL
 * (PyGILState_Ensure) unless the thread holds it and runs what CuPy's hooks run:
 * core_malloc_locked and core_free_addr. Why the GIL and not cudaMalloc straight from C: the
 * device is a Python object (CupyDevice picks the device and tells an OOM from other errors; a
 * SimulatedDevice in tests; expandable segments map pages through cuda.bindings), the OOM report
 * is built in Python, and history walks Python stacks. A device call costs tens of µs and more;
 * taking a free GIL costs well under one, and one path keeps one set of books for both libraries.
 *
 * No deadlock. The locks are the GIL, the core's lock (one per device) and PyTorch's mutexes:
 * 1. No thread waits for the GIL while it holds a core's lock: the slow path starts after the
 *    cached attempt has let the lock go, and takes the lock again once it holds the GIL. A thread
 *    that holds the GIL and waits for a core's lock waits with the GIL released (core_lock).
 * 2. A thread without the GIL that holds a core's lock runs only the cached paths, which wait for
 *    nothing: a wait for the lock it holds always ends.
 * 3. A thread with the GIL may call Python under a core's lock (the device, the recorder, the OOM
 *    handler), and a garbage collection there may free a tensor: PyTorch's free then calls us in
 *    the same thread, which takes the same lock again (it is re-entrant); PyTorch's metadata mutex
 *    is never held across our calls. That Python never waits for autograd.
 * 4. Taking the GIL from an autograd thread, under whatever engine locks its caller holds, is what
 *    PyTorch itself does to run Python hooks and Python autograd Functions on those threads; so
 *    PyTorch already keeps every thread that holds the GIL from waiting on those locks (it
 *    releases the GIL in backward() and around its waits). The slow path adds no new order.
 *
 * History. Events are recorded only under the GIL: while a core records, every call takes the
 * slow path. A thread that took the GIL for it gets its own Python stack, none for autograd's
 * C++ threads (PyTorch's own history has only C++ frames there).
 *
 * Errors. alloc returns NULL on any failure: out of memory (the core's OutOfMemoryError with its
 * report), the device's error, no core for the device. The exception is kept, without its
 * traceback (no frames kept alive), for torch_take_error(); none is left pending in the thread,
 * and one already pending there is put back. A free of an address no core bound here holds
 * (never handed out, or freed already) is ignored and counted. A core once bound is kept, alive,
 * for good, so that blocks handed out before a rebind or an unbind still go back to it.
 *
 * Streams. PyTorch's cudaStream_t is the pool's stream key, as the current stream's pointer is
 * for CuPy (hooks.c): the legacy default stream is 0 in both, so a block PyTorch freed on the
 * default stream serves a CuPy array on the default stream.
 *
 * Interpreter exit. Once the interpreter finalizes (Py_IsInitialized() turns false after the
 * atexit functions, before modules are torn down), alloc returns NULL and free does nothing: a
 * tensor freed by the teardown, or by a C++ destructor after it, stays on our books, and its
 * memory goes with the process. A thread without the GIL must then not take it (CPython would
 * stop the thread): finalizing() guards the slow paths in the moment before. */

/* Note [What PyTorch's pluggable path leaves out] (CUDAPluggableAllocator, PyTorch 2.x): with only
 * alloc and free given from Python, recordStream, emptyCache and setMemoryFraction do nothing;
 * getDeviceStats, resetPeakStats, resetAccumulatedStats, snapshot, recordHistory, cacheInfo,
 * getMemoryFraction and the IPC handles raise "does not yet support" (so torch.cuda's memory
 * functions must answer from our books, and cudnn's benchmark mode, which asks cacheInfo for the
 * largest block, may fail); CUDA graphs' private pools (beginAllocateToPool) are not kept apart,
 * so memory a captured graph uses can be handed to others: no graph capture under one cache.
 * PyTorch's own expandable_segments does not apply (its allocator is not used); ours does, for
 * both libraries. Without recordStream a block freed while a side stream still uses it goes back
 * to the cache at once (Note [No pending frees] in allocator.py), as with CuPy. What the Python
 * side gives instead: runtime/torch_books.py answers torch.cuda's memory functions (empty_cache
 * and the memory fraction too) from our books; Note [What one cache cannot do] in
 * runtime/torch_share.py refuses graph capture clearly and warns at record_stream. */

#define JG_EXPORT __attribute__((visibility("default")))
#define MAX_TORCH_DEVICES 128

/* the core PyTorch's calls for a device go to; written under the GIL, read by anyone */
static Core *bound[MAX_TORCH_DEVICES];

/* every core ever bound, each holding a reference for good: a list that only grows, at its head,
   under the GIL; read by anyone */
typedef struct Seen {
    Core *core;
    struct Seen *next;
} Seen;
static Seen *seen_head;

static PyObject *missing_fn;  /* missing(device) -> Core, or NULL; under the GIL */
static PyObject *last_error;  /* the last failure's exception, or NULL; under the GIL */

/* Note [The shim reads the error]: PyTorch does not check alloc's result (a NULL becomes a
 * tensor at address 0, and the first kernel that writes to it poisons the CUDA context), so
 * the function handed to PyTorch is a C++ shim (torch_shim.cpp) that calls
 * jupyter_gpumem_torch_alloc and, on NULL, throws with the text of why: out of memory (our
 * OOM report's message, as c10::OutOfMemoryError, which PyTorch raises as
 * torch.OutOfMemoryError) or another failure. That text is kept per thread, at the failure, by
 * the thread that failed (the slow path holds the GIL then, or needs none), so the shim reads
 * it in the same thread with no lock and no Python: jupyter_gpumem_torch_error(&is_oom). No C
 * frame of ours is unwound: our alloc has returned before the shim throws. */
#define ERROR_TEXT_MAX 4096
static _Thread_local char error_text[ERROR_TEXT_MAX];
static _Thread_local int error_is_oom;

static void set_error_text(const char *text, Py_ssize_t n, int is_oom) {
    if (n < 0) n = (Py_ssize_t)strlen(text);
    if (n >= ERROR_TEXT_MAX) n = ERROR_TEXT_MAX - 1;
    memcpy(error_text, text, (size_t)n);
    error_text[n] = 0;
    error_is_oom = is_oom;
}

/* rare events, counted atomically */
enum { N_SLOW_ALLOC, N_SLOW_FREE, N_UNKNOWN_FREE, N_DROPPED_FREE, N_REFUSED_ALLOC, N_COUNTERS };
static int64_t counters[N_COUNTERS];
static const char *counter_names[N_COUNTERS] = {"slow_allocs", "slow_frees", "unknown_frees",
                                                "dropped_frees", "refused_allocs"};

static inline void count(int which) { __atomic_fetch_add(&counters[which], 1, __ATOMIC_RELAXED); }

/* ---------------------------------------------------------------------------------------- */
/* the call log: who called, from which thread, with or without the GIL (tests, the probe)   */

enum { OP_ALLOC, OP_FREE };
enum { PATH_CACHED, PATH_SLOW, PATH_UNKNOWN, PATH_REFUSED };
#define LOG_MAX 65536

typedef struct TorchCall {
    uint64_t thread;    /* threading.get_ident() of the caller */
    int64_t native_id;  /* threading.get_native_id() (the kernel's thread id) */
    int64_t device, stream, size, ptr;
    int op, path, gil, done;
} TorchCall;

static TorchCall *log_v; /* LOG_MAX entries, made on first use, never freed */
static int64_t log_cap;  /* calls to keep; 0: not logging */
static int64_t log_n;    /* calls since the log started */

static void log_entry(int op, int path, int gil, int device, int64_t stream, int64_t size,
                      uint64_t ptr) {
    int64_t i = __atomic_fetch_add(&log_n, 1, __ATOMIC_RELAXED);
    if (i >= __atomic_load_n(&log_cap, __ATOMIC_RELAXED)) return;
    TorchCall *e = &log_v[i];
    e->thread = this_thread();
#ifdef PY_HAVE_THREAD_NATIVE_ID
    e->native_id = (int64_t)PyThread_get_thread_native_id();
#else
    e->native_id = 0;
#endif
    e->device = device;
    e->stream = stream;
    e->size = size;
    e->ptr = (int64_t)ptr;
    e->op = op;
    e->path = path;
    e->gil = gil;
    __atomic_store_n(&e->done, 1, __ATOMIC_RELEASE);
}

static inline void log_call(int op, int path, int gil, int device, int64_t stream, int64_t size,
                            uint64_t ptr) {
    if (__atomic_load_n(&log_cap, __ATOMIC_ACQUIRE))
        log_entry(op, path, gil, device, stream, size, ptr);
}

/* ---------------------------------------------------------------------------------------- */
/* binding                                                                                   */

static inline Core *bound_core(int device) {
    if (device < 0 || device >= MAX_TORCH_DEVICES) return NULL;
    return __atomic_load_n(&bound[device], __ATOMIC_ACQUIRE);
}

/* Keep c for good (once); GIL held. -1 with an exception set on out of memory. */
static int remember(Core *c) {
    for (Seen *s = seen_head; s; s = s->next)
        if (s->core == c) return 0;
    Seen *n = PyMem_RawMalloc(sizeof(Seen));
    if (!n) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(c);
    n->core = c;
    n->next = seen_head;
    __atomic_store_n(&seen_head, n, __ATOMIC_RELEASE);
    return 0;
}

/* Bind device to c (NULL: unbind); GIL held. */
static int bind(int device, Core *c) {
    if (c && remember(c) < 0) return -1;
    __atomic_store_n(&bound[device], c, __ATOMIC_RELEASE);
    return 0;
}

/* The core for device, made and bound by missing() on first use: a new reference, or NULL with
   an exception set. GIL held. */
static Core *core_for(int device) {
    Core *c = bound_core(device);
    if (c) {
        Py_INCREF(c);
        return c;
    }
    if (device < 0 || device >= MAX_TORCH_DEVICES) {
        PyErr_Format(PyExc_ValueError, "jupyter_gpumem: CUDA device %d is out of range", device);
        return NULL;
    }
    if (!missing_fn) {
        PyErr_Format(PyExc_RuntimeError,
                     "jupyter_gpumem: no allocator is bound to CUDA device %d for PyTorch", device);
        return NULL;
    }
    PyObject *fn = missing_fn;
    Py_INCREF(fn);
    PyObject *r = PyObject_CallFunction(fn, "i", device);
    Py_DECREF(fn);
    if (!r) return NULL;
    if (!PyObject_TypeCheck(r, CoreType)) {
        PyErr_Format(PyExc_TypeError, "missing(%d) must return a C core, got %s", device,
                     Py_TYPE(r)->tp_name);
        Py_DECREF(r);
        return NULL;
    }
    if (!bound_core(device) && bind(device, (Core *)r) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return (Core *)r;
}

/* ---------------------------------------------------------------------------------------- */
/* the entry points                                                                          */

static inline int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* This thread's error text from exception value (Note [The shim reads the error]); GIL held,
   no exception pending. */
static void error_text_of(PyObject *value) {
    int is_oom = value && PyErr_GivenExceptionMatches(value, PyExc_MemoryError);
    PyObject *str = value ? PyObject_Str(value) : NULL;
    Py_ssize_t n = 0;
    const char *text = str ? PyUnicode_AsUTF8AndSize(str, &n) : NULL;
    if (text && n > 0) {
        set_error_text(text, n, is_oom);
    } else {
        PyErr_Clear();
        set_error_text(value ? Py_TYPE(value)->tp_name : "jupyter_gpumem: allocation failed", -1,
                       is_oom);
    }
    Py_XDECREF(str);
}

/* Move the pending exception to last_error, without its traceback, and its text to this
   thread's error text; GIL held. */
static void keep_error(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!type) return;
    PyErr_NormalizeException(&type, &value, &tb);
    if (value) PyException_SetTraceback(value, Py_None);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    error_text_of(value);
    Py_XSETREF(last_error, value);
}

static const char FINALIZING_TEXT[] =
    "jupyter_gpumem: the Python interpreter is shutting down; no new GPU memory is handed out";

static void *alloc_slow(Py_ssize_t size, int device, int64_t stream, int gil) {
    if (!gil && finalizing()) {
        set_error_text(FINALIZING_TEXT, -1, 0);
        count(N_REFUSED_ALLOC);
        log_call(OP_ALLOC, PATH_REFUSED, gil, device, stream, size, 0);
        return NULL;
    }
    PyGILState_STATE state = PyGILState_LOCKED;
    if (!gil) state = PyGILState_Ensure();
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* the caller's pending exception, if any, survives */
    void *out = NULL;
    Core *c = core_for(device);
    if (c) {
        PyObject *r;
        core_lock(c);
        if (size > 0) {
            r = core_malloc_locked(c, size, stream);
        } else { /* above 2**63 as a size_t: out of memory at once */
            PyObject *n = PyLong_FromSize_t((size_t)size);
            r = n ? core_oom_too_large(c, n, stream) : NULL;
            Py_XDECREF(n);
        }
        core_unlock(c);
        Py_DECREF(c);
        if (r) {
            out = (void *)(uintptr_t)PyLong_AsUnsignedLongLong(r);
            Py_DECREF(r);
        }
    }
    if (!out) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "jupyter_gpumem: the core returned no address");
        keep_error();
    }
    PyErr_Restore(type, value, tb);
    count(N_SLOW_ALLOC);
    log_call(OP_ALLOC, PATH_SLOW, gil, device, stream, size, (uint64_t)(uintptr_t)out);
    if (!gil) PyGILState_Release(state);
    return out;
}

JG_EXPORT void *jupyter_gpumem_torch_alloc(Py_ssize_t size, int device, void *stream) {
    if (size == 0) return NULL;
    if (!Py_IsInitialized()) {
        set_error_text(FINALIZING_TEXT, -1, 0);
        return NULL;
    }
    int gil = PyGILState_Check();
    int64_t s = (int64_t)(intptr_t)stream;
    Core *c = bound_core(device);
    if (c && size > 0) {
        int64_t addr;
        if (gil) core_lock(c);
        else core_lock_nogil(c);
        int hit = core_malloc_cached(c, size, s, &addr);
        core_unlock(c);
        if (hit) {
            log_call(OP_ALLOC, PATH_CACHED, gil, device, s, size, (uint64_t)addr);
            return (void *)(intptr_t)addr;
        }
    }
    return alloc_slow(size, device, s, gil);
}

static int free_cached_in(Core *c, uint64_t ptr, int gil) {
    if (gil) core_lock(c);
    else core_lock_nogil(c);
    int r = core_free_cached(c, ptr);
    core_unlock(c);
    return r;
}

static void free_slow(Core *c, uint64_t ptr, int gil, int device, int64_t stream, int64_t size) {
    if (!gil && finalizing()) {
        count(N_DROPPED_FREE);
        log_call(OP_FREE, PATH_REFUSED, gil, device, stream, size, ptr);
        return;
    }
    PyGILState_STATE state = PyGILState_LOCKED;
    if (!gil) state = PyGILState_Ensure();
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (core_free_addr(c, ptr) < 0) keep_error(); /* c is kept for good: no reference needed */
    PyErr_Restore(type, value, tb);
    count(N_SLOW_FREE);
    log_call(OP_FREE, PATH_SLOW, gil, device, stream, size, ptr);
    if (!gil) PyGILState_Release(state);
}

JG_EXPORT void jupyter_gpumem_torch_free(void *ptr, Py_ssize_t size, int device, void *stream) {
    if (!ptr || !Py_IsInitialized()) return;
    int gil = PyGILState_Check();
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    int64_t s = (int64_t)(intptr_t)stream;
    Core *c = bound_core(device);
    int r = c ? free_cached_in(c, p, gil) : -1;
    /* not the bound core's block: one bound before it (or to another device) may hold it */
    for (Seen *e = __atomic_load_n(&seen_head, __ATOMIC_ACQUIRE); r < 0 && e; e = e->next) {
        if (e->core == bound_core(device)) continue;
        r = free_cached_in(e->core, p, gil);
        if (r >= 0) c = e->core;
    }
    if (r == 1) {
        log_call(OP_FREE, PATH_CACHED, gil, device, s, size, p);
    } else if (r < 0) {
        count(N_UNKNOWN_FREE);
        log_call(OP_FREE, PATH_UNKNOWN, gil, device, s, size, p);
    } else {
        free_slow(c, p, gil, device, s, size);
    }
}

/* Why this thread's last alloc returned NULL, in words (Note [The shim reads the error]);
   *is_oom (if given) is 1 when it was out of memory. Valid until this thread's next failure. */
JG_EXPORT const char *jupyter_gpumem_torch_error(int *is_oom) {
    if (is_oom) *is_oom = error_is_oom;
    return error_text;
}

/* ---------------------------------------------------------------------------------------- */
/* Python functions                                                                          */

static PyObject *torch_entry_points(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)&jupyter_gpumem_torch_alloc,
                         (unsigned long long)(uintptr_t)&jupyter_gpumem_torch_free);
}

static PyObject *torch_error_entry(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&jupyter_gpumem_torch_error);
}

static PyObject *torch_error_text(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    int is_oom = 0;
    const char *text = jupyter_gpumem_torch_error(&is_oom);
    return Py_BuildValue("(si)", text, is_oom);
}

static int device_arg(PyObject *o, int *device) {
    long d = PyLong_AsLong(o);
    if (d == -1 && PyErr_Occurred()) return -1;
    if (d < 0 || d >= MAX_TORCH_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device must be in [0, %d), got %ld", MAX_TORCH_DEVICES,
                     d);
        return -1;
    }
    *device = (int)d;
    return 0;
}

static PyObject *torch_bind(PyObject *self, PyObject *args) {
    PyObject *device_obj, *core;
    int device;
    if (!PyArg_ParseTuple(args, "OO", &device_obj, &core) || device_arg(device_obj, &device) < 0)
        return NULL;
    if (core != Py_None && !PyObject_TypeCheck(core, CoreType)) {
        PyErr_Format(PyExc_TypeError, "core must be a C core or None, got %s",
                     Py_TYPE(core)->tp_name);
        return NULL;
    }
    if (bind(device, core == Py_None ? NULL : (Core *)core) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *torch_bound(PyObject *self, PyObject *arg) {
    int device;
    if (device_arg(arg, &device) < 0) return NULL;
    Core *c = bound_core(device);
    if (!c) Py_RETURN_NONE;
    Py_INCREF(c);
    return (PyObject *)c;
}

static PyObject *torch_set_missing(PyObject *self, PyObject *fn) {
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "missing must be callable or None");
        return NULL;
    }
    Py_XINCREF(fn == Py_None ? NULL : fn);
    Py_XSETREF(missing_fn, fn == Py_None ? NULL : fn);
    Py_RETURN_NONE;
}

static PyObject *torch_take_error(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *e = last_error;
    last_error = NULL;
    if (!e) Py_RETURN_NONE;
    return e;
}

static PyObject *torch_counters(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < N_COUNTERS; i++) {
        PyObject *v = PyLong_FromLongLong(__atomic_load_n(&counters[i], __ATOMIC_RELAXED));
        if (!v || PyDict_SetItemString(d, counter_names[i], v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *torch_log(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > LOG_MAX)
        return PyErr_Format(PyExc_ValueError, "n must be in [0, %d]", LOG_MAX);
    __atomic_store_n(&log_cap, 0, __ATOMIC_RELEASE);
    if (n && !log_v && !(log_v = PyMem_RawCalloc(LOG_MAX, sizeof(TorchCall))))
        return PyErr_NoMemory();
    if (n) {
        for (Py_ssize_t i = 0; i < n; i++) __atomic_store_n(&log_v[i].done, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&log_n, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&log_cap, (int64_t)n, __ATOMIC_RELEASE);
    }
    Py_RETURN_NONE;
}

static PyObject *torch_log_read(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    int64_t cap = __atomic_load_n(&log_cap, __ATOMIC_ACQUIRE);
    int64_t seen = __atomic_load_n(&log_n, __ATOMIC_RELAXED);
    PyObject *rows = PyList_New(0);
    for (int64_t i = 0; rows && i < (seen < cap ? seen : cap); i++) {
        TorchCall *e = &log_v[i];
        if (!__atomic_load_n(&e->done, __ATOMIC_ACQUIRE)) continue;
        PyObject *t = Py_BuildValue("(iiiKLLLLL)", e->op, e->path, e->gil,
                                    (unsigned long long)e->thread, (long long)e->native_id,
                                    (long long)e->device, (long long)e->stream,
                                    (long long)e->size, (long long)e->ptr);
        if (!t || PyList_Append(rows, t) < 0) Py_CLEAR(rows);
        Py_XDECREF(t);
    }
    if (!rows) return NULL;
    PyObject *out = Py_BuildValue("(OL)", rows, (long long)seen);
    Py_DECREF(rows);
    return out;
}

static inline int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* n alloc+free pairs of size bytes through the entry points, in C, as PyTorch calls them:
   the nanoseconds they took. Released GIL (release=True): as autograd's threads call. */
static PyObject *torch_time_pairs(PyObject *self, PyObject *args) {
    Py_ssize_t size, n;
    int device, release = 1;
    long long stream = 0;
    if (!PyArg_ParseTuple(args, "nin|Lp", &size, &device, &n, &stream, &release)) return NULL;
    if (size <= 0 || n < 0) return PyErr_Format(PyExc_ValueError, "size > 0 and n >= 0");
    void *vstream = (void *)(intptr_t)stream;
    int64_t failed_at = -1, t0 = 0, t1 = 0;
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    t0 = monotonic_ns();
    for (Py_ssize_t i = 0; i < n; i++) {
        void *p = jupyter_gpumem_torch_alloc(size, device, vstream);
        if (!p) {
            failed_at = i;
            break;
        }
        jupyter_gpumem_torch_free(p, size, device, vstream);
    }
    t1 = monotonic_ns();
    if (ts) PyEval_RestoreThread(ts);
    if (failed_at >= 0)
        return PyErr_Format(PyExc_MemoryError, "alloc %lld of %zd B failed (torch_take_error())",
                            (long long)failed_at, size);
    return PyLong_FromLongLong(t1 - t0);
}

static PyMethodDef torch_methods[] = {
    {"torch_entry_points", torch_entry_points, METH_NOARGS,
     "(alloc, free): addresses of jupyter_gpumem_torch_alloc and _free, for "
     "torch._C._cuda_customAllocator"},
    {"torch_error_entry", torch_error_entry, METH_NOARGS,
     "the address of jupyter_gpumem_torch_error(int *is_oom) -> const char *: why this thread's "
     "last alloc returned NULL (for the C++ shim that throws in PyTorch)"},
    {"torch_error_text", torch_error_text, METH_NOARGS,
     "(text, is_oom) of this thread's last failed alloc through the entry points"},
    {"torch_bind", torch_bind, METH_VARARGS,
     "torch_bind(device, core | None): the core PyTorch's calls for device go to"},
    {"torch_bound", torch_bound, METH_O, "torch_bound(device) -> the core bound, or None"},
    {"torch_set_missing", torch_set_missing, METH_O,
     "torch_set_missing(fn | None): fn(device) -> core, called (with the GIL) for a device with "
     "no core bound; its result is bound"},
    {"torch_take_error", torch_take_error, METH_NOARGS,
     "the exception of the last failed call (kept without traceback), or None; forgets it"},
    {"torch_counters", torch_counters, METH_NOARGS,
     "{slow_allocs, slow_frees, unknown_frees, dropped_frees, refused_allocs}: counts since load"},
    {"torch_log", torch_log, METH_O,
     "torch_log(n): log the next n calls (0 stops); call it while nothing allocates"},
    {"torch_log_read", torch_log_read, METH_NOARGS,
     "([(op, path, gil, thread ident, native id, device, stream, size, ptr)], calls seen); "
     "op 0 alloc 1 free; path 0 cached 1 slow 2 unknown 3 refused"},
    {"torch_time_pairs", torch_time_pairs, METH_VARARGS,
     "torch_time_pairs(size, device, n, stream=0, release=True) -> ns for n alloc+free pairs "
     "through the entry points, called from C"},
    {NULL, NULL, 0, NULL},
};

int add_torch_functions(PyObject *module) {
    return PyModule_AddFunctions(module, torch_methods);
}
