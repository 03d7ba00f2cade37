/*
 * env_pin.h — an environment variable set for a while, then put back as
 * it was (set to its old value, or unset).
 *
 * The library reads its tuning knobs (SDPA_JIT_DQ_CONVERT, SDPA_JIT_TILES,
 * ...) when a plan is made; `sdpa-jit preheat` and the benchmarks pin one
 * for a single plan without disturbing what the user set for the rest of
 * the run. Not thread-safe: pin only while no other thread makes plans.
 */
#ifndef SDPA_ENV_PIN_H
#define SDPA_ENV_PIN_H

typedef struct sdpa_env_pin {
  const char *name; /* NULL after a failed set */
  char *saved; /* its value before (malloc'd), NULL when it was unset */
} sdpa_env_pin;

/* Sets `name` to `value`, remembering the old value in `pin`. Returns 0,
 * or -1 (nothing changed; restoring `pin` then does nothing) when out of
 * memory or setenv fails. */
int sdpa_env_pin_set(sdpa_env_pin *pin, const char *name, const char *value);

/* Puts `pin`'s variable back as it was before sdpa_env_pin_set. */
void sdpa_env_pin_restore(sdpa_env_pin *pin);

#endif /* SDPA_ENV_PIN_H */
