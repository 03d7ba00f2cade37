/*
 * test_cpu_hopper.c — the sm_90a family without a GPU: the plan's family
 * choice and its reasons, the family's tiles and launch shape from its
 * traits, and NVRTC compiling a representative set of its keys with a
 * clean ptxas report.
 *
 * A key compiles clean when ptxas reports no spill (stores or loads) for
 * any function, no "wgmma ... serialized" (C7510, C7515: a call, or
 * non-wgmma writes to accumulator registers, inside the pipeline), no
 * ignored setmaxnreg (C7508), and no other C75xx warning; the cubin is an
 * sm_90 image with the three kernels. The set covers both dtypes, head
 * dims 64 and 128 and some between (partial boxes, an uneven dQ split,
 * head_dim_v < head_dim), BSHD and THD, every mask, uneven lengths and
 * strided LSE (bench/NOTES.md has the whole class sweep).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "cubin_elf.h"
#include "hopper.h"
#include "../templates/sdpa_hopper_traits.h"
#include "plan.h"
#include "sdpa_jit.h"
#include "test_cache.h"

static sdpa_bwd_desc desc_for(sdpa_dtype dtype, int hd, sdpa_layout layout, sdpa_mask mask,
                              int uneven, int strided_lse) {
  sdpa_bwd_desc d = SDPA_BWD_DESC_INIT;
  d.dtype = dtype;
  d.layout = layout;
  d.batch = 2;
  d.heads_q = 8;
  d.heads_kv = 2;
  d.seqlen_q = d.seqlen_kv = uneven ? 1000 : 1024;
  d.head_dim = hd;
  d.mask = mask;
  if (mask == SDPA_MASK_SLIDING_WINDOW) {
    d.window_left = 128;
    d.window_right = 0;
  }
  if (strided_lse) {
    const int64_t rows = layout == SDPA_LAYOUT_THD ? 2 * d.seqlen_q : d.seqlen_q;
    d.lse.seq = 2;
    d.lse.head = 2 * rows;
    d.lse.batch = layout == SDPA_LAYOUT_THD ? 0 : d.lse.head * d.heads_q;
  }
  d.arch = 90;
  return d;
}

static sdpa_bwd_plan_options hopper_options(void) {
  sdpa_bwd_plan_options o = SDPA_BWD_PLAN_OPTIONS_INIT;
  o.family = SDPA_FAMILY_HOPPER;
  return o;
}

/* The family choice: forced Hopper where covered, the reasons where not;
 * mma.sync elsewhere and on other archs. */
