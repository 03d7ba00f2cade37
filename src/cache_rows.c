/*
 * cache_rows.c — reading, writing and pruning rows of the kernels table.
 *
 * A row is fit to be returned when its key text matches the lookup's, its
 * blob is present and matches the XXH3-64 checksum stored with it, with a
 * keyed checksum its MAC verifies (HMAC-SHA256 over a label, the key hash,
 * the key text and the blob: mac.h), and the caller's check of the blob
 * (a cubin for the key's arch: cubin.h) passes. The INSERT and its key
 * columns come from key_fields.h. Pruning counts the blobs' real lengths,
 * not the advisory cubin_bytes column.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "key.h"
#include "mac.h"

/* Label that starts every MAC input (a version for the MAC's layout). */
static const char mac_label[] = "sdpa-jit-row-mac-1";

/* The MAC of a row as 64 hex digits. */
static void row_mac(const sdpa_cache *cache, const char *hash, const char *key_text,
                    const void *blob, size_t bytes, char out[65]) {
  unsigned char mac[32];
  const sdpa_mac_piece pieces[] = {{mac_label, sizeof mac_label},
                                   {hash, strlen(hash) + 1},
                                   {key_text, strlen(key_text) + 1},
                                   {blob, bytes}};
  sdpa_hmac_sha256(cache->mac_key, cache->mac_key_bytes, pieces, 4, mac);
  sdpa_mac_hex(mac, out);
}

int cache_row_intact(const sdpa_cache *cache, const char *hash, const char *key_text,
                     const void *blob, int bytes, int64_t checksum, const char *mac_text,
                     char *why, size_t why_size) {
  if (!blob || bytes <= 0) {
    snprintf(why, why_size, "it has no cubin");
    return -1;
  }
  if (cache_checksum(blob, (size_t)bytes) != checksum) {
    snprintf(why, why_size, "it fails its checksum");
    return -1;
  }
  if (cache->keyed) {
    char want[65];
    row_mac(cache, hash, key_text ? key_text : "", blob, (size_t)bytes, want);
    if (!mac_text || strcmp(mac_text, want) != 0) {
      snprintf(why, why_size, "%s", mac_text ? "its MAC does not verify with this secret"
                                             : "it carries no MAC (a keyed checksum is "
                                               "configured)");
      return -1;
    }
  }
  return 0;
}

int cache_row_fetch(const sdpa_cache *cache, sqlite3 *db, const char *hash,
                    const char *key_text, sdpa_cache_blob_check check, void *check_context,
                    void **out, size_t *size, row_verdict *verdict, char *why,
                    size_t why_size) {
  sqlite3_stmt *stmt = NULL;
  *verdict = ROW_MISSING;
  const int with_mac = cache->keyed;
  int rc = sqlite3_prepare_v2(
      db,
      with_mac ? "SELECT key_text, cubin, checksum, mac FROM kernels WHERE key_hash = ?1"
               : "SELECT key_text, cubin, checksum FROM kernels WHERE key_hash = ?1",
      -1, &stmt, NULL);
  if (rc != SQLITE_OK && with_mac) /* a first-layout file has no mac column */
    rc = sqlite3_prepare_v2(
        db, "SELECT key_text, cubin, checksum, NULL FROM kernels WHERE key_hash = ?1", -1,
        &stmt, NULL);
  if (rc != SQLITE_OK) goto done;
  sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
  rc = sqlite3_step(stmt);
  if (rc == SQLITE_DONE) {
    rc = SQLITE_OK;
    goto done;
  }
  if (rc != SQLITE_ROW) goto done;
  rc = SQLITE_OK;
  const char *text = (const char *)sqlite3_column_text(stmt, 0);
  if (key_text && (!text || strcmp(text, key_text) != 0))
    goto done; /* a hash collision, or a forged row: a miss */
  const void *blob = sqlite3_column_blob(stmt, 1);
  const int bytes = sqlite3_column_bytes(stmt, 1);
  const char *mac = with_mac ? (const char *)sqlite3_column_text(stmt, 3) : NULL;
  if (cache_row_intact(cache, hash, text, blob, bytes, sqlite3_column_int64(stmt, 2), mac,
                       why, why_size) != 0 ||
      (check && check(blob, (size_t)bytes, -1, check_context, why, why_size) != 0)) {
    *verdict = ROW_BAD;
    goto done;
  }
  *out = malloc((size_t)bytes);
  if (!*out) {
    rc = SQLITE_NOMEM;
    goto done;
  }
  memcpy(*out, blob, (size_t)bytes);
  *size = (size_t)bytes;
  *verdict = ROW_GOOD;
done:
  sqlite3_finalize(stmt);
  return rc;
}

