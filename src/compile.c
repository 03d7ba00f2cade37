/*
 * compile.c — sdpa_bwd_compile: from a plan's key to a loaded module.
 *
 * Layers, cheapest first:
 *   1. the plan's own module, when it was loaded in the current context:
 *      one cuCtxGetCurrent, no table, no runtime lock (~1 µs);
 *   2. the runtime's kernel table (same key compiled or loaded earlier in
 *      this process, by any plan);
 *   3. the cache: shipped databases, then the user's (cache.c);
 *   4. NVRTC: instantiate the template (instantiate.c), compile (nvrtc.c),
 *      store the row.
 * Single flight: inside the process one thread per key goes past layer 2
 * while the others wait on the runtime's condition variable; across
 * processes the compiling one holds the key's flock (sdpa_cache_lock_key)
 * and looks the key up again once it has it, so N ranks starting on an
 * empty cache compile each key once. No runtime lock and no database
 * transaction is held while NVRTC runs.
 *
 * Then, when a CUDA driver and device are present and the device's arch is
 * the plan's, the cubin is loaded once per context (module, its three
 * kernels, the main kernel's dynamic shared memory limit and, for THD
 * kernels, a mapped host word for device-side input errors). A cubin the
 * driver rejects is removed from the cache and compiled again once.
 * Without a GPU, or for another arch, compile stops once the cubin is
 * cached: that is preheating.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cubin.h"
#include "instantiate.h"
#include "key.h"
#include "nvrtc.h"
#include "runtime.h"
#include "status.h"

/* Name of the translation unit in NVRTC's diagnostics. */
#define UNIT_NAME "sdpa_bwd_kernel.cu"

/* The cache's check of a blob looked up for a plan: a cubin for the
 * plan's arch (not the row's: its columns are anyone's) with the
 * kernels. */
static int check_blob(const void *blob, size_t size, int row_arch, void *context,
                      char *why, size_t why_size) {
  const sdpa_bwd_plan *plan = context;
  (void)row_arch;
  return sdpa_cubin_check_kernels(blob, size, plan->fields.arch, why, why_size);
}

/* Gets the plan's cubin from the cache, else compiles and stores it.
 * `lookup` zero skips the cache lookups (the cached cubin was rejected).
 * On success *cubin and *size (malloc'd) and *source (SHIPPED, DISK or
 * COMPILED); *log is NVRTC's log (malloc'd) whenever NVRTC ran, else NULL,
 * success or not. Holds only the key's cross-process lock while compiling. */
static sdpa_status obtain_cubin(sdpa_runtime *rt, const sdpa_bwd_plan *plan,
                                int lookup, void **cubin, size_t *size,
                                sdpa_source *source, char **log, int *stored) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_cache_lock *lock = NULL;
  char *unit = NULL;
  double compile_ms = 0.0;
  const sdpa_key *key = &plan->key;

  *cubin = NULL;
  *size = 0;
  *log = NULL;
  *stored = 0;
  void *context = (void *)plan;
  if (lookup && sdpa_cache_lookup(rt->cache, key->hash, key->text, check_blob, context,
                                  cubin, size, source) == SDPA_STATUS_SUCCESS) {
    *stored = 1;
    return SDPA_STATUS_SUCCESS;
  }

  sdpa_cache_lock_key(rt->cache, key->hash, &lock);
  /* Another process may have stored it while this one waited. */
  if (lookup && lock &&
      sdpa_cache_lookup(rt->cache, key->hash, key->text, check_blob, context, cubin, size,
                        source) == SDPA_STATUS_SUCCESS) {
    *stored = 1;
    goto done;
  }

  if ((status = sdpa_instantiate_source(&plan->fields, &unit))) goto done;
  status = sdpa_nvrtc_compile_timed(unit, UNIT_NAME, plan->fields.arch,
                                    plan->fields.family == SDPA_FAMILY_HOPPER, cubin, size,
                                    log, &compile_ms);
  if (status != SDPA_STATUS_SUCCESS) goto done;
  *source = SDPA_SOURCE_COMPILED;

  sdpa_cache_meta meta = {0};
  meta.key_hash = key->hash;
  meta.key_text = key->text;
  meta.fields = &plan->fields;
  meta.nvrtc_version = sdpa_nvrtc_version();
  meta.compile_ms = compile_ms;
  meta.compile_log = *log;
  /* A store that fails only costs the row (the cache warns); the cubin is
   * good and stays in memory. */
  (void)sdpa_cache_store(rt->cache, &meta, *cubin, *size, stored);

