/*
 * test_cpu_key.c — the specialization key: its text, its hash, and which
 * descriptor fields move them.
 *
 * The key decides which cubin a plan gets, so both directions matter: a
 * field that selects code must change the key (or two shapes would share a
 * wrong kernel), and a field that is only a launch argument must not (or
 * every batch size would compile its own kernel). The hash must be the
 * same in every process and runtime (the cache is shared by processes and
 * shipped between machines), and must cover the template bytes, which is
 * checked by recomputing it the way key.c documents.
 *
 * Needs no GPU: every plan names its arch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sqlite3.h>
#include <xxhash.h>

#include "cache.h"
#include "check_main.h"
#include "instantiate.h"
#include "key.h"
#include "nvrtc.h"
#include "plan.h"
#include "sdpa_jit.h"
#include "test_cache.h"

static sdpa_runtime *open_runtime(void) { return sdpa_test_memory_runtime(90); }

/* bf16 BSHD, 2 x 256 x 8 x 128, even for any tile that divides 256. */
static sdpa_bwd_desc base_desc(void) {
  sdpa_bwd_desc d;
  memset(&d, 0, sizeof d);
  d.version = SDPA_BWD_DESC_VERSION;
  d.dtype = SDPA_DTYPE_BF16;
  d.layout = SDPA_LAYOUT_BSHD;
  d.batch = 2;
  d.heads_q = 8;
  d.heads_kv = 8;
  d.seqlen_q = 256;
  d.seqlen_kv = 256;
  d.head_dim = 128;
  d.arch = 90;
  return d;
}

/* A plan's key text and hash, copied out. */
typedef struct key_copy {
  char text[512];
  char hash[33];
  sdpa_key_fields fields;
} key_copy;

static key_copy plan_key_with(sdpa_runtime *rt, const sdpa_bwd_desc *desc,
                              const sdpa_bwd_plan_options *options) {
  sdpa_bwd_plan *plan = NULL;
  sdpa_status st = sdpa_bwd_plan_create_with(&plan, rt, desc, options);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "plan_create: %s: %s",
                sdpa_status_name(st), sdpa_last_error());
  key_copy k;
  snprintf(k.text, sizeof k.text, "%s", sdpa_bwd_plan_key(plan));
  snprintf(k.hash, sizeof k.hash, "%s", sdpa_bwd_plan_key_hash(plan));
  k.fields = plan->fields;
  sdpa_bwd_plan_destroy(plan);
  return k;
}

/* The key of `desc` in the mma.sync family (which every descriptor has;
 * on sm_90 AUTO takes the Hopper family for some, test_cpu_hopper). */
static key_copy plan_key(sdpa_runtime *rt, const sdpa_bwd_desc *desc) {
  sdpa_bwd_plan_options mma = SDPA_BWD_PLAN_OPTIONS_INIT;
  mma.family = SDPA_FAMILY_MMA;
  return plan_key_with(rt, desc, &mma);
}

static sdpa_key_fields base_fields(void) {
  sdpa_key_fields f;
  memset(&f, 0, sizeof f);
  f.arch = 90;
  f.dtype = SDPA_DTYPE_BF16;
  f.head_dim = 128;
  f.head_dim_v = 128;
  f.family = SDPA_FAMILY_MMA;
  f.q_tile = 64;
  f.kv_tile = 128;
  f.warps = 8;
  f.stages = 2;
  f.lse_packed = 1;
  f.layout = SDPA_LAYOUT_BSHD;
  f.mask = SDPA_MASK_NONE;
  f.deterministic = 0;
  f.even = 1;
  return f;
}

static sdpa_key build(const sdpa_key_fields *f) {
  sdpa_key key;
  sdpa_status st = sdpa_key_build(f, &key);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "key_build: %s", sdpa_last_error());
  return key;
}

