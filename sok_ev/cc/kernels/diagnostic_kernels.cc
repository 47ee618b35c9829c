// Kernels of sok_ev/cc/ops/diagnostic_ops.cc: host-only, on the CPU device.
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#if GOOGLE_CUDA
#include "cc/status_gpu.h"
#endif

namespace sok_ev {

class GpuHostSyncsOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(tensorflow::OpKernelContext* context) override {
    tensorflow::Tensor* count;
    OP_REQUIRES_OK(context, context->allocate_output(0, tensorflow::TensorShape({}), &count));
#if GOOGLE_CUDA
    count->scalar<int64_t>()() = gpu::host_syncs();
#else
    count->scalar<int64_t>()() = 0;
#endif
  }
};

REGISTER_KERNEL_BUILDER(Name("SokEv>GpuHostSyncs").Device(tensorflow::DEVICE_CPU), GpuHostSyncsOp);

}  // namespace sok_ev
