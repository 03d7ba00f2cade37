/*
 * test_cpu_cache.c — the SQLite kernel cache (src/cache.c), no GPU needed.
 *
 * Every test works in a fresh temporary directory and drives the cache
 * through src/cache.h, then looks at the file with the sqlite3 API the way
 * a user would: rows round-trip with their readable columns, a damaged
 * cubin or file is detected and replaced, a location that cannot be used
 * leaves the cache in memory with exactly one warning, a newer file is
 * left byte for byte as it was, a hit writes nothing, hit counts reach the
 * file at close, pruning keeps what was used last, shipped databases are
 * searched first and never written, and the per-key lock really excludes
 * another process (and is freed when that process is killed).
 */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "cache.h"
#include "check_main.h"
#include "test_cache.h"
#include "test_db.h"

/* ------------------------------------------------------------- helpers */

static sdpa_cache *open_cache(const char *path, sdpa_test_log *counter) {
  sdpa_cache_config cfg = {0};
  sdpa_cache *cache = NULL;
  cfg.path = path;
  cfg.log = sdpa_test_log_warning;
  cfg.log_user = counter;
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  ck_assert_ptr_nonnull(cache);
  return cache;
}

/* The configuration of the user's database `path` over the shipped
 * databases `layers`, warnings counted in `counter`. */
static sdpa_cache_config layered_config(const char *path, const char *const *layers, size_t count,
                                        sdpa_test_log *counter) {
  sdpa_cache_config cfg = {0};
  cfg.path = path;
  cfg.readonly_paths = layers;
  cfg.readonly_count = count;
  cfg.log = sdpa_test_log_warning;
  cfg.log_user = counter;
  return cfg;
}

/* A 32-hex-digit key hash made from a number. */
static void make_hash(char out[33], unsigned number) {
  snprintf(out, 33, "%032x", number);
}

/* Deterministic pseudo-random cubin bytes. */
static unsigned char *make_cubin(size_t size, unsigned seed) {
  unsigned char *bytes = malloc(size);
  uint32_t state = seed * 2654435761u + 1;
  ck_assert_ptr_nonnull(bytes);
  for (size_t i = 0; i < size; i++) {
    state = state * 1664525u + 1013904223u;
    bytes[i] = (unsigned char)(state >> 24);
  }
  return bytes;
}

/* Stores `size` bytes made from `seed` under hash(number) and text
 * "key-<number>". */
static void store_row(sdpa_cache *cache, unsigned number, size_t size,
                      unsigned seed) {
  char hash[33], text[64];
  make_hash(hash, number);
  snprintf(text, sizeof text, "sdpa_bwd;key=%u", number);
  sdpa_cache_meta meta = sdpa_test_meta(hash, text);
  unsigned char *cubin = make_cubin(size, seed);
  ck_assert_int_eq(sdpa_cache_store(cache, &meta, cubin, size, NULL),
                   SDPA_STATUS_SUCCESS);
  free(cubin);
}

/* Looks hash(number) up; returns the status and checks the bytes on a hit. */
static sdpa_status lookup_row(sdpa_cache *cache, unsigned number, size_t size,
                              unsigned seed, sdpa_source *source) {
  char hash[33], text[64];
  void *data = NULL;
  size_t got = 0;
  make_hash(hash, number);
  snprintf(text, sizeof text, "sdpa_bwd;key=%u", number);
  sdpa_status status = sdpa_cache_lookup(cache, hash, text, NULL, NULL, &data, &got, source);
  if (status == SDPA_STATUS_SUCCESS) {
    unsigned char *want = make_cubin(size, seed);
    ck_assert_uint_eq(got, size);
    ck_assert_int_eq(memcmp(data, want, size), 0);
    free(want);
  } else {
    ck_assert_ptr_null(data);
  }
  free(data);
  return status;
}

/* Flips one byte in the middle of a stored cubin, checksum unchanged. */
static void flip_cubin_byte(const char *path, unsigned number) {
  char hash[33];
  make_hash(hash, number);
  sdpa_test_db_flip_cubin(path, hash, 0x5a);
}

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* --------------------------------------------------------------- tests */

