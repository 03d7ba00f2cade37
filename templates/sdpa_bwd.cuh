/*
 * sdpa_bwd.cuh - flash-attention backward for sm_80 and later (mma.sync),
 * KV-stationary. Two or three kernels make one backward: preprocess
 * (Delta, zeroed accumulator) and the dQ convert live in sdpa_aux.cuh,
 * shared with the sm_90a family; this file is the main kernel.
 *
 *   sdpa_bwd_main        one CTA per (kv tile, kv head, batch/sequence):
 *                        K, V tile resident in shared memory, dK, dV in
 *                        registers; for every query head of the kv head's
 *                        group and every query tile that sees the kv tile:
 *                          S = Q K^T, dP = dO V^T          (warps split MxN)
 *                          P = exp2(S*scale*log2e - LSE*log2e), masked to 0
 *                          dS = P * (dP - Delta)           -> P, dS to smem
 *                          dV += P^T dO, dK += dS^T Q      (warps split NxD)
 *                          dQacc += dS K                   (warps split MxD;
 *                                 fp32 vector reductions, fragment order)
 *                        epilogue dK *= scale, write dK, dV.
 *                        With SDPA_FOLD_DQ (one kernel fewer) main
 *                        also writes dQ: every CTA counts itself into
 *                        the counter of each query tile it reduced into;
 *                        the one that completes the count (kv_visitors)
 *                        writes dQ = dtype(dQacc * scale) for the tile
 *                        after its loop; tiles no kv tile sees get dQ = 0
 *                        from kv tile 0's CTA.
 *   sdpa_bwd_convert_dq  otherwise (sdpa_aux.cuh): dQ = dtype(dQacc *
 *                        scale), at full memory bandwidth (in-kernel
 *                        conversions run at the CTAs' ends, latency-bound:
 *                        3-4% slower at hd 128, 4k-16k tokens). Compiled in
 *                        every module, launched only without SDPA_FOLD_DQ.
 *
 * Parameters (the translation unit #defines them; each is a key field):
 *   SDPA_DTYPE 1 fp16 | 2 bf16;  SDPA_HEAD_DIM, SDPA_HEAD_DIM_V;
 *   SDPA_Q_TILE (M), SDPA_KV_TILE (N), SDPA_WARPS, SDPA_STAGES (1|2);
 *   SDPA_LSE_PACKED (LSE seq stride 1); SDPA_LAYOUT 1 BSHD | 2 THD;
 *   SDPA_MASK 0 none | 1 causal top-left | 2 causal bottom-right | 3 window;
 *   SDPA_DETERMINISTIC; SDPA_EVEN (BSHD, lengths multiples of M and N);
 *   SDPA_FOLD_DQ (main writes dQ; no convert launch).
 *
 * Launch contract (execute.c; preprocess and convert: sdpa_aux.cuh):
 *   main: grid (ceil(seqlen_kv / N) * batch, heads_kv), block 32*SDPA_WARPS,
 *         (no mask: x = b * kv_tiles + j, y = kv head; masked: the flat
 *         block index runs (sequence, kv head) fastest, kv tile slowest),
 *         dynamic smem sdpa_mma_smem_layout().total (sdpa_traits.h).
 *   Reads q, k, v, o, dout, lse, cu_seqlens; writes dq, dk, dv and the
 *   workspace; sets bits in *error_flag for bad THD offsets/lengths.
 *
 * Masking: key k visible to query i iff (right < 0 || k <= i+off+right) and
 * (left < 0 || k >= i+off-left), with off = 0 (top-left) or skv - sq; tile
 * pairs that see nothing are skipped, tiles fully visible and in bounds are
 * not masked element-wise. Deterministic mode orders the dQ atomics of the
 * kv tiles visiting one query tile by kv-tile index with the tile's
 * counter as a semaphore; the last in that order converts.
 */
#include "sdpa_params.h"
#include "sdpa_mma.cuh"
#include "sdpa_seq.cuh"
#include "sdpa_traits.h"
/* The configuration, its GEMM head dims, shared-memory carve and warp
 * partitions (sdpa_traits.h: the host sizes the launch from the same
 * functions). Macros, not constexpr variables: with device code as the
 * default a namespace-scope variable would be emitted into the module. */
#define CFG                                                                    \
  (sdpa_mma_config{SDPA_HEAD_DIM, SDPA_HEAD_DIM_V, SDPA_Q_TILE, SDPA_KV_TILE,   \
                   SDPA_WARPS, SDPA_STAGES, SDPA_DETERMINISTIC, SDPA_MASK == 3, \
                   SDPA_FOLD_DQ})
/* dQ accumulator rows as wide as the GEMM head dim (sdpa_aux.cuh) */
#define SDPA_DQ_ACCUM_DIM (sdpa_mma_gemm_dims(CFG).d)
#include "sdpa_aux.cuh" /* preprocess, convert; defines D, DV, DT, DQA */

#define M SDPA_Q_TILE
#define N SDPA_KV_TILE
#define NW SDPA_WARPS
#define NT (NW * 32)
#define SMEM sdpa_mma_smem_layout(CFG)
#define SPLIT sdpa_mma_warp_split(CFG)

/* GEMM head dims: D and DV rounded up to what the warps tile (equal to
 * them for multiples of 32). Columns [D, GD) and [DV, GDV) of the shared
 * tiles are zero and are never loaded from or stored to global memory. */
#define GD (sdpa_mma_gemm_dims(CFG).d)
#define GDV (sdpa_mma_gemm_dims(CFG).dv)
#define PADDED (GD != D || GDV != DV)

/* Padded row strides (elements) of the shared tiles. */
#define LD_D (GD + 8)
#define LD_DV (GDV + 8)
#define LD_N (N + 8)

/* Warp partitions: S, dP (M x N) over S_WM x S_WN warps; dK, dV (N x D,
 * N x DV) over KV_WN x KV_WD; dQ (M x D) over Q_WM x Q_WD. */
#define S_WM SPLIT.s_rows
#define S_WN (NW / S_WM)
#define KV_WN SPLIT.kv_rows
#define KV_WD (NW / KV_WN)
#define Q_WM SPLIT.q_rows
#define Q_WD (NW / Q_WM)
#define S_TM (M / S_WM)
#define S_TN (N / S_WN)
#define KV_TN (N / KV_WN)
#define KV_TD (GD / KV_WD)
#define KV_TDV (GDV / KV_WD)
#define Q_TM (M / Q_WM)
#define Q_TD (GD / Q_WD)

