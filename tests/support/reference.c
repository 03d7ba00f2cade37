/*
 * reference.c — float64 CPU reference of attention forward/backward, dtype
 * conversions, random problems and strided host layouts (see reference.h).
 *
 * The reference walks, for each (sequence, head), the visible key range of
 * each query row (every mask here yields one contiguous range), so masked
 * pairs cost nothing. Work is split across threads by (sequence, head) for
 * the forward and by (sequence, kv head) for the backward, so every output
 * element has exactly one writer and no locking is needed.
 */
#include "reference.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ numbers */

static uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

static float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

uint16_t sdpa_ref_float_to_half(float value) {
  uint32_t x = float_bits(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exponent = (x >> 23) & 0xffu;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xffu) /* inf stays inf; NaN stays (quiet) NaN */
    return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0));
  int e = (int)exponent - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    /* Subnormal half (or zero): value = m * 2^-24. */
    if (e < -10) return (uint16_t)sign;
    mantissa |= 0x800000u;
    int shift = 14 - e;
    uint32_t m = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1u))) m++;
    return (uint16_t)(sign | m); /* a carry makes the smallest normal */
  }
  uint32_t h = sign | ((uint32_t)e << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* may carry to inf */
  return (uint16_t)h;
}

float sdpa_ref_half_to_float(uint16_t bits) {
  uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    float magnitude = ldexpf((float)mantissa, -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t sdpa_ref_float_to_bf16(float value) {
  uint32_t x = float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float sdpa_ref_bf16_to_float(uint16_t bits) {
  return bits_float((uint32_t)bits << 16);
}

uint16_t sdpa_ref_to_bits(float value, sdpa_dtype dtype) {
  return dtype == SDPA_DTYPE_BF16 ? sdpa_ref_float_to_bf16(value)
                                  : sdpa_ref_float_to_half(value);
}

float sdpa_ref_from_bits(uint16_t bits, sdpa_dtype dtype) {
  return dtype == SDPA_DTYPE_BF16 ? sdpa_ref_bf16_to_float(bits)
                                  : sdpa_ref_half_to_float(bits);
}

float sdpa_ref_round(float value, sdpa_dtype dtype) {
  return sdpa_ref_from_bits(sdpa_ref_to_bits(value, dtype), dtype);
}

/* ---------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void sdpa_ref_rng_seed(sdpa_ref_rng *rng, uint64_t seed) {
  uint64_t state = seed;
  for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&state);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sdpa_ref_rng_next(sdpa_ref_rng *rng) {
  uint64_t *s = rng->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

int sdpa_ref_rng_int(sdpa_ref_rng *rng, int lo, int hi) {
  if (hi <= lo) return lo;
  uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
  return lo + (int)(sdpa_ref_rng_next(rng) % span);
}

double sdpa_ref_rng_uniform(sdpa_ref_rng *rng) {
  return (double)(sdpa_ref_rng_next(rng) >> 11) * 0x1.0p-53;
}

double sdpa_ref_rng_normal(sdpa_ref_rng *rng) {
  double u1 = sdpa_ref_rng_uniform(rng), u2 = sdpa_ref_rng_uniform(rng);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ------------------------------------------------------------ threads */

int sdpa_ref_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

typedef struct parallel_job {
  void (*fn)(void *context, int item);
  void *context;
  int items;
  atomic_int next;
} parallel_job;

static void *parallel_worker(void *arg) {
  parallel_job *job = arg;
  for (;;) {
    int item = atomic_fetch_add(&job->next, 1);
    if (item >= job->items) break;
    job->fn(job->context, item);
  }
  return NULL;
}

/* Runs fn(context, item) for item in [0, items) on `threads` threads
 * (0: one per online CPU); falls back to the calling thread alone when a
 * thread cannot be started. */
static void parallel_for(int items, int threads, void (*fn)(void *, int),
                         void *context) {
  if (threads <= 0) threads = sdpa_ref_cpu_count();
  if (threads > items) threads = items;
  parallel_job job = {fn, context, items, 0};
  atomic_init(&job.next, 0);
  if (threads <= 1) {
    parallel_worker(&job);
    return;
  }
  pthread_t *ids = calloc((size_t)threads, sizeof *ids);
  int started = 0;
  if (ids) {
    for (; started < threads - 1; started++)
      if (pthread_create(&ids[started], NULL, parallel_worker, &job) != 0) break;
  }
  parallel_worker(&job);
  for (int i = 0; i < started; i++) pthread_join(ids[i], NULL);
  free(ids);
}

/* ------------------------------------------------------------ problem */

static int tensor_heads(const sdpa_ref_problem *p, int t) {
  return (t == SDPA_REF_K || t == SDPA_REF_V || t == SDPA_REF_DK ||
          t == SDPA_REF_DV) ? p->heads_kv : p->heads_q;
}

static int tensor_dim(const sdpa_ref_problem *p, int t) {
  return (t == SDPA_REF_Q || t == SDPA_REF_K || t == SDPA_REF_DQ ||
          t == SDPA_REF_DK) ? p->head_dim : p->head_dim_v;
}

static int tensor_is_kv(int t) {
  return t == SDPA_REF_K || t == SDPA_REF_V || t == SDPA_REF_DK ||
         t == SDPA_REF_DV;
}

static int64_t tensor_rows(const sdpa_ref_problem *p, int t) {
  return tensor_is_kv(t) ? p->rows_kv : p->rows_q;
}

static int tensor_seqlen(const sdpa_ref_problem *p, int t) {
  return tensor_is_kv(t) ? p->seqlen_kv : p->seqlen_q;
}

size_t sdpa_ref_elements(const sdpa_ref_problem *p, int tensor) {
  return (size_t)tensor_rows(p, tensor) * (size_t)tensor_heads(p, tensor) *
         (size_t)tensor_dim(p, tensor);
}

int sdpa_ref_problem_alloc(sdpa_ref_problem *p, const int *seqlens_q,
                           const int *seqlens_kv) {
  if (p->head_dim_v == 0) p->head_dim_v = p->head_dim;
  if (p->batch < 1 || p->heads_q < 1 || p->heads_kv < 1 ||
      p->heads_q % p->heads_kv != 0 || p->head_dim < 1 || p->head_dim_v < 1)
    return -1;
  p->cu_seqlens_q = p->cu_seqlens_kv = NULL;
  p->q = p->k = p->v = p->o = p->dout = p->lse = NULL;
  if (p->layout == SDPA_LAYOUT_THD) {
    if (!seqlens_q || !seqlens_kv) return -1;
    p->cu_seqlens_q = calloc((size_t)p->batch + 1, sizeof(int32_t));
    p->cu_seqlens_kv = calloc((size_t)p->batch + 1, sizeof(int32_t));
    if (!p->cu_seqlens_q || !p->cu_seqlens_kv) goto fail;
    int longest_q = 1, longest_kv = 1;
    for (int b = 0; b < p->batch; b++) {
      if (seqlens_q[b] < 0 || seqlens_kv[b] < 0) goto fail;
      p->cu_seqlens_q[b + 1] = p->cu_seqlens_q[b] + seqlens_q[b];
      p->cu_seqlens_kv[b + 1] = p->cu_seqlens_kv[b] + seqlens_kv[b];
      if (seqlens_q[b] > longest_q) longest_q = seqlens_q[b];
      if (seqlens_kv[b] > longest_kv) longest_kv = seqlens_kv[b];
    }
    if (p->seqlen_q == 0) p->seqlen_q = longest_q;
    if (p->seqlen_kv == 0) p->seqlen_kv = longest_kv;
    p->rows_q = p->cu_seqlens_q[p->batch];
    p->rows_kv = p->cu_seqlens_kv[p->batch];
  } else {
    if (p->seqlen_q < 1 || p->seqlen_kv < 1) return -1;
    p->rows_q = (int64_t)p->batch * p->seqlen_q;
    p->rows_kv = (int64_t)p->batch * p->seqlen_kv;
  }
  /* At least one element each, so empty THD problems still allocate. */
  p->q = calloc(sdpa_ref_elements(p, SDPA_REF_Q) + 1, sizeof(float));
  p->k = calloc(sdpa_ref_elements(p, SDPA_REF_K) + 1, sizeof(float));
  p->v = calloc(sdpa_ref_elements(p, SDPA_REF_V) + 1, sizeof(float));
  p->o = calloc(sdpa_ref_elements(p, SDPA_REF_O) + 1, sizeof(float));
  p->dout = calloc(sdpa_ref_elements(p, SDPA_REF_DOUT) + 1, sizeof(float));
  p->lse = calloc((size_t)p->rows_q * (size_t)p->heads_q + 1, sizeof(float));
  if (!p->q || !p->k || !p->v || !p->o || !p->dout || !p->lse) goto fail;
  return 0;
fail:
  sdpa_ref_problem_free(p);
  return -1;
}

void sdpa_ref_problem_free(sdpa_ref_problem *p) {
  if (!p) return;
  free(p->cu_seqlens_q);
  free(p->cu_seqlens_kv);
  free(p->q);
  free(p->k);
  free(p->v);
  free(p->o);
  free(p->dout);
  free(p->lse);
  p->cu_seqlens_q = p->cu_seqlens_kv = NULL;
  p->q = p->k = p->v = p->o = p->dout = p->lse = NULL;
}

static void fill_normal(sdpa_ref_rng *rng, float *x, size_t n,
                        sdpa_dtype dtype) {
  for (size_t i = 0; i < n; i++)
    x[i] = sdpa_ref_round((float)sdpa_ref_rng_normal(rng), dtype);
}

void sdpa_ref_problem_fill(sdpa_ref_problem *p, uint64_t seed, int threads) {
  sdpa_ref_rng rng;
  sdpa_ref_rng_seed(&rng, seed);
  fill_normal(&rng, p->q, sdpa_ref_elements(p, SDPA_REF_Q), p->dtype);
  fill_normal(&rng, p->k, sdpa_ref_elements(p, SDPA_REF_K), p->dtype);
  fill_normal(&rng, p->v, sdpa_ref_elements(p, SDPA_REF_V), p->dtype);
  fill_normal(&rng, p->dout, sdpa_ref_elements(p, SDPA_REF_DOUT), p->dtype);
  sdpa_ref_forward(p, threads);
}

void sdpa_ref_sequence_q(const sdpa_ref_problem *p, int b, int64_t *start,
                         int *length) {
  if (p->layout == SDPA_LAYOUT_THD) {
    *start = p->cu_seqlens_q[b];
    *length = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
  } else {
    *start = (int64_t)b * p->seqlen_q;
    *length = p->seqlen_q;
  }
}

void sdpa_ref_sequence_kv(const sdpa_ref_problem *p, int b, int64_t *start,
                          int *length) {
  if (p->layout == SDPA_LAYOUT_THD) {
    *start = p->cu_seqlens_kv[b];
    *length = p->cu_seqlens_kv[b + 1] - p->cu_seqlens_kv[b];
  } else {
    *start = (int64_t)b * p->seqlen_kv;
    *length = p->seqlen_kv;
  }
}

/* The visible key range [*lo, *hi] of query i (empty when lo > hi). */
static void visible_range(const sdpa_ref_problem *p, int i, int sq, int skv,
                          int64_t *lo, int64_t *hi) {
  int64_t first = 0, last = (int64_t)skv - 1;
  int64_t diagonal = (int64_t)i + skv - sq;
  switch (p->mask) {
  case SDPA_MASK_CAUSAL_TOP_LEFT:
    if (i < last) last = i;
    break;
  case SDPA_MASK_CAUSAL_BOTTOM_RIGHT:
    if (diagonal < last) last = diagonal;
    break;
  case SDPA_MASK_SLIDING_WINDOW:
    if (p->window_left >= 0 && diagonal - p->window_left > first)
      first = diagonal - p->window_left;
    if (p->window_right >= 0 && diagonal + p->window_right < last)
      last = diagonal + p->window_right;
    break;
  default:
    break;
  }
  *lo = first;
  *hi = last;
}

int sdpa_ref_visible(const sdpa_ref_problem *p, int i, int j, int sq,
                     int skv) {
  int64_t lo, hi;
  visible_range(p, i, sq, skv, &lo, &hi);
  return j >= lo && j <= hi;
}

double sdpa_ref_scale(const sdpa_ref_problem *p) {
  return p->scale != 0.0f ? (double)p->scale : 1.0 / sqrt((double)p->head_dim);
}

/* ---------------------------------------------------------- reference */

static double dot_ff(const float *a, const float *b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int d = 0;
  for (; d + 4 <= n; d += 4) {
    s0 += (double)a[d] * b[d];
    s1 += (double)a[d + 1] * b[d + 1];
    s2 += (double)a[d + 2] * b[d + 2];
    s3 += (double)a[d + 3] * b[d + 3];
  }
  for (; d < n; d++) s0 += (double)a[d] * b[d];
  return (s0 + s1) + (s2 + s3);
}

static double dot_fd(const float *a, const double *b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int d = 0;
  for (; d + 4 <= n; d += 4) {
    s0 += (double)a[d] * b[d];
    s1 += (double)a[d + 1] * b[d + 1];
    s2 += (double)a[d + 2] * b[d + 2];
    s3 += (double)a[d + 3] * b[d + 3];
  }
  for (; d < n; d++) s0 += (double)a[d] * b[d];
  return (s0 + s1) + (s2 + s3);
}

static void axpy_fd(double alpha, const float *x, double *y, int n) {
  for (int d = 0; d < n; d++) y[d] += alpha * (double)x[d];
}

typedef struct forward_job {
  const sdpa_ref_problem *p;
  double *o, *lse;
} forward_job;

static void forward_item(void *context, int item) {
  forward_job *job = context;
  const sdpa_ref_problem *p = job->p;
  int b = item / p->heads_q, h = item % p->heads_q;
  int hk = h / (p->heads_q / p->heads_kv);
  int hd = p->head_dim, hdv = p->head_dim_v;
  double scale = sdpa_ref_scale(p);
  int64_t qs, ks;
  int sq, skv;
  sdpa_ref_sequence_q(p, b, &qs, &sq);
  sdpa_ref_sequence_kv(p, b, &ks, &skv);
  double *scores = malloc(((size_t)skv + 1) * sizeof *scores);
  if (!scores) abort(); /* test support: no way to report */
  for (int i = 0; i < sq; i++) {
    int64_t row = qs + i;
    const float *qi = p->q + ((size_t)row * p->heads_q + h) * hd;
    double *oi = job->o + ((size_t)row * p->heads_q + h) * hdv;
    double *lse = job->lse + (size_t)row * p->heads_q + h;
    int64_t lo, hi;
    visible_range(p, i, sq, skv, &lo, &hi);
    for (int d = 0; d < hdv; d++) oi[d] = 0;
    if (hi < lo) {
      *lse = -INFINITY;
      continue;
    }
    double best = -INFINITY;
    for (int64_t j = lo; j <= hi; j++) {
      const float *kj = p->k + ((size_t)(ks + j) * p->heads_kv + hk) * hd;
      scores[j] = scale * dot_ff(qi, kj, hd);
      if (scores[j] > best) best = scores[j];
    }
    double sum = 0;
    for (int64_t j = lo; j <= hi; j++) sum += exp(scores[j] - best);
    double l = best + log(sum);
    *lse = l;
    for (int64_t j = lo; j <= hi; j++) {
      const float *vj = p->v + ((size_t)(ks + j) * p->heads_kv + hk) * hdv;
      axpy_fd(exp(scores[j] - l), vj, oi, hdv);
    }
  }
  free(scores);
}

void sdpa_ref_forward_f64(const sdpa_ref_problem *p, double *o, double *lse,
                          int threads) {
  forward_job job = {p, o, lse};
  parallel_for(p->batch * p->heads_q, threads, forward_item, &job);
}

void sdpa_ref_forward(sdpa_ref_problem *p, int threads) {
  size_t no = sdpa_ref_elements(p, SDPA_REF_O);
  size_t nl = (size_t)p->rows_q * p->heads_q;
  double *o = malloc((no + 1) * sizeof *o);
  double *lse = malloc((nl + 1) * sizeof *lse);
  if (!o || !lse) abort(); /* test support: no way to report */
  sdpa_ref_forward_f64(p, o, lse, threads);
  for (size_t i = 0; i < no; i++) p->o[i] = sdpa_ref_round((float)o[i], p->dtype);
  for (size_t i = 0; i < nl; i++) p->lse[i] = (float)lse[i];
  free(o);
  free(lse);
}

typedef struct backward_job {
  const sdpa_ref_problem *p;
  const double *o, *lse;
  double *dq, *dk, *dv;
} backward_job;

static void backward_item(void *context, int item) {
  backward_job *job = context;
  const sdpa_ref_problem *p = job->p;
  int b = item / p->heads_kv, hk = item % p->heads_kv;
  int group = p->heads_q / p->heads_kv;
  int hd = p->head_dim, hdv = p->head_dim_v;
  double scale = sdpa_ref_scale(p);
  int64_t qs, ks;
  int sq, skv;
  sdpa_ref_sequence_q(p, b, &qs, &sq);
  sdpa_ref_sequence_kv(p, b, &ks, &skv);
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    for (int i = 0; i < sq; i++) {
      int64_t row = qs + i;
      size_t qi_at = ((size_t)row * p->heads_q + h);
      const float *qi = p->q + qi_at * hd;
      const float *doi = p->dout + qi_at * hdv;
      const double *oi = job->o + qi_at * hdv;
      double *dqi = job->dq + qi_at * hd;
      double lse = job->lse[(size_t)row * p->heads_q + h];
      int64_t lo, hi;
      visible_range(p, i, sq, skv, &lo, &hi);
      if (hi < lo) continue; /* dQ row stays 0 */
      double delta = dot_fd(doi, oi, hdv);
      for (int64_t j = lo; j <= hi; j++) {
        size_t kj_at = (size_t)(ks + j) * p->heads_kv + hk;
        const float *kj = p->k + kj_at * hd;
        const float *vj = p->v + kj_at * hdv;
        double prob = exp(scale * dot_ff(qi, kj, hd) - lse);
        double dprob = dot_ff(doi, vj, hdv);
        double ds = prob * (dprob - delta);
        axpy_fd(prob, doi, job->dv + kj_at * hdv, hdv);
        axpy_fd(scale * ds, kj, dqi, hd);
        axpy_fd(scale * ds, qi, job->dk + kj_at * hd, hd);
      }
    }
  }
}

void sdpa_ref_backward_f64(const sdpa_ref_problem *p, const double *o,
                           const double *lse, double *dq, double *dk,
                           double *dv, int threads) {
  memset(dq, 0, sdpa_ref_elements(p, SDPA_REF_DQ) * sizeof *dq);
  memset(dk, 0, sdpa_ref_elements(p, SDPA_REF_DK) * sizeof *dk);
  memset(dv, 0, sdpa_ref_elements(p, SDPA_REF_DV) * sizeof *dv);
  backward_job job = {p, o, lse, dq, dk, dv};
  parallel_for(p->batch * p->heads_kv, threads, backward_item, &job);
}

int sdpa_ref_backward(const sdpa_ref_problem *p, sdpa_ref_grads *out,
                      int threads) {
  size_t no = sdpa_ref_elements(p, SDPA_REF_O);
  size_t nl = (size_t)p->rows_q * p->heads_q;
  double *o = malloc((no + 1) * sizeof *o);
  double *lse = malloc((nl + 1) * sizeof *lse);
  out->dq = malloc((sdpa_ref_elements(p, SDPA_REF_DQ) + 1) * sizeof(double));
  out->dk = malloc((sdpa_ref_elements(p, SDPA_REF_DK) + 1) * sizeof(double));
  out->dv = malloc((sdpa_ref_elements(p, SDPA_REF_DV) + 1) * sizeof(double));
  int rc = -1;
  if (!o || !lse || !out->dq || !out->dk || !out->dv) goto done;
  for (size_t i = 0; i < no; i++) o[i] = p->o[i];
  for (size_t i = 0; i < nl; i++) lse[i] = p->lse[i];
  sdpa_ref_backward_f64(p, o, lse, out->dq, out->dk, out->dv, threads);
  rc = 0;
done:
  free(o);
  free(lse);
  if (rc != 0) sdpa_ref_grads_free(out);
  return rc;
}

void sdpa_ref_grads_free(sdpa_ref_grads *g) {
  if (!g) return;
  free(g->dq);
  free(g->dk);
  free(g->dv);
  g->dq = g->dk = g->dv = NULL;
}

double sdpa_ref_rel_error(const float *x, const double *ref, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    double e = (double)x[i] - ref[i];
    diff += e * e;
    norm += ref[i] * ref[i];
  }
  if (diff != diff) return NAN;
  if (norm == 0) return sqrt(diff);
  return sqrt(diff / norm);
}

size_t sdpa_ref_count_nonfinite(const float *x, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) count++;
  return count;
}

