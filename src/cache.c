/*
 * cache.c — the kernel cache's policy: which layers exist, the order a
 * lookup searches them, what a store writes, and what a failure costs.
 *
 * A cache is a list of layers: the read-only databases shipped with an
 * image (opened with immutable=1, never written), then the user's database
 * (cache/schema.sql, WAL). A lookup returns the first row whose key hash
 * and full key text match and whose blob passes its checks (cache_rows.c);
 * a store writes one row into the user's database and prunes it to its
 * size cap, least recently used first.
 *
 * Why it is shaped this way (DESIGN.md, "Specialization key and cache"):
 * - A hit writes nothing (cache_hits.c). Readers never queue.
 * - Writes are BEGIN IMMEDIATE on a connection of their own, short (one
 *   INSERT, or one prune), never overlapping the NVRTC compile that
 *   produced the row. A writer that holds SQLite's lock (a process stopped
 *   inside its transaction) makes this process's stores wait at most the
 *   busy timeout, once: then stores are skipped for STORE_BACKOFF_MS, and
 *   lookups, on their own connection, never wait at all.
 * - The cache fails open unless it is required. A location that cannot be
 *   used (untrusted, not ours, not writable, a newer layout) leaves the
 *   cache in memory-only mode; a read-only file is still searched; a
 *   damaged file that is ours is moved aside and replaced (cache_file.c).
 *   Each warns once through the log callback.
 * - With a keyed checksum every row carries an HMAC-SHA256 (mac.h); the
 *   secret is read once, here.
 */
#include "cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_internal.h"

/* ----------------------------------------------------------- the secret */

/* Reads the keyed-checksum secret: cfg->key_file, else
 * $SDPA_JIT_CACHE_KEY_FILE, else $SDPA_JIT_CACHE_KEY. The file must be a
 * regular file (not a link) owned by root or the user and writable by
 * nobody else. Returns 0 (none configured, or read), -1 with `why`. */
static int read_secret(sdpa_cache *cache, const char *key_file, char *why,
                       size_t why_size) {
  const char *file = key_file && *key_file ? key_file : getenv("SDPA_JIT_CACHE_KEY_FILE");
  const char *inline_key = getenv("SDPA_JIT_CACHE_KEY");
  if (file && *file) {
    int fd = open(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      snprintf(why, why_size, "cannot open the checksum key file %s (%s)", file,
               strerror(errno));
      if (fd >= 0) close(fd);
      return -1;
    }
    if (!S_ISREG(st.st_mode) || (st.st_uid != 0 && st.st_uid != geteuid()) ||
        (st.st_mode & (S_IWGRP | S_IWOTH))) {
      snprintf(why, why_size,
               "the checksum key file %s must be a regular file owned by root or this "
               "user and writable by nobody else",
               file);
      close(fd);
      return -1;
    }
    ssize_t got = read(fd, cache->mac_key, sizeof cache->mac_key);
    close(fd);
    if (got < 0) {
      snprintf(why, why_size, "cannot read the checksum key file %s", file);
      return -1;
    }
    cache->mac_key_bytes = (size_t)got;
    while (cache->mac_key_bytes > 0 && (cache->mac_key[cache->mac_key_bytes - 1] == '\n' ||
                                        cache->mac_key[cache->mac_key_bytes - 1] == '\r'))
      cache->mac_key_bytes--;
  } else if (inline_key && *inline_key) {
    size_t n = strlen(inline_key);
    if (n > sizeof cache->mac_key) n = sizeof cache->mac_key;
    memcpy(cache->mac_key, inline_key, n);
    cache->mac_key_bytes = n;
  } else {
    return 0;
  }
  if (cache->mac_key_bytes < 16) {
    snprintf(why, why_size, "the checksum key has %zu bytes; it needs at least 16",
             cache->mac_key_bytes);
    memset(cache->mac_key, 0, sizeof cache->mac_key);
    cache->mac_key_bytes = 0;
    return -1;
  }
  cache->keyed = 1;
  return 0;
}

