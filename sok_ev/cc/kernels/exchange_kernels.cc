// Kernels that build and read the many-worker lookup's two all-to-all
// messages, for CPU and (GOOGLE_CUDA builds) GPU: each plans the message on
// the host from the [N, W] counts (cc/exchange_message.h) and moves every
// table's rows with one Core::CopyRows. Op definitions:
// sok_ev/cc/ops/exchange_ops.cc.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/exchange_message.h"
#include "sok_ev/cc/kernels/combine_attributes.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "sok_ev/cc/kernels/row_message.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::OpOutputList;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

namespace {

// The fingerprint a worker that stopped the job sends (sok_ev/agreement.py).
constexpr int64_t kStopped = -1;

}  // namespace

template <typename Device>
class PackKeyMessageOp : public OpKernel {
 public:
  explicit PackKeyMessageOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("fingerprint", &fingerprint_));
  }

  void Compute(OpKernelContext* context) override {
    OpInputList keys, counts, positions;
    OP_REQUIRES_OK(context, context->input_list("keys_by_owner", &keys));
    OP_REQUIRES_OK(context, context->input_list("counts", &counts));
    OP_REQUIRES_OK(context, context->input_list("positions", &positions));
    const int n = keys.size();
    std::vector<int64_t> owner_counts;
    int num_workers;
    OP_REQUIRES_OK(context, ReadCounts(context->input(3 * n), n, &owner_counts, &num_workers));
    const std::vector<int64_t> widths(n, 1);
    const MessagePlan plan = PlanMessage(owner_counts.data(), n, num_workers, widths.data(),
                                         /*header_elements=*/n + 1);
    for (int t = 0; t < n; ++t) {
      const int64_t rows = plan.table_rows[t];
      OP_REQUIRES(context,
                  keys[t].NumElements() == rows && counts[t].NumElements() == rows &&
                      positions[t].NumElements() == rows,
                  errors::InvalidArgument("table ", t, ": owner_counts sum to ", rows,
                                          " keys, but ", keys[t].NumElements(), " keys, ",
                                          counts[t].NumElements(), " counts and ",
                                          positions[t].NumElements(), " positions were given"));
    }
    Tensor* message;
    OP_REQUIRES_OK(context,
                   context->allocate_output("message", TensorShape({plan.total, 2}), &message));
    OP_REQUIRES_OK(context, WriteSplits(context, plan, 1));
    int64_t* out = message->flat<int64_t>().data();
    Core<Device> core(context);
    for (int w = 0; w < num_workers; ++w) {
      std::vector<int64_t> header = {fingerprint_, n};
      for (int t = 0; t < n; ++t) {
        header.push_back(plan.rows(owner_counts.data(), t, w));
        header.push_back(0);
      }
      OP_REQUIRES_OK(context, core.Upload(header, out + 2 * plan.block_start[w]));
    }
    std::vector<RowCopy<int32_t, int64_t>> keys32;
    std::vector<RowCopy<int64_t, int64_t>> keys64_and_counts;
    for (int t = 0; t < n; ++t) {
      for (int w = 0; w < num_workers; ++w) {
        const int64_t i = int64_t{t} * num_workers + w, rows = owner_counts[i];
        if (rows == 0) continue;
        int64_t* dst = out + 2 * plan.start[i];
        const int64_t first = plan.table_offset[i];
        if (keys[t].dtype() == tensorflow::DT_INT32) {
          keys32.push_back(
              {keys[t].flat<int32_t>().data() + first, nullptr, 1, dst, nullptr, 2, rows, 1});
        } else {
          keys64_and_counts.push_back(
              {keys[t].flat<int64_t>().data() + first, nullptr, 1, dst, nullptr, 2, rows, 1});
        }
        keys64_and_counts.push_back({counts[t].flat<int64_t>().data(),
                                     positions[t].flat<int64_t>().data() + first, 1, dst + 1,
                                     nullptr, 2, rows, 1});
      }
    }
    OP_REQUIRES_OK(context, core.CopyRows(keys32));
    OP_REQUIRES_OK(context, core.CopyRows(keys64_and_counts));
  }

 private:
  int64_t fingerprint_;
};

