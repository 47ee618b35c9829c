// Op definitions that report on the library itself, for benchmarks.
// Kernels: sok_ev/cc/kernels/diagnostic_kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

namespace sok_ev {

REGISTER_OP("SokEv>GpuHostSyncs")
    .Output("count: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "How many times this process's GPU core has waited for a stream so "
        "far (0 in a build without GPU kernels). Benchmarks difference it "
        "around a number of steps to count host synchronisations per step.");

}  // namespace sok_ev
