// The two messages of the many-worker lookup (sok_ev/distributed.py), as
// one buffer per step instead of a tensor op per table and worker.
//
// Both messages hold, for every destination worker w in order, a block:
// `header_rows` rows, then table 0's rows for w, then table 1's, ... Table
// t sends counts[t * W + w] rows of `widths[t]` elements to worker w; in the
// table's own tensor these are rows table_offset(t, w) ... (the rows for
// worker 0 first, then worker 1, ...), or, when a row index is given, the
// rows it lists there.
//
//   keys to owners (int64, width 2):  header rows (fingerprint, N), then
//     (count of table t's keys for w, 0) for each t; then (key, occurrences)
//   rows back (float, or bfloat16 / float16 bits when compressed: see
//     cc/narrow_float.h; width dims[t]): no header; the rows of the keys w
//     sent, table by table, in the order w sent them
//
// The receiver of a message sees the same layout with the counts of the
// rows it receives, so one plan describes both ends.
#ifndef SOK_EV_CC_EXCHANGE_MESSAGE_H_
#define SOK_EV_CC_EXCHANGE_MESSAGE_H_

#include <cstdint>
#include <vector>

#include "cc/common.h"
#include "cc/narrow_float.h"

namespace sok_ev {

// Where each (table, worker) block sits in a message and in its table.
struct MessagePlan {
  int num_tables = 0;
  int num_workers = 0;
  std::vector<int64_t> block_start;   // (W,) first element of worker w's block
  std::vector<int64_t> block_size;    // (W,) elements in worker w's block
  std::vector<int64_t> start;         // (N * W,) first element of block (t, w)
  std::vector<int64_t> table_offset;  // (N * W,) first row of block (t, w) in table t
  std::vector<int64_t> table_rows;    // (N,) rows of table t over every worker
  int64_t total = 0;                  // elements in the message

  int64_t rows(const int64_t* counts, int t, int w) const { return counts[t * num_workers + w]; }
};

// Plans a message of N tables to W workers.
//   counts: (N * W,) host, rows of table t for worker w, each >= 0
//   widths: (N,) host, elements per row of table t
//   header_elements: elements before the tables' rows in each block
MessagePlan PlanMessage(const int64_t* counts, int num_tables, int num_workers,
                        const int64_t* widths, int64_t header_elements);

// One block of rows to copy: row r of the block reads
// src[(src_rows ? src_rows[r] : r) * src_stride + c] and writes
// dst[(dst_rows ? dst_rows[r] : r) * dst_stride + c], for c < width,
// converting Src to Dst (ConvertElement, cc/narrow_float.h: the same bits on
// both twins). Blocks of one call must not write the same element.
template <typename Src, typename Dst>
struct RowCopy {
  const Src* src;
  const int64_t* src_rows;  // (rows,) or null
  int64_t src_stride;
  Dst* dst;
  const int64_t* dst_rows;  // (rows,) or null
  int64_t dst_stride;
  int64_t rows;
  int64_t width;
};

// A block of rows read where they are instead of copied: row r of the block
// is at first_row + r * stride, and that address goes to
// addresses[positions ? positions[r] : r]. The requester's combine reads a
// received message this way (CombineRowMessage). Blocks of one call must not
// write the same address.
struct RowAddresses {
  const float* first_row;
  int64_t stride;
  const int64_t* positions;  // (rows,) or null
  int64_t rows;
  const float** addresses;
};

namespace cpu {
template <typename Src, typename Dst>
void copy_rows(const CpuContext& context, const std::vector<RowCopy<Src, Dst>>& blocks);
void row_addresses(const CpuContext& context, const std::vector<RowAddresses>& blocks);
}  // namespace cpu

namespace gpu {
// The same on context.stream, all blocks in as few launches as fit.
template <typename Src, typename Dst>
void copy_rows(const GpuContext& context, const std::vector<RowCopy<Src, Dst>>& blocks);
void row_addresses(const GpuContext& context, const std::vector<RowAddresses>& blocks);
}  // namespace gpu

}  // namespace sok_ev

#endif  // SOK_EV_CC_EXCHANGE_MESSAGE_H_
