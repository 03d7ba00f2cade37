/*
 * runtime.c — the runtime object and the public cache-inspection calls.
 *
 * A runtime owns a copy of its options, the plan options' defaults
 * (options.c), the cache layers (cache.c) and the in-process kernel table
 * (kernel_table.c, filled by compile.c). Creating one touches no
 * GPU and no driver, so a build host without a GPU can preheat the cache;
 * the driver is loaded only when a plan needs the current device's arch
 * and none was given, or when compile loads a module.
 *
 * The public sdpa_cache_* calls live here because they take a runtime:
 * each forwards to the cache's internal call on the runtime's layers.
 */
#include "runtime.h"

#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#include "cubin.h"
#include "status.h"

/* The size of a version-1 options struct: the fields up to log_user. */
static const size_t options_v1_size =
    offsetof(sdpa_runtime_options, log_user) + sizeof(void *);

/* Initializes `opts` to defaults for struct `version` (sdpa_jit.h). */
sdpa_status sdpa_runtime_options_init(sdpa_runtime_options *opts,
                                      unsigned int version) {
  if (!opts)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_runtime_options_init: opts is NULL");
  if (version < 1 || version > SDPA_RUNTIME_OPTIONS_VERSION)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_runtime_options_init: version %u is unknown: "
                          "this library knows versions 1 to %d "
                          "(SDPA_RUNTIME_OPTIONS_VERSION)",
                          version, SDPA_RUNTIME_OPTIONS_VERSION);
  sdpa_runtime_options defaults = SDPA_RUNTIME_OPTIONS_INIT;
  defaults.version = version;
  memcpy(opts, &defaults, version == 1 ? options_v1_size : sizeof defaults);
  return SDPA_STATUS_SUCCESS;
}

/* Frees everything a runtime owns; the kernel table only when
 * `sync_ready` (it was initialized). */
static void free_runtime(sdpa_runtime *rt, int sync_ready) {
  if (!rt) return;
  sdpa_cache_close(rt->cache);
  if (sync_ready) sdpa_kernel_table_destroy(&rt->table);
  free(rt);
}

/* Creates a runtime (sdpa_jit.h): copies the options (a version-1 struct
 * is read up to its last field), reads the plan options' environment
 * defaults, opens the cache layers (which copy the paths they are given).
 * Needs no GPU. */
static sdpa_status runtime_create(sdpa_runtime **out, const sdpa_runtime_options *given) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_runtime *rt = NULL;
  int sync_ready = 0;
  sdpa_runtime_options opts_copy = SDPA_RUNTIME_OPTIONS_INIT;
  const sdpa_runtime_options *opts = &opts_copy;

  if (!out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_runtime_create: out is NULL");
  *out = NULL;
  if (given) {
    if (given->version < 1 || given->version > SDPA_RUNTIME_OPTIONS_VERSION)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "options.version = %u is unknown: initialize the options "
                            "with SDPA_RUNTIME_OPTIONS_INIT (version %d)",
                            given->version, SDPA_RUNTIME_OPTIONS_VERSION);
    memcpy(&opts_copy, given, given->version == 1 ? options_v1_size : sizeof opts_copy);
    opts_copy.version = SDPA_RUNTIME_OPTIONS_VERSION;
  }
  if (opts->readonly_cache_count > 0 && !opts->readonly_cache_paths)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.readonly_cache_paths is NULL but "
                          "options.readonly_cache_count is %zu",
                          opts->readonly_cache_count);
  for (size_t i = 0; i < opts->readonly_cache_count; i++)
    if (!opts->readonly_cache_paths[i])
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "options.readonly_cache_paths[%zu] is NULL", i);
  if (opts->arch < 0)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.arch = %d is negative: give a compute "
                          "capability as major*10+minor (e.g. 90) or 0 for "
                          "the current device's",
                          opts->arch);
  if (opts->cache_max_bytes < 0)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.cache_max_bytes = %lld is negative: give "
                          "a size in bytes or 0 for the default (4 GiB)",
                          (long long)opts->cache_max_bytes);
  if (opts->cache_access != SDPA_CACHE_READ_WRITE &&
      opts->cache_access != SDPA_CACHE_READ_ONLY &&
      opts->cache_access != SDPA_CACHE_READ_WRITE_EXISTING)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.cache_access = %d is not valid: use "
                          "SDPA_CACHE_READ_WRITE (0), SDPA_CACHE_READ_ONLY (1) or "
                          "SDPA_CACHE_READ_WRITE_EXISTING (2)",
                          (int)opts->cache_access);

  rt = calloc(1, sizeof *rt);
  if (!rt) goto out_of_memory;
  rt->options = *opts;
  /* The caller's path strings may go away after this call: the cache
   * copies them and nothing else reads them. */
  rt->options.cache_path = NULL;
  rt->options.readonly_cache_paths = NULL;
  rt->options.cache_key_file = NULL;
  sdpa_options_read_defaults(&rt->defaults);
  if (sdpa_kernel_table_init(&rt->table) != 0) goto out_of_memory;
  sync_ready = 1;

  sdpa_cache_config config = {0};
  config.path = opts->cache_path;
  config.readonly_paths = opts->readonly_cache_paths;
  config.readonly_count = opts->readonly_cache_count;
  config.disabled = opts->disable_disk_cache;
  config.max_bytes = opts->cache_max_bytes;
  config.log = opts->log;
  config.log_user = opts->log_user;
  config.access = opts->cache_access;
  config.required = opts->cache_required;
  config.key_file = opts->cache_key_file;
  /* How long a process waits for another's compile of the same key before
   * compiling it itself (a holder that hangs); default 120 s. */
  const char *lock_env = getenv("SDPA_JIT_LOCK_TIMEOUT_MS");
  if (lock_env && atoi(lock_env) > 0) config.lock_timeout_ms = atoi(lock_env);
  status = sdpa_cache_open(&rt->cache, &config);
  if (status != SDPA_STATUS_SUCCESS) goto done;

  *out = rt;
  rt = NULL;
  goto done;

