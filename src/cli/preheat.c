/*
 * preheat.c — `sdpa-jit preheat`: compile a grid of keys into the cache.
 *
 * An operator runs this on a build host (no GPU needed: every plan names
 * its arch) and ships the database. The command multiplies the option
 * lists into grid points, creates one plan per point, keeps one plan per
 * distinct key hash (different points can share a key), compiles the
 * distinct keys on -j threads (workers.c) and ends with one summary line
 * on stdout: "compiled N, cached M, failed F" (", not stored T" when a
 * compiled kernel could not be written to the cache, ", skipped S" when a
 * point is NOT_SUPPORTED on its arch). Its exit status is the truth: 0
 * only when every key is in the cache afterwards and at least one was
 * planned; values the library rejects (a head dim it has no kernel for)
 * are usage errors found before any compile.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "grid.h"
#include "json.h"
#include "preheat.h"

/* Grids larger than this are almost surely a typo. */
enum { GRID_POINTS_MAX = 1 << 16 };
/* Arch used when neither --arch nor a device says. */
enum { FALLBACK_ARCH = 90 };

enum {
  OPT_ARCH = 1,
  OPT_DTYPE,
  OPT_HEAD_DIM,
  OPT_HEAD_DIM_V,
  OPT_MASK,
  OPT_LAYOUT,
  OPT_LSE,
  OPT_DETERMINISTIC,
  OPT_EVEN,
  OPT_DQ,
  OPT_TILES,
  OPT_JOBS,
  OPT_JSON,
  OPT_ANY_HEAD_DIM
};

static const cli_option options[] = {
    {"--arch", NULL, 1, OPT_ARCH},
    {"--dtype", NULL, 1, OPT_DTYPE},
    {"--head-dim", NULL, 1, OPT_HEAD_DIM},
    {"--head-dim-v", NULL, 1, OPT_HEAD_DIM_V},
    {"--mask", NULL, 1, OPT_MASK},
    {"--layout", NULL, 1, OPT_LAYOUT},
    {"--lse", NULL, 1, OPT_LSE},
    {"--deterministic", NULL, 1, OPT_DETERMINISTIC},
    {"--even", NULL, 1, OPT_EVEN},
    {"--dq", NULL, 1, OPT_DQ},
    {"--tiles", NULL, 1, OPT_TILES},
    {"--jobs", "-j", 1, OPT_JOBS},
    {"--json", NULL, 0, OPT_JSON},
    {"--any-head-dim", NULL, 0, OPT_ANY_HEAD_DIM},
    {NULL, NULL, 0, 0}};

static void print_help(void) {
  printf(
      "usage: %s preheat [options]\n"
      "\n"
      "Compile the kernels of a grid of keys into the cache, so processes\n"
      "that run later find them on disk. Needs no GPU. Each list option\n"
      "takes a comma list; the grid is the product of all lists.\n"
      "\n"
      "  --arch LIST            compute capabilities, e.g. 80,90\n"
      "                         (default: the local GPU's, else 90)\n"
      "  --dtype LIST           %s (default bf16,fp16)\n"
      "  --head-dim LIST        head dims of Q and K, multiples of 8 from 8\n"
      "                         to 256 (default 64,128)\n"
      "  --head-dim-v N         head dim of V, O, dO, a multiple of 8 up to\n"
      "                         the head dim (default: head dim)\n"
      "  --mask LIST            %s\n"
      "                         (default none,causal_br)\n"
      "  --layout LIST          %s (default bshd,thd)\n"
      "  --lse LIST             %s (default packed)\n"
      "  --deterministic LIST   0,1 (default 0)\n"
      "  --even LIST            0,1: BSHD lengths multiple of the tiles\n"
      "                         (default 1; with no grid option at all, the\n"
      "                         default grid also covers BSHD even 0)\n"
      "  --dq LIST              %s: who writes dQ, the main kernel\n"
      "                         (with SDPA_JIT_DQ_CONVERT=main: one kernel\n"
      "                         fewer) or a convert kernel (default convert)\n"
      "  --tiles LIST           %s: the table's tiles, or those of\n"
      "                         BSHD problems whose main kernel runs at\n"
      "                         most 64 blocks of 128 kv rows (causal:\n"
      "                         128), not deterministic (default both)\n"
      "  --any-head-dim         plan every multiple of 8 up to 256 even under\n"
      "                         SDPA_JIT_ANY_HEAD_DIM=0 (which restricts plans\n"
      "                         to 32, 64, 96, 128, 192, 256); the default\n"
      "                         plans them all (options.any_head_dim ON)\n"
      "  -j, --jobs N           compile threads (default: online CPUs)\n"
      "  --json                 one JSON object per key, then the summary\n"
      "                         as a JSON object\n"
      "\n"
      "Global options: --cache PATH, --readonly PATH, --no-disk.\n"
      "\n"
      "Progress goes to stderr, one line per key. The last line on stdout\n"
      "is \"compiled N, cached M, failed F\" (\", not stored T\" when a\n"
      "kernel could not be written to the cache, \", skipped S\" when a grid\n"
      "point is not supported on its arch). Exit status 1 when a key failed\n"
      "or was not stored, or when nothing was planned (every point skipped);\n"
      "2 for a value the library rejects (checked before compiling).\n",
      CLI_PROGRAM, cli_dtype_names, cli_mask_names, cli_layout_names,
      cli_lse_names, cli_dq_names, cli_tiles_names);
}

