// Host-side entry points of the downstream library.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// The float32 / sum AllReduce kernel of `rank` (0..3), or NULL. Launch it with one hccc_args
// argument (gen/hccc_prims.h), gen/manifest.json's "ranks"[rank]["tbs"] blocks and
// "nthreads"["cuda"] threads per block.
const void* ring_collectives_kernel(int rank);

#ifdef __cplusplus
}
#endif
