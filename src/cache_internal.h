/*
 * cache_internal.h — what the files of the kernel cache share (cache.h
 * lists them): the cache and layer structs, the two locks and their
 * order, gathered warnings, and the helpers each file provides.
 *
 * Connections. Each layer has a read connection, used by lookups under
 * `read_lock`; the user's database also has a write connection, used by
 * stores, removals, pruning and the hit flush under `write_lock`. A write
 * waits for SQLite's lock (another process writing) holding only
 * `write_lock`, so lookups go on meanwhile. Whoever needs both takes
 * `write_lock` first. Replacing a damaged user database closes and
 * reopens both connections under both locks and bumps `generation`, so
 * a reader that saw the damage under `read_lock` alone can tell whether
 * someone else already replaced it. Inspection opens connections of its
 * own and takes neither lock while it scans.
 *
 * Warnings are gathered while a lock is held and passed to the log
 * callback after it is released (a callback may be slow, or call back
 * into the library).
 */
#ifndef SDPA_CACHE_INTERNAL_H
#define SDPA_CACHE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include "cache.h"
#include "status.h"

#define BUSY_TIMEOUT_MS 10000        /* waiting for another writer        */
#define CLOSE_BUSY_TIMEOUT_MS 2000   /* flushing hit counts at close      */
#define STORE_BACKOFF_MS 30000       /* stores skipped after a busy timeout */
#define DEFAULT_MAX_BYTES (INT64_C(4) << 30)
#define DEFAULT_LOCK_TIMEOUT_MS 120000
#define LOCK_POLL_MS 10
#define HIT_BUCKETS 256
#define WARNING_SLOTS 4
#define WARNING_BYTES 1536
#define CORRUPT_COPIES_KEPT 2        /* moved-aside copies left in place   */
#define MAC_KEY_MAX 1024

/* ---------------------------------------------------------------- warnings */

typedef struct warning_list {
  int count;
  char text[WARNING_SLOTS][WARNING_BYTES];
} warning_list;

/* Adds a formatted warning (dropped when all slots are taken). */
void cache_warn(warning_list *w, const char *fmt, ...) SDPA_PRINTF(2, 3);

/* Passes the gathered warnings to the log callback and empties the list.
 * Call with no lock held. */
void cache_emit(const struct sdpa_cache *cache, warning_list *w);

/* ------------------------------------------------------------------ layers */

/* One database the cache searches. */
typedef struct cache_layer {
  char *path;   /* canonical for the user's database                     */
  sqlite3 *db;  /* read connection; NULL: not open                        */
  int shipped;  /* a shipped database: opened immutable, never written    */
  int readonly; /* shipped, or a user file this process may not write     */
  int immutable;/* opened with immutable=1 (no writer can exist)          */
  int v2;       /* has the second layout's columns (family ... mac)       */
  int warned;   /* a read error on this layer was reported already        */
} cache_layer;

/* Hits of one row since they were last written (cache_hits.c). */
typedef struct hit_record {
  char hash[33];
  sdpa_source source; /* SDPA_SOURCE_SHIPPED or SDPA_SOURCE_DISK */
  int64_t hits;
  int64_t last_used;
  struct hit_record *next;
} hit_record;

typedef struct hit_table {
  pthread_mutex_t lock;
  hit_record *buckets[HIT_BUCKETS];
} hit_table;

struct sdpa_cache {
  sdpa_log_fn log;
  void *log_user;
  int64_t max_bytes;
  int lock_timeout_ms;
  sdpa_cache_access access;
  int required;
  char *dir;             /* canonical directory of the user's database */
  cache_layer user;      /* path NULL when the disk cache is disabled  */
  sqlite3 *writer;       /* the user's write connection, or NULL       */
  cache_layer *shipped;
  size_t shipped_count;
  pthread_mutex_t read_lock;  /* the layers' read connections, warned  */
  pthread_mutex_t write_lock; /* writer, store_warned, backoff_until_ms */
  unsigned generation;   /* bumped when the user's database is replaced */
  hit_table hits;
  int store_warned;      /* a failing store was reported already       */
  int64_t backoff_until_ms; /* stores skipped until then (monotonic)    */
  int keyed;             /* rows carry an HMAC-SHA256 (mac.h)          */
  unsigned char mac_key[MAC_KEY_MAX];
  size_t mac_key_bytes;
};

struct sdpa_cache_lock {
  int fd;
};

/* Layer i in search order: the shipped databases, then the user's. */
static inline cache_layer *cache_layer_at(sdpa_cache *cache, size_t i) {
  return i < cache->shipped_count ? &cache->shipped[i] : &cache->user;
}
static inline size_t cache_layer_count(const sdpa_cache *cache) {
  return cache->shipped_count + 1;
}

/* --------------------------------------------------- helpers (cache_sql.c) */

int64_t cache_now_seconds(void);
int64_t cache_monotonic_ms(void);
void cache_sleep_ms(int ms);
/* Counts read from the advisory columns, clamped to [0, INT64_MAX];
 * totals saturate instead of wrapping. */
