/*
 * fuzz_cache_open.c — libFuzzer target: a cache file of arbitrary bytes.
 *
 * Cache files travel: they are shipped with images, copied between
 * machines, left half-written by dead processes. Whatever bytes sit where
 * the cache should be, opening must succeed (a damaged file is moved aside,
 * an unusable one leaves the cache in memory) and every later call must
 * return a status, never crash or hang. Each run writes the input to the
 * user's cache path and, as a second layer, to a shipped (read-only,
 * immutable) database path, then opens the cache and drives every call a
 * runtime or the CLI makes: lookups of the keys the seed corpus holds,
 * list, get by hash / prefix / text, read a cubin, stats, verify, a store,
 * a prune, a key lock, close. Then the directory is emptied for the next
 * run. Files go to /dev/shm when it exists (no disk syncs), else $TMPDIR.
 *
 * Seeds: tests/fuzz/make_seeds.c writes valid caches (WAL and rollback
 * journal, 512-byte pages so they stay small), a newer layout, another
 * program's database and fragments of them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"

static char *work_dir;     /* private directory for this process */
static char *user_path;    /* <dir>/kernels.sqlite               */
static char *shipped_path; /* <dir>/shipped.sqlite               */

#define REQUIRE(cond)                                                         \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "fuzz_cache_open: %s:%d: %s failed (last error: %s)\n", \
              __FILE__, __LINE__, #cond, sdpa_last_error());                  \
      abort();                                                                \
    }                                                                         \
  } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void ignore_log(sdpa_log_level level, const char *message, void *user) {
  (void)level;
  (void)message;
  (void)user;
}

static void empty_directory(const char *dir, int depth);

/* At exit: the work directory goes (a crash leaves it for inspection). */
static void remove_work_dir(void) {
  empty_directory(work_dir, 0);
  rmdir(work_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  struct stat st;
  const char *base = getenv("TMPDIR");
  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) &&
      access("/dev/shm", W_OK) == 0)
    base = "/dev/shm";
  if (!base || !*base) base = "/tmp";
  if (asprintf(&work_dir, "%s/sdpa-fuzz-cache-XXXXXX", base) < 0 ||
      !mkdtemp(work_dir) ||
      asprintf(&user_path, "%s/kernels.sqlite", work_dir) < 0 ||
      asprintf(&shipped_path, "%s/shipped.sqlite", work_dir) < 0) {
    fprintf(stderr, "fuzz_cache_open: cannot make a work directory\n");
    abort();
  }
  atexit(remove_work_dir);
  return 0;
}

/* Removes every entry of `dir` (and of its locks/ subdirectory). */
static void empty_directory(const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char *path = NULL;
    if (asprintf(&path, "%s/%s", dir, e->d_name) < 0) continue;
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
      if (depth == 0) empty_directory(path, 1);
      rmdir(path);
    } else {
      unlink(path);
    }
    free(path);
  }
  closedir(d);
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n > 0);
    done += (size_t)n;
  }
  close(fd);
}

/* The keys make_seeds.c stores: hash "%032x" of 1..3, text
 * "sdpa_bwd;fuzz;key=N". */
static void seed_key(int n, char hash[33], char *text, size_t text_size) {
  snprintf(hash, 33, "%032x", n);
  snprintf(text, text_size, "sdpa_bwd;fuzz;key=%d", n);
}

