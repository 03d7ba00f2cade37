/*
 * key.c — the specialization key: canonical text and its XXH3-128 hash.
 *
 * The text names every field that selects code (key_fields.h) and nothing
 * machine-local, so one cache row serves every shape of its class on every
 * machine. The hash is what the cache rows are keyed by; besides the text it
 * covers everything else that changes the bytes NVRTC produces, so a stale
 * cubin is never returned after an upgrade:
 *   1. every embedded template, in table order: name, NUL, size (8 bytes,
 *      little endian), contents;
 *   2. the NVRTC version, NUL;
 *   3. every compile option for the key's arch, each followed by NUL;
 *   4. the runtime version, NUL;
 *   5. the key text, NUL.
 * Part 1 is the same for every key; it is hashed once per process and the
 * streaming state copied for each key.
 */
#include "key.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "instantiate.h"
#include "nvrtc.h"
#include "status.h"

static pthread_once_t templates_once = PTHREAD_ONCE_INIT;
static XXH3_state_t *templates_state; /* after part 1; NULL on OOM */

const char *sdpa_key_value_name(sdpa_key_kind kind, int value) {
  switch (kind) {
  case SDPA_KEY_KIND_INT:
  case SDPA_KEY_KIND_BOOL: return NULL;
  case SDPA_KEY_KIND_DTYPE:
    return value == SDPA_DTYPE_FP16 ? "fp16" : value == SDPA_DTYPE_BF16 ? "bf16" : "unknown";
  case SDPA_KEY_KIND_FAMILY:
    return value == SDPA_FAMILY_MMA ? "mma" : value == SDPA_FAMILY_HOPPER ? "hopper" : "unknown";
  case SDPA_KEY_KIND_LSE: return value == 1 ? "packed" : value == 0 ? "strided" : "unknown";
  case SDPA_KEY_KIND_LAYOUT:
    return value == SDPA_LAYOUT_BSHD ? "bshd" : value == SDPA_LAYOUT_THD ? "thd" : "unknown";
  case SDPA_KEY_KIND_MASK:
    switch (value) {
    case SDPA_MASK_NONE: return "none";
    case SDPA_MASK_CAUSAL_TOP_LEFT: return "causal_tl";
    case SDPA_MASK_CAUSAL_BOTTOM_RIGHT: return "causal_br";
    case SDPA_MASK_SLIDING_WINDOW: return "window";
    }
    return "unknown";
  case SDPA_KEY_KIND_DQ: return value == 1 ? "main" : value == 0 ? "convert" : "unknown";
  }
  return "unknown";
}

const char *sdpa_dtype_key_name(sdpa_dtype dtype) {
  return sdpa_key_value_name(SDPA_KEY_KIND_DTYPE, (int)dtype);
}
const char *sdpa_mask_key_name(sdpa_mask mask) {
  return sdpa_key_value_name(SDPA_KEY_KIND_MASK, (int)mask);
}
const char *sdpa_layout_key_name(sdpa_layout layout) {
  return sdpa_key_value_name(SDPA_KEY_KIND_LAYOUT, (int)layout);
}
const char *sdpa_family_key_name(sdpa_family family) {
  return sdpa_key_value_name(SDPA_KEY_KIND_FAMILY, (int)family);
}

/* One row per key field, in key order (key_fields.h). */
typedef struct field_info {
  const char *text, *column;
  sdpa_key_kind kind;
  size_t offset;
} field_info;

