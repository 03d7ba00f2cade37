/*
 * test_cpu_plan.c — descriptor validation, defaults and workspace sizing.
 *
 * Every rule sdpa_bwd_plan_create enforces has a test that breaks it and
 * checks the status and that the message names the field (the user of a
 * framework sees nothing but that message). Then the defaults a valid
 * descriptor gets (packed strides, head_dim_v, scale, THD totals) and the
 * workspace formula, recomputed here from the plan's tiles.
 *
 * Needs no GPU: the runtime's arch option is 90.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "test_cache.h"
#include "driver.h"
#include "instantiate.h"
#include "plan.h"
#include "sdpa_jit.h"

static sdpa_runtime *rt;

static void open_runtime(void) { rt = sdpa_test_memory_runtime(90); }

static void close_runtime(void) {
  sdpa_runtime_destroy(rt);
  rt = NULL;
}

/* fp16 BSHD 2 x 256 x 8 x 64 */
static sdpa_bwd_desc good(void) {
  sdpa_bwd_desc d;
  memset(&d, 0, sizeof d);
  d.version = SDPA_BWD_DESC_VERSION;
  d.dtype = SDPA_DTYPE_FP16;
  d.layout = SDPA_LAYOUT_BSHD;
  d.batch = 2;
  d.heads_q = 8;
  d.heads_kv = 8;
  d.seqlen_q = 256;
  d.seqlen_kv = 256;
  d.head_dim = 64;
  return d;
}

/* Creates a plan from `d` expecting `status` and every substring of the
 * NULL-terminated list `subs` in sdpa_last_error(). */
static void expect_with(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o,
                        sdpa_status status, const char *const *subs) {
  /* not NULL: a failing create must reset it */
  sdpa_bwd_plan *plan = (sdpa_bwd_plan *)(uintptr_t)16;
  sdpa_status st = sdpa_bwd_plan_create_with(&plan, rt, d, o);
  ck_assert_msg(st == status, "expected %s, got %s (%s)",
                sdpa_status_name(status), sdpa_status_name(st),
                sdpa_last_error());
  if (status != SDPA_STATUS_SUCCESS) {
    ck_assert_ptr_null(plan);
    for (int i = 0; subs[i]; i++)
      ck_assert_msg(strstr(sdpa_last_error(), subs[i]) != NULL,
                    "message \"%s\" lacks \"%s\"", sdpa_last_error(), subs[i]);
  } else {
    sdpa_bwd_plan_destroy(plan);
  }
}

static void expect(const sdpa_bwd_desc *d, sdpa_status status, const char *const *subs) {
  expect_with(d, NULL, status, subs);
}

#define REJECT(d, st, ...)                                                    \
  expect(&(d), SDPA_STATUS_##st, (const char *const[]){__VA_ARGS__, NULL})
#define REJECT_WITH(d, o, st, ...)                                            \
  expect_with(&(d), &(o), SDPA_STATUS_##st, (const char *const[]){__VA_ARGS__, NULL})

static sdpa_bwd_plan *make_with(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o) {
  sdpa_bwd_plan *plan = NULL;
  sdpa_status st = sdpa_bwd_plan_create_with(&plan, rt, d, o);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan_create: %s: %s",
                sdpa_status_name(st), sdpa_last_error());
  return plan;
}

static sdpa_bwd_plan *make(const sdpa_bwd_desc *d) { return make_with(d, NULL); }

/* Makes the suite's runtime afresh with `name`=`value` in the environment
 * (NULL: unset), then takes the variable away again: the runtime read its
 * plan options' defaults when it was made, and keeps them. */
static void runtime_with_env(const char *name, const char *value) {
  if (value)
    ck_assert_int_eq(setenv(name, value, 1), 0);
  else
    unsetenv(name);
  close_runtime();
  open_runtime();
  unsetenv(name);
}

/* Each of `bad` as environment variable `name` fails plans for d with
 * INVALID_ARGUMENT naming the variable and what is `allowed`; then the
 * variable is unset again. */
static void env_values_rejected(sdpa_bwd_desc d, const char *name, const char *const *bad,
                                size_t count, const char *allowed) {
  for (size_t i = 0; i < count; ++i) {
    runtime_with_env(name, bad[i]);
    REJECT(d, INVALID_ARGUMENT, name, allowed);
  }
  runtime_with_env(name, NULL);
}

/* A count variable of 1 to 65535 (the head chunks, the tail split): 0,
 * -1, a trailing letter and 70000 each rejected as env_values_rejected
 * says, naming `allowed`. */
static void count_env_rejected(sdpa_bwd_desc d, const char *name, const char *allowed) {
  static const char *const bad[] = {"0", "-1", "2x", "70000"};
  env_values_rejected(d, name, bad, sizeof bad / sizeof bad[0], allowed);
}

/* Plan options with one field set. */
static sdpa_bwd_plan_options options_dq(sdpa_dq_writer w) {
  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  o.dq_writer = w;
  return o;
}

START_TEST(null_arguments) {
  sdpa_bwd_desc d = good();
  sdpa_bwd_plan *plan = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create(NULL, rt, &d),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "out is NULL"));
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, NULL, &d),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "runtime is NULL"));
  ck_assert_ptr_null(plan);
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, NULL),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "desc is NULL"));
  ck_assert_ptr_null(plan);
  /* the accessors and destroy accept NULL */
  sdpa_bwd_plan_destroy(NULL);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(NULL), 0);
  ck_assert_str_eq(sdpa_bwd_plan_key(NULL), "");
  ck_assert_str_eq(sdpa_bwd_plan_key_hash(NULL), "");
  ck_assert_str_eq(sdpa_bwd_plan_compile_log(NULL), "");
}
END_TEST

START_TEST(version) {
  sdpa_bwd_desc d = good();
  d.version = 0;
  REJECT(d, INVALID_ARGUMENT, "desc.version = 0", "SDPA_BWD_DESC_INIT");
  d.version = SDPA_BWD_DESC_VERSION + 1;
  REJECT(d, INVALID_ARGUMENT, "desc.version");
}
END_TEST

START_TEST(dtype_and_layout) {
  sdpa_bwd_desc d = good();
  d.dtype = (sdpa_dtype)0;
  REJECT(d, INVALID_ARGUMENT, "desc.dtype = 0", "SDPA_DTYPE_FP16");
  d.dtype = (sdpa_dtype)3;
  REJECT(d, INVALID_ARGUMENT, "desc.dtype = 3");
  d = good();
  d.layout = (sdpa_layout)0;
  REJECT(d, INVALID_ARGUMENT, "desc.layout = 0", "SDPA_LAYOUT_THD");
  d.layout = (sdpa_layout)7;
  REJECT(d, INVALID_ARGUMENT, "desc.layout = 7");
}
END_TEST

START_TEST(dims_below_one) {
  const char *names[] = {"batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv"};
  for (int i = 0; i < 5; i++) {
    for (int value = 0; value >= -1; value--) {
      sdpa_bwd_desc d = good();
      int *field[] = {&d.batch, &d.heads_q, &d.heads_kv, &d.seqlen_q,
                      &d.seqlen_kv};
      *field[i] = value;
      char text[64];
      snprintf(text, sizeof text, "desc.%s = %d is out of range", names[i],
               value);
      REJECT(d, INVALID_ARGUMENT, text, "between 1 and");
    }
  }
}
END_TEST

START_TEST(dims_above_limits) {
  sdpa_bwd_desc d = good();
  d.batch = (1 << 24) + 1;
  REJECT(d, INVALID_ARGUMENT, "desc.batch = 16777217", "16777216");
  d = good();
  d.heads_q = d.heads_kv = (1 << 16) + 1;
  REJECT(d, INVALID_ARGUMENT, "desc.heads_q", "65536");
  d = good();
  d.seqlen_kv = (1 << 30) + 1;
  REJECT(d, INVALID_ARGUMENT, "desc.seqlen_kv", "1073741824");
  d = good();
  d.seqlen_q = INT32_MAX;
  REJECT(d, INVALID_ARGUMENT, "desc.seqlen_q");
}
END_TEST

/* Each dimension within its limit, together too large for int64 offsets. */
START_TEST(dims_overflow_offsets) {
  sdpa_bwd_desc d = good();
  d.batch = 1 << 24;
  d.seqlen_q = 1 << 30;
  d.heads_q = d.heads_kv = 1 << 16;
  d.head_dim = 256;
  REJECT(d, INVALID_ARGUMENT, "desc.q strides", "packed default", "int64");
}
END_TEST

/* Every dimension valid, but the launch grids outgrow the hardware's
 * limits: the plan says so (execute would fail on every call). */
