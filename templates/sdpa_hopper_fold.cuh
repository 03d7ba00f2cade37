/*
 * sdpa_hopper_fold.cuh - dQ converted by the sm_90a main kernel itself
 * (SDPA_FOLD_DQ: no convert kernel after it). Included by sdpa_hopper.cuh
 * after its producer roles; the narrow kernel (and its transposed-dQ
 * form) without the deterministic order, with bulk dQ adds, one tile a
 * block: a step's adds are one bulk group of each consumer warp.
 *
 * Query tile (h, it) of sequence b is complete once every kv tile that
 * visits it (band_kv_visitors) has added its dQ. Each block counts its
 * own adds in: the consumer warps report (fold_report_*, lane 0) how many
 * of their steps' bulk reduce-adds have completed, not only been read;
 * warp 3 of the producer warpgroup (idle without the deterministic
 * writers) follows the block's steps, and once all eight consumer warps
 * are past step st it adds one to the tile's counter in p.semaphores
 * (zeroed by preprocess) as an acquire-release at gpu scope. The block
 * whose add completes the count converts the tile: dq_accum's 16-row
 * blocks come into shared memory by bulk copies (FOLD_BUFFERS at a
 * time, on their own mbarriers) and the warp writes dQ = dtype(dQacc *
 * scale) from there, while the consumers run on. Kv tile 0 of each
 * sequence writes dQ = 0 into the tiles no kv tile visits
 * (fold_zero_unseen), as the convert kernel's zeroed accumulator would
 * give them.
 */

static_assert(!SDPA_FOLD_DQ || (!SDPA_DETERMINISTIC && !HOP_WIDE && SDPA_HOPPER_DQ_BULK &&
                                !SDPA_HOPPER_PERSIST && DQ_COPIES == 1),
              "the folded conversion: the narrow kernels' bulk adds, one tile a block");

/* Consumer warps that report, and the reports' slots (ints, in the second
 * work slot: one tile a block uses the first only). */
#define FOLD_WARPS (CONSUMER_THREADS / 32)
#define SMEM_FOLD_PROGRESS SMEM_WORK_SLOT(1)
static_assert(FOLD_WARPS * 4 + 12 <= SDPA_HOPPER_WORK_BYTES,
              "the reports and warp 3's state fit a work slot");
/* Steps whose adds a report leaves outstanding (the newest FOLD_LAG), so
 * that the wait behind it is for adds issued that many steps before. */
#ifndef SDPA_HOPPER_FOLD_LAG
#define SDPA_HOPPER_FOLD_LAG 2
#endif
#define FOLD_LAG SDPA_HOPPER_FOLD_LAG
/* Measurement: 1 the consumers' reports stored relaxed (no release: no
 * memory barrier in their step); 2 as 1 with warp 3 idle (no counts, no
 * conversion: wrong results); 3 the counts released only, the block
 * whose count completes a tile acquiring with a fence before converting
 * it (no acquire, and no L1 invalidation, for the other counts). */
#ifndef SDPA_HOPPER_FOLD_ABLATE
#define SDPA_HOPPER_FOLD_ABLATE 0
#endif

#if SDPA_FOLD_DQ
#define FOLD_BUFFERS sdpa_hopper_fold_buffers(HOP_CFG, 1)
#define FOLD_BLOCK_BYTES (16 * D * 4)
#define SMEM_FOLD HOP_SMEM.carve
/* The conversion's barriers: the deterministic writers' four, unused here. */
#define BAR_FOLD(b) (BAR_DQ_FULL(0) + 8 * (b))
static_assert(BAR_DQ_EMPTY(1) == BAR_DQ_FULL(0) + 24 && FOLD_BUFFERS <= 4 &&
                  FOLD_BUFFERS >= 1 && SMEM_FOLD % 16 == 0 &&
                  HOP_SMEM.total + sdpa_hopper_fold_bytes(HOP_CFG, 1) <= 232448,
              "the conversion's buffers and barriers");

