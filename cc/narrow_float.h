// 16-bit float formats of the compressed row exchange (issue 12), and the
// element conversion `copy_rows` applies (cc/exchange_message.h).
//
// The conversions are integer arithmetic on the bits, written once here for
// both twins: the CPU and GPU copies of a row give the same bits, whatever
// the compiler, the rounding-mode or flush-to-zero settings of the thread.
// float -> 16 bits rounds to nearest, ties to even (TensorFlow's tf.cast
// gives the same bits); NaN stays NaN (quiet); the 16 -> float direction is
// exact.
//   bfloat16: float's 8-bit exponent, 7-bit mantissa (8 significant bits):
//     relative error <= 2^-8, subnormals kept; only |x| > 3.3961e38 rounds
//     to inf.
//   float16: 5-bit exponent, 10-bit mantissa: relative error <= 2^-11 for
//     |x| in [2^-14, 65504]; |x| >= 65520 becomes inf, below 2^-14 the
//     absolute error is up to 2^-25 and |x| <= 2^-25 becomes 0.
#ifndef SOK_EV_CC_NARROW_FLOAT_H_
#define SOK_EV_CC_NARROW_FLOAT_H_

#include <cstdint>
#include <cstring>

#include "cc/common.h"

namespace sok_ev {

// The bits of one value; distinct types so a RowCopy names its format.
struct Bfloat16Bits {
  uint16_t bits;
};
struct Float16Bits {
  uint16_t bits;
};

SOK_EV_HOST_DEVICE uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return u;
}

SOK_EV_HOST_DEVICE float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}

SOK_EV_HOST_DEVICE Bfloat16Bits to_bfloat16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncating could leave a zero mantissa (inf); set the quiet bit.
    return {static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  // Adding 0x7fff plus the kept lowest bit rounds to nearest, ties to even;
  // a carry into the exponent is the right result (up to inf).
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(rounded >> 16)};
}

SOK_EV_HOST_DEVICE float from_bfloat16(Bfloat16Bits h) {
  return bits_float(static_cast<uint32_t>(h.bits) << 16);
}

// Rounds (value >> shift) to nearest, ties to even; shift in [1, 31].
SOK_EV_HOST_DEVICE uint32_t shift_round_even(uint32_t value, uint32_t shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

SOK_EV_HOST_DEVICE Float16Bits to_float16(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, the mantissa's top bits kept
    return {static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu))};
  }
  if (a >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520: inf
  if (a >= 0x38800000u) {
    // Normal half: rebias the exponent (127 -> 15); a carry out of the
    // mantissa moves to the next exponent, as it should.
    return {static_cast<uint16_t>(sign | shift_round_even(a - 0x38000000u, 13))};
  }
  // Subnormal half (or zero): units of 2^-24 from float's 24-bit significand.
  const uint32_t exponent = a >> 23;
  if (exponent < 102) return {sign};  // below 2^-25: rounds to zero
  const uint32_t significand = (a & 0x007fffffu) | 0x00800000u;
  return {static_cast<uint16_t>(sign | shift_round_even(significand, 126 - exponent))};
}

SOK_EV_HOST_DEVICE float from_float16(Float16Bits h) {
  const uint32_t sign = (static_cast<uint32_t>(h.bits) & 0x8000u) << 16;
  uint32_t exponent = (h.bits >> 10) & 0x1fu;
  uint32_t mantissa = h.bits & 0x03ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal half: a normal float; shift the leading 1 out of the mantissa.
    exponent = 113;
    while ((mantissa & 0x0400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    return bits_float(sign | (exponent << 23) | ((mantissa & 0x03ffu) << 13));
  }
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// One element of a RowCopy: a plain cast, or one of the conversions above.
template <typename Src, typename Dst>
struct ConvertElement {
  SOK_EV_HOST_DEVICE static Dst apply(Src x) { return static_cast<Dst>(x); }
};
template <>
struct ConvertElement<float, Bfloat16Bits> {
  SOK_EV_HOST_DEVICE static Bfloat16Bits apply(float x) { return to_bfloat16(x); }
};
template <>
struct ConvertElement<Bfloat16Bits, float> {
  SOK_EV_HOST_DEVICE static float apply(Bfloat16Bits x) { return from_bfloat16(x); }
};
template <>
struct ConvertElement<float, Float16Bits> {
  SOK_EV_HOST_DEVICE static Float16Bits apply(float x) { return to_float16(x); }
};
template <>
struct ConvertElement<Float16Bits, float> {
  SOK_EV_HOST_DEVICE static float apply(Float16Bits x) { return from_float16(x); }
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_NARROW_FLOAT_H_
