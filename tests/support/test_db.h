/*
 * test_db.h — SQLite helpers for the suites that read or damage cache
 * files behind the runtime's back (cache, damage, compile, concurrency,
 * crash).
 * Every helper fails the running test (ck_assert) when SQLite does.
 */
#ifndef SDPA_TEST_DB_H
#define SDPA_TEST_DB_H

#include <sqlite3.h>
#include <stdint.h>

/* Opens `path` with SQLITE_OPEN_* `flags` and a 5 s busy timeout. */
sqlite3 *sdpa_test_db_open(const char *path, int flags);

/* Runs `sql` on `path` (read-write, created if missing). */
void sdpa_test_db_exec(const char *path, const char *sql);

/* The first column of the first row of `sql` on `path`, as an integer. */
int64_t sdpa_test_db_int(const char *path, const char *sql);

/* Asserts that PRAGMA integrity_check of `path` says "ok". */
void sdpa_test_db_check_integrity(const char *path);

/* XORs `mask` into the middle byte of the cubin stored for `key_hash`,
 * leaving its checksum column as it was; returns the cubin's size. */
int sdpa_test_db_flip_cubin(const char *path, const char *key_hash, unsigned char mask);

/* Sets last_used and created of the row of `key_hash` in the existing file
 * `path` to now - `age` seconds; asserts that exactly one row changed. */
void sdpa_test_db_set_age(const char *path, const char *key_hash, int64_t age);

/* The number of rows of `key_hash` in the existing file `path` (0 or 1). */
int sdpa_test_db_has_row(const char *path, const char *key_hash);

#endif
