/*
 * test_cpu_reference.c — proves the float64 CPU reference (tests/support/
 * reference.c) right, so the GPU tests can trust it.
 *
 * - dtype conversions: every fp16/bf16 bit pattern round-trips, ties go to
 *   even, overflow and subnormals round correctly (and agree with the
 *   compiler's _Float16 where it has one);
 * - the forward agrees with a naive evaluation written from the mask
 *   definitions in the public header (not from the reference's ranges);
 * - the backward equals central finite differences of the loss
 *   L = sum(O * dO) of the float64 forward, for every mask kind, GQA/MQA,
 *   head_dim_v < head_dim and THD with empty and unequal sequences;
 * - host layouts: every style packs and unpacks losslessly, tensors sharing
 *   a buffer never overlap, strides match their definitions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "reference.h"

/* ------------------------------------------------------------ numbers */

START_TEST(half_round_trip_every_pattern) {
  for (uint32_t bits = 0; bits < 0x10000u; bits++) {
    float value = sdpa_ref_half_to_float((uint16_t)bits);
    uint16_t back = sdpa_ref_float_to_half(value);
    if (isnan(value)) {
      ck_assert_msg((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) != 0,
                    "NaN 0x%04x came back as 0x%04x", bits, back);
    } else {
      ck_assert_msg(back == bits, "0x%04x -> %a -> 0x%04x", bits, (double)value, back);
    }
  }
}
END_TEST

START_TEST(bf16_round_trip_every_pattern) {
  for (uint32_t bits = 0; bits < 0x10000u; bits++) {
    float value = sdpa_ref_bf16_to_float((uint16_t)bits);
    uint16_t back = sdpa_ref_float_to_bf16(value);
    if (isnan(value)) {
      ck_assert_msg(isnan(sdpa_ref_bf16_to_float(back)), "NaN 0x%04x lost", bits);
    } else {
      ck_assert_msg(back == bits, "0x%04x -> %a -> 0x%04x", bits, (double)value, back);
    }
  }
}
END_TEST

/* For consecutive finite values a < b of a 16-bit format, the exact
 * midpoint goes to the one with an even pattern, and anything off the
 * midpoint goes to the nearer one. */
static void check_ties(sdpa_dtype dtype) {
  for (uint32_t bits = 0; bits < 0x7fffu; bits++) {
    float a = sdpa_ref_from_bits((uint16_t)bits, dtype);
    float b = sdpa_ref_from_bits((uint16_t)(bits + 1), dtype);
    if (!isfinite(a) || !isfinite(b)) continue;
    float mid = (float)(((double)a + (double)b) / 2); /* exact in float */
    ck_assert((double)mid == ((double)a + (double)b) / 2);
    uint16_t even = (bits & 1u) ? (uint16_t)(bits + 1) : (uint16_t)bits;
    ck_assert_msg(sdpa_ref_to_bits(mid, dtype) == even, "%s tie 0x%04x",
                  sdpa_ref_dtype_name(dtype), bits);
    ck_assert_msg(sdpa_ref_to_bits(-mid, dtype) == (even | 0x8000u), "%s -tie 0x%04x",
                  sdpa_ref_dtype_name(dtype), bits);
    float above = nextafterf(mid, INFINITY), below = nextafterf(mid, 0.0f);
    ck_assert(sdpa_ref_to_bits(above, dtype) == bits + 1);
    if (below >= a) ck_assert(sdpa_ref_to_bits(below, dtype) == bits);
  }
}

START_TEST(ties_to_even) {
  check_ties(SDPA_DTYPE_FP16);
  check_ties(SDPA_DTYPE_BF16);
}
END_TEST

