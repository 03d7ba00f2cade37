/*
 * status.c — status names, the thread-local last-error message, and where
 * log messages go.
 *
 * The message buffer is per thread (C11 _Thread_local), so concurrent calls
 * on a shared runtime never see each other's errors; a public call that
 * succeeds leaves it as it was (sdpa_api_enter / sdpa_api_leave). Warnings from the
 * runtime and the cache share one route (sdpa_log_emit) so that both print
 * the same line when no callback was given.
 */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[2048];
/* Inside a public call (depth > 0): the message the caller saw, kept once
 * an inner step records one (saved), to be put back on success. */
static _Thread_local char saved_error[sizeof last_error];
static _Thread_local int depth, saved;

/* Keeps the caller's message before the first change inside a call. */
static void save_once(void) {
  if (depth > 0 && !saved) {
    memcpy(saved_error, last_error, strlen(last_error) + 1);
    saved = 1;
  }
}

void sdpa_api_enter(void) {
  if (depth++ == 0) saved = 0;
}

sdpa_status sdpa_api_leave(sdpa_status status) {
  if (depth > 0 && --depth == 0) {
    if (status == SDPA_STATUS_SUCCESS && saved)
      memcpy(last_error, saved_error, strlen(saved_error) + 1);
    saved = 0;
  }
  return status;
}

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
  save_once();
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
  save_once();
  memcpy(inner, last_error, sizeof inner);
  snprintf(last_error, sizeof last_error, "%.500s: %.1500s", prefix, inner);
  return status;
}

void sdpa_error_clear(void) {
  save_once();
  last_error[0] = '\0';
}

void sdpa_log_emit(sdpa_log_fn log, void *user, sdpa_log_level level,
                   const char *message) {
  if (log)
    log(level, message, user);
  else if (level == SDPA_LOG_WARNING)
    fprintf(stderr, "sdpa-jit: warning: %s\n", message);
}
