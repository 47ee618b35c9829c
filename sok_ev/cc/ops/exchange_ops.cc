// Op definitions that build and read the two all-to-all messages of the
// many-worker lookup (sok_ev/distributed.py; layout in
// cc/exchange_message.h): one op per message end for all tables, instead of
// a tensor op per table and worker. Counts are [N, W]: rows of table t for
// worker w. Kernels: sok_ev/cc/kernels/exchange_kernels.cc. The owner's
// lookup that writes a rows message, FindOrInsertRowMessage, is a lookup
// op (lookup_ops.cc); its gradient is here.
#include <vector>

#include "sok_ev/cc/ops/shape_functions.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

using tensorflow::shape_inference::InferenceContext;

// The message (rows of `width`, unknown count) and its splits, one per worker
// (the counts' second dimension).
absl::Status MessageShape(InferenceContext* c, int counts_input, int width) {
  tensorflow::shape_inference::ShapeHandle counts;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(counts_input), 2, &counts));
  c->set_output(0, width > 0 ? c->Matrix(InferenceContext::kUnknownDim, width)
                             : c->Vector(InferenceContext::kUnknownDim));
  c->set_output(1, c->Vector(c->Dim(counts, 1)));
  return absl::OkStatus();
}

// The receiving end of a row message: a flat message in, one
// [rows, dims[t]] matrix out per table.
absl::Status ReceivedRowsShape(InferenceContext* c) {
  tensorflow::shape_inference::ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
  return OneMatrixPerDim(c, "dims");
}

REGISTER_OP("SokEv>PackKeyMessage")
    .Input("keys_by_owner: Tkeys")
    .Input("counts: N * int64")
    .Input("positions: N * int64")
    .Input("owner_counts: int64")
    .Output("message: int64")
    .Output("splits: int32")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("fingerprint: int")
    // Stateful so that Grappler never evaluates it, nor the collective it
    // feeds, while optimizing a graph whose keys are constants: Horovod's
    // alltoall is not marked stateful, and a collective run at optimization
    // time by one worker waits for the others forever.
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      return MessageShape(c, 3 * n, 2);
    })
    .Doc(
        "The keys-to-owners message: for each worker w, the header (fingerprint, "
        "N) and (owner_counts[t, w], 0) for each table t, then each table's "
        "(key, occurrences) rows for w. keys_by_owner[t] and positions[t] come "
        "from PartitionByOwner; the occurrences of keys_by_owner[t][i] are "
        "counts[t][positions[t][i]]. splits[w]: rows for worker w.");

REGISTER_OP("SokEv>UnpackKeyMessage")
    .Input("message: int64")
    .Input("splits: int32")
    .Output("keys: Tkeys")
    .Output("counts: N * int64")
    .Output("sender_counts: int64")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("fingerprint: int")
    .Attr("table_names: list(string)")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int i = 0; i < 2 * n; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2 * n, c->Matrix(n, c->Dim(c->input(1), 0)));
      return absl::OkStatus();
    })
    .Doc(
        "Reads the keys-to-owners message received from every worker (splits[w] "
        "rows from worker w): fails with InvalidArgument unless every worker's "
        "header is this lookup's (fingerprint, N), before anything else reads "
        "it; returns each table's keys and occurrences, worker 0's first, and "
        "sender_counts[t, w], the keys of table t from worker w.");

REGISTER_OP("SokEv>PackRowMessage")
    .Input("rows: N * float")
    .Input("counts: int64")
    .Input("positions: P * int64")
    .Output("message: Tmessage")
    .Output("splits: int32")
    .Output("local: N * float")
    .Attr("N: int >= 1")
    .Attr("P: int >= 0")
    // The compressed exchange (issue 12): uint16 carries bfloat16 bits
    // (Horovod's alltoall has no bfloat16), half float16; float is exact.
    .Attr("Tmessage: {float, uint16, half} = DT_FLOAT")
    // The worker running the op: its own rows need no network.
    .Attr("local_worker: int = -1")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(MessageShape(c, n, 0));
      for (int t = 0; t < n; ++t) {
        tensorflow::shape_inference::ShapeHandle rows;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(t), 2, &rows));
        c->set_output(2 + t, c->Matrix(InferenceContext::kUnknownDim, c->Dim(rows, 1)));
      }
      return absl::OkStatus();
    })
    .Doc(
        "The rows message, as Tmessage elements: for each worker w, table 0's "
        "counts[0, w] rows, then table 1's, ... Table t's rows for worker w "
        "follow those for the workers before it: rows[t][offset + i], or, with "
        "positions (P == N), rows[t][positions[t][offset + i]]. splits[w]: "
        "elements for w. uint16 holds bfloat16 bits, half float16, each rounded "
        "to nearest even (NaN stays NaN). With local_worker = k >= 0, worker "
        "k's block stays out of the message (splits[k] = 0) and local[t] holds "
        "its counts[t, k] rows of table t, float32 and exact (without positions "
        "a view of rows[t], no copy); with -1, every local[t] is empty.");

