/*
 * test_cpu_compile.c — sdpa_bwd_compile without a GPU: NVRTC, the cache
 * layers, single flight, and the failure paths a user can hit.
 *
 * The runtime's arch option stands in for a device, so this is exactly the
 * preheating path of a build host. The grid tests compile the template
 * variants of the default preheat grid (dtype bf16/fp16 x head_dim 64/128
 * x mask none/causal_br x layout bshd even/uneven, each with the table's
 * and the small-grid tiles, and thd; the unmasked ones with the main
 * kernel writing dQ instead, so both writers compile) for sm_80 and sm_90 and
 * read each cubin's ELF symbol table for the three kernels, and ptxas's
 * report in the log for spills. They compile into a cache
 * directory shared by the whole run, so later tests find those rows there.
 *
 * NVRTC takes about a second per key on two cores: the grids run two
 * threads each, and each other test compiles at most a few keys.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "test_cache.h"
#include "test_db.h"
#include "cubin_elf.h"
#include "driver.h"
#include "instantiate.h"
#include "nvrtc.h"
#include "plan.h"
#include "sdpa_jit.h"

static char *shared_dir; /* made in main(), removed after the run */

/* A runtime on `path` (NULL: disk cache disabled) for `arch`, logging into
 * `counter` (may be NULL: stderr). */
static sdpa_runtime *open_runtime(const char *path, int arch,
                                  sdpa_test_log *counter) {
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.cache_path = path;
  opts.disable_disk_cache = path == NULL;
  opts.arch = arch;
  if (counter) {
    opts.log = sdpa_test_log_warning;
    opts.log_user = counter;
  }
  sdpa_runtime *rt = NULL;
  sdpa_status st = sdpa_runtime_create(&rt, &opts);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "runtime_create: %s",
                sdpa_last_error());
  return rt;
}

typedef struct variant {
  sdpa_dtype dtype;
  int head_dim;
  sdpa_mask mask;
  sdpa_layout layout;
  int even;  /* BSHD only */
  int small; /* BSHD only: the small-grid tiles (else the table's) */
} variant;

static sdpa_bwd_desc variant_desc(const variant *v, int arch) {
  sdpa_bwd_desc d;
  memset(&d, 0, sizeof d);
  d.version = SDPA_BWD_DESC_VERSION;
  d.dtype = v->dtype;
  d.layout = v->layout;
  d.batch = v->mask == SDPA_MASK_NONE ? 2 : 16;
  d.heads_q = 8;
  d.heads_kv = 2;
  /* 256 divides every tile; 200 leaves a partial tile */
  d.seqlen_q = v->layout == SDPA_LAYOUT_BSHD && !v->even ? 200 : 256;
  d.seqlen_kv = d.seqlen_q;
  d.head_dim = v->head_dim;
  d.mask = v->mask;
  d.arch = arch;
  return d;
}

/* The default preheat grid: 40 variants. */
static int grid(variant *out) {
  const sdpa_dtype dtypes[] = {SDPA_DTYPE_BF16, SDPA_DTYPE_FP16};
  const int dims[] = {64, 128};
  const sdpa_mask masks[] = {SDPA_MASK_NONE, SDPA_MASK_CAUSAL_BOTTOM_RIGHT};
  const variant layouts[] = {{0, 0, 0, SDPA_LAYOUT_BSHD, 1, 0},
                             {0, 0, 0, SDPA_LAYOUT_BSHD, 1, 1},
                             {0, 0, 0, SDPA_LAYOUT_BSHD, 0, 0},
                             {0, 0, 0, SDPA_LAYOUT_BSHD, 0, 1},
                             {0, 0, 0, SDPA_LAYOUT_THD, 0, 0}};
  int n = 0;
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++)
      for (int c = 0; c < 2; c++)
        for (int l = 0; l < 5; l++) {
          out[n] = layouts[l];
          out[n].dtype = dtypes[a];
          out[n].head_dim = dims[b];
          out[n].mask = masks[c];
          n++;
        }
  return n;
}

