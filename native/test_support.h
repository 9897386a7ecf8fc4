/*
 * test_support.h -- what the C unit tests of the object store share (test_objstore.c
 * and test_objstore_commit.c, built into one program, and test_damage.c, by
 * tests/objstore/test_c_unit.py).
 */
#ifndef TEST_SUPPORT_H
#define TEST_SUPPORT_H

#include <stdint.h>
#include <stdio.h>

#include "objstore.h"

extern int failures;             /* checks failed so far */
extern const char *prefix;       /* every region made is named prefix-<n> */
extern const char *fallback_dir; /* where file-backed regions go */

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                      \
        }                                                                    \
    } while (0)

#define CHECK_ST(expr, want)                                                       \
    do {                                                                           \
        objstore_status_t st_ = (expr);                                            \
        if (st_ != (want)) {                                                       \
            fprintf(stderr, "%s:%d: %s -> %s, want %s\n", __FILE__, __LINE__, #expr, \
                    objstore_status_name(st_), objstore_status_name(want));        \
            failures++;                                                            \
        }                                                                          \
    } while (0)

void valid(objstore_t *s, int line);
#define VALID(s) valid((s), __LINE__)

void make_name(char *out, size_t n);
void make_id(char id[OBJSTORE_ID_SIZE], unsigned k);
objstore_t *new_store(char *name, size_t n, uint64_t capacity, uint64_t max_objects);
void drop_store(objstore_t *s);
void fill(void *p, uint64_t n, unsigned seed);
int check_fill(const void *p, uint64_t n, unsigned seed);
/* Run `fn` in a forked child and return its wait status. */
int in_child(void (*fn)(const char *), const char *name);

/* test_objstore_commit.c */
void test_lazy_commit(void);
void test_commit_limit(void);
void test_grow_crash(void);
void test_large_put(void);

#endif
