/*
 * sdpa_hopper_traits.h - the sm_90a family's configuration as functions of
 * one struct, read by the host (C11: plan, launch) and by the kernel
 * (NVRTC: C++17 constexpr; sdpa_hopper.cuh takes its shared-memory carve
 * from sdpa_hopper_smem_layout and static_asserts the translation unit's
 * defines against sdpa_hopper_choose). One home for each fact: tiles by
 * head dim, threads, the shared-memory carve, the grid.
 *
 * Plain C (no toolkit header), like sdpa_params.h.
 *
 * Launch of the family's sdpa_bwd_main (preprocess before it and convert
 * after it as for the mma family, sdpa_aux.cuh):
 *   grid   the kernel's tiles: x = sdpa_hopper_grid_x(c, seqlen_kv, batch)
 *          = ceil(seqlen_kv / kv_tile) * batch (THD: seqlen_kv is the
 *          max_s hint), y = heads_kv x p.head_chunks
 *          (sdpa_hopper_head_chunks); a persistent kernel
 *          (sdpa_hopper_persistent_kernel) may instead be launched with
 *          sdpa_hopper_persistent_blocks(tiles, sm_count) blocks in x and
 *          y = 1 (any count from 1 up: block b takes tiles b, b + blocks,
 *          ... of the same x-major order)
 *   block  sdpa_hopper_threads(c) = 384
 *   dynamic shared memory sdpa_hopper_smem_layout(c, layout, mask, det).total (set
 *          CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it: it is
 *          over 48 KiB)
 *   params (sdpa_kernel_params p, sdpa_tensor_maps maps), p filled as for
 *          the mma family with this family's tiles: p.q_tiles =
 *          ceil(seqlen_q / q_tile), p.order_group for kv_tile.
 */
#ifndef SDPA_HOPPER_TRAITS_H
#define SDPA_HOPPER_TRAITS_H

#ifdef __cplusplus
#define SDPA_HOPPER_TRAIT static constexpr inline
#else
#define SDPA_HOPPER_TRAIT static inline
#endif

/* MMA warpgroups (each owns 64 kv rows), warps per block (one producer
 * warpgroup besides), and the columns of one TMA box (128 bytes). */
#define SDPA_HOPPER_CONSUMERS 2
#define SDPA_HOPPER_WARPS (4 * (SDPA_HOPPER_CONSUMERS + 1))
#define SDPA_HOPPER_BOX_COLS 64

/* One configuration: the key fields that shape the kernel. */
typedef struct sdpa_hopper_config {
  int head_dim, head_dim_v;
  int q_tile;  /* M: query rows per step             */
  int kv_tile; /* N: kv rows per block (64 a consumer) */
  int warps;   /* SDPA_HOPPER_WARPS                  */
  int stages;  /* Q/dO ring depth                    */
} sdpa_hopper_config;

/* Whether the family compiles these head dims: multiples of 8 with
 * head_dim_v <= head_dim <= 256, and head_dim_v > 64 when head_dim > 128
 * (deterministic or not).
 * The GEMMs run the exact widths (wgmma N = head_dim for dK, head_dim_v
 * for dV, or each consumer's share of them); their reductions over a head
 * dim round it up to 16 with the zeros the bulk copies write past a
 * tensor's last column. */
SDPA_HOPPER_TRAIT int sdpa_hopper_supported(int head_dim, int head_dim_v) {
  return head_dim % 8 == 0 && head_dim_v % 8 == 0 && head_dim_v >= 8 &&
         head_dim_v <= head_dim && head_dim <= 256 && (head_dim <= 128 || head_dim_v > 64);
}