int64_t cache_count_add(int64_t a, int64_t b);
int64_t cache_count_from_double(double v);
/* XXH3-64 of a cubin as the signed integer the checksum column holds. */
int64_t cache_checksum(const void *data, size_t size);
/* Copies a 32-hex-digit hash into out in lowercase; 0 when it is not. */
int cache_normalize_hash(const char *hash, char out[33]);
int cache_is_hex(char c);
/* SQLITE_CORRUPT or SQLITE_NOTADB: the file is damaged. */
int cache_is_damage(int rc);
/* SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock. */
int cache_is_busy(int rc);
/* The single integer a statement returns (0 when none). */
int cache_pragma_int(sqlite3 *db, const char *sql, int *value);
/* Runs `sql`, copying SQLite's message into `why` on failure. */
int cache_exec(sqlite3 *db, const char *sql, char *why, size_t why_size);
void cache_rollback(sqlite3 *db);
/* BEGIN IMMEDIATE, retried while busy until `timeout_ms` passed. */
int cache_begin_write(sqlite3 *db, int timeout_ms, char *why, size_t why_size);
/* COMMIT, or ROLLBACK when it fails. */
int cache_commit(sqlite3 *db, char *why, size_t why_size);
/* Whether table `kernels` of `db` has column `name`. */
int cache_has_column(sqlite3 *db, const char *name);

/* ------------------------------------------------ files (cache_file.c) */

/* Opens the user's database as cfg and cache->access say: trust checks,
 * creation (READ_WRITE only), ownership, migration, recovery. Adds at most
 * one warning; when the database cannot be used returns CACHE_ERROR with
 * that text as the message (the caller fails only when required). */
sdpa_status cache_user_open(sdpa_cache *cache, const char *path, warning_list *w);

/* Opens a shipped database immutable and checks it is an sdpa-jit cache
 * this version reads. Returns 0, or -1 with `why`. */
int cache_shipped_attach(cache_layer *layer, char *why, size_t why_size);

/* Opens a fresh read-only connection to `layer` as it was attached (for
 * inspection). Returns an SQLite code. */
int cache_layer_connect(const sdpa_cache *cache, const cache_layer *layer,
                        sqlite3 **out);

/* Reacts to a failed read or write on `layer`: a damaged user database
 * (ours, writable) is moved aside and replaced; any other error is
 * reported once per layer. `what` names the operation; `message` is
 * SQLite's message captured when it failed (NULL: none). Called with both
 * locks held for the user's layer (read_lock for a shipped one). */
void cache_layer_failed(sdpa_cache *cache, cache_layer *layer, int rc,
                        const char *what, const char *message, warning_list *w);

/* Moves the damaged user database aside and starts a new one (both locks
 * held). `reason` completes "the kernel cache <path> ...". */
void cache_user_replace(sdpa_cache *cache, warning_list *w, const char *reason);


/* ------------------------------------------------ rows (cache_rows.c) */

/* What a fetched row is. */
typedef enum row_verdict {
  ROW_GOOD,        /* fits: *out holds the blob                    */
  ROW_MISSING,     /* no such row, or another key text (a miss)    */
  ROW_BAD          /* present but fails a check (why says which)   */
} row_verdict;

/* Reads and checks the cubin of row `hash` (key text `key_text` when not
 * NULL; checksum, MAC when keyed, `check` when not NULL). Returns an
 * SQLite code (SQLITE_OK for any verdict). */
int cache_row_fetch(const sdpa_cache *cache, sqlite3 *db, const char *hash,
                    const char *key_text, sdpa_cache_blob_check check,
                    void *check_context, void **out, size_t *size,
                    row_verdict *verdict, char *why, size_t why_size);

/* Checks a row already read: blob, checksum, optional MAC (mac_text NULL
 * when the column is absent or NULL). 0 when intact, else the reason. */
int cache_row_intact(const sdpa_cache *cache, const char *hash, const char *key_text,
                     const void *blob, int bytes, int64_t checksum,
                     const char *mac_text, char *why, size_t why_size);

/* Deletes row `hash` through the writer in its own transaction (write_lock
 * held). Returns an SQLite code and fills `why`. */
int cache_row_delete(sdpa_cache *cache, const char *hash, char *why, size_t why_size);

/* Writes one row (INSERT OR REPLACE) through the writer in its own
 * transaction (write_lock held). Returns an SQLite code and fills `why`. */
int cache_row_insert(sdpa_cache *cache, const sdpa_cache_meta *meta, const char *hash,
                     const void *cubin, size_t size, char *why, size_t why_size);

/* One pruning transaction on the writer (write_lock held): pending hits,
 * rows unused for more than `older_than_seconds` (< 0: none), least
 * recently used rows past `max_bytes` real blob bytes (< 0: none; `keep`
 * spared), freed pages returned. Then a truncating WAL checkpoint when
 * rows went. Returns an SQLite code and fills `why`. */
int cache_prune(sdpa_cache *cache, int64_t max_bytes, int64_t older_than_seconds,
                const char *keep, int64_t *removed, char *why, size_t why_size);

/* ------------------------------------------------ hits (cache_hits.c) */

int cache_hits_init(hit_table *t);
void cache_hits_destroy(hit_table *t);
void cache_hit_note(hit_table *t, const char *hash, sdpa_source source);
void cache_hit_forget(hit_table *t, const char *hash, sdpa_source source);
int64_t cache_hits_total(hit_table *t);
/* The pending hits at one moment, for a walk that must order rows by the
 * last use it reports: a copy of the records sorted by (hash, source). */
typedef struct hit_snapshot {
  hit_record *records;
  size_t count;
} hit_snapshot;
/* 0, or -1 out of memory (then *out is empty). */
int cache_hits_snapshot(hit_table *t, hit_snapshot *out);
void cache_hits_snapshot_free(hit_snapshot *s);
/* The record of (hash, source) in `s`, or NULL. */
const hit_record *cache_hits_find(const hit_snapshot *s, const char *hash,
                                  sdpa_source source);
/* Writes the pending hits of user rows inside the caller's transaction on
 * `db`; cache_hits_clear_disk drops them once it committed. */
int cache_hits_write(hit_table *t, sqlite3 *db);
void cache_hits_clear_disk(hit_table *t);

#endif /* SDPA_CACHE_INTERNAL_H */