static sdpa_bwd_plan *make_plan_with(sdpa_runtime *rt, const sdpa_bwd_desc *d,
                                     const sdpa_bwd_plan_options *o) {
  sdpa_bwd_plan *plan = NULL;
  sdpa_status st = sdpa_bwd_plan_create_with(&plan, rt, d, o);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan_create: %s",
                sdpa_last_error());
  return plan;
}

static sdpa_bwd_plan *make_plan(sdpa_runtime *rt, const sdpa_bwd_desc *d) {
  return make_plan_with(rt, d, NULL);
}

/* One key of a grid compiled by a worker thread; checked afterwards on the
 * test's own thread (Check asserts belong there). */
typedef struct grid_job {
  sdpa_bwd_plan *plan;
  sdpa_status status;
  sdpa_source source;
  double ms;
  char error[2048];
} grid_job;

typedef struct grid_queue {
  pthread_mutex_t lock;
  grid_job *jobs;
  int count, next;
} grid_queue;

static void *grid_worker(void *arg) {
  grid_queue *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->lock);
    int i = q->next++;
    pthread_mutex_unlock(&q->lock);
    if (i >= q->count) return NULL;
    grid_job *job = &q->jobs[i];
    double start = sdpa_test_now_ms();
    job->status = sdpa_bwd_compile(job->plan, &job->source);
    job->ms = sdpa_test_now_ms() - start;
    if (job->status != SDPA_STATUS_SUCCESS)
      snprintf(job->error, sizeof job->error, "%s", sdpa_last_error());
  }
}

/* Checks ptxas's report for `function` in `log`: present, and no spills.
 * Appends what is wrong to `problems` (size bytes). */
static void check_no_spills(const char *log, const char *function,
                            const char *key, char *problems, size_t size) {
  char report[256];
  int spills = sdpa_ptxas_spills(log, function, report, sizeof report);
  size_t used = strlen(problems);
  if (spills < 0)
    snprintf(problems + used, size - used, "%s: no ptxas report for %s\n",
             key, function);
  else if (spills)
    snprintf(problems + used, size - used, "%s: %s spills: %s\n", key,
             function, report + strspn(report, "ptxas. "));
}

