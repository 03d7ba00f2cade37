/*
 * sdpa_traits.h - the mma.sync family's configuration as functions of one
 * struct, read by the host (plan, config, execute: C11) and by the kernels
 * (NVRTC: C++17 constexpr), so each fact has one home: the shared-memory
 * carve of the main kernel, its warp partitions, the lanes and blocks of
 * the preprocess kernel, and the launch grids.
 *
 * The host sizes every launch from these functions; the kernels take their
 * layout and partitions from the same functions and static_assert what
 * they put in each region fits it. tests/test_cpu_traits.c compiles this
 * header with NVRTC for every configuration the tile table can pick and
 * checks that the device-side values equal the host's.
 *
 * Plain C (no toolkit header), like sdpa_params.h.
 */
#ifndef SDPA_TRAITS_H
#define SDPA_TRAITS_H

#include "sdpa_params.h"
#include "sdpa_hopper_traits.h" /* sdpa_dq_copies: the wide kernel */

#ifdef __cplusplus
#define SDPA_TRAIT static constexpr inline
#else
#define SDPA_TRAIT static inline
#endif

/* Threads per block of the preprocess and convert kernels. */
#define SDPA_AUX_THREADS 256

/* One configuration of the main kernel: the key fields that shape it. */
typedef struct sdpa_mma_config {
  int head_dim, head_dim_v;
  int q_tile;        /* M: query rows per step          */
  int kv_tile;       /* N: kv rows per block            */
  int warps;         /* 4 or 8                          */
  int stages;        /* Q/dO buffers: 1 or 2            */
  int deterministic; /* the ordered dQ hand-off          */
  int window;        /* a sliding-window mask           */
  int fold_dq;       /* the main kernel writes dQ        */
} sdpa_mma_config;

/* Warp partitions of the three GEMM shapes, R x C outputs over WR x
 * (warps / WR) warps: rows of warps for S/dP (M x N), for dK/dV (N x D
 * and N x DV) and for dQ (M x D). Default: the split that reads the
 * fewest rows from shared memory per k step (tile rows + tile cols), ties
 * to the squarer warp tile, each warp tile a multiple of 16 both ways.
 * Tight kernels (8 warps and deterministic, single-stage, sliding window
 * or writing dQ themselves: they spend registers on the hand-off, the
 * loads inside the step or the run-time band) take 16-row warp tiles,
 * the smallest A operands; with 4 warps the default already fits (every
 * class ptxas-checked without spills). */
typedef struct sdpa_mma_split {
  int s_rows, kv_rows, q_rows;
} sdpa_mma_split;

/* Head dims as the GEMMs and the shared tiles see them: D and DV rounded
 * up to the smallest multiples of 16 (the MMA's k step; ldmatrix takes 16
 * columns at a time) on which the warp split below tiles every GEMM. The
 * columns beyond the real head dims are zero in shared memory and are
 * never loaded or stored; for head dims that are multiples of 32 (every
 * head dim of the tile table) they are the head dims themselves. */
typedef struct sdpa_mma_dims {
  int d, dv; /* 0, 0: no padding up to 256 lets the warps tile the GEMMs */
} sdpa_mma_dims;

SDPA_TRAIT int sdpa_round_up(int x, int m) { return (x + m - 1) / m * m; }

/* The default split's rows of warps for R x C outputs whose columns also
 * tile a second width C2 (dK next to dV): 0 when none fits. */
SDPA_TRAIT int sdpa_split_rows(int rows, int cols, int cols2, int warps) {
  int best = 0, cost = 1 << 30;
  for (int wr = 1; wr <= warps; wr *= 2) {
    const int wc = warps / wr;
    if (rows % (16 * wr) != 0 || cols % (16 * wc) != 0 || cols2 % (16 * wc) != 0) continue;
    const int c = rows / wr + cols / wc;
    if (c < cost || (c == cost && rows / wr <= cols / wc)) {
      cost = c;
      best = wr;
    }
  }
  return best;
}

SDPA_TRAIT int sdpa_mma_tight(sdpa_mma_config c) {
  return (c.deterministic || c.stages == 1 || c.window || c.fold_dq) && c.warps == 8;
}

/* Whether `wr` rows of warps tile R x C (and C2) outputs in 16 x 16
 * multiples. */
SDPA_TRAIT int sdpa_split_tiles(int wr, int warps, int rows, int cols, int cols2) {
  return wr > 0 && warps % wr == 0 && rows % (16 * wr) == 0 &&
         cols % (16 * (warps / wr)) == 0 && cols2 % (16 * (warps / wr)) == 0;
}

/* The split of `c` at GEMM head dims d, dv; valid() says whether it tiles. */
SDPA_TRAIT sdpa_mma_split sdpa_mma_split_at(sdpa_mma_config c, int d, int dv) {
  sdpa_mma_split s = {0, 0, 0};
  if (sdpa_mma_tight(c)) {
    s.s_rows = c.q_tile / 16 < c.warps ? c.q_tile / 16 : c.warps;
    s.kv_rows = c.kv_tile / 16 < c.warps ? c.kv_tile / 16 : c.warps;
    s.q_rows = s.s_rows;
  } else {
    s.s_rows = sdpa_split_rows(c.q_tile, c.kv_tile, c.kv_tile, c.warps);
    s.kv_rows = sdpa_split_rows(c.kv_tile, dv, d, c.warps);
    s.q_rows = sdpa_split_rows(c.q_tile, d, d, c.warps);
  }
  return s;
}

SDPA_TRAIT int sdpa_mma_split_valid(sdpa_mma_config c, sdpa_mma_split s, int d, int dv) {
  return sdpa_split_tiles(s.s_rows, c.warps, c.q_tile, c.kv_tile, c.kv_tile) &&
         sdpa_split_tiles(s.kv_rows, c.warps, c.kv_tile, dv, d) &&
         sdpa_split_tiles(s.q_rows, c.warps, c.q_tile, d, d);
}

