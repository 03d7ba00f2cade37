/*
 * bench_bwd.c — TFLOP/s of the backward pass through the public API.
 *
 * Every case is validated before it is timed: a small twin of it (same
 * dtype, head_dim, mask, layout and GQA ratio, lengths that are tile
 * multiples or not as the case's, and the case's dQ writer and tiles
 * pinned with SDPA_JIT_DQ_CONVERT and SDPA_JIT_TILES: the same key, else
 * the case fails; B=1, S=512 or 500) runs against the
 * float64 CPU reference, since the reference is far too slow for the
 * full sizes. Then the full case is timed with CUDA events around
 * each sdpa_bwd_execute (preprocess + main + dQ convert):
 * warm-up runs, then the median of >= 20 runs, the inputs rotated over 3
 * buffer sets so the 50 MB L2 does not keep them warm between runs.
 * TFLOP/s = 4 * B * H * Sq * Skv * D * 2.5 / time (the backward counted as
 * 2.5 forwards), halved for causal; THD sums Sq*Skv over its sequences.
 *
 * Grid: bf16 and fp16; head_dim 64 and 128; B*S = 16k tokens and
 * H*D = 2048 with S in 1k..16k; causal and not; GQA (64 q / 8 kv heads,
 * D 128, S 4k); THD with mixed lengths. Options:
 *   --quick           a subset (bf16, hd 128, S 2k and 8k, GQA, THD)
 *   --dtype bf16|fp16 --hd 64|128   only those
 *   --seq S           only the BSHD cases of sequence length S
 *   --causal 0|1      only the non-causal (0) or causal (1) cases
 *   --small           instead, small problems (B 1, H 16: hd 64 at S
 *                     1000, 1024, 500 and 512, hd 128 at S 500 and 512),
 *                     causal and not
 *   --shape B,H,S     instead, BSHD problems of B sequences of length S
 *                     and H heads, hd 64 and 128 (or --hd's, any the
 *                     library supports), causal and not; with --thd,
 *                     THD problems of B (at most 16) sequences of S,
 *                     7S/8, 3S/4, 5S/8, S, ... tokens (max_s S)
 *   --deterministic   deterministic plans (bitwise-reproducible dQ adds)
 *   --runs N          timed runs per case (default 30, at least 20)
 *   --csv FILE        also write the rows as CSV
 * Exit: 0 when every case validated, 1 when one did not, 77 without a GPU.
 * Kernels come from the usual cache ($SDPA_JIT_CACHE or the default);
 * keys not there are compiled first, in parallel.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"
#include "reference.h"

#define TOKENS 16384
#define HIDDEN 2048
#define SETS 3
#define WARMUP 3
#define MAX_SEQS 16
#define MAX_CASES 128

typedef struct bench_case {
  char name[64];
  sdpa_dtype dtype;
  sdpa_layout layout;
  int batch, heads_q, heads_kv, seqlen, head_dim;
  int causal;
  int lens[MAX_SEQS]; /* THD: batch sequence lengths, */
  int64_t total;      /* their sum                     */
  /* results */
  sdpa_bwd_desc desc;
  sdpa_bwd_plan *plan;
  sdpa_status status;
  char message[1024];
  double err[3];
  int validated;
  double ms, tflops;
} bench_case;

static const int thd_lens[] = {4096, 512, 3000, 1500, 2048, 777, 3333, 1118}; /* sum 16384 */
#define THD_SEQS ((int)(sizeof thd_lens / sizeof thd_lens[0]))

static sdpa_gpu gpu;
static sdpa_runtime *runtime;
static int deterministic; /* --deterministic: every case's and twin's plan */

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, compare_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static sdpa_mask case_mask(const bench_case *c) {
  return c->causal ? SDPA_MASK_CAUSAL_TOP_LEFT : SDPA_MASK_NONE;
}

/* Multiply-adds of the forward QK^T and PV, summed over sequences. */
static double case_flops(const bench_case *c) {
  double pairs = 0;
  if (c->layout == SDPA_LAYOUT_THD) {
    for (int b = 0; b < c->batch; b++) pairs += (double)c->lens[b] * c->lens[b];
  } else {
    pairs = (double)c->batch * c->seqlen * c->seqlen;
  }
  double flops = 4.0 * pairs * c->heads_q * c->head_dim * 2.5;
  return c->causal ? flops / 2 : flops;
}

