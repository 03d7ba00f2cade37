/*
 * cubin_elf.c — ptxas's spill report in a compile log (see cubin_elf.h;
 * the ELF reader is the library's src/cubin.c).
 */
#include "cubin_elf.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int sdpa_ptxas_any_spills(const char *log, char *line, size_t size) {
  static const char header[] = "Function properties for ";
  line[0] = '\0';
  for (const char *at = log ? strstr(log, header) : NULL; at;
       at = strstr(at + 1, header)) {
    const char *name = at + strlen(header);
    const int name_length = (int)strcspn(name, "\n");
    char function[160], report[256];
    snprintf(function, sizeof function, "%.*s", name_length, name);
    if (sdpa_ptxas_spills(at, function, report, sizeof report) == 1) {
      snprintf(line, size, "%s: %s", function, report);
      return 1;
    }
  }
  return 0;
}

int sdpa_compile_any_warning(const char *log, char *line, size_t size) {
  const char *at = log ? strstr(log, ": warning #") : NULL;
  line[0] = '\0';
  if (!at) return 0;
  while (at > log && at[-1] != '\n') at--;
  const size_t n = strcspn(at, "\n");
  snprintf(line, size, "%.*s", (int)(n < 300 ? n : 300), at);
  return 1;
}

int sdpa_ptxas_spills(const char *log, const char *function, char *line,
                      size_t size) {
  char header[128], report[256];
  snprintf(header, sizeof header, "Function properties for %s\n", function);
  const char *at = log ? strstr(log, header) : NULL;
  line[0] = '\0';
  if (!at) return -1;
  const char *next = at + strlen(header);
  int length = (int)strcspn(next, "\n");
  if (length > 200) length = 200;
  snprintf(report, sizeof report, "%.*s", length, next);
  snprintf(line, size, "%s", report);
  return strstr(report, " 0 bytes spill stores") &&
                 strstr(report, " 0 bytes spill loads")
             ? 0
             : 1;
}
