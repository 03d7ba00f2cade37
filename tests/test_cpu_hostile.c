/*
 * test_cpu_hostile.c — every public call against hostile arguments.
 *
 * The library sits under frameworks that pass along whatever their users
 * give them, often from another language through an FFI. Nothing a caller
 * passes may crash it: every public function is called with NULL for each
 * of its pointer arguments, every descriptor field is swept over hostile
 * values (zero, negative, INT32_MAX / INT32_MIN, INT64_MAX / INT64_MIN
 * strides, NaN / Inf scale, enum values outside their enums, unknown
 * struct versions) in both layouts, and sdpa_bwd_execute is fed bad
 * tensors and workspaces. Each call must return a status, and every
 * rejection must come with a message that names the argument or field.
 * test_cpu_plan.c checks the exact wording of each descriptor rule; this
 * file checks that no combination escapes the rules.
 *
 * sdpa_bwd_execute has to reject a bad call before it touches the driver:
 * on a machine without a driver a check that ran after the driver lookup
 * would answer NO_DEVICE instead of INVALID_ARGUMENT, which the tests
 * would catch. With a valid call and no GPU the answer is NO_DEVICE (or
 * NOT_COMPILED when a GPU is present and the plan is not loaded).
 *
 * `test_cpu_hostile --leak-cycles N` (no Check) runs N create → plan →
 * compile → inspect → destroy cycles, error paths included, for
 * `valgrind --leak-check=full` (src/tools/run_sanitized.sh).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check_main.h"
#include "driver.h"
#include "plan.h"
#include "sdpa_jit.h"

static char *work_dir;
static char *cache_file;

/* ------------------------------------------------------------- helpers */

static void quiet_log(sdpa_log_level level, const char *message, void *user) {
  int *warnings = user;
  if (level == SDPA_LOG_WARNING && warnings) (*warnings)++;
  if (getenv("SDPA_TEST_VERBOSE")) fprintf(stderr, "log: %s\n", message);
}

static sdpa_runtime *make_runtime(const char *path) {
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  sdpa_runtime *rt = NULL;
  opts.cache_path = path;
  opts.disable_disk_cache = path == NULL;
  opts.arch = 90;
  opts.log = quiet_log;
  sdpa_status st = sdpa_runtime_create(&rt, &opts);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "runtime_create: %s",
                sdpa_last_error());
  return rt;
}

static sdpa_bwd_desc good_desc(sdpa_layout layout) {
  sdpa_bwd_desc d = SDPA_BWD_DESC_INIT;
  d.dtype = SDPA_DTYPE_BF16;
  d.layout = layout;
  d.batch = 2;
  d.heads_q = 8;
  d.heads_kv = 2;
  d.seqlen_q = d.seqlen_kv = 256;
  d.head_dim = 64;
  return d;
}

static int has(const char *text, const char *part) {
  return strstr(text, part) != NULL;
}

/* The message is not empty and names `what`. */
#define NAMES(what)                                                           \
  ck_assert_msg(has(sdpa_last_error(), (what)),                               \
                "message \"%s\" does not name \"%s\"", sdpa_last_error(),     \
                (what))

#define EXPECT(call, status, what)                                            \
  do {                                                                        \
    sdpa_status st_ = (call);                                                 \
    ck_assert_msg(st_ == (status), "%s: %s, expected %s (%s)", #call,         \
                  sdpa_status_name(st_), sdpa_status_name(status),            \
                  sdpa_last_error());                                         \
    NAMES(what);                                                              \
  } while (0)

/* ------------------------------------------------ NULL, every argument */

