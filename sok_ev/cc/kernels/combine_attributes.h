// The combiner and weighting attributes of the ops that combine
// (lookup_kernels.cc, and CombineRowMessage in exchange_kernels.cc), and the
// part of a table's combine backward their gradient ops all read alike.
#ifndef SOK_EV_CC_KERNELS_COMBINE_ATTRIBUTES_H_
#define SOK_EV_CC_KERNELS_COMBINE_ATTRIBUTES_H_

#include <string>
#include <vector>

#include "cc/combine.h"
#include "cc/common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"

namespace sok_ev {

// The combiner and weighting attributes, and the check that weights match
// entries, shared by every op that combines.
class CombineAttributes {
 public:
  explicit CombineAttributes(tensorflow::OpKernelConstruction* context) {
    std::vector<std::string> names;
    if (!context->HasAttr("weighted")) return;  // UniqueOwnedKeys: no weights
    OP_REQUIRES_OK(context, context->GetAttr("weighted", &weighted_));
    if (!context->HasAttr("combiners")) return;
    OP_REQUIRES_OK(context, context->GetAttr("combiners", &names));
    for (size_t t = 0; t < names.size(); ++t) {
      if (names[t] == "sum") {
        combiners_.push_back(Combiner::kSum);
      } else if (names[t] == "mean") {
        combiners_.push_back(Combiner::kMean);
      } else if (names[t] == "sqrtn") {
        combiners_.push_back(Combiner::kSqrtn);
      } else {
        context->CtxFailure(tensorflow::errors::InvalidArgument(
            "combiners[", t, "] must be 'sum', 'mean' or 'sqrtn', got '", names[t], "'"));
        return;
      }
    }
  }

  Combiner combiner(int t) const { return combiners_[t]; }

  absl::Status CheckWeights(int t, const tensorflow::Tensor& weights, int64_t nnz) const {
    if (t >= static_cast<int>(weighted_.size())) {
      return tensorflow::errors::InvalidArgument("weighted has ", weighted_.size(),
                                                 " entries, table ", t, " has none");
    }
    if (weighted_[t] && weights.NumElements() != nnz) {
      return tensorflow::errors::InvalidArgument("sp_weights[", t, "] has ", weights.NumElements(),
                                                 " values, but indices[", t, "] has ", nnz);
    }
    return absl::OkStatus();
  }

  const float* WeightsOrNull(int t, const tensorflow::Tensor& weights) const {
    return weighted_[t] ? weights.flat<float>().data() : nullptr;
  }

 private:
  std::vector<Combiner> combiners_;
  std::vector<bool> weighted_;
};

// Table t's combine backward as a gradient op's inputs give it, checked by
// the op: its entries (unique_index), grouped by key (order; empty where
// UniqueKeys ran on the CPU), segments and row offsets, with dim columns.
// Where the gradients are read and written, the weights and the combiner
// are the op's to set.
inline CombineBackwardTable CombineBackwardTableOf(const tensorflow::Tensor& unique_index,
                                                   const tensorflow::Tensor& order,
                                                   const tensorflow::Tensor& segments,
                                                   const tensorflow::Tensor& row_offsets,
                                                   int64_t dim) {
  CombineBackwardTable table;
  table.unique_index = unique_index.flat<int64_t>().data();
  table.order = order.NumElements() == 0 ? nullptr : order.flat<int64_t>().data();
  table.segments = segments.flat<int64_t>().data();
  table.num_unique = segments.NumElements() - 1;
  table.row_offsets = row_offsets.flat<int64_t>().data();
  table.batch = row_offsets.NumElements() - 1;
  table.nnz = unique_index.NumElements();
  table.dim = dim;
  return table;
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_COMBINE_ATTRIBUTES_H_
