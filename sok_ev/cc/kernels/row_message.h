// Where each (table, worker) block of a row message sits, at either end of
// the exchange, and one address per row into it: shared by the kernels that
// build and read row messages (exchange_kernels.cc) and by the owner's
// lookup that writes its rows straight into one (lookup_kernels.cc).
// Layout: cc/exchange_message.h.
#ifndef SOK_EV_CC_KERNELS_ROW_MESSAGE_H_
#define SOK_EV_CC_KERNELS_ROW_MESSAGE_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cc/exchange_message.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

// counts ([num_tables, W], host) as a vector, and W; errors call the
// input `name`.
inline absl::Status ReadCounts(const tensorflow::Tensor& counts, int num_tables,
                               std::vector<int64_t>* values, int* num_workers,
                               const char* name = "counts") {
  if (counts.dims() != 2 || counts.dim_size(0) != num_tables || counts.dim_size(1) < 1) {
    return tensorflow::errors::InvalidArgument(
        name, " must be [", num_tables, ", num_workers], got shape ", counts.shape().DebugString());
  }
  *num_workers = static_cast<int>(counts.dim_size(1));
  const auto flat = counts.flat<int64_t>();
  values->assign(flat.data(), flat.data() + flat.size());
  for (size_t i = 0; i < values->size(); ++i) {
    if ((*values)[i] < 0) {
      return tensorflow::errors::InvalidArgument(name, "[", i / *num_workers, ", ",
                                                 i % *num_workers, "] is negative: ", (*values)[i]);
    }
  }
  return absl::OkStatus();
}

// Writes the plan's block sizes (elements per worker) to an int32 splits
// output (host memory), as Horovod's alltoall takes them.
inline absl::Status WriteSplits(tensorflow::OpKernelContext* context, const MessagePlan& plan,
                                int64_t divisor) {
  tensorflow::Tensor* splits;
  TF_RETURN_IF_ERROR(
      context->allocate_output("splits", tensorflow::TensorShape({plan.num_workers}), &splits));
  auto out = splits->flat<int32_t>();
  for (int w = 0; w < plan.num_workers; ++w) {
    const int64_t size = plan.block_size[w] / divisor;
    if (size > std::numeric_limits<int32_t>::max()) {
      return tensorflow::errors::InvalidArgument("the message to worker ", w, " has ", size,
                                                 " rows, more than an int32 split holds");
    }
    out(w) = static_cast<int32_t>(size);
  }
  return absl::OkStatus();
}

// The row messages' optional positions: none (rows in message order), or one
// int64 vector per table with one entry per row the counts give that table.
inline absl::Status CheckPositions(const tensorflow::OpInputList& positions,
                                   const MessagePlan& plan) {
  const int n = static_cast<int>(plan.table_rows.size());
  if (positions.size() != 0 && positions.size() != n) {
    return tensorflow::errors::InvalidArgument("positions must be empty or one per table (", n,
                                               "), got ", positions.size());
  }
  for (int t = 0; t < positions.size(); ++t) {
    if (positions[t].NumElements() != plan.table_rows[t]) {
      return tensorflow::errors::InvalidArgument("positions[", t, "] has ",
                                                 positions[t].NumElements(), " entries for ",
                                                 plan.table_rows[t], " rows");
    }
  }
  return absl::OkStatus();
}

// Table t's row indices for the block that starts at its row `first`; null
// when the rows are in message order (the block is then contiguous at `first`).
inline const int64_t* BlockPositions(const tensorflow::OpInputList& positions, int t,
                                     int64_t first) {
  return positions.size() == 0 ? nullptr : positions[t].flat<int64_t>().data() + first;
}

// The rows that cross the network: counts ([N * W]) with worker
// local_worker's column zeroed (its block stays local; -1: none), after
// checking that local_worker is -1 or a worker.
inline absl::Status MessageCounts(const std::vector<int64_t>& counts, int num_workers,
                                  int local_worker, std::vector<int64_t>* message_counts) {
  if (local_worker < -1 || local_worker >= num_workers) {
    return tensorflow::errors::InvalidArgument("local_worker must be -1 or in [0, ", num_workers,
                                               ") for counts of ", num_workers, " workers, got ",
                                               local_worker);
  }
  *message_counts = counts;
  if (local_worker < 0) return absl::OkStatus();
  for (size_t i = local_worker; i < message_counts->size(); i += num_workers) {
    (*message_counts)[i] = 0;
  }
  return absl::OkStatus();
}

// Where each (table, worker) block of a row message is, at either end:
// counts [N, W], table t's rows dims[t] wide, the optional positions of the
// rows in their tables, and the worker whose block stays out of the message
// (local_worker; -1: none).
class RowMessageLayout {
 public:
  absl::Status Plan(const tensorflow::Tensor& counts, const tensorflow::OpInputList& positions,
                    const std::vector<int64_t>& dims, int local_worker) {
    dims_ = dims;
    local_worker_ = local_worker;
    positions_ = positions;
    const int n = static_cast<int>(dims_.size());
    TF_RETURN_IF_ERROR(ReadCounts(counts, n, &counts_, &num_workers_));
    TF_RETURN_IF_ERROR(MessageCounts(counts_, num_workers_, local_worker_, &message_counts_));
    plan_ = PlanMessage(counts_.data(), n, num_workers_, dims_.data(), 0);
    message_plan_ = PlanMessage(message_counts_.data(), n, num_workers_, dims_.data(), 0);
    return CheckPositions(positions_, plan_);
  }

