// Warp-level helpers shared by the GPU kernels that move rows through
// per-row addresses (cc/combine_kernels_gpu.h, cc/segment_sum_gpu.cu).
// CUDA only.
#ifndef SOK_EV_CC_WARP_GPU_H_
#define SOK_EV_CC_WARP_GPU_H_

#include <cuda_runtime.h>

namespace sok_ev {
namespace gpu {

// Lane `source`'s pointer, in every lane of the (full) warp: a row address
// resolved by one lane with its other loads, used by all.
template <typename T>
__device__ __forceinline__ T* shfl_pointer(T* p, int source) {
  return reinterpret_cast<T*>(
      __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(p), source));
}

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_WARP_GPU_H_
