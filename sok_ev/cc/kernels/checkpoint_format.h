// How Embedding Variables lie in a TensorFlow checkpoint (a tensor bundle),
// shared by the save and restore kernels (checkpoint_kernels.cc).
//
// A checkpoint holds, for each table saved under the name T (the Saver's
// name for the variable, or its object path in a tf.train.Checkpoint), one
// shard per worker that saved it: the keys that worker held. Shard w of W:
//   T/sok_ev/shard_<w>_of_<W>/keys                 [n]       int32 or int64
//   T/sok_ev/shard_<w>_of_<W>/values               [n, dim]  float32
//   T/sok_ev/shard_<w>_of_<W>/frequencies          [n]       int64
//   T/sok_ev/shard_<w>_of_<W>/versions             [n]       int64
//   T/sok_ev/shard_<w>_of_<W>/slot_names           [s]       string
//   T/sok_ev/shard_<w>_of_<W>/slot_initial_values  [s]       float32
//   T/sok_ev/shard_<w>_of_<W>/slot_<i>             [n, dim]  float32, slot i
// and worker 0 writes T/sok_ev/header = int64 [W, target_gpu, version, kind].
// Tensors of n > 0 rows are written as row slices of about 8 MiB
// (ExportBatchKeys), so neither side ever holds a whole table's copy;
// TensorFlow's readers (tf.train.load_variable) still see whole tensors.
// Which worker owns a key is not stored: a restore recomputes it for the
// worker count it runs on (cc/partition.h).
//
// A table with a feature filter (cc/feature_filter.h) also saves what its
// filter counted, per shard, as DeepRec's "-keys_filtered" tensors do: the
// keys not admitted yet have no row.
//   exact counts (CounterFilter):
//     .../keys_filtered         [m]  the key dtype
//     .../frequencies_filtered  [m]  int64
//     .../versions_filtered     [m]  int64
//   counting Bloom filter (CBFFilter):
//     .../bloom_counters        [num_counters]  uint8, uint16, uint32 or uint64
//     .../bloom_hashes          []              int64
//
// Kinds of checkpoint:
//   kFull         every key of the table.
//   kIncremental  only the keys that changed since the checkpoint named by
//                 T/sok_ev/base (a string, written by worker 0), full or
//                 incremental itself: rows for the keys in the table,
//                 filtered tensors for the keys the filter counts, and
//                   .../deleted_keys  [d]  keys gone since the base
//                 The Bloom filter's counters are saved whole.
//   kServingInitializer, kServingZeros
//                 an export for serving (sok_ev.serving_export): every key's
//                 value, without optimizer slots or filter state. A restore
//                 loads it for serving: lookups insert nothing, and a key
//                 the table lacks reads its initial value, or zeros.
//
// Version 1 (header [W, target_gpu, 1]) is a full checkpoint without
// filters; version 2 reads it.
#ifndef SOK_EV_CC_KERNELS_CHECKPOINT_FORMAT_H_
#define SOK_EV_CC_KERNELS_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <string>

namespace sok_ev {
namespace checkpoint {

constexpr int64_t kFormatVersion = 2;
// Entries of the header tensor.
constexpr int kHeaderWorkers = 0;
constexpr int kHeaderTarget = 1;
constexpr int kHeaderVersion = 2;
constexpr int kHeaderKind = 3;
constexpr int kHeaderSize = 4;
constexpr int kHeaderSizeV1 = 3;

constexpr int64_t kFull = 0;
constexpr int64_t kIncremental = 1;
constexpr int64_t kServingInitializer = 2;
constexpr int64_t kServingZeros = 3;

inline std::string HeaderKey(const std::string& table) { return table + "/sok_ev/header"; }
inline std::string BaseKey(const std::string& table) { return table + "/sok_ev/base"; }

inline std::string ShardKey(const std::string& table, int64_t worker, int64_t num_workers,
                            const std::string& field) {
  return table + "/sok_ev/shard_" + std::to_string(worker) + "_of_" + std::to_string(num_workers) +
         "/" + field;
}

inline std::string SlotField(int64_t slot) { return "slot_" + std::to_string(slot); }

// The name of worker w's part of a checkpoint being written at `prefix`
// (merged into the checkpoint once every part is written).
inline std::string PartPrefix(const std::string& prefix, int64_t worker, int64_t num_workers) {
  char suffix[64];
  snprintf(suffix, sizeof(suffix), "_worker_%05lld_of_%05lld", static_cast<long long>(worker),
           static_cast<long long>(num_workers));
  return prefix + suffix;
}

}  // namespace checkpoint
}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_CHECKPOINT_FORMAT_H_