/* Above head_dim 128 one consumer's 64 kv rows of dK and dV and a 64-row
 * query step's S^T and dP^T no longer fit its registers together. Two
 * kernels serve those head dims:
 *
 * The transposed-dQ kernel (sdpa_hopper_dqt): the narrow kernel's form
 * (128 kv rows a CTA, 64 a consumer, dK and dV whole in its registers)
 * with 32 query rows a step, so that S^T and dP^T take 16 registers each;
 * dQ's GEMM, whose M would be the 32 query rows, runs transposed (dQ^T =
 * K^T dS^T, M = the head dim, split between the consumers) and its
 * fragments are transposed back (movmatrix) before the staging. Where
 * dK and dV fit beside them: head_dim + head_dim_v <= 320 (the DeepSeek
 * shape, 192 / 128: 160 accumulator registers), head_dim a multiple of 64
 * (dQ^T's M), not deterministic (its dQ writers take 64-row tiles). Each
 * step's Q / dO loads and dQ adds serve 128 kv rows instead of the wide
 * kernel's 64: half the L2 bytes a flop (bench/HOPPER-NOTES.md).
 *
 * The wide kernel (sdpa_hopper_wide) elsewhere: one 64-row kv tile a CTA
 * whose dK, dV and dQ columns the two consumers split (each computes S^T
 * and dP^T for half of the query columns and shares P^T and dS^T through
 * shared memory). */
#define SDPA_HOPPER_WIDE_ABOVE 128
#define SDPA_HOPPER_DQT_MAX_DIMS 320
SDPA_HOPPER_TRAIT int sdpa_hopper_dqt(int head_dim, int head_dim_v, int deterministic) {
  return head_dim > SDPA_HOPPER_WIDE_ABOVE && head_dim % 64 == 0 &&
         head_dim + head_dim_v <= SDPA_HOPPER_DQT_MAX_DIMS && !deterministic;
}
SDPA_HOPPER_TRAIT int sdpa_hopper_wide(int head_dim, int head_dim_v, int deterministic) {
  return head_dim > SDPA_HOPPER_WIDE_ABOVE && !sdpa_hopper_dqt(head_dim, head_dim_v, deterministic);
}

/* Whether a kernel takes its tiles in a loop (a persistent grid, one block
 * an SM): its producer loads the next tile's K, V and first Q / dO stages
 * while the consumers store the last tile's dK and dV (staged in the dS
 * and dQ buffers, sdpa_hopper_smem_layout_variant), so that a block's
 * prologue and the gap between blocks leave the path. Where it measured
 * faster (bench/HOPPER-NOTES.md, the persistent grid): head dims up to 64,
 * BSHD (layout 1; THD's tiles are of unequal length, and a fixed share of
 * them a block lost 10% to the hardware's own scheduling at hd 128), no
 * mask (tiles of equal weight: block b takes every blocks-th tile), not
 * deterministic (whose adds wait on other tiles, each in its own block).
 * At hd 128 it measured 1-2% slower and stays off. A preprocessor
 * expression (the kernel tests it with #if), and the same as a function;
 * the kernel itself serves any narrow head dim (bench_hopper --define
 * SDPA_HOPPER_PERSIST=1). */
#define SDPA_HOPPER_PERSIST_MAX_HEAD_DIM 64
#define SDPA_HOPPER_PERSISTENT_KERNEL(head_dim, layout, mask, deterministic)                   \
  ((head_dim) <= SDPA_HOPPER_PERSIST_MAX_HEAD_DIM && (layout) == 1 && (mask) == 0 &&         \
   !(deterministic))
SDPA_HOPPER_TRAIT int sdpa_hopper_persistent_kernel(int head_dim, int layout, int mask,
                                                    int deterministic) {
  return SDPA_HOPPER_PERSISTENT_KERNEL(head_dim, layout, mask, deterministic);
}

