/*
 * test_objstore_commit.c -- C unit tests of the object store's lazy commitment (a region
 * commits memory as objects need it), growth under a crash, and large puts copied by
 * several threads; run from test_objstore.c's main.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_support.h"

/* ---------------------------------------------------------------- lazy commitment */

#define MiB (1ULL << 20)

static uint64_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

static uint64_t committed_of(objstore_t *s) {
    objstore_stats_t st;
    CHECK_ST(objstore_stats(s, &st), OBJSTORE_OK);
    return st.committed;
}

/* A 256 MiB store commits its tables and a 4 MiB first step; objects beyond grow it, from
 * whichever handle allocates, and every mapping (another handle, a forked child) reads
 * the new pages. Freed memory is reused before the mark grows again. */
static void child_reads_big(const char *name) {
    objstore_t *c = NULL;
    CHECK_ST(objstore_attach(name, NULL, &c), OBJSTORE_OK);
    if (c == NULL) return;
    char id[16];
    const void *r;
    uint64_t size;
    for (unsigned k = 1; k <= 2; k++) {
        make_id(id, k);
        CHECK_ST(objstore_get(c, id, &r, &size), OBJSTORE_OK);
        CHECK(size == 100 * MiB && check_fill(r, size, k));
        CHECK_ST(objstore_release(c, id), OBJSTORE_OK);
    }
    objstore_close(c);
}

void test_lazy_commit(void) {
    char name[256], id[16];
    objstore_t *s = new_store(name, sizeof name, 256 * MiB, 0);
    if (s == NULL) return;
    objstore_stats_t st;
    CHECK_ST(objstore_stats(s, &st), OBJSTORE_OK);
    uint64_t heap_off = st.region_size - st.capacity;
    CHECK(st.capacity == 256 * MiB);
    CHECK(st.committed == ((heap_off + 4 * MiB + 4095) & ~4095ULL));
    CHECK(file_size(objstore_path(s)) == st.committed);
    uint64_t first = st.committed;
    /* created by s: grows past the first step */
    void *w;
    make_id(id, 1);
    CHECK_ST(objstore_create(s, id, 100 * MiB, &w), OBJSTORE_OK);
    fill(w, 100 * MiB, 1);
    CHECK_ST(objstore_seal(s, id), OBJSTORE_OK);
    CHECK_ST(objstore_release(s, id), OBJSTORE_OK);
    uint64_t grown = committed_of(s);
    CHECK(grown > first && grown >= heap_off + 100 * MiB + 128 && grown < st.region_size);
    CHECK(file_size(objstore_path(s)) == grown);
    VALID(s);
    /* created through another mapping (another handle): grows again; s reads it */
    objstore_t *t = NULL;
    CHECK_ST(objstore_attach(name, NULL, &t), OBJSTORE_OK);
    if (t != NULL) {
        make_id(id, 2);
        CHECK_ST(objstore_create(t, id, 100 * MiB, &w), OBJSTORE_OK);
        fill(w, 100 * MiB, 2);
        CHECK_ST(objstore_seal(t, id), OBJSTORE_OK);
        CHECK_ST(objstore_release(t, id), OBJSTORE_OK);
        const void *r;
        uint64_t size;
        CHECK_ST(objstore_get(s, id, &r, &size), OBJSTORE_OK);
        CHECK(size == 100 * MiB && check_fill(r, size, 2));
        CHECK_ST(objstore_release(s, id), OBJSTORE_OK);
        CHECK(committed_of(s) > grown);
        objstore_close(t);
    }
    int status = in_child(child_reads_big, name);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* freed memory is taken again before the mark moves */
    uint64_t mark = committed_of(s);
    make_id(id, 1);
    CHECK_ST(objstore_delete(s, id, NULL), OBJSTORE_OK);
    make_id(id, 3);
    CHECK_ST(objstore_create(s, id, 90 * MiB, &w), OBJSTORE_OK);
    fill(w, 90 * MiB, 3);
    CHECK_ST(objstore_abort(s, id), OBJSTORE_OK);
    for (unsigned k = 10; k < 40; k++) { /* small ones */
        make_id(id, k);
        CHECK_ST(objstore_put(s, id, "small", 5), OBJSTORE_OK);
    }
    CHECK(committed_of(s) == mark);
    VALID(s);
    drop_store(s);
}

