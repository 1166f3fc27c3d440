// Host-side entry points of the downstream library.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Folder hccc generated the kernels into: manifest.json lists every rank's kernel symbol
// ("kernel_symbol", "ranks"[r]["kernel"]), its block count ("tbs") and threads per block
// ("nthreads"), its connections and progress counters; table mode adds the table file ("table").
const char* ring_collectives_dir(void);

// Table mode: the generic float32 / sum kernel. Launch it for rank r with manifest "ranks"[r]["tbs"]
// blocks and one hccc_table_args argument (hccc_table.h): the hccc_args of hccc_prims.h followed by
// the device address of rank r's table section. NULL in specialised mode, where each rank has its
// own kernel (manifest "ranks"[r]["kernel"]).
const void* ring_collectives_table_kernel(void);

#ifdef __cplusplus
}
#endif