START_TEST(launch_grid_limits) {
  sdpa_bwd_desc d = good();
  d.heads_q = d.heads_kv = 1 << 16; /* grid y is at most 65535 */
  REJECT(d, NOT_SUPPORTED, "desc.heads_kv = 65536", "launch grid");
  d = good();
  d.batch = 1 << 24;
  d.seqlen_q = d.seqlen_kv = 4096;
  d.heads_q = d.heads_kv = 64; /* convert grid: 256 blocks x 2^24 x 64 */
  REJECT(d, NOT_SUPPORTED, "desc.batch = 16777216", "launch grid");
  d.heads_q = d.heads_kv = 1; /* 256 x 2^24 = 2^32 blocks still */
  REJECT(d, NOT_SUPPORTED, "desc.seqlen_q = 4096", "launch grid");
  d.batch = 1 << 16; /* 2^24 blocks: fits */
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->convert_grid_x, (int64_t)(4096 / 16) << 16);
  ck_assert_int_eq(plan->main_grid_x,
                   (int64_t)(4096 / plan->fields.kv_tile) << 16);
  sdpa_bwd_plan_destroy(plan);
  /* THD: sequences and max_s are bounded each on its own; the convert
   * grid (2^26 x 2^24 query blocks x 2^15 heads) passes int64 while the
   * main grid (one kv tile x 2^24) fits */
  d = good();
  d.layout = SDPA_LAYOUT_THD;
  d.batch = 1 << 24;
  d.seqlen_q = 1 << 30;
  d.seqlen_kv = 128;
  d.heads_q = d.heads_kv = 1 << 15;
  d.max_total_q = d.max_total_kv = 1024;
  REJECT(d, NOT_SUPPORTED, "desc.batch = 16777216", "launch grid");
}
END_TEST

START_TEST(strides_overflow) {
  const int64_t huge = INT64_MAX / 2 / 8 * 8;
  sdpa_bwd_desc d = good();
  d.k.batch = huge;
  d.k.seq = 8 * 64;
  d.k.head = 64;
  REJECT(d, INVALID_ARGUMENT, "desc.k strides", "overflow", "int64");
  d = good();
  d.batch = 1;
  d.dv.seq = huge;
  d.dv.head = 64;
  d.dv.batch = 0;
  REJECT(d, INVALID_ARGUMENT, "desc.dv strides", "overflow");
  /* one huge stride with a single row is fine: offset 0 * stride */
  d = good();
  d.batch = 1;
  d.q.batch = huge;
  d.q.seq = 512;
  d.q.head = 64;
  sdpa_bwd_plan_destroy(make(&d));
  d = good();
  d.lse.batch = huge;
  d.lse.head = 256;
  d.lse.seq = 1;
  REJECT(d, INVALID_ARGUMENT, "desc.lse strides", "overflow");
}
END_TEST

START_TEST(heads_not_multiple) {
  sdpa_bwd_desc d = good();
  d.heads_q = 12;
  d.heads_kv = 5;
  REJECT(d, INVALID_ARGUMENT, "heads_q 12 is not a multiple of heads_kv 5");
  d.heads_kv = 24;
  REJECT(d, INVALID_ARGUMENT, "heads_q 12 is not a multiple of heads_kv 24");
}
END_TEST

START_TEST(head_dim_unsupported) {
  sdpa_bwd_desc d = good();
  d.head_dim = 100;
  REJECT(d, INVALID_ARGUMENT,
         "desc.head_dim = 100 is not supported: supported are multiples of 8 from 8 "
         "to 256");
  d.head_dim = 0;
  REJECT(d, INVALID_ARGUMENT, "desc.head_dim = 0 is not supported");
  d.head_dim = 264;
  REJECT(d, INVALID_ARGUMENT, "desc.head_dim = 264 is not supported");
  d = good();
  d.head_dim_v = 44;
  REJECT(d, INVALID_ARGUMENT, "desc.head_dim_v = 44 is not supported");
  d = good();
  d.head_dim = 128;
  d.head_dim_v = 136;
  REJECT(d, INVALID_ARGUMENT, "desc.head_dim_v = 136 is larger than desc.head_dim = 128");
  /* every multiple of 8 up to 256 is planned by default (options.any_head_dim
   * ON); OFF, the plan's own or SDPA_JIT_ANY_HEAD_DIM=0's, restricts plans
   * to the measured six */
  runtime_with_env("SDPA_JIT_ANY_HEAD_DIM", NULL);
  d = good();
  d.head_dim = 80;
  d.head_dim_v = 40;
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->options.any_head_dim, SDPA_SWITCH_ON);
  ck_assert_int_eq(plan->fields.head_dim, 80);
  ck_assert_int_eq(plan->fields.head_dim_v, 40);
  sdpa_bwd_plan_destroy(plan);
  const int odd[][2] = {{8, 8}, {16, 8}, {72, 72}, {248, 120}, {256, 248}};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    d.head_dim = odd[i][0];
    d.head_dim_v = odd[i][1];
    sdpa_bwd_plan_destroy(make(&d));
  }
  d.head_dim = 80;
  d.head_dim_v = 40;
  sdpa_bwd_plan_options any = SDPA_BWD_PLAN_OPTIONS_INIT;
  any.any_head_dim = SDPA_SWITCH_OFF;
  REJECT_WITH(d, any, NOT_SUPPORTED, "desc.head_dim = 80, head_dim_v = 40",
              "options.any_head_dim = SDPA_SWITCH_OFF restricts plans to the measured head "
              "dims 32, 64, 96, 128, 192 and 256",
              "set options.any_head_dim = SDPA_SWITCH_ON");
  d.head_dim = 128;
  REJECT_WITH(d, any, NOT_SUPPORTED, "head_dim_v = 40", "restricts");
  d.head_dim_v = 64;
  sdpa_bwd_plan_destroy(make_with(&d, &any));
  runtime_with_env("SDPA_JIT_ANY_HEAD_DIM", "0");
  sdpa_bwd_plan_destroy(make(&d)); /* 128 / 64: measured */
  d.head_dim = 80;
  d.head_dim_v = 40;
  REJECT(d, NOT_SUPPORTED, "desc.head_dim = 80, head_dim_v = 40",
         "SDPA_JIT_ANY_HEAD_DIM=0 (the runtime's default of options.any_head_dim) restricts",
         "unset SDPA_JIT_ANY_HEAD_DIM");
  any.any_head_dim = SDPA_SWITCH_ON; /* a plan's own choice wins */
  sdpa_bwd_plan_destroy(make_with(&d, &any));
  runtime_with_env("SDPA_JIT_ANY_HEAD_DIM", "1");
  sdpa_bwd_plan_destroy(make(&d));
  any.any_head_dim = SDPA_SWITCH_OFF;
  REJECT_WITH(d, any, NOT_SUPPORTED, "options.any_head_dim = SDPA_SWITCH_OFF restricts");
  runtime_with_env("SDPA_JIT_ANY_HEAD_DIM", "yes");
  REJECT(d, INVALID_ARGUMENT, "SDPA_JIT_ANY_HEAD_DIM = \"yes\" is not valid");
  runtime_with_env("SDPA_JIT_ANY_HEAD_DIM", NULL);
  /* a version 1 options struct (before any_head_dim) is still read */
  sdpa_bwd_plan_options v1 = SDPA_BWD_PLAN_OPTIONS_INIT;
  v1.version = 1;
  v1.any_head_dim = (sdpa_switch)77; /* past a version 1 struct: never read */
  d.head_dim = 64;
  d.head_dim_v = 0;
  sdpa_bwd_plan_destroy(make_with(&d, &v1));
}
END_TEST

START_TEST(head_dim_v_above_head_dim) {
  sdpa_bwd_desc d = good();
  d.head_dim = 64;
  d.head_dim_v = 128;
  REJECT(d, INVALID_ARGUMENT, "desc.head_dim_v = 128",
         "must be <= head_dim");
}
END_TEST

START_TEST(stride_not_multiple_of_8) {
  sdpa_bwd_desc d = good();
  d.q.batch = 256 * 8 * 64;
  d.q.seq = 8 * 64 + 4;
  d.q.head = 64;
  REJECT(d, INVALID_ARGUMENT, "desc.q.seq = 516", "multiple of 8",
         "16-byte");
  d = good();
  d.dout.batch = 256 * 8 * 64 + 1;
  d.dout.seq = 512;
  d.dout.head = 64;
  REJECT(d, INVALID_ARGUMENT, "desc.dout.batch", "multiple of 8");
  d = good();
  d.dk.batch = 256 * 8 * 64;
  d.dk.seq = 512;
  d.dk.head = 66;
  REJECT(d, INVALID_ARGUMENT, "desc.dk.head = 66", "multiple of 8");
}
END_TEST

START_TEST(negative_or_zero_strides) {
  sdpa_bwd_desc d = good();
  d.k.batch = 256 * 512;
  d.k.seq = 512;
  d.k.head = -8;
  REJECT(d, INVALID_ARGUMENT, "desc.k.head = -8", ">= 1");
  d = good();
  d.v.batch = -8;
  d.v.seq = 512;
  d.v.head = 64;
  REJECT(d, INVALID_ARGUMENT, "desc.v.batch = -8");
  d = good();
  d.o.batch = 256 * 512;
  d.o.seq = 0;
  d.o.head = 64;
  REJECT(d, INVALID_ARGUMENT, "desc.o.seq = 0", ">= 1");
  /* BSHD batch stride 0 with batch > 1 would alias the sequences */
  d = good();
  d.dq.batch = 0;
  d.dq.seq = 512;
  d.dq.head = 64;
  REJECT(d, INVALID_ARGUMENT, "desc.dq.batch = 0", "desc.batch > 1");
  /* ... and is fine for one sequence (a broadcast-free view) */
  d.batch = 1;
  sdpa_bwd_plan_destroy(make(&d));
  /* LSE strides */
  d = good();
  d.lse.batch = 2048;
  d.lse.head = 256;
  d.lse.seq = 0;
  REJECT(d, INVALID_ARGUMENT, "desc.lse.seq = 0", ">= 1");
  d.lse.seq = 1;
  d.lse.head = -1;
  REJECT(d, INVALID_ARGUMENT, "desc.lse.head = -1");
  d.lse.head = 256;
  d.lse.batch = -2048;
  REJECT(d, INVALID_ARGUMENT, "desc.lse.batch = -2048");
}
END_TEST

