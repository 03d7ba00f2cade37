"""sdpa_jit.runtime -- Python handles over the C runtime and plans.

``Runtime`` owns an ``sdpa_runtime`` (cache databases, kernel table);
``Plan`` owns an ``sdpa_bwd_plan`` made from a ``BwdDesc``. Both are
plain Python objects over the ctypes mirror in ``_capi`` and need neither
PyTorch nor a GPU: a plan for ``arch=90`` validates, builds its key and
compiles (into the cache) on a machine without one, which is what
preheating does. Every failing call raises the ``SdpaError`` subclass of
its status, with ``sdpa_last_error()``'s message (which names the field
and what is allowed).

Lifetimes follow the C rules: a plan keeps its runtime alive; a runtime's
``close()`` destroys the plans still open on it first, then the runtime.
Handles are also released when the objects are garbage collected.

``default_runtime()`` is the process's shared runtime (what
``sdpa_jit.torch`` uses), made on first use from ``configure()``'s options
and the environment: ``SDPA_JIT_CACHE`` (read by the library) and
``SDPA_JIT_READONLY_CACHE`` (shipped read-only databases, separated by
``os.pathsep``).
"""
from __future__ import annotations

import collections
import ctypes
import inspect
import os
import threading
import weakref

from . import _capi
from ._capi import (BwdDesc, BwdPlanInfo, BwdPlanOptions, CacheAccess, LogLevel, RuntimeOptions, Source, check,
                    error_for)

__all__ = ["Runtime", "Plan", "CacheRow", "default_runtime", "configure", "cache_default_location",
           "READONLY_CACHE_ENV"]

READONLY_CACHE_ENV = "SDPA_JIT_READONLY_CACHE"

# One cache row as Python values; its fields are the C struct's.
CacheRow = collections.namedtuple("CacheRow", _capi.CacheEntry.field_names())
CacheTotals = collections.namedtuple("CacheTotals", _capi.CacheStats.field_names())


