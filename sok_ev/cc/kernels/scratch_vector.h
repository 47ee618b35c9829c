// Scratch vectors in an op's device memory (host memory for CPU kernels),
// freed with the Tensor; TF's GPU allocator makes that safe for work still
// queued on the op's stream.
#ifndef SOK_EV_CC_KERNELS_SCRATCH_VECTOR_H_
#define SOK_EV_CC_KERNELS_SCRATCH_VECTOR_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace sok_ev {

// A vector of `count` T.
template <typename T>
absl::Status AllocateVector(tensorflow::OpKernelContext* context, int64_t count,
                            tensorflow::Tensor* tensor) {
  return context->allocate_temp(tensorflow::DataTypeToEnum<T>::value,
                                tensorflow::TensorShape({count}), tensor);
}

// The tensor's buffer as T, whatever its dtype (GPU row pointers live in an
// int64 vector).
template <typename T>
T* VectorData(tensorflow::Tensor& tensor) {
  return reinterpret_cast<T*>(tensor.data());
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_SCRATCH_VECTOR_H_