/* Output strides whose elements would share addresses are refused. BSHD
 * outputs are checked whole; THD outputs one token at a time, since the
 * token totals are the call's (execute checks those, test_cpu_hostile): a
 * head-major output's head stride covers the call's tokens, which may be
 * fewer than the plan's bound. */
START_TEST(output_strides_overlap) {
  sdpa_bwd_desc d = good(); /* 2 x 256 x 8 x 64 */
  d.dq.batch = 8 * 256 * 64;
  d.dq.seq = 64;
  d.dq.head = 255 * 64; /* one row short of [b, h, s, d] */
  REJECT(d, INVALID_ARGUMENT, "desc.dq strides (batch 131072, seq 64, head 16320)",
         "the 2 x 256 x 8 x 64 output share addresses");
  d.dq.head = 256 * 64;
  sdpa_bwd_plan_destroy(make(&d));

  /* THD, head-major for 240 tokens, bound 903 */
  d = good();
  d.layout = SDPA_LAYOUT_THD;
  d.heads_q = d.heads_kv = 4;
  d.max_total_q = d.max_total_kv = 903;
  const sdpa_strides head_major = {0, 64, 240 * 64};
  d.dq = d.dk = d.dv = head_major;
  sdpa_bwd_plan *plan = make(&d);
  const sdpa_bwd_desc *r = &plan->desc;
  ck_assert_int_eq(r->max_total_q, 903);
  ck_assert_int_eq(r->dq.seq, 64);
  ck_assert_int_eq(r->dq.head, 15360);
  /* at a total: the one check plan and execute share */
  ck_assert_int_eq(sdpa_output_strides_check("dq", &r->dq, r->layout, 1, 240, 4, 64,
                                             "tensors.total_q"),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_output_strides_check("dq", &r->dq, r->layout, 1, 241, 4, 64,
                                             "tensors.total_q"),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_str_eq(sdpa_last_error(),
                   "desc.dq strides (batch 0, seq 64, head 15360) make elements of the "
                   "1 x 241 x 4 x 64 output share addresses at tensors.total_q = 241: "
                   "an output needs every element at an address of its own (e.g. the "
                   "packed default, all strides 0); a head-major output's head stride "
                   "must cover the call's tokens");
  sdpa_bwd_plan_destroy(plan);
  /* token-major with the bound's tokens is fine at any total */
  const sdpa_strides token_major = {0, 4 * 64, 64};
  ck_assert_int_eq(sdpa_output_strides_check("dk", &token_major, SDPA_LAYOUT_THD, 1, 903, 4,
                                             64, "tensors.total_kv"),
                   SDPA_STATUS_SUCCESS);
  /* within one token is still the plan's to refuse */
  d.dk.head = 32; /* heads half a head_dim apart */
  REJECT(d, INVALID_ARGUMENT, "desc.dk strides (batch 0, seq 64, head 32)",
         "one token's 4 x 64 (heads x head_dim) output share addresses");
  d.dk = head_major;
  d.dv.seq = 32; /* tokens overlap only across tokens: the call's to say */
  plan = make(&d);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

START_TEST(mask_and_window) {
  sdpa_bwd_desc d = good();
  d.mask = (sdpa_mask)4;
  REJECT(d, INVALID_ARGUMENT, "desc.mask = 4", "SDPA_MASK_SLIDING_WINDOW");
  d.mask = (sdpa_mask)-1;
  REJECT(d, INVALID_ARGUMENT, "desc.mask = -1");
  d = good();
  d.mask = SDPA_MASK_SLIDING_WINDOW;
  d.window_left = -2;
  d.window_right = 0;
  REJECT(d, INVALID_ARGUMENT, "desc.window_left = -2", "-1 for unbounded");
  d.window_left = -1;
  d.window_right = -7;
  REJECT(d, INVALID_ARGUMENT, "desc.window_right = -7");
  d.window_right = 16;
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->desc.window_left, -1);
  ck_assert_int_eq(plan->desc.window_right, 16);
  sdpa_bwd_plan_destroy(plan);
  /* other masks ignore the window fields */
  d.mask = SDPA_MASK_CAUSAL_TOP_LEFT;
  d.window_left = -50;
  plan = make(&d);
  ck_assert_int_eq(plan->desc.window_left, -1);
  ck_assert_int_eq(plan->desc.window_right, -1);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

START_TEST(scale_not_finite) {
  sdpa_bwd_desc d = good();
  d.scale = NAN;
  REJECT(d, INVALID_ARGUMENT, "desc.scale", "finite");
  d.scale = INFINITY;
  REJECT(d, INVALID_ARGUMENT, "desc.scale = inf");
  d.scale = -INFINITY;
  REJECT(d, INVALID_ARGUMENT, "desc.scale");
}
END_TEST

START_TEST(arch_unsupported) {
  sdpa_bwd_desc d = good();
  d.arch = 75;
  REJECT(d, NOT_SUPPORTED, "desc.arch = 75", "sm_75 and older are not supported");
  d.arch = 70;
  REJECT(d, NOT_SUPPORTED, "sm_75 and older are not supported");
  d.arch = 85;
  REJECT(d, NOT_SUPPORTED, "desc.arch = 85", "NVRTC", "80");
  d.arch = -3;
  REJECT(d, INVALID_ARGUMENT, "desc.arch = -3");
  /* the runtime's arch option goes through the same checks */
  sdpa_runtime *old = rt, *r75 = sdpa_test_memory_runtime(75);
  rt = r75;
  d.arch = 0;
  REJECT(d, NOT_SUPPORTED, "runtime option arch = 75", "sm_75 and older");
  rt = old;
  sdpa_runtime_destroy(r75);
  /* every arch NVRTC knows from 80 up is accepted */
  int archs[] = {80, 86, 89, 90, 100, 120};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
    d.arch = archs[i];
    sdpa_bwd_plan *plan = make(&d);
    ck_assert_int_eq(plan->fields.arch, archs[i]);
    sdpa_bwd_plan_destroy(plan);
  }
}
END_TEST

/* No arch anywhere: NO_DEVICE, after every other field was checked. */
START_TEST(arch_missing_without_gpu) {
  if (sdpa_driver_get(NULL) == SDPA_STATUS_SUCCESS) return; /* has a GPU */
  sdpa_runtime *bare = sdpa_test_memory_runtime(0), *old = rt;
  ck_assert_int_eq(sdpa_runtime_arch(bare), 0);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "no GPU found"));
  rt = bare;
  sdpa_bwd_desc d = good();
  REJECT(d, NO_DEVICE,
         "no GPU found: set desc.arch or the runtime option arch");
  d.head_dim = 100; /* a bad field is still reported first */
  REJECT(d, INVALID_ARGUMENT, "desc.head_dim = 100");
  rt = old;
  sdpa_runtime_destroy(bare);
}
END_TEST

START_TEST(thd_totals) {
  sdpa_bwd_desc d = good();
  d.layout = SDPA_LAYOUT_THD;
  d.max_total_q = -1;
  REJECT(d, INVALID_ARGUMENT, "desc.max_total_q = -1", "between 1 and");
  d.max_total_q = 0;
  d.max_total_kv = -100;
  REJECT(d, INVALID_ARGUMENT, "desc.max_total_kv = -100");
  d.max_total_kv = (int64_t)INT32_MAX + 1;
  REJECT(d, INVALID_ARGUMENT, "desc.max_total_kv = 2147483648", "int32");
  /* the default batch x max_s can be too large for int32 offsets */
  d = good();
  d.layout = SDPA_LAYOUT_THD;
  d.batch = 1 << 20;
  d.seqlen_q = 1 << 20;
  REJECT(d, INVALID_ARGUMENT, "desc.max_total_q", "default batch x max_s");
  /* the default */
  d = good();
  d.layout = SDPA_LAYOUT_THD;
  d.batch = 3;
  d.seqlen_q = 100;
  d.seqlen_kv = 50;
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->desc.max_total_q, 300);
  ck_assert_int_eq(plan->desc.max_total_kv, 150);
  ck_assert_int_eq(plan->rows_q, 300);
  ck_assert_int_eq(plan->rows_kv, 150);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

