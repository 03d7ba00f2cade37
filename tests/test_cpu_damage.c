/*
 * test_cpu_damage.c — damaged, missing, unusable and full cache files,
 * through the whole runtime (create → plan → compile).
 *
 * A training fleet's cache lives on shared or ephemeral disks: files get
 * flipped bits, are cut short by a full disk or a copy that died, are
 * replaced by a directory or by junk, come from a newer release, or sit
 * where nothing can be created; $HOME may not even be set in a container,
 * and disks fill up. In every such case a compile must still succeed,
 * the user must see exactly the warnings that matter (counted through the
 * runtime's log callback), and each warning must say which file and what
 * to do. test_cpu_cache.c covers these files at the cache level; here the
 * same damage goes through the public API, where what matters is what a
 * user's compile returns, where the kernel came from, and what is left on
 * disk afterwards (repaired row, fresh file, untouched newer file).
 *
 * The second half holds the cache to its size rules: writes failing with
 * EFBIG (RLIMIT_FSIZE, SIGXFSZ ignored) cost only the row and one warning
 * while earlier rows keep being served; a tiny cache_max_bytes keeps the
 * file under the cap by least-recent use; sdpa_cache_prune(max_bytes)
 * keeps the rows used last.
 *
 * main() compiles six keys once into a "golden" database (K0..K3 kept,
 * K4 and K5 removed again but their sizes noted); tests start from copies
 * of it, so NVRTC runs only where a test needs a fresh compile.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "check_main.h"
#include "test_cache.h"
#include "test_db.h"
#include "plan.h"
#include "sdpa_jit.h"

enum { KEYS = 6, GOLDEN_KEYS = 4 };

/* What main() learned while building the golden database. */
typedef struct golden_info {
  char hash[KEYS][33];
  int64_t size[KEYS]; /* cubin bytes */
} golden_info;

static char *shared_dir;  /* made in main(), removed after the run */
static char *golden_path; /* K0..K3, WAL checkpointed into the file */
static golden_info golden;

/* ------------------------------------------------------------- helpers */

/* Key k: bf16/fp16 x mask none/causal_br/window, head_dim 64, small BSHD
 * shapes, arch 90 (K0 bf16 none, K1 bf16 causal_br, K2 fp16 none, K3 fp16
 * causal_br, K4 bf16 window, K5 fp16 window). */
static sdpa_bwd_desc key_desc(int k) {
  static const sdpa_mask masks[] = {
      SDPA_MASK_NONE,           SDPA_MASK_CAUSAL_BOTTOM_RIGHT,
      SDPA_MASK_NONE,           SDPA_MASK_CAUSAL_BOTTOM_RIGHT,
      SDPA_MASK_SLIDING_WINDOW, SDPA_MASK_SLIDING_WINDOW};
  sdpa_bwd_desc d = SDPA_BWD_DESC_INIT;
  d.dtype = (k == 2 || k == 3 || k == 5) ? SDPA_DTYPE_FP16 : SDPA_DTYPE_BF16;
  d.layout = SDPA_LAYOUT_BSHD;
  d.batch = 2;
  d.heads_q = 8;
  d.heads_kv = 2;
  d.seqlen_q = d.seqlen_kv = 256;
  d.head_dim = 64;
  d.mask = masks[k];
  d.window_left = 64;
  d.window_right = 0;
  d.arch = 90;
  return d;
}

/* A runtime on `path` (NULL: the default location) for arch 90, logging
 * into `counter`, with an optional size cap. */
static sdpa_runtime *runtime_capped(const char *path, sdpa_test_log *counter,
                                    int64_t max_bytes) {
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  sdpa_runtime *rt = NULL;
  opts.cache_path = path;
  opts.arch = 90;
  opts.cache_max_bytes = max_bytes;
  opts.log = sdpa_test_log_warning;
  opts.log_user = counter;
  sdpa_status st = sdpa_runtime_create(&rt, &opts);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "runtime_create: %s",
                sdpa_last_error());
  return rt;
}

static sdpa_runtime *runtime_on(const char *path, sdpa_test_log *counter) {
  return runtime_capped(path, counter, 0);
}

/* Plans and compiles key k; returns where it came from. *out (may be
 * NULL) gets the plan, else it is destroyed. */