START_TEST(null_pointer_arguments) {
  sdpa_runtime *rt = make_runtime(cache_file);
  sdpa_bwd_desc d = good_desc(SDPA_LAYOUT_BSHD);
  sdpa_bwd_plan *plan = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
  sdpa_cache_entry *entries = (sdpa_cache_entry *)1;
  size_t count = 7;
  void *bytes = (void *)1;
  size_t size = 7;
  sdpa_cache_stats stats;
  sdpa_source source = SDPA_SOURCE_DISK;

  /* status, version, last error */
  ck_assert_ptr_nonnull(sdpa_last_error());
  ck_assert_str_eq(sdpa_version(), SDPA_JIT_VERSION_STRING);

  /* runtime */
  EXPECT(sdpa_runtime_options_init(NULL, SDPA_RUNTIME_OPTIONS_VERSION),
         SDPA_STATUS_INVALID_ARGUMENT, "opts is NULL");
  EXPECT(sdpa_runtime_create(NULL, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "out is NULL");
  sdpa_runtime_destroy(NULL);
  ck_assert_ptr_null(sdpa_runtime_cache_path(NULL));
  ck_assert_int_eq(sdpa_runtime_arch(NULL), 0);
  NAMES("runtime is NULL");

  /* plan */
  EXPECT(sdpa_bwd_plan_create(NULL, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "out is NULL");
  sdpa_bwd_plan *none = (sdpa_bwd_plan *)1;
  EXPECT(sdpa_bwd_plan_create(&none, NULL, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "runtime is NULL");
  ck_assert_ptr_null(none);
  none = (sdpa_bwd_plan *)1;
  EXPECT(sdpa_bwd_plan_create(&none, rt, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "desc is NULL");
  ck_assert_ptr_null(none);
  sdpa_bwd_plan_destroy(NULL);
  ck_assert_uint_eq(sdpa_bwd_workspace_size(NULL), 0);
  ck_assert_str_eq(sdpa_bwd_plan_key(NULL), "");
  ck_assert_str_eq(sdpa_bwd_plan_key_hash(NULL), "");
  ck_assert_str_eq(sdpa_bwd_plan_compile_log(NULL), "");
  EXPECT(sdpa_bwd_compile(NULL, &source), SDPA_STATUS_INVALID_ARGUMENT,
         "plan is NULL");
  ck_assert_int_eq(source, SDPA_SOURCE_NONE);

  /* execute */
  sdpa_bwd_tensors t = SDPA_BWD_TENSORS_INIT;
  EXPECT(sdpa_bwd_execute(NULL, &t, NULL, 0, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "plan is NULL");
  EXPECT(sdpa_bwd_execute(plan, NULL, NULL, 0, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "tensors is NULL");
  EXPECT(sdpa_bwd_sync_check(NULL, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "plan is NULL");

  /* cache access */
  EXPECT(sdpa_cache_list(NULL, &entries, &count), SDPA_STATUS_INVALID_ARGUMENT,
         "runtime is NULL");
  EXPECT(sdpa_cache_list(rt, NULL, &count), SDPA_STATUS_INVALID_ARGUMENT,
         "out and count");
  EXPECT(sdpa_cache_list(rt, &entries, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "out and count");
  sdpa_cache_entries_free(NULL, 5);
  EXPECT(sdpa_cache_get(NULL, "abcdef", &entries),
         SDPA_STATUS_INVALID_ARGUMENT, "runtime is NULL");
  EXPECT(sdpa_cache_get(rt, NULL, &entries), SDPA_STATUS_INVALID_ARGUMENT,
         "key");
  EXPECT(sdpa_cache_get(rt, "abcdef", NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "out");
  EXPECT(sdpa_cache_get_cubin(NULL, "abcdef", &bytes, &size),
         SDPA_STATUS_INVALID_ARGUMENT, "runtime is NULL");
  EXPECT(sdpa_cache_get_cubin(rt, NULL, &bytes, &size),
         SDPA_STATUS_INVALID_ARGUMENT, "key");
  EXPECT(sdpa_cache_get_cubin(rt, "abcdef", NULL, &size),
         SDPA_STATUS_INVALID_ARGUMENT, "out");
  EXPECT(sdpa_cache_get_cubin(rt, "abcdef", &bytes, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "size");
  sdpa_free(NULL);
  EXPECT(sdpa_cache_stats_get(NULL, &stats), SDPA_STATUS_INVALID_ARGUMENT,
         "runtime is NULL");
  EXPECT(sdpa_cache_stats_get(rt, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "out is NULL");
  EXPECT(sdpa_cache_verify(NULL, NULL, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "runtime is NULL");
  EXPECT(sdpa_cache_prune(NULL, -1, -1, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "runtime is NULL");
  /* OUT counts that may be NULL */
  ck_assert_int_eq(sdpa_cache_verify(rt, NULL, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_cache_prune(rt, -1, -1, NULL), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_bwd_compile(NULL, NULL), SDPA_STATUS_INVALID_ARGUMENT);

  /* keys that are not keys */
  const char *bad_keys[] = {"", "abc", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
                            "0123456789abcdef0123456789abcdef0",
                            "%s%s%s%n", "' OR 1=1 --", "*", "\x01\xff"};
  for (size_t i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; i++) {
    sdpa_status st = sdpa_cache_get(rt, bad_keys[i], &entries);
    ck_assert_msg(st == SDPA_STATUS_NOT_FOUND ||
                      st == SDPA_STATUS_INVALID_ARGUMENT,
                  "key '%s': %s", bad_keys[i], sdpa_status_name(st));
    ck_assert_str_ne(sdpa_last_error(), "");
    st = sdpa_cache_get_cubin(rt, bad_keys[i], &bytes, &size);
    ck_assert(st == SDPA_STATUS_NOT_FOUND || st == SDPA_STATUS_INVALID_ARGUMENT);
  }
  /* extreme prune arguments */
  int64_t removed = -1;
  ck_assert_int_eq(sdpa_cache_prune(rt, INT64_MAX, INT64_MAX, &removed),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(removed, 0);
  ck_assert_int_eq(sdpa_cache_prune(rt, INT64_MIN, INT64_MIN, &removed),
                   SDPA_STATUS_SUCCESS);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
}
END_TEST

/* --------------------------------------------------- status and enums */

START_TEST(status_names) {
  for (int s = SDPA_STATUS_SUCCESS; s <= SDPA_STATUS_INTERNAL; s++) {
    const char *name = sdpa_status_name((sdpa_status)s);
    ck_assert_ptr_nonnull(name);
    ck_assert(strncmp(name, "SDPA_STATUS_", 12) == 0);
    ck_assert_str_ne(name, "SDPA_STATUS_UNKNOWN");
  }
  const int garbage[] = {-1, SDPA_STATUS_INTERNAL + 1, 1000, INT32_MAX,
                         INT32_MIN};
  for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++)
    ck_assert_str_eq(sdpa_status_name((sdpa_status)garbage[i]),
                     "SDPA_STATUS_UNKNOWN");
}
END_TEST

/* ------------------------------------------------ runtime options */

START_TEST(runtime_options_hostile) {
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  sdpa_runtime *rt = (sdpa_runtime *)1;
  const unsigned versions[] = {0, SDPA_RUNTIME_OPTIONS_VERSION + 1, UINT32_MAX};
  for (size_t i = 0; i < 3; i++) {
    EXPECT(sdpa_runtime_options_init(&opts, versions[i]),
           SDPA_STATUS_INVALID_ARGUMENT, "version");
    sdpa_runtime_options_init(&opts, SDPA_RUNTIME_OPTIONS_VERSION);
    opts.version = versions[i];
    EXPECT(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_INVALID_ARGUMENT,
           "options.version");
    ck_assert_ptr_null(rt);
  }
  sdpa_runtime_options_init(&opts, SDPA_RUNTIME_OPTIONS_VERSION);
  opts.disable_disk_cache = 1;
  opts.readonly_cache_count = 3;
  EXPECT(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_INVALID_ARGUMENT,
         "readonly_cache_paths");
  const char *paths[] = {"/nonexistent/a.sqlite", NULL};
  opts.readonly_cache_paths = paths;
  opts.readonly_cache_count = 2;
  EXPECT(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_INVALID_ARGUMENT,
         "readonly_cache_paths[1]");
  const char *empty[] = {""};
  opts.readonly_cache_paths = empty;
  opts.readonly_cache_count = 1;
  EXPECT(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_INVALID_ARGUMENT,
         "readonly_cache_paths[0]");
  ck_assert_ptr_null(rt);
  /* a shipped database that does not exist: skipped with a warning */
  int warnings = 0;
  opts.readonly_cache_paths = paths;
  opts.readonly_cache_count = 1;
  opts.log = quiet_log;
  opts.log_user = &warnings;
  ck_assert_int_eq(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(warnings, 1);
  sdpa_runtime_destroy(rt);

  sdpa_runtime_options_init(&opts, SDPA_RUNTIME_OPTIONS_VERSION);
  opts.disable_disk_cache = 1;
  opts.arch = INT32_MIN;
  EXPECT(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_INVALID_ARGUMENT,
         "options.arch");
  opts.arch = 0;
  opts.cache_max_bytes = INT64_MIN;
  EXPECT(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_INVALID_ARGUMENT,
         "options.cache_max_bytes");
  opts.cache_max_bytes = INT64_MAX; /* large is fine */
  opts.arch = INT32_MAX;            /* checked when a plan needs it */
  ck_assert_int_eq(sdpa_runtime_create(&rt, &opts), SDPA_STATUS_SUCCESS);
  sdpa_bwd_desc d = good_desc(SDPA_LAYOUT_BSHD);
  sdpa_bwd_plan *plan = (sdpa_bwd_plan *)1;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_NOT_SUPPORTED,
         "arch");
  ck_assert_ptr_null(plan);
  sdpa_runtime_destroy(rt);
}
END_TEST

/* --------------------------------------------------- descriptor sweep */

typedef enum field_kind { INT_FIELD, INT64_FIELD, FLOAT_FIELD } field_kind;

typedef struct field {
  const char *name;   /* what the message must name...               */
  field_kind kind;
  size_t offset;
  int window;         /* only meaningful with the sliding-window mask */
  const char *also;   /* ...or this: under THD a huge batch or max_s
                         breaks the default token total, and the message
                         names that (max_total_q = batch x max_s)      */
} field;

#define F(member, kind, name)                                                 \
  {name, kind, offsetof(sdpa_bwd_desc, member), 0, NULL}
#define F_ALSO(member, kind, name, also)                                      \
  {name, kind, offsetof(sdpa_bwd_desc, member), 0, also}
#define STRIDES(t)                                                            \
  F(t.batch, INT64_FIELD, "desc." #t), F(t.seq, INT64_FIELD, "desc." #t),     \
      F(t.head, INT64_FIELD, "desc." #t)

static const field fields[] = {
    F(version, INT_FIELD, "desc.version"),
    F(dtype, INT_FIELD, "desc.dtype"),
    F(layout, INT_FIELD, "desc.layout"),
    F_ALSO(batch, INT_FIELD, "batch", "desc.max_total_"),
    F(heads_q, INT_FIELD, "heads_q"),
    F(heads_kv, INT_FIELD, "heads_kv"),
    F_ALSO(seqlen_q, INT_FIELD, "seqlen_q", "desc.max_total_q"),
    F_ALSO(seqlen_kv, INT_FIELD, "seqlen_kv", "desc.max_total_kv"),
    F(head_dim, INT_FIELD, "head_dim"),
    F(head_dim_v, INT_FIELD, "head_dim_v"),
    STRIDES(q), STRIDES(k), STRIDES(v), STRIDES(o), STRIDES(dout),
    STRIDES(dq), STRIDES(dk), STRIDES(dv), STRIDES(lse),
    F(max_total_q, INT64_FIELD, "max_total_q"),
    F(max_total_kv, INT64_FIELD, "max_total_kv"),
    F(mask, INT_FIELD, "desc.mask"),
    {"desc.window_left", INT_FIELD, offsetof(sdpa_bwd_desc, window_left), 1,
     NULL},
    {"desc.window_right", INT_FIELD, offsetof(sdpa_bwd_desc, window_right), 1,
     NULL},
    F(scale, FLOAT_FIELD, "desc.scale"),
    F(deterministic, INT_FIELD, "deterministic"),
    F(arch, INT_FIELD, "arch"),
};

static const int64_t hostile_ints[] = {
    0, -1, -2, 1, 3, 7, 9, 63, 65, 80, 1 << 16, (1 << 16) + 1, 1 << 24,
    (1 << 24) + 1, 1 << 30, (1 << 30) + 1, INT32_MAX, INT32_MIN};
static const int64_t hostile_int64s[] = {
    0, -1, -8, 1, 8, 12, 1 << 20, INT32_MAX, (int64_t)INT32_MAX + 1,
    INT64_MAX / 2, INT64_MAX / 8 * 8, INT64_MAX, INT64_MIN, INT64_MIN + 8};

/* Creates a plan from `d`; returns its status. A plan that is accepted
 * must be sane; a rejection must name the field (or its `also`). */
static sdpa_status try_desc(sdpa_runtime *rt, const sdpa_bwd_desc *d,
                            const field *fl, const char *case_text) {
  sdpa_bwd_plan *plan = (sdpa_bwd_plan *)1;
  sdpa_status st = sdpa_bwd_plan_create(&plan, rt, d);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS ||
                    st == SDPA_STATUS_INVALID_ARGUMENT ||
                    st == SDPA_STATUS_NOT_SUPPORTED,
                "%s: unexpected %s (%s)", case_text, sdpa_status_name(st),
                sdpa_last_error());
  if (st != SDPA_STATUS_SUCCESS) {
    ck_assert_ptr_null(plan);
    ck_assert_msg(has(sdpa_last_error(), fl->name) ||
                      (fl->also && has(sdpa_last_error(), fl->also)),
                  "%s: %s, but the message does not name %s: \"%s\"",
                  case_text, sdpa_status_name(st), fl->name,
                  sdpa_last_error());
    return st;
  }
  ck_assert_ptr_nonnull(plan);
  size_t ws = sdpa_bwd_workspace_size(plan);
  ck_assert_uint_gt(ws, 0);
  ck_assert_uint_eq(ws % 256, 0);
  ck_assert_uint_eq(strlen(sdpa_bwd_plan_key_hash(plan)), 32);
  ck_assert(strncmp(sdpa_bwd_plan_key(plan), "sdpa_bwd;", 9) == 0);
  ck_assert(isfinite(plan->desc.scale) && plan->desc.scale != 0.0f);
  sdpa_bwd_plan_destroy(plan);
  return st;
}

START_TEST(descriptor_sweep) {
  sdpa_runtime *rt = make_runtime(NULL);
  int tried = 0, rejected = 0;
  const sdpa_layout layouts[] = {SDPA_LAYOUT_BSHD, SDPA_LAYOUT_THD};
  for (size_t l = 0; l < 2; l++) {
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
      const field *fl = &fields[f];
      size_t n = fl->kind == INT64_FIELD
                     ? sizeof hostile_int64s / sizeof hostile_int64s[0]
                 : fl->kind == INT_FIELD
                     ? sizeof hostile_ints / sizeof hostile_ints[0]
                     : 7;
      for (size_t v = 0; v < n; v++) {
        sdpa_bwd_desc d = good_desc(layouts[l]);
        if (fl->window) d.mask = SDPA_MASK_SLIDING_WINDOW;
        char text[160];
        unsigned char *slot = (unsigned char *)&d + fl->offset;
        if (fl->kind == INT_FIELD) {
          int value = (int)hostile_ints[v];
          memcpy(slot, &value, sizeof value);
          snprintf(text, sizeof text, "layout %d, %s = %d", (int)layouts[l],
                   fl->name, value);
        } else if (fl->kind == INT64_FIELD) {
          memcpy(slot, &hostile_int64s[v], sizeof(int64_t));
          snprintf(text, sizeof text, "layout %d, %s = %lld", (int)layouts[l],
                   fl->name, (long long)hostile_int64s[v]);
        } else {
          const float values[] = {NAN,     INFINITY,  -INFINITY, -NAN,
                                  FLT_MAX, -FLT_MAX, 1e-45f};
          memcpy(slot, &values[v], sizeof(float));
          snprintf(text, sizeof text, "layout %d, %s = %g", (int)layouts[l],
                   fl->name, (double)values[v]);
        }
        tried++;
        rejected += try_desc(rt, &d, fl, text) != SDPA_STATUS_SUCCESS;
      }
    }
  }
  /* Every field at once: the largest values, then the smallest. */
  for (int extreme = 0; extreme < 2; extreme++) {
    sdpa_bwd_desc d;
    memset(&d, extreme ? 0x80 : 0x7f, sizeof d);
    d.version = SDPA_BWD_DESC_VERSION;
    sdpa_bwd_plan *plan = (sdpa_bwd_plan *)1;
    sdpa_status st = sdpa_bwd_plan_create(&plan, rt, &d);
    ck_assert_int_eq(st, SDPA_STATUS_INVALID_ARGUMENT);
    ck_assert_ptr_null(plan);
    NAMES("desc.");
  }
  sdpa_runtime_destroy(rt);
  printf("hostile: %d descriptors tried, %d rejected with the field named\n",
         tried, rejected);
  ck_assert_int_gt(rejected, tried / 2);
}
END_TEST

/* A few hostile values with their exact outcome. */
START_TEST(descriptor_exact) {
  sdpa_runtime *rt = make_runtime(NULL);
  sdpa_bwd_plan *plan = NULL;
  sdpa_bwd_desc d = good_desc(SDPA_LAYOUT_BSHD);
  d.seqlen_q = d.seqlen_kv = INT32_MAX;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.seqlen_q");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.q.batch = INT64_MAX / 8 * 8;
  d.q.seq = 512;
  d.q.head = 64;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "overflow");
  NAMES("desc.q");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.dk.seq = INT64_MAX;
  d.dk.head = 64;
  d.dk.batch = 64;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.dk");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.heads_q = 7;
  d.heads_kv = 2;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "heads_kv");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.mask = SDPA_MASK_SLIDING_WINDOW;
  d.window_left = INT32_MIN;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.window_left");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.scale = NAN;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.scale");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.dtype = (sdpa_dtype)INT32_MIN;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.dtype");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.mask = (sdpa_mask)INT32_MAX;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.mask");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.version = 0xdeadbeef;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.version");
  d = good_desc(SDPA_LAYOUT_THD);
  d.max_total_q = INT64_MAX;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.max_total_q");
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.batch = 1 << 24; /* every limit at once: the workspace must not wrap */
  d.heads_q = d.heads_kv = 1 << 16;
  d.seqlen_q = d.seqlen_kv = 1 << 30;
  d.head_dim = 256;
  EXPECT(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.");
  ck_assert_ptr_null(plan);
  sdpa_runtime_destroy(rt);
}
END_TEST

/* ------------------------------------------------------------ execute */

/* A well-aligned address that is never dereferenced on the host. */
static void *fake(uintptr_t n) { return (void *)(uintptr_t)(0x100000 * n); }

static sdpa_bwd_tensors good_tensors(void) {
  sdpa_bwd_tensors t = SDPA_BWD_TENSORS_INIT;
  t.q = fake(1);
  t.k = fake(2);
  t.v = fake(3);
  t.o = fake(4);
  t.dout = fake(5);
  t.lse = fake(6);
  t.dq = fake(7);
  t.dk = fake(8);
  t.dv = fake(9);
  t.cu_seqlens_q = fake(10);
  t.cu_seqlens_kv = fake(11);
  t.total_q = 100;
  t.total_kv = 100;
  return t;
}

/* Every bad tensor, pointer or workspace is rejected, naming the
 * argument, before the driver is consulted. */
static void check_execute_arguments(sdpa_bwd_plan *plan, int thd) {
  size_t ws = sdpa_bwd_workspace_size(plan);
  void *workspace = fake(64);
  sdpa_bwd_tensors t = good_tensors();
  t.version = 0;
  EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "tensors.version");
  const char *names[] = {"q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 9; i++) {
    for (int misaligned = 0; misaligned < 2; misaligned++) {
      t = good_tensors();
      const void **slots[] = {&t.q, &t.k, &t.v, &t.o, &t.dout,
                              (const void **)&t.lse};
      void **out_slots[] = {&t.dq, &t.dk, &t.dv};
      void *value = misaligned ? (void *)(uintptr_t)0x100002 : NULL;
      if (i < 6)
        *slots[i] = value;
      else
        *out_slots[i - 6] = value;
      char what[32];
      snprintf(what, sizeof what, "tensors.%s", names[i]);
      EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL),
             SDPA_STATUS_INVALID_ARGUMENT, what);
    }
  }
  t = good_tensors();
  EXPECT(sdpa_bwd_execute(plan, &t, NULL, ws, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "workspace is NULL");
  NAMES("sdpa_bwd_workspace_size");
  EXPECT(sdpa_bwd_execute(plan, &t, (char *)workspace + 16, ws, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "256-byte aligned");
  NAMES("workspace");
  EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws - 1, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "workspace_bytes");
  NAMES("sdpa_bwd_workspace_size");
  EXPECT(sdpa_bwd_execute(plan, &t, workspace, 0, NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "workspace_bytes = 0");
  if (thd) {
    t = good_tensors();
    t.cu_seqlens_kv = NULL;
    EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL),
           SDPA_STATUS_INVALID_ARGUMENT, "cu_seqlens");
    t = good_tensors();
    t.cu_seqlens_q = (const int32_t *)(uintptr_t)0x100002;
    EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL),
           SDPA_STATUS_INVALID_ARGUMENT, "cu_seqlens");
    /* No tokens on a side: that side's tensors may be NULL (empty
     * framework tensors), the other side's may not. */
    const int gpu = sdpa_driver_get(NULL) == SDPA_STATUS_SUCCESS;
    const sdpa_status past_checks = gpu ? SDPA_STATUS_NOT_COMPILED : SDPA_STATUS_NO_DEVICE;
    t = good_tensors();
    t.total_q = 0;
    t.q = t.o = t.dout = NULL;
    t.lse = NULL;
    t.dq = NULL;
    ck_assert_int_eq(sdpa_bwd_execute(plan, &t, workspace, ws, NULL), past_checks);
    t.k = NULL; /* total_kv is 100 */
    EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL), SDPA_STATUS_INVALID_ARGUMENT,
           "tensors.k");
    t.total_kv = 0;
    t.v = t.dk = t.dv = NULL;
    ck_assert_int_eq(sdpa_bwd_execute(plan, &t, workspace, ws, NULL), past_checks);
    t = good_tensors();
    t.total_kv = 0;
    t.k = t.v = t.dk = t.dv = NULL;
    ck_assert_int_eq(sdpa_bwd_execute(plan, &t, workspace, ws, NULL), past_checks);
    t.dq = NULL; /* total_q is 100 */
    EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL), SDPA_STATUS_INVALID_ARGUMENT,
           "tensors.dq");
    const int64_t totals[] = {-1, INT64_MIN, plan->desc.max_total_q + 1,
                              INT64_MAX};
    for (int i = 0; i < 4; i++) {
      t = good_tensors();
      t.total_q = totals[i];
      EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL),
             SDPA_STATUS_INVALID_ARGUMENT, "tensors.total_q");
      t = good_tensors();
      t.total_kv = totals[i];
      EXPECT(sdpa_bwd_execute(plan, &t, workspace, ws, NULL),
             SDPA_STATUS_INVALID_ARGUMENT, "tensors.total_kv");
    }
  }
}

