// The worker topology of this process (worker_topology.h) and the two ops
// that set and read it (sok_ev/cc/ops/checkpoint_ops.cc). Host-only ops:
// their kernels are registered on CPU.
#include "sok_ev/cc/kernels/worker_topology.h"

#include <mutex>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"

namespace sok_ev {
namespace {

std::mutex& topology_mutex() {
  static std::mutex mutex;
  return mutex;
}

WorkerTopology& topology() {
  static WorkerTopology value;
  return value;
}

}  // namespace

WorkerTopology CurrentWorkerTopology() {
  std::lock_guard<std::mutex> lock(topology_mutex());
  return topology();
}

void SetWorkerTopology(WorkerTopology value) {
  std::lock_guard<std::mutex> lock(topology_mutex());
  topology() = value;
}

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

class SetWorkerTopologyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    const int32_t worker = context->input(0).scalar<int32_t>()();
    const int32_t num_workers = context->input(1).scalar<int32_t>()();
    OP_REQUIRES(context, num_workers >= 1 && worker >= 0 && worker < num_workers,
                tensorflow::errors::InvalidArgument("worker ", worker, " of ", num_workers,
                                                    " workers is not a worker topology"));
    SetWorkerTopology(WorkerTopology{worker, num_workers});
  }
};

class WorkerTopologyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    const WorkerTopology value = CurrentWorkerTopology();
    Tensor *worker, *num_workers;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &worker));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({}), &num_workers));
    worker->scalar<int32_t>()() = value.worker;
    num_workers->scalar<int32_t>()() = value.num_workers;
  }
};

REGISTER_KERNEL_BUILDER(Name("SokEv>SetWorkerTopology").Device(tensorflow::DEVICE_CPU),
                        SetWorkerTopologyOp);
REGISTER_KERNEL_BUILDER(Name("SokEv>WorkerTopology").Device(tensorflow::DEVICE_CPU),
                        WorkerTopologyOp);

#if GOOGLE_CUDA
// Host-memory twins, so graphs built under a GPU device scope place these ops
// without soft placement (the values never leave the host).
REGISTER_KERNEL_BUILDER(Name("SokEv>SetWorkerTopology")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("worker")
                            .HostMemory("num_workers"),
                        SetWorkerTopologyOp);
REGISTER_KERNEL_BUILDER(Name("SokEv>WorkerTopology")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("worker")
                            .HostMemory("num_workers"),
                        WorkerTopologyOp);
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace sok_ev