START_TEST(half_edges) {
  ck_assert_uint_eq(sdpa_ref_float_to_half(65504.0f), 0x7bffu);
  ck_assert_uint_eq(sdpa_ref_float_to_half(65519.99f), 0x7bffu);
  ck_assert_uint_eq(sdpa_ref_float_to_half(65520.0f), 0x7c00u); /* tie to even: inf */
  ck_assert_uint_eq(sdpa_ref_float_to_half(-1e9f), 0xfc00u);
  ck_assert_uint_eq(sdpa_ref_float_to_half(ldexpf(1.0f, -25)), 0x0000u); /* tie: 0 */
  ck_assert_uint_eq(sdpa_ref_float_to_half(ldexpf(1.5f, -25)), 0x0001u);
  ck_assert_uint_eq(sdpa_ref_float_to_half(ldexpf(1.0f, -24)), 0x0001u);
  ck_assert_uint_eq(sdpa_ref_float_to_half(ldexpf(1.0f, -14)), 0x0400u); /* min normal */
  ck_assert_uint_eq(sdpa_ref_float_to_half(ldexpf(1023.5f, -24)), 0x0400u); /* carry */
  ck_assert_uint_eq(sdpa_ref_float_to_half(ldexpf(1.0f, -30)), 0x0000u);
  ck_assert_uint_eq(sdpa_ref_float_to_half(-0.0f), 0x8000u);
  ck_assert_uint_eq(sdpa_ref_float_to_half(INFINITY), 0x7c00u);
  ck_assert(isnan(sdpa_ref_half_to_float(sdpa_ref_float_to_half(NAN))));
  ck_assert_uint_eq(sdpa_ref_float_to_bf16(1.0f), 0x3f80u);
  ck_assert_uint_eq(sdpa_ref_float_to_bf16(3.0e38f), 0x7f62u);
  ck_assert_uint_eq(sdpa_ref_float_to_bf16(3.4028235e38f), 0x7f80u); /* rounds up: inf */
  ck_assert(isnan(sdpa_ref_bf16_to_float(sdpa_ref_float_to_bf16(NAN))));
  /* the poison pattern the GPU tests use is NaN in both formats */
  ck_assert(isnan(sdpa_ref_half_to_float(0xffffu)));
  ck_assert(isnan(sdpa_ref_bf16_to_float(0xffffu)));
}
END_TEST

#ifdef __FLT16_MAX__
__extension__ typedef _Float16 compiler_half;

START_TEST(half_matches_compiler) {
  sdpa_ref_rng rng;
  sdpa_ref_rng_seed(&rng, 7);
  for (int i = 0; i < 2000000; i++) {
    uint32_t raw = (uint32_t)sdpa_ref_rng_next(&rng);
    /* exponents around the fp16 range, both signs */
    raw = (raw & 0x807fffffu) | ((uint32_t)(100 + (raw >> 8) % 50) << 23);
    float value;
    memcpy(&value, &raw, sizeof value);
    compiler_half h = (compiler_half)value;
    uint16_t expected;
    memcpy(&expected, &h, sizeof expected);
    ck_assert_msg(sdpa_ref_float_to_half(value) == expected, "%a", (double)value);
  }
}
END_TEST
#endif

START_TEST(rng_is_seeded) {
  sdpa_ref_rng a, b;
  sdpa_ref_rng_seed(&a, 42);
  sdpa_ref_rng_seed(&b, 42);
  for (int i = 0; i < 100; i++) ck_assert(sdpa_ref_rng_next(&a) == sdpa_ref_rng_next(&b));
  sdpa_ref_rng_seed(&b, 43);
  ck_assert(sdpa_ref_rng_next(&a) != sdpa_ref_rng_next(&b));
  double sum = 0, squares = 0;
  int n = 200000;
  for (int i = 0; i < n; i++) {
    double x = sdpa_ref_rng_normal(&a);
    sum += x;
    squares += x * x;
  }
  ck_assert(fabs(sum / n) < 0.02);
  ck_assert(fabs(squares / n - 1.0) < 0.02);
  for (int i = 0; i < 1000; i++) {
    int x = sdpa_ref_rng_int(&a, -3, 5);
    ck_assert(x >= -3 && x <= 5);
  }
}
END_TEST

START_TEST(error_measures) {
  float x[4] = {1, 2, 3, 4};
  double ref[4] = {1, 2, 3, 4};
  ck_assert(sdpa_ref_rel_error(x, ref, 4) == 0);
  x[3] = 5;
  ck_assert(fabs(sdpa_ref_rel_error(x, ref, 4) - 1 / sqrt(30.0)) < 1e-12);
  double zero[4] = {0, 0, 0, 0};
  float small[4] = {0, 0, 0, 0.5f};
  ck_assert(sdpa_ref_rel_error(small, zero, 4) == 0.5);
  x[1] = NAN;
  ck_assert(isnan(sdpa_ref_rel_error(x, ref, 4)));
  x[2] = INFINITY;
  ck_assert_uint_eq(sdpa_ref_count_nonfinite(x, 4), 2);
}
END_TEST

/* ------------------------------------------------------------ problems */