template <typename Device>
class UnpackKeyMessageOp : public OpKernel {
 public:
  explicit UnpackKeyMessageOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("fingerprint", &fingerprint_));
    OP_REQUIRES_OK(context, context->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(context, context->GetAttr("Tkeys", &key_dtypes_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& message = context->input(0);
    const Tensor& splits = context->input(1);  // host
    const int n = static_cast<int>(key_dtypes_.size());
    const int64_t header_rows = n + 1;
    OP_REQUIRES(context, message.dims() == 2 && message.dim_size(1) == 2,
                errors::InvalidArgument("message must be [rows, 2], got shape ",
                                        message.shape().DebugString()));
    const int num_workers = static_cast<int>(splits.NumElements());
    std::vector<int64_t> block_start(num_workers + 1, 0);
    for (int w = 0; w < num_workers; ++w) {
      const int64_t rows = splits.flat<int32_t>()(w);
      OP_REQUIRES(context, rows >= 1,
                  errors::InvalidArgument("worker ", w, " sent no header (", rows, " rows)"));
      block_start[w + 1] = block_start[w] + rows;
    }
    OP_REQUIRES(context, block_start[num_workers] == message.dim_size(0),
                errors::InvalidArgument("splits sum to ", block_start[num_workers],
                                        " rows, but the message has ", message.dim_size(0)));
    Core<Device> core(context);
    const int64_t* in = message.flat<int64_t>().data();

    // Every worker's header, on the host: checked before anything reads on.
    // A stopping worker sends its first row only (sok_ev/agreement.py).
    Tensor gathered;
    OP_REQUIRES_OK(context,
                   AllocateVector<int64_t>(context, num_workers * header_rows * 2, &gathered));
    OP_REQUIRES_OK(context, core.SetZero(gathered.flat<int64_t>().data(), gathered.NumElements()));
    std::vector<RowCopy<int64_t, int64_t>> header_blocks;
    for (int w = 0; w < num_workers; ++w) {
      header_blocks.push_back({in + 2 * block_start[w], nullptr, 2,
                               gathered.flat<int64_t>().data() + w * header_rows * 2, nullptr, 2,
                               std::min(header_rows, block_start[w + 1] - block_start[w]), 2});
    }
    OP_REQUIRES_OK(context, core.CopyRows(header_blocks));
    std::vector<int64_t> headers(num_workers * header_rows * 2);
    OP_REQUIRES_OK(context, core.CopyToHost(gathered.flat<int64_t>().data(),
                                            static_cast<int64_t>(headers.size()), headers.data()));
    OP_REQUIRES_OK(context, CheckHeaders(headers, num_workers));
    for (int w = 0; w < num_workers; ++w) {
      OP_REQUIRES(
          context, block_start[w + 1] - block_start[w] >= header_rows,
          errors::InvalidArgument("worker ", w, " sent ", block_start[w + 1] - block_start[w],
                                  " rows, fewer than the header's ", header_rows));
    }

    Tensor* sender_counts;
    OP_REQUIRES_OK(context, context->allocate_output("sender_counts", TensorShape({n, num_workers}),
                                                     &sender_counts));
    std::vector<int64_t> counts(int64_t{n} * num_workers);
    for (int w = 0; w < num_workers; ++w) {
      int64_t rows = header_rows;
      for (int t = 0; t < n; ++t) {
        const int64_t count = headers[(w * header_rows + 1 + t) * 2];
        OP_REQUIRES(context, count >= 0,
                    errors::InvalidArgument("worker ", w, " sent a negative count ", count,
                                            " for table ", t));
        counts[int64_t{t} * num_workers + w] = count;
        rows += count;
      }
      OP_REQUIRES(
          context, rows == block_start[w + 1] - block_start[w],
          errors::InvalidArgument("worker ", w, "'s header counts ", rows, " rows, but it sent ",
                                  block_start[w + 1] - block_start[w]));
    }
    std::copy(counts.begin(), counts.end(), sender_counts->flat<int64_t>().data());

    const std::vector<int64_t> widths(n, 1);
    const MessagePlan plan = PlanMessage(counts.data(), n, num_workers, widths.data(), header_rows);
    OpOutputList keys, key_counts;
    OP_REQUIRES_OK(context, context->output_list("keys", &keys));
    OP_REQUIRES_OK(context, context->output_list("counts", &key_counts));
    std::vector<RowCopy<int64_t, int32_t>> keys32;
    std::vector<RowCopy<int64_t, int64_t>> keys64_and_counts;
    for (int t = 0; t < n; ++t) {
      Tensor *table_keys, *table_counts;
      OP_REQUIRES_OK(context, keys.allocate(t, TensorShape({plan.table_rows[t]}), &table_keys));
      OP_REQUIRES_OK(context,
                     key_counts.allocate(t, TensorShape({plan.table_rows[t]}), &table_counts));
      for (int w = 0; w < num_workers; ++w) {
        const int64_t i = int64_t{t} * num_workers + w, rows = counts[i];
        if (rows == 0) continue;
        const int64_t* src = in + 2 * plan.start[i];
        const int64_t first = plan.table_offset[i];
        if (key_dtypes_[t] == tensorflow::DT_INT32) {
          keys32.push_back(
              {src, nullptr, 2, table_keys->flat<int32_t>().data() + first, nullptr, 1, rows, 1});
        } else {
          keys64_and_counts.push_back(
              {src, nullptr, 2, table_keys->flat<int64_t>().data() + first, nullptr, 1, rows, 1});
        }
        keys64_and_counts.push_back({src + 1, nullptr, 2,
                                     table_counts->flat<int64_t>().data() + first, nullptr, 1, rows,
                                     1});
      }
    }
    OP_REQUIRES_OK(context, core.CopyRows(keys32));
    OP_REQUIRES_OK(context, core.CopyRows(keys64_and_counts));
  }

 private:
  // headers: (W, N + 1, 2) host. A "stopped" header wins: its worker's
  // error names the cause.
  absl::Status CheckHeaders(const std::vector<int64_t>& headers, int num_workers) const {
    const int64_t n = static_cast<int64_t>(key_dtypes_.size());
    std::string names;  // the lookup's tables, as errors name it
    for (const std::string& name : table_names_) {
      names += (names.empty() ? "'" : ", '") + name + "'";
    }
    for (int w = 0; w < num_workers; ++w) {
      if (headers[w * (n + 1) * 2] == kStopped) {
        return errors::InvalidArgument(
            "sok-ev: another worker stopped this exchange of the lookup of [", names,
            "] because the workers built or ran different lookups (an evaluation or a table "
            "looked up on some workers only); see worker ",
            w,
            "'s error. Every worker must build and run the same sok-ev lookups in the same "
            "order.");
      }
    }
    for (int w = 0; w < num_workers; ++w) {
      const int64_t fingerprint = headers[w * (n + 1) * 2];
      const int64_t tables = headers[w * (n + 1) * 2 + 1];
      if (fingerprint != fingerprint_ || tables != n) {
        return errors::InvalidArgument(
            "sok-ev: workers ran different lookups at the same time: this worker looked up [",
            names, "] (fingerprint ", fingerprint_, ", ", n, " tables) but worker ", w,
            " sent fingerprint ", fingerprint, " (", tables,
            " tables). Every worker must run the same sok-ev lookups in the same order.");
      }
    }
    return absl::OkStatus();
  }

  int64_t fingerprint_;
  std::vector<std::string> table_names_;
  std::vector<tensorflow::DataType> key_dtypes_;
};

// The message's element type in the core (cc/narrow_float.h) for each
// Tmessage: uint16 tensors hold bfloat16 bits, half tensors float16 bits.
template <typename Element>
struct MessageElement;
template <>
struct MessageElement<float> {
  using Tensor = float;
};
template <>
struct MessageElement<Bfloat16Bits> {
  using Tensor = uint16_t;
};
template <>
struct MessageElement<Float16Bits> {
  using Tensor = Eigen::half;
};

// The message tensor's data as the core's element type (both 16-bit types
// are their bits).
template <typename Element>
Element* MessageData(Tensor* message) {
  static_assert(sizeof(Element) == sizeof(typename MessageElement<Element>::Tensor), "");
  return reinterpret_cast<Element*>(
      message->flat<typename MessageElement<Element>::Tensor>().data());
}
template <typename Element>
const Element* MessageData(const Tensor& message) {
  return MessageData<Element>(const_cast<Tensor*>(&message));
}

// Runs work(Element()) with the core's element type of a Tmessage.
template <typename Work>
absl::Status ForMessageType(tensorflow::DataType dtype, Work work) {
  switch (dtype) {
    case tensorflow::DT_FLOAT:
      return work(float());
    case tensorflow::DT_UINT16:
      return work(Bfloat16Bits());
    case tensorflow::DT_HALF:
      return work(Float16Bits());
    default:
      return errors::InvalidArgument("unsupported row message type ",
                                     tensorflow::DataTypeString(dtype));
  }
}

// Runs the message's copies and the local rows' copies, in one launch when
// both are float to float.
template <typename Device, typename Src, typename Dst>
absl::Status CopyAll(Core<Device>& core, std::vector<RowCopy<Src, Dst>>* message_blocks,
                     std::vector<RowCopy<float, float>>* local_blocks) {
  if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, float>) {
    message_blocks->insert(message_blocks->end(), local_blocks->begin(), local_blocks->end());
    return core.CopyRows(*message_blocks);
  } else {
    TF_RETURN_IF_ERROR(core.CopyRows(*message_blocks));
    return core.CopyRows(*local_blocks);
  }
}

