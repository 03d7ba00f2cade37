/*
 * cache.c — the SQLite kernel cache: layers, rows, single-flight locks.
 *
 * What it does. A cache is a list of layers searched in order: the
 * read-only databases shipped with an image (opened with immutable=1, never
 * written), then the user's database (cache/schema.sql, WAL). A lookup
 * returns the first row whose key hash and full key text match and whose
 * cubin passes its XXH3-64 checksum; a store writes one row into the user's
 * database and prunes it to its size cap, least recently used first.
 *
 * Why it is shaped this way (DESIGN.md, "Specialization key and cache"):
 * - A hit writes nothing. Hit counts and last-used times are kept in memory
 *   (`hits`, a small hash table) and written in one short transaction when
 *   the cache is closed, or when pruning needs them. Readers never queue.
 * - Writes are BEGIN IMMEDIATE, short (one INSERT, or one prune), and never
 *   overlap the NVRTC compile that produced the row. SQLITE_BUSY is waited
 *   out by the busy timeout and by retrying BEGIN itself.
 * - The cache fails open. A file that is not a database or is damaged
 *   (SQLITE_NOTADB / SQLITE_CORRUPT, whenever it shows up) is renamed to
 *   <path>.corrupt-<unixtime>-<pid> and a new one is started; another
 *   program's SQLite file (another application_id) is renamed to
 *   <path>.foreign-<unixtime>-<pid>. A location that cannot be used leaves
 *   the cache in memory-only mode (every lookup misses, stores do nothing);
 *   a read-only file is still searched. Each of these warns once through
 *   the log callback and none of them is an error for the caller.
 * - A file written by a newer sdpa-jit (user_version above ours) is never
 *   touched: memory-only mode, and a warning that says where to point
 *   SDPA_JIT_CACHE instead.
 *
 * Threads: one mutex guards every connection and the hit table. It is held
 * across SQLite calls only; warnings are collected while it is held and
 * passed to the log callback after it is released, and the cross-process
 * key lock (flock on <db dir>/locks/<hash>.lock) is waited for without it.
 */
#include "cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "status.h"

#define BUSY_TIMEOUT_MS 10000        /* waiting for another writer        */
#define CLOSE_BUSY_TIMEOUT_MS 2000   /* flushing hit counts at close      */
#define DEFAULT_MAX_BYTES (INT64_C(4) << 30)
#define DEFAULT_LOCK_TIMEOUT_MS 120000
#define LOCK_POLL_MS 10
#define HIT_BUCKETS 256
#define WARNING_SLOTS 4
#define WARNING_BYTES 1536

/* The readable columns of a row, in the order entry_from_row() reads them. */
#define ENTRY_COLUMNS                                                       \
  "key_hash, key_text, arch, dtype, head_dim, head_dim_v, q_tile, "         \
  "kv_tile, warps, stages, mask, layout, nvrtc_version, cubin_bytes, "      \
  "compile_ms, created, last_used, hits"

/* ------------------------------------------------------------------ types */

/* Warnings gathered while the mutex is held, emitted after it is released
 * (a log callback may be slow, or call back into the library). */
typedef struct warning_list {
  int count;
  char text[WARNING_SLOTS][WARNING_BYTES];
} warning_list;

/* Hits of one row since they were last written: counted by lookups,
 * written by sdpa_cache_close (rows of the user's database only). */
typedef struct hit_record {
  char hash[33];
  sdpa_source source; /* SDPA_SOURCE_SHIPPED or SDPA_SOURCE_DISK */
  int64_t hits;
  int64_t last_used;
  struct hit_record *next;
} hit_record;

/* One database the cache searches. */
typedef struct cache_layer {
  char *path;
  sqlite3 *db;  /* NULL: not open (the user's layer in memory-only mode) */
  int shipped;  /* a shipped database: opened immutable, never written    */
  int readonly; /* shipped, or a user file this process may not write     */
  int warned;   /* a read error on this layer was reported already        */
} cache_layer;

struct sdpa_cache {
  pthread_mutex_t mutex; /* guards the layers' connections and `hits` */
  sdpa_log_fn log;
  void *log_user;
  int64_t max_bytes;
  int lock_timeout_ms;
  char *dir;             /* directory of the user's database, or NULL */
  cache_layer user;      /* path NULL when the disk cache is disabled  */
  cache_layer *shipped;
  size_t shipped_count;
  hit_record *hits[HIT_BUCKETS];
  int store_warned;      /* a failing store was reported already       */
};

struct sdpa_cache_lock {
  int fd;
};

/* ---------------------------------------------------------------- helpers */

/* Adds a formatted warning to `w` (dropped when all slots are taken). */
static void warn_add(warning_list *w, const char *fmt, ...) SDPA_PRINTF(2, 3);
static void warn_add(warning_list *w, const char *fmt, ...) {
  if (w->count >= WARNING_SLOTS) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->text[w->count], WARNING_BYTES, fmt, ap);
  va_end(ap);
  w->count++;
}

/* Passes the gathered warnings to the log callback, or writes each as one
 * line on stderr (sdpa_log_emit). Call without the mutex held. */
static void warn_emit(const sdpa_cache *cache, warning_list *w) {
  for (int i = 0; i < w->count; i++)
    sdpa_log_emit(cache->log, cache->log_user, SDPA_LOG_WARNING, w->text[i]);
  w->count = 0;
}

static int64_t now_seconds(void) { return (int64_t)time(NULL); }

/* The readable columns are advisory: anyone can write any number into them
 * (the sqlite3 shell, a damaged or hostile file). Counts read from them are
 * clamped to [0, INT64_MAX] and totals saturate instead of wrapping. */
static int64_t count_add(int64_t a, int64_t b) {
  int64_t sum;
  if (a < 0) a = 0;
  if (b < 0) b = 0;
  return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

static int64_t count_from_double(double v) {
  if (!(v > 0)) return 0; /* also NaN */
  if (v >= 9223372036854775807.0) return INT64_MAX;
  return (int64_t)v;
}

static int64_t monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* XXH3-64 of a cubin as the signed 64-bit integer the checksum column
 * holds (the same bits). */
static int64_t cubin_checksum(const void *data, size_t size) {
  uint64_t hash = XXH3_64bits(data, size);
  int64_t value;
  memcpy(&value, &hash, sizeof value);
  return value;
}

/* Whether the cubin in column `cubin_column` of the current row is
 * present, not empty, and matches the checksum in `checksum_column`. */
static int stored_cubin_intact(sqlite3_stmt *stmt, int cubin_column,
                               int checksum_column) {
  const void *blob = sqlite3_column_blob(stmt, cubin_column);
  int bytes = sqlite3_column_bytes(stmt, cubin_column);
  return blob && bytes > 0 &&
         cubin_checksum(blob, (size_t)bytes) ==
             sqlite3_column_int64(stmt, checksum_column);
}

/* Appends `hash` ("" when NULL) to a list of 33-byte key hashes, growing it
 * as needed. Returns SQLITE_OK, or SQLITE_NOMEM with the list unchanged. */
static int hash_list_add(char (**list)[33], size_t *count, size_t *capacity,
                         const char *hash) {
  if (*count == *capacity) {
    size_t grown = *capacity ? *capacity * 2 : 8;
    void *p = realloc(*list, grown * sizeof **list);
    if (!p) return SQLITE_NOMEM;
    *list = p;
    *capacity = grown;
  }
  snprintf((*list)[(*count)++], 33, "%s", hash ? hash : "");
  return SQLITE_OK;
}

static int is_hex_digit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
         (c >= 'A' && c <= 'F');
}