/* ---------------------------------------------------------- open, close */

sdpa_status sdpa_cache_open(sdpa_cache **out, const sdpa_cache_config *cfg) {
  static const sdpa_cache_config defaults = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  warning_list warnings = {0};
  sdpa_cache *cache = NULL;
  char path[4096], why[512];
  int locks = 0;

  if (!out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_open: out is NULL; pass the address of an "
                          "sdpa_cache pointer");
  *out = NULL;
  if (!cfg) cfg = &defaults;
  if (cfg->readonly_count > 0 && !cfg->readonly_paths)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "readonly_cache_paths is NULL but readonly_cache_count is "
                          "%zu; pass an array of %zu paths or a count of 0",
                          cfg->readonly_count, cfg->readonly_count);
  for (size_t i = 0; i < cfg->readonly_count; i++)
    if (!cfg->readonly_paths[i] || !cfg->readonly_paths[i][0])
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "readonly_cache_paths[%zu] is %s; every shipped cache "
                            "needs a file path",
                            i, cfg->readonly_paths[i] ? "empty" : "NULL");
  if (cfg->access != SDPA_CACHE_READ_WRITE && cfg->access != SDPA_CACHE_READ_ONLY &&
      cfg->access != SDPA_CACHE_READ_WRITE_EXISTING)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.cache_access = %d is not valid: use "
                          "SDPA_CACHE_READ_WRITE (0), SDPA_CACHE_READ_ONLY (1) or "
                          "SDPA_CACHE_READ_WRITE_EXISTING (2)",
                          (int)cfg->access);

  cache = calloc(1, sizeof *cache);
  if (!cache) goto out_of_memory;
  if (pthread_mutex_init(&cache->read_lock, NULL) != 0) goto no_locks;
  if (pthread_mutex_init(&cache->write_lock, NULL) != 0) {
    pthread_mutex_destroy(&cache->read_lock);
    goto no_locks;
  }
  if (cache_hits_init(&cache->hits) != 0) {
    pthread_mutex_destroy(&cache->read_lock);
    pthread_mutex_destroy(&cache->write_lock);
    goto no_locks;
  }
  locks = 1;
  cache->log = cfg->log;
  cache->log_user = cfg->log_user;
  cache->max_bytes = cfg->max_bytes > 0 ? cfg->max_bytes : DEFAULT_MAX_BYTES;
  cache->lock_timeout_ms =
      cfg->lock_timeout_ms > 0 ? cfg->lock_timeout_ms : DEFAULT_LOCK_TIMEOUT_MS;
  cache->access = cfg->access;
  cache->required = cfg->required;

  if (read_secret(cache, cfg->key_file, why, sizeof why) != 0) {
    /* A configured secret that cannot be used: no database is trusted. */
    if (cfg->required) {
      status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR, "%s", why);
      goto fail;
    }
    cache_warn(&warnings,
               "%s: no kernel cache is used (compiled kernels are kept in memory for "
               "this process only)",
               why);
    cache_emit(cache, &warnings);
    *out = cache;
    return SDPA_STATUS_SUCCESS;
  }

  if (cfg->readonly_count > 0) {
    cache->shipped = calloc(cfg->readonly_count, sizeof *cache->shipped);
    if (!cache->shipped) goto out_of_memory;
    cache->shipped_count = cfg->readonly_count;
    for (size_t i = 0; i < cfg->readonly_count; i++) {
      cache_layer *layer = &cache->shipped[i];
      layer->shipped = layer->readonly = 1;
      layer->path = strdup(cfg->readonly_paths[i]);
      if (!layer->path) goto out_of_memory;
      if (cache_shipped_attach(layer, why, sizeof why) != 0)
        cache_warn(&warnings,
                   "skipping the shipped kernel cache %s (%s); kernels it would have "
                   "provided are compiled instead",
                   layer->path, why);
    }
  }

  if (!cfg->disabled) {
    if (cfg->path && cfg->path[0])
      snprintf(path, sizeof path, "%s", cfg->path);
    else
      sdpa_cache_default_path(path, sizeof path);
    if (!path[0] || (cfg->path && strlen(cfg->path) >= sizeof path)) {
      status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                              "the kernel cache path is too long (at most %zu bytes)",
                              sizeof path - 1);
      cache_warn(&warnings, "%s: compiled kernels are kept in memory for this process "
                            "only; set SDPA_JIT_CACHE to a shorter path",
                 sdpa_last_error());
    } else {
      status = cache_user_open(cache, path, &warnings);
    }
    if (status != SDPA_STATUS_SUCCESS) {
      if (cfg->required) goto fail;
      status = SDPA_STATUS_SUCCESS;
    }
  }
  cache_emit(cache, &warnings);
  *out = cache;
  return status;

