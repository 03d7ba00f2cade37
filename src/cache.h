/*
 * cache.h — the SQLite kernel cache: layers, rows, single-flight locks.
 *
 * Layers searched in order: read-only shipped databases (opened immutable)
 * → the user's database. (The in-process kernel table sits above both,
 * kernel_table.c.) The schema is cache/schema.sql, embedded at build time.
 *
 * Rules (DESIGN.md, and the trust model in sdpa_jit.h): WAL,
 * synchronous=NORMAL, a busy timeout, BEGIN IMMEDIATE for writes on a
 * connection of their own (lookups never wait for a writer), no
 * transaction open while NVRTC runs, application_id + user_version, a hit
 * writes nothing (hit counts are kept in memory and flushed by
 * sdpa_cache_close), an XXH3-64 checksum per cubin (an HMAC-SHA256 too
 * with a keyed checksum) and the caller's check of the blob before it is
 * returned, the full key text compared on a hit, the user's directory and
 * file checked to be the user's own, a damaged file that is ours moved
 * aside and recreated, a file that is not provably ours left byte for
 * byte, an unusable location failing open (in memory, one warning) unless
 * the cache is required, a size cap with least-recently-used pruning
 * counted in real blob bytes.
 *
 * The implementation: cache.c (open, close, the layered lookup and store
 * policy), cache_file.c (locations, trust, attaching, recovering),
 * cache_rows.c (reading, writing and pruning rows), cache_hits.c (hit
 * counts), cache_lock.c (per-key locks), cache_inspect.c (the public
 * inspection calls), over cache_internal.h.
 */
#ifndef SDPA_CACHE_H
#define SDPA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "key_fields.h"
#include "sdpa_jit.h"

typedef struct sdpa_cache sdpa_cache;

/* PRAGMA application_id of a cache file (0x53445041, "SDPA") and the
 * layout version it carries in PRAGMA user_version; both are set by
 * cache/schema.sql and must match it. Version 1 files (no family, lse,
 * deterministic, even, dq and mac columns) are migrated when opened for
 * writing and read as they are otherwise; a newer version is left
 * untouched. */
#define SDPA_CACHE_APPLICATION_ID 0x53445041
#define SDPA_CACHE_SCHEMA_VERSION 2

/* What is stored with every cubin besides its bytes (the readable
 * columns, see cache/schema.sql). */
typedef struct sdpa_cache_meta {
  const char *key_hash;             /* 32 hex digits                        */
  const char *key_text;             /* canonical key text                   */
  const sdpa_key_fields *fields;    /* its fields; NULL: those columns NULL */
  const char *nvrtc_version;
  double compile_ms;
  const char *compile_log;          /* may be NULL */
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
  sdpa_cache_access access;         /* READ_WRITE (default), READ_ONLY  */
  int required;                     /* the user's database must be usable */
  const char *key_file;             /* keyed checksums (sdpa_jit.h)     */
} sdpa_cache_config;

/* Resolves the default path: $SDPA_JIT_CACHE, else
 * $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else
 * $HOME/.cache/sdpa-jit/kernels.sqlite, else $TMPDIR (or /tmp)
 * /sdpa-jit-<uid>/kernels.sqlite (used only when that directory is the
 * user's own). Writes into buf; returns buf. */
char *sdpa_cache_default_path(char *buf, size_t size);

/* Opens the layers. Fails on bad arguments, out of memory, or — with
 * cfg->required — when the user's database cannot be used
 * (SDPA_STATUS_CACHE_ERROR, the reason in the message). Otherwise never
 * fails because of the files themselves: a damaged user database that is
 * ours is moved aside (<path>.corrupt-<time>-<pid>; older such copies
 * beyond the two newest are removed) and recreated with a warning; a
 * location that cannot be used, or a file that is not provably ours,
 * leaves the cache in memory-only mode with one warning; a shipped
 * database that cannot be opened is skipped with a warning. */
sdpa_status sdpa_cache_open(sdpa_cache **out, const sdpa_cache_config *cfg);

/* Flushes hit counters (one short write transaction) and closes. NULL ok. */
void sdpa_cache_close(sdpa_cache *cache);

/* The user's database path (canonical), or NULL in memory-only mode. */
const char *sdpa_cache_path(const sdpa_cache *cache);

/* Nonzero when stores can reach the user's database (opened for writing,
 * not read-only). */
int sdpa_cache_writable(const sdpa_cache *cache);

