/*
 * os_numpy.c -- a NumPy memory handler that places large arrays in the object store.
 *
 * NumPy (>= 1.22, NEP 49) lets a process replace the allocator of array data: a
 * PyDataMem_Handler in a capsule named "mem_handler", installed with
 * PyDataMem_SetHandler. Every array remembers the handler that allocated it and frees
 * through it, so arrays made before or after a change are always freed correctly.
 *
 * This handler gives a request of at least `threshold` bytes a block of the store: an
 * unsealed object created by this process, with an id of its own. When a task returns
 * such an array, the payload codec seals that very object (objstore_seal_at) instead of
 * copying the bytes into a new one, so a large result reaches its reader without a copy.
 * Freeing the array releases the creator's reference: an array that was never sealed
 * (a temporary) goes back to the store's free list at once, a sealed one when its last
 * reader and the scheduler are done with it. Freed blocks are reused most recent first,
 * so a process that allocates large arrays over and over writes into pages it has
 * mapped already (no page faults), where private memory of that size is a fresh mmap
 * every time.
 *
 * Anything else (smaller requests, calloc, whose lazily zeroed private pages cost
 * nothing until touched, and every request when the store is past `limit` bytes in use
 * or fails) goes to NumPy's own handler, whose functions are copied at creation.
 *
 * The layout below is NumPy's PyDataMem_Handler, version 1 (numpy/ndarraytypes.h); it
 * is declared here because NumPy is not a build dependency. The handler is never freed:
 * arrays keep pointers to it for as long as they live, which can be the whole process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "objstore.h"

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} os_np_allocator_t;

typedef struct {
    char name[127];
    uint8_t version;
    os_np_allocator_t allocator;
} os_np_handler_t;

typedef struct {
    os_np_handler_t handler; /* first: the capsule's pointer is the handler's */
    objstore_t *s;
    const char *lo, *hi; /* this handle's mapping */
    uint64_t threshold, limit;
    os_np_allocator_t fallback; /* NumPy's default handler */
    uint64_t seed, counter;
    uint64_t stats[OBJSTORE_NP_NSTATS];
} os_np_t;

static void os_np_count(os_np_t *n, int which) {
    __atomic_fetch_add(&n->stats[which], 1, __ATOMIC_RELAXED);
}

static int os_np_in_store(const os_np_t *n, const void *ptr) {
    return (const char *)ptr >= n->lo && (const char *)ptr < n->hi;
}

static void *os_np_malloc(void *ctx, size_t size) {
    os_np_t *n = ctx;
    if (size >= __atomic_load_n(&n->threshold, __ATOMIC_RELAXED)) {
        uint64_t id[2] = {n->seed, __atomic_add_fetch(&n->counter, 1, __ATOMIC_RELAXED)};
        void *data = NULL;
        if (objstore_create_bounded(n->s, (const char *)id, size, n->limit, &data) == OBJSTORE_OK) {
            os_np_count(n, OBJSTORE_NP_STORE_ALLOCS);
            return data;
        }
        os_np_count(n, OBJSTORE_NP_DECLINED);
    }
    return n->fallback.malloc(n->fallback.ctx, size);
}

static void *os_np_calloc(void *ctx, size_t nelem, size_t elsize) {
    os_np_t *n = ctx;
    return n->fallback.calloc(n->fallback.ctx, nelem, elsize);
}

static void os_np_free(void *ctx, void *ptr, size_t size) {
    os_np_t *n = ctx;
    if (ptr != NULL && os_np_in_store(n, ptr)) {
        /* A failure (the lock timed out; a forked child, whose handle is its parent's)
         * leaves the reference with this process's slot: returned when it exits. */
        os_np_count(n, objstore_release_at(n->s, ptr, NULL) == OBJSTORE_OK ? OBJSTORE_NP_RELEASED
                                                                           : OBJSTORE_NP_LOST);
        return;
    }
    n->fallback.free(n->fallback.ctx, ptr, size);
}

static void *os_np_realloc(void *ctx, void *ptr, size_t new_size) {
    os_np_t *n = ctx;
    if (ptr == NULL || !os_np_in_store(n, ptr)) return n->fallback.realloc(n->fallback.ctx, ptr, new_size);
    uint64_t old = 0;
    if (objstore_object_at(n->s, ptr, NULL, &old, NULL) != OBJSTORE_OK) return NULL;
    void *moved = os_np_malloc(ctx, new_size);
    if (moved == NULL) return NULL;
    memcpy(moved, ptr, old < new_size ? old : new_size);
    os_np_free(ctx, ptr, old);
    return moved;
}

objstore_status_t objstore_np_handler(objstore_t *s, uint64_t threshold, uint64_t limit,
                                      const void *fallback, void **handler) {
    if (s == NULL || fallback == NULL || handler == NULL || threshold == 0) return OBJSTORE_E_INVALID;
    *handler = NULL;
    const os_np_handler_t *numpy = fallback;
    if (numpy->version != 1) return OBJSTORE_E_INVALID;
    os_np_t *n = calloc(1, sizeof *n);
    if (n == NULL) return OBJSTORE_E_SYSTEM;
    const void *base;
    uint64_t size;
    objstore_mapping(s, &base, &size);
    strncpy(n->handler.name, "scaler_executor_objstore", sizeof n->handler.name - 1);
    n->handler.version = 1;
    n->handler.allocator = (os_np_allocator_t){n, os_np_malloc, os_np_calloc, os_np_realloc, os_np_free};
    n->s = s;
    n->lo = base;
    n->hi = (const char *)base + size;
    n->threshold = threshold;
    n->limit = limit;
    n->fallback = numpy->allocator;
    if (getrandom(&n->seed, sizeof n->seed, 0) != (ssize_t)sizeof n->seed)
        n->seed = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)n;
    *handler = n;
    return OBJSTORE_OK;
}

const char *objstore_np_capsule_name(void) { return "mem_handler"; }

void objstore_np_stats(const void *handler, uint64_t out[OBJSTORE_NP_NSTATS]) {
    const os_np_t *n = handler;
    for (int i = 0; i < OBJSTORE_NP_NSTATS; i++) out[i] = __atomic_load_n(&n->stats[i], __ATOMIC_RELAXED);
}

void objstore_np_disable(void *handler) {
    os_np_t *n = handler;
    __atomic_store_n(&n->threshold, UINT64_MAX, __ATOMIC_RELAXED);
}