done:
  if (lock) sdpa_cache_unlock_key(lock);
  free(unit);
  if (status != SDPA_STATUS_SUCCESS) {
    free(*cubin);
    *cubin = NULL;
    *size = 0;
  }
  return status;
}

/* Finds the plan's key in the runtime's table, else makes the row (cache
 * or NVRTC) with in-process single flight. *entry stays valid until the
 * runtime is destroyed. *source is MEMORY for a table hit. On failure
 * *log (malloc'd or NULL) is NVRTC's log. */
static sdpa_status find_or_build_entry(sdpa_runtime *rt,
                                       const sdpa_bwd_plan *plan,
                                       sdpa_kernel_entry **entry,
                                       sdpa_source *source, char **log) {
  void *cubin = NULL;
  size_t size = 0;
  int claimed = 0, stored = 0;
  *log = NULL;
  sdpa_status status = sdpa_kernel_table_find_or_claim(&rt->table, &plan->key, entry, &claimed);
  if (status || !claimed) {
    if (*entry) *source = SDPA_SOURCE_MEMORY;
    return status;
  }
  status = obtain_cubin(rt, plan, 1, &cubin, &size, source, log, &stored);
  sdpa_status published = sdpa_kernel_table_publish(
      &rt->table, &plan->key, status == SDPA_STATUS_SUCCESS ? cubin : NULL, size, *log,
      stored, entry);
  if (status != SDPA_STATUS_SUCCESS) free(cubin);
  return status ? status : published;
}

/* Driver errors that mean "this image is not loadable here": the cached
 * cubin is bad (or from another toolchain) and compiling again may help. */
static int image_rejected(CUresult rc) {
  switch (rc) {
  case CUDA_ERROR_INVALID_IMAGE:
  case CUDA_ERROR_NO_BINARY_FOR_GPU:
  case CUDA_ERROR_INVALID_PTX:
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
  case CUDA_ERROR_INVALID_SOURCE:
  case CUDA_ERROR_SHARED_OBJECT_INIT_FAILED:
  case CUDA_ERROR_NOT_FOUND: /* a kernel name missing from the image */
    return 1;
  default:
    return 0;
  }
}

/* Loads `cubin` in the current context `ctx` (of `device`): module, the
 * three kernels, the main kernel's dynamic shared memory limit, the
 * device's multiprocessor count (sdpa_kernel_params.sm_count) and, with
 * `error_word`
 * (THD kernels: only they check their input on the device), a zeroed
 * mapped error word. *rejected is set when the driver refused the image
 * itself.
 *
 * The error word lives in a page of ours that the driver registers and
 * maps into this context, the only one that launches this module: a
 * process's first cuMemHostAlloc sets up the driver's pinned pool, ~0.7-1.7
 * ms on an H200 host, where registering one page costs 80-220 us (445-575
 * us when registered as portable, mapped into every context). */
