/*
 * sdpa_hopper_wide.cuh - the sm_90a family's consumers above head_dim 128
 * (sdpa_hopper_wide): included by sdpa_hopper.cuh, whose producer, dQ
 * GEMM, masking and launch contract it shares.
 *
 * At head_dim 256 one consumer's 64 kv rows of dK and dV alone would take
 * 256 registers a thread. Here the CTA owns one 64-row kv tile (HOP_N =
 * 64), and the two consumer warpgroups split its head-dim columns instead
 * of its rows (sdpa_hopper_split: [0, 128) and [128, D) for D and for
 * DV), so that each holds 64 x (its share) of dK and of dV. Per step
 * (query tile of HOP_M = 64 rows), consumer CW:
 *   S^T, dP^T   for its half of the query columns, QH = 32 of them:
 *               wgmma SS, M = the 64 kv rows, N = 32, K = D (DV); S^T
 *               RS, K's fragments in registers, where head_dim_v <= 128
 *               leaves the room (sdpa_hopper_wide_k_regs); above
 *               head_dim 192 without it, split by operand instead
 *               (SDP_SPLIT below)
 *   P^T, dS^T   exp2, masks and dS as in consume(), stored by stmatrix
 *               into the P^T and dS^T tiles (kv rows x the 64 query
 *               columns, one 128-byte box a row), then both consumers
 *               meet on the buffer's mbarrier: each needs the other's half
 *   dV[:, its columns] += P^T dO    wgmma SS (P^T K-major, dO MN-major)
 *   dK[:, its columns] += dS^T Q    the same with dS^T and Q
 *   dQ[:, its columns]  = dS K      dq_gemm, into dq_accum by dq_out: bulk
 *               reduce-adds from the staging up to head_dim 192, handed
 *               to the dQ writer when deterministic (above 192 too: the
 *               staging in the room of a second Q / dO stage,
 *               sdpa_hopper_stages); above 192 otherwise one
 *               red.global.add.v4.f32 per fragment
 * P^T and dS^T are double-buffered by step parity: a consumer writes step
 * st + 1's only after step st's meeting, which both reached after their
 * GEMMs of step st - 1 (the last readers of that buffer) completed; a
 * buffer's mbarrier completes a phase a use, so a consumer waits for
 * parity (st / 2) & 1.
 */

/* The consumers' shares of the head-dim columns: dK and dQ as the traits
 * split dQ (sdpa_hopper_dq_col0 / _dq_cols), dV at sdpa_hopper_split(DV). */
#define WIDE_V1 sdpa_hopper_split(DV) /* dV: [0, WIDE_V1), [WIDE_V1, DV) */
static_assert(HOP_WIDE && HOP_N == 64 && HOP_M == 64,
              "the wide kernel: one 64-row kv tile, 64 query rows a step");
static_assert(sdpa_hopper_dq_cols(HOP_CFG, 1) > 0 && WIDE_V1 < DV && WIDE_V1 % 64 == 0,
              "both consumers own columns of dK, dV and dQ, from a box");
#define P_TILE_BYTES DS_TILE_BYTES

/* S^T = K Q^T with K's A fragments in registers (wgmma RS, loaded by
 * ldmatrix once a block) where consumer 0 has the room
 * (sdpa_hopper_wide_k_regs); otherwise each consumer reads all of K
 * every step for its 32 query columns. The define is for measurement
 * (bench_hopper --define). */
#ifndef SDPA_HOPPER_WIDE_K_REGS
#define SDPA_HOPPER_WIDE_K_REGS sdpa_hopper_wide_k_regs(D, DV)
#endif
constexpr bool WIDE_K_REGS = SDPA_HOPPER_WIDE_K_REGS;

/* 1 (the default): the dQ GEMM goes first, and its adds (or its staging
 * and bulk send) run under the dV and dK GEMMs: with the staging, dQ, dV,
 * dK; without it (head_dim > 192, dQ in two parts), part 1, dV, part 2,
 * dK, each part's adds under the GEMM after it (hd 256: +5 to +7%,
 * bench/HOPPER-NOTES.md). 0, for measurement (bench_hopper --define): dV,
 * dK, then dQ (part 1, its adds, part 2, its adds). */
#ifndef SDPA_HOPPER_WIDE_DQ_INTERLEAVE
#define SDPA_HOPPER_WIDE_DQ_INTERLEAVE 1
#endif
static_assert(!HOP_SPLIT_DO || (SDPA_HOPPER_WIDE_DQ_INTERLEAVE && D > SDPA_HOPPER_STAGING_MAX),
              "a one-stage ring: dQ in two parts a consumer, dK's GEMM before dV's");

