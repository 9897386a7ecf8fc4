/*
 * objstore.c -- objects: the index, reference records and the lifecycle
 * create -> write -> seal -> get/release -> delete (abort for unsealed).
 *
 * Index: entries[max_objects] (stable indices; freed ones chained through .next, those
 * never used yet counted by entry_fresh) and
 * buckets[nbuckets] heads of hash chains. Chaining rather than open addressing because a
 * removal then writes one word, which keeps every update's journal short and bounded.
 *
 * References: one record per (slot, entry) pair holding a count, in a second chained
 * hash table. The records make reaping exact: a dead process's references are found by
 * its slot, not guessed.
 *
 * Every public function: check arguments, take the lock (which recovers a dead holder's
 * update), check every precondition *before* the first write, then begin / write through
 * the journal / commit, and unlock.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "os_internal.h"

static uint64_t os_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static void os_id_words(const char *id, uint64_t w[2]) { memcpy(w, id, OBJSTORE_ID_SIZE); }

static uint32_t os_id_bucket(const objstore_t *s, const uint64_t w[2]) {
    const os_header_t *h = os_hdr(s);
    return (uint32_t)(os_mix(os_mix(w[0] ^ h->hash_seed) ^ w[1]) & (h->nbuckets - 1));
}

static uint32_t os_ref_bucket(const objstore_t *s, uint32_t slot, uint32_t entry) {
    const os_header_t *h = os_hdr(s);
    uint64_t key = ((uint64_t)slot << 32) | entry;
    return (uint32_t)(os_mix(key ^ h->hash_seed) & (h->nref_buckets - 1));
}

/* Entry index of `id` (any state but free), or OS_NIL. */
static uint32_t os_lookup(const objstore_t *s, const char *id) {
    uint64_t w[2];
    os_id_words(id, w);
    const os_entry_t *E = os_entries(s);
    uint64_t bound = os_hdr(s)->max_objects;
    for (uint32_t e = os_buckets(s)[os_id_bucket(s, w)]; e != OS_NIL && bound-- > 0; e = E[e].next)
        if (E[e].id[0] == w[0] && E[e].id[1] == w[1]) return e;
    return OS_NIL;
}

static void os_index_remove(objstore_t *s, uint32_t e) {
    os_entry_t *E = os_entries(s);
    uint32_t *head = &os_buckets(s)[os_id_bucket(s, E[e].id)];
    if (*head == e) {
        os_j32(s, head, E[e].next);
        return;
    }
    for (uint32_t p = *head; p != OS_NIL; p = E[p].next) {
        if (E[p].next == e) {
            os_j32(s, &E[p].next, E[e].next);
            return;
        }
    }
}

static uint32_t os_ref_find(const objstore_t *s, uint32_t slot, uint32_t entry) {
    const os_ref_t *R = os_refs(s);
    uint64_t bound = os_hdr(s)->max_refs;
    for (uint32_t r = os_ref_buckets(s)[os_ref_bucket(s, slot, entry)]; r != OS_NIL && bound-- > 0;
         r = R[r].next)
        if (R[r].slot == slot && R[r].entry == entry) return r;
    return OS_NIL;
}

/* Record one more reference of `slot` on `e` (the entry's refcount is raised by the
 * caller). The caller has checked that a record is free when none exists yet. */
static void os_ref_record(objstore_t *s, uint32_t slot, uint32_t e) {
    os_header_t *h = os_hdr(s);
    os_ref_t *R = os_refs(s);
    uint32_t r = os_ref_find(s, slot, e);
    if (r != OS_NIL) {
        os_j32(s, &R[r].count, R[r].count + 1);
    } else {
        uint32_t *head = &os_ref_buckets(s)[os_ref_bucket(s, slot, e)];
        if (h->ref_free != OS_NIL) {
            r = (uint32_t)h->ref_free;
            os_j64(s, &h->ref_free, R[r].next);
        } else {
            r = (uint32_t)h->ref_fresh; /* the caller checked that one is left */
            os_j64(s, &h->ref_fresh, h->ref_fresh + 1);
        }
        os_j32(s, &R[r].slot, slot);
        os_j32(s, &R[r].entry, e);
        os_j32(s, &R[r].count, 1);
        os_j32(s, &R[r].next, *head);
        os_j32(s, head, r);
    }
    os_j64(s, &os_slots(s)[slot].refs, os_slots(s)[slot].refs + 1);
    os_j64(s, &h->refs_total, h->refs_total + 1);
}

