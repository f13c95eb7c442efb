/* Replay of a recorded alloc/free program through the core, in one C loop (whatif/replay.py
 * holds the reference loop in Python and the meaning of each op; the two are tested equal).
 *
 * An op per recorded event, with the event's recorded address, request and stream:
 *   OP_NOP     nothing (segment events, snapshots: the policy makes its own)
 *   OP_MALLOC  malloc(size, stream); the replayed address is filed under the recorded one
 *   OP_FREE    free the block filed under the recorded address (skipped when its malloc
 *              failed in the replay; counted as unmatched when none was filed)
 *   OP_PROBE   a request that failed when recorded: malloc, and on success free at once
 * plus the flag OP_EMPTY_CACHE: empty_cache() before the op. After each op, reserved and
 * allocated bytes go to the output arrays. Out of memory (the exception type given) is caught
 * and counted by the core as usual; any other error stops the replay and is raised. */
#include "core.h"

enum { OP_NOP, OP_MALLOC, OP_FREE, OP_PROBE, OP_KIND = 7, OP_EMPTY_CACHE = 8 };

/* recorded address -> replayed address (0: the malloc failed in the replay); keys are stored
   as address + 1, so that 0 marks an empty slot */
typedef struct AddrTable {
    uint64_t *keys;
    int64_t *vals;
    Py_ssize_t cap, n;
} AddrTable;

