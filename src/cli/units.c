/*
 * units.c — numbers people type and read: sizes with K/M/G suffixes,
 * durations with s/m/h/d suffixes, plain bounded integers, dates.
 *
 * Parsing is strict (the whole token must be consumed, overflow is an
 * error) so a typo such as "--max-bytes 10X" is a usage error rather than
 * a silent prune to 10 bytes.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Reads a non-negative decimal prefix of `text`. Returns 0 with *end after
 * the digits, or -1 when there are none or the value overflows. */
static int parse_count(const char *text, int64_t *out, const char **end) {
  if (!text || !isdigit((unsigned char)text[0])) return -1;
  errno = 0;
  char *stop = NULL;
  long long v = strtoll(text, &stop, 10);
  if (errno == ERANGE || v < 0) return -1;
  *out = (int64_t)v;
  *end = stop;
  return 0;
}

/* Multiplies without overflow. Returns 0 or -1. */
static int scale(int64_t value, int64_t factor, int64_t *out) {
  if (value > INT64_MAX / factor) return -1;
  *out = value * factor;
  return 0;
}

int cli_parse_bytes(const char *text, int64_t *out) {
  int64_t value = 0;
  const char *rest = NULL;
  if (parse_count(text, &value, &rest) != 0) return -1;
  if (*rest == '\0' || strcasecmp(rest, "B") == 0) return (*out = value), 0;
  int shift;
  switch (toupper((unsigned char)*rest)) {
  case 'K': shift = 10; break;
  case 'M': shift = 20; break;
  case 'G': shift = 30; break;
  case 'T': shift = 40; break;
  default: return -1;
  }
  rest++;
  if (*rest && strcasecmp(rest, "B") != 0 && strcasecmp(rest, "iB") != 0)
    return -1;
  return scale(value, (int64_t)1 << shift, out);
}

int cli_parse_seconds(const char *text, int64_t *out) {
  int64_t value = 0;
  const char *rest = NULL;
  if (parse_count(text, &value, &rest) != 0) return -1;
  int64_t factor;
  switch (*rest) {
  case '\0':
  case 's': factor = 1; break;
  case 'm': factor = 60; break;
  case 'h': factor = 3600; break;
  case 'd': factor = 86400; break;
  default: return -1;
  }
  if (*rest && rest[1]) return -1;
  return scale(value, factor, out);
}

int cli_parse_int(const char *text, int min, int max, int *out) {
  if (!text || !*text) return -1;
  errno = 0;
  char *stop = NULL;
  long v = strtol(text, &stop, 10);
  if (errno == ERANGE || *stop != '\0' || v < min || v > max) return -1;
  *out = (int)v;
  return 0;
}

void cli_format_date(int64_t seconds, char *buf, size_t size) {
  struct tm tm;
  time_t t = (time_t)seconds;
  if (seconds <= 0 || !localtime_r(&t, &tm) ||
      strftime(buf, size, "%Y-%m-%d %H:%M", &tm) == 0)
    snprintf(buf, size, "-");
}

void cli_format_iso_utc(int64_t seconds, char *buf, size_t size) {
  struct tm tm;
  time_t t = (time_t)seconds;
  if (seconds <= 0 || !gmtime_r(&t, &tm) ||
      strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    snprintf(buf, size, "%s", "");
}

void cli_format_bytes(int64_t bytes, char *buf, size_t size) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) {
    snprintf(buf, size, "%lld B", (long long)bytes);
    return;
  }
  double v = (double)bytes / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, size, "%.1f %s", v, units[u]);
}