START_TEST(family_choice_and_reasons) {
  sdpa_runtime *rt = sdpa_test_memory_runtime(90);
  const sdpa_bwd_plan_options hop = hopper_options();
  sdpa_bwd_desc d = desc_for(SDPA_DTYPE_BF16, 128, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
  sdpa_bwd_plan *plan = NULL;
  ck_assert_int_eq(sdpa_bwd_plan_create_with(&plan, rt, &d, &hop), SDPA_STATUS_SUCCESS);
  sdpa_bwd_plan_info info = SDPA_BWD_PLAN_INFO_INIT;
  ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(info.family, SDPA_FAMILY_HOPPER);
  ck_assert_ptr_nonnull(strstr(info.family_reason, "hopper"));
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), ";family=hopper;"));
  ck_assert_int_eq(info.q_tile, 64);
  ck_assert_int_eq(info.kv_tile, 128);
  ck_assert_int_eq(info.warps, 12);
  ck_assert_int_eq(plan->threads, 384);
  ck_assert_int_le(info.smem_bytes, sdpa_arch_smem_limit(90));
  ck_assert_int_eq(plan->main_grid_x, 8 * 2); /* 1024 / 128 kv tiles x 2 sequences */
  sdpa_bwd_plan_destroy(plan);

  /* AUTO: mma.sync, and it says why */
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &d), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(info.family, SDPA_HOPPER_BY_DEFAULT ? SDPA_FAMILY_HOPPER : SDPA_FAMILY_MMA);
  ck_assert(strlen(info.family_reason) > 10);
  sdpa_bwd_plan_destroy(plan);

  /* what the family does not cover: a forced plan fails naming it; AUTO
   * falls back with the reason */
  struct {
    const char *label, *why;
    sdpa_bwd_desc d;
  } cases[5];
  cases[0].label = "head_dim 136, head_dim_v 48";
  cases[0].d = desc_for(SDPA_DTYPE_BF16, 136, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
  cases[0].d.head_dim_v = 48;
  cases[0].why = "head_dim_v 48";
  cases[1].label = "head_dim 192, head_dim_v 56";
  cases[1].d = desc_for(SDPA_DTYPE_BF16, 192, SDPA_LAYOUT_BSHD, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 0);
  cases[1].d.head_dim_v = 56;
  cases[1].d.deterministic = 1;
  cases[1].why = "head_dim_v 56";
  cases[2].label = "sm_80";
  cases[2].d = d;
  cases[2].d.arch = 80;
  cases[2].why = "needs sm_90";
  cases[3].label = "rows that overlap";
  cases[3].d = d;
  cases[3].d.k.seq = 64, cases[3].d.k.head = 64, cases[3].d.k.batch = 64 * 1024 * 2;
  cases[3].why = "desc.k.seq";
  cases[4].label = "head_dim 256, head_dim_v 64";
  cases[4].d = desc_for(SDPA_DTYPE_BF16, 256, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
  cases[4].d.head_dim_v = 64;
  cases[4].why = "head_dim_v 64";
  for (int i = 0; i < 5; i++) {
    sdpa_bwd_plan *none = NULL;
    ck_assert_msg(sdpa_bwd_plan_create_with(&none, rt, &cases[i].d, &hop) ==
                      SDPA_STATUS_NOT_SUPPORTED,
                  "%s: %s", cases[i].label, sdpa_last_error());
    ck_assert_msg(strstr(sdpa_last_error(), cases[i].why), "%s: %s", cases[i].label,
                  sdpa_last_error());
    ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &cases[i].d), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(info.family, SDPA_FAMILY_MMA);
    ck_assert_msg(strstr(info.family_reason, cases[i].why), "%s: %s", cases[i].label,
                  info.family_reason);
    sdpa_bwd_plan_destroy(plan);
  }
  /* deterministic: planned when asked for (key det=1), and by AUTO when
   * SDPA_HOPPER_DETERMINISTIC_BY_DEFAULT (else AUTO says why not) */
  sdpa_bwd_desc det = d;
  det.deterministic = 1;
  ck_assert_msg(sdpa_bwd_plan_create_with(&plan, rt, &det, &hop) == SDPA_STATUS_SUCCESS, "%s",
                sdpa_last_error());
  ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(info.family, SDPA_FAMILY_HOPPER);
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), ";det=1;"));
  ck_assert_int_gt((long long)sdpa_bwd_workspace_size(plan), 0);
  sdpa_bwd_plan_destroy(plan);
  /* above head_dim 192 too: one Q / dO stage, the dQ staging in the
   * second one's room (sdpa_hopper_stages), within sm_90's shared memory */
  sdpa_bwd_desc det256 = desc_for(SDPA_DTYPE_BF16, 256, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
  det256.deterministic = 1;
  ck_assert_msg(sdpa_bwd_plan_create_with(&plan, rt, &det256, &hop) == SDPA_STATUS_SUCCESS,
                "%s", sdpa_last_error());
  ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(info.family, SDPA_FAMILY_HOPPER);
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), ";stages=1;"));
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), ";det=1;"));
  ck_assert_int_le(info.smem_bytes, sdpa_arch_smem_limit(90));
  sdpa_bwd_plan_destroy(plan);
  det256.deterministic = 0;
  ck_assert_int_eq(sdpa_bwd_plan_create_with(&plan, rt, &det256, &hop), SDPA_STATUS_SUCCESS);
  ck_assert_ptr_nonnull(strstr(sdpa_bwd_plan_key(plan), ";stages=2;"));
  sdpa_bwd_plan_destroy(plan);
  ck_assert_int_eq(sdpa_bwd_plan_create(&plan, rt, &det), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(info.family,
                   SDPA_HOPPER_DETERMINISTIC_BY_DEFAULT ? SDPA_FAMILY_HOPPER : SDPA_FAMILY_MMA);
  if (!SDPA_HOPPER_DETERMINISTIC_BY_DEFAULT)
    ck_assert_msg(strstr(info.family_reason, "deterministic"), "%s", info.family_reason);
  sdpa_bwd_plan_destroy(plan);

  /* main writes dQ: the narrow and transposed-dQ kernels (key dq=main,
   * the conversion's buffers in its shared memory, the counters in the
   * workspace); not deterministic, wide or persistent kernels */
  sdpa_bwd_plan_options main_dq = hop;
  main_dq.dq_writer = SDPA_DQ_MAIN;
  sdpa_bwd_desc dqt = desc_for(SDPA_DTYPE_BF16, 192, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
  dqt.head_dim_v = 128;
  const sdpa_bwd_desc *folds[] = {&d, &dqt};
  sdpa_bwd_plan_options unsplit = hop; /* the counters against no split slots */
  unsplit.tail_split = 1;
  for (int i = 0; i < 2; i++) {
    sdpa_bwd_plan *convert = NULL;
    ck_assert_int_eq(sdpa_bwd_plan_create_with(&convert, rt, folds[i], &unsplit),
                     SDPA_STATUS_SUCCESS);
    ck_assert_msg(sdpa_bwd_plan_create_with(&plan, rt, folds[i], &main_dq) ==
                      SDPA_STATUS_SUCCESS,
                  "%s", sdpa_last_error());
    ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
    ck_assert_int_eq(info.family, SDPA_FAMILY_HOPPER);
    ck_assert_int_eq(info.dq_writer, SDPA_DQ_MAIN);
    ck_assert_msg(strstr(sdpa_bwd_plan_key(plan), ";dq=main"), "%s", sdpa_bwd_plan_key(plan));
    const sdpa_hopper_config c =
        sdpa_hopper_choose(folds[i]->head_dim, folds[i]->head_dim_v, 0);
    ck_assert_int_eq(info.smem_bytes, convert->smem_bytes + sdpa_hopper_fold_bytes(c, 1));
    ck_assert_int_le(info.smem_bytes, sdpa_arch_smem_limit(90));
    ck_assert_uint_gt(sdpa_bwd_workspace_size(plan), sdpa_bwd_workspace_size(convert));
    sdpa_bwd_plan_destroy(plan);
    sdpa_bwd_plan_destroy(convert);
  }
  sdpa_bwd_desc wide = desc_for(SDPA_DTYPE_BF16, 256, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
  sdpa_bwd_desc persistent = desc_for(SDPA_DTYPE_BF16, 64, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
  const sdpa_bwd_desc *not_folds[] = {&det, &wide, &persistent};
  for (int i = 0; i < 3; i++) {
    sdpa_bwd_plan *none = NULL;
    ck_assert_int_eq(sdpa_bwd_plan_create_with(&none, rt, not_folds[i], &main_dq),
                     SDPA_STATUS_NOT_SUPPORTED);
    ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "dq_writer main"));
  }
  sdpa_runtime_destroy(rt);
}
END_TEST

/* A warning of ptxas that means a slow kernel: spills, wgmma serialized,
 * setmaxnreg ignored, or any other C75xx; or one of the front end's.
 * Returns 1 with the line. */
static int bad_report(const char *log, char *line, size_t size) {
  if (sdpa_ptxas_any_spills(log, line, size)) return 1;
  if (sdpa_compile_any_warning(log, line, size)) return 1;
  for (const char *p = strstr(log, "C75"); p; p = strstr(p + 1, "C75")) {
    const char *start = p;
    while (start > log && start[-1] != '\n') start--;
    const size_t n = strcspn(start, "\n");
    snprintf(line, size, "%.*s", (int)(n < 300 ? n : 300), start);
    return 1;
  }
  if (strstr(log, "serialized") || strstr(log, "setmaxnreg")) {
    snprintf(line, size, "%s", "wgmma serialization or setmaxnreg in the log");
    return 1;
  }
  return 0;
}

/* A representative set of keys compiles with a clean ptxas report. */
START_TEST(representative_keys_compile_clean) {
  sdpa_runtime *rt = sdpa_test_memory_runtime(90);
  const sdpa_bwd_plan_options hop = hopper_options();
  struct {
    sdpa_dtype dtype;
    int hd, hdv; /* hdv 0: hd */
    sdpa_layout layout;
    sdpa_mask mask;
    int uneven, strided, deterministic;
  } keys[] = {
      {SDPA_DTYPE_BF16, 128, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 0},
      {SDPA_DTYPE_BF16, 128, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 0, 0},
      {SDPA_DTYPE_FP16, 128, 0, SDPA_LAYOUT_THD, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 1, 0},
      {SDPA_DTYPE_BF16, 64, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 0},
      {SDPA_DTYPE_FP16, 64, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_SLIDING_WINDOW, 1, 1, 0},
      {SDPA_DTYPE_BF16, 64, 0, SDPA_LAYOUT_THD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 0, 0},
      {SDPA_DTYPE_BF16, 128, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_SLIDING_WINDOW, 1, 1, 1},
      {SDPA_DTYPE_FP16, 64, 0, SDPA_LAYOUT_THD, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 0, 1},
      /* deterministic without a mask */
      {SDPA_DTYPE_BF16, 128, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 1},
      /* head dims between: partial boxes, an uneven dQ split, k16 steps
       * past the head dim, head_dim_v < head_dim */
      {SDPA_DTYPE_BF16, 96, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 0},
      {SDPA_DTYPE_FP16, 80, 0, SDPA_LAYOUT_THD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 0, 0},
      {SDPA_DTYPE_BF16, 112, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 0, 1},
      {SDPA_DTYPE_BF16, 72, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_SLIDING_WINDOW, 1, 1, 0},
      {SDPA_DTYPE_BF16, 40, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 0},
      {SDPA_DTYPE_BF16, 128, 64, SDPA_LAYOUT_BSHD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 0, 0},
      {SDPA_DTYPE_FP16, 96, 64, SDPA_LAYOUT_THD, SDPA_MASK_NONE, 0, 0, 0},
      /* the wide kernel (above 128): split columns, P^T through shared
       * memory, uneven shares at 192 and 160; dQ staged up to 192, from
       * registers at 256 */
      {SDPA_DTYPE_BF16, 256, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 0},
      {SDPA_DTYPE_FP16, 256, 0, SDPA_LAYOUT_THD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1, 0},
      {SDPA_DTYPE_BF16, 192, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_SLIDING_WINDOW, 1, 1, 0},
      {SDPA_DTYPE_FP16, 160, 0, SDPA_LAYOUT_THD, SDPA_MASK_NONE, 0, 0, 0},
      {SDPA_DTYPE_BF16, 136, 72, SDPA_LAYOUT_BSHD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 0, 0},
      /* K's fragments in registers (192 / 128, 136 / 72 above too), THD */
      {SDPA_DTYPE_FP16, 176, 120, SDPA_LAYOUT_THD, SDPA_MASK_SLIDING_WINDOW, 0, 1, 0},
      /* the transposed-dQ kernel (192 / <= 128, not deterministic): 32
       * query rows a step, dQ^T transposed back into the staging */
      {SDPA_DTYPE_BF16, 192, 128, SDPA_LAYOUT_BSHD, SDPA_MASK_CAUSAL_TOP_LEFT, 1, 0, 0},
      {SDPA_DTYPE_FP16, 192, 96, SDPA_LAYOUT_THD, SDPA_MASK_SLIDING_WINDOW, 0, 1, 0},
      {SDPA_DTYPE_BF16, 192, 128, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 0},
      /* the wide kernel's deterministic keys; above 192 with one Q / dO
       * stage and dQ staged in two parts */
      {SDPA_DTYPE_BF16, 192, 128, SDPA_LAYOUT_BSHD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 0, 1},
      {SDPA_DTYPE_FP16, 192, 0, SDPA_LAYOUT_THD, SDPA_MASK_SLIDING_WINDOW, 0, 1, 1},
      {SDPA_DTYPE_BF16, 256, 0, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0, 1},
      {SDPA_DTYPE_FP16, 224, 0, SDPA_LAYOUT_THD, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1, 1},
      {SDPA_DTYPE_BF16, 256, 128, SDPA_LAYOUT_BSHD, SDPA_MASK_SLIDING_WINDOW, 1, 0, 1},
  };
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    sdpa_bwd_desc d = desc_for(keys[i].dtype, keys[i].hd, keys[i].layout, keys[i].mask,
                               keys[i].uneven, keys[i].strided);
    d.deterministic = keys[i].deterministic;
    if (keys[i].hdv) d.head_dim_v = keys[i].hdv;
    sdpa_bwd_plan *plan = NULL;
    ck_assert_msg(sdpa_bwd_plan_create_with(&plan, rt, &d, &hop) == SDPA_STATUS_SUCCESS,
                  "plan: %s", sdpa_last_error());
    const double start = sdpa_test_now_ms();
    ck_assert_msg(sdpa_bwd_compile(plan, NULL) == SDPA_STATUS_SUCCESS, "%s: %s\n%s",
                  sdpa_bwd_plan_key(plan), sdpa_last_error(), sdpa_bwd_plan_compile_log(plan));
    const double ms = sdpa_test_now_ms() - start;
    const char *log = sdpa_bwd_plan_compile_log(plan);
    char line[400];
    ck_assert_msg(!bad_report(log, line, sizeof line), "%s: %s", sdpa_bwd_plan_key(plan),
                  line);
    ck_assert_int_eq(sdpa_cubin_check_kernels(plan->cubin, plan->cubin_size, 90, NULL, 0), 0);
    /* the report names the registers of the main kernel */
    const char *props = strstr(log, "Function properties for sdpa_bwd_main");
    ck_assert_ptr_nonnull(props);
    const char *regs = strstr(log, "Used ");
    printf("hopper: %s: %.0f ms; %.*s\n", sdpa_bwd_plan_key(plan), ms,
           regs ? (int)strcspn(regs, "\n") : 18, regs ? regs : "(no register line)");
    sdpa_bwd_plan_destroy(plan);
  }
  sdpa_runtime_destroy(rt);
}
END_TEST