static_assert(S_WM > 0 && KV_WN > 0 && Q_WM > 0 &&
              S_WM * S_WN == NW && KV_WN * KV_WD == NW && Q_WM * Q_WD == NW,
              "warps must tile every GEMM");
static_assert(S_TM % 16 == 0 && S_TN % 16 == 0, "S warp tile");
static_assert(KV_TN % 16 == 0 && KV_TD % 16 == 0 && KV_TDV % 16 == 0,
              "dK/dV warp tile");
static_assert(Q_TM % 16 == 0 && Q_TD % 16 == 0, "dQ warp tile");
static_assert(D % 8 == 0 && DV % 8 == 0 && DV <= D && GD >= D && GDV >= DV &&
                  GD % 16 == 0 && GDV % 16 == 0 && DQA == GD,
              "head dims: multiples of 8, GEMM head dims multiples of 16 that hold them");

/* Shared memory carve (bytes; sdpa_traits.h), and what the kernel puts in
 * each region fits it. */
#define SMEM_K SMEM.k
#define SMEM_V SMEM.v
#define SMEM_Q SMEM.q
#define SMEM_DO SMEM.dout
#define SMEM_P SMEM.p
#define SMEM_DS SMEM.ds
#define SMEM_LSE SMEM.lse
#define SMEM_DELTA SMEM.delta
static_assert(SMEM_V - SMEM_K >= N * LD_D * 2 && SMEM_Q - SMEM_V >= N * LD_DV * 2 &&
                  SMEM_DO - SMEM_Q >= SDPA_STAGES * M * LD_D * 2 &&
                  SMEM_P - SMEM_DO >= SDPA_STAGES * M * LD_DV * 2 &&
                  SMEM_DS - SMEM_P >= M * LD_N * 2 && SMEM_LSE - SMEM_DS >= M * LD_N * 2 &&
                  SMEM_DELTA - SMEM_LSE >= SDPA_STAGES * M * 4 &&
                  SMEM.total - SMEM_DELTA >= SDPA_STAGES * M * 4,
              "the kernel's tiles fit the shared-memory carve");

/* Delta enters the dP GEMM as its accumulators' start value (head_dim_v
 * <= 64: 60 subtractions a step fewer, hd 64 full +2.2 to +2.8%) or is
 * subtracted after it (larger head dims: there the start values cost hd
 * 128 full 0.6-1.4%, its loop scheduled worse). */
#define DELTA_IN_DP (DV <= 64)

#define LOG2E 1.4426950408889634f

/* dS from P in fp32 (1), as FlashAttention-2 computes it: one rounding,
 * with the fp32 P live across the dP GEMM; or (0) from the P rounded to
 * the dtype for dV, multiplied in fp32: two roundings, only the packed P
 * live. By default 1 on sm_90 and later where the dK/dV accumulators take
 * fewer than 128 registers a thread and the warp's S tile fewer than 64
 * (or the split is the tight one, one warp row of S per 16 query rows,
 * and the GEMM head dims are the head dims): at 128 accumulator registers
 * it spilled 20-44 B (head dims 120-128 on sm_90), at 64 of S 4-8 B (head
 * dim 64, 128 x 128 tiles, causal), tight with padded GEMM columns 4 B
 * (head dim 56, deterministic); on sm_80 at head dims 32-128
 * (bench/NOTES.md). */
#ifdef SDPA_DS_FP32_P
constexpr bool DS_FP32_P = SDPA_DS_FP32_P;
#elif __CUDA_ARCH__ >= 900
constexpr bool DS_FP32_P = KV_TN * (KV_TD + KV_TDV) / 32 < 128 &&
                           (S_TM * S_TN / 32 < 64 || (sdpa_mma_tight(CFG) && !PADDED));
#else
constexpr bool DS_FP32_P = false;
#endif

/* P and dS go to shared memory by stmatrix (sm_90 and later), except
 * with 4 warps: there dK/dV hold 128 registers a thread, and holding a
 * whole tile's packed values for it spilled (sm_120, head_dim 256); each
 * pair is stored as it is made instead. */
#if __CUDA_ARCH__ >= 900
#define STSM (NW == 8)
#else
#define STSM 0
#endif

/* A compile-time flag passed to generic lambdas. */
template <bool B> struct Flag {
  static constexpr bool value = B;
};


/* The main kernel's block: kv tile j of sequence b, kv head hk. Without
 * a mask every kv tile of a (sequence, head) walks the same query tiles
 * in step, so the launch runs them side by side and each Q/dO tile is
 * read from DRAM once. Under a mask the kv tiles differ in work (causal:
 * tile 0 sees every query tile), so within a group of p.order_group
 * (sequence, kv head) pairs the launch runs kv tile j of each pair
 * before tile j+1 (heaviest first, no long CTA left for the end), and the
 * groups follow each other: the tiles in flight belong to a few heads,
 * whose Q, dO and dQ accumulator stay in L2 (8-warp configurations).
 * Deterministic plans take every pair as one group: a kv tile's ordered
 * dQ adds wait for the lower kv tiles of its pair, which then run a wave
 * earlier instead of beside it (without a mask the plain order measured
 * faster: its kv tiles of a pair walk the query tiles in step, one wait
 * at the start, and share their Q/dO reads and dQ adds in L2). */
