/*
 * sdpa_seq.cuh - where a sequence lies, for every kernel of every family:
 * the mask's band of visible keys, a sequence's bounds (BSHD lengths, or
 * THD offsets from cu_seqlens with the device-side max_s guard), the
 * element offset of a kv row, and a sequence's first 16-row block of the
 * dQ accumulator (layout in sdpa_params.h).
 *
 * Reads the key defines SDPA_MASK and SDPA_LAYOUT.
 */
#ifndef SDPA_SEQ_CUH
#define SDPA_SEQ_CUH

#include "sdpa_params.h"
#include "sdpa_mma.cuh"

/* Band of visible keys for one sequence. */
struct Band {
  int off, left, right; /* left/right < 0: unbounded */
};

SDPA_DEVICE Band make_band(const sdpa_kernel_params &p, int sq, int skv) {
  Band b;
#if SDPA_MASK == 0
  b.off = 0; b.left = -1; b.right = -1;
#elif SDPA_MASK == 1
  b.off = 0; b.left = -1; b.right = 0;
#elif SDPA_MASK == 2
  b.off = skv - sq; b.left = -1; b.right = 0;
#else
  b.off = skv - sq; b.left = p.window_left; b.right = p.window_right;
#endif
  (void)p; (void)sq; (void)skv;
  return b;
}

/* The first kv tile (of `n` keys) that visits a query tile starting at
 * row i: its lowest visible key is i + off - left under a left window,
 * else key 0 (the deterministic dQ adds' order starts there). */
SDPA_DEVICE int band_first_kv_tile(const Band &band, int i, int n) {
  return band.left >= 0 ? max(0, i + band.off - band.left) / n : 0;
}

/* The last kv tile (of `n` keys, of a sequence of skv keys) that visits
 * the query tile of rows i..i_end (i_end < sq, the sequence's last row
 * at most), under a band with a right bound (band.right >= 0): its
 * highest visible key is i_end + off + right. Meant for tiles some kv
 * tile visits (then that key is >= 0). */
SDPA_DEVICE int band_last_kv_tile(const Band &band, int i_end, int skv, int n) {
  return min((skv + n - 1) / n - 1, (i_end + band.off + band.right) / n);
}

/* The kv tiles (of `n` keys) that see query tile `it` (of `m` rows: rows
 * [it*m, min(it*m + m, sq))) of a sequence of sq queries and skv keys:
 * the count of them, from kv tile `first` on. The same predicate as a
 * main kernel's query-tile range of a kv tile (some row of the one sees
 * some key of the other), so it counts exactly the blocks that add into
 * the tile's dQ. */
SDPA_DEVICE int band_kv_visitors(const Band &band, int it, int m, int n, int sq, int skv,
                                 int &first) {
  const int i0 = it * m, i_last = min(i0 + m, sq) - 1;
  int kmin = 0, kmax = skv - 1;
  if (band.left >= 0) kmin = max(kmin, i0 + band.off - band.left);
  if (band.right >= 0) kmax = min(kmax, i_last + band.off + band.right);
  first = kmin / n;
  return kmin <= kmax ? kmax / n - kmin / n + 1 : 0;
}

/* A non-negative index widened to 64 bits: sdpa_i64, or with zeros to
 * unsigned, where no sign word may be kept live (the sm_90a dQ writers
 * run on the producer's few registers); W() picks the type. */
SDPA_DEVICE sdpa_i64 sdpa_widen(int x, sdpa_i64) { return x; }
SDPA_DEVICE unsigned long long sdpa_widen(int x, unsigned long long) { return (unsigned)x; }

/* The counter of query tile `it` of head h, sequence b in p.semaphores
 * (zeroed by the preprocess kernel). Deterministic kernels (both
 * families) keep their dQ adds' turns in it: how many of the kv tiles
 * that visit the tile (from band_first_kv_tile on, in index order; the
 * sm_90a kernels may order them by a rotation without a mask, or
 * from band_last_kv_tile down under a right-bounded mask, sdpa_hopper.cuh's
 * dq_rank) have completed their adds. A kv tile of
 * rank r (in index order, its index minus the first's)
 * waits until it reads r (dq_turn_wait), adds, and once its adds are
 * complete stores r + 1 (dq_turn_pass). The folded dQ conversion counts
 * its visitors' arrivals in it. */