/* Compiles the whole grid for `arch` into the shared cache, two threads. */
static void compile_grid(int arch) {
  char *path = sdpa_test_path(shared_dir, "kernels.sqlite");
  sdpa_runtime *rt = open_runtime(path, arch, NULL);
  variant vs[40];
  int n = grid(vs);
  ck_assert_int_eq(n, 40);
  grid_job jobs[40];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < n; i++) {
    /* the variants' problems are small grids: the table's tiles need the
     * rule off; the unmasked ones have the main kernel write dQ, so that
     * both writers compile */
    sdpa_bwd_desc d = variant_desc(&vs[i], arch);
    sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
    o.family = SDPA_FAMILY_MMA; /* this grid's tiles; test_cpu_hopper compiles the other */
    o.small_grid = vs[i].small ? SDPA_SWITCH_ON : SDPA_SWITCH_OFF;
    o.dq_writer = vs[i].mask == SDPA_MASK_NONE ? SDPA_DQ_MAIN : SDPA_DQ_CONVERT;
    jobs[i].plan = make_plan_with(rt, &d, &o);
    ck_assert_int_eq(jobs[i].plan->fields.even,
                     vs[i].layout == SDPA_LAYOUT_BSHD && vs[i].even);
    ck_assert_int_eq(jobs[i].plan->fields.kv_tile, vs[i].small ? 64 : 128);
  }
  grid_queue q = {PTHREAD_MUTEX_INITIALIZER, jobs, n, 0};
  pthread_t threads[2];
  double start = sdpa_test_now_ms();
  for (int t = 0; t < 2; t++)
    ck_assert_int_eq(pthread_create(&threads[t], NULL, grid_worker, &q), 0);
  for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
  double total = sdpa_test_now_ms() - start;

  const char *kernels[] = {SDPA_KERNEL_PREPROCESS, SDPA_KERNEL_MAIN,
                           SDPA_KERNEL_CONVERT};
  double sum = 0;
  static char spills[16384];
  spills[0] = '\0';
  for (int i = 0; i < n; i++) {
    sdpa_bwd_plan *plan = jobs[i].plan;
    const char *key = sdpa_bwd_plan_key(plan);
    ck_assert_msg(jobs[i].status == SDPA_STATUS_SUCCESS, "%s: %s: %s\nlog:\n%s",
                  key, sdpa_status_name(jobs[i].status), jobs[i].error,
                  sdpa_bwd_plan_compile_log(plan));
    ck_assert_msg(jobs[i].source == SDPA_SOURCE_COMPILED,
                  "%s: source %d, expected a fresh compile", key,
                  (int)jobs[i].source);
    ck_assert_ptr_nonnull(plan->cubin);
    ck_assert_uint_gt(plan->cubin_size, 0);
    ck_assert_int_eq(sdpa_cubin_arch(plan->cubin, plan->cubin_size, NULL, 0), arch);
    for (int k = 0; k < 3; k++) {
      ck_assert_msg(sdpa_cubin_has_function(plan->cubin, plan->cubin_size,
                                            kernels[k]) == 1,
                    "%s: the cubin has no function %s", key, kernels[k]);
      check_no_spills(sdpa_bwd_plan_compile_log(plan), kernels[k], key,
                      spills, sizeof spills);
    }
    char line[400];
    if (sdpa_ptxas_any_spills(sdpa_bwd_plan_compile_log(plan), line, sizeof line)) {
      size_t used = strlen(spills);
      snprintf(spills + used, sizeof spills - used, "%s: %s\n", key, line);
    }
    ck_assert_msg(strstr(key, vs[i].mask == SDPA_MASK_NONE ? ";dq=main" : ";dq=convert"),
                  "%s: unexpected dQ writer", key);
    ck_assert_int_eq(sdpa_cubin_has_function(plan->cubin, plan->cubin_size,
                                             "no_such_kernel"), 0);
    /* no GPU here (or another arch): cached, not loaded */
    if (sdpa_driver_get(NULL) != SDPA_STATUS_SUCCESS)
      ck_assert_ptr_null(plan->module);
    printf("timing: cold compile %7.1f ms  %s\n", jobs[i].ms, key);
    sum += jobs[i].ms;
  }
  printf("timing: sm_%d grid: %d keys in %.1f s on 2 threads (%.0f ms per "
         "key)\n", arch, n, total / 1e3, sum / n);
  fflush(stdout);
  ck_assert_msg(spills[0] == '\0', "ptxas reports spills:\n%s", spills);

  /* every key is a row of the user's database */
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_stats_get(rt, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_ge(stats.entries, n);
  for (int i = 0; i < n; i++) {
    sdpa_cache_entry *entry = NULL;
    ck_assert_int_eq(sdpa_cache_get(rt, sdpa_bwd_plan_key_hash(jobs[i].plan),
                                    &entry), SDPA_STATUS_SUCCESS);
    ck_assert_str_eq(entry->key_text, sdpa_bwd_plan_key(jobs[i].plan));
    ck_assert_int_eq(entry->arch, arch);
    ck_assert_int_eq(entry->cubin_bytes, (int64_t)jobs[i].plan->cubin_size);
    sdpa_cache_entries_free(entry, 1);
    sdpa_bwd_plan_destroy(jobs[i].plan);
  }
  sdpa_runtime_destroy(rt);
  free(path);
}

START_TEST(grid_sm80) { compile_grid(80); }
END_TEST

START_TEST(grid_sm90) { compile_grid(90); }
END_TEST

/* bf16, head_dim 64, no mask, BSHD even: the key the other tests use. */
static sdpa_bwd_desc small_desc(int arch) {
  variant v = {SDPA_DTYPE_BF16, 64, SDPA_MASK_NONE, SDPA_LAYOUT_BSHD, 1, 1};
  return variant_desc(&v, arch);
}

static sdpa_source compile_once(sdpa_bwd_plan *plan) {
  sdpa_source source = SDPA_SOURCE_NONE;
  sdpa_status st = sdpa_bwd_compile(plan, &source);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "compile %s: %s: %s\n%s",
                sdpa_bwd_plan_key(plan), sdpa_status_name(st),
                sdpa_last_error(), sdpa_bwd_plan_compile_log(plan));
  return source;
}

