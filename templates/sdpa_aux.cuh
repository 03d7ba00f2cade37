/*
 * sdpa_aux.cuh - the kernels around the main kernel, shared by every
 * family (they depend on the head dims, dtype, layout and mask only):
 *
 *   sdpa_bwd_preprocess  Delta[h, row] = sum_d dO*O; zero the fp32 dQ
 *                        accumulator (and the query tiles' counters when
 *                        main writes dQ or in deterministic mode, and
 *                        dkv_accum where there is one); THD: the
 *                        longest-first order where p.seq_order is set.
 *   sdpa_bwd_convert_dq  dQ = dtype(dQacc * scale), at full memory
 *                        bandwidth; where there is a dkv_accum (the query
 *                        heads split over blocks), dK and dV from it too.
 *
 * Launch contract (execute.c):
 *   preprocess: grid ceil(rows_q*heads_q / (256 / sdpa_aux_lanes(DV)))
 *               (at least 1), block 256, no smem; before main, which
 *               needs its zeroes and Delta.
 *   convert: grid q_blocks * batch * heads_q, block 256, no smem; with a
 *               dkv_accum, sdpa_dkv_convert_blocks(rows_kv, heads_kv, D,
 *               DV) blocks more.
 *
 * Reads the key defines SDPA_DTYPE, SDPA_HEAD_DIM, SDPA_HEAD_DIM_V,
 * SDPA_LAYOUT, SDPA_MASK, SDPA_DETERMINISTIC and SDPA_FOLD_DQ, and
 * SDPA_DQ_ACCUM_DIM when the family's dQ accumulator rows are wider than
 * head_dim (the mma.sync family's GEMM head dim: it reduces the padding
 * columns too, zeros, rather than test each piece; the host's
 * sdpa_dq_accum_dim() is the same value).
 */
#ifndef SDPA_AUX_CUH
#define SDPA_AUX_CUH

#include "sdpa_params.h"
#include "sdpa_mma.cuh"
#include "sdpa_seq.cuh"
#include "sdpa_traits.h"
#include "sdpa_hopper_traits.h" /* sdpa_hopper_tail_slot_floats */

#define D SDPA_HEAD_DIM
#define DV SDPA_HEAD_DIM_V
#define DT SDPA_DTYPE
#ifndef SDPA_DQ_ACCUM_DIM
#define SDPA_DQ_ACCUM_DIM SDPA_HEAD_DIM
#endif
#define DQA SDPA_DQ_ACCUM_DIM /* columns of a dQ accumulator row, >= D */
/* copies of the dQ accumulator and of the counters (sdpa_traits.h) */
#define DQ_COPIES sdpa_dq_copies(SDPA_FAMILY, SDPA_DETERMINISTIC, SDPA_MASK, SDPA_HEAD_DIM)

/* Copy c (0 or 1) of the dQ accumulator and of the query tiles' counters. */
SDPA_DEVICE float *dq_accum_of(const sdpa_kernel_params &p, int c) {
  return c ? p.dq_accum_copy : p.dq_accum;
}
SDPA_DEVICE sdpa_i32 *counters_of(const sdpa_kernel_params &p, int c) {
  return c ? p.semaphores_copy : p.semaphores;
}

/* ------------------------------------------------------------ preprocess */

/* Zeroes dQacc (a grid-stride sweep over its dq_blocks) and the query
 * tiles' counters (when used), every copy of each, dkv_accum and the
 * split tiles' slots and counts where there are; then PRE_LANES lanes
 * per (row, head), 8 elements (16 bytes of O and of dO) a lane:
 * Delta = sum(dO * O) over DV.
 * Row-major items (head fastest) keep a warp's loads contiguous in BSHD
 * memory. Any grid is correct (warps stride over the items together);
 * the host's sdpa_aux_blocks() gives every lane one item. */
#define PRE_LANES sdpa_aux_lanes(DV)
/* Zeroes n float4 at dst, thread gid of `threads` (a grid-stride sweep). */
SDPA_DEVICE void zero_f4(float *dst, sdpa_i64 n, sdpa_i64 gid, sdpa_i64 threads) {
  float4 *const acc = (float4 *)dst;
  for (sdpa_i64 i = gid; i < n; i += threads) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}
/* The longest-first launch order (sdpa_params.h, seq_order): sequence b
 * goes to the place the sequences before it in (query length descending,
 * index ascending) leave; every thread reads the same lengths, so the
 * places are a permutation whatever cu_seqlens_q holds (bad offsets
 * included: the main kernel reports those). */