typedef struct tiny_case {
  const char *name;
  sdpa_layout layout;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim, head_dim_v;
  sdpa_mask mask;
  int left, right;
  float scale;
  int lens_q[4], lens_kv[4]; /* THD */
} tiny_case;

static const tiny_case tiny_cases[] = {
    {"none", SDPA_LAYOUT_BSHD, 2, 2, 2, 5, 6, 4, 0, SDPA_MASK_NONE, 0, 0, 0, {0}, {0}},
    {"causal_tl", SDPA_LAYOUT_BSHD, 1, 2, 2, 6, 6, 4, 0, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 0, 0.7f, {0}, {0}},
    {"causal_tl_sq>skv", SDPA_LAYOUT_BSHD, 1, 1, 1, 7, 4, 4, 0, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 0, 0, {0}, {0}},
    {"causal_br_sq<skv", SDPA_LAYOUT_BSHD, 2, 1, 1, 3, 7, 4, 0, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, {0}, {0}},
    {"causal_br_sq>skv", SDPA_LAYOUT_BSHD, 1, 2, 1, 7, 3, 4, 0, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, {0}, {0}},
    {"window_2_0", SDPA_LAYOUT_BSHD, 1, 2, 2, 6, 6, 4, 0, SDPA_MASK_SLIDING_WINDOW, 2, 0, 0, {0}, {0}},
    {"window_1_2", SDPA_LAYOUT_BSHD, 1, 1, 1, 5, 8, 4, 0, SDPA_MASK_SLIDING_WINDOW, 1, 2, 0, {0}, {0}},
    {"window_unbounded_left", SDPA_LAYOUT_BSHD, 1, 1, 1, 8, 5, 4, 0, SDPA_MASK_SLIDING_WINDOW, -1, 1, 0, {0}, {0}},
    {"window_unbounded_right", SDPA_LAYOUT_BSHD, 1, 1, 1, 6, 6, 4, 0, SDPA_MASK_SLIDING_WINDOW, 1, -1, 0, {0}, {0}},
    {"gqa_4_2", SDPA_LAYOUT_BSHD, 1, 4, 2, 5, 5, 4, 0, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 0, 0, {0}, {0}},
    {"mqa_3_1_hdv", SDPA_LAYOUT_BSHD, 1, 3, 1, 4, 6, 8, 4, SDPA_MASK_NONE, 0, 0, 0.4f, {0}, {0}},
    {"thd_none", SDPA_LAYOUT_THD, 4, 2, 1, 0, 0, 4, 0, SDPA_MASK_NONE, 0, 0, 0, {3, 0, 5, 2}, {4, 0, 2, 3}},
    {"thd_causal_br", SDPA_LAYOUT_THD, 4, 2, 2, 0, 0, 4, 0, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, {5, 2, 0, 3}, {2, 6, 3, 0}},
    {"thd_window", SDPA_LAYOUT_THD, 3, 2, 1, 0, 0, 4, 0, SDPA_MASK_SLIDING_WINDOW, 1, 1, 0, {4, 6, 1}, {6, 3, 2}},
    {"thd_causal_tl", SDPA_LAYOUT_THD, 3, 1, 1, 0, 0, 4, 0, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 0, 0, {4, 6, 1}, {6, 3, 2}},
};
#define TINY_COUNT ((int)(sizeof tiny_cases / sizeof tiny_cases[0]))

static void make_tiny(sdpa_ref_problem *p, const tiny_case *c, sdpa_dtype dtype,
                      uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->dtype = dtype;
  p->layout = c->layout;
  p->batch = c->batch;
  p->heads_q = c->heads_q;
  p->heads_kv = c->heads_kv;
  p->seqlen_q = c->seqlen_q;
  p->seqlen_kv = c->seqlen_kv;
  p->head_dim = c->head_dim;
  p->head_dim_v = c->head_dim_v;
  p->mask = c->mask;
  p->window_left = c->left;
  p->window_right = c->right;
  p->scale = c->scale;
  ck_assert_int_eq(sdpa_ref_problem_alloc(p, c->lens_q, c->lens_kv), 0);
  sdpa_ref_problem_fill(p, seed, 1);
}

