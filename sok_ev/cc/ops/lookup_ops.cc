// Op definitions of the grouped sparse-lookup pipeline: each op handles
// every table of one sok_ev.lookup_sparse call at once.
//   UniqueKeys -> [PartitionByOwner -> all-to-all] -> FindOrInsert
//   -> [all-to-all back] -> CombineForward
// Kernels: sok_ev/cc/kernels/lookup_kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("SokEv>UniqueKeys")
    .Input("keys: Tkeys")
    .Output("unique_keys: Tkeys")
    .Output("unique_index: N * int64")
    .Output("counts: N * int64")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) {
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
        c->set_output(c->num_inputs() + i, c->Vector(c->Dim(c->input(i), 0)));
        c->set_output(2 * c->num_inputs() + i, c->Vector(InferenceContext::kUnknownDim));
      }
      return absl::OkStatus();
    })
    .Doc(
        "Per table: unique_keys[unique_index[j]] == keys[j]; counts are "
        "each unique key's occurrences.");

REGISTER_OP("SokEv>PartitionByOwner")
    .Input("unique_keys: Tkeys")
    .Output("keys_by_owner: Tkeys")
    .Output("positions: N * int64")
    .Output("counts: int64")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("target_workers: list(int)")
    .Attr("num_workers: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs();
      for (int i = 0; i < n; ++i) {
        c->set_output(i, c->input(i));
        c->set_output(n + i, c->input(i));
      }
      int64_t num_workers;
      TF_RETURN_IF_ERROR(c->GetAttr("num_workers", &num_workers));
      c->set_output(2 * n, c->Matrix(n, num_workers));
      return absl::OkStatus();
    })
    .Doc(
        "Groups each table's keys by owning worker: owner_of(key) "
        "(cc/partition.h) for target -1, worker `target` otherwise. "
        "counts[t, w]: keys of table t sent to worker w; "
        "keys_by_owner[t][j] == unique_keys[t][positions[t][j]].");

REGISTER_OP("SokEv>FindOrInsert")
    .Input("resources: N * resource")
    .Input("keys: Tkeys")
    .Input("counts: N * int64")
    .Output("values: N * float")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("embedding_dims: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("embedding_dims", &dims));
      const int n = static_cast<int>(dims.size());
      for (int i = 0; i < n; ++i) {
        c->set_output(i, c->Matrix(c->Dim(c->input(n + i), 0), dims[i]));
      }
      return absl::OkStatus();
    })
    .Doc(
        "Values of each table's keys, inserting absent keys with their "
        "initial values; counts are added to the keys' frequencies.");

// Both combine ops output, per table, [unknown rows, the dim of input t].
absl::Status CombineShape(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  for (int i = 0; i < n; ++i) {
    c->set_output(i, c->Matrix(InferenceContext::kUnknownDim, c->Dim(c->input(i), 1)));
  }
  return absl::OkStatus();
}

// weights[t] is empty when weighted[t] is false.
REGISTER_OP("SokEv>CombineForward")
    .Input("unique_values: N * float")
    .Input("unique_index: N * int64")
    .Input("sample_ids: N * int64")
    .Input("weights: N * float")
    .Input("batch_sizes: int64")
    .Output("embeddings: N * float")
    .Attr("N: int >= 1")
    .Attr("combiners: list(string)")
    .Attr("weighted: list(bool)")
    .SetShapeFn(CombineShape)
    .Doc(
        "embeddings[t][b] combines the rows of sample b's entries, as "
        "tf.nn.embedding_lookup_sparse does; empty samples give zeros.");

REGISTER_OP("SokEv>CombineBackward")
    .Input("grads: N * float")
    .Input("unique_index: N * int64")
    .Input("sample_ids: N * int64")
    .Input("weights: N * float")
    .Input("num_unique: int64")
    .Output("grad_unique: N * float")
    .Attr("N: int >= 1")
    .Attr("combiners: list(string)")
    .Attr("weighted: list(bool)")
    .SetShapeFn(CombineShape)
    .Doc(
        "Gradient of CombineForward with respect to unique_values, "
        "summed per unique key.");

}  // namespace sok_ev