template <typename Device>
class PackRowMessageOp : public OpKernel {
 public:
  explicit PackRowMessageOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("Tmessage", &message_dtype_));
    OP_REQUIRES_OK(context, context->GetAttr("local_worker", &local_worker_));
  }

  void Compute(OpKernelContext* context) override {
    OpInputList rows, positions;
    OP_REQUIRES_OK(context, context->input_list("rows", &rows));
    OP_REQUIRES_OK(context, context->input_list("positions", &positions));
    const int n = rows.size();
    std::vector<int64_t> counts, message_counts;
    int num_workers;
    OP_REQUIRES_OK(context, ReadCounts(context->input(n), n, &counts, &num_workers));
    OP_REQUIRES_OK(context, MessageCounts(counts, num_workers, local_worker_, &message_counts));
    std::vector<int64_t> widths(n);
    for (int t = 0; t < n; ++t) {
      OP_REQUIRES(context, rows[t].dims() == 2,
                  errors::InvalidArgument("rows[", t, "] must be a matrix, got shape ",
                                          rows[t].shape().DebugString()));
      widths[t] = rows[t].dim_size(1);
    }
    // Where each block sits in its table (every block), and in the message.
    const MessagePlan plan = PlanMessage(counts.data(), n, num_workers, widths.data(), 0);
    const MessagePlan message_plan =
        PlanMessage(message_counts.data(), n, num_workers, widths.data(), 0);
    for (int t = 0; t < n; ++t) {
      OP_REQUIRES(context, rows[t].dim_size(0) == plan.table_rows[t],
                  errors::InvalidArgument("rows[", t, "] has ", rows[t].dim_size(0),
                                          " rows, but counts sum to ", plan.table_rows[t]));
    }
    OP_REQUIRES_OK(context, CheckPositions(positions, plan));
    Tensor* message;
    OP_REQUIRES_OK(
        context, context->allocate_output("message", TensorShape({message_plan.total}), &message));
    OP_REQUIRES_OK(context, WriteSplits(context, message_plan, 1));
    std::vector<RowCopy<float, float>> local_blocks;
    OP_REQUIRES_OK(context, LocalRows(context, rows, positions, counts, plan, &local_blocks));
    Core<Device> core(context);
    OP_REQUIRES_OK(
        context, ForMessageType(message_dtype_, [&](auto element) {
          using Element = decltype(element);
          Element* out = MessageData<Element>(message);
          std::vector<RowCopy<float, Element>> blocks;
          for (int t = 0; t < n; ++t) {
            for (int w = 0; w < num_workers; ++w) {
              const int64_t i = int64_t{t} * num_workers + w, count = message_counts[i];
              if (count == 0 || widths[t] == 0) continue;
              const int64_t first = plan.table_offset[i];
              const int64_t* index = BlockPositions(positions, t, first);
              blocks.push_back({rows[t].flat<float>().data() + (index ? 0 : first * widths[t]),
                                index, widths[t], out + message_plan.start[i], nullptr, widths[t],
                                count, widths[t]});
            }
          }
          return CopyAll(core, &blocks, &local_blocks);
        }));
  }

 private:
  // Sets output local[t] to table t's block for local_worker_ (empty with
  // -1): a view of rows[t] when its rows are in order, else a copy (gathered
  // by positions), whose row copies go to `blocks`.
  absl::Status LocalRows(OpKernelContext* context, const OpInputList& rows,
                         const OpInputList& positions, const std::vector<int64_t>& counts,
                         const MessagePlan& plan, std::vector<RowCopy<float, float>>* blocks) {
    OpOutputList local;
    TF_RETURN_IF_ERROR(context->output_list("local", &local));
    for (int t = 0; t < rows.size(); ++t) {
      const int64_t width = rows[t].dim_size(1);
      const int64_t i = int64_t{t} * plan.num_workers + local_worker_;
      const int64_t count = local_worker_ < 0 ? 0 : counts[i];
      const int64_t first = local_worker_ < 0 ? 0 : plan.table_offset[i];
      const int64_t* index = BlockPositions(positions, t, first);
      if (index == nullptr) {
        // TensorFlow's kernels need aligned tensors: a view only where the
        // block starts aligned (every block of 128-float rows), else a copy.
        const Tensor view = rows[t].Slice(first, first + count);
        if (view.IsAligned()) {
          local.set(t, view);
          continue;
        }
      }
      Tensor* out;
      TF_RETURN_IF_ERROR(local.allocate(t, TensorShape({count, width}), &out));
      if (count > 0 && width > 0) {
        blocks->push_back({rows[t].flat<float>().data() + (index ? 0 : first * width), index, width,
                           out->flat<float>().data(), nullptr, width, count, width});
      }
    }
    return absl::OkStatus();
  }

  tensorflow::DataType message_dtype_;
  int local_worker_;
};

