/*
 * sdpa_wgmma.cuh - sm_90a building blocks as inline PTX (no toolkit
 * header): warpgroup MMAs (wgmma.mma_async, operands from shared memory
 * through matrix descriptors, or A from registers), their fences, commit
 * groups and waits; shared-memory matrix descriptors for the 128-byte
 * swizzle; mbarriers (init, arrive, expect-tx, parity waits); bulk tensor
 * copies (TMA) completing on an mbarrier; the async-proxy fence; register
 * reallocation (setmaxnreg); named barriers.
 *
 * Reads SDPA_DTYPE (1 fp16, 2 bf16) for the wgmma operand type.
 *
 * wgmma (m64nNk16, fp32 accumulators, one warpgroup = 4 consecutive warps
 * whose first warp index is a multiple of 4). Accumulator layout: warp w
 * of the warpgroup holds rows 16w + lane/4 and 16w + lane/4 + 8; element
 * d[4j + e] is row 16w + lane/4 + 8*(e/2), column 8j + 2*(lane%4) + e%2
 * (every 8-column slice is one m16n8 accumulator fragment). A from
 * registers (RS): per warp the m16n8k16 A fragment of its 16 rows,
 * a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..),
 * a3 (row g+8, k 2t+8..), g = lane/4, t = lane%4.
 *
 * Shared-memory operands, 16-bit elements, 128-byte swizzle (the layout
 * TMA writes with CU_TENSOR_MAP_SWIZZLE_128B): a tile is stored as boxes
 * of 64 columns, each box `rows` rows of 128 bytes, the 16-byte chunk c
 * of row r at chunk c ^ (r % 8), every box 1024-byte aligned.
 *   K-major operand (the reduction index k runs along the 128-byte row):
 *     start = row 0 of the operand, + 2*(k0 % 64) bytes, in box k0 / 64;
 *     SBO = 1024 (8 rows to the next 8), LBO unused (16).
 *   MN-major operand (M or N runs along the row, k down the rows; the
 *     transpose flag set): start = row k0, + 2*(mn0 % 64) bytes;
 *     LBO = the box stride (64 M/N columns to the next 64), SBO = 1024
 *     (8 k rows to the next 8). N need not be a multiple of 64: from a
 *     box's start, any N = 8k reads whole boxes and then the first N % 64
 *     columns of the next (checked on the H200 against float64, head dims
 *     72-248 of the sm_90a family).
 */
#ifndef SDPA_WGMMA_CUH
#define SDPA_WGMMA_CUH

#include "sdpa_mma.cuh"

#if SDPA_DTYPE == 1
#define SDPA_WGMMA_AB "f16.f16"
#else
#define SDPA_WGMMA_AB "bf16.bf16"
#endif

/* ------------------------------------------------------------ descriptors */

/* Matrix descriptor of a 128-byte-swizzled operand at shared address
 * `addr` (bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63
 * layout 1 = 128-byte swizzle; base offset 0: boxes are 1024-aligned). */
SDPA_DEVICE u64 gmma_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr >> 4) & 0x3fff) | ((u64)((lbo >> 4) & 0x3fff) << 16) |
         ((u64)((sbo >> 4) & 0x3fff) << 32) | (1ull << 62);
}

/* The descriptors of a GEMM's k steps, `offset` bytes past a base
 * address (lbo, sbo fixed). STEP: made from an opaque base where the GEMM
 * is issued, each step's as the base's plus offset / 16 (shared addresses
 * end below 2^18, so the 14-bit field of addr >> 4 does not carry), so
 * that the compiler can neither hoist them out of a loop (a register each,
 * held across it) nor fold them; else each from its address. */
template <u32 LBO, u32 SBO, bool STEP> struct gmma_descs {
  u32 addr;
  u64 base = 0;
  SDPA_DEVICE explicit gmma_descs(u32 a) : addr(a) {
    if constexpr (STEP) {
      asm volatile("" : "+r"(addr));
      base = gmma_desc(addr, LBO, SBO);
    }
  }
  /* offset + more bytes on (in that order from the address: the
   * expression the compiler schedules best where descriptors are not made
   * in the step) */
  SDPA_DEVICE u64 at(u32 offset, u32 more = 0) const {
    if constexpr (STEP)
      return base + ((offset + more) >> 4);
    else
      return gmma_desc(addr + offset + more, LBO, SBO);
  }
};