no_locks:
  free(cache);
  return sdpa_error_set(SDPA_STATUS_INTERNAL, "sdpa_cache_open: pthread_mutex_init failed");
out_of_memory:
  status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY, "sdpa_cache_open: out of host memory");
fail:
  if (locks) {
    sdpa_cache_close(cache);
  } else {
    free(cache);
  }
  return status;
}

void sdpa_cache_close(sdpa_cache *cache) {
  if (!cache) return;
  pthread_mutex_lock(&cache->write_lock);
  pthread_mutex_lock(&cache->read_lock);
  sqlite3 *db = cache->writer;
  if (db) {
    /* One short transaction for every pending hit; failures are ignored:
     * the counts are advisory. */
    sqlite3_busy_timeout(db, CLOSE_BUSY_TIMEOUT_MS);
    if (cache_begin_write(db, CLOSE_BUSY_TIMEOUT_MS, NULL, 0) == SQLITE_OK) {
      if (cache_hits_write(&cache->hits, db) == SQLITE_OK)
        cache_commit(db, NULL, 0);
      else
        cache_rollback(db);
    }
  }
  for (size_t i = 0; i < cache->shipped_count; i++) {
    sqlite3_close_v2(cache->shipped[i].db);
    free(cache->shipped[i].path);
  }
  free(cache->shipped);
  sqlite3_close_v2(cache->user.db);
  sqlite3_close_v2(cache->writer);
  free(cache->user.path);
  free(cache->dir);
  memset(cache->mac_key, 0, sizeof cache->mac_key);
  pthread_mutex_unlock(&cache->read_lock);
  pthread_mutex_unlock(&cache->write_lock);
  cache_hits_destroy(&cache->hits);
  pthread_mutex_destroy(&cache->read_lock);
  pthread_mutex_destroy(&cache->write_lock);
  free(cache);
}

const char *sdpa_cache_path(const sdpa_cache *cache) {
  if (!cache) return NULL;
  sdpa_cache *c = (sdpa_cache *)cache;
  pthread_mutex_lock(&c->read_lock);
  const char *path = c->user.db ? c->user.path : NULL;
  pthread_mutex_unlock(&c->read_lock);
  return path;
}

int sdpa_cache_writable(const sdpa_cache *cache) {
  if (!cache) return 0;
  sdpa_cache *c = (sdpa_cache *)cache;
  pthread_mutex_lock(&c->write_lock);
  const int writable = c->writer != NULL;
  pthread_mutex_unlock(&c->write_lock);
  return writable;
}

/* ---------------------------------------------------------------- lookup */

/* A bad row of `layer`: removed from the user's writable database, else
 * reported. Called with no lock held; takes them. */