/* Compiled in one runtime, found on disk by the next, in memory after. */
START_TEST(disk_then_memory) {
  char *path = sdpa_test_path(shared_dir, "kernels.sqlite");
  sdpa_bwd_desc d = small_desc(80);

  sdpa_runtime *a = open_runtime(path, 80, NULL);
  ck_assert_str_eq(sdpa_runtime_cache_path(a), path);
  sdpa_bwd_plan *pa = make_plan(a, &d);
  sdpa_source first = compile_once(pa);
  ck_assert(first == SDPA_SOURCE_COMPILED || first == SDPA_SOURCE_DISK);
  size_t size = pa->cubin_size;
  void *copy = malloc(size);
  memcpy(copy, pa->cubin, size);
  sdpa_bwd_plan_destroy(pa);
  sdpa_runtime_destroy(a);

  sdpa_runtime *b = open_runtime(path, 80, NULL);
  sdpa_bwd_plan *pb = make_plan(b, &d);
  ck_assert_int_eq(compile_once(pb), SDPA_SOURCE_DISK);
  ck_assert_uint_eq(pb->cubin_size, size);
  ck_assert_mem_eq(pb->cubin, copy, size);
  void *stored = NULL;
  size_t stored_size = 0;
  ck_assert_int_eq(sdpa_cache_get_cubin(b, sdpa_bwd_plan_key_hash(pb), &stored,
                                        &stored_size),
                   SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(stored_size, size);
  ck_assert_mem_eq(stored, copy, size);
  sdpa_free(stored);

  /* the same plan again, and a new plan of the same key */
  ck_assert_int_eq(compile_once(pb), SDPA_SOURCE_MEMORY);
  ck_assert_int_eq(compile_once(pb), SDPA_SOURCE_MEMORY);
  sdpa_bwd_desc other_shape = d; /* smaller: the same key */
  other_shape.batch = 1;
  other_shape.heads_q = 4;
  sdpa_bwd_plan *pc = make_plan(b, &other_shape);
  ck_assert_str_eq(sdpa_bwd_plan_key_hash(pc), sdpa_bwd_plan_key_hash(pb));
  ck_assert_int_eq(compile_once(pc), SDPA_SOURCE_MEMORY);
  ck_assert_ptr_eq(pc->cubin, pb->cubin);
  sdpa_bwd_plan_destroy(pc);
  sdpa_bwd_plan_destroy(pb);
  sdpa_runtime_destroy(b);
  free(copy);
  free(path);
}
END_TEST

/* Replaces the stored cubin of `hash` with itself with one byte flipped. */
static void flip_cubin_byte(const char *path, const char *hash) {
  ck_assert_int_gt(sdpa_test_db_flip_cubin(path, hash, 0x5a), 1000);
}

START_TEST(damaged_cubin_is_recompiled) {
  char *dir = sdpa_test_tmpdir("flip");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_bwd_desc d = small_desc(80);

  sdpa_runtime *rt = open_runtime(path, 80, NULL);
  sdpa_bwd_plan *plan = make_plan(rt, &d);
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_COMPILED);
  char hash[33];
  snprintf(hash, sizeof hash, "%s", sdpa_bwd_plan_key_hash(plan));
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);

  flip_cubin_byte(path, hash);

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  rt = open_runtime(path, 80, &log);
  plan = make_plan(rt, &d);
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_COMPILED);
  ck_assert_int_ge(log.warnings, 1); /* the checksum mismatch was reported */
  ck_assert_int_eq(sdpa_cubin_has_function(plan->cubin, plan->cubin_size,
                                           SDPA_KERNEL_MAIN), 1);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);

  /* the row was stored again, good */
  rt = open_runtime(path, 80, NULL);
  int64_t checked = 0, removed = -1;
  ck_assert_int_eq(sdpa_cache_verify(rt, &checked, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(checked, 1);
  ck_assert_int_eq(removed, 0);
  plan = make_plan(rt, &d);
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_DISK);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* A text file where the cache should be is not provably ours: it is left
 * as it is, and compiles work in memory. */
START_TEST(not_a_database_is_left_alone) {
  char *dir = sdpa_test_tmpdir("notdb");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 200; i++) fputs("this is not a database\n", f);
  fclose(f);
  size_t before_size = 0;
  unsigned char *before = sdpa_test_read_file(path, &before_size);

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = open_runtime(path, 80, &log);
  ck_assert_int_eq(log.warnings, 1);
  ck_assert_ptr_null(sdpa_runtime_cache_path(rt));
  ck_assert_int_eq(sdpa_test_count_prefixed(dir, "kernels.sqlite.", NULL), 0);
  sdpa_bwd_desc d = small_desc(80);
  sdpa_bwd_plan *plan = make_plan(rt, &d);
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_COMPILED);
  sdpa_bwd_plan_info info = SDPA_BWD_PLAN_INFO_INIT;
  ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(info.stored, 0); /* compiled, kept in memory */
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
  size_t after_size = 0;
  unsigned char *after = sdpa_test_read_file(path, &after_size);
  ck_assert(before_size == after_size && !memcmp(before, after, before_size));
  free(before);
  free(after);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

