"""cffi build script of the C object store (out-of-line API mode).

Produces the extension module ``scaler_executor.objstore._objstore`` from the C sources
in this directory.

* ``pip install .`` / ``python setup.py build_ext --inplace``: setup.py names
  ``native/build_objstore.py:ffibuilder`` in ``cffi_modules`` and setuptools compiles it.
* ``python native/build_objstore.py`` (from anywhere): builds in ``native/build/`` and
  copies the module next to ``scaler_executor/objstore/__init__.py``, for development.

The cdef below repeats the declarations of ``objstore.h`` by hand (cffi's parser takes
no preprocessor directives); API mode compiles the generated wrapper against the real
header, so a cdef that drifted from it fails to build instead of misbehaving.
"""

from __future__ import annotations

import os
import shutil
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["objstore.c", "os_alloc.c", "os_journal.c", "os_region.c", "os_numpy.c"]
MODULE = "scaler_executor.objstore._objstore"

CDEF = """
#define OBJSTORE_ID_SIZE 16
#define OBJSTORE_CRASH_EXIT_CODE 86

typedef struct objstore objstore_t;

typedef enum {
    OBJSTORE_OK = 0,
    OBJSTORE_E_INVALID = 1,
    OBJSTORE_E_NOT_FOUND = 2,
    OBJSTORE_E_EXISTS = 3,
    OBJSTORE_E_NOT_SEALED = 4,
    OBJSTORE_E_SEALED = 5,
    OBJSTORE_E_NOT_HELD = 6,
    OBJSTORE_E_FULL = 7,
    OBJSTORE_E_TABLE_FULL = 8,
    OBJSTORE_E_LOCK_TIMEOUT = 9,
    OBJSTORE_E_NO_SPACE = 10,
    OBJSTORE_E_REGION_EXISTS = 11,
    OBJSTORE_E_NO_REGION = 12,
    OBJSTORE_E_BAD_REGION = 13,
    OBJSTORE_E_NO_SLOT = 14,
    OBJSTORE_E_CORRUPT = 15,
    OBJSTORE_E_FORKED = 16,
    OBJSTORE_E_SYSTEM = 17
} objstore_status_t;

typedef enum {
    OBJSTORE_ABSENT = 0,
    OBJSTORE_UNSEALED = 1,
    OBJSTORE_SEALED = 2,
    OBJSTORE_DELETE_PENDING = 3
} objstore_state_t;

typedef enum {
    OBJSTORE_CRASH_NONE = 0,
    OBJSTORE_CRASH_CREATE_AFTER_ALLOC = 1,
    OBJSTORE_CRASH_CREATE_AFTER_INDEX = 2,
    OBJSTORE_CRASH_SEAL = 3,
    OBJSTORE_CRASH_GET_AFTER_INCREF = 4,
    OBJSTORE_CRASH_RELEASE_AFTER_DECREF = 5,
    OBJSTORE_CRASH_FREE_AFTER_UNLINK = 6,
    OBJSTORE_CRASH_DELETE_AFTER_UNINDEX = 7,
    OBJSTORE_CRASH_REAP = 8,
    OBJSTORE_CRASH_GROW = 9,
    OBJSTORE_CRASH_NPOINTS = 10
} objstore_crash_point_t;

typedef enum {
    OBJSTORE_CRASH_EXIT = 0,
    OBJSTORE_CRASH_STOP = 1,
    OBJSTORE_CRASH_THREAD_EXIT = 2
} objstore_crash_action_t;

typedef struct {
    uint64_t capacity;
    uint64_t max_objects;
    uint32_t max_processes;
    uint32_t reserved;
    const char *fallback_dir;
    uint64_t test_shm_avail;
} objstore_options_t;

typedef struct {
    uint64_t capacity;
    uint64_t in_use;
    uint64_t data_bytes;
    uint64_t objects;
    uint64_t sealed;
    uint64_t pending_delete;
    uint64_t free_blocks;
    uint64_t largest_free;
    uint64_t max_objects;
    uint64_t references;
    uint64_t processes;
    uint64_t max_processes;
    uint64_t recoveries;
    uint64_t reaped_processes;
    uint64_t region_size;
    uint64_t file_backed;
    uint64_t committed;
} objstore_stats_t;

typedef struct {
    uint64_t capacity;
    uint64_t in_use;
    uint64_t data_bytes;
    uint64_t objects;
} objstore_usage_t;

objstore_status_t objstore_create_region(const char *name, const objstore_options_t *opts,
                                         objstore_t **out);
objstore_status_t objstore_attach(const char *name, const char *fallback_dir, objstore_t **out);
void objstore_close(objstore_t *s);
objstore_status_t objstore_unlink(objstore_t *s);
objstore_status_t objstore_unlink_name(const char *name, const char *fallback_dir);
const char *objstore_path(const objstore_t *s);
void objstore_mapping(const objstore_t *s, const void **base, uint64_t *size);

objstore_status_t objstore_create(objstore_t *s, const char *id, uint64_t size, void **data);
objstore_status_t objstore_create_bounded(objstore_t *s, const char *id, uint64_t size,
                                          uint64_t limit, void **data);
objstore_status_t objstore_seal(objstore_t *s, const char *id);
objstore_status_t objstore_abort(objstore_t *s, const char *id);
objstore_status_t objstore_put(objstore_t *s, const char *id, const void *data, uint64_t size);
objstore_status_t objstore_get(objstore_t *s, const char *id, const void **data,
                               uint64_t *size);
objstore_status_t objstore_release(objstore_t *s, const char *id);
objstore_status_t objstore_delete(objstore_t *s, const char *id, int *deferred);
objstore_status_t objstore_contains(objstore_t *s, const char *id, int *state);
objstore_status_t objstore_list(objstore_t *s, char *ids, uint64_t max, uint64_t *count);
objstore_status_t objstore_object_at(objstore_t *s, const void *data, char *id, uint64_t *size,
                                     int *state);
objstore_status_t objstore_seal_at(objstore_t *s, const void *data, uint64_t size, char *id);
objstore_status_t objstore_release_at(objstore_t *s, const void *data, uint64_t *size);

typedef enum {
    OBJSTORE_NP_STORE_ALLOCS = 0,
    OBJSTORE_NP_DECLINED = 1,
    OBJSTORE_NP_RELEASED = 2,
    OBJSTORE_NP_LOST = 3,
    OBJSTORE_NP_NSTATS = 4
} objstore_np_stat_t;
objstore_status_t objstore_np_handler(objstore_t *s, uint64_t threshold, uint64_t limit,
                                      const void *fallback, void **handler);
const char *objstore_np_capsule_name(void);
void objstore_np_disable(void *handler);
objstore_status_t objstore_privatize(objstore_t *s);
void objstore_np_stats(const void *handler, uint64_t out[4]);
int objstore_populate_write(void *addr, uint64_t len);

objstore_status_t objstore_stats(objstore_t *s, objstore_stats_t *out);
objstore_status_t objstore_usage(const objstore_t *s, objstore_usage_t *out);
objstore_status_t objstore_reap(objstore_t *s, uint32_t *reaped);
objstore_status_t objstore_validate(objstore_t *s, char *msg, size_t msglen);
void objstore_set_lock_timeout(objstore_t *s, uint32_t ms);
int32_t objstore_last_holder_pid(const objstore_t *s);
int objstore_last_errno(const objstore_t *s);
const char *objstore_status_name(objstore_status_t st);
const char *objstore_status_message(objstore_status_t st);
void objstore_test_crash_point(objstore_t *s, int point, uint32_t countdown, int action);
void objstore_test_set_commit_limit(objstore_t *s, uint64_t bytes);
"""


