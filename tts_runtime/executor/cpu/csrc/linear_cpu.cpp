// bf16 projections at the few rows of a decode step, on weights packed once into one
// sequential stream (tts_runtime/executor/cpu/cpu_linear.py).
//
// At 16 rows a projection is bound by streaming its weight from memory: each weight is
// used 16 times, and a SmolLM2 layer's 7 MB do not stay in cache between steps. oneDNN's
// blocked weight layout is read in an order the hardware prefetcher does not run ahead of,
// so its kernel waits on memory (measured alone at 16 rows: 580 us a layer with the
// weights in cache, 800 us streaming them). Here the weight is packed so that the kernel
// reads it front to back exactly once: the prefetcher keeps ahead of the arithmetic, and
// the rows' activations, which are reused, stay in L1.
//
// Layout: the N outputs in blocks of 16 columns, blocks in groups of up to 3. A group
// stores, for each pair of inputs (k, k+1), its blocks' 16x2 bf16 tiles side by side: one
// 64-byte line per block, the pair interleaving that vdpbf16ps multiplies.

// The few torch headers the kernel uses, not <torch/extension.h>: that one brings in torch's
// whole C++ API and took about 22 of a kernel's 25 s of compiling (cpu_build.py).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#define TTS_BF16_LINEAR 1
#else
#define TTS_BF16_LINEAR 0
#endif

namespace {

constexpr int64_t kColumns = 16;  // outputs per block: one zmm of fp32 sums
constexpr int64_t kGroup = 3;     // blocks per group: 3 x 8 rows = 24 accumulators
constexpr int64_t kRowTile = 8;

int64_t group_width(int64_t blocks, int64_t first_block) { return std::min(kGroup, blocks - first_block); }

#if TTS_BF16_LINEAR

// One group's outputs for ROWS rows: sums over every input pair, rounded to bf16 once.
template <int GROUP, int ROWS>
void group_tile(const uint32_t* x_pairs, int64_t x_stride, const __m512bh* weights, int64_t pairs,
                c10::BFloat16* out, int64_t out_stride) {
  __m512 sums[ROWS][GROUP];
  for (int r = 0; r < ROWS; ++r)
    for (int b = 0; b < GROUP; ++b) sums[r][b] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[GROUP];
    for (int b = 0; b < GROUP; ++b) w[b] = weights[p * GROUP + b];
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(x_pairs[r * x_stride + p]));
      for (int b = 0; b < GROUP; ++b) sums[r][b] = _mm512_dpbf16_ps(sums[r][b], x, w[b]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int b = 0; b < GROUP; ++b)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * out_stride + b * kColumns),
                          (__m256i)_mm512_cvtneps_pbh(sums[r][b]));
}

// All rows of one group, 8 at a time: after the first 8 the group's weights come from L2.
template <int GROUP>
void group_rows(const uint32_t* x_pairs, int64_t rows, int64_t pairs, const __m512bh* weights,
                c10::BFloat16* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; r += kRowTile) {
    const uint32_t* x = x_pairs + r * pairs;
    c10::BFloat16* o = out + r * out_stride;
    switch (std::min(kRowTile, rows - r)) {
      case 8: group_tile<GROUP, 8>(x, pairs, weights, pairs, o, out_stride); break;
      case 7: group_tile<GROUP, 7>(x, pairs, weights, pairs, o, out_stride); break;
      case 6: group_tile<GROUP, 6>(x, pairs, weights, pairs, o, out_stride); break;
      case 5: group_tile<GROUP, 5>(x, pairs, weights, pairs, o, out_stride); break;
      case 4: group_tile<GROUP, 4>(x, pairs, weights, pairs, o, out_stride); break;
      case 3: group_tile<GROUP, 3>(x, pairs, weights, pairs, o, out_stride); break;
      case 2: group_tile<GROUP, 2>(x, pairs, weights, pairs, o, out_stride); break;
      default: group_tile<GROUP, 1>(x, pairs, weights, pairs, o, out_stride); break;
    }
  }
}

#endif

void check_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "expected a 2-d bf16 weight");
  TORCH_CHECK(weight.size(0) % kColumns == 0 && weight.size(1) % 2 == 0,
              "the weight's outputs must be a multiple of 16 and its inputs even");
}

}  // namespace

// [N, K] -> the packed stream (N * K bf16).
at::Tensor pack_weight(const at::Tensor& weight) {
  check_weight(weight);
  const at::Tensor plain = weight.contiguous();
  const int64_t n = plain.size(0), k = plain.size(1), blocks = n / kColumns, pairs = k / 2;
  at::Tensor packed = at::empty({n * k}, plain.options());
  const c10::BFloat16* src = plain.data_ptr<c10::BFloat16>();
  c10::BFloat16* dst = packed.data_ptr<c10::BFloat16>();
  for (int64_t first = 0; first < blocks; first += kGroup) {
    const int64_t width = group_width(blocks, first);
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t b = 0; b < width; ++b)
        for (int64_t c = 0; c < kColumns; ++c) {
          const c10::BFloat16* column = src + ((first + b) * kColumns + c) * k + 2 * p;
          *dst++ = column[0];
          *dst++ = column[1];
        }
  }
  return packed;
}

// x [rows, K] bf16 (contiguous) times the packed weight of `outputs` rows: [rows, outputs] bf16.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t outputs) {
  TORCH_CHECK(TTS_BF16_LINEAR, "built without AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "expected contiguous 2-d bf16 activations");
  const int64_t rows = x.size(0), k = x.size(1), pairs = k / 2, blocks = outputs / kColumns;
  TORCH_CHECK(k % 2 == 0 && outputs % kColumns == 0 && packed.numel() == outputs * k,
              "activations and packed weight do not match");
  at::Tensor out = at::empty({rows, outputs}, x.options());
#if TTS_BF16_LINEAR
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(x.data_ptr<c10::BFloat16>());
  const auto* weights = reinterpret_cast<const __m512bh*>(packed.data_ptr<c10::BFloat16>());
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  const int64_t groups = (blocks + kGroup - 1) / kGroup;
  // Threads take consecutive groups, so each still reads one stretch of the stream in order.
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * kGroup;
      const __m512bh* w = weights + first * pairs;
      c10::BFloat16* group_out = o + first * kColumns;
      switch (group_width(blocks, first)) {
        case 3: group_rows<3>(x_pairs, rows, pairs, w, group_out, outputs); break;
        case 2: group_rows<2>(x_pairs, rows, pairs, w, group_out, outputs); break;
        default: group_rows<1>(x_pairs, rows, pairs, w, group_out, outputs); break;
      }
    }
  });
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_weight", &pack_weight, "A [N, K] bf16 weight as the kernel's sequential stream");
  m.def("linear", &linear, "bf16 activations times a packed weight");
  m.def("available", [] { return static_cast<bool>(TTS_BF16_LINEAR); },
        "Whether this build has the AVX512-BF16 kernel");
}