static sdpa_source compile_key(sdpa_runtime *rt, int k, sdpa_bwd_plan **out) {
  sdpa_bwd_desc d = key_desc(k);
  sdpa_bwd_plan *plan = NULL;
  sdpa_source source = SDPA_SOURCE_NONE;
  sdpa_status st = sdpa_bwd_plan_create(&plan, rt, &d);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan K%d: %s", k,
                sdpa_last_error());
  st = sdpa_bwd_compile(plan, &source);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "compile K%d: %s: %s", k,
                sdpa_status_name(st), sdpa_last_error());
  ck_assert_str_eq(sdpa_bwd_plan_key_hash(plan), golden.hash[k]);
  if (out)
    *out = plan;
  else
    sdpa_bwd_plan_destroy(plan);
  return source;
}

/* A fresh directory holding a copy of the golden database as
 * <dir>/kernels.sqlite; *path gets that path. */
static char *golden_copy(const char *tag, char **path) {
  char *dir = sdpa_test_tmpdir(tag);
  size_t size = 0;
  unsigned char *bytes = sdpa_test_read_file(golden_path, &size);
  *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_write_file(*path, bytes, size);
  free(bytes);
  return dir;
}

static int64_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* Nonzero when the row of key k is in the file at `path`. */
static int has_row(const char *path, int k) {
  return sdpa_test_db_has_row(path, golden.hash[k]);
}

/* Flips one byte in the middle of key k's stored cubin; the checksum
 * column stays as it was. */
static void flip_cubin_byte(const char *path, int k) {
  ck_assert_int_gt(sdpa_test_db_flip_cubin(path, golden.hash[k], 0xA5), 1000);
}

/* Sets last_used of key k to now - age seconds (one row changes). */
static void set_age(const char *path, int k, int64_t age) {
  sdpa_test_db_set_age(path, golden.hash[k], age);
}

/* ------------------------------------------------------ damaged files */

/* A flipped byte inside a stored cubin: the checksum catches it, the row
 * is removed and compiled again, the new row serves the next process. */
START_TEST(flipped_cubin_byte) {
  char *path = NULL;
  char *dir = golden_copy("flip", &path);
  flip_cubin_byte(path, 0);

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_int_eq(log.warnings, 0);
  sdpa_bwd_plan *plan = NULL;
  ck_assert_int_eq(compile_key(rt, 0, &plan), SDPA_SOURCE_COMPILED);
  ck_assert_msg(log.warnings == 1, "%d warnings", log.warnings);
  SDPA_TEST_EXPECT_WARNING(&log, 0, golden.hash[0], path, "checksum",
                           "compiled again");

  /* The row is repaired: it holds what the runtime now uses. */
  void *stored = NULL;
  size_t size = 0;
  ck_assert_int_eq(sdpa_cache_get_cubin(rt, golden.hash[0], &stored, &size),
                   SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(size, plan->cubin_size);
  ck_assert_int_eq(memcmp(stored, plan->cubin, size), 0);
  sdpa_free(stored);
  int64_t checked = -1, removed = -1;
  ck_assert_int_eq(sdpa_cache_verify(rt, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(checked, GOLDEN_KEYS);
  ck_assert_int_eq(removed, 0);
  /* the other rows were not touched */
  ck_assert_int_eq(compile_key(rt, 1, NULL), SDPA_SOURCE_DISK);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 1);

  sdpa_test_log_init(&log);
  rt = runtime_on(path, &log);
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_DISK);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 0);
  sdpa_test_db_check_integrity(path);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* The file cut short after its third page (a copy or a disk that died):
 * the schema still reads, the cubin does not. The first lookup finds the
 * damage, the file is moved aside (kept for inspection), a new one
 * starts, and the compile succeeds with one warning. */
START_TEST(truncated_database) {
  char *path = NULL;
  char *dir = golden_copy("trunc", &path);
  int64_t page = sdpa_test_db_int(path, "PRAGMA page_size");
  int64_t full = file_size(path);
  ck_assert_int_gt(full, 8 * page);
  ck_assert_int_eq(truncate(path, 3 * page), 0);

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_int_eq(compile_key(rt, 3, NULL), SDPA_SOURCE_COMPILED);
  ck_assert_msg(log.warnings == 1, "%d warnings; first: %s", log.warnings,
                log.text[0]);
  char *moved = NULL;
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt-", &moved),
                   1);
  /* found on open or on the first lookup, depending on the page that is
   * missing first: either way one warning naming both files */
  SDPA_TEST_EXPECT_WARNING(&log, 0, path, "moved it to", moved,
                           "started a new one");
  ck_assert_int_eq(file_size(moved), 3 * page); /* kept as it was */
  ck_assert_str_eq(sdpa_runtime_cache_path(rt), path);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 1);

  sdpa_test_log_init(&log);
  rt = runtime_on(path, &log);
  ck_assert_int_eq(compile_key(rt, 3, NULL), SDPA_SOURCE_DISK);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 0);
  sdpa_test_db_check_integrity(path);
  free(moved);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* A zero-length file is an empty SQLite database: used in place, no
 * warning, nothing moved aside. */
