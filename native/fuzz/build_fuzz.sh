#!/usr/bin/env bash
# Build the libFuzzer harness of the C object store with AddressSanitizer and UBSan.
#
#   native/fuzz/build_fuzz.sh [OUTPUT]      (default: native/fuzz/build/fuzz_objstore)
#
# Needs clang and libFuzzer's runtime (Debian: clang, libclang-rt-14-dev; .ci/system-deps).
# CC overrides the compiler. The store's sources are compiled into the binary with the
# sanitizers and libFuzzer's coverage instrumentation; see docs/fuzzing.rst to run it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
native=$(dirname "$here")
out=${1:-$here/build/fuzz_objstore}
mkdir -p "$(dirname "$out")"
"${CC:-clang}" -std=c11 -g -O1 -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Wall -Wextra -Wno-unused-parameter -Werror \
    -I"$native" \
    "$here/fuzz_objstore.c" "$here/fuzz_damage.c" \
    "$native/objstore.c" "$native/os_alloc.c" "$native/os_journal.c" "$native/os_region.c" \
    "$native/os_numpy.c" \
    -o "$out" -lrt -lpthread
echo "$out"