/* Visibility straight from the header's definitions. */
static int spec_visible(const sdpa_ref_problem *p, int i, int j, int sq, int skv) {
  int off = skv - sq;
  switch (p->mask) {
  case SDPA_MASK_NONE: return 1;
  case SDPA_MASK_CAUSAL_TOP_LEFT: return j <= i;
  case SDPA_MASK_CAUSAL_BOTTOM_RIGHT: return j <= i + off;
  case SDPA_MASK_SLIDING_WINDOW:
    return (p->window_left < 0 || i + off - p->window_left <= j) &&
           (p->window_right < 0 || j <= i + off + p->window_right);
  default: return 0;
  }
}

START_TEST(forward_matches_naive) {
  int empty_rows = 0, full_rows = 0;
  for (int c = 0; c < TINY_COUNT; c++) {
    sdpa_ref_problem p;
    make_tiny(&p, &tiny_cases[c], SDPA_DTYPE_BF16, 100 + (uint64_t)c);
    size_t no = sdpa_ref_elements(&p, SDPA_REF_O);
    size_t nl = (size_t)p.rows_q * p.heads_q;
    double *o = calloc(no + 1, sizeof *o), *lse = calloc(nl + 1, sizeof *lse);
    sdpa_ref_forward_f64(&p, o, lse, 2);
    int group = p.heads_q / p.heads_kv, hd = p.head_dim, hdv = p.head_dim_v;
    double scale = p.scale != 0 ? p.scale : 1 / sqrt((double)hd);
    for (int b = 0; b < p.batch; b++) {
      int64_t qs, ks;
      int sq, skv;
      sdpa_ref_sequence_q(&p, b, &qs, &sq);
      sdpa_ref_sequence_kv(&p, b, &ks, &skv);
      for (int h = 0; h < p.heads_q; h++)
        for (int i = 0; i < sq; i++) {
          double sum = 0, acc[16] = {0};
          int seen = 0;
          for (int j = 0; j < skv; j++) {
            ck_assert_int_eq(sdpa_ref_visible(&p, i, j, sq, skv), spec_visible(&p, i, j, sq, skv));
            if (!spec_visible(&p, i, j, sq, skv)) continue;
            seen++;
            double s = 0;
            for (int d = 0; d < hd; d++)
              s += (double)p.q[((qs + i) * p.heads_q + h) * hd + d] *
                   p.k[((ks + j) * p.heads_kv + h / group) * hd + d];
            double e = exp(scale * s);
            sum += e;
            for (int d = 0; d < hdv; d++)
              acc[d] += e * p.v[((ks + j) * p.heads_kv + h / group) * hdv + d];
          }
          size_t at = (size_t)(qs + i) * p.heads_q + h;
          if (seen == 0) {
            empty_rows++;
            ck_assert(isinf(lse[at]) && lse[at] < 0);
            ck_assert(isinf(p.lse[at]) && p.lse[at] < 0);
            for (int d = 0; d < hdv; d++) ck_assert(o[at * hdv + d] == 0 && p.o[at * hdv + d] == 0);
            continue;
          }
          full_rows++;
          ck_assert_msg(fabs(lse[at] - log(sum)) < 1e-12, "%s lse", tiny_cases[c].name);
          ck_assert(p.lse[at] == (float)lse[at]);
          for (int d = 0; d < hdv; d++) {
            ck_assert_msg(fabs(o[at * hdv + d] - acc[d] / sum) < 1e-12, "%s o", tiny_cases[c].name);
            ck_assert(p.o[at * hdv + d] == sdpa_ref_round((float)o[at * hdv + d], p.dtype));
          }
        }
    }
    free(o);
    free(lse);
    sdpa_ref_problem_free(&p);
  }
  ck_assert_int_gt(empty_rows, 0); /* the cases do reach rows with no key */
  ck_assert_int_gt(full_rows, 0);
}
END_TEST

/* L = sum(O * dO) of the float64 forward. */
static double loss(const sdpa_ref_problem *p, double *o, double *lse) {
  sdpa_ref_forward_f64(p, o, lse, 1);
  size_t n = sdpa_ref_elements(p, SDPA_REF_O);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += o[i] * p->dout[i];
  return sum;
}

/* Central differences of L in every element of x (a tensor of p), against
 * the analytic gradient; returns the relative error over the tensor. */
static double finite_difference_error(sdpa_ref_problem *p, float *x, size_t n,
                                      const double *analytic, double *o, double *lse) {
  const float step = 0x1.0p-14f;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    float saved = x[i];
    x[i] = saved + step;
    double h_up = (double)x[i] - saved;
    double up = loss(p, o, lse);
    x[i] = saved - step;
    double h_down = (double)saved - x[i];
    double down = loss(p, o, lse);
    x[i] = saved;
    double numeric = (up - down) / (h_up + h_down);
    diff += (numeric - analytic[i]) * (numeric - analytic[i]);
    norm += analytic[i] * analytic[i];
  }
  return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

