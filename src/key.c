/* key.c — being written. */
typedef int sdpa_key_unit_;
