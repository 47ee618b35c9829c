// Where an Embedding Variable export writes, device-neutral: the export
// kernel allocates its outputs once the core knows how many keys there are,
// or receives the table batch by batch (checkpoints).
#ifndef SOK_EV_CC_KERNELS_EXPORT_BUFFERS_H_
#define SOK_EV_CC_KERNELS_EXPORT_BUFFERS_H_

#include <algorithm>
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

// A streamed export (checkpoints): the table is handed out in batches of
// host memory, valid during the callback only.
template <typename Key>
struct HostExportBatch {
  const Key* keys;             // (count,)
  const float* rows;           // (count, row_width) value then slots
  const int64_t* frequencies;  // (count,)
  const int64_t* versions;     // (count,)
  int64_t count;
};

// Called once, before any batch, with the number of keys and the row width.
using ExportBegin = std::function<absl::Status(int64_t total, int64_t row_width)>;
template <typename Key>
using ExportEmit = std::function<absl::Status(const HostExportBatch<Key>& batch)>;

// Keys per batch of a streamed export of rows of `row_width` floats: about
// 8 MiB of rows, small next to any table worth streaming, large enough that
// per-batch costs vanish; at most 65536 keys, at least one.
inline int64_t ExportBatchKeys(int64_t row_width) {
  const int64_t bytes_per_key = row_width * static_cast<int64_t>(sizeof(float)) + 24;
  return std::max<int64_t>(1,
                           std::min<int64_t>(int64_t{1} << 16, (int64_t{8} << 20) / bytes_per_key));
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_EXPORT_BUFFERS_H_