START_TEST(backward_matches_finite_differences) {
  const tiny_case *c = &tiny_cases[_i];
  sdpa_ref_problem p;
  make_tiny(&p, c, SDPA_DTYPE_FP16, 500 + (uint64_t)_i);
  size_t nq = sdpa_ref_elements(&p, SDPA_REF_Q), nk = sdpa_ref_elements(&p, SDPA_REF_K);
  size_t nv = sdpa_ref_elements(&p, SDPA_REF_V), no = sdpa_ref_elements(&p, SDPA_REF_O);
  size_t nl = (size_t)p.rows_q * p.heads_q;
  double *o = calloc(no + 1, sizeof *o), *lse = calloc(nl + 1, sizeof *lse);
  double *dq = calloc(nq + 1, sizeof *dq), *dk = calloc(nk + 1, sizeof *dk);
  double *dv = calloc(nv + 1, sizeof *dv);
  sdpa_ref_forward_f64(&p, o, lse, 1);
  sdpa_ref_backward_f64(&p, o, lse, dq, dk, dv, 2);

  double norm_q = 0, norm_k = 0, norm_v = 0;
  for (size_t i = 0; i < nq; i++) norm_q += dq[i] * dq[i];
  for (size_t i = 0; i < nk; i++) norm_k += dk[i] * dk[i];
  for (size_t i = 0; i < nv; i++) norm_v += dv[i] * dv[i];
  ck_assert_msg(norm_q > 0 && norm_k > 0 && norm_v > 0, "%s: trivial gradients", c->name);

  double eq = finite_difference_error(&p, p.q, nq, dq, o, lse);
  double ek = finite_difference_error(&p, p.k, nk, dk, o, lse);
  double ev = finite_difference_error(&p, p.v, nv, dv, o, lse);
  ck_assert_msg(eq < 1e-6 && ek < 1e-6 && ev < 1e-6,
                "%s: finite differences disagree: dq %.3g dk %.3g dv %.3g", c->name, eq, ek, ev);

  /* The same through the dtype path (O rounded, LSE fp32) stays close. */
  sdpa_ref_grads g;
  ck_assert_int_eq(sdpa_ref_backward(&p, &g, 1), 0);
  float *as_float = malloc((nq + nk + nv + 1) * sizeof *as_float);
  for (size_t i = 0; i < nq; i++) as_float[i] = (float)g.dq[i];
  ck_assert(sdpa_ref_rel_error(as_float, dq, nq) < 5e-3);
  free(as_float);
  sdpa_ref_grads_free(&g);

  /* Rows with no visible key have dQ = 0; keys no query sees have dK = dV = 0. */
  for (int b = 0; b < p.batch; b++) {
    int64_t qs, ks;
    int sq, skv;
    sdpa_ref_sequence_q(&p, b, &qs, &sq);
    sdpa_ref_sequence_kv(&p, b, &ks, &skv);
    for (int i = 0; i < sq; i++) {
      int any = 0;
      for (int j = 0; j < skv; j++) any |= spec_visible(&p, i, j, sq, skv);
      if (any) continue;
      for (int h = 0; h < p.heads_q; h++)
        for (int d = 0; d < p.head_dim; d++)
          ck_assert(dq[((qs + i) * p.heads_q + h) * p.head_dim + d] == 0);
    }
    for (int j = 0; j < skv; j++) {
      int any = 0;
      for (int i = 0; i < sq; i++) any |= spec_visible(&p, i, j, sq, skv);
      if (any) continue;
      for (int h = 0; h < p.heads_kv; h++) {
        for (int d = 0; d < p.head_dim; d++)
          ck_assert(dk[((ks + j) * p.heads_kv + h) * p.head_dim + d] == 0);
        for (int d = 0; d < p.head_dim_v; d++)
          ck_assert(dv[((ks + j) * p.heads_kv + h) * p.head_dim_v + d] == 0);
      }
    }
  }
  free(o);
  free(lse);
  free(dq);
  free(dk);
  free(dv);
  sdpa_ref_problem_free(&p);
}
END_TEST

