/*
 * config.c — the per-arch table of kernel configurations.
 *
 * A configuration is the query tile M, the kv tile N, the warps and the
 * Q/dO pipeline depth of the main kernel. Shared memory decides most of
 * it: sm_80/sm_87 give a block 163 KiB, sm_90/sm_100 227 KiB, the consumer
 * parts (sm_86, sm_89, sm_120) 99 KiB. Registers decide the rest: dK and
 * dV live in registers, N*(D+DV)/(32*warps) floats per thread, kept at
 * 128 or below. A rule gives every head dim its candidates, from
 * fastest to smallest (the first that fits the arch's shared memory and
 * whose warps tile the GEMMs wins), and a table of measured rows replaces
 * the rule's candidates for the head dims it lists.
 *
 * The rule, on the GEMM head dims GD, GDV (D, DV rounded up to 16):
 * query tile 128 up to GD 64, 64 up to GD 224 (192 for kernels tight on
 * registers), 32 beyond; kv tile 128
 * while dK and dV fit 128 registers a thread at 8 warps (GD + GDV <= 256),
 * else 64; then one stage instead of two, then half the kv tile, then
 * 32 x 32 tiles over 4 warps. The
 * kernel pads the GEMM head dims further where its warp split needs it
 * (sdpa_mma_gemm_dims, templates/sdpa_traits.h).
 *
 * Small grids. The main kernel runs one block per kv tile per (sequence,
 * kv head), and each block walks every query tile in turn. When that grid
 * is at most SMALL_GRID_BLOCKS blocks at the table's kv tile of 128
 * (causal: twice as many, as their blocks' work is unequal), most of a
 * 108-148 SM GPU idles and the time is the length of one block's chain;
 * 64-row kv tiles double the blocks and halve the chain (bench_bwd
 * --small on an H200: +20 to +33%; bench/NOTES.md). The choice is a
 * function of the descriptor alone, so preheat can reach both keys (its
 * --tiles list). BSHD only (for THD, whose lengths arrive at execute,
 * they won 8-18% at 64 blocks but lost at 128 even causal: NOTES.md) and
 * not deterministic (its ordered dQ hand-off grows with the kv tiles).
 * The shared memory of a configuration is sdpa_mma_smem_layout()
 * (templates/sdpa_traits.h), the kernel's own carve.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "status.h"

int sdpa_arch_smem_limit(int arch) {
  switch (arch) {
  case 80: case 87: return 166912;           /* 163 KiB */
  case 90: case 100: case 103: case 110: return 232448; /* 227 KiB */
  default: return 101376;                   /* 99 KiB: 86, 89, 120, 121 */
  }
}

/* The traits configuration of tiles `t` for key fields `f`. */
static sdpa_mma_config mma_config(const sdpa_key_fields *f, int q_tile, int kv_tile,
                                  int warps, int stages) {
  sdpa_mma_config c = {f->head_dim, f->head_dim_v, q_tile, kv_tile, warps, stages,
                       f->deterministic, f->mask == SDPA_MASK_SLIDING_WINDOW,
                       f->fold_dq};
  return c;
}

sdpa_mma_config sdpa_config_mma(const sdpa_key_fields *f) {
  return mma_config(f, f->q_tile, f->kv_tile, f->warps, f->stages);
}

int sdpa_dq_accum_dim(const sdpa_key_fields *f) {
  return f->family == SDPA_FAMILY_HOPPER ? f->head_dim
                                         : sdpa_mma_gemm_dims(sdpa_config_mma(f)).d;
}

typedef struct {
  int q_tile, kv_tile, warps, stages;
} tile_choice;

#define MAX_CANDIDATES 5

typedef struct {
  int head_dim;
  tile_choice candidates[MAX_CANDIDATES]; /* q_tile 0 ends the list */
} config_row;

/* Measured rows: {q_tile, kv_tile, warps, stages} by head_dim, best first
 * (bench/NOTES.md). */
static const config_row table[] = {
  {32,  {{128, 128, 8, 2}, {128, 128, 8, 1}, {64, 64, 8, 2}, {0}}},
  {64,  {{128, 128, 8, 2}, {128, 128, 8, 1}, {64, 64, 8, 2}, {0}}},
  {96,  {{64, 128, 8, 2}, {64, 64, 8, 2}, {64, 64, 8, 1}, {0}}},
  {128, {{64, 128, 8, 2}, {64, 128, 8, 1}, {64, 64, 8, 1}, {0}}},
  {192, {{64, 64, 8, 2}, {64, 64, 8, 1}, {32, 64, 8, 1}, {0}}},
  {256, {{32, 64, 8, 2}, {32, 32, 4, 1}, {0}}},
};

#define MIN_HEAD_DIM 8
#define MAX_HEAD_DIM 256
#define HEAD_DIM_STEP 8

