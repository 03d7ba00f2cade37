/*
 * cubin_elf.h — what the tests read of a cubin without a GPU: its ELF
 * symbol table and arch (through the library's reader), and ptxas's
 * report on it.
 *
 * A cubin is an ELF64 little-endian image (e_machine EM_CUDA). Tests use
 * these to check that NVRTC produced the kernels the runtime will look up
 * by name (cuModuleGetFunction) and for the arch it was asked for, on a
 * machine that has no driver to load the image with; and that ptxas (its
 * verbose report is in the compile log) spilled no registers in them.
 */
#ifndef SDPA_TEST_CUBIN_ELF_H
#define SDPA_TEST_CUBIN_ELF_H

#include <stddef.h>

/* The ELF reader itself is the library's (src/cubin.h): the tests read
 * cubins with the same bounds-checked code that guards the driver. */
#include "cubin.h"

/* Reads ptxas's "Function properties for <function>" report in a compile
 * log: copies the report's line (at most 200 characters) to `line`
 * (`size` bytes, at least 1) and returns 1 when it shows spill stores or
 * spill loads, 0 when it shows "0 bytes spill stores" and "0 bytes spill
 * loads"; returns -1 (line "") when the log has no report for `function`. */
int sdpa_ptxas_spills(const char *log, const char *function, char *line,
                      size_t size);

/* The same over every function ptxas reports in `log` (kernels and the
 * out-of-line device functions they call): 1 and the first offending
 * "<function>: <report>" in `line` when any spills, else 0. */
int sdpa_ptxas_any_spills(const char *log, char *line, size_t size);

/* 1 and the line (at most 300 characters) when the compiler's front end
 * warned in `log` ("warning #NNN-D": an unused variable, a narrowing),
 * else 0 (line ""): the templates compile without warnings. */
int sdpa_compile_any_warning(const char *log, char *line, size_t size);

#endif