class Runtime:
    """An sdpa-jit runtime (sdpa_runtime_create).

    cache_path: the writable cache database (None: $SDPA_JIT_CACHE, else
        the XDG default); readonly_cache_paths: shipped databases searched
        first, opened immutable; disable_disk_cache: memory only;
        cache_max_bytes: size cap (0: 4 GiB); arch: compute capability as
        major*10+minor for plans whose descriptor says 0 (0: the current
        device's; lets a machine without a GPU compile); log: a callable
        ``log(level: LogLevel, message: str)`` for warnings and notes (None:
        one line on stderr per warning); cache_access: a CacheAccess
        (READ_ONLY: open an existing database, write nothing); cache_required:
        a database that cannot be used is a CacheError instead of a warning
        and memory; cache_key_file: the secret of keyed checksums (None:
        $SDPA_JIT_CACHE_KEY_FILE, else $SDPA_JIT_CACHE_KEY, else none).
    """

    def __init__(self, *, cache_path=None, readonly_cache_paths=(), disable_disk_cache=False,
                 cache_max_bytes=0, arch=0, log=None, cache_access=CacheAccess.READ_WRITE,
                 cache_required=False, cache_key_file=None, library=None):
        lib = library or _capi.library()
        self._lib = lib
        self._handle = None
        self._plans = weakref.WeakSet()
        opts = RuntimeOptions()
        check(lib.sdpa_runtime_options_init(ctypes.byref(opts), RuntimeOptions._version_),
              "sdpa_runtime_options_init", lib)
        keep = []
        if cache_path is not None:
            opts.cache_path = os.fsencode(cache_path)
            keep.append(opts.cache_path)
        if isinstance(readonly_cache_paths, (str, bytes, os.PathLike)):
            readonly_cache_paths = [readonly_cache_paths]
        paths = [os.fsencode(p) for p in readonly_cache_paths]
        if paths:
            array = (ctypes.c_char_p * len(paths))(*paths)
            keep += [paths, array]
            opts.readonly_cache_paths = ctypes.cast(array, ctypes.POINTER(ctypes.c_char_p))
            opts.readonly_cache_count = len(paths)
        opts.disable_disk_cache = 1 if disable_disk_cache else 0
        opts.cache_max_bytes = int(cache_max_bytes)
        opts.arch = int(arch)
        opts.cache_access = int(CacheAccess(cache_access))
        opts.cache_required = 1 if cache_required else 0
        if cache_key_file is not None:
            opts.cache_key_file = os.fsencode(cache_key_file)
            keep.append(opts.cache_key_file)
        if log is not None:
            if not callable(log):
                raise TypeError(f"log must be a callable log(level, message), not {type(log).__name__}")

            def trampoline(level, message, user, log=log):
                try:
                    log(LogLevel(level), message.decode(errors="replace"))
                except Exception:  # never raise into C
                    pass

            opts.log = _capi.LOG_FN(trampoline)
            keep.append(opts.log)
        self._keep = keep  # alive as long as the runtime: the C side holds pointers
        self.options = {"cache_path": cache_path, "readonly_cache_paths": tuple(readonly_cache_paths),
                        "disable_disk_cache": bool(disable_disk_cache),
                        "cache_max_bytes": int(cache_max_bytes), "arch": int(arch),
                        "cache_access": CacheAccess(cache_access), "cache_required": bool(cache_required),
                        "cache_key_file": cache_key_file}
        handle = ctypes.c_void_p()
        check(lib.sdpa_runtime_create(ctypes.byref(handle), ctypes.byref(opts)), "sdpa_runtime_create", lib)
        self._handle = handle.value

    # -- lifetime
    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("this sdpa_jit.Runtime is closed")
        return self._handle

    def close(self):
        """Destroys the plans still open on this runtime, then the runtime."""
        if self._handle is None:
            return
        for plan in list(self._plans):
            plan.destroy()
        self._lib.sdpa_runtime_destroy(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- properties
    @property
    def cache_path(self):
        """The writable cache database's path, or None when in memory."""
        path = self._lib.sdpa_runtime_cache_path(self.handle)
        return os.fsdecode(path) if path else None

    @property
    def arch(self):
        """The arch plans get when their descriptor says 0."""
        arch = self._lib.sdpa_runtime_arch(self.handle)
        if arch == 0:
            raise error_for(self._lib, _capi.Status.NO_DEVICE, "sdpa_runtime_arch")
        return arch

    # -- plans
    def plan(self, desc=None, options=None, **fields):
        """A Plan for `desc` (a BwdDesc), or for BwdDesc.init(**fields);
        `options` a BwdPlanOptions or a dict of its fields (family, tiles,
        dq_writer, small_grid, graphs, ...), None for the runtime's
        defaults."""
        if desc is None:
            desc = BwdDesc.init(**fields)
        elif fields:
            raise TypeError("give a BwdDesc or its fields, not both")
        return Plan(self, desc, options)

    # -- cache
    def cache_list(self):
        """Every row of the user's and the shipped databases (CacheRow), most
        recently used first."""
        lib = self._lib
        rows = ctypes.POINTER(_capi.CacheEntry)()
        count = ctypes.c_size_t()
        check(lib.sdpa_cache_list(self.handle, ctypes.byref(rows), ctypes.byref(count)),
              "sdpa_cache_list", lib)
        try:
            return [CacheRow(**rows[i].as_dict()) for i in range(count.value)]
        finally:
            lib.sdpa_cache_entries_free(rows, count)

    def cache_get(self, key):
        """The row of `key` (hash, unique hash prefix of >= 6 hex digits, or
        key text); NotFoundError when none matches."""
        lib = self._lib
        row = ctypes.POINTER(_capi.CacheEntry)()
        check(lib.sdpa_cache_get(self.handle, key.encode(), ctypes.byref(row)), "sdpa_cache_get", lib)
        try:
            return CacheRow(**row[0].as_dict())
        finally:
            lib.sdpa_cache_entries_free(row, 1)

    def cache_cubin(self, key):
        """The cubin bytes of `key`'s row (checksum verified)."""
        lib = self._lib
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        check(lib.sdpa_cache_get_cubin(self.handle, key.encode(), ctypes.byref(data), ctypes.byref(size)),
              "sdpa_cache_get_cubin", lib)
        try:
            return ctypes.string_at(data, size.value)
        finally:
            lib.sdpa_free(data)

    def cache_stats(self):
        """Totals over the user's and the shipped databases (CacheTotals)."""
        stats = _capi.CacheStats()
        check(self._lib.sdpa_cache_stats_get(self.handle, ctypes.byref(stats)), "sdpa_cache_stats_get",
              self._lib)
        return CacheTotals(**stats.as_dict())

    def cache_verify(self, report=None):
        """Checks every row (checksum, MAC with a keyed checksum, a cubin for
        its arch) and removes the failing ones from the user's database;
        returns (checked, removed). `report`, a callable
        ``report(key_hash, key_text, problem, removed)``, hears of each."""
        checked, removed = ctypes.c_int64(), ctypes.c_int64()
        if report is None:
            check(self._lib.sdpa_cache_verify(self.handle, ctypes.byref(checked), ctypes.byref(removed)),
                  "sdpa_cache_verify", self._lib)
            return checked.value, removed.value

        def trampoline(key_hash, key_text, problem, was_removed, user):
            try:
                report(*(x.decode(errors="replace") if x else "" for x in (key_hash, key_text, problem)),
                       bool(was_removed))
            except Exception:  # never raise into C
                pass

        callback = _capi.CACHE_PROBLEM_FN(trampoline)
        check(self._lib.sdpa_cache_verify_report(self.handle, callback, None, ctypes.byref(checked),
                                                 ctypes.byref(removed)), "sdpa_cache_verify_report", self._lib)
        return checked.value, removed.value

    def cache_prune(self, max_bytes=-1, older_than_seconds=-1):
        """Removes LRU rows past `max_bytes` and rows unused for longer than
        `older_than_seconds` (negative: no limit); returns the count."""
        removed = ctypes.c_int64()
        check(self._lib.sdpa_cache_prune(self.handle, int(max_bytes), int(older_than_seconds),
                                         ctypes.byref(removed)), "sdpa_cache_prune", self._lib)
        return removed.value


class Plan:
    """A backward plan (sdpa_bwd_plan_create) for one descriptor.

    ``key`` / ``key_hash``: the kernel's specialization key; ``workspace_size``:
    device bytes execute needs; ``compile()`` makes the kernels ready in the
    current CUDA context (memory, then the cache, then NVRTC) and returns
    where they came from (a Source); ``execute()`` launches on a stream.
    """

    __slots__ = ("runtime", "handle", "desc", "workspace_size", "key", "key_hash", "source", "_lib",
                 "__weakref__")

    def __init__(self, runtime, desc, options=None):
        if not isinstance(desc, BwdDesc):
            raise TypeError(f"desc must be an sdpa_jit.BwdDesc, not {type(desc).__name__}")
        lib = runtime._lib
        self._lib = lib
        self.handle = None
        self.runtime = runtime
        handle = ctypes.c_void_p()
        if options is None:
            check(lib.sdpa_bwd_plan_create(ctypes.byref(handle), runtime.handle, ctypes.byref(desc)),
                  "sdpa_bwd_plan_create", lib)
        else:
            if isinstance(options, dict):
                options = BwdPlanOptions.init(**options)
            if not isinstance(options, BwdPlanOptions):
                raise TypeError(f"options must be an sdpa_jit.BwdPlanOptions or a dict of its fields, not "
                                f"{type(options).__name__}")
            check(lib.sdpa_bwd_plan_create_with(ctypes.byref(handle), runtime.handle, ctypes.byref(desc),
                                                ctypes.byref(options)), "sdpa_bwd_plan_create_with", lib)
        self.handle = handle.value
        self.desc = desc
        self.workspace_size = lib.sdpa_bwd_workspace_size(self.handle)
        self.key = lib.sdpa_bwd_plan_key(self.handle).decode()
        self.key_hash = lib.sdpa_bwd_plan_key_hash(self.handle).decode()
        self.source = Source.NONE
        runtime._plans.add(self)

    def compile(self):
        """Finds or builds the kernels and loads them in the current CUDA
        context (without a GPU: stops once the cubin is cached). Returns the
        Source; CompileFailedError carries NVRTC's log."""
        lib = self._lib
        source = ctypes.c_int(0)
        status = lib.sdpa_bwd_compile(self._live(), ctypes.byref(source))
        if status != 0:
            raise error_for(lib, status, "sdpa_bwd_compile", log=self.compile_log)
        self.source = Source(source.value)
        return self.source

    def info(self):
        """What the plan chose and its last compile did (sdpa_bwd_plan_query):
        a dict of BwdPlanInfo's fields, enums as Family / DqWriter / Source."""
        info = BwdPlanInfo.init()
        check(self._lib.sdpa_bwd_plan_query(self._live(), ctypes.byref(info)), "sdpa_bwd_plan_query", self._lib)
        out = info.as_dict()
        out["family"] = _capi.Family(out["family"])
        out["dq_writer"] = _capi.DqWriter(out["dq_writer"])
        out["source"] = Source(out["source"])
        del out["version"]
        return out

    @property
    def compile_log(self):
        return self._lib.sdpa_bwd_plan_compile_log(self._live()).decode(errors="replace")

    def execute(self, tensors, workspace, workspace_bytes, stream=0):
        """Launches the backward (sdpa_bwd_execute): `tensors` a BwdTensors,
        `workspace` a device pointer (int) of at least workspace_size bytes,
        256-byte aligned, `stream` a CUstream as an int (0: legacy)."""
        status = self._lib.sdpa_bwd_execute(self._live(), ctypes.byref(tensors), workspace or None,
                                            workspace_bytes, stream or None)
        if status != 0:
            raise error_for(self._lib, status, "sdpa_bwd_execute")

    def sync_check(self, stream=0):
        """Synchronizes `stream` and raises DeviceError when a launch of this
        plan found bad input on the device."""
        check(self._lib.sdpa_bwd_sync_check(self._live(), stream or None), "sdpa_bwd_sync_check", self._lib)

    def _live(self):
        if self.handle is None:
            raise ValueError("this sdpa_jit.Plan is destroyed")
        return self.handle

    def destroy(self):
        if self.handle is not None:
            self._lib.sdpa_bwd_plan_destroy(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    def __repr__(self):
        return f"Plan({self.key!r}, workspace_size={self.workspace_size})"


def cache_default_location():
    """Where the user's cache database is by default ($SDPA_JIT_CACHE, else
    the XDG location, else ~/.cache/..., else a temporary directory); the
    library computes it and creates nothing."""
    lib = _capi.library()
    buf = ctypes.create_string_buffer(4096)
    return os.fsdecode(lib.sdpa_cache_default_location(buf, len(buf)))


# ------------------------------------------------------- default runtime
_default_lock = threading.Lock()
_default_runtime = None
_default_options = {}


def configure(**options):
    """Sets the options (Runtime's keyword arguments) of the process's
    default runtime; only before it is first used."""
    with _default_lock:
        if _default_runtime is not None and options != _default_options:
            raise RuntimeError("sdpa_jit.configure() must be called before the default runtime is "
                               "first used (it is already made)")
        inspect.signature(Runtime).bind(**options)  # a TypeError names an unknown option
        _default_options.clear()
        _default_options.update(options)


def default_runtime():
    """The process's shared Runtime: configure()'s options, and the shipped
    databases named by $SDPA_JIT_READONLY_CACHE when none were given."""
    global _default_runtime
    rt = _default_runtime
    if rt is None:
        with _default_lock:
            if _default_runtime is None:
                options = dict(_default_options)
                if "readonly_cache_paths" not in options:
                    env = os.environ.get(READONLY_CACHE_ENV, "")
                    options["readonly_cache_paths"] = [p for p in env.split(os.pathsep) if p]
                _default_runtime = Runtime(**options)
            rt = _default_runtime
    return rt
