/*
 * bench_jit.c — what just-in-time compilation costs a user.
 *
 * Rows:
 *   cold compile       sdpa_bwd_compile with an empty cache (NVRTC + store,
 *                      + module load when a GPU is present), one fresh
 *                      temporary cache per key; median over the grid
 *                      dtype {bf16, fp16} x head_dim {64, 128} x mask
 *                      {none, causal_br} x layout {bshd, thd}. Where a
 *                      driver is installed, NVRTC's code generation is
 *                      also served from the driver's compute cache
 *                      (~/.nv/ComputeCache): a key compiled before on the
 *                      machine comes back in ~35 ms. This program sets
 *                      CUDA_CACHE_DISABLE=1 (unless it is set) so that the
 *                      row measures a first compile.
 *   warm process       a fresh process (this program re-executed with
 *                      --child-warm) timing sdpa_runtime_create ->
 *                      sdpa_bwd_plan_create -> sdpa_bwd_compile from the
 *                      SQLite cache the cold row filled; its CUDA context
 *                      is created before the clock starts; also split into
 *                      runtime create (opening the database) and plan +
 *                      compile (the row read and the module load)
 *   plan create        sdpa_bwd_plan_create, in process (median of 1000)
 *   repeat compile     sdpa_bwd_compile of a compiled plan (median of 10000)
 *   execute (host)     host time of one sdpa_bwd_execute call on a small
 *                      problem (median of 2000; GPU only): the default
 *                      (three kernels, one graph launch), kernel by kernel
 *                      (SDPA_JIT_GRAPHS=0: three cuLaunchKernel), and two
 *                      kernels (SDPA_JIT_DQ_CONVERT=main) both ways; and
 *                      the plan's first two calls alone (the first goes
 *                      kernel by kernel, the second makes the graph)
 * Without a GPU everything but the last row runs, for --arch (default 90).
 * Options: --arch N, --quick (4 keys), --repeats N (warm processes per
 * key, default 3), --hd D[,D...] (the grid's head dims instead of 64 and
 * 128, at most 8; D or D/DV for a head_dim_v below it, e.g. 192/128),
 * --csv FILE.
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"
#include "reference.h"

typedef struct jit_key {
  sdpa_dtype dtype;
  int head_dim, head_dim_v;
  sdpa_mask mask;
  sdpa_layout layout;
} jit_key;

#define MAX_KEYS 64 /* 2 dtypes x 8 head dims x 2 masks x 2 layouts */

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + 1e-3 * (double)t.tv_nsec;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
  if (n <= 0) return 0;
  qsort(x, (size_t)n, sizeof *x, compare_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The grid's head dims (dims[i], head_dim_v in dims_v[i]): 64 and 128,
 * or --hd's list of D or D/DV (passed to the warm children in
 * HEAD_DIMS_ENV); returns how many (at most 8). */
#define HEAD_DIMS_ENV "SDPA_BENCH_JIT_HEAD_DIMS"
static int grid_head_dims(int *dims, int *dims_v) {
  const char *e = getenv(HEAD_DIMS_ENV);
  int n = 0;
  for (const char *c = e; c && *c && n < 8;) {
    char *end;
    const long d = strtol(c, &end, 10);
    if (end == c) break;
    const long dv = *end == '/' ? strtol(end + 1, &end, 10) : d;
    dims[n] = (int)d;
    dims_v[n++] = (int)dv;
    c = *end == ',' ? end + 1 : end;
  }
  if (n == 0) {
    dims[0] = dims_v[0] = 64;
    dims[1] = dims_v[1] = 128;
    n = 2;
  }
  return n;
}

static int grid(jit_key *keys, int quick) {
  int n = 0;
  const sdpa_dtype dtypes[] = {SDPA_DTYPE_BF16, SDPA_DTYPE_FP16};
  int dims[8], dims_v[8];
  const int dim_count = grid_head_dims(dims, dims_v);
  const sdpa_mask masks[] = {SDPA_MASK_NONE, SDPA_MASK_CAUSAL_BOTTOM_RIGHT};
  const sdpa_layout layouts[] = {SDPA_LAYOUT_BSHD, SDPA_LAYOUT_THD};
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < dim_count; b++)
      for (int c = 0; c < 2; c++)
        for (int d = 0; d < 2; d++) {
          if (quick && (a != 0 || d != 0)) continue;
          keys[n++] = (jit_key){dtypes[a], dims[b], dims_v[b], masks[c], layouts[d]};
        }
  return n;
}

