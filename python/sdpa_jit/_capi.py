"""sdpa_jit._capi -- the one ctypes mirror of include/sdpa_jit.h.

Everything Python knows about the C ABI lives in this module: the enums,
the versioned structs with their ``*_INIT`` defaults, the prototype of
every exported function, the mapping from ``sdpa_status`` to Python
exception classes, and how the shared library is found and loaded. No
other module declares a ctypes struct or a prototype; they import them
from here.

Extending it when the header changes:

- a new field of a versioned struct: append it to ``_fields_`` in header
  order, bump ``_version_`` to the header's ``*_VERSION`` and, when the
  ``*_INIT`` macro gives it a non-zero value, add it to ``_init_``;
- a new options struct: subclass ``VersionedStruct`` the same way;
- a new function: one line in ``PROTOTYPES``;
- a new status: one member of ``Status`` and, when it deserves its own
  exception class, one entry in ``_ERROR_CLASSES``.

tests/test_cpu_capi.py compiles a small C program against the header and
checks every struct's size, field offsets and ``*_INIT`` values and every
enum value against this module, so a header change that is not mirrored
here fails the tests rather than corrupting memory.

The library is found (``find_library_path``) in this order: the
``SDPA_JIT_LIBRARY`` environment variable (a path to libsdpa_jit.so; when
set it must load, nothing else is tried), then the system's linker search
(``ctypes.util.find_library("sdpa_jit")``), then the standard library
directories (``sys.prefix``/lib, /usr/local/lib, /usr/lib and their
multiarch and lib64 variants). Loading is lazy: importing the package needs
neither the library nor a GPU.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import enum
import os
import sys
import sysconfig
import threading

from ._version import __version__

__all__ = [
    "Status", "Dtype", "Layout", "Mask", "Source", "LogLevel", "CacheAccess", "Family",
    "DqWriter", "Switch",
    "Strides", "LseStrides", "RuntimeOptions", "BwdDesc", "BwdPlanOptions", "BwdPlanInfo",
    "BwdTensors", "CacheEntry", "CacheStats", "LOG_FN", "CACHE_ENTRY_FN", "CACHE_PROBLEM_FN",
    "PROTOTYPES",
    "SdpaError", "LibraryNotFoundError", "InvalidArgumentError",
    "NotSupportedError", "OutOfMemoryError", "CompileFailedError",
    "DriverError", "NoDeviceError", "CacheError", "NotFoundError",
    "NotCompiledError", "DeviceError", "InternalError",
    "LIBRARY_ENV", "library_candidates", "find_library_path", "library",
    "load_library", "check",
]

LIBRARY_ENV = "SDPA_JIT_LIBRARY"
LIBRARY_NAME = "sdpa_jit"

# ------------------------------------------------------------------ enums
# C enums of this ABI are int.
c_enum = ctypes.c_int


class Status(enum.IntEnum):
    """sdpa_status (append-only)."""
    SUCCESS = 0
    INVALID_ARGUMENT = 1
    NOT_SUPPORTED = 2
    OUT_OF_MEMORY = 3
    COMPILE_FAILED = 4
    DRIVER_ERROR = 5
    NO_DEVICE = 6
    CACHE_ERROR = 7
    NOT_FOUND = 8
    NOT_COMPILED = 9
    DEVICE_ERROR = 10
    INTERNAL = 11


class LogLevel(enum.IntEnum):
    """sdpa_log_level."""
    WARNING = 1
    INFO = 2


class Dtype(enum.IntEnum):
    """sdpa_dtype."""
    FP16 = 1
    BF16 = 2


class Layout(enum.IntEnum):
    """sdpa_layout."""
    BSHD = 1
    THD = 2


class Mask(enum.IntEnum):
    """sdpa_mask."""
    NONE = 0
    CAUSAL_TOP_LEFT = 1
    CAUSAL_BOTTOM_RIGHT = 2
    SLIDING_WINDOW = 3


class Source(enum.IntEnum):
    """sdpa_source: where the last sdpa_bwd_compile found the kernel."""
    NONE = 0
    MEMORY = 1
    SHIPPED = 2
    DISK = 3
    COMPILED = 4


class CacheAccess(enum.IntEnum):
    """sdpa_cache_access: how the runtime may use the user's database."""
    READ_WRITE = 0
    READ_ONLY = 1
    READ_WRITE_EXISTING = 2