/* ------------------------------------------------------------------ wgmma */

SDPA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
SDPA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int PENDING> SDPA_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(PENDING) : "memory");
}

/* Orders the compiler's view of registers against the asynchronous MMAs:
 * after a wait, reads of the accumulators must not be hoisted above it. */
template <int K> SDPA_DEVICE void reg_fence(float (&r)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

#include "sdpa_wgmma_ops.cuh" /* wgmma_ss<N, TA, TB>, wgmma_rs<N, TB>: every N = 8k <= 128 */

/* -------------------------------------------------------------- mbarriers */

SDPA_DEVICE void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialized barriers visible to the async proxy (TMA). */
SDPA_DEVICE void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
SDPA_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Arrives and raises the barrier's expected transaction bytes. */
SDPA_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
/* Whether the phase of parity `parity` has completed (a bounded wait). */
SDPA_DEVICE bool mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{ .reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p; }"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
/* Waits until the phase of parity `parity` has completed. */
SDPA_DEVICE void mbar_wait(u32 bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

/* ------------------------------------------------------------------- TMA */

SDPA_DEVICE void tma_prefetch_map(const void *map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
/* Box at coordinates {c0, c1, c2[, c3]} of `map` into shared `dst`,
 * completing `bytes` on mbarrier `bar`. */
SDPA_DEVICE void tma_load_3d(u32 dst, const void *map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
SDPA_DEVICE void tma_load_4d(u32 dst, const void *map, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

/* Bulk reduce-add of `bytes` (a multiple of 16) fp32 values from shared
 * `src` into global `dst` (16-byte aligned), in this thread's bulk
 * group; committed at once (COMMIT), or left for bulk_commit to close
 * the group with the adds after it. */
SDPA_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <bool COMMIT = true>
SDPA_DEVICE void bulk_reduce_add_f32(float *dst, u32 src, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                   dst),
               "r"(src), "r"(bytes)
               : "memory");
  if (COMMIT) bulk_commit();
}
/* Bulk copy of `bytes` (a multiple of 16) from global `src` into shared
 * `dst` (both 16-byte aligned), completing on mbarrier `bar`. */
SDPA_DEVICE void bulk_load(u32 dst, const void *src, u32 bytes, u32 bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
/* The same bytes stored, not added (measurement: SDPA_HOPPER_ABLATE 5). */
SDPA_DEVICE void bulk_store(float *dst, u32 src, u32 bytes) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
}
/* Waits until the bulk groups of this thread have read their sources /
 * have completed. */
SDPA_DEVICE void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
SDPA_DEVICE void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
/* Waits until at most PENDING of this thread's newest bulk groups have
 * not completed. */
template <int PENDING> SDPA_DEVICE void bulk_wait_but() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(PENDING) : "memory");
}
SDPA_DEVICE void st_shared_v4(u32 addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}
SDPA_DEVICE float2 ld_shared_v2(u32 addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
SDPA_DEVICE float4 ld_shared_v4(u32 addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

/* Generic-proxy writes to shared memory (st.shared, stmatrix) made visible
 * to the async proxy (wgmma operands, bulk copies); each writing thread
 * runs it before the barrier that hands the data over. */
SDPA_DEVICE void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
/* Orders this thread's generic accesses to global memory with its bulk
 * (async proxy) operations on it, both ways. */
SDPA_DEVICE void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

/* ------------------------------------------------------- warps, registers */

template <int REGS> SDPA_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS> SDPA_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}
/* Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads. */
SDPA_DEVICE void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
/* The same barrier where its threads reach it through different
 * instructions (bar.sync is barrier.sync.aligned: one instruction for
 * all of them). */
SDPA_DEVICE void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
/* Arrives on named barrier `id` without waiting (a producer's side of a
 * hand-off: the threads that wait sync on it, the barrier counting both). */
SDPA_DEVICE void named_barrier_arrive_unaligned(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

#endif /* SDPA_WGMMA_CUH */
