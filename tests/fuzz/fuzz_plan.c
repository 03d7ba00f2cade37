/*
 * fuzz_plan.c — libFuzzer target: bytes → a descriptor → validation, key,
 * plan, workspace, and the argument checks of execute.
 *
 * Descriptors reach the library from frameworks and FFIs, so every field
 * may hold anything. The input is decoded field by field: each value is
 * taken from a table of interesting numbers (limits, tile sizes, overflow
 * edges), as a small number, or as raw bytes, so the fuzzer reaches deep
 * into validation instead of failing the first check. What must hold:
 *   - no crash, no sanitizer report, no unbounded work;
 *   - a rejected descriptor gets INVALID_ARGUMENT or NOT_SUPPORTED, a
 *     non-empty message, and *out stays NULL;
 *   - an accepted one gets a sane plan: 256-aligned non-zero workspace, a
 *     canonical key text and 32 lowercase hex digits of hash (the same for
 *     a second plan of the same descriptor), resolved fields in range;
 *   - execute on it rejects a too-small workspace with INVALID_ARGUMENT
 *     (the argument checks come before any driver call).
 * The runtime targets sm_90 with the disk cache disabled; nothing is ever
 * compiled here (NVRTC would make each run take a second).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "sdpa_jit.h"

static sdpa_runtime *runtime;
static unsigned long accepted, rejected; /* printed at exit (stderr) */

static void print_counts(void) {
  fprintf(stderr, "fuzz_plan: %lu descriptors accepted, %lu rejected\n",
          accepted, rejected);
}

static void ignore_log(sdpa_log_level level, const char *message, void *user) {
  (void)level;
  (void)message;
  (void)user;
}

/* A violated property: report it and let libFuzzer record the input. */
#define REQUIRE(cond)                                                         \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "fuzz_plan: %s:%d: %s failed (last error: %s)\n",       \
              __FILE__, __LINE__, #cond, sdpa_last_error());                  \
      abort();                                                                \
    }                                                                         \
  } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.arch = 90;
  opts.disable_disk_cache = 1;
  opts.log = ignore_log;
  if (sdpa_runtime_create(&runtime, &opts) != SDPA_STATUS_SUCCESS) {
    fprintf(stderr, "fuzz_plan: runtime_create: %s\n", sdpa_last_error());
    abort();
  }
  atexit(print_counts);
  return 0;
}

/* ------------------------------------------------------- input decoding */

typedef struct reader {
  const uint8_t *data;
  size_t left;
} reader;

static uint8_t take_byte(reader *r) {
  if (r->left == 0) return 0;
  r->left--;
  return *r->data++;
}

static uint64_t take_raw(reader *r, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; i++) value |= (uint64_t)take_byte(r) << (8 * i);
  return value;
}

static const int64_t interesting[] = {
    0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 65, 80, 96, 127, 128, 129,
    192, 200, 255, 256, 257, 512, 1000, 1024, 4096, 8192, 65535, 65536, 65537,
    1 << 20, 1 << 24, (1 << 24) + 1, 1 << 30, (1 << 30) + 1, INT32_MAX,
    (int64_t)INT32_MAX + 1, UINT32_MAX, INT64_MAX / 2, INT64_MAX / 8 * 8,
    INT64_MAX - 7, INT64_MAX, -1, -2, -8, -64, INT32_MIN, INT64_MIN,
    INT64_MIN + 8};
#define INTERESTING_COUNT (sizeof interesting / sizeof interesting[0])

/* A value: mostly an interesting number or a small one, sometimes raw. */
static int64_t take_value(reader *r) {
  uint8_t mode = take_byte(r);
  if (mode < 160) return interesting[mode % INTERESTING_COUNT];
  if (mode < 224) return (int64_t)take_byte(r) - 16;
  return (int64_t)take_raw(r, 8);
}

static int take_int(reader *r) { return (int)take_value(r); }

static const int head_dims[] = {32, 64, 96, 128, 192, 256};

static int take_head_dim(reader *r) {
  uint8_t mode = take_byte(r);
  if (mode < 200) return head_dims[mode % 6];
  return take_int(r);
}

static void take_strides(reader *r, sdpa_strides *s) {
  if (take_byte(r) < 160) return; /* packed */
  s->batch = take_value(r);
  s->seq = take_value(r);
  s->head = take_value(r);
}

