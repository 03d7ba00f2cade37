/* execute.c — being written. */
typedef int sdpa_execute_unit_;
