// What every sok_ev op kernel needs to adapt TensorFlow to the core: the
// CPU context over TF's intra-op pool, key-dtype dispatch, resource lookup
// and Status conversion.
#ifndef SOK_EV_CC_KERNELS_KERNEL_UTILS_H_
#define SOK_EV_CC_KERNELS_KERNEL_UTILS_H_

#include <string>

#include "cc/common.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/threadpool.h"

namespace sok_ev {

// Core work runs on TF's intra-op thread pool, like TF's own kernels.
inline CpuContext MakeCpuContext(tensorflow::OpKernelContext* context) {
  tensorflow::thread::ThreadPool* pool =
      context->device()->tensorflow_cpu_worker_threads()->workers;
  CpuContext cpu;
  cpu.parallel_for = [pool](int64_t total, int64_t cost_per_unit,
                            const CpuContext::Work& work) {
    pool->ParallelFor(total, cost_per_unit, work);
  };
  return cpu;
}

inline absl::Status ToTfStatus(const Status& status) {
  if (status.ok()) return absl::OkStatus();
  if (status.code == Status::Code::kInvalidArgument) {
    return tensorflow::errors::InvalidArgument(status.message);
  }
  return tensorflow::errors::Internal(status.message);
}

// Calls body(Key{}) with Key = int32_t or int64_t according to `dtype`.
template <typename Body>
absl::Status DispatchKeyType(tensorflow::DataType dtype, const std::string& what,
                             Body&& body) {
  switch (dtype) {
    case tensorflow::DT_INT32:
      body(int32_t{});
      return absl::OkStatus();
    case tensorflow::DT_INT64:
      body(int64_t{});
      return absl::OkStatus();
    default:
      return tensorflow::errors::InvalidArgument(
          what, " must be int32 or int64, got ", tensorflow::DataTypeString(dtype));
  }
}

// Looks up the Embedding Variable behind input `index` and checks that it
// has been initialized and stores keys of `key_dtype`.
inline absl::Status LookupInitializedVariable(
    tensorflow::OpKernelContext* context, int index, tensorflow::DataType key_dtype,
    tensorflow::core::RefCountPtr<EmbeddingVariable>* variable) {
  const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, index);
  absl::Status status = tensorflow::LookupResource(context, handle, variable);
  if (!status.ok()) {
    return tensorflow::errors::FailedPrecondition(
        "Embedding Variable '", handle.name(),
        "' is not initialized; run its initializer (for example "
        "tf.compat.v1.global_variables_initializer()) first. (",
        status.message(), ")");
  }
  if (!(*variable)->is_initialized()) {
    return tensorflow::errors::FailedPrecondition(
        "Embedding Variable '", (*variable)->name(),
        "' is not initialized; run its initializer first.");
  }
  if ((*variable)->key_dtype() != key_dtype) {
    return tensorflow::errors::InvalidArgument(
        "keys for Embedding Variable '", (*variable)->name(), "' must be ",
        tensorflow::DataTypeString((*variable)->key_dtype()), ", got ",
        tensorflow::DataTypeString(key_dtype));
  }
  return absl::OkStatus();
}

// Base of the kernels that act on the one Embedding Variable at input 0,
// whose keys have the op's `key_dtype` attribute.
class EmbeddingVariableOpKernel : public tensorflow::OpKernel {
 public:
  explicit EmbeddingVariableOpKernel(tensorflow::OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("key_dtype", &key_dtype_));
  }

 protected:
  absl::Status LookupVariable(tensorflow::OpKernelContext* context,
                              tensorflow::core::RefCountPtr<EmbeddingVariable>* variable) const {
    return LookupInitializedVariable(context, 0, key_dtype_, variable);
  }

  tensorflow::DataType key_dtype_;
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_KERNEL_UTILS_H_