/* Remove entry `e` from the index and free its memory. */
static void os_object_free(objstore_t *s, uint32_t e) {
    os_header_t *h = os_hdr(s);
    os_entry_t *E = &os_entries(s)[e];
    os_index_remove(s, e);
    os_crash(s, OBJSTORE_CRASH_DELETE_AFTER_UNINDEX);
    os_free_block(s, E->block);
    os_j64(s, &h->objects, h->objects - 1);
    os_j64(s, &h->data_bytes, h->data_bytes - E->size);
    if (E->state == OS_ENTRY_SEALED) os_j64(s, &h->sealed, h->sealed - 1);
    if (E->flags & OS_FLAG_DELETE_PENDING) os_j64(s, &h->pending, h->pending - 1);
    os_j32(s, &E->state, OS_ENTRY_FREE);
    os_j32(s, &E->flags, 0);
    os_j32(s, &E->refcount, 0);
    os_j32(s, &E->next, (uint32_t)h->entry_free);
    os_j64(s, &h->entry_free, e);
}

/* Drop `n` references held through record `r`; free the object when that was the last
 * reference of a delete-pending or unsealed object. */
static void os_ref_drop(objstore_t *s, uint32_t r, uint32_t n, int crash) {
    os_header_t *h = os_hdr(s);
    os_ref_t *R = &os_refs(s)[r];
    uint32_t slot = R->slot, e = R->entry;
    os_entry_t *E = &os_entries(s)[e];
    os_j32(s, &E->refcount, E->refcount - n);
    if (crash) os_crash(s, OBJSTORE_CRASH_RELEASE_AFTER_DECREF);
    if (R->count == n) {
        uint32_t *head = &os_ref_buckets(s)[os_ref_bucket(s, slot, e)];
        os_ref_t *A = os_refs(s);
        if (*head == r) {
            os_j32(s, head, R->next);
        } else {
            for (uint32_t p = *head; p != OS_NIL; p = A[p].next) {
                if (A[p].next == r) {
                    os_j32(s, &A[p].next, R->next);
                    break;
                }
            }
        }
        os_j32(s, &R->slot, OS_NIL);
        os_j32(s, &R->count, 0);
        os_j32(s, &R->next, (uint32_t)h->ref_free);
        os_j64(s, &h->ref_free, r);
    } else {
        os_j32(s, &R->count, R->count - n);
    }
    os_j64(s, &os_slots(s)[slot].refs, os_slots(s)[slot].refs - n);
    os_j64(s, &h->refs_total, h->refs_total - n);
    if (E->refcount == 0 &&
        (E->state == OS_ENTRY_CREATED || (E->flags & OS_FLAG_DELETE_PENDING)))
        os_object_free(s, e);
}

/* Drop every reference of `slot` (detach or reap), one committed update per record so
 * the journal stays short and an interruption leaves a consistent, resumable state.
 * Called with the lock held. */
void os_drop_slot_refs(objstore_t *s, uint32_t slot, int crash_between) {
    os_header_t *h = os_hdr(s);
    os_ref_t *R = os_refs(s);
    for (uint32_t r = 0; r < h->ref_fresh; r++) {
        if (R[r].slot != slot) continue;
        os_begin(s, OS_OP_REAP, NULL);
        os_ref_drop(s, r, R[r].count, 0);
        if (crash_between) os_crash(s, OBJSTORE_CRASH_REAP);
        os_commit(s);
    }
}

/* Empty tables. Runs before the region is published: no journal. Entries and reference
 * records are all fresh (the file's zeroes: an entry in state FREE), so only the two
 * bucket arrays are written. */
void os_tables_init(objstore_t *s) {
    os_header_t *h = os_hdr(s);
    h->entry_free = OS_NIL;
    h->entry_fresh = 0;
    memset(os_buckets(s), 0xff, h->nbuckets * sizeof(uint32_t));
    h->ref_free = OS_NIL;
    h->ref_fresh = 0;
    memset(os_ref_buckets(s), 0xff, h->nref_buckets * sizeof(uint32_t));
}

/* ---------------------------------------------------------------- lifecycle */

/* The first fit at *off reaches past the committed mark: take a committed block that
 * fits instead if there is one (keeps the file small), else commit more. If the
 * filesystem is full, FULL, with s->last_errno saying why. Lock held; the commitment is
 * an update of its own, committed before the caller's begins. */
static objstore_status_t os_place(objstore_t *s, uint64_t need, uint64_t *off) {
    uint64_t within = os_alloc_find_within(s, need, os_hdr(s)->committed);
    if (within != 0) {
        *off = within;
        return OBJSTORE_OK;
    }
    return os_commit_to(s, os_take_end(s, *off, need));
}

objstore_status_t objstore_create(objstore_t *s, const char *id, uint64_t size, void **data) {
    return objstore_create_bounded(s, id, size, 0, data);
}