/* The descriptor of the full case: packed BSHD / THD, packed LSE. */
static void case_desc(const bench_case *c, sdpa_bwd_desc *d) {
  memset(d, 0, sizeof *d);
  d->version = SDPA_BWD_DESC_VERSION;
  d->dtype = c->dtype;
  d->layout = c->layout;
  d->batch = c->batch;
  d->heads_q = c->heads_q;
  d->heads_kv = c->heads_kv;
  d->seqlen_q = d->seqlen_kv = c->seqlen;
  d->head_dim = d->head_dim_v = c->head_dim;
  d->mask = case_mask(c);
  d->deterministic = deterministic;
  if (c->layout == SDPA_LAYOUT_THD) d->max_total_q = d->max_total_kv = c->total;
}

/* ------------------------------------------------------------ validate */

/* The small twin: same key class, sizes the reference can afford. */
static void twin_problem(const bench_case *c, sdpa_ref_problem *p) {
  memset(p, 0, sizeof *p);
  p->dtype = c->dtype;
  p->layout = c->layout;
  p->heads_q = c->heads_q == c->heads_kv ? 2 : c->heads_q / c->heads_kv;
  p->heads_kv = c->heads_q == c->heads_kv ? 2 : 1;
  p->head_dim = p->head_dim_v = c->head_dim;
  p->mask = case_mask(c);
  if (c->layout == SDPA_LAYOUT_THD) {
    static const int lq[] = {300, 512, 37, 129};
    p->batch = 4;
    p->heads_q = p->heads_q > 2 ? p->heads_q / 2 : 1;
    p->heads_kv = 1;
    sdpa_ref_problem_alloc(p, lq, lq);
  } else {
    /* lengths that are tile multiples or not, as the case's (its key's
     * "even" field) */
    const int uneven = c->plan && strstr(sdpa_bwd_plan_key(c->plan), ";even=0;");
    p->batch = 1;
    p->seqlen_q = p->seqlen_kv = (p->heads_q > 2 ? 256 : 512) - (uneven ? 12 : 0);
    sdpa_ref_problem_alloc(p, NULL, NULL);
  }
}

/* The plan options that give the twin the case's kernel: its family,
 * dQ writer and (mma.sync family) tiles (sdpa_bwd_plan_query). */
static sdpa_bwd_plan_options case_options(const bench_case *c) {
  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  sdpa_bwd_plan_info info = SDPA_BWD_PLAN_INFO_INIT;
  if (c->plan && sdpa_bwd_plan_query(c->plan, &info) == SDPA_STATUS_SUCCESS) {
    o.family = info.family;
    o.dq_writer = info.dq_writer;
    if (info.family == SDPA_FAMILY_MMA) { /* the sm_90a family's tiles are its own */
      o.q_tile = info.q_tile;
      o.kv_tile = info.kv_tile;
      o.warps = info.warps;
      o.stages = info.stages;
    }
  }
  return o;
}

