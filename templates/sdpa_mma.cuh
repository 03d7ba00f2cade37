/*
 * sdpa_mma.cuh - warp-level building blocks for the sm_80+ kernels:
 * 16-bit element conversions, cp.async copies, ldmatrix loads and the
 * m16n8k16 tensor-core MMA, plus a warp GEMM over padded shared memory.
 *
 * No toolkit header is included: everything is inline PTX, so NVRTC
 * needs only the files embedded with the runtime.
 *
 * Fragment layout of mma.m16n8k16 (g = lane / 4, t = lane % 4):
 *   A (16x16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..),
 *                         a3 (g+8, 2t+8..)
 *   B (16x8, "col"):      b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
 *   C (16x8, fp32):       c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
 * ldmatrix.x4 gives register j the 8x8 matrix whose row addresses lanes
 * 8j..8j+7 supplied; lane l holds row l/4, elements 2(l%4), 2(l%4)+1
 * (of the transposed matrix with .trans).
 *
 * Shared-memory tiles are row-major with rows padded by 8 elements
 * (16 bytes), so the 8 row addresses of one ldmatrix matrix fall in
 * distinct 16-byte bank groups for every head_dim used here.
 */
#ifndef SDPA_MMA_CUH
#define SDPA_MMA_CUH

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define SDPA_DEVICE __device__ __forceinline__

/* ---------------------------------------------------------- conversions */

/* Two floats to a packed pair of 16-bit values (lo in bits 0..15). */
template <int DTYPE> SDPA_DEVICE u32 pack2(float lo, float hi);
template <> SDPA_DEVICE u32 pack2<1>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> SDPA_DEVICE u32 pack2<2>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <int DTYPE> SDPA_DEVICE float to_float(u16 x);
template <> SDPA_DEVICE float to_float<1>(u16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
}
template <> SDPA_DEVICE float to_float<2>(u16 x) {
  return __uint_as_float(((u32)x) << 16);
}

/* Packed product of two bf16x2 pairs, rounded once (fma with -0). */
SDPA_DEVICE u32 mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}

SDPA_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* ------------------------------------------------------ shared addresses */

SDPA_DEVICE u32 smem_u32(const void *p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
      : "=r"(r) : "l"(p));
  return r;
}

/* The generic pointer of shared address a, made where it is used (volatile:
 * not one kept from earlier in registers). */
SDPA_DEVICE const void *shared_generic(u32 a) {
  const void *p;
  asm volatile("cvta.shared.u64 %0, %1;" : "=l"(p) : "l"((unsigned long long)a));
  return p;
}

/* ------------------------------------------------------------- cp.async */

/* 16 bytes global -> shared; when !valid the destination is zero-filled
 * and nothing is read. */
SDPA_DEVICE void cp_async16(u32 dst, const void *src, bool valid) {
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(n));
}
/* 4 bytes global -> shared, zero-filled when !valid. */
SDPA_DEVICE void cp_async4(u32 dst, const void *src, bool valid) {
  int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"(dst), "l"(src), "r"(n));
}
SDPA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> SDPA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}

/* dq_accum's fragment order (sdpa_params.h): float e of lane `lane` in a
 * 128-float piece holding one m16n8 accumulator tile. On sm_90 a lane's
 * four floats are adjacent (one 16-byte vector reduction, 512 contiguous
 * bytes a warp); before, each of the four scalar reductions of a warp
 * covers 128 contiguous bytes. */
SDPA_DEVICE int frag_at(int lane, int e) {
#if __CUDA_ARCH__ >= 900
  return lane * 4 + e;
#else
  return e * 32 + lane;
#endif
}

/* Adds one lane's m16n8 accumulator values to the piece at `piece`. */
SDPA_DEVICE void red_frag(float *piece, int lane, const float (&v)[4]) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
               :: "l"(piece + lane * 4), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
               : "memory");
#else
#pragma unroll
  for (int e = 0; e < 4; ++e) atomicAdd(piece + frag_at(lane, e), v[e]);
#endif
}

/* ------------------------------------------------------------- ldmatrix */