// The receiving end of a row message (UnpackRowMessage, CombineRowMessage,
// FindOrInsertRowMessageGrad): inputs message, counts, positions (where the
// op has them; rows in message order otherwise), local; attrs dims and
// local_worker. Read checks that they fit one another, and where each
// block is.
class ReceivedRows {
 public:
  absl::Status Read(OpKernelContext* context, const std::vector<int64_t>& dims, int local_worker) {
    message_ = &context->input(0);
    OpInputList positions;
    int first, last;
    if (context->op_kernel().InputRange("positions", &first, &last).ok()) {
      TF_RETURN_IF_ERROR(context->input_list("positions", &positions));
    }
    TF_RETURN_IF_ERROR(context->input_list("local", &local_));
    TF_RETURN_IF_ERROR(layout_.Plan(context->input(1), positions, dims, local_worker));
    if (message_->dims() != 1 || message_->NumElements() != layout_.message_elements()) {
      return errors::InvalidArgument("the message has shape ", message_->shape().DebugString(),
                                     ", but counts and dims make ", layout_.message_elements(),
                                     " elements");
    }
    return CheckLocal(dims, local_worker);
  }

  int64_t table_rows(int t) const { return layout_.table_rows(t); }

  // Writes the address of every received row, where it arrived.
  template <typename Device>
  absl::Status Addresses(Core<Device>& core, RowAddressTable* addresses) const {
    TF_RETURN_IF_ERROR(addresses->Allocate(core, layout_.table_rows()));
    ForEachBlock<float>(
        [&](int t, int64_t rows, int64_t first, const int64_t* index, const float* src) {
          addresses->Add(t, rows, first, index, src, layout_.dim(t));
        });
    return addresses->Write(core);
  }