/* 1: S^T and dP^T split by operand instead of by query columns: consumer
 * 0 computes S^T = K Q^T and P^T for all 64 query columns, consumer 1
 * dP^T = V dO^T and dS^T (wgmma N = 64 instead of two N = 32 GEMMs
 * each: a step reads K and V once instead of twice, 64 KB less of
 * shared memory at hd 256), the fp32 P^T handed over through the step's
 * dS^T and P^T buffers before they take the packed tiles (16 KB, the
 * exchange: chunk j of a thread's accumulators at wide_exchange(j) +
 * 16 x its index in the warpgroup). Where K's fragments stay in
 * registers (consumer 0's S^T RS) it does not apply. Measured on an H100
 * at hd 256 S8k: +1.3 to +4.2% full, +1.6 to +1.9% causal, bench_hopper's
 * 38 checks pass, racecheck / synccheck clean on two of them
 * (bench/HOPPER-NOTES.md, thirteenth session). On above head_dim 192:
 * +4 to +6% at 256 S8k with test_gpu_bwd passing, while 160 moved -1 to
 * +2% and 192 -0.5 to -2.5% (fourteenth session); 0 or 1 for measurement
 * (bench_hopper --define SDPA_HOPPER_WIDE_SDP_SPLIT=0). */
#ifndef SDPA_HOPPER_WIDE_SDP_SPLIT
#define SDPA_HOPPER_WIDE_SDP_SPLIT (D > 192)
#endif
constexpr bool SDP_SPLIT = SDPA_HOPPER_WIDE_SDP_SPLIT && !WIDE_K_REGS;
/* Named barriers of the hand-off (1 is the consumers' own): P^T in the
 * exchange (consumer 0 arrives, 1 waits); the exchange read (both). */
#define WIDE_BAR_P_IN 2
#define WIDE_BAR_P_READ 3
/* Chunk j (of HOP_M / 8) of the exchange: 0-3 in the dS^T buffer, 4-7 in
 * the P^T buffer (2 KB each: 128 threads x 16 bytes). */
SDPA_DEVICE u32 wide_exchange(u32 s_ds, u32 s_p, int j) {
  return (j < 4 ? s_ds : s_p) + (j % 4) * 2048;
}
static_assert(!SDPA_HOPPER_WIDE_SDP_SPLIT || (HOP_M == 64 && DS_TILE_BYTES >= 8192 &&
                                              P_TILE_BYTES >= 8192),
              "the exchange: 16 KB in the step's dS^T and P^T buffers");

/* acc += A B over the step's 64 query columns (k): A the P^T or dS^T
 * tile (K-major, kv rows x query columns), B the dO or Q box of this
 * consumer's columns (MN-major); one commit group. */
template <int N>
SDPA_DEVICE void wide_acc_gemm(float (&acc)[N / 2], u32 a, u32 b) {
  const SmemDescs<16, 1024> da(a);
  const SmemDescs<BOX_Q, 1024> db(b);
#pragma unroll
  for (int kk = 0; kk < HOP_M / 16; ++kk)
    wgmma_ss<N, 0, 1>(acc, da.at(kk * 32), db.at(kk * 2048), 1);
  wgmma_commit();
}