class Family(enum.IntEnum):
    """sdpa_family: kernel families (a key field)."""
    AUTO = 0
    MMA = 1
    HOPPER = 2


class DqWriter(enum.IntEnum):
    """sdpa_dq_writer: who writes dQ (a key field)."""
    DEFAULT = 0
    CONVERT = 1
    MAIN = 2


class Switch(enum.IntEnum):
    """sdpa_switch: a two-valued plan choice."""
    DEFAULT = 0
    ON = 1
    OFF = 2


# ---------------------------------------------------------------- structs


class Struct(ctypes.Structure):
    """A C struct mirror. ``init(**fields)`` makes one with the header's
    ``*_INIT`` defaults (``_version_`` into ``version``, ``_init_`` for the
    other non-zero defaults) and then the given fields; an unknown field
    name is a TypeError naming the fields that exist. Nested structs may be
    given as tuples."""

    _version_: int | None = None
    _init_: dict = {}

    @classmethod
    def field_names(cls):
        return [f[0] for f in cls._fields_]

    @classmethod
    def init(cls, **fields):
        s = cls()
        if cls._version_ is not None:
            s.version = cls._version_
        for name, value in cls._init_.items():
            setattr(s, name, value)
        s.update(**fields)
        return s

    def update(self, **fields):
        types = dict((f[0], f[1]) for f in self._fields_)
        for name, value in fields.items():
            if name not in types:
                raise TypeError(f"{type(self).__name__} has no field {name!r}; its fields are "
                                f"{', '.join(types)}")
            ftype = types[name]
            if isinstance(value, tuple) and isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
                value = ftype(*value)
            elif isinstance(value, str) and ftype is ctypes.c_char_p:
                value = value.encode()
            setattr(self, name, value)
        return self

    def as_dict(self):
        """The fields as Python values (bytes decoded, nested structs as dicts)."""
        out = {}
        for f in self._fields_:
            value = getattr(self, f[0])
            if isinstance(value, Struct):
                value = value.as_dict()
            elif isinstance(value, bytes):
                value = value.decode(errors="replace")
            out[f[0]] = value
        return out

    def __repr__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"{type(self).__name__}({body})"


class Strides(Struct):
    """sdpa_strides: element strides of [batch, seq, heads, dim]."""
    _fields_ = [("batch", ctypes.c_int64), ("seq", ctypes.c_int64), ("head", ctypes.c_int64)]


class LseStrides(Struct):
    """sdpa_lse_strides: LSE[b, h, s] at b*batch + h*head + s*seq."""
    _fields_ = [("batch", ctypes.c_int64), ("head", ctypes.c_int64), ("seq", ctypes.c_int64)]


# typedef void (*sdpa_log_fn)(sdpa_log_level, const char *message, void *user)
LOG_FN = ctypes.CFUNCTYPE(None, c_enum, ctypes.c_char_p, ctypes.c_void_p)


class RuntimeOptions(Struct):
    """sdpa_runtime_options (SDPA_RUNTIME_OPTIONS_INIT: all zero but version)."""
    _version_ = 2
    _fields_ = [
        ("version", ctypes.c_uint),
        ("cache_path", ctypes.c_char_p),
        ("readonly_cache_paths", ctypes.POINTER(ctypes.c_char_p)),
        ("readonly_cache_count", ctypes.c_size_t),
        ("disable_disk_cache", ctypes.c_int),
        ("cache_max_bytes", ctypes.c_int64),
        ("arch", ctypes.c_int),
        ("log", LOG_FN),
        ("log_user", ctypes.c_void_p),
        # version 2
        ("cache_access", c_enum),
        ("cache_required", ctypes.c_int),
        ("cache_key_file", ctypes.c_char_p),
    ]