  // Calls visit(t, rows, first, index, src) for every block (t, w) with
  // rows (RowMessageLayout::ForEachBlock), read from src: an Element* into
  // the message, or, for the local worker's block, a float* into local[t].
  template <typename Element, typename Visit>
  void ForEachBlock(const Visit& visit) const {
    const Element* in = MessageData<Element>(*message_);
    layout_.ForEachBlock(
        [&](int t, int64_t rows, int64_t first, const int64_t* index, int64_t message_start) {
          if (message_start < 0) {
            visit(t, rows, first, index, local_[t].flat<float>().data());
          } else {
            visit(t, rows, first, index, in + message_start);
          }
        });
  }

 private:
  // local: one [counts[t, local_worker], dims[t]] matrix per table with a
  // local worker, none without.
  absl::Status CheckLocal(const std::vector<int64_t>& dims, int local_worker) const {
    const int n = layout_.num_tables();
    const int want = local_worker < 0 ? 0 : n;
    if (local_.size() != want) {
      return errors::InvalidArgument("local must have ", want, " tensors for local_worker ",
                                     local_worker, ", got ", local_.size());
    }
    for (int t = 0; t < local_.size(); ++t) {
      const int64_t rows = layout_.local_rows(t);
      if (local_[t].dims() != 2 || local_[t].dim_size(0) != rows ||
          local_[t].dim_size(1) != dims[t]) {
        return errors::InvalidArgument("local[", t, "] must be [", rows, ", ", dims[t],
                                       "] (counts[", t, ", ", local_worker, "] rows of dims[", t,
                                       "]), got shape ", local_[t].shape().DebugString());
      }
    }
    return absl::OkStatus();
  }

  const Tensor* message_ = nullptr;
  OpInputList local_;
  RowMessageLayout layout_;
};