/* ------------------------------------------------------------- layout */

const char *sdpa_ref_style_name(sdpa_ref_style style) {
  switch (style) {
  case SDPA_REF_STYLE_PACKED: return "packed";
  case SDPA_REF_STYLE_PADDED: return "padded";
  case SDPA_REF_STYLE_HEAD_MAJOR: return "head_major";
  case SDPA_REF_STYLE_INTERLEAVED: return "interleaved";
  default: return "?";
  }
}

const char *sdpa_ref_lse_style_name(sdpa_ref_lse_style style) {
  switch (style) {
  case SDPA_REF_LSE_PACKED: return "lse_packed";
  case SDPA_REF_LSE_PADDED: return "lse_padded";
  case SDPA_REF_LSE_TOKEN_MAJOR: return "lse_token_major";
  default: return "?";
  }
}

const char *sdpa_ref_mask_name(sdpa_mask mask) {
  switch (mask) {
  case SDPA_MASK_NONE: return "none";
  case SDPA_MASK_CAUSAL_TOP_LEFT: return "causal_tl";
  case SDPA_MASK_CAUSAL_BOTTOM_RIGHT: return "causal_br";
  case SDPA_MASK_SLIDING_WINDOW: return "window";
  default: return "?";
  }
}

const char *sdpa_ref_dtype_name(sdpa_dtype dtype) {
  return dtype == SDPA_DTYPE_BF16 ? "bf16" : dtype == SDPA_DTYPE_FP16 ? "fp16" : "?";
}