int cache_row_delete(sdpa_cache *cache, const char *hash, char *why, size_t why_size) {
  sqlite3 *db = cache->writer;
  sqlite3_stmt *stmt = NULL;
  if (!db) return SQLITE_READONLY;
  int rc = cache_begin_write(db, BUSY_TIMEOUT_MS, why, why_size);
  if (rc != SQLITE_OK) goto done;
  rc = sqlite3_prepare_v2(db, "DELETE FROM kernels WHERE key_hash = ?1", -1, &stmt, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
    rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(stmt);
  if (rc == SQLITE_OK) {
    rc = cache_commit(db, why, why_size);
  } else {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    cache_rollback(db);
  }
done:
  cache_hit_forget(&cache->hits, hash, SDPA_SOURCE_DISK);
  return rc;
}

/* --------------------------------------------------------------- storing */

/* The INSERT of a row: the fixed columns, the key columns of key_fields.h
 * in their order, then the MAC. */
#define KEY_COLUMN_LIST(member, text, column, kind, define, entry) ", " column
#define KEY_COLUMN_MARK(member, text, column, kind, define, entry) ", ?"
static const char insert_sql[] =
    "INSERT OR REPLACE INTO kernels (key_hash, key_text, nvrtc_version, "
    "runtime_version, cubin, cubin_bytes, checksum, compile_ms, compile_log, created, "
    "last_used, hits, mac" SDPA_KEY_FIELDS(KEY_COLUMN_LIST)
    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?" SDPA_KEY_FIELDS(KEY_COLUMN_MARK) ")";
#undef KEY_COLUMN_LIST
#undef KEY_COLUMN_MARK
enum { INSERT_FIXED = 12 }; /* parameters before the key columns */

/* Binds the key columns of `f` (NULL: NULLs) from parameter `first` on. */
static void bind_key_columns(sqlite3_stmt *stmt, int first, const sdpa_key_fields *f) {
  int i = first;
#define BIND_KEY(member, text, column, kind, define, entry)                   \
  if (!f)                                                                     \
    sqlite3_bind_null(stmt, i);                                               \
  else if (SDPA_KEY_KIND_IS_TEXT(kind))                                       \
    sqlite3_bind_text(stmt, i, sdpa_key_value_name(SDPA_KEY_KIND_##kind, f->member), \
                      -1, SQLITE_STATIC);                                     \
  else                                                                        \
    sqlite3_bind_int(stmt, i, f->member);                                     \
  i++;
  SDPA_KEY_FIELDS(BIND_KEY)
#undef BIND_KEY
}

int cache_row_insert(sdpa_cache *cache, const sdpa_cache_meta *meta, const char *hash,
                     const void *cubin, size_t size, char *why, size_t why_size) {
  sqlite3 *db = cache->writer;
  sqlite3_stmt *stmt = NULL;
  char mac[65];
  const int64_t checksum = cache_checksum(cubin, size);
  const int64_t now = cache_now_seconds();
  if (cache->keyed) row_mac(cache, hash, meta->key_text, cubin, size, mac);
  int rc = sqlite3_prepare_v2(db, insert_sql, -1, &stmt, NULL);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    return rc;
  }
  sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
  sqlite3_bind_text(stmt, 2, meta->key_text, -1, SQLITE_STATIC);
  sqlite3_bind_text(stmt, 3, meta->nvrtc_version, -1, SQLITE_STATIC);
  sqlite3_bind_text(stmt, 4, SDPA_JIT_VERSION_STRING, -1, SQLITE_STATIC);
  sqlite3_bind_blob(stmt, 5, cubin, (int)size, SQLITE_STATIC);
  sqlite3_bind_int64(stmt, 6, (int64_t)size);
  sqlite3_bind_int64(stmt, 7, checksum);
  sqlite3_bind_double(stmt, 8, meta->compile_ms);
  sqlite3_bind_text(stmt, 9, meta->compile_log, -1, SQLITE_STATIC);
  sqlite3_bind_int64(stmt, 10, now);
  sqlite3_bind_int64(stmt, 11, now);
  if (cache->keyed)
    sqlite3_bind_text(stmt, 12, mac, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(stmt, 12);
  bind_key_columns(stmt, INSERT_FIXED + 1, meta->fields);
  /* The transaction covers the INSERT only. */
  rc = cache_begin_write(db, BUSY_TIMEOUT_MS, why, why_size);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) {
      rc = cache_commit(db, why, why_size);
    } else {
      snprintf(why, why_size, "%s", sqlite3_errmsg(db));
      cache_rollback(db);
    }
  }
  sqlite3_finalize(stmt);
  return rc;
}

