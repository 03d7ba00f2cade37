/*
 * cubin_elf.c — a bounds-checked ELF64 reader for cubins, and ptxas's
 * spill report (see cubin_elf.h).
 *
 * Reads only what the tests need: the header, the section headers, every
 * SHT_SYMTAB section and the string table it links to. Every offset read
 * from the image is checked against its size, so a truncated or damaged
 * image reads as "not a cubin" rather than crashing the test.
 */
#include "cubin_elf.h"

#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef EM_CUDA
#define EM_CUDA 190
#endif

/* Nonzero when [offset, offset + length) lies inside an image of `size`. */
static int inside(size_t size, uint64_t offset, uint64_t length) {
  return offset <= size && length <= size - offset;
}

/* Copies the ELF header out of `image` after checking it names an ELF64
 * little-endian CUDA image. Returns 0 on success, -1 otherwise. */
static int read_header(const unsigned char *image, size_t size, Elf64_Ehdr *eh) {
  if (!image || size < sizeof *eh) return -1;
  memcpy(eh, image, sizeof *eh);
  if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
      eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      eh->e_ident[EI_DATA] != ELFDATA2LSB || eh->e_machine != EM_CUDA)
    return -1;
  if (eh->e_shentsize != sizeof(Elf64_Shdr) ||
      !inside(size, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr)))
    return -1;
  return 0;
}

int sdpa_cubin_has_function(const void *image_in, size_t size,
                            const char *name) {
  const unsigned char *image = image_in;
  Elf64_Ehdr eh;
  if (read_header(image, size, &eh) != 0 || !name) return -1;
  for (unsigned i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh, strtab;
    memcpy(&sh, image + eh.e_shoff + (uint64_t)i * sizeof sh, sizeof sh);
    if (sh.sh_type != SHT_SYMTAB) continue;
    if (sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= eh.e_shnum ||
        !inside(size, sh.sh_offset, sh.sh_size))
      return -1;
    memcpy(&strtab, image + eh.e_shoff + (uint64_t)sh.sh_link * sizeof strtab,
           sizeof strtab);
    if (!inside(size, strtab.sh_offset, strtab.sh_size)) return -1;
    const char *strings = (const char *)image + strtab.sh_offset;
    uint64_t count = sh.sh_size / sizeof(Elf64_Sym);
    for (uint64_t s = 0; s < count; s++) {
      Elf64_Sym sym;
      memcpy(&sym, image + sh.sh_offset + s * sizeof sym, sizeof sym);
      if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC) continue;
      if (sym.st_name >= strtab.sh_size) return -1;
      const char *sym_name = strings + sym.st_name;
      size_t room = strtab.sh_size - sym.st_name;
      if (!memchr(sym_name, 0, room)) return -1; /* unterminated */
      if (strcmp(sym_name, name) == 0) return 1;
    }
  }
  return 0;
}

int sdpa_cubin_arch(const void *image, size_t size) {
  Elf64_Ehdr eh;
  if (read_header(image, size, &eh) != 0) return -1;
  /* ELF ABI version 8 and later (CUDA 12.8+) keep the SM number in bits
   * 8..15 of e_flags; older images in bits 0..7. */
  if (eh.e_ident[EI_ABIVERSION] >= 8) return (int)((eh.e_flags >> 8) & 0xff);
  return (int)(eh.e_flags & 0xff);
}

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