START_TEST(execute_rejects_before_the_driver) {
  sdpa_runtime *rt = make_runtime(NULL);
  const sdpa_layout layouts[] = {SDPA_LAYOUT_BSHD, SDPA_LAYOUT_THD};
  int gpu = sdpa_driver_get(NULL) == SDPA_STATUS_SUCCESS;
  for (int l = 0; l < 2; l++) {
    sdpa_bwd_desc d = good_desc(layouts[l]);
    sdpa_bwd_plan *plan = NULL;
    ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
    check_execute_arguments(plan, layouts[l] == SDPA_LAYOUT_THD);
    /* a valid call on a plan that was never compiled */
    sdpa_bwd_tensors t = good_tensors();
    sdpa_status st = sdpa_bwd_execute(plan, &t, fake(64),
                                      sdpa_bwd_workspace_size(plan), NULL);
    ck_assert_int_eq(st, gpu ? SDPA_STATUS_NOT_COMPILED : SDPA_STATUS_NO_DEVICE);
    ck_assert_str_ne(sdpa_last_error(), "");
    st = sdpa_bwd_sync_check(plan, NULL);
    ck_assert_int_eq(st, gpu ? SDPA_STATUS_NOT_COMPILED : SDPA_STATUS_NO_DEVICE);
    sdpa_bwd_plan_destroy(plan);
  }
  sdpa_runtime_destroy(rt);
}
END_TEST

