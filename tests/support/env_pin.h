/*
 * env_pin.h — an environment variable set for a while, then put back as
 * it was (set to its old value, or unset).
 *
 * The library reads its tuning and testing knobs (SDPA_JIT_DQ_CONVERT,
 * SDPA_JIT_TILES, ...) when a plan is made; the benchmarks pin one for a
 * single plan without disturbing what the user set for the rest of the
 * run. Not thread-safe: pin only while no other thread makes plans.
 */
#ifndef SDPA_TEST_ENV_PIN_H
#define SDPA_TEST_ENV_PIN_H

typedef struct sdpa_env_pin {
  const char *name;
  int had;        /* whether it was set before */
  char saved[64]; /* its value then            */
} sdpa_env_pin;

/* Sets `name` to `value`, remembering the old value in `pin`. */
void sdpa_env_pin_set(sdpa_env_pin *pin, const char *name, const char *value);

/* Puts `pin`'s variable back as it was before sdpa_env_pin_set. */
void sdpa_env_pin_restore(const sdpa_env_pin *pin);

#endif /* SDPA_TEST_ENV_PIN_H */