START_TEST(test_round_trip) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "a/b/kernels.sqlite"); /* parents are created */
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  char hash[33];
  make_hash(hash, 7);
  sdpa_cache_meta meta = sdpa_test_meta(hash, "sdpa_bwd;key=7");
  unsigned char *cubin = make_cubin(5000, 7);

  sdpa_cache *cache = open_cache(path, &counter);
  ck_assert_str_eq(sdpa_cache_path(cache), path);
  ck_assert_int_eq(sdpa_cache_store(cache, &meta, cubin, 5000, NULL),
                   SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);

  cache = open_cache(path, &counter);
  sdpa_source source = SDPA_SOURCE_NONE;
  ck_assert_int_eq(lookup_row(cache, 7, 5000, 7, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_DISK);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 0);

  /* The readable columns, as the sqlite3 shell sees them. */
  sqlite3 *db = sdpa_test_db_open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  sqlite3_stmt *stmt = NULL;
  ck_assert_int_eq(
      sqlite3_prepare_v2(db,
                         "SELECT key_text, arch, dtype, head_dim, head_dim_v, "
                         "q_tile, kv_tile, warps, stages, mask, layout, "
                         "nvrtc_version, runtime_version, cubin_bytes, "
                         "checksum, compile_ms, compile_log, created, "
                         "last_used, hits, length(cubin) FROM kernels "
                         "WHERE key_hash = ?1",
                         -1, &stmt, NULL),
      SQLITE_OK);
  sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 0), "sdpa_bwd;key=7");
  ck_assert_int_eq(sqlite3_column_int(stmt, 1), 90);
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 2), "bf16");
  ck_assert_int_eq(sqlite3_column_int(stmt, 3), 128);
  ck_assert_int_eq(sqlite3_column_int(stmt, 4), 64);
  ck_assert_int_eq(sqlite3_column_int(stmt, 5), 64);
  ck_assert_int_eq(sqlite3_column_int(stmt, 6), 128);
  ck_assert_int_eq(sqlite3_column_int(stmt, 7), 8);
  ck_assert_int_eq(sqlite3_column_int(stmt, 8), 2);
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 9), "causal_br");
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 10), "thd");
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 11), "13.0");
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 12),
                   SDPA_JIT_VERSION_STRING);
  ck_assert_int_eq(sqlite3_column_int64(stmt, 13), 5000);
  uint64_t sum = XXH3_64bits(cubin, 5000);
  int64_t signed_sum;
  memcpy(&signed_sum, &sum, sizeof signed_sum);
  ck_assert_int_eq(sqlite3_column_int64(stmt, 14), signed_sum);
  ck_assert_double_eq_tol(sqlite3_column_double(stmt, 15), 1234.5, 1e-9);
  ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 16), "no warnings");
  int64_t now = (int64_t)time(NULL);
  ck_assert_int_le(sqlite3_column_int64(stmt, 17), now);
  ck_assert_int_ge(sqlite3_column_int64(stmt, 17), now - 60);
  ck_assert_int_ge(sqlite3_column_int64(stmt, 18), sqlite3_column_int64(stmt, 17));
  ck_assert_int_eq(sqlite3_column_int64(stmt, 19), 1); /* flushed at close */
  ck_assert_int_eq(sqlite3_column_int(stmt, 20), 5000);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  ck_assert_int_eq(sdpa_test_db_int(path, "PRAGMA application_id"),
                   SDPA_CACHE_APPLICATION_ID);
  ck_assert_int_eq(sdpa_test_db_int(path, "PRAGMA user_version"),
                   SDPA_CACHE_SCHEMA_VERSION);
  ck_assert_int_eq(sdpa_test_db_int(path, "PRAGMA auto_vacuum"), 2); /* incremental */
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM pragma_journal_mode "
                                "WHERE journal_mode = 'wal'"),
                   1);
  free(cubin);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_key_text_mismatch_is_a_miss) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  store_row(cache, 1, 300, 1);
  char hash[33];
  make_hash(hash, 1);
  void *data = (void *)1;
  size_t size = 1;
  ck_assert_int_eq(sdpa_cache_lookup(cache, hash, "sdpa_bwd;key=other", NULL, NULL, &data,
                                     &size, NULL),
                   SDPA_STATUS_NOT_FOUND);
  ck_assert_ptr_null(data);
  ck_assert_uint_eq(size, 0);
  /* The row was a collision, not damage: it stays and still hits. */
  ck_assert_int_eq(lookup_row(cache, 1, 300, 1, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(counter.warnings, 0);
  sdpa_cache_close(cache);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_flipped_cubin_byte_removes_row) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  store_row(cache, 3, 4096, 3);
  store_row(cache, 4, 4096, 4);
  sdpa_cache_close(cache);
  flip_cubin_byte(path, 3);

  cache = open_cache(path, &counter);
  ck_assert_int_eq(lookup_row(cache, 3, 4096, 3, NULL), SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(counter.warnings, 1);
  ck_assert_ptr_nonnull(strstr(counter.last, "checksum"));
  ck_assert_int_eq(lookup_row(cache, 4, 4096, 4, NULL), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels WHERE key_hash "
                                "= '00000000000000000000000000000003'"),
                   0);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels"), 1);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* Memory mode: one warning, and nothing fails afterwards. */
static void check_memory_mode(sdpa_cache *cache, sdpa_test_log *counter) {
  ck_assert_int_eq(counter->warnings, 1);
  ck_assert_ptr_null(sdpa_cache_path(cache));
  store_row(cache, 8, 500, 8);
  ck_assert_int_eq(lookup_row(cache, 8, 500, 8, NULL), SDPA_STATUS_NOT_FOUND);
  char hash[33];
  make_hash(hash, 8);
  sdpa_cache_lock *lock = (sdpa_cache_lock *)1;
  sdpa_cache_lock_key(cache, hash, &lock);
  ck_assert_ptr_null(lock);
  sdpa_cache_entry *entries = NULL;
  size_t count = 5;
  ck_assert_int_eq(sdpa_cache_list_entries(cache, &entries, &count),
                   SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 0);
  sdpa_cache_free_entries(entries, count);
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_get_stats(cache, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stats.entries, 0);
  int64_t removed = -1;
  ck_assert_int_eq(sdpa_cache_prune_rows(cache, 0, 0, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 0);
  ck_assert_int_eq(counter->warnings, 1);
}

/* A file that is not an SQLite database is not provably ours: it is left
 * byte for byte, reported once, and the cache works in memory. */
START_TEST(test_random_bytes_file_left_alone) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  unsigned char *junk = make_cubin(8192, 99);
  sdpa_test_write_file(path, junk, 8192);

  sdpa_cache *cache = open_cache(path, &counter);
  ck_assert_int_eq(counter.warnings, 1);
  SDPA_TEST_EXPECT_WARNING(&counter, 0, path, "not an SQLite database", "left untouched");
  check_memory_mode(cache, &counter);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 1);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.", NULL), 0);
  size_t size = 0;
  unsigned char *kept = sdpa_test_read_file(path, &size);
  ck_assert_uint_eq(size, 8192);
  ck_assert_int_eq(memcmp(kept, junk, 8192), 0);
  free(kept);
  free(junk);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_zero_length_file) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_test_write_file(path, "", 0);
  sdpa_cache *cache = open_cache(path, &counter);
  ck_assert_int_eq(counter.warnings, 0);
  ck_assert_str_eq(sdpa_cache_path(cache), path);
  store_row(cache, 6, 700, 6);
  ck_assert_int_eq(lookup_row(cache, 6, 700, 6, NULL), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt-", NULL), 0);
  ck_assert_int_eq(sdpa_test_db_int(path, "PRAGMA application_id"),
                   SDPA_CACHE_APPLICATION_ID);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_truncated_database) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  for (unsigned i = 0; i < 20; i++) store_row(cache, 100 + i, 5000 + 700 * i, i);
  sdpa_cache_close(cache);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(truncate(path, st.st_size / 2), 0);

  cache = open_cache(path, &counter);
  /* Whatever survived is served intact, the rest misses. */
  for (unsigned i = 0; i < 20; i++) {
    sdpa_status status = lookup_row(cache, 100 + i, 5000 + 700 * i, i, NULL);
    ck_assert(status == SDPA_STATUS_SUCCESS || status == SDPA_STATUS_NOT_FOUND);
  }
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt-", NULL), 1);
  ck_assert_int_eq(counter.warnings, 1);
  store_row(cache, 200, 900, 200);
  ck_assert_int_eq(lookup_row(cache, 200, 900, 200, NULL), SDPA_STATUS_SUCCESS);
  int64_t checked = -1, removed = -1;
  ck_assert_int_eq(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_ge(checked, 1);
  ck_assert_int_eq(removed, 0);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 1);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_damage_found_after_open) {
  /* Page 1 (header and schema) intact, the b-tree pages behind it
   * overwritten: the file opens, and the first lookup finds the damage. */
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  for (unsigned i = 0; i < 8; i++) store_row(cache, 300 + i, 3000, i);
  sdpa_cache_close(cache);
  int64_t page_size = sdpa_test_db_int(path, "PRAGMA page_size");
  unsigned char *junk = make_cubin((size_t)page_size * 3, 42);
  int fd = open(path, O_WRONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, junk, (size_t)page_size * 3, page_size),
                   page_size * 3);
  close(fd);

  cache = open_cache(path, &counter);
  ck_assert_int_eq(counter.warnings, 0);
  ck_assert_int_eq(lookup_row(cache, 300, 3000, 0, NULL), SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(counter.warnings, 1);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt-", NULL), 1);
  ck_assert_str_eq(sdpa_cache_path(cache), path);
  store_row(cache, 400, 900, 4);
  ck_assert_int_eq(lookup_row(cache, 400, 900, 4, NULL), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 1);
  free(junk);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST


START_TEST(test_directory_in_place_of_file) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  ck_assert_int_eq(mkdir(path, 0700), 0);
  sdpa_cache *cache = open_cache(path, &counter);
  ck_assert_ptr_nonnull(strstr(counter.last, "directory"));
  ck_assert_ptr_nonnull(strstr(counter.last, "SDPA_JIT_CACHE"));
  check_memory_mode(cache, &counter);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 1);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert(S_ISDIR(st.st_mode));
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_uncreatable_directory) {
  char *dir = sdpa_test_tmpdir("cache");
  char *blocker = sdpa_test_path(dir, "file");
  sdpa_test_write_file(blocker, "x", 1);
  char *path = sdpa_test_path(dir, "file/sub/kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  ck_assert_ptr_nonnull(strstr(counter.last, "file/sub"));
  check_memory_mode(cache, &counter);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 1);
  free(blocker);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_newer_user_version_untouched) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  /* A file of a newer layout, made by hand. */
  sdpa_test_db_exec(path,
                    "CREATE TABLE kernels (key_hash TEXT PRIMARY KEY, future "
                    "BLOB);"
                    "INSERT INTO kernels VALUES ('x', x'0102');"
                    "PRAGMA application_id = 1396985921;"
                    "PRAGMA user_version = 99;");
  size_t before_size = 0, after_size = 0;
  unsigned char *before = sdpa_test_read_file(path, &before_size);

  sdpa_cache *cache = open_cache(path, &counter);
  ck_assert_ptr_nonnull(strstr(counter.last, "newer"));
  ck_assert_ptr_nonnull(strstr(counter.last, "SDPA_JIT_CACHE"));
  check_memory_mode(cache, &counter);
  sdpa_cache_close(cache);

  unsigned char *after = sdpa_test_read_file(path, &after_size);
  ck_assert_uint_eq(before_size, after_size);
  ck_assert_int_eq(memcmp(before, after, before_size), 0);
  char *wal = sdpa_test_path(dir, "kernels.sqlite-wal");
  ck_assert(!exists(wal));
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.", NULL), 0);
  free(wal);
  free(before);
  free(after);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* Another program's SQLite database (another application_id, or 0 with
 * tables of its own) is never adopted, renamed or rewritten. */