SDPA_DEVICE void seq_place(const sdpa_kernel_params &p, int b) {
  const unsigned len = (unsigned)p.cu_seqlens_q[b + 1] - (unsigned)p.cu_seqlens_q[b];
  int place = 0;
  unsigned prev = (unsigned)p.cu_seqlens_q[0];
#pragma unroll 4
  for (int i = 0; i < p.batch; ++i) {
    const unsigned next = (unsigned)p.cu_seqlens_q[i + 1], l = next - prev;
    prev = next;
    place += (int)l > (int)len || (l == len && i < b);
  }
  p.seq_order[place] = b;
}
extern "C" __global__ void __launch_bounds__(SDPA_AUX_THREADS)
sdpa_bwd_preprocess(const sdpa_kernel_params p) {
  const sdpa_i64 gid = (sdpa_i64)blockIdx.x * blockDim.x + threadIdx.x;
  const sdpa_i64 threads = (sdpa_i64)gridDim.x * blockDim.x;
#if SDPA_LAYOUT == 2
  if (p.seq_order)
    for (sdpa_i64 b = gid; b < p.batch; b += threads) seq_place(p, (int)b);
#endif
  {
    const sdpa_i64 n = p.dq_blocks * p.heads_q * (DQA * 4); /* 16 x DQA floats a block */
    const sdpa_i64 tiles = (sdpa_i64)p.heads_q * p.batch * p.q_tiles;
#pragma unroll 1
    for (int c = 0; c < DQ_COPIES; ++c) {
      zero_f4(dq_accum_of(p, c), n, gid, threads);
      if (SDPA_FOLD_DQ || SDPA_DETERMINISTIC) {
        sdpa_i32 *sem = counters_of(p, c);
        for (sdpa_i64 i = gid; i < tiles; i += threads) sem[i] = 0;
      }
    }
    if (p.tail_parts > 1) { /* the split tiles' slots and their counts */
      zero_f4(p.tail_acc, p.tail_tiles * sdpa_hopper_tail_slot_floats(D, DV) / 4, gid, threads);
      for (sdpa_i64 i = gid; i < p.tail_tiles; i += threads) p.tail_count[i] = 0;
    }
    if (p.dkv_accum) zero_f4(p.dkv_accum, p.rows_kv * p.heads_kv * ((D + DV) / 4), gid, threads);
  }
  const int lane = threadIdx.x & 31, part = lane % PRE_LANES;
  const sdpa_i64 items = p.rows_q * p.heads_q;
  const bool narrow = items <= 0xffffffffll; /* 32-bit divisions suffice */
  /* base is the warp's first item: the loop is warp-uniform, so every
   * lane takes part in the shuffles. */
  for (sdpa_i64 base = (gid - lane) / PRE_LANES; base < items; base += threads / PRE_LANES) {
    const sdpa_i64 item = base + lane / PRE_LANES;
    float sum = 0.f;
    sdpa_i64 row = 0;
    int h = 0;
    if (item < items) {
      if (narrow) {
        const unsigned r = (unsigned)item / (unsigned)p.heads_q;
        row = r;
        h = (int)((unsigned)item - r * (unsigned)p.heads_q);
      } else {
        row = item / p.heads_q;
        h = (int)(item - row * p.heads_q);
      }
#if SDPA_LAYOUT == 1
      const sdpa_i64 bb = narrow ? (sdpa_i64)((unsigned)row / (unsigned)p.seqlen_q)
                                 : row / p.seqlen_q;
      const sdpa_i64 s = row - bb * p.seqlen_q;
      const sdpa_i64 o_at = bb * p.o_batch + s * p.o_seq + h * p.o_head;
      const sdpa_i64 do_at = bb * p.do_batch + s * p.do_seq + h * p.do_head;
#else
      const sdpa_i64 o_at = row * p.o_seq + h * p.o_head;
      const sdpa_i64 do_at = row * p.do_seq + h * p.do_head;
#endif
      if (part * 8 < DV) {
        const uint4 ov = *(const uint4 *)((const u16 *)p.o + o_at + part * 8);
        const uint4 dv = *(const uint4 *)((const u16 *)p.dout + do_at + part * 8);
        const u32 o4[4] = {ov.x, ov.y, ov.z, ov.w}, d4[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sum += to_float<DT>((u16)(o4[e] & 0xffff)) * to_float<DT>((u16)(d4[e] & 0xffff));
          sum += to_float<DT>((u16)(o4[e] >> 16)) * to_float<DT>((u16)(d4[e] >> 16));
        }
      }
    }
#pragma unroll
    for (int s2 = PRE_LANES / 2; s2 > 0; s2 >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s2);
    if (part == 0 && item < items) p.delta[(sdpa_i64)h * p.rows_q + row] = sum;
  }
}