static void key_name(const jit_key *k, char *text, size_t size) {
  char hd[24];
  if (k->head_dim_v != k->head_dim)
    snprintf(hd, sizeof hd, "hd%d/%d", k->head_dim, k->head_dim_v);
  else
    snprintf(hd, sizeof hd, "hd%d", k->head_dim);
  snprintf(text, size, "%s %s %s %s", sdpa_ref_dtype_name(k->dtype), hd,
           sdpa_ref_mask_name(k->mask), k->layout == SDPA_LAYOUT_THD ? "thd" : "bshd");
}

/* A representative descriptor of the key (the arch comes from the runtime). */
static void key_desc(const jit_key *k, sdpa_bwd_desc *d) {
  memset(d, 0, sizeof *d);
  d->version = SDPA_BWD_DESC_VERSION;
  d->dtype = k->dtype;
  d->layout = k->layout;
  d->batch = k->layout == SDPA_LAYOUT_THD ? 4 : 2;
  d->heads_q = d->heads_kv = 16;
  d->seqlen_q = d->seqlen_kv = 1024;
  d->head_dim = k->head_dim;
  d->head_dim_v = k->head_dim_v;
  d->mask = k->mask;
}

static sdpa_status make_runtime(const char *cache_path, int arch, sdpa_runtime **out) {
  sdpa_runtime_options opts;
  sdpa_runtime_options_init(&opts, SDPA_RUNTIME_OPTIONS_VERSION);
  opts.cache_path = cache_path;
  opts.arch = arch;
  return sdpa_runtime_create(out, &opts);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void remove_tree(const char *path) {
  if (path && *path) nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* --child-warm CACHE INDEX ARCH QUICK: time runtime + plan + compile from
 * the cache; prints "<microseconds> <source>". */
static int child_warm(char **argv) {
  const char *cache_path = argv[0];
  int index = atoi(argv[1]), arch = atoi(argv[2]), quick = atoi(argv[3]);
  jit_key keys[MAX_KEYS];
  int count = grid(keys, quick);
  if (index < 0 || index >= count) return 2;
  sdpa_gpu gpu;
  sdpa_gpu_open(&gpu); /* the CUDA context, before the clock (no GPU: fine) */
  sdpa_bwd_desc desc;
  key_desc(&keys[index], &desc);
  sdpa_runtime *runtime = NULL;
  sdpa_bwd_plan *plan = NULL;
  sdpa_source source = SDPA_SOURCE_NONE;
  double t0 = now_us();
  sdpa_status st = make_runtime(cache_path, arch, &runtime);
  double t_runtime = now_us();
  if (!st) st = sdpa_bwd_plan_create(&plan, runtime, &desc);
  if (!st) st = sdpa_bwd_compile(plan, &source);
  double t1 = now_us();
  if (st) {
    fprintf(stderr, "child: %s: %s\n", sdpa_status_name(st), sdpa_last_error());
    return 1;
  }
  printf("%.3f %d %.3f\n", t1 - t0, (int)source, t_runtime - t0);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(runtime);
  return 0;
}

/* Runs this program with --child-warm; returns its microseconds (runtime
 * create + plan + compile; *runtime_us: the first alone), < 0 on failure. */
static double spawn_warm(const char *cache_path, int index, int arch, int quick, int *source,
                         double *runtime_us) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    char index_text[16], arch_text[16], quick_text[16];
    snprintf(index_text, sizeof index_text, "%d", index);
    snprintf(arch_text, sizeof arch_text, "%d", arch);
    snprintf(quick_text, sizeof quick_text, "%d", quick);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    char *args[] = {"bench_jit", "--child-warm", (char *)cache_path, index_text, arch_text,
                    quick_text, NULL};
    execv("/proc/self/exe", args);
    _exit(127);
  }
  close(fds[1]);
  char text[128] = "";
  size_t used = 0;
  ssize_t got;
  while (used < sizeof text - 1 && (got = read(fds[0], text + used, sizeof text - 1 - used)) > 0)
    used += (size_t)got;
  text[used] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  double us = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || sscanf(text, "%lf %d %lf", &us, source, runtime_us) != 3)
    return -1;
  return us;
}

