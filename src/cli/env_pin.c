/*
 * env_pin.c — see env_pin.h.
 */
#include "env_pin.h"

#include <stdlib.h>
#include <string.h>

int sdpa_env_pin_set(sdpa_env_pin *pin, const char *name, const char *value) {
  const char *outer = getenv(name);
  pin->name = NULL;
  pin->saved = outer ? strdup(outer) : NULL;
  if ((outer && !pin->saved) || setenv(name, value, 1) != 0) {
    free(pin->saved);
    pin->saved = NULL;
    return -1;
  }
  pin->name = name;
  return 0;
}

void sdpa_env_pin_restore(sdpa_env_pin *pin) {
  if (!pin->name) return; /* its set failed: nothing to put back */
  if (pin->saved)
    setenv(pin->name, pin->saved, 1);
  else
    unsetenv(pin->name);
  free(pin->saved);
  pin->saved = NULL;
}
