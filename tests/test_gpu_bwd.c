/*
 * test_gpu_bwd.c — the backward pass on a GPU against the float64 CPU
 * reference, through the public API only.
 *
 * - matrix: a fixed list covering every feature (dtypes, head dims, masks,
 *   BSHD strides, interleaved buffers, LSE layouts, THD with empty and
 *   unequal sequences, GQA/MQA, odd and tile-multiple lengths, seqlen 1,
 *   many sequences, many heads, explicit scale), for fp16 and bf16; again
 *   (in part) with dQ by the main kernel, with the table's tiles instead
 *   of the small-grid ones, with the launch order in groups, and with
 *   the query heads of a kv tile split over blocks;
 * - sweep: >= 200 random descriptors from a fresh, printed seed
 *   (SDPA_TEST_SEED reproduces one; SDPA_TEST_SWEEP_CASES changes the count);
 * - deterministic mode gives bitwise-identical outputs run after run (on
 *   sm_90 also with the sm_90a family forced);
 * - THD: one key serves many token totals with no recompile, one plan
 *   serves many cu_seqlens; a sequence past its max_s hint is reported as
 *   SDPA_STATUS_DEVICE_ERROR and the next good call works;
 * - execute rejects bad arguments with a message naming the field.
 *
 * Each case: outputs and workspace poisoned (NaN) before the launch; pass
 * when every relative error ||x - ref|| / ||ref|| is within the dtype's
 * tolerance (bf16 1e-2, fp16 2e-3), nothing is NaN/inf, no padding element
 * of an output buffer was written and no input changed. Plans are created
 * first and their distinct keys compiled in parallel (one thread per CPU).
 * Without a GPU: "skipped: no CUDA device", exit 77. Check runs the tests
 * in this process (CK_FORK=no): a forked child cannot use CUDA.
 */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "../templates/sdpa_hopper_traits.h" /* sdpa_hopper_fold_covers */
#include "gpu.h"
#include "plan.h" /* the plan's launch graphs (launch_paths) */
#include "reference.h"

#define TOL_BF16 1e-2
#define TOL_FP16 2e-3
#define MAX_SEQS 16
#define CASE_BUDGET_MACS 5.0e7

static sdpa_gpu gpu;
static sdpa_runtime *runtime;
/* The plan options every plan of this suite is made with: the default
 * (the runtime's environment: SDPA_JIT_FAMILY picks the family a whole
 * run tests), or what a test sets for its cases. */
static sdpa_bwd_plan_options test_options = SDPA_BWD_PLAN_OPTIONS_INIT;

/* ------------------------------------------------------------- summary */

typedef struct class_stats {
  sdpa_dtype dtype;
  int head_dim, head_dim_v;
  sdpa_mask mask;
  sdpa_layout layout;
  double worst[3];
  int cases, failures;
} class_stats;

static class_stats classes[512];
static int class_count;

static void record_class(const sdpa_ref_problem *p, const double err[3], int ok) {
  class_stats *c = NULL;
  for (int i = 0; i < class_count; i++) {
    class_stats *x = &classes[i];
    if (x->dtype == p->dtype && x->head_dim == p->head_dim && x->head_dim_v == p->head_dim_v &&
        x->mask == p->mask && x->layout == p->layout) {
      c = x;
      break;
    }
  }
  if (!c) {
    if (class_count == (int)(sizeof classes / sizeof classes[0])) return;
    c = &classes[class_count++];
    memset(c, 0, sizeof *c);
    c->dtype = p->dtype;
    c->head_dim = p->head_dim;
    c->head_dim_v = p->head_dim_v;
    c->mask = p->mask;
    c->layout = p->layout;
  }
  for (int t = 0; t < 3; t++)
    if (isnan(err[t]) || err[t] > c->worst[t]) c->worst[t] = err[t];
  c->cases++;
  c->failures += !ok;
}

static int class_order(const void *a, const void *b) {
  const class_stats *x = a, *y = b;
  if (x->dtype != y->dtype) return x->dtype - y->dtype;
  if (x->head_dim != y->head_dim) return x->head_dim - y->head_dim;
  if (x->head_dim_v != y->head_dim_v) return x->head_dim_v - y->head_dim_v;
  if (x->mask != y->mask) return (int)x->mask - (int)y->mask;
  return (int)x->layout - (int)y->layout;
}

static void print_summary(void) {
  qsort(classes, (size_t)class_count, sizeof classes[0], class_order);
  printf("\nworst relative error per class (tolerance bf16 %.0e, fp16 %.0e)\n", TOL_BF16, TOL_FP16);
  printf("%-5s %-8s %-10s %-5s %6s %10s %10s %10s %s\n", "dtype", "hd", "mask", "lay", "cases",
         "dq", "dk", "dv", "");
  for (int i = 0; i < class_count; i++) {
    const class_stats *c = &classes[i];
    char hd[16];
    snprintf(hd, sizeof hd, "%d/%d", c->head_dim, c->head_dim_v);
    printf("%-5s %-8s %-10s %-5s %6d %10.3e %10.3e %10.3e %s\n", sdpa_ref_dtype_name(c->dtype), hd,
           sdpa_ref_mask_name(c->mask), c->layout == SDPA_LAYOUT_THD ? "thd" : "bshd", c->cases,
           c->worst[0], c->worst[1], c->worst[2], c->failures ? "FAILED" : "");
  }
  fflush(stdout);
}

/* ---------------------------------------------------------------- cases */

typedef struct case_spec {
  const char *name;
  sdpa_layout layout;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim, head_dim_v;
  sdpa_mask mask;
  int left, right;
  float scale;
  sdpa_ref_style style;
  sdpa_ref_lse_style lse_style;
  int deterministic;
  int lens_q[MAX_SEQS], lens_kv[MAX_SEQS]; /* THD: batch entries */
  int exact_totals; /* THD: max_total_q/kv = the totals (else default) */
} case_spec;

typedef struct test_case {
  char label[80];
  case_spec spec;
  sdpa_dtype dtype;
  uint64_t seed;
  sdpa_ref_problem p;
  sdpa_ref_layout l;
  sdpa_bwd_desc desc;
  sdpa_ref_grads ref;
  int ready; /* problem and reference made */
  sdpa_bwd_plan *plan;
  int representative; /* index of the case that compiles this key */
  sdpa_source source;
  sdpa_status status;
  const char *stage;
  char message[1024];
} test_case;

static double tolerance(sdpa_dtype dtype) {
  return dtype == SDPA_DTYPE_BF16 ? TOL_BF16 : TOL_FP16;
}

static void case_init(test_case *c, const case_spec *s, sdpa_dtype dtype, uint64_t seed,
                      const char *label) {
  memset(c, 0, sizeof *c);
  c->spec = *s;
  c->dtype = dtype;
  c->seed = seed;
  snprintf(c->label, sizeof c->label, "%s", label);
  c->stage = "";
}

/* Makes the problem, its layout, descriptor and reference (thread-safe). */
static void case_prepare(test_case *c) {
  const case_spec *s = &c->spec;
  sdpa_ref_problem *p = &c->p;
  memset(p, 0, sizeof *p);
  p->dtype = c->dtype;
  p->layout = s->layout;
  p->batch = s->batch;
  p->heads_q = s->heads_q;
  p->heads_kv = s->heads_kv;
  p->seqlen_q = s->seqlen_q;
  p->seqlen_kv = s->seqlen_kv;
  p->head_dim = s->head_dim;
  p->head_dim_v = s->head_dim_v;
  p->mask = s->mask;
  p->window_left = s->left;
  p->window_right = s->right;
  p->scale = s->scale;
  if (sdpa_ref_problem_alloc(p, s->lens_q, s->lens_kv) != 0) {
    c->status = SDPA_STATUS_INVALID_ARGUMENT;
    c->stage = "reference";
    snprintf(c->message, sizeof c->message, "reference: bad shape or out of memory");
    return;
  }
  sdpa_ref_problem_fill(p, c->seed, 1);
  sdpa_ref_layout_make(&c->l, p, s->style, s->lse_style);
  sdpa_ref_desc(p, &c->l, &c->desc);
  c->desc.deterministic = s->deterministic;
  /* THD token bounds: the exact totals, or the default batch x max_s. */
  if (p->layout == SDPA_LAYOUT_THD && s->exact_totals) {
    c->desc.max_total_q = p->rows_q > 0 ? p->rows_q : 1;
    c->desc.max_total_kv = p->rows_kv > 0 ? p->rows_kv : 1;
  }
  if (sdpa_ref_backward(p, &c->ref, 1) != 0) {
    c->status = SDPA_STATUS_OUT_OF_MEMORY;
    c->stage = "reference";
    snprintf(c->message, sizeof c->message, "reference: out of memory");
    return;
  }
  c->ready = 1;
}

static void case_free(test_case *c) {
  sdpa_bwd_plan_destroy(c->plan);
  c->plan = NULL;
  sdpa_ref_grads_free(&c->ref);
  sdpa_ref_problem_free(&c->p);
}

static void describe_case(const test_case *c, char *text, size_t size) {
  char line[1024], desc[2048];
  sdpa_ref_describe(&c->p, &c->l, line, sizeof line);
  sdpa_ref_describe_desc(&c->desc, desc, sizeof desc);
  snprintf(text, size, "[%s seed=%" PRIu64 "] %s det=%d\n%s", c->label, c->seed, line,
           c->spec.deterministic, desc);
}

/* Compares one outcome against the case's reference; prints on failure;
 * `record`: counts it in the per-class summary. */
static int check_outcome_as(const test_case *c, const sdpa_gpu_outcome *o, const char *what,
                            int record) {
  char text[4096];
  double err[3] = {NAN, NAN, NAN};
  if (o->status != SDPA_STATUS_SUCCESS) {
    describe_case(c, text, sizeof text);
    printf("FAIL %s%s: %s\n%s", what, c->label, o->message, text);
    if (record) record_class(&c->p, err, 0);
    return 0;
  }
  const sdpa_ref_problem *p = &c->p;
  size_t n[3] = {sdpa_ref_elements(p, SDPA_REF_DQ), sdpa_ref_elements(p, SDPA_REF_DK),
                 sdpa_ref_elements(p, SDPA_REF_DV)};
  const float *x[3] = {o->grads.dq, o->grads.dk, o->grads.dv};
  const double *ref[3] = {c->ref.dq, c->ref.dk, c->ref.dv};
  size_t bad[3];
  double tol = tolerance(p->dtype);
  int ok = o->grads.padding_written == 0 && o->grads.inputs_changed == 0;
  for (int t = 0; t < 3; t++) {
    err[t] = sdpa_ref_rel_error(x[t], ref[t], n[t]);
    bad[t] = sdpa_ref_count_nonfinite(x[t], n[t]);
    ok = ok && bad[t] == 0 && err[t] <= tol;
  }
  if (record) record_class(p, err, ok);
  if (!ok) {
    describe_case(c, text, sizeof text);
    printf("FAIL %s%s: rel err dq %.3e dk %.3e dv %.3e (tol %.0e); non-finite dq %zu dk %zu "
           "dv %zu; padding written %" PRId64 "; inputs changed %" PRId64 "\n%s",
           what, c->label, err[0], err[1], err[2], tol, bad[0], bad[1], bad[2],
           o->grads.padding_written, o->grads.inputs_changed, text);
  }
  return ok;
}

static int check_outcome(const test_case *c, const sdpa_gpu_outcome *o, const char *what) {
  return check_outcome_as(c, o, what, 1);
}

/* ----------------------------------------------- preparing many cases */

typedef struct case_batch {
  test_case *cases;
  int count;
  int *keys; /* indexes of representatives */
  int key_count;
  atomic_int next;
} case_batch;

static void *prepare_worker(void *arg) {
  case_batch *b = arg;
  for (;;) {
    int i = atomic_fetch_add(&b->next, 1);
    if (i >= b->count) break;
    case_prepare(&b->cases[i]);
  }
  return NULL;
}

