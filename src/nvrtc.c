/*
 * nvrtc.c — compiling one translation unit to a cubin with NVRTC.
 *
 * NVRTC is linked (not dlopen'd): a build host that preheats the cache has
 * the toolkit's libnvrtc but no GPU, and every compile needs it anyway.
 * The translation unit (instantiate.c) includes the template family's entry
 * header; every embedded template is handed to nvrtcCreateProgram as a
 * named header, so no include path and no toolkit header is read at run
 * time and the key (key.c) covers every byte compiled.
 *
 * The option list is fixed per arch and enters the key. "--ptxas-options=-v"
 * puts ptxas's register / spill report into the log, which the cache keeps
 * with the cubin and the tests read ("0 bytes spill stores").
 */
#include "nvrtc.h"

/* The toolkit's nvrtc.h: src/nvrtc.h shadows <nvrtc.h> on the include
 * path, so name it through a directory only the toolkit has. */
#include <crt/../nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "instantiate.h"
#include "status.h"

/* Arch values the option table covers (compute capability major*10+minor). */
#define ARCH_LIMIT 256
_Static_assert(ARCH_LIMIT <= 1000, "format_arch_option writes three digits");
/* Log lines copied into the error message of a failed compile. */
#define MESSAGE_LOG_LINES 20

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static char version_text[32];
static int supported_archs[64];
static int supported_count;
static char supported_text[256];
static char arch_option[ARCH_LIMIT][2][40];
static const char *option_lists[ARCH_LIMIT][2][5];

/* Writes "--gpu-architecture=sm_<arch>" (with `specific`, the
 * arch-specific target "sm_<arch>a": wgmma, setmaxnreg) for 0 <= arch <
 * 1000 (512 of them per process: by snprintf they took 10-20 us of a
 * fresh process's first plan). */
static void format_arch_option(char *out, int arch, int specific) {
  static const char prefix[] = "--gpu-architecture=sm_";
  memcpy(out, prefix, sizeof prefix - 1);
  char *p = out + sizeof prefix - 1;
  if (arch >= 100) *p++ = (char)('0' + arch / 100);
  if (arch >= 10) *p++ = (char)('0' + arch / 10 % 10);
  *p++ = (char)('0' + arch % 10);
  if (specific) *p++ = 'a';
  *p = '\0';
}

/* Fills the version text, the supported-arch list and every arch's option
 * list once per process. NVRTC is linked, so none of this can fail short of
 * a broken installation; then the version reads "unknown" and no arch is
 * supported (plans report it). */
static void init_tables(void) {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) == NVRTC_SUCCESS)
    snprintf(version_text, sizeof version_text, "%d.%d", major, minor);
  else
    snprintf(version_text, sizeof version_text, "unknown");

  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) == NVRTC_SUCCESS && count > 0 &&
      count <= (int)(sizeof supported_archs / sizeof supported_archs[0]) &&
      nvrtcGetSupportedArchs(supported_archs) == NVRTC_SUCCESS)
    supported_count = count;
  size_t used = 0;
  supported_text[0] = '\0';
  for (int i = 0; i < supported_count && used < sizeof supported_text; i++) {
    int n = snprintf(supported_text + used, sizeof supported_text - used,
                     "%s%d", i ? ", " : "", supported_archs[i]);
    if (n < 0) break;
    used += (size_t)n;
  }

  for (int arch = 0; arch < ARCH_LIMIT; arch++)
    for (int specific = 0; specific < 2; specific++) {
      const char **list = option_lists[arch][specific];
      format_arch_option(arch_option[arch][specific], arch, specific);
      list[0] = arch_option[arch][specific];
      list[1] = "-std=c++17";
      list[2] = "--device-as-default-execution-space";
      list[3] = "--ptxas-options=-v";
      list[4] = NULL;
    }
}

const char *sdpa_nvrtc_version(void) {
  pthread_once(&init_once, init_tables);
  return version_text;
}

const char *const *sdpa_nvrtc_options(int arch, int arch_specific) {
  pthread_once(&init_once, init_tables);
  if (arch < 0 || arch >= ARCH_LIMIT) return NULL;
  return option_lists[arch][arch_specific != 0];
}

int sdpa_nvrtc_arch_known(int arch) {
  pthread_once(&init_once, init_tables);
  for (int i = 0; i < supported_count; i++)
    if (supported_archs[i] == arch) return 1;
  return 0;
}

const char *sdpa_nvrtc_arch_list(void) {
  pthread_once(&init_once, init_tables);
  return supported_text;
}

/* Copies at most `lines` lines of `log` into `out` (always terminated). */
static void first_lines(const char *log, int lines, char *out, size_t size) {
  size_t n = 0;
  int seen = 0;
  if (size == 0) return;
  for (const char *p = log; *p && n + 1 < size; p++) {
    out[n++] = *p;
    if (*p == '\n' && ++seen == lines) break;
  }
  while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' ')) n--;
  out[n] = '\0';
}