objstore_status_t objstore_create_bounded(objstore_t *s, const char *id, uint64_t size,
                                          uint64_t limit, void **data) {
    if (s == NULL || id == NULL || data == NULL) return OBJSTORE_E_INVALID;
    *data = NULL;
    s->last_errno = 0; /* set again if a commitment fails */
    os_header_t *h = os_hdr(s);
    if (size > h->heap_size) return OBJSTORE_E_FULL;
    uint64_t need = os_block_need(size), off = 0;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    if (os_lookup(s, id) != OS_NIL) st = OBJSTORE_E_EXISTS;
    else if (!os_entry_left(h) || !os_ref_left(h)) st = OBJSTORE_E_TABLE_FULL;
    else if (limit != 0 && h->in_use + need > limit) st = OBJSTORE_E_FULL;
    else if ((off = os_alloc_find(s, need)) == 0) st = OBJSTORE_E_FULL;
    else if (os_take_end(s, off, need) > h->committed) st = os_place(s, need, &off);
    if (st == OBJSTORE_OK) {
        uint64_t w[2];
        os_id_words(id, w);
        os_begin(s, OS_OP_CREATE, id);
        os_alloc_take(s, off, need);
        os_crash(s, OBJSTORE_CRASH_CREATE_AFTER_ALLOC);
        uint32_t e;
        if (h->entry_free != OS_NIL) {
            e = (uint32_t)h->entry_free;
            os_j64(s, &h->entry_free, os_entries(s)[e].next);
        } else {
            e = (uint32_t)h->entry_fresh;
            os_j64(s, &h->entry_fresh, h->entry_fresh + 1);
        }
        os_entry_t *E = &os_entries(s)[e];
        uint32_t *head = &os_buckets(s)[os_id_bucket(s, w)];
        os_j64(s, &E->id[0], w[0]);
        os_j64(s, &E->id[1], w[1]);
        os_j64(s, &E->block, off);
        os_j64(s, &E->size, size);
        os_j32(s, &E->state, OS_ENTRY_CREATED);
        os_j32(s, &E->flags, 0);
        os_j32(s, &E->creator, s->slot);
        os_j32(s, &E->next, *head);
        os_j32(s, head, e);
        os_j64(s, &os_block(s, off)->entry, e);
        os_j64(s, &h->objects, h->objects + 1);
        os_j64(s, &h->data_bytes, h->data_bytes + size);
        os_crash(s, OBJSTORE_CRASH_CREATE_AFTER_INDEX);
        os_j32(s, &E->refcount, 1);
        os_ref_record(s, s->slot, e);
        os_commit(s);
        *data = s->base + off + OS_BLOCK_HDR;
    }
    os_unlock(s);
    return st;
}

/* Shared checks of seal and abort: the object exists, is unsealed and is ours. */
static objstore_status_t os_check_own_unsealed(objstore_t *s, const char *id, uint32_t *e,
                                               uint32_t *r) {
    *e = os_lookup(s, id);
    if (*e == OS_NIL) return OBJSTORE_E_NOT_FOUND;
    const os_entry_t *E = &os_entries(s)[*e];
    if (E->state == OS_ENTRY_SEALED) return OBJSTORE_E_SEALED;
    if (E->creator != s->slot) return OBJSTORE_E_NOT_HELD;
    *r = os_ref_find(s, s->slot, *e);
    return *r == OS_NIL ? OBJSTORE_E_NOT_HELD : OBJSTORE_OK;
}

static void os_seal_locked(objstore_t *s, uint32_t e) {
    os_header_t *h = os_hdr(s);
    os_j32(s, &os_entries(s)[e].state, OS_ENTRY_SEALED);
    os_j64(s, &h->sealed, h->sealed + 1);
    os_crash(s, OBJSTORE_CRASH_SEAL);
}

objstore_status_t objstore_seal(objstore_t *s, const char *id) {
    if (s == NULL || id == NULL) return OBJSTORE_E_INVALID;
    uint32_t e, r;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    st = os_check_own_unsealed(s, id, &e, &r);
    if (st == OBJSTORE_OK) {
        os_begin(s, OS_OP_SEAL, id);
        os_seal_locked(s, e);
        os_commit(s);
    }
    os_unlock(s);
    return st;
}

objstore_status_t objstore_abort(objstore_t *s, const char *id) {
    if (s == NULL || id == NULL) return OBJSTORE_E_INVALID;
    uint32_t e, r;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    st = os_check_own_unsealed(s, id, &e, &r);
    if (st == OBJSTORE_OK) {
        /* get refuses unsealed objects, so the creator's records are all the references:
         * dropping them frees the object. */
        os_begin(s, OS_OP_ABORT, id);
        os_ref_drop(s, r, os_refs(s)[r].count, 0);
        os_commit(s);
    }
    os_unlock(s);
    return st;
}

/* Parallel copy of large objects. One thread's memcpy is bound by its core's load/store
 * throughput, well below the memory bandwidth (measured on a 2-core VM: 100 MB in 19 ms
 * with one thread, 9.9 ms with two; Ray copies with several threads for the same reason).
 * Threads live for one call only: nothing outlives it (fork-safe), and a failed
 * pthread_create only means that slice is copied by the caller. */
