// The value a key's row takes when the key is first inserted.
//
// Draws are counter-based: a key's initial row depends only on the seed, the
// key and the column, never on insertion order, thread or device. So a run
// is reproducible, and the CPU and GPU tables start every key identically.
#ifndef SOK_EV_CC_INITIALIZER_H_
#define SOK_EV_CC_INITIALIZER_H_

#include <cmath>
#include <cstdint>

#include "cc/common.h"
#include "cc/hash.h"

namespace sok_ev {

struct InitializerSpec {
  enum class Kind : int32_t {
    kConstant = 0,         // every element = param_a
    kRandomUniform = 1,    // uniform in [param_a, param_b)
    kRandomNormal = 2,     // normal(mean = param_a, stddev = param_b)
    kTruncatedNormal = 3,  // normal(param_a, param_b), redrawn beyond 2 stddev
    // DeepRec's InitializerOption(default_value_dim=N): a new key takes row
    // (key mod N) of a (N, dim) matrix drawn once by the framework layer.
    kDefaultValueMatrix = 4,
  };
  Kind kind = Kind::kConstant;
  float param_a = 0.0f;
  float param_b = 0.0f;
  uint64_t seed = 0;
  // kDefaultValueMatrix only: (default_value_dim, dim), host memory for the
  // CPU table and device memory for the GPU table.
  const float* default_values = nullptr;
  int64_t default_value_dim = 0;
};

// Uniform float in [0, 1) from (seed, key, column, draw); 24 random bits, so
// every value is exactly representable.
SOK_EV_HOST_DEVICE float counter_uniform(uint64_t seed, uint64_t key, uint64_t column,
                                         uint64_t draw) {
  uint64_t x =
      mix64(seed ^ mix64(key ^ mix64(column * 0x100000001b3ULL + draw * 0x9e3779b97f4a7c15ULL)));
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

// Standard normal from two counter uniforms (Box-Muller).
SOK_EV_HOST_DEVICE float counter_normal(uint64_t seed, uint64_t key, uint64_t column,
                                        uint64_t draw) {
  // 1 - u keeps the logarithm's argument in (0, 1].
  float u1 = 1.0f - counter_uniform(seed, key, column, 2 * draw);
  float u2 = counter_uniform(seed, key, column, 2 * draw + 1);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

// Row index of `key` in the default-value matrix: the non-negative key mod N,
// so negative keys also land in [0, N).
template <typename Key>
SOK_EV_HOST_DEVICE int64_t default_value_row(Key key, int64_t n) {
  int64_t r = static_cast<int64_t>(key) % n;
  return r < 0 ? r + n : r;
}

// Writes the initial `dim` floats of `key` into `row`.
template <typename Key>
SOK_EV_HOST_DEVICE void initial_row(const InitializerSpec& spec, Key key, int64_t dim, float* row) {
  const uint64_t bits = key_bits(key);
  for (int64_t c = 0; c < dim; ++c) {
    float v;
    switch (spec.kind) {
      case InitializerSpec::Kind::kConstant:
        v = spec.param_a;
        break;
      case InitializerSpec::Kind::kRandomUniform:
        v = spec.param_a + (spec.param_b - spec.param_a) * counter_uniform(spec.seed, bits, c, 0);
        break;
      case InitializerSpec::Kind::kRandomNormal:
        v = spec.param_a + spec.param_b * counter_normal(spec.seed, bits, c, 0);
        break;
      case InitializerSpec::Kind::kTruncatedNormal: {
        // Rejection as in tf.random.truncated_normal: redraw until within
        // two standard deviations (about 4.6% of draws are rejected).
        float z = counter_normal(spec.seed, bits, c, 0);
        for (uint64_t draw = 1; fabsf(z) > 2.0f; ++draw) {
          z = counter_normal(spec.seed, bits, c, draw);
        }
        v = spec.param_a + spec.param_b * z;
        break;
      }
      case InitializerSpec::Kind::kDefaultValueMatrix:
      default:
        v = spec.default_values[default_value_row(key, spec.default_value_dim) * dim + c];
        break;
    }
    row[c] = v;
  }
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_INITIALIZER_H_
