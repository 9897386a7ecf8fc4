/*
 * test_support.c -- what the C unit tests of the object store share (test_support.h):
 * the failure count, the regions' names, stores made and dropped, patterns written and
 * checked, a function run in a forked child.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_support.h"

int failures = 0;
const char *prefix;
const char *fallback_dir;
static int name_counter = 0;

void valid(objstore_t *s, int line) {
    char msg[256];
    objstore_status_t st = objstore_validate(s, msg, sizeof msg);
    if (st != OBJSTORE_OK) {
        fprintf(stderr, "line %d: validate -> %s: %s\n", line, objstore_status_name(st), msg);
        failures++;
    }
}

void make_name(char *out, size_t n) { snprintf(out, n, "%s-%d", prefix, name_counter++); }

void make_id(char id[OBJSTORE_ID_SIZE], unsigned k) {
    memset(id, 0, OBJSTORE_ID_SIZE);
    memcpy(id, &k, sizeof k);
    id[15] = 'x';
}

objstore_t *new_store(char *name, size_t n, uint64_t capacity, uint64_t max_objects) {
    objstore_options_t o = {0};
    o.capacity = capacity;
    o.max_objects = max_objects;
    make_name(name, n);
    objstore_t *s = NULL;
    CHECK_ST(objstore_create_region(name, &o, &s), OBJSTORE_OK);
    return s;
}

void drop_store(objstore_t *s) {
    if (s == NULL) return;
    objstore_unlink(s);
    objstore_close(s);
}

void fill(void *p, uint64_t n, unsigned seed) {
    unsigned char *b = p;
    for (uint64_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 31u + i * 7u);
}

int check_fill(const void *p, uint64_t n, unsigned seed) {
    const unsigned char *b = p;
    for (uint64_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed * 31u + i * 7u)) return 0;
    return 1;
}


/* Run `fn` in a forked child and return its wait status. */
int in_child(void (*fn)(const char *), const char *name) {
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        fn(name);
        _exit(failures == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}