#define OS_COPY_PARALLEL_MIN (8u << 20) /* below this, one memcpy */
#define OS_COPY_SLICE_MIN (4u << 20)    /* no thread copies less than this */
#define OS_COPY_THREADS_MAX 4           /* enough to reach memory bandwidth on most hosts */

/* Before the first write through this handle's mapping, a range's page-table entries are
 * filled in one MADV_POPULATE_WRITE call rather than one page fault per 4 KiB page: a
 * first put of 100 MB took 37 ms with two threads faulting and 26 ms with two threads
 * populating, then copying (measured on the 2-core VM). A per-handle bitmap of 2 MiB
 * chunks says which are done, so a put into pages this process has written before costs
 * nothing more (populating them again took 2 ms per 100 MB; a 64 KiB put, 2 us more).
 * A chunk is populated whole on its first put, so smaller objects that follow into it
 * find it done. */
#define OS_POPULATE_MIN (64u << 10) /* fewer pages: the faults cost less than the call */

static void os_populate(objstore_t *s, char *dst, uint64_t size) {
#ifdef MADV_POPULATE_WRITE
    if (size < OS_POPULATE_MIN || __atomic_load_n(&s->populate_off, __ATOMIC_RELAXED)) return;
    unsigned char *done = __atomic_load_n(&s->populated, __ATOMIC_ACQUIRE);
    if (done == NULL) {
        unsigned char *fresh = calloc(s->size / OS_POPULATE_CHUNK / 8 + 1, 1);
        if (fresh == NULL) return;
        if (__atomic_compare_exchange_n(&s->populated, &done, fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            done = fresh;
        } else {
            free(fresh); /* another thread's is there: `done` holds it */
        }
    }
    /* Whole chunks, up to the committed mark (page aligned; read without the lock, it only
     * grows): the object lies below it, and so do the pages around it that later puts into
     * the chunk will write. A chunk the mark cuts is populated up to it and not marked. */
    uint64_t committed = __atomic_load_n(&os_hdr(s)->committed, __ATOMIC_ACQUIRE);
    uint64_t from = (uint64_t)(dst - s->base), to = from + size;
    for (uint64_t c = from / OS_POPULATE_CHUNK; c * OS_POPULATE_CHUNK < to; c++) {
        unsigned char bit = (unsigned char)(1u << (c % 8));
        if (__atomic_load_n(&done[c / 8], __ATOMIC_RELAXED) & bit) continue;
        uint64_t lo = c * OS_POPULATE_CHUNK, hi = lo + OS_POPULATE_CHUNK;
        int whole = hi <= committed;
        if (!whole) hi = committed > to ? committed : (to + OS_PAGE - 1) & ~(uint64_t)(OS_PAGE - 1);
        if (madvise(s->base + lo, hi - lo, MADV_POPULATE_WRITE) != 0) {
            if (errno == EINVAL) __atomic_store_n(&s->populate_off, 1, __ATOMIC_RELAXED); /* kernel < 5.14 */
            return; /* the page faults will do it */
        }
        if (whole) __atomic_fetch_or(&done[c / 8], bit, __ATOMIC_RELAXED);
    }
#else
    (void)s;
    (void)dst;
    (void)size;
#endif
}

typedef struct {
    objstore_t *s;
    char *dst;
    const char *src;
    uint64_t size;
} os_copy_slice_t;

static void *os_copy_slice(void *arg) {
    os_copy_slice_t *c = arg;
    os_populate(c->s, c->dst, c->size);
    memcpy(c->dst, c->src, c->size);
    return NULL;
}

static int os_copy_threads(uint64_t size) {
    if (size < OS_COPY_PARALLEL_MIN) return 1;
    cpu_set_t cpus;
    int n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    uint64_t by_size = size / OS_COPY_SLICE_MIN;
    if ((uint64_t)n > by_size) n = (int)by_size;
    return n > OS_COPY_THREADS_MAX ? OS_COPY_THREADS_MAX : n;
}

static void os_copy(objstore_t *s, void *dst, const void *src, uint64_t size) {
    int n = os_copy_threads(size);
    if (n < 2) {
        os_copy_slice_t whole = {s, dst, src, size};
        os_copy_slice(&whole);
        return;
    }
    uint64_t step = (size / (uint64_t)n) & ~(uint64_t)4095; /* page-aligned slices */
    os_copy_slice_t slices[OS_COPY_THREADS_MAX];
    pthread_t threads[OS_COPY_THREADS_MAX];
    int started[OS_COPY_THREADS_MAX] = {0};
    for (int i = 0; i < n; i++) {
        slices[i].s = s;
        slices[i].dst = (char *)dst + (uint64_t)i * step;
        slices[i].src = (const char *)src + (uint64_t)i * step;
        slices[i].size = i == n - 1 ? size - (uint64_t)i * step : step;
    }
    /* The helpers block every signal: a signal meant for the process (Python's SIGINT)
     * goes to a thread that handles it, not to one that vanishes in a few milliseconds. */
    sigset_t all, old;
    sigfillset(&all);
    int masked = pthread_sigmask(SIG_SETMASK, &all, &old) == 0;
    for (int i = 1; i < n; i++) started[i] = pthread_create(&threads[i], NULL, os_copy_slice, &slices[i]) == 0;
    if (masked) pthread_sigmask(SIG_SETMASK, &old, NULL);
    os_copy_slice(&slices[0]);
    for (int i = 1; i < n; i++) {
        if (started[i]) pthread_join(threads[i], NULL);
        else os_copy_slice(&slices[i]);
    }
}

objstore_status_t objstore_put(objstore_t *s, const char *id, const void *data, uint64_t size) {
    if (s == NULL || id == NULL || (data == NULL && size > 0)) return OBJSTORE_E_INVALID;
    void *dst;
    objstore_status_t st = objstore_create(s, id, size, &dst);
    if (st != OBJSTORE_OK) return st;
    if (size > 0) os_copy(s, dst, data, size); /* outside the lock: only we write here */
    st = os_lock(s);
    if (st != OBJSTORE_OK) return st; /* the unsealed object goes with our slot (close/reap) */
    uint32_t e, r;
    st = os_check_own_unsealed(s, id, &e, &r);
    if (st == OBJSTORE_OK) {
        os_begin(s, OS_OP_SEAL, id);
        os_seal_locked(s, e);
        os_ref_drop(s, r, 1, 0);
        os_commit(s);
    }
    os_unlock(s);
    return st;
}

objstore_status_t objstore_get(objstore_t *s, const char *id, const void **data,
                               uint64_t *size) {
    if (s == NULL || id == NULL || data == NULL || size == NULL) return OBJSTORE_E_INVALID;
    *data = NULL;
    *size = 0;
    os_header_t *h = os_hdr(s);
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint32_t e = os_lookup(s, id);
    os_entry_t *E = e == OS_NIL ? NULL : &os_entries(s)[e];
    if (E == NULL || (E->flags & OS_FLAG_DELETE_PENDING)) st = OBJSTORE_E_NOT_FOUND;
    else if (E->state != OS_ENTRY_SEALED) st = OBJSTORE_E_NOT_SEALED;
    else if (os_ref_find(s, s->slot, e) == OS_NIL && !os_ref_left(h))
        st = OBJSTORE_E_TABLE_FULL;
    if (st == OBJSTORE_OK) {
        os_begin(s, OS_OP_GET, id);
        os_j32(s, &E->refcount, E->refcount + 1);
        os_crash(s, OBJSTORE_CRASH_GET_AFTER_INCREF);
        os_ref_record(s, s->slot, e);
        os_commit(s);
        *data = s->base + E->block + OS_BLOCK_HDR;
        *size = E->size;
    }
    os_unlock(s);
    return st;
}

/* Drop one reference this handle holds on entry `e` (OS_NIL: none found). Lock held. */
static objstore_status_t os_release_locked(objstore_t *s, uint32_t e) {
    if (e == OS_NIL) return OBJSTORE_E_NOT_FOUND;
    uint32_t r = os_ref_find(s, s->slot, e);
    if (r == OS_NIL) return OBJSTORE_E_NOT_HELD;
    char id[OBJSTORE_ID_SIZE];
    memcpy(id, os_entries(s)[e].id, OBJSTORE_ID_SIZE);
    os_begin(s, OS_OP_RELEASE, id);
    os_ref_drop(s, r, 1, 1);
    os_commit(s);
    return OBJSTORE_OK;
}

objstore_status_t objstore_release(objstore_t *s, const char *id) {
    if (s == NULL || id == NULL) return OBJSTORE_E_INVALID;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    st = os_release_locked(s, os_lookup(s, id));
    os_unlock(s);
    return st;
}

objstore_status_t objstore_delete(objstore_t *s, const char *id, int *deferred) {
    if (s == NULL || id == NULL) return OBJSTORE_E_INVALID;
    if (deferred != NULL) *deferred = 0;
    os_header_t *h = os_hdr(s);
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint32_t e = os_lookup(s, id);
    os_entry_t *E = e == OS_NIL ? NULL : &os_entries(s)[e];
    if (E == NULL || (E->flags & OS_FLAG_DELETE_PENDING)) st = OBJSTORE_E_NOT_FOUND;
    else if (E->state != OS_ENTRY_SEALED) st = OBJSTORE_E_NOT_SEALED;
    if (st == OBJSTORE_OK) {
        os_begin(s, OS_OP_DELETE, id);
        if (E->refcount > 0) {
            os_j32(s, &E->flags, E->flags | OS_FLAG_DELETE_PENDING);
            os_j64(s, &h->pending, h->pending + 1);
            if (deferred != NULL) *deferred = 1;
        } else {
            os_object_free(s, e);
        }
        os_commit(s);
    }
    os_unlock(s);
    return st;
}

/* The entry whose object bytes start at `data`, or OS_NIL. Lock held. A pointer that is
 * not the start of a live object's bytes (inside one, past the committed mark, into a
 * free block, outside the heap) finds nothing: the block header must carry the magic,
 * be in use, and name an entry that names this block back. */
static uint32_t os_entry_at(const objstore_t *s, const void *data) {
    const os_header_t *h = os_hdr(s);
    const char *p = (const char *)data;
    if (p < s->base + h->heap_off + OS_BLOCK_HDR || p >= s->base + h->heap_off + h->heap_size)
        return OS_NIL;
    uint64_t off = (uint64_t)(p - s->base) - OS_BLOCK_HDR;
    if ((off - h->heap_off) % OS_ALIGN != 0 || off + OS_BLOCK_HDR > h->committed) return OS_NIL;
    const os_block_t *b = os_block(s, off);
    if (b->magic != OS_BLOCK_MAGIC || b->is_free || b->entry >= h->max_objects) return OS_NIL;
    const os_entry_t *E = &os_entries(s)[b->entry];
    if (E->state == OS_ENTRY_FREE || E->block != off) return OS_NIL;
    return (uint32_t)b->entry;
}

objstore_status_t objstore_object_at(objstore_t *s, const void *data, char *id, uint64_t *size,
                                     int *state) {
    if (s == NULL || data == NULL) return OBJSTORE_E_INVALID;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint32_t e = os_entry_at(s, data);
    if (e == OS_NIL) {
        st = OBJSTORE_E_NOT_FOUND;
    } else {
        const os_entry_t *E = &os_entries(s)[e];
        if (id != NULL) memcpy(id, E->id, OBJSTORE_ID_SIZE);
        if (size != NULL) *size = E->size;
        if (state != NULL)
            *state = (E->flags & OS_FLAG_DELETE_PENDING) ? OBJSTORE_DELETE_PENDING
                     : E->state == OS_ENTRY_SEALED      ? OBJSTORE_SEALED
                                                        : OBJSTORE_UNSEALED;
    }
    os_unlock(s);
    return st;
}

objstore_status_t objstore_seal_at(objstore_t *s, const void *data, uint64_t size, char *id) {
    if (s == NULL || data == NULL || id == NULL) return OBJSTORE_E_INVALID;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint32_t e = os_entry_at(s, data), r = OS_NIL;
    char oid[OBJSTORE_ID_SIZE];
    if (e == OS_NIL || os_entries(s)[e].size != size) {
        st = OBJSTORE_E_NOT_FOUND;
    } else {
        memcpy(oid, os_entries(s)[e].id, OBJSTORE_ID_SIZE);
        st = os_check_own_unsealed(s, oid, &e, &r);
    }
    if (st == OBJSTORE_OK) {
        os_begin(s, OS_OP_SEAL, oid);
        os_seal_locked(s, e);
        os_commit(s);
        memcpy(id, oid, OBJSTORE_ID_SIZE);
    }
    os_unlock(s);
    return st;
}

objstore_status_t objstore_release_at(objstore_t *s, const void *data, uint64_t *size) {
    if (s == NULL || data == NULL) return OBJSTORE_E_INVALID;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint32_t e = os_entry_at(s, data);
    if (e != OS_NIL && size != NULL) *size = os_entries(s)[e].size;
    st = os_release_locked(s, e);
    os_unlock(s);
    return st;
}

objstore_status_t objstore_contains(objstore_t *s, const char *id, int *state) {
    if (s == NULL || id == NULL || state == NULL) return OBJSTORE_E_INVALID;
    *state = OBJSTORE_ABSENT;
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint32_t e = os_lookup(s, id);
    if (e != OS_NIL) {
        const os_entry_t *E = &os_entries(s)[e];
        if (E->flags & OS_FLAG_DELETE_PENDING) *state = OBJSTORE_DELETE_PENDING;
        else *state = E->state == OS_ENTRY_SEALED ? OBJSTORE_SEALED : OBJSTORE_UNSEALED;
    }
    os_unlock(s);
    return st;
}

objstore_status_t objstore_list(objstore_t *s, char *ids, uint64_t max, uint64_t *count) {
    if (s == NULL || count == NULL || (ids == NULL && max > 0)) return OBJSTORE_E_INVALID;
    *count = 0;
    const os_header_t *h = os_hdr(s);
    const os_entry_t *E = os_entries(s);
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint64_t n = 0;
    for (uint64_t e = 0; e < h->entry_fresh; e++) {
        if (E[e].state == OS_ENTRY_FREE) continue;
        if (n < max) memcpy(ids + n * OBJSTORE_ID_SIZE, E[e].id, OBJSTORE_ID_SIZE);
        n++;
    }
    *count = n;
    os_unlock(s);
    return st;
}

/* ---------------------------------------------------------------- maintenance */

objstore_status_t objstore_stats(objstore_t *s, objstore_stats_t *out) {
    if (s == NULL || out == NULL) return OBJSTORE_E_INVALID;
    memset(out, 0, sizeof *out);
    const os_header_t *h = os_hdr(s);
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    uint64_t largest = 0, nfree = 0, bound = h->heap_size / OS_MIN_BLOCK + 1;
    for (unsigned k = 0; k < OS_NCLASSES; k++) {
        for (uint64_t off = h->free_head[k]; off != 0 && bound > 0; bound--) {
            const os_block_t *b = os_block(s, off);
            nfree++;
            if (b->size > largest) largest = b->size;
            off = b->next_free;
        }
    }
    out->capacity = h->heap_size;
    out->in_use = h->in_use;
    out->data_bytes = h->data_bytes;
    out->objects = h->objects;
    out->sealed = h->sealed;
    out->pending_delete = h->pending;
    out->free_blocks = nfree;
    out->largest_free = largest >= OS_BLOCK_HDR ? largest - OS_BLOCK_HDR : 0;
    out->max_objects = h->max_objects;
    out->references = h->refs_total;
    out->processes = h->processes;
    out->max_processes = h->max_slots;
    out->recoveries = h->recoveries;
    out->reaped_processes = h->reaped_processes;
    out->region_size = h->region_size;
    out->committed = h->committed;
    out->file_backed = (uint64_t)s->file_backed;
    os_unlock(s);
    return st;
}

objstore_status_t objstore_usage(const objstore_t *s, objstore_usage_t *out) {
    if (s == NULL || out == NULL) return OBJSTORE_E_INVALID;
    const os_header_t *h = os_hdr(s);
    /* Relaxed atomic loads of counters that writers update under the lock: no lock here
     * (see the header), and no torn value on any platform with 64-bit loads. */
    out->capacity = h->heap_size; /* layout: written once at creation */
    out->in_use = __atomic_load_n(&h->in_use, __ATOMIC_RELAXED);
    out->data_bytes = __atomic_load_n(&h->data_bytes, __ATOMIC_RELAXED);
    out->objects = __atomic_load_n(&h->objects, __ATOMIC_RELAXED);
    return OBJSTORE_OK;
}

#define VFAIL(...)                                            \
    do {                                                      \
        if (msg != NULL) snprintf(msg, msglen, __VA_ARGS__);  \
        goto done;                                            \
    } while (0)

/* Entries, index chains, reference records and slots against each other and the
 * counters; the heap is checked by os_validate_heap. Lock held; 1 if consistent. */
static int os_validate_tables(const objstore_t *s, uint32_t *counts, char *msg, size_t msglen,
                              uint64_t used_blocks) {
    const os_header_t *h = os_hdr(s);
    const os_entry_t *E = os_entries(s);
    const os_ref_t *R = os_refs(s);
    const os_slot_t *S = os_slots(s);
    uint64_t live = 0, sealed = 0, pending = 0, data = 0, chained = 0, nfree = 0, refs = 0;
    uint64_t records = 0, free_records = 0, procs = 0;
    for (uint64_t i = 0; i < h->max_slots; i++) procs += S[i].pid != 0;
    if (procs != h->processes) VFAIL("%llu slots in use, counter says %llu",
                                     (unsigned long long)procs, (unsigned long long)h->processes);
    if (h->ref_fresh > h->max_refs || h->entry_fresh > h->max_objects) VFAIL("fresh marks past the tables");
    for (uint64_t r = 0; r < h->ref_fresh; r++) {
        if (R[r].slot == OS_NIL) continue;
        if (R[r].slot >= h->max_slots || S[R[r].slot].pid == 0)
            VFAIL("reference record %llu belongs to a free slot", (unsigned long long)r);
        if (R[r].entry >= h->max_objects || E[R[r].entry].state == OS_ENTRY_FREE || R[r].count == 0)
            VFAIL("reference record %llu: bad entry or count", (unsigned long long)r);
        if (os_ref_find(s, R[r].slot, R[r].entry) != r)
            VFAIL("reference record %llu not reachable in its chain", (unsigned long long)r);
        counts[R[r].entry] += R[r].count;
        counts[h->max_objects + R[r].slot] += R[r].count;
        refs += R[r].count;
        records++;
    }
    for (uint32_t r = (uint32_t)h->ref_free; r != OS_NIL; r = R[r].next) {
        if (r >= h->ref_fresh || R[r].slot != OS_NIL || ++free_records > h->max_refs)
            VFAIL("reference free list broken at %u", r);
    }
    if (records + free_records != h->ref_fresh) VFAIL("reference records leaked");
    if (refs != h->refs_total) VFAIL("references: counted %llu, counter %llu",
                                     (unsigned long long)refs, (unsigned long long)h->refs_total);
    for (uint64_t i = 0; i < h->max_slots; i++) {
        uint64_t held = counts[h->max_objects + i];
        if (held != S[i].refs) VFAIL("slot %llu: holds %llu, counter %llu", (unsigned long long)i,
                                     (unsigned long long)held, (unsigned long long)S[i].refs);
    }
    for (uint32_t e = 0; e < h->entry_fresh; e++) {
        if (E[e].state == OS_ENTRY_FREE) continue;
        live++;
        data += E[e].size;
        sealed += E[e].state == OS_ENTRY_SEALED;
        pending += (E[e].flags & OS_FLAG_DELETE_PENDING) != 0;
        if (E[e].refcount != counts[e])
            VFAIL("object %u: refcount %u, records hold %u", e, E[e].refcount, counts[e]);
        if (E[e].state == OS_ENTRY_CREATED && E[e].refcount == 0)
            VFAIL("object %u: unsealed with no reference", e);
        if ((E[e].flags & OS_FLAG_DELETE_PENDING) && E[e].refcount == 0)
            VFAIL("object %u: delete pending with no reference", e);
        if (E[e].block < h->heap_off || E[e].block >= h->heap_off + h->heap_size ||
            os_block(s, E[e].block)->is_free || os_block(s, E[e].block)->entry != e)
            VFAIL("object %u: block does not point back", e);
    }
    for (uint64_t b = 0; b < h->nbuckets; b++) {
        for (uint32_t e = os_buckets(s)[b]; e != OS_NIL; e = E[e].next) {
            if (e >= h->entry_fresh || E[e].state == OS_ENTRY_FREE || ++chained > live)
                VFAIL("index chain %llu broken", (unsigned long long)b);
            if (os_id_bucket(s, E[e].id) != b) VFAIL("object %u in the wrong bucket", e);
        }
    }
    for (uint32_t e = (uint32_t)h->entry_free; e != OS_NIL; e = E[e].next) {
        if (e >= h->entry_fresh || E[e].state != OS_ENTRY_FREE || ++nfree > h->max_objects)
            VFAIL("entry free list broken at %u", e);
    }
    if (chained != live) VFAIL("%llu objects, %llu indexed", (unsigned long long)live,
                               (unsigned long long)chained);
    if (live + nfree != h->entry_fresh) VFAIL("entries leaked");
    if (live != used_blocks) VFAIL("%llu objects, %llu used blocks", (unsigned long long)live,
                                   (unsigned long long)used_blocks);
    if (live != h->objects || sealed != h->sealed || pending != h->pending || data != h->data_bytes)
        VFAIL("counters disagree with the index");
    return 1;
done:
    return 0;
}

/* The committed mark: page aligned (or the region's end), covers the tables, and the
 * file really holds that much (else touching the heap below the mark could SIGBUS). */
static int os_validate_commitment(const objstore_t *s, char *msg, size_t msglen) {
    const os_header_t *h = os_hdr(s);
    struct stat sb;
    if (h->committed < h->heap_off + OS_MIN_BLOCK || h->committed > h->region_size ||
        (h->committed % OS_PAGE != 0 && h->committed != h->region_size))
        VFAIL("committed mark %llu outside [heap start, region end] or not page aligned",
              (unsigned long long)h->committed);
    if (fstat(s->fd, &sb) != 0) VFAIL("fstat of the region failed (errno %d)", errno);
    if ((uint64_t)sb.st_size < h->committed)
        VFAIL("committed mark %llu past the end of the file (%llu bytes)",
              (unsigned long long)h->committed, (unsigned long long)sb.st_size);
    return 1;
done:
    return 0;
}

objstore_status_t objstore_validate(objstore_t *s, char *msg, size_t msglen) {
    if (s == NULL) return OBJSTORE_E_INVALID;
    if (msg != NULL && msglen > 0) msg[0] = '\0';
    const os_header_t *h = os_hdr(s);
    /* per-entry reference counts, then per-slot ones */
    uint32_t *counts = calloc(h->max_objects + h->max_slots, sizeof *counts);
    if (counts == NULL) return OBJSTORE_E_SYSTEM;
    objstore_status_t st = os_lock(s);
    if (st == OBJSTORE_OK) {
        uint64_t used = 0;
        int ok = h->undo_count == 0;
        if (!ok && msg != NULL) snprintf(msg, msglen, "journal not empty");
        ok = ok && os_validate_commitment(s, msg, msglen);
        ok = ok && os_validate_heap(s, msg, msglen, &used);
        ok = ok && os_validate_tables(s, counts, msg, msglen, used);
        st = ok ? OBJSTORE_OK : OBJSTORE_E_CORRUPT;
        os_unlock(s);
    }
    free(counts);
    return st;
}
