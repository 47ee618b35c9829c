// Op definitions for saving Embedding Variables into TensorFlow checkpoints
// and restoring them, on any number of workers. Kernels:
// sok_ev/cc/kernels/checkpoint_kernels.cc; layout:
// sok_ev/cc/kernels/checkpoint_format.h.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("SokEv>SaveEmbeddingVariables")
    .Input("prefix: string")
    .Input("resources: N * resource")
    .Output("part: string")
    .Attr("N: int >= 1")
    .Attr("table_names: list(string)")
    .Attr("key_dtypes: list({int32, int64})")
    .Attr("target_workers: list(int)")
    .Attr("num_workers: int >= 1")
    .Attr("kind: {'full', 'incremental', 'serving', 'serving_zeros'} = 'full'")
    .Attr("record_changes: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Writes this worker's shard of every table, streamed batch by batch, "
        "into a new tensor bundle `part` = prefix + '_worker_<w>_of_<W>' "
        "(w, W: the worker topology at run time, which must have num_workers "
        "workers). Merging the parts of all workers gives the checkpoint. "
        "kind: every key ('full'); the keys changed since the table's last "
        "committed checkpoint ('incremental'); values without slots or filter "
        "state ('serving', 'serving_zeros': an export for serving, restored "
        "for serving, where a key the table lacks reads its initial value, "
        "or zeros). record_changes: the saver "
        "also saves incrementally, so the tables record changes from now on "
        "(SokEv>MarkEmbeddingVariablesSaved makes this checkpoint their "
        "base).");

REGISTER_OP("SokEv>RestoreEmbeddingVariables")
    .Input("prefix: string")
    .Input("resources: N * resource")
    .Input("default_values: N * float")
    .Attr("N: int >= 1")
    .Attr("table_names: list(string)")
    .Attr("key_dtypes: list({int32, int64})")
    .Attr("embedding_dims: list(int)")
    .Attr("initializer_kinds: list(int)")
    .Attr("initializer_params_a: list(float)")
    .Attr("initializer_params_b: list(float)")
    .Attr("initializer_seeds: list(int)")
    .Attr("target_workers: list(int)")
    .Attr("filter_specs: list(int) = []")
    .Attr("no_permission_values: list(float) = []")
    .Attr("serving_modes: list(int) = []")
    .Attr("storage_specs: list(int) = []")
    .Attr("record_changes: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Replaces every table with the keys of the checkpoint at `prefix` "
        "that this worker owns under the run-time worker topology (all of "
        "them for a table with target_workers[i] == this worker, none for "
        "another worker's table), with their values, slots, frequencies and "
        "versions, and its feature filter with what the checkpoint counted. "
        "An incremental checkpoint restores the chain of checkpoints it "
        "builds on. Creates uninitialized variables (initializer given per "
        "table, as SokEv>InitializeEmbeddingVariable takes it; filter_specs: "
        "[filter_freq, filter_counters, filter_hashes, filter_counter_bytes] "
        "per table, or empty for no filters). serving_modes per table (empty: "
        "all -1): -1 as the checkpoint says (an export for serving serves, any other "
        "checkpoint trains); 0 trains (an export restored into a table built for training "
        "gives it values only); 1 and 2 serve (values only, lookups insert nothing; a "
        "missing key reads its initial value, or zeros; a filtered table's, its "
        "no_permission_value, or zeros). "
        "storage_specs: [hbm_bytes, cache_strategy] per table (cc/storage_spec.h: "
        "the HBM budget of a GPU table's HBM_DRAM storage, 0 for none), or empty: "
        "each variable's own. The checkpoint's layout does not depend on it. "
        "record_changes: the restored checkpoint is the base of the next "
        "incremental save. Every table is read and checked before any "
        "variable changes: on an error none does.");

REGISTER_OP("SokEv>MarkEmbeddingVariablesSaved")
    .Input("prefix: string")
    .Input("resources: N * resource")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "The checkpoint at `prefix` (full or incremental) is complete: the "
        "next incremental save of these tables writes what changed since.");

REGISTER_OP("SokEv>SetWorkerTopology")
    .Input("worker: int32")
    .Input("num_workers: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Records this process's worker index and the number of workers.");

REGISTER_OP("SokEv>WorkerTopology")
    .Output("worker: int32")
    .Output("num_workers: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("The worker topology recorded by SokEv>SetWorkerTopology (0 of 1 before).");

}  // namespace sok_ev