out_of_memory:
  status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                          "out of host memory creating a runtime");
done:
  free_runtime(rt, sync_ready);
  return status;
}

sdpa_status sdpa_runtime_create(sdpa_runtime **out, const sdpa_runtime_options *opts) {
  return SDPA_API_CALL(runtime_create(out, opts));
}

/* Destroys a runtime (sdpa_jit.h). NULL is a no-op. */
void sdpa_runtime_destroy(sdpa_runtime *runtime) { free_runtime(runtime, 1); }

const char *sdpa_cache_default_location(char *buf, size_t size) {
  return sdpa_cache_default_path(buf, size);
}

const char *sdpa_runtime_cache_path(const sdpa_runtime *runtime) {
  if (!runtime) return NULL;
  return sdpa_cache_path(runtime->cache);
}

/* The arch plans use when their descriptor says 0 (sdpa_jit.h): the
 * options' arch, else the current context's device's (the primary context
 * of device 0 is made current when none is). Queried on every call, so a
 * thread that switches devices gets its device's arch. Returns 0 with a
 * message when neither. */
int sdpa_runtime_arch(sdpa_runtime *runtime) {
  if (!runtime) {
    sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                   "sdpa_runtime_arch: runtime is NULL");
    return 0;
  }
  if (runtime->options.arch > 0) return runtime->options.arch;

  const sdpa_driver *drv = NULL;
  CUdevice device = 0;
  int arch = 0;
  if (sdpa_driver_get(&drv) != SDPA_STATUS_SUCCESS ||
      sdpa_driver_context(drv, NULL, &device) != SDPA_STATUS_SUCCESS ||
      sdpa_driver_arch(drv, device, &arch) != SDPA_STATUS_SUCCESS) {
    sdpa_error_wrap(SDPA_STATUS_NO_DEVICE,
                    "no GPU found: set desc.arch or the runtime option arch");
    return 0;
  }
  return arch;
}

/* Logs one message through the runtime's callback, else (warnings only)
 * one line on stderr: "sdpa-jit: warning: ...". */
void sdpa_runtime_log(const sdpa_runtime *rt, sdpa_log_level level,
                      const char *fmt, ...) {
  char message[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  sdpa_log_emit(rt ? rt->options.log : NULL, rt ? rt->options.log_user : NULL,
                level, message);
}

/* ------------------------------------------------ public cache access */

/* Checks the runtime argument of a public cache call. */
static sdpa_status check_runtime(const sdpa_runtime *runtime, const char *call) {
  if (!runtime)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "%s: runtime is NULL",
                          call);
  return SDPA_STATUS_SUCCESS;
}

