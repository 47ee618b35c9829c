// DeepRec's feature filters: the state that decides when a table admits a
// new key. Host memory, for the CPU and the GPU table alike (the TF layer
// consults it before any insert: sok_ev/cc/kernels/variable_lookup.h).
//
// A key is admitted once it has been seen filter_freq times. Until then it
// has no row: lookups read `no_permission_value` and its gradients are
// dropped. Two ways to count the keys not admitted yet, as in DeepRec:
//   * exact (CounterFilter): a map key -> (frequency, version); the version
//     is the global step of the last update that dropped the key's gradient;
//   * a counting Bloom filter (CBFFilter): num_counters counters of
//     counter_bytes each; a key's count is the least of its num_hashes
//     counters, never below its true count. Counters stop at filter_freq.
// Admitted keys live in the table, which counts their frequency.
#ifndef SOK_EV_CC_FEATURE_FILTER_H_
#define SOK_EV_CC_FEATURE_FILTER_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "cc/common.h"
#include "cc/hash.h"

namespace sok_ev {

struct FeatureFilterSpec {
  int64_t filter_freq = 0;        // 0: no filter, every key is admitted
  int64_t num_counters = 0;       // 0: exact counts; > 0: a counting Bloom filter
  int64_t num_hashes = 0;         // Bloom filter: counters per key
  int64_t counter_bytes = 8;      // Bloom filter: 1, 2, 4 or 8
  float no_permission_value = 0;  // what a lookup of a key not admitted reads

  bool enabled() const { return filter_freq > 0; }
  bool bloom() const { return num_counters > 0; }
};

// The checks the op layer runs on a spec before making a filter.
inline Status CheckFeatureFilterSpec(const FeatureFilterSpec& spec) {
  if (spec.filter_freq < 0) {
    return Status::InvalidArgument("filter_freq must be >= 0, got " +
                                   std::to_string(spec.filter_freq));
  }
  if (spec.num_counters < 0 || (spec.num_counters > 0 && spec.num_hashes < 1)) {
    return Status::InvalidArgument(
        "a counting Bloom filter needs num_counters > 0 and "
        "num_hashes > 0, got " +
        std::to_string(spec.num_counters) + " and " + std::to_string(spec.num_hashes));
  }
  const int64_t b = spec.counter_bytes;
  if (b != 1 && b != 2 && b != 4 && b != 8) {
    return Status::InvalidArgument("counter_bytes must be 1, 2, 4 or 8, got " + std::to_string(b));
  }
  return Status::Ok();
}

template <typename Key>
class FeatureFilter {
 public:
  struct Entry {
    int64_t frequency = 0;
    int64_t version = 0;
  };

  // A filter with nothing counted; ResourceExhausted when the Bloom
  // filter's counters cannot be allocated. spec must pass
  // CheckFeatureFilterSpec and be enabled().
  static Status Create(const FeatureFilterSpec& spec, FeatureFilter** filter) {
    FeatureFilter* created = new FeatureFilter(spec);
    if (spec.bloom()) {
      try {
        created->counters_.assign(static_cast<size_t>(spec.num_counters * spec.counter_bytes), 0);
      } catch (const std::bad_alloc&) {
        delete created;
        return Status::ResourceExhausted(
            "out of memory allocating " + std::to_string(spec.num_counters * spec.counter_bytes) +
            " bytes for the counters of a counting Bloom filter (CBFFilter)");
      }
    }
    *filter = created;
    return Status::Ok();
  }

  const FeatureFilterSpec& spec() const { return spec_; }

  // Held by callers across a lookup or update, so that deciding which keys
  // are admitted and inserting them into the table happen as one step.
  std::mutex& mutex() { return mutex_; }

  // Occurrences of a key not admitted yet (for the Bloom filter, an upper
  // bound that saturates at filter_freq).
  int64_t frequency(Key key) const {
    if (spec_.bloom()) {
      int64_t least = std::numeric_limits<int64_t>::max();
      for (int64_t h = 0; h < spec_.num_hashes; ++h) least = std::min(least, counter(slot(key, h)));
      return least;
    }
    auto it = entries_.find(key);
    return it == entries_.end() ? 0 : it->second.frequency;
  }

  // Counts `count` more occurrences of a key not admitted yet.
  void add(Key key, int64_t count) {
    if (spec_.bloom()) {
      const int64_t cap = std::min<int64_t>(spec_.filter_freq, max_counter());
      for (int64_t h = 0; h < spec_.num_hashes; ++h) {
        const int64_t s = slot(key, h);
        set_counter(s, std::min(cap, counter(s) + count));
      }
      return;
    }
    entries_[key].frequency += count;
  }