START_TEST(uncreatable_directory_works_in_memory) {
  char *dir = sdpa_test_tmpdir("nodir");
  char *file = sdpa_test_path(dir, "file");
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  char *path = sdpa_test_path(file, "sub/kernels.sqlite"); /* under a regular file */

  sdpa_test_log log;
  sdpa_test_log_init(&log);
  sdpa_runtime *rt = open_runtime(path, 80, &log);
  ck_assert_ptr_null(sdpa_runtime_cache_path(rt));
  sdpa_bwd_desc d = small_desc(80);
  sdpa_bwd_plan *plan = make_plan(rt, &d);
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_COMPILED);
  sdpa_bwd_plan *again = make_plan(rt, &d);
  ck_assert_int_eq(compile_once(again), SDPA_SOURCE_MEMORY);
  ck_assert_msg(log.warnings == 1, "%d warnings, expected one; last: %s",
                log.warnings, log.last);
  sdpa_bwd_plan_destroy(again);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
  sdpa_test_rmtree(dir);
  free(path);
  free(file);
  free(dir);
}
END_TEST

START_TEST(disabled_cache_works_in_memory) {
  sdpa_runtime *rt = open_runtime(NULL, 80, NULL);
  ck_assert_ptr_null(sdpa_runtime_cache_path(rt));
  sdpa_bwd_desc d = small_desc(80);
  sdpa_bwd_plan *plan = make_plan(rt, &d);
  ck_assert_str_eq(sdpa_bwd_plan_compile_log(plan), "");
  ck_assert_int_eq(plan->source, SDPA_SOURCE_NONE);
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_COMPILED);
  ck_assert_int_eq(plan->source, SDPA_SOURCE_COMPILED);
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_compile_log(plan),
                               "Function properties for " SDPA_KERNEL_MAIN));
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_MEMORY);
  /* the log stays readable after a memory hit */
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_compile_log(plan), "ptxas"));
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
}
END_TEST

