/*
 * runtime.h — the runtime object: options, cache layers, the in-process
 * module table and the single-flight guard for compiles.
 *
 * Module table: one row per key hash holding the cubin (for later contexts
 * and for plans created afterwards) and, per CUDA context, the loaded
 * module with its three kernel handles. Looked up under a mutex; a repeated
 * compile of the same plan in the same context takes the plan's fast path
 * and touches no table at all.
 */
#ifndef SDPA_RUNTIME_H
#define SDPA_RUNTIME_H

#include <pthread.h>

#include "cache.h"
#include "driver.h"
#include "options.h"
#include "plan.h"

/* A module loaded in one context. */
struct sdpa_module_entry {
  CUcontext ctx;
  CUmodule module;
  CUfunction preprocess, main, convert;
  int *error_host;          /* first word of a registered, mapped page
                             * (THD kernels set flags); malloc'd; NULL
                             * for BSHD kernels                         */
  CUdeviceptr error_device; /* its device address                     */
  struct sdpa_module_entry *next;
};

/* A cubin the driver rejected, replaced by a fresh compile; kept until
 * the runtime is destroyed because plans may still point at it. */
typedef struct sdpa_retired_cubin {
  void *cubin;
  struct sdpa_retired_cubin *next;
} sdpa_retired_cubin;

/* One compiled key. */
typedef struct sdpa_kernel_entry {
  char hash[33];
  char *key_text;
  void *cubin;
  size_t cubin_size;
  char *compile_log;          /* NVRTC's log when compiled in this
                                 process, else "" (owned)             */
  int stored;                 /* the cubin is in a database           */
  struct sdpa_module_entry *modules; /* per context                   */
  sdpa_retired_cubin *retired;
  struct sdpa_kernel_entry *next;
} sdpa_kernel_entry;

/* In-flight compile of one key inside this process. */
typedef struct sdpa_inflight {
  char hash[33];
  struct sdpa_inflight *next;
} sdpa_inflight;

struct sdpa_runtime {
  sdpa_runtime_options options; /* the caller's, without the cache
                                   paths (the cache keeps copies)   */
  sdpa_cache *cache;            /* never NULL once created          */
  sdpa_option_defaults defaults; /* plan options' defaults, read from
                                    the environment at creation     */
  pthread_mutex_t lock;         /* guards kernels and inflight      */
  pthread_cond_t inflight_done;
  sdpa_kernel_entry *kernels;
  sdpa_inflight *inflight;
};

/* Logs through the runtime's callback (stderr when none). */
void sdpa_runtime_log(const sdpa_runtime *rt, sdpa_log_level level,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif /* SDPA_RUNTIME_H */
