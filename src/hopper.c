/*
 * hopper.c — the sm_90a family on the host (hopper.h).
 *
 * The family's kernel (templates/sdpa_hopper.cuh) is not part of this
 * build yet: every descriptor is reported as not covered, with the reason,
 * so AUTO plans take the mma.sync family and a forced Hopper family fails
 * with a message that says why.
 */
#include "hopper.h"

#include <stdio.h>

#include "status.h"

int sdpa_hopper_covers(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o, char *why,
                       size_t why_size) {
  (void)o;
  if (d->arch != 90) {
    snprintf(why, why_size, "sm_%d: the Hopper family needs sm_90 (H100, H200)", d->arch);
    return 0;
  }
  snprintf(why, why_size, "sm_90: the Hopper family's kernels are not in this build");
  return 0;
}

sdpa_status sdpa_hopper_config_select(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o,
                                      sdpa_key_fields *f, int *smem_bytes) {
  (void)d, (void)o, (void)f, (void)smem_bytes;
  return sdpa_error_set(SDPA_STATUS_INTERNAL,
                        "the Hopper family has no tiles in this build");
}
