/*
 * status.h — recording errors for sdpa_last_error().
 *
 * Every failing path inside the library returns through sdpa_error_set(),
 * which formats a message into a thread-local buffer and returns the status
 * it was given, so a check reads `return sdpa_error_set(SDPA_STATUS_..., "...")`.
 * Warnings and notes go out through sdpa_log_emit(), the one place that
 * chooses between the user's log callback and stderr.
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

/* The public calls' scope of the message: a call that succeeds leaves
 * sdpa_last_error() as it found it, whatever its inner steps recorded on
 * the way (a cache miss, a missing driver on a build host). Public entry
 * points return SDPA_API_CALL(inner(...)): sdpa_api_enter saves nothing
 * until a message is recorded, then keeps the caller's; sdpa_api_leave
 * puts it back when the outermost call succeeded. */
void sdpa_api_enter(void);
sdpa_status sdpa_api_leave(sdpa_status status);
#define SDPA_API_CALL(call) (sdpa_api_enter(), sdpa_api_leave(call))

/* Passes `message` to the log callback `log` (with `user`) when there is
 * one; otherwise writes a warning as one line on stderr,
 * "sdpa-jit: warning: <message>", and drops any other level. */
void sdpa_log_emit(sdpa_log_fn log, void *user, sdpa_log_level level,
                   const char *message);

#endif /* SDPA_STATUS_H */