START_TEST(defaults_resolved) {
  sdpa_bwd_desc d = good();
  d.head_dim = 128;
  d.deterministic = 5;
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->desc.head_dim_v, 128);
  ck_assert_float_eq_tol(plan->desc.scale, 1.0f / sqrtf(128.0f), 1e-7f);
  ck_assert_int_eq(plan->desc.deterministic, 1);
  ck_assert_int_eq(plan->fields.deterministic, 1);
  ck_assert_int_eq(plan->desc.arch, 90); /* from the runtime option */
  ck_assert_int_eq(plan->fields.arch, 90);
  sdpa_bwd_plan_destroy(plan);
  d.scale = -0.5f; /* any finite scale is kept */
  plan = make(&d);
  ck_assert_float_eq(plan->desc.scale, -0.5f);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

START_TEST(packed_strides_bshd) {
  sdpa_bwd_desc d = good();
  d.seqlen_q = 100;
  d.seqlen_kv = 300;
  d.heads_q = 12;
  d.heads_kv = 4;
  d.head_dim = 128;
  d.head_dim_v = 64;
  sdpa_bwd_plan *plan = make(&d);
  const sdpa_bwd_desc *r = &plan->desc;
  struct { const sdpa_strides *s; int64_t S, H, D; } t[] = {
      {&r->q, 100, 12, 128},  {&r->k, 300, 4, 128},  {&r->v, 300, 4, 64},
      {&r->o, 100, 12, 64},   {&r->dout, 100, 12, 64}, {&r->dq, 100, 12, 128},
      {&r->dk, 300, 4, 128},  {&r->dv, 300, 4, 64}};
  for (int i = 0; i < 8; i++) {
    ck_assert_int_eq(t[i].s->head, t[i].D);
    ck_assert_int_eq(t[i].s->seq, t[i].H * t[i].D);
    ck_assert_int_eq(t[i].s->batch, t[i].S * t[i].H * t[i].D);
  }
  ck_assert_int_eq(r->lse.seq, 1);
  ck_assert_int_eq(r->lse.head, 100);
  ck_assert_int_eq(r->lse.batch, 12 * 100);
  ck_assert_int_eq(plan->fields.lse_packed, 1);
  sdpa_bwd_plan_destroy(plan);

  /* declared strides are kept; a strided LSE is its own key class */
  d.q.batch = 1 << 20;
  d.q.seq = 4096;
  d.q.head = 256;
  d.lse.batch = 1;
  d.lse.head = 2;
  d.lse.seq = 24;
  plan = make(&d);
  ck_assert_int_eq(plan->desc.q.batch, 1 << 20);
  ck_assert_int_eq(plan->desc.q.seq, 4096);
  ck_assert_int_eq(plan->desc.q.head, 256);
  ck_assert_int_eq(plan->desc.lse.seq, 24);
  ck_assert_int_eq(plan->fields.lse_packed, 0);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

START_TEST(packed_strides_thd) {
  sdpa_bwd_desc d = good();
  d.layout = SDPA_LAYOUT_THD;
  d.heads_q = 6;
  d.heads_kv = 2;
  d.head_dim = 96;
  d.max_total_q = 1000;
  d.max_total_kv = 2000;
  sdpa_bwd_plan *plan = make(&d);
  const sdpa_bwd_desc *r = &plan->desc;
  ck_assert_int_eq(r->q.head, 96);
  ck_assert_int_eq(r->q.seq, 6 * 96);
  ck_assert_int_eq(r->q.batch, 0);
  ck_assert_int_eq(r->k.seq, 2 * 96);
  ck_assert_int_eq(r->dv.seq, 2 * 96);
  ck_assert_int_eq(r->dv.batch, 0);
  ck_assert_int_eq(r->lse.seq, 1);
  ck_assert_int_eq(r->lse.head, 1000);
  ck_assert_int_eq(r->lse.batch, 0);
  ck_assert_int_eq(plan->fields.even, 0);
  sdpa_bwd_plan_destroy(plan);

  /* a THD batch stride is ignored (set to 0), not validated */
  d.k.batch = 3;
  d.k.seq = 2 * 96;
  d.k.head = 96;
  plan = make(&d);
  ck_assert_int_eq(plan->desc.k.batch, 0);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

START_TEST(workspace_bshd) {
  sdpa_bwd_desc d = good();
  d.head_dim = 128;
  /* the main kernel writing dQ counts the kv tiles done with each (head,
   * sequence, query tile) in an int32 */
  const sdpa_bwd_plan_options main_dq = options_dq(SDPA_DQ_MAIN);
  sdpa_bwd_plan *plan = make_with(&d, &main_dq);
  size_t dq = align256((size_t)2 * 256 * 8 * 128 * 4);
  size_t delta = align256((size_t)2 * 256 * 8 * 4);
  size_t sem = align256((size_t)8 * 2 * (256 / plan->fields.q_tile) * 4);
  ck_assert_int_eq(plan->fields.fold_dq, 1);
  ck_assert_uint_eq(plan->ws_dq_accum, 0);
  ck_assert_uint_eq(plan->ws_delta, dq);
  ck_assert_uint_eq(plan->ws_semaphores, dq + delta);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), dq + delta + sem);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), 2097152 + 16384 + 256);
  sdpa_bwd_plan_destroy(plan);

  /* deterministic mode uses the same counters (as semaphores) */
  d.deterministic = 1;
  d.batch = 3;
  d.seqlen_q = 17;
  d.heads_q = 3;
  d.heads_kv = 1;
  d.head_dim = 32;
  plan = make_with(&d, &main_dq);
  int qt = plan->fields.q_tile;
  /* dQacc keeps whole 16-row blocks per sequence: 17 rows -> 2 blocks */
  dq = align256((size_t)3 * 2 * 16 * 3 * 32 * 4); /* 36864 */
  delta = align256((size_t)3 * 17 * 3 * 4);       /* 612 -> 768 */
  sem = align256((size_t)3 * 3 * ((17 + qt - 1) / qt) * 4);
  ck_assert_uint_eq(dq, 36864);
  ck_assert_uint_eq(plan->ws_delta, dq);
  ck_assert_uint_eq(plan->ws_semaphores, dq + delta);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), dq + delta + sem);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan) % 256, 0);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

START_TEST(workspace_thd) {
  const sdpa_bwd_plan_options main_dq = options_dq(SDPA_DQ_MAIN);
  sdpa_bwd_desc d = good();
  d.layout = SDPA_LAYOUT_THD;
  d.batch = 4;
  d.heads_q = 4;
  d.heads_kv = 2;
  d.seqlen_q = 700;
  d.max_total_q = 1001;
  sdpa_bwd_plan *plan = make_with(&d, &main_dq);
  /* every sequence may start a 16-row block of its own: 1001/16 + 4 + 1 */
  size_t dq = align256((size_t)(62 + 4 + 1) * 16 * 4 * 64 * 4);
  size_t delta = align256((size_t)1001 * 4 * 4);
  int qt = plan->fields.q_tile;
  size_t sem = align256((size_t)4 * 4 * ((700 + qt - 1) / qt) * 4);
  ck_assert_int_eq(plan->rows_q, 1001);
  ck_assert_int_eq(plan->fields.fold_dq, 1);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), dq + delta + sem);
  sdpa_bwd_plan_destroy(plan);

  d.deterministic = 1; /* the same counters, as semaphores */
  plan = make_with(&d, &main_dq);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), dq + delta + sem);
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

/* Two choices of a plan for `d`: who writes dQ (the key field) and the
 * masked launch order's group size (a parameter, size-dependent). */
typedef struct plan_choices {
  int fold_dq, order_group;
} plan_choices;

static plan_choices choices_with(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o) {
  sdpa_bwd_plan *plan = make_with(d, o);
  const plan_choices c = {plan->fields.fold_dq, plan->params.order_group};
  sdpa_bwd_plan_destroy(plan);
  return c;
}

static plan_choices choices_of(const sdpa_bwd_desc *d) { return choices_with(d, NULL); }

/* Who writes dQ: the convert kernel whatever the size; the main kernel
 * (with the counters it needs) only with options.dq_writer MAIN, or
 * SDPA_JIT_DQ_CONVERT=main in the environment the runtime was made in; the
 * variable is validated, and a plan that sets the option itself does not
 * depend on it. */