/* A hex digit in lowercase. */
static char hex_lower(char c) {
  return (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
}

/* Copies a 32-hex-digit key hash into `out` in lowercase. Returns 0 when
 * `hash` is not exactly 32 hex digits. */
static int normalize_hash(const char *hash, char out[33]) {
  if (!hash) return 0;
  for (int i = 0; i < 32; i++) {
    if (!is_hex_digit(hash[i])) return 0;
    out[i] = hex_lower(hash[i]);
  }
  out[32] = '\0';
  return hash[32] == '\0';
}

/* SQLITE_CORRUPT or SQLITE_NOTADB (any extended code): the file is damaged
 * and is to be moved aside. */
static int is_damage(int rc) {
  rc &= 0xff;
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

/* A write refused because the file or its directory may not be written. */
static int is_readonly_error(int rc) {
  rc &= 0xff;
  return rc == SQLITE_READONLY || rc == SQLITE_CANTOPEN || rc == SQLITE_PERM ||
         rc == SQLITE_AUTH;
}

/* Creates `dir` and its missing parents (mode 0700, as the XDG base
 * directory rules ask). Returns 0, or an errno value. */
static int make_directories(const char *dir) {
  size_t length = strlen(dir);
  char *copy = malloc(length + 1);
  int err = 0;
  if (!copy) return ENOMEM;
  memcpy(copy, dir, length + 1);
  for (size_t i = 1; i <= length; i++) {
    if (copy[i] != '/' && copy[i] != '\0') continue;
    if (copy[i - 1] == '/') continue; /* "a//b" */
    char saved = copy[i];
    copy[i] = '\0';
    if (mkdir(copy, 0700) != 0) {
      struct stat st;
      if (errno != EEXIST) {
        err = errno;
        goto done;
      }
      if (stat(copy, &st) != 0) {
        err = errno;
        goto done;
      }
      if (!S_ISDIR(st.st_mode)) {
        err = ENOTDIR;
        goto done;
      }
    }
    copy[i] = saved;
  }
done:
  free(copy);
  return err;
}

/* The directory part of `path` ("." when it has none), malloc'd. */
static char *directory_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  size_t length = (size_t)(slash - path);
  char *dir = malloc(length + 1);
  if (!dir) return NULL;
  memcpy(dir, path, length);
  dir[length] = '\0';
  return dir;
}

/* Renames a damaged or foreign database (and its -wal / -journal files)
 * to <path>.<tag>-<unixtime>-<pid>[-n] and removes its -shm index, so that
 * a new database can start at `path`. Writes the new name into `dest`.
 * Returns 0, or an errno value (the file then stays where it was). */
static int move_aside(const char *path, const char *tag, char *dest,
                      size_t dest_size) {
  struct stat st;
  char from[4200], to[4200];
  int n = snprintf(dest, dest_size, "%s.%s-%lld-%ld", path, tag,
                   (long long)now_seconds(), (long)getpid());
  if (n < 0 || (size_t)n >= dest_size) return ENAMETOOLONG;
  for (int i = 2; lstat(dest, &st) == 0 && i < 100; i++) {
    n = snprintf(dest, dest_size, "%s.%s-%lld-%ld-%d", path, tag,
                 (long long)now_seconds(), (long)getpid(), i);
    if (n < 0 || (size_t)n >= dest_size) return ENAMETOOLONG;
  }
  if (rename(path, dest) != 0) return errno;
  static const char *const companions[] = {"-wal", "-journal"};
  for (size_t i = 0; i < sizeof companions / sizeof companions[0]; i++) {
    snprintf(from, sizeof from, "%s%s", path, companions[i]);
    snprintf(to, sizeof to, "%s%s", dest, companions[i]);
    if (lstat(from, &st) == 0 && rename(from, to) != 0) unlink(from);
  }
  snprintf(from, sizeof from, "%s-shm", path);
  unlink(from);
  return 0;
}

/* Reads the single integer a pragma returns. Returns an SQLite code. */
static int pragma_int(sqlite3 *db, const char *sql, int *value) {
  sqlite3_stmt *stmt = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, NULL);
  if (rc != SQLITE_OK) goto done;
  rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) {
    *value = sqlite3_column_int(stmt, 0);
    rc = SQLITE_OK;
  } else if (rc == SQLITE_DONE) {
    *value = 0;
    rc = SQLITE_OK;
  }
done:
  sqlite3_finalize(stmt);
  return rc;
}

/* Reads a cache file's header: its application_id and user_version.
 * Returns an SQLite code. */
static int read_header(sqlite3 *db, int *app_id, int *version) {
  int rc = pragma_int(db, "PRAGMA application_id", app_id);
  if (rc == SQLITE_OK) rc = pragma_int(db, "PRAGMA user_version", version);
  return rc;
}

/* Runs `sql` (no rows expected) and, on failure, copies SQLite's message
 * into `why`. Returns an SQLite code. */
static int exec_sql(sqlite3 *db, const char *sql, char *why, size_t why_size) {
  char *message = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &message);
  if (rc != SQLITE_OK && why)
    snprintf(why, why_size, "%s", message ? message : sqlite3_errstr(rc));
  sqlite3_free(message);
  return rc;
}