/* The candidates for head_dim `d` with head_dim_v `dv` into `out` (q_tile
 * 0 ends the list): the table's row for d, else the rule's. `tight`: a
 * kernel that spends registers on a hand-off or a run-time band
 * (deterministic, sliding window, main writes dQ), which takes the 32-row
 * query tile already above GEMM head dim 192 (64 spilled 4-8 bytes at
 * head dims 200-224). */
static void candidates_for(int d, int dv, int tight, tile_choice out[MAX_CANDIDATES]) {
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i)
    if (table[i].head_dim == d) {
      for (int k = 0; k < MAX_CANDIDATES; ++k) out[k] = table[i].candidates[k];
      return;
    }
  const int gd = sdpa_round_up(d, 16), gdv = sdpa_round_up(dv, 16);
  const int q = gd <= 64 ? 128 : gd <= (tight ? 192 : 224) ? 64 : 32;
  const int kv = gd + gdv <= 256 ? 128 : 64;
  out[0] = (tile_choice){q, kv, 8, 2};
  out[1] = (tile_choice){q, kv, 8, 1};
  out[2] = (tile_choice){q, kv / 2, 8, 2};
  out[3] = (tile_choice){q, kv / 2, 8, 1};
  out[4] = (tile_choice){32, 32, 4, 1}; /* the 99 KiB parts at the widest head dims */
}

/* Small-grid candidates, best first (the table's warps; q tile 128 where
 * shared memory allows: +2 to +4% over 64 at head_dim 64 and 128). */
static const tile_choice small_grid_candidates[] = {
    {128, 64, 8, 2}, {64, 64, 8, 2}, {64, 64, 8, 1}, {0}};
#define SMALL_GRID_BLOCKS 64

/* Whether `d`, planned with the table's kv tile `kv_tile`, is a small grid
 * (see the file comment; the rule is on unless options.small_grid is OFF). */
static int small_grid(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o, int kv_tile) {
  if (o->small_grid == SDPA_SWITCH_OFF || d->layout != SDPA_LAYOUT_BSHD ||
      d->deterministic || kv_tile != 128)
    return 0;
  const int causal = d->mask == SDPA_MASK_CAUSAL_TOP_LEFT ||
                     d->mask == SDPA_MASK_CAUSAL_BOTTOM_RIGHT;
  const int64_t tiles = ((int64_t)d->seqlen_kv + kv_tile - 1) / kv_tile;
  int64_t blocks = 0; /* tiles * batch < 2^58; times heads_kv may pass int64 */
  if (__builtin_mul_overflow(tiles * d->batch, (int64_t)d->heads_kv, &blocks))
    return 0; /* not small */
  return blocks <= (causal ? 2 : 1) * SMALL_GRID_BLOCKS;
}

/* The arch whose shared memory the tiles are picked for: the target's, or
 * options.config_arch (testing: one GPU runs every arch's configurations)
 * when that has no more shared memory than the target. */
static int config_arch(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o) {
  return o->config_arch >= 80 &&
                 sdpa_arch_smem_limit(o->config_arch) <= sdpa_arch_smem_limit(d->arch)
             ? o->config_arch
             : d->arch;
}

/* Sets the tiles of `f` and *smem. */
static void take(sdpa_key_fields *f, const tile_choice *t, int *smem) {
  f->q_tile = t->q_tile;
  f->kv_tile = t->kv_tile;
  f->warps = t->warps;
  f->stages = t->stages;
  *smem = sdpa_mma_smem_layout(sdpa_config_mma(f)).total;
}

/* Whether the warps of tiles `t` tile every GEMM at the head dims of `f`. */
static int tiles_gemms(const sdpa_key_fields *f, const tile_choice *t) {
  return sdpa_mma_gemm_dims(mma_config(f, t->q_tile, t->kv_tile, t->warps, t->stages)).d > 0;
}

/* The shared memory tiles `t` need with key fields `f`. */
static int smem_of(const sdpa_key_fields *f, const tile_choice *t) {
  return sdpa_mma_smem_layout(mma_config(f, t->q_tile, t->kv_tile, t->warps, t->stages))
      .total;
}