/* Under THD the plan checks the outputs' strides one token at a time and
 * execute checks them at the call's totals, before the driver: head-major
 * outputs whose head strides cover 240 query and 100 kv tokens take calls
 * of up to that many, under a bound of 903. */
START_TEST(execute_checks_thd_outputs_at_the_totals) {
  sdpa_runtime *rt = make_runtime(NULL);
  const int gpu = sdpa_driver_get(NULL) == SDPA_STATUS_SUCCESS;
  const sdpa_status past_checks = gpu ? SDPA_STATUS_NOT_COMPILED : SDPA_STATUS_NO_DEVICE;
  sdpa_bwd_desc d = good_desc(SDPA_LAYOUT_THD); /* 8 query heads, 2 kv heads, 64 */
  d.max_total_q = d.max_total_kv = 903;
  d.dq = (sdpa_strides){0, 64, 240 * 64};
  d.dk = (sdpa_strides){0, 64, 100 * 64};
  d.head_dim_v = 32;
  d.dv = (sdpa_strides){0, 32, 100 * 32};
  sdpa_bwd_plan *plan = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
  const size_t ws = sdpa_bwd_workspace_size(plan);
  sdpa_bwd_tensors t = good_tensors();
  t.total_q = 240;
  t.total_kv = 100;
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), ws, NULL), past_checks, "");
  t.total_q = 241;
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), ws, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.dq strides (batch 0, seq 64, head 15360)");
  NAMES("the 1 x 241 x 8 x 64 output share addresses at tensors.total_q = 241");
  t.total_q = 240;
  t.total_kv = 101;
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), ws, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.dk strides (batch 0, seq 64, head 6400)");
  NAMES("the 1 x 101 x 2 x 64 output share addresses at tensors.total_kv = 101");
  /* one side of no tokens is not checked (its tensors may be NULL) */
  t = good_tensors();
  t.total_q = 0;
  t.total_kv = 100;
  t.q = t.o = t.dout = NULL;
  t.lse = NULL;
  t.dq = NULL;
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), ws, NULL), past_checks, "");
  t = good_tensors();
  t.total_q = 240;
  t.total_kv = 0;
  t.k = t.v = t.dk = t.dv = NULL;
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), ws, NULL), past_checks, "");
  t.total_q = 903;
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), ws, NULL), SDPA_STATUS_INVALID_ARGUMENT,
         "desc.dq strides");
  sdpa_bwd_plan_destroy(plan);

  /* dv alone */
  d.dk = (sdpa_strides){0, 0, 0};
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
  t = good_tensors();
  t.total_q = 240;
  t.total_kv = 101;
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), sdpa_bwd_workspace_size(plan), NULL),
         SDPA_STATUS_INVALID_ARGUMENT, "desc.dv strides (batch 0, seq 32, head 3200)");
  NAMES("the 1 x 101 x 2 x 32 output share addresses at tensors.total_kv = 101");
  sdpa_bwd_plan_destroy(plan);

  /* BSHD outputs were checked whole by the plan: execute adds nothing */
  d = good_desc(SDPA_LAYOUT_BSHD);
  d.dq = (sdpa_strides){8 * 256 * 64, 64, 256 * 64};
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
  t = good_tensors();
  EXPECT(sdpa_bwd_execute(plan, &t, fake(64), sdpa_bwd_workspace_size(plan), NULL),
         past_checks, "");
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
}
END_TEST