START_TEST(compile_error_has_log) {
  const char *broken =
      "#include \"sdpa_params.h\"\n"
      "extern \"C\" __global__ void f(sdpa_kernel_params p) {\n"
      "  int x = ;\n"
      "}\n";
  void *cubin = (void *)broken;
  size_t size = 99;
  char *log = NULL;
  sdpa_status st = sdpa_nvrtc_compile(broken, "broken.cu", 80, &cubin, &size,
                                      &log);
  ck_assert_int_eq(st, SDPA_STATUS_COMPILE_FAILED);
  ck_assert_ptr_null(cubin);
  ck_assert_uint_eq(size, 0);
  ck_assert_ptr_nonnull(log);
  ck_assert_msg(strstr(log, "broken.cu(3)") && strstr(log, "error"),
                "log does not name the error line: %s", log);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "broken.cu(3)"));
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "sm_80"));
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "sdpa_bwd_plan_compile_log"));
  free(log);

  /* a header that is not embedded is named */
  st = sdpa_nvrtc_compile("#include \"missing_header.h\"\n", "missing.cu", 90,
                          &cubin, &size, &log);
  ck_assert_int_eq(st, SDPA_STATUS_COMPILE_FAILED);
  ck_assert_ptr_nonnull(strstr(log, "missing_header.h"));
  free(log);

  /* the embedded headers are there, and a good unit compiles and times */
  const char *good =
      "#include \"sdpa_params.h\"\n"
      "extern \"C\" __global__ void f(sdpa_kernel_params p) {\n"
      "  if (p.error_flag) *p.error_flag = SDPA_DEVICE_ERR_OFFSETS;\n"
      "}\n";
  double ms = -1;
  st = sdpa_nvrtc_compile_timed(good, "good.cu", 90, 0, &cubin, &size, &log, &ms);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "%s\n%s", sdpa_last_error(), log);
  ck_assert_int_eq(sdpa_cubin_has_function(cubin, size, "f"), 1);
  ck_assert_int_eq(sdpa_cubin_arch(cubin, size, NULL, 0), 90);
  ck_assert(ms > 0);
  free(cubin);
  free(log);
}
END_TEST

/* Threads of one process compiling one key: one NVRTC run. */
typedef struct flight_job {
  sdpa_bwd_plan *plan;
  sdpa_status status;
  sdpa_source source;
} flight_job;

static void *flight_worker(void *arg) {
  flight_job *job = arg;
  job->status = sdpa_bwd_compile(job->plan, &job->source);
  return NULL;
}

START_TEST(single_flight_in_process) {
  char *dir = sdpa_test_tmpdir("flight");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  sdpa_runtime *rt = open_runtime(path, 90, NULL);
  sdpa_bwd_desc d = small_desc(90);
  flight_job jobs[4];
  pthread_t threads[4];
  for (int i = 0; i < 4; i++) {
    d.batch = i + 1; /* different plans, one key */
    jobs[i].plan = make_plan(rt, &d);
  }
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(pthread_create(&threads[i], NULL, flight_worker, &jobs[i]), 0);
  int compiled = 0, memory = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(threads[i], NULL);
    ck_assert_int_eq(jobs[i].status, SDPA_STATUS_SUCCESS);
    compiled += jobs[i].source == SDPA_SOURCE_COMPILED;
    memory += jobs[i].source == SDPA_SOURCE_MEMORY;
  }
  ck_assert_int_eq(compiled, 1);
  ck_assert_int_eq(memory, 3);
  for (int i = 1; i < 4; i++) ck_assert_ptr_eq(jobs[i].plan->cubin, jobs[0].plan->cubin);
  sdpa_cache_stats stats;
  ck_assert_int_eq(sdpa_cache_stats_get(rt, &stats), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(stats.entries, 1);
  for (int i = 0; i < 4; i++) sdpa_bwd_plan_destroy(jobs[i].plan);
  sdpa_runtime_destroy(rt);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* Processes starting together on an empty cache: one compiles, the others
 * wait for its key lock and find the row. */
START_TEST(single_flight_across_processes) {
  char *dir = sdpa_test_tmpdir("ranks");
  char *path = sdpa_test_path(dir, "kernels.sqlite");
  enum { RANKS = 3 };
  pid_t pids[RANKS];
  for (int r = 0; r < RANKS; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
      opts.cache_path = path;
      opts.arch = 80;
      sdpa_runtime *rt = NULL;
      sdpa_bwd_plan *plan = NULL;
      sdpa_source source = SDPA_SOURCE_NONE;
      sdpa_bwd_desc d = small_desc(80);
      if (sdpa_runtime_create(&rt, &opts) != SDPA_STATUS_SUCCESS ||
          sdpa_bwd_plan_create(&plan, rt, &d) != SDPA_STATUS_SUCCESS ||
          sdpa_bwd_compile(plan, &source) != SDPA_STATUS_SUCCESS)
        _exit(100);
      sdpa_bwd_plan_destroy(plan);
      sdpa_runtime_destroy(rt);
      _exit((int)source);
    }
  }
  int compiled = 0, disk = 0;
  for (int r = 0; r < RANKS; r++) {
    int wstatus = 0;
    ck_assert_int_eq(waitpid(pids[r], &wstatus, 0), pids[r]);
    ck_assert(WIFEXITED(wstatus));
    int code = WEXITSTATUS(wstatus);
    ck_assert_msg(code != 100, "rank %d failed", r);
    compiled += code == SDPA_SOURCE_COMPILED;
    disk += code == SDPA_SOURCE_DISK;
  }
  ck_assert_int_eq(compiled, 1);
  ck_assert_int_eq(disk, RANKS - 1);
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
}
END_TEST

