/*
 * env.h — the library's two-valued environment knobs (SDPA_JIT_DQ_CONVERT,
 * SDPA_JIT_SMALL_GRID, SDPA_JIT_GRAPHS), read when a plan is made.
 */
#ifndef SDPA_ENV_H
#define SDPA_ENV_H

#include "sdpa_jit.h"

/* Reads the knob `name`: unset or empty gives values[0], the default;
 * otherwise it must be values[0] or values[1], and *out is 0 or 1 for
 * which. Anything else is INVALID_ARGUMENT with a message naming the
 * variable, its value and both choices with what they mean (meanings). */
sdpa_status sdpa_env_choice(const char *name, const char *const values[2],
                            const char *const meanings[2], int *out);

#endif /* SDPA_ENV_H */