START_TEST(text_exact_format) {
  sdpa_key_fields f = base_fields();
  sdpa_key key = build(&f);
  ck_assert_str_eq(key.text,
                   "sdpa_bwd;arch=90;family=mma;dtype=bf16;hd=128;hdv=128;qt=64;"
                   "kvt=128;warps=8;stages=2;lse=packed;layout=bshd;mask=none;det=0;"
                   "even=1;dq=convert");

  f.arch = 80;
  f.dtype = SDPA_DTYPE_FP16;
  f.head_dim = 96;
  f.head_dim_v = 64;
  f.family = SDPA_FAMILY_HOPPER;
  f.q_tile = 32;
  f.kv_tile = 64;
  f.warps = 4;
  f.stages = 1;
  f.lse_packed = 0;
  f.layout = SDPA_LAYOUT_THD;
  f.mask = SDPA_MASK_SLIDING_WINDOW;
  f.deterministic = 1;
  f.even = 0;
  f.fold_dq = 1;
  key = build(&f);
  ck_assert_str_eq(key.text,
                   "sdpa_bwd;arch=80;family=hopper;dtype=fp16;hd=96;hdv=64;qt=32;"
                   "kvt=64;warps=4;stages=1;lse=strided;layout=thd;mask=window;det=1;"
                   "even=0;dq=main");

  f.mask = SDPA_MASK_CAUSAL_TOP_LEFT;
  ck_assert_ptr_nonnull(strstr(build(&f).text, ";mask=causal_tl;"));
  f.mask = SDPA_MASK_CAUSAL_BOTTOM_RIGHT;
  ck_assert_ptr_nonnull(strstr(build(&f).text, ";mask=causal_br;"));
}
END_TEST

START_TEST(plan_text_uses_its_fields) {
  sdpa_runtime *rt = open_runtime();
  sdpa_bwd_desc d = base_desc();
  key_copy k = plan_key(rt, &d);
  char expected[512];
  snprintf(expected, sizeof expected,
           "sdpa_bwd;arch=90;family=mma;dtype=bf16;hd=128;hdv=128;qt=%d;kvt=%d;"
           "warps=%d;stages=%d;lse=packed;layout=bshd;mask=none;det=0;even=%d;"
           "dq=convert",
           k.fields.q_tile, k.fields.kv_tile,
           k.fields.warps, k.fields.stages,
           256 % k.fields.q_tile == 0 && 256 % k.fields.kv_tile == 0);
  ck_assert_str_eq(k.text, expected);
  ck_assert_uint_eq(strlen(k.hash), 32);
  ck_assert_uint_eq(strspn(k.hash, "0123456789abcdef"), 32);
  sdpa_runtime_destroy(rt);
}
END_TEST

