/*
 * key.h — the specialization key: canonical text and its hash.
 *
 * Text: "sdpa_bwd;arch=90;family=mma;dtype=bf16;hd=128;hdv=128;qt=64;
 * kvt=128;warps=8;stages=2;lse=packed;layout=bshd;mask=none;det=0;even=1;
 * dq=convert" — every field of key_fields.h in its order, nothing
 * machine-local. Hash: XXH3-128 over the text, every embedded template
 * byte (names and contents, in order), the NVRTC version, the compile
 * options and the runtime version, as 32 hex digits. Batch, heads,
 * lengths, token totals and non-LSE strides enter it only through "even"
 * (BSHD lengths multiples of the tiles) and the tiles (small BSHD grids
 * take 64-row kv tiles, config.c).
 */
#ifndef SDPA_KEY_H
#define SDPA_KEY_H

#include <stddef.h>

#include "key_fields.h"
#include "sdpa_jit.h"

/* Text and hash of a key. */
typedef struct sdpa_key {
  char text[512]; /* canonical "sdpa_bwd;arch=90;..."                */
  char hash[33];  /* XXH3-128 hex of text + sources + toolchain      */
} sdpa_key;

/* Builds key->text and key->hash from `fields`. Fails with OUT_OF_MEMORY
 * when the hash state cannot be allocated, INVALID_ARGUMENT for an arch
 * NVRTC has no option list for. */
sdpa_status sdpa_key_build(const sdpa_key_fields *fields, sdpa_key *key);

/* The name of `value` of a named kind ("bf16", "causal_br", "hopper",
 * "packed", "convert", ...), "unknown" for a value outside it, NULL for
 * INT and BOOL (written as numbers). Used in the key text and the cache's
 * TEXT columns. */
const char *sdpa_key_value_name(sdpa_key_kind kind, int value);

/* Writes field `index` (0 .. SDPA_KEY_FIELD_COUNT-1) of `fields` as the key
 * text writes it ("bf16", "128") into buf; returns buf. *name gets the
 * field's name in the key text, *column its cache column (either may be
 * NULL). */
const char *sdpa_key_field_text(const sdpa_key_fields *fields, int index,
                                const char **name, const char **column,
                                char *buf, size_t size);

/* Short names used in the key text and the cache's readable columns. */
const char *sdpa_dtype_key_name(sdpa_dtype dtype);   /* "fp16", "bf16"   */
const char *sdpa_mask_key_name(sdpa_mask mask);      /* "none", "causal_tl",
                                                        "causal_br", "window" */
const char *sdpa_layout_key_name(sdpa_layout layout);/* "bshd", "thd"    */
const char *sdpa_family_key_name(sdpa_family family);/* "mma", "hopper"  */

#endif /* SDPA_KEY_H */
