"""The package's version: the C library's (SDPA_JIT_VERSION_STRING)."""
__version__ = "0.1.0"
