"""sdpa_jit -- Python bindings of sdpa-jit, the backward pass of
scaled-dot-product attention (dQ, dK, dV) on NVIDIA GPUs with kernels
compiled at run time by NVRTC and kept in an SQLite cache.

``import sdpa_jit`` needs neither PyTorch nor a GPU, nor (until first use)
the C library: it is loaded when a Runtime is made, from $SDPA_JIT_LIBRARY,
else the installed libsdpa_jit.so. ``sdpa_jit.torch`` (which needs PyTorch)
has the attention ops: ``attention`` and ``varlen_attention``.

The C API's types are in ``sdpa_jit._capi`` (BwdDesc, BwdTensors, the
enums); ``Runtime`` and ``Plan`` wrap its handles; every failing call
raises an ``SdpaError`` subclass whose message names the field and what is
allowed.
"""
from ._version import __version__
from ._capi import (
    BwdDesc, BwdPlanInfo, BwdPlanOptions, BwdTensors, CacheAccess, CacheEntry, CacheStats, DqWriter,
    Dtype, Family, Layout, LogLevel, LseStrides, Mask, RuntimeOptions, Source, Status, Strides, Switch,
    CacheError, CompileFailedError, DeviceError, DriverError, InternalError,
    InvalidArgumentError, LibraryNotFoundError, NoDeviceError, NotCompiledError, NotFoundError,
    NotSupportedError, OutOfMemoryError, SdpaError,
    LIBRARY_ENV, find_library_path, library, library_candidates, load_library,
)
from .runtime import (READONLY_CACHE_ENV, CacheRow, Plan, Runtime, cache_default_location, configure,
                      default_runtime)


def library_version():
    """The loaded C library's version string (sdpa_version())."""
    return library().sdpa_version().decode()


__all__ = [
    "__version__", "library_version",
    "BwdDesc", "BwdPlanInfo", "BwdPlanOptions", "BwdTensors", "CacheAccess", "CacheEntry", "CacheStats",
    "DqWriter", "Dtype", "Family", "Layout", "LogLevel", "LseStrides", "Mask", "RuntimeOptions", "Source",
    "Status", "Strides", "Switch",
    "SdpaError", "CacheError", "CompileFailedError", "DeviceError", "DriverError", "InternalError",
    "InvalidArgumentError", "LibraryNotFoundError", "NoDeviceError", "NotCompiledError",
    "NotFoundError", "NotSupportedError", "OutOfMemoryError",
    "LIBRARY_ENV", "READONLY_CACHE_ENV", "find_library_path", "library", "library_candidates",
    "load_library", "CacheRow", "Plan", "Runtime", "cache_default_location", "configure", "default_runtime",
]