static void bad_row(sdpa_cache *cache, cache_layer *layer, const char *hash,
                    const char *problem, warning_list *w) {
  char why[512] = "";
  if (layer->shipped || layer->readonly) {
    cache_warn(w, "kernel %s in the %skernel cache %s: %s; skipped it (%s)", hash,
               layer->shipped ? "shipped " : "", layer->path, problem,
               layer->shipped ? "rebuild that file"
                              : "the file cannot be written here, so the row stays");
    return;
  }
  pthread_mutex_lock(&cache->write_lock);
  int rc = cache->writer ? cache_row_delete(cache, hash, why, sizeof why) : SQLITE_READONLY;
  pthread_mutex_unlock(&cache->write_lock);
  if (rc == SQLITE_OK)
    cache_warn(w, "kernel %s in the kernel cache %s: %s; removed it (it will be compiled "
                  "again)",
               hash, layer->path, problem);
  else
    cache_warn(w, "kernel %s in the kernel cache %s: %s; skipped it (could not remove "
                  "it: %s)",
               hash, layer->path, problem, why[0] ? why : sqlite3_errstr(rc));
}

/* A read error on the user's layer: replace the file when it is damaged
 * and nobody replaced it since `generation`, else report it. */
static void read_failed(sdpa_cache *cache, cache_layer *layer, int rc,
                        unsigned generation, warning_list *w) {
  if (layer->shipped) {
    pthread_mutex_lock(&cache->read_lock);
    cache_layer_failed(cache, layer, rc, "read", NULL, w);
    pthread_mutex_unlock(&cache->read_lock);
    return;
  }
  pthread_mutex_lock(&cache->write_lock);
  pthread_mutex_lock(&cache->read_lock);
  if (cache->generation == generation && layer->db)
    cache_layer_failed(cache, layer, rc, "read", NULL, w);
  pthread_mutex_unlock(&cache->read_lock);
  pthread_mutex_unlock(&cache->write_lock);
}

sdpa_status sdpa_cache_lookup(sdpa_cache *cache, const char *key_hash, const char *key_text,
                              sdpa_cache_blob_check check, void *check_context,
                              void **cubin, size_t *size, sdpa_source *source) {
  warning_list warnings = {0};
  char hash[33];
  int found = 0;
  if (!cache || !key_text || !cubin || !size)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_lookup: cache, key_text, cubin and size must not "
                          "be NULL");
  if (!cache_normalize_hash(key_hash, hash))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_lookup: key_hash '%s' is not 32 hex digits",
                          key_hash ? key_hash : "(null)");
  *cubin = NULL;
  *size = 0;
  if (source) *source = SDPA_SOURCE_NONE;

  for (size_t i = 0; i < cache_layer_count(cache) && !found; i++) {
    cache_layer *layer = cache_layer_at(cache, i);
    row_verdict verdict = ROW_MISSING;
    char why[512] = "";
    pthread_mutex_lock(&cache->read_lock);
    const unsigned generation = cache->generation;
    int rc = layer->db ? cache_row_fetch(cache, layer->db, hash, key_text, check,
                                         check_context, cubin, size, &verdict, why,
                                         sizeof why)
                       : SQLITE_OK;
    pthread_mutex_unlock(&cache->read_lock);
    if (rc != SQLITE_OK) {
      read_failed(cache, layer, rc, generation, &warnings);
    } else if (verdict == ROW_GOOD) {
      sdpa_source from = layer->shipped ? SDPA_SOURCE_SHIPPED : SDPA_SOURCE_DISK;
      cache_hit_note(&cache->hits, hash, from);
      if (source) *source = from;
      found = 1;
    } else if (verdict == ROW_BAD) {
      bad_row(cache, layer, hash, why, &warnings);
    }
  }
  cache_emit(cache, &warnings);
  if (found) return SDPA_STATUS_SUCCESS;
  return sdpa_error_set(SDPA_STATUS_NOT_FOUND, "no cached kernel for key %s", hash);
}

/* ----------------------------------------------------------------- store */

/* After a store: prunes the user's database when its blobs pass the cap
 * (write_lock held). */