/* What a user pays after the first compile (printed, not asserted). */
START_TEST(timings) {
  char *path = sdpa_test_path(shared_dir, "kernels.sqlite");
  sdpa_bwd_desc d = small_desc(80);
  sdpa_runtime *warm = open_runtime(path, 80, NULL);
  sdpa_bwd_plan *plan = make_plan(warm, &d);
  compile_once(plan); /* make sure the row exists */
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(warm);

  double start = sdpa_test_now_ms();
  sdpa_runtime *rt = open_runtime(path, 80, NULL);
  double opened = sdpa_test_now_ms();
  plan = make_plan(rt, &d);
  double planned = sdpa_test_now_ms();
  ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_DISK);
  double compiled = sdpa_test_now_ms();
  printf("timing: fresh runtime on a warm cache: create %.0f us, plan %.0f us, "
         "compile (disk) %.0f us\n",
         (opened - start) * 1e3, (planned - opened) * 1e3,
         (compiled - planned) * 1e3);

  enum { REPEAT = 20000 };
  start = sdpa_test_now_ms();
  for (int i = 0; i < REPEAT; i++)
    ck_assert_int_eq(compile_once(plan), SDPA_SOURCE_MEMORY);
  double per = (sdpa_test_now_ms() - start) * 1e3 / REPEAT;
  printf("timing: repeated compile of one plan (memory%s): %.2f us\n",
         plan->module ? ", module loaded" : ", no GPU: table lookup", per);

  start = sdpa_test_now_ms();
  for (int i = 0; i < 2000; i++) {
    sdpa_bwd_plan *p = make_plan(rt, &d);
    ck_assert_int_eq(compile_once(p), SDPA_SOURCE_MEMORY);
    sdpa_bwd_plan_destroy(p);
  }
  per = (sdpa_test_now_ms() - start) * 1e3 / 2000;
  printf("timing: new plan + compile of a key in memory: %.2f us\n", per);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
  free(path);
}
END_TEST

static Suite *compile_suite(void) {
  Suite *s = suite_create("compile");
  TCase *grid_case = tcase_create("grid");
  tcase_set_timeout(grid_case, 600); /* NVRTC compiles 24 keys a grid */
  tcase_add_test(grid_case, grid_sm80);
  tcase_add_test(grid_case, grid_sm90);
  suite_add_tcase(s, grid_case);

  TCase *cache = tcase_create("cache");
  tcase_set_timeout(cache, 600); /* a few keys each */
  tcase_add_test(cache, disk_then_memory);
  tcase_add_test(cache, damaged_cubin_is_recompiled);
  tcase_add_test(cache, not_a_database_is_left_alone);
  tcase_add_test(cache, uncreatable_directory_works_in_memory);
  tcase_add_test(cache, disabled_cache_works_in_memory);
  tcase_add_test(cache, single_flight_in_process);
  tcase_add_test(cache, single_flight_across_processes);
  tcase_add_test(cache, timings);
  suite_add_tcase(s, cache);

  TCase *errors = tcase_create("errors");
  tcase_add_test(errors, compile_error_has_log);
  suite_add_tcase(s, errors);
  return s;
}

int main(void) {
  shared_dir = sdpa_test_tmpdir("compile");
  if (!shared_dir) {
    fprintf(stderr, "cannot make a temporary directory\n");
    return 1;
  }
  int rc = sdpa_test_run(compile_suite());
  sdpa_test_rmtree(shared_dir);
  free(shared_dir);
  return rc;
}
