/*
 * status.h — recording errors for sdpa_last_error().
 *
 * Every failing path inside the library returns through sdpa_error_set(),
 * which formats a message into a thread-local buffer and returns the status
 * it was given, so a check reads `return sdpa_error_set(SDPA_STATUS_..., "...")`.
 */
#ifndef SDPA_STATUS_H
#define SDPA_STATUS_H

#include "sdpa_jit.h"

#if defined(__GNUC__)
#define SDPA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SDPA_PRINTF(a, b)
#endif

/* Records a printf-style message for sdpa_last_error() on this thread and
 * returns `status` unchanged. */
sdpa_status sdpa_error_set(sdpa_status status, const char *fmt, ...)
    SDPA_PRINTF(2, 3);

/* Prefixes the current thread's message with "context: " (for callers that
 * add where an inner failure happened). Returns `status`. */
sdpa_status sdpa_error_wrap(sdpa_status status, const char *fmt, ...)
    SDPA_PRINTF(2, 3);

/* Clears this thread's message. */
void sdpa_error_clear(void);

#endif /* SDPA_STATUS_H */