START_TEST(dq_writer) {
  sdpa_bwd_desc d = good(); /* 2 x 256 rows x 8 heads x 64 floats: 1 MiB */
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->fields.fold_dq, 0);
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), ";dq=convert"));
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), plan->ws_semaphores); /* none */
  const size_t without_counters = sdpa_bwd_workspace_size(plan);
  sdpa_bwd_plan_destroy(plan);
  d.batch = d.heads_q = d.heads_kv = 1;
  d.seqlen_q = d.seqlen_kv = 16; /* 4 KiB */
  ck_assert_int_eq(choices_of(&d).fold_dq, 0);
  d = good();

  const sdpa_bwd_plan_options main_dq = options_dq(SDPA_DQ_MAIN);
  const sdpa_bwd_plan_options convert_dq = options_dq(SDPA_DQ_CONVERT);
  plan = make_with(&d, &main_dq);
  ck_assert_int_eq(plan->fields.fold_dq, 1);
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), ";dq=main"));
  const size_t with_counters = sdpa_bwd_workspace_size(plan);
  ck_assert_uint_gt(with_counters, plan->ws_semaphores);
  ck_assert_uint_gt(with_counters, without_counters);
  sdpa_bwd_plan_destroy(plan);
  d.seqlen_q = d.seqlen_kv = 16384; /* 64 MiB: still the main kernel */
  ck_assert_int_eq(choices_with(&d, &main_dq).fold_dq, 1);
  d = good();

  ck_assert_int_eq(choices_with(&d, &convert_dq).fold_dq, 0);
  d.deterministic = 1; /* keeps its semaphores */
  plan = make_with(&d, &convert_dq);
  ck_assert_int_eq(plan->fields.fold_dq, 0);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), with_counters);
  ck_assert_uint_eq(plan->ws_dq_accum_copy, plan->ws_delta); /* one copy: empty */
  sdpa_bwd_plan_destroy(plan);
  /* the sm_90a deterministic wide kernel without a mask: two copies of
   * dQacc and of the counters (sdpa_dq_copies), each the size of the first */
  d.head_dim = d.head_dim_v = 192;
  plan = make_with(&d, &convert_dq);
  ck_assert_int_eq(plan->fields.family, SDPA_FAMILY_HOPPER); /* AUTO on sm_90 */
  ck_assert_int_eq(sdpa_dq_copies(plan->fields.family, 1, plan->fields.mask, 192), 2);
  const size_t dq = plan->ws_dq_accum_copy, sem = plan->ws_semaphores_copy - plan->ws_semaphores;
  ck_assert_uint_eq(plan->ws_dq_accum, 0);
  ck_assert_uint_gt(dq, 0);
  ck_assert_uint_eq(plan->ws_delta, 2 * dq);
  ck_assert_uint_gt(sem, 0);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(plan), plan->ws_semaphores_copy + sem);
  sdpa_bwd_plan_destroy(plan);
  d.head_dim = d.head_dim_v = good().head_dim;
  d.deterministic = 0;

  /* the environment is the default, read when the runtime is made */
  runtime_with_env("SDPA_JIT_DQ_CONVERT", "main");
  ck_assert_int_eq(choices_of(&d).fold_dq, 1);
  ck_assert_int_eq(choices_with(&d, &convert_dq).fold_dq, 0);
  runtime_with_env("SDPA_JIT_DQ_CONVERT", "both");
  REJECT(d, INVALID_ARGUMENT, "SDPA_JIT_DQ_CONVERT = \"both\"", "\"main\"", "\"convert\"");
  ck_assert_int_eq(choices_with(&d, &main_dq).fold_dq, 1); /* set: not the default */
  runtime_with_env("SDPA_JIT_DQ_CONVERT", NULL);

  sdpa_bwd_plan_options bad = options_dq((sdpa_dq_writer)7);
  sdpa_bwd_plan *none = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create_with(&none, rt, &d, &bad),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "options.dq_writer = 7"));
  bad = options_dq(SDPA_DQ_DEFAULT);
  bad.version = 9;
  ck_assert_int_eq(sdpa_bwd_plan_create_with(&none, rt, &d, &bad),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "options.version = 9"));
  ck_assert_ptr_null(none);
}
END_TEST

/* Launch graphs: on by default and with SDPA_JIT_GRAPHS=1, off with 0 or
 * options.graphs OFF (a plan parameter: the key does not change), a bad
 * variable rejected naming it; a new plan holds none until it is
 * executed. */
START_TEST(launch_graphs_setting) {
  sdpa_bwd_desc d = good();
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->graphs.enabled, 1);
  ck_assert_int_eq(plan->graphs.used, 0);
  char key[sizeof plan->key.text];
  snprintf(key, sizeof key, "%s", sdpa_bwd_plan_key(plan));
  sdpa_bwd_plan_destroy(plan);
  sdpa_bwd_plan_options off = SDPA_BWD_PLAN_OPTIONS_INIT;
  off.graphs = SDPA_SWITCH_OFF;
  plan = make_with(&d, &off);
  ck_assert_int_eq(plan->graphs.enabled, 0);
  ck_assert_str_eq(sdpa_bwd_plan_key(plan), key);
  sdpa_bwd_plan_info info = SDPA_BWD_PLAN_INFO_INIT;
  ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(info.graphs, 0);
  sdpa_bwd_plan_destroy(plan);
  runtime_with_env("SDPA_JIT_GRAPHS", "0");
  plan = make(&d);
  ck_assert_int_eq(plan->graphs.enabled, 0);
  sdpa_bwd_plan_destroy(plan);
  runtime_with_env("SDPA_JIT_GRAPHS", "1");
  plan = make(&d);
  ck_assert_int_eq(plan->graphs.enabled, 1);
  sdpa_bwd_plan_destroy(plan);
  runtime_with_env("SDPA_JIT_GRAPHS", "yes");
  REJECT(d, INVALID_ARGUMENT, "SDPA_JIT_GRAPHS = \"yes\"", "\"0\"", "\"1\"");
  runtime_with_env("SDPA_JIT_GRAPHS", NULL);
}
END_TEST

/* The mma.sync family's kernel configuration of `d` (with options `o`,
 * may be NULL; their family AUTO taken as mma.sync, which these tests
 * are about) as "qt,kvt,warps,stages". */
static const char *tiles_with(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o,
                              char *buf, size_t size) {
  sdpa_bwd_plan_options mma = SDPA_BWD_PLAN_OPTIONS_INIT;
  if (o) mma = *o;
  if (mma.family == SDPA_FAMILY_AUTO) mma.family = SDPA_FAMILY_MMA;
  sdpa_bwd_plan *plan = make_with(d, &mma);
  const sdpa_key_fields *c = &plan->fields;
  snprintf(buf, size, "%d,%d,%d,%d", c->q_tile, c->kv_tile, c->warps, c->stages);
  sdpa_bwd_plan_destroy(plan);
  return buf;
}

static const char *tiles_of(const sdpa_bwd_desc *d, char *buf, size_t size) {
  return tiles_with(d, NULL, buf, size);
}

/* Small grids: at most 64 blocks of 128 kv rows (causal: 128) take 64-row
 * kv tiles (q tile 128 where shared memory allows); BSHD, not
 * deterministic, table kv tile 128 only; options.small_grid OFF (or
 * SDPA_JIT_SMALL_GRID=0) turns it off, the variable is validated; given
 * tiles (options, SDPA_JIT_TILES) still win. */
START_TEST(small_grid_tiles) {
  char t[32];
  sdpa_bwd_desc d = good();
  d.arch = 90;
  d.dtype = SDPA_DTYPE_BF16;
  d.head_dim = d.head_dim_v = 128;
  d.batch = 1;
  d.heads_q = d.heads_kv = 16;
  d.seqlen_q = d.seqlen_kv = 512; /* 16 x 4 = 64 blocks */
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "128,64,8,2");
  { /* AUTO on sm_90 takes the Hopper family here, whose tiles are its own */
    sdpa_bwd_plan *plan = make(&d);
    ck_assert_int_eq(plan->fields.family, SDPA_FAMILY_HOPPER);
    ck_assert_int_eq(plan->fields.warps, 12);
    sdpa_bwd_plan_destroy(plan);
  }
  d.seqlen_kv = 513; /* 16 x 5 = 80 blocks */
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,128,8,2");
  d.mask = SDPA_MASK_CAUSAL_TOP_LEFT; /* causal: up to 128 blocks */
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "128,64,8,2");
  d.mask = SDPA_MASK_CAUSAL_BOTTOM_RIGHT;
  d.seqlen_q = d.seqlen_kv = 1024; /* 128 blocks */
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "128,64,8,2");
  d.seqlen_kv = 1025; /* 144 blocks */
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,128,8,2");
  d.mask = SDPA_MASK_SLIDING_WINDOW; /* not causal: 64 */
  d.window_left = 64;
  d.window_right = 0;
  d.seqlen_q = d.seqlen_kv = 1024;
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,128,8,2");
  d.heads_q = d.heads_kv = 8; /* 64 blocks */
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "128,64,8,2");
  d.heads_q = 64; /* GQA: blocks count kv heads; dQ by the convert kernel */
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "128,64,8,2");
  d.heads_q = 8;
  d.deterministic = 1;
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,128,8,2");
  d.deterministic = 0;

  /* sm_80's 163 KiB: q tile 64 at head_dim 128, 128 at 64 */
  d.arch = 80;
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,64,8,2");
  d.head_dim = d.head_dim_v = 64;
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "128,64,8,2");
  /* sm_86: its table tiles are 64-row already */
  d.arch = 86;
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,64,8,2");
  /* head_dim 256: the table's kv tile is 64 */
  d.arch = 90;
  d.head_dim = d.head_dim_v = 256;
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "32,64,8,2");
  d.head_dim = d.head_dim_v = 128;

  /* THD: its lengths arrive at execute */
  sdpa_bwd_desc thd = d;
  thd.layout = SDPA_LAYOUT_THD;
  thd.batch = 1;
  thd.max_total_q = thd.max_total_kv = 1024;
  memset(&thd.q, 0, sizeof thd.q);
  ck_assert_str_eq(tiles_of(&thd, t, sizeof t), "64,128,8,2");

  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  o.small_grid = SDPA_SWITCH_OFF;
  ck_assert_str_eq(tiles_with(&d, &o, t, sizeof t), "64,128,8,2");
  o.small_grid = SDPA_SWITCH_ON;
  ck_assert_str_eq(tiles_with(&d, &o, t, sizeof t), "128,64,8,2");
  o.small_grid = SDPA_SWITCH_DEFAULT;
  o.q_tile = 64, o.kv_tile = 128, o.warps = 8, o.stages = 1;
  ck_assert_str_eq(tiles_with(&d, &o, t, sizeof t), "64,128,8,1");
  o.warps = 12; /* a warp count this family has not */
  sdpa_bwd_plan *none = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create_with(&none, rt, &d, &o), SDPA_STATUS_NOT_SUPPORTED);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "mma.sync"));
  o.warps = 5;
  ck_assert_int_eq(sdpa_bwd_plan_create_with(&none, rt, &d, &o), SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "options tiles"));

  runtime_with_env("SDPA_JIT_SMALL_GRID", "0");
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,128,8,2");
  runtime_with_env("SDPA_JIT_SMALL_GRID", "1");
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "128,64,8,2");
  runtime_with_env("SDPA_JIT_SMALL_GRID", "yes");
  REJECT(d, INVALID_ARGUMENT, "SDPA_JIT_SMALL_GRID = \"yes\"", "\"0\"", "\"1\"");
  runtime_with_env("SDPA_JIT_TILES", "64,128,8,1");
  ck_assert_str_eq(tiles_of(&d, t, sizeof t), "64,128,8,1");
  runtime_with_env("SDPA_JIT_TILES", "64,128");
  REJECT(d, INVALID_ARGUMENT, "SDPA_JIT_TILES = \"64,128\"");
  runtime_with_env("SDPA_JIT_TILES", NULL);
}
END_TEST