/* --------------------------------------------------------------- pruning */

/* Deletes rows until the blobs of the user's database total at most
 * `max_bytes`, least recently used first; never the row `keep`. Inside
 * the caller's transaction; adds to *removed. One pass over the rows,
 * deleting as it goes (SQLite allows deleting rows a statement has
 * passed). */
static int prune_to_size(sqlite3 *db, int64_t max_bytes, const char *keep,
                         int64_t *removed) {
  sqlite3_stmt *stmt = NULL, *del = NULL;
  int64_t total = 0;
  int rc = sqlite3_prepare_v2(db,
                              "SELECT key_hash, length(cubin) FROM kernels "
                              "ORDER BY last_used DESC, created DESC, key_hash",
                              -1, &stmt, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(db, "DELETE FROM kernels WHERE key_hash = ?1", -1, &del, NULL);
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    rc = SQLITE_OK;
    const char *hash = (const char *)sqlite3_column_text(stmt, 0);
    total = cache_count_add(total, sqlite3_column_int64(stmt, 1));
    if (!hash || total <= max_bytes) continue;
    if (keep && strcmp(hash, keep) == 0) continue; /* counted, never deleted */
    sqlite3_bind_text(del, 1, hash, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(del);
    sqlite3_reset(del);
    if (rc == SQLITE_DONE) {
      rc = SQLITE_OK;
      *removed += sqlite3_changes(db);
    }
  }
  sqlite3_finalize(stmt);
  sqlite3_finalize(del);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int cache_prune(sdpa_cache *cache, int64_t max_bytes, int64_t older_than_seconds,
                const char *keep, int64_t *removed, char *why, size_t why_size) {
  sqlite3 *db = cache->writer;
  sqlite3_stmt *stmt = NULL;
  int64_t count = 0;
  int rc = cache_begin_write(db, BUSY_TIMEOUT_MS, why, why_size);
  if (rc != SQLITE_OK) return rc;
  rc = cache_hits_write(&cache->hits, db);
  if (rc == SQLITE_OK && older_than_seconds >= 0) {
    rc = sqlite3_prepare_v2(db, "DELETE FROM kernels WHERE last_used < ?1", -1, &stmt, NULL);
    if (rc == SQLITE_OK) {
      sqlite3_bind_int64(stmt, 1, cache_now_seconds() - older_than_seconds);
      rc = sqlite3_step(stmt);
      if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
        count += sqlite3_changes(db);
      }
    }
    sqlite3_finalize(stmt);
  }
  if (rc == SQLITE_OK && max_bytes >= 0) rc = prune_to_size(db, max_bytes, keep, &count);
  if (rc == SQLITE_OK && count > 0)
    rc = cache_exec(db, "PRAGMA incremental_vacuum", why, why_size);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    cache_rollback(db);
    return rc;
  }
  rc = cache_commit(db, why, why_size);
  if (rc == SQLITE_OK) {
    cache_hits_clear_disk(&cache->hits);
    *removed += count;
    /* Fold the WAL back and shrink it to journal_size_limit; a reader in
     * another process may hold it open, so a failure here is harmless
     * (the next checkpoint truncates it). */
    if (count > 0) {
      sqlite3_busy_timeout(db, CLOSE_BUSY_TIMEOUT_MS);
      cache_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, 0);
      sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
    }
  }
  return rc;
}
