/*
 * test_damage.c -- C unit tests of the object store on a damaged region: what the
 * fuzzer (native/fuzz/fuzz_objstore.c) found or asked for, kept as plain regression
 * tests. White-box: it includes os_internal.h to damage the region's metadata the way a
 * stray write from another process that maps the region would.
 *
 * Built and run under ASan and UBSan by tests/objstore/test_c_unit.py, like
 * test_objstore.c, with the same helpers (test_support.c). usage: test_damage NAME_PREFIX
 * Every region it creates is named NAME_PREFIX-<n> and removed before it returns.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "os_internal.h"
#include "test_support.h"

static objstore_status_t validate(objstore_t *s, char *msg, size_t n) {
    return objstore_validate(s, msg, n);
}

/* A store whose lock waits are bounded: a damaged region must fail, never hang. */
static objstore_t *new_damageable(char *name, size_t n, uint64_t capacity) {
    objstore_t *s = new_store(name, n, capacity, 0);
    if (s != NULL) objstore_set_lock_timeout(s, 2000);
    return s;
}

static void id_of(char id[OBJSTORE_ID_SIZE], unsigned k) {
    memset(id, 0, OBJSTORE_ID_SIZE);
    memcpy(id, &k, sizeof k);
    id[15] = 'd';
}

/* Found by the fuzzer: validate sized its scratch array from the header's max_objects,
 * so a damaged header made it allocate 16 GiB; and attach trusted every table offset. */
static void test_layout(void) {
    char name[128], msg[256];
    objstore_t *s = new_damageable(name, sizeof name, 1 << 20), *t = NULL;
    if (s == NULL) return;
    os_header_t *h = os_hdr(s);
    uint64_t keep = h->max_objects;
    h->max_objects = 1ULL << 40;
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
    CHECK(strstr(msg, "layout") != NULL);
    CHECK_ST(objstore_attach(name, NULL, &t), OBJSTORE_E_BAD_REGION);
    h->max_objects = keep;
    keep = h->slots_off;
    h->slots_off += 64; /* tables that would overlap: attach must refuse */
    CHECK_ST(objstore_attach(name, NULL, &t), OBJSTORE_E_BAD_REGION);
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
    h->slots_off = keep;
    keep = h->committed;
    h->committed = h->region_size + 4096; /* more than the file holds */
    CHECK_ST(objstore_attach(name, NULL, &t), OBJSTORE_E_BAD_REGION);
    h->committed = keep;
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_OK);
    CHECK_ST(objstore_attach(name, NULL, &t), OBJSTORE_OK);
    objstore_close(t);
    drop_store(s);
}

/* The undo journal is replayed by the next locker; a damaged one (a write outside the
 * region, into the mutex, past the committed mark, of a width other than 4 or 8) must be
 * refused whole (CORRUPT) and write nothing, while a genuine one still rolls back. */
static void test_journal(void) {
    char name[128], msg[256], id[OBJSTORE_ID_SIZE];
    objstore_t *s = new_damageable(name, sizeof name, 16u << 20);
    if (s == NULL) return;
    os_header_t *h = os_hdr(s);
    id_of(id, 1);
    CHECK_ST(objstore_put(s, id, "abc", 3), OBJSTORE_OK);
    CHECK(h->committed < h->region_size); /* a lazily committed heap: pages past it */
    const uint64_t bad[][2] = {
        {UINT64_MAX - 3, 8},                            /* wraps past the end */
        {h->region_size, 8},                            /* just past the mapping */
        {offsetof(os_header_t, mutex), 8},              /* the lock itself */
        {offsetof(os_header_t, heap_off), 8},           /* the layout */
        {h->committed + 4096, 8},                       /* no file behind it: SIGBUS */
        {offsetof(os_header_t, objects) + 4, 8},        /* misaligned */
        {offsetof(os_header_t, objects), 3},            /* no such width */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        h->undo[0].off = bad[i][0];
        h->undo[0].old = 0x5a5a5a5a5a5a5a5aULL;
        h->undo[0].width = bad[i][1];
        h->undo_count = 1;
        int state = -1;
        CHECK_ST(objstore_contains(s, id, &state), OBJSTORE_E_CORRUPT);
        h->undo_count = 0;
        CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_OK);
    }
    h->undo_count = OS_JOURNAL_CAP + 1;
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
    h->undo_count = 0;
    /* a genuine record: the objects counter as it was before a half-done update */
    uint64_t objects = h->objects;
    h->undo[0].off = offsetof(os_header_t, objects);
    h->undo[0].old = objects;
    h->undo[0].width = 8;
    h->objects = objects + 7;
    h->undo_count = 1;
    objstore_stats_t st;
    CHECK_ST(objstore_stats(s, &st), OBJSTORE_OK);
    CHECK(st.objects == objects && h->undo_count == 0);
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_OK);
    drop_store(s);
}

