/* compile.c — being written. */
typedef int sdpa_compile_unit_;
