// std::lower_bound and std::upper_bound for device code, shared by the GPU
// kernels that find segment starts in sorted arrays (row offsets, run
// lengths, owner counts) and merge sorted runs.
#ifndef SOK_EV_CC_LOWER_BOUND_GPU_H_
#define SOK_EV_CC_LOWER_BOUND_GPU_H_

#include <cstdint>

namespace sok_ev {
namespace gpu {

// The first index in [0, n) whose element is not less than `value`, or n.
// Element i is sorted[i * stride].
//   sorted: (n * stride,) non-decreasing, device memory
template <typename T>
__device__ __forceinline__ int64_t lower_bound(const T* sorted, int64_t n, T value,
                                               int64_t stride = 1) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sorted[mid * stride] < value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The first index in [0, n) whose element is greater than `value`, or n.
//   sorted: (n,) non-decreasing, device memory
template <typename T>
__device__ __forceinline__ int64_t upper_bound(const T* sorted, int64_t n, T value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (value < sorted[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_LOWER_BOUND_GPU_H_