static float take_scale(reader *r) {
  static const float values[] = {0.0f,      0.125f,   1.0f,     -1.0f,
                                 NAN,       INFINITY, -INFINITY, FLT_MAX,
                                 -FLT_MAX,  1e-45f,   FLT_MIN,  0.0883883f};
  uint8_t mode = take_byte(r);
  if (mode < 200) return values[mode % 12];
  uint32_t bits = (uint32_t)take_raw(r, 4);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static int take_arch(reader *r) {
  static const int values[] = {0, 80, 86, 89, 90, 100, 120, 75, 70, 85, 1,
                               -1};
  uint8_t mode = take_byte(r);
  if (mode < 220) return values[mode % 12];
  return take_int(r);
}

static void decode(reader *r, sdpa_bwd_desc *d) {
  memset(d, 0, sizeof *d);
  d->version = take_byte(r) < 250 ? SDPA_BWD_DESC_VERSION
                                  : (unsigned)take_raw(r, 4);
  uint8_t dtype = take_byte(r);
  d->dtype = (sdpa_dtype)(dtype < 240 ? 1 + dtype % 2 : take_int(r));
  uint8_t layout = take_byte(r);
  d->layout = (sdpa_layout)(layout < 240 ? 1 + layout % 2 : take_int(r));
  d->batch = take_int(r);
  d->heads_q = take_int(r);
  d->heads_kv = take_int(r);
  d->seqlen_q = take_int(r);
  d->seqlen_kv = take_int(r);
  d->head_dim = take_head_dim(r);
  d->head_dim_v = take_byte(r) < 128 ? 0 : take_head_dim(r);
  sdpa_strides *tensors[] = {&d->q, &d->k,  &d->v,  &d->o,
                             &d->dout, &d->dq, &d->dk, &d->dv};
  for (int i = 0; i < 8; i++) take_strides(r, tensors[i]);
  if (take_byte(r) >= 160) {
    d->lse.batch = take_value(r);
    d->lse.head = take_value(r);
    d->lse.seq = take_value(r);
  }
  d->max_total_q = take_byte(r) < 128 ? 0 : take_value(r);
  d->max_total_kv = take_byte(r) < 128 ? 0 : take_value(r);
  uint8_t mask = take_byte(r);
  d->mask = (sdpa_mask)(mask < 240 ? mask % 4 : take_int(r));
  d->window_left = take_int(r);
  d->window_right = take_int(r);
  d->scale = take_scale(r);
  d->deterministic = take_int(r);
  d->arch = take_arch(r);
}

/* -------------------------------------------------------------- checks */

static int is_lower_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return 0;
  return s[n] == '\0';
}

static void check_plan(sdpa_bwd_plan *plan, const sdpa_bwd_desc *d) {
  const sdpa_bwd_desc *r = &plan->desc;
  size_t ws = sdpa_bwd_workspace_size(plan);
  REQUIRE(ws > 0 && ws % 256 == 0);
  REQUIRE(strncmp(sdpa_bwd_plan_key(plan), "sdpa_bwd;", 9) == 0);
  REQUIRE(is_lower_hex(sdpa_bwd_plan_key_hash(plan), 32));
  REQUIRE(r->batch >= 1 && r->heads_q >= 1 && r->heads_kv >= 1);
  REQUIRE(r->heads_q % r->heads_kv == 0);
  REQUIRE(r->seqlen_q >= 1 && r->seqlen_kv >= 1);
  REQUIRE(r->head_dim_v >= 1 && r->head_dim_v <= r->head_dim);
  REQUIRE(isfinite(r->scale) && r->scale != 0.0f);
  REQUIRE(r->arch >= 80);
  REQUIRE(d->arch == 0 ? r->arch == 90 : r->arch == d->arch);
  REQUIRE(r->q.seq >= 1 && r->q.head >= 1 && r->lse.seq >= 1);
  REQUIRE(plan->fields.q_tile >= 1 && plan->fields.kv_tile >= 1);
  REQUIRE(plan->source == SDPA_SOURCE_NONE);
  if (r->layout == SDPA_LAYOUT_THD)
    REQUIRE(r->max_total_q >= 1 && r->max_total_q <= INT32_MAX &&
            r->max_total_kv >= 1 && r->max_total_kv <= INT32_MAX);

  /* The same descriptor gives the same key. */
  sdpa_bwd_plan *again = NULL;
  REQUIRE(sdpa_bwd_plan_create(&again, runtime, d) == SDPA_STATUS_SUCCESS);
  REQUIRE(strcmp(sdpa_bwd_plan_key_hash(again), sdpa_bwd_plan_key_hash(plan)) ==
          0);
  REQUIRE(sdpa_bwd_workspace_size(again) == ws);
  sdpa_bwd_plan_destroy(again);

  /* Execute's argument checks come before the driver. */
  sdpa_bwd_tensors t = SDPA_BWD_TENSORS_INIT;
  void *fake = (void *)(uintptr_t)0x100000;
  t.q = t.k = t.v = t.o = t.dout = fake;
  t.lse = fake;
  t.dq = t.dk = t.dv = fake;
  t.cu_seqlens_q = t.cu_seqlens_kv = fake;
  REQUIRE(sdpa_bwd_execute(plan, &t, fake, ws - 1, NULL) ==
          SDPA_STATUS_INVALID_ARGUMENT);
  REQUIRE(sdpa_bwd_execute(plan, NULL, fake, ws, NULL) ==
          SDPA_STATUS_INVALID_ARGUMENT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  sdpa_bwd_desc d;
  decode(&r, &d);

  sdpa_bwd_plan *plan = (sdpa_bwd_plan *)(uintptr_t)16;
  sdpa_status st = sdpa_bwd_plan_create(&plan, runtime, &d);
  if (st == SDPA_STATUS_SUCCESS) {
    REQUIRE(plan != NULL);
    check_plan(plan, &d);
    sdpa_bwd_plan_destroy(plan);
    accepted++;
  } else {
    rejected++;
    REQUIRE(st == SDPA_STATUS_INVALID_ARGUMENT ||
            st == SDPA_STATUS_NOT_SUPPORTED);
    REQUIRE(plan == NULL);
    REQUIRE(sdpa_last_error()[0] != '\0');
  }

  /* The internal resolver with an arch from the input: same verdict
   * rules, no runtime involved. */
  sdpa_bwd_desc resolved;
  int arch = take_arch(&r);
  st = sdpa_desc_resolve(&d, arch, &resolved);
  REQUIRE(st == SDPA_STATUS_SUCCESS || st == SDPA_STATUS_INVALID_ARGUMENT ||
          st == SDPA_STATUS_NOT_SUPPORTED || st == SDPA_STATUS_NO_DEVICE);
  if (st != SDPA_STATUS_SUCCESS) REQUIRE(sdpa_last_error()[0] != '\0');
  return 0;
}
