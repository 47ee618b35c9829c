// Op definitions of the native GPU transport (cc/nccl_exchange.h): the row
// messages' all-to-all over NCCL without Horovod, whose sizes both ends know
// (sok_ev.communication.alltoall with received_splits). Kernels:
// sok_ev/cc/kernels/nccl_kernels.cc (GPU builds only).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("SokEv>NcclUniqueId")
    .Output("id: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "A fresh NCCL unique id (128 bytes): worker 0 makes it, every worker "
        "passes it (hex) as NcclAlltoall's communicator. Fails when NCCL "
        "cannot be loaded.");

REGISTER_OP("SokEv>NcclAlltoall")
    .Input("tensor: T")
    .Input("splits: int32")
    .Input("received_splits: int32")
    .Output("received: T")
    .Attr("T: {float, half, bfloat16, uint16, int32, int64}")
    .Attr("communicator: string")
    .Attr("rank: int")
    .Attr("world_size: int")
    .Attr("timeout_seconds: float = 60")
    // Never evaluated while optimizing a graph, never pruned as pure.
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle tensor, rows;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &tensor));
      TF_RETURN_IF_ERROR(c->ReplaceDim(tensor, 0, c->UnknownDim(), &rows));
      c->set_output(0, rows);
      return absl::OkStatus();
    })
    .Doc(
        "Sends splits[w] leading rows of tensor (worker 0's first) to worker "
        "w, and receives received_splits[w] rows from worker w, which every "
        "worker knows in advance (its row message's counts): received holds "
        "worker 0's rows, then worker 1's, ... Collective over the workers of "
        "`communicator` (the hex of NcclUniqueId's id); this worker is `rank` "
        "of `world_size`. Fails if the exchange has not ended within "
        "timeout_seconds (a worker stopped before its part), aborting the "
        "communicator.");

}  // namespace sok_ev