/* Blocks a kv tile's group of query heads is split over (the launch's
 * p.head_chunks; grid y = heads_kv x chunks): each block runs group /
 * chunks query heads and adds its dK / dV, in fp32, to an accumulator the
 * convert kernel writes out, instead of storing them. A GQA block walks
 * its group's heads one after the other, so the kv tiles of a kv head
 * drift apart and read each Q / dO tile (and add to each dQ tile) too far
 * apart in time for L2 (bench/RESULTS.md, GQA causal: L2 and the order of
 * the steps); split, they keep an MHA block's order, for the adds at each
 * block's end. The rule, measured at GQA 64/8 hd 128 S4k (H100,
 * bench/HOPPER-NOTES.md): with a mask, up to 4 chunks (causal 410 -> 481
 * / 495 TFLOP/s; 2: 476 / 480, 8: 467 / 470), where the blocks' spans
 * differ and drift; without one, 1 (the blocks run in step already: 2
 * to 8 chunks lost 1-4% to the adds). The wide kernel the same (GQA 16/2
 * S8k causal: hd 192 293 -> 414, hd 256 238 -> 392; 2 and 8 chunks at
 * most as fast as 4; full lost 2-3% split). `wanted` > 0 asks for that
 * many instead; either way the largest divisor of the group up to it
 * and up to `most` (what the grid's y leaves). Deterministic plans: 1 (the dK / dV adds would come in any
 * order); so are persistent kernels (sdpa_hopper_persistent_kernel: their
 * epilogue has no fp32 path). */
SDPA_HOPPER_TRAIT int sdpa_hopper_head_chunks(int group, int head_dim, int layout, int mask,
                                              int deterministic, int wanted, int most) {
  if (deterministic || group <= 1 ||
      sdpa_hopper_persistent_kernel(head_dim, layout, mask, deterministic))
    return 1;
  int c = wanted > 0 ? wanted : mask != 0 ? 4 : 1;
  if (c > most) c = most;
  if (c > group) c = group;
  while (c > 1 && group % c) --c;
  return c < 1 ? 1 : c; /* most may be 0 */
}

/* The largest head dim whose kernel has room for the dQ staging beside
 * two Q / dO stages (the wide kernel's carve at 256 is 231,616 bytes
 * without it; with it, up to 192 fits sm_90's 232,448: the kernel
 * static_asserts its carve). Above it a kernel keeps two stages and
 * reduces dQ from registers, except a deterministic one, whose ordered
 * adds go through the staging: it takes one Q / dO stage and stages dQ
 * in the second one's room (SDPA_HOPPER_ONE_STAGE). The same for every
 * kernel above 192 measured 21-27% slower than two stages and register
 * reductions (bench/HOPPER-NOTES.md, thirteenth session). */
#define SDPA_HOPPER_STAGING_MAX 192
#define SDPA_HOPPER_ONE_STAGE(head_dim, deterministic) \
  ((head_dim) > SDPA_HOPPER_STAGING_MAX && (deterministic))

/* The Q / dO ring's depth: two, or one (SDPA_HOPPER_ONE_STAGE; its dQ
 * staging, a step's 64 x head_dim fp32, takes the room of the second
 * stage's Q and dO tiles). */
SDPA_HOPPER_TRAIT int sdpa_hopper_stages(int head_dim, int deterministic) {
  return SDPA_HOPPER_ONE_STAGE(head_dim, deterministic) ? 1 : 2;
}

/* Whether a deterministic kernel adds each query tile's dQ in descending
 * kv-tile order and launches the kv tiles of a group of the masked launch
 * order lightest first (each block then waits only for blocks launched
 * before it): under a mask with a right bound (mask 1, 2 causal; 3 a
 * window with window_right >= 0), where kv tile j + 1 reaches each query
 * tile steps before j, and one query head a kv head (`group` 1). With a
 * group of query heads a block runs `group` times longer, and the
 * heaviest blocks launched last make a tail as long (measured: GQA 64/8
 * S 4k causal 8-21% slower than index order, bench/HOPPER-NOTES.md).
 * Otherwise index order, heaviest first. */
SDPA_HOPPER_TRAIT int sdpa_hopper_dq_descends(int mask, int window_right, int group) {
  return group == 1 && (mask == 1 || mask == 2 || (mask == 3 && window_right >= 0));
}

/* The configuration for a key: q tile 128 up to head_dim 64 (the S^T and
 * dP^T accumulators are 64 x 128 per consumer next to at most 64 + 64
 * dK/dV registers), 64 above (up to 128 dK/dV registers), 32 for the
 * transposed-dQ kernel (up to 160); kv tile 128 (two consumers of 64
 * rows), 64 for the wide kernel; two Q / dO stages (one where
 * sdpa_hopper_stages says). Tiles hold whole 64-column boxes (a head dim
 * of 96 takes the room of 128). */
