/*
 * test_cpu_crash.c — SIGKILL in the middle of cache writes.
 *
 * A training fleet kills ranks at any moment (preemption, OOM killer, a
 * scheduler's SIGKILL), also while one is writing the kernel cache. The
 * cache must come back exactly as the last committed transaction left it:
 * a file SQLite calls sound, every row passing its checksum, every
 * committed row still there, and no row that was never committed.
 *
 * The test loops (CRASH_ITERATIONS times, all on one database): a child
 * process opens the cache and stores rows as fast as it can through
 * sdpa_cache_store (fake cubins, 256 B to 24 KB, each carrying its key
 * and a version number, so the bytes are known); it records in shared
 * memory, per key, the version it is about to store and the version whose
 * store returned. The parent SIGKILLs it after a random 0-50 ms (so kills
 * land in open, schema creation, BEGIN, the INSERT, COMMIT, WAL writes and
 * checkpoints alike), then opens the cache the way a restarted rank would
 * and checks: no warning on open (a killed writer must not make the file
 * look damaged), PRAGMA integrity_check "ok", sdpa_cache_verify_all
 * removes nothing, every row's lookup returns its exact bytes, every key's
 * row holds the version last committed or the one in flight at the kill,
 * and (outside pruning rounds) no committed row is missing. Every fourth
 * round the child runs under a small size cap, so kills also land in the
 * prune transaction (DELETE + incremental_vacuum).
 *
 * Set SDPA_TEST_CRASH_SEED to replay a run; the seed is printed.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cache.h"
#include "check_main.h"
#include "test_cache.h"
#include "test_db.h"

enum {
  CRASH_ITERATIONS = 200,
  KEYS = 256,           /* distinct keys; rows are replaced often       */
  MAX_KILL_US = 50000,  /* kill after 0..50 ms                          */
  PRUNE_EVERY = 4,      /* every 4th round stores under a small cap     */
  PRUNE_CAP = 256 * 1024
};

/* Shared between the parent and the writing child (MAP_SHARED). */
typedef struct shared_state {
  int64_t next_version;      /* versions handed out, across rounds      */
  int64_t committed[KEYS];   /* version whose store returned (0: none)  */
  int64_t in_flight[KEYS];   /* version being stored when killed        */
  int64_t stores;            /* stores that returned, this round        */
  int warnings;              /* warnings the child's cache logged       */
  char first_warning[512];
} shared_state;

static shared_state *shared;

/* ------------------------------------------------------------- helpers */

static void make_hash(char out[33], int key) { snprintf(out, 33, "%032x", key + 1); }

static void make_text(char *out, size_t size, int key) {
  snprintf(out, size, "sdpa_bwd;crash-test;key=%d", key);
}

/* Size and bytes of version `version` of `key`: 16 header bytes (key,
 * version) and then a pseudo-random body. */
static size_t cubin_size(int key, int64_t version) {
  return 256 + (size_t)(((uint64_t)key * 7919u + (uint64_t)version * 131u) %
                        24000u);
}

static unsigned char *make_cubin(int key, int64_t version, size_t *size) {
  *size = cubin_size(key, version);
  unsigned char *bytes = malloc(*size);
  if (!bytes) return NULL;
  int64_t k = key;
  memcpy(bytes, &k, 8);
  memcpy(bytes + 8, &version, 8);
  uint64_t state = (uint64_t)version * 0x9E3779B97F4A7C15ull + (uint64_t)key;
  for (size_t i = 16; i < *size; i++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    bytes[i] = (unsigned char)(state >> 56);
  }
  return bytes;
}

static void child_log(sdpa_log_level level, const char *message, void *user) {
  (void)user;
  if (level != SDPA_LOG_WARNING) return;
  if (shared->warnings++ == 0)
    snprintf(shared->first_warning, sizeof shared->first_warning, "%s",
             message);
}