class BwdDesc(Struct):
    """sdpa_bwd_desc (SDPA_BWD_DESC_INIT: window_left = window_right = -1)."""
    _version_ = 1
    _init_ = {"window_left": -1, "window_right": -1}
    _fields_ = [
        ("version", ctypes.c_uint),
        ("dtype", c_enum),
        ("layout", c_enum),
        ("batch", ctypes.c_int),
        ("heads_q", ctypes.c_int),
        ("heads_kv", ctypes.c_int),
        ("seqlen_q", ctypes.c_int),
        ("seqlen_kv", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("head_dim_v", ctypes.c_int),
        ("q", Strides), ("k", Strides), ("v", Strides), ("o", Strides),
        ("dout", Strides), ("dq", Strides), ("dk", Strides), ("dv", Strides),
        ("lse", LseStrides),
        ("max_total_q", ctypes.c_int64),
        ("max_total_kv", ctypes.c_int64),
        ("mask", c_enum),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("deterministic", ctypes.c_int),
        ("arch", ctypes.c_int),
    ]


class BwdPlanOptions(Struct):
    """sdpa_bwd_plan_options: tuning and testing choices beyond the
    descriptor (SDPA_BWD_PLAN_OPTIONS_INIT: all zero, "the runtime's
    default", but version)."""
    _version_ = 5
    _fields_ = [
        ("version", ctypes.c_uint),
        ("family", c_enum),
        ("q_tile", ctypes.c_int), ("kv_tile", ctypes.c_int),
        ("warps", ctypes.c_int), ("stages", ctypes.c_int),
        ("dq_writer", c_enum),
        ("small_grid", c_enum),
        ("graphs", c_enum),
        ("order_group", ctypes.c_int),
        ("config_arch", ctypes.c_int),
        # version 2
        ("any_head_dim", c_enum),
        # version 3
        ("head_chunks", ctypes.c_int),
        # version 4
        ("tail_split", ctypes.c_int),
        # version 5
        ("longest_first", c_enum),
    ]


class BwdPlanInfo(Struct):
    """sdpa_bwd_plan_info: what a plan chose and what its last compile did
    (strings owned by the plan)."""
    _version_ = 1
    _fields_ = [
        ("version", ctypes.c_uint),
        ("family", c_enum),
        ("family_reason", ctypes.c_char_p),
        ("q_tile", ctypes.c_int), ("kv_tile", ctypes.c_int),
        ("warps", ctypes.c_int), ("stages", ctypes.c_int),
        ("smem_bytes", ctypes.c_int),
        ("dq_writer", c_enum),
        ("graphs", ctypes.c_int),
        ("source", c_enum),
        ("stored", ctypes.c_int),
    ]


class BwdTensors(Struct):
    """sdpa_bwd_tensors: device pointers (as integers) and THD totals."""
    _version_ = 1
    _fields_ = [
        ("version", ctypes.c_uint),
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p), ("dout", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_kv", ctypes.c_void_p),
        ("total_q", ctypes.c_int64), ("total_kv", ctypes.c_int64),
    ]


class CacheEntry(Struct):
    """sdpa_cache_entry: one cache row (strings owned by the C array)."""
    _fields_ = [
        ("key_hash", ctypes.c_char * 33),
        ("key_text", ctypes.c_char_p),
        ("arch", ctypes.c_int),
        ("dtype", ctypes.c_char_p),
        ("head_dim", ctypes.c_int), ("head_dim_v", ctypes.c_int),
        ("q_tile", ctypes.c_int), ("kv_tile", ctypes.c_int),
        ("warps", ctypes.c_int), ("stages", ctypes.c_int),
        ("mask", ctypes.c_char_p),
        ("layout", ctypes.c_char_p),
        ("nvrtc_version", ctypes.c_char_p),
        ("cubin_bytes", ctypes.c_int64),
        ("compile_ms", ctypes.c_double),
        ("created", ctypes.c_int64), ("last_used", ctypes.c_int64),
        ("hits", ctypes.c_int64),
        ("readonly", ctypes.c_int),
        # the second cache layout's key fields (NULL / -1 on older rows)
        ("family", ctypes.c_char_p),
        ("lse", ctypes.c_char_p),
        ("deterministic", ctypes.c_int),
        ("even", ctypes.c_int),
        ("dq", ctypes.c_char_p),
    ]


class CacheStats(Struct):
    """sdpa_cache_stats."""
    _fields_ = [
        ("entries", ctypes.c_int64),
        ("cubin_bytes", ctypes.c_int64),
        ("file_bytes", ctypes.c_int64),
        ("hits", ctypes.c_int64),
        ("compile_ms_total", ctypes.c_double),
        ("readonly_entries", ctypes.c_int64),
    ]


# typedef int (*sdpa_cache_entry_fn)(const sdpa_cache_entry *, void *user)
CACHE_ENTRY_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(CacheEntry), ctypes.c_void_p)
# typedef void (*sdpa_cache_problem_fn)(key_hash, key_text, problem, removed, user)
CACHE_PROBLEM_FN = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                    ctypes.c_void_p)

