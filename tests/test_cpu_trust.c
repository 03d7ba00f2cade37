/*
 * test_cpu_trust.c — the cache as code: what it trusts, what it never
 * touches, and how it behaves under another process's misbehaviour.
 *
 * Tried as a hostile local user and as a careless one would: directories
 * and files that are not the user's own (group- or world-writable, another
 * owner when the tests run as root, links), planted lock files (a FIFO, a
 * link), rows whose blob is not a cubin for the key or comes from another
 * arch (their checksum recomputed, as anyone can), keyed checksums (a
 * forged row, another secret, a careless key file), a read-only file, a
 * writer stopped inside its transaction, the WAL after a prune, our own
 * moved-aside copies, a million-row style lookup by prefix, a first-layout
 * file migrated (or read as it is), and a successful call that leaves the
 * thread's last error alone. No GPU needed; a few keys are compiled by
 * NVRTC for sm_80.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "cache.h"
#include "check_main.h"
#include "test_cache.h"
#include "test_db.h"

/* ------------------------------------------------------------- helpers */

static sdpa_cache *open_cache_cfg(sdpa_cache_config *cfg, sdpa_test_log *log) {
  sdpa_cache *cache = NULL;
  cfg->log = sdpa_test_log_warning;
  cfg->log_user = log;
  ck_assert_int_eq(sdpa_cache_open(&cache, cfg), SDPA_STATUS_SUCCESS);
  return cache;
}

static sdpa_cache *open_cache(const char *path, sdpa_test_log *log) {
  sdpa_cache_config cfg = {0};
  cfg.path = path;
  return open_cache_cfg(&cfg, log);
}

/* A runtime for sm_80 on `path` (NULL: memory only). */
static sdpa_runtime *runtime_on(const char *path, sdpa_test_log *log) {
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.cache_path = path;
  opts.disable_disk_cache = path == NULL;
  opts.arch = 80;
  opts.log = sdpa_test_log_warning;
  opts.log_user = log;
  sdpa_runtime *rt = NULL;
  ck_assert_msg(sdpa_runtime_create(&rt, &opts) == SDPA_STATUS_SUCCESS, "%s",
                sdpa_last_error());
  return rt;
}

/* A small key (bf16 hd 64, BSHD, no mask) for `arch`. */
static sdpa_bwd_desc small_desc(int arch) {
  sdpa_bwd_desc d = sdpa_test_bshd_desc(1, 1, 128, 64);
  d.arch = arch;
  return d;
}

/* Compiles the small key of `arch` on `rt`: its source, hash (33 bytes)
 * and, when `cubin` is not NULL, a copy of the cubin (malloc'd). */
static sdpa_source compile_small(sdpa_runtime *rt, int arch, char *hash, void **cubin,
                                 size_t *size) {
  sdpa_bwd_desc d = small_desc(arch);
  sdpa_bwd_plan *plan = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
  sdpa_source source = SDPA_SOURCE_NONE;
  ck_assert_msg(sdpa_bwd_compile(plan, &source) == SDPA_STATUS_SUCCESS, "%s",
                sdpa_last_error());
  if (hash) snprintf(hash, 33, "%s", sdpa_bwd_plan_key_hash(plan));
  if (cubin) {
    sdpa_runtime *owner = rt;
    (void)owner;
    void *copy = NULL;
    size_t n = 0;
    ck_assert_int_eq(sdpa_cache_get_cubin(rt, sdpa_bwd_plan_key_hash(plan), &copy, &n),
                     SDPA_STATUS_SUCCESS);
    *cubin = copy;
    *size = n;
  }
  sdpa_bwd_plan_destroy(plan);
  return source;
}

/* Replaces row `hash`'s blob with `data`, recomputing its checksum (as
 * anyone who can write the file can). */
static void forge_row(const char *path, const char *hash, const void *data, size_t size) {
  sqlite3 *db = sdpa_test_db_open(path, SQLITE_OPEN_READWRITE);
  sqlite3_stmt *stmt = NULL;
  uint64_t sum = XXH3_64bits(data, size);
  int64_t checksum;
  memcpy(&checksum, &sum, sizeof checksum);
  ck_assert_int_eq(sqlite3_prepare_v2(db,
                                      "UPDATE kernels SET cubin = ?1, checksum = ?2, "
                                      "cubin_bytes = ?3 WHERE key_hash = ?4",
                                      -1, &stmt, NULL),
                   SQLITE_OK);
  sqlite3_bind_blob(stmt, 1, data, (int)size, SQLITE_STATIC);
  sqlite3_bind_int64(stmt, 2, checksum);
  sqlite3_bind_int64(stmt, 3, (int64_t)size);
  sqlite3_bind_text(stmt, 4, hash, -1, SQLITE_STATIC);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_DONE);
  ck_assert_int_eq(sqlite3_changes(db), 1);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