/* A wrong formula must not pass the finite-difference check: drop the
 * Delta term and the check sees it. */
START_TEST(finite_differences_catch_errors) {
  sdpa_ref_problem p;
  make_tiny(&p, &tiny_cases[0], SDPA_DTYPE_BF16, 9);
  size_t nq = sdpa_ref_elements(&p, SDPA_REF_Q), nk = sdpa_ref_elements(&p, SDPA_REF_K);
  size_t nv = sdpa_ref_elements(&p, SDPA_REF_V), no = sdpa_ref_elements(&p, SDPA_REF_O);
  size_t nl = (size_t)p.rows_q * p.heads_q;
  double *o = calloc(no, sizeof *o), *lse = calloc(nl, sizeof *lse);
  double *dq = calloc(nq, sizeof *dq), *dk = calloc(nk, sizeof *dk), *dv = calloc(nv, sizeof *dv);
  double *zero_o = calloc(no, sizeof *zero_o);
  sdpa_ref_forward_f64(&p, o, lse, 1);
  sdpa_ref_backward_f64(&p, zero_o, lse, dq, dk, dv, 1); /* Delta = 0: wrong */
  ck_assert(finite_difference_error(&p, p.q, nq, dq, o, lse) > 1e-3);
  free(o);
  free(lse);
  free(dq);
  free(dk);
  free(dv);
  free(zero_o);
  sdpa_ref_problem_free(&p);
}
END_TEST

START_TEST(thd_offsets_and_hints) {
  sdpa_ref_problem p;
  make_tiny(&p, &tiny_cases[11], SDPA_DTYPE_BF16, 1);
  int32_t expect_q[5] = {0, 3, 3, 8, 10}, expect_kv[5] = {0, 4, 4, 6, 9};
  for (int b = 0; b <= 4; b++) {
    ck_assert_int_eq(p.cu_seqlens_q[b], expect_q[b]);
    ck_assert_int_eq(p.cu_seqlens_kv[b], expect_kv[b]);
  }
  ck_assert_int_eq(p.rows_q, 10);
  ck_assert_int_eq(p.rows_kv, 9);
  ck_assert_int_eq(p.seqlen_q, 5); /* hint defaults to the longest */
  ck_assert_int_eq(p.seqlen_kv, 4);
  /* values are representable in the dtype */
  for (size_t i = 0; i < sdpa_ref_elements(&p, SDPA_REF_Q); i++)
    ck_assert(p.q[i] == sdpa_ref_round(p.q[i], p.dtype));
  /* the same seed gives the same problem */
  sdpa_ref_problem again;
  make_tiny(&again, &tiny_cases[11], SDPA_DTYPE_BF16, 1);
  ck_assert(memcmp(p.q, again.q, sdpa_ref_elements(&p, SDPA_REF_Q) * sizeof(float)) == 0);
  ck_assert(memcmp(p.lse, again.lse, (size_t)p.rows_q * p.heads_q * sizeof(float)) == 0);
  sdpa_ref_problem_free(&again);
  sdpa_ref_problem_free(&p);
}
END_TEST

/* ------------------------------------------------------------- layouts */

