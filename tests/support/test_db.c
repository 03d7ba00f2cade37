/*
 * test_db.c — SQLite helpers of the CPU suites (see test_db.h).
 */
#include "test_db.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

sqlite3 *sdpa_test_db_open(const char *path, int flags) {
  sqlite3 *db = NULL;
  ck_assert_int_eq(sqlite3_open_v2(path, &db, flags, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  return db;
}

static sqlite3 *open_rw(const char *path) {
  return sdpa_test_db_open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
}

/* Prepares `sql` on `db`, failing the test when SQLite refuses it. */
static sqlite3_stmt *prepare(sqlite3 *db, const char *sql) {
  sqlite3_stmt *stmt = NULL;
  ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL) == SQLITE_OK, "%s: %s", sql,
                sqlite3_errmsg(db));
  return stmt;
}

void sdpa_test_db_exec(const char *path, const char *sql) {
  sqlite3 *db = open_rw(path);
  char *message = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &message);
  ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, message ? message : "?");
  sqlite3_free(message);
  sqlite3_close(db);
}

int64_t sdpa_test_db_int(const char *path, const char *sql) {
  sqlite3 *db = open_rw(path);
  sqlite3_stmt *stmt = prepare(db, sql);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  int64_t value = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

void sdpa_test_db_check_integrity(const char *path) {
  sqlite3 *db = sdpa_test_db_open(path, SQLITE_OPEN_READONLY);
  sqlite3_stmt *stmt = prepare(db, "PRAGMA integrity_check");
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 0), "ok");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

int sdpa_test_db_flip_cubin(const char *path, const char *key_hash, unsigned char mask) {
  sqlite3 *db = open_rw(path);
  sqlite3_stmt *stmt = prepare(db, "SELECT cubin FROM kernels WHERE key_hash = ?1");
  sqlite3_bind_text(stmt, 1, key_hash, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  int size = sqlite3_column_bytes(stmt, 0);
  ck_assert_int_gt(size, 0);
  unsigned char *bytes = malloc((size_t)size);
  ck_assert_ptr_nonnull(bytes);
  memcpy(bytes, sqlite3_column_blob(stmt, 0), (size_t)size);
  sqlite3_finalize(stmt);
  bytes[size / 2] ^= mask;
  stmt = prepare(db, "UPDATE kernels SET cubin = ?1 WHERE key_hash = ?2");
  sqlite3_bind_blob(stmt, 1, bytes, size, SQLITE_STATIC);
  sqlite3_bind_text(stmt, 2, key_hash, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  free(bytes);
  return size;
}

void sdpa_test_db_set_age(const char *path, const char *key_hash, int64_t age) {
  sqlite3 *db = sdpa_test_db_open(path, SQLITE_OPEN_READWRITE);
  sqlite3_stmt *stmt = prepare(db, "UPDATE kernels SET last_used = ?1, created = ?1 "
                                      "WHERE key_hash = ?2");
  sqlite3_bind_int64(stmt, 1, (int64_t)time(NULL) - age);
  sqlite3_bind_text(stmt, 2, key_hash, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

int sdpa_test_db_has_row(const char *path, const char *key_hash) {
  sqlite3 *db = sdpa_test_db_open(path, SQLITE_OPEN_READWRITE);
  sqlite3_stmt *stmt = prepare(db, "SELECT count(*) FROM kernels WHERE key_hash = ?1");
  sqlite3_bind_text(stmt, 1, key_hash, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  int found = sqlite3_column_int(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return found;
}
