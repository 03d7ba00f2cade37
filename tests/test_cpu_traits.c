/*
 * test_cpu_traits.c — host and kernels agree on every configuration.
 *
 * templates/sdpa_traits.h is compiled twice: by the host's C compiler
 * (the plan sizes launches from it) and by NVRTC (the kernels take their
 * shared-memory carve and warp partitions from it). For every
 * configuration the tile table can pick (each head dim's candidates and
 * the small-grid ones, with and without the tight variants), this suite
 * writes the host's values into a translation unit of static_asserts and
 * has NVRTC compile it: any disagreement fails the compile. A wrong value
 * planted on purpose must fail it (the check can fail), and the kernel
 * itself static_asserts that its tiles fit the carve (compiled by
 * test_cpu_compile and test_cpu_kernels).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "nvrtc.h"
#include "plan.h"
#include "sdpa_jit.h"
#include "test_cache.h"

/* Appends `static_assert(<fn>(config c).<member> == value, what)`. */
static void assert_value(FILE *out, sdpa_mma_config c, const char *fn, const char *member,
                         int value, const char *what) {
  fprintf(out,
          "static_assert(%s(sdpa_mma_config{%d,%d,%d,%d,%d,%d,%d,%d,%d}).%s == %d, \"%s\");\n",
          fn, c.head_dim, c.head_dim_v, c.q_tile, c.kv_tile, c.warps, c.stages,
          c.deterministic, c.window, c.fold_dq, member, value, what);
}

/* Appends the static_asserts of one configuration to `out`. */
static void assert_config(FILE *out, sdpa_mma_config c, int plant_error) {
  const sdpa_mma_smem s = sdpa_mma_smem_layout(c);
  const sdpa_mma_split w = sdpa_mma_warp_split(c);
  const sdpa_mma_dims g = sdpa_mma_gemm_dims(c);
  assert_value(out, c, "sdpa_mma_smem_layout", "total", s.total + (plant_error ? 16 : 0),
               "smem total");
  assert_value(out, c, "sdpa_mma_smem_layout", "ds", s.ds, "smem regions");
  assert_value(out, c, "sdpa_mma_smem_layout", "delta", s.delta, "smem regions");
  assert_value(out, c, "sdpa_mma_warp_split", "s_rows", w.s_rows, "warp split");
  assert_value(out, c, "sdpa_mma_warp_split", "kv_rows", w.kv_rows, "warp split");
  assert_value(out, c, "sdpa_mma_warp_split", "q_rows", w.q_rows, "warp split");
  assert_value(out, c, "sdpa_mma_gemm_dims", "d", g.d, "gemm dims");
  assert_value(out, c, "sdpa_mma_gemm_dims", "dv", g.dv, "gemm dims");
  fprintf(out, "static_assert(sdpa_aux_lanes(%d) == %d, \"aux lanes\");\n", c.head_dim_v,
          sdpa_aux_lanes(c.head_dim_v));
}

/* The translation unit for every configuration (one planted error when
 * `plant_error`): every supported head dim, with head_dim_v equal and
 * smaller. Returns a malloc'd string and the count. */
static char *traits_unit(int plant_error, size_t *configs) {
  char *text = NULL;
  size_t size = 0;
  FILE *out = open_memstream(&text, &size);
  ck_assert_ptr_nonnull(out);
  fputs("#include \"sdpa_traits.h\"\n", out);
  *configs = 0;
  for (int hd = 8; hd <= 256; hd += 8) {
    const int hdvs[2] = {hd, hd / 2 >= 8 ? (hd / 2 + 7) / 8 * 8 : hd};
    for (int k = 0; k < 2; k++) {
      sdpa_mma_config candidates[16];
      const size_t n = sdpa_config_candidates(hd, hdvs[k], candidates, 16);
      ck_assert_uint_gt(n, 0);
      ck_assert_uint_le(n, 16);
      for (size_t i = 0; i < n; i++)
        for (int variant = 0; variant < 4; variant++) {
          sdpa_mma_config c = candidates[i];
          c.deterministic = variant == 1;
          c.window = variant == 2;
          c.fold_dq = variant == 3;
          assert_config(out, c, plant_error && *configs == 5);
          ++*configs;
        }
    }
  }
  ck_assert_int_eq(fclose(out), 0);
  return text;
}

