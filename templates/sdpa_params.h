/*
 * sdpa_params.h - the launch parameter block shared by the host (execute.c)
 * and the kernels (compiled by NVRTC, which receives this file as a named
 * header). Plain C, fixed-width types only, so both compilers lay it out
 * identically. Passed by value to every kernel of the chain.
 *
 * Index conventions (elements, not bytes):
 *   BSHD  X[b, s, h, d]  at b*X_batch + s*X_seq + h*X_head + d
 *   THD   X[t, h, d]     at t*X_seq + h*X_head + d   (X_batch unused)
 *   LSE   BSHD [b,h,s] at b*lse_batch + h*lse_head + s*lse_seq;
 *         THD  [h,t]   at h*lse_head + t*lse_seq
 *   Workspace (fp32), row = token (BSHD: b*seqlen_q + s; THD: t):
 *         delta[h*rows + row]
 *         dq_accum in blocks of 16 query rows of one sequence, in the order
 *         of the m16n8 MMA accumulator fragments so that a warp's
 *         reductions cover contiguous bytes:
 *           [block][h][d / 8][frag], frag = lane*4 + e (sm_90+) or
 *           e*32 + lane (earlier), where row = 8*(e/2) + lane/4 and
 *           d % 8 = 2*(lane%4) + e%2 within the block's 16 x 8 piece.
 *         Sequence b's row s is in block base(b) + s/16, base(b) =
 *         b*q_blocks (BSHD) or cu_seqlens_q[b]/16 + b (THD): sequences
 *         never share a block. dq_blocks bounds the blocks in use:
 *         batch*q_blocks (BSHD), rows_q/16 + batch + 1 (THD).
 *   semaphores[(h*batch + b)*q_tiles + tile]: per query tile, the kv
 *         tiles done with it (when main writes dQ; in deterministic mode
 *         also the order they reduce in)
 *   dkv_accum[(row*heads_kv + hk)*(head_dim + head_dim_v) + c], row = kv
 *         token (BSHD: b*seqlen_kv + s; THD: t): dK times the scale in
 *         columns c < head_dim, dV after them, summed over the blocks a
 *         kv head's query heads are split over (head_chunks > 1)
 */
#ifndef SDPA_PARAMS_H
#define SDPA_PARAMS_H

#ifdef __CUDACC_RTC__
typedef long long sdpa_i64;
typedef int sdpa_i32;
#else
#include <stdint.h>
typedef int64_t sdpa_i64;
typedef int32_t sdpa_i32;
#endif

typedef struct sdpa_kernel_params {
  const void *q, *k, *v, *o, *dout;
  const float *lse;
  void *dq, *dk, *dv;
  float *dq_accum;
  float *delta;
  sdpa_i32 *semaphores;
  sdpa_i32 *error_flag; /* mapped host word; nonzero = bad device input */
  const sdpa_i32 *cu_seqlens_q, *cu_seqlens_kv;

  sdpa_i64 q_batch, q_seq, q_head;
  sdpa_i64 k_batch, k_seq, k_head;
  sdpa_i64 v_batch, v_seq, v_head;
  sdpa_i64 o_batch, o_seq, o_head;
  sdpa_i64 do_batch, do_seq, do_head;
  sdpa_i64 dq_batch, dq_seq, dq_head;
  sdpa_i64 dk_batch, dk_seq, dk_head;
  sdpa_i64 dv_batch, dv_seq, dv_head;
  sdpa_i64 lse_batch, lse_head, lse_seq;

  sdpa_i64 rows_q;   /* BSHD: batch*seqlen_q; THD: total_q          */
  sdpa_i64 rows_kv;  /* BSHD: batch*seqlen_kv; THD: total_kv        */
  sdpa_i64 dq_blocks; /* 16-row blocks of dq_accum in use (above)    */
  sdpa_i32 batch;    /* BSHD batch / THD sequences                  */
  sdpa_i32 heads_q, heads_kv, group; /* group = heads_q / heads_kv  */
  sdpa_i32 seqlen_q, seqlen_kv;      /* BSHD lengths / THD max_s    */
  sdpa_i32 q_tiles;  /* ceil(seqlen_q / Q_TILE)                     */
  sdpa_i32 q_blocks; /* ceil(seqlen_q / 16)                         */
  sdpa_i32 window_left, window_right; /* -1 unbounded               */
  sdpa_i32 order_group; /* masked launch order: (sequence, kv head)
                           pairs a group spans (sdpa_bwd.cuh)        */
  float scale;       /* softmax scale                               */
  float scale_log2;  /* scale * log2(e)                             */
  sdpa_i32 sm_count; /* multiprocessors of the device launched on, 0
                        if unknown (sm_90a deterministic plans without a
                        mask: whether a kv head's blocks fit at once,
                        sdpa_hopper.cuh's rotation)                  */
  /* the second copies of dq_accum and semaphores where the key has two
   * (sdpa_dq_copies), laid out as they are; else null */
  float *dq_accum_copy;
  sdpa_i32 *semaphores_copy;
  /* blocks a kv tile's group of query heads is split over (sm_90a, not
   * deterministic; sdpa_hopper_head_chunks): 1 (or 0) = one block runs
   * the whole group and stores dK / dV; more: each runs group /
   * head_chunks heads and adds its dK / dV to dkv_accum (above, else
   * null), which the convert kernel writes out */
  sdpa_i32 head_chunks;
  float *dkv_accum;
  /* the last wave's split (sdpa_hopper_traits.h, sdpa_hopper_tail_parts):
   * tail_parts > 1: the grid is one-dimensional, its first tail_first
   * blocks the tiles in order, then tail_tiles tiles of tail_parts blocks
   * each; tail_acc[slot][k][t] (slot = tile - tail_first, float4 k of
   * consumer thread t: its dK fragments, then dV's) sums their dK / dV,
   * tail_count[slot] their finished parts; both zeroed by the preprocess
   * kernel. Else 0 / null. */
  sdpa_i64 tail_first;
  sdpa_i32 tail_parts, tail_tiles;
  float *tail_acc;
  sdpa_i32 *tail_count;
  /* THD without a mask (sm_90a, sdpa_hopper_longest_first): seq_order[r]
   * is the sequence of the grid's r-th span of heads x kv tiles blocks,
   * the longest query sequence first (ties in index order), written by the
   * preprocess kernel from cu_seqlens_q; null: batch order. */
  sdpa_i32 *seq_order;
} sdpa_kernel_params;

/* Error flag bits (error_flag word). */
#define SDPA_DEVICE_ERR_SEQLEN_Q 1   /* a THD query length > max_s hint */
#define SDPA_DEVICE_ERR_SEQLEN_KV 2  /* a THD key length > max_s hint   */
#define SDPA_DEVICE_ERR_OFFSETS 4    /* cu_seqlens past the totals / not
                                        monotone                         */

#endif /* SDPA_PARAMS_H */
