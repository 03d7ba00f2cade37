/*
 * cache_sql.c — small helpers every file of the cache uses: time, count
 * arithmetic over advisory columns, checksums, key-hash text, SQLite
 * result classes, and the write-transaction idiom (BEGIN IMMEDIATE
 * retried while busy, COMMIT or ROLLBACK).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "cache_internal.h"

void cache_warn(warning_list *w, const char *fmt, ...) {
  if (w->count >= WARNING_SLOTS) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->text[w->count], WARNING_BYTES, fmt, ap);
  va_end(ap);
  w->count++;
}

void cache_emit(const sdpa_cache *cache, warning_list *w) {
  for (int i = 0; i < w->count; i++)
    sdpa_log_emit(cache->log, cache->log_user, SDPA_LOG_WARNING, w->text[i]);
  w->count = 0;
}

int64_t cache_now_seconds(void) { return (int64_t)time(NULL); }

int64_t cache_monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cache_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The readable columns are advisory: anyone can write any number into them
 * (the sqlite3 shell, a damaged or hostile file). */
int64_t cache_count_add(int64_t a, int64_t b) {
  int64_t sum;
  if (a < 0) a = 0;
  if (b < 0) b = 0;
  return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

int64_t cache_count_from_double(double v) {
  if (!(v > 0)) return 0; /* also NaN */
  if (v >= 9223372036854775807.0) return INT64_MAX;
  return (int64_t)v;
}

int64_t cache_checksum(const void *data, size_t size) {
  uint64_t hash = XXH3_64bits(data, size);
  int64_t value;
  memcpy(&value, &hash, sizeof value);
  return value;
}

int cache_is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int cache_normalize_hash(const char *hash, char out[33]) {
  if (!hash) return 0;
  for (int i = 0; i < 32; i++) {
    if (!cache_is_hex(hash[i])) return 0;
    out[i] = (hash[i] >= 'A' && hash[i] <= 'F') ? (char)(hash[i] - 'A' + 'a') : hash[i];
  }
  out[32] = '\0';
  return hash[32] == '\0';
}

int cache_is_damage(int rc) {
  rc &= 0xff;
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

int cache_is_busy(int rc) {
  rc &= 0xff;
  return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

int cache_pragma_int(sqlite3 *db, const char *sql, int *value) {
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

int cache_exec(sqlite3 *db, const char *sql, char *why, size_t why_size) {
  char *message = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &message);
  if (rc != SQLITE_OK && why)
    snprintf(why, why_size, "%s", message ? message : sqlite3_errstr(rc));
  sqlite3_free(message);
  return rc;
}

void cache_rollback(sqlite3 *db) {
  if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

/* The busy handler covers most waits; BEGIN can still return BUSY at once
 * (e.g. while another connection recovers the WAL). */
int cache_begin_write(sqlite3 *db, int timeout_ms, char *why, size_t why_size) {
  int64_t deadline = cache_monotonic_ms() + timeout_ms;
  for (;;) {
    int rc = cache_exec(db, "BEGIN IMMEDIATE", why, why_size);
    if (!cache_is_busy(rc) || cache_monotonic_ms() >= deadline) return rc;
    cache_sleep_ms(LOCK_POLL_MS);
  }
}

int cache_commit(sqlite3 *db, char *why, size_t why_size) {
  int rc = cache_exec(db, "COMMIT", why, why_size);
  if (rc != SQLITE_OK) cache_rollback(db);
  return rc;
}

int cache_has_column(sqlite3 *db, const char *name) {
  sqlite3_stmt *stmt = NULL;
  int found = 0;
  if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info('kernels')", -1, &stmt,
                         NULL) != SQLITE_OK)
    return 0;
  while (!found && sqlite3_step(stmt) == SQLITE_ROW) {
    const char *column = (const char *)sqlite3_column_text(stmt, 0);
    found = column && strcmp(column, name) == 0;
  }
  sqlite3_finalize(stmt);
  return found;
}