START_TEST(host_and_device_agree) {
  size_t configs = 0;
  char *unit = traits_unit(0, &configs);
  void *cubin = NULL;
  size_t size = 0;
  char *log = NULL;
  sdpa_status st = sdpa_nvrtc_compile(unit, "traits.cu", 80, &cubin, &size, &log);
  ck_assert_msg(st == SDPA_STATUS_SUCCESS, "host and device disagree:\n%s",
                log ? log : sdpa_last_error());
  printf("traits: %zu configurations, host == device\n", configs);
  ck_assert_uint_ge(configs, 32 * 2 * 4 * 4);
  free(cubin);
  free(log);
  free(unit);

  /* the check can fail: one planted wrong total */
  unit = traits_unit(1, &configs);
  st = sdpa_nvrtc_compile(unit, "traits.cu", 80, &cubin, &size, &log);
  ck_assert_int_eq(st, SDPA_STATUS_COMPILE_FAILED);
  ck_assert_msg(log && strstr(log, "smem total"), "log: %s", log ? log : "");
  free(cubin);
  free(log);
  free(unit);
}
END_TEST

/* The plan sizes its launch from the traits: the main kernel's dynamic
 * shared memory and threads of a plan are the traits' for its key. Every
 * supported head dim (with head_dim_v equal and smaller) gets a plan on
 * every class of shared memory, whose warps tile its GEMMs with GEMM
 * head dims that hold the real ones. */
START_TEST(plans_launch_what_the_traits_say) {
  static const int arches[] = {90, 80, 86};
  int planned = 0, padded = 0;
  for (size_t a = 0; a < sizeof arches / sizeof arches[0]; a++) {
    sdpa_runtime *rt = sdpa_test_memory_runtime(arches[a]);
    for (int hd = 8; hd <= 256; hd += 8)
      for (int v = 0; v < 2; v++)
        for (int det = 0; det < 2; det++) {
          sdpa_bwd_desc desc = sdpa_test_bshd_desc(4, 8, 2048, hd);
          desc.head_dim_v = v ? (hd / 2 + 7) / 8 * 8 : hd;
          desc.deterministic = det;
          sdpa_bwd_plan_options mma = SDPA_BWD_PLAN_OPTIONS_INIT;
          mma.family = SDPA_FAMILY_MMA; /* the traits of this family */
          mma.any_head_dim = SDPA_SWITCH_ON;
          sdpa_bwd_plan *plan = NULL;
          ck_assert_msg(sdpa_bwd_plan_create_with(&plan, rt, &desc, &mma) ==
                            SDPA_STATUS_SUCCESS,
                        "sm_%d hd %d/%d det %d: %s", arches[a], hd, desc.head_dim_v, det,
                        sdpa_last_error());
          const sdpa_mma_config c = sdpa_config_mma(&plan->fields);
          const sdpa_mma_dims g = sdpa_mma_gemm_dims(c);
          ck_assert_int_ge(g.d, hd);
          ck_assert_int_ge(g.dv, desc.head_dim_v);
          ck_assert_int_le(g.d, 256);
          padded += g.d != hd;
          ck_assert_int_eq(plan->smem_bytes, sdpa_mma_smem_layout(c).total);
          ck_assert_int_eq(plan->threads, sdpa_mma_threads(c));
          ck_assert_int_le(plan->smem_bytes, sdpa_arch_smem_limit(arches[a]));
          sdpa_bwd_plan_info info = SDPA_BWD_PLAN_INFO_INIT;
          ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
          ck_assert_int_eq(info.smem_bytes, plan->smem_bytes);
          ck_assert_ptr_nonnull(info.family_reason);
          sdpa_bwd_plan_destroy(plan);
          planned++;
        }
    sdpa_runtime_destroy(rt);
  }
  printf("traits: %d plans over 32 head dims, %d with padded GEMM head dims\n", planned,
         padded);
}
END_TEST

/* What stays unsupported is refused by name: not a multiple of 8, above
 * 256, head_dim_v above head_dim. */
START_TEST(unsupported_head_dims_are_named) {
  sdpa_runtime *rt = sdpa_test_memory_runtime(90);
  static const struct {
    int hd, hdv;
    const char *field;
  } bad[] = {{100, 0, "head_dim = 100"}, {264, 0, "head_dim = 264"}, {4, 0, "head_dim = 4"},
             {64, 60, "head_dim_v = 60"}, {64, 72, "head_dim_v = 72"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sdpa_bwd_desc desc = sdpa_test_bshd_desc(1, 2, 128, bad[i].hd);
    desc.head_dim_v = bad[i].hdv;
    sdpa_bwd_plan *plan = NULL;
    ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &desc), SDPA_STATUS_INVALID_ARGUMENT);
    ck_assert_msg(strstr(sdpa_last_error(), bad[i].field), "%s", sdpa_last_error());
    ck_assert_ptr_null(plan);
  }
  sdpa_runtime_destroy(rt);
}
END_TEST

static Suite *traits_suite(void) {
  Suite *s = suite_create("traits");
  TCase *tc = tcase_create("traits");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, host_and_device_agree);
  tcase_add_test(tc, plans_launch_what_the_traits_say);
  tcase_add_test(tc, unsupported_head_dims_are_named);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return sdpa_test_run(traits_suite()); }
