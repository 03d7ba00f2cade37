/*
 * json.h — writing the small JSON objects `sdpa-jit --json` prints.
 *
 * No document model: a command writes an object field by field straight to
 * a FILE. `cli_json_object` tracks whether a comma is due. Strings are
 * escaped per RFC 8259 (quotes, backslash, control characters); numbers
 * that are not finite are written as null.
 */
#ifndef SDPA_CLI_JSON_H
#define SDPA_CLI_JSON_H

#include <stdint.h>
#include <stdio.h>

typedef struct cli_json_object {
  FILE *out;
  int fields; /* written so far */
} cli_json_object;

/* Writes `text` as a JSON string literal; NULL writes null. */
void cli_json_string(FILE *out, const char *text);

/* Writes "{" and readies `object` for fields. */
void cli_json_begin(cli_json_object *object, FILE *out);
/* Writes "}". */
void cli_json_end(cli_json_object *object);

/* Write one field each: "name":value. */
void cli_json_str(cli_json_object *object, const char *name,
                  const char *value);
void cli_json_int(cli_json_object *object, const char *name, int64_t value);
void cli_json_num(cli_json_object *object, const char *name, double value);
void cli_json_bool(cli_json_object *object, const char *name, int value);

#endif /* SDPA_CLI_JSON_H */