/* Ends a failed write transaction, if one is still open. */
static void rollback(sqlite3 *db) {
  if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

/* BEGIN IMMEDIATE, retried while SQLite answers SQLITE_BUSY (the busy
 * handler covers most waits; BEGIN can still return BUSY at once, e.g.
 * while another connection recovers the WAL) until `timeout_ms` passed. */
static int begin_write(sqlite3 *db, int timeout_ms, char *why, size_t why_size) {
  int64_t deadline = monotonic_ms() + timeout_ms;
  for (;;) {
    int rc = exec_sql(db, "BEGIN IMMEDIATE", why, why_size);
    if ((rc & 0xff) != SQLITE_BUSY || monotonic_ms() >= deadline) return rc;
    sleep_ms(LOCK_POLL_MS);
  }
}

/* COMMIT, or ROLLBACK when it fails. */
static int commit_write(sqlite3 *db, char *why, size_t why_size) {
  int rc = exec_sql(db, "COMMIT", why, why_size);
  if (rc != SQLITE_OK) rollback(db);
  return rc;
}

/* Runs the embedded schema (cache/schema.sql), retrying while busy. */
static int run_schema(sqlite3 *db, char *why, size_t why_size) {
  int64_t deadline = monotonic_ms() + BUSY_TIMEOUT_MS;
  for (;;) {
    int rc = exec_sql(db, sdpa_embedded_schema_sql, why, why_size);
    if (rc == SQLITE_OK) return rc;
    rollback(db);
    if ((rc & 0xff) != SQLITE_BUSY || monotonic_ms() >= deadline) return rc;
    sleep_ms(LOCK_POLL_MS);
  }
}

/* Checks that the `kernels` table has every column the cache reads. */
static int check_layout(sqlite3 *db, char *why, size_t why_size) {
  sqlite3_stmt *stmt = NULL;
  int rc = sqlite3_prepare_v2(
      db,
      "SELECT " ENTRY_COLUMNS ", runtime_version, cubin, checksum, "
      "compile_log FROM kernels LIMIT 0",
      -1, &stmt, NULL);
  if (rc != SQLITE_OK) snprintf(why, why_size, "%s", sqlite3_errmsg(db));
  sqlite3_finalize(stmt);
  return rc;
}

/* ------------------------------------------------------------ hit records */

static unsigned hit_bucket(const char *hash) {
  unsigned value = 0;
  for (int i = 0; i < 2; i++) {
    char c = hash[i];
    value = value * 16 + (unsigned)(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return value % HIT_BUCKETS;
}

static hit_record *hit_find(sdpa_cache *cache, const char *hash,
                            sdpa_source source) {
  for (hit_record *r = cache->hits[hit_bucket(hash)]; r; r = r->next)
    if (r->source == source && strcmp(r->hash, hash) == 0) return r;
  return NULL;
}

/* Counts one hit in memory. Out of memory: the hit goes uncounted. */
static void hit_note(sdpa_cache *cache, const char *hash, sdpa_source source) {
  hit_record *record = hit_find(cache, hash, source);
  if (!record) {
    record = calloc(1, sizeof *record);
    if (!record) return;
    memcpy(record->hash, hash, 33);
    record->source = source;
    unsigned b = hit_bucket(hash);
    record->next = cache->hits[b];
    cache->hits[b] = record;
  }
  record->hits++;
  record->last_used = now_seconds();
}

/* Drops the pending hits of one row (it was replaced or deleted). */
static void hit_forget(sdpa_cache *cache, const char *hash, sdpa_source source) {
  for (hit_record **p = &cache->hits[hit_bucket(hash)]; *p; p = &(*p)->next) {
    if ((*p)->source == source && strcmp((*p)->hash, hash) == 0) {
      hit_record *dead = *p;
      *p = dead->next;
      free(dead);
      return;
    }
  }
}

/* Drops the pending hits of every user row (after they were written), or
 * of every row when `all` is set. */
static void hit_clear(sdpa_cache *cache, int all) {
  for (int b = 0; b < HIT_BUCKETS; b++) {
    hit_record **p = &cache->hits[b];
    while (*p) {
      if (all || (*p)->source == SDPA_SOURCE_DISK) {
        hit_record *dead = *p;
        *p = dead->next;
        free(dead);
      } else {
        p = &(*p)->next;
      }
    }
  }
}

/* Writes the pending hits of user rows inside the caller's write
 * transaction (the caller clears them once it committed). */
static int hit_write(sdpa_cache *cache, sqlite3 *db) {
  sqlite3_stmt *stmt = NULL;
  int rc = SQLITE_OK;
  for (int b = 0; b < HIT_BUCKETS; b++) {
    for (hit_record *r = cache->hits[b]; r; r = r->next) {
      if (r->source != SDPA_SOURCE_DISK) continue;
      if (!stmt) {
        rc = sqlite3_prepare_v2(db,
                                "UPDATE kernels SET hits = hits + ?1, "
                                "last_used = max(last_used, ?2) "
                                "WHERE key_hash = ?3",
                                -1, &stmt, NULL);
        if (rc != SQLITE_OK) goto done;
      }
      sqlite3_bind_int64(stmt, 1, r->hits);
      sqlite3_bind_int64(stmt, 2, r->last_used);
      sqlite3_bind_text(stmt, 3, r->hash, -1, SQLITE_STATIC);
      rc = sqlite3_step(stmt);
      sqlite3_reset(stmt);
      if (rc != SQLITE_DONE) goto done;
      rc = SQLITE_OK;
    }
  }
done:
  sqlite3_finalize(stmt);
  return rc;
}

/* ------------------------------------------------------------ layers */

/* How opening the user's database went. */
typedef enum attach_result {
  ATTACH_WRITABLE, /* ours, schema in place, writable          */
  ATTACH_READONLY, /* ours, schema in place, may not be written */
  ATTACH_DAMAGED,  /* not a database, or corrupt: move aside    */
  ATTACH_FOREIGN,  /* another program's database: move aside    */
  ATTACH_NEWER,    /* a newer sdpa-jit's layout: leave it alone */
  ATTACH_FAILED    /* cannot be used (why says)                 */
} attach_result;

/* Opens the user's database at `path`, checks that it is ours, and
 * creates the schema when the file is new. The header is read before
 * anything is written, so a foreign or newer file is left byte for byte as
 * it was. On ATTACH_WRITABLE / ATTACH_READONLY *out is the connection;
 * otherwise *out is NULL and `why` says what was wrong. */
static attach_result user_attach(const char *path, sqlite3 **out, char *why,
                                 size_t why_size) {
  sqlite3 *db = NULL;
  attach_result result = ATTACH_FAILED;
  int app_id = 0, version = 0;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                           NULL);
  *out = NULL;
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    goto done;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
  rc = read_header(db, &app_id, &version);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    result = is_damage(rc) ? ATTACH_DAMAGED : ATTACH_FAILED;
    goto done;
  }
  if (app_id != 0 && app_id != SDPA_CACHE_APPLICATION_ID) {
    snprintf(why, why_size, "application_id 0x%08x, not 0x%08x",
             (unsigned)app_id, (unsigned)SDPA_CACHE_APPLICATION_ID);
    result = ATTACH_FOREIGN;
    goto done;
  }
  if (version > SDPA_CACHE_SCHEMA_VERSION) {
    snprintf(why, why_size, "schema version %d; this sdpa-jit reads %d",
             version, SDPA_CACHE_SCHEMA_VERSION);
    /* Closing must not checkpoint a WAL into a file we do not own. */
    sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    result = ATTACH_NEWER;
    goto done;
  }
  if (sqlite3_db_readonly(db, "main") == 1) {
    if (version < SDPA_CACHE_SCHEMA_VERSION) {
      snprintf(why, why_size, "the file is read-only and holds no cache yet");
      goto done;
    }
    snprintf(why, why_size, "the file is read-only");
    result = ATTACH_READONLY;
  } else if (version < SDPA_CACHE_SCHEMA_VERSION) {
    rc = run_schema(db, why, why_size);
    if (rc != SQLITE_OK) {
      result = is_damage(rc) ? ATTACH_DAMAGED : ATTACH_FAILED;
      goto done;
    }
    rc = pragma_int(db, "PRAGMA user_version", &version);
    if (rc != SQLITE_OK || version != SDPA_CACHE_SCHEMA_VERSION) {
      snprintf(why, why_size,
               "the embedded schema left user_version %d, expected %d "
               "(a build problem: please report it)",
               version, SDPA_CACHE_SCHEMA_VERSION);
      goto done;
    }
    result = ATTACH_WRITABLE;
  } else {
    /* A no-op on our own files; a file left in another journal mode is
     * switched back. If it cannot be switched now (busy), it still works
     * in its current mode. */
    rc = exec_sql(db, "PRAGMA journal_mode = WAL", why, why_size);
    result = ATTACH_WRITABLE;
    if (is_damage(rc)) {
      result = ATTACH_DAMAGED;
      goto done;
    }
    if (is_readonly_error(rc)) result = ATTACH_READONLY;
  }
  exec_sql(db, "PRAGMA synchronous = NORMAL", NULL, 0);
  rc = check_layout(db, why, why_size);
  if (rc != SQLITE_OK) {
    result = is_damage(rc) ? ATTACH_DAMAGED : ATTACH_FAILED;
    if (result == ATTACH_FAILED)
      snprintf(why + strlen(why), why_size - strlen(why),
               "; its kernels table is not the one sdpa-jit writes");
  }
done:
  if (result == ATTACH_WRITABLE || result == ATTACH_READONLY) {
    *out = db;
  } else {
    sqlite3_close_v2(db);
  }
  return result;
}

/* Moves a damaged (tag "corrupt") or foreign (tag "foreign") user database
 * aside and starts a new one at the same path; without a new one the
 * cache works in memory. `reason` completes "the kernel cache <path> ...".
 * Adds exactly one warning. Called with the mutex held (or while opening). */
static void user_replace(sdpa_cache *cache, warning_list *w, const char *tag,
                         const char *reason) {
  char dest[4200], why[512] = "";
  sqlite3 *db = NULL;
  const char *path = cache->user.path;
  if (cache->user.db) {
    sqlite3_close_v2(cache->user.db);
    cache->user.db = NULL;
  }
  cache->user.readonly = 0;
  int err = move_aside(path, tag, dest, sizeof dest);
  if (err != 0) {
    warn_add(w,
             "the kernel cache %s %s and could not be moved aside (%s): "
             "compiled kernels are kept in memory for this process only; "
             "remove the file or set SDPA_JIT_CACHE to another path",
             path, reason, strerror(err));
    return;
  }
  attach_result result = user_attach(path, &db, why, sizeof why);
  if (result == ATTACH_WRITABLE) {
    cache->user.db = db;
    warn_add(w, "the kernel cache %s %s; moved it to %s and started a new one",
             path, reason, dest);
    return;
  }
  if (db) sqlite3_close_v2(db);
  warn_add(w,
           "the kernel cache %s %s; moved it to %s, but a new one could not "
           "be started (%s): compiled kernels are kept in memory for this "
           "process only; set SDPA_JIT_CACHE to a writable file path",
           path, reason, dest, why);
}

/* Opens the user's database for sdpa_cache_open: creates its directory,
 * then attaches, moves aside or falls back as the file requires. Adds at
 * most one warning. */
static void user_open(sdpa_cache *cache, warning_list *w) {
  const char *path = cache->user.path;
  char why[512] = "", reason[700];
  struct stat st;
  sqlite3 *db = NULL;
  int err = make_directories(cache->dir);
  if (err != 0) {
    warn_add(w,
             "cannot create the directory %s for the kernel cache (%s): "
             "compiled kernels are kept in memory for this process only; "
             "set SDPA_JIT_CACHE to a file in a writable directory",
             cache->dir, strerror(err));
    return;
  }
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    warn_add(w,
             "cannot use %s as the kernel cache: it is %s, not a file; "
             "compiled kernels are kept in memory for this process only; "
             "set SDPA_JIT_CACHE to a file path",
             path, S_ISDIR(st.st_mode) ? "a directory" : "a special file");
    return;
  }
  switch (user_attach(path, &db, why, sizeof why)) {
  case ATTACH_WRITABLE:
    cache->user.db = db;
    break;
  case ATTACH_READONLY:
    cache->user.db = db;
    cache->user.readonly = 1;
    warn_add(w,
             "the kernel cache %s cannot be written (%s): kernels already "
             "in it are used, new ones are kept in memory for this process "
             "only; set SDPA_JIT_CACHE to a writable file path to keep them",
             path, why);
    break;
  case ATTACH_DAMAGED:
    snprintf(reason, sizeof reason, "is not a usable database (%s)", why);
    user_replace(cache, w, "corrupt", reason);
    break;
  case ATTACH_FOREIGN:
    snprintf(reason, sizeof reason,
             "is another program's SQLite database (%s)", why);
    user_replace(cache, w, "foreign", reason);
    break;
  case ATTACH_NEWER:
    warn_add(w,
             "the kernel cache %s was written by a newer sdpa-jit (%s); it "
             "is left untouched and compiled kernels are kept in memory; set "
             "SDPA_JIT_CACHE to another file to keep a cache for this "
             "version",
             path, why);
    break;
  case ATTACH_FAILED:
    warn_add(w,
             "cannot use %s as the kernel cache (%s): compiled kernels are "
             "kept in memory for this process only; set SDPA_JIT_CACHE to a "
             "writable file path",
             path, why);
    break;
  }
}

/* Reacts to a failed read or write on `layer`: a damaged user database is
 * moved aside and replaced; any other error is reported once per layer.
 * `what` names the operation ("read", "write"); `message` is SQLite's
 * message captured when it failed (NULL: the connection's last one). */
static void layer_failed(sdpa_cache *cache, cache_layer *layer, int rc,
                         const char *what, const char *message,
                         warning_list *w) {
  char reason[700];
  if (!message || !message[0])
    message = layer->db ? sqlite3_errmsg(layer->db) : sqlite3_errstr(rc);
  if (!layer->shipped && is_damage(rc)) {
    snprintf(reason, sizeof reason, "is damaged (%s)", message);
    user_replace(cache, w, "corrupt", reason);
    return;
  }
  if (layer->warned) return;
  layer->warned = 1;
  warn_add(w,
           "could not %s the %skernel cache %s (%s); its kernels are treated "
           "as missing%s",
           what, layer->shipped ? "shipped " : "", layer->path, message,
           layer->shipped ? "; rebuild or remove that file"
                          : "; run `sdpa-jit verify`, or set SDPA_JIT_CACHE "
                            "to another file");
}

