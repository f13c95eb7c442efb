/* The caching allocator's policy in C: the fast core behind jupyter_gpumem.CachingAllocator.
 *
 * It implements exactly the policy of the pure-Python core in _pycore.py (the reference, whose
 * module docstring states the rules), with the same interface, so CachingAllocator can use
 * either. tests/test_native.py drives both with the same random programs and compares every
 * counter and every block.
 *
 * Layout:
 *   Block      a range of a segment; doubly linked with its neighbours in the segment.
 *   Segment    one device allocation; kept in a list for snapshots.
 *   Pool       the cached free blocks of the small or the large pool, per stream, each stream's
 *              blocks in a sorted array ordered by (size, address): best fit is a binary search.
 *   AddrMap    open-addressing hash map from address to live (handed-out) block.
 *
 * Thread safety: the GIL serialises everything except while the core calls back into Python
 * (device malloc/free, the history recorder, the OOM handler). A re-entrant lock, taken by
 * every method, keeps other threads out during those calls and lets the same thread re-enter
 * (the OOM handler reads the state it reports).
 *
 * History lives here too: events go into a ring buffer and Python stacks are walked and interned
 * in C, so recording costs no Python call per event (see Note [History in C] below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <pythread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MIN_BLOCK_SIZE 512LL
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define LARGE_BUFFER (20LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)
#define NO_LIMIT INT64_MAX
#define NO_STACK (-1LL)

/* history actions, as _history.py numbers them */
enum { A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED, A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_OOM,
       A_SNAPSHOT };
/* what a stack walk does with a frame of a code object (_history.classify_code) */
enum { K_KEEP, K_SKIP, K_STOP };
#define MAX_FRAMES 24

/* pooled counters, in the order of stats() */
enum { S_ALLOCATION, S_SEGMENT, S_INACTIVE_SPLIT, S_ALLOCATED_BYTES, S_RESERVED_BYTES,
       S_INACTIVE_SPLIT_BYTES, S_REQUESTED_BYTES, N_POOLED };
enum { P_ALL, P_LARGE, P_SMALL };

typedef struct Stat { int64_t current, peak, allocated, freed; } Stat;

typedef struct Segment {
    int64_t addr, size, stream, stack;
    int small;
    struct Segment *prev, *next;
} Segment;

typedef struct Block {
    int64_t addr, size, requested, stream, gc_base, stack;
    Segment *segment;
    struct Block *prev, *next;
    int small, allocated;
} Block;

typedef struct StreamBlocks {
    int64_t stream;
    Block **v;
    Py_ssize_t n, cap;
} StreamBlocks;

typedef struct Pool {
    StreamBlocks *streams;
    Py_ssize_t nstreams, capstreams;
    int64_t searches;
    int small;
} Pool;

typedef struct AddrMap {
    uint64_t *keys;
    Block **vals;
    Py_ssize_t cap, n; /* cap is a power of two */
} AddrMap;

/* Note [History in C]: an event is a fixed-size record in a ring buffer that grows by doubling
 * up to max_entries, then overwrites its oldest entry. A stack is the list of (code, offset)
 * pairs of the frames the walk keeps, interned in StackTable; code objects are classified once
 * (keep, skip our own frames, stop at IPython's run_code) by a Python function and kept alive
 * by CodeKinds, so their addresses can key the tables. Lines are looked up only in Python,
 * when a snapshot asks for frames. */
typedef struct Event {
    int64_t action, addr, size, block_size, stream, time_ns, stack, cell, device_free;
} Event;

typedef struct Pair { PyObject *code; int64_t lasti; } Pair;

typedef struct Stack { uint64_t hash; Py_ssize_t n; Pair *pairs; } Stack;

typedef struct CodeKinds {
    PyObject **codes; /* keys; each holds a reference */
    int *kinds;
    Py_ssize_t cap, n;
} CodeKinds;

typedef struct History {
    int on, stacks;
    Event *ev;
    Py_ssize_t alloc, len, start, max_entries;
    int64_t dropped, last_stack, cell;
    PyObject *clock, *classify, *device_free; /* clock NULL: CLOCK_MONOTONIC, as perf_counter */
    CodeKinds kinds;
    Stack *stacks_v;
    Py_ssize_t nstacks, capstacks;
    int64_t *index; /* open addressing: stack ids, -1 empty */
    Py_ssize_t index_cap;
} History;

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner;
    int depth;
    Pool pools[2]; /* [0] large, [1] small */
    AddrMap active;
    Segment *segments;
    Py_ssize_t nsegments;
    int64_t reserved;
    int64_t max_split, cap, divisions;
    double gc_threshold;
    Stat pooled[N_POOLED][3];
    Stat oversize_allocations, oversize_segments;
    int64_t num_alloc_retries, num_ooms, num_device_alloc, num_device_free, num_sync_all_streams;
    int64_t mark_allocated, mark_reserved;
    PyObject *device_malloc, *device_free, *device_oom, *recorder, *oom_handler;
    History h;
} Core;

#define RECORDING(c) ((c)->recorder != NULL || (c)->h.on)

/* ---------------------------------------------------------------------------------------- */
/* counters                                                                                  */

static inline void stat_inc(Stat *s, int64_t amount) {
    s->current += amount;
    s->allocated += amount;
    if (s->current > s->peak) s->peak = s->current;
}

static inline void stat_dec(Stat *s, int64_t amount) {
    s->current -= amount;
    s->freed += amount;
}

static inline void pooled_inc(Core *c, int which, int small, int64_t amount) {
    stat_inc(&c->pooled[which][P_ALL], amount);
    stat_inc(&c->pooled[which][small ? P_SMALL : P_LARGE], amount);
}

static inline void pooled_dec(Core *c, int which, int small, int64_t amount) {
    stat_dec(&c->pooled[which][P_ALL], amount);
    stat_dec(&c->pooled[which][small ? P_SMALL : P_LARGE], amount);
}

/* ---------------------------------------------------------------------------------------- */
/* the re-entrant lock                                                                       */