static void check_layout(const sdpa_ref_problem *p, sdpa_ref_style style,
                         sdpa_ref_lse_style lse_style) {
  sdpa_ref_layout l;
  sdpa_ref_layout_make(&l, p, style, lse_style);
  uint16_t *buffers[SDPA_REF_MAX_BUFFERS] = {0};
  for (int b = 0; b < l.buffer_count; b++) {
    ck_assert_int_gt(l.buffer_elements[b], 0);
    ck_assert_int_eq(l.buffer_elements[b] % 8, 0);
    buffers[b] = malloc((size_t)l.buffer_elements[b] * sizeof(uint16_t));
    memset(buffers[b], 0xff, (size_t)l.buffer_elements[b] * sizeof(uint16_t));
    /* tensors sharing a buffer do not overlap: count each element's owners */
    unsigned char *map = calloc((size_t)l.buffer_elements[b], 1);
    int64_t owned = 0, expected = 0;
    for (int t = 0; t < SDPA_REF_TENSORS; t++) {
      if (l.place[t].buffer != b) continue;
      unsigned char *one = calloc((size_t)l.buffer_elements[b], 1);
      sdpa_ref_layout single = l;
      for (int u = 0; u < SDPA_REF_TENSORS; u++)
        if (u != t) single.place[u].buffer = -1;
      sdpa_ref_coverage(p, &single, b, one);
      for (int64_t e = 0; e < l.buffer_elements[b]; e++) {
        ck_assert_msg(!(one[e] && map[e]), "%s: tensors overlap in buffer %d",
                      sdpa_ref_style_name(style), b);
        map[e] |= one[e];
      }
      expected += (int64_t)sdpa_ref_elements(p, t);
      free(one);
    }
    for (int64_t e = 0; e < l.buffer_elements[b]; e++) owned += map[e];
    ck_assert_int_eq(owned, expected);
    free(map);
  }
  /* strides: multiples of 8 elements, declared zero only when packed */
  for (int t = 0; t < SDPA_REF_TENSORS; t++) {
    const sdpa_strides *s = &l.place[t].strides;
    ck_assert(s->seq % 8 == 0 && s->head % 8 == 0 && s->batch % 8 == 0);
    ck_assert(l.place[t].offset % 8 == 0);
    int zero = l.declared[t].batch == 0 && l.declared[t].seq == 0 && l.declared[t].head == 0;
    ck_assert_int_eq(zero, style == SDPA_REF_STYLE_PACKED);
  }
  /* pack then unpack every tensor gives it back */
  const float *src[SDPA_REF_TENSORS] = {p->q, p->k, p->v, p->o, p->dout, p->q, p->k, p->v};
  for (int t = 0; t < SDPA_REF_TENSORS; t++)
    sdpa_ref_pack(p, &l, t, src[t], buffers[l.place[t].buffer]);
  for (int t = 0; t < SDPA_REF_TENSORS; t++) {
    size_t n = sdpa_ref_elements(p, t);
    float *back = malloc((n + 1) * sizeof *back);
    sdpa_ref_unpack(p, &l, t, buffers[l.place[t].buffer], back);
    ck_assert_msg(memcmp(back, src[t], n * sizeof(float)) == 0, "%s tensor %d",
                  sdpa_ref_style_name(style), t);
    free(back);
  }
  /* LSE: every row/head lands on its own element */
  float *lse = malloc((size_t)l.lse_elements * sizeof *lse);
  for (int64_t i = 0; i < l.lse_elements; i++) lse[i] = -12345.0f;
  float *values = malloc(((size_t)p->rows_q * p->heads_q + 1) * sizeof *values);
  for (int64_t i = 0; i < p->rows_q * p->heads_q; i++) values[i] = (float)i;
  sdpa_ref_pack_lse(p, &l, values, lse);
  int64_t placed = 0;
  for (int64_t i = 0; i < l.lse_elements; i++) placed += lse[i] != -12345.0f;
  ck_assert_int_eq(placed, p->rows_q * p->heads_q);
  ck_assert(l.lse_actual.seq == 1 || lse_style == SDPA_REF_LSE_TOKEN_MAJOR);
  free(values);
  free(lse);
  for (int b = 0; b < l.buffer_count; b++) free(buffers[b]);
}

START_TEST(layouts_round_trip) {
  int cases[] = {0, 3, 10, 11, 12};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tiny_case tc = tiny_cases[cases[c]];
    tc.head_dim = 16;
    if (tc.head_dim_v) tc.head_dim_v = 8;
    sdpa_ref_problem p;
    make_tiny(&p, &tc, SDPA_DTYPE_FP16, 3);
    for (int s = 0; s < SDPA_REF_STYLE_COUNT; s++)
      for (int ls = 0; ls < SDPA_REF_LSE_COUNT; ls++) check_layout(&p, s, ls);
    sdpa_ref_problem_free(&p);
  }
}
END_TEST

