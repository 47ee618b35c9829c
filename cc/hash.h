// Integer mixing shared by the hash tables, the owner function and the
// per-key initializers. Inline for host and device so every backend agrees.
#ifndef SOK_EV_CC_HASH_H_
#define SOK_EV_CC_HASH_H_

#include <cstdint>

#include "cc/common.h"

namespace sok_ev {

// The splitmix64 finalizer: a bijection on 64-bit integers whose output bits
// each depend on every input bit, so sequential or strided ids spread evenly.
SOK_EV_HOST_DEVICE uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A key's 64-bit pattern. int32 keys are sign-extended first, so a key means
// the same thing (same owner, same initial value) whatever its dtype.
template <typename Key>
SOK_EV_HOST_DEVICE uint64_t key_bits(Key key) {
  return static_cast<uint64_t>(static_cast<int64_t>(key));
}

// Hash used for bucket positions inside a table. Salted differently from
// owner_of() so that the keys a worker owns still fill all of its buckets.
template <typename Key>
SOK_EV_HOST_DEVICE uint64_t bucket_hash(Key key) {
  return mix64(key_bits(key));
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_HASH_H_
