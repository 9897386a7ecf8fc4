/*
 * os_journal.c -- the undo journal that makes every update under the region lock atomic
 * with respect to a holder dying.
 *
 * Why undo (roll back) rather than redo: the dead process never returned from the call,
 * so nobody was told the update happened; undoing it is always correct. The only state a
 * dead process leaves that must be rolled *forward* is its slot and references, and
 * objstore_reap does that as separate, idempotent updates.
 *
 * Ordering: a process that dies stops at an instruction boundary, and stores it retired
 * become visible to the next lock holder (the kernel's robust-futex hand-off orders
 * them). So only the compiler's order matters: a signal fence keeps "log the old value"
 * before "write the new one".
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "os_internal.h"

#define OS_FENCE() __atomic_signal_fence(__ATOMIC_SEQ_CST)

static void os_log(objstore_t *s, void *p, uint64_t old, uint64_t width) {
    os_header_t *h = os_hdr(s);
    uint64_t n = h->undo_count;
    if (n >= OS_JOURNAL_CAP) {
        /* A bug, not a runtime condition: every update writes a bounded number of words
         * (OS_JOURNAL_CAP has a 6x margin). Continuing would make the update unrecoverable. */
        abort();
    }
    h->undo[n].off = (uint64_t)((char *)p - s->base);
    h->undo[n].old = old;
    h->undo[n].width = width;
    OS_FENCE();
    h->undo_count = n + 1;
    OS_FENCE();
}

void os_j64(objstore_t *s, uint64_t *p, uint64_t v) {
    os_log(s, p, *p, 8);
    *p = v;
}

void os_j32(objstore_t *s, uint32_t *p, uint32_t v) {
    os_log(s, p, *p, 4);
    *p = v;
}

void os_begin(objstore_t *s, int op, const char *id) {
    os_header_t *h = os_hdr(s);
    /* The journal is empty here: os_lock recovered any leftover. */
    h->intent_op = (uint64_t)op;
    h->intent_pid = s->pid;
    if (id != NULL) memcpy(h->intent_id, id, OBJSTORE_ID_SIZE);
    else memset(h->intent_id, 0, OBJSTORE_ID_SIZE);
    OS_FENCE();
}

void os_commit(objstore_t *s) {
    os_header_t *h = os_hdr(s);
    OS_FENCE();
    h->undo_count = 0; /* the commit point: one aligned word */
    OS_FENCE();
    h->intent_op = OS_OP_NONE;
}

/* Whether undo record u can be one the library wrote: a 4- or 8-byte aligned word among
 * the header's journaled fields (free_head .. committed) or in the tables and heap below
 * the committed mark (`limit`). */
static int os_undo_ok(const objstore_t *s, const os_undo_t *u, uint64_t limit) {
    const os_header_t *h = os_hdr(s);
    uint64_t lo = offsetof(os_header_t, free_head), hi = offsetof(os_header_t, undo);
    if ((u->width != 4 && u->width != 8) || u->off % u->width != 0) return 0;
    if (u->off >= lo && u->off <= hi - u->width) return 1;
    return u->off >= h->slots_off && u->off < limit && u->width <= limit - u->off;
}

/* Undo the journaled writes, newest first. Idempotent: if the process doing it dies too,
 * the next one replays the same log to the same result.
 *
 * The log lives in shared memory that another process may have damaged, so it is checked
 * whole before anything is written: the region's layout must add up and every record
 * must name a word the library journals (os_undo_ok), below both the committed mark and
 * the end of the file (a write past it would be SIGBUS). A log that fails is not replayed
 * at all (half of it would be worse): returns -1 and the caller reports CORRUPT; else 0. */
int os_rollback(objstore_t *s) {
    os_header_t *h = os_hdr(s);
    uint64_t n = h->undo_count;
    struct stat sb;
    if (n > OS_JOURNAL_CAP || !os_layout_ok(h, s->size) || h->committed > s->size ||
        fstat(s->fd, &sb) != 0)
        return -1;
    uint64_t limit = h->committed < (uint64_t)sb.st_size ? h->committed : (uint64_t)sb.st_size;
    for (uint64_t i = 0; i < n; i++)
        if (!os_undo_ok(s, &h->undo[i], limit)) return -1;
    while (n > 0) {
        os_undo_t *u = &h->undo[--n];
        if (u->width == 8) *(uint64_t *)(s->base + u->off) = u->old;
        else *(uint32_t *)(s->base + u->off) = (uint32_t)u->old;
    }
    OS_FENCE();
    h->undo_count = 0;
    OS_FENCE();
    h->intent_op = OS_OP_NONE;
    return 0;
}

void os_crash(objstore_t *s, int point) {
    if (s->crash_point == OBJSTORE_CRASH_NONE || s->crash_point != point) return;
    if (s->crash_countdown > 1) {
        s->crash_countdown--;
        return;
    }
    s->crash_point = OBJSTORE_CRASH_NONE;
    if (s->crash_action == OBJSTORE_CRASH_STOP) {
        raise(SIGSTOP);
        return;
    }
    if (s->crash_action == OBJSTORE_CRASH_THREAD_EXIT) pthread_exit(NULL);
    _exit(OBJSTORE_CRASH_EXIT_CODE);
}

void objstore_test_crash_point(objstore_t *s, int point, uint32_t countdown, int action) {
    if (s == NULL) return;
    s->crash_point = (point > 0 && point < OBJSTORE_CRASH_NPOINTS) ? point : OBJSTORE_CRASH_NONE;
    s->crash_countdown = countdown == 0 ? 1 : countdown;
    s->crash_action = action;
}