/* A compiled plan on a machine without a GPU (a preheating host): execute
 * answers NO_DEVICE with a message, every time, and never crashes. */
START_TEST(execute_compiled_without_gpu) {
  if (sdpa_driver_get(NULL) == SDPA_STATUS_SUCCESS) {
    printf("hostile: a CUDA device is present; execute_compiled_without_gpu "
           "checks nothing here (fake pointers must not be launched)\n");
    return;
  }
  sdpa_runtime *rt = make_runtime(NULL);
  sdpa_bwd_desc d = good_desc(SDPA_LAYOUT_BSHD);
  sdpa_bwd_plan *plan = NULL;
  sdpa_source source = SDPA_SOURCE_NONE;
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
  sdpa_status st = sdpa_bwd_compile(plan, &source);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "compile: %s", sdpa_last_error());
  ck_assert_int_eq(source, SDPA_SOURCE_COMPILED);
  check_execute_arguments(plan, 0);
  sdpa_bwd_tensors t = good_tensors();
  for (int i = 0; i < 3; i++) {
    st = sdpa_bwd_execute(plan, &t, fake(64), sdpa_bwd_workspace_size(plan),
                          fake(99));
    ck_assert_int_eq(st, SDPA_STATUS_NO_DEVICE);
    ck_assert_str_ne(sdpa_last_error(), "");
  }
  ck_assert_int_eq(sdpa_bwd_sync_check(plan, NULL), SDPA_STATUS_NO_DEVICE);
  /* compiling again is a table hit, still without a GPU */
  ck_assert_int_eq(sdpa_bwd_compile(plan, &source), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(source, SDPA_SOURCE_MEMORY);
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
}
END_TEST

