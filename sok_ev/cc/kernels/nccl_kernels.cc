// Kernels of sok_ev/cc/ops/nccl_ops.cc: they adapt tensors to the core's
// NcclExchange (cc/nccl_exchange.h). GPU builds only; in a CPU build the
// ops have no kernel, and sok_ev.communication refuses the transport first.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#if GOOGLE_CUDA

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cc/nccl_exchange.h"
#include "sok_ev/cc/kernels/tf_status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace sok_ev {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

namespace {

// The bytes a hex string spells, or an error naming it.
absl::Status FromHex(const std::string& hex, std::string* bytes) {
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() != 2 * static_cast<size_t>(gpu::kNcclIdBytes)) {
    return errors::InvalidArgument("communicator must be the hex of a ", gpu::kNcclIdBytes,
                                   "-byte NCCL unique id (", 2 * gpu::kNcclIdBytes,
                                   " digits), got ", hex.size(), " characters");
  }
  bytes->resize(hex.size() / 2);
  for (size_t i = 0; i < bytes->size(); ++i) {
    const int high = digit(hex[2 * i]), low = digit(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return errors::InvalidArgument("communicator has a non-hex character at ", 2 * i);
    }
    (*bytes)[i] = static_cast<char>(high * 16 + low);
  }
  return absl::OkStatus();
}

// Rows per worker, in bytes, after checking splits against the workers.
absl::Status SplitBytes(const Tensor& splits, const char* name, int world_size, int64_t row_bytes,
                        std::vector<int64_t>* bytes, int64_t* rows) {
  if (splits.dims() != 1 || splits.dim_size(0) != world_size) {
    return errors::InvalidArgument(name, " must have one entry per worker (", world_size,
                                   "), got shape ", splits.shape().DebugString());
  }
  const auto flat = splits.flat<int32_t>();
  bytes->resize(world_size);
  *rows = 0;
  for (int w = 0; w < world_size; ++w) {
    if (flat(w) < 0) return errors::InvalidArgument(name, "[", w, "] is negative: ", flat(w));
    (*bytes)[w] = flat(w) * row_bytes;
    *rows += flat(w);
  }
  return absl::OkStatus();
}

}  // namespace

class NcclUniqueIdOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    std::string id;
    OP_REQUIRES_OK(context, ToTfStatus(gpu::nccl_unique_id(&id)));
    Tensor* out;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = id;
  }
};

class NcclAlltoallOp : public AsyncOpKernel {
 public:
  explicit NcclAlltoallOp(OpKernelConstruction* context) : AsyncOpKernel(context) {
    std::string hex;
    OP_REQUIRES_OK(context, context->GetAttr("communicator", &hex));
    OP_REQUIRES_OK(context, FromHex(hex, &id_));
    OP_REQUIRES_OK(context, context->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(context, context->GetAttr("world_size", &world_size_));
    OP_REQUIRES_OK(context, context->GetAttr("timeout_seconds", &timeout_seconds_));
    OP_REQUIRES(context, world_size_ >= 1 && rank_ >= 0 && rank_ < world_size_,
                errors::InvalidArgument("rank must be in [0, world_size), got rank ", rank_,
                                        " of world_size ", world_size_));
    OP_REQUIRES(
        context, timeout_seconds_ > 0,
        errors::InvalidArgument("timeout_seconds must be positive, got ", timeout_seconds_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    const Tensor& tensor = context->input(0);
    OP_REQUIRES_ASYNC(context, tensor.dims() >= 1,
                      errors::InvalidArgument("tensor must have at least one dimension, got "
                                              "shape ",
                                              tensor.shape().DebugString()),
                      done);
    TensorShape row_shape = tensor.shape();
    row_shape.RemoveDim(0);
    const int64_t row_bytes = row_shape.num_elements() * tensorflow::DataTypeSize(tensor.dtype());
    std::vector<int64_t> send_bytes, recv_bytes;
    int64_t send_rows, recv_rows;
    OP_REQUIRES_OK_ASYNC(
        context,
        SplitBytes(context->input(1), "splits", world_size_, row_bytes, &send_bytes, &send_rows),
        done);
    OP_REQUIRES_OK_ASYNC(context,
                         SplitBytes(context->input(2), "received_splits", world_size_, row_bytes,
                                    &recv_bytes, &recv_rows),
                         done);
    OP_REQUIRES_ASYNC(context, send_rows == tensor.dim_size(0),
                      errors::InvalidArgument("splits sum to ", send_rows, " rows, but tensor has ",
                                              tensor.dim_size(0)),
                      done);
    TensorShape received_shape = row_shape;
    received_shape.InsertDim(0, recv_rows);
    Tensor* received;
    OP_REQUIRES_OK_ASYNC(context, context->allocate_output(0, received_shape, &received), done);
    std::shared_ptr<gpu::NcclExchange> exchange;
    OP_REQUIRES_OK_ASYNC(context, Exchange(&exchange), done);
    void* stream = context->eigen_device<Eigen::GpuDevice>().stream();
    const absl::Status queued = ToTfStatus(
        exchange->alltoall(tensor.data(), send_bytes.data(), received->data(), recv_bytes.data(),
                           stream, timeout_seconds_, [context, done](Status ended) {
                             if (!ended.ok()) context->SetStatus(ToTfStatus(ended));
                             done();
                           }));
    OP_REQUIRES_OK_ASYNC(context, queued, done);
  }

 private:
  // The communicator, made at the first run (collective: every worker's
  // first run of an exchange on it makes it).
  absl::Status Exchange(std::shared_ptr<gpu::NcclExchange>* exchange) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (exchange_ == nullptr) {
      TF_RETURN_IF_ERROR(ToTfStatus(
          gpu::NcclExchange::get(id_, rank_, world_size_, timeout_seconds_, &exchange_)));
    }
    *exchange = exchange_;
    return absl::OkStatus();
  }

  std::string id_;
  int rank_;
  int world_size_;
  float timeout_seconds_;
  std::mutex mutex_;
  std::shared_ptr<gpu::NcclExchange> exchange_;
};

REGISTER_KERNEL_BUILDER(Name("SokEv>NcclUniqueId").Device(tensorflow::DEVICE_CPU), NcclUniqueIdOp);
REGISTER_KERNEL_BUILDER(Name("SokEv>NcclAlltoall")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("splits")
                            .HostMemory("received_splits"),
                        NcclAlltoallOp);

}  // namespace sok_ev

#endif  // GOOGLE_CUDA
