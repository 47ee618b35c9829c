// gpu::copy_rows and gpu::row_addresses: see cc/exchange_message.h.
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

// Rows a warp copies at once: their loads are all in flight together.
constexpr int kRowsPerWarp = 4;
// Rows of at most this many units go a thread a row: a warp over a row of
// one key or count would leave 31 of its lanes idle.
constexpr int kThreadRowUnits = 4;

// blockIdx.y picks the block. kVector elements move as one: 4 floats (16
// bytes) when every block of the launch allows it (see vector_copy_allowed),
// else 1. A block of consecutive rows at both ends (no row index, rows
// packed) is one run of elements, which every thread strides over. A block
// of narrow rows (kThreadRowUnits or fewer: the key message's keys and
// counts) goes a thread a row. Any other block goes by rows: a warp copies
// kRowsPerWarp rows at a time, its lanes striding over their elements
// (coalesced, no division per element), the x blocks' warps striding over
// the rows.
template <typename Src, typename Dst, int kVector>
__global__ void copy_rows_kernel(RowCopyBatch<Src, Dst> batch) {
  using Unit = typename VectorUnit<Src, Dst, kVector>::type;
  using SrcUnit = std::conditional_t<kVector == 1, Src, Unit>;
  const RowCopy<Src, Dst> block = batch.blocks[blockIdx.y];
  const int64_t units = block.width / kVector;  // per row
  auto convert = [](const SrcUnit& value) -> Unit {
    if constexpr (kVector == 1) {
      return ConvertElement<Src, Dst>::apply(value);
    } else {
      return value;
    }
  };
  const SrcUnit* src = reinterpret_cast<const SrcUnit*>(block.src);
  Unit* dst = reinterpret_cast<Unit*>(block.dst);
  if (block.src_rows == nullptr && block.dst_rows == nullptr && block.src_stride == block.width &&
      block.dst_stride == block.width) {
    const int64_t total = block.rows * units;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
      dst[i] = convert(src[i]);
    }
    return;
  }
  const int64_t src_stride = block.src_stride / kVector, dst_stride = block.dst_stride / kVector;
  if (units <= kThreadRowUnits) {
    for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < block.rows;
         r += int64_t(gridDim.x) * blockDim.x) {
      const int64_t from = block.src_rows ? block.src_rows[r] : r;
      const int64_t to = block.dst_rows ? block.dst_rows[r] : r;
      for (int64_t c = 0; c < units; ++c)
        dst[to * dst_stride + c] = convert(src[from * src_stride + c]);
    }
    return;
  }
  const int lane = threadIdx.x % kWarp;
  const int64_t step = int64_t(gridDim.x) * (blockDim.x / kWarp) * kRowsPerWarp;
  for (int64_t first =
           (blockIdx.x * int64_t(blockDim.x / kWarp) + threadIdx.x / kWarp) * kRowsPerWarp;
       first < block.rows; first += step) {
    int64_t from[kRowsPerWarp], to[kRowsPerWarp];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int64_t r = first + k;
      from[k] = r >= block.rows ? -1 : block.src_rows ? block.src_rows[r] : r;
      to[k] = r >= block.rows ? -1 : block.dst_rows ? block.dst_rows[r] : r;
    }
    for (int64_t c = lane; c < units; c += kWarp) {
      // Every row's load first, so that they are in flight together (a load
      // cannot be moved above a store that might alias it).
      SrcUnit value[kRowsPerWarp];
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        if (from[k] >= 0) value[k] = src[from[k] * src_stride + c];
      }
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        if (from[k] >= 0) dst[to[k] * dst_stride + c] = convert(value[k]);
      }
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

struct RowAddressBatch {
  RowAddresses blocks[kBlocksPerLaunch];
};

// blockIdx.y picks the block; its rows are spread over the x blocks' threads.
__global__ void row_addresses_kernel(RowAddressBatch batch) {
  const RowAddresses block = batch.blocks[blockIdx.y];
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < block.rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    block.addresses[block.positions ? block.positions[r] : r] = block.first_row + r * block.stride;
  }
}

}  // namespace

void row_addresses(const GpuContext& context, const std::vector<RowAddresses>& blocks) {
  for (size_t first = 0; first < blocks.size(); first += kBlocksPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kBlocksPerLaunch, blocks.size() - first));
    RowAddressBatch batch;
    int64_t largest = 0;
    for (int b = 0; b < count; ++b) {
      batch.blocks[b] = blocks[first + b];
      largest = std::max(largest, batch.blocks[b].rows);
    }
    if (largest == 0) continue;
    const dim3 grid(grid_for(largest, kThreads, 4096), count);
    row_addresses_kernel<<<grid, kThreads, 0, stream_of(context)>>>(batch);
    const Status status = cuda_status(cudaGetLastError(), "row_addresses");
    if (!status.ok()) {
      record_error(status);
      return;
    }
  }
}

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
    const dim3 grid(grid_for(largest, kThreads / kWarp * kRowsPerWarp, 4096), count);
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