/* The masked launch order's groups: about 256 blocks of kv tiles, at
 * most every (sequence, kv head) pair (deterministic: every pair), or
 * SDPA_JIT_ORDER_GROUP. */
START_TEST(launch_order_group) {
  sdpa_bwd_desc d = good(); /* 2 sequences x 8 kv heads: 16 pairs */
  d.arch = 90;
  d.seqlen_q = d.seqlen_kv = 16384;
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->fields.kv_tile, 128);
  sdpa_bwd_plan_destroy(plan);
  ck_assert_int_eq(choices_of(&d).order_group, 2); /* 128 kv tiles a pair */
  d.seqlen_kv = 16384 + 1; /* 129 tiles: still 2 pairs (258 blocks) */
  ck_assert_int_eq(choices_of(&d).order_group, 2);
  d.seqlen_kv = 40000; /* 313 tiles: one pair a group */
  ck_assert_int_eq(choices_of(&d).order_group, 1);
  d.seqlen_q = d.seqlen_kv = 1024; /* 8 tiles: 32 pairs wanted, 16 exist */
  ck_assert_int_eq(choices_of(&d).order_group, 16);
  /* deterministic: every pair in one group, however long the sequences */
  d.deterministic = 1;
  d.seqlen_q = d.seqlen_kv = 40000;
  ck_assert_int_eq(choices_of(&d).order_group, 16);
  d.deterministic = 0;
  ck_assert_int_eq(choices_of(&d).order_group, 1);
  d.seqlen_q = d.seqlen_kv = 1024;

  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  o.order_group = 3;
  ck_assert_int_eq(choices_with(&d, &o).order_group, 3);
  o.order_group = 99;
  ck_assert_int_eq(choices_with(&d, &o).order_group, 16);
  runtime_with_env("SDPA_JIT_ORDER_GROUP", "3");
  ck_assert_int_eq(choices_of(&d).order_group, 3);
  const char *bad[] = {"0", "-2", "4x", "x"};
  env_values_rejected(d, "SDPA_JIT_ORDER_GROUP", bad, sizeof bad / sizeof bad[0], "from 1 to");
  o.order_group = -1;
  REJECT_WITH(d, o, INVALID_ARGUMENT, "options.order_group = -1");
}
END_TEST

/* The query heads of a kv tile split over blocks (options.head_chunks,
 * SDPA_JIT_HEAD_CHUNKS; Hopper family, not deterministic; by default up
 * to 4 where a mask makes the blocks' spans differ, at head dims up to
 * 128): the largest divisor of the group up to the count asked for, the
 * launch parameter
 * and grid y follow it, and the workspace grows by the fp32 dK / dV
 * accumulator (rows_kv x heads_kv x (head_dim + head_dim_v) floats, the
 * region up to the tail's); 1 (no region) for MHA, deterministic plans,
 * the persistent kernel and the mma.sync family. */
static int chunks_with(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o, size_t *bytes) {
  sdpa_bwd_plan *plan = make_with(d, o);
  const int chunks = plan->head_chunks;
  ck_assert_int_eq(plan->params.head_chunks, chunks);
  if (bytes) *bytes = sdpa_bwd_workspace_size(plan);
  if (chunks > 1)
    ck_assert_uint_eq(plan->ws_tail_acc - plan->ws_dkv_accum,
                      (size_t)plan->rows_kv * d->heads_kv * (d->head_dim + d->head_dim_v) * 4);
  sdpa_bwd_plan_destroy(plan);
  return chunks;
}

START_TEST(head_chunks) {
  sdpa_bwd_desc d = good();
  d.arch = 90;
  d.heads_q = 8;
  d.heads_kv = 2; /* a group of 4 */
  d.head_dim = 128;
  d.head_dim_v = 64;
  d.mask = SDPA_MASK_CAUSAL_TOP_LEFT;
  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  /* the rule: up to 4 with a mask, else 1 */
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 4);
  d.mask = SDPA_MASK_SLIDING_WINDOW;
  d.window_left = 100;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 4);
  d.mask = SDPA_MASK_NONE;
  d.window_left = -1;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 1);
  d.mask = SDPA_MASK_CAUSAL_TOP_LEFT;
  d.heads_kv = 4; /* a group of 2 */
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 2);
  d.heads_kv = 2;
  d.head_dim = d.head_dim_v = 192; /* the wide kernel: the same rule */
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 4);
  d.mask = SDPA_MASK_NONE;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 1);
  d.mask = SDPA_MASK_CAUSAL_TOP_LEFT;
  d.head_dim = 128;
  d.head_dim_v = 64;
  size_t whole = 0, split = 0;
  o.head_chunks = 1;
  ck_assert_int_eq(chunks_with(&d, &o, &whole), 1);
  o.head_chunks = 4;
  ck_assert_int_eq(chunks_with(&d, &o, &split), 4);
  ck_assert_uint_eq(split - whole, (size_t)2 * 256 * 2 * (128 + 64) * 4);
  o.head_chunks = 3; /* the largest divisor of 4 up to 3 */
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 2);
  o.head_chunks = 100;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 4);
  d.mask = SDPA_MASK_NONE;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 4);
  d.head_dim = d.head_dim_v = 64; /* the persistent kernel: never split */
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 1);
  d.layout = SDPA_LAYOUT_THD; /* one tile a block */
  d.max_total_q = d.max_total_kv = 512;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 4);
  d.layout = SDPA_LAYOUT_BSHD;
  d.max_total_q = d.max_total_kv = 0;
  d.head_dim = 128;
  d.head_dim_v = 64;
  d.deterministic = 1;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 1);
  d.deterministic = 0;
  o.family = SDPA_FAMILY_MMA;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 1);
  o.family = SDPA_FAMILY_AUTO;
  d.heads_kv = 8; /* MHA */
  ck_assert_int_eq(chunks_with(&d, &o, NULL), 1);
  d.heads_kv = 2;
  runtime_with_env("SDPA_JIT_HEAD_CHUNKS", "2");
  ck_assert_int_eq(chunks_with(&d, NULL, NULL), 2);
  count_env_rejected(d, "SDPA_JIT_HEAD_CHUNKS", "from 1 to 65535");
  o.head_chunks = -1;
  REJECT_WITH(d, o, INVALID_ARGUMENT, "options.head_chunks = -1");
  /* a version 2 struct: head_chunks is not read (the default) */
  o.version = 2;
  o.head_chunks = 99999;
  ck_assert_int_eq(chunks_with(&d, &o, NULL), sdpa_hopper_head_chunks(4, d.head_dim, (int)d.layout,
                                                                     (int)d.mask, 0, 0, 65535));
}
END_TEST

/* The last wave's split (options.tail_split, SDPA_JIT_TAIL_SPLIT;
 * sdpa_hopper_tail_parts): the parts of the rule for the tiles of a plan
 * on `sms` multiprocessors, from the plan's slots, steps and query tiles. */
static int tail_parts_with(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o, int sms,
                           size_t *slots_bytes) {
  sdpa_bwd_plan *plan = make_with(d, o);
  const long long tiles = (long long)plan->main_grid_x * d->heads_kv;
  const int parts = plan->tail_cap > 0
                        ? sdpa_hopper_tail_parts(tiles, sms, sdpa_tail_steps(&plan->params),
                                                 plan->params.q_tiles, plan->tail_cap)
                        : 1;
  if (slots_bytes)
    *slots_bytes = plan->tail_cap > 0 ? sdpa_bwd_workspace_size(plan) - plan->ws_tail_acc : 0;
  sdpa_bwd_plan_destroy(plan);
  return parts;
}

