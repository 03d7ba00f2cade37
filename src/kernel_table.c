/*
 * kernel_table.c — the in-process kernel table (kernel_table.h).
 */
#include "kernel_table.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

int sdpa_kernel_table_init(sdpa_kernel_table *t) {
  memset(t, 0, sizeof *t);
  if (pthread_mutex_init(&t->lock, NULL) != 0) return -1;
  if (pthread_cond_init(&t->done, NULL) != 0) {
    pthread_mutex_destroy(&t->lock);
    return -1;
  }
  return 0;
}

void sdpa_kernel_table_destroy(sdpa_kernel_table *t) {
  const sdpa_driver *drv = NULL;
  CUcontext saved = NULL;
  int have_driver = 0;
  for (sdpa_kernel_entry *k = t->kernels; k && !have_driver; k = k->next)
    if (k->modules) have_driver = 1;
  if (have_driver && sdpa_driver_get(&drv) != SDPA_STATUS_SUCCESS) drv = NULL;
  if (drv) drv->cuCtxGetCurrent(&saved);

  sdpa_kernel_entry *kernels = t->kernels;
  while (kernels) {
    sdpa_kernel_entry *next = kernels->next;
    sdpa_module_entry *m = kernels->modules;
    while (m) {
      sdpa_module_entry *next_module = m->next;
      if (drv) {
        drv->cuCtxSetCurrent(m->ctx);
        if (m->module) drv->cuModuleUnload(m->module);
        if (m->error_host) drv->cuMemHostUnregister(m->error_host);
      }
      free(m->error_host);
      free(m);
      m = next_module;
    }
    while (kernels->retired) {
      sdpa_retired_cubin *next_retired = kernels->retired->next;
      free(kernels->retired->cubin);
      free(kernels->retired);
      kernels->retired = next_retired;
    }
    free(kernels->key_text);
    free(kernels->cubin);
    free(kernels->compile_log);
    free(kernels);
    kernels = next;
  }
  if (drv) drv->cuCtxSetCurrent(saved);
  while (t->inflight) {
    sdpa_inflight *next = t->inflight->next;
    free(t->inflight);
    t->inflight = next;
  }
  pthread_cond_destroy(&t->done);
  pthread_mutex_destroy(&t->lock);
  t->kernels = NULL;
}

/* The row of a key (hash and full text). Lock held. */
static sdpa_kernel_entry *find_entry(sdpa_kernel_table *t, const sdpa_key *key) {
  for (sdpa_kernel_entry *e = t->kernels; e; e = e->next)
    if (strcmp(e->hash, key->hash) == 0 && strcmp(e->key_text, key->text) == 0) return e;
  return NULL;
}

/* The in-flight link of a hash, or NULL. Lock held. */
static sdpa_inflight **find_inflight(sdpa_kernel_table *t, const char *hash) {
  for (sdpa_inflight **p = &t->inflight; *p; p = &(*p)->next)
    if (strcmp((*p)->hash, hash) == 0) return p;
  return NULL;
}

sdpa_status sdpa_kernel_table_find_or_claim(sdpa_kernel_table *t, const sdpa_key *key,
                                            sdpa_kernel_entry **entry, int *claimed) {
  *entry = NULL;
  *claimed = 0;
  pthread_mutex_lock(&t->lock);
  for (;;) {
    *entry = find_entry(t, key);
    if (*entry || !find_inflight(t, key->hash)) break;
    pthread_cond_wait(&t->done, &t->lock);
  }
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (!*entry) {
    sdpa_inflight *flight = calloc(1, sizeof *flight);
    if (!flight) {
      status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY, "out of host memory compiling a kernel");
    } else {
      memcpy(flight->hash, key->hash, sizeof flight->hash);
      flight->next = t->inflight;
      t->inflight = flight;
      *claimed = 1;
    }
  }
  pthread_mutex_unlock(&t->lock);
  return status;
}

sdpa_status sdpa_kernel_table_publish(sdpa_kernel_table *t, const sdpa_key *key, void *cubin,
                                      size_t size, const char *log, int stored,
                                      sdpa_kernel_entry **entry) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_kernel_entry *fresh = NULL;
  *entry = NULL;
  if (cubin) {
    fresh = calloc(1, sizeof *fresh);
    if (fresh) {
      fresh->key_text = strdup(key->text);
      fresh->compile_log = strdup(log ? log : "");
    }
    if (!fresh || !fresh->key_text || !fresh->compile_log) {
      status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                              "out of host memory keeping a compiled kernel");
      if (fresh) {
        free(fresh->key_text);
        free(fresh->compile_log);
        free(fresh);
        fresh = NULL;
      }
      free(cubin);
    } else {
      memcpy(fresh->hash, key->hash, sizeof fresh->hash);
      fresh->cubin = cubin;
      fresh->cubin_size = size;
      fresh->stored = stored;
    }
  }
  pthread_mutex_lock(&t->lock);
  sdpa_inflight **link = find_inflight(t, key->hash);
  if (link) {
    sdpa_inflight *node = *link;
    *link = node->next;
    free(node);
  }
  if (fresh) {
    fresh->next = t->kernels;
    t->kernels = fresh;
    *entry = fresh;
  }
  pthread_cond_broadcast(&t->done);
  pthread_mutex_unlock(&t->lock);
  return status;
}
