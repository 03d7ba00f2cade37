/* runtime.c — being written. */
typedef int sdpa_runtime_unit_;