static void store_bytes(sdpa_cache *cache, unsigned number, const void *data, size_t size) {
  char hash[33], text[64];
  snprintf(hash, sizeof hash, "%032x", number);
  snprintf(text, sizeof text, "sdpa_bwd;trust=%u", number);
  sdpa_cache_meta meta = sdpa_test_meta(hash, text);
  int stored = 0;
  ck_assert_int_eq(sdpa_cache_store(cache, &meta, data, size, &stored), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stored, 1);
}

static sdpa_status lookup_number(sdpa_cache *cache, unsigned number) {
  char hash[33], text[64];
  void *data = NULL;
  size_t size = 0;
  snprintf(hash, sizeof hash, "%032x", number);
  snprintf(text, sizeof text, "sdpa_bwd;trust=%u", number);
  sdpa_status st = sdpa_cache_lookup(cache, hash, text, NULL, NULL, &data, &size, NULL);
  free(data);
  return st;
}

/* -------------------------------------------------------------- trust */

/* A directory writable by its group or by others, or (as root) owned by
 * another user, is not trusted: one warning, memory only; required, it is
 * an error; nothing is created in it. */
START_TEST(untrusted_directory) {
  char *dir = sdpa_test_tmpdir("trust");
  char *sub = sdpa_test_path(dir, "shared");
  char *path = sdpa_test_path(sub, "kernels.sqlite");
  ck_assert_int_eq(mkdir(sub, 0700), 0);
  const mode_t modes[] = {0770, 0707, 01777};
  for (size_t i = 0; i < 3; i++) {
    ck_assert_int_eq(chmod(sub, modes[i]), 0);
    sdpa_test_log log;
    sdpa_test_log_init(&log);
    sdpa_cache *cache = open_cache(path, &log);
    ck_assert_int_eq(log.warnings, 1);
    SDPA_TEST_EXPECT_WARNING(&log, 0, sub, "writable by", "in memory");
    ck_assert_ptr_null(sdpa_cache_path(cache));
    sdpa_cache_close(cache);
    sdpa_cache_config cfg = {0};
    cfg.path = path;
    cfg.required = 1;
    sdpa_cache *none = NULL;
    ck_assert_int_eq(sdpa_cache_open(&none, &cfg), SDPA_STATUS_CACHE_ERROR);
    ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "writable by"));
    ck_assert_ptr_null(none);
    ck_assert_int_eq(sdpa_test_count_prefixed(sub, "", NULL), 2); /* . and .. */
  }
  ck_assert_int_eq(chmod(sub, 0700), 0);
  if (geteuid() == 0) {
    /* another owner (as root the test can make one) */
    ck_assert_int_eq(chown(sub, 65534, 65534), 0);
    sdpa_test_log log;
    sdpa_test_log_init(&log);
    sdpa_cache *cache = open_cache(path, &log);
    SDPA_TEST_EXPECT_WARNING(&log, 0, sub, "belongs to uid 65534");
    ck_assert_ptr_null(sdpa_cache_path(cache));
    sdpa_cache_close(cache);
    ck_assert_int_eq(chown(sub, 0, 0), 0);
  }
  /* an ancestor writable by others and not sticky */
  char *deep = sdpa_test_path(sub, "inner");
  char *deep_path = sdpa_test_path(deep, "kernels.sqlite");
  ck_assert_int_eq(mkdir(deep, 0700), 0);
  ck_assert_int_eq(chmod(sub, 0777), 0);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache *cache = open_cache(deep_path, &log);
  SDPA_TEST_EXPECT_WARNING(&log, 0, sub, "not sticky");
  ck_assert_ptr_null(sdpa_cache_path(cache));
  sdpa_cache_close(cache);
  ck_assert_int_eq(chmod(sub, 0700), 0);
  /* the same, trusted: used */
  sdpa_test_log_init(&log);
  cache = open_cache(deep_path, &log);
  ck_assert_int_eq(log.warnings, 0);
  ck_assert_ptr_nonnull(sdpa_cache_path(cache));
  sdpa_cache_close(cache);
  free(deep);
  free(deep_path);
  free(path);
  free(sub);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* The database path itself: a link is refused (not followed), a file
 * writable by others or (as root) owned by another user is refused, each
 * left as it is. */