/* The hash as key.h documents it, computed here independently. */
START_TEST(hash_covers_templates_toolchain_and_text) {
  sdpa_key_fields f = base_fields();
  sdpa_key key = build(&f);

  XXH3_state_t *state = XXH3_createState();
  ck_assert_ptr_nonnull(state);
  XXH3_128bits_reset(state);
  ck_assert_uint_gt(sdpa_embedded_templates_count, 0);
  for (size_t i = 0; i < sdpa_embedded_templates_count; i++) {
    const sdpa_embedded_file *file = &sdpa_embedded_templates[i];
    unsigned char size_bytes[8];
    for (int b = 0; b < 8; b++)
      size_bytes[b] = (unsigned char)((uint64_t)file->size >> (8 * b));
    XXH3_128bits_update(state, file->name, strlen(file->name) + 1);
    XXH3_128bits_update(state, size_bytes, 8);
    XXH3_128bits_update(state, file->data, file->size);
  }
  const char *version = sdpa_nvrtc_version();
  XXH3_128bits_update(state, version, strlen(version) + 1);
  const char *const *options = sdpa_nvrtc_options(90, 0);
  ck_assert_ptr_nonnull(options);
  for (size_t i = 0; options[i]; i++)
    XXH3_128bits_update(state, options[i], strlen(options[i]) + 1);
  XXH3_128bits_update(state, SDPA_JIT_VERSION_STRING,
                      strlen(SDPA_JIT_VERSION_STRING) + 1);
  XXH3_128bits_update(state, key.text, strlen(key.text) + 1);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state));
  XXH3_freeState(state);
  char hex[33];
  for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
  ck_assert_str_eq(key.hash, hex);

  /* and it is not the hash of the text alone */
  XXH128_canonicalFromHash(&c, XXH3_128bits(key.text, strlen(key.text)));
  for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
  ck_assert_str_ne(key.hash, hex);

  /* options name the arch and ask ptxas for its report */
  int saw_arch = 0, saw_verbose = 0;
  for (size_t i = 0; options[i]; i++) {
    if (strcmp(options[i], "--gpu-architecture=sm_90") == 0) saw_arch = 1;
    if (strcmp(options[i], "--ptxas-options=-v") == 0) saw_verbose = 1;
    ck_assert_str_ne(options[i], "-lineinfo");
  }
  ck_assert(saw_arch && saw_verbose);
  ck_assert_str_eq(sdpa_nvrtc_options(80, 0)[0], "--gpu-architecture=sm_80");
  /* every arch of the table spells its number as printf would, and the
   * arch-specific target (the Hopper family) with an "a" */
  for (int arch = 0; arch < 256; arch++) {
    char want[40];
    snprintf(want, sizeof want, "--gpu-architecture=sm_%d", arch);
    ck_assert_str_eq(sdpa_nvrtc_options(arch, 0)[0], want);
    snprintf(want, sizeof want, "--gpu-architecture=sm_%da", arch);
    ck_assert_str_eq(sdpa_nvrtc_options(arch, 1)[0], want);
  }
  ck_assert_ptr_null(sdpa_nvrtc_options(256, 0));
  ck_assert_ptr_null(sdpa_nvrtc_options(-1, 1));

  /* the family picks the options: a Hopper key hashes sm_90a's */
  sdpa_key_fields hopper = base_fields();
  hopper.family = SDPA_FAMILY_HOPPER;
  ck_assert_str_ne(build(&hopper).hash, key.hash);
}
END_TEST

/* Prints the base plan's hash and text (the child side of the test below). */
static int print_key(void) {
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.disable_disk_cache = 1;
  sdpa_runtime *rt = NULL;
  if (sdpa_runtime_create(&rt, &opts) != SDPA_STATUS_SUCCESS) return 1;
  sdpa_bwd_desc d = base_desc();
  sdpa_bwd_plan *plan = NULL;
  if (sdpa_bwd_plan_create(&plan, rt, &d) != SDPA_STATUS_SUCCESS) return 1;
  printf("%s %s\n", sdpa_bwd_plan_key_hash(plan), sdpa_bwd_plan_key(plan));
  sdpa_bwd_plan_destroy(plan);
  sdpa_runtime_destroy(rt);
  return 0;
}

START_TEST(hash_stable_across_processes) {
  /* Two fresh processes of this test binary (exec, not fork: nothing of
   * this process's state is inherited) print the key they build. */
  char line[2][700], exe[4096], cmd[4200];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ck_assert_int_gt(n, 0);
  exe[n] = '\0';
  snprintf(cmd, sizeof cmd, "'%s' --print-key", exe);
  for (int run = 0; run < 2; run++) {
    FILE *child = popen(cmd, "r");
    ck_assert_ptr_nonnull(child);
    ck_assert_ptr_nonnull(fgets(line[run], sizeof line[run], child));
    ck_assert_int_eq(pclose(child), 0);
    line[run][strcspn(line[run], "\n")] = '\0';
  }
  ck_assert_str_eq(line[0], line[1]);

  sdpa_runtime *rt = open_runtime();
  sdpa_bwd_desc d = base_desc();
  key_copy k = plan_key_with(rt, &d, NULL); /* as the children: every default */
  char here[700];
  snprintf(here, sizeof here, "%s %s", k.hash, k.text);
  ck_assert_str_eq(line[0], here);
  sdpa_runtime_destroy(rt);
}
END_TEST