SDPA_DEVICE void decode_block(const sdpa_kernel_params &p, int &j, int &b, int &hk) {
  const int kv_tiles = (p.seqlen_kv + N - 1) / N;
#if SDPA_MASK == 0
  j = blockIdx.x % kv_tiles;
  b = blockIdx.x / kv_tiles;
  hk = blockIdx.y;
#elif NW == 4
  /* The 4-warp configurations (128 registers of dK/dV accumulators) keep
   * the plain j-major order: the group arithmetic spilled 4-12 B there. */
  (void)kv_tiles;
  const sdpa_i64 flat = (sdpa_i64)blockIdx.y * gridDim.x + blockIdx.x;
  const sdpa_i64 per_tile = (sdpa_i64)p.batch * p.heads_kv;
  j = (int)(flat / per_tile);
  const int r_bh = (int)(flat % per_tile);
  b = r_bh / p.heads_kv;
  hk = r_bh % p.heads_kv;
#else
  /* The block index read afresh (volatile): the dQ hand-off after the
   * loop decodes again, and a decode shared with the start would keep its
   * values live across the loop (spills at 255 registers). */
  unsigned bx, by;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bx));
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(by));
  const sdpa_i64 flat = (sdpa_i64)by * gridDim.x + bx;
  const sdpa_i64 pairs = (sdpa_i64)p.batch * p.heads_kv;
  const sdpa_i64 span = (sdpa_i64)p.order_group * kv_tiles;
  const sdpa_i64 group = flat / span, first = group * p.order_group;
  const int members = (int)min((sdpa_i64)p.order_group, pairs - first);
  const int r = (int)(flat - group * span); /* < span <= grid x */
  j = r / members;
  const sdpa_i64 pair = first + r % members;
  b = (int)(pair / p.heads_kv);
  hk = (int)(pair % p.heads_kv);
#endif
}

/* Query tiles [it_lo, it_hi] with a row that sees some key of kv tile
 * [k0, k0 + kv_valid) (empty: it_hi < it_lo). */
SDPA_DEVICE void query_tile_range(const Band &band, int k0, int kv_valid, int sq, int &it_lo,
                                  int &it_hi) {
  int lo = 0, hi = sq - 1;
  if (band.right >= 0) lo = max(lo, k0 - band.off - band.right);
  if (band.left >= 0) hi = min(hi, k0 + kv_valid - 1 - band.off + band.left);
  it_lo = lo / M;
  it_hi = lo <= hi ? hi / M : it_lo - 1;
}

/* ------------------------------------------------------------ dQ hand-off */

/* The kv tiles that see query tile `it` (band_kv_visitors, this family's
 * tiles). */
SDPA_DEVICE int kv_visitors(const Band &band, int it, int sq, int skv, int &first) {
  return band_kv_visitors(band, it, M, N, sq, skv, first);
}

/* One main-kernel CTA's work, as the dQ hand-off recomputes it: kv tile
 * j of sequence b (first query token q0, first dq_accum block blk0, dq of
 * its head 0), kv head hk, query tiles [it_lo, it_hi] of each of the
 * group's heads (`steps` in all). */
struct CtaWork {
  int b, j, hk, sq, skv, it_lo, it_hi, steps;
  sdpa_i64 blk0;
  u16 *dq;
  Band band;
};

/* Query rows of query tile `it`, head h: dq = dtype(dQacc * scale). Reads
 * the tile's fragment-ordered 16-row blocks from L2 (.cg: other CTAs'
 * reductions, not this SM's L1) with up to 8 units a thread in flight;
 * rows >= sq are skipped. Every reduction into the tile is visible. */
SDPA_DEVICE void convert_tile(const sdpa_kernel_params &p, const CtaWork &w, int h, int it) {
  constexpr int UNITS = M * D / 4; /* float4 pieces: 32 per 16 x 8 piece */
  constexpr bool EVEN_UNITS = UNITS % NT == 0; /* else the last pass is partial */
  constexpr int PER = (UNITS + NT - 1) / NT;
  /* Units whose loads are in flight together (32 floats a thread: this
   * runs after the main loop, when registers are free). */
  constexpr int CHUNK = PER % 8 == 0 ? 8 : PER % 4 == 0 ? 4 : PER % 2 == 0 ? 2 : 1;
  const int i0 = it * M;
  const sdpa_i64 blk_elems = (sdpa_i64)p.heads_q * (DQA * 16);
  const float *src = p.dq_accum + (w.blk0 + i0 / 16) * blk_elems + (sdpa_i64)h * (DQA * 16);
  u16 *dq = w.dq + (sdpa_i64)h * p.dq_head;
#pragma unroll 1
  for (int c0 = 0; c0 < PER; c0 += CHUNK) {
    float v[CHUNK][4];
#pragma unroll
    for (int u = 0; u < CHUNK; ++u) {
      const int unit = (c0 + u) * NT + threadIdx.x;
      const int mb = unit / (D * 4), piece = (unit % (D * 4)) >> 5, lane = unit & 31;
      const float *at = src + mb * blk_elems + piece * 128;
      if ((EVEN_UNITS || unit < UNITS) && (SDPA_EVEN || i0 + mb * 16 < w.sq)) {
#if __CUDA_ARCH__ >= 900
        asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v[u][0]), "=f"(v[u][1]), "=f"(v[u][2]), "=f"(v[u][3])
                     : "l"(at + lane * 4));
#else
#pragma unroll
        for (int e = 0; e < 4; ++e)
          asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v[u][e]) : "l"(at + frag_at(lane, e)));
#endif
      }
    }
#pragma unroll
    for (int u = 0; u < CHUNK; ++u) {
      const int unit = (c0 + u) * NT + threadIdx.x;
      const int mb = unit / (D * 4), piece = (unit % (D * 4)) >> 5, lane = unit & 31;
      if (EVEN_UNITS || unit < UNITS)
        store_dq_piece(dq, p.dq_seq, i0 + mb * 16, piece, lane, v[u], w.sq, p.scale);
    }
  }
}

/* The main kernel's end when it writes dQ (SDPA_FOLD_DQ). Kv tile 0's CTA
 * (one exists for every sequence) writes dq = 0 into the query tiles no
 * kv tile sees. Then the CTA counts itself into the counter of every
 * query tile it reduced into and converts the tiles whose count it
 * completed (deterministic mode: those it is the last visitor of, in
 * kv-tile order, its semaphore chain having ordered the others); the
 * step list lives in P's shared memory, free by now. The caller has
 * passed a barrier after its last reductions and has nothing left to do.
 * It recomputes the CTA's work from its block index and the parameters,
 * so that nothing stays live across the main loop for it. Inline with 8
 * warps (as a call it took registers from the whole kernel: 4-36 B of
 * spill in six fp16 classes); out of line with 4 warps, whose 128-register
 * dK/dV accumulators left no room for it inline (4-44 B in eleven hd 256
 * classes). Both forms were swept over every class without a spill. */
