# Stub of the cffi extension built from native/build_objstore.py: cffi objects are
# dynamic, so both are Any (the C API is documented in native/objstore.h).
from typing import Any

ffi: Any
lib: Any