static void *compile_worker(void *arg) {
  case_batch *b = arg;
  if (sdpa_driver_context(gpu.drv, NULL, NULL) != SDPA_STATUS_SUCCESS) return NULL;
  for (;;) {
    int k = atomic_fetch_add(&b->next, 1);
    if (k >= b->key_count) break;
    test_case *c = &b->cases[b->keys[k]];
    c->status = sdpa_bwd_compile(c->plan, &c->source);
    if (c->status != SDPA_STATUS_SUCCESS) {
      c->stage = "compile";
      snprintf(c->message, sizeof c->message, "compile: %s: %s", sdpa_status_name(c->status),
               sdpa_last_error());
    }
  }
  return NULL;
}

/* Runs fn over the batch on one thread per online CPU (at most `items`). */
static void run_threads(case_batch *b, void *(*fn)(void *), int items) {
  int threads = sdpa_ref_cpu_count();
  if (threads > items) threads = items;
  if (threads < 1) threads = 1;
  pthread_t *ids = calloc((size_t)threads, sizeof *ids);
  int started = 0;
  atomic_store(&b->next, 0);
  for (; ids && started < threads; started++)
    if (pthread_create(&ids[started], NULL, fn, b) != 0) break;
  if (started == 0) fn(b); /* no threads: do it here */
  for (int i = 0; i < started; i++) pthread_join(ids[i], NULL);
  free(ids);
}

/* Problems + references in parallel, plans in order, distinct keys
 * compiled in parallel, then every other plan compiled (an in-memory hit). */