# ------------------------------------------------------------- prototypes
_p = ctypes.POINTER
_vp = ctypes.c_void_p

# name: (restype, argtypes). Opaque handles (sdpa_runtime *, sdpa_bwd_plan *)
# travel as void pointers (Python ints).
PROTOTYPES = {
    "sdpa_status_name": (ctypes.c_char_p, [c_enum]),
    "sdpa_last_error": (ctypes.c_char_p, []),
    "sdpa_version": (ctypes.c_char_p, []),
    "sdpa_runtime_options_init": (c_enum, [_p(RuntimeOptions), ctypes.c_uint]),
    "sdpa_runtime_create": (c_enum, [_p(_vp), _p(RuntimeOptions)]),
    "sdpa_runtime_destroy": (None, [_vp]),
    "sdpa_runtime_cache_path": (ctypes.c_char_p, [_vp]),
    "sdpa_cache_default_location": (ctypes.c_char_p, [ctypes.c_char_p, ctypes.c_size_t]),
    "sdpa_runtime_arch": (ctypes.c_int, [_vp]),
    "sdpa_bwd_plan_create": (c_enum, [_p(_vp), _vp, _p(BwdDesc)]),
    "sdpa_bwd_plan_create_with": (c_enum, [_p(_vp), _vp, _p(BwdDesc), _p(BwdPlanOptions)]),
    "sdpa_bwd_plan_query": (c_enum, [_vp, _p(BwdPlanInfo)]),
    "sdpa_bwd_plan_destroy": (None, [_vp]),
    "sdpa_bwd_workspace_size": (ctypes.c_size_t, [_vp]),
    "sdpa_bwd_plan_key": (ctypes.c_char_p, [_vp]),
    "sdpa_bwd_plan_key_hash": (ctypes.c_char_p, [_vp]),
    "sdpa_bwd_compile": (c_enum, [_vp, _p(c_enum)]),
    "sdpa_bwd_plan_compile_log": (ctypes.c_char_p, [_vp]),
    "sdpa_bwd_execute": (c_enum, [_vp, _p(BwdTensors), _vp, ctypes.c_size_t, _vp]),
    "sdpa_bwd_sync_check": (c_enum, [_vp, _vp]),
    "sdpa_cache_foreach": (c_enum, [_vp, CACHE_ENTRY_FN, _vp]),
    "sdpa_cache_list": (c_enum, [_vp, _p(_p(CacheEntry)), _p(ctypes.c_size_t)]),
    "sdpa_cache_entries_free": (None, [_p(CacheEntry), ctypes.c_size_t]),
    "sdpa_cache_get": (c_enum, [_vp, ctypes.c_char_p, _p(_p(CacheEntry))]),
    "sdpa_cache_get_cubin": (c_enum, [_vp, ctypes.c_char_p, _p(_vp), _p(ctypes.c_size_t)]),
    "sdpa_free": (None, [_vp]),
    "sdpa_cache_stats_get": (c_enum, [_vp, _p(CacheStats)]),
    "sdpa_cache_verify_report": (c_enum, [_vp, CACHE_PROBLEM_FN, _vp, _p(ctypes.c_int64),
                                          _p(ctypes.c_int64)]),
    "sdpa_cache_verify": (c_enum, [_vp, _p(ctypes.c_int64), _p(ctypes.c_int64)]),
    "sdpa_cache_prune": (c_enum, [_vp, ctypes.c_int64, ctypes.c_int64, _p(ctypes.c_int64)]),
}