  int num_tables() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int t) const { return dims_[t]; }
  int64_t table_rows(int t) const { return plan_.table_rows[t]; }
  const std::vector<int64_t>& table_rows() const { return plan_.table_rows; }
  int64_t message_elements() const { return message_plan_.total; }
  // The message's blocks (elements per worker: block_size).
  const MessagePlan& message_plan() const { return message_plan_; }
  // Rows of table t in the local block (0 without a local worker).
  int64_t local_rows(int t) const {
    return local_worker_ < 0 ? 0 : counts_[int64_t{t} * num_workers_ + local_worker_];
  }

  // Calls visit(t, rows, first, index, message_start) for every block
  // (t, w) with rows: they belong at table t's rows first, first + 1, ...
  // (index null) or at index[0], index[1], ... (positions), and sit in the
  // message from element message_start on, or, for the local worker's
  // block (message_start -1), in table t's local matrix.
  template <typename Visit>
  void ForEachBlock(const Visit& visit) const {
    for (int t = 0; t < num_tables(); ++t) {
      for (int w = 0; w < num_workers_; ++w) {
        const int64_t i = int64_t{t} * num_workers_ + w;
        if (counts_[i] == 0 || dims_[t] == 0) continue;
        const int64_t first = plan_.table_offset[i];
        visit(t, counts_[i], first, BlockPositions(positions_, t, first),
              w == local_worker_ ? int64_t{-1} : message_plan_.start[i]);
      }
    }
  }

 private:
  std::vector<int64_t> dims_;
  int local_worker_ = -1;
  tensorflow::OpInputList positions_;
  std::vector<int64_t> counts_, message_counts_;
  int num_workers_ = 0;
  MessagePlan plan_, message_plan_;
};

// One address per row of every table (table t's row i at
// addresses()[first(t) + i]), pointing where that row sits in a row
// message or its local block, for the ops that combine a message in place
// or write its gradient in place.
class RowAddressTable {
 public:
  //   table_rows: (N,) rows of each table
  template <typename Device>
  absl::Status Allocate(Core<Device>& core, const std::vector<int64_t>& table_rows) {
    const int n = static_cast<int>(table_rows.size());
    first_.assign(n + 1, 0);
    for (int t = 0; t < n; ++t) first_[t + 1] = first_[t] + table_rows[t];
    aligned_.assign(n, 1);
    static_assert(sizeof(float*) == sizeof(int64_t), "row addresses are 8 bytes");
    TF_RETURN_IF_ERROR(core.template Scratch<int64_t>(std::max<int64_t>(1, first_[n]), &scratch_));
    addresses_ = reinterpret_cast<float**>(VectorData<int64_t>(scratch_));
    return absl::OkStatus();
  }

  // A block of table t: `rows` rows of dim floats from `src` on, the table's
  // rows first, first + 1, ... or index[0], index[1], ...
  void Add(int t, int64_t rows, int64_t first, const int64_t* index, const float* src,
           int64_t dim) {
    aligned_[t] = aligned_[t] && reinterpret_cast<uintptr_t>(src) % 16 == 0;
    blocks_.push_back({src, dim, index, rows,
                       const_cast<const float**>(addresses_) + first_[t] + (index ? 0 : first)});
  }

  // Writes every block's addresses (one launch on a GPU).
  template <typename Device>
  absl::Status Write(Core<Device>& core) {
    return core.WriteRowAddresses(blocks_);
  }

  float* const* table(int t) const { return addresses_ + first_[t]; }
  // Whether table t's rows can move as float4s: dim % 4 == 0 and every
  // block 16-byte aligned (then every row is).
  bool aligned(int t, int64_t dim) const { return aligned_[t] && dim % 4 == 0; }

 private:
  std::vector<int64_t> first_;
  std::vector<char> aligned_;
  std::vector<RowAddresses> blocks_;
  tensorflow::Tensor scratch_;
  float** addresses_ = nullptr;
};

// The outputs of an op that writes a row message in place: "message"
// (flat float32, layout.message_elements()), "local" (table t's
// [layout.local_rows(t), dims[t]]: the local worker's block, empty without
// one) and, with_splits, "splits" (elements per worker); the address of
// every row in them goes to *addresses, written on the device.
template <typename Device>
absl::Status AllocateRowMessage(tensorflow::OpKernelContext* context, Core<Device>& core,
                                const RowMessageLayout& layout, bool with_splits,
                                RowAddressTable* addresses) {
  tensorflow::Tensor* message;
  TF_RETURN_IF_ERROR(context->allocate_output(
      "message", tensorflow::TensorShape({layout.message_elements()}), &message));
  if (with_splits) TF_RETURN_IF_ERROR(WriteSplits(context, layout.message_plan(), 1));
  tensorflow::OpOutputList local;
  TF_RETURN_IF_ERROR(context->output_list("local", &local));
  std::vector<float*> local_rows(local.size());
  for (int t = 0; t < local.size(); ++t) {
    tensorflow::Tensor* out;
    TF_RETURN_IF_ERROR(
        local.allocate(t, tensorflow::TensorShape({layout.local_rows(t), layout.dim(t)}), &out));
    local_rows[t] = out->flat<float>().data();
  }
  TF_RETURN_IF_ERROR(addresses->Allocate(core, layout.table_rows()));
  float* out = message->flat<float>().data();
  layout.ForEachBlock(
      [&](int t, int64_t rows, int64_t first, const int64_t* index, int64_t message_start) {
        addresses->Add(t, rows, first, index,
                       message_start < 0 ? local_rows[t] : out + message_start, layout.dim(t));
      });
  return addresses->Write(core);
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_ROW_MESSAGE_H_