/* What the command line asked for. */
typedef struct request {
  cli_grid grid;
  int grid_options; /* list options given */
  int threads;
  int json;
} request;

/* Reads the options into `req`. Returns -1 to go on, else an exit code. */
static int parse(cli_args *args, request *req) {
  const char *value = NULL;
  int id;
  while ((id = cli_args_next(args, options, &value)) != CLI_ARG_END) {
    const char *error = NULL;
    switch (id) {
    case CLI_ARG_HELP: print_help(); return CLI_EXIT_OK;
    case CLI_ARG_VERSION: printf("%s %s\n", CLI_PROGRAM, sdpa_version());
      return CLI_EXIT_OK;
    case CLI_ARG_ERROR: return CLI_EXIT_USAGE;
    case CLI_ARG_POSITIONAL:
      return cli_usage_error(args, "unexpected argument '%s'", value);
    case OPT_ARCH:
      error = cli_list_parse_ints(value, 50, 1000, &req->grid.arch);
      break;
    case OPT_DTYPE: error = cli_list_parse_dtypes(value, &req->grid.dtype);
      break;
    case OPT_HEAD_DIM:
      error = cli_list_parse_ints(value, 1, 1024, &req->grid.head_dim);
      break;
    case OPT_HEAD_DIM_V:
      if (cli_parse_int(value, 1, 1024, &req->grid.head_dim_v) != 0)
        error = "expected an integer from 1 to 1024";
      break;
    case OPT_MASK: error = cli_list_parse_masks(value, &req->grid.mask);
      break;
    case OPT_LAYOUT: error = cli_list_parse_layouts(value, &req->grid.layout);
      break;
    case OPT_LSE: error = cli_list_parse_lse(value, &req->grid.lse_strided);
      break;
    case OPT_DETERMINISTIC:
      error = cli_list_parse_ints(value, 0, 1, &req->grid.deterministic);
      break;
    case OPT_EVEN: error = cli_list_parse_ints(value, 0, 1, &req->grid.even);
      break;
    case OPT_DQ: error = cli_list_parse_dq(value, &req->grid.dq_main);
      break;
    case OPT_TILES: error = cli_list_parse_tiles(value, &req->grid.tiles);
      break;
    case OPT_JOBS:
      if (cli_parse_int(value, 1, 1024, &req->threads) != 0)
        error = "expected a thread count from 1 to 1024";
      break;
    case OPT_JSON: req->json = 1; break;
    case OPT_ANY_HEAD_DIM: req->grid.any_head_dim = 1; break;
    default: break;
    }
    if (error) {
      const char *name = "option";
      for (const cli_option *o = options; o->name; o++)
        if (o->id == id) name = o->name;
      return cli_usage_error(args, "%s '%s': %s", name, value, error);
    }
    if (id >= OPT_ARCH && id <= OPT_TILES) req->grid_options++;
  }
  return -1;
}

