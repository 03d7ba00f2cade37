/*
 * text.c — database strings made safe to print.
 *
 * Anything read from a cache file (key texts, dtype and mask names, the
 * NVRTC version) is someone's bytes: a hostile or damaged file could hold
 * terminal escape sequences. Printed for people, control characters
 * (C0, DEL and the C1 range U+0080..U+009F) and bytes that are not UTF-8
 * are written as \xNN; everything else as it is.
 */
#include <string.h>

#include "cli.h"

/* The length of the valid UTF-8 sequence at `p` (1-4), or 0 when it is not
 * one. */
size_t cli_utf8_length(const unsigned char *p) {
  size_t n;
  if (p[0] < 0x80) return 1;
  if (p[0] < 0xc2) return 0; /* a continuation byte, or overlong */
  if (p[0] < 0xe0)
    n = 2;
  else if (p[0] < 0xf0)
    n = 3;
  else if (p[0] < 0xf5)
    n = 4;
  else
    return 0;
  for (size_t i = 1; i < n; i++) /* stops at the string's end: NUL is no continuation */
    if ((p[i] & 0xc0) != 0x80) return 0;
  if (n == 3 && p[0] == 0xe0 && p[1] < 0xa0) return 0;   /* overlong */
  if (n == 3 && p[0] == 0xed && p[1] >= 0xa0) return 0;  /* surrogate */
  if (n == 4 && p[0] == 0xf0 && p[1] < 0x90) return 0;   /* overlong */
  if (n == 4 && p[0] == 0xf4 && p[1] >= 0x90) return 0;  /* past U+10FFFF */
  return n;
}

const char *cli_escape(const char *text, char *out, size_t size) {
  static const char hex[] = "0123456789abcdef";
  size_t used = 0;
  if (size == 0) return out;
  if (!text) text = "";
  for (const unsigned char *p = (const unsigned char *)text; *p;) {
    size_t n = cli_utf8_length(p);
    const int control = n == 1 ? (*p < 0x20 || *p == 0x7f)
                               : (n == 2 && p[0] == 0xc2 && p[1] < 0xa0);
    if (n == 0 || control) {
      const size_t bytes = n ? n : 1;
      for (size_t i = 0; i < bytes; i++) {
        if (used + 4 >= size) goto full;
        out[used++] = '\\';
        out[used++] = 'x';
        out[used++] = hex[p[i] >> 4];
        out[used++] = hex[p[i] & 15];
      }
      p += bytes;
      continue;
    }
    if (used + n >= size) goto full;
    memcpy(out + used, p, n);
    used += n;
    p += n;
  }
full:
  out[used] = '\0';
  return out;
}
