/*
 * test_cache.h — what the cache-facing suites (cache, compile, concurrency,
 * damage, and the planning suites) share: a log callback that counts the
 * warnings a cache or a runtime logs and keeps their texts, a check of one
 * warning's text, a process that holds a key's lock until it is killed,
 * processes that start together on one signal,
 * and a runtime without a disk cache.
 *
 * The warnings are how the cache tells a user what went wrong with a file,
 * so these suites count them and read what they say. The callback is safe
 * to call from several threads and works in a forked child (no Check
 * assert in it); the lock holder stands in for another rank.
 */
#ifndef SDPA_TEST_CACHE_H
#define SDPA_TEST_CACHE_H

#include <pthread.h>
#include <sys/types.h>

#include "cache.h"
#include "sdpa_jit.h"

enum { SDPA_TEST_LOG_KEPT = 4 }; /* warning texts kept, from the first */

/* Warnings seen by a log callback (sdpa_test_log_warning). */
typedef struct sdpa_test_log {
  pthread_mutex_t lock;
  int warnings;                         /* how many were logged           */
  char text[SDPA_TEST_LOG_KEPT][1024];  /* the first ones, in order       */
  char last[2048];                      /* the most recent one            */
} sdpa_test_log;

/* Empties `log` and makes its mutex; call before handing it to a cache or
 * runtime (again to start counting afresh). */
void sdpa_test_log_init(sdpa_test_log *log);

/* A sdpa_log_fn; `user` is a sdpa_test_log. Counts SDPA_LOG_WARNING
 * messages and keeps their texts; other levels are not counted. With
 * $SDPA_TEST_VERBOSE set, prints every message to stderr. */
void sdpa_test_log_warning(sdpa_log_level level, const char *message,
                           void *user);

/* Asserts that warning `i` was logged and contains every string of the
 * NULL-terminated list `parts` (i < SDPA_TEST_LOG_KEPT). */
void sdpa_test_expect_warning(const sdpa_test_log *log, int i,
                              const char *const *parts);
#define SDPA_TEST_EXPECT_WARNING(log, i, ...)                                 \
  sdpa_test_expect_warning((log), (i), (const char *const[]){__VA_ARGS__, NULL})

/* Forks a process that opens the cache at `cache_path`, takes the lock of
 * `key_hash` and sleeps until it is killed; returns once it holds the lock
 * (the test fails when it could not take it). The caller kills and reaps
 * the process. */
pid_t sdpa_test_start_lock_holder(const char *cache_path, const char *key_hash);

/* A racer's body (sdpa_test_fork_racers): process `index` of the set,
 * the caller's `arg`. It ends its process with _exit (returning ends it
 * with status 0) and makes no Check assert. */
typedef void (*sdpa_test_racer)(int index, void *arg);

/* Forks `count` processes (pids into `pids`) that wait for one start
 * signal and then run body(index, arg): ranks that reach the cache at
 * once. Returns the signal's descriptor for sdpa_test_start_racers, so
 * that the caller may check what must hold before they run. */
int sdpa_test_fork_racers(pid_t *pids, int count, sdpa_test_racer body, void *arg);

/* Starts the `count` racers of sdpa_test_fork_racers together (and closes
 * `signal`). The caller reaps them. */
void sdpa_test_start_racers(int signal, int count);

/* The key fields the cache suites store their rows with: sm_90 mma.sync,
 * bf16, head dims 128/64, tiles 64 x 128 w8 s2, strided LSE, THD,
 * causal bottom-right, deterministic, dQ by the main kernel (fields whose
 * names are not the defaults, so a column that is not written shows). */
extern const sdpa_key_fields sdpa_test_key_fields;

/* A row's metadata with those fields, NVRTC "13.0", 1234.5 ms, a log. */
sdpa_cache_meta sdpa_test_meta(const char *hash, const char *text);

/* A runtime for `arch` with the disk cache disabled (plans, and compiles
 * kept in memory); fails the running test when it cannot be made. */
sdpa_runtime *sdpa_test_memory_runtime(int arch);

/* A bf16 BSHD descriptor: batch x seqlen (q and kv) x heads (q = kv) x
 * head_dim (head_dim_v the same), no mask, the other fields default. */
sdpa_bwd_desc sdpa_test_bshd_desc(int batch, int heads, int seqlen, int head_dim);

#endif