/* /dev/shm full (the test limit): a commitment of a whole step that does not fit is
 * retried with just what is needed; one that cannot fit is FULL with ENOSPC, and the
 * store keeps serving from its committed memory. */
void test_commit_limit(void) {
    char name[256], id[16];
    objstore_t *s = new_store(name, sizeof name, 256 * MiB, 0);
    if (s == NULL) return;
    uint64_t first = committed_of(s);
    objstore_test_set_commit_limit(s, first + 8 * MiB);
    void *w;
    unsigned made = 0;
    objstore_status_t st = OBJSTORE_OK;
    for (unsigned k = 1; k < 200 && st == OBJSTORE_OK; k++) {
        make_id(id, k);
        st = objstore_create(s, id, 1 * MiB, &w);
        if (st == OBJSTORE_OK) {
            fill(w, 1 * MiB, k); /* would be SIGBUS past the file's end */
            CHECK_ST(objstore_seal(s, id), OBJSTORE_OK);
            CHECK_ST(objstore_release(s, id), OBJSTORE_OK);
            made++;
        }
    }
    CHECK(st == OBJSTORE_E_FULL);
    CHECK(objstore_last_errno(s) == ENOSPC);
    CHECK(made >= 10 && made <= 12); /* 4 MiB + 8 MiB of 1 MiB objects (+ headers) */
    uint64_t mark = committed_of(s);
    CHECK(mark > first && mark <= first + 8 * MiB && mark % 4096 == 0);
    CHECK(file_size(objstore_path(s)) == mark);
    VALID(s);
    /* usable: small objects still fit in committed gaps; a freed one is reused */
    make_id(id, 1);
    CHECK_ST(objstore_delete(s, id, NULL), OBJSTORE_OK);
    make_id(id, 500);
    CHECK_ST(objstore_create(s, id, 1 * MiB, &w), OBJSTORE_OK);
    CHECK(objstore_last_errno(s) == 0);
    fill(w, 1 * MiB, 500);
    CHECK_ST(objstore_seal(s, id), OBJSTORE_OK);
    CHECK_ST(objstore_release(s, id), OBJSTORE_OK);
    make_id(id, 501);
    CHECK_ST(objstore_create(s, id, 4 * MiB, &w), OBJSTORE_E_FULL);
    /* room again: the store grows */
    objstore_test_set_commit_limit(s, 0);
    CHECK_ST(objstore_create(s, id, 4 * MiB, &w), OBJSTORE_OK);
    fill(w, 4 * MiB, 501);
    CHECK_ST(objstore_abort(s, id), OBJSTORE_OK);
    CHECK(committed_of(s) > mark);
    VALID(s);
    drop_store(s);
    /* creation checks room only for the first step: a 1 GiB store needs ~70 MiB free */
    objstore_options_t o = {0};
    o.capacity = 1024 * MiB;
    o.test_shm_avail = 100 * MiB;
    make_name(name, sizeof name);
    s = NULL;
    CHECK_ST(objstore_create_region(name, &o, &s), OBJSTORE_OK);
    if (s != NULL) {
        CHECK(committed_of(s) < 100 * MiB);
        drop_store(s);
    }
    o.test_shm_avail = 16 * MiB;
    s = NULL;
    CHECK_ST(objstore_create_region(name, &o, &s), OBJSTORE_E_NO_SPACE);
    CHECK(s == NULL);
}

/* Crash while committing: between the fallocate and the commit of the new mark (rolled
 * back: the old mark stays, the longer file is harmless); and in a create after the
 * commitment was committed (the create is rolled back, the commitment kept). */
static int grow_crash_point;

