// Per-sample combination of embedding rows (forward) and its gradient
// (backward), the arithmetic of tf.nn.embedding_lookup_sparse.
//
// Sample b owns the entries j in [row_offsets[b], row_offsets[b + 1]); entry
// j reads unique row unique_index[j] with weight weights[j] (1 when weights
// is null). An empty sample gives a zero vector. 'mean' and 'sqrtn' divide
// by the sample's weight sum (or root of its sum of squares) as TensorFlow
// does, with div_no_nan: a sample whose weights sum to zero gives zeros and
// a zero gradient, never inf or NaN.
//
// The backward pass is organised by unique key, not by sample: unique u's
// gradient sums its entries order[segments[u] .. segments[u + 1]) in that
// order (ascending entries, as unique_keys' grouping leaves them), so every
// unique row is written by one worker, without atomics, and the bits do not
// depend on scheduling.
#ifndef SOK_EV_CC_COMBINE_H_
#define SOK_EV_CC_COMBINE_H_

#include <cstdint>

#include "cc/common.h"

namespace sok_ev {

// tf.math.div_no_nan: x / y, and 0 where y is 0.
SOK_EV_HOST_DEVICE float div_no_nan(float x, float y) { return y == 0.0f ? 0.0f : x / y; }

// One table's combine forward, in any of its forms (combine_forward,
// combine_forward_into_rows, combine_forward_rows below): a multi-table op
// hands over all its tables at once (Core::CombineForwardTables), and the
// GPU combines them in one launch per kernel variant
// (gpu::combine_forward_tables). A lookup that gathers from a hash table
// (gpu::lookup_combine_tables, Core::FindOrInsertCombineTables) describes
// its samples with the same struct, its rows and dim being the table's.
struct CombineForwardTable {
  const float* unique_values = nullptr;       // (num_unique, dim); null: unique_rows
  const float* const* unique_rows = nullptr;  // (num_unique,) unique u's row, read in place
  const int64_t* unique_index = nullptr;      // (nnz,)
  const float* weights = nullptr;             // (nnz,) or null
  const int64_t* row_offsets = nullptr;       // (batch + 1,)
  int64_t batch = 0;
  int64_t dim = 0;
  Combiner combiner = Combiner::kSum;
  float* out = nullptr;              // (batch, dim) out; null: out_rows
  float* const* out_rows = nullptr;  // (batch,) sample b's vector, out (rows must not overlap)
  // Every row read or written by address (unique_rows, out_rows) starts
  // 16-byte aligned: the GPU then moves rows as float4s when dim % 4 == 0.
  bool rows_aligned = false;
};

// One table's combine backward, in any of its forms (combine_backward,
// combine_backward_rows, combine_backward_from_rows below): a multi-table
// op hands over all its tables at once (Core::CombineBackwardTables), and
// the GPU sums them in a few launches (gpu::combine_backward_tables).
struct CombineBackwardTable {
  const float* grad_out = nullptr;              // (batch, dim); null: grad_out_rows
  const float* const* grad_out_rows = nullptr;  // (batch,) sample b's gradient row
  const int64_t* unique_index = nullptr;        // (nnz,)
  const int64_t* order = nullptr;               // (nnz,) grouped by key, or null (see below)
  const int64_t* segments = nullptr;            // (num_unique + 1,)
  int64_t num_unique = 0;
  const float* weights = nullptr;        // (nnz,) or null
  const int64_t* row_offsets = nullptr;  // (batch + 1,)
  int64_t batch = 0;
  int64_t nnz = 0;
  int64_t dim = 0;
  Combiner combiner = Combiner::kSum;
  float* grad_unique = nullptr;       // (num_unique, dim) out; null: grad_rows
  float* const* grad_rows = nullptr;  // (num_unique,) unique u's gradient row, out
  bool rows_aligned = false;          // every row read or written by address is 16-byte aligned
};

namespace cpu {

// Entry j's sample id is sample_ids[j * stride]: a SparseTensor's indices
// (stride = its rank) are read in place, column 0 being the sample.

// Turns the sample id of each entry into per-sample offsets, in one pass
// that also checks the ids. Returns the first entry whose sample id is
// outside [0, batch) or smaller than the id before it, or nnz when every id
// is valid (what the combines require); row_offsets is meaningful only then.
//   sample_ids:  (nnz * stride,)
//   row_offsets: (batch + 1,) out
int64_t row_offsets_from_sample_ids(const int64_t* sample_ids, int64_t stride, int64_t nnz,
                                    int64_t batch, int64_t* row_offsets);

// A RaggedTensor's row splits, read in place: sample b's entries are
// [row_splits[b] - first_entry, row_splits[b + 1] - first_entry), where
// first_entry is the table's first entry in a batch packing many tables.

// The first b in [0, batch] at which the splits stop describing nnz entries
// from first_entry: row_splits[0] != first_entry, a split below the one
// before it, or row_splits[batch] != first_entry + nnz; batch + 1 when the
// splits are valid (what row_offsets_from_row_splits and the combines need).
//   row_splits: (batch + 1,)
int64_t first_invalid_row_split(const int64_t* row_splits, int64_t first_entry, int64_t nnz,
                                int64_t batch);

// row_offsets[b] = row_splits[b] - first_entry for b in [0, batch].
void row_offsets_from_row_splits(const int64_t* row_splits, int64_t first_entry, int64_t batch,
                                 int64_t* row_offsets);

//   unique_values: (num_unique, dim)   unique_index: (nnz,)
//   weights:       (nnz,) or null      row_offsets:  (batch + 1,)
//   out:           (batch, dim) out, every element written
void combine_forward(const CpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out);

// The same, sample b's vector written at out_rows[b] (rows where a message
// wants them: FindOrInsertRowMessage). The rows must not overlap.
//   out_rows: (batch,) each a row of dim floats, written in full
void combine_forward_into_rows(const CpuContext& context, const float* unique_values,
                               const int64_t* unique_index, const float* weights,
                               const int64_t* row_offsets, int64_t batch, int64_t dim,
                               Combiner combiner, float* const* out_rows);

// The same, unique row u read at unique_rows[u] (rows left where they are,
// e.g. in a received message: CombineRowMessage).
//   unique_rows: (num_unique,) each a row of dim floats
void combine_forward_rows(const CpuContext& context, const float* const* unique_rows,
                          const int64_t* unique_index, const float* weights,
                          const int64_t* row_offsets, int64_t batch, int64_t dim, Combiner combiner,
                          float* out);

// Gradient of combine_forward with respect to unique_values: unique u's row
// sums its entries (unique_index[j] == u) in ascending order. The entries
// are grouped by key here (group_entries_by_key), one writer per key.
//   grad_out:     (batch, dim)
//   unique_index: (nnz,) from unique_keys' inverse
//   segments:     (num_unique + 1,) from segments_from_counts
//   nnz:          row_offsets[batch]
//   grad_unique:  (num_unique, dim) out, every element written
void combine_backward(const CpuContext& context, const float* grad_out, const int64_t* unique_index,
                      const int64_t* segments, int64_t num_unique, const float* weights,
                      const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                      Combiner combiner, float* grad_unique);

// The same, unique u's gradient written at grad_rows[u] (rows where a
// message wants them, e.g. the gradient of a received message:
// CombineRowMessageGrad). The rows must not overlap.
//   grad_rows: (num_unique,) each a row of dim floats, written in full
void combine_backward_rows(const CpuContext& context, const float* grad_out,
                           const int64_t* unique_index, const int64_t* segments, int64_t num_unique,
                           const float* weights, const int64_t* row_offsets, int64_t batch,
                           int64_t nnz, int64_t dim, Combiner combiner, float* const* grad_rows);

// The same, sample b's gradient read at grad_out_rows[b] (the gradient of
// a row message, where it arrived: FindOrInsertRowMessageGrad).
//   grad_out_rows: (batch,) each a row of dim floats
void combine_backward_from_rows(const CpuContext& context, const float* const* grad_out_rows,
                                const int64_t* unique_index, const int64_t* segments,
                                int64_t num_unique, const float* weights,
                                const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                                Combiner combiner, float* grad_unique);

// combine_backward's result, bit for bit, on the calling thread: one pass
// over the entries in sample order adds each one into its key's row
// (unique_index), so grad_out is read front to back instead of gathered in
// key order, and no grouping of the entries by key is needed. Each key
// still sums its entries in ascending order.
//   unique_index: (row_offsets[batch],) from unique_keys' inverse
void combine_backward_serial(const float* grad_out, const int64_t* unique_index, int64_t num_unique,
                             const float* weights, const int64_t* row_offsets, int64_t batch,
                             int64_t dim, Combiner combiner, float* grad_unique);
// The same into grad_rows, as combine_backward_rows.
void combine_backward_rows_serial(const float* grad_out, const int64_t* unique_index,
                                  int64_t num_unique, const float* weights,
                                  const int64_t* row_offsets, int64_t batch, int64_t dim,
                                  Combiner combiner, float* const* grad_rows);
// The same from grad_out_rows, as combine_backward_from_rows.
void combine_backward_from_rows_serial(const float* const* grad_out_rows,
                                       const int64_t* unique_index, int64_t num_unique,
                                       const float* weights, const int64_t* row_offsets,
                                       int64_t batch, int64_t dim, Combiner combiner,
                                       float* grad_unique);

}  // namespace cpu

namespace gpu {
// The same contracts with device pointers, work ordered on context.stream.

// One table's sample ids (or row splits), for row_offsets_from_sample_ids.
struct SampleIds {
  const int64_t* sample_ids;  // (nnz * stride,) device; null: entry j is sample j (and
                              // samples past nnz are empty)
  int64_t stride;
  int64_t nnz;
  int64_t batch;
  int64_t* row_offsets;                 // (batch + 1,) device out, or null
  const int64_t* row_splits = nullptr;  // (batch + 1,) device: used instead of sample_ids
  int64_t first_entry = 0;              // with row_splits: see cpu::first_invalid_row_split
};

// cpu::row_offsets_from_sample_ids (or, for tables given by row splits,
// cpu::first_invalid_row_split and cpu::row_offsets_from_row_splits) for many
// tables in one launch: table t's answer goes to first_invalid[t] (when
// first_invalid is not null) and its offsets to tables[t].row_offsets (when
// not null; meaningless where the ids are invalid). first_invalid[t] is nnz when table
// t is valid; for row splits an invalid table gets nnz + 1 (the sample is
// found on the host, cpu::first_invalid_row_split, on the error path).
//   tables: (num_tables,) host   first_invalid: (num_tables,) device out
void row_offsets_from_sample_ids(const GpuContext& context, const SampleIds* tables, int num_tables,
                                 int64_t* first_invalid);
// cpu::combine_forward from a matrix into a matrix (the harness's form).
void combine_forward(const GpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out);
// Every table's combine forward, in its form (unique_values or unique_rows
// in, out or out_rows out), one launch for
// all tables of a kernel variant (dim and alignment); each table's bits are
// those of its own call. Records an error when a dim is outside [1, 1024].
//   tables: (num_tables,) host
void combine_forward_tables(const GpuContext& context, const CombineForwardTable* tables,
                            int num_tables);
// cpu::combine_backward's result, reading the entries already grouped by key
// (order[segments[u] .. segments[u + 1]), from gpu::unique_keys_segmented)
// where the CPU twin groups them from unique_index itself.
void combine_backward(const GpuContext& context, const float* grad_out, const int64_t* order,
                      const int64_t* segments, int64_t num_unique, const float* weights,
                      const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                      Combiner combiner, float* grad_unique);
// Every table's combine_backward, in its form (grad_out or grad_out_rows in,
// grad_unique or grad_rows out), each stage one launch for up to 32
// tables; each table's bits are those of its own call. order must be set
// (the GPU reads the entries grouped by key).
//   tables: (num_tables,) host
void combine_backward_tables(const GpuContext& context, const CombineBackwardTable* tables,
                             int num_tables);
}  // namespace gpu

}  // namespace sok_ev

#endif  // SOK_EV_CC_COMBINE_H_
