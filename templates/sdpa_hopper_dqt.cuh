/*
 * sdpa_hopper_dqt.cuh - the transposed-dQ kernel's dQ (sdpa_hopper_dqt,
 * sdpa_hopper_traits.h): the narrow kernel's consume() with 32 query rows
 * a step, where dQ = dS K would be a GEMM of M = 32 rows, below wgmma's
 * 64. Included by sdpa_hopper.cuh before consume() (for every narrow
 * kernel: consume's branches name them), which calls these where HOP_DQT:
 *
 *   dqt_store_ds  the consumer's dS^T fragments stored transposed
 *                 (stmatrix .trans) into the dS tile [32 query rows][128
 *                 kv columns]: two 128-byte-swizzled boxes of 64 kv
 *                 columns, BOX_Q apart
 *   dqt_gemm      dQ^T = K^T dS^T for this consumer's NQ head-dim rows
 *                 from d_off, once both consumers' dS rows are in: one
 *                 m64n32 GEMM a 64-row chunk, A = the K tile (MN-major:
 *                 its kv rows are k), B = the dS tile (K-major)
 *   dqt_stage     the accumulators transposed back (movmatrix, each 8 x 8
 *                 block of fp32 as its two 16-bit halves) and staged in
 *                 dq_accum's fragment order, so that the bulk adds and the
 *                 convert kernel are the narrow kernel's
 *   dqt_send      one bulk reduce-add per (16-row block of the step, 64-row
 *                 chunk): the warp's 16 head-dim columns of 16 query rows,
 *                 1 KB (with SDPA_FOLD_DQ the step's adds one bulk group)
 *
 * A thread's chunk accumulators (warp wi, lane = 4 g + t):
 *   dq[c][4 j + 2 hh + e] = dQ^T[d_off + 64 c + 16 wi + 8 hh + g][8 j + 2 t + e]
 * and after the transposition
 *   dq[c][4 j + 2 hh + e] = dQ[8 j + g][d_off + 64 c + 16 wi + 8 hh + 2 t + e],
 * which is lane (g, t)'s share of fragment (d_off + 64 c + 16 wi) / 8 + hh
 * of the step's 16-row block j / 2 (rows g, g + 8 for j even, odd).
 */
static_assert(!HOP_DQT || (HOP_M == 32 && HOP_N == 64 * SDPA_HOPPER_CONSUMERS && D % 64 == 0 &&
                           SDPA_HOPPER_DQ_BULK && !SDPA_DETERMINISTIC),
              "the transposed-dQ kernel: 32 query rows, 128 kv rows, bulk dQ adds");
static_assert(!HOP_DQT || (2 * BOX_Q <= DS_TILE_BYTES && DQ_N0 % 64 == 0 && DQ_N1 % 64 == 0),
              "the dS tile's two boxes fit its buffer; dQ^T's chunks of 64 rows");

/* df[kk]: the A fragments of dS^T, kv rows 64 cw + 16 wi .. + 15, query
 * columns 16 kk .. + 15. stmatrix .trans writes matrix m's columns as
 * rows: lane l addresses query row 16 kk + 8 (m >> 1) + l % 8 of matrix
 * m = l / 8, whose 8 kv columns start at 8-column chunk 2 wi + (m & 1) of
 * box cw. */
SDPA_DEVICE void dqt_store_ds(u32 s_ds, const u32 (&df)[HOP_M / 16][4], int cw, int wi,
                              int lane) {
  const int mq = lane >> 3, mi = lane & 7, c8 = 2 * wi + (mq & 1);
#pragma unroll
  for (int kk = 0; kk < HOP_M / 16; ++kk) {
    const int q = 16 * kk + 8 * (mq >> 1) + mi;
    stmatrix_x4<true>(s_ds + cw * BOX_Q + q * 128 + ((c8 ^ mi) << 4), df[kk]);
  }
}

/* dq[c] = dQ^T rows d_off + 64 c .. + 63 (all 32 query columns), k = the
 * 128 kv rows, for c < chunks (chunks <= c: chunk 0's again, dropped,
 * SDPA_HOPPER_DQT_ONE); one commit group once both consumers' dS rows are
 * in (named barrier 1). */