/* What happened to one grid point, in grid order, for --json. */
typedef struct record {
  size_t job;          /* index into jobs, when status is SUCCESS       */
  sdpa_status status;  /* of sdpa_bwd_plan_create                       */
  char *error;         /* its message when it failed (malloc'd)         */
  char point[160];     /* cli_grid_describe text                        */
} record;

/* Distinct keys: an open-addressing set of job indices by key hash. */
typedef struct key_set {
  size_t *slots; /* job index + 1; 0 = empty */
  size_t mask;
} key_set;

static int key_set_init(key_set *set, size_t expected) {
  size_t size = 16;
  while (size < expected * 2) size *= 2;
  set->slots = calloc(size, sizeof *set->slots);
  set->mask = size - 1;
  return set->slots ? 0 : -1;
}

/* Returns the index of the job with `hash`, or inserts `job` and returns
 * it. */
static size_t key_set_find_or_add(key_set *set, const cli_job *jobs,
                                  const char *hash, size_t job) {
  uint64_t h = 1469598103934665603u; /* FNV-1a */
  for (const char *c = hash; *c; c++)
    h = (h ^ (unsigned char)*c) * 1099511628211u;
  for (size_t slot = (size_t)h & set->mask;; slot = (slot + 1) & set->mask) {
    size_t held = set->slots[slot];
    if (held == 0) {
      set->slots[slot] = job + 1;
      return job;
    }
    if (strcmp(sdpa_bwd_plan_key_hash(jobs[held - 1].plan), hash) == 0)
      return held - 1;
  }
}

/* Prints the JSON object of one record. */
static void print_record_json(const record *r, const cli_job *jobs) {
  cli_json_object o;
  cli_json_begin(&o, stdout);
  if (r->status == SDPA_STATUS_SUCCESS) {
    const cli_job *job = &jobs[r->job];
    cli_json_str(&o, "key", sdpa_bwd_plan_key(job->plan));
    cli_json_str(&o, "hash", sdpa_bwd_plan_key_hash(job->plan));
    cli_json_str(&o, "source", cli_source_name(job->source));
    cli_json_num(&o, "ms", job->ms);
    cli_json_str(&o, "status", cli_job_outcome(job));
    if (job->error) cli_json_str(&o, "error", job->error);
  } else {
    cli_json_str(&o, "key", NULL);
    cli_json_str(&o, "hash", NULL);
    cli_json_str(&o, "source", "none");
    cli_json_num(&o, "ms", 0.0);
    cli_json_str(&o, "status",
                 r->status == SDPA_STATUS_NOT_SUPPORTED ? "skipped"
                                                        : "failed");
    cli_json_str(&o, "point", r->point);
    cli_json_str(&o, "error", r->error);
  }
  cli_json_end(&o);
  fputc('\n', stdout);
}

/* The work of one preheat run. */
typedef struct preheat {
  cli_job *jobs; /* one per distinct key             */
  size_t job_count;
  record *records; /* one per reported grid point      */
  size_t record_count;
  size_t skipped, plan_failed;
  key_set keys;
} preheat;

/* Plans one grid point: who writes dQ is the point's (a plan option). */
static sdpa_status plan_point(sdpa_runtime *runtime, const cli_grid_point *point,
                              const sdpa_bwd_desc *desc, sdpa_bwd_plan **plan) {
  sdpa_bwd_plan_options choices;
  cli_grid_options(point, &choices);
  return sdpa_bwd_plan_create_with(plan, runtime, desc, &choices);
}

/* Checks the head dims of the grid before any work, against the library's
 * own validation (a plan on a memory-only runtime): a value it rejects is
 * a usage error. Returns -1 to go on, else the exit code. */