static void child_grows_and_crashes(const char *name) {
    objstore_t *c = NULL;
    if (objstore_attach(name, NULL, &c) != OBJSTORE_OK) _exit(2);
    char id[16];
    void *w;
    make_id(id, 77);
    objstore_test_crash_point(c, grow_crash_point, 1, OBJSTORE_CRASH_EXIT);
    objstore_create(c, id, 100 * MiB, &w);
    _exit(3);
}

void test_grow_crash(void) {
    int points[2] = {OBJSTORE_CRASH_GROW, OBJSTORE_CRASH_CREATE_AFTER_ALLOC};
    for (int i = 0; i < 2; i++) {
        char name[256], id[16];
        objstore_t *s = new_store(name, sizeof name, 256 * MiB, 0);
        if (s == NULL) return;
        make_id(id, 1);
        CHECK_ST(objstore_put(s, id, "kept", 4), OBJSTORE_OK);
        objstore_stats_t before, after;
        CHECK_ST(objstore_stats(s, &before), OBJSTORE_OK);
        grow_crash_point = points[i];
        int status = in_child(child_grows_and_crashes, name);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == OBJSTORE_CRASH_EXIT_CODE);
        VALID(s); /* recovers */
        CHECK_ST(objstore_stats(s, &after), OBJSTORE_OK);
        CHECK(after.recoveries == 1 && after.objects == 1 && after.in_use == before.in_use);
        CHECK(file_size(objstore_path(s)) > before.committed); /* the child's fallocate */
        if (points[i] == OBJSTORE_CRASH_GROW) CHECK(after.committed == before.committed);
        else CHECK(after.committed > before.committed);
        uint32_t reaped = 0;
        CHECK_ST(objstore_reap(s, &reaped), OBJSTORE_OK);
        CHECK(reaped == 1);
        void *w;
        make_id(id, 2);
        CHECK_ST(objstore_create(s, id, 150 * MiB, &w), OBJSTORE_OK);
        fill(w, 150 * MiB, 2);
        CHECK_ST(objstore_seal(s, id), OBJSTORE_OK);
        CHECK_ST(objstore_release(s, id), OBJSTORE_OK);
        CHECK(file_size(objstore_path(s)) == committed_of(s));
        VALID(s);
        drop_store(s);
    }
}

/* Byte i encodes i itself (a byte of it, chosen by i mod 4), so a slice copied to the
 * wrong place, or twice, or not at all, fails the check; fill() repeats every 256 bytes. */
static unsigned char position_byte(uint64_t i, unsigned seed) {
    return (unsigned char)((i >> ((i & 3u) * 8u)) ^ seed);
}

/* Large puts are copied by several threads (os_copy): every byte lands where it belongs,
 * for sizes below, at and past the parallel threshold, odd sizes, an unaligned source. */
void test_large_put(void) {
    char name[256], id[16];
    objstore_t *s = new_store(name, sizeof name, 96 * MiB, 0);
    if (s == NULL) return;
    const uint64_t sizes[] = {8 * MiB - 1, 8 * MiB, 8 * MiB + 4096 + 3, 33 * MiB + 5};
    unsigned char *src = malloc(33 * MiB + 6);
    CHECK(src != NULL);
    if (src == NULL) {
        drop_store(s);
        return;
    }
    for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t n = sizes[k];
        unsigned char *from = src + (k & 1u); /* odd source addresses too */
        for (uint64_t i = 0; i < n; i++) from[i] = position_byte(i, k);
        make_id(id, 900 + k);
        CHECK_ST(objstore_put(s, id, from, n), OBJSTORE_OK);
        const void *r;
        uint64_t size = 0;
        CHECK_ST(objstore_get(s, id, &r, &size), OBJSTORE_OK);
        CHECK(size == n);
        uint64_t bad = 0;
        for (uint64_t i = 0; i < size; i++) bad += ((const unsigned char *)r)[i] != position_byte(i, k);
        CHECK(bad == 0);
        CHECK_ST(objstore_release(s, id), OBJSTORE_OK);
        CHECK_ST(objstore_delete(s, id, NULL), OBJSTORE_OK);
    }
    free(src);
    VALID(s);
    drop_store(s);
}