START_TEST(untrusted_file) {
  char *dir = sdpa_test_tmpdir("trustfile");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  char *target = sdpa_test_path(dir, "elsewhere.sqlite");
  ck_assert_int_eq(symlink(target, path), 0);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache *cache = open_cache(path, &log);
  SDPA_TEST_EXPECT_WARNING(&log, 0, "symbolic link");
  ck_assert_ptr_null(sdpa_cache_path(cache));
  sdpa_cache_close(cache);
  struct stat st;
  ck_assert(stat(target, &st) != 0); /* the link was not followed */
  ck_assert_int_eq(unlink(path), 0);

  sdpa_test_log_init(&log);
  cache = open_cache(path, &log); /* a cache of ours */
  store_bytes(cache, 1, "abcdef", 6);
  sdpa_cache_close(cache);
  ck_assert_int_eq(chmod(path, 0666), 0);
  sdpa_test_log_init(&log);
  cache = open_cache(path, &log);
  SDPA_TEST_EXPECT_WARNING(&log, 0, path, "writable by");
  ck_assert_int_eq(lookup_number(cache, 1), SDPA_STATUS_NOT_FOUND);
  sdpa_cache_close(cache);
  ck_assert_int_eq(chmod(path, 0600), 0);
  if (geteuid() == 0) {
    ck_assert_int_eq(chown(path, 65534, 65534), 0);
    sdpa_test_log_init(&log);
    cache = open_cache(path, &log);
    SDPA_TEST_EXPECT_WARNING(&log, 0, path, "uid 65534");
    ck_assert_int_eq(lookup_number(cache, 1), SDPA_STATUS_NOT_FOUND);
    sdpa_cache_close(cache);
    ck_assert_int_eq(chown(path, 0, 0), 0);
  }
  sdpa_test_log_init(&log);
  cache = open_cache(path, &log);
  ck_assert_int_eq(log.warnings, 0);
  ck_assert_int_eq(lookup_number(cache, 1), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  free(target);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* With HOME unset the default is <TMPDIR>/sdpa-jit-<uid>: a directory
 * another user made there first is not used. */
START_TEST(planted_default_directory) {
  char *tmp = sdpa_test_tmpdir("tmpdir");
  char name[64];
  snprintf(name, sizeof name, "sdpa-jit-%ld", (long)geteuid());
  char *planted = sdpa_test_path(tmp, name);
  ck_assert_int_eq(mkdir(planted, 0777), 0);
  ck_assert_int_eq(chmod(planted, 0777), 0);
  const char *saved[4] = {getenv("SDPA_JIT_CACHE"), getenv("XDG_CACHE_HOME"),
                          getenv("HOME"), getenv("TMPDIR")};
  char *copies[4];
  for (int i = 0; i < 4; i++) copies[i] = saved[i] ? strdup(saved[i]) : NULL;
  unsetenv("SDPA_JIT_CACHE");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  setenv("TMPDIR", tmp, 1);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache *cache = open_cache(NULL, &log);
  SDPA_TEST_EXPECT_WARNING(&log, 0, planted, "writable by");
  ck_assert_ptr_null(sdpa_cache_path(cache));
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_count_prefixed(planted, "", NULL), 2);
  const char *names[4] = {"SDPA_JIT_CACHE", "XDG_CACHE_HOME", "HOME", "TMPDIR"};
  for (int i = 0; i < 4; i++) {
    if (copies[i])
      setenv(names[i], copies[i], 1);
    else
      unsetenv(names[i]);
    free(copies[i]);
  }
  free(planted);
  sdpa_test_rmtree(tmp);
  free(tmp);
}
END_TEST

/* Planted lock files: a FIFO does not hang the open, a link is not
 * followed; either way the caller compiles without the lock, told so. */
START_TEST(planted_lock_files) {
  char *dir = sdpa_test_tmpdir("locks");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache_config cfg = {0};
  cfg.path = path;
  cfg.lock_timeout_ms = 60000;
  sdpa_cache *cache = open_cache_cfg(&cfg, &log);
  char *locks = sdpa_test_path(dir, "locks");
  ck_assert_int_eq(mkdir(locks, 0700), 0);
  char fifo_hash[33], link_hash[33];
  snprintf(fifo_hash, sizeof fifo_hash, "%032x", 0xf1f0u);
  snprintf(link_hash, sizeof link_hash, "%032x", 0x11u);
  char fifo[1200], link[1200], target[1200];
  snprintf(fifo, sizeof fifo, "%s/%s.lock", locks, fifo_hash);
  snprintf(link, sizeof link, "%s/%s.lock", locks, link_hash);
  snprintf(target, sizeof target, "%s/victim", dir);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(symlink(target, link), 0);

  sdpa_cache_lock *lock = (sdpa_cache_lock *)1;
  const double start = sdpa_test_now_ms();
  sdpa_cache_lock_key(cache, fifo_hash, &lock);
  ck_assert_ptr_null(lock);
  ck_assert_msg(sdpa_test_now_ms() - start < 2000, "a FIFO lock file blocked");
  SDPA_TEST_EXPECT_WARNING(&log, 0, fifo, "not a regular file");
  lock = (sdpa_cache_lock *)1;
  sdpa_cache_lock_key(cache, link_hash, &lock);
  ck_assert_ptr_null(lock);
  SDPA_TEST_EXPECT_WARNING(&log, 1, link);
  struct stat st;
  ck_assert(lstat(target, &st) != 0); /* nothing created where the link points */
  /* a regular lock still works */
  char ok_hash[33];
  snprintf(ok_hash, sizeof ok_hash, "%032x", 0x22u);
  sdpa_cache_lock_key(cache, ok_hash, &lock);
  ck_assert_ptr_nonnull(lock);
  sdpa_cache_unlock_key(lock);
  sdpa_cache_close(cache);
  free(locks);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* ------------------------------------------------- blobs before the driver */

/* Rows whose blob is not a cubin for the key (text the driver would read
 * as PTX; a real cubin of another arch), with their checksum recomputed,
 * are never returned: compile removes them, compiles again, and stores a
 * good row. */
START_TEST(forged_blobs_refused) {
  char *dir = sdpa_test_tmpdir("forged");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  char hash80[33], hash86[33];
  void *cubin86 = NULL;
  size_t size86 = 0;
  ck_assert_int_eq(compile_small(rt, 80, hash80, NULL, NULL), SDPA_SOURCE_COMPILED);
  ck_assert_int_eq(compile_small(rt, 86, hash86, &cubin86, &size86), SDPA_SOURCE_COMPILED);
  sdpa_runtime_destroy(rt);

  const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                     ".visible .entry sdpa_bwd_main() { ret; }\n";
  const struct {
    const void *data;
    size_t size;
    const char *why;
  } forgeries[] = {{ptx, sizeof ptx - 1, "not an ELF image"},
                   {cubin86, size86, "a cubin for sm_86, not sm_80"},
                   {cubin86, 200, "outside"}};
  for (size_t i = 0; i < 3; i++) {
    forge_row(path, hash80, forgeries[i].data, forgeries[i].size);
    sdpa_test_log_init(&log);
    rt = runtime_on(path, &log);
    ck_assert_int_eq(compile_small(rt, 80, NULL, NULL, NULL), SDPA_SOURCE_COMPILED);
    ck_assert_int_eq(log.warnings, 1);
    SDPA_TEST_EXPECT_WARNING(&log, 0, hash80, "not a cubin for this key", forgeries[i].why,
                             "removed");
    sdpa_runtime_destroy(rt);
    sdpa_test_log_init(&log);
    rt = runtime_on(path, &log);
    ck_assert_int_eq(compile_small(rt, 80, NULL, NULL, NULL), SDPA_SOURCE_DISK);
    sdpa_runtime_destroy(rt);
    ck_assert_int_eq(log.warnings, 0);
  }
  /* verify finds a forged row by the arch its row names, and names it */
  forge_row(path, hash80, cubin86, size86);
  sdpa_test_log_init(&log);
  rt = runtime_on(path, &log);
  int64_t checked = 0, removed = 0;
  ck_assert_int_eq(sdpa_cache_verify(rt, &checked, &removed), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(checked, 2);
  ck_assert_int_eq(removed, 1);
  ck_assert(!sdpa_test_db_has_row(path, hash80) && sdpa_test_db_has_row(path, hash86));
  sdpa_runtime_destroy(rt);
  free(cubin86);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* Keyed checksums: rows carry an HMAC; a forged blob with a recomputed
 * checksum, or a row made under another secret, is refused; a careless
 * key file is refused, and with it every database. */
START_TEST(keyed_checksums) {
  char *dir = sdpa_test_tmpdir("keyed");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  char *key_file = sdpa_test_path(dir, "secret");
  sdpa_test_write_file(key_file, "0123456789abcdef0123456789abcdef\n", 33);
  ck_assert_int_eq(chmod(key_file, 0600), 0);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache_config cfg = {0};
  cfg.path = path;
  cfg.key_file = key_file;
  sdpa_cache *cache = open_cache_cfg(&cfg, &log);
  store_bytes(cache, 7, "genuine", 7);
  ck_assert_int_eq(lookup_number(cache, 7), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  char hash[33];
  snprintf(hash, sizeof hash, "%032x", 7u);
  ck_assert_int_eq(
      sdpa_test_db_int(path, "SELECT length(mac) FROM kernels WHERE key_hash = "
                             "'00000000000000000000000000000007'"),
      64);

  /* the same secret from the environment */
  setenv("SDPA_JIT_CACHE_KEY", "0123456789abcdef0123456789abcdef", 1);
  sdpa_test_log_init(&log);
  cache = open_cache(path, &log);
  ck_assert_int_eq(lookup_number(cache, 7), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  /* another secret: refused (and, the file being ours, removed) */
  setenv("SDPA_JIT_CACHE_KEY", "another secret of 16+ bytes", 1);
  sdpa_test_log_init(&log);
  cache = open_cache(path, &log);
  ck_assert_int_eq(lookup_number(cache, 7), SDPA_STATUS_NOT_FOUND);
  SDPA_TEST_EXPECT_WARNING(&log, 0, "MAC does not verify");
  store_bytes(cache, 8, "other", 5);
  sdpa_cache_close(cache);
  unsetenv("SDPA_JIT_CACHE_KEY");

  /* a forged blob with a recomputed checksum under the file's secret */
  cache = open_cache_cfg(&cfg, &log);
  store_bytes(cache, 9, "genuine", 7);
  sdpa_cache_close(cache);
  char hash9[33];
  snprintf(hash9, sizeof hash9, "%032x", 9u);
  forge_row(path, hash9, "planted", 7);
  /* without a secret the checksum alone is checked: a process that has
   * none takes what the forger wrote (which is what the MAC is for) */
  sdpa_test_log_init(&log);
  sdpa_cache_config plain = {0};
  plain.path = path;
  plain.access = SDPA_CACHE_READ_ONLY;
  cache = open_cache_cfg(&plain, &log);
  ck_assert_int_eq(lookup_number(cache, 9), SDPA_STATUS_SUCCESS);
  sdpa_cache_close(cache);
  /* with it, refused */
  sdpa_test_log_init(&log);
  cache = open_cache_cfg(&cfg, &log);
  ck_assert_int_eq(lookup_number(cache, 9), SDPA_STATUS_NOT_FOUND);
  SDPA_TEST_EXPECT_WARNING(&log, 0, "MAC");
  sdpa_cache_close(cache);

  /* a key file others may write, or too short: no database is trusted */
  ck_assert_int_eq(chmod(key_file, 0622), 0);
  sdpa_test_log_init(&log);
  cache = open_cache_cfg(&cfg, &log);
  SDPA_TEST_EXPECT_WARNING(&log, 0, key_file, "writable by nobody else");
  ck_assert_ptr_null(sdpa_cache_path(cache));
  sdpa_cache_close(cache);
  cfg.required = 1;
  sdpa_cache *none = NULL;
  ck_assert_int_eq(sdpa_cache_open(&none, &cfg), SDPA_STATUS_CACHE_ERROR);
  ck_assert_int_eq(chmod(key_file, 0600), 0);
  sdpa_test_write_file(key_file, "short", 5);
  ck_assert_int_eq(sdpa_cache_open(&none, &cfg), SDPA_STATUS_CACHE_ERROR);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "at least 16"));
  free(key_file);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* ---------------------------------------------------- read-only files */

/* A valid cache in a read-only file is used read-only: hits served,
 * stores skipped, one warning, the file unchanged. */
START_TEST(read_only_file_used) {
  char *dir = sdpa_test_tmpdir("rofile");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache *cache = open_cache(path, &log);
  store_bytes(cache, 1, "kept", 4);
  sdpa_cache_close(cache);
  ck_assert_int_eq(chmod(path, 0400), 0);
  size_t before_size = 0, after_size = 0;
  unsigned char *before = sdpa_test_read_file(path, &before_size);
  sdpa_test_log_init(&log);
  cache = open_cache(path, &log);
  ck_assert_int_eq(log.warnings, 1);
  SDPA_TEST_EXPECT_WARNING(&log, 0, "cannot be written", "read-only file");
  ck_assert_ptr_nonnull(sdpa_cache_path(cache));
  ck_assert_int_eq(sdpa_cache_writable(cache), 0);
  ck_assert_int_eq(lookup_number(cache, 1), SDPA_STATUS_SUCCESS);
  char hash[33];
  snprintf(hash, sizeof hash, "%032x", 2u);
  sdpa_cache_meta meta = sdpa_test_meta(hash, "sdpa_bwd;trust=2");
  int stored = 1;
  ck_assert_int_eq(sdpa_cache_store(cache, &meta, "new", 3, &stored), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stored, 0);
  sdpa_cache_close(cache);
  unsigned char *after = sdpa_test_read_file(path, &after_size);
  ck_assert(before_size == after_size && !memcmp(before, after, before_size));
  free(before);
  free(after);
  ck_assert_int_eq(chmod(path, 0600), 0);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* ------------------------------------------------ another writer stopped */

/* A process that holds the write lock (stopped inside its transaction):
 * lookups from other threads never wait for it, the first store waits at
 * most the busy timeout and then stores back off, so the next misses do
 * not each wait again. */
typedef struct store_job {
  sdpa_cache *cache;
  double ms;
} store_job;

static void *store_thread(void *arg) {
  store_job *job = arg;
  char hash[33];
  snprintf(hash, sizeof hash, "%032x", 50u);
  sdpa_cache_meta meta = sdpa_test_meta(hash, "sdpa_bwd;trust=50");
  const double start = sdpa_test_now_ms();
  int stored = 1;
  sdpa_cache_store(job->cache, &meta, "late", 4, &stored);
  job->ms = sdpa_test_now_ms() - start;
  return NULL;
}

START_TEST(stopped_writer) {
  char *dir = sdpa_test_tmpdir("stopped");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache *cache = open_cache(path, &log);
  store_bytes(cache, 1, "hit", 3);
  int ready[2];
  ck_assert_int_eq(pipe(ready), 0);
  pid_t holder = fork();
  ck_assert_int_ge(holder, 0);
  if (holder == 0) {
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK ||
        sqlite3_exec(db, "BEGIN IMMEDIATE; DELETE FROM kernels WHERE 0", NULL, NULL,
                     NULL) != SQLITE_OK)
      _exit(1);
    if (write(ready[1], "x", 1) != 1) _exit(2);
    for (;;) pause(); /* a writer stopped inside its transaction */
  }
  char c;
  ck_assert_int_eq(read(ready[0], &c, 1), 1);
  store_job job = {cache, 0};
  pthread_t thread;
  ck_assert_int_eq(pthread_create(&thread, NULL, store_thread, &job), 0);
  sdpa_test_sleep_ms(100);
  double worst = 0;
  for (int i = 0; i < 20; i++) { /* while the store waits */
    const double start = sdpa_test_now_ms();
    ck_assert_int_eq(lookup_number(cache, 1), SDPA_STATUS_SUCCESS);
    const double ms = sdpa_test_now_ms() - start;
    if (ms > worst) worst = ms;
    sdpa_test_sleep_ms(50);
  }
  pthread_join(thread, NULL);
  ck_assert_msg(worst < 500, "a lookup waited %.0f ms for the stopped writer", worst);
  ck_assert_msg(job.ms > 5000 && job.ms < 15000, "the first store took %.0f ms", job.ms);
  /* backed off: the next store does not wait */
  const double start = sdpa_test_now_ms();
  char hash[33];
  snprintf(hash, sizeof hash, "%032x", 51u);
  sdpa_cache_meta meta = sdpa_test_meta(hash, "sdpa_bwd;trust=51");
  int stored = 1;
  ck_assert_int_eq(sdpa_cache_store(cache, &meta, "skip", 4, &stored), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stored, 0);
  ck_assert_msg(sdpa_test_now_ms() - start < 500, "a store during the back-off waited");
  SDPA_TEST_EXPECT_WARNING(&log, 0, "write lock", "skipped for a while");
  kill(holder, SIGKILL);
  waitpid(holder, NULL, 0);
  sdpa_cache_close(cache);
  close(ready[0]);
  close(ready[1]);
  printf("trust: lookups during a stopped writer: worst %.1f ms; first store %.0f ms\n",
         worst, job.ms);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* ------------------------------------------------------ bounded files */

/* After a prune the WAL is truncated, even with another connection open;
 * moved-aside copies beyond the two newest are removed. */
START_TEST(wal_and_copies_bounded) {
  char *dir = sdpa_test_tmpdir("bounded");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache *cache = open_cache(path, &log);
  sqlite3 *other = sdpa_test_db_open(path, SQLITE_OPEN_READONLY);
  unsigned char *blob = malloc(256 * 1024);
  ck_assert_ptr_nonnull(blob);
  for (unsigned i = 0; i < 40; i++) {
    memset(blob, (int)i, 256 * 1024);
    store_bytes(cache, 100 + i, blob, 256 * 1024);
  }
  int64_t removed = 0;
  ck_assert_int_eq(sdpa_cache_prune_rows(cache, 0, -1, &removed), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 40);
  char *wal = sdpa_test_path(dir, "kernels.sqlite-wal");
  struct stat st;
  ck_assert_int_eq(stat(wal, &st), 0);
  ck_assert_msg(st.st_size <= 4194304, "the WAL kept %lld bytes", (long long)st.st_size);
  sqlite3_close(other);
  sdpa_cache_close(cache);
  free(blob);

  /* four old copies of ours, then damage: two copies remain */
  for (int i = 0; i < 4; i++) {
    char name[128];
    snprintf(name, sizeof name, "kernels.sqlite.corrupt-%d-1", 1000 + i);
    char *copy = sdpa_test_path(dir, name);
    sdpa_test_write_file(copy, "old", 3);
    free(copy);
  }
  sdpa_test_write_file(path, "SQLite format 3", 16); /* header only: ours? no */
  sdpa_test_log_init(&log);
  cache = open_cache(path, &log); /* not provably ours: left, nothing reaped */
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt-", NULL), 4);
  unlink(path);
  cache = open_cache(path, &log);
  store_bytes(cache, 1, "x", 1);
  sdpa_cache_close(cache);
  struct stat db;
  ck_assert_int_eq(stat(path, &db), 0);
  ck_assert_int_eq(truncate(path, db.st_size / 2 + 1), 0); /* ours, damaged */
  sdpa_test_log_init(&log);
  cache = open_cache(path, &log);
  lookup_number(cache, 1);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt-", NULL), 2);
  free(wal);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* ---------------------------------------------------------- large caches */

/* A prefix lookup reads the matches only: 200,000 rows, `show 000000`-
 * style prefixes that match nothing or one row, each well under a
 * second. */
START_TEST(prefix_lookup_is_linear_in_matches) {
  char *dir = sdpa_test_tmpdir("large");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache *cache = open_cache(path, &log);
  sdpa_cache_close(cache);
  sdpa_test_db_exec(path,
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                    "WHERE i < 200000) INSERT INTO kernels (key_hash, key_text, cubin, "
                    "cubin_bytes, checksum, created, last_used) SELECT printf('%032x', i "
                    "* 2654435761 % 4294967296), 'k' || i, x'00', 1, 0, 1, 1 FROM n");
  cache = open_cache(path, &log);
  const char *prefixes[] = {"000000", "ffffff", "123456"};
  for (size_t i = 0; i < 3; i++) {
    const double start = sdpa_test_now_ms();
    sdpa_cache_entry *e = NULL;
    sdpa_status st = sdpa_cache_get_entry(cache, prefixes[i], &e);
    ck_assert(st == SDPA_STATUS_NOT_FOUND || st == SDPA_STATUS_SUCCESS ||
              st == SDPA_STATUS_INVALID_ARGUMENT);
    sdpa_cache_free_entries(e, e ? 1 : 0);
    const double ms = sdpa_test_now_ms() - start;
    ck_assert_msg(ms < 1000, "prefix %s took %.0f ms", prefixes[i], ms);
  }
  sdpa_cache_close(cache);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* ------------------------------------------------------------- layouts */

/* A first-layout file (user_version 1, no family/lse/det/even/dq/mac
 * columns): opened for writing it is migrated, its rows kept; opened
 * read-only it is read as it is, byte for byte untouched. */
START_TEST(first_layout_migrated) {
  static const char v1[] =
      "PRAGMA journal_mode = DELETE;"
      "CREATE TABLE kernels (key_hash TEXT PRIMARY KEY NOT NULL, key_text TEXT NOT NULL,"
      " arch INTEGER, dtype TEXT, head_dim INTEGER, head_dim_v INTEGER, q_tile INTEGER,"
      " kv_tile INTEGER, warps INTEGER, stages INTEGER, mask TEXT, layout TEXT,"
      " nvrtc_version TEXT, runtime_version TEXT, cubin BLOB NOT NULL,"
      " cubin_bytes INTEGER NOT NULL, checksum INTEGER NOT NULL, compile_ms REAL,"
      " compile_log TEXT, created INTEGER NOT NULL, last_used INTEGER NOT NULL,"
      " hits INTEGER NOT NULL DEFAULT 0);"
      "INSERT INTO kernels (key_hash, key_text, arch, dtype, cubin, cubin_bytes, checksum,"
      " created, last_used) VALUES ('0123456789abcdef0123456789abcdef', 'sdpa_bwd;arch=80;"
      "dtype=bf16', 80, 'bf16', x'00', 1, 0, 5, 5);"
      "PRAGMA application_id = 1396985921; PRAGMA user_version = 1;";
  char *dir = sdpa_test_tmpdir("v1");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_db_exec(path, v1);
  size_t before_size = 0, after_size = 0;
  unsigned char *before = sdpa_test_read_file(path, &before_size);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_cache_config cfg = {0};
  cfg.path = path;
  cfg.access = SDPA_CACHE_READ_ONLY;
  sdpa_cache *cache = open_cache_cfg(&cfg, &log);
  ck_assert_int_eq(log.warnings, 0);
  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  ck_assert_int_eq(sdpa_cache_list_entries(cache, &entries, &count), SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 1);
  ck_assert_str_eq(entries[0].dtype, "bf16");
  ck_assert_ptr_null(entries[0].family); /* the first layout had no such column */
  ck_assert_int_eq(entries[0].even, -1);
  sdpa_cache_free_entries(entries, count);
  sdpa_cache_close(cache);
  unsigned char *after = sdpa_test_read_file(path, &after_size);
  ck_assert(before_size == after_size && !memcmp(before, after, before_size));
  free(after);

  cache = open_cache(path, &log); /* read-write: migrated */
  ck_assert_int_eq(log.warnings, 0);
  store_bytes(cache, 3, "new", 3);
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_db_int(path, "PRAGMA user_version"), SDPA_CACHE_SCHEMA_VERSION);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels"), 2);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels WHERE family = "
                                          "'mma' AND deterministic = 1 AND dq = 'main'"),
                   1);
  free(before);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* ------------------------------------------------------- the last error */

/* A call that succeeds leaves sdpa_last_error() as the last failing call
 * left it, whatever its inner steps met (here: a compile that misses the
 * cache, and on a machine without a GPU the driver it looks for). */
START_TEST(last_error_survives_success) {
  sdpa_runtime *rt = runtime_on(NULL, NULL);
  sdpa_bwd_desc bad = small_desc(80);
  bad.head_dim = 100;
  sdpa_bwd_plan *plan = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &bad), SDPA_STATUS_INVALID_ARGUMENT);
  char message[512];
  snprintf(message, sizeof message, "%s", sdpa_last_error());
  ck_assert_ptr_nonnull(strstr(message, "head_dim = 100"));
  sdpa_bwd_desc good = small_desc(80);
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &good), SDPA_STATUS_SUCCESS);
  ck_assert_str_eq(sdpa_last_error(), message);
  ck_assert_int_eq(sdpa_bwd_compile(plan, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_str_eq(sdpa_last_error(), message);
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_stats_get(rt, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_str_eq(sdpa_last_error(), message);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
}
END_TEST

static Suite *trust_suite(void) {
  Suite *s = suite_create("trust");
  TCase *tc = tcase_create("files");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, untrusted_directory);
  tcase_add_test(tc, untrusted_file);
  tcase_add_test(tc, planted_default_directory);
  tcase_add_test(tc, planted_lock_files);
  tcase_add_test(tc, read_only_file_used);
  tcase_add_test(tc, wal_and_copies_bounded);
  tcase_add_test(tc, prefix_lookup_is_linear_in_matches);
  tcase_add_test(tc, first_layout_migrated);
  tcase_add_test(tc, keyed_checksums);
  tcase_add_test(tc, stopped_writer);
  suite_add_tcase(s, tc);
  TCase *blobs = tcase_create("blobs");
  tcase_set_timeout(blobs, 600); /* NVRTC compiles two keys */
  tcase_add_test(blobs, forged_blobs_refused);
  tcase_add_test(blobs, last_error_survives_success);
  suite_add_tcase(s, blobs);
  return s;
}

int main(void) { return sdpa_test_run(trust_suite()); }
