// One launch for many tables. A grouped stage (an op's tables each with
// their own sizes and buffers) passes the tables by value in the kernel's
// parameters, and blockIdx.y picks a block's table: one launch for the op
// instead of one a table, with no device-side table array to upload first.
// Kernel parameters are at most 4 KB, so launch_by_table cuts longer lists.
// CUDA only.
#ifndef SOK_EV_CC_TABLE_LAUNCH_GPU_H_
#define SOK_EV_CC_TABLE_LAUNCH_GPU_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cc/common.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {

// The tables of one launch; blockIdx.y < count indexes `at`. kCapacity
// leaves a kernel about 100 bytes of parameters besides.
template <typename Table>
struct LaunchTables {
  static constexpr int kCapacity =
      4000 / sizeof(Table) < 64 ? static_cast<int>(4000 / sizeof(Table)) : 64;
  static_assert(kCapacity >= 1, "one table must fit the 4 KB of kernel parameters");
  Table at[kCapacity];
};

// Calls launch(batch, first, count, longest) for tables[0, n), kCapacity
// tables at a time: batch.at[t] is tables[first + t] for t < count, and
// longest the most work items (size(table)) of any of them. A batch whose
// tables have no work is skipped. Returns the first launch error, named
// `what`.
template <typename Table, typename Size, typename Launch>
Status launch_by_table(const Table* tables, size_t n, const Size& size, const Launch& launch,
                       const char* what) {
  constexpr int kCapacity = LaunchTables<Table>::kCapacity;
  for (size_t first = 0; first < n; first += kCapacity) {
    const int count = static_cast<int>(std::min<size_t>(kCapacity, n - first));
    LaunchTables<Table> batch;
    int64_t longest = 0;
    for (int t = 0; t < count; ++t) {
      batch.at[t] = tables[first + t];
      longest = std::max<int64_t>(longest, size(batch.at[t]));
    }
    if (longest == 0) continue;
    launch(batch, static_cast<int>(first), count, longest);
    SOK_EV_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), what));
  }
  return Status::Ok();
}

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_TABLE_LAUNCH_GPU_H_
