/*
 * json.c — JSON string escaping and field writers for `--json` output.
 *
 * Key texts, paths and library messages may hold quotes, backslashes or
 * control characters (a compile log line, a path with a tab, a hostile
 * cache file); every control character (C0, DEL, C1) is escaped so each
 * object stays on one line and any JSON reader accepts it, and a byte that
 * is not part of valid UTF-8 is written as the code point of its value
 * (\u00NN), so the output is always valid JSON.
 */
#include "json.h"

#include <math.h>

#include "cli.h"

void cli_json_string(FILE *out, const char *text) {
  if (!text) {
    fputs("null", out);
    return;
  }
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)text; *p;) {
    const size_t n = cli_utf8_length(p);
    if (n > 1 && !(n == 2 && p[0] == 0xc2 && p[1] < 0xa0)) {
      fwrite(p, 1, n, out);
      p += n;
      continue;
    }
    if (n == 2) { /* a C1 control: its code point */
      fprintf(out, "\\u%04x", p[1]);
      p += 2;
      continue;
    }
    switch (*p) {
    case '"': fputs("\\\"", out); break;
    case '\\': fputs("\\\\", out); break;
    case '\b': fputs("\\b", out); break;
    case '\f': fputs("\\f", out); break;
    case '\n': fputs("\\n", out); break;
    case '\r': fputs("\\r", out); break;
    case '\t': fputs("\\t", out); break;
    default:
      if (*p < 0x20 || *p >= 0x7f) /* also a byte that is not UTF-8 */
        fprintf(out, "\\u%04x", *p);
      else
        fputc(*p, out);
    }
    p++;
  }
  fputc('"', out);
}

void cli_json_begin(cli_json_object *object, FILE *out) {
  object->out = out;
  object->fields = 0;
  fputc('{', out);
}

void cli_json_end(cli_json_object *object) { fputc('}', object->out); }

/* Writes the separator and the quoted field name. */
static void field_name(cli_json_object *object, const char *name) {
  if (object->fields++ > 0) fputc(',', object->out);
  cli_json_string(object->out, name);
  fputc(':', object->out);
}

void cli_json_str(cli_json_object *object, const char *name,
                  const char *value) {
  field_name(object, name);
  cli_json_string(object->out, value);
}

void cli_json_int(cli_json_object *object, const char *name, int64_t value) {
  field_name(object, name);
  fprintf(object->out, "%lld", (long long)value);
}

void cli_json_num(cli_json_object *object, const char *name, double value) {
  field_name(object, name);
  if (isfinite(value))
    fprintf(object->out, "%.3f", value);
  else
    fputs("null", object->out);
}

void cli_json_bool(cli_json_object *object, const char *name, int value) {
  field_name(object, name);
  fputs(value ? "true" : "false", object->out);
}