/* The wide kernel's rule for K's fragments in registers: where consumer
 * 0 has the room with its larger shares (head_dim <= 192 with
 * head_dim_v <= 128), the measured choice; not at 192 / 192, 160 / 160
 * or above 192, nor in the narrow kernel. */
START_TEST(wide_kernel_k_fragments_rule) {
  ck_assert(sdpa_hopper_wide_k_regs(192, 128));
  ck_assert(sdpa_hopper_wide_k_regs(136, 72));
  ck_assert(sdpa_hopper_wide_k_regs(176, 120));
  ck_assert(!sdpa_hopper_wide_k_regs(192, 192));
  ck_assert(!sdpa_hopper_wide_k_regs(160, 160));
  ck_assert(!sdpa_hopper_wide_k_regs(136, 136));
  ck_assert(!sdpa_hopper_wide_k_regs(256, 128));
  ck_assert(!sdpa_hopper_wide_k_regs(200, 120));
  ck_assert(!sdpa_hopper_wide_k_regs(128, 128));
  int picked = 0;
  for (int hd = 8; hd <= 256; hd += 8)
    for (int hdv = 8; hdv <= hd; hdv += 8)
      if (sdpa_hopper_supported(hd, hdv) && sdpa_hopper_wide_k_regs(hd, hdv)) {
        ck_assert_msg(hd > 128 && hd <= 192 && hdv <= 128, "%d / %d", hd, hdv);
        picked++;
      }
  ck_assert_int_eq(picked, 64); /* 136-192 by 8, head_dim_v 72-128 by 8 */
}
END_TEST