static int inspect_status_ok(sdpa_status st) {
  return st == SDPA_STATUS_SUCCESS || st == SDPA_STATUS_NOT_FOUND ||
         st == SDPA_STATUS_CACHE_ERROR || st == SDPA_STATUS_INVALID_ARGUMENT ||
         st == SDPA_STATUS_OUT_OF_MEMORY;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  empty_directory(work_dir, 0);
  write_file(user_path, data, size);
  write_file(shipped_path, data, size);

  const char *shipped[] = {shipped_path};
  sdpa_cache_config cfg = {0};
  cfg.path = user_path;
  cfg.readonly_paths = shipped;
  cfg.readonly_count = 1;
  cfg.max_bytes = 4096;
  cfg.log = ignore_log;
  cfg.lock_timeout_ms = 50;
  sdpa_cache *cache = NULL;
  REQUIRE(sdpa_cache_open(&cache, &cfg) == SDPA_STATUS_SUCCESS);
  REQUIRE(cache != NULL);

  for (int n = 1; n <= 3; n++) {
    char hash[33], text[64];
    void *cubin = NULL;
    size_t cubin_size = 0;
    sdpa_source source = SDPA_SOURCE_NONE;
    seed_key(n, hash, text, sizeof text);
    sdpa_status st =
        sdpa_cache_lookup(cache, hash, text, NULL, NULL, &cubin, &cubin_size, &source);
    REQUIRE(st == SDPA_STATUS_SUCCESS || st == SDPA_STATUS_NOT_FOUND);
    if (st == SDPA_STATUS_SUCCESS) {
      REQUIRE(cubin != NULL && cubin_size > 0);
      REQUIRE(source == SDPA_SOURCE_SHIPPED || source == SDPA_SOURCE_DISK);
    } else {
      REQUIRE(cubin == NULL && cubin_size == 0);
    }
    free(cubin);
  }

  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  sdpa_status st = sdpa_cache_list_entries(cache, &entries, &count);
  REQUIRE(inspect_status_ok(st));
  if (st == SDPA_STATUS_SUCCESS) {
    for (size_t i = 0; i < count; i++) {
      /* strings are NULL or terminated (a hostile file may hold NULLs) */
      REQUIRE(!entries[i].key_text || strlen(entries[i].key_text) < (size_t)1 << 30);
      REQUIRE(!entries[i].dtype || strlen(entries[i].dtype) < (size_t)1 << 30);
      REQUIRE(strlen(entries[i].key_hash) <= 32);
    }
    /* each listed row can be looked up by its own hash */
    if (count > 0 && strlen(entries[0].key_hash) == 32) {
      sdpa_cache_entry *one = NULL;
      st = sdpa_cache_get_entry(cache, entries[0].key_hash, &one);
      REQUIRE(inspect_status_ok(st));
      sdpa_cache_free_entries(one, one ? 1 : 0);
    }
  }
  sdpa_cache_free_entries(entries, count);

  const char *keys[] = {"00000000000000000000000000000001", "000000",
                        "sdpa_bwd;fuzz;key=2", "abcdef", ""};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    sdpa_cache_entry *entry = NULL;
    st = sdpa_cache_get_entry(cache, keys[i], &entry);
    REQUIRE(inspect_status_ok(st));
    REQUIRE((st == SDPA_STATUS_SUCCESS) == (entry != NULL));
    sdpa_cache_free_entries(entry, entry ? 1 : 0);
    void *cubin = NULL;
    size_t cubin_size = 0;
    st = sdpa_cache_read_cubin(cache, keys[i], &cubin, &cubin_size);
    REQUIRE(inspect_status_ok(st));
    REQUIRE((st == SDPA_STATUS_SUCCESS) == (cubin != NULL));
    free(cubin);
  }

  sdpa_cache_stats stats;
  REQUIRE(inspect_status_ok(sdpa_cache_get_stats(cache, &stats)));
  int64_t checked = 0, removed = 0;
  REQUIRE(inspect_status_ok(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, &checked, &removed)));
  REQUIRE(removed >= 0 && removed <= checked);

  /* A store never fails because of the file; a stored row reads back
   * with its bytes unless the cache had to fall back to memory (or the
   * input itself holds a row of that key, which would then be found). */
  char hash[33], text[64];
  seed_key(7, hash, text, sizeof text);
  static const uint8_t cubin[300] = {1, 2, 3, 4, 5, 6, 7, 8};
  sdpa_cache_meta meta = {0};
  meta.key_hash = hash;
  meta.key_text = text;
  meta.nvrtc_version = "13.0"; /* key columns NULL: no fields given */
  REQUIRE(sdpa_cache_store(cache, &meta, cubin, sizeof cubin, NULL) ==
          SDPA_STATUS_SUCCESS);
  void *back = NULL;
  size_t back_size = 0;
  st = sdpa_cache_lookup(cache, hash, text, NULL, NULL, &back, &back_size, NULL);
  REQUIRE(st == SDPA_STATUS_SUCCESS || st == SDPA_STATUS_NOT_FOUND);
  if (st == SDPA_STATUS_SUCCESS && !memmem(data, size, text, strlen(text)))
    REQUIRE(back_size == sizeof cubin && memcmp(back, cubin, back_size) == 0);
  free(back);

  int64_t pruned = 0;
  REQUIRE(inspect_status_ok(sdpa_cache_prune_rows(cache, 1000, 3600, &pruned)));
  sdpa_cache_lock *lock = NULL;
  sdpa_cache_lock_key(cache, hash, &lock);
  sdpa_cache_unlock_key(lock);
  sdpa_cache_remove(cache, hash);
  sdpa_cache_close(cache);
  return 0;
}
