/*
 * config.c — the per-arch table of kernel configurations.
 *
 * A configuration is the query tile M, the kv tile N, the warps and the
 * Q/dO pipeline depth of the main kernel. Shared memory decides most of
 * it: sm_80/sm_87 give a block 163 KiB, sm_90/sm_100 227 KiB, the consumer
 * parts (sm_86, sm_89, sm_120) 99 KiB. Registers decide the rest: dK and
 * dV live in registers, N*(D+DV)/(32*warps) floats per thread, kept at
 * 128 or below. The table lists, per head_dim, candidates from fastest to
 * smallest; the first that fits the arch's shared memory wins.
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
 */
#include <stdio.h>
#include <stdlib.h>

#include "env.h"
#include "plan.h"
#include "status.h"

int sdpa_arch_smem_limit(int arch) {
  switch (arch) {
  case 80: case 87: return 166912;           /* 163 KiB */
  case 90: case 100: case 103: case 110: return 232448; /* 227 KiB */
  default: return 101376;                   /* 99 KiB: 86, 89, 120, 121 */
  }
}

int sdpa_config_smem_bytes(int head_dim, int head_dim_v,
                           const sdpa_kernel_config *c) {
  const int ld_d = head_dim + 8, ld_dv = head_dim_v + 8, ld_n = c->kv_tile + 8;
  return c->kv_tile * ld_d * 2 + c->kv_tile * ld_dv * 2 +
         c->stages * c->q_tile * (ld_d + ld_dv) * 2 +
         2 * c->q_tile * ld_n * 2 + 2 * c->stages * c->q_tile * 4;
}

typedef struct {
  int q_tile, kv_tile, warps, stages;
} tile_choice;

typedef struct {
  int head_dim;
  tile_choice candidates[4]; /* q_tile 0 ends the list */
} config_row;

/* {q_tile, kv_tile, warps, stages} by head_dim, best first. */
static const config_row table[] = {
  {32,  {{128, 128, 8, 2}, {128, 128, 8, 1}, {64, 64, 8, 2}, {0}}},
  {64,  {{128, 128, 8, 2}, {128, 128, 8, 1}, {64, 64, 8, 2}, {0}}},
  {96,  {{64, 128, 8, 2}, {64, 64, 8, 2}, {64, 64, 8, 1}, {0}}},
  {128, {{64, 128, 8, 2}, {64, 128, 8, 1}, {64, 64, 8, 1}, {0}}},
  {192, {{64, 64, 8, 2}, {64, 64, 8, 1}, {32, 64, 8, 1}, {0}}},
  {256, {{32, 64, 8, 2}, {32, 32, 4, 1}, {0}}},
};

/* Small-grid candidates, best first (the table's warps; q tile 128 where
 * shared memory allows: +2 to +4% over 64 at head_dim 64 and 128). */
static const tile_choice small_grid_candidates[] = {
    {128, 64, 8, 2}, {64, 64, 8, 2}, {64, 64, 8, 1}, {0}};
#define SMALL_GRID_BLOCKS 64

/* Whether `d`, planned with the table's choice `c`, is a small grid (see
 * the file comment). SDPA_JIT_SMALL_GRID=0 turns the rule off (tests use
 * it to run small problems with the table's tiles); 1 or unset: on. */
static sdpa_status small_grid(const sdpa_bwd_desc *d, const sdpa_kernel_config *c,
                              int *out) {
  static const char *const values[2] = {"1", "0"};
  static const char *const meanings[2] = {"64-row kv tiles for small grids",
                                          "the table's tiles for every grid"};
  int off = 0;
  sdpa_status st = sdpa_env_choice("SDPA_JIT_SMALL_GRID", values, meanings, &off);
  *out = 0;
  if (st) return st;
  if (off || d->layout != SDPA_LAYOUT_BSHD ||
      d->deterministic || c->kv_tile != 128)
    return SDPA_STATUS_SUCCESS;
  const int causal = d->mask == SDPA_MASK_CAUSAL_TOP_LEFT ||
                     d->mask == SDPA_MASK_CAUSAL_BOTTOM_RIGHT;
  const int64_t tiles = ((int64_t)d->seqlen_kv + c->kv_tile - 1) / c->kv_tile;
  int64_t blocks = 0; /* tiles * batch < 2^58; times heads_kv may pass int64 */
  if (__builtin_mul_overflow(tiles * d->batch, (int64_t)d->heads_kv, &blocks))
    return SDPA_STATUS_SUCCESS; /* not small */
  *out = blocks <= (causal ? 2 : 1) * SMALL_GRID_BLOCKS;
  return SDPA_STATUS_SUCCESS;
}