static const char *source_name(sdpa_source s) {
  switch (s) {
  case SDPA_SOURCE_MEMORY: return "memory";
  case SDPA_SOURCE_SHIPPED: return "shipped";
  case SDPA_SOURCE_DISK: return "disk";
  case SDPA_SOURCE_COMPILED: return "compiled";
  default: return "none";
  }
}

/* Host time of sdpa_bwd_execute on a small problem (GPU only), its plan
 * made with options.dq_writer `writer` ("convert": three kernels,
 * "main": two) and options.graphs `graphs` ("1": one graph launch a
 * call, "0": a cuLaunchKernel per kernel). */
static double execute_host_us(sdpa_gpu *gpu, sdpa_runtime *runtime, int iterations,
                              const char *writer, const char *graphs, double first_us[2]) {
  sdpa_ref_problem p = {0};
  p.dtype = SDPA_DTYPE_BF16;
  p.layout = SDPA_LAYOUT_BSHD;
  p.batch = 1;
  p.heads_q = p.heads_kv = 2;
  p.seqlen_q = p.seqlen_kv = 128;
  p.head_dim = p.head_dim_v = 64;
  double result = -1;
  sdpa_bwd_plan *plan = NULL;
  sdpa_gpu_problem d;
  int uploaded = 0;
  CUdeviceptr workspace = 0;
  double *samples = calloc((size_t)iterations, sizeof *samples);
  if (!samples || sdpa_ref_problem_alloc(&p, NULL, NULL) != 0) goto done;
  sdpa_ref_problem_fill(&p, 5, 1);
  sdpa_ref_layout l;
  sdpa_ref_layout_make(&l, &p, SDPA_REF_STYLE_PACKED, SDPA_REF_LSE_PACKED);
  sdpa_bwd_desc desc;
  sdpa_ref_desc(&p, &l, &desc);
  sdpa_bwd_plan_options options = SDPA_BWD_PLAN_OPTIONS_INIT;
  options.dq_writer = strcmp(writer, "main") == 0 ? SDPA_DQ_MAIN : SDPA_DQ_CONVERT;
  options.graphs = strcmp(graphs, "0") == 0 ? SDPA_SWITCH_OFF : SDPA_SWITCH_ON;
  sdpa_status planned = sdpa_bwd_plan_create_with(&plan, runtime, &desc, &options);
  if (planned || sdpa_bwd_compile(plan, NULL)) goto done;
  if (sdpa_gpu_problem_upload(gpu, &p, &l, &d)) goto done;
  uploaded = 1;
  size_t bytes = sdpa_bwd_workspace_size(plan);
  if (sdpa_gpu_alloc(gpu, bytes, &workspace)) goto done;
  void *ws = (void *)(uintptr_t)workspace;
  for (int i = 0; i < 2; i++) { /* the second call makes the stream's graph */
    double t_first = now_us();
    if (sdpa_bwd_execute(plan, &d.tensors, ws, bytes, gpu->stream)) goto done;
    first_us[i] = now_us() - t_first;
  }
  for (int i = 0; i < 50; i++)
    if (sdpa_bwd_execute(plan, &d.tensors, ws, bytes, gpu->stream)) goto done;
  if (sdpa_bwd_sync_check(plan, gpu->stream)) goto done;
  for (int i = 0; i < iterations; i++) {
    double t0 = now_us();
    sdpa_status st = sdpa_bwd_execute(plan, &d.tensors, ws, bytes, gpu->stream);
    samples[i] = now_us() - t0;
    if (st) goto done;
    if (i % 100 == 99 && sdpa_bwd_sync_check(plan, gpu->stream)) goto done;
  }
  if (sdpa_bwd_sync_check(plan, gpu->stream)) goto done;
  result = median(samples, iterations);
done:
  if (result < 0) fprintf(stderr, "execute timing: %s\n", sdpa_last_error());
  sdpa_gpu_free(gpu, workspace);
  if (uploaded) sdpa_gpu_problem_free(gpu, &d);
  sdpa_bwd_plan_destroy(plan);
  sdpa_ref_problem_free(&p);
  free(samples);
  return result;
}