static void enforce_cap(sdpa_cache *cache, const char *keep, warning_list *w) {
  sqlite3 *db = cache->writer;
  sqlite3_stmt *stmt = NULL;
  int64_t total = 0, removed = 0;
  char why[512] = "";
  int rc = sqlite3_prepare_v2(db, "SELECT total(length(cubin)) FROM kernels", -1, &stmt,
                              NULL);
  if (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    total = cache_count_from_double(sqlite3_column_double(stmt, 0));
    rc = SQLITE_OK;
  }
  sqlite3_finalize(stmt);
  if (rc == SQLITE_OK && total > cache->max_bytes)
    rc = cache_prune(cache, cache->max_bytes, -1, keep, &removed, why, sizeof why);
  if (rc != SQLITE_OK && !cache_is_damage(rc) && !cache->store_warned) {
    cache->store_warned = 1;
    cache_warn(w, "could not prune the kernel cache %s to its size cap (%s)",
               cache->user.path, why[0] ? why : sqlite3_errstr(rc));
  }
}

sdpa_status sdpa_cache_store(sdpa_cache *cache, const sdpa_cache_meta *meta,
                             const void *cubin, size_t size, int *stored) {
  warning_list warnings = {0};
  char hash[33], why[512] = "";
  if (stored) *stored = 0;
  if (!cache || !meta || !cubin)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: cache, meta and cubin must not be NULL");
  if (!cache_normalize_hash(meta->key_hash, hash))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: meta->key_hash '%s' is not 32 hex digits",
                          meta->key_hash ? meta->key_hash : "(null)");
  if (!meta->key_text || !meta->key_text[0])
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: meta->key_text is empty; every row needs "
                          "its canonical key text");
  if (size == 0 || size > (size_t)INT32_MAX)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: cubin size %zu is out of range (1 to %d "
                          "bytes)",
                          size, INT32_MAX);

  pthread_mutex_lock(&cache->write_lock);
  if (!cache->writer) goto done; /* memory-only or read-only: nothing to do */
  if (cache_monotonic_ms() < cache->backoff_until_ms) goto done;
  int rc = cache_row_insert(cache, meta, hash, cubin, size, why, sizeof why);
  if (rc != SQLITE_OK) {
    if (cache_is_damage(rc)) {
      pthread_mutex_lock(&cache->read_lock);
      cache_layer_failed(cache, &cache->user, rc, "write", why, &warnings);
      pthread_mutex_unlock(&cache->read_lock);
    } else {
      if (cache_is_busy(rc)) cache->backoff_until_ms = cache_monotonic_ms() + STORE_BACKOFF_MS;
      if (!cache->store_warned) {
        cache->store_warned = 1;
        cache_warn(&warnings,
                   "could not store a kernel in the kernel cache %s (%s)%s; new kernels "
                   "are kept in memory for this process only%s",
                   cache->user.path, why,
                   cache_is_busy(rc) ? ": another process holds its write lock; stores "
                                       "are skipped for a while"
                                     : "",
                   cache_is_busy(rc) ? ""
                                     : "; free disk space or set SDPA_JIT_CACHE to a "
                                       "writable file path");
      }
    }
    goto done;
  }
  if (stored) *stored = 1;
  cache_hit_forget(&cache->hits, hash, SDPA_SOURCE_DISK); /* counts of a replaced row */
  enforce_cap(cache, hash, &warnings);
done:
  pthread_mutex_unlock(&cache->write_lock);
  cache_emit(cache, &warnings);
  return SDPA_STATUS_SUCCESS;
}

void sdpa_cache_remove(sdpa_cache *cache, const char *key_hash) {
  warning_list warnings = {0};
  char hash[33], why[512] = "";
  if (!cache || !cache_normalize_hash(key_hash, hash)) return;
  pthread_mutex_lock(&cache->write_lock);
  if (cache->writer) {
    int rc = cache_row_delete(cache, hash, why, sizeof why);
    if (rc != SQLITE_OK) {
      pthread_mutex_lock(&cache->read_lock);
      cache_layer_failed(cache, &cache->user, rc, "write", why, &warnings);
      pthread_mutex_unlock(&cache->read_lock);
    }
  }
  pthread_mutex_unlock(&cache->write_lock);
  cache_emit(cache, &warnings);
}