/* The transposed-dQ kernel's rule: head_dim a multiple of 64 above 128
 * with head_dim + head_dim_v <= 320, not deterministic (192 / 72 .. 128:
 * 32 query rows, 128 kv rows); the wide kernel (64 x 64) for the other
 * head dims above 128 and for deterministic plans; the plans' keys say
 * the tiles. */
START_TEST(transposed_dq_kernel_rule) {
  int picked = 0;
  for (int hd = 8; hd <= 256; hd += 8)
    for (int hdv = 8; hdv <= hd; hdv += 8)
      for (int det = 0; det < 2; det++) {
        if (!sdpa_hopper_supported(hd, hdv)) continue;
        const sdpa_hopper_config c = sdpa_hopper_choose(hd, hdv, det);
        const int dqt = hd == 192 && hdv <= 128 && !det;
        ck_assert_msg(sdpa_hopper_dqt(hd, hdv, det) == dqt, "%d / %d det %d", hd, hdv, det);
        ck_assert_int_eq(sdpa_hopper_config_dqt(c), dqt);
        ck_assert_int_eq(sdpa_hopper_config_wide(c), hd > 128 && !dqt);
        ck_assert_int_eq(c.q_tile, dqt ? 32 : hd <= 64 ? 128 : 64);
        ck_assert_int_eq(c.kv_tile, hd > 128 && !dqt ? 64 : 128);
        picked += dqt;
      }
  ck_assert_int_eq(picked, 8); /* 192 / 72 .. 128 */
  sdpa_runtime *rt = sdpa_test_memory_runtime(90);
  const sdpa_bwd_plan_options hop = hopper_options();
  static const struct {
    int hdv, det;
    const char *tiles;
  } plans[] = {{128, 0, ";qt=32;kvt=128;"}, {96, 0, ";qt=32;kvt=128;"},
               {128, 1, ";qt=64;kvt=64;"},  {192, 0, ";qt=64;kvt=64;"}};
  for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
    sdpa_bwd_desc d = desc_for(SDPA_DTYPE_BF16, 192, SDPA_LAYOUT_BSHD, SDPA_MASK_NONE, 0, 0);
    d.head_dim_v = plans[i].hdv;
    d.deterministic = plans[i].det;
    sdpa_bwd_plan *plan = NULL;
    ck_assert_msg(sdpa_bwd_plan_create_with(&plan, rt, &d, &hop) == SDPA_STATUS_SUCCESS, "%s",
                  sdpa_last_error());
    ck_assert_msg(strstr(sdpa_bwd_plan_key(plan), plans[i].tiles), "%s: want %s",
                  sdpa_bwd_plan_key(plan), plans[i].tiles);
    sdpa_bwd_plan_destroy(plan);
  }
  sdpa_runtime_destroy(rt);
}
END_TEST

