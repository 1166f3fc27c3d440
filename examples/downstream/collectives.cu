// Host-side entry points of the downstream library (see collectives.h).
#include "collectives.h"

#ifdef DOWNSTREAM_TABLE
#include "hccc_table.h"
extern "C" HCCC_GLOBAL void hccc_table_float32_sum(hccc_table_args);
#endif

const char* ring_collectives_dir(void) { return DOWNSTREAM_HCCC_DIR; }

const void* ring_collectives_table_kernel(void) {
#ifdef DOWNSTREAM_TABLE
  return reinterpret_cast<const void*>(&hccc_table_float32_sum);
#else
  return nullptr;
#endif
}