template <typename W = sdpa_i64>
SDPA_DEVICE sdpa_i32 *q_tile_counter_of(sdpa_i32 *counters, const sdpa_kernel_params &p, int h,
                                        int b, int it) {
  return counters +
         ((sdpa_widen(h, W()) * sdpa_widen(p.batch, W()) + sdpa_widen(b, W())) *
              sdpa_widen(p.q_tiles, W()) +
          sdpa_widen(it, W()));
}
SDPA_DEVICE sdpa_i32 *q_tile_counter(const sdpa_kernel_params &p, int h, int b, int it) {
  return q_tile_counter_of(p.semaphores, p, h, b, it);
}
/* A counter's add of 1 at gpu scope, release or acquire-release
 * (returns the count before), and the fence of acquire-release strength. */
SDPA_DEVICE int atom_add_release_gpu(sdpa_i32 *counter) {
  int old;
  asm volatile("atom.release.gpu.global.add.s32 %0, [%1], 1;"
               : "=r"(old)
               : "l"(counter)
               : "memory");
  return old;
}
SDPA_DEVICE int atom_add_acq_rel_gpu(sdpa_i32 *counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
               : "=r"(old)
               : "l"(counter)
               : "memory");
  return old;
}
SDPA_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

SDPA_DEVICE void dq_turn_wait(const sdpa_i32 *sem, int rank) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(sem) : "memory");
  } while (seen != rank);
}
SDPA_DEVICE void dq_turn_pass(sdpa_i32 *sem, int next) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(sem), "r"(next) : "memory");
}

/* Sequence bounds of batch entry / sequence `b`: first row of q and kv in
 * the row space of the workspace, lengths. Returns false (and flags the
 * error once) when THD offsets are inconsistent with the launch. */
SDPA_DEVICE bool sequence_bounds(const sdpa_kernel_params &p, int b,
                                 sdpa_i64 &q0, sdpa_i64 &kv0, int &sq,
                                 int &skv, bool report) {
#if SDPA_LAYOUT == 1
  q0 = (sdpa_i64)b * p.seqlen_q;
  kv0 = (sdpa_i64)b * p.seqlen_kv;
  sq = p.seqlen_q;
  skv = p.seqlen_kv;
  (void)report;
  return true;
#else
  const sdpa_i64 qa = p.cu_seqlens_q[b], qb = p.cu_seqlens_q[b + 1];
  const sdpa_i64 ka = p.cu_seqlens_kv[b], kb = p.cu_seqlens_kv[b + 1];
  int err = 0;
  if (qa < 0 || qb < qa || qb > p.rows_q || ka < 0 || kb < ka || kb > p.rows_kv)
    err |= SDPA_DEVICE_ERR_OFFSETS;
  else {
    if (qb - qa > p.seqlen_q) err |= SDPA_DEVICE_ERR_SEQLEN_Q;
    if (kb - ka > p.seqlen_kv) err |= SDPA_DEVICE_ERR_SEQLEN_KV;
  }
  if (err) {
    if (report) *(volatile sdpa_i32 *)p.error_flag = err; /* host-mapped */
    return false;
  }
  q0 = qa; kv0 = ka;
  sq = (int)(qb - qa);
  skv = (int)(kb - ka);
  return true;
#endif
}

/* Element offset of kv row k0 of kv head hk in sequence b (starting at
 * token kv0 under THD) of a tensor with these strides. */
SDPA_DEVICE sdpa_i64 kv_row_offset(int b, sdpa_i64 kv0, int k0, int hk, sdpa_i64 s_batch,
                                   sdpa_i64 s_seq, sdpa_i64 s_head) {
#if SDPA_LAYOUT == 1
  (void)kv0;
  return (sdpa_i64)b * s_batch + (sdpa_i64)k0 * s_seq + (sdpa_i64)hk * s_head;
#else
  (void)b; (void)s_batch;
  return (kv0 + k0) * s_seq + (sdpa_i64)hk * s_head;
#endif
}

/* First 16-row block of dq_accum owned by sequence `b` (sdpa_params.h). */
SDPA_DEVICE sdpa_i64 dq_block_base(const sdpa_kernel_params &p, int b, sdpa_i64 q0) {
#if SDPA_LAYOUT == 1
  (void)q0;
  return (sdpa_i64)b * p.q_blocks;
#else
  return q0 / 16 + b;
#endif
}

#endif /* SDPA_SEQ_CUH */
