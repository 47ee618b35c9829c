// Conversion of the core's Status (cc/common.h) into TensorFlow's.
#ifndef SOK_EV_CC_KERNELS_TF_STATUS_H_
#define SOK_EV_CC_KERNELS_TF_STATUS_H_

#include "cc/common.h"
#include "tensorflow/core/lib/core/errors.h"

namespace sok_ev {

inline absl::Status ToTfStatus(const Status& status) {
  if (status.ok()) return absl::OkStatus();
  if (status.code == Status::Code::kInvalidArgument) {
    return tensorflow::errors::InvalidArgument(status.message);
  }
  if (status.code == Status::Code::kResourceExhausted) {
    return tensorflow::errors::ResourceExhausted(status.message);
  }
  return tensorflow::errors::Internal(status.message);
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_TF_STATUS_H_