static int check_head_dims(cli_args *args, const cli_grid *grid) {
  sdpa_runtime_options memory = SDPA_RUNTIME_OPTIONS_INIT;
  sdpa_runtime *probe = NULL;
  int rc = -1;
  memory.disable_disk_cache = 1;
  memory.arch = 90;
  if (sdpa_runtime_create(&probe, &memory) != SDPA_STATUS_SUCCESS)
    return cli_fail(args, SDPA_STATUS_INTERNAL, "cannot check the options");
  for (size_t i = 0; i < grid->head_dim.count && rc < 0; i++) {
    sdpa_bwd_desc d = SDPA_BWD_DESC_INIT;
    sdpa_bwd_plan *plan = NULL;
    d.dtype = SDPA_DTYPE_BF16;
    d.layout = SDPA_LAYOUT_BSHD;
    d.batch = d.heads_q = d.heads_kv = 1;
    d.seqlen_q = d.seqlen_kv = 128;
    d.head_dim = grid->head_dim.values[i];
    d.head_dim_v = grid->head_dim_v;
    sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
    if (grid->any_head_dim) o.any_head_dim = SDPA_SWITCH_ON;
    sdpa_status st = sdpa_bwd_plan_create_with(&plan, probe, &d, &o);
    sdpa_bwd_plan_destroy(plan);
    if (st == SDPA_STATUS_INVALID_ARGUMENT)
      rc = cli_usage_error(args, "--head-dim %d%s: %s", d.head_dim,
                           grid->head_dim_v ? " with --head-dim-v" : "", sdpa_last_error());
    else if (st == SDPA_STATUS_NOT_SUPPORTED && !grid->any_head_dim)
      rc = cli_usage_error(args, "--head-dim %d%s: %s (preheat --any-head-dim plans it anyway)",
                           d.head_dim,
                           grid->head_dim_v ? " with --head-dim-v" : "", sdpa_last_error());
  }
  sdpa_runtime_destroy(probe);
  return rc;
}

/* Creates a plan per grid point and keeps one job per distinct key;
 * NOT_SUPPORTED points are skipped, other plan failures recorded as
 * failed, both with a line on stderr. Returns 0, or -1 out of memory. */
static int build_jobs(preheat *run, sdpa_runtime *runtime,
                      const cli_grid *grid) {
  size_t points = cli_grid_size(grid);
  run->jobs = calloc(points, sizeof *run->jobs);
  run->records = calloc(points, sizeof *run->records);
  if (!run->jobs || !run->records || key_set_init(&run->keys, points) != 0)
    return -1;
  for (size_t i = 0; i < points; i++) {
    cli_grid_point point;
    if (cli_grid_point_at(grid, i, &point)) continue;
    sdpa_bwd_desc desc;
    cli_grid_desc(&point, &desc);
    record *r = &run->records[run->record_count];
    memset(r, 0, sizeof *r);
    cli_grid_describe(&point, r->point, sizeof r->point);
    sdpa_bwd_plan *plan = NULL;
    r->status = plan_point(runtime, &point, &desc, &plan);
    if (r->status != SDPA_STATUS_SUCCESS) {
      r->error = strdup(cli_error_text(r->status));
      if (r->status == SDPA_STATUS_NOT_SUPPORTED) {
        run->skipped++;
        fprintf(stderr, "skipped %s: %s\n", r->point,
                r->error ? r->error : "");
      } else {
        run->plan_failed++;
        fprintf(stderr, "FAILED %s: %s: %s\n", r->point,
                sdpa_status_name(r->status), r->error ? r->error : "");
      }
      run->record_count++;
      continue;
    }
    size_t n = run->job_count;
    run->jobs[n].plan = plan;
    r->job = key_set_find_or_add(&run->keys, run->jobs,
                                 sdpa_bwd_plan_key_hash(plan), n);
    if (r->job == n) {
      run->job_count++;
      run->record_count++;
    } else {
      sdpa_bwd_plan_destroy(plan); /* same key as an earlier point */
      run->jobs[n].plan = NULL;
    }
  }
  return 0;
}

/* Prints the per-key JSON objects (with --json) and the summary line.
 * Returns the exit code: 1 when anything failed. */