template <int CW>
SDPA_DEVICE void consume_wide(const sdpa_kernel_params &p, const Work &w, u32 base,
                              const unsigned char *smem) {
  constexpr int K0 = sdpa_hopper_dq_col0(HOP_CFG, CW), NK = sdpa_hopper_dq_cols(HOP_CFG, CW);
  constexpr int V0 = CW == 0 ? 0 : WIDE_V1, NV = CW == 0 ? WIDE_V1 : DV - WIDE_V1;
  constexpr int QH = HOP_M / 2, Q0 = CW * QH; /* this consumer's query columns of S^T */
  const int wi = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = 16 * wi + g; /* kv row of e = 0, 1 */

  float acc_dk[NK / 2], acc_dv[NV / 2];
#pragma unroll
  for (int i = 0; i < NK / 2; ++i) acc_dk[i] = 0.f;
#pragma unroll
  for (int i = 0; i < NV / 2; ++i) acc_dv[i] = 0.f;

  const u32 s_k = base + SMEM_K, s_v = base + SMEM_V;
  const bool kv_partial = !SDPA_EVEN && w.k0 + HOP_N > w.skv;
  const float scale_log2 = p.scale_log2;
  const sdpa_i64 blk_elems = (sdpa_i64)p.heads_q * (D * 16);
  /* this thread's first reduction target: query rows 16 wi of tile 0,
   * head 0, column K0 */
  float *const dq_first =
      p.dq_accum + (dq_block_base(p, w.b, w.q0) + wi) * blk_elems + (K0 / 8) * 128;

  /* K and V both (a wait between the S^T and dP^T GEMMs below makes
   * ptxas fence them, C7519) */
  if (w.steps > 0) {
    mbar_wait(base + BAR_K, 0);
    mbar_wait(base + BAR_V, 0);
  }
  /* K's A fragments of the S^T GEMM (wgmma_rs; the m16n8k16 A layout a
   * warp: rows 16 wi.., ldmatrix x4 of the swizzled boxes as stmatrix
   * writes them below). */
  u32 kf[WIDE_K_REGS ? D_STEPS : 1][4];
  if constexpr (WIDE_K_REGS) {
    const int r = 16 * wi + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < D_STEPS; ++kk) {
      const int c = (kk % 4) * 2 + (lane >> 4); /* 8-column chunk of box kk / 4 */
      ldsm_x4(s_k + (kk / 4) * BOX_KV + r * 128 + ((c ^ (r & 7)) << 4), kf[kk][0], kf[kk][1],
              kf[kk][2], kf[kk][3]);
    }
  }
  int h = w.h_first, it = w.it_first, stage = 0, buf = 0;
  u32 phase = 0;
