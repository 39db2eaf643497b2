// fp32 projections on CPUs with AVX2 and FMA (no AVX-512 needed), on weights packed once
// into one sequential stream (cpu_linear_fp32.py).
//
// The same idea as linear_cpu.cpp's AVX512-BF16 kernel: a decode step's projection reads
// each weight once per step and uses it for only a few rows, so it is bound by streaming the
// weight from memory; read front to back, the stream keeps the hardware prefetcher ahead.
// With more rows, each group's weights (a few hundred KB at most) stay in L2 while every
// 4-row tile of the activations passes over them, and the 4 x 3 tile of sums keeps both FMA
// pipes busy: it stays ahead of oneDNN's fp32 GEMM up to prefill's thousand rows.
// The weight is stored either as fp32 or as bf16 (half the bytes to stream; each value is
// widened to fp32 in registers, a shift, and the sums are fp32 either way).
//
// Layout: the N outputs in blocks of 8 columns (one ymm), blocks in groups of up to 3. A
// group stores, for each input k, its blocks' 8 weights side by side: 3 x 32 bytes (fp32)
// or 3 x 16 bytes (bf16) per k, read in order.

// The few torch headers the kernel uses, not <torch/extension.h> (see cpu_build.py).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TTS_FP32_LINEAR 1
#else
#define TTS_FP32_LINEAR 0
#endif

namespace {

constexpr int64_t kColumns = 8;  // outputs per block: one ymm of fp32 sums
constexpr int64_t kGroup = 3;    // blocks per group: 3 x 4 rows = 12 accumulators of 16 ymm
constexpr int64_t kRowTile = 4;

int64_t group_width(int64_t blocks, int64_t first_block) { return std::min(kGroup, blocks - first_block); }

#if TTS_FP32_LINEAR

// 8 weights of one block at input k, as fp32.
template <typename W>
inline __m256 load_block(const W* w);

template <>
inline __m256 load_block<float>(const float* w) { return _mm256_loadu_ps(w); }

template <>
inline __m256 load_block<uint16_t>(const uint16_t* w) {
  // bf16 is the top half of an fp32: widen each to 32 bits and shift it up.
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// One group's outputs for ROWS rows: sums over every input. The sums are one flat array
// indexed r * GROUP + b: as sums[ROWS][GROUP] beside a w[GROUP] array, GCC 12 kept the 4 x 3
// tile (all 16 ymm registers) in registers but also stored all 12 sums to the stack on every
// input, which halved the kernel's speed on AVX2.
template <typename W, int GROUP, int ROWS>
void group_tile(const float* x, int64_t k, const W* weights, float* out, int64_t out_stride) {
  __m256 sums[ROWS * GROUP];
#pragma GCC unroll 16
  for (int j = 0; j < ROWS * GROUP; ++j) sums[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const W* w = weights + i * GROUP * kColumns;
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * k + i);
#pragma GCC unroll 3
      for (int b = 0; b < GROUP; ++b)
        sums[r * GROUP + b] = _mm256_fmadd_ps(xv, load_block<W>(w + b * kColumns), sums[r * GROUP + b]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < ROWS * GROUP; ++j)
    _mm256_storeu_ps(out + (j / GROUP) * out_stride + (j % GROUP) * kColumns, sums[j]);
}

// All rows of one group, 4 at a time: after the first 4 the group's weights come from L2.
template <typename W, int GROUP>
void group_rows(const float* x, int64_t rows, int64_t k, const W* weights, float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; r += kRowTile) {
    const float* xr = x + r * k;
    float* o = out + r * out_stride;
    switch (std::min(kRowTile, rows - r)) {
      case 4: group_tile<W, GROUP, 4>(xr, k, weights, o, out_stride); break;
      case 3: group_tile<W, GROUP, 3>(xr, k, weights, o, out_stride); break;
      case 2: group_tile<W, GROUP, 2>(xr, k, weights, o, out_stride); break;
      default: group_tile<W, GROUP, 1>(xr, k, weights, o, out_stride); break;
    }
  }
}

template <typename W>
void run(const float* x, int64_t rows, int64_t k, const W* weights, float* out, int64_t outputs) {
  const int64_t blocks = outputs / kColumns, groups = (blocks + kGroup - 1) / kGroup;
  // Threads take consecutive groups, so each still reads one stretch of the stream in order.
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * kGroup;
      const W* w = weights + first * kColumns * k;
      float* group_out = out + first * kColumns;
      switch (group_width(blocks, first)) {
        case 3: group_rows<W, 3>(x, rows, k, w, group_out, outputs); break;
        case 2: group_rows<W, 2>(x, rows, k, w, group_out, outputs); break;
        default: group_rows<W, 1>(x, rows, k, w, group_out, outputs); break;
      }
    }
  });
}

#endif

// Round to nearest even, as torch's fp32 -> bf16 conversion does (no NaNs in weights).
uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

}  // namespace

// [N, K] fp32 -> the packed stream (N * K values), fp32 or (`bf16`) bf16.
at::Tensor pack_weight(const at::Tensor& weight, bool bf16) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "expected a 2-d fp32 weight");
  TORCH_CHECK(weight.size(0) % kColumns == 0, "the weight's outputs must be a multiple of 8");
  const at::Tensor plain = weight.contiguous();
  const int64_t n = plain.size(0), k = plain.size(1), blocks = n / kColumns;
  at::Tensor packed = at::empty({n * k}, plain.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  const float* src = plain.data_ptr<float>();
  float* dst32 = bf16 ? nullptr : packed.data_ptr<float>();
  auto* dst16 = bf16 ? reinterpret_cast<uint16_t*>(packed.data_ptr<c10::BFloat16>()) : nullptr;
  int64_t at = 0;
  for (int64_t first = 0; first < blocks; first += kGroup) {
    const int64_t width = group_width(blocks, first);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t b = 0; b < width; ++b)
        for (int64_t c = 0; c < kColumns; ++c, ++at) {
          const float value = src[((first + b) * kColumns + c) * k + i];
          if (bf16) dst16[at] = to_bf16(value); else dst32[at] = value;
        }
  }
  return packed;
}

// x [rows, K] fp32 (contiguous) times the packed weight of `outputs` rows: [rows, outputs] fp32.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t outputs) {
  TORCH_CHECK(TTS_FP32_LINEAR, "built without AVX2 and FMA");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "expected contiguous 2-d fp32 activations");
  const int64_t rows = x.size(0), k = x.size(1);
  TORCH_CHECK(outputs % kColumns == 0 && packed.numel() == outputs * k,
              "activations and packed weight do not match");
  at::Tensor out = at::empty({rows, outputs}, x.options());
#if TTS_FP32_LINEAR
  if (packed.scalar_type() == at::kBFloat16)
    run(x.data_ptr<float>(), rows, k, reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>()),
        out.data_ptr<float>(), outputs);
  else
    run(x.data_ptr<float>(), rows, k, packed.data_ptr<float>(), out.data_ptr<float>(), outputs);
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_weight", &pack_weight, "A [N, K] fp32 weight as the kernel's sequential stream (fp32 or bf16)");
  m.def("linear", &linear, "fp32 activations times a packed weight");
  m.def("available", [] { return static_cast<bool>(TTS_FP32_LINEAR); },
        "Whether this build has the AVX2/FMA kernel");
}
