/*
 * test_cpu_grid.c — the preheat grid (src/cli/grid.c): every point's
 * representative descriptor plans to the key the point names, so
 * `sdpa-jit preheat` compiles the keys that processes will ask for.
 *
 * For each point of a wide grid (archs 80, 86, 90; every supported
 * head_dim, mask, layout, LSE class, determinism, even / uneven lengths,
 * dQ writer and tile class), planned as preheat plans it (the options of
 * cli_grid_options), the plan's key must carry the point's dQ
 * writer, layout, determinism and (BSHD) even-tiles fields. Tile class:
 * a "default" point plans exactly as with the small-grid rule off (the
 * table's tiles); a "small" point differs from that exactly when the
 * table's kv tile is 128, and then takes 64-row kv tiles. Repeated points
 * (THD past its first even value; THD or deterministic small) must be
 * reported as such.
 * Planning needs no GPU and no compile.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "test_cache.h"
#include "grid.h"
#include "plan.h"
#include "sdpa_jit.h"

static sdpa_runtime *rt;

static void open_runtime(void) { rt = sdpa_test_memory_runtime(90); }

static void close_runtime(void) {
  sdpa_runtime_destroy(rt);
  rt = NULL;
}

/* Plans `d` as preheat plans point `p` (cli_grid_options), with the
 * small-grid rule on or off (`rule`); returns the status and, on
 * success, the plan. */
static sdpa_status plan_with_rule(const cli_grid_point *p, const sdpa_bwd_desc *d,
                                  int rule, sdpa_bwd_plan **plan) {
  sdpa_bwd_plan_options o;
  cli_grid_options(p, &o);
  o.small_grid = rule ? SDPA_SWITCH_ON : SDPA_SWITCH_OFF;
  *plan = NULL;
  return sdpa_bwd_plan_create_with(plan, rt, d, &o);
}

static void fill(cli_list *list, const int *values, size_t count) {
  list->count = 0;
  for (size_t i = 0; i < count; i++) list->values[list->count++] = values[i];
}

START_TEST(points_plan_to_their_keys) {
  static const int archs[] = {80, 86, 90};
  static const int dtypes[] = {SDPA_DTYPE_BF16};
  static const int dims[] = {32, 64, 96, 128, 192, 256};
  static const int masks[] = {SDPA_MASK_NONE, SDPA_MASK_CAUSAL_TOP_LEFT,
                              SDPA_MASK_CAUSAL_BOTTOM_RIGHT,
                              SDPA_MASK_SLIDING_WINDOW};
  static const int layouts[] = {SDPA_LAYOUT_BSHD, SDPA_LAYOUT_THD};
  static const int both[] = {0, 1};
  cli_grid grid;
  memset(&grid, 0, sizeof grid);
  fill(&grid.arch, archs, 3);
  fill(&grid.dtype, dtypes, 1);
  fill(&grid.head_dim, dims, 6);
  fill(&grid.mask, masks, 4);
  fill(&grid.layout, layouts, 2);
  fill(&grid.lse_strided, both, 2);
  fill(&grid.deterministic, both, 2);
  fill(&grid.even, both, 2);
  fill(&grid.dq_main, both, 2);
  fill(&grid.tiles, both, 2);
  const size_t points = cli_grid_size(&grid);
  ck_assert_uint_eq(points, 3 * 6 * 4 * 2 * 2 * 2 * 2 * 2 * 2);

  size_t planned = 0, small_keys = 0, repeats = 0;
  for (size_t i = 0; i < points; i++) {
    cli_grid_point p;
    char where[200];
    const int repeat = cli_grid_point_at(&grid, i, &p);
    cli_grid_describe(&p, where, sizeof where);
    const int thd = p.layout == SDPA_LAYOUT_THD;
    /* lists vary last-fastest: even's position is (i / (2*2*2*2)) % 2 */
    const int even_position = (int)(i / 16 % 2);
    const int expect_repeat = (thd && even_position == 1) ||
                              (p.small && (thd || p.deterministic));
    ck_assert_msg(repeat == expect_repeat, "%s: repeat %d, expected %d", where,
                  repeat, expect_repeat);
    if (repeat) {
      repeats++;
      continue;
    }

    sdpa_bwd_desc d;
    cli_grid_desc(&p, &d);
    sdpa_bwd_plan *on = NULL, *off = NULL;
    sdpa_status st = plan_with_rule(&p, &d, 1, &on);
    if (st == SDPA_STATUS_NOT_SUPPORTED) continue; /* too big for the arch */
    ck_assert_msg(st == SDPA_STATUS_SUCCESS, "%s: %s", where, sdpa_last_error());
    ck_assert_int_eq(plan_with_rule(&p, &d, 0, &off), SDPA_STATUS_SUCCESS);
    planned++;

    const char *key = sdpa_bwd_plan_key(on);
    char want[64];
    ck_assert_msg(strstr(key, p.dq_main ? ";dq=main" : ";dq=convert"),
                  "%s: key %s", where, key);
    ck_assert_msg(strstr(key, thd ? ";layout=thd;" : ";layout=bshd;"),
                  "%s: key %s", where, key);
    snprintf(want, sizeof want, ";det=%d;", p.deterministic);
    ck_assert_msg(strstr(key, want), "%s: key %s", where, key);
    if (!thd) {
      snprintf(want, sizeof want, ";even=%d;", p.even);
      ck_assert_msg(strstr(key, want), "%s: key %s", where, key);
    }

    const int table_kv = off->fields.kv_tile;
    const int differs = strcmp(key, sdpa_bwd_plan_key(off)) != 0;
    if (!p.small) {
      ck_assert_msg(!differs, "%s: a default point took the small-grid "
                    "tiles: %s", where, key);
    } else if (off->fields.family == SDPA_FAMILY_HOPPER) {
      /* the small-grid rule is the mma.sync family's: one key */
      ck_assert_msg(!differs, "%s: a Hopper point took other tiles: %s", where, key);
    } else {
      ck_assert_msg(differs == (table_kv == 128),
                    "%s: table kv tile %d, key %s", where, table_kv, key);
      if (differs) {
        ck_assert_int_eq(on->fields.kv_tile, 64);
        small_keys++;
      }
    }
    sdpa_bwd_plan_destroy(on);
    sdpa_bwd_plan_destroy(off);
  }
  printf("grid: %zu points, %zu planned, %zu repeats, %zu small-grid keys\n",
         points, planned, repeats, small_keys);
  ck_assert_uint_gt(small_keys, 0);
  ck_assert_uint_gt(planned, points / 3);
}
END_TEST

static Suite *grid_suite(void) {
  Suite *s = suite_create("grid");
  TCase *tc = tcase_create("points");
  tcase_add_checked_fixture(tc, open_runtime, close_runtime);
  tcase_add_test(tc, points_plan_to_their_keys);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return sdpa_test_run(grid_suite()); }