/* ------------------------------------------------------- leak cycles */

/* Runs `cycles` create → plan → compile → inspect → destroy rounds on a
 * disk cache in a temporary directory (the first compile runs NVRTC, the
 * rest load from disk), with the error paths a caller can reach. Returns
 * the number of unexpected results (0 for a clean run). */
static int leak_cycles(int cycles) {
  int failures = 0, warnings = 0;
  char *dir = sdpa_test_tmpdir("leaks");
  char *path = NULL;
  if (!dir || asprintf(&path, "%s/kernels.sqlite", dir) < 0) return 1;
  for (int c = 0; c < cycles; c++) {
    sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
    sdpa_runtime *rt = NULL;
    opts.cache_path = path;
    opts.arch = 90;
    opts.log = quiet_log;
    opts.log_user = &warnings;
    if (sdpa_runtime_create(&rt, &opts) != SDPA_STATUS_SUCCESS) {
      failures++;
      continue;
    }
    sdpa_bwd_desc d = good_desc(SDPA_LAYOUT_BSHD);
    sdpa_bwd_plan *plan = NULL, *again = NULL, *bad = NULL;
    sdpa_source source = SDPA_SOURCE_NONE;
    failures += sdpa_bwd_plan_create(&plan, rt, &d) != SDPA_STATUS_SUCCESS;
    failures += sdpa_bwd_compile(plan, &source) != SDPA_STATUS_SUCCESS;
    failures += source != (c == 0 ? SDPA_SOURCE_COMPILED : SDPA_SOURCE_DISK);
    failures += sdpa_bwd_plan_create(&again, rt, &d) != SDPA_STATUS_SUCCESS;
    failures += sdpa_bwd_compile(again, &source) != SDPA_STATUS_SUCCESS;
    failures += source != SDPA_SOURCE_MEMORY;
    d.head_dim = 84; /* an error path: not a multiple of 8 */
    failures += sdpa_bwd_plan_create(&bad, rt, &d) == SDPA_STATUS_SUCCESS;
    sdpa_bwd_tensors t = SDPA_BWD_TENSORS_INIT;
    failures += sdpa_bwd_execute(plan, &t, NULL, 0, NULL) ==
                SDPA_STATUS_SUCCESS;

    sdpa_cache_entry *entries = NULL, *entry = NULL;
    size_t count = 0, size = 0;
    void *cubin = NULL;
    sdpa_cache_stats stats;
    int64_t checked = 0, removed = 0;
    failures += sdpa_cache_list(rt, &entries, &count) != SDPA_STATUS_SUCCESS;
    failures += count != 1;
    sdpa_cache_entries_free(entries, count);
    failures += sdpa_cache_get(rt, sdpa_bwd_plan_key_hash(plan), &entry) !=
                SDPA_STATUS_SUCCESS;
    sdpa_cache_entries_free(entry, 1);
    failures += sdpa_cache_get(rt, "ffffff", &entry) != SDPA_STATUS_NOT_FOUND;
    failures += sdpa_cache_get_cubin(rt, sdpa_bwd_plan_key(plan), &cubin,
                                     &size) != SDPA_STATUS_SUCCESS;
    sdpa_free(cubin);
    failures += sdpa_cache_stats_get(rt, &stats) != SDPA_STATUS_SUCCESS;
    failures += sdpa_cache_verify(rt, &checked, &removed) !=
                SDPA_STATUS_SUCCESS;
    failures += removed != 0;
    failures += sdpa_cache_prune(rt, -1, -1, &removed) != SDPA_STATUS_SUCCESS;
    sdpa_bwd_plan_destroy(again);
    sdpa_bwd_plan_destroy(plan);
    sdpa_runtime_destroy(rt);
  }
  /* a runtime whose location cannot be used (memory mode, one warning) */
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  sdpa_runtime *rt = NULL;
  char *under = NULL;
  if (asprintf(&under, "%s/sub/kernels.sqlite", path) >= 0) {
    opts.cache_path = under;
    opts.arch = 90;
    opts.log = quiet_log;
    opts.log_user = &warnings;
    failures += sdpa_runtime_create(&rt, &opts) != SDPA_STATUS_SUCCESS;
    sdpa_runtime_destroy(rt);
    free(under);
  }
  failures += warnings != 1;
  sdpa_test_rmtree(dir);
  free(path);
  free(dir);
  printf("leak cycles: %d cycles, %d unexpected results, %d warnings\n",
         cycles, failures, warnings);
  return failures;
}

