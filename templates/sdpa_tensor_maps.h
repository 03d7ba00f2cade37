/*
 * sdpa_tensor_maps.h - the bulk-tensor-copy (TMA) descriptors of the sm_90a
 * family, passed to its main kernel as a second by-value parameter
 * (`const __grid_constant__ sdpa_tensor_maps maps`). Plain C, included by
 * the host (C11) and by NVRTC: a slot is an opaque, 64-byte-aligned copy
 * of the driver's CUtensorMap (128 bytes), which the host fills with
 * cuTensorMapEncodeTiled and memcpy's in (static_assert on the host that
 * sizeof(CUtensorMap) == sizeof(sdpa_tensor_map)).
 *
 * How each map must be encoded (every one the same way):
 *   data type   CU_TENSOR_MAP_DATA_TYPE_FLOAT16 (SDPA_DTYPE 1) or
 *               CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 (SDPA_DTYPE 2)
 *   interleave  CU_TENSOR_MAP_INTERLEAVE_NONE
 *   swizzle     CU_TENSOR_MAP_SWIZZLE_128B   (the kernel's wgmma
 *               descriptors and its dS stores assume this pattern)
 *   L2          CU_TENSOR_MAP_L2_PROMOTION_L2_256B
 *   OOB fill    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE (out-of-bounds elements
 *               read as zero; the kernel relies on that for rows past a
 *               BSHD sequence and columns past the head dim)
 *   element strides all 1.
 *   Dimensions, innermost first, and byte strides of dims 1.. from the
 *   descriptor's element strides (x2 bytes); `cols` is the tensor's last
 *   dim (head_dim for q, k; head_dim_v for v, dout):
 *     BSHD, rank 4: dims {cols, seqlen, heads, batch},
 *                   strides {seq*2, head*2, batch*2}
 *                   (batch == 1: the batch stride is never used; give any
 *                   multiple of 16 below 2^40, e.g. seq*2*seqlen)
 *     THD,  rank 3: dims {cols, total_tokens, heads},
 *                   strides {seq*2, head*2}
 *                   total_tokens = the call's total_q (q, dout) or
 *                   total_kv (k, v): the real totals, not the plan's
 *                   bounds, so that no row past the tensor is read
 *                   (total 0: encode 1 row; no block reads it).
 *     seqlen / heads are seqlen_q, heads_q for q and dout and seqlen_kv,
 *     heads_kv for k and v.
 *   Box: {SDPA_HOPPER_BOX_COLS (64), rows, 1, 1} (rank 3: {64, rows, 1}),
 *     rows = SDPA_Q_TILE for q and dout, SDPA_KV_TILE for k and v. A
 *     head dim of more than 64 columns is loaded as ceil(cols / 64) boxes
 *     (the last one zero-filled past cols).
 *   Requirements the descriptor checks already give: base addresses 16-byte
 *   aligned, strides multiples of 16 bytes (8 elements).
 *
 * What the kernel assumes of them: box {64, rows, 1, 1} lands in shared
 * memory as `rows` rows of 128 bytes in the 128-byte swizzle; a box's
 * coordinates are {64 * i, row, head, batch} (THD {64 * i, token, head}),
 * rows past dims[1] (the end of a BSHD sequence, or of the THD token
 * total) read as zero, and rows of the next THD sequence are read and
 * masked by the kernel.
 */
#ifndef SDPA_TENSOR_MAPS_H
#define SDPA_TENSOR_MAPS_H

/* One CUtensorMap, opaque: 128 bytes, 64-byte aligned. */
typedef struct __attribute__((aligned(64))) sdpa_tensor_map {
  unsigned long long opaque[16];
} sdpa_tensor_map;

/* The maps of one call, in this order. */
typedef struct sdpa_tensor_maps {
  sdpa_tensor_map q;    /* [.., head_dim]   box rows SDPA_Q_TILE  */
  sdpa_tensor_map k;    /* [.., head_dim]   box rows SDPA_KV_TILE */
  sdpa_tensor_map v;    /* [.., head_dim_v] box rows SDPA_KV_TILE */
  sdpa_tensor_map dout; /* [.., head_dim_v] box rows SDPA_Q_TILE  */
} sdpa_tensor_maps;

#ifdef __cplusplus
static_assert(sizeof(sdpa_tensor_map) == 128, "one CUtensorMap");
static_assert(sizeof(sdpa_tensor_maps) == 4 * 128, "four maps, no padding");
#else
_Static_assert(sizeof(sdpa_tensor_map) == 128, "one CUtensorMap");
_Static_assert(sizeof(sdpa_tensor_maps) == 4 * 128, "four maps, no padding");
#endif

#endif /* SDPA_TENSOR_MAPS_H */