sdpa_status sdpa_cache_list(sdpa_runtime *runtime, sdpa_cache_entry **out,
                            size_t *count) {
  sdpa_status status = check_runtime(runtime, "sdpa_cache_list");
  if (status != SDPA_STATUS_SUCCESS) return status;
  if (!out || !count)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_list: out and count must not be NULL");
  return SDPA_API_CALL(sdpa_cache_list_entries(runtime->cache, out, count));
}

sdpa_status sdpa_cache_foreach(sdpa_runtime *runtime, sdpa_cache_entry_fn fn, void *user) {
  sdpa_status status = check_runtime(runtime, "sdpa_cache_foreach");
  if (status != SDPA_STATUS_SUCCESS) return status;
  if (!fn)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "sdpa_cache_foreach: fn is NULL");
  return SDPA_API_CALL(sdpa_cache_foreach_entry(runtime->cache, fn, user));
}

void sdpa_cache_entries_free(sdpa_cache_entry *entries, size_t count) {
  if (entries) sdpa_cache_free_entries(entries, count);
}

sdpa_status sdpa_cache_get(sdpa_runtime *runtime, const char *key,
                           sdpa_cache_entry **out) {
  sdpa_status status = check_runtime(runtime, "sdpa_cache_get");
  if (status != SDPA_STATUS_SUCCESS) return status;
  if (!key || !out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_get: key and out must not be NULL");
  return SDPA_API_CALL(sdpa_cache_get_entry(runtime->cache, key, out));
}

sdpa_status sdpa_cache_get_cubin(sdpa_runtime *runtime, const char *key,
                                 void **out, size_t *size) {
  sdpa_status status = check_runtime(runtime, "sdpa_cache_get_cubin");
  if (status != SDPA_STATUS_SUCCESS) return status;
  if (!key || !out || !size)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_get_cubin: key, out and size must not "
                          "be NULL");
  return SDPA_API_CALL(sdpa_cache_read_cubin(runtime->cache, key, out, size));
}

void sdpa_free(void *pointer) { free(pointer); }

sdpa_status sdpa_cache_stats_get(sdpa_runtime *runtime, sdpa_cache_stats *out) {
  sdpa_status status = check_runtime(runtime, "sdpa_cache_stats_get");
  if (status != SDPA_STATUS_SUCCESS) return status;
  if (!out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_stats_get: out is NULL");
  return SDPA_API_CALL(sdpa_cache_get_stats(runtime->cache, out));
}

/* Verify's check of a row's blob: a cubin for the arch its row names,
 * with the kernels (cubin.h). */
static int check_row_blob(const void *blob, size_t size, int row_arch, void *context,
                          char *why, size_t why_size) {
  (void)context;
  return sdpa_cubin_check_kernels(blob, size, row_arch > 0 ? row_arch : 0, why, why_size);
}

sdpa_status sdpa_cache_verify_report(sdpa_runtime *runtime, sdpa_cache_problem_fn fn,
                                     void *user, int64_t *checked, int64_t *removed) {
  sdpa_status status = check_runtime(runtime, "sdpa_cache_verify");
  if (status != SDPA_STATUS_SUCCESS) return status;
  return SDPA_API_CALL(sdpa_cache_verify_all(runtime->cache, check_row_blob, NULL, fn, user,
                                             checked, removed));
}

sdpa_status sdpa_cache_verify(sdpa_runtime *runtime, int64_t *checked,
                              int64_t *removed) {
  return sdpa_cache_verify_report(runtime, NULL, NULL, checked, removed);
}

sdpa_status sdpa_cache_prune(sdpa_runtime *runtime, int64_t max_bytes,
                             int64_t older_than_seconds, int64_t *removed) {
  sdpa_status status = check_runtime(runtime, "sdpa_cache_prune");
  if (status != SDPA_STATUS_SUCCESS) return status;
  return SDPA_API_CALL(
      sdpa_cache_prune_rows(runtime->cache, max_bytes, older_than_seconds, removed));
}
