/* config.c — being written. */
typedef int sdpa_config_unit_;