static void validate_case(bench_case *c) {
  sdpa_ref_problem p;
  sdpa_ref_layout l;
  sdpa_bwd_desc d;
  sdpa_ref_grads ref = {0};
  sdpa_gpu_outcome o;
  double tol = c->dtype == SDPA_DTYPE_BF16 ? 1e-2 : 2e-3;
  twin_problem(c, &p);
  sdpa_ref_problem_fill(&p, 0xbe7c4u + (uint64_t)c->head_dim, 0);
  sdpa_ref_layout_make(&l, &p, SDPA_REF_STYLE_PACKED, SDPA_REF_LSE_PACKED);
  sdpa_ref_desc(&p, &l, &d);
  d.deterministic = deterministic;
  if (c->layout == SDPA_LAYOUT_THD) {
    d.max_total_q = p.rows_q;
    d.max_total_kv = p.rows_kv;
  }
  c->validated = 0;
  if (sdpa_ref_backward(&p, &ref, 0) != 0) {
    snprintf(c->message, sizeof c->message, "reference: out of memory");
    goto done;
  }
  /* the twin is small: the case's family, dQ writer and tiles as plan
   * options, so that it gets the case's key */
  const sdpa_bwd_plan_options twin = case_options(c);
  sdpa_gpu_run_problem_with(&gpu, runtime, &p, &l, &d, &twin, &o);
  if (o.status != SDPA_STATUS_SUCCESS) {
    snprintf(c->message, sizeof c->message, "twin: %.1000s", o.message);
    sdpa_gpu_outcome_free(&o);
    goto done;
  }
  if (c->plan && strcmp(o.key_hash, sdpa_bwd_plan_key_hash(c->plan)) != 0) {
    /* it would check another kernel than the one timed */
    snprintf(c->message, sizeof c->message, "the twin's key differs from the case's (%s)",
             sdpa_bwd_plan_key(c->plan));
    sdpa_gpu_outcome_free(&o);
    goto done;
  }
  c->err[0] = sdpa_ref_rel_error(o.grads.dq, ref.dq, sdpa_ref_elements(&p, SDPA_REF_DQ));
  c->err[1] = sdpa_ref_rel_error(o.grads.dk, ref.dk, sdpa_ref_elements(&p, SDPA_REF_DK));
  c->err[2] = sdpa_ref_rel_error(o.grads.dv, ref.dv, sdpa_ref_elements(&p, SDPA_REF_DV));
  size_t bad = sdpa_ref_count_nonfinite(o.grads.dq, sdpa_ref_elements(&p, SDPA_REF_DQ)) +
               sdpa_ref_count_nonfinite(o.grads.dk, sdpa_ref_elements(&p, SDPA_REF_DK)) +
               sdpa_ref_count_nonfinite(o.grads.dv, sdpa_ref_elements(&p, SDPA_REF_DV));
  c->validated = bad == 0 && c->err[0] <= tol && c->err[1] <= tol && c->err[2] <= tol;
  if (!c->validated)
    snprintf(c->message, sizeof c->message,
             "twin check failed: rel err dq %.3e dk %.3e dv %.3e (tol %.0e), %zu non-finite",
             c->err[0], c->err[1], c->err[2], tol, bad);
  sdpa_gpu_outcome_free(&o);
done:
  sdpa_ref_grads_free(&ref);
  sdpa_ref_problem_free(&p);
}

/* Validates case i, reusing the result of an earlier case of the same
 * key and group size (the twin depends only on those). */
static void validate_class(bench_case *cases, int i) {
  bench_case *c = &cases[i];
  for (int j = 0; j < i; j++) {
    const bench_case *e = &cases[j];
    if (e->status == SDPA_STATUS_SUCCESS && e->plan && c->plan &&
        e->heads_q / e->heads_kv == c->heads_q / c->heads_kv &&
        !strcmp(sdpa_bwd_plan_key_hash(e->plan), sdpa_bwd_plan_key_hash(c->plan))) {
      c->validated = e->validated;
      memcpy(c->err, e->err, sizeof c->err);
      snprintf(c->message, sizeof c->message, "%s", e->message);
      return;
    }
  }
  validate_case(c);
}

/* --------------------------------------------------------------- timing */

/* One set of full-size device tensors. */
typedef struct tensor_set {
  CUdeviceptr q, k, v, o, dout, dq, dk, dv, lse;
  sdpa_bwd_tensors tensors;
} tensor_set;

/* Random N(0,1) values per dtype, tiled from a pool so 100M-element
 * tensors fill fast. */
static uint16_t *pools[3]; /* by sdpa_dtype */
#define POOL (1 << 20)

static sdpa_status upload_random(CUdeviceptr dst, size_t elements, size_t salt,
                                 sdpa_dtype dtype) {
  const uint16_t *pool = pools[dtype];
  const size_t chunk = 1 << 24;
  uint16_t *host = malloc(chunk * sizeof *host);
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (!host) return SDPA_STATUS_OUT_OF_MEMORY;
  for (size_t at = 0; at < elements && status == SDPA_STATUS_SUCCESS; at += chunk) {
    size_t n = elements - at < chunk ? elements - at : chunk;
    for (size_t i = 0; i < n; i++) host[i] = pool[(at + i + salt * 7919u) % (POOL - 1)];
    status = sdpa_gpu_upload(&gpu, dst + at * 2, host, n * 2);
  }
  free(host);
  return status;
}

/* LSE consistent with N(0,1) inputs at scale 1/sqrt(D): S ~ N(0,1), so
 * sum_j exp(S_ij) ~ n_i * e^0.5 over the n_i visible keys. Exact values do
 * not matter for timing; keeping P near a distribution keeps the
 * arithmetic in range. LSE is packed [b, h, s] / [h, t]. */