#if NW == 8
SDPA_DEVICE void fold_dq_end(const sdpa_kernel_params &p, unsigned char *smem) {
#else
__device__ __noinline__ void fold_dq_end(const sdpa_kernel_params p, unsigned char *smem) {
#endif
  CtaWork w;
  decode_block(p, w.j, w.b, w.hk);
  sdpa_i64 q0, kv0;
  if (!sequence_bounds(p, w.b, q0, kv0, w.sq, w.skv, false)) return; /* main flagged it */
  w.band = make_band(p, w.sq, w.skv);
  const int k0 = w.j * N;
  w.it_lo = 0;
  w.it_hi = -1;
  if (k0 < w.skv)
    query_tile_range(w.band, k0, w.skv - k0 < N ? w.skv - k0 : N, w.sq, w.it_lo, w.it_hi);
  w.steps = w.it_hi >= w.it_lo ? (w.it_hi - w.it_lo + 1) * p.group : 0;
  w.blk0 = dq_block_base(p, w.b, q0);
#if SDPA_LAYOUT == 1
  w.dq = (u16 *)p.dq + (sdpa_i64)w.b * p.dq_batch;
#else
  w.dq = (u16 *)p.dq + q0 * p.dq_seq;
#endif

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int first;
  if (w.j == 0)
    for (int it = warp; it * M < w.sq; it += NW) {
      if (kv_visitors(w.band, it, w.sq, w.skv, first) > 0) continue;
      const int rows = min(M, w.sq - it * M);
      for (int h = w.hk * p.group; h < (w.hk + 1) * p.group; ++h)
        for (int c = lane; c < rows * (D / 2); c += 32) {
          const int r = c / (D / 2), k = (c - r * (D / 2)) * 2;
          *(u32 *)(w.dq + h * p.dq_head + (sdpa_i64)(it * M + r) * p.dq_seq + k) = 0u;
        }
    }
  static_assert(M * LD_N * 2 >= (NT + 1) * 4, "the step list fits in P's space");
  int *list = (int *)(smem + SMEM_P); /* [0] count, then steps */
  const int span = w.it_hi - w.it_lo + 1;
  for (int base = 0; base < w.steps; base += NT) {
    if (threadIdx.x == 0) list[0] = 0;
    __syncthreads();
    const int s = base + threadIdx.x;
    if (s < w.steps) {
      const int sit = w.it_lo + s % span;
      const int visitors = kv_visitors(w.band, sit, w.sq, w.skv, first);
#if SDPA_DETERMINISTIC
      const bool mine = w.j == first + visitors - 1;
#else
      sdpa_i32 *counter = q_tile_counter(p, w.hk * p.group + s / span, w.b, sit);
      /* the release of this CTA's reductions (a barrier before it ordered
       * every thread's) */
      const bool mine = atom_add_release_gpu(counter) + 1 == visitors;
      if (mine) fence_acq_rel_gpu(); /* the other visitors' reductions */
#endif
      if (mine) list[1 + atomicAdd(&list[0], 1)] = s;
    }
    __syncthreads();
    const int n = list[0];
    for (int k = 0; k < n; ++k) {
      const int s2 = list[1 + k];
      convert_tile(p, w, w.hk * p.group + s2 / span, w.it_lo + s2 % span);
    }
    __syncthreads();
  }
}

/* ------------------------------------------------------------------ main */

/* Copies a [ROWS x COLS] tile (global row stride `stride` elements) into
 * shared memory at byte address `s` with row stride LD, in 16-byte
 * cp.async chunks; rows >= valid are zero-filled (WHOLE: none are, the
 * check is left out). When the block's
 * threads tile a row's chunks evenly (COLS/8 divides NT) each thread keeps
 * one column and steps by whole rows with no divisions;
 * otherwise (head dims 96, 192) a plain loop hands chunk c to thread
 * c % NT, which costs fewer registers than unrolling it. */
template <int ROWS, int COLS, int LD, bool WHOLE = SDPA_EVEN>
SDPA_DEVICE void copy_tile(u32 s, const u16 *g, sdpa_i64 stride, int valid) {
  constexpr int CH = COLS / 8;
  if (NT % CH == 0) {
    constexpr int RSTEP = NT % CH == 0 ? NT / CH : 1;
    const int r0 = threadIdx.x / CH, k = (threadIdx.x % CH) * 8;
    const u16 *g0 = g + r0 * stride + k;
    const sdpa_i64 gstep = RSTEP * stride;
    /* Unrolled up to 4 passes (every 8-warp tile here); longer copies
     * (4-warp tiles) loop, sparing registers. */
    constexpr int PASSES = (ROWS + RSTEP - 1) / RSTEP;
    constexpr int UNROLL = PASSES <= 4 ? PASSES : 1;
#pragma unroll UNROLL
    for (int i = 0; i < PASSES; ++i) {
      const int r = r0 + i * RSTEP;
      if (ROWS % RSTEP == 0 || r < ROWS) {
        const bool ok = WHOLE || r < valid;
        cp_async16(s + (r * LD + k) * 2, ok ? g0 + i * gstep : g, ok);
      }
    }
  } else {
#pragma unroll 1
    for (int c = threadIdx.x; c < ROWS * CH; c += NT) {
      const int r = c / CH, k = (c - r * CH) * 8;
      const bool ok = WHOLE || r < valid;
      cp_async16(s + (r * LD + k) * 2, ok ? g + r * stride + k : g, ok);
    }
  }
}

/* Columns [cmin, cmax] of the kv tile at k0 that query row i sees (band,
 * sequence ends); cmax < cmin when none. */
SDPA_DEVICE void visible_columns(const Band &band, int i, int k0, int sq, int skv, int &cmin,
                                 int &cmax) {
  cmin = 0;
  cmax = min(N, skv - k0) - 1;
  if (!SDPA_EVEN && i >= sq) cmax = -1;
  if (band.right >= 0) cmax = min(cmax, i + band.off + band.right - k0);
  if (band.left >= 0) cmin = max(cmin, i + band.off - band.left - k0);
  (void)sq;
}

/* Scores outside each row's visible columns become -inf, so that their P
 * is exactly 0. With 8 warps only tiles that need element-wise masking run
 * this, before the one softmax path (two copies of the softmax made the
 * compiler rematerialize shared-memory addresses in every step: ~10% more
 * instructions under a mask). */
SDPA_DEVICE void mask_tile(float (&acc_s)[S_TM / 16][S_TN / 8][4], int s_m, int s_n,
                           int g, int t, const Band &band, int i0, int k0, int sq,
                           int skv) {
#pragma unroll
  for (int mi = 0; mi < S_TM / 16; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      int cmin, cmax;
      visible_columns(band, i0 + s_m + mi * 16 + g + hf * 8, k0, sq, skv, cmin, cmax);
#pragma unroll
      for (int nj = 0; nj < S_TN / 8; ++nj)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = s_n + nj * 8 + 2 * t + e;
          if (c < cmin || c > cmax) acc_s[mi][nj][hf * 2 + e] = __int_as_float(0xff800000);
        }
    }
}