START_TEST(zero_length_file) {
  char *dir = sdpa_test_tmpdir("empty");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_test_write_file(path, "", 0);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_str_eq(sdpa_runtime_cache_path(rt), path);
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_COMPILED);
  sdpa_runtime_destroy(rt);
  ck_assert_msg(log.warnings == 0, "warned: %s", log.text[0]);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.", NULL), 0);
  sdpa_test_db_check_integrity(path);
  ck_assert(has_row(path, 0));
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* Random bytes where the cache should be: not provably ours, so left byte
 * for byte; one warning that names the file; kernels kept in memory. */
START_TEST(random_bytes_file) {
  char *dir = sdpa_test_tmpdir("junk");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  enum { JUNK = 65536 };
  unsigned char *junk = malloc(JUNK);
  unsigned state = 12345;
  for (int i = 0; i < JUNK; i++) junk[i] = (unsigned char)rand_r(&state);
  sdpa_test_write_file(path, junk, JUNK);

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_int_eq(log.warnings, 1); /* found when the file is opened */
  SDPA_TEST_EXPECT_WARNING(&log, 0, path, "not an SQLite database", "left untouched",
                           "in memory");
  ck_assert_ptr_null(sdpa_runtime_cache_path(rt));
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_COMPILED);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 1);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.", NULL), 0);
  size_t size = 0;
  unsigned char *kept = sdpa_test_read_file(path, &size);
  ck_assert_uint_eq(size, JUNK);
  ck_assert_int_eq(memcmp(kept, junk, JUNK), 0);
  free(kept);
  free(junk);
  free(path);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* A directory where the file should be: memory mode with one warning, the
 * directory left alone, compiles keep working (the second from memory). */
START_TEST(directory_in_place_of_file) {
  char *dir = sdpa_test_tmpdir("isdir");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  ck_assert_int_eq(mkdir(path, 0700), 0);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_int_eq(log.warnings, 1);
  SDPA_TEST_EXPECT_WARNING(&log, 0, path, "a directory", "in memory",
                           "SDPA_JIT_CACHE");
  ck_assert_ptr_null(sdpa_runtime_cache_path(rt));
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_COMPILED);
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_MEMORY);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 1);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert(S_ISDIR(st.st_mode));
  ck_assert_int_eq(sdpa_test_count_prefixed(path, "", NULL), 2); /* "." and ".." */
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* A cache written by a newer sdpa-jit (user_version 3): its rows are not
 * used, nothing is written to it, one warning says what to do. */
START_TEST(newer_user_version) {
  char *path = NULL;
  char *dir = golden_copy("newer", &path);
  sdpa_test_db_exec(path, "PRAGMA user_version = 3");
  char *wal = sdpa_test_path(dir, "kernels.sqlite-wal");
  ck_assert_int_le(file_size(wal), 0); /* checkpointed at close */
  size_t before_size = 0, after_size = 0;
  unsigned char *before = sdpa_test_read_file(path, &before_size);

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_int_eq(log.warnings, 1);
  SDPA_TEST_EXPECT_WARNING(&log, 0, path, "newer sdpa-jit", "untouched",
                           "SDPA_JIT_CACHE");
  ck_assert_ptr_null(sdpa_runtime_cache_path(rt));
  /* K0 is in the file, but a newer layout is never read */
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_COMPILED);
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_MEMORY);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 1);

  unsigned char *after = sdpa_test_read_file(path, &after_size);
  ck_assert_uint_eq(after_size, before_size);
  ck_assert_int_eq(memcmp(before, after, before_size), 0);
  ck_assert_int_le(file_size(wal), 0);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt", NULL), 0);
  free(before);
  free(after);
  free(wal);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* A path under a regular file (no directory can be made there): memory
 * mode, one warning naming the directory, nothing created. */
