/*
 * env_pin.c — see env_pin.h.
 */
#include "env_pin.h"

#include <stdio.h>
#include <stdlib.h>

void sdpa_env_pin_set(sdpa_env_pin *pin, const char *name, const char *value) {
  const char *outer = getenv(name);
  pin->name = name;
  pin->had = outer != NULL;
  snprintf(pin->saved, sizeof pin->saved, "%s", outer ? outer : "");
  setenv(name, value, 1);
}

void sdpa_env_pin_restore(const sdpa_env_pin *pin) {
  if (pin->had)
    setenv(pin->name, pin->saved, 1);
  else
    unsetenv(pin->name);
}