/* --------------------------------------------------------------- convert */

/* Row 0 of head h's dQ in sequence b (first query token q0), and whether
 * its rows take 16-byte stores. */
SDPA_DEVICE u16 *dq_head_rows(const sdpa_kernel_params &p, int b, sdpa_i64 q0, int h) {
#if SDPA_LAYOUT == 1
  (void)q0;
  return (u16 *)p.dq + (sdpa_i64)b * p.dq_batch + (sdpa_i64)h * p.dq_head;
#else
  (void)b;
  return (u16 *)p.dq + q0 * p.dq_seq + (sdpa_i64)h * p.dq_head;
#endif
}
SDPA_DEVICE bool dq_rows_wide(const u16 *dq, sdpa_i64 dq_seq) {
  return ((unsigned long long)dq & 15) == 0 && (dq_seq & 7) == 0;
}

/* Writes one lane's share of a 16 x 8 piece of dQ: the four accumulator
 * values `v` of fragment lane `lane` (sdpa_params.h order) times `scale`,
 * at rows r0 + lane/4 and r0 + lane/4 + 8 (those below sq) and columns
 * piece*8 + 2*(lane%4) and the next. */
SDPA_DEVICE void store_dq_piece(u16 *dq, sdpa_i64 dq_seq, int r0, int piece, int lane,
                                const float (&v)[4], int sq, float scale) {
  const int col = piece * 8 + 2 * (lane & 3);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = r0 + (lane >> 2) + 8 * hf;
    if (row < sq)
      *(u32 *)(dq + (sdpa_i64)row * dq_seq + col) =
          pack2<DT>(v[2 * hf] * scale, v[2 * hf + 1] * scale);
  }
}

#if __CUDA_ARCH__ >= 900
/* Float4 k of src, plus (DQ_COPIES 2) float4 k of copy 1's `copy`, the same place. */
SDPA_DEVICE float4 dq_sum4(const float *src, const float *copy, int k) {
  float4 v = ((const float4 *)src)[k];
  if (DQ_COPIES > 1) {
    const float4 u = ((const float4 *)copy)[k];
    v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
  }
  return v;
}

/* Rows rr and rr + 8 of the 16-row block at src (rows from r0),
 * columns 8 pc .. 8 pc + 7, from the 64 contiguous bytes that fragment
 * lanes 4 rr .. 4 rr + 3 of piece pc hold (lane 4 rr + c: row rr, columns
 * 2c and 2c + 1, then row rr + 8, the same columns), each row as one
 * 16-byte store; with two copies, their sum. */
SDPA_DEVICE void store_dq_rows(u16 *dq, sdpa_i64 dq_seq, int r0, int rr, int pc,
                               const float *src, const float *copy, int sq, float scale) {
  const int at = pc * 128 + rr * 16;
  const float4 a = dq_sum4(src + at, copy + at, 0), b = dq_sum4(src + at, copy + at, 1),
               c = dq_sum4(src + at, copy + at, 2), d = dq_sum4(src + at, copy + at, 3);
  if (r0 + rr < sq)
    *(uint4 *)(dq + (sdpa_i64)(r0 + rr) * dq_seq + pc * 8) =
        make_uint4(pack2<DT>(a.x * scale, a.y * scale), pack2<DT>(b.x * scale, b.y * scale),
                   pack2<DT>(c.x * scale, c.y * scale), pack2<DT>(d.x * scale, d.y * scale));
  if (r0 + rr + 8 < sq)
    *(uint4 *)(dq + (sdpa_i64)(r0 + rr + 8) * dq_seq + pc * 8) =
        make_uint4(pack2<DT>(a.z * scale, a.w * scale), pack2<DT>(b.z * scale, b.w * scale),
                   pack2<DT>(c.z * scale, c.w * scale), pack2<DT>(d.z * scale, d.w * scale));
}
#endif

/* dK and dV from dkv_accum (sdpa_params.h; dK's scale already applied):
 * 8 columns (two float4, one 16-byte store) a thread, `block` numbering
 * the convert kernel's blocks past its dQ ones. The kv rows' 16-byte
 * alignment is the sm_90a family's (its epilogue stores them so). */