/* Reads the program's log into a malloc'd string (NULL on out of memory). */
static char *program_log(nvrtcProgram program) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0)
    return strdup("");
  char *log = malloc(size + 1);
  if (!log) return NULL;
  if (nvrtcGetProgramLog(program, log) != NVRTC_SUCCESS) log[0] = '\0';
  log[size] = '\0';
  return log;
}

static double elapsed_ms(const struct timespec *start) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - start->tv_sec) * 1e3 +
         (double)(now.tv_nsec - start->tv_nsec) / 1e6;
}

/* Compiles `source` for `arch` with the embedded templates as headers; see
 * nvrtc.h. `compile_ms` (may be NULL) gets the wall time of the NVRTC calls
 * from program creation to the cubin copy, CLOCK_MONOTONIC. */
sdpa_status sdpa_nvrtc_compile_timed(const char *source, const char *name,
                                     int arch, int arch_specific, void **cubin,
                                     size_t *size, char **log, double *compile_ms) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  nvrtcProgram program = NULL;
  const char **header_data = NULL, **header_names = NULL;
  void *binary = NULL;
  char *text = NULL;
  struct timespec start;

  if (cubin) *cubin = NULL;
  if (size) *size = 0;
  if (log) *log = NULL;
  if (compile_ms) *compile_ms = 0.0;
  if (!source || !cubin || !size || !log)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_nvrtc_compile: source, cubin, size and log "
                          "must not be NULL");
  const char *const *options = sdpa_nvrtc_options(arch, arch_specific);
  if (!options || arch < 10)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_nvrtc_compile: arch %d is out of range", arch);
  int option_count = 0;
  while (options[option_count]) option_count++;

  size_t headers = sdpa_embedded_templates_count;
  header_data = calloc(headers ? headers : 1, sizeof *header_data);
  header_names = calloc(headers ? headers : 1, sizeof *header_names);
  if (!header_data || !header_names) {
    status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                            "out of host memory preparing an NVRTC compile");
    goto done;
  }
  for (size_t i = 0; i < headers; i++) {
    header_data[i] = sdpa_embedded_templates[i].data;
    header_names[i] = sdpa_embedded_templates[i].name;
  }

  clock_gettime(CLOCK_MONOTONIC, &start);
  nvrtcResult rc = nvrtcCreateProgram(&program, source, name ? name : "sdpa_bwd.cu",
                                      (int)headers, header_data, header_names);
  if (rc != NVRTC_SUCCESS) {
    program = NULL;
    status = sdpa_error_set(rc == NVRTC_ERROR_OUT_OF_MEMORY
                                ? SDPA_STATUS_OUT_OF_MEMORY
                                : SDPA_STATUS_COMPILE_FAILED,
                            "nvrtcCreateProgram failed: %s",
                            nvrtcGetErrorString(rc));
    goto done;
  }
  rc = nvrtcCompileProgram(program, option_count, options);
  text = program_log(program);
  if (rc != NVRTC_SUCCESS) {
    char head[1536];
    first_lines(text ? text : "", MESSAGE_LOG_LINES, head, sizeof head);
    status = sdpa_error_set(SDPA_STATUS_COMPILE_FAILED,
                            "NVRTC %s could not compile the kernel for sm_%d%s "
                            "(%s); the full log is in "
                            "sdpa_bwd_plan_compile_log():\n%s",
                            sdpa_nvrtc_version(), arch, arch_specific ? "a" : "",
                            nvrtcGetErrorString(rc), head);
    goto done;
  }
  size_t binary_size = 0;
  rc = nvrtcGetCUBINSize(program, &binary_size);
  if (rc == NVRTC_SUCCESS && binary_size == 0) rc = NVRTC_ERROR_INTERNAL_ERROR;
  if (rc == NVRTC_SUCCESS) {
    binary = malloc(binary_size);
    if (!binary) {
      status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                              "out of host memory copying a %zu-byte cubin",
                              binary_size);
      goto done;
    }
    rc = nvrtcGetCUBIN(program, binary);
  }
  if (rc != NVRTC_SUCCESS) {
    status = sdpa_error_set(SDPA_STATUS_COMPILE_FAILED,
                            "NVRTC compiled the kernel for sm_%d but gave no "
                            "cubin: %s",
                            arch, nvrtcGetErrorString(rc));
    goto done;
  }
  if (compile_ms) *compile_ms = elapsed_ms(&start);
  *cubin = binary;
  *size = binary_size;
  binary = NULL;

done:
  *log = text ? text : strdup("");
  free(binary);
  if (program) nvrtcDestroyProgram(&program);
  free(header_data);
  free(header_names);
  return status;
}

sdpa_status sdpa_nvrtc_compile(const char *source, const char *name, int arch,
                               void **cubin, size_t *size, char **log) {
  return sdpa_nvrtc_compile_timed(source, name, arch, 0, cubin, size, log, NULL);
}
