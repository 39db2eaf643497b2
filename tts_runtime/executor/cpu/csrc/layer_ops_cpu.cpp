// A decoder layer's elementwise ops for the CPU, one pass each: RMSNorm, rotary embedding
// (in place) and the gated activation times up.
//
// Torch's eager versions make several passes over fp32 copies (RMSNorm: upcast, square,
// mean, add, rsqrt, scale, cast, weight; rotary: negate, concatenate, two products, a sum)
// and, at the few rows a decode step has, pay torch's per-op dispatch a dozen times per layer.
// These loops round where the eager ops round (each product and sum to the tensor's dtype,
// the Llama norm before its weight, the activation before the product), convert to bf16
// exactly as c10 does, and are built without contracting multiply-adds, so the rotary
// embedding is bit-exact with the eager op; the norm differs only by its fp32 summation order
// and the activations by their exp (vector_math.h, ~1e-7 relative), which after rounding
// to bf16 almost never shows.

// The few torch headers the kernel uses, not <torch/extension.h>: that one brings in torch's
// whole C++ API and took about 22 of a kernel's 25 s of compiling (cpu_build.py).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vector_math.h"

namespace {

using tts_vec::L, tts_vec::vfloat, tts_vec::vint;
typedef uint32_t vuint __attribute__((vector_size(L * sizeof(uint32_t))));
typedef uint16_t vhalfword __attribute__((vector_size(L * sizeof(uint16_t))));

inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline vfloat load(const c10::BFloat16* p) {
  vhalfword h;
  std::memcpy(&h, p, sizeof(h));
  const vuint bits = __builtin_convertvector(h, vuint) << 16;
  vfloat v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

inline void store(float* p, vfloat v) { std::memcpy(p, &v, sizeof(v)); }

// c10's float -> bf16 rounding: to nearest even, NaN to the quiet NaN 0x7fc0; the bf16 bits
// in the low half of each lane.
inline vuint bf16_bits(vfloat v) {
  vuint bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const vuint rounded = (bits + (((bits >> 16) & 1u) + 0x7fffu)) >> 16;
  return v != v ? vuint{} + 0x7fc0u : rounded;
}

inline void store(c10::BFloat16* p, vfloat v) {
  const vhalfword h = __builtin_convertvector(bf16_bits(v), vhalfword);
  std::memcpy(p, &h, sizeof(h));
}

// The value x takes once stored in T (a product or sum the eager op rounds to its dtype).
template <typename T>
inline vfloat round_to(vfloat x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    const vuint bits = bf16_bits(x) << 16;
    vfloat v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
}

// The vector-wide chunks [offset, offset + width) of a row of `cols` elements, through
// `body`: full vectors, then a shorter tail (load_part and store_part pad it).
template <typename Body>
inline void for_chunks(int64_t cols, Body body) {
  for (int64_t c = 0; c < cols; c += L) body(c, std::min(L, cols - c));
}

template <typename T>
inline vfloat load_part(const T* p, int64_t width) {
  if (width == L) return load(p);
  alignas(64) T tmp[L] = {};
  std::memcpy(tmp, p, width * sizeof(T));
  return load(tmp);
}

template <typename T>
inline void store_part(T* p, vfloat v, int64_t width) {
  if (width == L) return store(p, v);
  alignas(64) T tmp[L];
  store(tmp, v);
  std::memcpy(p, tmp, width * sizeof(T));
}

// body(T{}) for x's dtype: fp32 or bf16, the dtypes models run in on the CPU.
template <typename Body>
void dispatch(const at::Tensor& x, Body body) {
  if (x.scalar_type() == at::kFloat) return body(float{});
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "the CPU layer ops take float32 or bfloat16, not ", x.scalar_type());
  body(c10::BFloat16{});
}

// x [rows, heads, dim] (any row and head strides, dim contiguous) -> out, contiguous.
template <typename T>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, bool gemma_style, at::Tensor& out) {
  const int64_t rows = x.size(0), heads = x.dim() == 3 ? x.size(1) : 1, dim = x.size(-1);
  const int64_t s_row = x.stride(0), s_head = x.dim() == 3 ? x.stride(1) : 0;
  const T* src = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, rows * heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = src + (r / heads) * s_row + (r % heads) * s_head;
      T* o = dst + r * dim;
      vfloat squares = {};
      for_chunks(dim, [&](int64_t c, int64_t width) {
        const vfloat v = load_part(row + c, width);
        squares += v * v;
      });
      float sum = 0.0f;
      for (int64_t i = 0; i < L; ++i) sum += squares[i];
      // torch's mean multiplies by 1 / dim; its rsqrt is 1 / sqrt.
      const float inv = 1.0f / std::sqrt(sum * (1.0f / static_cast<float>(dim)) + static_cast<float>(eps));
      for_chunks(dim, [&](int64_t c, int64_t width) {
        const vfloat normed = load_part(row + c, width) * inv;
        const vfloat wv = load_part(w + c, width);
        // Gemma scales by (1 + w) in fp32; Llama rounds the normalised row before its weight.
        store_part(o + c, gemma_style ? normed * (1.0f + wv) : wv * round_to<T>(normed), width);
      });
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool gemma_style) {
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && x.stride(-1) == 1, "x must be [rows, dim] or [rows, heads, dim] "
              "with a contiguous last dim");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == x.size(-1),
              "weight must be a contiguous [dim] of x's dtype");
  at::Tensor out = at::empty(x.sizes(), x.options());
  dispatch(x, [&](auto zero) { rms_norm_rows<decltype(zero)>(x, weight, eps, gemma_style, out); });
  return out;
}