/* Whether q and k/v rows line up token for token (so q, k and v can share
 * one row per token). */
static int rows_match(const sdpa_ref_problem *p) {
  if (p->layout == SDPA_LAYOUT_BSHD) return p->seqlen_q == p->seqlen_kv;
  for (int b = 0; b <= p->batch; b++)
    if (p->cu_seqlens_q[b] != p->cu_seqlens_kv[b]) return 0;
  return 1;
}

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

/* One past the last element tensor t touches (relative to the buffer). */
static int64_t tensor_extent(const sdpa_ref_problem *p,
                             const sdpa_ref_placement *pl, int t) {
  int64_t rows = tensor_rows(p, t);
  if (rows == 0) return pl->offset;
  int heads = tensor_heads(p, t), dim = tensor_dim(p, t);
  int64_t last = pl->offset + (int64_t)(heads - 1) * pl->strides.head + dim;
  if (p->layout == SDPA_LAYOUT_THD) return last + (rows - 1) * pl->strides.seq;
  return last + (int64_t)(p->batch - 1) * pl->strides.batch +
         (int64_t)(tensor_seqlen(p, t) - 1) * pl->strides.seq;
}

void sdpa_ref_layout_make(sdpa_ref_layout *out, const sdpa_ref_problem *p,
                          sdpa_ref_style style, sdpa_ref_lse_style lse_style) {
  memset(out, 0, sizeof *out);
  out->style = style;
  out->lse_style = lse_style;
  int thd = p->layout == SDPA_LAYOUT_THD;
  for (int t = 0; t < SDPA_REF_TENSORS; t++) {
    int heads = tensor_heads(p, t), dim = tensor_dim(p, t);
    int seqlen = tensor_seqlen(p, t);
    int64_t rows = tensor_rows(p, t);
    sdpa_strides s = {0, 0, 0};
    switch (style) {
    case SDPA_REF_STYLE_PADDED:
      s.head = dim + 8;
      s.seq = (int64_t)heads * (dim + 8) + 8;
      s.batch = thd ? 0 : (int64_t)seqlen * s.seq + 16;
      break;
    case SDPA_REF_STYLE_HEAD_MAJOR:
      s.seq = dim;
      s.head = thd ? (rows > 0 ? rows : 1) * dim : (int64_t)seqlen * dim;
      s.batch = thd ? 0 : (int64_t)heads * seqlen * dim;
      break;
    default: /* packed, and the defaults interleaving overrides below */
      s.head = dim;
      s.seq = (int64_t)heads * dim;
      s.batch = thd ? 0 : (int64_t)seqlen * heads * dim;
      break;
    }
    out->place[t].buffer = t;
    out->place[t].offset = 0;
    out->place[t].strides = s;
    out->declared[t] = style == SDPA_REF_STYLE_PACKED ? (sdpa_strides){0, 0, 0} : s;
  }
  out->buffer_count = SDPA_REF_TENSORS;
  if (style == SDPA_REF_STYLE_INTERLEAVED) {
    /* One row per token holding q heads (if rows match), then k heads,
     * then v heads; the gradients share a second buffer the same way. */
    int with_q = rows_match(p);
    int64_t q_width = (int64_t)p->heads_q * p->head_dim;
    int64_t k_width = (int64_t)p->heads_kv * p->head_dim;
    int64_t v_width = (int64_t)p->heads_kv * p->head_dim_v;
    int64_t width = (with_q ? q_width : 0) + k_width + v_width;
    int64_t k_offset = with_q ? q_width : 0, v_offset = k_offset + k_width;
    /* buffers: with q: 0 qkv, 1 o, 2 dout, 3 dqdkdv;
     *          without: 0 q, 1 kv, 2 o, 3 dout, 4 dq, 5 dkdv */
    int in_kv = with_q ? 0 : 1, out_kv = with_q ? 3 : 5;
    int buffer_of[SDPA_REF_TENSORS] = {
        0, in_kv, in_kv, in_kv + 1, in_kv + 2, with_q ? out_kv : 4, out_kv, out_kv};
    for (int t = 0; t < SDPA_REF_TENSORS; t++) {
      sdpa_ref_placement *pl = &out->place[t];
      pl->buffer = buffer_of[t];
      int shared = tensor_is_kv(t) || (with_q && (t == SDPA_REF_Q || t == SDPA_REF_DQ));
      if (shared) {
        int seqlen = tensor_seqlen(p, t);
        pl->offset = (t == SDPA_REF_K || t == SDPA_REF_DK) ? k_offset
                     : (t == SDPA_REF_V || t == SDPA_REF_DV) ? v_offset : 0;
        pl->strides.head = tensor_dim(p, t);
        pl->strides.seq = width;
        pl->strides.batch = thd ? 0 : (int64_t)seqlen * width;
      }
      out->declared[t] = pl->strides;
    }
    out->buffer_count = with_q ? 4 : 6;
  }
  for (int t = 0; t < SDPA_REF_TENSORS; t++) {
    int buffer = out->place[t].buffer;
    int64_t extent = tensor_extent(p, &out->place[t], t);
    if (extent > out->buffer_elements[buffer]) out->buffer_elements[buffer] = extent;
    if (t >= SDPA_REF_DQ) out->buffer_is_output[buffer] = 1;
  }
  for (int i = 0; i < out->buffer_count; i++) {
    out->buffer_elements[i] = round8(out->buffer_elements[i]);
    if (out->buffer_elements[i] < 8) out->buffer_elements[i] = 8;
  }

  /* LSE. */
  int64_t sq = p->seqlen_q, hq = p->heads_q;
  int64_t rows_q = p->rows_q > 0 ? p->rows_q : 1;
  sdpa_lse_strides ls = {0, 0, 0};
  switch (lse_style) {
  case SDPA_REF_LSE_PADDED:
    ls.seq = 1;
    ls.head = (thd ? rows_q : sq) + 8;
    ls.batch = thd ? 0 : hq * ls.head + 8;
    break;
  case SDPA_REF_LSE_TOKEN_MAJOR:
    ls.head = 1;
    ls.seq = hq;
    ls.batch = thd ? 0 : sq * hq;
    break;
  default:
    ls.seq = 1;
    ls.head = thd ? rows_q : sq;
    ls.batch = thd ? 0 : hq * sq;
    break;
  }
  out->lse_actual = ls;
  out->lse_declared = lse_style == SDPA_REF_LSE_PACKED ? (sdpa_lse_strides){0, 0, 0} : ls;
  int64_t extent = (hq - 1) * ls.head + 1;
  if (thd) extent += (rows_q - 1) * ls.seq;
  else extent += (int64_t)(p->batch - 1) * ls.batch + (sq - 1) * ls.seq;
  out->lse_elements = round8(extent);
}

