// Host-side lookup of the kernels hccc generated from algo.rccl.
#include "collectives.h"

#include "hccc_prims.h"

// The generated kernels are extern "C"; declare the ones this library hands out.
extern "C" __global__ void hccc_ring_r0_float32_sum(hccc_args);
extern "C" __global__ void hccc_ring_r1_float32_sum(hccc_args);
extern "C" __global__ void hccc_ring_r2_float32_sum(hccc_args);
extern "C" __global__ void hccc_ring_r3_float32_sum(hccc_args);

const void* ring_collectives_kernel(int rank) {
  switch (rank) {
    case 0: return reinterpret_cast<const void*>(&hccc_ring_r0_float32_sum);
    case 1: return reinterpret_cast<const void*>(&hccc_ring_r1_float32_sum);
    case 2: return reinterpret_cast<const void*>(&hccc_ring_r2_float32_sum);
    case 3: return reinterpret_cast<const void*>(&hccc_ring_r3_float32_sum);
    default: return nullptr;
  }
}
