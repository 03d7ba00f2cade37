/* instantiate.c — being written. */
typedef int sdpa_instantiate_unit_;
