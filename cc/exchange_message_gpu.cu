// gpu::copy_rows: see cc/exchange_message.h.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cc/exchange_message.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
// Blocks per launch, passed by value as a kernel parameter (4 KB limit).
constexpr int kBlocksPerLaunch = 48;

template <typename Src, typename Dst>
struct RowCopyBatch {
  RowCopy<Src, Dst> blocks[kBlocksPerLaunch];
};

// What kVector elements move as (kVector 4: float rows only).
template <typename Src, typename Dst, int kVector>
struct VectorUnit {
  using type = Dst;
};
template <>
struct VectorUnit<float, float, 4> {
  using type = float4;
};

// blockIdx.y picks the block; a warp copies a row, its lanes striding over
// the row's elements (coalesced, and with no division per element), the x
// blocks' warps striding over the rows. kVector elements move as one: 4
// floats (16 bytes) when every block of the launch allows it (see
// vector_copy_allowed), else 1.
template <typename Src, typename Dst, int kVector>
__global__ void copy_rows_kernel(RowCopyBatch<Src, Dst> batch) {
  using Unit = typename VectorUnit<Src, Dst, kVector>::type;
  const RowCopy<Src, Dst> block = batch.blocks[blockIdx.y];
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  const int64_t units = block.width / kVector;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp; r < block.rows;
       r += warps) {
    const int64_t from = block.src_rows ? block.src_rows[r] : r;
    const int64_t to = block.dst_rows ? block.dst_rows[r] : r;
    if constexpr (kVector == 1) {
      const Src* src = block.src + from * block.src_stride;
      Dst* dst = block.dst + to * block.dst_stride;
      for (int64_t c = lane; c < units; c += kWarp) {
        dst[c] = ConvertElement<Src, Dst>::apply(src[c]);
      }
    } else {
      const Unit* src = reinterpret_cast<const Unit*>(block.src + from * block.src_stride);
      Unit* dst = reinterpret_cast<Unit*>(block.dst + to * block.dst_stride);
      for (int64_t c = lane; c < units; c += kWarp) dst[c] = src[c];
    }
  }
}

// Whether a block can move float4s: the same element type on both sides,
// rows of whole float4s, and 16-byte-aligned rows at both ends.
template <typename Src, typename Dst>
bool vector_copy_allowed(const RowCopy<Src, Dst>& block) {
  if constexpr (!std::is_same_v<Src, float> || !std::is_same_v<Dst, float>) {
    return false;
  } else {
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return block.width % 4 == 0 && block.src_stride % 4 == 0 && block.dst_stride % 4 == 0 &&
           aligned(block.src) && aligned(block.dst);
  }
}

}  // namespace

template <typename Src, typename Dst>
void copy_rows(const GpuContext& context, const std::vector<RowCopy<Src, Dst>>& blocks) {
  for (size_t first = 0; first < blocks.size(); first += kBlocksPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kBlocksPerLaunch, blocks.size() - first));
    RowCopyBatch<Src, Dst> batch;
    int64_t largest = 0;  // rows of the largest non-empty block
    bool vector = true;
    for (int b = 0; b < count; ++b) {
      batch.blocks[b] = blocks[first + b];
      if (batch.blocks[b].rows * batch.blocks[b].width == 0) continue;
      largest = std::max(largest, batch.blocks[b].rows);
      vector = vector && vector_copy_allowed(batch.blocks[b]);
    }
    if (largest == 0) continue;
    const dim3 grid(grid_for(largest, kThreads / kWarp, 4096), count);
    if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, float>) {
      if (vector) {
        copy_rows_kernel<Src, Dst, 4><<<grid, kThreads, 0, stream_of(context)>>>(batch);
      } else {
        copy_rows_kernel<Src, Dst, 1><<<grid, kThreads, 0, stream_of(context)>>>(batch);
      }
    } else {
      copy_rows_kernel<Src, Dst, 1><<<grid, kThreads, 0, stream_of(context)>>>(batch);
    }
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