SDPA_HOPPER_TRAIT sdpa_hopper_config sdpa_hopper_choose(int head_dim, int head_dim_v,
                                                         int deterministic) {
  sdpa_hopper_config c = {0, 0, 0, 0, 0, 0};
  c.head_dim = head_dim;
  c.head_dim_v = head_dim_v;
  c.q_tile = head_dim <= 64                                         ? 128
             : sdpa_hopper_dqt(head_dim, head_dim_v, deterministic) ? 32
                                                                    : 64;
  c.kv_tile = sdpa_hopper_wide(head_dim, head_dim_v, deterministic) ? 64
                                                                    : 64 * SDPA_HOPPER_CONSUMERS;
  c.warps = SDPA_HOPPER_WARPS;
  c.stages = sdpa_hopper_stages(head_dim, deterministic);
  return c;
}

SDPA_HOPPER_TRAIT int sdpa_hopper_threads(sdpa_hopper_config c) { return 32 * c.warps; }

/* Which kernel a configuration runs (sdpa_hopper_choose's tiles say it):
 * the wide one (a 64-row kv tile), the transposed-dQ one (32-row query
 * tiles), else the narrow one. */
SDPA_HOPPER_TRAIT int sdpa_hopper_config_wide(sdpa_hopper_config c) {
  return c.kv_tile < 64 * SDPA_HOPPER_CONSUMERS;
}
SDPA_HOPPER_TRAIT int sdpa_hopper_config_dqt(sdpa_hopper_config c) { return c.q_tile == 32; }

/* 64-column boxes of a row of `cols` 16-bit elements, and the bytes of a
 * [rows x cols] tile stored as boxes of [rows][128 bytes]. */
SDPA_HOPPER_TRAIT int sdpa_hopper_boxes(int cols) {
  return (cols + SDPA_HOPPER_BOX_COLS - 1) / SDPA_HOPPER_BOX_COLS;
}
SDPA_HOPPER_TRAIT int sdpa_hopper_tile_bytes(int rows, int cols) {
  return sdpa_hopper_boxes(cols) * rows * 128;
}

/* Byte offsets of the shared-memory regions from the kernel's
 * 1024-aligned base (the 128-byte swizzle needs every tile 1024-aligned),
 * in order:
 *   K [N x d], V [N x dv]                 resident, TMA
 *   Q [stages][M x d], dO [stages][M x dv]  TMA ring
 *   dS [2][N x M]  kv rows x query columns, boxes of 64 query columns
 *                  (the transposed-dQ kernel: [M][N], query rows x kv
 *                  columns, in the same room)
 *   P  [2][N x M]  the same for P^T (the wide kernel's; empty otherwise)
 *   (one tile a block: the epilogue stages dK and dV rows from Q on, and
 *   dq starts past them where Q, dO, dS and P hold fewer bytes: the
 *   transposed-dQ kernel's 32-row query tiles)
 *   dq   [dq_buffers][q_tile / 16][16 x head_dim] fp32, each 16-row
 *        block in dq_accum's fragment order: the staging of the bulk
 *        reduce-adds of dQ (dq_bulk, the kernel's SDPA_HOPPER_DQ_BULK;
 *        empty with dQ reduced from registers), one step's per buffer
 *        (sdpa_hopper_dq_buffers); a persistent kernel's epilogue stages
 *        dK and dV rows (sdpa_hopper_out_pitch) from dS on, the region
 *        grown to hold them where dS, P and dq do not
 *   lse2 [stages][M] fp32: LSE * log2 e, +inf for rows past the sequence
 *        or with no visible key; delta [stages][M] fp32 (0 past it)
 *   bar  mbarriers (SDPA_HOPPER_BARRIERS)
 *   work two slots of a tile's coordinates (SDPA_HOPPER_WORK_BYTES each),
 *        written once a tile and read by the consumers where needed, so
 *        that they stay out of the registers across the main loop
 * `carve` is where they end; `total`, the dynamic shared memory to launch
 * with, adds 1024 bytes for the alignment of the base. */