void sdpa_ref_desc(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                   sdpa_bwd_desc *out) {
  sdpa_bwd_desc d;
  memset(&d, 0, sizeof d);
  d.version = SDPA_BWD_DESC_VERSION;
  d.dtype = p->dtype;
  d.layout = p->layout;
  d.batch = p->batch;
  d.heads_q = p->heads_q;
  d.heads_kv = p->heads_kv;
  d.seqlen_q = p->seqlen_q;
  d.seqlen_kv = p->seqlen_kv;
  d.head_dim = p->head_dim;
  d.head_dim_v = p->head_dim_v;
  d.q = l->declared[SDPA_REF_Q];
  d.k = l->declared[SDPA_REF_K];
  d.v = l->declared[SDPA_REF_V];
  d.o = l->declared[SDPA_REF_O];
  d.dout = l->declared[SDPA_REF_DOUT];
  d.dq = l->declared[SDPA_REF_DQ];
  d.dk = l->declared[SDPA_REF_DK];
  d.dv = l->declared[SDPA_REF_DV];
  d.lse = l->lse_declared;
  d.mask = p->mask;
  d.window_left = p->window_left;
  d.window_right = p->window_right;
  d.scale = p->scale;
  *out = d;
}

/* Element index of (row, head, 0) of tensor t in its buffer. */
static int64_t element_at(const sdpa_ref_problem *p, const sdpa_ref_placement *pl,
                          int t, int64_t row, int head) {
  const sdpa_strides *s = &pl->strides;
  int64_t at = pl->offset + (int64_t)head * s->head;
  if (p->layout == SDPA_LAYOUT_THD) return at + row * s->seq;
  int seqlen = tensor_seqlen(p, t);
  return at + (row / seqlen) * s->batch + (row % seqlen) * s->seq;
}