START_TEST(hash_same_across_runtimes) {
  char *dir = sdpa_test_tmpdir("key");
  ck_assert_ptr_nonnull(dir);
  char path[4200];
  snprintf(path, sizeof path, "%s/kernels.sqlite", dir);

  sdpa_runtime *a = open_runtime();
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.cache_path = path;
  opts.arch = 80; /* a different default; the desc names 90 */
  sdpa_runtime *b = NULL;
  ck_assert_int_eq(sdpa_runtime_create(&b, &opts), SDPA_STATUS_SUCCESS);

  sdpa_bwd_desc d = base_desc();
  key_copy ka = plan_key(a, &d), kb = plan_key(b, &d);
  ck_assert_str_eq(ka.text, kb.text);
  ck_assert_str_eq(ka.hash, kb.hash);

  /* arch 0 takes each runtime's own arch */
  d.arch = 0;
  ka = plan_key(a, &d);
  kb = plan_key(b, &d);
  ck_assert_ptr_nonnull(strstr(ka.text, "arch=90;"));
  ck_assert_ptr_nonnull(strstr(kb.text, "arch=80;"));
  ck_assert_str_ne(ka.hash, kb.hash);

  sdpa_runtime_destroy(a);
  sdpa_runtime_destroy(b);
  sdpa_test_rmtree(dir);
  free(dir);
}
END_TEST

/* Every field of sdpa_key_fields moves both the text and the hash. */
START_TEST(every_key_field_changes_text_and_hash) {
  const sdpa_key_fields base = base_fields();
  const sdpa_key ref = build(&base);
  sdpa_key_fields variants[SDPA_KEY_FIELD_COUNT + 4];
  const char *what[SDPA_KEY_FIELD_COUNT + 4];
  int n = 0;
#define VARIANT(label, stmt)                                                  \
  do {                                                                        \
    variants[n] = base;                                                       \
    { sdpa_key_fields *f = &variants[n]; stmt; }                              \
    what[n++] = label;                                                        \
  } while (0)
  VARIANT("arch", f->arch = 80);
  VARIANT("family", f->family = SDPA_FAMILY_HOPPER);
  VARIANT("dtype", f->dtype = SDPA_DTYPE_FP16);
  VARIANT("head_dim", f->head_dim = 192);
  VARIANT("head_dim_v", f->head_dim_v = 64);
  VARIANT("q_tile", f->q_tile = 128);
  VARIANT("kv_tile", f->kv_tile = 64);
  VARIANT("warps", f->warps = 4);
  VARIANT("stages", f->stages = 1);
  VARIANT("lse", f->lse_packed = 0);
  VARIANT("layout", f->layout = SDPA_LAYOUT_THD);
  VARIANT("mask tl", f->mask = SDPA_MASK_CAUSAL_TOP_LEFT);
  VARIANT("mask br", f->mask = SDPA_MASK_CAUSAL_BOTTOM_RIGHT);
  VARIANT("mask window", f->mask = SDPA_MASK_SLIDING_WINDOW);
  VARIANT("deterministic", f->deterministic = 1);
  VARIANT("even", f->even = 0);
  VARIANT("dq writer", f->fold_dq = 1);
#undef VARIANT
  /* one variant per field at least: a field added to key_fields.h without
   * a variant here fails this count */
  ck_assert_int_ge(n, SDPA_KEY_FIELD_COUNT);
  sdpa_key keys[SDPA_KEY_FIELD_COUNT + 4];
  for (int i = 0; i < n; i++) {
    keys[i] = build(&variants[i]);
    ck_assert_msg(strcmp(keys[i].text, ref.text) != 0, "%s: text unchanged",
                  what[i]);
    ck_assert_msg(strcmp(keys[i].hash, ref.hash) != 0, "%s: hash unchanged",
                  what[i]);
  }
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      ck_assert_msg(strcmp(keys[i].hash, keys[j].hash) != 0,
                    "%s and %s share a hash", what[i], what[j]);
}
END_TEST

