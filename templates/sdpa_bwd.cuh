/* placeholder */
#include "sdpa_params.h"