START_TEST(tail_split) {
  /* the rule alone (SDPA_HOPPER_TAIL_PART_STEPS 6): 2048 equal tiles on
   * 132 SMs (hd 128, 16k tokens x 16 heads) leave 68 in the last wave;
   * at S2k (32 steps a tile) no split gains enough */
  ck_assert_int_eq(sdpa_hopper_tail_parts(2048, 132, 32, 32, SDPA_HOPPER_TAIL_MAX_TILES), 1);
  /* S8k (128 steps): fifths, 3 waves of them, 0.74 of a tile against 1;
   * S16k: sevenths, 4 waves, 0.66 */
  ck_assert_int_eq(sdpa_hopper_tail_parts(2048, 132, 128, 128, SDPA_HOPPER_TAIL_MAX_TILES), 5);
  ck_assert_int_eq(sdpa_hopper_tail_parts(2048, 132, 256, 256, SDPA_HOPPER_TAIL_MAX_TILES), 7);
  /* 136 tiles (B 1, 17 heads, S1k): a second wave of 4 as 32 eighths */
  ck_assert_int_eq(sdpa_hopper_tail_parts(136, 132, 16, 16, 160), 8);
  ck_assert_int_eq(sdpa_hopper_tail_parts(136, 132, 16, 4, 160), 4);      /* 4 query tiles */
  ck_assert_int_eq(sdpa_hopper_tail_parts(2048, 128, 128, 128, 160), 1);  /* whole waves */
  ck_assert_int_eq(sdpa_hopper_tail_parts(100, 132, 128, 128, 160), 1);   /* one wave */
  ck_assert_int_eq(sdpa_hopper_tail_parts(2048, 132, 128, 128, 60), 1);   /* past the slots */
  ck_assert_int_eq(sdpa_hopper_tail_parts(2048, 132, 128, 1, 160), 1);    /* one query tile */
  ck_assert_int_eq(sdpa_hopper_tail_parts(15 * 132 + 120, 132, 128, 128, 160), 1); /* nearly full */
  ck_assert_int_eq(sdpa_hopper_tail_parts(2048, 0, 128, 128, 160), 1);    /* SMs unknown */

  sdpa_bwd_desc d = good();
  d.arch = 90;
  d.batch = 1;
  d.heads_q = d.heads_kv = 2;
  d.seqlen_q = d.seqlen_kv = 1000;
  d.head_dim = 128;
  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  size_t slots = 0;
  /* test_gpu_bwd's cases: 16 tiles on 12 SMs, thirds */
  o.tail_split = 12;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 3);
  /* slots for 4 tiles (16 - 12: what 12 SMs leave), their sums and counts */
  ck_assert_uint_eq(slots, (size_t)4 * 128 * (128 + 128) * 4 + 256);
  o.tail_split = 0;
  ck_assert_int_eq(tail_parts_with(&d, &o, 132, &slots), 1); /* one wave */
  ck_assert_uint_eq(slots, (size_t)7 * 128 * 256 * 4 + 256); /* any SMs: (16 - 1) / 2 */
  d.batch = 2; /* 32 tiles: slots for min(12 - 1, 32 - 12), min(20 - 1, 32 - 20) */
  o.tail_split = 12;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1); /* 8 left, 2 waves of halves */
  ck_assert_uint_eq(slots, (size_t)11 * 128 * 256 * 4 + 256);
  o.tail_split = 20;
  tail_parts_with(&d, &o, 20, &slots);
  ck_assert_uint_eq(slots, (size_t)12 * 128 * 256 * 4 + 256);
  o.tail_split = 40; /* one wave on 40: no slots */
  ck_assert_int_eq(tail_parts_with(&d, &o, 40, &slots), 1);
  ck_assert_uint_eq(slots, 0);
  d.batch = 1;
  d.heads_q = 4;
  d.seqlen_kv = 900;
  d.head_dim = 96;
  o.tail_split = 13;
  ck_assert_int_eq(tail_parts_with(&d, &o, 13, NULL), 4);
  d.heads_q = d.heads_kv = 3;
  d.seqlen_q = d.seqlen_kv = 1100;
  d.head_dim = 72;
  d.head_dim_v = 40;
  o.tail_split = 20;
  ck_assert_int_eq(tail_parts_with(&d, &o, 20, &slots), 2);
  ck_assert_uint_eq(slots, (size_t)7 * 128 * (72 + 40) * 4 + 256);
  /* where the kernel cannot: no slots */
  d.heads_q = d.heads_kv = 2;
  d.seqlen_q = d.seqlen_kv = 1000;
  d.head_dim = 128;
  d.head_dim_v = 0;
  o.tail_split = 1; /* never */
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  ck_assert_uint_eq(slots, 0);
  o.tail_split = 12;
  d.mask = SDPA_MASK_CAUSAL_TOP_LEFT;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  d.mask = SDPA_MASK_NONE;
  d.deterministic = 1;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  d.deterministic = 0;
  d.head_dim = 64; /* the persistent kernel */
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  d.head_dim = 192; /* the wide kernel */
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  d.head_dim = 128;
  o.dq_writer = SDPA_DQ_MAIN;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  o.dq_writer = SDPA_DQ_DEFAULT;
  o.family = SDPA_FAMILY_MMA;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  o.family = SDPA_FAMILY_AUTO;
  d.layout = SDPA_LAYOUT_THD;
  d.max_total_q = d.max_total_kv = 2000;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, &slots), 1);
  ck_assert_uint_eq(slots, 0);
  d.layout = SDPA_LAYOUT_BSHD;
  d.max_total_q = d.max_total_kv = 0;
  /* the environment's default, and bad values */
  runtime_with_env("SDPA_JIT_TAIL_SPLIT", "12");
  ck_assert_int_eq(tail_parts_with(&d, NULL, 12, NULL), 3);
  count_env_rejected(d, "SDPA_JIT_TAIL_SPLIT", "from 2 to 65535");
  o.tail_split = -1;
  REJECT_WITH(d, o, INVALID_ARGUMENT, "options.tail_split = -1");
  o.tail_split = 70000;
  REJECT_WITH(d, o, INVALID_ARGUMENT, "options.tail_split = 70000");
  /* a version 3 struct: tail_split is not read (the default: the device's) */
  o.version = 3;
  o.tail_split = 1;
  ck_assert_int_eq(tail_parts_with(&d, &o, 12, NULL), 3);
}
END_TEST

/* The resolved options.longest_first of a plan for `d` with options `o`
 * (NULL: every default). */
static sdpa_switch longest_first_with(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o) {
  sdpa_bwd_plan *plan = make_with(d, o);
  const sdpa_switch s = plan->options.longest_first;
  sdpa_bwd_plan_destroy(plan);
  return s;
}

/* The longest sequence first (options.longest_first,
 * SDPA_JIT_LONGEST_FIRST): ON by default and with the variable 1, OFF
 * with 0; where ON, the unmasked, not deterministic THD plans of the
 * Hopper family keep the order in the workspace (4 bytes a sequence), the
 * others not; a plan parameter (the key does not change); a bad variable
 * fails only the plans that take the default, a bad field names it; a
 * version 4 struct is read without it. */