SDPA_TRAIT sdpa_mma_dims sdpa_mma_gemm_dims(sdpa_mma_config c) {
  sdpa_mma_dims r = {0, 0};
  for (int d = sdpa_round_up(c.head_dim, 16); d <= 256; d += 16)
    for (int dv = sdpa_round_up(c.head_dim_v, 16); dv <= d; dv += 16)
      if (sdpa_mma_split_valid(c, sdpa_mma_split_at(c, d, dv), d, dv)) {
        r.d = d;
        r.dv = dv;
        return r;
      }
  return r;
}

SDPA_TRAIT sdpa_mma_split sdpa_mma_warp_split(sdpa_mma_config c) {
  const sdpa_mma_dims g = sdpa_mma_gemm_dims(c);
  return sdpa_mma_split_at(c, g.d, g.dv);
}

/* Byte offsets of the main kernel's shared-memory regions, in order:
 * K [N][GD+8], V [N][GDV+8], Q [stages][M][GD+8], dO [stages][M][GDV+8],
 * P [M][N+8], dS [M][N+8] (16-bit elements, GD, GDV the GEMM head dims
 * above; rows padded by 16 bytes so the 8 rows of an ldmatrix fall in
 * distinct bank groups), LSE and Delta [stages][M] (fp32). `total` is the
 * dynamic shared memory to launch with. */
typedef struct sdpa_mma_smem {
  int k, v, q, dout, p, ds, lse, delta, total;
} sdpa_mma_smem;

SDPA_TRAIT sdpa_mma_smem sdpa_mma_smem_layout(sdpa_mma_config c) {
  const sdpa_mma_dims g = sdpa_mma_gemm_dims(c);
  const int ld_d = g.d + 8, ld_dv = g.dv + 8, ld_n = c.kv_tile + 8;
  sdpa_mma_smem s = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  s.k = 0;
  s.v = s.k + c.kv_tile * ld_d * 2;
  s.q = s.v + c.kv_tile * ld_dv * 2;
  s.dout = s.q + c.stages * c.q_tile * ld_d * 2;
  s.p = s.dout + c.stages * c.q_tile * ld_dv * 2;
  s.ds = s.p + c.q_tile * ld_n * 2;
  s.lse = s.ds + c.q_tile * ld_n * 2;
  s.delta = s.lse + c.stages * c.q_tile * 4;
  s.total = s.delta + c.stages * c.q_tile * 4;
  return s;
}

/* Lanes of the preprocess kernel per (row, head) of Delta, 8 elements a
 * lane. The kernel is correct for any grid; sized by sdpa_aux_blocks,
 * every lane has one item. */
SDPA_TRAIT int sdpa_aux_lanes(int head_dim_v) {
  return head_dim_v <= 32 ? 4 : head_dim_v <= 64 ? 8 : head_dim_v <= 128 ? 16 : 32;
}

/* Blocks of the preprocess kernel for `items` (row, head) pairs. */
SDPA_TRAIT sdpa_i64 sdpa_aux_blocks(sdpa_i64 items, int head_dim_v) {
  const sdpa_i64 per_block = SDPA_AUX_THREADS / sdpa_aux_lanes(head_dim_v);
  return (items + per_block - 1) / per_block;
}

/* Copies of the fp32 dQ accumulator and of the query tiles' counters
 * for a key's family (1 mma.sync, 2 sm_90a), deterministic flag, mask and
 * head_dim. Two for the sm_90a family's deterministic wide kernel without
 * a mask: it adds a query tile's dQ in two chains, the adds of even rank
 * into copy 0 and of odd rank into copy 1 (each copy's counters keep its
 * chain's turns), so that an add waits for the completion of the one two
 * before it rather than the one just before; the convert kernel sums
 * copy 0 + copy 1. There (64 x 64 tiles, 48 KiB of dQ an add) an add's
 * completion outlasts a step, and the rotation puts one add a step on
 * every query tile (bench/HOPPER-NOTES.md, twelfth session). Else one:
 * elsewhere the second copy's zeroing and reading cost more than the
 * chains gain. */
SDPA_TRAIT int sdpa_dq_copies(int family, int deterministic, int mask, int head_dim) {
  /* deterministic keys above 128 run the wide kernel at any head_dim_v */
  return family == 2 && deterministic && mask == 0 && sdpa_hopper_wide(head_dim, head_dim, 1) ? 2
                                                                                            : 1;
}

/* Tiles of `length` rows at `tile` rows a tile. */
SDPA_TRAIT sdpa_i64 sdpa_tiles(sdpa_i64 length, int tile) {
  return (length + tile - 1) / tile;
}

/* Blocks the convert kernel runs past its dQ ones for dK and dV from
 * dkv_accum (sdpa_aux.cuh): 8 columns a thread. */
SDPA_TRAIT sdpa_i64 sdpa_dkv_convert_blocks(sdpa_i64 rows_kv, int heads_kv, int head_dim,
                                          int head_dim_v) {
  return sdpa_tiles(rows_kv * heads_kv * ((head_dim + head_dim_v) / 8), SDPA_AUX_THREADS);
}

/* The main kernel's grid: x = kv tiles x sequences, y = kv heads, one
 * block of 32 * warps threads each. */
SDPA_TRAIT sdpa_i64 sdpa_mma_main_grid_x(sdpa_mma_config c, int seqlen_kv, int batch) {
  return sdpa_tiles(seqlen_kv, c.kv_tile) * batch;
}
SDPA_TRAIT int sdpa_mma_threads(sdpa_mma_config c) { return 32 * c.warps; }

#endif /* SDPA_TRAITS_H */