/* P = exp2(S * scale_log2 - LSE * log2e) for a warp's S tile, to shared
 * memory and packed into p_pk (and in place into acc_s, fp32, with
 * DS_FP32_P). A row whose LSE is -inf sees no key: its
 * LSE is taken as +inf, so P = 0 (and a -inf score never meets a -inf
 * LSE: no NaN). MASKED: P = 0 outside each row's visible columns, for the
 * 4-warp configurations (the 128-register dK/dV accumulators leave no room
 * for mask_tile's separate pass: it spilled at head_dim 256 on sm_120). */
template <bool MASKED>
SDPA_DEVICE void softmax_tile(float (&acc_s)[S_TM / 16][S_TN / 8][4],
                              u32 (&p_pk)[S_TM / 16][2][S_TN / 8], const float *lse,
                              u16 *sP, int s_m, int s_n, int g, int t, float scale_log2,
                              const Band &band, int i0, int k0, int sq, int skv) {
#pragma unroll
  for (int mi = 0; mi < S_TM / 16; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = s_m + mi * 16 + g + hf * 8;
      float row_lse = lse[r];
      row_lse = row_lse == __int_as_float(0xff800000) ? __int_as_float(0x7f800000)
                                                      : row_lse * LOG2E;
      int cmin = 0, cmax = N - 1;
      if (MASKED) visible_columns(band, i0 + r, k0, sq, skv, cmin, cmax);
#pragma unroll
      for (int nj = 0; nj < S_TN / 8; ++nj) {
        float pv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = s_n + nj * 8 + 2 * t + e;
          pv[e] = fast_exp2(acc_s[mi][nj][hf * 2 + e] * scale_log2 - row_lse);
          if (MASKED && (c < cmin || c > cmax)) pv[e] = 0.f;
          if (DS_FP32_P) acc_s[mi][nj][hf * 2 + e] = pv[e];
        }
        p_pk[mi][hf][nj] = pack2<DT>(pv[0], pv[1]);
        if (!STSM) *(u32 *)(sP + r * LD_N + s_n + nj * 8 + 2 * t) = p_pk[mi][hf][nj];
      }
    }
  if (STSM) store_frags<S_TM, S_TN>(sP + s_m * LD_N + s_n, LD_N, p_pk);
}

/* Issues the loads of one step (head lh, query tile lit) into buffer
 * `stage`: Q and dO tiles, and their LSE and Delta rows, in one cp.async
 * group. WHOLE: the query tile is known to lie inside the sequence. */
template <bool WHOLE>
SDPA_DEVICE void load_step(const sdpa_kernel_params &p, int b, sdpa_i64 q0, int sq, int lh,
                           int lit, int stage, u32 smem0) {
  const int i0 = lit * M;
  const int q_valid = sq - i0 < M ? sq - i0 : M;
#if SDPA_LAYOUT == 1
  const sdpa_i64 qb = (sdpa_i64)b * p.q_batch + (sdpa_i64)i0 * p.q_seq + (sdpa_i64)lh * p.q_head;
  const sdpa_i64 dob = (sdpa_i64)b * p.do_batch + (sdpa_i64)i0 * p.do_seq + (sdpa_i64)lh * p.do_head;
  const sdpa_i64 lse_b = (sdpa_i64)b * p.lse_batch + (sdpa_i64)lh * p.lse_head;
#else
  const sdpa_i64 qb = (q0 + i0) * p.q_seq + (sdpa_i64)lh * p.q_head;
  const sdpa_i64 dob = (q0 + i0) * p.do_seq + (sdpa_i64)lh * p.do_head;
  const sdpa_i64 lse_b = (sdpa_i64)lh * p.lse_head + q0 * p.lse_seq;
#endif
  copy_tile<M, D, LD_D, WHOLE>(smem0 + SMEM_Q + stage * M * LD_D * 2, (const u16 *)p.q + qb,
                         p.q_seq, q_valid);
  copy_tile<M, DV, LD_DV, WHOLE>(smem0 + SMEM_DO + stage * M * LD_DV * 2,
                          (const u16 *)p.dout + dob, p.do_seq, q_valid);
  /* LSE and Delta rows ride in the same cp.async group; rows past the
   * sequence are zero-filled (and masked). */
  if (threadIdx.x < M) {
    const int r = threadIdx.x, i = i0 + r;
    const bool ok = WHOLE || i < sq;
#if SDPA_LSE_PACKED
    const float *lse_src = p.lse + lse_b + (ok ? i : 0);
#else
    const float *lse_src = p.lse + lse_b + (ok ? (sdpa_i64)i * p.lse_seq : 0);
#endif
    const float *delta_src = p.delta + (sdpa_i64)lh * p.rows_q + q0 + (ok ? i : 0);
    cp_async4(smem0 + SMEM_LSE + (stage * M + r) * 4, lse_src, ok);
    cp_async4(smem0 + SMEM_DELTA + (stage * M + r) * 4, delta_src, ok);
  }
  cp_async_commit();
  (void)b;
}

/* One step's scores: S = Q K^T -> P (to shared memory, and kept packed
 * in registers), then dP = dO V^T -> dS = P * (dP - Delta) (to shared
 * memory). Holding P packed in 16-bit pairs rather than as fp32 keeps S
 * and dP from being live together next to the dK/dV accumulators; dS
 * then uses the same rounded P that dV = P^T dO uses. `visible`: the tile
 * needs no element-wise mask. */
