/*
 * key.h — the specialization key: canonical text and its hash.
 *
 * Text: "sdpa_bwd;arch=90;dtype=bf16;hd=128;hdv=128;qt=64;kvt=128;warps=8;
 * stages=2;lse=packed;layout=bshd;mask=none;det=0;even=1;dq=convert" — every field
 * that selects code, nothing machine-local. Hash: XXH3-128 over the text,
 * every embedded template byte (names and contents, in order), the NVRTC
 * version, the compile options and the runtime version, as 32 hex digits.
 * Batch, heads, lengths, token totals and non-LSE strides enter it only
 * through "even" (BSHD lengths multiples of the tiles) and the tiles
 * (small BSHD grids take 64-row kv tiles, config.c).
 */
#ifndef SDPA_KEY_H
#define SDPA_KEY_H

#include "plan.h"

/* Builds key->text and key->hash from `fields`. Needs NVRTC's version
 * (nvrtc.c); returns its status when NVRTC cannot be loaded. */
sdpa_status sdpa_key_build(const sdpa_key_fields *fields, sdpa_key *key);

/* Short names used in the key text and the cache's readable columns. */
const char *sdpa_dtype_key_name(sdpa_dtype dtype);   /* "fp16", "bf16"   */
const char *sdpa_mask_key_name(sdpa_mask mask);      /* "none", "causal_tl",
                                                        "causal_br", "window" */
const char *sdpa_layout_key_name(sdpa_layout layout);/* "bshd", "thd"    */

#endif /* SDPA_KEY_H */
