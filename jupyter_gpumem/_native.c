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
 * Built with the limited API (abi3), so one build serves every CPython from 3.11 on.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>

#define MIN_BLOCK_SIZE 512LL
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define LARGE_BUFFER (20LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)
#define NO_LIMIT INT64_MAX
#define NO_STACK (-1LL)

/* history actions, as _history.py numbers them */
enum { A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED, A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_OOM };

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
} Core;

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

/* Call the recorder; returns the stack id it gives, or -2 with an exception set. */
static int64_t record(Core *c, int action, int64_t addr, int64_t size, int64_t block_size,
                      int64_t stream) {
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
    if (c->recorder) {
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
    PyObject *r = PyObject_CallFunction(c->device_free, "L", (long long)addr);
    if (!r) return -1;
    Py_DECREF(r);
    if (c->recorder && record(c, A_SEGMENT_FREE, addr, size, 0, stream) == -2) return -1;
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
    if (c->recorder && record(c, A_OOM, 0, size, 0, stream) == -2) return NULL;
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
    if (c->recorder) {
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

static PyObject *Core_free(Core *c, PyObject *arg) {
    unsigned long long ptr = PyLong_AsUnsignedLongLong(arg);
    if (ptr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (ptr == 0) Py_RETURN_NONE;
    core_lock(c);
    Block *b = map_pop(&c->active, ptr);
    if (!b) {
        core_unlock(c);
        return PyErr_Format(PyExc_ValueError,
                            "free of address %#llx, which this allocator did not hand out or "
                            "which was already freed", ptr);
    }
    int failed = 0;
    if (c->recorder) {
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
    if (failed) return NULL;
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

static void Core_dealloc(Core *c) {
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
    Py_XDECREF(c->device_malloc);
    Py_XDECREF(c->device_free);
    Py_XDECREF(c->device_oom);
    Py_XDECREF(c->recorder);
    Py_XDECREF(c->oom_handler);
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
    {"set_recorder", (PyCFunction)Core_set_recorder, METH_O, "history callback or None"},
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
    {Py_tp_methods, Core_methods},
    {0, NULL},
};

static PyType_Spec Core_spec = {
    "jupyter_gpumem._native.Core", sizeof(Core), 0, Py_TPFLAGS_DEFAULT, Core_slots,
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
    PyObject *type = PyType_FromSpec(&Core_spec);
    if (!type || PyModule_AddObject(m, "Core", type) < 0) {
        Py_XDECREF(type);
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
