/* cache.c — being written. */
typedef int sdpa_cache_unit_;
