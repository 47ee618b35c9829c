// Shape functions shared by the op definitions of sok_ev/cc/ops/.
#ifndef SOK_EV_CC_OPS_SHAPE_FUNCTIONS_H_
#define SOK_EV_CC_OPS_SHAPE_FUNCTIONS_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

// Output t is a matrix of unknown rows and dims[t] columns, dims the list(int)
// attribute `dims_attr` (one per table).
inline absl::Status OneMatrixPerDim(tensorflow::shape_inference::InferenceContext* c,
                                    const char* dims_attr) {
  std::vector<int64_t> dims;
  TF_RETURN_IF_ERROR(c->GetAttr(dims_attr, &dims));
  for (size_t t = 0; t < dims.size(); ++t) {
    c->set_output(static_cast<int>(t),
                  c->Matrix(tensorflow::shape_inference::InferenceContext::kUnknownDim, dims[t]));
  }
  return absl::OkStatus();
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_OPS_SHAPE_FUNCTIONS_H_
