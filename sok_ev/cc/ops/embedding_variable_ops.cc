// Op definitions for creating, initializing, sizing and checkpointing an
// Embedding Variable. Kernels: sok_ev/cc/kernels/embedding_variable_kernels.cc.
#include "cc/storage_spec.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("SokEv>EmbeddingVariableHandle")
    .Output("resource: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("key_dtype: {int32, int64}")
    .Attr("embedding_dim: int >= 1")
    // [?, embedding_dim]: what TF reads of a resource's producer, as of a
    // VarHandleOp, to accumulate its IndexedSlices gradient out of a v1
    // tf.while_loop (control_flow_ops._resource_safe_shape).
    .Attr("shape: shape = { unknown_rank: true }")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("A handle to the Embedding Variable named `shared_name`.");

// initializer_kind follows sok_ev::InitializerSpec::Kind (cc/initializer.h).
REGISTER_OP("SokEv>InitializeEmbeddingVariable")
    .Input("resource: resource")
    .Input("default_values: float")
    .Attr("key_dtype: {int32, int64}")
    .Attr("embedding_dim: int >= 1")
    .Attr("initializer_kind: int")
    .Attr("param_a: float = 0.0")
    .Attr("param_b: float = 0.0")
    .Attr("seed: int = 0")
    .Attr("filter_freq: int = 0")
    .Attr("filter_counters: int = 0")
    .Attr("filter_hashes: int = 0")
    .Attr("filter_counter_bytes: int = 8")
    .Attr("no_permission_value: float = 0.0")
    .Attr("hbm_bytes: int = 0")
    .Attr("cache_strategy: int = 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle default_values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &default_values));
      return absl::OkStatus();
    })
    .Doc(
        "Creates the variable's table, or empties it if it exists. "
        "default_values: (N, embedding_dim), N = 0 unless initializer_kind "
        "is the default-value matrix. filter_freq > 0 gives it DeepRec's "
        "feature filter (cc/feature_filter.h): exact counts, or a counting "
        "Bloom filter of filter_counters counters of filter_counter_bytes "
        "and filter_hashes hashes; keys not admitted read "
        "no_permission_value. hbm_bytes > 0 (GPU tables only) gives it "
        "DeepRec's HBM_DRAM storage (cc/tiered_table_gpu.h): rows beyond "
        "hbm_bytes of HBM (values and slots) live in host memory, moved by "
        "cache_strategy (0 LRU, 1 LFU).");

REGISTER_OP("SokEv>EmbeddingVariableIsInitialized")
    .Input("resource: resource")
    .Output("is_initialized: bool")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("SokEv>EmbeddingVariableRestoreStamp")
    .Input("resource: resource")
    .Output("stamp: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Which checkpoint the variable was last restored from (a hash of its "
        "path), 0 if it was initialized since, or never created.");

REGISTER_OP("SokEv>EmbeddingVariableTierCounters")
    .Input("resource: resource")
    .Output("counters: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(sok_ev::TierCounters::kFields));
      return absl::OkStatus();
    })
    .Doc(
        "The table's tier counters (cc/storage_spec.h TierCounters): hits, "
        "misses, rows_to_hbm, rows_to_host, pcie_bytes, calls (cumulative), "
        "hbm_rows, host_rows (now), choose_us, write_back_us, bring_in_us "
        "(cumulative host time of the moves), host_tier_us, wait_us (parts of "
        "it: the host tier's map work, the waits for the GPU).");

REGISTER_OP("SokEv>EmbeddingVariableSize")
    .Input("resource: resource")
    .Output("size: int64")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Number of keys stored.");

// Checkpoint export: rows are [value | slots], (n, (1 + num_slots) * dim).
REGISTER_OP("SokEv>EmbeddingVariableExport")
    .Input("resource: resource")
    .Output("keys: key_dtype")
    .Output("rows: float")
    .Output("frequencies: int64")
    .Output("versions: int64")
    .Output("slot_names: string")
    .Output("slot_initial_values: float")
    .Attr("key_dtype: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(3, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(4, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(5, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

REGISTER_OP("SokEv>EmbeddingVariableImport")
    .Input("resource: resource")
    .Input("keys: key_dtype")
    .Input("rows: float")
    .Input("frequencies: int64")
    .Input("versions: int64")
    .Input("slot_names: string")
    .Input("slot_initial_values: float")
    .Attr("key_dtype: {int32, int64}")
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Replaces the table's contents with a checkpoint's, after checking "
        "every shape; on a bad input the table is left untouched.");

REGISTER_OP("SokEv>EmbeddingVariableFind")
    .Input("resource: resource")
    .Input("keys: key_dtype")
    .Output("values: float")
    .Attr("key_dtype: {int32, int64}")
    .Attr("embedding_dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("embedding_dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(c->input(1), 0), dim));
      return absl::OkStatus();
    })
    .Doc(
        "Values of `keys` without inserting or counting; an absent key "
        "reads its initial value (zeros for a variable served with zeros; "
        "the no-permission value for a key its filter has not admitted).");

REGISTER_OP("SokEv>EmbeddingVariableEvictByL2Weight")
    .Input("resource: resource")
    .Output("evicted: int64")
    .Attr("key_dtype: {int32, int64}")
    .Attr("l2_weight_threshold: float")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Erases keys whose value v has 0.5 * sum(v * v) < l2_weight_threshold "
        "(DeepRec's L2WeightEvict).");

REGISTER_OP("SokEv>EmbeddingVariableEvict")
    .Input("resource: resource")
    .Input("global_step: int64")
    .Output("evicted: int64")
    .Attr("key_dtype: {int32, int64}")
    .Attr("steps_to_live: int >= 1")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Erases keys not updated in the last steps_to_live steps.");

}  // namespace sok_ev