START_TEST(path_under_regular_file) {
  char *dir = sdpa_test_tmpdir("underfile");
  char *file = sdpa_test_path(dir, "plain-file");
  sdpa_test_write_file(file, "x", 1);
  char *path = sdpa_test_path(file, "sdpa-jit/kernels.sqlite");
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_int_eq(log.warnings, 1);
  SDPA_TEST_EXPECT_WARNING(&log, 0, "cannot be created", file, "in memory",
                           "SDPA_JIT_CACHE");
  ck_assert_ptr_null(sdpa_runtime_cache_path(rt));
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_COMPILED);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 1);
  ck_assert_int_eq(file_size(file), 1);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "", NULL),
                   3); /* ., .., plain-file */
  free(file);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* Saves and restores an environment variable. */
typedef struct saved_env {
  const char *name;
  char *value; /* NULL: was unset */
} saved_env;

static saved_env env_save(const char *name) {
  const char *value = getenv(name);
  saved_env s = {name, value ? strdup(value) : NULL};
  return s;
}

static void env_restore(saved_env *s) {
  if (s->value)
    setenv(s->name, s->value, 1);
  else
    unsetenv(s->name);
  free(s->value);
}

/* No $SDPA_JIT_CACHE, no $XDG_CACHE_HOME (or a relative one, which the
 * XDG rules ignore), no $HOME: the cache goes to
 * $TMPDIR/sdpa-jit-<uid>/kernels.sqlite, silently, and works. */
START_TEST(no_home_falls_back_to_temp) {
  char *dir = sdpa_test_tmpdir("nohome");
  saved_env saved[] = {env_save("SDPA_JIT_CACHE"), env_save("XDG_CACHE_HOME"),
                       env_save("HOME"), env_save("TMPDIR")};
  unsetenv("SDPA_JIT_CACHE");
  setenv("XDG_CACHE_HOME", "relative/cache", 1);
  unsetenv("HOME");
  setenv("TMPDIR", dir, 1);
  char *expected = NULL;
  ck_assert_int_gt(asprintf(&expected, "%s/sdpa-jit-%ld/kernels.sqlite", dir,
                            (long)getuid()),
                   0);

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(NULL, &log);
  for (size_t i = 0; i < sizeof saved / sizeof saved[0]; i++)
    env_restore(&saved[i]);
  ck_assert_msg(log.warnings == 0, "warned: %s", log.text[0]);
  ck_assert_ptr_nonnull(sdpa_runtime_cache_path(rt));
  ck_assert_str_eq(sdpa_runtime_cache_path(rt), expected);
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_COMPILED);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 0);
  sdpa_test_db_check_integrity(expected);
  ck_assert(has_row(expected, 0));
  free(expected);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* The readable columns are advisory: anyone can write any number into
 * them (the sqlite3 shell, a damaged or hostile shipped file). Rows that
 * claim INT64_MAX cubin bytes and hits, in the user's database and in a
 * shipped copy of it: byte totals are the blobs' real lengths, hits
 * saturate instead of wrapping (a wrapped sum is negative), and the size
 * cap counts real bytes, so the claims neither wrap it nor prune rows.
 * (fuzz_cache_open found the overflow.) */