/* Builds "file:<path>?immutable=1" with the characters URIs reserve
 * escaped. An absolute path gets an empty authority ("file:///..."). */
static char *immutable_uri(const char *path) {
  size_t length = strlen(path);
  char *uri = malloc(length * 3 + 32);
  char *p = uri;
  if (!uri) return NULL;
  p += sprintf(p, path[0] == '/' ? "file://" : "file:");
  for (const unsigned char *s = (const unsigned char *)path; *s; s++) {
    if (*s == '%' || *s == '?' || *s == '#' || *s < 0x20 || *s == 0x7f)
      p += sprintf(p, "%%%02X", *s);
    else
      *p++ = (char)*s;
  }
  strcpy(p, "?immutable=1");
  return uri;
}

/* Opens a shipped database read-only and immutable and checks that it is
 * an sdpa-jit cache this version reads. Returns 0 with *out set, or -1
 * with `why` filled. */
static int shipped_attach(const char *path, sqlite3 **out, char *why,
                          size_t why_size) {
  sqlite3 *db = NULL;
  int app_id = 0, version = 0, ok = -1, rc;
  char *uri = immutable_uri(path);
  *out = NULL;
  if (!uri) {
    snprintf(why, why_size, "out of memory");
    return -1;
  }
  rc = sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    goto done;
  }
  sqlite3_extended_result_codes(db, 1);
  rc = read_header(db, &app_id, &version);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    goto done;
  }
  if (app_id != SDPA_CACHE_APPLICATION_ID) {
    snprintf(why, why_size, "not an sdpa-jit cache (application_id 0x%08x)",
             (unsigned)app_id);
    goto done;
  }
  if (version < 1 || version > SDPA_CACHE_SCHEMA_VERSION) {
    snprintf(why, why_size, "schema version %d; this sdpa-jit reads 1 to %d",
             version, SDPA_CACHE_SCHEMA_VERSION);
    goto done;
  }
  if (check_layout(db, why, why_size) != SQLITE_OK) goto done;
  ok = 0;
done:
  free(uri);
  if (ok == 0)
    *out = db;
  else
    sqlite3_close_v2(db);
  return ok;
}

/* Layer i in search order: the shipped databases, then the user's. */
static cache_layer *layer_at(sdpa_cache *cache, size_t i) {
  return i < cache->shipped_count ? &cache->shipped[i] : &cache->user;
}

static size_t layer_count(const sdpa_cache *cache) {
  return cache->shipped_count + 1;
}

/* ------------------------------------------------------- default path */

char *sdpa_cache_default_path(char *buf, size_t size) {
  const char *value;
  int n;
  if (!buf || size == 0) return buf;
  if ((value = getenv("SDPA_JIT_CACHE")) && *value) {
    n = snprintf(buf, size, "%s", value);
  } else if ((value = getenv("XDG_CACHE_HOME")) && value[0] == '/') {
    /* The XDG rules ignore a relative XDG_CACHE_HOME. */
    n = snprintf(buf, size, "%s/sdpa-jit/kernels.sqlite", value);
  } else if ((value = getenv("HOME")) && *value) {
    n = snprintf(buf, size, "%s/.cache/sdpa-jit/kernels.sqlite", value);
  } else {
    value = getenv("TMPDIR");
    if (!value || !*value) value = "/tmp";
    n = snprintf(buf, size, "%s/sdpa-jit-%ld/kernels.sqlite", value,
                 (long)getuid());
  }
  if (n < 0 || (size_t)n >= size) buf[0] = '\0'; /* did not fit */
  return buf;
}

/* ------------------------------------------------------- open / close */

sdpa_status sdpa_cache_open(sdpa_cache **out, const sdpa_cache_config *cfg) {
  static const sdpa_cache_config defaults = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  warning_list warnings = {0};
  sdpa_cache *cache = NULL;
  char path[4096], why[512];

  if (!out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_open: out is NULL; pass the address of "
                          "an sdpa_cache pointer");
  *out = NULL;
  if (!cfg) cfg = &defaults;
  if (cfg->readonly_count > 0 && !cfg->readonly_paths)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "readonly_cache_paths is NULL but "
                          "readonly_cache_count is %zu; pass an array of %zu "
                          "paths or a count of 0",
                          cfg->readonly_count, cfg->readonly_count);
  for (size_t i = 0; i < cfg->readonly_count; i++)
    if (!cfg->readonly_paths[i] || !cfg->readonly_paths[i][0])
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "readonly_cache_paths[%zu] is %s; every shipped "
                            "cache needs a file path",
                            i, cfg->readonly_paths[i] ? "empty" : "NULL");

  cache = calloc(1, sizeof *cache);
  if (!cache) goto out_of_memory;
  if (pthread_mutex_init(&cache->mutex, NULL) != 0) {
    free(cache);
    return sdpa_error_set(SDPA_STATUS_INTERNAL,
                          "sdpa_cache_open: pthread_mutex_init failed");
  }
  cache->log = cfg->log;
  cache->log_user = cfg->log_user;
  cache->max_bytes = cfg->max_bytes > 0 ? cfg->max_bytes : DEFAULT_MAX_BYTES;
  cache->lock_timeout_ms =
      cfg->lock_timeout_ms > 0 ? cfg->lock_timeout_ms : DEFAULT_LOCK_TIMEOUT_MS;

  if (cfg->readonly_count > 0) {
    cache->shipped = calloc(cfg->readonly_count, sizeof *cache->shipped);
    if (!cache->shipped) goto out_of_memory;
    cache->shipped_count = cfg->readonly_count;
    for (size_t i = 0; i < cfg->readonly_count; i++) {
      cache_layer *layer = &cache->shipped[i];
      layer->shipped = layer->readonly = 1;
      layer->path = strdup(cfg->readonly_paths[i]);
      if (!layer->path) goto out_of_memory;
      if (shipped_attach(layer->path, &layer->db, why, sizeof why) != 0)
        warn_add(&warnings,
                 "skipping the shipped kernel cache %s (%s); kernels it "
                 "would have provided are compiled instead",
                 layer->path, why);
    }
  }

  if (!cfg->disabled) {
    if (cfg->path && cfg->path[0])
      snprintf(path, sizeof path, "%s", cfg->path);
    else
      sdpa_cache_default_path(path, sizeof path);
    if (!path[0] || (cfg->path && strlen(cfg->path) >= sizeof path)) {
      warn_add(&warnings,
               "the kernel cache path is too long (at most %zu bytes): "
               "compiled kernels are kept in memory for this process only; "
               "set SDPA_JIT_CACHE to a shorter path",
               sizeof path - 1);
    } else {
      cache->user.path = strdup(path);
      cache->dir = directory_of(path);
      if (!cache->user.path || !cache->dir) goto out_of_memory;
      user_open(cache, &warnings);
    }
  }
  warn_emit(cache, &warnings);
  *out = cache;
  return status;

out_of_memory:
  sdpa_cache_close(cache);
  return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                        "sdpa_cache_open: out of host memory");
}

void sdpa_cache_close(sdpa_cache *cache) {
  if (!cache) return;
  pthread_mutex_lock(&cache->mutex);
  sqlite3 *db = cache->user.db;
  if (db && !cache->user.readonly) {
    /* One short transaction for every pending hit; failures are ignored:
     * the counts are advisory. */
    sqlite3_busy_timeout(db, CLOSE_BUSY_TIMEOUT_MS);
    if (begin_write(db, CLOSE_BUSY_TIMEOUT_MS, NULL, 0) == SQLITE_OK) {
      if (hit_write(cache, db) == SQLITE_OK)
        commit_write(db, NULL, 0);
      else
        rollback(db);
    }
  }
  hit_clear(cache, 1);
  for (size_t i = 0; i < cache->shipped_count; i++) {
    sqlite3_close_v2(cache->shipped[i].db);
    free(cache->shipped[i].path);
  }
  free(cache->shipped);
  sqlite3_close_v2(cache->user.db);
  free(cache->user.path);
  free(cache->dir);
  pthread_mutex_unlock(&cache->mutex);
  pthread_mutex_destroy(&cache->mutex);
  free(cache);
}

const char *sdpa_cache_path(const sdpa_cache *cache) {
  if (!cache) return NULL;
  sdpa_cache *mutable_cache = (sdpa_cache *)cache;
  pthread_mutex_lock(&mutable_cache->mutex);
  const char *path = cache->user.db ? cache->user.path : NULL;
  pthread_mutex_unlock(&mutable_cache->mutex);
  return path;
}

/* ------------------------------------------------------ rows */

/* Reads the cubin of row `hash` from `db`. With `key_text`, a row whose
 * text differs is a miss. Returns SQLITE_ROW with *out (malloc'd) and
 * *size on a hit, SQLITE_DONE on a miss (*bad set when the row exists but
 * fails its checksum), or an SQLite error code. */
