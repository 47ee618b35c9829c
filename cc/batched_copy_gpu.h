// Many small device copies in one launch. A grouped stage works on one
// buffer for all tables while TensorFlow hands over, and takes back, one
// tensor per table: these copies adapt between the two without a launch
// (or a cudaMemcpy) per table, and without waiting for the stream.
#ifndef SOK_EV_CC_BATCHED_COPY_GPU_H_
#define SOK_EV_CC_BATCHED_COPY_GPU_H_

#include <cstdint>
#include <vector>

#include "cc/common.h"

namespace sok_ev {
namespace gpu {

// dst[i] = src[i] - shift for i < count (shift turns a global index into a
// table's own).
template <typename T>
struct CopyJob {
  const T* src;  // (count,) device
  T* dst;        // (count,) device
  int64_t count;
  T shift;
};

// Runs every job on context.stream; jobs must not overlap each other.
template <typename T>
void batched_copy(const GpuContext& context, const std::vector<CopyJob<T>>& jobs);

// dst[i] = values[i]: a few host values (offsets, sizes) written through
// kernel parameters. A cudaMemcpyAsync from pageable host memory would wait
// for the stream first; this does not.
//   dst: (values.size(),) device
void upload_values(const GpuContext& context, const std::vector<int64_t>& values, int64_t* dst);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_BATCHED_COPY_GPU_H_