REGISTER_OP("SokEv>RowMessageSplits")
    .Input("counts: int64")
    .Output("splits: int32")
    .Attr("dims: list(int)")
    .Attr("local_worker: int = -1")
    .SetShapeFn([](InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle counts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &counts));
      c->set_output(0, c->Vector(c->Dim(counts, 1)));
      return absl::OkStatus();
    })
    .Doc(
        "The splits (elements per worker) of a row message laid out by counts "
        "[N, W] with rows dims[t] wide, worker local_worker's block left out: "
        "PackRowMessage's splits output, computed from the counts alone. The "
        "receiving end of a row exchange knows what will arrive this way.");

REGISTER_OP("SokEv>UnpackRowMessage")
    .Input("message: Tmessage")
    .Input("counts: int64")
    .Input("positions: P * int64")
    .Input("local: L * float")
    .Output("rows: N * float")
    .Attr("N: int >= 1")
    .Attr("P: int >= 0")
    .Attr("L: int >= 0 = 0")
    .Attr("dims: list(int)")
    .Attr("Tmessage: {float, uint16, half} = DT_FLOAT")
    .Attr("local_worker: int = -1")
    .SetShapeFn(ReceivedRowsShape)
    .Doc(
        "The inverse of PackRowMessage: rows[t] ([sum_w counts[t, w], dims[t]]) "
        "gets table t's rows of every worker's block, worker 0's first; with "
        "positions, row i goes to rows[t][positions[t][i]] (a permutation). A "
        "uint16 (bfloat16 bits) or half message is widened to float exactly. "
        "With local_worker = k >= 0 the message has no block from worker k: "
        "table t's rows of that block are local[t] ([counts[t, k], dims[t]], "
        "PackRowMessage's local output; L == N). With -1, L == 0.");

REGISTER_OP("SokEv>CombineRowMessage")
    .Input("message: float")
    .Input("counts: int64")
    .Input("positions: N * int64")
    .Input("local: L * float")
    .Input("unique_index: N * int64")
    .Input("order: N * int64")
    .Input("segments: N * int64")
    .Input("row_offsets: N * int64")
    .Input("weights: N * float")
    .Output("embeddings: N * float")
    .Attr("N: int >= 1")
    .Attr("L: int >= 0 = 0")
    .Attr("dims: list(int)")
    .Attr("combiners: list(string)")
    .Attr("weighted: list(bool)")
    .Attr("local_worker: int = -1")
    .SetShapeFn(ReceivedRowsShape)
    .Doc(
        "CombineForward of the rows UnpackRowMessage(message, counts, "
        "positions, local) would give, without them: each sample combines its "
        "keys' rows where they arrived, in the message or in local. The "
        "requester's end of a float32 row exchange. order and segments are "
        "not read; they are inputs so that the gradient has them.");

REGISTER_OP("SokEv>CombineRowMessageGrad")
    .Input("grads: N * float")
    .Input("counts: int64")
    .Input("positions: N * int64")
    .Input("unique_index: N * int64")
    .Input("order: N * int64")
    .Input("segments: N * int64")
    .Input("row_offsets: N * int64")
    .Input("weights: N * float")
    .Output("message: float")
    .Output("local: N * float")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .Attr("combiners: list(string)")
    .Attr("weighted: list(bool)")
    .Attr("local_worker: int = -1")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      for (size_t t = 0; t < dims.size(); ++t) {
        c->set_output(1 + t, c->Matrix(InferenceContext::kUnknownDim, dims[t]));
      }
      return absl::OkStatus();
    })
    .Doc(
        "The gradient of CombineRowMessage with respect to its message and "
        "local inputs, in their layout: CombineBackward's gradient of each "
        "unique key (grads[t]: [batch_t, dims[t]]) written where its row "
        "arrived, in a message laid out as PackRowMessage(..., counts, "
        "positions, local_worker) lays it out, or in local[t] (the "
        "local_worker's block, as PackRowMessage's local; empty with -1), with "
        "no unpacked copy between. Equals "
        "CombineBackward then PackRowMessage, bit for bit.");

REGISTER_OP("SokEv>FindOrInsertRowMessageGrad")
    .Input("message: float")
    .Input("counts: int64")
    .Input("local: L * float")
    .Input("unique_index: N * int64")
    .Input("order: N * int64")
    .Input("segments: N * int64")
    .Input("row_offsets: N * int64")
    .Output("grad_unique: N * float")
    .Attr("N: int >= 1")
    .Attr("L: int >= 0 = 0")
    .Attr("dims: list(int)")
    .Attr("local_worker: int = -1")
    .SetShapeFn(ReceivedRowsShape)
    .Doc(
        "The gradient of FindOrInsertRowMessage with respect to each unique "
        "key's row: CombineBackward (sum, one entry a received row) of the "
        "rows UnpackRowMessage(message, counts, local) would give, read where "
        "they arrived, without them. The owner's end of the gradients' "
        "exchange. Equals UnpackRowMessage then CombineBackward, bit for "
        "bit.");

}  // namespace sok_ev