/* ---------------------------------------------------------------- main */

static Suite *hostile_suite(void) {
  Suite *s = suite_create("hostile");
  TCase *args = tcase_create("arguments");
  tcase_set_timeout(args, 120);
  tcase_add_test(args, null_pointer_arguments);
  tcase_add_test(args, status_names);
  tcase_add_test(args, runtime_options_hostile);
  tcase_add_test(args, descriptor_sweep);
  tcase_add_test(args, descriptor_exact);
  suite_add_tcase(s, args);

  TCase *exec = tcase_create("execute");
  tcase_set_timeout(exec, 300);
  tcase_add_test(exec, execute_rejects_before_the_driver);
  tcase_add_test(exec, execute_checks_thd_outputs_at_the_totals);
  tcase_add_test(exec, execute_compiled_without_gpu);
  suite_add_tcase(s, exec);
  return s;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--leak-cycles") == 0)
    return leak_cycles(atoi(argv[2])) == 0 ? 0 : 1;
  work_dir = sdpa_test_tmpdir("hostile");
  if (!work_dir || asprintf(&cache_file, "%s/kernels.sqlite", work_dir) < 0) {
    fprintf(stderr, "cannot make a temporary directory\n");
    return 1;
  }
  int rc = sdpa_test_run(hostile_suite());
  sdpa_test_rmtree(work_dir);
  free(cache_file);
  free(work_dir);
  return rc;
}