/* The reports' release and acquire, as atomics on shared memory: the
 * flags are read while written by design (compute-sanitizer's racecheck
 * reports plain loads and stores of them as hazards, not atomics). */
SDPA_DEVICE void flag_release_cta(u32 addr, int v) {
  asm volatile("{ .reg .b32 old; atom.release.cta.shared::cta.exch.b32 old, [%0], %1; }" ::"r"(addr),
               "r"(v)
               : "memory");
}
SDPA_DEVICE int flag_acquire_cta(u32 addr) {
  int v;
  asm volatile("atom.acquire.cta.shared::cta.or.b32 %0, [%1], 0;" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
#endif

/* A consumer warp's reports, lane 0, released to warp 3 (the value: the
 * steps below it have their adds complete; the completed bulk adds are
 * visible to the waiting thread, and the release carries them on; no
 * proxy fence here, which would wait for the newest adds too).
 * fold_report_step: after the warp issued (sent) or skipped the dQ adds
 * of step st (one bulk group); all its bulk groups but the newest FOLD_LAG
 * (FOLD_LAG - 1 when it sent none) completed: steps up to st - FOLD_LAG.
 * fold_report_end: the tile's `steps`, every add completed. */
SDPA_DEVICE void fold_publish(u32 base, int done) {
#if SDPA_FOLD_DQ
  if (SDPA_HOPPER_FOLD_ABLATE) {
    *(volatile int *)shared_generic(base + SMEM_FOLD_PROGRESS + 4 * ((threadIdx.x >> 5) - 4)) = done;
    return;
  }
  flag_release_cta(base + SMEM_FOLD_PROGRESS + 4 * ((threadIdx.x >> 5) - 4), done);
#else
  (void)base, (void)done;
#endif
}
SDPA_DEVICE void fold_report_step(u32 base, int st, bool sent) {
  if (!SDPA_FOLD_DQ || (threadIdx.x & 31) != 0) return;
  if (sent)
    bulk_wait_but<FOLD_LAG>();
  else
    bulk_wait_but<FOLD_LAG - 1>();
  fold_publish(base, st - FOLD_LAG + 1);
}
SDPA_DEVICE void fold_report_end(u32 base, int steps) {
  if (!SDPA_FOLD_DQ || (threadIdx.x & 31) != 0) return;
  bulk_wait_all();
  fold_publish(base, steps);
}

#if SDPA_FOLD_DQ
/* dQ rows of head h from row r0 of the sequence (the first of them at
 * `dq`), row stride dq_seq, from the 16-row fragment-ordered block at
 * shared `s` (sdpa_params.h): rows below sq, times `scale`. 16-byte
 * stores where dQ's rows allow (as the convert kernel's store_dq_rows),
 * else 4-byte ones. */
SDPA_DEVICE void fold_block(u16 *dq, sdpa_i64 dq_seq, bool wide, int r0, int sq, u32 s,
                            float scale) {
  const int lane = threadIdx.x & 31;
  u16 *const rows = dq + (sdpa_i64)r0 * dq_seq;
  if (wide) {
#pragma unroll 1
    for (int i = lane; i < 2 * D; i += 32) { /* 16 rows x D / 8 pieces */
      const int r = i / (D / 8), pc = i - r * (D / 8);
      /* row r, columns 8 pc..: lanes 4 (r % 8) + c of the piece, half r / 8
       * (a lane's floats 16 bytes after the one before it) */
      const u32 at = s + (pc * 128 + frag_at(4 * (r & 7), 2 * (r >> 3))) * 4;
      const float2 a = ld_shared_v2(at), b = ld_shared_v2(at + 16), c = ld_shared_v2(at + 32),
                   d = ld_shared_v2(at + 48);
      if (r0 + r < sq)
        *(uint4 *)(rows + r * dq_seq + pc * 8) =
            make_uint4(pack2<DT>(a.x * scale, a.y * scale), pack2<DT>(b.x * scale, b.y * scale),
                       pack2<DT>(c.x * scale, c.y * scale), pack2<DT>(d.x * scale, d.y * scale));
    }
  } else {
#pragma unroll 1
    for (int i = lane; i < 8 * D; i += 32) { /* 16 rows x D / 2 column pairs */
      const int r = i / (D / 2), col = 2 * (i - r * (D / 2));
      const float2 v =
          ld_shared_v2(s + ((col / 8) * 128 + frag_at(4 * (r & 7) + (col & 7) / 2, 2 * (r >> 3))) * 4);
      if (r0 + r < sq) *(u32 *)(rows + r * dq_seq + col) = pack2<DT>(v.x * scale, v.y * scale);
    }
  }
}

/* Lane 0 of warp 3: 16-row block rb of query tile (h, it)'s dq_accum into
 * conversion buffer u % FOLD_BUFFERS (the addresses derived here, so that
 * little stays live across the conversion on the producer's registers). */
SDPA_DEVICE void fold_load(const sdpa_kernel_params &p, const Work &w, u32 base, int h, int it,
                           int rb, u32 u) {
  const unsigned long long blk_elems = (unsigned long long)(unsigned)p.heads_q * (D * 16);
  const float *src =
      p.dq_accum +
      ((unsigned long long)dq_block_base(p, w.b, w.q0) + (unsigned)(it * (HOP_M / 16) + rb)) *
          blk_elems +
      (unsigned)h * (D * 16);
  const u32 buf = u % FOLD_BUFFERS;
  fence_proxy_async(); /* the warp's reads of the buffer before, ahead of its rewrite */
  mbar_arrive_expect_tx(base + BAR_FOLD(buf), FOLD_BLOCK_BYTES);
  bulk_load(base + SMEM_FOLD + buf * FOLD_BLOCK_BYTES, src, FOLD_BLOCK_BYTES, base + BAR_FOLD(buf));
}

/* Warp 3: query tile (h, it) of the block's sequence, every add into it
 * complete, converted (`loads` counts the block loads before it: the
 * buffers' parities); returns its loads. */
SDPA_DEVICE int fold_convert(const sdpa_kernel_params &p, const Work &w, u32 base, int h, int it,
                             u32 loads) {
  const int lane = threadIdx.x & 31;
  const int blocks = (min(HOP_M, w.sq - it * HOP_M) + 15) / 16;
  fence_proxy_async_global(); /* the acquired adds, before the bulk copies read them */
  if (lane == 0) {
#pragma unroll 1
    for (int rb = 0; rb < blocks && rb < FOLD_BUFFERS; ++rb) fold_load(p, w, base, h, it, rb, loads + rb);
  }
#pragma unroll 1
  for (int rb = 0; rb < blocks; ++rb) {
    const u32 u = loads + rb, s = base + SMEM_FOLD + (u % FOLD_BUFFERS) * FOLD_BLOCK_BYTES;
    mbar_wait(base + BAR_FOLD(u % FOLD_BUFFERS), (u / FOLD_BUFFERS) & 1);
    u16 *const dq = dq_head_rows(p, w.b, w.q0, h);
    fold_block(dq, p.dq_seq, dq_rows_wide(dq, p.dq_seq), it * HOP_M + 16 * rb, w.sq, s, p.scale);
    __syncwarp();
    if (lane == 0 && rb + FOLD_BUFFERS < blocks) /* the buffer read: its next block */
      fold_load(p, w, base, h, it, rb + FOLD_BUFFERS, u);
  }
  return blocks;
}

/* Kv tile 0 of a sequence (w.k0 == 0), every warp of the block before
 * the roles part: dQ = 0 in the query tiles no kv tile visits (tiles
 * taken warp by warp), for the group's query heads. */
SDPA_DEVICE void fold_zero_unseen(const sdpa_kernel_params &p, const Work &w) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
  for (int it = warp; it * HOP_M < w.sq; it += SDPA_WARPS) {
    int first;
    if (band_kv_visitors(w.band, it, HOP_M, HOP_N, w.sq, w.skv, first) > 0) continue;
    const int rows = min(HOP_M, w.sq - it * HOP_M);
#pragma unroll 1
    for (int h = w.hk * p.group; h < (w.hk + 1) * p.group; ++h) {
      u16 *const dq = dq_head_rows(p, w.b, w.q0, h);
#pragma unroll 1
      for (int c = 2 * lane; c < rows * D; c += 64)
        *(u32 *)(dq + (sdpa_i64)(it * HOP_M + c / D) * p.dq_seq + c % D) = 0u;
    }
  }
}

/* Step st's query tile and head (advance_step's order from it_first). */
SDPA_DEVICE void fold_step_tile(const Work &w, int st, int &h, int &it) {
  const int span = w.it_hi - w.it_lo + 1, k = st % span;
  h = w.h_first + st / span;
  it = w.it_lo + (w.it_first - w.it_lo + k) % span;
}

/* Warp 3 of a block with work: the block's steps in order, in batches of
 * up to 32 (lane i the batch's step i): once every consumer warp has
 * reported their adds complete, one count each into the steps' query
 * tiles, issued together (their round trips overlap, so that the warp
 * keeps up with the consumers after a conversion); the block whose count
 * completes a tile converts it. */
SDPA_DEVICE void fold_dq(const sdpa_kernel_params &p, u32 base, const unsigned char *smem) {
  const Work &w = *(const Work *)(smem + SMEM_WORK);
  const int lane = threadIdx.x & 31;
  if (SDPA_HOPPER_FOLD_ABLATE == 2) return;
  /* the loop's state in shared memory (after the reports), so that the
   * conversion has the warp's few registers: [0] the next step, [1] the
   * block loads so far, [2] the batch's tiles left to convert */
  volatile int *state = (volatile int *)(smem + SMEM_FOLD_PROGRESS) + FOLD_WARPS;
  if (lane == 0) state[0] = state[1] = 0;
  __syncwarp();
#pragma unroll 1
  while (state[0] < w.steps) {
    int avail;
    do { /* the steps every consumer warp has done */
      int seen = 0x7fffffff;
      if (lane < FOLD_WARPS) seen = flag_acquire_cta(base + SMEM_FOLD_PROGRESS + 4 * lane);
      avail = __reduce_min_sync(0xffffffffu, seen);
      if (avail <= state[0]) __nanosleep(64);
    } while (avail <= state[0]);
    __syncwarp(); /* the acquired reports, for every lane's count */
    const int st = state[0], n = min(avail - st, 32);
    int last = 0;
    if (lane < n) {
      int h, it, first;
      fold_step_tile(w, st + lane, h, it);
      const int visitors = band_kv_visitors(w.band, it, HOP_M, HOP_N, w.sq, w.skv, first);
      sdpa_i32 *const counter = q_tile_counter_of<unsigned long long>(p.semaphores, p, h, w.b, it);
      last = (SDPA_HOPPER_FOLD_ABLATE == 3 ? atom_add_release_gpu(counter)
                                           : atom_add_acq_rel_gpu(counter)) == visitors - 1;
    }
    const unsigned todo = __ballot_sync(0xffffffffu, last);
    if (SDPA_HOPPER_FOLD_ABLATE == 3 && todo) fence_acq_rel_gpu(); /* the other counts' adds */
    __syncwarp();
    if (lane == 0) state[2] = (int)todo;
    __syncwarp();
#pragma unroll 1
    while (state[2] != 0) {
      const unsigned left = (unsigned)state[2];
      int h, it;
      fold_step_tile(w, state[0] + __ffs(left) - 1, h, it);
      const int blocks = fold_convert(p, w, base, h, it, (u32)state[1]);
      __syncwarp();
      if (lane == 0) state[1] += blocks, state[2] = (int)(left & (left - 1));
      __syncwarp();
    }
    if (lane == 0) state[0] += n;
    __syncwarp();
  }
}
#endif