static int core_lock(Core *c) {
    unsigned long me = PyThread_get_thread_ident();
    if (c->depth > 0 && c->owner == me) {
        c->depth++;
        return 0;
    }
    if (!PyThread_acquire_lock(c->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(c->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    c->owner = me;
    c->depth = 1;
    return 0;
}

static void core_unlock(Core *c) {
    if (--c->depth == 0) {
        c->owner = 0;
        PyThread_release_lock(c->lock);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* size rules                                                                                */

static int64_t round_size(int64_t size, int64_t divisions) {
    if (size < MIN_BLOCK_SIZE) return MIN_BLOCK_SIZE;
    if (divisions > 1 && size > MIN_BLOCK_SIZE * divisions) {
        if ((size & (size - 1)) == 0) return size;
        int64_t floor = 1;
        while (floor <= size / 2) floor <<= 1;
        int64_t step = floor / divisions;
        if (step == 0) return floor << 1;
        int64_t rounded = size & ~(step - 1);
        return rounded == size ? size : rounded + step;
    }
    return (size + MIN_BLOCK_SIZE - 1) / MIN_BLOCK_SIZE * MIN_BLOCK_SIZE;
}

static int64_t segment_size_for(int64_t size) {
    if (size <= SMALL_SIZE) return SMALL_BUFFER;
    if (size < MIN_LARGE_ALLOC) return LARGE_BUFFER;
    return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

/* ---------------------------------------------------------------------------------------- */
/* address map                                                                               */

static inline Py_ssize_t map_slot(const AddrMap *m, uint64_t key) {
    uint64_t h = (key >> 9) * 0x9E3779B97F4A7C15ULL;
    return (Py_ssize_t)(h >> 20) & (m->cap - 1);
}

static int map_grow(AddrMap *m) {
    Py_ssize_t old_cap = m->cap, new_cap = old_cap ? old_cap * 2 : 64;
    uint64_t *old_keys = m->keys;
    Block **old_vals = m->vals;
    uint64_t *keys = PyMem_Calloc((size_t)new_cap, sizeof(uint64_t));
    Block **vals = PyMem_Calloc((size_t)new_cap, sizeof(Block *));
    if (!keys || !vals) {
        PyMem_Free(keys);
        PyMem_Free(vals);
        PyErr_NoMemory();
        return -1;
    }
    m->keys = keys;
    m->vals = vals;
    m->cap = new_cap;
    for (Py_ssize_t i = 0; i < old_cap; i++) {
        if (old_keys[i]) {
            Py_ssize_t j = map_slot(m, old_keys[i]);
            while (keys[j]) j = (j + 1) & (new_cap - 1);
            keys[j] = old_keys[i];
            vals[j] = old_vals[i];
        }
    }
    PyMem_Free(old_keys);
    PyMem_Free(old_vals);
    return 0;
}

static int map_put(AddrMap *m, uint64_t key, Block *b) {
    if ((m->n + 1) * 2 > m->cap && map_grow(m) < 0) return -1;
    Py_ssize_t j = map_slot(m, key);
    while (m->keys[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) m->n++;
    m->keys[j] = key;
    m->vals[j] = b;
    return 0;
}

static Block *map_get(const AddrMap *m, uint64_t key) {
    if (!m->cap || !key) return NULL;
    Py_ssize_t j = map_slot(m, key);
    while (m->keys[j]) {
        if (m->keys[j] == key) return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

static Block *map_pop(AddrMap *m, uint64_t key) {
    if (!m->cap || !key) return NULL;
    Py_ssize_t mask = m->cap - 1, j = map_slot(m, key);
    while (m->keys[j] && m->keys[j] != key) j = (j + 1) & mask;
    if (!m->keys[j]) return NULL;
    Block *found = m->vals[j];
    /* backward-shift deletion keeps every probe chain unbroken */
    Py_ssize_t hole = j, k = (j + 1) & mask;
    while (m->keys[k]) {
        Py_ssize_t home = map_slot(m, m->keys[k]);
        if (((k - home) & mask) >= ((k - hole) & mask)) {
            m->keys[hole] = m->keys[k];
            m->vals[hole] = m->vals[k];
            hole = k;
        }
        k = (k + 1) & mask;
    }
    m->keys[hole] = 0;
    m->vals[hole] = NULL;
    m->n--;
    return found;
}

/* ---------------------------------------------------------------------------------------- */
/* pools                                                                                     */

static StreamBlocks *pool_stream(Pool *p, int64_t stream, int create) {
    for (Py_ssize_t i = 0; i < p->nstreams; i++)
        if (p->streams[i].stream == stream) return &p->streams[i];
    if (!create) return NULL;
    if (p->nstreams == p->capstreams) {
        Py_ssize_t cap = p->capstreams ? p->capstreams * 2 : 4;
        StreamBlocks *s = PyMem_Realloc(p->streams, (size_t)cap * sizeof(StreamBlocks));
        if (!s) {
            PyErr_NoMemory();
            return NULL;
        }
        p->streams = s;
        p->capstreams = cap;
    }
    StreamBlocks *s = &p->streams[p->nstreams++];
    s->stream = stream;
    s->v = NULL;
    s->n = s->cap = 0;
    return s;
}

/* first index whose (size, addr) >= (size, addr) */
static Py_ssize_t lower_bound(const StreamBlocks *s, int64_t size, int64_t addr) {
    Py_ssize_t lo = 0, hi = s->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        const Block *b = s->v[mid];
        if (b->size < size || (b->size == size && b->addr < addr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int pool_insert(Pool *p, Block *b) {
    StreamBlocks *s = pool_stream(p, b->stream, 1);
    if (!s) return -1;
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 16;
        Block **v = PyMem_Realloc(s->v, (size_t)cap * sizeof(Block *));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        s->v = v;
        s->cap = cap;
    }
    Py_ssize_t i = lower_bound(s, b->size, b->addr);
    memmove(&s->v[i + 1], &s->v[i], (size_t)(s->n - i) * sizeof(Block *));
    s->v[i] = b;
    s->n++;
    b->gc_base = p->searches;
    return 0;
}

static void pool_remove_at(StreamBlocks *s, Py_ssize_t i) {
    memmove(&s->v[i], &s->v[i + 1], (size_t)(s->n - i - 1) * sizeof(Block *));
    s->n--;
}

static void pool_remove(Pool *p, Block *b) {
    StreamBlocks *s = pool_stream(p, b->stream, 0);
    Py_ssize_t i = lower_bound(s, b->size, b->addr);
    pool_remove_at(s, i);
}

static Py_ssize_t pool_count(const Pool *p) {
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < p->nstreams; i++) n += p->streams[i].n;
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* history                                                                                   */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* The kind of a code object, classifying (and keeping) it on first sight; -1 on error. */
static int code_kind(History *h, PyObject *code) {
    if ((h->kinds.n + 1) * 2 > h->kinds.cap) {
        Py_ssize_t old_cap = h->kinds.cap, cap = old_cap ? old_cap * 2 : 256;
        PyObject **codes = PyMem_Calloc((size_t)cap, sizeof(PyObject *));
        int *kinds = PyMem_Calloc((size_t)cap, sizeof(int));
        if (!codes || !kinds) {
            PyMem_Free(codes);
            PyMem_Free(kinds);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < old_cap; i++) {
            if (!h->kinds.codes[i]) continue;
            Py_ssize_t j = (Py_ssize_t)(mix64((uint64_t)(uintptr_t)h->kinds.codes[i]) & (uint64_t)(cap - 1));
            while (codes[j]) j = (j + 1) & (cap - 1);
            codes[j] = h->kinds.codes[i];
            kinds[j] = h->kinds.kinds[i];
        }
        PyMem_Free(h->kinds.codes);
        PyMem_Free(h->kinds.kinds);
        h->kinds.codes = codes;
        h->kinds.kinds = kinds;
        h->kinds.cap = cap;
    }
    Py_ssize_t mask = h->kinds.cap - 1;
    Py_ssize_t j = (Py_ssize_t)(mix64((uint64_t)(uintptr_t)code) & (uint64_t)mask);
    while (h->kinds.codes[j]) {
        if (h->kinds.codes[j] == code) return h->kinds.kinds[j];
        j = (j + 1) & mask;
    }
    PyObject *r = PyObject_CallOneArg(h->classify, code);
    if (!r) return -1;
    long kind = PyLong_AsLong(r);
    Py_DECREF(r);
    if (kind == -1 && PyErr_Occurred()) return -1;
    Py_INCREF(code);
    h->kinds.codes[j] = code;
    h->kinds.kinds[j] = (int)kind;
    h->kinds.n++;
    return (int)kind;
}

static int index_insert(History *h, uint64_t hash, int64_t sid) {
    if ((h->nstacks + 1) * 2 > h->index_cap) {
        Py_ssize_t cap = h->index_cap ? h->index_cap * 2 : 256;
        int64_t *index = PyMem_Malloc((size_t)cap * sizeof(int64_t));
        if (!index) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < cap; i++) index[i] = -1;
        for (Py_ssize_t k = 0; k < h->nstacks; k++) {
            Py_ssize_t j = (Py_ssize_t)(h->stacks_v[k].hash & (uint64_t)(cap - 1));
            while (index[j] >= 0) j = (j + 1) & (cap - 1);
            index[j] = k;
        }
        PyMem_Free(h->index);
        h->index = index;
        h->index_cap = cap;
    }
    Py_ssize_t j = (Py_ssize_t)(hash & (uint64_t)(h->index_cap - 1));
    while (h->index[j] >= 0) j = (j + 1) & (h->index_cap - 1);
    h->index[j] = sid;
    return 0;
}

/* Walk the caller's Python stack and intern it; returns its id, or -2 with an exception set. */
static int64_t capture_stack(History *h) {
    Pair pairs[MAX_FRAMES];
    Py_ssize_t n = 0;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f && n < MAX_FRAMES) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int kind = code_kind(h, (PyObject *)code);
        if (kind < 0) {
            Py_DECREF(code);
            Py_DECREF(f);
            return -2;
        }
        if (kind == K_KEEP) {
            pairs[n].code = (PyObject *)code; /* kept alive by CodeKinds */
            pairs[n].lasti = PyFrame_GetLasti(f);
            n++;
        }
        Py_DECREF(code);
        if (kind == K_STOP) break;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    uint64_t hash = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        hash = mix64(hash ^ (uint64_t)(uintptr_t)pairs[i].code) + (uint64_t)pairs[i].lasti;
    if (h->index_cap) {
        Py_ssize_t j = (Py_ssize_t)(hash & (uint64_t)(h->index_cap - 1));
        while (h->index[j] >= 0) {
            Stack *s = &h->stacks_v[h->index[j]];
            if (s->hash == hash && s->n == n && memcmp(s->pairs, pairs, (size_t)n * sizeof(Pair)) == 0)
                return h->index[j];
            j = (j + 1) & (h->index_cap - 1);
        }
    }
    if (h->nstacks == h->capstacks) {
        Py_ssize_t cap = h->capstacks ? h->capstacks * 2 : 64;
        Stack *v = PyMem_Realloc(h->stacks_v, (size_t)cap * sizeof(Stack));
        if (!v) {
            PyErr_NoMemory();
            return -2;
        }
        h->stacks_v = v;
        h->capstacks = cap;
    }
    Stack *s = &h->stacks_v[h->nstacks];
    s->pairs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Pair));
    if (!s->pairs) {
        PyErr_NoMemory();
        return -2;
    }
    memcpy(s->pairs, pairs, (size_t)n * sizeof(Pair));
    s->n = n;
    s->hash = hash;
    int64_t sid = h->nstacks;
    if (index_insert(h, hash, sid) < 0) {
        PyMem_Free(s->pairs);
        return -2;
    }
    h->nstacks++;
    return sid;
}

static int push_event(History *h, const Event *e) {
    if (h->max_entries == 0) {
        h->dropped++;
        return 0;
    }
    if (h->len < h->max_entries) {
        if (h->len == h->alloc) {
            Py_ssize_t grow = h->alloc ? h->alloc * 2 : 1024;
            if (grow > h->max_entries) grow = h->max_entries;
            Event *ev = PyMem_Realloc(h->ev, (size_t)grow * sizeof(Event));
            if (!ev) {
                PyErr_NoMemory();
                return -1;
            }
            h->ev = ev;
            h->alloc = grow;
        }
        h->ev[h->len++] = *e; /* start stays 0 until the buffer is full */
    } else {
        h->ev[h->start] = *e;
        h->start = (h->start + 1) % h->max_entries;
        h->dropped++;
    }
    return 0;
}

static int64_t now_ns(History *h) {
    if (h->clock) {
        PyObject *r = PyObject_CallNoArgs(h->clock);
        if (!r) return -2;
        int64_t t = PyLong_AsLongLong(r);
        Py_DECREF(r);
        return (t == -1 && PyErr_Occurred()) ? -2 : t;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t native_record(Core *c, int action, int64_t addr, int64_t size,
                             int64_t block_size, int64_t stream) {
    History *h = &c->h;
    int64_t sid = NO_STACK;
    if (h->stacks) {
        sid = capture_stack(h);
        if (sid == -2) return -2;
    }
    Event e = {action, addr, size, block_size, stream, 0, sid, h->cell, 0};
    e.time_ns = now_ns(h);
    if (e.time_ns == -2 && PyErr_Occurred()) return -2;
    if (action == A_OOM && h->device_free) {
        PyObject *r = PyObject_CallNoArgs(h->device_free);
        if (!r) return -2;
        e.device_free = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (e.device_free == -1 && PyErr_Occurred()) return -2;
    }
    if (push_event(h, &e) < 0) return -2;
    if (action == A_FREE_REQUESTED) { /* Note [No pending frees] in _allocator.py */
        e.action = A_FREE_COMPLETED;
        if (push_event(h, &e) < 0) return -2;
    }
    return sid;
}

/* Record an event; returns the stack id, or -2 with an exception set. */
static int64_t record(Core *c, int action, int64_t addr, int64_t size, int64_t block_size,
                      int64_t stream) {
    if (c->h.on) return native_record(c, action, addr, size, block_size, stream);
    PyObject *r = PyObject_CallFunction(c->recorder, "iLLLL", action, (long long)addr,
                                        (long long)size, (long long)block_size,
                                        (long long)stream);
    if (!r) return -2;
    int64_t sid = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (sid == -1 && PyErr_Occurred()) return -2;
    return sid;
}

/* ---------------------------------------------------------------------------------------- */
/* segments                                                                                  */

/* A new segment: its whole-segment block in *out, or NULL when the device refused.
   Returns -1 (exception set) on any other error. */
static int alloc_block(Core *c, int64_t size, int64_t stream, int small, int retry, Block **out) {
    *out = NULL;
    if (retry) c->num_alloc_retries++;
    if (c->cap >= 0 && c->reserved + size > c->cap) return 0;
    if (!c->device_malloc) {
        PyErr_SetString(PyExc_RuntimeError, "the allocator core was cleared");
        return -1;
    }
    PyObject *r = PyObject_CallFunction(c->device_malloc, "LL", (long long)size,
                                        (long long)stream);
    if (!r) {
        if (PyErr_ExceptionMatches(c->device_oom)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    int64_t addr = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (addr == -1 && PyErr_Occurred()) return -1;
    Segment *seg = PyMem_Malloc(sizeof(Segment));
    Block *b = PyMem_Malloc(sizeof(Block));
    if (!seg || !b) {
        PyMem_Free(seg);
        PyMem_Free(b);
        PyErr_NoMemory();
        return -1;
    }
    seg->addr = addr;
    seg->size = size;
    seg->stream = stream;
    seg->small = small;
    seg->stack = NO_STACK;
    seg->prev = NULL;
    seg->next = c->segments;
    if (c->segments) c->segments->prev = seg;
    c->segments = seg;
    c->nsegments++;
    c->reserved += size;
    c->num_device_alloc++;
    pooled_inc(c, S_SEGMENT, small, 1);
    pooled_inc(c, S_RESERVED_BYTES, small, size);
    if (size >= c->max_split) stat_inc(&c->oversize_segments, 1);
    if (c->reserved > c->mark_reserved) c->mark_reserved = c->reserved;
    memset(b, 0, sizeof(Block));
    b->addr = addr;
    b->size = size;
    b->stream = stream;
    b->small = small;
    b->segment = seg;
    b->stack = NO_STACK;
    *out = b;
    if (RECORDING(c)) {
        int64_t sid = record(c, A_SEGMENT_ALLOC, addr, size, 0, stream);
        if (sid == -2) return -1; /* the block is in a consistent state; the caller frees it */
        seg->stack = sid;
    }
    return 0;
}

/* Return a cached whole-segment block to the device. */
static int release_block(Core *c, Block *b) {
    Pool *p = &c->pools[b->small];
    Segment *seg = b->segment;
    pool_remove(p, b);
    if (seg->prev) seg->prev->next = seg->next;
    else c->segments = seg->next;
    if (seg->next) seg->next->prev = seg->prev;
    c->nsegments--;
    c->reserved -= b->size;
    c->num_device_free++;
    pooled_dec(c, S_SEGMENT, b->small, 1);
    pooled_dec(c, S_RESERVED_BYTES, b->small, b->size);
    if (b->size >= c->max_split) stat_dec(&c->oversize_segments, 1);
    int64_t addr = b->addr, size = b->size, stream = b->stream;
    PyMem_Free(seg);
    PyMem_Free(b);
    if (!c->device_free) return 0;
    PyObject *r = PyObject_CallFunction(c->device_free, "L", (long long)addr);
    if (!r) return -1;
    Py_DECREF(r);
    if (RECORDING(c) && record(c, A_SEGMENT_FREE, addr, size, 0, stream) == -2) return -1;
    return 0;
}

static int is_whole(const Block *b) { return b->prev == NULL && b->next == NULL; }

/* Blocks of a pool in (stream, size, address) order, into a new array (for release loops). */
static Block **pool_snapshot(Pool *p, Py_ssize_t *n) {
    Py_ssize_t total = pool_count(p), k = 0, ns = p->nstreams;
    Block **v = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(Block *));
    Py_ssize_t *order = PyMem_Malloc((size_t)(ns ? ns : 1) * sizeof(Py_ssize_t));
    if (!v || !order) {
        PyMem_Free(v);
        PyMem_Free(order);
        PyErr_NoMemory();
        return NULL;
    }
    /* streams are kept in first-use order: sort their indices by stream id (few streams) */
    for (Py_ssize_t i = 0; i < ns; i++) {
        Py_ssize_t j = i;
        while (j > 0 && p->streams[order[j - 1]].stream > p->streams[i].stream) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        StreamBlocks *s = &p->streams[order[i]];
        for (Py_ssize_t j = 0; j < s->n; j++) v[k++] = s->v[j];
    }
    PyMem_Free(order);
    *n = k;
    return v;
}

static int release_cached_blocks(Core *c) {
    c->num_sync_all_streams++;
    for (int which = 0; which < 2; which++) { /* large pool first, then small */
        Py_ssize_t n;
        Block **v = pool_snapshot(&c->pools[which], &n);
        if (!v) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (is_whole(v[i]) && release_block(c, v[i]) < 0) {
                PyMem_Free(v);
                return -1;
            }
        }
        PyMem_Free(v);
    }
    return 0;
}

/* 1 if it released what is needed, 0 if not, -1 on error. */
static int release_available_cached_blocks(Core *c, Pool *p, int64_t size, int64_t stream) {
    int64_t ms = c->max_split;
    if (ms == NO_LIMIT) return 0;
    int64_t want = size > ms ? size : ms;
    StreamBlocks *s = pool_stream(p, stream, 0);
    if (!s) return 0;
    Py_ssize_t i = lower_bound(s, want, 0);
    if (i < s->n) return release_block(c, s->v[i]) < 0 ? -1 : 1;
    int64_t released = 0;
    while (released < want && s->n > 0 && s->v[s->n - 1]->size >= ms) {
        Block *b = s->v[s->n - 1];
        released += b->size;
        if (release_block(c, b) < 0) return -1;
        s = pool_stream(p, stream, 0); /* release_block may not move streams, but be safe */
        if (!s) break;
    }
    return released >= want;
}

static int garbage_collect(Core *c) {
    int64_t threshold = (int64_t)(c->gc_threshold * (double)c->cap);
    if (c->reserved <= threshold) return 0;
    int64_t target = c->reserved - threshold;
    Pool *p = &c->pools[0];
    Py_ssize_t n;
    Block **v = pool_snapshot(p, &n);
    if (!v) return -1;
    int64_t total_age = 0, count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (is_whole(v[i])) {
            total_age += p->searches - v[i]->gc_base;
            count++;
        }
    PyMem_Free(v);
    int64_t reclaimed = 0;
    int freed = 1;
    while (reclaimed < target && freed && count > 0) {
        double average = (double)total_age / (double)count;
        freed = 0;
        v = pool_snapshot(p, &n);
        if (!v) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            Block *b = v[i];
            int64_t age = p->searches - b->gc_base;
            if (is_whole(b) && (double)age >= average) {
                freed = 1;
                reclaimed += b->size;
                total_age -= age;
                count--;
                if (release_block(c, b) < 0) {
                    PyMem_Free(v);
                    return -1;
                }
            }
        }
        PyMem_Free(v);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* malloc and free                                                                           */

static Block *get_free_block(Core *c, Pool *p, int64_t size, int64_t stream) {
    if (c->gc_threshold > 0 && c->cap >= 0) p->searches++;
    StreamBlocks *s = pool_stream(p, stream, 0);
    if (!s || s->n == 0) return NULL;
    Py_ssize_t i = lower_bound(s, size, 0);
    if (i == s->n) return NULL;
    Block *b = s->v[i];
    int64_t ms = c->max_split;
    if (size < ms) {
        if (b->size >= ms) return NULL;
    } else if (b->size >= size + LARGE_BUFFER) {
        return NULL;
    }
    pool_remove_at(s, i);
    return b;
}

static PyObject *raise_oom(Core *c, int64_t nbytes, int64_t size, int64_t segment_size,
                           int64_t stream) {
    c->num_ooms++;
    if (RECORDING(c) && record(c, A_OOM, 0, size, 0, stream) == -2) return NULL;
    if (!c->oom_handler) return PyErr_NoMemory();
    PyObject *exc = PyObject_CallFunction(c->oom_handler, "LLLL", (long long)nbytes,
                                          (long long)size, (long long)segment_size,
                                          (long long)stream);
    if (!exc) return NULL;
    PyObject *type = PyObject_Type(exc);
    PyErr_SetObject(type, exc);
    Py_DECREF(type);
    Py_DECREF(exc);
    return NULL;
}

static void free_block(Core *c, Block *b) {
    /* Merge with free neighbours, then cache. See Note [Stats of a split] in _pycore.py. */
    Pool *p = &c->pools[b->small];
    int64_t net_blocks = 0, net_bytes = 0;
    Block *prev = b->prev;
    if (prev && !prev->allocated) {
        pool_remove(p, prev);
        b->addr = prev->addr;
        b->size += prev->size;
        b->prev = prev->prev;
        if (prev->prev) prev->prev->next = b;
        net_blocks -= 1;
        net_bytes -= prev->size;
        PyMem_Free(prev);
    }
    Block *next = b->next;
    if (next && !next->allocated) {
        pool_remove(p, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next) next->next->prev = b;
        net_blocks -= 1;
        net_bytes -= next->size;
        PyMem_Free(next);
    }
    b->allocated = 0;
    b->stack = NO_STACK;
    if (pool_insert(p, b) < 0) PyErr_Clear(); /* out of memory: the block is leaked to the map */
    if (!is_whole(b)) {
        net_blocks += 1;
        net_bytes += b->size;
    }
    int small = b->small;
    if (net_blocks > 0) pooled_inc(c, S_INACTIVE_SPLIT, small, net_blocks);
    else if (net_blocks < 0) pooled_dec(c, S_INACTIVE_SPLIT, small, -net_blocks);
    if (net_bytes > 0) pooled_inc(c, S_INACTIVE_SPLIT_BYTES, small, net_bytes);
    else if (net_bytes < 0) pooled_dec(c, S_INACTIVE_SPLIT_BYTES, small, -net_bytes);
    pooled_dec(c, S_REQUESTED_BYTES, small, b->requested);
    b->requested = 0;
}

/* A live block, already out of the address map, goes back to the cache: counters and merge. */
static void unaccount_and_cache(Core *c, Block *b) {
    int small = b->small;
    pooled_dec(c, S_ALLOCATION, small, 1);
    pooled_dec(c, S_ALLOCATED_BYTES, small, b->size);
    if (b->size >= c->max_split) stat_dec(&c->oversize_allocations, 1);
    free_block(c, b);
}

static PyObject *core_malloc_locked(Core *c, int64_t nbytes, int64_t stream) {
    int64_t size = round_size(nbytes, c->divisions);
    int small = size <= SMALL_SIZE;
    Pool *p = &c->pools[small];
    Block *b = get_free_block(c, p, size, stream);
    if (!b) {
        if (c->gc_threshold > 0 && c->cap >= 0 && garbage_collect(c) < 0) return NULL;
        int64_t segment_size = segment_size_for(size);
        if (alloc_block(c, segment_size, stream, small, 0, &b) < 0) goto segment_error;
        if (!b) {
            int r = release_available_cached_blocks(c, p, size, stream);
            if (r < 0) return NULL;
            if (r && alloc_block(c, segment_size, stream, small, 0, &b) < 0) goto segment_error;
        }
        if (!b) {
            if (release_cached_blocks(c) < 0) return NULL;
            if (alloc_block(c, segment_size, stream, small, 1, &b) < 0) goto segment_error;
        }
        if (!b) return raise_oom(c, nbytes, size, segment_size, stream);
    }
    /* See Note [Stats of a split] in _pycore.py. */
    int64_t remaining = b->size - size;
    int already_split = !is_whole(b);
    int split = small ? remaining >= MIN_BLOCK_SIZE
                      : (size < c->max_split && remaining > SMALL_SIZE);
    if (split) {
        Block *rest = PyMem_Malloc(sizeof(Block));
        if (!rest) {
            pool_insert(p, b);
            return PyErr_NoMemory();
        }
        memset(rest, 0, sizeof(Block));
        rest->addr = b->addr + size;
        rest->size = remaining;
        rest->stream = b->stream;
        rest->small = small;
        rest->segment = b->segment;
        rest->stack = NO_STACK;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        b->size = size;
        if (pool_insert(p, rest) < 0) return NULL;
        if (already_split) {
            pooled_dec(c, S_INACTIVE_SPLIT_BYTES, small, size);
        } else {
            pooled_inc(c, S_INACTIVE_SPLIT_BYTES, small, remaining);
            pooled_inc(c, S_INACTIVE_SPLIT, small, 1);
        }
    } else if (already_split) {
        pooled_dec(c, S_INACTIVE_SPLIT_BYTES, small, b->size);
        pooled_dec(c, S_INACTIVE_SPLIT, small, 1);
    }
    b->allocated = 1;
    b->requested = nbytes;
    if (map_put(&c->active, (uint64_t)b->addr, b) < 0) return NULL;
    pooled_inc(c, S_ALLOCATION, small, 1);
    pooled_inc(c, S_ALLOCATED_BYTES, small, b->size);
    pooled_inc(c, S_REQUESTED_BYTES, small, nbytes);
    if (b->size >= c->max_split) stat_inc(&c->oversize_allocations, 1);
    int64_t allocated = c->pooled[S_ALLOCATED_BYTES][P_ALL].current;
    if (allocated > c->mark_allocated) c->mark_allocated = allocated;
    if (RECORDING(c)) {
        int64_t sid = record(c, A_ALLOC, b->addr, nbytes, b->size, b->stream);
        if (sid == -2) {
            /* The caller never sees this block: give it back so nothing is lost. */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            map_pop(&c->active, (uint64_t)b->addr);
            unaccount_and_cache(c, b);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        b->stack = sid;
    }
    return PyLong_FromLongLong(b->addr);

segment_error:
    /* A recorder failed after a segment was made: cache the segment so nothing is lost. */
    if (b) pool_insert(p, b);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Python methods                                                                            */

static PyObject *Core_malloc(Core *c, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    PyObject *nbytes_obj = nargs > 0 ? args[0] : NULL, *stream_obj = nargs > 1 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (nargs > 2) goto usage;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GetItem(kwnames, i);
        PyObject *value = args[nargs + i];
        if (PyUnicode_CompareWithASCIIString(name, "nbytes") == 0 && !nbytes_obj)
            nbytes_obj = value;
        else if (PyUnicode_CompareWithASCIIString(name, "stream") == 0 && !stream_obj)
            stream_obj = value;
        else goto usage;
    }
    if (!nbytes_obj) goto usage;
    long long nbytes = PyLong_AsLongLong(nbytes_obj);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    long long stream = 0;
    if (stream_obj) {
        stream = PyLong_AsLongLong(stream_obj);
        if (stream == -1 && PyErr_Occurred()) return NULL;
    }
    if (nbytes <= 0) {
        if (nbytes == 0) return PyLong_FromLong(0);
        return PyErr_Format(PyExc_ValueError, "cannot allocate a negative size (%lld B)", nbytes);
    }
    core_lock(c);
    PyObject *r = core_malloc_locked(c, nbytes, stream);
    core_unlock(c);
    return r;
usage:
    PyErr_SetString(PyExc_TypeError, "malloc(nbytes, stream=0): bad arguments");
    return NULL;
}

/* Free one address; 0 on success, -1 with an exception set. */
static int core_free_addr(Core *c, unsigned long long ptr) {
    if (ptr == 0) return 0;
    core_lock(c);
    Block *b = map_pop(&c->active, ptr);
    if (!b) {
        core_unlock(c);
        char message[160]; /* PyErr_Format's hex support differs between Python versions */
        snprintf(message, sizeof message,
                 "free of address 0x%llx, which this allocator did not hand out or "
                 "which was already freed", ptr);
        PyErr_SetString(PyExc_ValueError, message);
        return -1;
    }
    int failed = 0;
    if (RECORDING(c)) {
        /* one call: the recorder logs free_requested and free_completed together */
        failed = record(c, A_FREE_REQUESTED, b->addr, b->requested, b->size, b->stream) == -2;
    }
    if (failed) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        unaccount_and_cache(c, b);
        PyErr_Restore(type, value, tb);
    } else {
        unaccount_and_cache(c, b);
    }
    core_unlock(c);
    return failed ? -1 : 0;
}

static PyObject *Core_free(Core *c, PyObject *arg) {
    unsigned long long ptr = PyLong_AsUnsignedLongLong(arg);
    if (ptr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (core_free_addr(c, ptr) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_configure(Core *c, PyObject *args) {
    long long max_split, divisions, cap;
    double gc;
    if (!PyArg_ParseTuple(args, "LLLd", &max_split, &divisions, &cap, &gc)) return NULL;
    core_lock(c);
    c->max_split = max_split;
    c->divisions = divisions;
    c->cap = cap;
    c->gc_threshold = gc;
    /* oversize counters follow the new threshold */
    int64_t allocations = 0, segments = 0;
    for (Py_ssize_t i = 0; i < c->active.cap; i++)
        if (c->active.keys[i] && c->active.vals[i]->size >= max_split) allocations++;
    for (Segment *s = c->segments; s; s = s->next)
        if (s->size >= max_split) segments++;
    Stat *pairs[2] = {&c->oversize_allocations, &c->oversize_segments};
    int64_t want[2] = {allocations, segments};
    for (int k = 0; k < 2; k++) {
        if (want[k] > pairs[k]->current) stat_inc(pairs[k], want[k] - pairs[k]->current);
        else if (want[k] < pairs[k]->current) stat_dec(pairs[k], pairs[k]->current - want[k]);
    }
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_empty_cache(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    int64_t before = c->reserved;
    int r = release_cached_blocks(c);
    int64_t released = before - c->reserved;
    core_unlock(c);
    if (r < 0) return NULL;
    return PyLong_FromLongLong(released);
}

static PyObject *stat_tuple_into(PyObject *t, Py_ssize_t *k, const Stat *s) {
    int64_t vals[4] = {s->current, s->peak, s->allocated, s->freed};
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyLong_FromLongLong(vals[i]);
        if (!v) return NULL;
        PyTuple_SetItem(t, (*k)++, v);
    }
    return t;
}

static PyObject *Core_stats(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    PyObject *t = PyTuple_New(N_POOLED * 3 * 4 + 8 + 5);
    Py_ssize_t k = 0;
    if (!t) goto done;
    for (int s = 0; s < N_POOLED; s++)
        for (int p = 0; p < 3; p++)
            if (!stat_tuple_into(t, &k, &c->pooled[s][p])) goto fail;
    if (!stat_tuple_into(t, &k, &c->oversize_allocations)) goto fail;
    if (!stat_tuple_into(t, &k, &c->oversize_segments)) goto fail;
    int64_t scalars[5] = {c->num_alloc_retries, c->num_ooms, c->num_device_alloc,
                          c->num_device_free, c->num_sync_all_streams};
    for (int i = 0; i < 5; i++) {
        PyObject *v = PyLong_FromLongLong(scalars[i]);
        if (!v) goto fail;
        PyTuple_SetItem(t, k++, v);
    }
    goto done;
fail:
    Py_CLEAR(t);
done:
    core_unlock(c);
    return t;
}

static PyObject *Core_reset_peak(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    for (int s = 0; s < N_POOLED; s++)
        for (int p = 0; p < 3; p++) c->pooled[s][p].peak = c->pooled[s][p].current;
    c->oversize_allocations.peak = c->oversize_allocations.current;
    c->oversize_segments.peak = c->oversize_segments.current;
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_reset_accumulated(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    for (int s = 0; s < N_POOLED; s++)
        for (int p = 0; p < 3; p++) c->pooled[s][p].allocated = c->pooled[s][p].freed = 0;
    c->oversize_allocations.allocated = c->oversize_allocations.freed = 0;
    c->oversize_segments.allocated = c->oversize_segments.freed = 0;
    c->num_alloc_retries = c->num_ooms = c->num_device_alloc = c->num_device_free = 0;
    c->num_sync_all_streams = 0;
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *block_tuple(const Block *b) {
    return Py_BuildValue("(LLLLiLiL)", (long long)b->addr, (long long)b->size,
                         (long long)b->requested, (long long)b->stream, b->small,
                         (long long)b->segment->addr, b->allocated, (long long)b->stack);
}

/* (segments, blocks): segments as (addr, size, stream, small, stack), blocks as
   (addr, size, requested, stream, small, segment_addr, allocated, stack). */
static PyObject *Core_state(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    PyObject *segs = PyList_New(0), *blocks = PyList_New(0), *out = NULL;
    if (!segs || !blocks) goto done;
    for (Segment *s = c->segments; s; s = s->next) {
        PyObject *t = Py_BuildValue("(LLLiL)", (long long)s->addr, (long long)s->size,
                                    (long long)s->stream, s->small, (long long)s->stack);
        if (!t || PyList_Append(segs, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    for (Py_ssize_t i = 0; i < c->active.cap; i++) {
        if (!c->active.keys[i]) continue;
        PyObject *t = block_tuple(c->active.vals[i]);
        if (!t || PyList_Append(blocks, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    for (int w = 0; w < 2; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams; i++)
            for (Py_ssize_t j = 0; j < p->streams[i].n; j++) {
                PyObject *t = block_tuple(p->streams[i].v[j]);
                if (!t || PyList_Append(blocks, t) < 0) {
                    Py_XDECREF(t);
                    goto done;
                }
                Py_DECREF(t);
            }
    }
    out = PyTuple_Pack(2, segs, blocks);
done:
    Py_XDECREF(segs);
    Py_XDECREF(blocks);
    core_unlock(c);
    return out;
}

static PyObject *Core_check(Core *c, PyObject *Py_UNUSED(ignored)) {
    /* Structural checks the Python side cannot see: pool order and links. */
    core_lock(c);
    const char *err = NULL;
    for (int w = 0; w < 2 && !err; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams && !err; i++) {
            StreamBlocks *s = &p->streams[i];
            for (Py_ssize_t j = 0; j < s->n && !err; j++) {
                Block *b = s->v[j];
                if (b->allocated) err = "an allocated block is in a pool";
                else if (b->stream != s->stream) err = "a block is filed under another stream";
                else if (b->small != p->small) err = "a block is in the wrong pool";
                else if (j && (s->v[j - 1]->size > b->size ||
                               (s->v[j - 1]->size == b->size && s->v[j - 1]->addr >= b->addr)))
                    err = "a pool is out of (size, address) order";
                else if ((b->prev && b->prev->next != b) || (b->next && b->next->prev != b))
                    err = "broken neighbour links";
            }
        }
    }
    for (Py_ssize_t i = 0; i < c->active.cap && !err; i++) {
        if (!c->active.keys[i]) continue;
        Block *b = c->active.vals[i];
        if (!b->allocated || (uint64_t)b->addr != c->active.keys[i]) err = "address map is stale";
        if (map_get(&c->active, c->active.keys[i]) != b) err = "address map probe is broken";
    }
    core_unlock(c);
    if (err) {
        PyErr_SetString(PyExc_AssertionError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_owns(Core *c, PyObject *arg) {
    unsigned long long ptr = PyLong_AsUnsignedLongLong(arg);
    if (ptr == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    core_lock(c);
    int found = map_get(&c->active, ptr) != NULL;
    core_unlock(c);
    return PyBool_FromLong(found);
}

static PyObject *Core_take_mark(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    PyObject *r = Py_BuildValue("(LL)", (long long)c->mark_allocated, (long long)c->mark_reserved);
    c->mark_allocated = c->pooled[S_ALLOCATED_BYTES][P_ALL].current;
    c->mark_reserved = c->reserved;
    core_unlock(c);
    return r;
}

static PyObject *Core_set_recorder(Core *c, PyObject *arg) {
    core_lock(c);
    PyObject *old = c->recorder;
    if (arg == Py_None) {
        c->recorder = NULL;
    } else {
        Py_INCREF(arg);
        c->recorder = arg;
    }
    Py_XDECREF(old);
    core_unlock(c);
    Py_RETURN_NONE;
}

/* The i-th oldest event. The buffer wraps only once it holds max_entries events. */
static const Event *event_at(const History *h, Py_ssize_t i) {
    return &h->ev[h->len == h->max_entries ? (h->start + i) % h->max_entries : i];
}

static void history_free_events(History *h) {
    PyMem_Free(h->ev);
    h->ev = NULL;
    h->alloc = h->len = h->start = 0;
    h->dropped = 0;
}

static PyObject *Core_history_configure(Core *c, PyObject *args) {
    Py_ssize_t max_entries;
    int stacks;
    PyObject *clock, *classify, *device_free;
    if (!PyArg_ParseTuple(args, "npOOO", &max_entries, &stacks, &clock, &classify, &device_free))
        return NULL;
    if (max_entries < 0) {
        PyErr_SetString(PyExc_ValueError, "max_entries must be >= 0");
        return NULL;
    }
    core_lock(c);
    History *h = &c->h;
    if (max_entries != h->max_entries && h->len) {
        /* keep the newest events that fit, oldest first */
        Py_ssize_t keep = h->len < max_entries ? h->len : max_entries;
        Event *ev = keep ? PyMem_Malloc((size_t)keep * sizeof(Event)) : NULL;
        if (keep && !ev) {
            core_unlock(c);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < keep; i++) ev[i] = *event_at(h, h->len - keep + i);
        int64_t dropped = h->dropped + (h->len - keep);
        PyMem_Free(h->ev);
        h->ev = ev;
        h->alloc = h->len = keep;
        h->start = 0;
        h->dropped = dropped;
    }
    h->max_entries = max_entries;
    h->stacks = stacks;
    PyObject *olds[3] = {h->clock, h->classify, h->device_free};
    h->clock = clock == Py_None ? NULL : (Py_INCREF(clock), clock);
    Py_INCREF(classify);
    h->classify = classify;
    h->device_free = device_free == Py_None ? NULL : (Py_INCREF(device_free), device_free);
    h->on = 1;
    for (int i = 0; i < 3; i++) Py_XDECREF(olds[i]);
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_history_stop(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    c->h.on = 0;
    history_free_events(&c->h);
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_history_clear(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    history_free_events(&c->h);
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_history_info(Core *c, PyObject *Py_UNUSED(ignored)) {
    History *h = &c->h;
    return Py_BuildValue("(iinLnn)", h->on, h->stacks, h->max_entries, (long long)h->dropped,
                         h->len, h->nstacks);
}

/* The events, oldest first, as (action, addr, size, block_size, stream, time_ns, stack, cell,
   device_free) tuples. */
static PyObject *Core_events(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    History *h = &c->h;
    PyObject *out = PyList_New(h->len);
    for (Py_ssize_t i = 0; out && i < h->len; i++) {
        const Event *e = event_at(h, i);
        PyObject *t = Py_BuildValue("(LLLLLLLLL)", (long long)e->action, (long long)e->addr,
                                    (long long)e->size, (long long)e->block_size,
                                    (long long)e->stream, (long long)e->time_ns,
                                    (long long)e->stack, (long long)e->cell,
                                    (long long)e->device_free);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
    core_unlock(c);
    return out;
}

/* A stack as a tuple of (code, instruction offset) pairs, innermost first. */
static PyObject *Core_stack(Core *c, PyObject *arg) {
    Py_ssize_t sid = PyLong_AsSsize_t(arg);
    if (sid == -1 && PyErr_Occurred()) return NULL;
    core_lock(c);
    History *h = &c->h;
    PyObject *out = NULL;
    if (sid < 0 || sid >= h->nstacks) {
        PyErr_Format(PyExc_IndexError, "no stack %zd", sid);
    } else {
        Stack *s = &h->stacks_v[sid];
        out = PyTuple_New(s->n);
        for (Py_ssize_t i = 0; out && i < s->n; i++) {
            PyObject *t = Py_BuildValue("(OL)", s->pairs[i].code, (long long)s->pairs[i].lasti);
            if (!t) {
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(out, i, t);
        }
    }
    core_unlock(c);
    return out;
}

static PyObject *Core_set_cell(Core *c, PyObject *arg) {
    long long cell = PyLong_AsLongLong(arg);
    if (cell == -1 && PyErr_Occurred()) return NULL;
    c->h.cell = cell;
    Py_RETURN_NONE;
}

static PyObject *Core_record_snapshot(Core *c, PyObject *arg) {
    long long size = PyLong_AsLongLong(arg);
    if (size == -1 && PyErr_Occurred()) return NULL;
    core_lock(c);
    int64_t r = c->h.on ? native_record(c, A_SNAPSHOT, 0, size, 0, 0) : 0;
    core_unlock(c);
    if (r == -2) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_allocated(Core *c, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(c->pooled[S_ALLOCATED_BYTES][P_ALL].current);
}

static PyObject *Core_reserved(Core *c, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(c->reserved);
}

static PyObject *Core_largest_free_block(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    int64_t best = 0;
    for (int w = 0; w < 2; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams; i++)
            if (p->streams[i].n && p->streams[i].v[p->streams[i].n - 1]->size > best)
                best = p->streams[i].v[p->streams[i].n - 1]->size;
    }
    core_unlock(c);
    return PyLong_FromLongLong(best);
}

static PyObject *native_round_size(PyObject *Py_UNUSED(m), PyObject *args) {
    long long size, divisions = 0;
    if (!PyArg_ParseTuple(args, "L|L", &size, &divisions)) return NULL;
    return PyLong_FromLongLong(round_size(size, divisions));
}

/* ---------------------------------------------------------------------------------------- */
/* CuPy hooks: the malloc(size, device_id) and free(ptr, device_id) functions CuPy's
   PythonFunctionAllocator calls, in C, so no Python frame runs between CuPy and the core.    */

typedef struct {
    PyObject_HEAD
    PyObject *cores;      /* list: device id -> Core, or None until made */
    PyObject *get_stream; /* cupy.cuda.get_current_stream */
    PyObject *missing;    /* missing(device_id) -> Core, and puts it in the list */
} Hooks;

static PyObject *str_ptr;
static PyTypeObject *CoreType;

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

/* ---------------------------------------------------------------------------------------- */
/* type                                                                                      */

static int Core_init(Core *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"device_malloc", "device_free", "device_oom", "oom_handler", NULL};
    PyObject *dm, *df, *doom, *oh;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO", kwlist, &dm, &df, &doom, &oh))
        return -1;
    if (c->lock) {
        PyErr_SetString(PyExc_RuntimeError, "Core is already initialised");
        return -1;
    }
    c->lock = PyThread_allocate_lock();
    if (!c->lock) {
        PyErr_NoMemory();
        return -1;
    }
    c->pools[0].small = 0;
    c->pools[1].small = 1;
    c->max_split = NO_LIMIT;
    c->cap = -1;
    c->h.last_stack = NO_STACK;
    c->h.cell = -1;
    Py_INCREF(dm);
    Py_INCREF(df);
    Py_INCREF(doom);
    Py_INCREF(oh);
    c->device_malloc = dm;
    c->device_free = df;
    c->device_oom = doom;
    c->oom_handler = oh;
    return 0;
}

static int Core_traverse(Core *c, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(c));
    Py_VISIT(c->device_malloc);
    Py_VISIT(c->device_free);
    Py_VISIT(c->device_oom);
    Py_VISIT(c->recorder);
    Py_VISIT(c->oom_handler);
    Py_VISIT(c->h.clock);
    Py_VISIT(c->h.classify);
    Py_VISIT(c->h.device_free);
    return 0;
}

static int Core_clear(Core *c) {
    Py_CLEAR(c->device_malloc);
    Py_CLEAR(c->device_free);
    Py_CLEAR(c->device_oom);
    Py_CLEAR(c->recorder);
    Py_CLEAR(c->oom_handler);
    Py_CLEAR(c->h.clock);
    Py_CLEAR(c->h.classify);
    Py_CLEAR(c->h.device_free);
    c->h.on = 0;
    return 0;
}

static void Core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    /* Segments still held go back to nobody: the device object may be gone. Free our memory. */
    for (int w = 0; w < 2; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams; i++) {
            for (Py_ssize_t j = 0; j < p->streams[i].n; j++) PyMem_Free(p->streams[i].v[j]);
            PyMem_Free(p->streams[i].v);
        }
        PyMem_Free(p->streams);
    }
    for (Py_ssize_t i = 0; i < c->active.cap; i++)
        if (c->active.keys[i]) PyMem_Free(c->active.vals[i]);
    PyMem_Free(c->active.keys);
    PyMem_Free(c->active.vals);
    Segment *s = c->segments;
    while (s) {
        Segment *next = s->next;
        PyMem_Free(s);
        s = next;
    }
    History *h = &c->h;
    PyMem_Free(h->ev);
    for (Py_ssize_t i = 0; i < h->nstacks; i++) PyMem_Free(h->stacks_v[i].pairs);
    PyMem_Free(h->stacks_v);
    PyMem_Free(h->index);
    for (Py_ssize_t i = 0; i < h->kinds.cap; i++) Py_XDECREF(h->kinds.codes[i]);
    PyMem_Free(h->kinds.codes);
    PyMem_Free(h->kinds.kinds);
    Core_clear(c);
    if (c->lock) PyThread_free_lock(c->lock);
    PyTypeObject *tp = (PyTypeObject *)PyObject_Type((PyObject *)c);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(c);
    Py_DECREF(tp); /* the reference PyObject_Type gave */
    Py_DECREF(tp); /* the instance's own reference to its heap type */
}

static PyMethodDef Core_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))Core_malloc, METH_FASTCALL | METH_KEYWORDS,
     "malloc(nbytes, stream=0) -> address"},
    {"free", (PyCFunction)Core_free, METH_O, "free(address)"},
    {"configure", (PyCFunction)Core_configure, METH_VARARGS,
     "configure(max_split, divisions, cap, gc_threshold); max_split NO_LIMIT and cap -1 unset"},
    {"empty_cache", (PyCFunction)Core_empty_cache, METH_NOARGS, "release whole cached segments"},
    {"stats", (PyCFunction)Core_stats, METH_NOARGS, "every counter, as a flat tuple"},
    {"reset_peak", (PyCFunction)Core_reset_peak, METH_NOARGS, ""},
    {"reset_accumulated", (PyCFunction)Core_reset_accumulated, METH_NOARGS, ""},
    {"state", (PyCFunction)Core_state, METH_NOARGS, "(segments, blocks) as tuples"},
    {"check", (PyCFunction)Core_check, METH_NOARGS, "assert the internal structures agree"},
    {"owns", (PyCFunction)Core_owns, METH_O, "whether an address is a live block"},
    {"take_mark", (PyCFunction)Core_take_mark, METH_NOARGS,
     "(peak allocated, peak reserved) since the last call; restarts the mark"},
    {"set_recorder", (PyCFunction)Core_set_recorder, METH_O,
     "a Python history callback or None (tests); the C history below is faster"},
    {"history_configure", (PyCFunction)Core_history_configure, METH_VARARGS,
     "history_configure(max_entries, stacks, clock|None, classify, device_free|None)"},
    {"history_stop", (PyCFunction)Core_history_stop, METH_NOARGS, "stop and drop the events"},
    {"history_clear", (PyCFunction)Core_history_clear, METH_NOARGS, "drop the events"},
    {"history_info", (PyCFunction)Core_history_info, METH_NOARGS,
     "(on, stacks, max_entries, dropped, events, stacks interned)"},
    {"events", (PyCFunction)Core_events, METH_NOARGS, "the recorded events, oldest first"},
    {"stack", (PyCFunction)Core_stack, METH_O, "stack id -> ((code, offset), ...)"},
    {"set_cell", (PyCFunction)Core_set_cell, METH_O, "the cell number tagged on events"},
    {"record_snapshot", (PyCFunction)Core_record_snapshot, METH_O, "log a snapshot event"},
    {"allocated", (PyCFunction)Core_allocated, METH_NOARGS, ""},
    {"reserved", (PyCFunction)Core_reserved, METH_NOARGS, ""},
    {"largest_free_block", (PyCFunction)Core_largest_free_block, METH_NOARGS, ""},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Core_slots[] = {
    {Py_tp_doc, "The caching allocator's policy in C; see _pycore.PyCore for the reference."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, (void *)Core_init},
    {Py_tp_dealloc, (void *)Core_dealloc},
    {Py_tp_traverse, (void *)Core_traverse},
    {Py_tp_clear, (void *)Core_clear},
    {Py_tp_methods, Core_methods},
    {0, NULL},
};

static PyType_Spec Core_spec = {
    "jupyter_gpumem._native.Core", sizeof(Core), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    Core_slots,
};

static PyMethodDef module_methods[] = {
    {"round_size", native_round_size, METH_VARARGS, "round_size(size, divisions=0)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "jupyter_gpumem._native", "The allocator's fast core.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    str_ptr = PyUnicode_InternFromString("ptr");
    PyObject *type = PyType_FromSpec(&Core_spec);
    if (!str_ptr || !type) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    CoreType = (PyTypeObject *)type;
    Py_INCREF(type); /* CoreType keeps one reference for the module's lifetime */
    if (PyModule_AddObject(m, "Core", type) < 0) {
        Py_DECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *hooks = PyType_FromSpec(&Hooks_spec);
    if (!hooks || PyModule_AddObject(m, "Hooks", hooks) < 0) {
        Py_XDECREF(hooks);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *nl = PyLong_FromLongLong(NO_LIMIT);
    if (!nl || PyModule_AddObject(m, "NO_LIMIT", nl) < 0) {
        Py_XDECREF(nl);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