SDPA_DEVICE void scores_and_ds(const sdpa_kernel_params &p, bool visible, const Band &band,
                               int i0, int k0, int sq, int skv, const u16 *sQ, const u16 *sK,
                               const u16 *sdO, const u16 *sV, u16 *sP, u16 *sdS,
                               const float *lse, const float *dlt, int s_m, int s_n, int g,
                               int t) {
  u32 p_pk[S_TM / 16][2][S_TN / 8];
  float acc_s[S_TM / 16][S_TN / 8][4]; /* S, then P (live until dS with DS_FP32_P) */
  {
    zero_acc(acc_s);
    warp_gemm<DT, S_TM, S_TN, D, false, false>(acc_s, sQ + s_m * LD_D, LD_D,
                                               sK + s_n * LD_D, LD_D);
#if NW == 8
    if (!visible) mask_tile(acc_s, s_m, s_n, g, t, band, i0, k0, sq, skv);
    softmax_tile<false>(acc_s, p_pk, lse, sP, s_m, s_n, g, t, p.scale_log2, band, i0, k0,
                        sq, skv);
#else
    if (visible)
      softmax_tile<false>(acc_s, p_pk, lse, sP, s_m, s_n, g, t, p.scale_log2, band, i0,
                          k0, sq, skv);
    else
      softmax_tile<true>(acc_s, p_pk, lse, sP, s_m, s_n, g, t, p.scale_log2, band, i0,
                         k0, sq, skv);
#endif
  }
  /* dP - Delta: with DELTA_IN_DP the accumulators start at -Delta of
   * their rows (no subtraction after the GEMM), else at 0. */
  float acc_dp[S_TM / 16][S_TN / 8][4];
#pragma unroll
  for (int mi = 0; mi < S_TM / 16; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float start = DELTA_IN_DP ? -dlt[s_m + mi * 16 + g + hf * 8] : 0.f;
#pragma unroll
      for (int nj = 0; nj < S_TN / 8; ++nj)
        acc_dp[mi][nj][hf * 2] = acc_dp[mi][nj][hf * 2 + 1] = start;
    }
  warp_gemm<DT, S_TM, S_TN, DV, false, false>(acc_dp, sdO + s_m * LD_DV, LD_DV,
                                              sV + s_n * LD_DV, LD_DV);
  u32 ds_pk[S_TM / 16][2][S_TN / 8];
#pragma unroll
  for (int mi = 0; mi < S_TM / 16; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = s_m + mi * 16 + g + hf * 8;
      const float row_delta = DELTA_IN_DP ? 0.f : dlt[r];
#pragma unroll
      for (int nj = 0; nj < S_TN / 8; ++nj) {
        const u32 pp = p_pk[mi][hf][nj];
        if constexpr (DS_FP32_P) {
          (void)pp;
          ds_pk[mi][hf][nj] =
              pack2<DT>(acc_s[mi][nj][hf * 2] * (acc_dp[mi][nj][hf * 2] - row_delta),
                        acc_s[mi][nj][hf * 2 + 1] * (acc_dp[mi][nj][hf * 2 + 1] - row_delta));
        } else {
          /* From the P rounded for dV, multiplied in fp32: two roundings
           * (bf16's packed product made three); for fp16 dP - Delta may
           * also exceed its range where dS does not. */
          const float p0 = to_float<DT>((u16)(pp & 0xffff));
          const float p1 = to_float<DT>((u16)(pp >> 16));
          ds_pk[mi][hf][nj] = pack2<DT>(p0 * (acc_dp[mi][nj][hf * 2] - row_delta),
                                        p1 * (acc_dp[mi][nj][hf * 2 + 1] - row_delta));
        }
        if (!STSM) *(u32 *)(sdS + r * LD_N + s_n + nj * 8 + 2 * t) = ds_pk[mi][hf][nj];
      }
    }
  if (STSM) store_frags<S_TM, S_TN>(sdS + s_m * LD_N + s_n, LD_N, ds_pk);
}

/* One step's dQacc += dS K, one vector reduction per m16n8 fragment into
 * dq_accum's fragment-ordered blocks (query tile `it` of head `h`, its
 * first row i0). 16-row blocks past the sequence belong to the next one
 * and are skipped. Deterministic mode waits for the kv tiles before this
 * one that visit the tile, then releases the next. */
template <bool WHOLE>
SDPA_DEVICE void reduce_dq(const sdpa_kernel_params &p, const Band &band, int b, int h, int it,
                           int j, int i0, int sq, sdpa_i64 blk0, const u16 *sdS,
                           const u16 *sK, int q_m, int q_d, int lane) {
#if SDPA_DETERMINISTIC
  const int kv_first = band_first_kv_tile(band, i0, N);
  int *sem = q_tile_counter(p, h, b, it);
#endif
  const sdpa_i64 blk_elems = (sdpa_i64)p.heads_q * (DQA * 16);
  float *dqa = p.dq_accum + (blk0 + (i0 + q_m) / 16) * blk_elems +
               (sdpa_i64)h * (DQA * 16) + q_d * 16;
  float acc_dq[Q_TM / 16][Q_TD / 8][4];
  zero_acc(acc_dq);
  warp_gemm<DT, Q_TM, Q_TD, N, false, true>(acc_dq, sdS + q_m * LD_N, LD_N,
                                            sK + q_d, LD_D);
#if SDPA_DETERMINISTIC
  /* Wait for the kv tiles before this one (in index order) that visit
   * this query tile. */
  if (threadIdx.x == 0) dq_turn_wait(sem, j - kv_first);
  __syncthreads();
#endif
#pragma unroll
  for (int mi = 0; mi < Q_TM / 16; ++mi)
    if (WHOLE || i0 + q_m + mi * 16 < sq) {
#pragma unroll
      for (int nj = 0; nj < Q_TD / 8; ++nj)
        red_frag(dqa + mi * blk_elems + nj * 128, lane, acc_dq[mi][nj]);
    }
#if SDPA_DETERMINISTIC
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) dq_turn_pass(sem, j - kv_first + 1);
#endif
  (void)band, (void)b, (void)it, (void)j;
}

