// 16-lane fp32 vectors and the elementary functions the CPU kernels share (paged attention's
// softmax and soft-cap, the layer ops' SiLU and tanh-GELU), as GCC/Clang vector extensions:
// one AVX-512 register where the machine has it (the builds use -march=native), narrower
// registers where not.
#pragma once

#include <cstdint>
#include <cstring>

namespace tts_vec {

constexpr int64_t L = 16;
typedef float vfloat __attribute__((vector_size(L * sizeof(float))));
typedef int32_t vint __attribute__((vector_size(L * sizeof(int32_t))));

inline vfloat splat(float x) { return vfloat{} + x; }

// exp(x) for x <= 0, lane-wise: Cephes' expf polynomial (relative error ~1e-7); arguments
// below -87 (and -inf) give 0.
inline vfloat exp_nonpositive(vfloat x) {
  const vfloat xc = x < -87.0f ? splat(-87.0f) : x;
  const vfloat t = xc * 1.44269504088896341f + 0.5f;
  vint n = __builtin_convertvector(t, vint);       // truncates toward zero ...
  n += __builtin_convertvector(n, vfloat) > t;     // ... and this makes it floor (true is -1)
  const vfloat nf = __builtin_convertvector(n, vfloat);
  const vfloat r = xc - nf * 0.693359375f + nf * 2.12194440e-4f;
  vfloat p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vint bits = (n + 127) << 23;
  vfloat scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? vfloat{} : p * scale;
}

inline float exp_nonpositive(float x) { return exp_nonpositive(splat(x))[0]; }

inline vfloat abs(vfloat x) { return x < 0.0f ? -x : x; }

// tanh through exp of a non-positive argument, so that large |x| saturate instead of overflowing.
inline vfloat tanh(vfloat x) {
  const vfloat e = exp_nonpositive(-2.0f * abs(x));
  const vfloat t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

// 1 / (1 + exp(-x)), the same way.
inline vfloat sigmoid(vfloat x) {
  const vfloat e = exp_nonpositive(-abs(x));
  return x < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e);
}

}  // namespace tts_vec
