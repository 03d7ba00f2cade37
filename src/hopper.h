/*
 * hopper.h — the sm_90a family (wgmma + TMA, warp-specialized) on the host:
 * what it covers, its tiles, and the tensor maps its main kernel reads
 * through.
 *
 * The plan asks sdpa_hopper_covers() whether the family can run a
 * descriptor (AUTO takes it on sm_90 when it can; the reason is recorded
 * either way) and sdpa_hopper_config_select() for its tiles; execute asks
 * for the tensor maps of the call's pointers.
 */
#ifndef SDPA_HOPPER_H
#define SDPA_HOPPER_H

#include <stddef.h>

#include "key_fields.h"
#include "sdpa_jit.h"

/* 1 when the Hopper family runs `d` (resolved) with options `o`; `why`
 * gets a sentence either way ("sm_90, head_dim 128: covered" or what it
 * does not cover). */
int sdpa_hopper_covers(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o, char *why,
                       size_t why_size);

/* The family's tiles for a covered descriptor: fills the tile fields of
 * `f` and *smem_bytes. */
sdpa_status sdpa_hopper_config_select(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o,
                                      sdpa_key_fields *f, int *smem_bytes);

#endif /* SDPA_HOPPER_H */