static sdpa_status upload_lse(const bench_case *c, CUdeviceptr dst) {
  int64_t rows = c->layout == SDPA_LAYOUT_THD ? c->total : (int64_t)c->batch * c->seqlen;
  size_t n = (size_t)rows * c->heads_q;
  float *host = malloc(n * sizeof *host);
  if (!host) return SDPA_STATUS_OUT_OF_MEMORY;
  for (int h = 0; h < c->heads_q; h++)
    for (int64_t r = 0; r < rows; r++) {
      int64_t i, len;
      if (c->layout == SDPA_LAYOUT_THD) {
        int64_t start = 0;
        int b = 0;
        while (b < c->batch - 1 && r >= start + c->lens[b]) start += c->lens[b++];
        i = r - start;
        len = c->lens[b];
      } else {
        i = r % c->seqlen;
        len = c->seqlen;
      }
      int64_t visible = c->causal ? i + 1 : len;
      size_t at = c->layout == SDPA_LAYOUT_THD
                      ? (size_t)h * rows + (size_t)r
                      : ((size_t)(r / c->seqlen) * c->heads_q + h) * c->seqlen + (size_t)i;
      host[at] = (float)(log((double)visible) + 0.5);
    }
  sdpa_status status = sdpa_gpu_upload(&gpu, dst, host, n * sizeof *host);
  free(host);
  return status;
}

