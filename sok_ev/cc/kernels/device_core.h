// The one seam between the TF op kernels and the framework-neutral core:
// Core<Device> turns an OpKernelContext into the core's context (CPU thread
// pool, or GPU stream and allocator), names the device's hash table, and
// calls each core stage with its Status turned into TF's. The kernels are
// templates over Device and never touch a thread pool, stream or cudaXxx
// call themselves, so the CPU build runs every line of them but the device
// plumbing in device_core_gpu.h.
//
// Both specialisations offer the same members:
//   Table<Key>            cpu::HashTable<Key> / gpu::HashTable<Key>
//   kTableIsThreadSafe    false: the variable serialises calls on its table
//   kBackwardReadsOrder   CombineBackwardTables sums entries grouped by key (order);
//                         false: UniqueKeys leaves order empty
//   Core(OpKernelContext*)
//   NewTableAllocator()   table-lifetime memory, null when the table needs none
//   NewTable, Size, AddSlot, FindOrInsert, Find, FindPresent,
//   InsertOrAssign, InsertOrAssignFromHost, Erase, EvictStale, ExportAll,
//   ExportBatches, ApplyOptimizer                     on one table
//   FindOrInsertCombineTables, ApplyOptimizerTables   on all tables of an op
//                                                     at once (below)
//   UniqueKeys (all tables of a lookup at once), CheckDistinct,
//   PartitionByOwner, CombineForwardTables, CombineBackwardTables (all tables
//   of a combine or its gradient at once)                      free stages
//   Copy, SetZero, CopyToHost, CopyFromHost, Upload, Scratch  device memory
//   CopyRows                  blocks of rows to and from a message buffer
//   WriteRowAddresses         where a message's rows are, to read them in place
// Pointers passed to them are device memory (host memory on CPU) unless a
// comment says host. ForEachTable (below) runs a multi-table op's per-table
// stages.
#ifndef SOK_EV_CC_KERNELS_DEVICE_CORE_H_
#define SOK_EV_CC_KERNELS_DEVICE_CORE_H_

#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#error "define EIGEN_USE_GPU before any include in a GOOGLE_CUDA build"
#endif

#include <string>
#include <unordered_set>

#include "cc/combine.h"
#include "cc/common.h"
#include "cc/optimizers.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/errors.h"

namespace sok_ev {

using CPUDevice = Eigen::ThreadPoolDevice;
using GPUDevice = Eigen::GpuDevice;

template <typename Device>
class Core;

// CheckDistinct's test and message, the same on both devices.
//   keys: (n,) host
template <typename Key>
absl::Status CheckDistinctOnHost(const Key* keys, int64_t n, const std::string& where) {
  std::unordered_set<Key> seen;
  seen.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (!seen.insert(keys[i]).second) {
      return tensorflow::errors::InvalidArgument(where, ": key ", keys[i],
                                                 " appears more than once");
    }
  }
  return absl::OkStatus();
}

// One table of Core::FindOrInsertCombineTables (an op's forward lookup of
// plain tables): its unique keys found or inserted, their counts added to
// the frequencies; then each sample's rows combined as combine describes
// (cc/combine.h: into its out, or at its out_rows). A table may be listed
// more than once: the inserts then run in list order.
template <typename Table, typename Key>
struct FindOrInsertCombineTable {
  Table* table;
  const Key* unique_keys;  // (num_unique,)
  const int64_t* counts;   // (num_unique,)
  int64_t num_unique;
  CombineForwardTable combine;  // its rows and dim are the table's
};

// One table of Core::ApplyOptimizerTables: Core::ApplyOptimizer's
// arguments. Tables listed more than once are updated in list order.
template <typename Table, typename Key>
struct ApplyOptimizerTable {
  Table* table;
  OptimizerSpec spec;  // with this table's slot indices
  const Key* keys;     // (n,)
  int64_t n;
  const float* grads;  // (n, dim)
  int64_t dim;
  bool keys_are_unique;
};

// ForEachTable(core, n, costs, same_stream, work) runs work(t, table_core)
// for every table t < n of a multi-table op and returns the first failure;
// table_core is the Core that table t's stages run on. Each device defines
// it beside its Core: the CPU runs tables on threads side by side
// (device_core_cpu.h), the GPU on side streams (device_core_gpu.h). work
// must touch only table t's buffers, whatever the order.
//   costs: (n,) host, each table's share of the work (e.g. its entries)
//   same_stream: (n,) host or null: tables with the same non-null entry
//     (their Embedding Variable) must not overlap on the GPU

}  // namespace sok_ev

#include "sok_ev/cc/kernels/device_core_cpu.h"
#if GOOGLE_CUDA
#include "sok_ev/cc/kernels/device_core_gpu.h"
#endif

#endif  // SOK_EV_CC_KERNELS_DEVICE_CORE_H_