static int row_fetch(sqlite3 *db, const char *hash, const char *key_text,
                     void **out, size_t *size, int *bad) {
  sqlite3_stmt *stmt = NULL;
  *bad = 0;
  int rc = sqlite3_prepare_v2(
      db, "SELECT key_text, cubin, checksum FROM kernels WHERE key_hash = ?1",
      -1, &stmt, NULL);
  if (rc != SQLITE_OK) goto done;
  sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
  rc = sqlite3_step(stmt);
  if (rc != SQLITE_ROW) goto done;
  const char *text = (const char *)sqlite3_column_text(stmt, 0);
  if (key_text && (!text || strcmp(text, key_text) != 0)) {
    rc = SQLITE_DONE; /* a hash collision, or a forged row: a miss */
    goto done;
  }
  if (!stored_cubin_intact(stmt, 1, 2)) {
    *bad = 1;
    rc = SQLITE_DONE;
    goto done;
  }
  const void *blob = sqlite3_column_blob(stmt, 1);
  int bytes = sqlite3_column_bytes(stmt, 1);
  *out = malloc((size_t)bytes);
  if (!*out) {
    rc = SQLITE_NOMEM;
    goto done;
  }
  memcpy(*out, blob, (size_t)bytes);
  *size = (size_t)bytes;
done:
  sqlite3_finalize(stmt);
  return rc;
}

/* Deletes row `hash` from the user's database in its own transaction.
 * Returns an SQLite code. */
static int row_delete(sdpa_cache *cache, const char *hash, warning_list *w) {
  sqlite3 *db = cache->user.db;
  sqlite3_stmt *stmt = NULL;
  char why[512] = "";
  int rc;
  if (!db || cache->user.readonly) return SQLITE_READONLY;
  rc = begin_write(db, BUSY_TIMEOUT_MS, why, sizeof why);
  if (rc != SQLITE_OK) goto done;
  rc = sqlite3_prepare_v2(db, "DELETE FROM kernels WHERE key_hash = ?1", -1,
                          &stmt, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
    rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(stmt);
  if (rc == SQLITE_OK) {
    rc = commit_write(db, why, sizeof why);
  } else {
    snprintf(why, sizeof why, "%s", sqlite3_errmsg(db));
    rollback(db);
  }
done:
  hit_forget(cache, hash, SDPA_SOURCE_DISK);
  if (rc != SQLITE_OK) layer_failed(cache, &cache->user, rc, "write", why, w);
  return rc;
}

/* Removes a row that failed its checksum from the user's database, or
 * reports it in a shipped one (never written). */
static void row_bad(sdpa_cache *cache, cache_layer *layer, const char *hash,
                    warning_list *w) {
  if (layer->shipped) {
    warn_add(w,
             "kernel %s in the shipped kernel cache %s fails its checksum; "
             "skipped it (rebuild that file)",
             hash, layer->path);
    return;
  }
  if (layer->readonly) {
    warn_add(w,
             "kernel %s in the kernel cache %s fails its checksum; skipped "
             "it (the file cannot be written, so the row stays)",
             hash, layer->path);
    return;
  }
  if (row_delete(cache, hash, w) == SQLITE_OK)
    warn_add(w,
             "kernel %s in the kernel cache %s failed its checksum; removed "
             "it (it will be compiled again)",
             hash, layer->path);
}

sdpa_status sdpa_cache_lookup(sdpa_cache *cache, const char *key_hash,
                              const char *key_text, void **cubin,
                              size_t *size, sdpa_source *source) {
  warning_list warnings = {0};
  char hash[33];
  int found = 0;
  if (!cache || !key_text || !cubin || !size)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_lookup: cache, key_text, cubin and "
                          "size must not be NULL");
  if (!normalize_hash(key_hash, hash))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_lookup: key_hash '%s' is not 32 hex "
                          "digits",
                          key_hash ? key_hash : "(null)");
  *cubin = NULL;
  *size = 0;
  if (source) *source = SDPA_SOURCE_NONE;

  pthread_mutex_lock(&cache->mutex);
  for (size_t i = 0; i < layer_count(cache) && !found; i++) {
    cache_layer *layer = layer_at(cache, i);
    int bad = 0;
    if (!layer->db) continue;
    int rc = row_fetch(layer->db, hash, key_text, cubin, size, &bad);
    if (rc == SQLITE_ROW) {
      sdpa_source from = layer->shipped ? SDPA_SOURCE_SHIPPED : SDPA_SOURCE_DISK;
      hit_note(cache, hash, from);
      if (source) *source = from;
      found = 1;
    } else if (bad) {
      row_bad(cache, layer, hash, &warnings);
    } else if (rc != SQLITE_DONE) {
      layer_failed(cache, layer, rc, "read", NULL, &warnings);
    }
  }
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  if (found) return SDPA_STATUS_SUCCESS;
  return sdpa_error_set(SDPA_STATUS_NOT_FOUND, "no cached kernel for key %s",
                        hash);
}

/* Deletes rows until the cubins of the user's database total at most
 * `max_bytes`, least recently used first; never the row `keep` (may be
 * NULL). Runs inside the caller's write transaction; adds the number of
 * rows deleted to *removed. Returns an SQLite code. */
static int prune_to_size(sqlite3 *db, int64_t max_bytes, const char *keep,
                         int64_t *removed) {
  sqlite3_stmt *stmt = NULL, *del = NULL;
  char (*victims)[33] = NULL;
  size_t count = 0, capacity = 0;
  int64_t total = 0;
  int rc = sqlite3_prepare_v2(db,
                              "SELECT key_hash, cubin_bytes FROM kernels "
                              "ORDER BY last_used DESC, created DESC, key_hash",
                              -1, &stmt, NULL);
  if (rc != SQLITE_OK) goto done;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const char *hash = (const char *)sqlite3_column_text(stmt, 0);
    if (!hash) continue;
    total = count_add(total, sqlite3_column_int64(stmt, 1));
    if (total <= max_bytes) continue;
    if (keep && strcmp(hash, keep) == 0) continue; /* counted, never deleted */
    rc = hash_list_add(&victims, &count, &capacity, hash);
    if (rc != SQLITE_OK) goto done;
  }
  if (rc != SQLITE_DONE) goto done;
  rc = sqlite3_prepare_v2(db, "DELETE FROM kernels WHERE key_hash = ?1", -1,
                          &del, NULL);
  for (size_t i = 0; rc == SQLITE_OK && i < count; i++) {
    sqlite3_bind_text(del, 1, victims[i], -1, SQLITE_STATIC);
    rc = sqlite3_step(del);
    sqlite3_reset(del);
    if (rc == SQLITE_DONE) {
      rc = SQLITE_OK;
      *removed += sqlite3_changes(db);
    }
  }
done:
  sqlite3_finalize(stmt);
  sqlite3_finalize(del);
  free(victims);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* One pruning transaction on the user's database: writes pending hits
 * (so recent use counts), deletes rows unused for more than
 * `older_than_seconds` (< 0: none), then least recently used rows past
 * `max_bytes` (< 0: none; `keep` is spared), and hands freed pages back to
 * the file system. Returns an SQLite code and fills `why`. */
static int prune_locked(sdpa_cache *cache, int64_t max_bytes,
                        int64_t older_than_seconds, const char *keep,
                        int64_t *removed, char *why, size_t why_size) {
  sqlite3 *db = cache->user.db;
  sqlite3_stmt *stmt = NULL;
  int64_t count = 0;
  int rc = begin_write(db, BUSY_TIMEOUT_MS, why, why_size);
  if (rc != SQLITE_OK) return rc;
  rc = hit_write(cache, db);
  if (rc == SQLITE_OK && older_than_seconds >= 0) {
    rc = sqlite3_prepare_v2(db, "DELETE FROM kernels WHERE last_used < ?1", -1,
                            &stmt, NULL);
    if (rc == SQLITE_OK) {
      sqlite3_bind_int64(stmt, 1, now_seconds() - older_than_seconds);
      rc = sqlite3_step(stmt);
      if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
        count += sqlite3_changes(db);
      }
    }
    sqlite3_finalize(stmt);
  }
  if (rc == SQLITE_OK && max_bytes >= 0)
    rc = prune_to_size(db, max_bytes, keep, &count);
  if (rc == SQLITE_OK && count > 0)
    rc = exec_sql(db, "PRAGMA incremental_vacuum", why, why_size);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    rollback(db);
    return rc;
  }
  rc = commit_write(db, why, why_size);
  if (rc == SQLITE_OK) {
    hit_clear(cache, 0);
    *removed += count;
  }
  return rc;
}

/* After a store: prunes the user's database when its cubins pass the cap. */
static void enforce_cap(sdpa_cache *cache, const char *keep, warning_list *w) {
  sqlite3 *db = cache->user.db;
  sqlite3_stmt *stmt = NULL;
  int64_t total = 0, removed = 0;
  char why[512] = "";
  int rc = sqlite3_prepare_v2(db, "SELECT total(cubin_bytes) FROM kernels", -1,
                              &stmt, NULL);
  if (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    total = count_from_double(sqlite3_column_double(stmt, 0));
    rc = SQLITE_OK;
  }
  sqlite3_finalize(stmt);
  if (rc == SQLITE_OK && total > cache->max_bytes)
    rc = prune_locked(cache, cache->max_bytes, -1, keep, &removed, why,
                      sizeof why);
  if (rc != SQLITE_OK) layer_failed(cache, &cache->user, rc, "prune", why, w);
}

