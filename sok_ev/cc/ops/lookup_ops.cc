// Op definitions of the grouped sparse-lookup pipeline: each op handles
// every table of one sok_ev.lookup_sparse call at once.
//   one worker:   UniqueKeys (or UniquePackedKeys) -> FindOrInsertCombine
//   many workers: UniqueKeys -> PartitionByOwner -> all-to-all
//                 -> UniqueOwnedKeys -> FindOrInsertRowMessage (owners)
//                 -> all-to-all back -> CombineRowMessage
//                 (sok_ev/cc/ops/exchange_ops.cc; a compressed exchange
//                 packs FindOrInsertCombine's rows, then CombineForward after
//                 UnpackRowMessage)
//   backward:     CombineBackward (per unique key), then the optimizer's
//                 SparseApplyOptimizer (sok_ev/cc/ops/optimizer_ops.cc)
// Kernels: sok_ev/cc/kernels/lookup_kernels.cc.
#include <vector>

#include "sok_ev/cc/ops/shape_functions.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

using tensorflow::shape_inference::InferenceContext;

// The six output lists of UniqueKeys and UniqueOwnedKeys, N tables each:
// unique_keys, counts and segments sized by the unique keys; unique_index by
// the entries (input t), order too on a GPU and empty on the CPU (whose
// backward pass reads unique_index instead); row_offsets by the samples,
// entries + 1 when each entry is its own sample.
static absl::Status UniqueShapes(InferenceContext* c, bool entry_per_sample) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  for (int t = 0; t < n; ++t) {
    const auto nnz = c->Dim(c->input(t), 0);
    tensorflow::shape_inference::DimensionHandle samples = c->UnknownDim();
    if (entry_per_sample) TF_RETURN_IF_ERROR(c->Add(nnz, 1, &samples));
    c->set_output(t, c->Vector(InferenceContext::kUnknownDim));          // unique_keys
    c->set_output(n + t, c->Vector(InferenceContext::kUnknownDim));      // counts
    c->set_output(2 * n + t, c->Vector(nnz));                            // unique_index
    c->set_output(3 * n + t, c->Vector(InferenceContext::kUnknownDim));  // order
    c->set_output(4 * n + t, c->Vector(InferenceContext::kUnknownDim));  // segments
    c->set_output(5 * n + t, c->Vector(samples));                        // row_offsets
  }
  return absl::OkStatus();
}

// indices[t] and dense_shapes[t] are the SparseTensor's own: the kernel
// reads the sample ids (column 0) and the batch size (element 0) in place,
// so no per-table slice op runs. weights[t] is empty when weighted[t] is false.
REGISTER_OP("SokEv>UniqueKeys")
    .Input("keys: Tkeys")
    .Input("indices: N * int64")
    .Input("weights: N * float")
    .Input("dense_shapes: N * int64")
    .Output("unique_keys: Tkeys")
    .Output("counts: N * int64")
    .Output("unique_index: N * int64")
    .Output("order: N * int64")
    .Output("segments: N * int64")
    .Output("row_offsets: N * int64")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("weighted: list(bool)")
    .SetShapeFn([](InferenceContext* c) { return UniqueShapes(c, /*entry_per_sample=*/false); })
    .Doc(
        "Checks each table's entries (sample ids indices[t][:, 0] "
        "non-decreasing in [0, dense_shapes[t][0]), one weight per entry when "
        "weighted) before anything "
        "else runs, then, per table: unique_keys[unique_index[j]] == keys[j]; "
        "counts are each unique key's occurrences; unique key u's entries are "
        "order[segments[u] .. segments[u + 1]) on a GPU (order is empty on "
        "the CPU, whose backward reads unique_index); sample b's entries are "
        "[row_offsets[b], row_offsets[b + 1]).");

// UniqueKeys for a batch packing every table in one RaggedTensor
// [N, batch, None] (what TensorFlow passes to a tf.function as 3 tensors,
// however many tables): keys are its flat values, row_splits its inner row
// splits (each sample's entries), table_splits its outer ones (each table's
// samples), and entry_splits[t] == row_splits[table_splits[t]] each table's
// first entry. The outputs are UniqueKeys' per table, plus each table's
// slice of the weights (empty when not weighted) for the combining ops.
REGISTER_OP("SokEv>UniquePackedKeys")
    .Input("keys: Tkey")
    .Input("row_splits: int64")
    .Input("table_splits: int64")
    .Input("entry_splits: int64")
    .Input("weights: float")
    .Output("unique_keys: N * Tkey")
    .Output("counts: N * int64")
    .Output("unique_index: N * int64")
    .Output("order: N * int64")
    .Output("segments: N * int64")
    .Output("row_offsets: N * int64")
    .Output("table_weights: N * float")
    .Attr("Tkey: {int32, int64}")
    .Attr("N: int >= 1")
    .Attr("weighted: list(bool)")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) {
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      }
      return absl::OkStatus();
    })
    .Doc(
        "Checks the packed batch (table_splits from 0 to the number of "
        "samples, entry_splits from 0 to the number of keys, each table's row "
        "splits non-decreasing from its first entry to its last, one weight "
        "per key when weighted) before anything else runs, then gives table "
        "t, whose keys are keys[entry_splits[t] .. entry_splits[t + 1]), "
        "UniqueKeys' outputs.");