int main(int argc, char **argv) {
  if (argc >= 6 && !strcmp(argv[1], "--child-warm")) return child_warm(argv + 2);
  setenv("CUDA_CACHE_DISABLE", "1", 0); /* before any CUDA call: see the cold row */
  int arch = 0, quick = 0, repeats = 3;
  const char *csv_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--arch") && i + 1 < argc) arch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
    else if (!strcmp(argv[i], "--hd") && i + 1 < argc) setenv(HEAD_DIMS_ENV, argv[++i], 1);
    else {
      printf("usage: bench_jit [--arch N] [--quick] [--repeats N] [--hd D[/DV][,...]] [--csv FILE]\n");
      return !strcmp(argv[i], "--help") ? 0 : 2;
    }
  }
  if (repeats < 1) repeats = 1;
  sdpa_gpu gpu;
  int has_gpu = sdpa_gpu_open(&gpu) == SDPA_STATUS_SUCCESS;
  if (arch == 0 && !has_gpu) arch = 90;
  if (has_gpu)
    printf("device: %s (sm_%d)%s\n", gpu.name, gpu.arch,
           arch && arch != gpu.arch ? "; compiling for another arch: no module loads" : "");
  else
    printf("no GPU: compiling for sm_%d without loading modules\n", arch);

  jit_key keys[MAX_KEYS];
  int count = grid(keys, quick);
  char dirs[MAX_KEYS][256];
  char paths[MAX_KEYS][300];
  double cold_ms[MAX_KEYS];
  int cold_count = 0, failures = 0;
  const char *tmp = getenv("TMPDIR");
  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv) fprintf(csv, "metric,key,value,unit\n");

  printf("\ncold compile (empty cache, one fresh cache per key)\n");
  for (int i = 0; i < count; i++) {
    char name[64];
    key_name(&keys[i], name, sizeof name);
    snprintf(dirs[i], sizeof dirs[i], "%.200s/sdpa-bench-jit-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    paths[i][0] = '\0';
    if (!mkdtemp(dirs[i])) {
      dirs[i][0] = '\0';
      printf("  %-30s cannot make a temporary directory\n", name);
      failures++;
      continue;
    }
    snprintf(paths[i], sizeof paths[i], "%.250s/kernels.sqlite", dirs[i]);
    sdpa_runtime *runtime = NULL;
    sdpa_bwd_plan *plan = NULL;
    sdpa_bwd_desc desc;
    sdpa_source source = SDPA_SOURCE_NONE;
    key_desc(&keys[i], &desc);
    sdpa_status st = make_runtime(paths[i], arch, &runtime);
    if (!st) st = sdpa_bwd_plan_create(&plan, runtime, &desc);
    double t0 = now_us();
    if (!st) st = sdpa_bwd_compile(plan, &source);
    double ms = (now_us() - t0) / 1e3;
    if (st) {
      printf("  %-30s FAILED: %s: %.300s\n", name, sdpa_status_name(st), sdpa_last_error());
      if (plan && st == SDPA_STATUS_COMPILE_FAILED)
        printf("  compile log:\n%.2000s\n", sdpa_bwd_plan_compile_log(plan));
      failures++;
      paths[i][0] = '\0';
    } else {
      cold_ms[cold_count++] = ms;
      printf("  %-30s %9.1f ms  (%s)  %s\n", name, ms, source_name(source), sdpa_bwd_plan_key(plan));
      if (csv) fprintf(csv, "cold_compile,%s,%.3f,ms\n", name, ms);
    }
    fflush(stdout);
    sdpa_bwd_plan_destroy(plan);
    sdpa_runtime_destroy(runtime);
  }

  double warm[MAX_KEYS * 16], warm_by_layout[2][MAX_KEYS * 16];
  double warm_runtime[MAX_KEYS * 16], warm_plan_compile[MAX_KEYS * 16];
  int warm_count = 0, layout_count[2] = {0, 0};
  int warm_not_disk = 0;
  if (repeats > 16) repeats = 16;
  for (int i = 0; i < count; i++) {
    if (!paths[i][0]) continue;
    for (int r = 0; r < repeats; r++) {
      int source = 0;
      double runtime_us = 0;
      double us = spawn_warm(paths[i], i, arch, quick, &source, &runtime_us);
      if (us < 0) {
        printf("  warm child for key %d failed\n", i);
        failures++;
        continue;
      }
      if (source != SDPA_SOURCE_DISK) warm_not_disk++;
      warm_runtime[warm_count] = runtime_us;
      warm_plan_compile[warm_count] = us - runtime_us;
      warm[warm_count++] = us;
      const int thd = keys[i].layout == SDPA_LAYOUT_THD;
      warm_by_layout[thd][layout_count[thd]++] = us;
    }
  }

  /* In-process rows on the first key's cache. */
  double plan_us = -1, repeat_us = -1;
  /* execute's host time: [dQ by main][kernel by kernel] */
  double execute_us[2][2] = {{-1, -1}, {-1, -1}};
  double execute_first_us[2][2][2]; /* each plan's first and second call */
  int first = -1;
  for (int i = 0; i < count && first < 0; i++)
    if (paths[i][0]) first = i;
  if (first >= 0) {
    sdpa_runtime *runtime = NULL;
    sdpa_bwd_desc desc;
    key_desc(&keys[first], &desc);
    if (make_runtime(paths[first], arch, &runtime) == SDPA_STATUS_SUCCESS) {
      enum { PLANS = 1000, COMPILES = 10000 };
      double *samples = calloc(COMPILES, sizeof *samples);
      sdpa_bwd_plan *plan = NULL;
      int ok = samples != NULL;
      for (int i = 0; ok && i < PLANS; i++) {
        double t0 = now_us();
        ok = sdpa_bwd_plan_create(&plan, runtime, &desc) == SDPA_STATUS_SUCCESS;
        samples[i] = now_us() - t0;
        sdpa_bwd_plan_destroy(plan);
        plan = NULL;
      }
      if (ok) plan_us = median(samples, PLANS);
      ok = ok && sdpa_bwd_plan_create(&plan, runtime, &desc) == SDPA_STATUS_SUCCESS &&
           sdpa_bwd_compile(plan, NULL) == SDPA_STATUS_SUCCESS;
      for (int i = 0; ok && i < COMPILES; i++) {
        sdpa_source source;
        double t0 = now_us();
        ok = sdpa_bwd_compile(plan, &source) == SDPA_STATUS_SUCCESS;
        samples[i] = now_us() - t0;
        ok = ok && source == SDPA_SOURCE_MEMORY;
      }
      if (ok) repeat_us = median(samples, COMPILES);
      else printf("  in-process rows failed: %s\n", sdpa_last_error());
      sdpa_bwd_plan_destroy(plan);
      free(samples);
      if (has_gpu && (arch == 0 || arch == gpu.arch)) {
        /* Kernel by kernel first: its first call also loads the
         * module's kernels on the device, so the graph plan's second
         * call shows what making the graph costs. */
        for (int main_dq = 0; main_dq < 2; main_dq++)
          for (int direct = 1; direct >= 0; direct--)
            execute_us[main_dq][direct] = execute_host_us(
                &gpu, runtime, 2000, main_dq ? "main" : "convert", direct ? "0" : "1",
                execute_first_us[main_dq][direct]);
      }
      sdpa_runtime_destroy(runtime);
    }
  }

  /* Medians once (median sorts its array), for the table and the CSV. */
  const double cold_median = cold_count ? median(cold_ms, cold_count) : 0;
  const double warm_ms = warm_count ? median(warm, warm_count) / 1e3 : 0;
  const double runtime_ms = warm_count ? median(warm_runtime, warm_count) / 1e3 : 0;
  const double plan_compile_ms = warm_count ? median(warm_plan_compile, warm_count) / 1e3 : 0;
  /* execute's rows: [dQ by main][kernel by kernel] */
  static const struct {
    const char *row, *over, *csv;
  } execute_names[2][2] = {
      {{"execute, host time", "one graph launch: 3 kernels", "execute_host_median"},
       {"  kernel by kernel (GRAPHS=0)", "3 cuLaunchKernel", "execute_host_median_direct"}},
      {{"  dQ by main (DQ_CONVERT=main)", "one graph launch: 2 kernels",
        "execute_host_median_dq_main"},
       {"  dQ by main, kernel by kernel", "2 cuLaunchKernel",
        "execute_host_median_dq_main_direct"}}};

  printf("\n%-34s %14s  %s\n", "what", "median", "over");
  if (cold_count)
    printf("%-34s %11.1f ms  %d keys\n", "cold compile (NVRTC + store)", cold_median, cold_count);
  if (warm_count)
    printf("%-34s %11.2f ms  %d processes%s\n", "warm process: runtime+plan+compile", warm_ms,
           warm_count, warm_not_disk ? " (some not served from disk!)" : "");
  for (int thd = 0; thd < 2; thd++)
    if (layout_count[thd])
      printf("  %-32s %11.2f ms  %d processes\n", thd ? "THD keys" : "BSHD keys",
             median(warm_by_layout[thd], layout_count[thd]) / 1e3, layout_count[thd]);
  if (warm_count) {
    printf("  %-32s %11.2f ms  %d processes\n", "of which runtime create", runtime_ms,
           warm_count);
    printf("  %-32s %11.2f ms  %d processes\n", "of which plan + compile", plan_compile_ms,
           warm_count);
  }
  if (plan_us >= 0) printf("%-34s %11.2f us  1000 calls\n", "plan create", plan_us);
  if (repeat_us >= 0) printf("%-34s %11.3f us  10000 calls\n", "repeat compile (in memory)", repeat_us);
  for (int main_dq = 0; main_dq < 2; main_dq++)
    for (int direct = 0; direct < 2; direct++) {
      const double us = execute_us[main_dq][direct];
      if (us >= 0)
        printf("%-34s %11.2f us  2000 calls (%s; the plan's first calls %.0f, %.0f us)\n",
               execute_names[main_dq][direct].row, us, execute_names[main_dq][direct].over,
               execute_first_us[main_dq][direct][0], execute_first_us[main_dq][direct][1]);
      else
        printf("%-34s %14s  %s\n", execute_names[main_dq][direct].row, "-",
               has_gpu ? "failed" : "skipped: no GPU");
    }
  if (csv) {
    if (cold_count) fprintf(csv, "cold_compile_median,,%.3f,ms\n", cold_median);
    if (warm_count) {
      fprintf(csv, "warm_process_median,,%.3f,ms\n", warm_ms);
      fprintf(csv, "warm_runtime_create_median,,%.3f,ms\n", runtime_ms);
      fprintf(csv, "warm_plan_compile_median,,%.3f,ms\n", plan_compile_ms);
    }
    if (plan_us >= 0) fprintf(csv, "plan_create_median,,%.3f,us\n", plan_us);
    if (repeat_us >= 0) fprintf(csv, "repeat_compile_median,,%.4f,us\n", repeat_us);
    for (int main_dq = 0; main_dq < 2; main_dq++)
      for (int direct = 0; direct < 2; direct++)
        if (execute_us[main_dq][direct] >= 0)
          fprintf(csv, "%s,,%.3f,us\n", execute_names[main_dq][direct].csv,
                  execute_us[main_dq][direct]);
    fclose(csv);
  }
  for (int i = 0; i < count; i++) remove_tree(dirs[i]);
  if (has_gpu) sdpa_gpu_close(&gpu);
  return failures || warm_not_disk ? 1 : 0;
}