static void prepare_batch(test_case *cases, int count) {
  case_batch b = {cases, count, NULL, 0, 0};
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_threads(&b, prepare_worker, count);
  clock_gettime(CLOCK_MONOTONIC, &t1);

  b.keys = calloc((size_t)count + 1, sizeof *b.keys);
  for (int i = 0; i < count; i++) {
    test_case *c = &cases[i];
    c->representative = -1;
    if (!c->ready) continue;
    c->status = sdpa_bwd_plan_create_with(&c->plan, runtime, &c->desc, &test_options);
    if (c->status != SDPA_STATUS_SUCCESS) {
      c->stage = "plan";
      snprintf(c->message, sizeof c->message, "plan: %s: %s", sdpa_status_name(c->status),
               sdpa_last_error());
      c->plan = NULL;
      continue;
    }
    const char *hash = sdpa_bwd_plan_key_hash(c->plan);
    for (int k = 0; k < b.key_count; k++)
      if (strcmp(sdpa_bwd_plan_key_hash(cases[b.keys[k]].plan), hash) == 0) {
        c->representative = b.keys[k];
        break;
      }
    if (c->representative < 0) {
      c->representative = i;
      b.keys[b.key_count++] = i;
    }
  }
  run_threads(&b, compile_worker, b.key_count);
  for (int i = 0; i < count; i++) {
    test_case *c = &cases[i];
    if (!c->plan || c->representative == i) continue;
    c->status = sdpa_bwd_compile(c->plan, &c->source);
    if (c->status != SDPA_STATUS_SUCCESS) {
      c->stage = "compile";
      snprintf(c->message, sizeof c->message, "compile: %s: %s", sdpa_status_name(c->status),
               sdpa_last_error());
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t2);
  int logged = 0;
  for (int k = 0; k < b.key_count; k++) {
    test_case *c = &cases[b.keys[k]];
    if (c->status == SDPA_STATUS_COMPILE_FAILED && logged++ < 3)
      printf("compile log of %s:\n%.4000s\n", sdpa_bwd_plan_key(c->plan),
             sdpa_bwd_plan_compile_log(c->plan));
  }
  int hopper = 0;
  for (int i = 0; i < count; i++)
    hopper += cases[i].plan && strstr(sdpa_bwd_plan_key(cases[i].plan), ";family=hopper;");
  printf("  %d cases (%d on the Hopper family): references %.1f s, %d distinct keys "
         "compiled in %.1f s\n",
         count, hopper,
         (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), b.key_count,
         (double)(t2.tv_sec - t1.tv_sec) + 1e-9 * (double)(t2.tv_nsec - t1.tv_nsec));
  fflush(stdout);
  free(b.keys);
}

/* Runs every prepared case twice, each time on fresh copies of its
 * tensors: the plan's first call on the stream goes kernel by kernel, the
 * second through the graph it makes (launch.h; with SDPA_JIT_GRAPHS=0
 * kernel by kernel again). Both are checked; returns the number of cases
 * that failed either. */
static int run_batch(test_case *cases, int count, const char *what) {
  int failures = 0;
  for (int i = 0; i < count; i++) {
    test_case *c = &cases[i];
    int ok = 1;
    for (int call = 0; call < 2; call++) {
      sdpa_gpu_outcome o;
      memset(&o, 0, sizeof o);
      if (c->status != SDPA_STATUS_SUCCESS || !c->plan) {
        o.status = c->status != SDPA_STATUS_SUCCESS ? c->status : SDPA_STATUS_INTERNAL;
        snprintf(o.message, sizeof o.message, "%s", c->message);
      } else {
        sdpa_gpu_execute_problem(&gpu, c->plan, &c->p, &c->l, &o);
      }
      char label[160];
      snprintf(label, sizeof label, "%s%s", what ? what : "",
               call ? " [second call] " : "");
      const int planned = c->status == SDPA_STATUS_SUCCESS && c->plan;
      ok = check_outcome_as(c, &o, label, call == 1 || !planned) && ok;
      sdpa_gpu_outcome_free(&o);
      if (!planned) break;
    }
    failures += !ok;
    fflush(stdout);
  }
  return failures;
}

/* ----------------------------------------------------------------- matrix */

#define BSHD_CASE(n, b, hq, hkv, sq, skv, hd, hdv, mask, l, r, scale, style, lse, det)        \
  {n, SDPA_LAYOUT_BSHD, b, hq, hkv, sq, skv, hd, hdv, mask, l, r, scale, style, lse, det, {0}, {0}, 0}
#define THD_CASE(n, b, hq, hkv, hd, hdv, mask, l, r, scale, style, lse, det, lq, lkv)          \
  {n, SDPA_LAYOUT_THD, b, hq, hkv, 0, 0, hd, hdv, mask, l, r, scale, style, lse, det, lq, lkv, 0}
/* THD with max_total_q/kv set to the exact totals */
#define THD_EXACT(n, b, hq, hkv, hd, hdv, mask, l, r, scale, style, lse, det, lq, lkv)         \
  {n, SDPA_LAYOUT_THD, b, hq, hkv, 0, 0, hd, hdv, mask, l, r, scale, style, lse, det, lq, lkv, 1}

#define NONE SDPA_MASK_NONE
#define TL SDPA_MASK_CAUSAL_TOP_LEFT
#define BR SDPA_MASK_CAUSAL_BOTTOM_RIGHT
#define WIN SDPA_MASK_SLIDING_WINDOW
#define PACKED SDPA_REF_STYLE_PACKED
#define PADDED SDPA_REF_STYLE_PADDED
#define HEADS SDPA_REF_STYLE_HEAD_MAJOR
#define INTER SDPA_REF_STYLE_INTERLEAVED
#define LP SDPA_REF_LSE_PACKED
#define LPAD SDPA_REF_LSE_PADDED
#define LTOK SDPA_REF_LSE_TOKEN_MAJOR

/* THD lengths: an empty sequence, a query-less and a key-less one, and
 * sq != skv elsewhere. */
#define LENS(...) {__VA_ARGS__}
#define LENS_Q_MIXED {37, 0, 129, 64, 1, 0, 9}
#define LENS_KV_MIXED {50, 0, 100, 64, 7, 20, 0}

static const case_spec matrix_specs[] = {
    /* head dims */
    BSHD_CASE("hd32", 2, 4, 4, 100, 100, 32, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd64", 2, 4, 4, 100, 100, 64, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd96", 2, 2, 2, 100, 100, 96, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd128", 2, 2, 2, 100, 100, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd192", 1, 2, 2, 100, 100, 192, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd256", 1, 2, 2, 100, 100, 256, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd192_hdv128", 1, 2, 2, 100, 100, 192, 128, NONE, 0, 0, 0, PACKED, LP, 0),
    /* head dims of the rule: GEMM head dims padded to 16, to 32, at both */
    BSHD_CASE("hd8", 2, 4, 4, 100, 100, 8, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd40_causal", 2, 4, 2, 130, 130, 40, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd72_window", 1, 4, 4, 150, 150, 72, 0, WIN, 40, 8, 0, PADDED, LTOK, 0),
    BSHD_CASE("hd80", 2, 2, 2, 100, 100, 80, 0, NONE, 0, 0, 0, HEADS, LP, 0),
    BSHD_CASE("hd112_causal_br", 1, 2, 2, 90, 170, 112, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd160", 1, 2, 2, 100, 100, 160, 0, NONE, 0, 0, 0, PACKED, LPAD, 0),
    BSHD_CASE("hd216_causal", 1, 2, 1, 100, 100, 216, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("hd136_hdv72", 1, 2, 2, 100, 100, 136, 72, NONE, 0, 0, 0, PADDED, LP, 0),
    BSHD_CASE("hd80_hdv40_det", 1, 4, 2, 100, 100, 80, 40, TL, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("even_hd80", 1, 2, 2, 256, 256, 80, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd248_causal", 1, 1, 1, 128, 128, 248, 0, TL, 0, 0, 0, PACKED, LP, 0),
    /* tile-multiple lengths (the even-tile kernels) */
    BSHD_CASE("even_hd32", 1, 2, 2, 256, 256, 32, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd64", 1, 2, 2, 256, 256, 64, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd96_causal", 1, 2, 2, 256, 256, 96, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd128", 1, 2, 2, 128, 128, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd128_causal_br", 1, 2, 2, 128, 256, 128, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd192", 1, 1, 1, 128, 128, 192, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd256", 1, 1, 1, 128, 128, 256, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_hd192_hdv128", 1, 1, 1, 128, 128, 192, 128, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("even_window", 1, 2, 2, 256, 256, 64, 0, WIN, 64, 0, 0, PACKED, LP, 0),
    /* masks */
    BSHD_CASE("causal_tl", 1, 2, 2, 130, 130, 64, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("causal_tl_sq<skv", 1, 2, 2, 90, 200, 128, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("causal_tl_sq>skv", 1, 2, 2, 200, 90, 64, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("causal_br_sq<skv", 1, 2, 2, 90, 200, 64, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("causal_br_sq>skv", 1, 2, 2, 200, 90, 128, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("causal_br_hd256", 1, 1, 1, 70, 150, 256, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("gqa_6_2_hd256_br", 1, 6, 2, 130, 150, 256, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("gqa_4_1_hd160_tl", 1, 4, 1, 100, 120, 160, 0, TL, 0, 0, 0, PACKED, LTOK, 0),
    /* the transposed-dQ kernel (192 / <= 128): the query-head split, a
     * last query tile of one 16-row block, head-major strides */
    BSHD_CASE("gqa_6_2_hd192_hdv128_br", 1, 6, 2, 130, 250, 192, 128, BR, 0, 0, 0, PACKED, LTOK,
              0),
    BSHD_CASE("hd192_hdv96_tl", 2, 2, 2, 79, 300, 192, 96, TL, 0, 0, 0, HEADS, LP, 0),
    BSHD_CASE("window_64_0", 1, 2, 2, 200, 200, 64, 0, WIN, 64, 0, 0, PACKED, LP, 0),
    BSHD_CASE("window_32_16", 1, 2, 2, 150, 190, 128, 0, WIN, 32, 16, 0, PACKED, LP, 0),
    BSHD_CASE("window_-1_8", 1, 2, 2, 190, 150, 64, 0, WIN, -1, 8, 0, PACKED, LP, 0),
    BSHD_CASE("window_16_-1", 1, 2, 2, 130, 130, 96, 0, WIN, 16, -1, 0, PACKED, LP, 0),
    BSHD_CASE("window_0_0", 1, 2, 2, 100, 100, 64, 0, WIN, 0, 0, 0, PACKED, LP, 0),
    /* strides and buffers */
    BSHD_CASE("bhsd", 2, 4, 4, 77, 77, 64, 0, NONE, 0, 0, 0, HEADS, LP, 0),
    BSHD_CASE("bhsd_causal_br", 2, 2, 2, 60, 140, 128, 0, BR, 0, 0, 0, HEADS, LTOK, 0),
    BSHD_CASE("padded", 2, 3, 1, 100, 90, 96, 0, TL, 0, 0, 0, PADDED, LPAD, 0),
    BSHD_CASE("padded_hdv", 1, 2, 2, 80, 80, 192, 128, WIN, 20, 5, 0, PADDED, LTOK, 0),
    BSHD_CASE("interleaved_qkv", 2, 4, 4, 100, 100, 64, 0, NONE, 0, 0, 0, INTER, LP, 0),
    BSHD_CASE("interleaved_qkv_gqa", 2, 8, 2, 64, 64, 128, 0, TL, 0, 0, 0, INTER, LTOK, 0),
    BSHD_CASE("interleaved_kv", 1, 4, 4, 70, 110, 64, 0, BR, 0, 0, 0, INTER, LPAD, 0),
    BSHD_CASE("lse_token_major", 2, 4, 4, 100, 100, 64, 0, TL, 0, 0, 0, PACKED, LTOK, 0),
    BSHD_CASE("lse_padded", 2, 2, 2, 100, 100, 128, 0, NONE, 0, 0, 0, PACKED, LPAD, 0),
    /* GQA / MQA */
    BSHD_CASE("gqa_8_2", 1, 8, 2, 100, 100, 64, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("gqa_8_2_window", 1, 8, 2, 90, 120, 64, 0, WIN, 32, 16, 0, PADDED, LP, 0),
    BSHD_CASE("mqa_8_1", 1, 8, 1, 64, 96, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("mqa_8_1_causal_br", 1, 8, 1, 96, 64, 64, 0, BR, 0, 0, 0, HEADS, LTOK, 0),
    /* lengths */
    BSHD_CASE("len_65_127", 1, 2, 2, 65, 127, 64, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("len_129_63", 1, 2, 2, 129, 63, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("seqlen_1", 2, 2, 2, 1, 1, 64, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("seqlen_q1", 2, 2, 2, 1, 150, 128, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("seqlen_q1_tl", 2, 2, 2, 1, 150, 64, 0, TL, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("seqlen_kv1", 2, 2, 2, 150, 1, 64, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("seqlen_kv1_none", 1, 2, 2, 150, 1, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("batch_256", 256, 2, 2, 3, 5, 64, 0, BR, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("batch_256_none", 256, 2, 1, 4, 4, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("heads_128", 1, 128, 128, 5, 5, 64, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    BSHD_CASE("heads_128_gqa", 2, 128, 16, 7, 9, 128, 0, TL, 0, 0, 0, PACKED, LTOK, 0),
    /* more tiles than a GPU has SMs: a persistent kernel's blocks take
     * several each */
    BSHD_CASE("tiles_432", 3, 48, 48, 200, 333, 64, 0, NONE, 0, 0, 0, PADDED, LTOK, 0),
    BSHD_CASE("tiles_320_hd128", 2, 40, 40, 150, 520, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0),
    /* scale */
    BSHD_CASE("scale_0.3", 1, 2, 2, 100, 100, 64, 0, TL, 0, 0, 0.3f, PACKED, LP, 0),
    BSHD_CASE("scale_0.05_hd256", 1, 1, 1, 100, 100, 256, 0, NONE, 0, 0, 0.05f, PACKED, LP, 0),
    /* deterministic */
    BSHD_CASE("det_gqa_causal", 1, 8, 2, 100, 100, 64, 0, TL, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_even", 1, 2, 2, 256, 256, 128, 0, NONE, 0, 0, 0, PACKED, LP, 1),
    /* THD */
    THD_CASE("thd", 7, 2, 2, 64, 0, NONE, 0, 0, 0, PACKED, LPAD, 0, LENS_Q_MIXED, LENS_KV_MIXED),
    THD_CASE("thd_packed_lse", 7, 2, 2, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_causal_tl", 7, 2, 2, 64, 0, TL, 0, 0, 0, PACKED, LTOK, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_EXACT("thd_causal_br", 7, 2, 2, 128, 0, BR, 0, 0, 0, PACKED, LP, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_window_32_16", 7, 2, 2, 64, 0, WIN, 32, 16, 0, PACKED, LPAD, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_window_-1_8", 7, 2, 2, 96, 0, WIN, -1, 8, 0, PADDED, LTOK, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_EXACT("thd_gqa_8_2", 7, 8, 2, 64, 0, BR, 0, 0, 0, PACKED, LTOK, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_mqa_8_1", 7, 8, 1, 128, 0, NONE, 0, 0, 0.2f, PACKED, LPAD, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_many_tiles", 7, 48, 48, 96, 0, NONE, 0, 0, 0, PACKED, LP, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_head_major", 7, 2, 2, 64, 0, TL, 0, 0, 0, HEADS, LTOK, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_interleaved_kv", 7, 4, 2, 64, 0, BR, 0, 0, 0, INTER, LPAD, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_EXACT("thd_interleaved_qkv", 4, 4, 4, 128, 0, TL, 0, 0, 0, INTER, LTOK, 0,
             LENS(33, 0, 100, 2), LENS(33, 0, 100, 2)),
    THD_CASE("thd_hd256", 3, 1, 1, 256, 0, BR, 0, 0, 0, PACKED, LPAD, 0, LENS(40, 90, 0),
             LENS(100, 30, 10)),
    THD_CASE("thd_hd192_hdv128", 3, 2, 1, 192, 128, WIN, 16, 16, 0, PADDED, LPAD, 0,
             LENS(40, 90, 0), LENS(100, 30, 10)),
    THD_CASE("thd_gqa_hd192_hdv128", 7, 4, 2, 192, 128, TL, 0, 0, 0, PACKED, LP, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_EXACT("thd_hd32", 5, 4, 4, 32, 0, NONE, 0, 0, 0, PACKED, LPAD, 0, LENS(128, 64, 1, 0, 200),
             LENS(128, 64, 300, 3, 1)),
    THD_CASE("thd_many", 16, 2, 2, 64, 0, BR, 0, 0, 0, PACKED, LPAD, 0,
             LENS(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16),
             LENS(16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)),
    THD_EXACT("thd_det", 7, 8, 2, 64, 0, TL, 0, 0, 0, PACKED, LPAD, 1, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_hd88", 7, 4, 2, 88, 0, BR, 0, 0, 0, PACKED, LPAD, 0, LENS_Q_MIXED,
             LENS_KV_MIXED),
    THD_CASE("thd_hd176_hdv96", 3, 2, 2, 176, 96, WIN, 30, 10, 0, PADDED, LTOK, 0,
             LENS(40, 90, 0), LENS(100, 30, 10)),
};
#define MATRIX_COUNT ((int)(sizeof matrix_specs / sizeof matrix_specs[0]))

/* Runs every `every`-th case of the matrix (both dtypes) but those `skip`
 * (if not NULL) returns nonzero for; the number of failed cases.
 * SDPA_TEST_MATRIX_EVERY=n thins it further (for slow runs under the
 * memory checkers). */
static int run_matrix(int every, const char *what, int (*skip)(const case_spec *)) {
  const char *every_env = getenv("SDPA_TEST_MATRIX_EVERY");
  if (every_env && atoi(every_env) > 1) every *= atoi(every_env);
  test_case *cases = calloc((size_t)(2 * MATRIX_COUNT), sizeof *cases);
  ck_assert_ptr_nonnull(cases);
  int count = 0;
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < MATRIX_COUNT; i++) {
      if ((d * MATRIX_COUNT + i) % every != 0) continue;
      if (skip && skip(&matrix_specs[i])) continue;
      sdpa_dtype dtype = d == 0 ? SDPA_DTYPE_BF16 : SDPA_DTYPE_FP16;
      char label[80];
      snprintf(label, sizeof label, "%s %s %s", what, matrix_specs[i].name,
               sdpa_ref_dtype_name(dtype));
      case_init(&cases[count++], &matrix_specs[i], dtype,
                0x5eed0000u + (uint64_t)(d * MATRIX_COUNT + i), label);
    }
  printf("%s: %d cases\n", what, count);
  prepare_batch(cases, count);
  int failures = run_batch(cases, count, "");
  for (int i = 0; i < count; i++) case_free(&cases[i]);
  free(cases);
  printf("%s: %d of %d cases failed\n", what, failures, count);
  return failures;
}

START_TEST(matrix) {
  int failures = run_matrix(1, "matrix", NULL);
  ck_assert_msg(failures == 0, "%d matrix cases failed (see above)", failures);
}
END_TEST

/* Every `every`-th case of the matrix with plan options `o` (their
 * family the run's), asserting that none fails. */
static void matrix_with(sdpa_bwd_plan_options o, int every, const char *what) {
  const sdpa_bwd_plan_options saved = test_options;
  o.family = saved.family;
  test_options = o;
  int failures = run_matrix(every, what, NULL);
  test_options = saved;
  ck_assert_msg(failures == 0, "%d matrix cases failed (see above)", failures);
}

/* The suite's default options, every head dim the kernels are built for
 * asked for explicitly (whatever SDPA_JIT_ANY_HEAD_DIM says). */
static sdpa_bwd_plan_options options_init(void) {
  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  o.any_head_dim = SDPA_SWITCH_ON;
  return o;
}

/* Every other case again with the main kernel writing dQ
 * (options.dq_writer MAIN: one kernel fewer; the mma.sync family's). */
START_TEST(matrix_main_kernel) {
  sdpa_bwd_plan_options o = options_init();
  o.dq_writer = SDPA_DQ_MAIN;
  const sdpa_family family = test_options.family;
  test_options.family = SDPA_FAMILY_MMA;
  matrix_with(o, 2, "matrix, dQ by the main kernel");
  test_options.family = family;
}
END_TEST

/* Whether the sm_90a main kernel cannot write dQ itself for spec. */
static int fold_not_covered(const case_spec *s) {
  const int dv = s->head_dim_v ? s->head_dim_v : s->head_dim;
  return !sdpa_hopper_fold_covers(s->head_dim, dv, (int)s->layout, (int)s->mask,
                                  s->deterministic);
}

/* Every case the sm_90a main kernel can write dQ for, with it writing dQ
 * (options.dq_writer MAIN, the family forced: no convert launch; the
 * query tiles counted in by the kv tiles that visit them, converted by
 * the last one). */
START_TEST(matrix_main_kernel_sm90a) {
  if (gpu.arch != 90) {
    printf("matrix_main_kernel_sm90a: skipped: sm_%d (the family needs sm_90)\n", gpu.arch);
    return;
  }
  const sdpa_bwd_plan_options saved = test_options;
  test_options = options_init();
  test_options.dq_writer = SDPA_DQ_MAIN;
  test_options.family = SDPA_FAMILY_HOPPER;
  const int failures = run_matrix(1, "matrix, dQ by the sm_90a main kernel", fold_not_covered);
  test_options = saved;
  ck_assert_msg(failures == 0, "%d matrix cases failed (see above)", failures);
}
END_TEST

/* Every third case with execute launching kernel by kernel
 * (options.graphs OFF; by default a graph per plan and stream). */
START_TEST(matrix_direct_launches) {
  sdpa_bwd_plan_options o = options_init();
  o.graphs = SDPA_SWITCH_OFF;
  matrix_with(o, 3, "matrix, kernel by kernel");
}
END_TEST

/* Every case again with the small-grid rule off: the matrix's BSHD
 * problems are small grids, so by default they run 64-row kv tiles; here
 * they run the table's tiles, as larger problems do. */
START_TEST(matrix_table_tiles) {
  sdpa_bwd_plan_options o = options_init();
  o.small_grid = SDPA_SWITCH_OFF;
  matrix_with(o, 1, "matrix, the table's tiles");
}
END_TEST

/* Every third case with the masked launch order in groups of 3 (sequence,
 * kv head) pairs: the matrix's problems are short, so by default one
 * group holds every pair; here most have several groups and a smaller
 * last one, and no kv tile may be missed or run twice. */
START_TEST(matrix_launch_groups) {
  sdpa_bwd_plan_options o = options_init();
  o.order_group = 3;
  matrix_with(o, 3, "matrix, launch order in groups of 3 pairs");
}
END_TEST

/* Every case with each kv tile's query heads split over blocks
 * (options.head_chunks: one query head a block, the largest count; the
 * sm_90a family adds dK / dV in fp32 for the convert kernel to write), and
 * every other case split in two. MHA cases, deterministic ones and the
 * mma.sync family run as without it. */
START_TEST(matrix_split_heads) {
  sdpa_bwd_plan_options o = options_init();
  o.head_chunks = 65535;
  matrix_with(o, 1, "matrix, query heads split over blocks, one a block");
  o.head_chunks = 2;
  matrix_with(o, 2, "matrix, query heads split over two blocks");
}
END_TEST

/* The last wave's split tiles (options.tail_split n: the rule as if the
 * device had n multiprocessors, so that these small grids split): each
 * case with the n under which its plan splits its last tiles % n tiles
 * (the parts asserted from the plan), the last kv tile partial in two,
 * GQA in one; both dtypes, against the float64 reference. */
typedef struct tail_spec {
  case_spec spec;
  int sms, parts; /* options.tail_split, the parts the rule gives */
} tail_spec;
static const tail_spec tail_specs[] = {
    /* 16 tiles on 12 SMs: the last 4 in thirds (the last kv tile partial) */
    {BSHD_CASE("tail_hd128", 1, 2, 2, 1000, 1000, 128, 0, NONE, 0, 0, 0, PACKED, LP, 0), 12, 3},
    /* 16 tiles on 13, a group of 2: the last 3 in quarters */
    {BSHD_CASE("tail_hd96_gqa", 1, 4, 2, 1000, 900, 96, 0, NONE, 0, 0, 0, PADDED, LPAD, 0), 13, 4},
    /* 27 tiles on 20: the last 7 in halves (head_dim_v < head_dim) */
    {BSHD_CASE("tail_hd72_hdv40", 1, 3, 3, 1100, 1100, 72, 40, NONE, 0, 0, 0, HEADS, LTOK, 0), 20,
     2},
};

START_TEST(tail_split_sm90a) {
  if (gpu.arch != 90) {
    printf("tail_split_sm90a: skipped: sm_%d (the family needs sm_90)\n", gpu.arch);
    return;
  }
  const sdpa_bwd_plan_options saved = test_options;
  int failures = 0;
  for (size_t i = 0; i < sizeof tail_specs / sizeof tail_specs[0]; i++) {
    const tail_spec *t = &tail_specs[i];
    test_options = options_init();
    test_options.family = SDPA_FAMILY_HOPPER;
    test_options.tail_split = t->sms;
    test_case cases[2];
    memset(cases, 0, sizeof cases);
    for (int d = 0; d < 2; d++) {
      char label[80];
      snprintf(label, sizeof label, "tail split over %d SMs %s %s", t->sms, t->spec.name,
               d ? "fp16" : "bf16");
      case_init(&cases[d], &t->spec, d ? SDPA_DTYPE_FP16 : SDPA_DTYPE_BF16,
                0x7a110000u + 2 * i + (uint64_t)d, label);
    }
    prepare_batch(cases, 2);
    for (int d = 0; d < 2; d++) {
      const sdpa_bwd_plan *plan = cases[d].plan;
      ck_assert_msg(plan && plan->tail_cap > 0, "%s: the plan holds no split slots",
                    t->spec.name);
      const long long tiles = (long long)plan->main_grid_x * t->spec.heads_kv;
      const int parts = sdpa_hopper_tail_parts(tiles, t->sms, sdpa_tail_steps(&plan->params),
                                               plan->params.q_tiles, plan->tail_cap);
      ck_assert_msg(parts == t->parts, "%s: %d tiles on %d SMs split in %d parts, not %d",
                    t->spec.name, (int)tiles, t->sms, parts, t->parts);
    }
    failures += run_batch(cases, 2, "");
    for (int d = 0; d < 2; d++) case_free(&cases[d]);
  }
  test_options = saved;
  printf("tail split: %d of %d cases failed\n", failures,
         (int)(2 * sizeof tail_specs / sizeof tail_specs[0]));
  ck_assert_msg(failures == 0, "%d split-tail cases failed (see above)", failures);
}
END_TEST

/* The longest-first launch order (THD without a mask, not deterministic:
 * the preprocess ranks the sequences by query length, the main kernel's
 * spans of heads x kv tiles follow the ranks): lengths out of order, ties,
 * empty sequences and a zero-length query with keys, GQA, the narrow,
 * wide and transposed-dQ kernels; each with options.longest_first ON (the
 * plan asserted to order) and OFF (asserted not to), both against the
 * float64 reference. A rank given twice or never leaves a sequence's dK /
 * dV poisoned or written by the wrong tiles. */
#define ORDER_Q_7 {300, 0, 1000, 300, 17, 640, 1}
#define ORDER_KV_7 {300, 40, 1000, 200, 17, 900, 1}
#define ORDER_Q_5 {129, 700, 0, 700, 64}
#define ORDER_KV_5 {129, 700, 33, 650, 300}
#define ORDER_QKV_3 {70, 600, 333}
#define ORDER_Q_4 {100, 500, 9, 380}
#define ORDER_KV_4 {260, 500, 9, 380}
static const case_spec order_specs[] = {
    THD_CASE("order_hd128", 7, 3, 3, 128, 0, NONE, 0, 0, 0, PACKED, LPAD, 0, ORDER_Q_7,
             ORDER_KV_7),
    THD_CASE("order_hd64_gqa", 5, 4, 2, 64, 0, NONE, 0, 0, 0, PACKED, LTOK, 0, ORDER_Q_5,
             ORDER_KV_5),
    THD_CASE("order_hd160", 3, 2, 1, 160, 0, NONE, 0, 0, 0, PADDED, LP, 0, ORDER_QKV_3,
             ORDER_QKV_3),
    THD_CASE("order_hd192_hdv128", 4, 2, 2, 192, 128, NONE, 0, 0, 0, PACKED, LPAD, 0, ORDER_Q_4,
             ORDER_KV_4),
};
START_TEST(longest_first_sm90a) {
  if (gpu.arch != 90) {
    printf("longest_first_sm90a: skipped: sm_%d (the family needs sm_90)\n", gpu.arch);
    return;
  }
  const sdpa_bwd_plan_options saved = test_options;
  const size_t n = sizeof order_specs / sizeof order_specs[0];
  int failures = 0;
  for (int on = 1; on >= 0; on--) {
    test_options = options_init();
    test_options.family = SDPA_FAMILY_HOPPER;
    test_options.longest_first = on ? SDPA_SWITCH_ON : SDPA_SWITCH_OFF;
    test_case cases[2 * (sizeof order_specs / sizeof order_specs[0])];
    memset(cases, 0, sizeof cases);
    for (size_t i = 0; i < 2 * n; i++) {
      char label[80];
      snprintf(label, sizeof label, "%s %s %s", order_specs[i / 2].name,
               on ? "longest first" : "batch order", i % 2 ? "fp16" : "bf16");
      case_init(&cases[i], &order_specs[i / 2], i % 2 ? SDPA_DTYPE_FP16 : SDPA_DTYPE_BF16,
                0x0dde0000u + 4 * i + (uint64_t)on, label);
    }
    prepare_batch(cases, (int)(2 * n));
    for (size_t i = 0; i < 2 * n; i++)
      ck_assert_msg(cases[i].plan && cases[i].plan->longest_first == on,
                    "%s: the plan's longest_first is %d, not %d", cases[i].label,
                    cases[i].plan ? cases[i].plan->longest_first : -1, on);
    failures += run_batch(cases, (int)(2 * n), "");
    for (size_t i = 0; i < 2 * n; i++) case_free(&cases[i]);
  }
  test_options = saved;
  printf("longest first: %d of %d cases failed\n", failures, (int)(4 * n));
  ck_assert_msg(failures == 0, "%d longest-first cases failed (see above)", failures);
}
END_TEST

/* ------------------------------------------------------------------ sweep */

static uint64_t fresh_seed(void) {
  const char *env = getenv("SDPA_TEST_SEED");
  if (env && *env) return strtoull(env, NULL, 0);
  uint64_t seed = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(&seed, sizeof seed, 1, f) != 1) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    seed = (uint64_t)now.tv_sec * 1000000007u ^ (uint64_t)now.tv_nsec ^ (uint64_t)getpid();
  }
  if (f) fclose(f);
  return seed;
}

static double spec_cost(const case_spec *s) {
  double pairs = 0;
  if (s->layout == SDPA_LAYOUT_THD) {
    for (int b = 0; b < s->batch; b++) pairs += (double)s->lens_q[b] * s->lens_kv[b];
  } else {
    pairs = (double)s->batch * s->seqlen_q * s->seqlen_kv;
  }
  int hdv = s->head_dim_v ? s->head_dim_v : s->head_dim;
  return pairs * s->heads_q * (4.0 * s->head_dim + 3.0 * hdv);
}

static int random_length(sdpa_ref_rng *rng) {
  int kind = sdpa_ref_rng_int(rng, 0, 19);
  if (kind < 5) { /* tile multiples */
    static const int multiples[] = {64, 128, 192, 256};
    return multiples[sdpa_ref_rng_int(rng, 0, 3)];
  }
  if (kind < 8) return sdpa_ref_rng_int(rng, 1, 8);
  return sdpa_ref_rng_int(rng, 1, 300);
}

/* One random descriptor within the reference's budget. */
static void random_spec(sdpa_ref_rng *rng, case_spec *s, sdpa_dtype *dtype) {
  static const int dims[][2] = {{32, 0}, {64, 0},  {96, 0},    {128, 0},  {192, 0},
                                {256, 0}, {192, 128}, {64, 0}, {128, 0},  {8, 0},
                                {40, 0},  {80, 0},  {112, 0},   {160, 0},  {216, 0},
                                {136, 72}, {72, 0}, {200, 120}, {48, 24}, {24, 0}};
  static const int groups[][2] = {{1, 1}, {2, 2}, {4, 4}, {2, 1}, {4, 1},
                                  {8, 2}, {8, 1}, {6, 2}, {6, 3}, {3, 1}};
  memset(s, 0, sizeof *s);
  s->name = "sweep";
  *dtype = sdpa_ref_rng_int(rng, 0, 1) ? SDPA_DTYPE_BF16 : SDPA_DTYPE_FP16;
  int d = sdpa_ref_rng_int(rng, 0, (int)(sizeof dims / sizeof dims[0]) - 1);
  s->head_dim = dims[d][0];
  s->head_dim_v = dims[d][1];
  int g = sdpa_ref_rng_int(rng, 0, (int)(sizeof groups / sizeof groups[0]) - 1);
  s->heads_q = groups[g][0];
  s->heads_kv = groups[g][1];
  s->mask = (sdpa_mask)sdpa_ref_rng_int(rng, 0, 3);
  if (s->mask == SDPA_MASK_SLIDING_WINDOW) {
    s->left = sdpa_ref_rng_int(rng, 0, 4) == 0 ? -1 : sdpa_ref_rng_int(rng, 0, 150);
    s->right = sdpa_ref_rng_int(rng, 0, 4) == 0 ? -1 : sdpa_ref_rng_int(rng, 0, 40);
  }
  s->style = (sdpa_ref_style)sdpa_ref_rng_int(rng, 0, SDPA_REF_STYLE_COUNT - 1);
  s->lse_style = (sdpa_ref_lse_style)sdpa_ref_rng_int(rng, 0, SDPA_REF_LSE_COUNT - 1);
  s->deterministic = sdpa_ref_rng_int(rng, 0, 6) == 0;
  s->scale = sdpa_ref_rng_int(rng, 0, 1) ? 0.0f : (float)(0.03 + 0.27 * sdpa_ref_rng_uniform(rng));
  if (sdpa_ref_rng_int(rng, 0, 9) < 6) {
    s->layout = SDPA_LAYOUT_BSHD;
    s->batch = sdpa_ref_rng_int(rng, 1, 4);
    s->seqlen_q = random_length(rng);
    s->seqlen_kv = sdpa_ref_rng_int(rng, 0, 1) ? s->seqlen_q : random_length(rng);
  } else {
    s->layout = SDPA_LAYOUT_THD;
    s->batch = sdpa_ref_rng_int(rng, 1, 8);
    for (int b = 0; b < s->batch; b++) {
      s->lens_q[b] = sdpa_ref_rng_int(rng, 0, 9) == 0 ? 0 : random_length(rng);
      s->lens_kv[b] = sdpa_ref_rng_int(rng, 0, 1) ? s->lens_q[b]
                      : sdpa_ref_rng_int(rng, 0, 9) == 0 ? 0 : random_length(rng);
    }
  }
  /* Shrink into the budget: heads first, then sequences, then lengths. */
  while (spec_cost(s) > CASE_BUDGET_MACS) {
    if (s->heads_q > s->heads_kv && s->heads_kv > 1 && s->heads_kv % 2 == 0) {
      s->heads_q /= 2;
      s->heads_kv /= 2;
    } else if (s->heads_q == s->heads_kv && s->heads_q > 1) {
      s->heads_q = s->heads_kv = s->heads_q / 2;
    } else if (s->batch > 1) {
      s->batch--;
    } else if (s->layout == SDPA_LAYOUT_BSHD) {
      s->seqlen_q = s->seqlen_q * 3 / 4 + 1;
      s->seqlen_kv = s->seqlen_kv * 3 / 4 + 1;
    } else {
      s->lens_q[0] = s->lens_q[0] * 3 / 4;
      s->lens_kv[0] = s->lens_kv[0] * 3 / 4;
    }
  }
  if (s->layout == SDPA_LAYOUT_THD) s->exact_totals = sdpa_ref_rng_int(rng, 0, 1);
  if (s->layout == SDPA_LAYOUT_THD && sdpa_ref_rng_int(rng, 0, 2) == 0) {
    /* max_s hints above the longest sequence */
    int longest_q = 1, longest_kv = 1;
    for (int b = 0; b < s->batch; b++) {
      if (s->lens_q[b] > longest_q) longest_q = s->lens_q[b];
      if (s->lens_kv[b] > longest_kv) longest_kv = s->lens_kv[b];
    }
    s->seqlen_q = longest_q + sdpa_ref_rng_int(rng, 0, 100);
    s->seqlen_kv = longest_kv + sdpa_ref_rng_int(rng, 0, 100);
  }
}

START_TEST(random_sweep) {
  uint64_t seed = fresh_seed();
  int count = 200;
  const char *env = getenv("SDPA_TEST_SWEEP_CASES");
  if (env && atoi(env) > 0) count = atoi(env);
  printf("sweep seed = %" PRIu64 " (SDPA_TEST_SEED=%" PRIu64 " repeats this sweep), %d cases\n",
         seed, seed, count);
  fflush(stdout);
  sdpa_ref_rng rng;
  sdpa_ref_rng_seed(&rng, seed);
  test_case *cases = calloc((size_t)count, sizeof *cases);
  ck_assert_ptr_nonnull(cases);
  for (int i = 0; i < count; i++) {
    case_spec s;
    sdpa_dtype dtype;
    random_spec(&rng, &s, &dtype);
    char label[80];
    snprintf(label, sizeof label, "sweep #%d", i);
    case_init(&cases[i], &s, dtype, sdpa_ref_rng_next(&rng), label);
  }
  prepare_batch(cases, count);
  int failures = run_batch(cases, count, "");
  for (int i = 0; i < count; i++) case_free(&cases[i]);
  free(cases);
  printf("sweep: %d of %d cases failed (seed %" PRIu64 ")\n", failures, count, seed);
  ck_assert_msg(failures == 0, "%d sweep cases failed (seed %" PRIu64 ")", failures, seed);
}
END_TEST

/* ---------------------------------------------------------- determinism */

/* Runs the compiled plan of `c` `runs` times on one upload, poisoning the
 * outputs and workspace before each run; out[r] gets each run's outputs. */
static sdpa_status run_repeatedly(test_case *c, int runs, sdpa_gpu_outcome *out) {
  sdpa_gpu_problem d;
  CUdeviceptr workspace = 0;
  size_t workspace_bytes = sdpa_bwd_workspace_size(c->plan);
  sdpa_status status = sdpa_gpu_problem_upload(&gpu, &c->p, &c->l, &d);
  for (int r = 0; r < runs; r++) memset(&out[r], 0, sizeof out[r]);
  if (status != SDPA_STATUS_SUCCESS) return status;
  if ((status = sdpa_gpu_alloc(&gpu, workspace_bytes, &workspace)) != SDPA_STATUS_SUCCESS)
    goto done;
  for (int r = 0; r < runs; r++) {
    out[r].stage = "";
    if ((status = sdpa_gpu_poison(&gpu, workspace, workspace_bytes)) != SDPA_STATUS_SUCCESS ||
        (status = sdpa_gpu_problem_poison_outputs(&gpu, &d)) != SDPA_STATUS_SUCCESS)
      goto done;
    gpu.drv->cuCtxSynchronize();
    status = sdpa_bwd_execute(c->plan, &d.tensors, (void *)(uintptr_t)workspace,
                              workspace_bytes, gpu.stream);
    if (status == SDPA_STATUS_SUCCESS) status = sdpa_bwd_sync_check(c->plan, gpu.stream);
    if (status == SDPA_STATUS_SUCCESS)
      status = sdpa_gpu_problem_download(&gpu, &c->p, &d, &out[r].grads);
    out[r].status = status;
    if (status != SDPA_STATUS_SUCCESS) {
      snprintf(out[r].message, sizeof out[r].message, "run %d: %s: %s", r,
               sdpa_status_name(status), sdpa_last_error());
      goto done;
    }
  }
done:
  sdpa_gpu_free(&gpu, workspace);
  sdpa_gpu_problem_free(&gpu, &d);
  return status;
}

static const case_spec deterministic_specs[] = {
    /* several kv tiles add into every dQ row, so an unordered sum shows */
    BSHD_CASE("det_mha", 1, 2, 2, 256, 640, 64, 0, NONE, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_gqa_8_2_causal", 1, 8, 2, 448, 448, 64, 0, TL, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_gqa_8_2_causal_hd128", 1, 8, 2, 200, 520, 128, 0, BR, 0, 0, 0, PADDED, LTOK, 1),
    THD_CASE("det_thd_gqa", 3, 4, 1, 64, 0, BR, 0, 0, 0, PACKED, LPAD, 1, LENS(300, 17, 0),
             LENS(600, 40, 5)),
    /* a left window: a query tile's first visiting kv tile is not tile 0 */
    BSHD_CASE("det_window_200_0", 1, 2, 1, 520, 520, 128, 0, WIN, 200, 0, 0, PACKED, LP, 1),
    /* head dims above 128 (the sm_90a family's wide kernel; above 192
     * with one Q / dO stage and dQ staged in two parts): 192 / 128
     * causal, 160 with GQA, 256 causal, 224 with GQA (two dQ chains),
     * 232 / 128 THD in a window */
    BSHD_CASE("det_hd192_128_causal", 1, 2, 1, 333, 333, 192, 128, BR, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_gqa_4_2_hd160", 2, 4, 2, 200, 260, 160, 0, NONE, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_hd256_causal", 1, 2, 1, 333, 333, 256, 0, BR, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_gqa_4_2_hd224", 2, 4, 2, 200, 260, 224, 0, NONE, 0, 0, 0, PACKED, LP, 1),
    THD_CASE("det_thd_hd232_128_window", 3, 2, 1, 232, 128, WIN, 100, 30, 0, PACKED, LPAD, 1,
             LENS(300, 17, 0), LENS(260, 40, 5)),
    /* the sm_90a orders of the adds: no mask with more kv tiles than
     * query tiles (the rotation's ties), causal over many tiles and a
     * window open to the right (the kv-tile order) */
    BSHD_CASE("det_short_q_long_kv", 1, 2, 2, 130, 900, 128, 0, NONE, 0, 0, 0, PACKED, LP, 1),
    /* at most half as many kv tiles as query tiles: the rotation's
     * stride, exact (GQA) and with a wrap that breaks the steps' order */
    BSHD_CASE("det_rotation_stride_2", 1, 4, 2, 384, 384, 96, 0, NONE, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_rotation_stride_wrap", 1, 2, 2, 1100, 300, 128, 0, NONE, 0, 0, 0, PACKED, LP,
              1),
    BSHD_CASE("det_causal_tl_hd128", 1, 2, 2, 700, 700, 128, 0, TL, 0, 0, 0, PACKED, LP, 1),
    BSHD_CASE("det_window_64_open", 1, 2, 1, 400, 400, 128, 0, WIN, 64, -1, 0, PACKED, LP, 1),
    /* no mask, more kv tiles than an H200 has SMs (132 at 128 keys): the
     * rotation's condition fails and the adds go in index order */
    BSHD_CASE("det_long_kv", 1, 1, 1, 70, 17000, 64, 0, NONE, 0, 0, 0, PACKED, LP, 1),
};

/* Masked deterministic problems of many (sequence, kv head) pairs, run
 * as they plan and in launch groups of 5 pairs, the last one smaller
 * (deterministic_sm90a_launch_groups): the sm_90a family adds each
 * query tile's dQ in descending kv-tile order and launches a group's
 * lightest kv tiles first, so no block may be missed or wait for one
 * launched after it. */
static const case_spec many_pairs_specs[] = {
    BSHD_CASE("det_many_pairs_causal", 2, 24, 24, 300, 300, 128, 0, TL, 0, 0, 0, PACKED, LP, 1),
    THD_CASE("det_many_pairs_thd", 3, 16, 16, 64, 0, BR, 0, 0, 0, PACKED, LPAD, 1,
             LENS(300, 17, 200), LENS(280, 40, 384)),
    BSHD_CASE("det_many_pairs_window", 1, 48, 48, 380, 380, 64, 0, WIN, 100, 30, 0, PACKED, LP,
              1),
};

/* Every case of `specs`, three runs each with the run's plan options:
 * each run correct, the runs bitwise equal. Returns the failures. */
static int deterministic_cases_of(const case_spec *specs, int count) {
  test_case *cases = calloc((size_t)count * 2, sizeof *cases);
  for (int i = 0; i < count; i++) {
    char label[80];
    snprintf(label, sizeof label, "deterministic %s", specs[i].name);
    case_init(&cases[i], &specs[i], i % 2 ? SDPA_DTYPE_FP16 : SDPA_DTYPE_BF16,
              0xde7e0000u + (uint64_t)i, label);
  }
  prepare_batch(cases, count);
  int failures = 0;
  enum { RUNS = 3 };
  for (int i = 0; i < count; i++) {
    test_case *c = &cases[i];
    sdpa_gpu_outcome out[RUNS];
    memset(out, 0, sizeof out);
    if (c->status != SDPA_STATUS_SUCCESS) {
      out[0].status = c->status;
      snprintf(out[0].message, sizeof out[0].message, "%s", c->message);
      failures += !check_outcome(c, &out[0], "");
      continue;
    }
    run_repeatedly(c, RUNS, out);
    int ok = 1;
    for (int r = 0; r < RUNS && ok; r++) ok = check_outcome(c, &out[r], "");
    for (int r = 1; r < RUNS && ok; r++)
      for (int b = 0; b < c->l.buffer_count; b++) {
        if (!c->l.buffer_is_output[b]) continue;
        size_t differ = 0;
        for (size_t e = 0; e < out[0].grads.raw_elements[b]; e++)
          differ += out[0].grads.raw[b][e] != out[r].grads.raw[b][e];
        if (differ) {
          printf("FAIL %s: run %d differs from run 0 in %zu elements of output buffer %d\n",
                 c->label, r, differ, b);
          ok = 0;
        }
      }
    failures += !ok;
    for (int r = 0; r < RUNS; r++) sdpa_gpu_outcome_free(&out[r]);
  }
  for (int i = 0; i < count; i++) case_free(&cases[i]);
  free(cases);
  return failures;
}

#define SPECS(a) (a), (int)(sizeof(a) / sizeof((a)[0]))
static int deterministic_cases(void) {
  return deterministic_cases_of(SPECS(deterministic_specs)) +
         deterministic_cases_of(SPECS(many_pairs_specs));
}

START_TEST(deterministic_is_bitwise) {
  const int failures = deterministic_cases();
  ck_assert_msg(failures == 0, "%d deterministic cases failed", failures);
}
END_TEST

/* The same with the sm_90a family forced (AUTO keeps deterministic plans
 * on mma.sync until they are validated: this is where they are). */
START_TEST(deterministic_sm90a_is_bitwise) {
  if (gpu.arch != 90) {
    printf("deterministic_sm90a_is_bitwise: skipped: sm_%d (the family needs sm_90)\n", gpu.arch);
    return;
  }
  const sdpa_bwd_plan_options saved = test_options;
  test_options.family = SDPA_FAMILY_HOPPER;
  const int failures = deterministic_cases();
  test_options = saved;
  ck_assert_msg(failures == 0, "%d deterministic sm_90a cases failed", failures);
}
END_TEST

/* The many-pairs problems on the sm_90a family in launch groups of 5
 * pairs (the default groups hold more pairs than they have). */
START_TEST(deterministic_sm90a_launch_groups) {
  if (gpu.arch != 90) {
    printf("deterministic_sm90a_launch_groups: skipped: sm_%d (the family needs sm_90)\n",
           gpu.arch);
    return;
  }
  const sdpa_bwd_plan_options saved = test_options;
  test_options.family = SDPA_FAMILY_HOPPER;
  test_options.order_group = 5;
  const int failures = deterministic_cases_of(SPECS(many_pairs_specs));
  test_options = saved;
  ck_assert_msg(failures == 0, "%d deterministic sm_90a launch-group cases failed", failures);
}
END_TEST

/* ------------------------------------------------------------------- THD */

/* Descriptors that differ only in batch, max_s hints and token totals
 * share one key: after the first, compile finds the kernel in memory. */
START_TEST(thd_one_key_many_totals) {
  static const case_spec specs[] = {
      THD_EXACT("thd_key_1", 1, 4, 2, 128, 0, BR, 0, 0, 0, PACKED, LP, 0, LENS(200), LENS(200)),
      THD_EXACT("thd_key_2", 3, 4, 2, 128, 0, BR, 0, 0, 0, PACKED, LP, 0, LENS(17, 64, 130),
               LENS(17, 80, 100)),
      THD_EXACT("thd_key_3", 5, 4, 2, 128, 0, BR, 0, 0, 0, PACKED, LP, 0, LENS(0, 33, 1, 128, 77),
               LENS(5, 33, 1, 128, 90)),
      THD_EXACT("thd_key_4", 2, 4, 2, 128, 0, BR, 0, 0, 0, PACKED, LP, 0, LENS(255, 3),
               LENS(255, 300)),
      THD_EXACT("thd_key_5", 8, 4, 2, 128, 0, BR, 0, 0, 0, PACKED, LP, 0,
               LENS(60, 1, 59, 7, 0, 33, 48, 12), LENS(60, 9, 40, 7, 2, 33, 50, 12)),
      THD_EXACT("thd_key_6", 4, 4, 2, 128, 0, BR, 0, 0, 0, PACKED, LP, 0, LENS(64, 64, 64, 64),
               LENS(64, 64, 64, 64)),
  };
  int count = (int)(sizeof specs / sizeof specs[0]);
  test_case *cases = calloc((size_t)count, sizeof *cases);
  for (int i = 0; i < count; i++)
    case_init(&cases[i], &specs[i], SDPA_DTYPE_BF16, 0x7d000000u + (uint64_t)i, specs[i].name);
  for (int i = 0; i < count; i++) case_prepare(&cases[i]);
  int failures = 0;
  char first_hash[33] = "";
  for (int i = 0; i < count; i++) {
    test_case *c = &cases[i];
    ck_assert(c->ready);
    sdpa_status st = sdpa_bwd_plan_create_with(&c->plan, runtime, &c->desc, &test_options);
    ck_assert_msg(st == SDPA_STATUS_SUCCESS, "%s: plan: %s: %s", c->label, sdpa_status_name(st),
                  sdpa_last_error());
    const char *hash = sdpa_bwd_plan_key_hash(c->plan);
    if (i == 0) snprintf(first_hash, sizeof first_hash, "%s", hash);
    ck_assert_msg(strcmp(hash, first_hash) == 0, "%s: key %s differs from the first (%s)",
                  c->label, sdpa_bwd_plan_key(c->plan), first_hash);
    sdpa_source source = SDPA_SOURCE_NONE;
    st = sdpa_bwd_compile(c->plan, &source);
    ck_assert_msg(st == SDPA_STATUS_SUCCESS, "%s: compile: %s: %s", c->label,
                  sdpa_status_name(st), sdpa_last_error());
    if (i > 0)
      ck_assert_msg(source == SDPA_SOURCE_MEMORY, "%s: compiled again (source %d)", c->label,
                    (int)source);
    sdpa_gpu_outcome o;
    sdpa_gpu_execute_problem(&gpu, c->plan, &c->p, &c->l, &o);
    failures += !check_outcome(c, &o, "");
    sdpa_gpu_outcome_free(&o);
  }
  for (int i = 0; i < count; i++) case_free(&cases[i]);
  free(cases);
  ck_assert_msg(failures == 0, "%d THD cases failed", failures);
}
END_TEST

/* A plan for `desc`, compiled (asserts both steps). */
static sdpa_bwd_plan *planned_and_compiled(const sdpa_bwd_desc *desc) {
  sdpa_bwd_plan *plan = NULL;
  sdpa_status st = sdpa_bwd_plan_create_with(&plan, runtime, desc, &test_options);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan: %s", sdpa_last_error());
  st = sdpa_bwd_compile(plan, NULL);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "compile: %s", sdpa_last_error());
  return plan;
}

/* A THD batch of no tokens comes with NULL data pointers (empty
 * framework tensors): execute succeeds and does nothing. Keys with no
 * queries at all (total_q 0, the query-side tensors NULL) get dK = dV = 0
 * in their poisoned buffers. Both families of the arch (hd 64, hd 80). */
START_TEST(thd_no_tokens_takes_null_tensors) {
  static const int dims[] = {64, 80};
  for (int di = 0; di < 2; di++) {
    const int hd = dims[di], heads = 2, batch = 3;
    sdpa_bwd_desc desc = SDPA_BWD_DESC_INIT;
    desc.dtype = SDPA_DTYPE_BF16;
    desc.layout = SDPA_LAYOUT_THD;
    desc.batch = batch;
    desc.heads_q = desc.heads_kv = heads;
    desc.seqlen_q = desc.seqlen_kv = 64;
    desc.head_dim = hd;
    desc.max_total_q = desc.max_total_kv = 256;
    sdpa_bwd_plan *plan = planned_and_compiled(&desc);
    const size_t ws_bytes = sdpa_bwd_workspace_size(plan);
    CUdeviceptr ws = 0, cu_q = 0, cu_kv = 0, k = 0, v = 0, dk = 0, dv = 0;
    const int zeros[4] = {0, 0, 0, 0}, kv_offsets[4] = {0, 5, 5, 12};
    const int64_t total_kv = 12;
    const size_t kv_bytes = (size_t)total_kv * heads * hd * 2;
    ck_assert_int_eq(sdpa_gpu_alloc(&gpu, ws_bytes, &ws), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_alloc(&gpu, sizeof zeros, &cu_q), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_alloc(&gpu, sizeof kv_offsets, &cu_kv), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_upload(&gpu, cu_q, zeros, sizeof zeros), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_upload(&gpu, cu_kv, zeros, sizeof zeros), SDPA_STATUS_SUCCESS);

    sdpa_bwd_tensors t = SDPA_BWD_TENSORS_INIT; /* every tensor NULL */
    t.cu_seqlens_q = (const int32_t *)(uintptr_t)cu_q;
    t.cu_seqlens_kv = (const int32_t *)(uintptr_t)cu_kv;
    sdpa_status st = sdpa_bwd_execute(plan, &t, (void *)(uintptr_t)ws, ws_bytes, gpu.stream);
    ck_assert_msg(st == SDPA_STATUS_SUCCESS, "hd %d, no tokens: %s", hd, sdpa_last_error());
    ck_assert_int_eq(sdpa_bwd_sync_check(plan, gpu.stream), SDPA_STATUS_SUCCESS);

    /* keys, no queries */
    unsigned short *host = malloc(kv_bytes);
    ck_assert_ptr_nonnull(host);
    for (size_t i = 0; i < kv_bytes / 2; i++) host[i] = 0x3f80; /* bf16 1.0 */
    ck_assert_int_eq(sdpa_gpu_alloc(&gpu, kv_bytes, &k), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_alloc(&gpu, kv_bytes, &v), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_alloc(&gpu, kv_bytes, &dk), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_alloc(&gpu, kv_bytes, &dv), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_upload(&gpu, k, host, kv_bytes), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_upload(&gpu, v, host, kv_bytes), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_poison(&gpu, dk, kv_bytes), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_poison(&gpu, dv, kv_bytes), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_gpu_upload(&gpu, cu_kv, kv_offsets, sizeof kv_offsets),
                     SDPA_STATUS_SUCCESS);
    t.k = (const void *)(uintptr_t)k;
    t.v = (const void *)(uintptr_t)v;
    t.dk = (void *)(uintptr_t)dk;
    t.dv = (void *)(uintptr_t)dv;
    t.total_kv = total_kv;
    st = sdpa_bwd_execute(plan, &t, (void *)(uintptr_t)ws, ws_bytes, gpu.stream);
    ck_assert_msg(st == SDPA_STATUS_SUCCESS, "hd %d, keys only: %s", hd, sdpa_last_error());
    ck_assert_int_eq(sdpa_bwd_sync_check(plan, gpu.stream), SDPA_STATUS_SUCCESS);
    for (int which = 0; which < 2; which++) {
      ck_assert_int_eq(sdpa_gpu_download(&gpu, host, which ? dv : dk, kv_bytes),
                       SDPA_STATUS_SUCCESS);
      size_t nonzero = 0;
      for (size_t i = 0; i < kv_bytes / 2; i++) nonzero += (host[i] & 0x7fff) != 0;
      ck_assert_msg(nonzero == 0, "hd %d, keys only: %zu elements of %s are not 0", hd,
                    nonzero, which ? "dV" : "dK");
    }
    printf("thd no tokens, hd %d (%s): NULL tensors accepted, dK = dV = 0 without queries\n",
           hd, plan->fields.family == SDPA_FAMILY_HOPPER ? "hopper" : "mma");
    free(host);
    sdpa_gpu_free(&gpu, ws);
    sdpa_gpu_free(&gpu, cu_q);
    sdpa_gpu_free(&gpu, cu_kv);
    sdpa_gpu_free(&gpu, k);
    sdpa_gpu_free(&gpu, v);
    sdpa_gpu_free(&gpu, dk);
    sdpa_gpu_free(&gpu, dv);
    sdpa_bwd_plan_destroy(plan);
  }
}
END_TEST

/* One plan (max_s 256, room for 1024 tokens, 4 sequences) runs many
 * different cu_seqlens and totals. */
START_TEST(thd_one_plan_many_offsets) {
  static const int lens[][2][4] = {
      {{256, 256, 256, 256}, {256, 256, 256, 256}},
      {{1, 0, 0, 0}, {0, 0, 0, 1}},
      {{100, 3, 250, 17}, {120, 3, 200, 40}},
      {{0, 256, 0, 131}, {9, 256, 0, 131}},
      {{64, 128, 192, 255}, {255, 192, 128, 64}},
      {{7, 7, 7, 7}, {7, 7, 7, 7}},
  };
  int count = (int)(sizeof lens / sizeof lens[0]);
  sdpa_bwd_plan *plan = NULL;
  int failures = 0;
  for (int i = 0; i < count; i++) {
    case_spec s = THD_CASE("thd_one_plan", 4, 4, 2, 64, 0, TL, 0, 0, 0, PACKED, LTOK, 0, {0}, {0});
    memcpy(s.lens_q, lens[i][0], sizeof lens[i][0]);
    memcpy(s.lens_kv, lens[i][1], sizeof lens[i][1]);
    s.seqlen_q = s.seqlen_kv = 256;
    test_case c;
    char label[80];
    snprintf(label, sizeof label, "thd one plan, offsets #%d", i);
    case_init(&c, &s, SDPA_DTYPE_FP16, 0x0ff5e700u + (uint64_t)i, label);
    case_prepare(&c);
    ck_assert(c.ready);
    c.desc.max_total_q = c.desc.max_total_kv = 1024;
    if (!plan) plan = planned_and_compiled(&c.desc);
    sdpa_gpu_outcome o;
    sdpa_gpu_execute_problem(&gpu, plan, &c.p, &c.l, &o);
    failures += !check_outcome(&c, &o, "");
    sdpa_gpu_outcome_free(&o);
    case_free(&c);
  }
  sdpa_bwd_plan_destroy(plan);
  ck_assert_msg(failures == 0, "%d offset sets failed", failures);
}
END_TEST

/* ---------------------------------------------------------- launch paths */

/* One compiled plan executed many times with fresh data (new pointers, so
 * each graph launch follows an update): twice on the tests' stream (the
 * first call goes kernel by kernel, the second makes the stream's graph),
 * twice on each of four more streams (three get graphs of their own; the
 * fourth, past the plan's four streams, goes kernel by kernel), once
 * recorded by stream capture (the library must launch kernels for the
 * capture to record) and back on the first stream; then a plan made with
 * SDPA_JIT_GRAPHS=0. Every run is checked against the reference; the plan
 * must hold exactly four graphs when the driver has them, none without. */
static int launch_paths_case(const case_spec *spec, uint64_t seed0) {
  enum { EXTRA_STREAMS = 4 };
  CUstream streams[EXTRA_STREAMS] = {0};
  const sdpa_driver *drv = gpu.drv;
  for (int i = 0; i < EXTRA_STREAMS; i++)
    ck_assert_int_eq(drv->cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  struct {
    CUstream stream;
    int capture;
    const char *what;
  } runs[] = {
      {gpu.stream, 0, "first stream"},       {gpu.stream, 0, "first stream, graph"},
      {streams[0], 0, "second stream"},      {streams[0], 0, "second stream, graph"},
      {streams[1], 0, "third stream"},       {streams[1], 0, "third stream, graph"},
      {streams[2], 0, "fourth stream"},      {streams[2], 0, "fourth stream, graph"},
      {streams[3], 0, "fifth stream"},       {streams[3], 0, "fifth stream again"},
      {streams[0], 1, "captured"},           {gpu.stream, 0, "first stream again"},
  };
  const int count = (int)(sizeof runs / sizeof runs[0]);
  int failures = 0;
  sdpa_bwd_plan *plan = NULL;
  for (int graphs = 1; graphs >= 0; graphs--) {
    if (!graphs) test_options.graphs = SDPA_SWITCH_OFF;
    for (int i = 0; i < (graphs ? count : 1); i++) {
      test_case c;
      char label[sizeof c.label];
      snprintf(label, sizeof label, "%s: %s", spec->name,
               graphs ? runs[i].what : "options.graphs off");
      case_init(&c, spec, SDPA_DTYPE_BF16, seed0 + (uint64_t)i + (graphs ? 0 : 100), label);
      case_prepare(&c);
      ck_assert(c.ready);
      if (!plan) plan = planned_and_compiled(&c.desc);
      sdpa_gpu_outcome o;
      const CUstream stream = graphs ? runs[i].stream : gpu.stream;
      sdpa_gpu_execute_problem_on(&gpu, plan, &c.p, &c.l, stream, graphs && runs[i].capture, &o);
      failures += !check_outcome(&c, &o, "");
      sdpa_gpu_outcome_free(&o);
      case_free(&c);
    }
    const int expected = graphs && drv->has_graphs ? SDPA_LAUNCH_GRAPHS : 0;
    const int made = sdpa_launch_graphs_made(&plan->graphs);
    ck_assert_msg(made == expected, "%s: the plan holds %d launch graphs, not %d", spec->name,
                  made, expected);
    sdpa_bwd_plan_destroy(plan);
    plan = NULL;
  }
  test_options.graphs = SDPA_SWITCH_DEFAULT;
  for (int i = 0; i < EXTRA_STREAMS; i++) drv->cuStreamDestroy(streams[i]);
  return failures;
}

START_TEST(launch_paths) {
  static const case_spec specs[] = {
      BSHD_CASE("launch_bshd", 2, 4, 2, 200, 200, 64, 0, TL, 0, 0, 0, PACKED, LP, 0),
      THD_CASE("launch_thd", 3, 4, 4, 128, 0, BR, 0, 0, 0, PACKED, LP, 0, LENS(100, 7, 64),
               LENS(90, 40, 64)),
  };
  int failures = 0;
  for (int i = 0; i < 2; i++) failures += launch_paths_case(&specs[i], 0x1a0c0000u + 1000u * (uint64_t)i);
  ck_assert_msg(failures == 0, "%d runs failed (see above)", failures);
}
END_TEST

/* Threads executing one plan at once, each on a stream of its own with
 * data of its own, several calls each (more threads than a plan has
 * graphs; a thread that finds the plan's graphs held by another launches
 * kernel by kernel): every call's result checked. */
enum { EXEC_THREADS = 6, EXEC_THREAD_CALLS = 5 };

typedef struct execute_job {
  test_case *c;
  sdpa_bwd_plan *plan;
  int failures;
} execute_job;

static void *execute_worker(void *arg) {
  execute_job *job = arg;
  const sdpa_driver *drv = gpu.drv;
  CUstream stream = NULL;
  if (drv->cuCtxSetCurrent(gpu.ctx) != CUDA_SUCCESS ||
      drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    printf("FAIL [threads] %s: no stream\n", job->c->label);
    job->failures = EXEC_THREAD_CALLS;
    return NULL;
  }
  for (int i = 0; i < EXEC_THREAD_CALLS; i++) {
    sdpa_gpu_outcome o;
    sdpa_gpu_execute_problem_on(&gpu, job->plan, &job->c->p, &job->c->l, stream, 0, &o);
    job->failures += !check_outcome_as(job->c, &o, "[threads] ", 0);
    sdpa_gpu_outcome_free(&o);
  }
  drv->cuStreamDestroy(stream);
  return NULL;
}

START_TEST(execute_from_threads) {
  static const case_spec spec =
      BSHD_CASE("threads", 2, 4, 2, 160, 160, 64, 0, BR, 0, 0, 0, PACKED, LP, 0);
  test_case cases[EXEC_THREADS];
  execute_job jobs[EXEC_THREADS];
  pthread_t threads[EXEC_THREADS];
  for (int i = 0; i < EXEC_THREADS; i++) {
    char label[32];
    snprintf(label, sizeof label, "threads #%d", i);
    case_init(&cases[i], &spec, SDPA_DTYPE_BF16, 0x7e4d0000u + (uint64_t)i, label);
    case_prepare(&cases[i]);
    ck_assert(cases[i].ready);
  }
  sdpa_bwd_plan *plan = planned_and_compiled(&cases[0].desc);
  for (int i = 0; i < EXEC_THREADS; i++) {
    jobs[i] = (execute_job){&cases[i], plan, 0};
    ck_assert_int_eq(pthread_create(&threads[i], NULL, execute_worker, &jobs[i]), 0);
  }
  int failures = 0;
  for (int i = 0; i < EXEC_THREADS; i++) {
    pthread_join(threads[i], NULL);
    failures += jobs[i].failures;
  }
  printf("execute from %d threads: %d graphs made, %d of %d calls failed\n", EXEC_THREADS,
         sdpa_launch_graphs_made(&plan->graphs), failures, EXEC_THREADS * EXEC_THREAD_CALLS);
  sdpa_bwd_plan_destroy(plan);
  for (int i = 0; i < EXEC_THREADS; i++) case_free(&cases[i]);
  ck_assert_msg(failures == 0, "%d calls failed (see above)", failures);
}
END_TEST

/* A THD sequence longer than the plan's max_s hint: the launch reports
 * SDPA_STATUS_DEVICE_ERROR (from execute or sync_check), and the next good
 * call on the same plan works. */
START_TEST(thd_overlong_sequence_is_reported) {
  static const int bad[][2][2] = {{{100, 20}, {50, 20}}, {{20, 20}, {20, 100}}};
  case_spec good_spec =
      THD_CASE("thd_overlong", 2, 2, 2, 64, 0, NONE, 0, 0, 0, PACKED, LTOK, 0, LENS(64, 30), LENS(64, 50));
  good_spec.seqlen_q = good_spec.seqlen_kv = 64; /* max_s hints */
  test_case good;
  case_init(&good, &good_spec, SDPA_DTYPE_BF16, 77, "thd good after overlong");
  case_prepare(&good);
  ck_assert(good.ready);
  ck_assert_int_eq(good.desc.seqlen_q, 64);
  sdpa_bwd_plan *plan = NULL;
  sdpa_status st = sdpa_bwd_plan_create_with(&plan, runtime, &good.desc, &test_options); /* max totals: 128 */
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan: %s", sdpa_last_error());
  st = sdpa_bwd_compile(plan, NULL);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "compile: %s", sdpa_last_error());
  for (int k = 0; k < 2; k++) {
    case_spec s = good_spec;
    memcpy(s.lens_q, bad[k][0], sizeof bad[k][0]);
    memcpy(s.lens_kv, bad[k][1], sizeof bad[k][1]);
    test_case c;
    case_init(&c, &s, SDPA_DTYPE_BF16, 78 + (uint64_t)k, "thd overlong");
    case_prepare(&c);
    ck_assert(c.ready);
    ck_assert_int_le(c.p.rows_q, 128); /* the totals fit; only a length is bad */
    ck_assert_int_le(c.p.rows_kv, 128);
    sdpa_gpu_outcome o;
    sdpa_gpu_execute_problem(&gpu, plan, &c.p, &c.l, &o);
    ck_assert_msg(o.status == SDPA_STATUS_DEVICE_ERROR,
                  "overlong %s sequence: got %s at '%s' (%s), want SDPA_STATUS_DEVICE_ERROR",
                  k == 0 ? "query" : "key", sdpa_status_name(o.status), o.stage, o.message);
    ck_assert_msg(strlen(o.message) > strlen("sync_check: SDPA_STATUS_DEVICE_ERROR: "),
                  "no message: %s", o.message);
    printf("overlong %s sequence reported: %s\n", k == 0 ? "query" : "key", o.message);
    sdpa_gpu_outcome_free(&o);
    case_free(&c);
    /* the flag was cleared: a good call succeeds and is right */
    sdpa_gpu_execute_problem(&gpu, plan, &good.p, &good.l, &o);
    ck_assert_msg(check_outcome(&good, &o, "after overlong: "), "good call after overlong failed");
    sdpa_gpu_outcome_free(&o);
  }
  sdpa_bwd_plan_destroy(plan);
  case_free(&good);
}
END_TEST

/* ------------------------------------------------------- execute rejects */

/* Whether message names `field` as a whole word (case-insensitive). */
static int names_field(const char *message, const char *field) {
  size_t n = strlen(field);
  for (const char *at = message; (at = strcasestr(at, field)) != NULL; at++) {
    int before = at == message || !(isalnum((unsigned char)at[-1]) || at[-1] == '_');
    int after = !(isalnum((unsigned char)at[n]) || at[n] == '_');
    if (before && after) return 1;
  }
  return 0;
}

static const char *pointer_names[] = {"q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv"};

static uintptr_t get_pointer(const sdpa_bwd_tensors *t, int which) {
  switch (which) {
  case 0: return (uintptr_t)t->q;
  case 1: return (uintptr_t)t->k;
  case 2: return (uintptr_t)t->v;
  case 3: return (uintptr_t)t->o;
  case 4: return (uintptr_t)t->dout;
  case 5: return (uintptr_t)t->lse;
  case 6: return (uintptr_t)t->dq;
  case 7: return (uintptr_t)t->dk;
  default: return (uintptr_t)t->dv;
  }
}

static void set_pointer(sdpa_bwd_tensors *t, int which, uintptr_t value) {
  switch (which) {
  case 0: t->q = (const void *)value; break;
  case 1: t->k = (const void *)value; break;
  case 2: t->v = (const void *)value; break;
  case 3: t->o = (const void *)value; break;
  case 4: t->dout = (const void *)value; break;
  case 5: t->lse = (const float *)value; break;
  case 6: t->dq = (void *)value; break;
  case 7: t->dk = (void *)value; break;
  default: t->dv = (void *)value; break;
  }
}

static void expect_reject(sdpa_bwd_plan *plan, const sdpa_bwd_tensors *t, CUdeviceptr ws,
                          size_t ws_bytes, const char *field, int whole_word, const char *what) {
  sdpa_status st = sdpa_bwd_execute(plan, t, (void *)(uintptr_t)ws, ws_bytes, gpu.stream);
  const char *message = sdpa_last_error();
  ck_assert_msg(st == SDPA_STATUS_INVALID_ARGUMENT, "%s: got %s (%s), want INVALID_ARGUMENT", what,
                sdpa_status_name(st), message);
  int named = whole_word ? names_field(message, field) : strcasestr(message, field) != NULL;
  ck_assert_msg(named, "%s: the message does not name '%s': \"%s\"", what, field, message);
}

START_TEST(execute_rejects_bad_arguments) {
  case_spec s = BSHD_CASE("rejects", 1, 2, 2, 64, 64, 64, 0, NONE, 0, 0, 0, PACKED, LP, 0);
  test_case c;
  case_init(&c, &s, SDPA_DTYPE_BF16, 99, "rejects");
  case_prepare(&c);
  ck_assert(c.ready);
  sdpa_status st = sdpa_bwd_plan_create_with(&c.plan, runtime, &c.desc, &test_options);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan: %s", sdpa_last_error());
  size_t ws_bytes = sdpa_bwd_workspace_size(c.plan);
  ck_assert_uint_gt(ws_bytes, 0);
  CUdeviceptr ws = 0;
  ck_assert_int_eq(sdpa_gpu_alloc(&gpu, ws_bytes, &ws), SDPA_STATUS_SUCCESS);
  sdpa_gpu_problem d;
  ck_assert_int_eq(sdpa_gpu_problem_upload(&gpu, &c.p, &c.l, &d), SDPA_STATUS_SUCCESS);

  /* before compile */
  st = sdpa_bwd_execute(c.plan, &d.tensors, (void *)(uintptr_t)ws, ws_bytes, gpu.stream);
  ck_assert_msg(st == SDPA_STATUS_NOT_COMPILED, "execute before compile: %s",
                sdpa_status_name(st));
  st = sdpa_bwd_compile(c.plan, NULL);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "compile: %s", sdpa_last_error());

  for (int i = 0; i < 9; i++) {
    sdpa_bwd_tensors t = d.tensors;
    char what[64];
    snprintf(what, sizeof what, "NULL %s", pointer_names[i]);
    set_pointer(&t, i, 0);
    expect_reject(c.plan, &t, ws, ws_bytes, pointer_names[i], 1, what);
    t = d.tensors;
    snprintf(what, sizeof what, "odd address of %s", pointer_names[i]);
    set_pointer(&t, i, get_pointer(&d.tensors, i) + 1);
    expect_reject(c.plan, &t, ws, ws_bytes, pointer_names[i], 1, what);
    if (i == 5) continue; /* LSE is fp32: execute takes any 4-byte aligned address */
    t = d.tensors;
    snprintf(what, sizeof what, "%s 8-byte aligned only", pointer_names[i]);
    set_pointer(&t, i, get_pointer(&d.tensors, i) + 8);
    expect_reject(c.plan, &t, ws, ws_bytes, pointer_names[i], 1, what);
  }
  expect_reject(c.plan, &d.tensors, ws, ws_bytes - 1, "workspace", 0, "workspace too small");
  expect_reject(c.plan, &d.tensors, 0, ws_bytes, "workspace", 0, "NULL workspace");
  st = sdpa_bwd_execute(c.plan, NULL, (void *)(uintptr_t)ws, ws_bytes, gpu.stream);
  ck_assert_int_eq(st, SDPA_STATUS_INVALID_ARGUMENT);
  st = sdpa_bwd_execute(NULL, &d.tensors, (void *)(uintptr_t)ws, ws_bytes, gpu.stream);
  ck_assert_int_eq(st, SDPA_STATUS_INVALID_ARGUMENT);
  sdpa_bwd_tensors versioned = d.tensors;
  versioned.version = 9999;
  expect_reject(c.plan, &versioned, ws, ws_bytes, "version", 0, "unknown tensors version");
  sdpa_gpu_problem_free(&gpu, &d);
  sdpa_gpu_free(&gpu, ws);

  /* the rejects left the plan usable */
  sdpa_gpu_outcome o;
  sdpa_gpu_execute_problem(&gpu, c.plan, &c.p, &c.l, &o);
  ck_assert(check_outcome(&c, &o, "after rejects: "));
  sdpa_gpu_outcome_free(&o);
  case_free(&c);

  /* THD: totals past the descriptor's bounds, missing offsets */
  case_spec ts = THD_CASE("rejects_thd", 2, 2, 2, 64, 0, NONE, 0, 0, 0, PACKED, LTOK, 0,
                          LENS(30, 40), LENS(50, 20));
  case_init(&c, &ts, SDPA_DTYPE_FP16, 100, "rejects thd");
  case_prepare(&c);
  ck_assert(c.ready);
  c.desc.max_total_q = 70;
  c.desc.max_total_kv = 70;
  st = sdpa_bwd_plan_create_with(&c.plan, runtime, &c.desc, &test_options);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan: %s", sdpa_last_error());
  st = sdpa_bwd_compile(c.plan, NULL);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "compile: %s", sdpa_last_error());
  ws_bytes = sdpa_bwd_workspace_size(c.plan);
  ck_assert_int_eq(sdpa_gpu_alloc(&gpu, ws_bytes, &ws), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_gpu_problem_upload(&gpu, &c.p, &c.l, &d), SDPA_STATUS_SUCCESS);
  sdpa_bwd_tensors t = d.tensors;
  t.total_q = 71;
  expect_reject(c.plan, &t, ws, ws_bytes, "total_q", 1, "total_q > max_total_q");
  t = d.tensors;
  t.total_kv = 71;
  expect_reject(c.plan, &t, ws, ws_bytes, "total_kv", 1, "total_kv > max_total_kv");
  t = d.tensors;
  t.cu_seqlens_q = NULL;
  expect_reject(c.plan, &t, ws, ws_bytes, "cu_seqlens_q", 1, "NULL cu_seqlens_q");
  t = d.tensors;
  t.cu_seqlens_kv = NULL;
  expect_reject(c.plan, &t, ws, ws_bytes, "cu_seqlens_kv", 1, "NULL cu_seqlens_kv");
  sdpa_gpu_problem_free(&gpu, &d);
  sdpa_gpu_free(&gpu, ws);
  sdpa_gpu_execute_problem(&gpu, c.plan, &c.p, &c.l, &o);
  ck_assert(check_outcome(&c, &o, "thd after rejects: "));
  sdpa_gpu_outcome_free(&o);
  case_free(&c);
}
END_TEST

/* ------------------------------------------------------------------- main */

static Suite *gpu_suite(void) {
  Suite *s = suite_create("gpu_bwd");
  TCase *api = tcase_create("api");
  tcase_add_test(api, execute_rejects_bad_arguments);
  tcase_add_test(api, thd_overlong_sequence_is_reported);
  tcase_add_test(api, thd_one_key_many_totals);
  tcase_add_test(api, thd_one_plan_many_offsets);
  tcase_add_test(api, thd_no_tokens_takes_null_tensors);
  tcase_add_test(api, launch_paths);
  tcase_add_test(api, execute_from_threads);
  suite_add_tcase(s, api);
  TCase *numerics = tcase_create("numerics");
  tcase_add_test(numerics, matrix);
  tcase_add_test(numerics, matrix_main_kernel);
  tcase_add_test(numerics, matrix_main_kernel_sm90a);
  tcase_add_test(numerics, matrix_direct_launches);
  tcase_add_test(numerics, matrix_table_tiles);
  tcase_add_test(numerics, matrix_launch_groups);
  tcase_add_test(numerics, matrix_split_heads);
  tcase_add_test(numerics, tail_split_sm90a);
  tcase_add_test(numerics, longest_first_sm90a);
  tcase_add_test(numerics, random_sweep);
  suite_add_tcase(s, numerics);
  /* its own case: CK_RUN_CASE=deterministic runs it alone (sanitizers) */
  TCase *det = tcase_create("deterministic");
  tcase_add_test(det, deterministic_is_bitwise);
  tcase_add_test(det, deterministic_sm90a_is_bitwise);
  tcase_add_test(det, deterministic_sm90a_launch_groups);
  suite_add_tcase(s, det);
  return s;
}

int main(void) {
  sdpa_gpu_require(&gpu);
  /* CUDA is initialized in this process: a forked child could not use it. */
  setenv("CK_FORK", "no", 1);

  char *temp_dir = NULL;
  char *cache_path = NULL;
  sdpa_runtime_options opts;
  sdpa_runtime_options_init(&opts, SDPA_RUNTIME_OPTIONS_VERSION);
  const char *env_cache = getenv("SDPA_JIT_CACHE");
  if (!env_cache || !*env_cache) {
    temp_dir = sdpa_test_tmpdir("gpu-bwd");
    if (!temp_dir || asprintf(&cache_path, "%s/kernels.sqlite", temp_dir) < 0) {
      fprintf(stderr, "cannot make a temporary cache directory\n");
      return 1;
    }
    opts.cache_path = cache_path;
  }
  test_options = options_init();
  sdpa_status st = sdpa_runtime_create(&runtime, &opts);
  if (st != SDPA_STATUS_SUCCESS) {
    printf("sdpa_runtime_create: %s: %s\n", sdpa_status_name(st), sdpa_last_error());
    sdpa_test_rmtree(temp_dir);
    return 1;
  }
  const char *used = sdpa_runtime_cache_path(runtime);
  printf("device: %s (sm_%d, %d SMs); cache: %s; %d CPUs\n", gpu.name, gpu.arch, gpu.sm_count,
         used ? used : "(memory)", sdpa_ref_cpu_count());
  fflush(stdout);

  int rc = sdpa_test_run(gpu_suite());
  print_summary();

  sdpa_runtime_destroy(runtime);
  sdpa_gpu_close(&gpu);
  sdpa_test_rmtree(temp_dir);
  free(temp_dir);
  free(cache_path);
  return rc;
}
