/*
 * status.c — status names, the thread-local last-error message, and where
 * log messages go.
 *
 * The message buffer is per thread (C11 _Thread_local), so concurrent calls
 * on a shared runtime never see each other's errors. Warnings from the
 * runtime and the cache share one route (sdpa_log_emit) so that both print
 * the same line when no callback was given.
 */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[2048];

const char *sdpa_status_name(sdpa_status status) {
  switch (status) {
  case SDPA_STATUS_SUCCESS: return "SDPA_STATUS_SUCCESS";
  case SDPA_STATUS_INVALID_ARGUMENT: return "SDPA_STATUS_INVALID_ARGUMENT";
  case SDPA_STATUS_NOT_SUPPORTED: return "SDPA_STATUS_NOT_SUPPORTED";
  case SDPA_STATUS_OUT_OF_MEMORY: return "SDPA_STATUS_OUT_OF_MEMORY";
  case SDPA_STATUS_COMPILE_FAILED: return "SDPA_STATUS_COMPILE_FAILED";
  case SDPA_STATUS_DRIVER_ERROR: return "SDPA_STATUS_DRIVER_ERROR";
  case SDPA_STATUS_NO_DEVICE: return "SDPA_STATUS_NO_DEVICE";
  case SDPA_STATUS_CACHE_ERROR: return "SDPA_STATUS_CACHE_ERROR";
  case SDPA_STATUS_NOT_FOUND: return "SDPA_STATUS_NOT_FOUND";
  case SDPA_STATUS_NOT_COMPILED: return "SDPA_STATUS_NOT_COMPILED";
  case SDPA_STATUS_DEVICE_ERROR: return "SDPA_STATUS_DEVICE_ERROR";
  case SDPA_STATUS_INTERNAL: return "SDPA_STATUS_INTERNAL";
  }
  return "SDPA_STATUS_UNKNOWN";
}

const char *sdpa_last_error(void) { return last_error; }

const char *sdpa_version(void) { return SDPA_JIT_VERSION_STRING; }

sdpa_status sdpa_error_set(sdpa_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

sdpa_status sdpa_error_wrap(sdpa_status status, const char *fmt, ...) {
  char prefix[512], inner[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(inner, last_error, sizeof inner);
  snprintf(last_error, sizeof last_error, "%.500s: %.1500s", prefix, inner);
  return status;
}

void sdpa_error_clear(void) { last_error[0] = '\0'; }

void sdpa_log_emit(sdpa_log_fn log, void *user, sdpa_log_level level,
                   const char *message) {
  if (log)
    log(level, message, user);
  else if (level == SDPA_LOG_WARNING)
    fprintf(stderr, "sdpa-jit: warning: %s\n", message);
}