static void *seal_in_thread(void *arg) {
    objstore_t *s = arg;
    char id[OBJSTORE_ID_SIZE];
    id_of(id, 9);
    objstore_seal(s, id); /* exits at the crash point, holding the lock */
    return NULL;
}

/* A holder that died mid-update (here a thread: OBJSTORE_CRASH_THREAD_EXIT) leaves its
 * journal for the next locker: a genuine one is rolled back; a damaged one is refused,
 * and the lock stays unrecoverable (CORRUPT on every call) rather than half replayed. */
static void test_dead_holder_journal(void) {
    char name[128], msg[256], id[OBJSTORE_ID_SIZE];
    for (int damaged = 0; damaged < 2; damaged++) {
        objstore_t *s = new_damageable(name, sizeof name, 1 << 20);
        if (s == NULL) return;
        void *data;
        id_of(id, 9);
        CHECK_ST(objstore_create(s, id, 100, &data), OBJSTORE_OK);
        objstore_test_crash_point(s, OBJSTORE_CRASH_SEAL, 1, OBJSTORE_CRASH_THREAD_EXIT);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, seal_in_thread, s) == 0);
        pthread_join(t, NULL);
        os_header_t *h = os_hdr(s);
        CHECK(h->undo_count > 0);
        if (damaged) h->undo[0].off = UINT64_MAX - 7; /* far outside the region */
        int state = -1;
        if (!damaged) {
            CHECK_ST(objstore_contains(s, id, &state), OBJSTORE_OK);
            CHECK(state == OBJSTORE_UNSEALED); /* the seal was rolled back */
            CHECK_ST(objstore_seal(s, id), OBJSTORE_OK);
            CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_OK);
            CHECK_ST(objstore_release(s, id), OBJSTORE_OK);
            drop_store(s);
        } else {
            CHECK_ST(objstore_contains(s, id, &state), OBJSTORE_E_CORRUPT);
            CHECK_ST(objstore_contains(s, id, &state), OBJSTORE_E_CORRUPT);
            CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
            objstore_unlink(s);
            objstore_close(s); /* cannot lock: leaves the slot, frees the handle */
        }
    }
}

/* validate walks block headers and free lists: a damaged size or link that points past
 * the committed mark (where the file may have no pages: a read is SIGBUS) is reported,
 * not followed; lookups stop at an index outside the table. */
static void test_heap_and_index(void) {
    char name[128], msg[256], id[OBJSTORE_ID_SIZE];
    objstore_t *s = new_damageable(name, sizeof name, 16u << 20);
    if (s == NULL) return;
    os_header_t *h = os_hdr(s);
    id_of(id, 2);
    CHECK_ST(objstore_put(s, id, "hello", 5), OBJSTORE_OK);
    os_block_t *b = os_block(s, h->heap_off); /* the object's block, first in the heap */
    uint64_t keep = b->size;
    b->size = h->committed + 4096 - h->heap_off; /* the next header lies past the mark */
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
    CHECK(strstr(msg, "committed") != NULL);
    b->size = keep;
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_OK);

    unsigned k = 0;
    while (k < OS_NCLASSES && h->free_head[k] == 0) k++;
    CHECK(k < OS_NCLASSES);
    if (k < OS_NCLASSES) {
        keep = h->free_head[k];
        h->free_head[k] = h->committed + 4096;
        CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
        h->free_head[k] = keep;
    }

    uint32_t *buckets = os_buckets(s);
    uint32_t *saved = malloc(h->nbuckets * sizeof *saved);
    CHECK(saved != NULL);
    if (saved != NULL) {
        memcpy(saved, buckets, h->nbuckets * sizeof *saved);
        for (uint64_t i = 0; i < h->nbuckets; i++) buckets[i] = 0x7ffffff0u; /* outside */
        int state = -1;
        CHECK_ST(objstore_contains(s, id, &state), OBJSTORE_OK);
        CHECK(state == OBJSTORE_ABSENT);
        CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
        memcpy(buckets, saved, h->nbuckets * sizeof *saved);
        free(saved);
    }
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_OK);

    /* Found by the fuzzer on the hardened code: validate walked the free lists from
     * (uint32_t)entry_free, so a head whose high half was damaged passed for OS_NIL, and
     * the next create took entry 0xffffffff. */
    uint64_t keep_free = h->entry_free;
    h->entry_free = 0x1ffffffffULL;
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
    h->entry_free = keep_free;
    keep_free = h->ref_free;
    h->ref_free = 0x1ffffffffULL;
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_E_CORRUPT);
    h->ref_free = keep_free;
    CHECK_ST(validate(s, msg, sizeof msg), OBJSTORE_OK);
    drop_store(s);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s NAME_PREFIX\n", argv[0]);
        return 2;
    }
    prefix = argv[1];
    test_layout();
    test_journal();
    test_dead_holder_journal();
    test_heap_and_index();
    if (failures != 0) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all damaged-region tests passed\n");
    return 0;
}
