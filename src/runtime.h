/*
 * runtime.h — the runtime object: its options, the plan options'
 * defaults, the cache layers (cache.h) and the in-process kernel table
 * (kernel_table.h). A repeated compile of the same plan in the same
 * context takes the plan's fast path and touches no table at all.
 */
#ifndef SDPA_RUNTIME_H
#define SDPA_RUNTIME_H

#include <pthread.h>

#include "cache.h"
#include "driver.h"
#include "kernel_table.h"
#include "options.h"
#include "plan.h"

struct sdpa_runtime {
  sdpa_runtime_options options; /* the caller's, without the cache
                                   paths (the cache keeps copies)   */
  sdpa_cache *cache;            /* never NULL once created          */
  sdpa_option_defaults defaults; /* plan options' defaults, read from
                                    the environment at creation     */
  sdpa_kernel_table table;      /* compiled kernels, in process     */
};

/* Logs through the runtime's callback (stderr when none). */
void sdpa_runtime_log(const sdpa_runtime *rt, sdpa_log_level level,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif /* SDPA_RUNTIME_H */
