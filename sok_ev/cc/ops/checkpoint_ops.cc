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
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Writes this worker's shard of every table, streamed batch by batch, "
        "into a new tensor bundle `part` = prefix + '_worker_<w>_of_<W>' "
        "(w, W: the worker topology at run time, which must have num_workers "
        "workers). Merging the parts of all workers gives the checkpoint.");

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
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Replaces every table with the keys of the checkpoint at `prefix` "
        "that this worker owns under the run-time worker topology (all of "
        "them for a table with target_workers[i] == this worker, none for "
        "another worker's table), with their values, slots, frequencies and "
        "versions. Creates uninitialized variables (initializer given per "
        "table, as SokEv>InitializeEmbeddingVariable takes it). Every table "
        "is read and checked before any variable changes: on an error none "
        "does.");

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
