// fp32 vectors of one register and the elementary functions the CPU kernels share (paged
// attention's softmax and soft-cap, the layer ops' SiLU and tanh-GELU), as GCC/Clang vector
// extensions: 16 lanes in an AVX-512 register, 8 in an AVX2 one (x86-64-v3 builds).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tts_vec {

#if defined(__AVX512F__)
constexpr int64_t L = 16;
#else
// Not 16 lanes in two registers: GCC keeps such vectors in memory between operations, and
// paged attention's eight score accumulators (16 registers) plus its query no longer fit in
// AVX2's 16. The x86-64-v3 build took 9x the time on a 1500-token bf16 prefill layer and 6x
// on fp32 prefill and PRM chunks with 16 lanes (docs/benchmarks/beam_attention_avx2.md).
constexpr int64_t L = 8;
#endif
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

// exp(x) for x <= 0 to about 1e-5 relative error, in about half the instructions of
// exp_nonpositive: for weights that are rounded to bf16 next (2^-9 relative). With AVX-512,
// 2^(x log2 e) as 2^round(.) (vscalefps) times a degree-4 fit of 2^f on [-0.5, 0.5] (relative
// error 2.7e-6, plus up to 5e-6 from rounding x log2 e); elsewhere exp_nonpositive. Below
// -87 (and -inf) gives 0, as exp_nonpositive.
inline vfloat exp_nonpositive_coarse(vfloat x) {
#if defined(__AVX512F__)
  static_assert(sizeof(vfloat) == sizeof(__m512), "one vfloat is one AVX-512 register");
  const __m512 v = reinterpret_cast<__m512>(x);
  const __mmask16 live = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  const __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(9.570530615746975e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5919185280799866e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402474582195282e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.93121612071991e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999992847442627e-1f));
  return reinterpret_cast<vfloat>(_mm512_maskz_scalef_ps(live, p, n));
#else
  return exp_nonpositive(x);
#endif
}

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