static sdpa_status load_module(const sdpa_driver *drv, CUcontext ctx, CUdevice device,
                               const void *cubin, int smem_bytes,
                               int error_word, sdpa_module_entry **out,
                               int *rejected) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_module_entry *m = NULL;
  CUmodule module = NULL;
  void *host = NULL;
  int registered = 0;
  CUresult rc;

  *out = NULL;
  *rejected = 0;
  m = calloc(1, sizeof *m);
  if (!m) {
    status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                            "out of host memory loading a module");
    goto done;
  }
  rc = drv->cuModuleLoadData(&module, cubin);
  if (rc != CUDA_SUCCESS) {
    module = NULL;
    *rejected = image_rejected(rc);
    status = sdpa_driver_error(drv, rc, "cuModuleLoadData (loading the cubin)");
    goto done;
  }
  const struct { CUfunction *slot; const char *name; } kernels[] = {
      {&m->preprocess, SDPA_KERNEL_PREPROCESS},
      {&m->main, SDPA_KERNEL_MAIN},
      {&m->convert, SDPA_KERNEL_CONVERT}};
  for (size_t i = 0; i < 3; i++) {
    rc = drv->cuModuleGetFunction(kernels[i].slot, module, kernels[i].name);
    if (rc != CUDA_SUCCESS) {
      *rejected = image_rejected(rc);
      status = sdpa_driver_error(drv, rc, "cuModuleGetFunction");
      sdpa_error_wrap(status, "kernel %s", kernels[i].name);
      goto done;
    }
  }
  SDPA_CU_CHECK(drv,
                drv->cuFuncSetAttribute(
                    m->main, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem_bytes),
                "cuFuncSetAttribute (the main kernel's dynamic shared memory)");
  SDPA_CU_CHECK(drv,
                drv->cuDeviceGetAttribute(&m->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                          device),
                "reading the device's multiprocessor count");
  if (error_word) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    if (posix_memalign(&host, (size_t)page, (size_t)page) != 0) {
      host = NULL;
      status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                              "out of host memory for the device error word");
      goto done;
    }
    memset(host, 0, (size_t)page);
    SDPA_CU_CHECK(drv,
                  drv->cuMemHostRegister(host, (size_t)page,
                                         CU_MEMHOSTREGISTER_DEVICEMAP),
                  "cuMemHostRegister (the device error word)");
    registered = 1;
    SDPA_CU_CHECK(drv,
                  drv->cuMemHostGetDevicePointer(&m->error_device, host, 0),
                  "cuMemHostGetDevicePointer (the device error word)");
  }
  m->ctx = ctx;
  m->module = module;
  m->error_host = host;
  *out = m;
  m = NULL;
  module = NULL;
  host = NULL;

done:
  if (host && registered) drv->cuMemHostUnregister(host);
  free(host);
  if (module) drv->cuModuleUnload(module);
  free(m);
  return status;
}

/* Finds or loads the entry's module for `ctx`, recompiling once when the
 * driver rejects the cached image. *source becomes COMPILED when that
 * happens. Takes the runtime lock (not across NVRTC). */
static sdpa_status module_for_context(sdpa_runtime *rt,
                                      const sdpa_bwd_plan *plan,
                                      sdpa_kernel_entry *entry,
                                      const sdpa_driver *drv, CUcontext ctx,
                                      CUdevice device, sdpa_module_entry **out,
                                      sdpa_source *source) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int rejected = 0, retried = 0;
  sdpa_retired_cubin *retired = NULL;
  int smem = plan->smem_bytes;

  pthread_mutex_lock(&rt->table.lock);
  for (;;) {
    for (sdpa_module_entry *m = entry->modules; m; m = m->next)
      if (m->ctx == ctx) {
        *out = m;
        goto done;
      }
    status = load_module(drv, ctx, device, entry->cubin, smem,
                         plan->fields.layout == SDPA_LAYOUT_THD, out, &rejected);
    if (status == SDPA_STATUS_SUCCESS) {
      (*out)->next = entry->modules;
      entry->modules = *out;
      goto done;
    }
    if (!rejected || retried) goto done;

    /* The driver refused the image: drop the row and compile once more. */
    retried = 1;
    pthread_mutex_unlock(&rt->table.lock); /* the log callback may call back in */
    sdpa_runtime_log(rt, SDPA_LOG_WARNING,
                     "the CUDA driver rejected the cubin of %s (%s); removing "
                     "it from the cache and compiling again",
                     plan->key.text, sdpa_last_error());
    void *cubin = NULL;
    size_t size = 0;
    char *log = NULL;
    sdpa_source fresh_source = SDPA_SOURCE_COMPILED;
    int stored = 0;
    sdpa_cache_remove(rt->cache, plan->key.hash);
    status = obtain_cubin(rt, plan, 0, &cubin, &size, &fresh_source, &log, &stored);
    if (status == SDPA_STATUS_SUCCESS) {
      retired = calloc(1, sizeof *retired);
      if (!retired)
        status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                                "out of host memory replacing a cubin");
    }
    pthread_mutex_lock(&rt->table.lock);
    if (status != SDPA_STATUS_SUCCESS) {
      free(cubin);
      free(log);
      goto done;
    }
    retired->cubin = entry->cubin;
    retired->next = entry->retired;
    entry->retired = retired;
    retired = NULL;
    entry->cubin = cubin;
    entry->cubin_size = size;
    entry->stored = stored;
    if (log) {
      free(entry->compile_log);
      entry->compile_log = log;
    }
    *source = fresh_source;
  }