template <typename Device>
class UnpackRowMessageOp : public OpKernel {
 public:
  explicit UnpackRowMessageOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(context, context->GetAttr("Tmessage", &message_dtype_));
    OP_REQUIRES_OK(context, context->GetAttr("local_worker", &local_worker_));
  }

  void Compute(OpKernelContext* context) override {
    ReceivedRows received;
    OP_REQUIRES_OK(context, received.Read(context, dims_, local_worker_));
    const int n = static_cast<int>(dims_.size());
    OpOutputList outputs;
    OP_REQUIRES_OK(context, context->output_list("rows", &outputs));
    std::vector<float*> tables(n);
    for (int t = 0; t < n; ++t) {
      Tensor* table;
      OP_REQUIRES_OK(context,
                     outputs.allocate(t, TensorShape({received.table_rows(t), dims_[t]}), &table));
      tables[t] = table->flat<float>().data();
    }
    Core<Device> core(context);
    OP_REQUIRES_OK(
        context, ForMessageType(message_dtype_, [&](auto element) {
          using Element = decltype(element);
          std::vector<RowCopy<Element, float>> blocks;
          std::vector<RowCopy<float, float>> local_blocks;
          auto add = [&](auto* list, int t, int64_t rows, int64_t first, const int64_t* index,
                         auto src) {
            float* dst = tables[t] + (index ? 0 : first * dims_[t]);
            list->push_back({src, nullptr, dims_[t], dst, index, dims_[t], rows, dims_[t]});
          };
          received.ForEachBlock<Element>(
              [&](int t, int64_t rows, int64_t first, const int64_t* index, const auto* src) {
                if constexpr (std::is_same_v<std::decay_t<decltype(*src)>, Element>) {
                  add(&blocks, t, rows, first, index, src);
                } else {
                  add(&local_blocks, t, rows, first, index, src);
                }
              });
          return CopyAll(core, &blocks, &local_blocks);
        }));
  }

 private:
  std::vector<int64_t> dims_;
  tensorflow::DataType message_dtype_;
  int local_worker_;
};