// The owner's side of a lookup over several workers: each worker sent its
// unique keys once, with their occurrences in its batch, so a key asked by
// several workers arrives several times. Deduplicated here, the owner finds
// each key once (FindOrInsertRowMessage with one entry per sample hands
// every received key its row) and its gradients arrive summed per key, so
// the optimizer needs no second deduplication. The keys arrive as one run
// per worker (sender_counts, UnpackKeyMessage's), each sorted on the GPU:
// there the runs are merged, not sorted again.
REGISTER_OP("SokEv>UniqueOwnedKeys")
    .Input("keys: Tkeys")
    .Input("occurrences: N * int64")
    .Input("sender_counts: int64")
    .Output("unique_keys: Tkeys")
    .Output("counts: N * int64")
    .Output("unique_index: N * int64")
    .Output("order: N * int64")
    .Output("segments: N * int64")
    .Output("row_offsets: N * int64")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) { return UniqueShapes(c, /*entry_per_sample=*/true); })
    .Doc(
        "UniqueKeys for keys[t] where entry j is sample j (row_offsets[j] == j) "
        "and stands for occurrences[t][j] occurrences of its key: counts[t][u] "
        "sums them over unique key u's entries. sender_counts [N, W] (host "
        "memory on the GPU) splits keys[t] into W runs, sender_counts[t][w] "
        "keys from worker w; the outputs do not depend on it.");

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

// One worker's forward: every table local. order and segments are not read;
// they are inputs so that the gradient has them.
REGISTER_OP("SokEv>FindOrInsertCombine")
    .Input("resources: N * resource")
    .Input("unique_keys: Tkeys")
    .Input("counts: N * int64")
    .Input("unique_index: N * int64")
    .Input("order: N * int64")
    .Input("segments: N * int64")
    .Input("row_offsets: N * int64")
    .Input("weights: N * float")
    .Output("embeddings: N * float")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("embedding_dims: list(int)")
    .Attr("combiners: list(string)")
    .Attr("weighted: list(bool)")
    .SetShapeFn([](InferenceContext* c) { return OneMatrixPerDim(c, "embedding_dims"); })
    .Doc(
        "Finds or inserts each table's unique keys (counts added to their "
        "frequencies) and combines each sample's rows, as "
        "tf.nn.embedding_lookup_sparse does; empty samples give zeros.");

// An owner's forward in a float32 row exchange: FindOrInsertCombine of the
// received keys (one entry a received key, summed) then PackRowMessage of
// its rows, in one op that writes each row where the message wants it. Its
// gradient, FindOrInsertRowMessageGrad (exchange_ops.cc), reads the
// gradient message where it arrives. order and segments are not read; they
// are inputs so that the gradient has them.
REGISTER_OP("SokEv>FindOrInsertRowMessage")
    .Input("resources: N * resource")
    .Input("unique_keys: Tkeys")
    .Input("counts: N * int64")
    .Input("unique_index: N * int64")
    .Input("order: N * int64")
    .Input("segments: N * int64")
    .Input("row_offsets: N * int64")
    .Input("sender_counts: int64")
    .Output("message: float")
    .Output("splits: int32")
    .Output("local: N * float")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("embedding_dims: list(int)")
    .Attr("local_worker: int = -1")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("embedding_dims", &dims));
      tensorflow::shape_inference::ShapeHandle sender_counts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(7 * n), 2, &sender_counts));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(c->Dim(sender_counts, 1)));
      for (size_t t = 0; t < dims.size(); ++t) {
        c->set_output(2 + t, c->Matrix(InferenceContext::kUnknownDim, dims[t]));
      }
      return absl::OkStatus();
    })
    .Doc(
        "Finds or inserts each table's unique keys (counts added to their "
        "frequencies) and writes the row of every received key j (entry j, "
        "sample j: unique_keys[t][unique_index[t][j]]) into the rows message "
        "PackRowMessage(rows, sender_counts, local_worker=local_worker) would "
        "build from those rows: message (float32), splits (elements per "
        "worker) and local[t] (local_worker's block; empty with -1). "
        "sender_counts[t, w]: the keys of table t received from worker w, in "
        "order.");

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

// Many workers' forward, once the rows are back. order and segments are not
// read; they are inputs so that the gradient has them.
REGISTER_OP("SokEv>CombineForward")
    .Input("unique_values: N * float")
    .Input("unique_index: N * int64")
    .Input("order: N * int64")
    .Input("segments: N * int64")
    .Input("row_offsets: N * int64")
    .Input("weights: N * float")
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
    .Input("order: N * int64")
    .Input("segments: N * int64")
    .Input("row_offsets: N * int64")
    .Input("weights: N * float")
    .Output("grad_unique: N * float")
    .Attr("N: int >= 1")
    .Attr("combiners: list(string)")
    .Attr("weighted: list(bool)")
    .SetShapeFn(CombineShape)
    .Doc(
        "Gradient of the combine with respect to each unique key's row: unique "
        "u sums its entries (unique_index[j] == u) in ascending order. order "
        "lists them grouped by key (order[segments[u] .. segments[u + 1])), "
        "or is empty: UniqueKeys ran on the CPU.");

}  // namespace sok_ev