#pragma unroll 1
  for (int st = 0; st < w.steps; ++st) {
    const int i0 = it * HOP_M;
    mbar_wait(base + BAR_FULL(stage), phase);
    /* One stage (sdpa_hopper_stages): the Q and dO addresses would be
     * loop-invariant, and ptxas would hold every GEMM's descriptors of
     * them across the loop (spills); an opaque stage keeps them derived
     * where used, as with two stages. */
    int ring = stage;
    if (HOP_STAGES == 1) asm volatile("" : "+r"(ring));
    const u32 s_q = base + SMEM_Q + ring * Q_TILE_BYTES;
    const u32 s_do = base + SMEM_DO + ring * DO_TILE_BYTES;
    const u32 s_ds = base + SMEM_DS + buf * DS_TILE_BYTES;
    const u32 s_p = base + SMEM_P + buf * P_TILE_BYTES;

    if constexpr (!SDP_SPLIT) {
      /* ---- S^T = K Q^T, dP^T = V dO^T: all 64 kv rows, query columns
       * [Q0, Q0 + QH) (rows Q0.. of the Q and dO tiles: Q0 * 128 bytes on). */
      float s[QH / 2], dp[QH / 2];
      wgmma_fence();
      if constexpr (WIDE_K_REGS) {
#pragma unroll
        for (int kk = 0; kk < D_STEPS; ++kk)
          wgmma_rs<QH, 0>(s, kf[kk],
                          gmma_desc(s_q + Q0 * 128 + (kk / 4) * BOX_Q + (kk % 4) * 32, 16, 1024),
                          kk > 0);
      } else {
        rows_gemm<QH, D_STEPS>(s, s_k, s_q + Q0 * 128);
      }
      wgmma_commit();
      if (HOP_SPLIT_DO) { /* dO in after Q; the fence ptxas would add after the wait (C7519) */
        mbar_wait(base + BAR_DO_FULL, phase);
        wgmma_fence();
      }
      rows_gemm<QH, DV_STEPS>(dp, s_v, s_do + Q0 * 128);
      wgmma_commit();

      /* ---- P^T and dS^T of these columns, packed as 16x16 fragments. */
      wgmma_wait<1>();
      reg_fence(s);
      u32 pf[QH / 16][4], df[QH / 16][4];
      {
        const float *l2s = (const float *)(smem + SMEM_LSE) + stage * HOP_M + Q0;
        const float *dls = (const float *)(smem + SMEM_DELTA) + stage * HOP_M + Q0;
        exp_probs<QH>(s, l2s, t, scale_log2);
        const bool band = band_crosses(w, it);
        if (band || kv_partial) mask_probs<QH>(s, w, row0, t, i0 + Q0, band);
        pack_probs<QH>(pf, s);
        wgmma_wait<0>();
        reg_fence(dp);
        ds_frags<QH>(df, s, dp, dls, t); /* from the fp32 P */
      }

      /* ---- P^T and dS^T to shared memory (kv rows x query columns, one
       * swizzled 128-byte row a kv row; stmatrix as in consume()). */
      {
        const int mq = lane >> 3, mi = lane & 7;
        const int r = 16 * wi + mi + 8 * (mq & 1);
#pragma unroll
        for (int kk = 0; kk < QH / 16; ++kk) {
          const int c = Q0 / 8 + 2 * kk + (mq >> 1); /* 8-column chunk */
          const u32 off = r * 128 + (((c % 8) ^ mi) << 4);
          stmatrix_x4(s_p + off, pf[kk]);
          stmatrix_x4(s_ds + off, df[kk]);
        }
      }
    } else {
      /* ---- S^T (consumer 0) or dP^T (consumer 1) over all 64 query
       * columns; P^T to consumer 1 through the exchange, then P^T and
       * dS^T to shared memory (one 16x16 fragment pair per kk). */
      float acc[HOP_M / 2];
      wgmma_fence();
      if constexpr (CW == 0) {
        rows_gemm<HOP_M, D_STEPS>(acc, s_k, s_q);
      } else {
        if (HOP_SPLIT_DO) {
          mbar_wait(base + BAR_DO_FULL, phase);
          wgmma_fence();
        }
        rows_gemm<HOP_M, DV_STEPS>(acc, s_v, s_do);
      }
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(acc);
      const int mq = lane >> 3, mi = lane & 7;
      const int r = 16 * wi + mi + 8 * (mq & 1);
      const int xt = (threadIdx.x & 127) * 16;
      u32 fr[HOP_M / 16][4];
      if constexpr (CW == 0) {
        const float *l2s = (const float *)(smem + SMEM_LSE) + stage * HOP_M;
        exp_probs<HOP_M>(acc, l2s, t, scale_log2);
        const bool band = band_crosses(w, it);
        if (band || kv_partial) mask_probs<HOP_M>(acc, w, row0, t, i0, band);
#pragma unroll
        for (int j = 0; j < HOP_M / 8; ++j)
          st_shared_v4(wide_exchange(s_ds, s_p, j) + xt, acc[4 * j], acc[4 * j + 1],
                       acc[4 * j + 2], acc[4 * j + 3]);
        named_barrier_arrive_unaligned(WIDE_BAR_P_IN, CONSUMER_THREADS);
        pack_probs<HOP_M>(fr, acc);
      } else {
        const float *dls = (const float *)(smem + SMEM_DELTA) + stage * HOP_M;
        named_barrier_sync_unaligned(WIDE_BAR_P_IN, CONSUMER_THREADS);
        /* dS^T = P^T (dP^T - Delta) from the fp32 P, a chunk at a time */
#pragma unroll
        for (int j = 0; j < HOP_M / 8; ++j) {
          const float4 pv = ld_shared_v4(wide_exchange(s_ds, s_p, j) + xt);
          const float2 dl = *(const float2 *)(dls + 8 * j + 2 * t);
          fr[j / 2][2 * (j % 2)] = ds_pair(pv.x, pv.y, acc[4 * j], acc[4 * j + 1], dl);
          fr[j / 2][2 * (j % 2) + 1] = ds_pair(pv.z, pv.w, acc[4 * j + 2], acc[4 * j + 3], dl);
        }
      }
      /* consumer 1 has read the exchange: both buffers may be written */
      named_barrier_sync_unaligned(WIDE_BAR_P_READ, CONSUMER_THREADS);
#pragma unroll
      for (int kk = 0; kk < HOP_M / 16; ++kk) {
        const int c = 2 * kk + (mq >> 1); /* 8-column chunk */
        stmatrix_x4((CW == 0 ? s_p : s_ds) + r * 128 + (((c % 8) ^ mi) << 4), fr[kk]);
      }
    }
    fence_proxy_async();
    /* both halves in: buffer buf's (st / 2)-th use */
    mbar_arrive(base + BAR_HALVES(buf));
    mbar_wait(base + BAR_HALVES(buf), (st >> 1) & 1);
    /* split by operand, consumer 0 has not waited for dO (its dV GEMM
     * reads it): its own wait, not one seen through consumer 1's */
    if (SDP_SPLIT && HOP_SPLIT_DO && CW == 0) mbar_wait(base + BAR_DO_FULL, phase);

    /* ---- dV[:, V0..] += P^T dO, dK[:, K0..] += dS^T Q (A K-major from
     * shared memory, k = query columns; B MN-major from its box), and
     * dQ[:, K0..] = dS K, into dq_accum (warp wi holds the tile's 16-row
     * block wi). Above head_dim 192 (or without the staging) the GEMM runs
     * in two parts of at most 64 columns (the second from the next box):
     * at most 32 dQ accumulators sit next to the 128 of dK and dV; their
     * adds come from registers, or (deterministic) each part is staged
     * and the writer takes the tile after the second. */
    constexpr int NQ1 =
        (NK > 64 && (!SDPA_HOPPER_DQ_BULK || D > SDPA_HOPPER_STAGING_MAX)) ? 64 : NK;
    constexpr int NQ2 = NK - NQ1;
    float dq[NQ1 / 2];
    if constexpr (SDPA_HOPPER_WIDE_DQ_INTERLEAVE) {
      /* dV's GEMM before dK's; with dO on barriers of its own
       * (HOP_SPLIT_DO), dK's first, so that Q is free before dO */
      wgmma_fence();
      dq_gemm<NQ1>(dq, s_ds, s_k, 0, K0);
      wgmma_commit();
      if constexpr (HOP_SPLIT_DO)
        wide_acc_gemm<NK>(acc_dk, s_ds, s_q + (K0 / 64) * BOX_Q);
      else
        wide_acc_gemm<NV>(acc_dv, s_p, s_do + (V0 / 64) * BOX_Q);
      if constexpr (NQ2 == 0) wide_acc_gemm<NK>(acc_dk, s_ds, s_q + (K0 / 64) * BOX_Q);
      wgmma_wait<(NQ2 > 0 ? 1 : 2)>(); /* dQ (part 1) done */
      reg_fence(dq);
      dq_out<NQ1, true, NQ2 == 0>(w, base, st, i0, h, wi, K0, dq, dq_first, blk_elems);
      if constexpr (NQ2 > 0) {
        float dq2[NQ2 / 2];
        wgmma_fence();
        dq_gemm<NQ2>(dq2, s_ds, s_k, 0, K0 + NQ1);
        wgmma_commit();
        if constexpr (HOP_SPLIT_DO)
          wide_acc_gemm<NV>(acc_dv, s_p, s_do + (V0 / 64) * BOX_Q);
        else
          wide_acc_gemm<NK>(acc_dk, s_ds, s_q + (K0 / 64) * BOX_Q);
        wgmma_wait<1>();
        reg_fence(dq2);
        if (HOP_SPLIT_DO) mbar_arrive(base + BAR_EMPTY(stage)); /* dK done: Q is free */
        dq_out<NQ2, false>(w, base, st, i0, h, wi, K0 + NQ1, dq2, dq_first + (NQ1 / 8) * 128,
                    blk_elems);
      }
      wgmma_wait<0>();
      /* dV, dK done: the stage (or, HOP_SPLIT_DO, its dO) is free */
      mbar_arrive(base + (HOP_SPLIT_DO ? BAR_DO_EMPTY : BAR_EMPTY(stage)));
    } else {
      wgmma_fence();
      wide_acc_gemm<NV>(acc_dv, s_p, s_do + (V0 / 64) * BOX_Q);
      wide_acc_gemm<NK>(acc_dk, s_ds, s_q + (K0 / 64) * BOX_Q);
      dq_gemm<NQ1>(dq, s_ds, s_k, 0, K0);
      wgmma_commit();

      /* dV, dK done: the stage's Q, dO, LSE and Delta are free. */
      wgmma_wait<1>();
      mbar_arrive(base + BAR_EMPTY(stage));
      wgmma_wait<0>();
      reg_fence(dq);
      dq_out<NQ1, true, NQ2 == 0>(w, base, st, i0, h, wi, K0, dq, dq_first, blk_elems);
      if constexpr (NQ2 > 0) {
        float dq2[NQ2 / 2];
        wgmma_fence();
        dq_gemm<NQ2>(dq2, s_ds, s_k, 0, K0 + NQ1);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dq2);
        dq_out<NQ2, false>(w, base, st, i0, h, wi, K0 + NQ1, dq2, dq_first + (NQ1 / 8) * 128,
                    blk_elems);
      }
    }
    advance_step(w, it, h);
    advance_ring(stage, phase, buf);
  }
  /* ---- epilogue: dK * scale, dV, this consumer's columns; rows <
   * kv_valid. */
  finish_consumer<NK, NV>(p, w, base, acc_dk, acc_dv, row0, K0, V0);
}