/* Tuning knob: SDPA_JIT_TILES="q_tile,kv_tile,warps,stages" replaces the
 * table's choice (for every head_dim) when it fits. Tiles are key fields,
 * so such kernels get keys and cache rows of their own. */
static sdpa_status config_from_env(const sdpa_bwd_desc *d, int limit_arch,
                                   sdpa_kernel_config *out, int *used) {
  const int limit = sdpa_arch_smem_limit(limit_arch);
  const char *env = getenv("SDPA_JIT_TILES");
  *used = 0;
  if (!env || !*env) return SDPA_STATUS_SUCCESS;
  sdpa_kernel_config c = {0, 0, 0, 0, 0};
  if (sscanf(env, "%d,%d,%d,%d", &c.q_tile, &c.kv_tile, &c.warps, &c.stages) != 4 ||
      (c.q_tile != 32 && c.q_tile != 64 && c.q_tile != 128) ||
      (c.kv_tile != 32 && c.kv_tile != 64 && c.kv_tile != 128) ||
      (c.warps != 4 && c.warps != 8) || (c.stages != 1 && c.stages != 2))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "SDPA_JIT_TILES = \"%s\" is not valid: expected "
                          "\"q_tile,kv_tile,warps,stages\" with tiles 32, 64 or "
                          "128, warps 4 or 8, stages 1 or 2",
                          env);
  c.smem_bytes = sdpa_config_smem_bytes(d->head_dim, d->head_dim_v, &c);
  if (c.smem_bytes > limit)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "SDPA_JIT_TILES = \"%s\" needs %d bytes of shared "
                          "memory at head_dim %d; sm_%d allows %d",
                          env, c.smem_bytes, d->head_dim, limit_arch, limit);
  *out = c;
  *used = 1;
  return SDPA_STATUS_SUCCESS;
}

/* Testing knob: SDPA_JIT_CONFIG_ARCH=80 picks tiles as the table does for
 * that arch (its shared-memory budget) while compiling for the real one, so
 * one GPU can run every arch's configurations. */
static int config_arch(const sdpa_bwd_desc *d) {
  const char *env = getenv("SDPA_JIT_CONFIG_ARCH");
  int arch = env && *env ? atoi(env) : 0;
  return arch >= 80 && sdpa_arch_smem_limit(arch) <= sdpa_arch_smem_limit(d->arch)
             ? arch : d->arch;
}

sdpa_status sdpa_config_select(const sdpa_bwd_desc *d, sdpa_kernel_config *out) {
  const int limit_arch = config_arch(d);
  const int limit = sdpa_arch_smem_limit(limit_arch);
  int from_env = 0;
  sdpa_status st = config_from_env(d, limit_arch, out, &from_env);
  if (st || from_env) return st;
  int smallest = 0;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
    if (table[i].head_dim != d->head_dim) continue;
    for (int k = 0; k < 4 && table[i].candidates[k].q_tile; ++k) {
      const tile_choice *t = &table[i].candidates[k];
      sdpa_kernel_config c = {t->q_tile, t->kv_tile, t->warps, t->stages, 0};
      c.smem_bytes = sdpa_config_smem_bytes(d->head_dim, d->head_dim_v, &c);
      if (c.smem_bytes <= limit) {
        int small = 0;
        if ((st = small_grid(d, &c, &small))) return st;
        for (const tile_choice *s = small_grid_candidates; small && s->q_tile; ++s) {
          sdpa_kernel_config n = {s->q_tile, s->kv_tile, s->warps, s->stages, 0};
          n.smem_bytes = sdpa_config_smem_bytes(d->head_dim, d->head_dim_v, &n);
          if (n.smem_bytes <= limit) {
            c = n;
            break;
          }
        }
        *out = c;
        return SDPA_STATUS_SUCCESS;
      }
      smallest = c.smem_bytes;
    }
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "desc.head_dim = %d (head_dim_v %d) needs %d bytes of "
                          "shared memory per block at the smallest tiles; sm_%d "
                          "allows %d",
                          d->head_dim, d->head_dim_v, smallest, limit_arch, limit);
  }
  /* Unreachable: plan.c admits only the table's head dims. */
  return sdpa_error_set(SDPA_STATUS_INTERNAL,
                        "no kernel configuration for head_dim %d", d->head_dim);
}

int sdpa_config_supports_head_dim(int head_dim) {
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i)
    if (table[i].head_dim == head_dim) return 1;
  return 0;
}

const char *sdpa_config_head_dim_list(char *buf, size_t size) {
  size_t used = 0;
  buf[0] = 0;
  for (size_t i = 0; i < sizeof table / sizeof table[0] && used < size; ++i) {
    int n = snprintf(buf + used, size - used, "%s%d", i ? ", " : "", table[i].head_dim);
    if (n < 0) break;
    used += (size_t)n;
  }
  return buf;
}