START_TEST(layout_strides_by_definition) {
  sdpa_ref_problem p = {0};
  p.dtype = SDPA_DTYPE_BF16;
  p.layout = SDPA_LAYOUT_BSHD;
  p.batch = 3;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 5;
  p.seqlen_kv = 5;
  p.head_dim = 16;
  p.head_dim_v = 8;
  ck_assert_int_eq(sdpa_ref_problem_alloc(&p, NULL, NULL), 0);
  sdpa_ref_layout l;
  sdpa_ref_layout_make(&l, &p, SDPA_REF_STYLE_PACKED, SDPA_REF_LSE_PACKED);
  ck_assert_int_eq(l.place[SDPA_REF_Q].strides.batch, 5 * 4 * 16);
  ck_assert_int_eq(l.place[SDPA_REF_Q].strides.seq, 4 * 16);
  ck_assert_int_eq(l.place[SDPA_REF_Q].strides.head, 16);
  ck_assert_int_eq(l.place[SDPA_REF_V].strides.seq, 2 * 8);
  ck_assert_int_eq(l.lse_actual.batch, 4 * 5);
  ck_assert_int_eq(l.lse_actual.head, 5);
  sdpa_ref_layout_make(&l, &p, SDPA_REF_STYLE_HEAD_MAJOR, SDPA_REF_LSE_TOKEN_MAJOR);
  ck_assert_int_eq(l.place[SDPA_REF_K].strides.batch, 2 * 5 * 16);
  ck_assert_int_eq(l.place[SDPA_REF_K].strides.head, 5 * 16);
  ck_assert_int_eq(l.place[SDPA_REF_K].strides.seq, 16);
  ck_assert_int_eq(l.lse_actual.seq, 4);
  ck_assert_int_eq(l.lse_actual.head, 1);
  sdpa_ref_layout_make(&l, &p, SDPA_REF_STYLE_INTERLEAVED, SDPA_REF_LSE_PACKED);
  ck_assert_int_eq(l.buffer_count, 4);
  ck_assert_int_eq(l.place[SDPA_REF_K].buffer, l.place[SDPA_REF_Q].buffer);
  ck_assert_int_eq(l.place[SDPA_REF_K].offset, 4 * 16);
  ck_assert_int_eq(l.place[SDPA_REF_V].offset, 4 * 16 + 2 * 16);
  ck_assert_int_eq(l.place[SDPA_REF_Q].strides.seq, 4 * 16 + 2 * 16 + 2 * 8);
  ck_assert_int_eq(l.place[SDPA_REF_DV].buffer, l.place[SDPA_REF_DQ].buffer);
  ck_assert_int_ne(l.place[SDPA_REF_DV].buffer, l.place[SDPA_REF_V].buffer);
  sdpa_bwd_desc d;
  sdpa_ref_desc(&p, &l, &d);
  ck_assert_int_eq(d.k.seq, 4 * 16 + 2 * 16 + 2 * 8);
  ck_assert_int_eq(d.head_dim_v, 8);
  ck_assert_int_eq(d.version, SDPA_BWD_DESC_VERSION);
  sdpa_ref_problem_free(&p);
  p.seqlen_kv = 7; /* rows differ: only k and v share a buffer */
  ck_assert_int_eq(sdpa_ref_problem_alloc(&p, NULL, NULL), 0);
  sdpa_ref_layout_make(&l, &p, SDPA_REF_STYLE_INTERLEAVED, SDPA_REF_LSE_PACKED);
  ck_assert_int_eq(l.buffer_count, 6);
  ck_assert_int_ne(l.place[SDPA_REF_K].buffer, l.place[SDPA_REF_Q].buffer);
  ck_assert_int_eq(l.place[SDPA_REF_K].buffer, l.place[SDPA_REF_V].buffer);
  ck_assert_int_eq(l.place[SDPA_REF_K].offset, 0);
  sdpa_ref_problem_free(&p);
}
END_TEST

static Suite *reference_suite(void) {
  Suite *s = suite_create("reference");
  TCase *numbers = tcase_create("numbers");
  tcase_add_test(numbers, half_round_trip_every_pattern);
  tcase_add_test(numbers, bf16_round_trip_every_pattern);
  tcase_add_test(numbers, ties_to_even);
  tcase_add_test(numbers, half_edges);
#ifdef __FLT16_MAX__
  tcase_add_test(numbers, half_matches_compiler);
#endif
  tcase_add_test(numbers, rng_is_seeded);
  tcase_add_test(numbers, error_measures);
  suite_add_tcase(s, numbers);
  TCase *math = tcase_create("math");
  tcase_set_timeout(math, 120);
  tcase_add_test(math, forward_matches_naive);
  tcase_add_loop_test(math, backward_matches_finite_differences, 0, TINY_COUNT);
  tcase_add_test(math, finite_differences_catch_errors);
  tcase_add_test(math, thd_offsets_and_hints);
  suite_add_tcase(s, math);
  TCase *layout = tcase_create("layout");
  tcase_add_test(layout, layouts_round_trip);
  tcase_add_test(layout, layout_strides_by_definition);
  suite_add_tcase(s, layout);
  return s;
}

int main(void) { return sdpa_test_run(reference_suite()); }