static const field_info fields_info[SDPA_KEY_FIELD_COUNT] = {
#define FIELD_ROW(member, text, column, kind, define, entry)                  \
  {text, column, SDPA_KEY_KIND_##kind, offsetof(sdpa_key_fields, member)},
    SDPA_KEY_FIELDS(FIELD_ROW)
#undef FIELD_ROW
};

const char *sdpa_key_field_text(const sdpa_key_fields *f, int index,
                                const char **name, const char **column,
                                char *buf, size_t size) {
  const field_info *info = &fields_info[index];
  int value;
  memcpy(&value, (const char *)f + info->offset, sizeof value);
  if (name) *name = info->text;
  if (column) *column = info->column;
  const char *named = sdpa_key_value_name(info->kind, value);
  if (named)
    snprintf(buf, size, "%s", named);
  else
    snprintf(buf, size, "%d", info->kind == SDPA_KEY_KIND_BOOL ? value != 0 : value);
  return buf;
}

/* Feeds a string and its terminating NUL (the NUL keeps "ab"+"c" apart
 * from "a"+"bc"). */
static void update_string(XXH3_state_t *state, const char *text) {
  XXH3_128bits_update(state, text, strlen(text) + 1);
}

/* Hashes part 1 (the embedded templates) into templates_state. */
static void hash_templates(void) {
  XXH3_state_t *state = XXH3_createState();
  if (!state) return;
  XXH3_128bits_reset(state);
  for (size_t i = 0; i < sdpa_embedded_templates_count; i++) {
    const sdpa_embedded_file *file = &sdpa_embedded_templates[i];
    unsigned char size_bytes[8];
    uint64_t size = (uint64_t)file->size;
    for (int b = 0; b < 8; b++) size_bytes[b] = (unsigned char)(size >> (8 * b));
    update_string(state, file->name);
    XXH3_128bits_update(state, size_bytes, sizeof size_bytes);
    XXH3_128bits_update(state, file->data, file->size);
  }
  templates_state = state;
}

/* Frees the process-wide state when the library is unloaded (or the
 * process exits), so dlclose does not leak it and leak checkers stay
 * quiet. */
__attribute__((destructor)) static void free_templates_state(void) {
  XXH3_freeState(templates_state);
  templates_state = NULL;
}

/* Writes the canonical text of `fields` into `out` ("sdpa_bwd;" and
 * name=value for every field, ';'-separated); returns the length it needs
 * (>= size means it did not fit). */
static int key_text(const sdpa_key_fields *fields, char *out, size_t size) {
  size_t used = 0;
  int n = snprintf(out, size, "sdpa_bwd");
  if (n < 0) return n;
  used = (size_t)n;
  for (int i = 0; i < SDPA_KEY_FIELD_COUNT; i++) {
    char value[32];
    const char *name = NULL;
    sdpa_key_field_text(fields, i, &name, NULL, value, sizeof value);
    n = snprintf(out + (used < size ? used : size), used < size ? size - used : 0,
                 ";%s=%s", name, value);
    if (n < 0) return n;
    used += (size_t)n;
  }
  return (int)used;
}

/* Builds key->text and key->hash from `fields` (key.h). Fails with
 * OUT_OF_MEMORY when the hash state cannot be allocated, INVALID_ARGUMENT on
 * NULL arguments or an arch NVRTC has no option list for. */
sdpa_status sdpa_key_build(const sdpa_key_fields *fields, sdpa_key *key) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  XXH3_state_t *state = NULL;

  if (!fields || !key)
    return sdpa_error_set(SDPA_STATUS_INTERNAL,
                          "sdpa_key_build: fields and key must not be NULL");
  const char *const *options =
      sdpa_nvrtc_options(fields->arch, fields->family == SDPA_FAMILY_HOPPER);
  if (!options)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "arch %d is out of range for a kernel key",
                          fields->arch);
  int n = key_text(fields, key->text, sizeof key->text);
  if (n < 0 || (size_t)n >= sizeof key->text)
    return sdpa_error_set(SDPA_STATUS_INTERNAL,
                          "the kernel key text does not fit in %zu bytes",
                          sizeof key->text);

  pthread_once(&templates_once, hash_templates);
  state = XXH3_createState();
  if (!templates_state || !state) {
    status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                            "out of host memory hashing the kernel key");
    goto done;
  }
  XXH3_copyState(state, templates_state);
  update_string(state, sdpa_nvrtc_version());
  for (size_t i = 0; options[i]; i++) update_string(state, options[i]);
  update_string(state, SDPA_JIT_VERSION_STRING);
  update_string(state, key->text);

  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state));
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof canonical.digest; i++) {
    key->hash[2 * i] = hex[canonical.digest[i] >> 4];
    key->hash[2 * i + 1] = hex[canonical.digest[i] & 15];
  }
  key->hash[32] = '\0';

done:
  XXH3_freeState(state);
  return status;
}
