/*
 * cache.h — the SQLite kernel cache: layers, rows, single-flight locks.
 *
 * Layers searched in order: read-only shipped databases (opened immutable)
 * → the user's database. (The in-process module table sits above both, in
 * runtime.c.) The schema is cache/schema.sql, embedded at build time.
 *
 * Rules (DESIGN.md): WAL, synchronous=NORMAL, a busy timeout, BEGIN
 * IMMEDIATE for writes, no transaction open while NVRTC runs,
 * application_id + user_version, a hit writes nothing (hit counts are kept
 * in memory and flushed by sdpa_cache_close / flush), an XXH3-64 checksum
 * per cubin checked on load, the full key text compared on a hit, a file
 * that is not a database (or is corrupt) moved aside and recreated, an
 * unwritable location failing open (in memory, one warning), a size cap
 * with least-recently-used pruning.
 */
#ifndef SDPA_CACHE_H
#define SDPA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa_jit.h"

typedef struct sdpa_cache sdpa_cache;

/* PRAGMA application_id of a cache file (0x53445041, "SDPA") and the
 * layout version it carries in PRAGMA user_version; both are set by
 * cache/schema.sql and must match it. A file with another nonzero
 * application_id is moved aside; one with a newer user_version is left
 * untouched (memory-only mode). */
#define SDPA_CACHE_APPLICATION_ID 0x53445041
#define SDPA_CACHE_SCHEMA_VERSION 1

/* Readable columns stored with every cubin (see cache/schema.sql). */
typedef struct sdpa_cache_meta {
  const char *key_hash; /* 32 hex digits                        */
  const char *key_text; /* canonical key text                   */
  int arch;
  const char *dtype;
  int head_dim, head_dim_v;
  int q_tile, kv_tile, warps, stages;
  const char *mask, *layout;
  const char *nvrtc_version;
  double compile_ms;
  const char *compile_log; /* may be NULL */
} sdpa_cache_meta;

typedef struct sdpa_cache_config {
  const char *path;                 /* NULL: default location          */
  const char *const *readonly_paths;
  size_t readonly_count;
  int disabled;                     /* nonzero: no database at all      */
  int64_t max_bytes;                /* <= 0: 4 GiB                      */
  sdpa_log_fn log;                  /* NULL: stderr                     */
  void *log_user;
  int lock_timeout_ms;              /* <= 0: 120000                     */
} sdpa_cache_config;

/* Resolves the default path: $SDPA_JIT_CACHE, else
 * $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else
 * $HOME/.cache/sdpa-jit/kernels.sqlite, else $TMPDIR (or /tmp)
 * /sdpa-jit-<uid>/kernels.sqlite. Writes into buf; returns buf. */
char *sdpa_cache_default_path(char *buf, size_t size);

/* Opens the layers. Never fails because of the files themselves: a
 * damaged user database is moved aside (<path>.corrupt-<time>) and
 * recreated with a warning; a location that cannot be created or written
 * leaves the cache in memory-only mode with one warning; a shipped database
 * that cannot be opened is skipped with a warning. Fails only on bad
 * arguments or out of memory. */
sdpa_status sdpa_cache_open(sdpa_cache **out, const sdpa_cache_config *cfg);

/* Flushes hit counters (one short write transaction) and closes. NULL ok. */
void sdpa_cache_close(sdpa_cache *cache);

/* The user's database path, or NULL in memory-only mode. */
const char *sdpa_cache_path(const sdpa_cache *cache);

/* Looks a key up in the shipped databases, then the user's. On a hit
 * returns SUCCESS with *cubin (malloc'd, caller frees) and *size, and
 * *source = SDPA_SOURCE_SHIPPED or SDPA_SOURCE_DISK; counts the hit in
 * memory. A row whose key text differs is a miss. A row whose checksum
 * fails is deleted from the user's database (skipped in a shipped one) with
 * a warning, and the lookup goes on. Returns SDPA_STATUS_NOT_FOUND on a
 * miss; database errors (busy past the timeout, I/O) are reported as a miss
 * after a warning, never as a failure. */
sdpa_status sdpa_cache_lookup(sdpa_cache *cache, const char *key_hash,
                              const char *key_text, void **cubin,
                              size_t *size, sdpa_source *source);

/* Stores a freshly compiled cubin in the user's database (BEGIN IMMEDIATE,
 * INSERT OR REPLACE, then prune to the size cap). A failure (disk full,
 * read-only file) warns once and returns SUCCESS: the cache only loses the
 * row. In memory-only mode does nothing. */
sdpa_status sdpa_cache_store(sdpa_cache *cache, const sdpa_cache_meta *meta,
                             const void *cubin, size_t size);

/* Deletes a row from the user's database (the driver rejected its cubin). */
void sdpa_cache_remove(sdpa_cache *cache, const char *key_hash);

/* Cross-process single flight for one key: an flock() on
 * <db dir>/locks/<key_hash>.lock, waited for at most the configured
 * timeout (a crashed holder's lock is released by the kernel). *out is
 * NULL when there is nothing to lock (memory-only mode) or the wait timed
 * out (then the caller compiles anyway). Never fails. */
typedef struct sdpa_cache_lock sdpa_cache_lock;
void sdpa_cache_lock_key(sdpa_cache *cache, const char *key_hash,
                         sdpa_cache_lock **out);
void sdpa_cache_unlock_key(sdpa_cache_lock *lock);

/* Inspection, for the public sdpa_cache_* calls (runtime.c forwards). */
sdpa_status sdpa_cache_list_entries(sdpa_cache *cache, sdpa_cache_entry **out,
                                    size_t *count);
sdpa_status sdpa_cache_get_entry(sdpa_cache *cache, const char *key,
                                 sdpa_cache_entry **out);
sdpa_status sdpa_cache_read_cubin(sdpa_cache *cache, const char *key,
                                  void **out, size_t *size);
sdpa_status sdpa_cache_get_stats(sdpa_cache *cache, sdpa_cache_stats *out);
sdpa_status sdpa_cache_verify_all(sdpa_cache *cache, int64_t *checked,
                                  int64_t *removed);
sdpa_status sdpa_cache_prune_rows(sdpa_cache *cache, int64_t max_bytes,
                                  int64_t older_than_seconds,
                                  int64_t *removed);
void sdpa_cache_free_entries(sdpa_cache_entry *entries, size_t count);

/* The embedded cache/schema.sql text (generated at build time). */
extern const char sdpa_embedded_schema_sql[];

#endif /* SDPA_CACHE_H */