template <int NQ>
SDPA_DEVICE void dqt_meet_gemm(float (&dq)[NQ / 64][HOP_M / 2], u32 s_ds, u32 s_k,
                               int d_off, int chunks) {
  named_barrier_sync_unaligned(1, CONSUMER_THREADS);
  wgmma_fence();
#pragma unroll
  for (int c = 0; c < NQ / 64; ++c) {
    const SmemDescs<BOX_KV, 1024> da(s_k + (d_off / 64 + (c < chunks ? c : 0)) * BOX_KV);
    const SmemDescs<16, 1024> db(s_ds);
#pragma unroll
    for (int kk = 0; kk < HOP_N / 16; ++kk)
      wgmma_ss<HOP_M, 1, 0>(dq[c], da.at(kk * 2048), db.at((kk / 4) * BOX_Q, (kk % 4) * 32),
                            kk > 0);
  }
  wgmma_commit();
}

SDPA_DEVICE u32 movmatrix_trans(u32 x) {
  u32 y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

/* An 8 x 8 block of fp32 over the warp, lane (g, t) holding row g,
 * columns 2 t and 2 t + 1 in a and b, transposed in place: the low 16
 * bits of each element as one 16-bit matrix, the high as another. */
SDPA_DEVICE void transpose_pair(float &a, float &b) {
  const u32 x = __float_as_uint(a), y = __float_as_uint(b);
  const u32 lo = movmatrix_trans(__byte_perm(x, y, 0x5410));
  const u32 hi = movmatrix_trans(__byte_perm(x, y, 0x7632));
  a = __uint_as_float(__byte_perm(lo, hi, 0x5410));
  b = __uint_as_float(__byte_perm(lo, hi, 0x7632));
}

/* Step st's dQ^T of this warp (its first `chunks`), transposed and staged
 * (once the unit has read the previous step's); returns the target of
 * block 0's first chunk in dq_accum (query tile from row i0, head h), and
 * in `blocks` how many of the step's 16-row blocks hold rows of the
 * sequence. */
template <int NQ>
SDPA_DEVICE float *dqt_stage(const Work &w, u32 base, int st, int i0, int h, int wi, int d_off,
                             float (&dq)[NQ / 64][HOP_M / 2], float *const dq_first,
                             sdpa_i64 blk_elems, int &blocks, int chunks) {
  const int lane = threadIdx.x & 31;
  blocks = SDPA_EVEN ? HOP_M / 16 : min(HOP_M / 16, (w.sq - i0 + 15) / 16);
  if (SDPA_HOPPER_ABLATE != 4) bulk_wait_read();
  __syncwarp();
#pragma unroll
  for (int c = 0; c < NQ / 64; ++c) {
    if (c >= chunks) break;
#pragma unroll
    for (int j = 0; j < HOP_M / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) transpose_pair(dq[c][4 * j + 2 * hh], dq[c][4 * j + 2 * hh + 1]);
#pragma unroll
    for (int rb = 0; rb < HOP_M / 16; ++rb)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        st_shared_v4(dq_slice(base, st, rb, d_off + 64 * c + 16 * wi + 8 * hh) + lane * 16,
                     dq[c][8 * rb + 2 * hh], dq[c][8 * rb + 2 * hh + 1],
                     dq[c][8 * rb + 4 + 2 * hh], dq[c][8 * rb + 5 + 2 * hh]);
  }
  return dq_first + (sdpa_i64)(i0 / 16) * blk_elems + (sdpa_i64)h * (D * 16);
}

/* The staged step made visible to the bulk-copy unit and added: per
 * chunk (the first `chunks`) and block, the warp's two fragments (16
 * columns, 1 KB). */
template <int NQ>
SDPA_DEVICE void dqt_send(u32 base, int st, int wi, int d_off, float *const dqa, int blocks,
                          sdpa_i64 blk_elems, int chunks) {
  if (!dqa || SDPA_HOPPER_ABLATE == 3) return;
  fence_proxy_async();
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int c = 0; c < NQ / 64; ++c)
#pragma unroll
      for (int rb = 0; rb < HOP_M / 16; ++rb)
        if (rb < blocks && c < chunks)
          bulk_reduce_add_f32<!SDPA_FOLD_DQ>(dqa + rb * blk_elems + c * (64 / 8) * 128,
                                             dq_slice(base, st, rb, d_off + 64 * c + 16 * wi),
                                             2 * 128 * 4);
    if (SDPA_FOLD_DQ) bulk_commit(); /* the step's adds one group (fold_report_step) */
  }
}