SDPA_DEVICE void convert_dkv(const sdpa_kernel_params &p, sdpa_i64 block) {
  constexpr int PARTS = (D + DV) / 8;
  const sdpa_i64 x = block * SDPA_AUX_THREADS + threadIdx.x;
  const sdpa_i64 item = x / PARTS; /* (kv token, kv head) */
  if (item >= p.rows_kv * p.heads_kv) return;
  const int col = (int)(x - item * PARTS) * 8, hk = (int)(item % p.heads_kv);
  const sdpa_i64 t = item / p.heads_kv;
  const float4 a = *(const float4 *)(p.dkv_accum + x * 8),
               b = *(const float4 *)(p.dkv_accum + x * 8 + 4);
  const uint4 v = make_uint4(pack2<DT>(a.x, a.y), pack2<DT>(a.z, a.w), pack2<DT>(b.x, b.y),
                             pack2<DT>(b.z, b.w));
  const bool k = col < D;
#if SDPA_LAYOUT == 1
  const sdpa_i64 bb = t / p.seqlen_kv, s = t - bb * p.seqlen_kv;
  const sdpa_i64 at = k ? bb * p.dk_batch + s * p.dk_seq + hk * p.dk_head + col
                        : bb * p.dv_batch + s * p.dv_seq + hk * p.dv_head + (col - D);
#else
  const sdpa_i64 at =
      k ? t * p.dk_seq + hk * p.dk_head + col : t * p.dv_seq + hk * p.dv_head + (col - D);
#endif
  *(uint4 *)((u16 *)(k ? p.dk : p.dv) + at) = v;
}

/* One CTA per (16-row block of a sequence, head), grid.x = q_blocks *
 * batch * heads_q: dq = dtype(dQacc * scale) (dQacc: the copies' sum),
 * reading the block's fragment-ordered pieces. sm_90: where dQ's rows are 16-byte aligned,
 * a thread a pair of rows of one piece (store_dq_rows: 64 bytes read, two
 * 16-byte stores; consecutive threads on consecutive pieces of a row);
 * else one 16 x 8 piece per 32 threads, a 4-byte store each. */
extern "C" __global__ void __launch_bounds__(SDPA_AUX_THREADS)
sdpa_bwd_convert_dq(const sdpa_kernel_params p) {
  sdpa_i64 x = blockIdx.x;
  const sdpa_i64 dq_part = (sdpa_i64)p.q_blocks * p.batch * p.heads_q;
  if (x >= dq_part) {
    if (p.dkv_accum) convert_dkv(p, x - dq_part);
    return;
  }
  const int h = (int)(x % p.heads_q);
  x /= p.heads_q;
  const int blk = (int)(x % p.q_blocks), b = (int)(x / p.q_blocks);
  sdpa_i64 q0, kv0;
  int sq, skv;
  if (!sequence_bounds(p, b, q0, kv0, sq, skv, false)) return; /* main flags it */
  const int r0 = blk * 16;
  if (r0 >= sq) return;
  const sdpa_i64 at = ((dq_block_base(p, b, q0) + blk) * p.heads_q + h) * (sdpa_i64)(DQA * 16);
  const float *src = p.dq_accum + at;
#if __CUDA_ARCH__ >= 900
  const float *copy = dq_accum_of(p, DQ_COPIES - 1) + at; /* read only with two */
#else
  static_assert(DQ_COPIES == 1, "sm_80-class: the mma.sync family, one copy");
#endif
  u16 *dq = dq_head_rows(p, b, q0, h);
#if __CUDA_ARCH__ >= 900
  if (dq_rows_wide(dq, p.dq_seq)) {
    for (int i = threadIdx.x; i < D; i += blockDim.x) /* 8 row pairs x D / 8 pieces */
      store_dq_rows(dq, p.dq_seq, r0, i / (D / 8), i % (D / 8), src, copy, sq, p.scale);
    return;
  }
#endif
  for (int i = threadIdx.x; i < D * 4; i += blockDim.x) {
    const int piece = i >> 5, lane = i & 31;
    float v[4];
#if __CUDA_ARCH__ >= 900
    const float4 f = dq_sum4(src + piece * 128 + lane * 4, copy + piece * 128 + lane * 4, 0);
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
#else
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = src[piece * 128 + frag_at(lane, e)];
#endif
    store_dq_piece(dq, p.dq_seq, r0, piece, lane, v, sq, p.scale);
  }
}

#endif /* SDPA_AUX_CUH */
