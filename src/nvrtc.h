/*
 * nvrtc.h — compiling a translation unit to a cubin with NVRTC.
 *
 * The templates need no toolkit include path: every header they include is
 * embedded (templates/) and handed to NVRTC as a named header, so the key
 * covers every byte compiled.
 */
#ifndef SDPA_NVRTC_H
#define SDPA_NVRTC_H

#include <stddef.h>

#include "sdpa_jit.h"

/* "13.0": NVRTC's version as it enters the key. */
const char *sdpa_nvrtc_version(void);

/* The option list used for `arch` ("--gpu-architecture=sm_90", or with
 * `arch_specific` the arch-specific target "sm_90a" the Hopper family
 * needs for wgmma and setmaxnreg; "-std=c++17",
 * "--device-as-default-execution-space", "--ptxas-options=-v"),
 * NULL-terminated, static; NULL for an arch outside 0..255. Enters the
 * key. */
const char *const *sdpa_nvrtc_options(int arch, int arch_specific);

/* Compiles `source` (named `name` in diagnostics) for `arch` with the
 * embedded templates as headers. On success *cubin (malloc'd) and *size.
 * *log (malloc'd, possibly "") gets NVRTC's log whether or not it worked;
 * *log may be NULL on out-of-memory. On failure returns
 * SDPA_STATUS_COMPILE_FAILED with the first log lines in the message. */
sdpa_status sdpa_nvrtc_compile(const char *source, const char *name, int arch,
                               void **cubin, size_t *size, char **log);

/* sdpa_nvrtc_compile for the arch-specific target too (`arch_specific`),
 * and the wall time of the NVRTC calls in ms (CLOCK_MONOTONIC) through
 * `compile_ms` (may be NULL). */
sdpa_status sdpa_nvrtc_compile_timed(const char *source, const char *name,
                                     int arch, int arch_specific, void **cubin,
                                     size_t *size, char **log, double *compile_ms);

/* Nonzero when NVRTC can target `arch` (nvrtcGetSupportedArchs). */
int sdpa_nvrtc_arch_known(int arch);

/* The archs NVRTC can target, "75, 80, 86, ..." (static). */
const char *sdpa_nvrtc_arch_list(void);

#endif /* SDPA_NVRTC_H */