/* A check of a cached blob (the cache itself knows bytes only): 0 when it
 * is fit to be loaded, else nonzero with the reason in `why`. `row_arch`
 * is the row's arch column (advisory: a lookup's check compares with the
 * key it was asked for; -1 when unknown). */
typedef int (*sdpa_cache_blob_check)(const void *blob, size_t size, int row_arch,
                                     void *context, char *why, size_t why_size);

/* Looks a key up in the shipped databases, then the user's. On a hit
 * returns SUCCESS with *cubin (malloc'd, caller frees) and *size, and
 * *source = SDPA_SOURCE_SHIPPED or SDPA_SOURCE_DISK; counts the hit in
 * memory. A row whose key text differs is a miss. A row whose checksum
 * (or MAC) fails, or whose blob `check` (may be NULL) refuses, is deleted
 * from the user's database (skipped in a shipped or read-only one) with a
 * warning, and the lookup goes on. Returns SDPA_STATUS_NOT_FOUND on a
 * miss; database errors (I/O) are reported as a miss after a warning,
 * never as a failure. Never waits for another connection's write. */
sdpa_status sdpa_cache_lookup(sdpa_cache *cache, const char *key_hash,
                              const char *key_text, sdpa_cache_blob_check check,
                              void *check_context, void **cubin, size_t *size,
                              sdpa_source *source);

/* Stores a freshly compiled cubin in the user's database (BEGIN IMMEDIATE
 * on the write connection, INSERT OR REPLACE, then prune to the size
 * cap). A failure (disk full, read-only file, another writer holding the
 * lock past the busy timeout) warns once and returns SUCCESS: the cache
 * only loses the row; after a busy timeout stores are skipped for a while
 * (the store back-off) so that misses do not each wait again. In
 * memory-only or read-only mode does nothing. OUT `stored` (may be NULL)
 * says whether the row was written. */
sdpa_status sdpa_cache_store(sdpa_cache *cache, const sdpa_cache_meta *meta,
                             const void *cubin, size_t size, int *stored);

/* Deletes a row from the user's database (the driver rejected its cubin). */
void sdpa_cache_remove(sdpa_cache *cache, const char *key_hash);

/* Cross-process single flight for one key: an flock() on
 * <db dir>/locks/<key_hash>.lock, opened without following links and
 * without blocking and checked to be a regular file, waited for at most
 * the configured timeout (a crashed holder's lock is released by the
 * kernel). *out is NULL when there is nothing to lock (memory-only or
 * read-only mode), the lock file is not usable, or the wait timed out
 * (then the caller compiles anyway). Never fails. */
typedef struct sdpa_cache_lock sdpa_cache_lock;
void sdpa_cache_lock_key(sdpa_cache *cache, const char *key_hash,
                         sdpa_cache_lock **out);
void sdpa_cache_unlock_key(sdpa_cache_lock *lock);

/* Inspection, for the public sdpa_cache_* calls (runtime.c forwards).
 * Each reads through connections of its own, so the lookups of other
 * threads never wait for a scan. */
sdpa_status sdpa_cache_foreach_entry(sdpa_cache *cache, sdpa_cache_entry_fn fn,
                                     void *user);
sdpa_status sdpa_cache_list_entries(sdpa_cache *cache, sdpa_cache_entry **out,
                                    size_t *count);
sdpa_status sdpa_cache_get_entry(sdpa_cache *cache, const char *key,
                                 sdpa_cache_entry **out);
sdpa_status sdpa_cache_read_cubin(sdpa_cache *cache, const char *key,
                                  void **out, size_t *size);
sdpa_status sdpa_cache_get_stats(sdpa_cache *cache, sdpa_cache_stats *out);
/* Verify: every row's checksum (MAC when keyed), its blob through `check`
 * (may be NULL) and each file's integrity; bad rows of the user's writable
 * database removed; `fn` (may be NULL) told of each. */
sdpa_status sdpa_cache_verify_all(sdpa_cache *cache, sdpa_cache_blob_check check,
                                  void *check_context, sdpa_cache_problem_fn fn,
                                  void *user, int64_t *checked, int64_t *removed);
sdpa_status sdpa_cache_prune_rows(sdpa_cache *cache, int64_t max_bytes,
                                  int64_t older_than_seconds,
                                  int64_t *removed);
void sdpa_cache_free_entries(sdpa_cache_entry *entries, size_t count);

/* The embedded cache/schema.sql text (generated at build time). */
extern const char sdpa_embedded_schema_sql[];

#endif /* SDPA_CACHE_H */
