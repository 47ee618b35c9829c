// Where an Embedding Variable export writes, device-neutral: the export
// kernel allocates its outputs once the core knows how many keys there are.
#ifndef SOK_EV_CC_KERNELS_EXPORT_BUFFERS_H_
#define SOK_EV_CC_KERNELS_EXPORT_BUFFERS_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace sok_ev {

template <typename Key>
struct ExportBuffers {
  Key* keys = nullptr;             // (count,)
  float* rows = nullptr;           // (count, row_width) value then slots
  int64_t* frequencies = nullptr;  // (count,)
  int64_t* versions = nullptr;     // (count,)
};

// Called once with the number of keys and the row width; fills *buffers.
template <typename Key>
using ExportAllocator =
    std::function<absl::Status(int64_t count, int64_t row_width, ExportBuffers<Key>* buffers)>;

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_EXPORT_BUFFERS_H_
