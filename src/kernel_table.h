/*
 * kernel_table.h — the runtime's in-process table of compiled kernels.
 *
 * One row per key (hash and full text) holding its cubin (for later
 * contexts and for plans created afterwards) and, per CUDA context, the
 * loaded module with its three kernel handles and the THD error word. The
 * table also keeps the in-process single flight: while one thread builds a
 * key's row (cache lookup or NVRTC), other threads asking for the same key
 * wait for it instead of compiling it again. Rows live until the runtime
 * is destroyed (plans point into them).
 *
 * Threads: `lock` guards every list here; compile.c takes it around a
 * row's module list. No lock is held while a row is being built.
 */
#ifndef SDPA_KERNEL_TABLE_H
#define SDPA_KERNEL_TABLE_H

#include <pthread.h>
#include <stddef.h>

#include "driver.h"
#include "key.h"

/* A module loaded in one context. */
typedef struct sdpa_module_entry {
  CUcontext ctx;
  CUmodule module;
  CUfunction preprocess, main, convert;
  int *error_host;          /* first word of a registered, mapped page
                             * (THD kernels set flags); malloc'd; NULL
                             * for BSHD kernels                         */
  CUdeviceptr error_device; /* its device address                     */
  int sm_count;             /* multiprocessors of the context's device
                             * (sdpa_kernel_params.sm_count)            */
  struct sdpa_module_entry *next;
} sdpa_module_entry;

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
  sdpa_module_entry *modules; /* per context                          */
  sdpa_retired_cubin *retired;
  struct sdpa_kernel_entry *next;
} sdpa_kernel_entry;

/* A key being built inside this process. */
typedef struct sdpa_inflight {
  char hash[33];
  struct sdpa_inflight *next;
} sdpa_inflight;

typedef struct sdpa_kernel_table {
  pthread_mutex_t lock;  /* guards the lists below and each row's modules */
  pthread_cond_t done;   /* signalled when a build ends                   */
  sdpa_kernel_entry *kernels;
  sdpa_inflight *inflight;
} sdpa_kernel_table;

/* Initializes an empty table. Returns 0, or -1 (no mutex/condvar). */
int sdpa_kernel_table_init(sdpa_kernel_table *t);

/* Unloads every module in its context (driver errors ignored: the
 * context may be gone at exit), restoring the caller's current context,
 * and frees the table. */
void sdpa_kernel_table_destroy(sdpa_kernel_table *t);

/* The row of `key`, waiting while another thread builds it; when there is
 * none, claims the build for the caller (*claimed = 1; the caller must
 * then call sdpa_kernel_table_publish). OUT_OF_MEMORY when a claim cannot
 * be recorded. */
sdpa_status sdpa_kernel_table_find_or_claim(sdpa_kernel_table *t, const sdpa_key *key,
                                            sdpa_kernel_entry **entry, int *claimed);

/* Ends the caller's claim on `key`: with a cubin (malloc'd, taken over on
 * success) adds the row and returns it in *entry; with cubin NULL (the
 * build failed) only releases waiting threads. `log` (may be NULL) is
 * copied. */
sdpa_status sdpa_kernel_table_publish(sdpa_kernel_table *t, const sdpa_key *key, void *cubin,
                                      size_t size, const char *log, int stored,
                                      sdpa_kernel_entry **entry);

#endif /* SDPA_KERNEL_TABLE_H */