void sdpa_ref_pack(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                   int tensor, const float *src, uint16_t *buffer) {
  int heads = tensor_heads(p, tensor), dim = tensor_dim(p, tensor);
  int64_t rows = tensor_rows(p, tensor);
  for (int64_t row = 0; row < rows; row++)
    for (int h = 0; h < heads; h++) {
      int64_t at = element_at(p, &l->place[tensor], tensor, row, h);
      const float *x = src + ((size_t)row * heads + h) * dim;
      for (int d = 0; d < dim; d++) buffer[at + d] = sdpa_ref_to_bits(x[d], p->dtype);
    }
}

void sdpa_ref_unpack(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                     int tensor, const uint16_t *buffer, float *dst) {
  int heads = tensor_heads(p, tensor), dim = tensor_dim(p, tensor);
  int64_t rows = tensor_rows(p, tensor);
  for (int64_t row = 0; row < rows; row++)
    for (int h = 0; h < heads; h++) {
      int64_t at = element_at(p, &l->place[tensor], tensor, row, h);
      float *x = dst + ((size_t)row * heads + h) * dim;
      for (int d = 0; d < dim; d++) x[d] = sdpa_ref_from_bits(buffer[at + d], p->dtype);
    }
}

void sdpa_ref_pack_lse(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                       const float *lse, float *buffer) {
  const sdpa_lse_strides *s = &l->lse_actual;
  for (int64_t row = 0; row < p->rows_q; row++)
    for (int h = 0; h < p->heads_q; h++) {
      int64_t at = (int64_t)h * s->head;
      if (p->layout == SDPA_LAYOUT_THD) at += row * s->seq;
      else at += (row / p->seqlen_q) * s->batch + (row % p->seqlen_q) * s->seq;
      buffer[at] = lse[(size_t)row * p->heads_q + h];
    }
}