/* The same through descriptors: the fields that select code, as a user
 * sets them, move the key. */
START_TEST(descriptor_fields_that_select_code) {
  sdpa_runtime *rt = open_runtime();
  sdpa_bwd_desc base = base_desc();
  key_copy ref = plan_key(rt, &base);
  ck_assert_int_eq(ref.fields.even, 1);
  sdpa_bwd_desc v[12];
  const char *what[12];
  int n = 0;
#define VARIANT(label, stmt)                                                  \
  do {                                                                        \
    v[n] = base;                                                              \
    { sdpa_bwd_desc *d = &v[n]; stmt; }                                       \
    what[n++] = label;                                                        \
  } while (0)
  VARIANT("arch", d->arch = 80);
  VARIANT("dtype", d->dtype = SDPA_DTYPE_FP16);
  VARIANT("head_dim", (d->head_dim = 64, d->head_dim_v = 64));
  VARIANT("head_dim_v", d->head_dim_v = 64);
  VARIANT("mask", d->mask = SDPA_MASK_CAUSAL_BOTTOM_RIGHT);
  VARIANT("window", (d->mask = SDPA_MASK_SLIDING_WINDOW, d->window_left = 16));
  VARIANT("layout", d->layout = SDPA_LAYOUT_THD);
  VARIANT("lse class", (d->lse.batch = 8 * 256, d->lse.head = 1, d->lse.seq = 8));
  VARIANT("deterministic", d->deterministic = 1);
  VARIANT("even", (d->seqlen_q = 200, d->seqlen_kv = 200));
  /* the tiles follow the main kernel's grid: 32 blocks of 128 kv rows
   * here (small-grid tiles), 1024 */
  VARIANT("small-grid tiles", d->batch = 64);
#undef VARIANT
  for (int i = 0; i < n; i++) {
    key_copy k = plan_key(rt, &v[i]);
    ck_assert_msg(strcmp(k.text, ref.text) != 0, "%s: text unchanged", what[i]);
    ck_assert_msg(strcmp(k.hash, ref.hash) != 0, "%s: hash unchanged", what[i]);
  }
  /* who writes dQ: the convert kernel unless options.dq_writer says main */
  sdpa_bwd_plan_options main_dq = SDPA_BWD_PLAN_OPTIONS_INIT;
  main_dq.dq_writer = SDPA_DQ_MAIN;
  key_copy main_writer = plan_key_with(rt, &base, &main_dq);
  ck_assert_ptr_nonnull(strstr(ref.text, ";dq=convert"));
  ck_assert_ptr_nonnull(strstr(main_writer.text, ";dq=main"));
  ck_assert_str_ne(main_writer.hash, ref.hash);
  /* the even flag is cleared by a length that is not a tile multiple */
  sdpa_bwd_desc odd = base;
  odd.seqlen_kv = 256 + 1;
  ck_assert_int_eq(plan_key(rt, &odd).fields.even, 0);
  /* THD is never even */
  sdpa_bwd_desc thd = base;
  thd.layout = SDPA_LAYOUT_THD;
  ck_assert_int_eq(plan_key(rt, &thd).fields.even, 0);
  sdpa_runtime_destroy(rt);
}
END_TEST

