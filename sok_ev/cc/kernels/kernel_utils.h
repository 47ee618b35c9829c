// What every sok_ev op kernel needs besides Core<Device>: key-dtype
// dispatch and grouping, and resource lookup.
#ifndef SOK_EV_CC_KERNELS_KERNEL_UTILS_H_
#define SOK_EV_CC_KERNELS_KERNEL_UTILS_H_

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/scratch_vector.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"

namespace sok_ev {

// Returns body(Key{}) with Key = int32_t or int64_t according to `dtype`;
// body returns absl::Status.
template <typename Body>
absl::Status DispatchKeyType(tensorflow::DataType dtype, const std::string& what, Body&& body) {
  switch (dtype) {
    case tensorflow::DT_INT32:
      return body(int32_t{});
    case tensorflow::DT_INT64:
      return body(int64_t{});
    default:
      return tensorflow::errors::InvalidArgument(what, " must be int32 or int64, got ",
                                                 tensorflow::DataTypeString(dtype));
  }
}

// Calls entry(t, Key{}) for every table t of a multi-table op, Key its
// keys' dtype, and gathers the entries by key dtype: int32 tables into
// *narrow and int64 tables into *wide, each then one grouped Core call.
template <typename Narrow, typename Wide, typename Entry>
absl::Status GroupByKeyType(const tensorflow::OpInputList& keys, std::vector<Narrow>* narrow,
                            std::vector<Wide>* wide, const Entry& entry) {
  for (int t = 0; t < keys.size(); ++t) {
    TF_RETURN_IF_ERROR(DispatchKeyType(keys[t].dtype(), "keys", [&](auto key) {
      if constexpr (std::is_same_v<decltype(key), int32_t>) {
        narrow->push_back(entry(t, key));
      } else {
        wide->push_back(entry(t, key));
      }
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

// Looks up the Embedding Variable behind input `index` and checks that it
// has been initialized and stores keys of `key_dtype`.
template <typename Device>
absl::Status LookupInitializedVariable(
    tensorflow::OpKernelContext* context, int index, tensorflow::DataType key_dtype,
    tensorflow::core::RefCountPtr<EmbeddingVariable<Device>>* variable) {
  const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, index);
  absl::Status status = tensorflow::LookupResource(context, handle, variable);
  if (!status.ok()) {
    return tensorflow::errors::FailedPrecondition(
        "Embedding Variable '", DisplayName(handle.name()),
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
    return tensorflow::errors::InvalidArgument("keys for Embedding Variable '", (*variable)->name(),
                                               "' must be ",
                                               tensorflow::DataTypeString((*variable)->key_dtype()),
                                               ", got ", tensorflow::DataTypeString(key_dtype));
  }
  return absl::OkStatus();
}

// Base of the kernels that act on the one Embedding Variable at input 0,
// whose keys have the op's `key_dtype` attribute.
template <typename Device>
class EmbeddingVariableOpKernel : public tensorflow::OpKernel {
 public:
  explicit EmbeddingVariableOpKernel(tensorflow::OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("key_dtype", &key_dtype_));
  }

 protected:
  absl::Status LookupVariable(
      tensorflow::OpKernelContext* context,
      tensorflow::core::RefCountPtr<EmbeddingVariable<Device>>* variable) const {
    return LookupInitializedVariable<Device>(context, 0, key_dtype_, variable);
  }

  tensorflow::DataType key_dtype_;
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_KERNEL_UTILS_H_
