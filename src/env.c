/*
 * env.c — two-valued environment knobs (env.h).
 */
#include "env.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

sdpa_status sdpa_env_choice(const char *name, const char *const values[2],
                            const char *const meanings[2], int *out) {
  const char *env = getenv(name);
  *out = 0;
  if (!env || !*env || !strcmp(env, values[0])) return SDPA_STATUS_SUCCESS;
  if (!strcmp(env, values[1])) {
    *out = 1;
    return SDPA_STATUS_SUCCESS;
  }
  return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                        "%s = \"%s\" is not valid: expected \"%s\" or unset "
                        "(%s) or \"%s\" (%s)",
                        name, env, values[0], meanings[0], values[1], meanings[1]);
}