// The requester's end of a float32 row message and its combine in one:
// UnpackRowMessage then CombineForward, without the unpacked rows. Each
// unique key's row is read where it arrived, in the message or in the local
// block (Core::WriteRowAddresses, then CombineForwardTables).
template <typename Device>
class CombineRowMessageOp : public OpKernel {
 public:
  explicit CombineRowMessageOp(OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {
    OP_REQUIRES_OK(context, context->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(context, context->GetAttr("local_worker", &local_worker_));
  }

  void Compute(OpKernelContext* context) override {
    ReceivedRows received;
    OP_REQUIRES_OK(context, received.Read(context, dims_, local_worker_));
    OpInputList unique_index, row_offsets, weights;
    OP_REQUIRES_OK(context, context->input_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->input_list("row_offsets", &row_offsets));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    OpOutputList embeddings;
    OP_REQUIRES_OK(context, context->output_list("embeddings", &embeddings));
    const int n = static_cast<int>(dims_.size());
    std::vector<CombineForwardTable> tables(n);
    for (int t = 0; t < n; ++t) {
      const int64_t batch = row_offsets[t].NumElements() - 1;
      OP_REQUIRES(context, batch >= 0,
                  errors::InvalidArgument("row_offsets[", t, "] must not be empty"));
      OP_REQUIRES_OK(context,
                     attributes_.CheckWeights(t, weights[t], unique_index[t].NumElements()));
      Tensor* output = nullptr;
      OP_REQUIRES_OK(context, embeddings.allocate(t, TensorShape({batch, dims_[t]}), &output));
      CombineForwardTable& table = tables[t];
      table.unique_index = unique_index[t].flat<int64_t>().data();
      table.weights = attributes_.WeightsOrNull(t, weights[t]);
      table.row_offsets = row_offsets[t].flat<int64_t>().data();
      table.batch = batch;
      table.dim = dims_[t];
      table.combiner = attributes_.combiner(t);
      table.out = output->flat<float>().data();
    }
    Core<Device> core(context);
    RowAddressTable addresses;
    OP_REQUIRES_OK(context, received.Addresses(core, &addresses));
    for (int t = 0; t < n; ++t) {
      tables[t].unique_rows = addresses.table(t);
      tables[t].rows_aligned = addresses.aligned(t, dims_[t]);
    }
    OP_REQUIRES_OK(context, core.CombineForwardTables(tables));
  }

 private:
  CombineAttributes attributes_;
  std::vector<int64_t> dims_;
  int local_worker_;
};

// The gradient of CombineRowMessage, in the layout of its message and local
// inputs: each unique key's gradient (CombineBackward's sums) written where
// the key's row arrived, so that the gradient message needs no
// PackRowMessage copy (Core::WriteRowAddresses, then CombineBackwardTables
// into those rows).
template <typename Device>
class CombineRowMessageGradOp : public OpKernel {
 public:
  explicit CombineRowMessageGradOp(OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {
    OP_REQUIRES_OK(context, context->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(context, context->GetAttr("local_worker", &local_worker_));
  }

  void Compute(OpKernelContext* context) override {
    OpInputList grads, positions, unique_index, order, segments, row_offsets, weights;
    OP_REQUIRES_OK(context, context->input_list("grads", &grads));
    OP_REQUIRES_OK(context, context->input_list("positions", &positions));
    OP_REQUIRES_OK(context, context->input_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->input_list("order", &order));
    OP_REQUIRES_OK(context, context->input_list("segments", &segments));
    OP_REQUIRES_OK(context, context->input_list("row_offsets", &row_offsets));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    const int n = grads.size();
    OP_REQUIRES(context, static_cast<int>(dims_.size()) == n,
                errors::InvalidArgument("dims has ", dims_.size(), " entries for ", n, " tables"));
    RowMessageLayout layout;
    OP_REQUIRES_OK(context, layout.Plan(context->input(n), positions, dims_, local_worker_));
    std::vector<int64_t> table_rows(n);
    for (int t = 0; t < n; ++t) {
      const int64_t batch = row_offsets[t].NumElements() - 1;
      const int64_t nnz = unique_index[t].NumElements();
      table_rows[t] = layout.table_rows(t);
      OP_REQUIRES(
          context,
          grads[t].dims() == 2 && grads[t].dim_size(0) == batch && grads[t].dim_size(1) == dims_[t],
          errors::InvalidArgument("grads[", t, "] must be [", batch, ", ", dims_[t],
                                  "] (row_offsets[", t, "] samples of dims[", t, "]), got shape ",
                                  grads[t].shape().DebugString()));
      // Each unique key's row sits in the message: one per position.
      OP_REQUIRES(
          context,
          segments[t].NumElements() == table_rows[t] + 1 &&
              (order[t].NumElements() == nnz || order[t].NumElements() == 0),
          errors::InvalidArgument("table ", t, ": ", segments[t].NumElements(), " segments for ",
                                  table_rows[t], " unique keys, ", nnz, " entries and ",
                                  order[t].NumElements(), " in their order"));
      OP_REQUIRES_OK(context, attributes_.CheckWeights(t, weights[t], nnz));
    }
    Core<Device> core(context);
    RowAddressTable addresses;
    OP_REQUIRES_OK(context,
                   AllocateRowMessage(context, core, layout, /*with_splits=*/false, &addresses));
    std::vector<CombineBackwardTable> tables;
    for (int t = 0; t < n; ++t) {
      if (dims_[t] == 0) continue;  // no rows, nothing to write
      tables.push_back(
          CombineBackwardTableOf(unique_index[t], order[t], segments[t], row_offsets[t], dims_[t]));
      tables.back().grad_out = grads[t].flat<float>().data();
      tables.back().weights = attributes_.WeightsOrNull(t, weights[t]);
      tables.back().combiner = attributes_.combiner(t);
      tables.back().grad_rows = addresses.table(t);
      tables.back().rows_aligned = addresses.aligned(t, dims_[t]);
    }
    OP_REQUIRES_OK(context, core.CombineBackwardTables(tables));
  }

 private:
  CombineAttributes attributes_;
  std::vector<int64_t> dims_;
  int local_worker_;
};

// The gradient of FindOrInsertRowMessage (lookup_kernels.cc): the owner's
// sum of each unique key's gradients, CombineBackward of the rows
// UnpackRowMessage(message, counts, local) would give, read where they
// arrived (Core::WriteRowAddresses, then CombineBackwardTables from those
// rows), so the gradient message needs no unpacking copy. Sample j is
// received row j, its one entry, summed.
template <typename Device>
class FindOrInsertRowMessageGradOp : public OpKernel {
 public:
  explicit FindOrInsertRowMessageGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(context, context->GetAttr("local_worker", &local_worker_));
  }

  void Compute(OpKernelContext* context) override {
    ReceivedRows received;
    OP_REQUIRES_OK(context, received.Read(context, dims_, local_worker_));
    OpInputList unique_index, order, segments, row_offsets;
    OP_REQUIRES_OK(context, context->input_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->input_list("order", &order));
    OP_REQUIRES_OK(context, context->input_list("segments", &segments));
    OP_REQUIRES_OK(context, context->input_list("row_offsets", &row_offsets));
    OpOutputList grad_unique;
    OP_REQUIRES_OK(context, context->output_list("grad_unique", &grad_unique));
    const int n = static_cast<int>(dims_.size());
    OP_REQUIRES(
        context, unique_index.size() == n,
        errors::InvalidArgument("dims has ", n, " entries for ", unique_index.size(), " tables"));
    std::vector<CombineBackwardTable> tables(n);
    for (int t = 0; t < n; ++t) {
      const int64_t rows = received.table_rows(t);
      const int64_t nnz = unique_index[t].NumElements();
      const int64_t num_unique = segments[t].NumElements() - 1;
      // One sample a received row, one entry a sample (UniqueOwnedKeys').
      OP_REQUIRES(
          context,
          row_offsets[t].NumElements() == rows + 1 && nnz == rows && num_unique >= 0 &&
              (order[t].NumElements() == nnz || order[t].NumElements() == 0),
          errors::InvalidArgument("table ", t, ": counts give ", rows, " received rows, but ",
                                  row_offsets[t].NumElements(), " row offsets, ", nnz, " entries, ",
                                  segments[t].NumElements(), " segments and ",
                                  order[t].NumElements(), " in their order"));
      Tensor* output;
      OP_REQUIRES_OK(context,
                     grad_unique.allocate(t, TensorShape({num_unique, dims_[t]}), &output));
      tables[t] =
          CombineBackwardTableOf(unique_index[t], order[t], segments[t], row_offsets[t], dims_[t]);
      tables[t].grad_unique = output->flat<float>().data();
    }
    Core<Device> core(context);
    RowAddressTable addresses;
    OP_REQUIRES_OK(context, received.Addresses(core, &addresses));
    for (int t = 0; t < n; ++t) {
      tables[t].grad_out_rows = addresses.table(t);
      tables[t].rows_aligned = addresses.aligned(t, dims_[t]);
    }
    OP_REQUIRES_OK(context, core.CombineBackwardTables(tables));
  }

 private:
  std::vector<int64_t> dims_;
  int local_worker_;
};

// Host only: the counts and the splits are host memory on both devices.
class RowMessageSplitsOp : public OpKernel {
 public:
  explicit RowMessageSplitsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(context, context->GetAttr("local_worker", &local_worker_));
  }

  void Compute(OpKernelContext* context) override {
    const int n = static_cast<int>(dims_.size());
    std::vector<int64_t> counts, message_counts;
    int num_workers = 0;
    OP_REQUIRES_OK(context, ReadCounts(context->input(0), n, &counts, &num_workers));
    OP_REQUIRES_OK(context, MessageCounts(counts, num_workers, local_worker_, &message_counts));
    OP_REQUIRES_OK(
        context,
        WriteSplits(context, PlanMessage(message_counts.data(), n, num_workers, dims_.data(), 0),
                    1));
  }

 private:
  std::vector<int64_t> dims_;
  int local_worker_;
};

REGISTER_KERNEL_BUILDER(Name("SokEv>RowMessageSplits").Device(tensorflow::DEVICE_CPU),
                        RowMessageSplitsOp);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("SokEv>RowMessageSplits")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("counts")
                            .HostMemory("splits"),
                        RowMessageSplitsOp);
#endif

#define SOK_EV_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name("SokEv>" name).Device(tensorflow::DEVICE_CPU), kernel<CPUDevice>)
SOK_EV_REGISTER_CPU("PackKeyMessage", PackKeyMessageOp);
SOK_EV_REGISTER_CPU("UnpackKeyMessage", UnpackKeyMessageOp);
SOK_EV_REGISTER_CPU("PackRowMessage", PackRowMessageOp);
SOK_EV_REGISTER_CPU("UnpackRowMessage", UnpackRowMessageOp);
SOK_EV_REGISTER_CPU("CombineRowMessage", CombineRowMessageOp);
SOK_EV_REGISTER_CPU("CombineRowMessageGrad", CombineRowMessageGradOp);
SOK_EV_REGISTER_CPU("FindOrInsertRowMessageGrad", FindOrInsertRowMessageGradOp);
#undef SOK_EV_REGISTER_CPU

#if GOOGLE_CUDA
// The messages stay on the GPU; the [N, W] counts that plan them and the
// splits Horovod reads are host memory.
using tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(
    Name("SokEv>PackKeyMessage").Device(DEVICE_GPU).HostMemory("owner_counts").HostMemory("splits"),
    PackKeyMessageOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>UnpackKeyMessage")
                            .Device(DEVICE_GPU)
                            .HostMemory("splits")
                            .HostMemory("sender_counts"),
                        UnpackKeyMessageOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(
    Name("SokEv>PackRowMessage").Device(DEVICE_GPU).HostMemory("counts").HostMemory("splits"),
    PackRowMessageOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>UnpackRowMessage").Device(DEVICE_GPU).HostMemory("counts"),
                        UnpackRowMessageOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineRowMessage").Device(DEVICE_GPU).HostMemory("counts"),
                        CombineRowMessageOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineRowMessageGrad").Device(DEVICE_GPU).HostMemory("counts"),
                        CombineRowMessageGradOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(
    Name("SokEv>FindOrInsertRowMessageGrad").Device(DEVICE_GPU).HostMemory("counts"),
    FindOrInsertRowMessageGradOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace sok_ev