static inline Py_ssize_t table_home(const AddrTable *t, uint64_t key) {
    return (Py_ssize_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & (t->cap - 1);
}

static int table_put(AddrTable *t, uint64_t key, int64_t val) {
    if ((t->n + 1) * 2 > t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 1024;
        uint64_t *keys = PyMem_Calloc((size_t)cap, sizeof(uint64_t));
        int64_t *vals = PyMem_Calloc((size_t)cap, sizeof(int64_t));
        if (!keys || !vals) {
            PyMem_Free(keys);
            PyMem_Free(vals);
            PyErr_NoMemory();
            return -1;
        }
        AddrTable old = *t;
        t->keys = keys;
        t->vals = vals;
        t->cap = cap;
        for (Py_ssize_t i = 0; i < old.cap; i++) {
            if (!old.keys[i]) continue;
            Py_ssize_t j = table_home(t, old.keys[i]);
            while (keys[j]) j = (j + 1) & (cap - 1);
            keys[j] = old.keys[i];
            vals[j] = old.vals[i];
        }
        PyMem_Free(old.keys);
        PyMem_Free(old.vals);
    }
    Py_ssize_t j = table_home(t, key);
    while (t->keys[j] && t->keys[j] != key) j = (j + 1) & (t->cap - 1);
    if (!t->keys[j]) t->n++;
    t->keys[j] = key;
    t->vals[j] = val;
    return 0;
}

/* Take key out; 1 and its value in *val if it was there, else 0. */
static int table_pop(AddrTable *t, uint64_t key, int64_t *val) {
    if (!t->cap) return 0;
    Py_ssize_t mask = t->cap - 1, j = table_home(t, key);
    while (t->keys[j] && t->keys[j] != key) j = (j + 1) & mask;
    if (!t->keys[j]) return 0;
    *val = t->vals[j];
    Py_ssize_t hole = j, k = (j + 1) & mask;
    while (t->keys[k]) {
        Py_ssize_t home = table_home(t, t->keys[k]);
        if (((k - home) & mask) >= ((k - hole) & mask)) {
            t->keys[hole] = t->keys[k];
            t->vals[hole] = t->vals[k];
            hole = k;
        }
        k = (k + 1) & mask;
    }
    t->keys[hole] = 0;
    t->vals[hole] = 0;
    t->n--;
    return 1;
}

/* A C-contiguous buffer of n items of itemsize bytes; -1 with an exception set. */
static int get_array(PyObject *o, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n,
                     int writable, const char *what) {
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != itemsize || (n >= 0 && view->len != n * itemsize)) {
        PyErr_Format(PyExc_ValueError, "replay: %s must hold %zd items of %zd bytes", what,
                     n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* One malloc of the replay: its address, 0 when out of memory (caught), -1 on another error. */
static int64_t replay_malloc(Core *c, int64_t size, int64_t stream, PyObject *oom_type) {
    if (size <= 0) return 0;
    PyObject *r = core_malloc_locked(c, size, stream);
    if (!r) {
        if (PyErr_ExceptionMatches(oom_type)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    int64_t addr = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return addr;
}

/* replay(ops, addrs, sizes, streams, init_recorded, init_replayed, oom_type, reserved_out,
   allocated_out) -> (first failed op or -1, unmatched frees) */
PyObject *Core_replay(Core *c, PyObject *args) {
    PyObject *objs[9];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6], &objs[7], &objs[8]))
        return NULL;
    PyObject *oom_type = objs[6];
    Py_buffer v[8];
    int got = 0;
    PyObject *out = NULL;
    AddrTable table = {NULL, NULL, 0, 0};
    if (get_array(objs[0], &v[got], 1, -1, 0, "ops") < 0) goto done;
    got++;
    Py_ssize_t n = v[0].len, n0 = -1;
    static const char *names[] = {"addrs", "sizes", "streams", "init_recorded", "init_replayed"};
    for (int k = 1; k <= 5; k++) {
        if (get_array(objs[k], &v[got], 8, k >= 4 ? n0 : n, 0, names[k - 1]) < 0) goto done;
        if (k == 4) n0 = v[got].len / 8;
        got++;
    }
    if (get_array(objs[7], &v[got], 8, n, 1, "reserved_out") < 0) goto done;
    got++;
    if (get_array(objs[8], &v[got], 8, n, 1, "allocated_out") < 0) goto done;
    got++;
    const int8_t *ops = v[0].buf;
    const int64_t *addrs = v[1].buf, *sizes = v[2].buf, *streams = v[3].buf;
    const int64_t *init_rec = v[4].buf, *init_rep = v[5].buf;
    int64_t *reserved = v[6].buf, *allocated = v[7].buf;
    core_lock(c);
    int64_t first_oom = -1, unmatched = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < n0 && !failed; i++)
        failed = table_put(&table, (uint64_t)init_rec[i] + 1, init_rep[i]) < 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        int op = ops[i];
        if ((op & OP_EMPTY_CACHE) && release_cached_blocks(c, R_EMPTY_CACHE) < 0) {
            failed = 1;
            break;
        }
        switch (op & OP_KIND) {
        case OP_MALLOC: {
            int64_t addr = replay_malloc(c, sizes[i], streams[i], oom_type);
            if (addr < 0) {
                failed = 1;
                break;
            }
            if (addr == 0 && sizes[i] > 0 && first_oom < 0) first_oom = i;
            if (table_put(&table, (uint64_t)addrs[i] + 1, addr) < 0) failed = 1;
            break;
        }
        case OP_FREE: {
            int64_t addr;
            if (!table_pop(&table, (uint64_t)addrs[i] + 1, &addr)) unmatched++;
            else if (addr && core_free_addr(c, (unsigned long long)addr) < 0) failed = 1;
            break;
        }
        case OP_PROBE: {
            int64_t addr = replay_malloc(c, sizes[i], streams[i], oom_type);
            if (addr < 0) failed = 1;
            else if (addr == 0 && sizes[i] > 0 && first_oom < 0) first_oom = i;
            else if (addr && core_free_addr(c, (unsigned long long)addr) < 0) failed = 1;
            break;
        }
        default:
            break;
        }
        reserved[i] = c->reserved;
        allocated[i] = c->pooled[S_ALLOCATED_BYTES][P_ALL].current;
    }
    core_unlock(c);
    if (!failed) out = Py_BuildValue("(LL)", (long long)first_oom, (long long)unmatched);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&v[k]);
    PyMem_Free(table.keys);
    PyMem_Free(table.vals);
    return out;
}