sdpa_status sdpa_cache_store(sdpa_cache *cache, const sdpa_cache_meta *meta,
                             const void *cubin, size_t size) {
  warning_list warnings = {0};
  sqlite3_stmt *stmt = NULL;
  char hash[33], why[512] = "";
  if (!cache || !meta || !cubin)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: cache, meta and cubin must not "
                          "be NULL");
  if (!normalize_hash(meta->key_hash, hash))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: meta->key_hash '%s' is not 32 "
                          "hex digits",
                          meta->key_hash ? meta->key_hash : "(null)");
  if (!meta->key_text || !meta->key_text[0])
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: meta->key_text is empty; every "
                          "row needs its canonical key text");
  if (size == 0 || size > (size_t)INT32_MAX)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_store: cubin size %zu is out of range "
                          "(1 to %d bytes)",
                          size, INT32_MAX);
  int64_t checksum = cubin_checksum(cubin, size); /* outside the mutex */
  int64_t now = now_seconds();

  pthread_mutex_lock(&cache->mutex);
  sqlite3 *db = cache->user.db;
  if (!db || cache->user.readonly) goto done; /* memory-only: nothing to do */
  int rc = sqlite3_prepare_v2(
      db,
      "INSERT OR REPLACE INTO kernels (key_hash, key_text, arch, dtype, "
      "head_dim, head_dim_v, q_tile, kv_tile, warps, stages, mask, layout, "
      "nvrtc_version, runtime_version, cubin, cubin_bytes, checksum, "
      "compile_ms, compile_log, created, last_used, hits) VALUES (?1, ?2, ?3, "
      "?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
      "?19, ?20, ?20, 0)",
      -1, &stmt, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(stmt, 2, meta->key_text, -1, SQLITE_STATIC);
    sqlite3_bind_int(stmt, 3, meta->arch);
    sqlite3_bind_text(stmt, 4, meta->dtype, -1, SQLITE_STATIC);
    sqlite3_bind_int(stmt, 5, meta->head_dim);
    sqlite3_bind_int(stmt, 6, meta->head_dim_v);
    sqlite3_bind_int(stmt, 7, meta->q_tile);
    sqlite3_bind_int(stmt, 8, meta->kv_tile);
    sqlite3_bind_int(stmt, 9, meta->warps);
    sqlite3_bind_int(stmt, 10, meta->stages);
    sqlite3_bind_text(stmt, 11, meta->mask, -1, SQLITE_STATIC);
    sqlite3_bind_text(stmt, 12, meta->layout, -1, SQLITE_STATIC);
    sqlite3_bind_text(stmt, 13, meta->nvrtc_version, -1, SQLITE_STATIC);
    sqlite3_bind_text(stmt, 14, SDPA_JIT_VERSION_STRING, -1, SQLITE_STATIC);
    sqlite3_bind_blob(stmt, 15, cubin, (int)size, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 16, (int64_t)size);
    sqlite3_bind_int64(stmt, 17, checksum);
    sqlite3_bind_double(stmt, 18, meta->compile_ms);
    sqlite3_bind_text(stmt, 19, meta->compile_log, -1, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 20, now);
    /* The transaction covers the INSERT only. */
    rc = begin_write(db, BUSY_TIMEOUT_MS, why, sizeof why);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(stmt);
      if (rc == SQLITE_DONE) {
        rc = commit_write(db, why, sizeof why);
      } else {
        snprintf(why, sizeof why, "%s", sqlite3_errmsg(db));
        rollback(db);
      }
    }
  } else {
    snprintf(why, sizeof why, "%s", sqlite3_errmsg(db));
  }
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    stmt = NULL;
    if (is_damage(rc)) {
      layer_failed(cache, &cache->user, rc, "write", why, &warnings);
    } else if (!cache->store_warned) {
      cache->store_warned = 1;
      warn_add(&warnings,
               "could not store a kernel in the kernel cache %s (%s); new "
               "kernels are kept in memory for this process only; free disk "
               "space or set SDPA_JIT_CACHE to a writable file path",
               cache->user.path, why);
    }
    goto done;
  }
  hit_forget(cache, hash, SDPA_SOURCE_DISK); /* counts of a replaced row */
  enforce_cap(cache, hash, &warnings);
done:
  sqlite3_finalize(stmt);
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  return SDPA_STATUS_SUCCESS;
}

void sdpa_cache_remove(sdpa_cache *cache, const char *key_hash) {
  warning_list warnings = {0};
  char hash[33];
  if (!cache || !normalize_hash(key_hash, hash)) return;
  pthread_mutex_lock(&cache->mutex);
  if (cache->user.db && !cache->user.readonly) row_delete(cache, hash, &warnings);
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
}

/* ------------------------------------------------------ key locks */

void sdpa_cache_lock_key(sdpa_cache *cache, const char *key_hash,
                         sdpa_cache_lock **out) {
  warning_list warnings = {0};
  char hash[33], *file = NULL;
  int fd = -1;
  if (!out) return;
  *out = NULL;
  if (!cache || !normalize_hash(key_hash, hash) || !cache->dir) return;
  pthread_mutex_lock(&cache->mutex);
  int attached = cache->user.db != NULL;
  pthread_mutex_unlock(&cache->mutex);
  if (!attached) return; /* memory-only: nothing shared to guard */

  if (asprintf(&file, "%s/locks", cache->dir) < 0) {
    file = NULL;
    goto done;
  }
  if (make_directories(file) != 0) goto done;
  free(file);
  if (asprintf(&file, "%s/locks/%s.lock", cache->dir, hash) < 0) {
    file = NULL;
    goto done;
  }
  /* flock needs no write access: a lock file another user made works. */
  fd = open(file, O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) goto done;
  int64_t start = monotonic_ms();
  for (;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno == EINTR) continue;
    int64_t waited = monotonic_ms() - start;
    if (errno != EWOULDBLOCK || waited >= cache->lock_timeout_ms) {
      if (errno == EWOULDBLOCK)
        warn_add(&warnings,
                 "waited %lld ms for another process compiling kernel %s "
                 "(lock %s); compiling it here as well",
                 (long long)waited, hash, file);
      close(fd);
      fd = -1;
      goto done;
    }
    int64_t left = cache->lock_timeout_ms - waited;
    sleep_ms(left < LOCK_POLL_MS ? (int)left : LOCK_POLL_MS);
  }
  *out = malloc(sizeof **out);
  if (!*out) {
    close(fd); /* releases the lock */
    goto done;
  }
  (*out)->fd = fd;
done:
  free(file);
  warn_emit(cache, &warnings);
}

void sdpa_cache_unlock_key(sdpa_cache_lock *lock) {
  if (!lock) return;
  flock(lock->fd, LOCK_UN);
  close(lock->fd);
  free(lock);
}

/* ------------------------------------------------------ inspection */

/* Frees the strings one entry owns (not the entry itself). */
static void entry_strings_free(sdpa_cache_entry *entry) {
  free((void *)entry->key_text);
  free((void *)entry->dtype);
  free((void *)entry->mask);
  free((void *)entry->layout);
  free((void *)entry->nvrtc_version);
}

void sdpa_cache_free_entries(sdpa_cache_entry *entries, size_t count) {
  if (!entries) return;
  for (size_t i = 0; i < count; i++) entry_strings_free(&entries[i]);
  free(entries);
}

/* strdup of a text column; "" for NULL. */
static char *column_strdup(sqlite3_stmt *stmt, int column) {
  const char *text = (const char *)sqlite3_column_text(stmt, column);
  return strdup(text ? text : "");
}

/* Fills `entry` from a row of "SELECT ENTRY_COLUMNS", with the pending
 * in-memory hits of that row added. Returns 0, or -1 out of memory (the
 * entry's strings are then freed). */