static void set_free(tensor_set *s) {
  CUdeviceptr all[] = {s->q, s->k, s->v, s->o, s->dout, s->dq, s->dk, s->dv, s->lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sdpa_gpu_free(&gpu, all[i]);
  memset(s, 0, sizeof *s);
}

static sdpa_status set_make(const bench_case *c, tensor_set *s, const CUdeviceptr cu[2], int index) {
  int64_t rows = c->layout == SDPA_LAYOUT_THD ? c->total : (int64_t)c->batch * c->seqlen;
  size_t nq = (size_t)rows * c->heads_q * c->head_dim;
  size_t nk = (size_t)rows * c->heads_kv * c->head_dim;
  sdpa_status st;
  memset(s, 0, sizeof *s);
  if ((st = sdpa_gpu_alloc(&gpu, nq * 2, &s->q)) || (st = sdpa_gpu_alloc(&gpu, nk * 2, &s->k)) ||
      (st = sdpa_gpu_alloc(&gpu, nk * 2, &s->v)) || (st = sdpa_gpu_alloc(&gpu, nq * 2, &s->o)) ||
      (st = sdpa_gpu_alloc(&gpu, nq * 2, &s->dout)) || (st = sdpa_gpu_alloc(&gpu, nq * 2, &s->dq)) ||
      (st = sdpa_gpu_alloc(&gpu, nk * 2, &s->dk)) || (st = sdpa_gpu_alloc(&gpu, nk * 2, &s->dv)) ||
      (st = sdpa_gpu_alloc(&gpu, (size_t)rows * c->heads_q * 4, &s->lse)))
    goto done;
  size_t salt = (size_t)index * 5;
  if ((st = upload_random(s->q, nq, salt, c->dtype)) ||
      (st = upload_random(s->k, nk, salt + 1, c->dtype)) ||
      (st = upload_random(s->v, nk, salt + 2, c->dtype)) ||
      (st = upload_random(s->o, nq, salt + 3, c->dtype)) ||
      (st = upload_random(s->dout, nq, salt + 4, c->dtype)) || (st = upload_lse(c, s->lse)))
    goto done;
  sdpa_bwd_tensors *t = &s->tensors;
  memset(t, 0, sizeof *t);
  t->version = SDPA_BWD_TENSORS_VERSION;
  t->q = (const void *)(uintptr_t)s->q;
  t->k = (const void *)(uintptr_t)s->k;
  t->v = (const void *)(uintptr_t)s->v;
  t->o = (const void *)(uintptr_t)s->o;
  t->dout = (const void *)(uintptr_t)s->dout;
  t->lse = (const float *)(uintptr_t)s->lse;
  t->dq = (void *)(uintptr_t)s->dq;
  t->dk = (void *)(uintptr_t)s->dk;
  t->dv = (void *)(uintptr_t)s->dv;
  if (c->layout == SDPA_LAYOUT_THD) {
    t->cu_seqlens_q = t->cu_seqlens_kv = (const int32_t *)(uintptr_t)cu[0];
    t->total_q = t->total_kv = c->total;
  }
done:
  if (st) set_free(s);
  return st;
}

/* Times the case; fills ms and tflops, or message. */
static void time_case(bench_case *c, int runs) {
  tensor_set sets[SETS];
  CUdeviceptr cu[2] = {0, 0}, workspace = 0;
  CUevent *events = calloc((size_t)runs * 2, sizeof *events);
  double *ms = calloc((size_t)runs, sizeof *ms);
  const sdpa_driver *drv = gpu.drv;
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int made = 0, created = 0;
  size_t workspace_bytes = sdpa_bwd_workspace_size(c->plan);
  if (!events || !ms) {
    status = SDPA_STATUS_OUT_OF_MEMORY;
    goto done;
  }
  if (c->layout == SDPA_LAYOUT_THD) {
    int32_t offsets[MAX_SEQS + 1] = {0};
    for (int b = 0; b < c->batch; b++) offsets[b + 1] = offsets[b] + c->lens[b];
    if ((status = sdpa_gpu_alloc(&gpu, sizeof offsets, &cu[0])) ||
        (status = sdpa_gpu_upload(&gpu, cu[0], offsets, sizeof offsets)))
      goto done;
  }
  for (; made < SETS; made++)
    if ((status = set_make(c, &sets[made], cu, made))) goto done;
  if ((status = sdpa_gpu_alloc(&gpu, workspace_bytes, &workspace))) goto done;
  for (int i = 0; i < WARMUP; i++) {
    status = sdpa_bwd_execute(c->plan, &sets[i % SETS].tensors, (void *)(uintptr_t)workspace,
                              workspace_bytes, gpu.stream);
    if (status) goto done;
  }
  if ((status = sdpa_bwd_sync_check(c->plan, gpu.stream))) goto done;
  for (; created < 2 * runs; created++)
    SDPA_CU_CHECK(drv, drv->cuEventCreate(&events[created], CU_EVENT_DEFAULT), "cuEventCreate");
  for (int r = 0; r < runs; r++) {
    SDPA_CU_CHECK(drv, drv->cuEventRecord(events[2 * r], gpu.stream), "cuEventRecord");
    status = sdpa_bwd_execute(c->plan, &sets[r % SETS].tensors, (void *)(uintptr_t)workspace,
                              workspace_bytes, gpu.stream);
    if (status) goto done;
    SDPA_CU_CHECK(drv, drv->cuEventRecord(events[2 * r + 1], gpu.stream), "cuEventRecord");
  }
  if ((status = sdpa_bwd_sync_check(c->plan, gpu.stream))) goto done;
  for (int r = 0; r < runs; r++) {
    float elapsed = 0;
    SDPA_CU_CHECK(drv, drv->cuEventElapsedTime(&elapsed, events[2 * r], events[2 * r + 1]),
                  "cuEventElapsedTime");
    ms[r] = elapsed;
  }
  c->ms = median(ms, runs);
  c->tflops = case_flops(c) / (c->ms * 1e-3) / 1e12;
done:
  if (status) {
    c->status = status;
    snprintf(c->message, sizeof c->message, "timing: %s: %s", sdpa_status_name(status),
             sdpa_last_error());
  }
  for (int i = 0; i < created; i++) drv->cuEventDestroy(events[i]);
  for (int i = 0; i < made; i++) set_free(&sets[i]);
  sdpa_gpu_free(&gpu, workspace);
  sdpa_gpu_free(&gpu, cu[0]);
  free(events);
  free(ms);
}

/* ------------------------------------------------------------- compile */

typedef struct compile_job {
  bench_case *cases;
  int *keys;
  int key_count;
  atomic_int next;
} compile_job;

static void *compile_worker(void *arg) {
  compile_job *job = arg;
  if (sdpa_driver_context(gpu.drv, NULL, NULL)) return NULL;
  for (;;) {
    int k = atomic_fetch_add(&job->next, 1);
    if (k >= job->key_count) break;
    bench_case *c = &job->cases[job->keys[k]];
    c->status = sdpa_bwd_compile(c->plan, NULL);
    if (c->status)
      snprintf(c->message, sizeof c->message, "compile: %s: %s", sdpa_status_name(c->status),
               sdpa_last_error());
  }
  return NULL;
}

/* Plans every case, compiles the distinct keys in parallel, then the rest
 * (in-memory hits). */
static void compile_all(bench_case *cases, int count) {
  compile_job job = {cases, calloc((size_t)count + 1, sizeof(int)), 0, 0};
  atomic_init(&job.next, 0);
  for (int i = 0; i < count; i++) {
    bench_case *c = &cases[i];
    case_desc(c, &c->desc);
    c->status = sdpa_bwd_plan_create(&c->plan, runtime, &c->desc);
    if (c->status) {
      snprintf(c->message, sizeof c->message, "plan: %s: %s", sdpa_status_name(c->status),
               sdpa_last_error());
      c->plan = NULL;
      continue;
    }
    int seen = 0;
    for (int k = 0; k < job.key_count && !seen; k++)
      seen = !strcmp(sdpa_bwd_plan_key_hash(cases[job.keys[k]].plan), sdpa_bwd_plan_key_hash(c->plan));
    if (!seen) job.keys[job.key_count++] = i;
  }
  double t0 = now_seconds();
  int threads = sdpa_ref_cpu_count() < job.key_count ? sdpa_ref_cpu_count() : job.key_count;
  pthread_t ids[256];
  int started = 0;
  for (; started < threads && started < 256; started++)
    if (pthread_create(&ids[started], NULL, compile_worker, &job)) break;
  if (started == 0) compile_worker(&job);
  for (int i = 0; i < started; i++) pthread_join(ids[i], NULL);
  for (int i = 0; i < count; i++) {
    bench_case *c = &cases[i];
    if (!c->plan || c->status) continue;
    c->status = sdpa_bwd_compile(c->plan, NULL);
    if (c->status)
      snprintf(c->message, sizeof c->message, "compile: %s: %s", sdpa_status_name(c->status),
               sdpa_last_error());
  }
  printf("%d cases, %d distinct keys ready in %.1f s\n", count, job.key_count, now_seconds() - t0);
  free(job.keys);
}

/* ----------------------------------------------------------------- grid */

/* Adds a case; THD takes `lens` (`batch` of them; NULL: the mixed
 * lengths of the standard grid) and ignores `seqlen` (their longest). */
static int add_case(bench_case *cases, int count, sdpa_dtype dtype, sdpa_layout layout,
                    int batch, int hq, int hkv, int seqlen, int hd, int causal, const char *tag,
                    const int *lens) {
  if (count >= MAX_CASES) return count;
  bench_case *c = &cases[count];
  memset(c, 0, sizeof *c);
  c->dtype = dtype;
  c->layout = layout;
  c->batch = batch;
  c->heads_q = hq;
  c->heads_kv = hkv;
  c->seqlen = seqlen;
  c->head_dim = hd;
  c->causal = causal;
  if (layout == SDPA_LAYOUT_THD) {
    if (!lens) {
      lens = thd_lens;
      batch = THD_SEQS;
    }
    c->batch = batch;
    memcpy(c->lens, lens, (size_t)batch * sizeof *lens);
    c->seqlen = 0;
    for (int b = 0; b < batch; b++) {
      if (lens[b] > c->seqlen) c->seqlen = lens[b];
      c->total += lens[b];
    }
  }
  snprintf(c->name, sizeof c->name, "%s %s hd%d %s%s", sdpa_ref_dtype_name(dtype), tag, hd,
           causal ? "causal" : "full", "");
  return count + 1;
}

static void usage(void) {
  printf("usage: bench_bwd [--quick | --small | --shape B,H,S[,Hkv] [--thd]] [--dtype bf16|fp16]\n"
         "                 [--hd 64|128] [--seq S] [--causal 0|1] [--deterministic] [--runs N]\n"
         "                 [--csv FILE]\n");
}

int main(int argc, char **argv) {
  int quick = 0, small = 0, thd = 0, runs = 30, only_hd = 0, only_seq = 0, only_causal = -1;
  int shape[4] = {0, 0, 0, 0}; /* --shape B,H,S[,Hkv] */
  sdpa_dtype only_dtype = 0;
  const char *csv_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--small")) small = 1;
    else if (!strcmp(argv[i], "--thd")) thd = 1;
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
      /* B,H,S or B,H,S,Hkv (GQA / MQA: Hkv divides H) */
      const int n = sscanf(argv[++i], "%d,%d,%d,%d", &shape[0], &shape[1], &shape[2], &shape[3]);
      if (n == 3) shape[3] = shape[1];
      if (n < 3 || shape[0] < 1 || shape[1] < 1 || shape[2] < 1 || shape[3] < 1 ||
          shape[1] % shape[3]) {
        usage();
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      const char *d = argv[++i];
      only_dtype = !strcmp(d, "bf16") ? SDPA_DTYPE_BF16 : !strcmp(d, "fp16") ? SDPA_DTYPE_FP16 : 0;
      if (!only_dtype) {
        usage();
        return 2;
      }
    } else if (!strcmp(argv[i], "--hd") && i + 1 < argc) only_hd = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seq") && i + 1 < argc) only_seq = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--causal") && i + 1 < argc) only_causal = atoi(argv[++i]) != 0;
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--deterministic")) deterministic = 1;
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
    else {
      usage();
      return !strcmp(argv[i], "--help") ? 0 : 2;
    }
  }
  if (runs < 20) runs = 20;
  if (thd && (!shape[0] || shape[0] > MAX_SEQS)) { /* THD: --shape with at most 16 sequences */
    usage();
    return 2;
  }

  static bench_case cases[MAX_CASES];
  int count = 0;
  const sdpa_dtype dtypes[] = {SDPA_DTYPE_BF16, SDPA_DTYPE_FP16};
  const int dims[] = {64, 128};
  const int lengths[] = {1024, 2048, 4096, 8192, 16384};
  for (int di = 0; di < 2; di++) {
    sdpa_dtype dtype = dtypes[di];
    if ((only_dtype && dtype != only_dtype) || (quick && dtype != SDPA_DTYPE_BF16)) continue;
    if (shape[0]) { /* hd 64 and 128, or any --hd */
      for (int hi = 0; hi < (only_hd ? 1 : 2); hi++)
        for (int causal = 0; causal < 2; causal++) {
          if (only_causal >= 0 && causal != only_causal) continue;
          char heads[16], tag[48]; /* H16, or H16/2 (GQA / MQA) */
          if (shape[3] == shape[1]) snprintf(heads, sizeof heads, "H%d", shape[1]);
          else snprintf(heads, sizeof heads, "H%d/%d", shape[1], shape[3]);
          snprintf(tag, sizeof tag, "%sB%d %s S%d", thd ? "thd " : "", shape[0], heads, shape[2]);
          int lens[MAX_SEQS]; /* THD: B sequences of S, 7S/8, 3S/4, 5S/8, S, ... tokens */
          for (int b = 0; thd && b < shape[0]; b++) lens[b] = shape[2] - (b % 4) * shape[2] / 8;
          count = add_case(cases, count, dtype, thd ? SDPA_LAYOUT_THD : SDPA_LAYOUT_BSHD,
                           shape[0], shape[1], shape[3], shape[2], only_hd ? only_hd : dims[hi],
                           causal, tag, thd ? lens : NULL);
        }
      continue;
    }
    if (small) {
      /* by head_dim, 0-terminated: 1024 at hd 64 is 128 blocks of 128 kv
       * rows (16 heads), 512 at either head_dim 64 */
      static const int small_lengths[2][5] = {{1024, 1000, 512, 500, 0}, {512, 500, 0}};
      for (int hi = 0; hi < 2; hi++) {
        const int hd = dims[hi];
        if (only_hd && hd != only_hd) continue;
        for (int causal = 0; causal < 2; causal++)
          for (int li = 0; small_lengths[hi][li]; li++) {
            const int s = small_lengths[hi][li];
            if ((only_seq && s != only_seq) || (only_causal >= 0 && causal != only_causal))
              continue;
            char tag[32];
            snprintf(tag, sizeof tag, "small S%d", s);
            count = add_case(cases, count, dtype, SDPA_LAYOUT_BSHD, 1, 16, 16, s, hd, causal, tag,
                             NULL);
          }
      }
      continue;
    }
    for (int hi = 0; hi < 2; hi++) {
      int hd = dims[hi];
      if ((only_hd && hd != only_hd) || (quick && hd != 128)) continue;
      for (int causal = 0; causal < 2; causal++)
        for (int si = 0; si < 5; si++) {
          int s = lengths[si];
          if (quick && s != 2048 && s != 8192) continue;
          if ((only_seq && s != only_seq) || (only_causal >= 0 && causal != only_causal)) continue;
          char tag[32];
          snprintf(tag, sizeof tag, "bshd S%dk", s / 1024);
          count = add_case(cases, count, dtype, SDPA_LAYOUT_BSHD, TOKENS / s, HIDDEN / hd,
                           HIDDEN / hd, s, hd, causal, tag, NULL);
        }
    }
    if ((!only_hd || only_hd == 128) && !only_seq)
      for (int causal = 0; causal < 2; causal++) {
        if (only_causal >= 0 && causal != only_causal) continue;
        count = add_case(cases, count, dtype, SDPA_LAYOUT_BSHD, TOKENS / 4096, 64, 8, 4096, 128,
                         causal, "gqa64/8 S4k", NULL);
        count = add_case(cases, count, dtype, SDPA_LAYOUT_THD, 0, HIDDEN / 128, HIDDEN / 128, 0,
                         128, causal, "thd mixed", NULL);
      }
  }

  sdpa_gpu_require(&gpu);
  sdpa_status st = sdpa_runtime_create(&runtime, NULL);
  if (st) {
    printf("sdpa_runtime_create: %s: %s\n", sdpa_status_name(st), sdpa_last_error());
    return 1;
  }
  pools[SDPA_DTYPE_FP16] = malloc(POOL * sizeof(uint16_t));
  pools[SDPA_DTYPE_BF16] = malloc(POOL * sizeof(uint16_t));
  if (!pools[SDPA_DTYPE_FP16] || !pools[SDPA_DTYPE_BF16]) return 1;
  sdpa_ref_rng rng;
  sdpa_ref_rng_seed(&rng, 1234);
  for (int i = 0; i < POOL; i++) {
    float x = (float)sdpa_ref_rng_normal(&rng);
    pools[SDPA_DTYPE_FP16][i] = sdpa_ref_to_bits(x, SDPA_DTYPE_FP16);
    pools[SDPA_DTYPE_BF16][i] = sdpa_ref_to_bits(x, SDPA_DTYPE_BF16);
  }
  printf("device: %s (sm_%d, %d SMs); cache: %s\n", gpu.name, gpu.arch, gpu.sm_count,
         sdpa_runtime_cache_path(runtime) ? sdpa_runtime_cache_path(runtime) : "(memory)");
  compile_all(cases, count);

  FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
  if (csv_path && !csv) {
    printf("cannot write %s\n", csv_path);
    return 2;
  }
  if (csv)
    fprintf(csv, "case,dtype,head_dim,layout,causal,batch,heads_q,heads_kv,seqlen,ms,tflops,"
                 "check,err_dq,err_dk,err_dv\n");
  printf("\n%-34s %9s %9s  %s\n", "case", "ms", "TFLOP/s", "check (twin vs float64 reference)");
  int failures = 0;
  for (int i = 0; i < count; i++) {
    bench_case *c = &cases[i];
    if (c->status == SDPA_STATUS_SUCCESS) validate_class(cases, i);
    if (c->status == SDPA_STATUS_SUCCESS && c->validated) time_case(c, runs);
    int ok = c->status == SDPA_STATUS_SUCCESS && c->validated;
    failures += !ok;
    if (ok)
      printf("%-34s %9.3f %9.1f  ok (dq %.1e dk %.1e dv %.1e)\n", c->name, c->ms, c->tflops,
             c->err[0], c->err[1], c->err[2]);
    else
      printf("%-34s %9s %9s  FAILED: %s\n", c->name, "-", "-", c->message);
    if (csv)
      fprintf(csv, "%s,%s,%d,%s,%d,%d,%d,%d,%d,%.4f,%.2f,%s,%.3e,%.3e,%.3e\n", c->name,
              sdpa_ref_dtype_name(c->dtype), c->head_dim,
              c->layout == SDPA_LAYOUT_THD ? "thd" : "bshd", c->causal, c->batch, c->heads_q,
              c->heads_kv, c->seqlen, ok ? c->ms : NAN, ok ? c->tflops : NAN, ok ? "ok" : "failed",
              c->err[0], c->err[1], c->err[2]);
    fflush(stdout);
  }
  if (csv) fclose(csv);
  for (int i = 0; i < count; i++) sdpa_bwd_plan_destroy(cases[i].plan);
  sdpa_runtime_destroy(runtime);
  sdpa_gpu_close(&gpu);
  free(pools[SDPA_DTYPE_FP16]);
  free(pools[SDPA_DTYPE_BF16]);
  return failures ? 1 : 0;
}
