/*
 * cubin_elf.h — reading a cubin's ELF symbol table without a GPU.
 *
 * A cubin is an ELF64 little-endian image (e_machine EM_CUDA). Tests use
 * these to check that NVRTC produced the kernels the runtime will look up
 * by name (cuModuleGetFunction) and for the arch it was asked for, on a
 * machine that has no driver to load the image with.
 */
#ifndef SDPA_TEST_CUBIN_ELF_H
#define SDPA_TEST_CUBIN_ELF_H

#include <stddef.h>

/* Returns 1 when `image` (size bytes) is an ELF64 cubin whose symbol table
 * has a function symbol named `name`, 0 when it has none, -1 when the image
 * is not a well-formed ELF64 cubin. */
int sdpa_cubin_has_function(const void *image, size_t size, const char *name);

/* The SM arch the cubin was compiled for (e.g. 90), from e_flags, or -1 when
 * the image is not a well-formed ELF64 cubin. */
int sdpa_cubin_arch(const void *image, size_t size);

#endif