typedef struct sdpa_hopper_smem {
  int k, v, q, dout, ds, p, lse2, delta, bar, work, dq, carve, total;
} sdpa_hopper_smem;

/* Where `cols` head-dim columns split between the two consumers: at the
 * 64-column box that halves the boxes (rounding the first share up), so
 * that each one's operand slices start at a box. */
SDPA_HOPPER_TRAIT int sdpa_hopper_split(int cols) {
  return 64 * ((sdpa_hopper_boxes(cols) + 1) / 2);
}

/* The dQ tile's split between the consumers. With 128 query rows each
 * takes 64 of them and every column; with 64, consumer 0 takes columns
 * [0, split) and consumer 1 [split, head_dim) (sdpa_hopper_split: 64
 * for 64 < head_dim <= 128, 128 above, where dK and dV split the same
 * way). */
SDPA_HOPPER_TRAIT int sdpa_hopper_dq_col0(sdpa_hopper_config c, int consumer) {
  return c.q_tile == 128 ? 0 : consumer * sdpa_hopper_split(c.head_dim);
}
SDPA_HOPPER_TRAIT int sdpa_hopper_dq_cols(sdpa_hopper_config c, int consumer) {
  return c.q_tile == 128   ? c.head_dim
         : consumer == 0 ? sdpa_hopper_split(c.head_dim)
                         : c.head_dim - sdpa_hopper_split(c.head_dim);
}

/* Whether the wide kernel holds K's A fragments of S^T = K Q^T in
 * registers (wgmma RS, 4 registers a k16 step of head_dim, loaded once
 * a block) instead of both consumers reading all of K from shared memory
 * every step (2 x 64 x head_dim x 2 bytes: 48 KB at 192): where consumer
 * 0, which holds the larger shares, has the room. Its registers at the
 * peak, estimated: its dK and dV shares, the larger of its dQ share (the
 * staging's one GEMM up to 192) and S^T, dP^T and their packed halves
 * (48), and K's fragments; within SDPA_HOPPER_WIDE_REG_ROOM of the 240 it
 * gets (the rest: addresses, loop state). Measured on the H200
 * (bench/HOPPER-NOTES.md, sixth session): 192 / 128 +2.6-4.3%; 192 / 192
 * and 160, with dQ's larger share moved to consumer 1 to make the room,
 * no faster (and that even split alone 1.5-4% slower), so they keep K in
 * shared memory. */
#define SDPA_HOPPER_WIDE_REG_ROOM 224
SDPA_HOPPER_TRAIT int sdpa_hopper_wide_k_regs(int head_dim, int head_dim_v) {
  const int dk = sdpa_hopper_split(head_dim) / 2; /* dK's share, and dQ's (one split) */
  return head_dim > SDPA_HOPPER_WIDE_ABOVE && head_dim <= SDPA_HOPPER_STAGING_MAX &&
         dk + sdpa_hopper_split(head_dim_v) / 2 + (dk > 48 ? dk : 48) + 4 * ((head_dim + 15) / 16) <=
             SDPA_HOPPER_WIDE_REG_ROOM;
}

#define SDPA_HOPPER_WORK_BYTES 128 /* a tile's coordinates; two slots */
/* Stamps a block records under SDPA_HOPPER_TRACE (sdpa_hopper.cuh; read
 * by bench_hopper --trace). */
#define SDPA_HOPPER_TRACE_SLOTS 10
/* The kernel's mbarriers (sdpa_hopper.cuh, BAR_*): full and empty per
 * stage, then k, dq_full[2], dq_empty[2], halves[2], v, kv_empty,
 * work_full[2], work_empty[2]. */
#define SDPA_HOPPER_BARRIERS(stages) (2 * (stages) + 13)

/* Bytes of a row of `cols` 16-bit elements in the epilogue's dK / dV
 * staging: an odd number of 16-byte chunks, so that the eight rows of
 * an stmatrix (and eight consecutive chunks read back) fall in distinct
 * bank groups. */
SDPA_HOPPER_TRAIT int sdpa_hopper_out_pitch(int cols) { return (((cols + 7) / 8) | 1) * 16; }