/* Launch arguments do not move the key: one artifact serves them all. */
START_TEST(launch_arguments_leave_key_unchanged) {
  /* Sizes move the key only through the small-grid tiles (the test
   * above, and test_cpu_plan's small_grid_tiles): rule off (the runtime's
   * default, from its environment), so that these variants may cross the
   * 64-block threshold. */
  ck_assert_int_eq(setenv("SDPA_JIT_SMALL_GRID", "0", 1), 0);
  sdpa_runtime *rt = open_runtime();
  unsetenv("SDPA_JIT_SMALL_GRID");
  sdpa_bwd_desc base = base_desc();
  key_copy ref = plan_key(rt, &base);
  int qt = ref.fields.q_tile, kvt = ref.fields.kv_tile;
  int tile = qt > kvt ? qt : kvt;
  sdpa_bwd_desc v[16];
  const char *what[16];
  int n = 0;
#define VARIANT(label, stmt)                                                  \
  do {                                                                        \
    v[n] = base;                                                              \
    { sdpa_bwd_desc *d = &v[n]; stmt; }                                       \
    what[n++] = label;                                                        \
  } while (0)
  VARIANT("batch", d->batch = 7);
  VARIANT("heads", (d->heads_q = 32, d->heads_kv = 4));
  VARIANT("mqa", (d->heads_q = 16, d->heads_kv = 1));
  VARIANT("seqlens (still even)", (d->seqlen_q = 4 * tile, d->seqlen_kv = 8 * tile));
  VARIANT("q strides", (d->q.batch = 1 << 22, d->q.seq = 8 * 128 * 2, d->q.head = 256));
  VARIANT("dq strides", (d->dq.batch = 1 << 22, d->dq.seq = 2048, d->dq.head = 128));
  VARIANT("k/v strides", (d->k.seq = 4096, d->k.head = 512, d->k.batch = 1 << 24,
                          d->v.seq = 4096, d->v.head = 512, d->v.batch = 1 << 24));
  VARIANT("lse head/batch (packed)", (d->lse.seq = 1, d->lse.head = 300,
                                      d->lse.batch = 8 * 300));
  VARIANT("scale", d->scale = 0.25f);
  VARIANT("window ignored without its mask", (d->window_left = 5, d->window_right = 9));
#undef VARIANT
  for (int i = 0; i < n; i++) {
    key_copy k = plan_key(rt, &v[i]);
    ck_assert_msg(strcmp(k.text, ref.text) == 0, "%s: text changed: %s",
                  what[i], k.text);
    ck_assert_msg(strcmp(k.hash, ref.hash) == 0, "%s: hash changed", what[i]);
  }

  /* THD: sequence count, max_s and token totals are launch arguments */
  sdpa_bwd_desc thd = base;
  thd.layout = SDPA_LAYOUT_THD;
  key_copy tref = plan_key(rt, &thd);
  sdpa_bwd_desc t2 = thd;
  t2.batch = 5;
  t2.seqlen_q = 1000;
  t2.seqlen_kv = 77;
  t2.max_total_q = 3000;
  t2.max_total_kv = 200;
  key_copy k2 = plan_key(rt, &t2);
  ck_assert_str_eq(k2.text, tref.text);
  ck_assert_str_eq(k2.hash, tref.hash);
  /* strided LSE: its head and batch strides stay out of the key */
  sdpa_bwd_desc s1 = base, s2 = base;
  s1.lse.seq = 8;
  s1.lse.head = 1;
  s1.lse.batch = 8 * 256 * 8;
  s2.lse.seq = 16;
  s2.lse.head = 2;
  s2.lse.batch = 0;
  ck_assert_str_eq(plan_key(rt, &s1).hash, plan_key(rt, &s2).hash);
  sdpa_runtime_destroy(rt);
}
END_TEST