# ----------------------------------------------------------------- errors


class SdpaError(RuntimeError):
    """A failing sdpa-jit call. ``status`` (a Status), ``status_name``
    ("SDPA_STATUS_INVALID_ARGUMENT"), ``message`` (sdpa_last_error(): names
    the field and what is allowed), ``call`` (what was being done) and, for
    compile failures, ``log`` (NVRTC's log)."""

    def __init__(self, status, message, call="", status_name=None, log=""):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.status_name = status_name or (f"SDPA_STATUS_{status.name}" if isinstance(status, Status)
                                           else "SDPA_STATUS_UNKNOWN")
        self.message = message
        self.call = call
        self.log = log
        super().__init__(str(self))

    def __str__(self):
        text = f"{self.call}: {self.status_name}: {self.message}" if self.call else \
            f"{self.status_name}: {self.message}"
        if self.log:
            text += "\nNVRTC log:\n" + self.log
        return text

    def __reduce__(self):
        return (type(self), (self.status, self.message, self.call, self.status_name, self.log))


class LibraryNotFoundError(ImportError):
    """libsdpa_jit.so could not be found or loaded (says where it looked)."""


class InvalidArgumentError(SdpaError, ValueError):
    """SDPA_STATUS_INVALID_ARGUMENT: a field or argument is out of range."""


class NotSupportedError(SdpaError, ValueError):
    """SDPA_STATUS_NOT_SUPPORTED: valid, but not on this arch or build."""


class OutOfMemoryError(SdpaError, MemoryError):
    """SDPA_STATUS_OUT_OF_MEMORY."""


class CompileFailedError(SdpaError):
    """SDPA_STATUS_COMPILE_FAILED: NVRTC rejected the kernel (see ``log``)."""


class DriverError(SdpaError):
    """SDPA_STATUS_DRIVER_ERROR: a CUDA driver call failed."""


class NoDeviceError(SdpaError):
    """SDPA_STATUS_NO_DEVICE: no CUDA driver or device available."""


class CacheError(SdpaError):
    """SDPA_STATUS_CACHE_ERROR: the cache could not be read or written."""


class NotFoundError(SdpaError, LookupError):
    """SDPA_STATUS_NOT_FOUND: no such cache entry."""


class NotCompiledError(SdpaError):
    """SDPA_STATUS_NOT_COMPILED: the plan's kernels are not loaded in the
    current CUDA context."""


class DeviceError(SdpaError):
    """SDPA_STATUS_DEVICE_ERROR: a kernel reported bad input."""


class InternalError(SdpaError):
    """SDPA_STATUS_INTERNAL: a bug in sdpa-jit."""


_ERROR_CLASSES = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.NOT_SUPPORTED: NotSupportedError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.COMPILE_FAILED: CompileFailedError,
    Status.DRIVER_ERROR: DriverError,
    Status.NO_DEVICE: NoDeviceError,
    Status.CACHE_ERROR: CacheError,
    Status.NOT_FOUND: NotFoundError,
    Status.NOT_COMPILED: NotCompiledError,
    Status.DEVICE_ERROR: DeviceError,
    Status.INTERNAL: InternalError,
}


def error_for(lib, status, call, log=""):
    """The exception for a failed call: right after the call, on the same
    thread (sdpa_last_error is thread-local)."""
    message = lib.sdpa_last_error().decode(errors="replace")
    name = lib.sdpa_status_name(status).decode()
    cls = _ERROR_CLASSES.get(status, SdpaError)
    return cls(status, message, call, name, log)


def check(status, call, lib=None):
    """Raises the matching SdpaError subclass unless status is SUCCESS."""
    if status != 0:
        raise error_for(lib or library(), status, call)