// Rotate-half (HF layout) of every head of `x` [tokens, heads, dim] in place, with the eager
// op's roundings: x * cos + rotated * sin, each product and the sum rounded to T.
template <typename T>
void rotate(at::Tensor& x, const T* cos, const T* sin, int64_t s_cos, int64_t s_sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2;
  const int64_t s_tok = x.stride(0), s_head = x.stride(1);
  T* base = x.data_ptr<T>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        T* first = base + t * s_tok + h * s_head;
        T* second = first + half;
        const T* c = cos + t * s_cos;
        const T* s = sin + t * s_sin;
        for_chunks(half, [&](int64_t i, int64_t width) {
          const vfloat x1 = load_part(first + i, width), x2 = load_part(second + i, width);
          const vfloat out1 = round_to<T>(x1 * load_part(c + i, width)) + round_to<T>(-x2 * load_part(s + i, width));
          const vfloat out2 = round_to<T>(x2 * load_part(c + half + i, width)) +
                              round_to<T>(x1 * load_part(s + half + i, width));
          store_part(first + i, out1, width);
          store_part(second + i, out2, width);
        });
      }
  });
}

void rotary_qk(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  for (const at::Tensor* t : {&q, &k})
    TORCH_CHECK(t->dim() == 3 && t->stride(2) == 1 && t->size(2) % 2 == 0 && t->size(2) == q.size(2) &&
                t->size(0) == q.size(0) && t->scalar_type() == q.scalar_type(),
                "q and k must be [tokens, heads, head_dim] of one dtype with an even, contiguous head_dim");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->dim() == 3 && t->size(0) == q.size(0) && t->size(1) == 1 && t->size(2) == q.size(2) &&
                t->stride(2) == 1 && t->scalar_type() == q.scalar_type(),
                "cos and sin must be [tokens, 1, head_dim] of q's dtype");
  dispatch(q, [&](auto zero) {
    using T = decltype(zero);
    for (at::Tensor* t : {&q, &k}) rotate<T>(*t, cos.data_ptr<T>(), sin.data_ptr<T>(), cos.stride(0), sin.stride(0));
  });
}

enum Activation : int64_t { kSilu = 0, kGeluTanh = 1 };

inline vfloat activate(vfloat x, int64_t activation) {
  if (activation == kSilu) return x * tts_vec::sigmoid(x);
  const vfloat z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tts_vec::tanh(z));
}

// gate_up [rows, 2 * inter] (any row stride) -> act(gate) * up [rows, inter]; the activation
// is rounded to T before the product, as the eager op stores it.
template <typename T>
void act_and_mul_rows(const at::Tensor& gate_up, int64_t activation, at::Tensor& out) {
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2, s_row = gate_up.stride(0);
  const T* src = gate_up.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = src + r * s_row;
      const T* up = gate + inter;
      T* o = dst + r * inter;
      for_chunks(inter, [&](int64_t c, int64_t width) {
        const vfloat act = round_to<T>(activate(load_part(gate + c, width), activation));
        store_part(o + c, act * load_part(up + c, width), width);
      });
    }
  });
}

at::Tensor act_and_mul(const at::Tensor& gate_up, int64_t activation) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "gate_up must be [rows, 2 * intermediate] with a contiguous last dim");
  TORCH_CHECK(activation == kSilu || activation == kGeluTanh, "activation must be 0 (SiLU) or 1 (tanh-GELU)");
  at::Tensor out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  dispatch(gate_up, [&](auto zero) { act_and_mul_rows<decltype(zero)>(gate_up, activation, out); });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dim, Llama or Gemma style");
  m.def("rotary_qk", &rotary_qk, "Rotate-half rotary embedding of q and k, in place");
  m.def("act_and_mul", &act_and_mul, "act(gate) * up of a fused gate/up projection");
}
