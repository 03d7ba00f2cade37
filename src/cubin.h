/*
 * cubin.h — checking that a blob is a cubin for an arch, before the CUDA
 * driver sees it.
 *
 * cuModuleLoadData takes a pointer and no length: it trusts the image's own
 * headers. A cached blob is therefore parsed here first, bounds-checked
 * against the length it came with: an ELF64 little-endian image of the CUDA
 * machine (EM_CUDA), its program and section header tables inside the blob,
 * every section's bytes inside the blob (SHT_NOBITS excepted), its string
 * table terminated, the SM number in e_flags equal to the key's arch, and
 * (optionally) a function symbol for each kernel the runtime looks up.
 * Anything else — a text row that the driver would read as NUL-terminated
 * PTX, a truncated image, another arch's — is refused.
 */
#ifndef SDPA_CUBIN_H
#define SDPA_CUBIN_H

#include <stddef.h>

/* The SM number an image was compiled for (e.g. 90), from e_flags, or -1
 * when it is not a well-formed ELF64 CUDA image (`why` says why; may be
 * NULL). */
int sdpa_cubin_arch(const void *image, size_t size, char *why, size_t why_size);

/* 1 when the image's symbol table has a function named `name`, 0 when not,
 * -1 when the image is not a well-formed ELF64 CUDA image. */
int sdpa_cubin_has_function(const void *image, size_t size, const char *name);

/* 0 when `image` is a well-formed cubin for `arch` (0: any arch) with a
 * function symbol for every name of the NULL-terminated `functions` (may
 * be NULL); else -1 with the reason in `why`. */
int sdpa_cubin_check(const void *image, size_t size, int arch,
                     const char *const *functions, char *why, size_t why_size);

/* sdpa_cubin_check with the kernels every module of either family has
 * (preprocess, main, convert), the reason prefixed "its blob is not a
 * cubin for this key: ". Fits sdpa_cache_blob_check's use. */
int sdpa_cubin_check_kernels(const void *image, size_t size, int arch, char *why,
                             size_t why_size);

#endif /* SDPA_CUBIN_H */