/* The epilogue: the CTA's dK (times the softmax scale) and dV, rows
 * below kv_valid, from the accumulators' fragments. */
SDPA_DEVICE void store_dk_dv(const sdpa_kernel_params &p, int b, sdpa_i64 kv0, int k0, int hk,
                             int kv_valid, int kv_n, int kv_d, int kv_dv, int g, int t,
                             const float (&acc_dk)[KV_TN / 16][KV_TD / 8][4],
                             const float (&acc_dv)[KV_TN / 16][KV_TDV / 8][4]) {
  u16 *dk = (u16 *)p.dk + kv_row_offset(b, kv0, k0, hk, p.dk_batch, p.dk_seq, p.dk_head);
  u16 *dv = (u16 *)p.dv + kv_row_offset(b, kv0, k0, hk, p.dv_batch, p.dv_seq, p.dv_head);
#pragma unroll
  for (int ni = 0; ni < KV_TN / 16; ++ni)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = kv_n + ni * 16 + g + hf * 8;
      if (SDPA_EVEN || r < kv_valid) {
#pragma unroll
        for (int dj = 0; dj < KV_TD / 8; ++dj)
          if (GD == D || kv_d + dj * 8 < D) /* not a padding column */
            *(u32 *)(dk + r * p.dk_seq + kv_d + dj * 8 + 2 * t) = pack2<DT>(
                acc_dk[ni][dj][hf * 2] * p.scale, acc_dk[ni][dj][hf * 2 + 1] * p.scale);
#pragma unroll
        for (int dj = 0; dj < KV_TDV / 8; ++dj)
          if (GDV == DV || kv_dv + dj * 8 < DV)
            *(u32 *)(dv + r * p.dv_seq + kv_dv + dj * 8 + 2 * t) =
                pack2<DT>(acc_dv[ni][dj][hf * 2], acc_dv[ni][dj][hf * 2 + 1]);
      }
    }
  (void)kv_valid;
}

/* Zeroes the columns beyond the head dims in the K, V, Q and dO tiles
 * (every stage), which no load writes: the GEMMs over GD and GDV then add
 * products of zeros. The first step's barrier orders these stores before
 * any read. */
SDPA_DEVICE void zero_pad_columns(unsigned char *smem) {
  /* 16-byte chunks a row (at least 1: no division by 0 where one is 0
   * and its loop runs no pass) */
  constexpr int PD = GD > D ? (GD - D) / 8 : 1, PDV = GDV > DV ? (GDV - DV) / 8 : 1;
  constexpr int ROWS = N + SDPA_STAGES * M;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int c = threadIdx.x; GD > D && c < ROWS * PD; c += NT) {
    const int r = c / PD, k = D + (c - r * PD) * 8;
    u16 *row = r < N ? (u16 *)(smem + SMEM_K) + r * LD_D
                     : (u16 *)(smem + SMEM_Q) + (r - N) * LD_D;
    *(uint4 *)(row + k) = zero;
  }
  for (int c = threadIdx.x; GDV > DV && c < ROWS * PDV; c += NT) {
    const int r = c / PDV, k = DV + (c - r * PDV) * 8;
    u16 *row = r < N ? (u16 *)(smem + SMEM_V) + r * LD_DV
                     : (u16 *)(smem + SMEM_DO) + (r - N) * LD_DV;
    *(uint4 *)(row + k) = zero;
  }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