void sdpa_ref_coverage(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                       int buffer, unsigned char *map) {
  for (int t = 0; t < SDPA_REF_TENSORS; t++) {
    if (l->place[t].buffer != buffer) continue;
    int heads = tensor_heads(p, t), dim = tensor_dim(p, t);
    int64_t rows = tensor_rows(p, t);
    for (int64_t row = 0; row < rows; row++)
      for (int h = 0; h < heads; h++)
        memset(map + element_at(p, &l->place[t], t, row, h), 1, (size_t)dim);
  }
}

void sdpa_ref_describe(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                       char *text, size_t size) {
  int n = snprintf(text, size,
                   "%s %s hd=%d/%d B=%d H=%d/%d S=%d/%d mask=%s", sdpa_ref_dtype_name(p->dtype),
                   p->layout == SDPA_LAYOUT_THD ? "thd" : "bshd", p->head_dim,
                   p->head_dim_v, p->batch, p->heads_q, p->heads_kv, p->seqlen_q,
                   p->seqlen_kv, sdpa_ref_mask_name(p->mask));
  if (n < 0 || (size_t)n >= size) return;
  if (p->mask == SDPA_MASK_SLIDING_WINDOW)
    n += snprintf(text + n, size - (size_t)n, "(%d,%d)", p->window_left, p->window_right);
  if ((size_t)n >= size) return;
  n += snprintf(text + n, size - (size_t)n, " scale=%g", (double)p->scale);
  if (l && (size_t)n < size)
    n += snprintf(text + n, size - (size_t)n, " %s %s", sdpa_ref_style_name(l->style),
                  sdpa_ref_lse_style_name(l->lse_style));
  if (p->layout == SDPA_LAYOUT_THD && (size_t)n < size) {
    n += snprintf(text + n, size - (size_t)n, " total=%lld/%lld lens(q/kv)=",
                  (long long)p->rows_q, (long long)p->rows_kv);
    for (int b = 0; b < p->batch && (size_t)n < size; b++) {
      if (b == 24) {
        n += snprintf(text + n, size - (size_t)n, " ...");
        break;
      }
      n += snprintf(text + n, size - (size_t)n, "%s%d/%d", b ? "," : "",
                    p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b],
                    p->cu_seqlens_kv[b + 1] - p->cu_seqlens_kv[b]);
    }
  }
}

