// Scalar fp32 <-> fp16/bf16 conversions on bits: the single definition of
// the rounding contract in runtime/dtype.h, compiled for the host and, through
// nvcc, for CUDA kernels (runtime/cuda_convert.cu), so both devices round
// identically by construction.
#ifndef MEMWALL_RUNTIME_DTYPE_BITS_H_
#define MEMWALL_RUNTIME_DTYPE_BITS_H_

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define MEMWALL_HOST_DEVICE __host__ __device__
#else
#define MEMWALL_HOST_DEVICE
#endif

namespace memwall {

MEMWALL_HOST_DEVICE inline uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MEMWALL_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// fp16 -> fp32, exact.
MEMWALL_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000 | (mant << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);
  // Subnormal: mant * 2^-24. Normalize: shift until the implicit bit (0x400).
  int e = 113;  // biased fp32 exponent of 2^-14
  while ((mant & 0x400) == 0) {
    mant <<= 1;
    --e;
  }
  return BitsToFloat(sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3FF) << 13));
}

// fp32 -> fp16, round to nearest even.
MEMWALL_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) {  // NaN: keep the top 10 payload bits.
    uint16_t payload = static_cast<uint16_t>((ax >> 13) & 0x3FF);
    return sign | 0x7C00 | (payload ? payload : 0x200);
  }
  // 65520 = 0x477FF000 is halfway between 65504 (max fp16, odd mantissa) and
  // 2^16, so it and everything above round to Inf.
  if (ax >= 0x477FF000) return sign | 0x7C00;
  if (ax >= 0x38800000) {  // >= 2^-14: a normal fp16.
    // Rebias the exponent (127 -> 15) and round the 13 dropped bits to even;
    // a carry out of the mantissa correctly bumps the exponent.
    const uint32_t odd = (ax >> 13) & 1;
    return sign | static_cast<uint16_t>((ax - (112u << 23) + 0xFFF + odd) >> 13);
  }
  // Subnormal fp16 or zero: result = round(|f| * 2^24) with ties to even.
  const uint32_t e = ax >> 23;
  if (e < 102) return sign;  // |f| < 2^-25: rounds to 0 (2^-25 is a tie to 0).
  const uint32_t m = (ax & 0x7FFFFF) | 0x800000;  // |f| = m * 2^(e-150)
  const uint32_t shift = 126 - e;                  // |f| * 2^24 = m >> shift
  const uint32_t q = m >> shift;
  const uint32_t r = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return sign | static_cast<uint16_t>(q + (r > half || (r == half && (q & 1))));
}

// bf16 -> fp32, exact.
MEMWALL_HOST_DEVICE inline float BF16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// fp32 -> bf16, round to nearest even. bf16 shares fp32's exponent, so
// rounding the low 16 bits is the whole conversion; a carry into the
// exponent gives the next binade or Inf, as it should.
MEMWALL_HOST_DEVICE inline uint16_t FloatToBF16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) {  // NaN
    uint16_t top = static_cast<uint16_t>(x >> 16);
    return (top & 0x7F) ? top : static_cast<uint16_t>(top | 0x40);
  }
  return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_DTYPE_BITS_H_