SDPA_HOPPER_TRAIT sdpa_hopper_smem sdpa_hopper_smem_layout_variant(sdpa_hopper_config c,
                                                                  int dq_bulk,
                                                                  int dq_buffers,
                                                                  int persistent) {
  sdpa_hopper_smem s = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  s.k = 0;
  s.v = s.k + sdpa_hopper_tile_bytes(c.kv_tile, c.head_dim);
  s.q = s.v + sdpa_hopper_tile_bytes(c.kv_tile, c.head_dim_v);
  s.dout = s.q + c.stages * sdpa_hopper_tile_bytes(c.q_tile, c.head_dim);
  s.ds = s.dout + c.stages * sdpa_hopper_tile_bytes(c.q_tile, c.head_dim_v);
  s.p = s.ds + 2 * sdpa_hopper_tile_bytes(c.kv_tile, c.q_tile);
  s.dq = s.p + (sdpa_hopper_config_wide(c) ? 2 * sdpa_hopper_tile_bytes(c.kv_tile, c.q_tile) : 0);
  const int out = c.kv_tile * (sdpa_hopper_out_pitch(c.head_dim) +
                               sdpa_hopper_out_pitch(c.head_dim_v));
  if (!persistent && s.dq < s.q + out) /* the epilogue's dK / dV rows from s.q on */
    s.dq = (s.q + out + 1023) / 1024 * 1024;
  s.lse2 = s.dq + (dq_bulk ? dq_buffers * c.q_tile * c.head_dim * 4 : 0);
  if (persistent && s.lse2 < s.ds + out) /* the epilogue's dK / dV rows from s.ds on */
    s.lse2 = s.ds + out;
  s.delta = s.lse2 + c.stages * c.q_tile * 4;
  s.bar = s.delta + c.stages * c.q_tile * 4;
  s.work = (s.bar + 8 * SDPA_HOPPER_BARRIERS(c.stages) + 15) / 16 * 16;
  s.carve = s.work + 2 * SDPA_HOPPER_WORK_BYTES;
  s.total = s.carve + 1024;
  return s;
}

/* Where the main kernel converts dQ itself (SDPA_FOLD_DQ,
 * sdpa_hopper_fold.cuh): the 16-row blocks of dq_accum (16 x head_dim
 * fp32) that its converting warp holds in shared memory at once, past
 * the carve, and their bytes; 0 where the kernel does not convert. */
SDPA_HOPPER_TRAIT int sdpa_hopper_fold_buffers(sdpa_hopper_config c, int fold) {
  return fold ? (c.q_tile / 16 < 4 ? c.q_tile / 16 : 4) : 0;
}
SDPA_HOPPER_TRAIT int sdpa_hopper_fold_bytes(sdpa_hopper_config c, int fold) {
  return sdpa_hopper_fold_buffers(c, fold) * 16 * c.head_dim * 4;
}

/* How the default kernel reduces dQ into dq_accum: 1 through shared
 * memory and bulk reduce-adds (measured on the H200: +4 to +9% at S 4k
 * over 0, one vector reduction per fragment from registers), where the
 * staging fits beside two stages (SDPA_HOPPER_STAGING_MAX) or takes the
 * second one's room (SDPA_HOPPER_ONE_STAGE; the deterministic kernels'
 * dQ writers add the staged tiles in order); 0 otherwise. A
 * preprocessor expression (the kernel tests it with #if). */
#define SDPA_HOPPER_DQ_BULK_DEFAULT(head_dim, deterministic) \
  ((head_dim) <= SDPA_HOPPER_STAGING_MAX || SDPA_HOPPER_ONE_STAGE(head_dim, deterministic) ? 1 : 0)

/* The dQ staging buffers of a kernel that stages dQ (dq_bulk): 2 for
 * deterministic ones where the second fits sm_90's 227 KiB (not the wide
 * kernel's), each read by a dQ writer of its own (sdpa_hopper.cuh,
 * write_dq, DQ_WRITERS): one buffer's adds wait for their turn and their
 * completion while the consumers fill the other; else 1. */
