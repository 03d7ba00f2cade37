/*
 * test_cache.c — the warning counter, the key-lock holder and the racing
 * processes of the cache-facing suites (see test_cache.h).
 */
#include "test_cache.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"

void sdpa_test_log_init(sdpa_test_log *log) {
  memset(log, 0, sizeof *log);
  pthread_mutex_init(&log->lock, NULL);
}

void sdpa_test_log_warning(sdpa_log_level level, const char *message,
                           void *user) {
  sdpa_test_log *log = user;
  if (getenv("SDPA_TEST_VERBOSE"))
    fprintf(stderr, "%s: %s\n", level == SDPA_LOG_WARNING ? "warning" : "info",
            message);
  if (level != SDPA_LOG_WARNING) return;
  pthread_mutex_lock(&log->lock);
  if (log->warnings < SDPA_TEST_LOG_KEPT)
    snprintf(log->text[log->warnings], sizeof log->text[0], "%s", message);
  snprintf(log->last, sizeof log->last, "%s", message);
  log->warnings++;
  pthread_mutex_unlock(&log->lock);
}

void sdpa_test_expect_warning(const sdpa_test_log *log, int i,
                              const char *const *parts) {
  ck_assert_int_lt(i, SDPA_TEST_LOG_KEPT);
  ck_assert_int_lt(i, log->warnings);
  for (int p = 0; parts[p]; p++)
    ck_assert_msg(strstr(log->text[i], parts[p]) != NULL,
                  "warning \"%s\" lacks \"%s\"", log->text[i], parts[p]);
}

pid_t sdpa_test_start_lock_holder(const char *cache_path, const char *key_hash) {
  int ready[2];
  ck_assert_int_eq(pipe(ready), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* the child: no Check asserts here, only the answer on the pipe */
    close(ready[0]);
    sdpa_cache_config cfg = {0};
    sdpa_cache *cache = NULL;
    sdpa_cache_lock *lock = NULL;
    char answer = 'n';
    cfg.path = cache_path;
    if (sdpa_cache_open(&cache, &cfg) == SDPA_STATUS_SUCCESS) {
      sdpa_cache_lock_key(cache, key_hash, &lock);
      if (lock) answer = 'L';
    }
    if (write(ready[1], &answer, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(ready[1]);
  char answer = 0;
  ck_assert_int_eq(read(ready[0], &answer, 1), 1);
  close(ready[0]);
  ck_assert_msg(answer == 'L', "the holder could not take the key lock");
  return pid;
}

int sdpa_test_fork_racers(pid_t *pids, int count, sdpa_test_racer body, void *arg) {
  int start[2];
  ck_assert_int_eq(pipe(start), 0);
  for (int i = 0; i < count; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      /* the child: no Check asserts here */
      char go = 0;
      close(start[1]);
      if (read(start[0], &go, 1) != 1) _exit(90);
      close(start[0]);
      body(i, arg);
      _exit(0);
    }
  }
  close(start[0]);
  return start[1];
}

void sdpa_test_start_racers(int signal, int count) {
  for (int i = 0; i < count; i++) ck_assert_int_eq(write(signal, "g", 1), 1);
  close(signal);
}

sdpa_runtime *sdpa_test_memory_runtime(int arch) {
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.disable_disk_cache = 1;
  opts.arch = arch;
  sdpa_runtime *runtime = NULL;
  ck_assert_msg(sdpa_runtime_create(&runtime, &opts) == SDPA_STATUS_SUCCESS,
                "runtime_create: %s", sdpa_last_error());
  return runtime;
}

sdpa_bwd_desc sdpa_test_bshd_desc(int batch, int heads, int seqlen, int head_dim) {
  sdpa_bwd_desc d = SDPA_BWD_DESC_INIT;
  d.dtype = SDPA_DTYPE_BF16;
  d.layout = SDPA_LAYOUT_BSHD;
  d.batch = batch;
  d.heads_q = d.heads_kv = heads;
  d.seqlen_q = d.seqlen_kv = seqlen;
  d.head_dim = head_dim;
  return d;
}

const sdpa_key_fields sdpa_test_key_fields = {
    .arch = 90,
    .family = SDPA_FAMILY_MMA,
    .dtype = SDPA_DTYPE_BF16,
    .head_dim = 128,
    .head_dim_v = 64,
    .q_tile = 64,
    .kv_tile = 128,
    .warps = 8,
    .stages = 2,
    .lse_packed = 0,
    .layout = SDPA_LAYOUT_THD,
    .mask = SDPA_MASK_CAUSAL_BOTTOM_RIGHT,
    .deterministic = 1,
    .even = 0,
    .fold_dq = 1,
};

sdpa_cache_meta sdpa_test_meta(const char *hash, const char *text) {
  sdpa_cache_meta meta = {0};
  meta.key_hash = hash;
  meta.key_text = text;
  meta.fields = &sdpa_test_key_fields;
  meta.nvrtc_version = "13.0";
  meta.compile_ms = 1234.5;
  meta.compile_log = "no warnings";
  return meta;
}