START_TEST(test_foreign_database_left_alone) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  static const char *const schemas[] = {
      "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine'); "
      "PRAGMA application_id = 305419896;",
      "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');"};
  for (size_t i = 0; i < 2; i++) {
    sdpa_test_log counter;
    sdpa_test_log_init(&counter);
    unlink(path);
    sdpa_test_db_exec(path, schemas[i]);
    size_t before_size = 0, after_size = 0;
    unsigned char *before = sdpa_test_read_file(path, &before_size);
    sdpa_cache *cache = open_cache(path, &counter);
    ck_assert_int_eq(counter.warnings, 1);
    SDPA_TEST_EXPECT_WARNING(&counter, 0, "another program's SQLite database",
                             "left untouched");
    check_memory_mode(cache, &counter);
    sdpa_cache_close(cache);
    unsigned char *after = sdpa_test_read_file(path, &after_size);
    ck_assert_uint_eq(before_size, after_size);
    ck_assert_int_eq(memcmp(before, after, before_size), 0);
    ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.", NULL), 0);
    ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite-", NULL), 0);
    free(before);
    free(after);
  }
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_default_path) {
  char buf[4096], want[4096];
  char *dir = sdpa_test_tmpdir("cache");
  long uid = (long)getuid();

  setenv("SDPA_JIT_CACHE", "/elsewhere/k.sqlite", 1);
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  setenv("HOME", "/home/someone", 1);
  ck_assert_str_eq(sdpa_cache_default_path(buf, sizeof buf),
                   "/elsewhere/k.sqlite");
  unsetenv("SDPA_JIT_CACHE");
  ck_assert_str_eq(sdpa_cache_default_path(buf, sizeof buf),
                   "/xdg/sdpa-jit/kernels.sqlite");
  setenv("XDG_CACHE_HOME", "relative/dir", 1); /* ignored, as XDG says */
  ck_assert_str_eq(sdpa_cache_default_path(buf, sizeof buf),
                   "/home/someone/.cache/sdpa-jit/kernels.sqlite");
  unsetenv("XDG_CACHE_HOME");
  ck_assert_str_eq(sdpa_cache_default_path(buf, sizeof buf),
                   "/home/someone/.cache/sdpa-jit/kernels.sqlite");
  setenv("SDPA_JIT_CACHE", "", 1); /* empty means unset */
  unsetenv("HOME");
  setenv("TMPDIR", "/scratch", 1);
  snprintf(want, sizeof want, "/scratch/sdpa-jit-%ld/kernels.sqlite", uid);
  ck_assert_str_eq(sdpa_cache_default_path(buf, sizeof buf), want);
  unsetenv("TMPDIR");
  snprintf(want, sizeof want, "/tmp/sdpa-jit-%ld/kernels.sqlite", uid);
  ck_assert_str_eq(sdpa_cache_default_path(buf, sizeof buf), want);
  char small[8];
  ck_assert_str_eq(sdpa_cache_default_path(small, sizeof small), "");

  /* Opened with no path: $HOME unset falls back to $TMPDIR. */
  setenv("TMPDIR", dir, 1);
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(NULL, &counter);
  snprintf(want, sizeof want, "%s/sdpa-jit-%ld/kernels.sqlite", dir, uid);
  ck_assert_str_eq(sdpa_cache_path(cache), want);
  store_row(cache, 10, 100, 10);
  sdpa_cache_close(cache);
  ck_assert(exists(want));

  /* $SDPA_JIT_CACHE wins over everything. */
  char *explicit_path = sdpa_test_path(dir, "chosen/kernels.sqlite");
  setenv("SDPA_JIT_CACHE", explicit_path, 1);
  setenv("HOME", dir, 1);
  cache = open_cache(NULL, &counter);
  ck_assert_str_eq(sdpa_cache_path(cache), explicit_path);
  sdpa_cache_close(cache);
  ck_assert(exists(explicit_path));
  ck_assert_int_eq(counter.warnings, 0);
  unsetenv("SDPA_JIT_CACHE");
  unsetenv("TMPDIR");
  free(explicit_path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

static void file_state(const char *path, struct stat *st) {
  memset(st, 0, sizeof *st);
  if (stat(path, st) != 0) memset(st, 0, sizeof *st);
}

static int same_state(const struct stat *a, const struct stat *b) {
  return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
         a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ino == b->st_ino;
}

START_TEST(test_hit_writes_nothing_and_counts_flush_at_close) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  char *wal = sdpa_test_path(dir, "kernels.sqlite-wal");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  store_row(cache, 11, 2000, 11);
  sdpa_cache_close(cache);
  int64_t created = sdpa_test_db_int(path, "SELECT created FROM kernels");

  cache = open_cache(path, &counter);
  /* Another connection holds the write lock: a lookup that tried to write
   * would wait for the busy timeout and warn. */
  sqlite3 *writer = sdpa_test_db_open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  sqlite3_busy_timeout(writer, 0);
  ck_assert_int_eq(sqlite3_exec(writer, "BEGIN IMMEDIATE", NULL, NULL, NULL),
                   SQLITE_OK);
  struct stat db_before, wal_before, db_after, wal_after;
  file_state(path, &db_before);
  file_state(wal, &wal_before);
  double start = sdpa_test_now_ms();
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(lookup_row(cache, 11, 2000, 11, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_double_lt(sdpa_test_now_ms() - start, 2000.0);
  file_state(path, &db_after);
  file_state(wal, &wal_after);
  ck_assert(same_state(&db_before, &db_after));
  ck_assert(same_state(&wal_before, &wal_after));
  ck_assert_int_eq(sqlite3_exec(writer, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(writer);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT hits FROM kernels"), 0);

  /* In-memory counts show in what the inspection calls return. */
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_get_stats(cache, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stats.hits, 3);
  ck_assert_int_eq(stats.entries, 1);
  ck_assert_int_eq(stats.cubin_bytes, 2000);
  ck_assert_int_gt(stats.file_bytes, 2000);
  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  ck_assert_int_eq(sdpa_cache_list_entries(cache, &entries, &count),
                   SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 1);
  ck_assert_int_eq(entries[0].hits, 3);
  ck_assert_int_eq(entries[0].readonly, 0);
  sdpa_cache_free_entries(entries, count);
  ck_assert_int_eq(counter.warnings, 0);
  sdpa_cache_close(cache);

  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT hits FROM kernels"), 3);
  ck_assert_int_ge(sdpa_test_db_int(path, "SELECT last_used FROM kernels"), created);
  free(wal);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* Sets last_used of hash(number) to now - age seconds. */
static void set_age(const char *path, unsigned number, int64_t age) {
  char hash[33];
  make_hash(hash, number);
  sdpa_test_db_set_age(path, hash, age);
}

START_TEST(test_prune_by_size_keeps_recently_used) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  for (unsigned i = 1; i <= 4; i++) store_row(cache, 20 + i, 1000, i);
  sdpa_cache_close(cache);
  for (unsigned i = 1; i <= 4; i++) set_age(path, 20 + i, 500 - 100 * i);
  /* 21 is oldest ... 24 newest on disk; a hit makes 21 the most recent. */
  cache = open_cache(path, &counter);
  ck_assert_int_eq(lookup_row(cache, 21, 1000, 1, NULL), SDPA_STATUS_SUCCESS);
  int64_t removed = -1;
  ck_assert_int_eq(sdpa_cache_prune_rows(cache, 2000, -1, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 2);
  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  ck_assert_int_eq(sdpa_cache_list_entries(cache, &entries, &count),
                   SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 2);
  char hash[33];
  make_hash(hash, 21);
  ck_assert_str_eq(entries[0].key_hash, hash); /* most recently used first */
  make_hash(hash, 24);
  ck_assert_str_eq(entries[1].key_hash, hash);
  ck_assert_int_eq(entries[0].hits, 1);
  sdpa_cache_free_entries(entries, count);
  ck_assert_int_eq(lookup_row(cache, 22, 1000, 2, NULL), SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(lookup_row(cache, 23, 1000, 3, NULL), SDPA_STATUS_NOT_FOUND);
  /* Nothing over the limits: nothing removed. */
  ck_assert_int_eq(sdpa_cache_prune_rows(cache, -1, -1, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 0);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT hits FROM kernels WHERE key_hash = "
                                "'00000000000000000000000000000015'"),
                   1); /* written by the prune, not counted twice at close */
  ck_assert_int_eq(counter.warnings, 0);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_store_enforces_size_cap) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache_config cfg = {0};
  cfg.path = path;
  cfg.max_bytes = 3000;
  cfg.log = sdpa_test_log_warning;
  cfg.log_user = &counter;
  sdpa_cache *cache = NULL;
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  for (unsigned i = 1; i <= 3; i++) store_row(cache, 30 + i, 1000, i);
  sdpa_cache_close(cache);
  set_age(path, 31, 10);
  set_age(path, 32, 300);
  set_age(path, 33, 200);
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  store_row(cache, 34, 1000, 4); /* 4000 > 3000: the least recent goes */
  ck_assert_int_eq(lookup_row(cache, 32, 1000, 2, NULL), SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(lookup_row(cache, 31, 1000, 1, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(lookup_row(cache, 33, 1000, 3, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(lookup_row(cache, 34, 1000, 4, NULL), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT sum(cubin_bytes) FROM kernels"), 3000);
  ck_assert_int_eq(counter.warnings, 0);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_prune_by_age) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  for (unsigned i = 1; i <= 3; i++) store_row(cache, 40 + i, 1500, i);
  sdpa_cache_close(cache);
  set_age(path, 41, 40 * 86400);
  set_age(path, 42, 29 * 86400);
  cache = open_cache(path, &counter);
  int64_t removed = -1;
  ck_assert_int_eq(sdpa_cache_prune_rows(cache, -1, 30 * 86400, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 1);
  ck_assert_int_eq(lookup_row(cache, 41, 1500, 1, NULL), SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(lookup_row(cache, 42, 1500, 2, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(lookup_row(cache, 43, 1500, 3, NULL), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels"), 2);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_verify_removes_corrupted_row) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  for (unsigned i = 1; i <= 3; i++) store_row(cache, 50 + i, 2500, i);
  sdpa_cache_close(cache);
  flip_cubin_byte(path, 52);
  cache = open_cache(path, &counter);
  int64_t checked = -1, removed = -1;
  ck_assert_int_eq(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(checked, 3);
  ck_assert_int_eq(removed, 1);
  ck_assert_int_eq(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(checked, 2);
  ck_assert_int_eq(removed, 0);
  ck_assert_int_eq(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, NULL, NULL), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels WHERE key_hash "
                                "= '00000000000000000000000000000034'"),
                   0);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels"), 2);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_get_entry_by_prefix_and_text) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  static const char *const hashes[] = {"abcdef00000000000000000000000001",
                                       "abcdef00000000000000000000000002",
                                       "1234567890abcdef1234567890abcdef"};
  static const char *const texts[] = {"sdpa_bwd;row=1", "sdpa_bwd;row=2",
                                      "sdpa_bwd;row=3"};
  for (int i = 0; i < 3; i++) {
    sdpa_cache_meta meta = sdpa_test_meta(hashes[i], texts[i]);
    unsigned char *cubin = make_cubin(1000 + 100 * (size_t)i, (unsigned)i);
    ck_assert_int_eq(sdpa_cache_store(cache, &meta, cubin, 1000 + 100 * (size_t)i, NULL),
                     SDPA_STATUS_SUCCESS);
    free(cubin);
  }
  sdpa_cache_entry *entry = NULL;
  /* Ambiguous prefix: names the count. */
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "abcdef", &entry),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_null(entry);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "2 cache entries"));
  /* Unique prefix, any case. */
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "ABCDEF000000000000000000000000", &entry),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "123456", &entry),
                   SDPA_STATUS_SUCCESS);
  ck_assert_str_eq(entry->key_hash, hashes[2]);
  ck_assert_str_eq(entry->key_text, texts[2]);
  ck_assert_int_eq(entry->cubin_bytes, 1200);
  ck_assert_str_eq(entry->dtype, "bf16");
  ck_assert_str_eq(entry->mask, "causal_br");
  ck_assert_str_eq(entry->layout, "thd");
  ck_assert_str_eq(entry->nvrtc_version, "13.0");
  ck_assert_int_eq(entry->head_dim, 128);
  ck_assert_int_eq(entry->head_dim_v, 64);
  ck_assert_int_eq(entry->q_tile, 64);
  ck_assert_int_eq(entry->kv_tile, 128);
  ck_assert_int_eq(entry->warps, 8);
  ck_assert_int_eq(entry->stages, 2);
  ck_assert_int_eq(entry->arch, 90);
  ck_assert_double_eq_tol(entry->compile_ms, 1234.5, 1e-9);
  ck_assert_int_eq(entry->readonly, 0);
  sdpa_cache_free_entries(entry, 1);
  /* Full hash, upper case. */
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "ABCDEF00000000000000000000000001",
                                        &entry),
                   SDPA_STATUS_SUCCESS);
  ck_assert_str_eq(entry->key_hash, hashes[0]);
  sdpa_cache_free_entries(entry, 1);
  /* Full key text. */
  ck_assert_int_eq(sdpa_cache_get_entry(cache, texts[1], &entry),
                   SDPA_STATUS_SUCCESS);
  ck_assert_str_eq(entry->key_hash, hashes[1]);
  sdpa_cache_free_entries(entry, 1);
  /* Misses. */
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "abc", &entry),
                   SDPA_STATUS_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "6"));
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "ffffff", &entry),
                   SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "sdpa_bwd;row=9", &entry),
                   SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "", &entry),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_null(entry);

  /* The cubin by prefix, checksum verified. */
  void *data = NULL;
  size_t size = 0;
  ck_assert_int_eq(sdpa_cache_read_cubin(cache, "1234567890", &data, &size),
                   SDPA_STATUS_SUCCESS);
  unsigned char *want = make_cubin(1200, 2);
  ck_assert_uint_eq(size, 1200);
  ck_assert_int_eq(memcmp(data, want, size), 0);
  free(want);
  free(data);
  ck_assert_int_eq(sdpa_cache_read_cubin(cache, "abcdef", &data, &size),
                   SDPA_STATUS_INVALID_ARGUMENT);
  sdpa_cache_close(cache);

  /* A damaged cubin is refused (reading it is inspection: it stays until
   * verify removes it). */
  sdpa_test_db_exec(path, "UPDATE kernels SET checksum = checksum + 1 "
                          "WHERE key_text = 'sdpa_bwd;row=3'");
  cache = open_cache(path, &counter);
  ck_assert_int_eq(sdpa_cache_read_cubin(cache, "123456", &data, &size),
                   SDPA_STATUS_CACHE_ERROR);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "checksum"));
  ck_assert_ptr_null(data);
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "123456", &entry), SDPA_STATUS_SUCCESS);
  sdpa_cache_entries_free(entry, 1);
  entry = NULL;
  int64_t checked = 0, removed = 0;
  ck_assert_int_eq(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 1);
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "123456", &entry), SDPA_STATUS_NOT_FOUND);
  sdpa_cache_close(cache);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_key_lock_excludes_other_process) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  char hash[33], other[33];
  make_hash(hash, 60);
  make_hash(other, 61);
  /* Another process takes the lock and sleeps until killed. */
  pid_t child = sdpa_test_start_lock_holder(path, hash);

  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache_config cfg = {0};
  sdpa_cache *cache = NULL;
  cfg.path = path;
  cfg.lock_timeout_ms = 300;
  cfg.log = sdpa_test_log_warning;
  cfg.log_user = &counter;
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);

  /* Held elsewhere: waits the timeout, then gives up (NULL). */
  sdpa_cache_lock *lock = (sdpa_cache_lock *)1;
  double start = sdpa_test_now_ms();
  sdpa_cache_lock_key(cache, hash, &lock);
  double waited = sdpa_test_now_ms() - start;
  ck_assert_ptr_null(lock);
  ck_assert_double_ge(waited, 290.0);
  ck_assert_double_lt(waited, 5000.0);
  ck_assert_int_eq(counter.warnings, 1);

  /* Another key is free. */
  sdpa_cache_lock *free_lock = NULL;
  start = sdpa_test_now_ms();
  sdpa_cache_lock_key(cache, other, &free_lock);
  ck_assert_ptr_nonnull(free_lock);
  ck_assert_double_lt(sdpa_test_now_ms() - start, 200.0);

  /* The holder dies: the kernel drops its lock at once. */
  ck_assert_int_eq(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ck_assert_int_eq(waitpid(child, &wstatus, 0), child);
  ck_assert(WIFSIGNALED(wstatus));
  start = sdpa_test_now_ms();
  sdpa_cache_lock_key(cache, hash, &lock);
  ck_assert_ptr_nonnull(lock);
  ck_assert_double_lt(sdpa_test_now_ms() - start, 200.0);

  /* Held in this process: a second claim waits too (one flock per open). */
  sdpa_cache_lock *second = (sdpa_cache_lock *)1;
  sdpa_cache_lock_key(cache, hash, &second);
  ck_assert_ptr_null(second);
  sdpa_cache_unlock_key(lock);
  sdpa_cache_lock_key(cache, hash, &second);
  ck_assert_ptr_nonnull(second);
  sdpa_cache_unlock_key(second);
  sdpa_cache_unlock_key(free_lock);
  sdpa_cache_unlock_key(NULL);

  char *lock_file = NULL;
  ck_assert_int_ge(asprintf(&lock_file, "%s/locks/%s.lock", dir, hash), 0);
  ck_assert(exists(lock_file));
  free(lock_file);
  sdpa_cache_close(cache);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_shipped_database_first_and_never_written) {
  char *dir = sdpa_test_tmpdir("cache");
  char *shipped = sdpa_test_path(dir, "image/shipped.sqlite");
  char *user = sdpa_test_path(dir, "user.sqlite");
  char *missing = sdpa_test_path(dir, "image/missing.sqlite");
  char *junk = sdpa_test_path(dir, "image/junk.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);

  /* A preheated database with keys 70 and 71 (71 then damaged). */
  sdpa_cache *cache = open_cache(shipped, &counter);
  store_row(cache, 70, 3000, 170);
  store_row(cache, 71, 3000, 171);
  sdpa_cache_close(cache);
  flip_cubin_byte(shipped, 71);
  unsigned char *noise = make_cubin(5000, 5);
  sdpa_test_write_file(junk, noise, 5000);
  free(noise);
  /* The user's database has both keys with other bytes, and key 72. */
  cache = open_cache(user, &counter);
  store_row(cache, 70, 2000, 270);
  store_row(cache, 71, 2000, 271);
  store_row(cache, 72, 2000, 272);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 0);
  size_t before_size = 0, after_size = 0;
  unsigned char *before = sdpa_test_read_file(shipped, &before_size);

  const char *layers[] = {missing, shipped, junk};
  const sdpa_cache_config cfg = layered_config(user, layers, 3, &counter);
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(counter.warnings, 2); /* missing and junk skipped */

  sdpa_source source = SDPA_SOURCE_NONE;
  ck_assert_int_eq(lookup_row(cache, 70, 3000, 170, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_SHIPPED);
  /* A bad shipped row is skipped (warned), the user's row serves. */
  ck_assert_int_eq(lookup_row(cache, 71, 2000, 271, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_DISK);
  ck_assert_int_eq(counter.warnings, 3);
  ck_assert_int_eq(lookup_row(cache, 72, 2000, 272, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_DISK);
  /* A store goes to the user's database. */
  store_row(cache, 73, 1000, 273);

  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  ck_assert_int_eq(sdpa_cache_list_entries(cache, &entries, &count),
                   SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 6);
  int readonly_rows = 0;
  for (size_t i = 0; i < count; i++) readonly_rows += entries[i].readonly;
  ck_assert_int_eq(readonly_rows, 2);
  for (size_t i = 1; i < count; i++)
    ck_assert_int_ge(entries[i - 1].last_used, entries[i].last_used);
  sdpa_cache_free_entries(entries, count);
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_get_stats(cache, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stats.entries, 6);
  ck_assert_int_eq(stats.readonly_entries, 2);
  ck_assert_int_eq(stats.cubin_bytes, 2 * 3000 + 3 * 2000 + 1000);
  ck_assert_int_eq(stats.hits, 3);
  sdpa_cache_entry *entry = NULL;
  ck_assert_int_eq(sdpa_cache_get_entry(cache, "00000000000000000000000000000046",
                                        &entry),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(entry->readonly, 1);
  ck_assert_int_eq(entry->hits, 1);
  sdpa_cache_free_entries(entry, 1);

  int64_t checked = 0, removed = 0;
  ck_assert_int_eq(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(checked, 6);
  ck_assert_int_eq(removed, 0); /* the bad shipped row stays */
  ck_assert_int_eq(sdpa_cache_prune_rows(cache, 0, -1, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 4); /* the user's rows only */
  ck_assert_int_eq(lookup_row(cache, 70, 3000, 170, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_SHIPPED);
  sdpa_cache_close(cache);

  unsigned char *after = sdpa_test_read_file(shipped, &after_size);
  ck_assert_uint_eq(before_size, after_size);
  ck_assert_int_eq(memcmp(before, after, before_size), 0);
  char *shm = sdpa_test_path(dir, "image/shipped.sqlite-shm");
  ck_assert(!exists(shm));
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "image", NULL), 1);
  char *image = sdpa_test_path(dir, "image");
  ck_assert_int_eq(sdpa_test_count_prefixed(image, "junk.sqlite.", NULL), 0);
  ck_assert_int_eq(sdpa_test_db_int(shipped, "SELECT sum(hits) FROM kernels"), 0);
  ck_assert_int_eq(sdpa_test_db_int(user, "SELECT count(*) FROM kernels"), 0);
  free(image);
  free(shm);
  free(before);
  free(after);
  free(shipped);
  free(user);
  free(missing);
  free(junk);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* A walk's first row (sdpa_cache_foreach_entry stops after it). */
typedef struct first_seen {
  int calls;
  char hash[33];
} first_seen;

static int take_first(const sdpa_cache_entry *entry, void *user) {
  first_seen *f = user;
  f->calls++;
  memcpy(f->hash, entry->key_hash, 33);
  return 1;
}

/* The walk reports rows at their last use, pending hits included, and in
 * that order: rows hit since their file was written come first, whatever
 * their place in the file, in the user's database and a shipped one. */
START_TEST(test_walk_orders_by_pending_hits) {
  char *dir = sdpa_test_tmpdir("cache");
  char *shipped = sdpa_test_path(dir, "image/shipped.sqlite");
  char *user = sdpa_test_path(dir, "user.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(shipped, &counter);
  store_row(cache, 80, 1000, 180);
  store_row(cache, 81, 1000, 181);
  store_row(cache, 82, 1000, 182);
  sdpa_cache_close(cache);
  cache = open_cache(user, &counter);
  store_row(cache, 90, 1000, 190);
  store_row(cache, 91, 1000, 191);
  store_row(cache, 92, 1000, 192);
  store_row(cache, 81, 1000, 281); /* also shipped: lookups take the shipped row */
  sdpa_cache_close(cache);
  /* Ages in seconds: the files' order is 92, 81 (user), 82, 81 (shipped),
   * 90, 91, 80. */
  const struct { const char *path; unsigned number; int64_t age; } ages[] = {
      {shipped, 80, 500}, {shipped, 81, 300}, {shipped, 82, 200},
      {user, 90, 400},    {user, 91, 450},    {user, 92, 50},  {user, 81, 100}};
  for (size_t i = 0; i < sizeof ages / sizeof ages[0]; i++)
    set_age(ages[i].path, ages[i].number, ages[i].age);

  const char *layers[] = {shipped};
  const sdpa_cache_config cfg = layered_config(user, layers, 1, &counter);
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  const int64_t hit_time = (int64_t)time(NULL);
  sdpa_source source = SDPA_SOURCE_NONE;
  ck_assert_int_eq(lookup_row(cache, 80, 1000, 180, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_SHIPPED);
  ck_assert_int_eq(lookup_row(cache, 91, 1000, 191, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_DISK);
  ck_assert_int_eq(lookup_row(cache, 91, 1000, 191, &source), SDPA_STATUS_SUCCESS);

  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  ck_assert_int_eq(sdpa_cache_list_entries(cache, &entries, &count), SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 7);
  for (size_t i = 1; i < count; i++)
    ck_assert_int_ge(entries[i - 1].last_used, entries[i].last_used);
  /* The two rows hit, then the others in the files' order. */
  char hash[33];
  int first_two = 0;
  for (size_t i = 0; i < 2; i++) {
    ck_assert_int_ge(entries[i].last_used, hit_time);
    make_hash(hash, 80);
    if (strcmp(entries[i].key_hash, hash) == 0) {
      ck_assert_int_eq(entries[i].readonly, 1);
      ck_assert_int_eq(entries[i].hits, 1);
      first_two |= 1;
    }
    make_hash(hash, 91);
    if (strcmp(entries[i].key_hash, hash) == 0) {
      ck_assert_int_eq(entries[i].readonly, 0);
      ck_assert_int_eq(entries[i].hits, 2);
      first_two |= 2;
    }
  }
  ck_assert_int_eq(first_two, 3);
  const struct { unsigned number; int readonly; } rest[] = {
      {92, 0}, {81, 0}, {82, 1}, {81, 1}, {90, 0}};
  for (size_t i = 0; i < 5; i++) {
    make_hash(hash, rest[i].number);
    ck_assert_str_eq(entries[2 + i].key_hash, hash);
    ck_assert_int_eq(entries[2 + i].readonly, rest[i].readonly);
    ck_assert_int_lt(entries[2 + i].last_used, hit_time);
    ck_assert_int_eq(entries[2 + i].hits, 0);
  }
  sdpa_cache_free_entries(entries, count);
  /* A walk stopped at its first row (a moved one) ends cleanly. */
  first_seen first = {0, ""};
  ck_assert_int_eq(sdpa_cache_foreach_entry(cache, take_first, &first), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(first.calls, 1);
  ck_assert(strcmp(first.hash, "00000000000000000000000000000050") == 0 ||
            strcmp(first.hash, "0000000000000000000000000000005b") == 0);

  /* After the user's hits are written (close), the same order from the files. */
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_cache_list_entries(cache, &entries, &count), SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 7);
  make_hash(hash, 91);
  ck_assert_str_eq(entries[0].key_hash, hash);
  ck_assert_int_eq(entries[0].hits, 2);
  make_hash(hash, 92);
  ck_assert_str_eq(entries[1].key_hash, hash);
  make_hash(hash, 80); /* the shipped row's hit was not kept */
  ck_assert_str_eq(entries[6].key_hash, hash);
  ck_assert_int_eq(entries[6].hits, 0);
  sdpa_cache_free_entries(entries, count);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 0);
  free(shipped);
  free(user);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* One of the processes in test_processes_compile_each_key_once: waits for
 * the start signal, then for each shared key takes the key lock, looks the
 * key up, and on a miss "compiles" it (appends a byte to `compiled`,
 * sleeps) and stores it. Exits with the number of things that went wrong. */
/* Where the racing processes work: the cache, and the file each appends
 * a byte to when it compiles. */
typedef struct racing_files {
  const char *path, *compiled;
} racing_files;

static void racing_process(int index, void *arg) {
  const racing_files *files = arg;
  const char *path = files->path, *compiled = files->compiled;
  const unsigned id = (unsigned)index;
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache_config cfg = {0};
  sdpa_cache *cache = NULL;
  int failures = 0;
  cfg.path = path;
  cfg.log = sdpa_test_log_warning;
  cfg.log_user = &counter;
  if (sdpa_cache_open(&cache, &cfg) != SDPA_STATUS_SUCCESS) _exit(101);
  for (unsigned key = 0; key < 5; key++) {
    char hash[33], text[64];
    make_hash(hash, 500 + key);
    snprintf(text, sizeof text, "sdpa_bwd;key=%u", 500 + key);
    sdpa_cache_lock *lock = NULL;
    sdpa_cache_lock_key(cache, hash, &lock);
    if (!lock) failures++;
    void *data = NULL;
    size_t size = 0;
    sdpa_status status =
        sdpa_cache_lookup(cache, hash, text, NULL, NULL, &data, &size, NULL);
    unsigned char *want = make_cubin(4000, key);
    if (status == SDPA_STATUS_NOT_FOUND) {
      int fd = open(compiled, O_WRONLY | O_APPEND | O_CREAT, 0600);
      if (fd < 0 || write(fd, "c", 1) != 1) failures++;
      if (fd >= 0) close(fd);
      sdpa_test_sleep_ms(20);
      sdpa_cache_meta meta = sdpa_test_meta(hash, text);
      if (sdpa_cache_store(cache, &meta, want, 4000, NULL) != SDPA_STATUS_SUCCESS)
        failures++;
    } else if (status != SDPA_STATUS_SUCCESS || size != 4000 ||
               memcmp(data, want, 4000) != 0) {
      failures++;
    }
    free(want);
    free(data);
    sdpa_cache_unlock_key(lock);
  }
  char hash[33], text[64];
  make_hash(hash, 600 + id);
  snprintf(text, sizeof text, "sdpa_bwd;key=%u", 600 + id);
  sdpa_cache_meta meta = sdpa_test_meta(hash, text);
  unsigned char *mine = make_cubin(1000, id);
  void *data = NULL;
  size_t size = 0;
  if (sdpa_cache_store(cache, &meta, mine, 1000, NULL) != SDPA_STATUS_SUCCESS ||
      sdpa_cache_lookup(cache, hash, text, NULL, NULL, &data, &size, NULL) !=
          SDPA_STATUS_SUCCESS ||
      size != 1000 || memcmp(data, mine, 1000) != 0)
    failures++;
  free(data);
  free(mine);
  sdpa_cache_close(cache);
  _exit(failures + counter.warnings);
}

START_TEST(test_processes_compile_each_key_once) {
  /* Six processes start together on a cache that does not exist yet. */
  enum { PROCESSES = 6 };
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  char *compiled = sdpa_test_path(dir, "compiled");
  pid_t children[PROCESSES];
  racing_files files = {path, compiled};
  sdpa_test_start_racers(sdpa_test_fork_racers(children, PROCESSES, racing_process, &files),
                         PROCESSES);
  for (unsigned i = 0; i < PROCESSES; i++) {
    int wstatus = 0;
    ck_assert_int_eq(waitpid(children[i], &wstatus, 0), children[i]);
    ck_assert(WIFEXITED(wstatus));
    ck_assert_int_eq(WEXITSTATUS(wstatus), 0);
  }
  struct stat st;
  ck_assert_int_eq(stat(compiled, &st), 0);
  ck_assert_int_eq(st.st_size, 5); /* each shared key compiled once */
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels"), 5 + PROCESSES);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT sum(hits) FROM kernels WHERE key_hash "
                                "< '00000000000000000000000000000258'"),
                   5 * (PROCESSES - 1));
  free(compiled);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

typedef struct thread_job {
  sdpa_cache *cache;
  unsigned first;
  int failures;
} thread_job;

static void *thread_main(void *arg) {
  thread_job *job = arg;
  for (unsigned i = 0; i < 40; i++) {
    unsigned number = job->first + i;
    char hash[33], text[64];
    make_hash(hash, number);
    snprintf(text, sizeof text, "sdpa_bwd;key=%u", number);
    sdpa_cache_meta meta = sdpa_test_meta(hash, text);
    unsigned char *cubin = make_cubin(600 + i, number);
    void *data = NULL;
    size_t size = 0;
    if (sdpa_cache_store(job->cache, &meta, cubin, 600 + i, NULL) != SDPA_STATUS_SUCCESS)
      job->failures++;
    if (sdpa_cache_lookup(job->cache, hash, text, NULL, NULL, &data, &size, NULL) !=
            SDPA_STATUS_SUCCESS ||
        size != 600 + i || memcmp(data, cubin, size) != 0)
      job->failures++;
    free(data);
    free(cubin);
  }
  return NULL;
}

START_TEST(test_shared_by_threads) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  pthread_t threads[4];
  thread_job jobs[4];
  for (int t = 0; t < 4; t++) {
    jobs[t] = (thread_job){cache, 1000u * (unsigned)(t + 1), 0};
    ck_assert_int_eq(pthread_create(&threads[t], NULL, thread_main, &jobs[t]), 0);
  }
  for (int t = 0; t < 4; t++) {
    pthread_join(threads[t], NULL);
    ck_assert_int_eq(jobs[t].failures, 0);
  }
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_get_stats(cache, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stats.entries, 160);
  ck_assert_int_eq(stats.hits, 160);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT sum(hits) FROM kernels"), 160);
  ck_assert_int_eq(counter.warnings, 0);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_remove_and_disabled) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  store_row(cache, 80, 400, 80);
  char hash[33];
  make_hash(hash, 80);
  sdpa_cache_remove(cache, hash);
  ck_assert_int_eq(lookup_row(cache, 80, 400, 80, NULL), SDPA_STATUS_NOT_FOUND);
  sdpa_cache_remove(cache, "not-a-hash"); /* ignored */
  sdpa_cache_close(cache);

  sdpa_cache_config cfg = {0};
  cfg.disabled = 1;
  cfg.path = path;
  cfg.log = sdpa_test_log_warning;
  cfg.log_user = &counter;
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  ck_assert_ptr_null(sdpa_cache_path(cache));
  store_row(cache, 81, 400, 81);
  ck_assert_int_eq(lookup_row(cache, 81, 400, 81, NULL), SDPA_STATUS_NOT_FOUND);
  sdpa_cache_close(cache);
  ck_assert_int_eq(counter.warnings, 0); /* asked for: nothing to warn */
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels"), 0);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

START_TEST(test_invalid_arguments) {
  sdpa_cache_config cfg = {0};
  sdpa_cache *cache = NULL;
  ck_assert_int_eq(sdpa_cache_open(NULL, &cfg), SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_str_ne(sdpa_last_error(), "");
  cfg.readonly_count = 1;
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "readonly_cache_paths"));
  ck_assert_ptr_null(cache);

  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  cache = open_cache(path, &counter);
  void *data = NULL;
  size_t size = 0;
  ck_assert_int_eq(sdpa_cache_lookup(cache, "xyz", "t", NULL, NULL, &data, &size, NULL),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "32 hex digits"));
  ck_assert_int_eq(sdpa_cache_lookup(cache, "00000000000000000000000000000001",
                                     NULL, NULL, NULL, &data, &size, NULL),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_int_eq(sdpa_cache_store(cache, NULL, "x", 1, NULL),
                   SDPA_STATUS_INVALID_ARGUMENT);
  sdpa_cache_meta meta = sdpa_test_meta("00000000000000000000000000000001", "t");
  ck_assert_int_eq(sdpa_cache_store(cache, &meta, "x", 0, NULL),
                   SDPA_STATUS_INVALID_ARGUMENT);
  meta.key_hash = "0000000000000000000000000000000g";
  ck_assert_int_eq(sdpa_cache_store(cache, &meta, "x", 1, NULL),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_int_eq(sdpa_cache_list_entries(cache, NULL, &size),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_int_eq(sdpa_cache_get_stats(NULL, NULL), SDPA_STATUS_INVALID_ARGUMENT);
  sdpa_cache_lock *lock = (sdpa_cache_lock *)1;
  sdpa_cache_lock_key(cache, "../../etc/passwd", &lock);
  ck_assert_ptr_null(lock);
  sdpa_cache_close(cache);
  sdpa_cache_close(NULL);
  sdpa_cache_free_entries(NULL, 0);
  ck_assert_ptr_null(sdpa_cache_path(NULL));
  ck_assert_int_eq(counter.warnings, 0);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* Runs `sqlite3 db < file` through the shell; returns its exit status and
 * whether it wrote to stderr. -1 when no sqlite3 shell is installed. */
static int run_shell(const char *db, const char *script, const char *dir,
                     int *stderr_bytes) {
  char *command = NULL, *err = sdpa_test_path(dir, "shell.err");
  struct stat st;
  if (system("command -v sqlite3 >/dev/null 2>&1") != 0) {
    free(err);
    return -1;
  }
  ck_assert_int_ge(asprintf(&command, "sqlite3 -bail '%s' < '%s' >/dev/null 2>'%s'",
                            db, script, err),
                   0);
  int status = system(command);
  *stderr_bytes = stat(err, &st) == 0 ? (int)st.st_size : -1;
  free(command);
  free(err);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

START_TEST(test_sql_files_run_in_the_shell) {
  char *dir = sdpa_test_tmpdir("cache");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  char *by_hand = sdpa_test_path(dir, "by_hand.sqlite");
  sdpa_test_log counter;
  sdpa_test_log_init(&counter);
  sdpa_cache *cache = open_cache(path, &counter);
  for (unsigned i = 0; i < 5; i++) store_row(cache, 90 + i, 700 + 50 * i, i);
  ck_assert_int_eq(lookup_row(cache, 90, 700, 0, NULL), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  int stderr_bytes = -1;
  int rc = run_shell(path, SDPA_TEST_SOURCE_DIR "/cache/inspect.sql", dir,
                     &stderr_bytes);
  if (rc == -1) {
    fprintf(stderr, "note: no sqlite3 shell; inspect.sql not run\n");
  } else {
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(stderr_bytes, 0);
    /* schema.sql by hand makes a file the library accepts silently. */
    rc = run_shell(by_hand, SDPA_TEST_SOURCE_DIR "/cache/schema.sql", dir,
                   &stderr_bytes);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(stderr_bytes, 0);
    cache = open_cache(by_hand, &counter);
    store_row(cache, 99, 100, 99);
    ck_assert_int_eq(lookup_row(cache, 99, 100, 99, NULL), SDPA_STATUS_SUCCESS);
    sdpa_cache_close(cache);
    ck_assert_int_eq(counter.warnings, 0);
  }
  /* The embedded schema is the file's text. */
  size_t size = 0;
  unsigned char *text = sdpa_test_read_file(SDPA_TEST_SOURCE_DIR "/cache/schema.sql", &size);
  ck_assert_uint_eq(strlen(sdpa_embedded_schema_sql), size);
  ck_assert_int_eq(memcmp(text, sdpa_embedded_schema_sql, size), 0);
  free(text);
  free(by_hand);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

static Suite *cache_suite(void) {
  Suite *suite = suite_create("cache");
  TCase *tc = tcase_create("cache");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_key_text_mismatch_is_a_miss);
  tcase_add_test(tc, test_flipped_cubin_byte_removes_row);
  tcase_add_test(tc, test_random_bytes_file_left_alone);
  tcase_add_test(tc, test_zero_length_file);
  tcase_add_test(tc, test_truncated_database);
  tcase_add_test(tc, test_damage_found_after_open);
  tcase_add_test(tc, test_directory_in_place_of_file);
  tcase_add_test(tc, test_uncreatable_directory);
  tcase_add_test(tc, test_newer_user_version_untouched);
  tcase_add_test(tc, test_foreign_database_left_alone);
  tcase_add_test(tc, test_default_path);
  tcase_add_test(tc, test_hit_writes_nothing_and_counts_flush_at_close);
  tcase_add_test(tc, test_prune_by_size_keeps_recently_used);
  tcase_add_test(tc, test_store_enforces_size_cap);
  tcase_add_test(tc, test_prune_by_age);
  tcase_add_test(tc, test_verify_removes_corrupted_row);
  tcase_add_test(tc, test_get_entry_by_prefix_and_text);
  tcase_add_test(tc, test_key_lock_excludes_other_process);
  tcase_add_test(tc, test_shipped_database_first_and_never_written);
  tcase_add_test(tc, test_walk_orders_by_pending_hits);
  tcase_add_test(tc, test_shared_by_threads);
  tcase_add_test(tc, test_processes_compile_each_key_once);
  tcase_add_test(tc, test_remove_and_disabled);
  tcase_add_test(tc, test_invalid_arguments);
  tcase_add_test(tc, test_sql_files_run_in_the_shell);
  suite_add_tcase(suite, tc);
  return suite;
}

int main(void) { return sdpa_test_run(cache_suite()); }