# ------------------------------------------------------------ the library


def _standard_dirs():
    """Directories an installed libsdpa_jit.so is looked for in, in order."""
    dirs = []
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for prefix in (sys.prefix, sys.base_prefix, "/usr/local", "/usr"):
        for sub in ("lib", "lib64", os.path.join("lib", multiarch) if multiarch else None):
            if sub:
                d = os.path.join(prefix, sub)
                if d not in dirs:
                    dirs.append(d)
    return dirs


_FILE_NAMES = ("libsdpa_jit.so", "libsdpa_jit.so.0", "libsdpa_jit.dylib")


def library_candidates(environ=None, find_library=None, dirs=None):
    """Where the library is looked for, in order: a list of (origin, path)
    with origin "SDPA_JIT_LIBRARY", "find_library" or "directory".
    ``environ``, ``find_library`` and ``dirs`` default to the process's
    (tests pass their own)."""
    environ = os.environ if environ is None else environ
    find_library = ctypes.util.find_library if find_library is None else find_library
    dirs = _standard_dirs() if dirs is None else dirs
    explicit = environ.get(LIBRARY_ENV)
    if explicit:
        return [(LIBRARY_ENV, explicit)]
    out = []
    found = find_library(LIBRARY_NAME)
    if found:
        out.append(("find_library", found))
    for d in dirs:
        for name in _FILE_NAMES:
            path = os.path.join(d, name)
            if os.path.exists(path):
                out.append(("directory", path))
    return out


def find_library_path(environ=None, find_library=None, dirs=None):
    """The (origin, path) the library is loaded from (see library_candidates).
    Raises LibraryNotFoundError naming the places searched when there is none,
    or when SDPA_JIT_LIBRARY names a file that does not exist."""
    environ = os.environ if environ is None else environ
    candidates = library_candidates(environ, find_library, dirs)
    explicit = environ.get(LIBRARY_ENV)
    if explicit:
        if not os.path.exists(explicit):
            raise LibraryNotFoundError(
                f"{LIBRARY_ENV}={explicit!r} does not exist: set it to the path of "
                f"libsdpa_jit.so (e.g. build/libsdpa_jit.so), or unset it to use the installed library")
        return candidates[0]
    if not candidates:
        searched = ", ".join(_standard_dirs() if dirs is None else dirs)
        raise LibraryNotFoundError(
            f"libsdpa_jit.so not found: set {LIBRARY_ENV} to its path (e.g. build/libsdpa_jit.so), "
            f"or install the library (cmake --install build); searched the linker's path "
            f"(ctypes.util.find_library('{LIBRARY_NAME}')) and {searched}")
    return candidates[0]


def _bind(lib):
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise LibraryNotFoundError(
                f"{getattr(lib, '_name', 'the library')} does not export {name}: it is not "
                f"libsdpa_jit or it is older than this package") from e
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def load_library(path=None):
    """Loads libsdpa_jit from `path` (None: find_library_path()) and binds
    every prototype. Returns the ctypes.CDLL, with ``origin`` and ``path``
    attributes saying where it came from."""
    origin = "argument"
    if path is None:
        origin, path = find_library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        hint = f" (from {LIBRARY_ENV})" if origin == LIBRARY_ENV else f" (found by {origin})"
        raise LibraryNotFoundError(f"could not load {path}{hint}: {e}") from e
    _bind(lib)
    version = lib.sdpa_version().decode()
    if version.split(".")[:2] != __version__.split(".")[:2]:
        raise LibraryNotFoundError(
            f"{path} is libsdpa_jit {version}, but this package (sdpa_jit {__version__}) mirrors "
            f"the {'.'.join(__version__.split('.')[:2])} C API: point {LIBRARY_ENV} at a matching build")
    lib.origin = origin
    lib.path = path
    lib.version = version
    return lib


_lock = threading.Lock()
_library = None


def library():
    """The process's libsdpa_jit (loaded on first use, then the same one)."""
    global _library
    lib = _library
    if lib is None:
        with _lock:
            if _library is None:
                _library = load_library()
            lib = _library
    return lib