def _rel(path: str) -> str:
    # setuptools wants source paths relative to the project root (the cwd of a build).
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def make_ffibuilder(relative: bool = True) -> FFI:
    """The FFI builder; setuptools wants relative source paths, cffi's compile() (which
    changes directory to its tmpdir) absolute ones."""
    where = _rel if relative else (lambda path: path)
    builder = FFI()
    builder.cdef(CDEF)
    builder.set_source(
        MODULE,
        '#include "objstore.h"',
        sources=[where(os.path.join(HERE, name)) for name in SOURCES],
        include_dirs=[where(HERE)],
        libraries=["rt", "pthread"],
        extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    )
    return builder


ffibuilder = make_ffibuilder()


def build_inplace() -> str:
    """Compile in native/build and copy the module into the package; return its path."""
    build_dir = os.path.join(HERE, "build")
    os.makedirs(build_dir, exist_ok=True)
    built = make_ffibuilder(relative=False).compile(tmpdir=build_dir, verbose=False)
    target_dir = os.path.join(os.path.dirname(HERE), "scaler_executor", "objstore")
    # The name setuptools gives it (cffi modules use the limited API), so that this script
    # and `pip install -e .` overwrite one file; any other variant could be imported first.
    target = os.path.join(target_dir, "_objstore.abi3.so")
    for name in os.listdir(target_dir):
        if name.startswith("_objstore.") and name.endswith(".so"):
            os.remove(os.path.join(target_dir, name))
    shutil.copy2(built, target)
    return target


if __name__ == "__main__":
    print(build_inplace(), file=sys.stdout)
