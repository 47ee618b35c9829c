// gpu::copy_rows: see cc/exchange_message.h.
#include <algorithm>
#include <vector>

#include "cc/exchange_message.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Blocks per launch, passed by value as a kernel parameter (4 KB limit).
constexpr int kBlocksPerLaunch = 48;

template <typename Src, typename Dst>
struct RowCopyBatch {
  RowCopy<Src, Dst> blocks[kBlocksPerLaunch];
};

// blockIdx.y picks the block; the x blocks stride over its elements.
template <typename Src, typename Dst>
__global__ void copy_rows_kernel(RowCopyBatch<Src, Dst> batch) {
  const RowCopy<Src, Dst> block = batch.blocks[blockIdx.y];
  const int64_t elements = block.rows * block.width;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < elements;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / block.width;
    const int64_t c = e - r * block.width;
    const int64_t from = block.src_rows ? block.src_rows[r] : r;
    const int64_t to = block.dst_rows ? block.dst_rows[r] : r;
    block.dst[to * block.dst_stride + c] =
        ConvertElement<Src, Dst>::apply(block.src[from * block.src_stride + c]);
  }
}

}  // namespace

template <typename Src, typename Dst>
void copy_rows(const GpuContext& context, const std::vector<RowCopy<Src, Dst>>& blocks) {
  for (size_t first = 0; first < blocks.size(); first += kBlocksPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kBlocksPerLaunch, blocks.size() - first));
    RowCopyBatch<Src, Dst> batch;
    int64_t largest = 0;
    for (int b = 0; b < count; ++b) {
      batch.blocks[b] = blocks[first + b];
      largest = std::max(largest, batch.blocks[b].rows * batch.blocks[b].width);
    }
    if (largest == 0) continue;
    const dim3 grid(grid_for(largest, kThreads, 4096), count);
    copy_rows_kernel<Src, Dst><<<grid, kThreads, 0, stream_of(context)>>>(batch);
    const Status status = cuda_status(cudaGetLastError(), "copy_rows");
    if (!status.ok()) {
      record_error(status);
      return;
    }
  }
}

template void copy_rows<int32_t, int64_t>(const GpuContext&,
                                          const std::vector<RowCopy<int32_t, int64_t>>&);
template void copy_rows<int64_t, int64_t>(const GpuContext&,
                                          const std::vector<RowCopy<int64_t, int64_t>>&);
template void copy_rows<int64_t, int32_t>(const GpuContext&,
                                          const std::vector<RowCopy<int64_t, int32_t>>&);
template void copy_rows<float, float>(const GpuContext&, const std::vector<RowCopy<float, float>>&);
// The compressed row exchange (cc/narrow_float.h).
template void copy_rows<float, Bfloat16Bits>(const GpuContext&,
                                             const std::vector<RowCopy<float, Bfloat16Bits>>&);
template void copy_rows<Bfloat16Bits, float>(const GpuContext&,
                                             const std::vector<RowCopy<Bfloat16Bits, float>>&);
template void copy_rows<float, Float16Bits>(const GpuContext&,
                                            const std::vector<RowCopy<float, Float16Bits>>&);
template void copy_rows<Float16Bits, float>(const GpuContext&,
                                            const std::vector<RowCopy<Float16Bits, float>>&);

}  // namespace gpu
}  // namespace sok_ev