SDPA_HOPPER_TRAIT int sdpa_hopper_dq_buffers(sdpa_hopper_config c, int dq_bulk,
                                             int deterministic) {
  return dq_bulk && deterministic && !sdpa_hopper_config_wide(c) &&
                 sdpa_hopper_smem_layout_variant(c, dq_bulk, 2, 0).total <= 232448
             ? 2
             : 1;
}

/* The default kernel's carve (what the runtime launches). */
SDPA_HOPPER_TRAIT sdpa_hopper_smem sdpa_hopper_smem_layout(sdpa_hopper_config c, int layout,
                                                           int mask, int deterministic) {
  const int bulk = SDPA_HOPPER_DQ_BULK_DEFAULT(c.head_dim, deterministic);
  return sdpa_hopper_smem_layout_variant(
      c, bulk, sdpa_hopper_dq_buffers(c, bulk, deterministic),
      sdpa_hopper_persistent_kernel(c.head_dim, layout, mask, deterministic));
}

/* Whether the main kernel can convert dQ itself (the key field dq=main,
 * SDPA_FOLD_DQ; sdpa_hopper_fold.cuh): the narrow kernels and the
 * transposed-dQ one, whose dQ adds go through shared memory in bulk, one
 * tile a block (not the persistent kernels), dK and dV stored by the
 * block (the plan's head chunks 1), not deterministic. The kernel's
 * static_assert holds the same. */
SDPA_HOPPER_TRAIT int sdpa_hopper_fold_covers(int head_dim, int head_dim_v, int layout, int mask,
                                              int deterministic) {
  return !deterministic && !sdpa_hopper_wide(head_dim, head_dim_v, 0) &&
         SDPA_HOPPER_DQ_BULK_DEFAULT(head_dim, 0) &&
         !sdpa_hopper_persistent_kernel(head_dim, layout, mask, 0);
}

/* Blocks in x: one per kv tile of each sequence. */
SDPA_HOPPER_TRAIT long long sdpa_hopper_grid_x(sdpa_hopper_config c, int seqlen_kv, int batch) {
  return ((long long)seqlen_kv + c.kv_tile - 1) / c.kv_tile * (long long)batch;
}

/* Blocks of a persistent kernel's launch over `tiles` tiles (grid_x *
 * heads_kv) on a device of sm_count multiprocessors (one block an SM);
 * 0 if sm_count is unknown (launch one block a tile). */
SDPA_HOPPER_TRAIT long long sdpa_hopper_persistent_blocks(long long tiles, int sm_count) {
  return sm_count <= 0 ? 0 : tiles < sm_count ? tiles : sm_count;
}

/* Longest first (the launch's p.seq_order): a THD grid without a mask
 * launches, sequence by sequence, every kv tile of every head; a tile's
 * time is its sequence's query tiles, so a long sequence late in the
 * batch ends the grid alone (hd 128, 8 sequences of 512-4096 tokens x 16
 * heads on 132 SMs: the tail was 7.5% of each SM's time against 2.9% for
 * BSHD). Launched longest query sequence first instead, the last wave
 * holds the shortest tiles. The preprocess kernel ranks the sequences
 * (each thread counts the longer ones: batch^2 reads, hence at most
 * SDPA_HOPPER_ORDER_MAX_BATCH sequences); not deterministic plans (their
 * adds wait in index order) and not the fold (its counters follow the
 * grid). The kernel tests the same expression with #if. */
#define SDPA_HOPPER_ORDER_MAX_BATCH 512
#define SDPA_HOPPER_LONGEST_FIRST(layout, mask, deterministic, fold)                             \
  ((layout) == 2 && (mask) == 0 && !(deterministic) && !(fold))
SDPA_HOPPER_TRAIT int sdpa_hopper_longest_first(int layout, int mask, int deterministic,
                                                int fold, int batch) {
  return SDPA_HOPPER_LONGEST_FIRST(layout, mask, deterministic, fold) && batch >= 2 &&
         batch <= SDPA_HOPPER_ORDER_MAX_BATCH;
}

