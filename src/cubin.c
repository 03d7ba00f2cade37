/*
 * cubin.c — a bounds-checked ELF64 reader for cubins (cubin.h).
 *
 * Every offset read from the image is checked against its length before it
 * is used, so a truncated, damaged or hostile blob reads as "not a cubin"
 * rather than as an out-of-bounds read, here or in the driver.
 */
#include "cubin.h"

#include "instantiate.h"

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

#define FAIL(...)                                                             \
  do {                                                                        \
    if (why) snprintf(why, why_size, __VA_ARGS__);                            \
    return -1;                                                                \
  } while (0)

/* Copies and checks the ELF header and the header tables' bounds. */
static int read_header(const unsigned char *image, size_t size, Elf64_Ehdr *eh,
                       char *why, size_t why_size) {
  if (!image || size < sizeof *eh) FAIL("%zu bytes: shorter than an ELF header", size);
  memcpy(eh, image, sizeof *eh);
  if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) FAIL("not an ELF image");
  if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB)
    FAIL("not a 64-bit little-endian ELF image");
  if (eh->e_machine != EM_CUDA) FAIL("an ELF image of machine %u, not CUDA (%u)",
                                     (unsigned)eh->e_machine, (unsigned)EM_CUDA);
  if (eh->e_shnum == 0 || eh->e_shentsize != sizeof(Elf64_Shdr) ||
      !inside(size, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr)))
    FAIL("its section header table lies outside its %zu bytes", size);
  if (eh->e_phnum > 0 &&
      (eh->e_phentsize != sizeof(Elf64_Phdr) ||
       !inside(size, eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr))))
    FAIL("its program header table lies outside its %zu bytes", size);
  if (eh->e_shstrndx >= eh->e_shnum) FAIL("its section name table index is out of range");
  return 0;
}

static void section_at(const unsigned char *image, const Elf64_Ehdr *eh, unsigned i,
                       Elf64_Shdr *out) {
  memcpy(out, image + eh->e_shoff + (uint64_t)i * sizeof *out, sizeof *out);
}

/* Checks every section's and segment's bytes lie inside the image. */
static int check_bounds(const unsigned char *image, size_t size, const Elf64_Ehdr *eh,
                        char *why, size_t why_size) {
  for (unsigned i = 0; i < eh->e_shnum; i++) {
    Elf64_Shdr sh;
    section_at(image, eh, i, &sh);
    if (sh.sh_type != SHT_NOBITS && sh.sh_type != SHT_NULL &&
        !inside(size, sh.sh_offset, sh.sh_size))
      FAIL("section %u lies outside its %zu bytes", i, size);
  }
  for (unsigned i = 0; i < eh->e_phnum; i++) {
    Elf64_Phdr ph;
    memcpy(&ph, image + eh->e_phoff + (uint64_t)i * sizeof ph, sizeof ph);
    if (!inside(size, ph.p_offset, ph.p_filesz))
      FAIL("segment %u lies outside its %zu bytes", i, size);
  }
  Elf64_Shdr names;
  section_at(image, eh, eh->e_shstrndx, &names);
  if (names.sh_type != SHT_STRTAB || names.sh_size == 0 ||
      image[names.sh_offset + names.sh_size - 1] != '\0')
    FAIL("its section name table is not a terminated string table");
  return 0;
}

/* The SM number of e_flags: ELF ABI version 8 and later (CUDA 12.8+) keep
 * it in bits 8..15, older images in bits 0..7. */
static int flags_arch(const Elf64_Ehdr *eh) {
  if (eh->e_ident[EI_ABIVERSION] >= 8) return (int)((eh->e_flags >> 8) & 0xff);
  return (int)(eh->e_flags & 0xff);
}

int sdpa_cubin_arch(const void *image, size_t size, char *why, size_t why_size) {
  Elf64_Ehdr eh;
  if (read_header(image, size, &eh, why, why_size) != 0) return -1;
  return flags_arch(&eh);
}

int sdpa_cubin_has_function(const void *image_in, size_t size, const char *name) {
  const unsigned char *image = image_in;
  Elf64_Ehdr eh;
  if (!name || read_header(image, size, &eh, NULL, 0) != 0) return -1;
  for (unsigned i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh, strtab;
    section_at(image, &eh, i, &sh);
    if (sh.sh_type != SHT_SYMTAB) continue;
    if (sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= eh.e_shnum ||
        !inside(size, sh.sh_offset, sh.sh_size))
      return -1;
    section_at(image, &eh, sh.sh_link, &strtab);
    if (!inside(size, strtab.sh_offset, strtab.sh_size)) return -1;
    const char *strings = (const char *)image + strtab.sh_offset;
    uint64_t count = sh.sh_size / sizeof(Elf64_Sym);
    for (uint64_t s = 0; s < count; s++) {
      Elf64_Sym sym;
      memcpy(&sym, image + sh.sh_offset + s * sizeof sym, sizeof sym);
      if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC) continue;
      if (sym.st_name >= strtab.sh_size) return -1;
      const char *sym_name = strings + sym.st_name;
      if (!memchr(sym_name, 0, strtab.sh_size - sym.st_name)) return -1;
      if (strcmp(sym_name, name) == 0) return 1;
    }
  }
  return 0;
}

int sdpa_cubin_check(const void *image_in, size_t size, int arch,
                     const char *const *functions, char *why, size_t why_size) {
  const unsigned char *image = image_in;
  Elf64_Ehdr eh;
  if (read_header(image, size, &eh, why, why_size) != 0) return -1;
  if (check_bounds(image, size, &eh, why, why_size) != 0) return -1;
  if (arch > 0 && flags_arch(&eh) != arch)
    FAIL("a cubin for sm_%d, not sm_%d", flags_arch(&eh), arch);
  for (size_t i = 0; functions && functions[i]; i++) {
    int has = sdpa_cubin_has_function(image, size, functions[i]);
    if (has < 0) FAIL("its symbol table lies outside its %zu bytes", size);
    if (has == 0) FAIL("it has no kernel %s", functions[i]);
  }
  return 0;
}

int sdpa_cubin_check_kernels(const void *image, size_t size, int arch, char *why,
                             size_t why_size) {
  static const char *const kernels[] = {SDPA_KERNEL_PREPROCESS, SDPA_KERNEL_MAIN,
                                        SDPA_KERNEL_CONVERT, NULL};
  char inner[256] = "";
  if (sdpa_cubin_check(image, size, arch, kernels, inner, sizeof inner) == 0) return 0;
  if (why) snprintf(why, why_size, "its blob is not a cubin for this key: %s", inner);
  return -1;
}