SDPA_DEVICE void ldsm_x4(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
SDPA_DEVICE void ldsm_x4_t(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
      : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

/* Stores a warp's 16-bit tile of TM x TN (rows of `ld` elements, `base`
 * at the tile's first element), held as packed mma C fragments:
 * v[mi][hf][nj] = rows 16mi + 8hf + lane/4, columns 8nj + 2(lane%4), +1,
 * four 8x8 matrices per stmatrix (sm_90 and later): lane l addresses row
 * l%8 of matrix l/8, whose fragment layout is ldmatrix's. */
template <int TM, int TN>
SDPA_DEVICE void store_frags(u16 *base, int ld, const u32 (&v)[TM / 16][2][TN / 8]) {
#if __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31, q = lane >> 3, i = lane & 7;
  const u32 a = smem_u32(base + (i + (q & 1) * 8) * ld + (q >> 1) * 8);
#pragma unroll
  for (int mi = 0; mi < TM / 16; ++mi)
#pragma unroll
    for (int nj = 0; nj < TN / 8; nj += 2)
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};"
                   :: "r"(a + (mi * 16 * ld + nj * 8) * 2), "r"(v[mi][0][nj]),
                      "r"(v[mi][1][nj]), "r"(v[mi][0][nj + 1]), "r"(v[mi][1][nj + 1])
                   : "memory");
#else
  (void)base; (void)ld; (void)v;
#endif
}

/* ------------------------------------------------------------------ mma */

template <int DTYPE>
SDPA_DEVICE void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1);
template <>
SDPA_DEVICE void mma16816<1>(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
SDPA_DEVICE void mma16816<2>(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ------------------------------------------------------------ warp GEMM */

/*
 * acc[WM x WN] += A[WM x KD] * B[KD x WN] for one warp, operands in padded
 * shared memory (element strides lda, ldb).
 *   A_T = false: A stored [row][k] at a + row*lda + k   (ldmatrix)
 *   A_T = true:  A stored [k][row] at a + k*lda + row   (ldmatrix.trans)
 *   B_T = false: B stored [n][k]   at b + n*ldb + k     (ldmatrix)
 *   B_T = true:  B stored [k][n]   at b + k*ldb + n     (ldmatrix.trans)
 * a and b point at the warp tile's first row/col and k = 0. acc[mi][nj] is
 * the m16n8 tile (mi, nj) in the C layout above.
 */
template <int DTYPE, int WM, int WN, int KD, bool A_T, bool B_T>
SDPA_DEVICE void warp_gemm(float (&acc)[WM / 16][WN / 8][4], const u16 *a,
                           int lda, const u16 *b, int ldb) {
  const int lane = threadIdx.x & 31;
  const int li = lane & 7, lq = lane >> 3;
  /* Per-lane element offsets of the 16x16 block at (0, 0). */
  int a_off, b_off;
  if (!A_T) a_off = (li + (lq & 1) * 8) * lda + (lq >> 1) * 8;
  else      a_off = (li + (lq >> 1) * 8) * lda + (lq & 1) * 8;
  if (!B_T) b_off = (li + (lq >> 1) * 8) * ldb + (lq & 1) * 8;
  else      b_off = (li + (lq & 1) * 8) * ldb + (lq >> 1) * 8;
  const u32 a_base = smem_u32(a + a_off);
  const u32 b_base = smem_u32(b + b_off);
#pragma unroll
  for (int kk = 0; kk < KD; kk += 16) {
    u32 af[WM / 16][4];
#pragma unroll
    for (int mi = 0; mi < WM / 16; ++mi) {
      const int off = A_T ? (kk * lda + mi * 16) : (mi * 16 * lda + kk);
      if (!A_T) ldsm_x4(a_base + off * 2, af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
      else      ldsm_x4_t(a_base + off * 2, af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
    }
    /* B fragments are loaded per 16 columns and used at once, so a wide
     * warp tile does not hold all of them live. */
#pragma unroll
    for (int nj = 0; nj < WN / 16; ++nj) {
      u32 bf[4];
      const int off = B_T ? (kk * ldb + nj * 16) : (nj * 16 * ldb + kk);
      if (!B_T) ldsm_x4(b_base + off * 2, bf[0], bf[1], bf[2], bf[3]);
      else      ldsm_x4_t(b_base + off * 2, bf[0], bf[1], bf[2], bf[3]);
#pragma unroll
      for (int mi = 0; mi < WM / 16; ++mi) {
        mma16816<DTYPE>(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
        mma16816<DTYPE>(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
      }
    }
  }
}

template <int R, int C>
SDPA_DEVICE void zero_acc(float (&acc)[R][C][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

#endif /* SDPA_MMA_CUH */