done:
  pthread_mutex_unlock(&rt->table.lock);
  return status;
}

/* Replaces the plan's compile log with a copy of `log` (NULL: ""). */
static void set_plan_log(sdpa_bwd_plan *plan, const char *log) {
  char *copy = strdup(log ? log : "");
  if (!copy) return; /* keep the old one rather than fail the compile */
  free(plan->compile_log);
  plan->compile_log = copy;
}

/* The slow path of sdpa_bwd_compile; plan lock held. */
static sdpa_status compile_plan(sdpa_bwd_plan *plan, sdpa_source *source) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_runtime *rt = plan->runtime;
  sdpa_kernel_entry *entry = NULL;
  sdpa_module_entry *module = NULL;
  char *log = NULL;
  const sdpa_driver *drv = NULL;
  CUcontext ctx = NULL;
  CUdevice device = 0;
  int device_arch = 0;

  status = find_or_build_entry(rt, plan, &entry, source, &log);
  if (status != SDPA_STATUS_SUCCESS) {
    if (log) set_plan_log(plan, log);
    goto done;
  }

  if (sdpa_driver_get(&drv) == SDPA_STATUS_SUCCESS) {
    if ((status = sdpa_driver_context(drv, &ctx, &device)) ||
        (status = sdpa_driver_arch(drv, device, &device_arch)))
      goto done;
    if (device_arch == plan->fields.arch) {
      status = module_for_context(rt, plan, entry, drv, ctx, device, &module, source);
      if (status != SDPA_STATUS_SUCCESS) goto done;
    } else {
      sdpa_runtime_log(rt, SDPA_LOG_INFO,
                       "%s: cached for sm_%d; not loaded because the current "
                       "device is sm_%d",
                       plan->key.text, plan->fields.arch, device_arch);
    }
  }

  pthread_mutex_lock(&rt->table.lock);
  plan->cubin = entry->cubin;
  plan->cubin_size = entry->cubin_size;
  plan->stored = entry->stored;
  set_plan_log(plan, entry->compile_log);
  pthread_mutex_unlock(&rt->table.lock);
  plan->module = module;
  plan->module_ctx = module ? ctx : NULL;
  plan->source = *source;

done:
  free(log);
  return status;
}

/* Makes the plan's kernels ready (sdpa_jit.h). The fast path (module
 * already loaded in the current context) is one cuCtxGetCurrent. */
static sdpa_status compile(sdpa_bwd_plan *plan, sdpa_source *source) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_source found = SDPA_SOURCE_NONE;

  if (source) *source = SDPA_SOURCE_NONE;
  if (!plan)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_bwd_compile: plan is NULL");
  pthread_mutex_lock(&plan->lock);
  if (plan->module) {
    const sdpa_driver *drv = NULL;
    CUcontext current = NULL;
    if (sdpa_driver_get(&drv) == SDPA_STATUS_SUCCESS &&
        drv->cuCtxGetCurrent(&current) == CUDA_SUCCESS &&
        current == plan->module_ctx) {
      plan->source = SDPA_SOURCE_MEMORY;
      found = SDPA_SOURCE_MEMORY;
      goto done;
    }
  }
  status = compile_plan(plan, &found);

done:
  pthread_mutex_unlock(&plan->lock);
  if (source && status == SDPA_STATUS_SUCCESS) *source = found;
  return status;
}

sdpa_status sdpa_bwd_compile(sdpa_bwd_plan *plan, sdpa_source *source) {
  return SDPA_API_CALL(compile(plan, source));
}
