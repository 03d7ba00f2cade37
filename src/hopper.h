/*
 * hopper.h — the sm_90a family (wgmma + TMA, warp-specialized) on the host:
 * what it covers, its tiles and launch shape, and the tensor maps its main
 * kernel reads through.
 *
 * The plan asks sdpa_hopper_covers() whether the family can run a
 * descriptor with its options (AUTO takes it on sm_90 when it can; the
 * reason is recorded either way) and sdpa_hopper_config_select() for its
 * tiles; execute asks sdpa_hopper_tensor_maps() for the maps of the call's
 * pointers (templates/sdpa_tensor_maps.h says how each is encoded). The
 * configuration itself lives in templates/sdpa_hopper_traits.h, read by
 * the kernel as well.
 */
#ifndef SDPA_HOPPER_H
#define SDPA_HOPPER_H

#include <stddef.h>

#include "driver.h"
#include "key_fields.h"
#include "sdpa_jit.h"
#include "../templates/sdpa_params.h"
#include "../templates/sdpa_tensor_maps.h"

/* Whether SDPA_FAMILY_AUTO takes the Hopper family where it covers the
 * descriptor (1), or only a plan that asks for it does (0). */
#define SDPA_HOPPER_BY_DEFAULT 1
/* Whether AUTO takes it for deterministic plans too (1: its ordered dQ
 * adds are bitwise reproducible and faster than the mma.sync family's,
 * bench/RESULTS.md), or only a plan that asks for it does (0). */
#define SDPA_HOPPER_DETERMINISTIC_BY_DEFAULT 1

/* Whether a plan that leaves options.dq_writer to the runtime (DEFAULT,
 * SDPA_JIT_DQ_CONVERT unset) has the main kernel write dQ where the
 * family can (sdpa_hopper_fold_by_default), or the convert kernel (0). */
#define SDPA_HOPPER_FOLD_BY_DEFAULT 0

/* 1 when the Hopper family runs `d` (resolved) with options `o`; `why`
 * gets a sentence either way ("covers this descriptor" or what it does
 * not cover: the arch, head dims, determinism under AUTO, the dQ writer,
 * strides the bulk copies cannot express). */
int sdpa_hopper_covers(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o, char *why,
                       size_t why_size);

/* The family's tiles for a covered descriptor: fills the tile fields of
 * `f` and *smem_bytes (NOT_SUPPORTED past the arch's shared memory). */
sdpa_status sdpa_hopper_config_select(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o,
                                      sdpa_key_fields *f, int *smem_bytes);

/* The blocks a kv tile's query heads are split over in a Hopper plan of
 * `d` (resolved) with options `o` whose dQ the convert kernel writes
 * (sdpa_hopper_head_chunks; grid y at most 65535). */
int sdpa_hopper_split_heads(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o);

/* 1 when a Hopper plan of `d` (resolved) whose options `o` leave the dQ
 * writer to the runtime has its main kernel write dQ: under
 * SDPA_HOPPER_FOLD_BY_DEFAULT, where the kernel can
 * (sdpa_hopper_fold_covers) and the plan would not split a kv tile's
 * query heads over blocks (sdpa_hopper_head_chunks 1: their dK / dV go
 * through the convert kernel). */
int sdpa_hopper_fold_by_default(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o);

/* Threads per block and blocks in x of the family's main kernel. */
int sdpa_hopper_block_threads(const sdpa_key_fields *f);
long long sdpa_hopper_blocks_x(const sdpa_key_fields *f, int seqlen_kv, int batch);

/* Blocks of the main kernel's launch when it is persistent
 * (sdpa_hopper_persistent_kernel in templates/sdpa_hopper_traits.h) over
 * `tiles` tiles (blocks_x * heads_kv) on sm_count multiprocessors: one
 * an SM, fewer for fewer tiles; 0 when it is not persistent or sm_count
 * is unknown (launch blocks_x x heads_kv, one block a tile: the kernel
 * runs either way). */
long long sdpa_hopper_persistent_grid(const sdpa_key_fields *f, long long tiles, int sm_count);

/* Encodes the call's four tensor maps (q, k, v, dout) from the bound
 * parameter block `p` (pointers, strides, THD token totals) through the
 * driver's cuTensorMapEncodeTiled. NOT_SUPPORTED when the driver lacks it;
 * DRIVER_ERROR (naming the tensor) when it refuses one. */
sdpa_status sdpa_hopper_tensor_maps(const sdpa_driver *drv, const sdpa_key_fields *f,
                                    const sdpa_bwd_desc *d, const sdpa_kernel_params *p,
                                    sdpa_tensor_maps *out);

#endif /* SDPA_HOPPER_H */