sdpa_bwd_main(const sdpa_kernel_params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  u16 *sK = (u16 *)(smem + SMEM_K);
  u16 *sV = (u16 *)(smem + SMEM_V);
  u16 *sP = (u16 *)(smem + SMEM_P);
  u16 *sdS = (u16 *)(smem + SMEM_DS);
  float *sLSE = (float *)(smem + SMEM_LSE);
  float *sDelta = (float *)(smem + SMEM_DELTA);

  int j, b, hk;
  decode_block(p, j, b, hk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  sdpa_i64 q0, kv0;
  int sq, skv;
  if (!sequence_bounds(p, b, q0, kv0, sq, skv, j == 0 && hk == 0 && threadIdx.x == 0))
    return;
  const int k0 = j * N;
  if (k0 >= skv) {
#if SDPA_FOLD_DQ
    if (j == 0) fold_dq_end(p, smem); /* the unseen tiles */
#endif
    return;
  }
  const int kv_valid = skv - k0 < N ? skv - k0 : N;
  const Band band = make_band(p, sq, skv);

  int it_lo, it_hi;
  query_tile_range(band, k0, kv_valid, sq, it_lo, it_hi);

  /* Global bases (elements). */
  const sdpa_i64 kb = kv_row_offset(b, kv0, k0, hk, p.k_batch, p.k_seq, p.k_head);
  const sdpa_i64 vb = kv_row_offset(b, kv0, k0, hk, p.v_batch, p.v_seq, p.v_head);

  const u32 smem0 = smem_u32(smem);
  if (PADDED) zero_pad_columns(smem);
  copy_tile<N, D, LD_D>(smem0 + SMEM_K, (const u16 *)p.k + kb, p.k_seq, kv_valid);
  copy_tile<N, DV, LD_DV>(smem0 + SMEM_V, (const u16 *)p.v + vb, p.v_seq, kv_valid);
  cp_async_commit();

  /* Warp positions in each partition. */
  const int s_m = (warp % S_WM) * S_TM, s_n = (warp / S_WM) * S_TN;
  const int kv_n = (warp % KV_WN) * KV_TN, kv_d = (warp / KV_WN) * KV_TD;
  const int kv_dv = (warp / KV_WN) * KV_TDV;
  const int q_m = (warp % Q_WM) * Q_TM, q_d = (warp / Q_WM) * Q_TD;

  float acc_dk[KV_TN / 16][KV_TD / 8][4];
  float acc_dv[KV_TN / 16][KV_TDV / 8][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);

  const int steps = it_hi >= it_lo ? (it_hi - it_lo + 1) * p.group : 0;
  const sdpa_i64 blk0 = dq_block_base(p, b, q0);

  /* Issues the loads of step (head lh, tile lit) into `stage`; `whole`:
   * Flag<true> when the query tile is known to lie inside the sequence. */
  auto issue = [&](int lh, int lit, int stage, auto whole) {
    load_step<decltype(whole)::value>(p, b, q0, sq, lh, lit, stage, smem0);
  };

  /* The tile pairs that need element-wise masking (band edges, sequence
   * ends) run first, in a loop of their own; the rest run in a loop
   * without the mask code. (In one loop with the mask behind a branch,
   * the compiler rematerialized shared-memory addresses in every step:
   * ~70 more instructions a step at hd 128, bench/NOTES.md.) Per head,
   * the unmasked tiles are one range [u_lo, u_hi] of [it_lo, it_hi]:
   * the band's right edge masks a prefix, its left edge and a partial
   * last query tile a suffix, a partial kv tile every tile. The 4-warp
   * configurations (128 registers of dK/dV accumulators) and the
   * deterministic kernels keep one loop in the natural order and decide
   * per step: two loop bodies spilled there. So do the kernels that write
   * dQ themselves (small problems, a few steps a block, where the second
   * body buys little and costs ~40% of the compile) at head_dim <= 128
   * (sm_80's single-stage hd 128 ones then keep 8-16 B of values in local
   * memory, bench/NOTES.md); wider ones spilled 8-32 B with one loop and
   * keep two. */
  constexpr bool PEELED =
      NW == 8 && !SDPA_DETERMINISTIC && !(SDPA_FOLD_DQ && D <= 128 && DV <= 128);
  auto unmasked = [&](int qt) {
    const int q_first = qt * M;
    bool full = SDPA_EVEN || (q_first + M <= sq && k0 + N <= skv);
    if (band.right >= 0 && k0 + N - 1 > q_first + band.off + band.right) full = false;
    if (band.left >= 0 && k0 < q_first + M - 1 + band.off - band.left) full = false;
    return full;
  };
  int u_lo = it_lo, u_hi = it_hi;
  while (PEELED && u_lo <= it_hi && !unmasked(u_lo)) ++u_lo;
  while (PEELED && u_hi >= u_lo && !unmasked(u_hi)) --u_hi;
  const int masked_steps = steps > 0 ? (it_hi - it_lo - (u_hi - u_lo)) * p.group : 0;

  /* Step order: every head's masked tiles ([it_lo, u_lo), then
   * (u_hi, it_hi]), then every head's unmasked ones. (nh, nit) = the
   * step after (h, it), the last masked step followed by the first
   * unmasked one. */
  const int h_first = hk * p.group;
  auto next_step = [&](auto masking, int st, int h, int it, int &nh, int &nit) {
    nh = h;
    nit = it + 1;
    if (decltype(masking)::value) {
      if (st + 1 == masked_steps) {
        nh = h_first;
        nit = u_lo;
        return;
      }
      if (nit == u_lo) nit = u_hi + 1;
      if (nit > it_hi) {
        ++nh;
        nit = it_lo == u_lo ? u_hi + 1 : it_lo;
      }
    } else if (nit > u_hi) {
      ++nh;
      nit = u_lo;
    }
  };

  int h = h_first; /* the step being computed */
  int it = masked_steps == 0 ? u_lo : it_lo == u_lo ? u_hi + 1 : it_lo;
  if (steps > 0) issue(h, it, 0, Flag<SDPA_EVEN>());
  auto step = [&](int st, auto masking) {
    constexpr bool MASKED = decltype(masking)::value;
    constexpr bool WHOLE = SDPA_EVEN || (PEELED && !MASKED); /* tiles inside the sequences */
    const int stage = SDPA_STAGES == 2 ? (st & 1) : 0;
#if SDPA_STAGES == 1
    if (st > 0) issue(h, it, 0, Flag<WHOLE>()); /* one buffer: load this step's tiles now */
#endif
    cp_async_wait<0>();
    __syncthreads();
#if SDPA_STAGES == 2
    /* Every warp is past the previous step, whose buffer is now free:
     * prefetch the next step into it. (Two barriers a step: this one
     * also orders the P/dS writes below after the previous step's
     * reads.) */
    if (st + 1 < steps) {
      int nh, nit;
      next_step(masking, st, h, it, nh, nit);
      issue(nh, nit, stage ^ 1, Flag<WHOLE>()); /* unmasked steps follow unmasked ones */
    }
#endif

    const int i0 = it * M;
    const u16 *sQ = (const u16 *)(smem + SMEM_Q) + stage * M * LD_D;
    const u16 *sdO = (const u16 *)(smem + SMEM_DO) + stage * M * LD_DV;
    const float *lse = sLSE + stage * M;
    const float *dlt = sDelta + stage * M;

    scores_and_ds(p, PEELED ? !MASKED : unmasked(it), band, i0, k0, sq, skv, sQ, sK, sdO,
                  sV, sP, sdS, lse, dlt, s_m, s_n, g, t);
    __syncthreads();

    /* ---- dV += P^T dO, dK += dS^T Q. */
    warp_gemm<DT, KV_TN, KV_TDV, M, true, true>(acc_dv, sP + kv_n, LD_N,
                                                sdO + kv_dv, LD_DV);
    warp_gemm<DT, KV_TN, KV_TD, M, true, true>(acc_dk, sdS + kv_n, LD_N,
                                               sQ + kv_d, LD_D);

    reduce_dq<WHOLE>(p, band, b, h, it, j, i0, sq, blk0, sdS, sK, q_m, q_d, lane);
#if SDPA_STAGES == 1
    __syncthreads(); /* the next step's loads overwrite this step's tiles */
#endif
    int nh, nit;
    next_step(masking, st, h, it, nh, nit);
    h = nh;
    it = nit;
  };
  int st = 0;
  if (PEELED && (SDPA_MASK != 0 || !SDPA_EVEN))
    for (; st < masked_steps; ++st) step(st, Flag<true>());
  for (; st < steps; ++st) step(st, Flag<false>());

  store_dk_dv(p, b, kv0, k0, hk, kv_valid, kv_n, kv_d, kv_dv, g, t, acc_dk, acc_dv);

#if SDPA_FOLD_DQ
  /* ---- dQ hand-off: count into the tiles, convert the completed ones
   * (called by every CTA: a condition on its state would keep that state
   * live across the loop). */
  __syncthreads(); /* every thread's last reductions (and reads of P) done */
  fold_dq_end(p, smem);
#endif
}