START_TEST(longest_first) {
  sdpa_bwd_desc d = good();
  d.arch = 90;
  d.layout = SDPA_LAYOUT_THD;
  d.max_total_q = d.max_total_kv = 512;
  d.head_dim = 128;
  d.batch = 300;
  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  ck_assert_int_eq(o.longest_first, SDPA_SWITCH_DEFAULT);
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", NULL);
  ck_assert_int_eq(longest_first_with(&d, NULL), SDPA_SWITCH_ON);
  o.family = SDPA_FAMILY_HOPPER;
  o.longest_first = SDPA_SWITCH_OFF;
  sdpa_bwd_plan *plan = make_with(&d, &o);
  char key[sizeof plan->key.text];
  snprintf(key, sizeof key, "%s", sdpa_bwd_plan_key(plan));
  const size_t bytes = plan->workspace_bytes;
  ck_assert_int_eq(plan->longest_first, 0);
  sdpa_bwd_plan_destroy(plan);
  o.longest_first = SDPA_SWITCH_ON;
  plan = make_with(&d, &o);
  ck_assert_int_eq(plan->options.longest_first, SDPA_SWITCH_ON);
  ck_assert_int_eq(plan->longest_first, 1);
  ck_assert_str_eq(sdpa_bwd_plan_key(plan), key);
  ck_assert_uint_ge(plan->workspace_bytes, bytes + 4 * 300);
  sdpa_bwd_plan_destroy(plan);
  /* not under a mask, not deterministic, not the mma.sync family, not
   * above SDPA_HOPPER_ORDER_MAX_BATCH sequences */
  sdpa_bwd_desc other = d;
  other.mask = SDPA_MASK_CAUSAL_TOP_LEFT;
  plan = make_with(&other, &o);
  ck_assert_int_eq(plan->longest_first, 0);
  sdpa_bwd_plan_destroy(plan);
  other = d;
  other.deterministic = 1;
  plan = make_with(&other, &o);
  ck_assert_int_eq(plan->longest_first, 0);
  sdpa_bwd_plan_destroy(plan);
  other = d;
  other.batch = SDPA_HOPPER_ORDER_MAX_BATCH + 1;
  plan = make_with(&other, &o);
  ck_assert_int_eq(plan->longest_first, 0);
  sdpa_bwd_plan_destroy(plan);
  o.family = SDPA_FAMILY_MMA;
  plan = make_with(&d, &o);
  ck_assert_int_eq(plan->longest_first, 0);
  sdpa_bwd_plan_destroy(plan);
  o.family = SDPA_FAMILY_AUTO;
  ck_assert_int_eq(longest_first_with(&d, &o), SDPA_SWITCH_ON);
  /* the environment's default, read when the runtime is made */
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", "0");
  ck_assert_int_eq(longest_first_with(&d, NULL), SDPA_SWITCH_OFF);
  o.longest_first = SDPA_SWITCH_ON;
  ck_assert_int_eq(longest_first_with(&d, &o), SDPA_SWITCH_ON); /* a plan's own wins */
  o.longest_first = SDPA_SWITCH_OFF;
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", "1");
  ck_assert_int_eq(longest_first_with(&d, NULL), SDPA_SWITCH_ON);
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", "");
  ck_assert_int_eq(longest_first_with(&d, NULL), SDPA_SWITCH_ON);
  static const char *const bad[] = {"2", "yes", "on", "01"};
  env_values_rejected(d, "SDPA_JIT_LONGEST_FIRST", bad, sizeof bad / sizeof bad[0],
                      "expected \"1\" or unset");
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", "2");
  REJECT(d, INVALID_ARGUMENT, "SDPA_JIT_LONGEST_FIRST = \"2\" is not valid", "\"0\"");
  o.longest_first = SDPA_SWITCH_ON; /* set: not the default */
  ck_assert_int_eq(longest_first_with(&d, &o), SDPA_SWITCH_ON);
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", NULL);
  o.longest_first = (sdpa_switch)7;
  REJECT_WITH(d, o, INVALID_ARGUMENT, "options.longest_first = 7 is not valid",
              "SDPA_SWITCH_DEFAULT (0)");
  o.longest_first = (sdpa_switch)-1;
  REJECT_WITH(d, o, INVALID_ARGUMENT, "options.longest_first = -1");
  /* a version 4 struct: longest_first (-1) is not read (the default) */
  o.version = 4;
  ck_assert_int_eq(longest_first_with(&d, &o), SDPA_SWITCH_ON);
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", "0");
  ck_assert_int_eq(longest_first_with(&d, &o), SDPA_SWITCH_OFF);
  o.tail_split = 12; /* still read */
  plan = make_with(&d, &o);
  ck_assert_int_eq(plan->options.tail_split, 12);
  ck_assert_uint_eq(plan->options.version, SDPA_BWD_PLAN_OPTIONS_VERSION);
  sdpa_bwd_plan_destroy(plan);
  runtime_with_env("SDPA_JIT_LONGEST_FIRST", NULL);
  o.version = SDPA_BWD_PLAN_OPTIONS_VERSION + 1;
  char unknown[64], current[32];
  snprintf(unknown, sizeof unknown, "options.version = %d is unknown",
           SDPA_BWD_PLAN_OPTIONS_VERSION + 1);
  snprintf(current, sizeof current, "(version %d)", SDPA_BWD_PLAN_OPTIONS_VERSION);
  REJECT_WITH(d, o, INVALID_ARGUMENT, unknown, current);
}
END_TEST

/* The preprocess grid: 8 elements a lane cover every head_dim_v with a
 * power-of-two lane count that divides a warp, and the blocks cover every
 * (row, head) item with no block left without one. */
START_TEST(preprocess_grid) {
  const int dims[] = {32, 64, 96, 128, 192, 256};
  const int64_t counts[] = {1, 7, 8, 31, 32, 33, 255, 4096, 524288, 524289,
                            (int64_t)INT32_MAX * 8 + 5};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i) {
    const int lanes = sdpa_aux_lanes(dims[i]);
    ck_assert_int_ge(lanes * 8, dims[i]);
    ck_assert_int_lt(lanes * 4, dims[i]); /* half the lanes would not do */
    ck_assert_int_eq(32 % lanes, 0);
    const int64_t per_block = SDPA_AUX_THREADS / lanes;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; ++k) {
      const int64_t blocks = sdpa_aux_blocks(counts[k], dims[i]);
      ck_assert_int_ge(blocks * per_block, counts[k]);
      ck_assert_int_lt((blocks - 1) * per_block, counts[k]);
    }
  }
}
END_TEST

START_TEST(runtime_options) {
  sdpa_runtime_options opts;
  ck_assert_int_eq(sdpa_runtime_options_init(&opts, SDPA_RUNTIME_OPTIONS_VERSION),
                   SDPA_STATUS_SUCCESS);
  ck_assert_uint_eq(opts.version, SDPA_RUNTIME_OPTIONS_VERSION);
  ck_assert_ptr_null(opts.cache_path);
  ck_assert_int_eq(opts.arch, 0);
  ck_assert_int_eq(sdpa_runtime_options_init(&opts, 99),
                   SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_int_eq(sdpa_runtime_options_init(NULL, 1),
                   SDPA_STATUS_INVALID_ARGUMENT);
  sdpa_runtime *r = NULL;
  opts.version = 7;
  ck_assert_int_eq(sdpa_runtime_create(&r, &opts), SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "options.version = 7"));
  ck_assert_ptr_null(r);
  sdpa_runtime_options_init(&opts, SDPA_RUNTIME_OPTIONS_VERSION);
  opts.arch = -1;
  ck_assert_int_eq(sdpa_runtime_create(&r, &opts), SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "options.arch = -1"));
  opts.arch = 0;
  opts.readonly_cache_count = 2;
  ck_assert_int_eq(sdpa_runtime_create(&r, &opts), SDPA_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "readonly_cache_paths"));
  ck_assert_int_eq(sdpa_runtime_create(NULL, NULL), SDPA_STATUS_INVALID_ARGUMENT);
  sdpa_runtime_destroy(NULL);
  ck_assert_ptr_null(sdpa_runtime_cache_path(NULL));
  ck_assert_int_eq(sdpa_runtime_arch(rt), 90);
}
END_TEST

/* A plan keeps the runtime's arch; the desc's own arch wins. */
START_TEST(desc_arch_overrides_runtime) {
  sdpa_bwd_desc d = good();
  d.arch = 80;
  sdpa_bwd_plan *plan = make(&d);
  ck_assert_int_eq(plan->fields.arch, 80);
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), "arch=80;"));
  ck_assert_int_le(plan->smem_bytes, sdpa_arch_smem_limit(80));
  sdpa_bwd_plan_destroy(plan);
}
END_TEST

static Suite *plan_suite(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("validate");
  tcase_add_checked_fixture(tc, open_runtime, close_runtime);
  tcase_add_test(tc, null_arguments);
  tcase_add_test(tc, version);
  tcase_add_test(tc, dtype_and_layout);
  tcase_add_test(tc, dims_below_one);
  tcase_add_test(tc, dims_above_limits);
  tcase_add_test(tc, dims_overflow_offsets);
  tcase_add_test(tc, strides_overflow);
  tcase_add_test(tc, launch_grid_limits);
  tcase_add_test(tc, small_grid_tiles);
  tcase_add_test(tc, heads_not_multiple);
  tcase_add_test(tc, head_dim_unsupported);
  tcase_add_test(tc, head_dim_v_above_head_dim);
  tcase_add_test(tc, stride_not_multiple_of_8);
  tcase_add_test(tc, negative_or_zero_strides);
  tcase_add_test(tc, output_strides_overlap);
  tcase_add_test(tc, mask_and_window);
  tcase_add_test(tc, scale_not_finite);
  tcase_add_test(tc, arch_unsupported);
  tcase_add_test(tc, arch_missing_without_gpu);
  tcase_add_test(tc, thd_totals);
  tcase_add_test(tc, preprocess_grid);
  suite_add_tcase(s, tc);

  TCase *tr = tcase_create("resolve");
  tcase_add_checked_fixture(tr, open_runtime, close_runtime);
  tcase_add_test(tr, defaults_resolved);
  tcase_add_test(tr, packed_strides_bshd);
  tcase_add_test(tr, packed_strides_thd);
  tcase_add_test(tr, workspace_bshd);
  tcase_add_test(tr, workspace_thd);
  tcase_add_test(tr, dq_writer);
  tcase_add_test(tr, launch_graphs_setting);
  tcase_add_test(tr, launch_order_group);
  tcase_add_test(tr, head_chunks);
  tcase_add_test(tr, tail_split);
  tcase_add_test(tr, longest_first);
  tcase_add_test(tr, runtime_options);
  tcase_add_test(tr, desc_arch_overrides_runtime);
  suite_add_tcase(s, tr);
  return s;
}

int main(void) { return sdpa_test_run(plan_suite()); }