START_TEST(hostile_column_values) {
  char *path = NULL;
  char *dir = golden_copy("columns", &path);
  sqlite3 *db = sdpa_test_db_open(path, SQLITE_OPEN_READWRITE);
  char *sql = sqlite3_mprintf("UPDATE kernels SET cubin_bytes = %lld, hits = "
                              "%lld WHERE key_hash IN (%Q, %Q)",
                              (long long)INT64_MAX, (long long)INT64_MAX,
                              golden.hash[0], golden.hash[1]);
  ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_changes(db), 2);
  sqlite3_free(sql);
  sqlite3_close(db);
  char *shipped = sdpa_test_path(dir, "shipped.sqlite");
  size_t size = 0;
  unsigned char *bytes = sdpa_test_read_file(path, &size);
  sdpa_test_write_file(shipped, bytes, size);
  free(bytes);

  const int64_t cap = 1 << 20;
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  const char *layers[] = {shipped};
  opts.cache_path = path;
  opts.readonly_cache_paths = layers;
  opts.readonly_cache_count = 1;
  opts.cache_max_bytes = cap;
  opts.arch = 90;
  opts.log = sdpa_test_log_warning;
  opts.log_user = &log;
  sdpa_runtime *rt = NULL;
  ck_assert_int_eq(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_SHIPPED);
  ck_assert_int_eq(compile_key(rt, 2, NULL), SDPA_SOURCE_SHIPPED);

  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_stats_get(rt, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stats.entries, 2 * GOLDEN_KEYS);
  ck_assert_int_eq(stats.readonly_entries, GOLDEN_KEYS);
  /* bytes are the blobs' real lengths, whatever the column claims; the
   * advisory hits saturate */
  ck_assert_msg(stats.cubin_bytes > 0 && stats.cubin_bytes < cap && stats.hits == INT64_MAX,
                "totals: cubin_bytes %lld, hits %lld", (long long)stats.cubin_bytes,
                (long long)stats.hits);
  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  ck_assert_int_eq(sdpa_cache_list(rt, &entries, &count), SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(count, 2 * GOLDEN_KEYS);
  for (size_t i = 0; i < count; i++)
    ck_assert_msg(entries[i].hits >= 0 && entries[i].cubin_bytes >= 0,
                  "entry %s: hits %lld, cubin_bytes %lld", entries[i].key_hash,
                  (long long)entries[i].hits,
                  (long long)entries[i].cubin_bytes);
  sdpa_cache_entries_free(entries, count);

  /* A new kernel is stored: the cap (1 MiB) counts real bytes, so the
   * rows that claim more than it are not pruned for their claim. */
  ck_assert_int_eq(compile_key(rt, 4, NULL), SDPA_SOURCE_COMPILED);
  sdpa_runtime_destroy(rt);
  ck_assert_msg(log.warnings == 0, "warned: %s", log.text[0]);
  ck_assert(has_row(path, 4) && has_row(path, 0) && has_row(path, 1));
  ck_assert_int_le(sdpa_test_db_int(path, "SELECT total(length(cubin)) FROM kernels"), cap);
  sdpa_test_db_check_integrity(path);
  free(shipped);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* ------------------------------------------------------- full disks */

/* What the child of writes_fail_with_efbig saw. */
typedef struct efbig_report {
  int failed_step;     /* 0: all steps ran; else the step that failed */
  char error[512];
  int source[6];
  int warnings_after[6];
  char warning[1024];
  int64_t limit, new_cubin_bytes;
} efbig_report;

/* In a child with RLIMIT_FSIZE = 40 KiB and SIGXFSZ ignored (so writes
 * past the limit fail with EFBIG, as on a full disk): stored rows are
 * served, two new keys compile though their rows cannot be written (one
 * warning for both), stored rows are still served after that, also to a
 * fresh runtime. */
static void efbig_child(const char *path, int report_fd) {
  efbig_report r;
  sdpa_test_log log;
  memset(&r, 0, sizeof r);
  sdpa_test_log_init(&log);
  r.limit = 40 * 1024;
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = {(rlim_t)r.limit, (rlim_t)r.limit};
  if (setrlimit(RLIMIT_FSIZE, &limit) != 0) {
    r.failed_step = 99;
    goto done;
  }
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.cache_path = path;
  opts.arch = 90;
  opts.log = sdpa_test_log_warning;
  opts.log_user = &log;
  sdpa_runtime *rt = NULL, *fresh = NULL;
  if (sdpa_runtime_create(&rt, &opts) != SDPA_STATUS_SUCCESS) {
    r.failed_step = 100;
    goto done;
  }
  /* K0 (stored), K4, K5 (new: stores fail), K1 (stored) */
  const int keys[] = {0, 4, 5, 1};
  for (int s = 0; s < 5; s++) {
    sdpa_runtime *use = rt;
    int k = s < 4 ? keys[s] : 2;
    if (s == 4) { /* a fresh runtime on the full disk */
      if (sdpa_runtime_create(&fresh, &opts) != SDPA_STATUS_SUCCESS) {
        r.failed_step = 101;
        goto done;
      }
      use = fresh;
    }
    sdpa_bwd_desc d = key_desc(k);
    sdpa_bwd_plan *plan = NULL;
    sdpa_source source = SDPA_SOURCE_NONE;
    if (sdpa_bwd_plan_create(&plan, use, &d) != SDPA_STATUS_SUCCESS ||
        sdpa_bwd_compile(plan, &source) != SDPA_STATUS_SUCCESS) {
      r.failed_step = s + 1;
      snprintf(r.error, sizeof r.error, "%s", sdpa_last_error());
      sdpa_bwd_plan_destroy(plan);
      goto done;
    }
    if (k == 4) r.new_cubin_bytes = (int64_t)plan->cubin_size;
    r.source[s] = (int)source;
    r.warnings_after[s] = log.warnings;
    sdpa_bwd_plan_destroy(plan);
  }
  sdpa_runtime_destroy(fresh);
  sdpa_runtime_destroy(rt);
  r.warnings_after[5] = log.warnings;
done:
  snprintf(r.warning, sizeof r.warning, "%s", log.text[0]);
  if (write(report_fd, &r, sizeof r) != (ssize_t)sizeof r) _exit(2);
  _exit(0);
}

START_TEST(writes_fail_with_efbig) {
  char *path = NULL;
  char *dir = golden_copy("efbig", &path);
  int pipe_fds[2];
  ck_assert_int_eq(pipe(pipe_fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(pipe_fds[0]);
    efbig_child(path, pipe_fds[1]);
  }
  close(pipe_fds[1]);
  efbig_report r;
  ck_assert_int_eq(read(pipe_fds[0], &r, sizeof r), (ssize_t)sizeof r);
  close(pipe_fds[0]);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  ck_assert_msg(r.failed_step == 0, "step %d failed: %s", r.failed_step,
                r.error);
  /* the scenario needs a row larger than the limit */
  ck_assert_int_gt(r.new_cubin_bytes, r.limit);
  ck_assert_int_eq(r.source[0], SDPA_SOURCE_DISK);     /* K0 stored      */
  ck_assert_int_eq(r.warnings_after[0], 0);
  ck_assert_int_eq(r.source[1], SDPA_SOURCE_COMPILED); /* K4: store fails */
  ck_assert_int_eq(r.warnings_after[1], 1);
  ck_assert_int_eq(r.source[2], SDPA_SOURCE_COMPILED); /* K5: no 2nd one  */
  ck_assert_int_eq(r.warnings_after[2], 1);
  ck_assert_int_eq(r.source[3], SDPA_SOURCE_DISK);     /* K1 still served */
  ck_assert_int_eq(r.source[4], SDPA_SOURCE_DISK);     /* K2, new runtime */
  ck_assert_int_eq(r.warnings_after[5], 1);
  ck_assert_msg(strstr(r.warning, "could not store") &&
                    strstr(r.warning, path) &&
                    strstr(r.warning, "free disk space") &&
                    strstr(r.warning, "SDPA_JIT_CACHE"),
                "warning: %s", r.warning);

  /* Afterwards the file is sound and holds exactly the earlier rows. */
  sdpa_test_db_check_integrity(path);
  ck_assert_int_eq(sdpa_test_db_int(path, "SELECT count(*) FROM kernels"), GOLDEN_KEYS);
  ck_assert(!has_row(path, 4) && !has_row(path, 5));
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  int64_t checked = -1, removed = -1;
  ck_assert_int_eq(sdpa_cache_verify(rt, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(checked, GOLDEN_KEYS);
  ck_assert_int_eq(removed, 0);
  ck_assert_int_eq(compile_key(rt, 3, NULL), SDPA_SOURCE_DISK);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 0);
  printf("damage: EFBIG at %lld bytes: 2 compiles kept in memory, 1 warning, "
         "stored rows served throughout\n",
         (long long)r.limit);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* A cap of about K4+K0+K1 bytes: compiling K4 (new) after touching K0 (the
 * oldest row) prunes the least recently used rows, K2 and K3, and keeps
 * the file itself under the cap. */
START_TEST(cache_max_bytes_prunes_least_recent) {
  char *path = NULL;
  char *dir = golden_copy("cap", &path);
  set_age(path, 0, 4000);
  set_age(path, 1, 1000);
  set_age(path, 2, 2000);
  set_age(path, 3, 3000);
  /* room for K4, K0 and K1 (with slack, should K4 compile a few bytes
   * differently), not for one more row */
  int64_t smallest = golden.size[2] < golden.size[3] ? golden.size[2]
                                                     : golden.size[3];
  int64_t cap = golden.size[4] + golden.size[0] + golden.size[1] + smallest / 2;

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_capped(path, &log, cap);
  ck_assert_int_eq(compile_key(rt, 0, NULL), SDPA_SOURCE_DISK); /* touch */
  ck_assert_int_eq(compile_key(rt, 4, NULL), SDPA_SOURCE_COMPILED);
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_stats_get(rt, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stats.entries, 3);
  ck_assert_int_le(stats.cubin_bytes, cap);
  sdpa_runtime_destroy(rt);
  ck_assert_msg(log.warnings == 0, "warned: %s", log.text[0]);

  ck_assert(has_row(path, 4));
  ck_assert(has_row(path, 0)); /* the oldest, but used just now */
  ck_assert(has_row(path, 1));
  ck_assert(!has_row(path, 2));
  ck_assert(!has_row(path, 3));
  sdpa_test_db_check_integrity(path);
  /* Freed pages went back to the file system (incremental vacuum): the
   * file holds the three cubins and a few pages of b-tree, nothing of the
   * two pruned rows (about 110 KB). */
  int64_t page = sdpa_test_db_int(path, "PRAGMA page_size");
  int64_t on_disk = file_size(path);
  int64_t kept = golden.size[4] + golden.size[0] + golden.size[1];
  ck_assert_msg(on_disk <= kept + 12 * page,
                "the file is %lld bytes for %lld bytes of cubins (cap %lld)",
                (long long)on_disk, (long long)kept, (long long)cap);
  printf("damage: cap %lld bytes: file %lld bytes after pruning to 3 rows\n",
         (long long)cap, (long long)on_disk);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* sdpa_cache_prune(max_bytes) keeps the rows used last: K2 and K3 are the
 * oldest rows in the file but this process just used them. */
START_TEST(prune_keeps_recently_used) {
  char *path = NULL;
  char *dir = golden_copy("prune", &path);
  set_age(path, 0, 1000);
  set_age(path, 1, 2000);
  set_age(path, 2, 3000);
  set_age(path, 3, 4000);
  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = runtime_on(path, &log);
  ck_assert_int_eq(compile_key(rt, 3, NULL), SDPA_SOURCE_DISK);
  ck_assert_int_eq(compile_key(rt, 2, NULL), SDPA_SOURCE_DISK);
  int64_t removed = -1;
  ck_assert_int_eq(sdpa_cache_prune(rt, golden.size[2] + golden.size[3], -1,
                                    &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 2);
  sdpa_cache_entry *entry = NULL;
  ck_assert_int_eq(sdpa_cache_get(rt, golden.hash[0], &entry),
                   SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(sdpa_cache_get(rt, golden.hash[1], &entry),
                   SDPA_STATUS_NOT_FOUND);
  ck_assert_int_eq(sdpa_cache_get(rt, golden.hash[3], &entry),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_ge(entry->hits, 1);
  sdpa_cache_entries_free(entry, 1);
  /* pruning again to the same size removes nothing */
  ck_assert_int_eq(sdpa_cache_prune(rt, golden.size[2] + golden.size[3], -1,
                                    &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 0);
  /* one byte less: one of the two goes (they tie on last use; the older
   * row by creation time) */
  ck_assert_int_eq(sdpa_cache_prune(rt, golden.size[2] + golden.size[3] - 1,
                                    -1, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 1);
  sdpa_runtime_destroy(rt);
  ck_assert_int_eq(log.warnings, 0);
  ck_assert(!has_row(path, 0) && !has_row(path, 1));
  ck_assert(has_row(path, 2) && !has_row(path, 3));
  sdpa_test_db_check_integrity(path);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

static Suite *damage_suite(void) {
  Suite *s = suite_create("damage");
  TCase *files = tcase_create("files");
  tcase_set_timeout(files, 600);
  tcase_add_test(files, flipped_cubin_byte);
  tcase_add_test(files, truncated_database);
  tcase_add_test(files, zero_length_file);
  tcase_add_test(files, random_bytes_file);
  tcase_add_test(files, directory_in_place_of_file);
  tcase_add_test(files, newer_user_version);
  tcase_add_test(files, path_under_regular_file);
  tcase_add_test(files, no_home_falls_back_to_temp);
  tcase_add_test(files, hostile_column_values);
  suite_add_tcase(s, files);

  TCase *disk = tcase_create("disk");
  tcase_set_timeout(disk, 600);
  tcase_add_test(disk, writes_fail_with_efbig);
  tcase_add_test(disk, cache_max_bytes_prunes_least_recent);
  tcase_add_test(disk, prune_keeps_recently_used);
  suite_add_tcase(s, disk);
  return s;
}

/* ------------------------------------------------------------ golden */

/* Compiles K0..K5 into golden_path in a child process (NVRTC stays out of
 * the test runner), notes their hashes and sizes, then removes K4 and K5
 * again and checkpoints. Returns 0 on success. */
static int build_golden(void) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    golden_info info;
    memset(&info, 0, sizeof info);
    sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
    sdpa_runtime *rt = NULL;
    opts.cache_path = golden_path;
    opts.arch = 90;
    if (sdpa_runtime_create(&rt, &opts) != SDPA_STATUS_SUCCESS) _exit(2);
    for (int k = 0; k < KEYS; k++) {
      sdpa_bwd_desc d = key_desc(k);
      sdpa_bwd_plan *plan = NULL;
      if (sdpa_bwd_plan_create(&plan, rt, &d) != SDPA_STATUS_SUCCESS ||
          sdpa_bwd_compile(plan, NULL) != SDPA_STATUS_SUCCESS) {
        fprintf(stderr, "golden K%d: %s\n", k, sdpa_last_error());
        _exit(3);
      }
      snprintf(info.hash[k], 33, "%s", sdpa_bwd_plan_key_hash(plan));
      info.size[k] = (int64_t)plan->cubin_size;
      sdpa_bwd_plan_destroy(plan);
    }
    sdpa_runtime_destroy(rt);
    sqlite3 *db = NULL;
    char *sql = sqlite3_mprintf("DELETE FROM kernels WHERE key_hash IN "
                                "(%Q, %Q); PRAGMA incremental_vacuum;",
                                info.hash[4], info.hash[5]);
    if (sqlite3_open(golden_path, &db) != SQLITE_OK ||
        sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
      _exit(4);
    sqlite3_free(sql);
    sqlite3_close(db);
    if (write(fds[1], &info, sizeof info) != (ssize_t)sizeof info) _exit(5);
    _exit(0);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], &golden, sizeof golden);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != (ssize_t)sizeof golden || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    return -1;
  char *wal = NULL;
  if (asprintf(&wal, "%s-wal", golden_path) < 0) return -1;
  struct stat st;
  int wal_left = stat(wal, &st) == 0 && st.st_size > 0;
  free(wal);
  return wal_left ? -1 : 0;
}

int main(void) {
  shared_dir = sdpa_test_tmpdir("damage");
  if (!shared_dir || asprintf(&golden_path, "%s/golden.sqlite", shared_dir) < 0) {
    fprintf(stderr, "cannot make a temporary directory\n");
    return 1;
  }
  if (build_golden() != 0) {
    fprintf(stderr, "could not build the golden cache (does compiling "
                    "work?)\n");
    sdpa_test_rmtree(shared_dir);
    return 1;
  }
  int rc = sdpa_test_run(damage_suite());
  sdpa_test_rmtree(shared_dir);
  free(golden_path);
  free(shared_dir);
  return rc;
}
