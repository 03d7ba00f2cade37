/* plan.c — being written. */
typedef int sdpa_plan_unit_;
