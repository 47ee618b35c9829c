// What creating an Embedding Variable takes, shared by the kernels that may
// create one: its initializer (SokEv>InitializeEmbeddingVariable) and a
// checkpoint restore into a session that never ran the initializer: the
// initializer, the feature filter, the variable itself.
#ifndef SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_SETUP_H_
#define SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_SETUP_H_

#include <cstdint>
#include <string>

#include "cc/feature_filter.h"
#include "cc/initializer.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/tf_status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"

namespace sok_ev {

// The initializer of cc/initializer.h from op attributes.
inline absl::Status MakeInitializerSpec(int64_t kind, float param_a, float param_b, int64_t seed,
                                        InitializerSpec* spec) {
  if (kind < 0 || kind > static_cast<int64_t>(InitializerSpec::Kind::kDefaultValueMatrix)) {
    return tensorflow::errors::InvalidArgument("initializer_kind must be in [0, 4], got ", kind);
  }
  spec->kind = static_cast<InitializerSpec::Kind>(kind);
  spec->param_a = param_a;
  spec->param_b = param_b;
  spec->seed = static_cast<uint64_t>(seed);
  return absl::OkStatus();
}

// The feature filter of cc/feature_filter.h from op attributes; filter_freq
// 0 filters nothing.
inline absl::Status MakeFeatureFilterSpec(int64_t filter_freq, int64_t num_counters,
                                          int64_t num_hashes, int64_t counter_bytes,
                                          float no_permission_value, FeatureFilterSpec* spec) {
  spec->filter_freq = filter_freq;
  spec->num_counters = num_counters;
  spec->num_hashes = num_hashes;
  spec->counter_bytes = counter_bytes;
  spec->no_permission_value = no_permission_value;
  return ToTfStatus(CheckFeatureFilterSpec(*spec));
}

// Checks the default-value matrix input (N, dim) and, for the matrix
// initializer, copies it into *matrix (the variable keeps its own copy: the
// input's buffer may be reused) and points spec at it.
template <typename Device>
absl::Status CopyDefaultValues(tensorflow::OpKernelContext* context, const std::string& name,
                               int64_t dim, const tensorflow::Tensor& default_values,
                               InitializerSpec* spec, tensorflow::Tensor* matrix) {
  if (!(default_values.dims() == 2 && default_values.dim_size(1) == dim)) {
    return tensorflow::errors::InvalidArgument("default_values of Embedding Variable '", name,
                                               "' must have shape [N, ", dim, "], got ",
                                               default_values.shape().DebugString());
  }
  if (spec->kind != InitializerSpec::Kind::kDefaultValueMatrix) return absl::OkStatus();
  if (default_values.dim_size(0) == 0) {
    return tensorflow::errors::InvalidArgument("default_value_dim of Embedding Variable '", name,
                                               "' must be positive, got 0");
  }
  TF_RETURN_IF_ERROR(context->allocate_temp(tensorflow::DT_FLOAT, default_values.shape(), matrix));
  Core<Device> core(context);
  TF_RETURN_IF_ERROR(core.Copy(matrix->flat<float>().data(), default_values.flat<float>().data(),
                               default_values.NumElements()));
  spec->default_value_dim = default_values.dim_size(0);
  spec->default_values = matrix->flat<float>().data();  // valid while *matrix lives
  return absl::OkStatus();
}

// The variable behind `handle`, created (uninitialized) if it does not
// exist yet; fails if it exists with another key dtype or dim.
template <typename Device>
absl::Status LookupOrCreateVariable(tensorflow::OpKernelContext* context,
                                    const tensorflow::ResourceHandle& handle,
                                    tensorflow::DataType key_dtype, int64_t dim,
                                    tensorflow::core::RefCountPtr<EmbeddingVariable<Device>>* out) {
  if (dim > kMaxEmbeddingDim) {
    return tensorflow::errors::InvalidArgument("embedding_dim of Embedding Variable '",
                                               DisplayName(handle.name()), "' must be at most ",
                                               kMaxEmbeddingDim, ", got ", dim);
  }
  TF_RETURN_IF_ERROR(tensorflow::LookupOrCreateResource<EmbeddingVariable<Device>>(
      context, handle, out, [&](EmbeddingVariable<Device>** created) {
        *created = new EmbeddingVariable<Device>(handle.name(), key_dtype, dim);
        return absl::OkStatus();
      }));
  if ((*out)->key_dtype() != key_dtype || (*out)->embedding_dim() != dim) {
    return tensorflow::errors::InvalidArgument(
        "Embedding Variable '", DisplayName(handle.name()), "' already exists with key_dtype ",
        tensorflow::DataTypeString((*out)->key_dtype()), " and embedding_dim ",
        (*out)->embedding_dim(), "; cannot make it one with key_dtype ",
        tensorflow::DataTypeString(key_dtype), " and embedding_dim ", dim);
  }
  return absl::OkStatus();
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_SETUP_H_
