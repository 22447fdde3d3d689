// CPU stand-in for CANN's register/tilingdata_base.h: the TilingData macros become a plain struct with
// set_<field>() setters, so op_host/kl_div_custom_tiling.h itself defines what the simulated kernels read.
#pragma once
#include <cstdint>

#define BEGIN_TILING_DATA_DEF(name) struct name {
#define TILING_DATA_FIELD_DEF(type, field) \
  type field;                              \
  void set_##field(type v) { field = v; }
#define END_TILING_DATA_DEF }
#define REGISTER_TILING_DATA_CLASS(op, cls)
