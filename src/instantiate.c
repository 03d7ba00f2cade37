/*
 * instantiate.c — the NVRTC translation unit for a key.
 *
 * One #define per key field (key_fields.h: the values are the fields'
 * own: dtype 1 fp16 / 2 bf16, layout 1 BSHD / 2 THD, mask 0..3, family
 * 1 mma.sync / 2 Hopper, the flags 0/1), then the family's entry header.
 * The text is a pure function of the key fields, so the key hash (which covers the
 * fields and every embedded template byte) covers everything compiled.
 */
#include "instantiate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

/* The entry header of a family. */
static const char *family_header(int family) {
  return family == SDPA_FAMILY_HOPPER ? "sdpa_hopper.cuh" : "sdpa_bwd.cuh";
}

sdpa_status sdpa_instantiate_source(const sdpa_key_fields *f, char **out) {
  static const char *const defines[SDPA_KEY_FIELD_COUNT] = {
#define DEFINE_NAME(member, text, column, kind, define, entry) define,
      SDPA_KEY_FIELDS(DEFINE_NAME)
#undef DEFINE_NAME
  };
  const int values[SDPA_KEY_FIELD_COUNT] = {
#define DEFINE_VALUE(member, text, column, kind, define, entry) f->member,
      SDPA_KEY_FIELDS(DEFINE_VALUE)
#undef DEFINE_VALUE
  };
  char buf[2048];
  size_t used = (size_t)snprintf(buf, sizeof buf, "/* sdpa-jit instantiation */\n");
  for (int i = 0; i < SDPA_KEY_FIELD_COUNT && used < sizeof buf; i++)
    used += (size_t)snprintf(buf + used, sizeof buf - used, "#define %s %d\n", defines[i],
                             values[i]);
  if (used < sizeof buf)
    used += (size_t)snprintf(buf + used, sizeof buf - used, "#include \"%s\"\n",
                             family_header(f->family));
  if (used >= sizeof buf)
    return sdpa_error_set(SDPA_STATUS_INTERNAL,
                          "the kernel source of a key does not fit in %zu bytes",
                          sizeof buf);
  *out = strdup(buf);
  if (!*out)
    return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                          "out of memory building the kernel source");
  return SDPA_STATUS_SUCCESS;
}