/* Every head-dim pair the family compiles plans with it on sm_90,
 * deterministic or not, every mask and layout, within sm_90's shared
 * memory; one Q / dO stage exactly where deterministic above 192 (the
 * dQ staging in the second stage's room), two elsewhere. */
START_TEST(every_head_dim_pair_plans_within_shared_memory) {
  sdpa_runtime *rt = sdpa_test_memory_runtime(90);
  const sdpa_bwd_plan_options hop = hopper_options();
  int plans = 0;
  for (int hd = 8; hd <= 256; hd += 8)
    for (int hdv = 8; hdv <= hd; hdv += 8) {
      if (!sdpa_hopper_supported(hd, hdv)) continue;
      for (int det = 0; det < 2; det++)
        for (int layout = SDPA_LAYOUT_BSHD; layout <= SDPA_LAYOUT_THD; layout++)
          for (int mask = SDPA_MASK_NONE; mask <= SDPA_MASK_SLIDING_WINDOW; mask += 3) {
            sdpa_bwd_desc d =
                desc_for(SDPA_DTYPE_BF16, hd, (sdpa_layout)layout, (sdpa_mask)mask, 0, 0);
            d.head_dim_v = hdv;
            d.deterministic = det;
            sdpa_bwd_plan *plan = NULL;
            ck_assert_msg(sdpa_bwd_plan_create_with(&plan, rt, &d, &hop) == SDPA_STATUS_SUCCESS,
                          "%d / %d det %d layout %d mask %d: %s", hd, hdv, det, layout, mask,
                          sdpa_last_error());
            sdpa_bwd_plan_info info = SDPA_BWD_PLAN_INFO_INIT;
            ck_assert_int_eq(sdpa_bwd_plan_query(plan, &info), SDPA_STATUS_SUCCESS);
            ck_assert_int_le(info.smem_bytes, sdpa_arch_smem_limit(90));
            ck_assert_ptr_nonnull(
                strstr(sdpa_bwd_plan_key(plan), det && hd > 192 ? ";stages=1;" : ";stages=2;"));
            sdpa_bwd_plan_destroy(plan);
            plans++;
          }
    }
  ck_assert_int_gt(plans, 1000);
  sdpa_runtime_destroy(rt);
}
END_TEST

static Suite *hopper_suite(void) {
  Suite *s = suite_create("hopper");
  TCase *tc = tcase_create("hopper");
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, family_choice_and_reasons);
  tcase_add_test(tc, wide_kernel_k_fragments_rule);
  tcase_add_test(tc, transposed_dq_kernel_rule);
  tcase_add_test(tc, every_head_dim_pair_plans_within_shared_memory);
  tcase_add_test(tc, representative_keys_compile_clean);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return sdpa_test_run(hopper_suite()); }