/* The writing child: stores random keys until it is killed. */
static void writer(const char *path, unsigned seed, int64_t cap) {
  sdpa_cache_config cfg = {0};
  sdpa_cache *cache = NULL;
  cfg.path = path;
  cfg.max_bytes = cap;
  cfg.log = child_log;
  if (sdpa_cache_open(&cache, &cfg) != SDPA_STATUS_SUCCESS) _exit(3);
  for (;;) {
    int key = (int)(rand_r(&seed) % KEYS);
    int64_t version = __atomic_add_fetch(&shared->next_version, 1,
                                         __ATOMIC_SEQ_CST);
    char hash[33], text[64];
    size_t size = 0;
    make_hash(hash, key);
    make_text(text, sizeof text, key);
    unsigned char *cubin = make_cubin(key, version, &size);
    if (!cubin) _exit(4);
    sdpa_cache_meta meta = sdpa_test_meta(hash, text);
    __atomic_store_n(&shared->in_flight[key], version, __ATOMIC_SEQ_CST);
    if (sdpa_cache_store(cache, &meta, cubin, size, NULL) != SDPA_STATUS_SUCCESS)
      _exit(5);
    __atomic_store_n(&shared->committed[key], version, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&shared->stores, 1, __ATOMIC_SEQ_CST);
    free(cubin);
  }
}

static void parent_log(sdpa_log_level level, const char *message, void *user) {
  int *warnings = user;
  if (level == SDPA_LOG_WARNING) {
    (*warnings)++;
    fprintf(stderr, "after the kill: warning: %s\n", message);
  }
}

/* What one check after a kill found. */
typedef struct round_result {
  int64_t rows;
} round_result;

/* Opens the cache as a restarted rank would and checks it (see the file
 * comment). `pruning`: rows may have been removed by the cap. Resets the
 * shared expectations to what the file holds. */
static round_result check_after_kill(const char *dir, const char *path,
                                     int round, int pruning) {
  round_result result = {0};
  int warnings = 0;
  sdpa_cache_config cfg = {0};
  sdpa_cache *cache = NULL;
  cfg.path = path;
  cfg.log = parent_log;
  cfg.log_user = &warnings;
  ck_assert_int_eq(sdpa_cache_open(&cache, &cfg), SDPA_STATUS_SUCCESS);
  ck_assert_msg(warnings == 0, "round %d: opening after the kill warned",
                round);
  ck_assert_ptr_nonnull(sdpa_cache_path(cache)); /* not memory-only */

  /* The file as a whole, through a connection of its own. */
  sqlite3 *db = sdpa_test_db_open(path, SQLITE_OPEN_READWRITE);
  sqlite3_stmt *stmt = NULL;
  ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &stmt,
                                      NULL),
                   SQLITE_OK);
  ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
  ck_assert_msg(strcmp((const char *)sqlite3_column_text(stmt, 0), "ok") == 0,
                "round %d: integrity_check: %s", round,
                sqlite3_column_text(stmt, 0));
  sqlite3_finalize(stmt);

  /* Every row passes its checksum: verify removes nothing. */
  int64_t checked = -1, removed = -1;
  ck_assert_int_eq(sdpa_cache_verify_all(cache, NULL, NULL, NULL, NULL, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_msg(removed == 0, "round %d: verify removed %lld rows", round,
                (long long)removed);

  /* Every row is found by its lookup, with exactly its bytes. */
  int64_t present[KEYS] = {0};
  ck_assert_int_eq(sqlite3_prepare_v2(db,
                                      "SELECT key_hash, key_text FROM kernels",
                                      -1, &stmt, NULL),
                   SQLITE_OK);
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    const char *hash = (const char *)sqlite3_column_text(stmt, 0);
    const char *text = (const char *)sqlite3_column_text(stmt, 1);
    int key = -1;
    ck_assert_int_eq(sscanf(text, "sdpa_bwd;crash-test;key=%d", &key), 1);
    ck_assert(key >= 0 && key < KEYS);
    void *data = NULL;
    size_t size = 0;
    sdpa_source source = SDPA_SOURCE_NONE;
    ck_assert_msg(sdpa_cache_lookup(cache, hash, text, NULL, NULL, &data, &size,
                                    &source) == SDPA_STATUS_SUCCESS,
                  "round %d: lookup of key %d: %s", round, key,
                  sdpa_last_error());
    ck_assert_int_eq(source, SDPA_SOURCE_DISK);
    ck_assert_uint_ge(size, 16);
    int64_t stored_key = 0, version = 0;
    memcpy(&stored_key, data, 8);
    memcpy(&version, (unsigned char *)data + 8, 8);
    ck_assert_int_eq(stored_key, key);
    size_t want_size = 0;
    unsigned char *want = make_cubin(key, version, &want_size);
    ck_assert_uint_eq(size, want_size);
    ck_assert_int_eq(memcmp(data, want, size), 0);
    free(want);
    free(data);
    /* Only the last committed version, or the one in flight. */
    ck_assert_msg(version == shared->committed[key] ||
                      version == shared->in_flight[key],
                  "round %d: key %d holds version %lld; committed %lld, in "
                  "flight %lld",
                  round, key, (long long)version,
                  (long long)shared->committed[key],
                  (long long)shared->in_flight[key]);
    present[key] = version;
    result.rows++;
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  ck_assert_int_eq(result.rows, checked);

  /* A store that returned is durable (unless the cap pruned it). */
  for (int key = 0; key < KEYS; key++) {
    if (!pruning && shared->committed[key] != 0)
      ck_assert_msg(present[key] != 0,
                    "round %d: committed version %lld of key %d is missing",
                    round, (long long)shared->committed[key], key);
    shared->committed[key] = present[key];
    shared->in_flight[key] = present[key];
  }
  sdpa_cache_close(cache);
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.corrupt", NULL),
                   0);
  return result;
}

