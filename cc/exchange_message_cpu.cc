// PlanMessage, cpu::copy_rows and cpu::row_addresses: see cc/exchange_message.h.
#include <cstdint>
#include <vector>

#include "cc/exchange_message.h"

namespace sok_ev {

MessagePlan PlanMessage(const int64_t* counts, int num_tables, int num_workers,
                        const int64_t* widths, int64_t header_elements) {
  MessagePlan plan;
  plan.num_tables = num_tables;
  plan.num_workers = num_workers;
  plan.block_start.assign(num_workers, 0);
  plan.block_size.assign(num_workers, 0);
  plan.start.assign(int64_t{num_tables} * num_workers, 0);
  plan.table_offset.assign(int64_t{num_tables} * num_workers, 0);
  plan.table_rows.assign(num_tables, 0);
  int64_t at = 0;
  for (int w = 0; w < num_workers; ++w) {
    plan.block_start[w] = at;
    at += header_elements;
    for (int t = 0; t < num_tables; ++t) {
      const int64_t i = int64_t{t} * num_workers + w;
      plan.start[i] = at;
      plan.table_offset[i] = plan.table_rows[t];
      plan.table_rows[t] += counts[i];
      at += counts[i] * widths[t];
    }
    plan.block_size[w] = at - plan.block_start[w];
  }
  plan.total = at;
  return plan;
}

namespace cpu {

template <typename Src, typename Dst>
void copy_rows(const CpuContext& context, const std::vector<RowCopy<Src, Dst>>& blocks) {
  // Rows of all blocks, numbered in order, spread over the threads.
  std::vector<int64_t> first(blocks.size() + 1, 0);
  for (size_t b = 0; b < blocks.size(); ++b) first[b + 1] = first[b] + blocks[b].rows;
  const int64_t width_hint = blocks.empty() ? 1 : blocks[0].width;
  context.parallel_for(first.back(), 4 * width_hint, [&](int64_t begin, int64_t end) {
    size_t b = 0;
    while (first[b + 1] <= begin) ++b;
    for (int64_t i = begin; i < end; ++i) {
      while (first[b + 1] <= i) ++b;
      const RowCopy<Src, Dst>& block = blocks[b];
      const int64_t r = i - first[b];
      const Src* src = block.src + (block.src_rows ? block.src_rows[r] : r) * block.src_stride;
      Dst* dst = block.dst + (block.dst_rows ? block.dst_rows[r] : r) * block.dst_stride;
      for (int64_t c = 0; c < block.width; ++c) dst[c] = ConvertElement<Src, Dst>::apply(src[c]);
    }
  });
}

void row_addresses(const CpuContext& context, const std::vector<RowAddresses>& blocks) {
  for (const RowAddresses& block : blocks) {
    context.parallel_for(block.rows, 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        block.addresses[block.positions ? block.positions[r] : r] =
            block.first_row + r * block.stride;
      }
    });
  }
}

template void copy_rows<int32_t, int64_t>(const CpuContext&,
                                          const std::vector<RowCopy<int32_t, int64_t>>&);
template void copy_rows<int64_t, int64_t>(const CpuContext&,
                                          const std::vector<RowCopy<int64_t, int64_t>>&);
template void copy_rows<int64_t, int32_t>(const CpuContext&,
                                          const std::vector<RowCopy<int64_t, int32_t>>&);
template void copy_rows<float, float>(const CpuContext&, const std::vector<RowCopy<float, float>>&);
// The compressed row exchange (cc/narrow_float.h).
template void copy_rows<float, Bfloat16Bits>(const CpuContext&,
                                             const std::vector<RowCopy<float, Bfloat16Bits>>&);
template void copy_rows<Bfloat16Bits, float>(const CpuContext&,
                                             const std::vector<RowCopy<Bfloat16Bits, float>>&);
template void copy_rows<float, Float16Bits>(const CpuContext&,
                                            const std::vector<RowCopy<float, Float16Bits>>&);
template void copy_rows<Float16Bits, float>(const CpuContext&,
                                            const std::vector<RowCopy<Float16Bits, float>>&);

}  // namespace cpu
}  // namespace sok_ev
