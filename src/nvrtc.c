/* nvrtc.c — being written. */
typedef int sdpa_nvrtc_unit_;