/* The last wave's split (the launch's p.tail_*). A grid of equal tiles
 * (one block a kv tile, no mask) on `sms` multiprocessors ends with its
 * last tiles % sms blocks running while the other SMs idle: ~3% of the
 * time at 15.5 waves (2048 tiles on 132 SMs: hd 128 at 16k tokens x 16
 * heads). Those last R = tiles % sms tiles may instead run as `parts`
 * blocks each, each over a share of the tile's query tiles, adding its
 * dK / dV in fp32 to the tile's slot of the workspace; the last of them
 * to finish stores the sum (sdpa_hopper.cuh, tail_merge). Where: the
 * narrow kernel's one-block-a-tile keys (not the persistent ones, not the
 * wide or transposed-dQ kernels), BSHD, no mask, not deterministic, dQ by
 * the convert kernel; the plan adds that its head chunks are 1. The
 * kernel tests the same expression with #if. */
#define SDPA_HOPPER_TAIL_COVERS(narrow, head_dim, layout, mask, deterministic, fold)            \
  ((narrow) && (layout) == 1 && (mask) == 0 && !(deterministic) && !(fold) &&                  \
   !SDPA_HOPPER_PERSISTENT_KERNEL(head_dim, layout, mask, deterministic))
SDPA_HOPPER_TRAIT int sdpa_hopper_tail_covers(int head_dim, int layout, int mask,
                                              int deterministic, int fold) {
  return SDPA_HOPPER_TAIL_COVERS(head_dim <= SDPA_HOPPER_WIDE_ABOVE, head_dim, layout, mask,
                                 deterministic, fold);
}

/* Floats of a split tile's slot (tail_acc): the narrow kernel's 128 kv
 * rows of dK and dV. */
SDPA_HOPPER_TRAIT long long sdpa_hopper_tail_slot_floats(int head_dim, int head_dim_v) {
  return 128LL * (head_dim + head_dim_v);
}

/* Tiles the workspace's split slots are sized for at most (the tail's
 * tiles % sms: below the multiprocessors of any sm_90 part). */
#define SDPA_HOPPER_TAIL_MAX_TILES 160
/* A part's fixed cost in steps (the block's prologue: K and V, the first
 * stages; its epilogue: the fp32 adds of 128 KB at hd 128 and the last
 * part's reads). Measured (H100, hd 128, 2048 tiles on 132 SMs): at 2
 * the rule split S2k's 68 last tiles in 5 and gained nothing (528 TFLOP/s
 * either way), where 2 steps predicted +1.3%: ~4 steps a part; 6 leaves
 * the splits whose predicted gain survives twice that. */
#define SDPA_HOPPER_TAIL_PART_STEPS 6
#define SDPA_HOPPER_TAIL_MAX_PARTS 8

/* The parts each of the last tiles % sms tiles runs as (1: no split), for
 * `tiles` equal tiles of `steps` steps over `query_tiles` query tiles on
 * `sms` multiprocessors, at most `cap` split tiles: the count c in 2..8
 * (at most the query tiles) that minimizes the tail's time, ceil(R c /
 * sms) waves of a part (1 / c of a tile plus TAIL_PART_STEPS steps),
 * where it is below the one wave of whole tiles it replaces. */
SDPA_HOPPER_TRAIT int sdpa_hopper_tail_parts(long long tiles, int sms, int steps, int query_tiles,
                                             int cap) {
  if (sms <= 0 || tiles <= sms || steps <= 0) return 1;
  const long long r = tiles % sms;
  if (r == 0 || r > cap) return 1;
  int best = 1;
  double best_cost = 1.0;
  for (int c = 2; c <= SDPA_HOPPER_TAIL_MAX_PARTS && c <= query_tiles; ++c) {
    const long long waves = (r * c + sms - 1) / sms;
    const double cost = (double)waves * (1.0 / c + (double)SDPA_HOPPER_TAIL_PART_STEPS / steps);
    if (cost < best_cost - 1e-9) {
      best = c;
      best_cost = cost;
    }
  }
  return best;
}

#endif /* SDPA_HOPPER_TRAITS_H */