void sdpa_ref_describe_desc(const sdpa_bwd_desc *d, char *text, size_t size) {
  const sdpa_strides *s[8] = {&d->q, &d->k, &d->v, &d->o, &d->dout, &d->dq, &d->dk, &d->dv};
  const char *names[8] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
  int n = snprintf(text, size,
                   "  desc: version=%u dtype=%s layout=%s batch=%d heads_q=%d heads_kv=%d\n"
                   "        seqlen_q=%d seqlen_kv=%d head_dim=%d head_dim_v=%d\n"
                   "        mask=%s window=(%d,%d) scale=%.9g deterministic=%d arch=%d\n"
                   "        max_total_q=%lld max_total_kv=%lld\n"
                   "        lse strides (batch,head,seq)=(%lld,%lld,%lld)\n",
                   d->version, sdpa_ref_dtype_name(d->dtype),
                   d->layout == SDPA_LAYOUT_THD ? "thd" : "bshd", d->batch, d->heads_q,
                   d->heads_kv, d->seqlen_q, d->seqlen_kv, d->head_dim, d->head_dim_v,
                   sdpa_ref_mask_name(d->mask), d->window_left, d->window_right,
                   (double)d->scale, d->deterministic, d->arch, (long long)d->max_total_q,
                   (long long)d->max_total_kv, (long long)d->lse.batch,
                   (long long)d->lse.head, (long long)d->lse.seq);
  for (int i = 0; i < 8 && n >= 0 && (size_t)n < size; i++)
    n += snprintf(text + n, size - (size_t)n,
                  "        %-4s strides (batch,seq,head)=(%lld,%lld,%lld)\n", names[i],
                  (long long)s[i]->batch, (long long)s[i]->seq, (long long)s[i]->head);
}
