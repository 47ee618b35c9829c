// Device-side probing of a gpu::HashTable index, shared by the table's own
// kernels and the fused lookup. CUDA only.
#ifndef SOK_EV_CC_HASH_TABLE_PROBE_GPU_H_
#define SOK_EV_CC_HASH_TABLE_PROBE_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/hash.h"
#include "cc/hash_table_gpu.h"
#include "cc/initializer.h"

namespace sok_ev {
namespace gpu {

// Element `column` of initial_row(spec, key, dim, .): the same expressions
// in the same order, so the value is the same bits (the core is built with
// -fmad=false so no multiply-add is contracted differently from the CPU).
template <typename Key>
__device__ __forceinline__ float initial_value_at(const InitializerSpec& spec, Key key,
                                                  int64_t column, int64_t dim) {
  const uint64_t bits = key_bits(key);
  const uint64_t c = static_cast<uint64_t>(column);
  switch (spec.kind) {
    case InitializerSpec::Kind::kConstant:
      return spec.param_a;
    case InitializerSpec::Kind::kRandomUniform:
      return spec.param_a + (spec.param_b - spec.param_a) * counter_uniform(spec.seed, bits, c, 0);
    case InitializerSpec::Kind::kRandomNormal:
      return spec.param_a + spec.param_b * counter_normal(spec.seed, bits, c, 0);
    case InitializerSpec::Kind::kTruncatedNormal: {
      float z = counter_normal(spec.seed, bits, c, 0);
      for (uint64_t draw = 1; fabsf(z) > 2.0f; ++draw) {
        z = counter_normal(spec.seed, bits, c, draw);
      }
      return spec.param_a + spec.param_b * z;
    }
    case InitializerSpec::Kind::kDefaultValueMatrix:
    default:
      return spec.default_values[default_value_row(key, spec.default_value_dim) * dim + column];
  }
}

// Loads the kBucketSlots keys of a bucket with 16-byte loads (a bucket is
// 128 bytes for int64 keys, 64 for int32, aligned to its size).
template <typename Key, bool kCoherent>
__device__ __forceinline__ void load_bucket_keys(const Key* bucket, Key (&keys)[kBucketSlots]) {
  constexpr int kVectors = kBucketSlots * sizeof(Key) / sizeof(uint4);
  const uint4* source = reinterpret_cast<const uint4*>(bucket);
  uint4 words[kVectors];
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    // Inserting kernels read through L2 only (.cg): L1 is not coherent with
    // keys other multiprocessors write during the launch.
    words[v] = kCoherent ? __ldcg(source + v) : __ldg(source + v);
  }
  memcpy(keys, words, sizeof(words));
}

template <bool kCoherent>
__device__ __forceinline__ void load_bucket_states(const int32_t* bucket,
                                                   int32_t (&states)[kBucketSlots]) {
  const int4* source = reinterpret_cast<const int4*>(bucket);
  int4 words[kBucketSlots / 4];
#pragma unroll
  for (int v = 0; v < kBucketSlots / 4; ++v) {
    words[v] = kCoherent ? __ldcg(source + v) : __ldg(source + v);
  }
  memcpy(states, words, sizeof(words));
}

// Row id of `key`, or -1 when absent. Read-only: valid only while no kernel
// inserts into or erases from the table.
template <typename Key>
__device__ __forceinline__ int32_t find_row(const TableView<Key>& table, Key key) {
  uint64_t bucket = bucket_hash(key) & table.bucket_mask;
  for (uint64_t probe = 0; probe <= table.bucket_mask; ++probe) {
    const uint64_t first = bucket * kBucketSlots;
    Key keys[kBucketSlots];
    load_bucket_keys<Key, false>(table.keys + first, keys);
    unsigned match = 0;
#pragma unroll
    for (int s = 0; s < kBucketSlots; ++s) match |= (keys[s] == key) << s;
    // A key may equal the stale key of an empty or erased slot: the state
    // decides. In the common case this is one extra 4-byte read.
    while (match != 0) {
      const int s = __ffs(match) - 1;
      const int32_t state = __ldg(table.states + first + s);
      if (state >= 0) return state;
      match &= match - 1;
    }
    int32_t states[kBucketSlots];
    load_bucket_states<false>(table.states + first, states);
    bool has_empty = false;
#pragma unroll
    for (int s = 0; s < kBucketSlots; ++s) has_empty |= states[s] == kEmptySlot;
    if (has_empty) return -1;
    bucket = (bucket + 1) & table.bucket_mask;
  }
  return -1;
}

// Cooperative probing: a group of kProbeGroup<Key> lanes reads one bucket,
// each lane 16 bytes of keys and the matching state words, so a bucket is
// one coalesced 128-byte (int64) or 64-byte (int32) request instead of eight
// (four) per thread. Lanes of a group are consecutive and aligned; every
// branch below depends only on group-wide ballots, so a group stays
// converged.
template <typename Key>
struct ProbeGroup {
  static constexpr int kKeysPerLane = 16 / sizeof(Key);
  static constexpr int kLanes = kBucketSlots / kKeysPerLane;  // 8 or 4
  unsigned mask;                                              // the group's lanes in the warp
  int rank;                                                   // lane within the group
  int base;                                                   // first lane of the group in the warp
  __device__ __forceinline__ ProbeGroup() {
    const int lane = threadIdx.x & 31;
    rank = lane % kLanes;
    base = lane - rank;
    mask = ((1u << kLanes) - 1) << base;
  }
  __device__ __forceinline__ unsigned ballot(bool p) const {
    return (__ballot_sync(mask, p) >> base) & ((1u << kLanes) - 1);
  }
  template <typename T>
  __device__ __forceinline__ T shfl(T v, int src) const {
    return __shfl_sync(mask, v, base + src);
  }
};

// This lane's kKeysPerLane keys / states of a bucket.
template <typename Key>
struct LaneSlots {
  Key keys[ProbeGroup<Key>::kKeysPerLane];
  int32_t states[ProbeGroup<Key>::kKeysPerLane];
};

template <typename Key>
__device__ __forceinline__ void load_lane_keys(const Key* slot, bool coherent, LaneSlots<Key>& s) {
  if constexpr (ProbeGroup<Key>::kKeysPerLane == 2) {
    const longlong2* p = reinterpret_cast<const longlong2*>(slot);
    const longlong2 v = coherent ? __ldcg(p) : __ldg(p);
    s.keys[0] = static_cast<Key>(v.x);
    s.keys[1] = static_cast<Key>(v.y);
  } else {
    const int4* p = reinterpret_cast<const int4*>(slot);
    const int4 v = coherent ? __ldcg(p) : __ldg(p);
    s.keys[0] = v.x;
    s.keys[1] = v.y;
    s.keys[2] = v.z;
    s.keys[3] = v.w;
  }
}

template <typename Key>
__device__ __forceinline__ void load_lane_states(const int32_t* slot, LaneSlots<Key>& s) {
  if constexpr (ProbeGroup<Key>::kKeysPerLane == 2) {
    const int2 v = __ldg(reinterpret_cast<const int2*>(slot));
    s.states[0] = v.x;
    s.states[1] = v.y;
  } else {
    const int4 v = __ldg(reinterpret_cast<const int4*>(slot));
    s.states[0] = v.x;
    s.states[1] = v.y;
    s.states[2] = v.z;
    s.states[3] = v.w;
  }
}

// States read as relaxed (strong) loads, so that a fence after them orders
// the key reads that follow (the acquire half of the publish protocol).
template <typename Key>
__device__ __forceinline__ void load_lane_states_relaxed(const int32_t* slot, LaneSlots<Key>& s) {
  if constexpr (ProbeGroup<Key>::kKeysPerLane == 2) {
    asm volatile("ld.relaxed.gpu.global.v2.s32 {%0, %1}, [%2];"
                 : "=r"(s.states[0]), "=r"(s.states[1])
                 : "l"(slot)
                 : "memory");
  } else {
    asm volatile("ld.relaxed.gpu.global.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(s.states[0]), "=r"(s.states[1]), "=r"(s.states[2]), "=r"(s.states[3])
                 : "l"(slot)
                 : "memory");
  }
}

__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Row id of `key`, or -1 when absent, found by the whole group (every lane
// gets the answer). Read-only: valid only while no kernel inserts or erases.
// States and keys are loaded together (no ordering needed without writers).
template <typename Key>
__device__ __forceinline__ int32_t group_find_row(const TableView<Key>& table,
                                                  const ProbeGroup<Key>& g, Key key) {
  constexpr int kK = ProbeGroup<Key>::kKeysPerLane;
  uint64_t bucket = bucket_hash(key) & table.bucket_mask;
  for (uint64_t probe = 0; probe <= table.bucket_mask; ++probe) {
    const uint64_t slot = bucket * kBucketSlots + g.rank * kK;
    LaneSlots<Key> s;
    load_lane_keys(table.keys + slot, false, s);
    load_lane_states(table.states + slot, s);
    int32_t row = -1;
    bool empty = false;
#pragma unroll
    for (int j = kK - 1; j >= 0; --j) {
      if (s.states[j] >= 0 && s.keys[j] == key) row = s.states[j];
      empty |= s.states[j] == kEmptySlot;
    }
    const unsigned hits = g.ballot(row >= 0);
    if (hits != 0) return g.shfl(row, __ffs(hits) - 1);
    if (g.ballot(empty) != 0) return -1;
    bucket = (bucket + 1) & table.bucket_mask;
  }
  return -1;
}

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_HASH_TABLE_PROBE_GPU_H_