static int entry_from_row(sdpa_cache *cache, sqlite3_stmt *stmt,
                          const cache_layer *layer, sdpa_cache_entry *entry) {
  memset(entry, 0, sizeof *entry);
  const char *hash = (const char *)sqlite3_column_text(stmt, 0);
  snprintf(entry->key_hash, sizeof entry->key_hash, "%s", hash ? hash : "");
  entry->key_text = column_strdup(stmt, 1);
  entry->arch = sqlite3_column_int(stmt, 2);
  entry->dtype = column_strdup(stmt, 3);
  entry->head_dim = sqlite3_column_int(stmt, 4);
  entry->head_dim_v = sqlite3_column_int(stmt, 5);
  entry->q_tile = sqlite3_column_int(stmt, 6);
  entry->kv_tile = sqlite3_column_int(stmt, 7);
  entry->warps = sqlite3_column_int(stmt, 8);
  entry->stages = sqlite3_column_int(stmt, 9);
  entry->mask = column_strdup(stmt, 10);
  entry->layout = column_strdup(stmt, 11);
  entry->nvrtc_version = column_strdup(stmt, 12);
  entry->cubin_bytes = count_add(sqlite3_column_int64(stmt, 13), 0);
  entry->compile_ms = sqlite3_column_double(stmt, 14);
  entry->created = sqlite3_column_int64(stmt, 15);
  entry->last_used = sqlite3_column_int64(stmt, 16);
  entry->hits = count_add(sqlite3_column_int64(stmt, 17), 0);
  entry->readonly = layer->shipped;
  if (!entry->key_text || !entry->dtype || !entry->mask || !entry->layout ||
      !entry->nvrtc_version) {
    entry_strings_free(entry);
    memset(entry, 0, sizeof *entry);
    return -1;
  }
  hit_record *pending = hit_find(
      cache, entry->key_hash,
      layer->shipped ? SDPA_SOURCE_SHIPPED : SDPA_SOURCE_DISK);
  if (pending) {
    entry->hits = count_add(entry->hits, pending->hits);
    if (pending->last_used > entry->last_used)
      entry->last_used = pending->last_used;
  }
  return 0;
}

/* Most recently used first; then newest; then by hash, shipped first. */
static int entry_order(const void *a, const void *b) {
  const sdpa_cache_entry *x = a, *y = b;
  if (x->last_used != y->last_used) return x->last_used > y->last_used ? -1 : 1;
  if (x->created != y->created) return x->created > y->created ? -1 : 1;
  int c = strcmp(x->key_hash, y->key_hash);
  if (c != 0) return c;
  return y->readonly - x->readonly;
}

/* Reports a read failure of an inspection call: a damaged user database
 * is moved aside (warning) and the call goes on without its rows; any
 * other error fails the call with CACHE_ERROR. Returns the status. */
static sdpa_status inspect_failed(sdpa_cache *cache, cache_layer *layer, int rc,
                                  warning_list *w) {
  if (!layer->shipped && is_damage(rc)) {
    layer_failed(cache, layer, rc, "read", NULL, w);
    return SDPA_STATUS_SUCCESS;
  }
  if ((rc & 0xff) == SQLITE_NOMEM)
    return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                          "out of host memory reading the kernel cache %s",
                          layer->path);
  return sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                        "could not read the %skernel cache %s: %s; %s",
                        layer->shipped ? "shipped " : "", layer->path,
                        layer->db ? sqlite3_errmsg(layer->db)
                                  : sqlite3_errstr(rc),
                        layer->shipped ? "rebuild or remove that file"
                                       : "retry, or move the file away");
}

sdpa_status sdpa_cache_list_entries(sdpa_cache *cache, sdpa_cache_entry **out,
                                    size_t *count) {
  warning_list warnings = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_cache_entry *entries = NULL;
  size_t used = 0, capacity = 0;
  sqlite3_stmt *stmt = NULL;
  if (!cache || !out || !count)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_list_entries: cache, out and count "
                          "must not be NULL");
  *out = NULL;
  *count = 0;
  pthread_mutex_lock(&cache->mutex);
  for (size_t i = 0; i < layer_count(cache) && status == SDPA_STATUS_SUCCESS;
       i++) {
    cache_layer *layer = layer_at(cache, i);
    if (!layer->db) continue;
    int rc = sqlite3_prepare_v2(layer->db,
                                "SELECT " ENTRY_COLUMNS " FROM kernels", -1,
                                &stmt, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      rc = SQLITE_OK;
      if (used == capacity) {
        size_t grown = capacity ? capacity * 2 : 32;
        void *p = realloc(entries, grown * sizeof *entries);
        if (!p) {
          rc = SQLITE_NOMEM;
          break;
        }
        entries = p;
        capacity = grown;
      }
      if (entry_from_row(cache, stmt, layer, &entries[used]) != 0) {
        rc = SQLITE_NOMEM;
        break;
      }
      used++;
    }
    sqlite3_finalize(stmt);
    stmt = NULL;
    if (rc != SQLITE_OK && rc != SQLITE_DONE)
      status = inspect_failed(cache, layer, rc, &warnings);
  }
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  if (status != SDPA_STATUS_SUCCESS) {
    sdpa_cache_free_entries(entries, used);
    return status;
  }
  if (used > 1) qsort(entries, used, sizeof *entries, entry_order);
  if (used == 0) {
    free(entries);
    entries = NULL;
  }
  *out = entries;
  *count = used;
  return SDPA_STATUS_SUCCESS;
}

/* Finds the row `key` names: a full 32-digit hash, a unique prefix of at
 * least 6 hex digits, or the full key text (the most recently used row of
 * the first layer that has it). Layers are searched in lookup order.
 * On success sets *layer_index and `hash`. Called with the mutex held. */
static sdpa_status find_key(sdpa_cache *cache, const char *key,
                            size_t *layer_index, char hash[33],
                            warning_list *w) {
  size_t length = key ? strlen(key) : 0;
  int hex = length > 0;
  char wanted[33] = "";
  char (*candidates)[33] = NULL;
  size_t candidate_count = 0, candidate_capacity = 0, first_layer = 0;
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sqlite3_stmt *stmt = NULL;
  const char *sql;

  if (!key || !key[0])
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "the cache key is empty; give a key hash, a prefix "
                          "of at least 6 hex digits, or the full key text");
  for (size_t i = 0; i < length && hex; i++) hex = is_hex_digit(key[i]);
  if (hex) {
    if (length < 6 || length > 32)
      return sdpa_error_set(SDPA_STATUS_NOT_FOUND,
                            "no cache entry matches '%s': a key hash has 32 "
                            "hex digits and a prefix needs at least 6",
                            key);
    for (size_t i = 0; i < length; i++) wanted[i] = hex_lower(key[i]);
    wanted[length] = '\0';
    sql = length == 32 ? "SELECT key_hash FROM kernels WHERE key_hash = ?1"
                       : "SELECT key_hash FROM kernels "
                         "WHERE key_hash GLOB ?1 || '*' ORDER BY key_hash";
  } else {
    sql = "SELECT key_hash FROM kernels WHERE key_text = ?1 "
          "ORDER BY last_used DESC, created DESC LIMIT 1";
  }

  for (size_t i = 0; i < layer_count(cache); i++) {
    cache_layer *layer = layer_at(cache, i);
    if (!layer->db) continue;
    int rc = sqlite3_prepare_v2(layer->db, sql, -1, &stmt, NULL);
    if (rc == SQLITE_OK)
      sqlite3_bind_text(stmt, 1, hex ? wanted : key, -1, SQLITE_STATIC);
    while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      const char *found = (const char *)sqlite3_column_text(stmt, 0);
      int seen = 0;
      rc = SQLITE_OK;
      if (!found || strlen(found) != 32) continue;
      for (size_t c = 0; c < candidate_count && !seen; c++)
        seen = strcmp(candidates[c], found) == 0;
      if (seen) continue;
      if (candidate_count == 0) first_layer = i;
      rc = hash_list_add(&candidates, &candidate_count, &candidate_capacity,
                         found);
    }
    sqlite3_finalize(stmt);
    stmt = NULL;
    if (rc != SQLITE_OK && rc != SQLITE_DONE) {
      status = inspect_failed(cache, layer, rc, w);
      if (status != SDPA_STATUS_SUCCESS) goto done;
    }
    if (candidate_count > 0 && (!hex || length == 32)) break;
  }
  if (candidate_count == 0) {
    status = sdpa_error_set(SDPA_STATUS_NOT_FOUND,
                            "no cache entry matches '%s'; give a key hash, a "
                            "prefix of at least 6 hex digits, or the full key "
                            "text (`sdpa-jit ls` lists them)",
                            key);
  } else if (candidate_count > 1) {
    status = sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "the key prefix '%s' matches %zu cache entries "
                            "(%s, %s%s); give more hex digits",
                            key, candidate_count, candidates[0], candidates[1],
                            candidate_count > 2 ? ", ..." : "");
  } else {
    *layer_index = first_layer;
    memcpy(hash, candidates[0], 33);
  }
done:
  free(candidates);
  return status;
}

/* The status when a row found by find_key could not be read back: rc
 * SQLITE_DONE (another process deleted it meanwhile) or a database error
 * (handled by inspect_failed, which may recover the file). */
static sdpa_status row_gone(sdpa_cache *cache, cache_layer *layer, int rc,
                            const char *hash, warning_list *warnings) {
  if (rc == SQLITE_DONE)
    return sdpa_error_set(SDPA_STATUS_NOT_FOUND,
                          "cache entry %s was removed meanwhile", hash);
  sdpa_status status = inspect_failed(cache, layer, rc, warnings);
  if (status == SDPA_STATUS_SUCCESS)
    status = sdpa_error_set(SDPA_STATUS_NOT_FOUND,
                            "cache entry %s was lost with its damaged "
                            "database",
                            hash);
  return status;
}