  // The key got a row in the table: the exact filter stops counting it (a
  // Bloom filter cannot forget a key).
  void forget(Key key) {
    if (!spec_.bloom()) entries_.erase(key);
  }

  // The global step of an update that dropped the key's gradient (exact
  // filter only: a Bloom filter keeps no versions).
  void set_version(Key key, int64_t version) {
    if (!spec_.bloom()) entries_[key].version = version;
  }

  // --- Checkpoints ---------------------------------------------------------

  // Keys not admitted yet with their counts (exact filter; empty for a
  // Bloom filter).
  const std::unordered_map<Key, Entry>& entries() const { return entries_; }
  bool contains(Key key) const { return entries_.count(key) > 0; }
  void set_entry(Key key, int64_t frequency, int64_t version) {
    if (!spec_.bloom()) entries_[key] = Entry{frequency, version};
  }

  // Erases exact entries whose version is older than
  // global_step - steps_to_live (DeepRec evicts them with the table's keys);
  // appends the erased keys to *evicted.
  void evict_stale(int64_t global_step, int64_t steps_to_live, std::vector<Key>* evicted) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.version < global_step - steps_to_live) {
        evicted->push_back(it->first);
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The Bloom filter's counters, num_counters of counter_bytes each
  // (native byte order), as checkpoints store them.
  const std::vector<uint8_t>& counters() const { return counters_; }

  // Adds a saved filter's counters to this one's, saturating at
  // filter_freq: the counts of keys from several workers' shards. The saved
  // filter must have this one's num_counters and num_hashes.
  Status merge_counters(const void* saved, int64_t num_counters, int64_t counter_bytes,
                        int64_t num_hashes) {
    if (num_counters != spec_.num_counters || num_hashes != spec_.num_hashes) {
      return Status::InvalidArgument(
          "the checkpoint's counting Bloom filter has " + std::to_string(num_counters) +
          " counters and " + std::to_string(num_hashes) + " hashes; this CBFFilter has " +
          std::to_string(spec_.num_counters) + " and " + std::to_string(spec_.num_hashes) +
          " (give it the max_element_size and false_positive_probability it was saved with)");
    }
    const int64_t cap = std::min<int64_t>(spec_.filter_freq, max_counter());
    const auto* bytes = static_cast<const uint8_t*>(saved);
    for (int64_t s = 0; s < num_counters; ++s) {
      const int64_t value = read_counter(bytes + s * counter_bytes, counter_bytes);
      set_counter(s, std::min(cap, counter(s) + value));
    }
    return Status::Ok();
  }

 private:
  explicit FeatureFilter(const FeatureFilterSpec& spec) : spec_(spec) {}

  int64_t slot(Key key, int64_t h) const {
    const uint64_t salt = 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(h + 1);
    return static_cast<int64_t>(mix64(key_bits(key) ^ salt) %
                                static_cast<uint64_t>(spec_.num_counters));
  }

  int64_t max_counter() const {
    return spec_.counter_bytes >= 8 ? std::numeric_limits<int64_t>::max()
                                    : (int64_t{1} << (8 * spec_.counter_bytes)) - 1;
  }

  static int64_t read_counter(const uint8_t* p, int64_t bytes) {
    switch (bytes) {
      case 1:
        return *p;
      case 2: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
      }
      case 4: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
      default: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        return static_cast<int64_t>(std::min<uint64_t>(v, std::numeric_limits<int64_t>::max()));
      }
    }
  }

  int64_t counter(int64_t s) const {
    return read_counter(counters_.data() + s * spec_.counter_bytes, spec_.counter_bytes);
  }

  void set_counter(int64_t s, int64_t value) {
    uint8_t* p = counters_.data() + s * spec_.counter_bytes;
    switch (spec_.counter_bytes) {
      case 1:
        *p = static_cast<uint8_t>(value);
        break;
      case 2: {
        const uint16_t v = static_cast<uint16_t>(value);
        std::memcpy(p, &v, 2);
        break;
      }
      case 4: {
        const uint32_t v = static_cast<uint32_t>(value);
        std::memcpy(p, &v, 4);
        break;
      }
      default: {
        const uint64_t v = static_cast<uint64_t>(value);
        std::memcpy(p, &v, 8);
        break;
      }
    }
  }

  const FeatureFilterSpec spec_;
  std::mutex mutex_;
  std::unordered_map<Key, Entry> entries_;
  std::vector<uint8_t> counters_;
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_FEATURE_FILTER_H_