/* ---------------------------------------------------------------- test */

START_TEST(sigkill_during_stores) {
  char *dir = sdpa_test_tmpdir("crash");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(shared, MAP_FAILED);
  memset(shared, 0, sizeof *shared);

  unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  const char *fixed = getenv("SDPA_TEST_CRASH_SEED");
  if (fixed && *fixed) seed = (unsigned)strtoul(fixed, NULL, 10);
  printf("crash: seed %u (SDPA_TEST_CRASH_SEED replays it)\n", seed);

  int64_t rows_seen = 0, stores = 0, max_rows = 0;
  int killed_with_stores = 0, killed_before_store = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int round = 0; round < CRASH_ITERATIONS; round++) {
    int pruning = round % PRUNE_EVERY == PRUNE_EVERY - 1;
    unsigned child_seed = rand_r(&seed);
    useconds_t delay = (useconds_t)(rand_r(&seed) % (MAX_KILL_US + 1));
    shared->stores = 0;
    shared->warnings = 0;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) writer(path, child_seed, pruning ? PRUNE_CAP : 0);
    usleep(delay);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "round %d: the writer ended on its own (status 0x%x)",
                  round, status);
    ck_assert_msg(shared->warnings == 0, "round %d: the writer warned: %s",
                  round, shared->first_warning);
    stores += shared->stores;
    if (shared->stores > 0)
      killed_with_stores++;
    else
      killed_before_store++;
    round_result r = check_after_kill(dir, path, round, pruning);
    rows_seen += r.rows;
    if (r.rows > max_rows) max_rows = r.rows;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double seconds = (double)(t1.tv_sec - t0.tv_sec) +
                   (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  /* The kills must have landed in the middle of real work (most rounds
   * store something; a slow, loaded machine spends more of the 50 ms in
   * opening the cache). */
  ck_assert_int_gt(killed_with_stores, CRASH_ITERATIONS / 4);
  ck_assert_int_gt(max_rows, 0);
  printf("crash: %d SIGKILLs (%d after >= 1 store, %d before the first), "
         "%lld stores returned, %lld rows checked in all (max %lld at once), "
         "%.1f s\n",
         CRASH_ITERATIONS, killed_with_stores, killed_before_store,
         (long long)stores, (long long)rows_seen, (long long)max_rows,
         seconds);
  munmap(shared, sizeof *shared);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

static Suite *crash_suite(void) {
  Suite *s = suite_create("crash");
  TCase *tc = tcase_create("sigkill");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, sigkill_during_stores);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return sdpa_test_run(crash_suite()); }