static int print_summary(const preheat *run, const sdpa_runtime *runtime,
                         int json) {
  size_t compiled = 0, cached = 0, failed = run->plan_failed, unstored = 0;
  double total_ms = 0.0;
  for (size_t j = 0; j < run->job_count; j++) {
    const char *outcome = cli_job_outcome(&run->jobs[j]);
    if (strcmp(outcome, "compiled") == 0)
      compiled++;
    else if (strcmp(outcome, "cached") == 0)
      cached++;
    else if (strcmp(outcome, "not stored") == 0)
      unstored++;
    else
      failed++;
    total_ms += run->jobs[j].ms;
  }
  if (json) {
    for (size_t i = 0; i < run->record_count; i++)
      print_record_json(&run->records[i], run->jobs);
    cli_json_object o;
    cli_json_begin(&o, stdout);
    cli_json_int(&o, "compiled", (int64_t)compiled);
    cli_json_int(&o, "cached", (int64_t)cached);
    cli_json_int(&o, "failed", (int64_t)failed);
    cli_json_int(&o, "not_stored", (int64_t)unstored);
    cli_json_int(&o, "skipped", (int64_t)run->skipped);
    cli_json_int(&o, "keys", (int64_t)run->job_count);
    cli_json_num(&o, "compile_ms", total_ms);
    cli_json_str(&o, "cache", cli_cache_location(runtime));
    cli_json_end(&o);
    fputc('\n', stdout);
  } else {
    printf("compiled %zu, cached %zu, failed %zu", compiled, cached, failed);
    if (unstored) printf(", not stored %zu", unstored);
    if (run->skipped) printf(", skipped %zu", run->skipped);
    putchar('\n');
  }
  if (unstored)
    fprintf(stderr,
            "%s preheat: %zu kernel%s compiled but not stored in %s (see the warning "
            "above): nothing to ship for %s\n",
            CLI_PROGRAM, unstored, unstored == 1 ? " was" : "s were",
            cli_cache_location(runtime), unstored == 1 ? "it" : "them");
  if (run->job_count == 0)
    fprintf(stderr, "%s preheat: nothing was preheated: every grid point was %s\n",
            CLI_PROGRAM, run->skipped ? "skipped (not supported on its arch)" : "rejected");
  return failed || unstored || run->job_count == 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}

int cli_preheat(cli_args *args) {
  request req;
  memset(&req, 0, sizeof req);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  req.threads = cpus > 0 ? (int)cpus : 1;
  int rc = parse(args, &req);
  if (rc >= 0) return rc;
  if (args->globals->no_disk)
    return cli_usage_error(args, "--no-disk leaves preheat nothing to store; give the "
                                 "cache to fill with --cache (or $SDPA_JIT_CACHE)");
  if ((rc = check_head_dims(args, &req.grid)) >= 0) return rc;
  /* Arch 0 stands for "the local one" until a runtime can say. */
  cli_grid_fill_defaults(&req.grid, 0, req.grid_options == 0);
  size_t points = cli_grid_size(&req.grid);
  if (points > GRID_POINTS_MAX)
    return cli_usage_error(args, "the grid has %zu points; at most %d",
                           points, GRID_POINTS_MAX);

  sdpa_runtime *runtime = NULL;
  preheat run;
  memset(&run, 0, sizeof run);
  if ((rc = cli_runtime_open(args, CLI_CACHE_FILL, &runtime)) != CLI_EXIT_OK) goto done;
  if (req.grid.arch.values[0] == 0) {
    int arch = sdpa_runtime_arch(runtime);
    if (arch <= 0)
      fprintf(stderr, "%s preheat: no GPU here: preheating for sm_%d (give --arch to "
                      "choose)\n",
              CLI_PROGRAM, FALLBACK_ARCH);
    req.grid.arch.values[0] = arch > 0 ? arch : FALLBACK_ARCH;
  }
  if (build_jobs(&run, runtime, &req.grid) != 0) {
    fprintf(stderr, "%s preheat: out of memory\n", CLI_PROGRAM);
    rc = CLI_EXIT_FAILURE;
    goto done;
  }
  int threads = req.threads;
  if ((size_t)threads > run.job_count)
    threads = run.job_count ? (int)run.job_count : 1;
  fprintf(stderr, "preheating %zu key%s into %s on %d thread%s\n",
          run.job_count, run.job_count == 1 ? "" : "s",
          cli_cache_location(runtime), threads, threads == 1 ? "" : "s");
  cli_jobs_run(run.jobs, run.job_count, threads);
  rc = print_summary(&run, runtime, req.json);

done:
  for (size_t j = 0; run.jobs && j < run.job_count; j++) {
    sdpa_bwd_plan_destroy(run.jobs[j].plan);
    free(run.jobs[j].error);
  }
  for (size_t i = 0; run.records && i < run.record_count; i++)
    free(run.records[i].error);
  free(run.keys.slots);
  free(run.records);
  free(run.jobs);
  sdpa_runtime_destroy(runtime);
  return rc;
}