sdpa_status sdpa_config_select(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o,
                               sdpa_key_fields *f, int *smem) {
  const int limit_arch = config_arch(d, o);
  const int limit = sdpa_arch_smem_limit(limit_arch);
  if (o->q_tile) {
    /* The options' (or SDPA_JIT_TILES') tiles, for every head_dim, when
     * this family has them and they fit. Tiles are key fields, so such
     * kernels get keys and cache rows of their own. */
    const tile_choice t = {o->q_tile, o->kv_tile, o->warps, o->stages};
    if ((t.q_tile != 32 && t.q_tile != 64 && t.q_tile != 128) ||
        (t.kv_tile != 32 && t.kv_tile != 64 && t.kv_tile != 128) ||
        (t.warps != 4 && t.warps != 8))
      return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                            "tiles %d,%d,%d,%d (options or SDPA_JIT_TILES) are not "
                            "tiles of the mma.sync family: tiles 32, 64 or 128, warps "
                            "4 or 8, stages 1 or 2",
                            t.q_tile, t.kv_tile, t.warps, t.stages);
    if (!tiles_gemms(f, &t))
      return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                            "tiles %d,%d,%d,%d (options or SDPA_JIT_TILES): their warps do "
                            "not tile the GEMMs at head_dim %d, head_dim_v %d",
                            t.q_tile, t.kv_tile, t.warps, t.stages, d->head_dim,
                            d->head_dim_v);
    const int need = smem_of(f, &t);
    if (need > limit)
      return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                            "tiles %d,%d,%d,%d (options or SDPA_JIT_TILES) need %d "
                            "bytes of shared memory at head_dim %d; sm_%d allows %d",
                            t.q_tile, t.kv_tile, t.warps, t.stages, need, d->head_dim,
                            limit_arch, limit);
    take(f, &t, smem);
    return SDPA_STATUS_SUCCESS;
  }
  tile_choice candidates[MAX_CANDIDATES];
  candidates_for(d->head_dim, d->head_dim_v,
                 d->deterministic || d->mask == SDPA_MASK_SLIDING_WINDOW || f->fold_dq,
                 candidates);
  int smallest = 0;
  for (int k = 0; k < MAX_CANDIDATES && candidates[k].q_tile; ++k) {
    const tile_choice *t = &candidates[k];
    if (!tiles_gemms(f, t)) continue;
    const int need = smem_of(f, t);
    if (need > limit) {
      smallest = need;
      continue;
    }
    if (small_grid(d, o, t->kv_tile))
      for (const tile_choice *s = small_grid_candidates; s->q_tile; ++s)
        if (tiles_gemms(f, s) && smem_of(f, s) <= limit) {
          t = s;
          break;
        }
    take(f, t, smem);
    return SDPA_STATUS_SUCCESS;
  }
  if (smallest)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "desc.head_dim = %d (head_dim_v %d) needs %d bytes of "
                          "shared memory per block at the smallest tiles; sm_%d "
                          "allows %d",
                          d->head_dim, d->head_dim_v, smallest, limit_arch, limit);
  /* Unreachable for the head dims plan.c admits (checked for all of them
   * by test_cpu_traits). */
  return sdpa_error_set(SDPA_STATUS_INTERNAL,
                        "no tiles of the mma.sync family cover head_dim %d, head_dim_v %d",
                        d->head_dim, d->head_dim_v);
}

size_t sdpa_config_candidates(int head_dim, int head_dim_v, sdpa_mma_config *out,
                              size_t capacity) {
  size_t n = 0;
  tile_choice lists[2][MAX_CANDIDATES];
  candidates_for(head_dim, head_dim_v, 0, lists[0]);
  candidates_for(head_dim, head_dim_v, 1, lists[1]);
  for (int tight = 0; tight < 2; ++tight)
    for (int k = 0; k < MAX_CANDIDATES && lists[tight][k].q_tile; ++k) {
      const tile_choice *t = &lists[tight][k];
      int seen = 0;
      for (int j = 0; tight && j < MAX_CANDIDATES && lists[0][j].q_tile; ++j)
        seen |= memcmp(&lists[0][j], t, sizeof *t) == 0;
      if (seen) continue;
      if (n < capacity)
        out[n] = (sdpa_mma_config){head_dim, head_dim_v, t->q_tile, t->kv_tile,
                                   t->warps, t->stages, 0, 0, 0};
      n++;
    }
  for (const tile_choice *s = small_grid_candidates; s->q_tile; ++s) {
    if (n < capacity)
      out[n] = (sdpa_mma_config){head_dim, head_dim_v, s->q_tile, s->kv_tile,
                                 s->warps, s->stages, 0, 0, 0};
    n++;
  }
  return n;
}

int sdpa_config_head_dim_measured(int head_dim) {
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i)
    if (table[i].head_dim == head_dim) return 1;
  return 0;
}

int sdpa_config_supports_head_dim(int head_dim) {
  return head_dim >= MIN_HEAD_DIM && head_dim <= MAX_HEAD_DIM &&
         head_dim % HEAD_DIM_STEP == 0;
}

const char *sdpa_config_head_dim_list(char *buf, size_t size) {
  snprintf(buf, size, "multiples of %d from %d to %d", HEAD_DIM_STEP, MIN_HEAD_DIM,
           MAX_HEAD_DIM);
  return buf;
}