sdpa_status sdpa_cache_get_entry(sdpa_cache *cache, const char *key,
                                 sdpa_cache_entry **out) {
  warning_list warnings = {0};
  sqlite3_stmt *stmt = NULL;
  sdpa_cache_entry *entry = NULL;
  size_t index = 0;
  char hash[33];
  if (!cache || !out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_get_entry: cache and out must not be "
                          "NULL");
  *out = NULL;
  pthread_mutex_lock(&cache->mutex);
  sdpa_status status = find_key(cache, key, &index, hash, &warnings);
  if (status != SDPA_STATUS_SUCCESS) goto done;
  cache_layer *layer = layer_at(cache, index);
  int rc = sqlite3_prepare_v2(
      layer->db, "SELECT " ENTRY_COLUMNS " FROM kernels WHERE key_hash = ?1",
      -1, &stmt, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
    rc = sqlite3_step(stmt);
  }
  if (rc == SQLITE_ROW) {
    entry = malloc(sizeof *entry);
    if (!entry || entry_from_row(cache, stmt, layer, entry) != 0) {
      free(entry);
      entry = NULL;
      status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                              "out of host memory reading cache entry %s",
                              hash);
    }
  } else {
    status = row_gone(cache, layer, rc, hash, &warnings);
  }
done:
  sqlite3_finalize(stmt);
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  *out = entry;
  return status;
}

sdpa_status sdpa_cache_read_cubin(sdpa_cache *cache, const char *key,
                                  void **out, size_t *size) {
  warning_list warnings = {0};
  size_t index = 0;
  char hash[33];
  int bad = 0;
  if (!cache || !out || !size)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_read_cubin: cache, out and size must "
                          "not be NULL");
  *out = NULL;
  *size = 0;
  pthread_mutex_lock(&cache->mutex);
  sdpa_status status = find_key(cache, key, &index, hash, &warnings);
  if (status != SDPA_STATUS_SUCCESS) goto done;
  cache_layer *layer = layer_at(cache, index);
  int rc = row_fetch(layer->db, hash, NULL, out, size, &bad);
  if (rc == SQLITE_ROW) goto done;
  if (bad) {
    row_bad(cache, layer, hash, &warnings);
    status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                            "the cubin of cache entry %s in %s fails its "
                            "checksum%s",
                            hash, layer->path,
                            layer->readonly
                                ? "; rebuild that file"
                                : "; the row was removed and the kernel will "
                                  "be compiled again when next used");
  } else {
    status = row_gone(cache, layer, rc, hash, &warnings);
  }
done:
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  return status;
}

static int64_t file_bytes(const char *path, const char *suffix) {
  char name[4200];
  struct stat st;
  snprintf(name, sizeof name, "%s%s", path, suffix);
  return stat(name, &st) == 0 ? (int64_t)st.st_size : 0;
}

sdpa_status sdpa_cache_get_stats(sdpa_cache *cache, sdpa_cache_stats *out) {
  warning_list warnings = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sqlite3_stmt *stmt = NULL;
  if (!cache || !out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_get_stats: cache and out must not be "
                          "NULL");
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&cache->mutex);
  for (size_t i = 0; i < layer_count(cache); i++) {
    cache_layer *layer = layer_at(cache, i);
    if (!layer->db) continue;
    int rc = sqlite3_prepare_v2(layer->db,
                                "SELECT count(*), total(cubin_bytes), "
                                "total(hits), total(compile_ms) FROM kernels",
                                -1, &stmt, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      int64_t entries = sqlite3_column_int64(stmt, 0);
      out->entries += entries;
      out->cubin_bytes =
          count_add(out->cubin_bytes, count_from_double(sqlite3_column_double(stmt, 1)));
      out->hits = count_add(out->hits, count_from_double(sqlite3_column_double(stmt, 2)));
      out->compile_ms_total += sqlite3_column_double(stmt, 3);
      if (layer->shipped) out->readonly_entries += entries;
      out->file_bytes += file_bytes(layer->path, "");
      if (!layer->shipped) out->file_bytes += file_bytes(layer->path, "-wal");
    }
    sqlite3_finalize(stmt);
    stmt = NULL;
    if (rc != SQLITE_ROW) {
      status = inspect_failed(cache, layer, rc, &warnings);
      if (status != SDPA_STATUS_SUCCESS) break;
    }
  }
  for (int b = 0; b < HIT_BUCKETS; b++)
    for (hit_record *r = cache->hits[b]; r; r = r->next)
      out->hits = count_add(out->hits, r->hits);
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  return status;
}

/* Checks every row of one layer (and, for the user's database, removes
 * the rows that fail). Returns an SQLite code; counts into the totals. */
static int verify_layer(sdpa_cache *cache, cache_layer *layer, int64_t *checked,
                        int64_t *removed, warning_list *w) {
  sqlite3_stmt *stmt = NULL;
  char (*bad)[33] = NULL;
  size_t bad_count = 0, bad_capacity = 0;
  int rc = sqlite3_prepare_v2(layer->db,
                              "SELECT key_hash, cubin, checksum FROM kernels",
                              -1, &stmt, NULL);
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    (*checked)++;
    rc = SQLITE_OK;
    if (stored_cubin_intact(stmt, 1, 2)) continue;
    rc = hash_list_add(&bad, &bad_count, &bad_capacity,
                       (const char *)sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_OK && rc != SQLITE_DONE) goto done;
  rc = SQLITE_OK;
  for (size_t i = 0; i < bad_count; i++) {
    if (layer->readonly) {
      row_bad(cache, layer, bad[i], w);
    } else {
      rc = row_delete(cache, bad[i], w);
      if (rc != SQLITE_OK) break;
      (*removed)++;
    }
  }
done:
  free(bad);
  return rc;
}

sdpa_status sdpa_cache_verify_all(sdpa_cache *cache, int64_t *checked,
                                  int64_t *removed) {
  warning_list warnings = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int64_t checked_rows = 0, removed_rows = 0;
  if (!cache)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_verify_all: cache is NULL");
  pthread_mutex_lock(&cache->mutex);
  for (size_t i = 0; i < layer_count(cache); i++) {
    cache_layer *layer = layer_at(cache, i);
    sqlite3_stmt *stmt = NULL;
    char verdict[512] = "";
    int64_t rows = 0;
    if (!layer->db) continue;
    /* The file as a whole first: a damaged b-tree cannot be fixed by
     * removing rows. */
    int rc = sqlite3_prepare_v2(layer->db, "PRAGMA integrity_check", -1, &stmt,
                                NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      const char *text = (const char *)sqlite3_column_text(stmt, 0);
      snprintf(verdict, sizeof verdict, "%s", text ? text : "");
      rc = SQLITE_OK;
    }
    sqlite3_finalize(stmt);
    if (rc == SQLITE_OK && strcmp(verdict, "ok") != 0) {
      if (layer->shipped) {
        warn_add(&warnings,
                 "the shipped kernel cache %s fails integrity_check (%s); "
                 "rebuild that file",
                 layer->path, verdict);
      } else if (!layer->readonly) {
        char reason[700];
        int count = 0; /* rows lost with the file, when they can be counted */
        if (pragma_int(layer->db, "SELECT count(*) FROM kernels", &count) ==
            SQLITE_OK)
          rows = count;
        snprintf(reason, sizeof reason, "fails integrity_check (%s)", verdict);
        user_replace(cache, &warnings, "corrupt", reason);
        checked_rows += rows;
        removed_rows += rows;
        continue;
      }
    }
    if (rc == SQLITE_OK)
      rc = verify_layer(cache, layer, &checked_rows, &removed_rows, &warnings);
    if (rc != SQLITE_OK) {
      status = inspect_failed(cache, layer, rc, &warnings);
      if (status != SDPA_STATUS_SUCCESS) break;
    }
  }
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  if (checked) *checked = checked_rows;
  if (removed) *removed = removed_rows;
  return status;
}

sdpa_status sdpa_cache_prune_rows(sdpa_cache *cache, int64_t max_bytes,
                                  int64_t older_than_seconds,
                                  int64_t *removed) {
  warning_list warnings = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int64_t count = 0;
  char why[512] = "";
  if (removed) *removed = 0;
  if (!cache)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_prune_rows: cache is NULL");
  pthread_mutex_lock(&cache->mutex);
  if (!cache->user.db) goto done; /* memory-only: nothing to prune */
  if (cache->user.readonly) {
    status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                            "the kernel cache %s cannot be written; nothing "
                            "was pruned (check the file's permissions)",
                            cache->user.path);
    goto done;
  }
  int rc = prune_locked(cache, max_bytes, older_than_seconds, NULL, &count, why,
                        sizeof why);
  if (rc != SQLITE_OK) {
    if (is_damage(rc))
      layer_failed(cache, &cache->user, rc, "prune", why, &warnings);
    status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                            "could not prune the kernel cache %s: %s%s",
                            cache->user.path, why,
                            is_damage(rc) ? " (the damaged file was moved "
                                            "aside and a new one started)"
                                          : "; retry when no other process "
                                            "is writing to it");
  }
done:
  pthread_mutex_unlock(&cache->mutex);
  warn_emit(cache, &warnings);
  if (removed) *removed = count;
  return status;
}