START_TEST(key_names) {
  ck_assert_str_eq(sdpa_dtype_key_name(SDPA_DTYPE_FP16), "fp16");
  ck_assert_str_eq(sdpa_dtype_key_name(SDPA_DTYPE_BF16), "bf16");
  ck_assert_str_eq(sdpa_layout_key_name(SDPA_LAYOUT_BSHD), "bshd");
  ck_assert_str_eq(sdpa_layout_key_name(SDPA_LAYOUT_THD), "thd");
  ck_assert_str_eq(sdpa_mask_key_name(SDPA_MASK_NONE), "none");
  ck_assert_str_eq(sdpa_mask_key_name(SDPA_MASK_CAUSAL_TOP_LEFT), "causal_tl");
  ck_assert_str_eq(sdpa_mask_key_name(SDPA_MASK_CAUSAL_BOTTOM_RIGHT), "causal_br");
  ck_assert_str_eq(sdpa_mask_key_name(SDPA_MASK_SLIDING_WINDOW), "window");
}
END_TEST

/* The one list of key fields (key_fields.h) and the cache's table agree:
 * every field is a column of cache/schema.sql (as embedded), TEXT for a
 * named value and INTEGER for a number; and the key text and the
 * translation unit name every field. */
START_TEST(key_fields_are_columns_text_and_defines) {
  sqlite3 *db = NULL;
  ck_assert_int_eq(sqlite3_open(":memory:", &db), SQLITE_OK);
  char *message = NULL;
  ck_assert_msg(sqlite3_exec(db, sdpa_embedded_schema_sql, NULL, NULL, &message) == SQLITE_OK,
                "schema: %s", message ? message : "");
  static const struct {
    const char *column, *type, *define;
    int text;
  } fields[] = {
#define ROW(member, text, column, kind, define, entry)                        \
  {column, SDPA_KEY_KIND_IS_TEXT(kind) ? "TEXT" : "INTEGER", define, SDPA_KEY_KIND_IS_TEXT(kind)},
      SDPA_KEY_FIELDS(ROW)
#undef ROW
  };
  ck_assert_int_eq(sizeof fields / sizeof fields[0], SDPA_KEY_FIELD_COUNT);
  const sdpa_key_fields f = base_fields();
  const sdpa_key key = build(&f);
  char *unit = NULL;
  ck_assert_int_eq(sdpa_instantiate_source(&f, &unit), SDPA_STATUS_SUCCESS);
  for (int i = 0; i < SDPA_KEY_FIELD_COUNT; i++) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT type FROM pragma_table_info('kernels') WHERE name = '%s'",
             fields[i].column);
    sqlite3_stmt *stmt = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL), SQLITE_OK);
    ck_assert_msg(sqlite3_step(stmt) == SQLITE_ROW, "column %s is missing from schema.sql",
                  fields[i].column);
    ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 0), fields[i].type);
    sqlite3_finalize(stmt);
    const char *name = NULL;
    char value[32], want[64];
    sdpa_key_field_text(&f, i, &name, NULL, value, sizeof value);
    snprintf(want, sizeof want, ";%s=%s", name, value);
    ck_assert_msg(strstr(key.text, want), "key text lacks %s: %s", want, key.text);
    snprintf(want, sizeof want, "#define %s ", fields[i].define);
    ck_assert_msg(strstr(unit, want), "translation unit lacks %s", want);
  }
  free(unit);
  sqlite3_close(db);
}
END_TEST

static Suite *key_suite(void) {
  Suite *s = suite_create("key");
  TCase *tc = tcase_create("key");
  tcase_add_test(tc, text_exact_format);
  tcase_add_test(tc, plan_text_uses_its_fields);
  tcase_add_test(tc, hash_covers_templates_toolchain_and_text);
  tcase_add_test(tc, hash_stable_across_processes);
  tcase_add_test(tc, hash_same_across_runtimes);
  tcase_add_test(tc, every_key_field_changes_text_and_hash);
  tcase_add_test(tc, descriptor_fields_that_select_code);
  tcase_add_test(tc, launch_arguments_leave_key_unchanged);
  tcase_add_test(tc, key_names);
  tcase_add_test(tc, key_fields_are_columns_text_and_defines);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--print-key") == 0) return print_key();
  return sdpa_test_run(key_suite());
}
