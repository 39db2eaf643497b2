// Paged attention for the CPU that reads K/V where they live in the block pool.
//
// The work comes as a plan (built once per forward by cpu_attention.py and shared by every
// layer): each *item* is a run of keys [key_lo, key_hi) read through one sequence's block
// table, and a list of query rows (flat token, position) that attend to those keys. An item
// is evaluated for every KV head, with the query heads of the GQA group as extra rows, and
// leaves a partial softmax (max, sum, weighted values) per (row, head). A second pass merges
// each token's partials by log-sum-exp. Shared-prefix (cascade) attention is just a plan in
// which the rows of several sequences share an item over their common blocks: each key is
// read once for all of them.
//
// Scores are fp32 whatever the cache dtype (fp32 or bf16); masking is per row: causal
// (key <= position) and, with a sliding window, key > position - window. With a bf16 cache on
// a CPU with AVX512-BF16, `bf16_dot` takes the dot products two elements at a time
// (vdpbf16ps, fp32 accumulation): query x key products are then exact as before, and only
// the softmax weights are rounded to bf16 for the value sum (which is why that path takes
// them from a coarser exp).
//
// Lane groups of at most four query vectors (a decode row of a small GQA group, the remainder
// of a shared item's rows) fill few of a vector's lanes, so with `few_lanes` they take loops
// of their own: scores along head_dim (each key row loaded once as D / L vectors and
// multiplied with each query's row, a few keys at a time, the sums reduced across lanes at
// the end), and value sums that broadcast each weight once per key for several chunks of
// head_dim.

// The few torch headers the kernel uses, not <torch/extension.h>: that one brings in torch's
// whole C++ API and took about 22 of a kernel's 25 s of compiling (cpu_build.py).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "vector_math.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#define TTS_BF16_DOT 1
#else
#define TTS_BF16_DOT 0
#endif

#if defined(__AVX2__)
#include <immintrin.h>
#define TTS_FEW_LANES 1
#else
#define TTS_FEW_LANES 0
#endif

namespace {

using tts_vec::L, tts_vec::vfloat, tts_vec::vint, tts_vec::splat, tts_vec::exp_nonpositive;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A lane group is up to L query vectors (rows x the heads of a GQA group) held across the L
// lanes of one vector: every key is read straight from the pool and broadcast against all of
// them, so a shared prefix's keys are loaded once for every beam that reads them and nothing
// is copied or transposed (vector_math.h: L lanes).
constexpr int64_t KB = 8;   // keys per block of independent multiply-add chains
// Keys per online-softmax update, and how far ahead the next keys are prefetched: one block
// of 16 tokens. Measured on SmolLM2's beam shape with the pool out of cache (one pool per
// layer), 16 beat 32, 64 and 128.
constexpr int64_t KT = 16;
constexpr int64_t VR = 4;   // query vectors per register block of the value accumulation
constexpr int64_t KS = L;   // head_dim chunk of the value accumulation (one vector)
constexpr int64_t kMaxHeadDim = 256;
// AVX-512's lane count, which an AVX2 build's divides: every build takes the same head sizes
// (cpu_attention.py's HEAD_DIM_MULTIPLE sends the others to the torch backend).
constexpr int64_t kHeadDimMultiple = 16;
// Lane groups of up to this many lanes keep lane-major value accumulators (see
// lane_values_dot_by_dim).
constexpr int64_t kMaxLanesByLane = 8;
// Lane groups of up to this many lanes take few_lane_scores and few_lane_values.
constexpr int64_t kMaxFewLanes = 4;

// The K and V rows [from, to) of the next tile (head_dim D), into L2 (see lane_scores).
template <typename T>
inline void prefetch_rows(const T* const* knext, const T* const* vnext, int64_t from, int64_t to, int64_t D) {
  for (int64_t k = from; k < to; ++k)
    for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(knext[k]) + b, 0, 2);
      __builtin_prefetch(reinterpret_cast<const char*>(vnext[k]) + b, 0, 2);
    }
}

// softcap * tanh(x / softcap).
inline vfloat soft_cap(vfloat x, float cap) { return cap * tts_vec::tanh(x / cap); }

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

inline vfloat load_vector(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
inline vfloat load_vector(const T* p) {
  vfloat v;
  for (int64_t i = 0; i < L; ++i) v[i] = to_float(p[i]);
  return v;
}

struct CacheView {
  int64_t block_stride, token_stride, head_stride;  // elements; head_dim is contiguous
  int64_t block_size;
};

struct Plan {
  const int32_t* tables;  // [num_seqs, table_width]
  int64_t table_width;
  const int32_t* items;  // [num_items, 5]: seq, key_lo, key_hi, row_begin, row_end
  const int32_t* rows;   // [num_entries, 2]: flat token, position
};

struct Params {
  int64_t num_heads, num_kv_heads, head_dim;
  float scale, softcap;  // softcap <= 0: none
  int64_t window;        // <= 0: none
  bool bf16_dot;         // bf16 cache: dot products on AVX512-BF16 (only where compiled in)
  bool few_lanes;        // lane groups of <= kMaxFewLanes lanes: few_lane_scores and few_lane_values
  bool prefetch_next_item;  // an item's last tile prefetches the first keys of the thread's next item
};

// Partials, indexed by (entry, head): running max and sum, and the value accumulator.
struct Partials {
  float* max;
  float* sum;
  float* acc;  // [entries, heads, head_dim]
};

// out[j] = where key `from + j` sits in the pool (elements from the pool's start), j < count:
// one division per call, then a walk along the block table.
inline void row_offsets(const int32_t* table, const CacheView& c, int64_t from, int64_t count, int64_t* out) {
  int64_t block = from / c.block_size, slot = from % c.block_size;
  for (int64_t j = 0; j < count; ++j) {
    out[j] = static_cast<int64_t>(table[block]) * c.block_stride + slot * c.token_stride;
    if (++slot == c.block_size) {
      slot = 0;
      ++block;
    }
  }
}

// One lane group's queries and running softmax state over the keys it has seen.
struct LaneState {
  vfloat qt[kMaxHeadDim];          // qt[d][lane]
  float qrow[kMaxFewLanes][kMaxHeadDim];  // a group of <= kMaxFewLanes lanes' queries again, row by row
  vint lo, hi;                      // each lane's visible keys [lo, hi)
  vfloat m, l;                      // running max and sum
  vfloat acc[L * kMaxHeadDim / KS];  // lane-major [lane][d / KS][KS], or dim-major [d][lane]
#if TTS_BF16_DOT
  // bf16_dot's queries: qp[p] holds, for each lane r, the pair (q[2p][r], q[2p+1][r]) as the
  // 32-bit element r, which vdpbf16ps multiplies with a key pair broadcast to every lane.
  __m512i qp[kMaxHeadDim / 2];
#endif
};

// A key's raw dot products (one per lane) to its masked, scaled, capped scores.
inline vfloat finish_scores(const LaneState& st, vfloat dots, int64_t key, const Params& prm, bool mask) {
  vfloat x = dots * prm.scale;
  if (prm.softcap > 0.0f) x = soft_cap(x, prm.softcap);
  if (mask) {
    const vint k = vint{} + static_cast<int32_t>(key);
    x = (k >= st.lo) & (k < st.hi) ? x : splat(kNegInf);
  }
  return x;
}

// s[j][lane] = masked, scaled score of key j0 + j, for keys [j0, j0 + n8). The next tile's
// rows (knext/vnext, nnext of them) sit in other blocks of the pool: each block of KB keys
// asks for KB of them, so their loads overlap this tile's arithmetic. Asking for a whole tile
// at once, before the arithmetic, stalls on the CPU's few outstanding-miss slots instead.
// prefetch_rows asks for them into L2 (prefetcht1), which takes more requests in flight than
// L1: SmolLM2's decode layer with the pool out of cache took 0.6x the time of L1 prefetches.
template <typename T>
void lane_scores(const LaneState& st, const T* const* krows, int64_t j0, int64_t n8, int64_t D,
                 const Params& prm, bool mask, vfloat* s, const T* const* knext, const T* const* vnext,
                 int64_t nnext) {
  for (int64_t jb = 0; jb < n8; jb += KB) {
    prefetch_rows(knext, vnext, jb, std::min(jb + KB, nnext), D);
    vfloat a[KB] = {};
    for (int64_t d = 0; d < D; ++d) {
      const vfloat q = st.qt[d];
      for (int64_t k = 0; k < KB; ++k) a[k] += to_float(krows[jb + k][d]) * q;
    }
    for (int64_t k = 0; k < KB; ++k) s[jb + k] = finish_scores(st, a[k], j0 + jb + k, prm, mask);
  }
}

#if TTS_FEW_LANES
// The four lane sums of a0..a3, in that order.
inline __m128 lane_sums4(vfloat a0, vfloat a1, vfloat a2, vfloat a3) {
#if defined(__AVX512F__)
  const auto fold = [](vfloat x) {
    const __m512 v = reinterpret_cast<__m512>(x);
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  };
  const __m256 b0 = fold(a0), b1 = fold(a1), b2 = fold(a2), b3 = fold(a3);
#else
  const __m256 b0 = reinterpret_cast<__m256>(a0), b1 = reinterpret_cast<__m256>(a1);
  const __m256 b2 = reinterpret_cast<__m256>(a2), b3 = reinterpret_cast<__m256>(a3);
#endif
  // [b0 01, b1 01, b2 01, b3 01 | the same for elements 4-7] after two rounds of pairwise sums.
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Four lanes' scores in the first lanes of a vector, the rest zero (as the lane path leaves
// lanes without a query).
inline vfloat widen(__m128 x) {
#if defined(__AVX512F__)
  return reinterpret_cast<vfloat>(_mm512_zextps128_ps512(x));
#else
  return reinterpret_cast<vfloat>(_mm256_zextps128_ps256(x));
#endif
}

// lane_scores for a group of R <= 4 lanes: for KG keys at a time, each key row is loaded once
// per head_dim chunk and multiplied with the R query rows (KG x R accumulators: with R = 4,
// two keys, so that they and a key chunk fit AVX2's 16 registers), then each accumulator is
// summed across its lanes. The broadcast loop spends the same instructions per key whatever
// the lane count, so a 3-lane group (a decode row of SmolLM2's 3-query GQA group) used 3 of
// AVX2's 8 lanes, 3 of AVX-512's 16.
template <int R, typename T>
void few_lane_scores(const LaneState& st, const T* const* krows, int64_t j0, int64_t n8, int64_t D,
                     const Params& prm, bool mask, vfloat* s, const T* const* knext, const T* const* vnext,
                     int64_t nnext) {
  static_assert(R >= 1 && R <= kMaxFewLanes, "few_lane_scores takes 1 to 4 lanes");
  constexpr int KG = R <= 3 ? 4 : 2;
  static_assert(KB % KG == 0, "key groups tile a block");
  for (int64_t jb = 0; jb < n8; jb += KB) {
    prefetch_rows(knext, vnext, jb, std::min(jb + KB, nnext), D);
    for (int64_t k0 = jb; k0 < jb + KB; k0 += KG) {
      vfloat a[KG][R] = {};
      for (int64_t c = 0; c < D; c += L) {
        for (int k = 0; k < KG; ++k) {
          const vfloat key = load_vector(krows[k0 + k] + c);
          for (int r = 0; r < R; ++r) a[k][r] += key * load_vector(st.qrow[r] + c);
        }
      }
      __m128 by_key[KG];
      if constexpr (KG == 4) {
        __m128 rows[4];  // rows[r]: lane r's scores of the four keys
        for (int r = 0; r < 4; ++r) rows[r] = r < R ? lane_sums4(a[0][r], a[1][r], a[2][r], a[3][r]) : _mm_setzero_ps();
        _MM_TRANSPOSE4_PS(rows[0], rows[1], rows[2], rows[3]);
        for (int k = 0; k < 4; ++k) by_key[k] = rows[k];
      } else {
        // [key 0, key 1] of lanes 0 and 1, then of lanes 2 and 3.
        const __m128 x0 = lane_sums4(a[0][0], a[1][0], a[0][1], a[1][1]);
        const __m128 x1 = lane_sums4(a[0][2], a[1][2], a[0][3], a[1][3]);
        by_key[0] = _mm_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
        by_key[1] = _mm_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
      }
      for (int k = 0; k < KG; ++k) s[k0 + k] = finish_scores(st, widen(by_key[k]), j0 + k0 + k, prm, mask);
    }
  }
}

// few_lane_scores for `lanes` lanes.
template <typename T>
void few_lane_scores(int64_t lanes, const LaneState& st, const T* const* krows, int64_t j0, int64_t n8, int64_t D,
                     const Params& prm, bool mask, vfloat* s, const T* const* knext, const T* const* vnext,
                     int64_t nnext) {
  switch (lanes) {
    case 1: return few_lane_scores<1>(st, krows, j0, n8, D, prm, mask, s, knext, vnext, nnext);
    case 2: return few_lane_scores<2>(st, krows, j0, n8, D, prm, mask, s, knext, vnext, nnext);
    case 3: return few_lane_scores<3>(st, krows, j0, n8, D, prm, mask, s, knext, vnext, nnext);
    default: return few_lane_scores<4>(st, krows, j0, n8, D, prm, mask, s, knext, vnext, nnext);
  }
}
#endif

// lane_values for R <= 4 lanes over head_dim chunks [c_begin, c_end), CH chunks at a time:
// each key's R weights are broadcast once for CH chunks (R x CH accumulators; lane_values
// broadcasts them again for every chunk, for 4 lanes whatever the group holds).
template <int R, int CH, typename T>
void few_lane_values(LaneState& st, const T* const* vrows, int64_t n8, int64_t chunks, int64_t c_begin,
                     int64_t c_end, const vfloat* s, vfloat alpha) {
  for (int64_t c0 = c_begin; c0 + CH <= c_end; c0 += CH) {
    vfloat a[R][CH];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CH; ++c) a[r][c] = st.acc[r * chunks + c0 + c] * alpha[r];
    for (int64_t j = 0; j < n8; ++j) {
      vfloat w[R];
      for (int r = 0; r < R; ++r) w[r] = splat(s[j][r]);
      for (int c = 0; c < CH; ++c) {
        const vfloat v = load_vector(vrows[j] + (c0 + c) * KS);
        for (int r = 0; r < R; ++r) a[r][c] += w[r] * v;
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CH; ++c) st.acc[r * chunks + c0 + c] = a[r][c];
  }
}

// few_lane_values over all of head_dim: four chunks at a time (two with 4 lanes, so that the
// accumulators, weights and a value vector fit AVX2's 16 registers), the rest one by one.
template <int R, typename T>
void few_lane_values(LaneState& st, const T* const* vrows, int64_t n8, int64_t D, const vfloat* s, vfloat alpha) {
  constexpr int CH = R <= 3 ? 4 : 2;
  const int64_t chunks = D / KS, grouped = chunks / CH * CH;
  few_lane_values<R, CH>(st, vrows, n8, chunks, 0, grouped, s, alpha);
  few_lane_values<R, 1>(st, vrows, n8, chunks, grouped, chunks, s, alpha);
}

template <typename T>
void few_lane_values(int64_t lanes, LaneState& st, const T* const* vrows, int64_t n8, int64_t D, const vfloat* s,
                     vfloat alpha) {
  switch (lanes) {
    case 1: return few_lane_values<1>(st, vrows, n8, D, s, alpha);
    case 2: return few_lane_values<2>(st, vrows, n8, D, s, alpha);
    case 3: return few_lane_values<3>(st, vrows, n8, D, s, alpha);
    default: return few_lane_values<4>(st, vrows, n8, D, s, alpha);
  }
}

// Scores to weights (in place), and the running max and sum; returns how much each lane's
// earlier accumulator shrinks. `coarse_exp` where the weights are rounded to bf16 next: the
// exact exp took about a seventh of a bf16 decode layer's time.
template <bool coarse_exp>
inline vfloat lane_softmax(LaneState& st, int64_t n8, vfloat* s) {
  const auto exp = [](vfloat x) {
    return coarse_exp ? tts_vec::exp_nonpositive_coarse(x) : exp_nonpositive(x);
  };
  vfloat tile_max = splat(kNegInf), sum = {};
  for (int64_t j = 0; j < n8; ++j) tile_max = s[j] > tile_max ? s[j] : tile_max;
  const vfloat m_new = st.m > tile_max ? st.m : tile_max;
  // A lane that has seen no visible key yet keeps weight 0 and its (empty) state.
  const vint none = m_new == kNegInf;
  const vfloat base = none ? vfloat{} : m_new;
  const vfloat alpha = none ? splat(1.0f) : exp(st.m - base);
  for (int64_t j = 0; j < n8; ++j) {
    s[j] = exp(s[j] - base);
    sum += s[j];
  }
  st.l = st.l * alpha + sum;
  st.m = m_new;
  return alpha;
}

// acc[lane] = acc[lane] * alpha[lane] + sum_j s[j][lane] v_j for the first `lanes` lanes.
template <typename T>
void lane_values(LaneState& st, const T* const* vrows, int64_t n8, int64_t D, int64_t lanes, const vfloat* s,
                 vfloat alpha) {
  const int64_t chunks = D / KS;
  for (int64_t r0 = 0; r0 < lanes; r0 += VR) {
    for (int64_t c = 0; c < chunks; ++c) {
      vfloat a[VR];
      for (int64_t r = 0; r < VR; ++r) a[r] = st.acc[(r0 + r) * chunks + c] * alpha[r0 + r];
      for (int64_t j = 0; j < n8; ++j) {
        const vfloat v = load_vector(vrows[j] + c * KS);
        for (int64_t r = 0; r < VR; ++r) a[r] += s[j][r0 + r] * v;
      }
      for (int64_t r = 0; r < VR; ++r) st.acc[(r0 + r) * chunks + c] = a[r];
    }
  }
}

#if TTS_BF16_DOT
// Value accumulators held in registers per pass over a tile's weights (dim-major).
constexpr int64_t DB = 8;

inline uint16_t bf16_bits(c10::BFloat16 x) { return x.x; }

inline __m512i broadcast_pair(const c10::BFloat16* p) {
  int32_t pair;
  std::memcpy(&pair, p, sizeof(pair));
  return _mm512_set1_epi32(pair);
}

// lane_scores with the query x key dot products on vdpbf16ps: one instruction per two
// elements of head_dim for all 16 lanes, instead of a convert, a broadcast and a multiply-add
// per element.
void lane_scores_dot(const LaneState& st, const c10::BFloat16* const* krows, int64_t j0, int64_t n8, int64_t D,
                     const Params& prm, bool mask, vfloat* s, const c10::BFloat16* const* knext,
                     const c10::BFloat16* const* vnext, int64_t nnext) {
  for (int64_t jb = 0; jb < n8; jb += KB) {
    prefetch_rows(knext, vnext, jb, std::min(jb + KB, nnext), D);
    __m512 a[KB];
    for (int64_t k = 0; k < KB; ++k) a[k] = _mm512_setzero_ps();
    for (int64_t p = 0; p < D / 2; ++p) {
      const __m512bh q = reinterpret_cast<__m512bh>(st.qp[p]);
      for (int64_t k = 0; k < KB; ++k)
        a[k] = _mm512_dpbf16_ps(a[k], q, reinterpret_cast<__m512bh>(broadcast_pair(krows[jb + k] + 2 * p)));
    }
    for (int64_t k = 0; k < KB; ++k)
      s[jb + k] = finish_scores(st, reinterpret_cast<vfloat>(a[k]), j0 + jb + k, prm, mask);
  }
}

// lane_values on vdpbf16ps for a few lanes, lane-major accumulators (acc[lane][d / KS]), two
// keys at a time: the weights of keys j and j + 1 are rounded to bf16 and paired per lane, and
// the two value rows are interleaved (unpack within each 128-bit block) for every VR lanes. The unpack leaves head_dim permuted inside each 32-wide chunk: acc chunk
// 2c holds dims 32c + 8b + i and chunk 2c + 1 dims 32c + 8b + 4 + i at element 4b + i (block
// b, i < 4); unpermute_acc restores the order. n8 is even; D a multiple of 32.
void lane_values_dot_by_lane(LaneState& st, const c10::BFloat16* const* vrows, int64_t n8, int64_t D, int64_t lanes,
                     const vfloat* s, vfloat alpha) {
  const int64_t chunks = D / KS;
  alignas(64) int32_t w[KT / 2][L];  // w[pair][lane]: bf16 weights of keys 2 pair and 2 pair + 1
  for (int64_t j = 0; j < n8; j += 2) {
    const __m512i lo = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(reinterpret_cast<__m512>(s[j]))));
    const __m512i hi = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(reinterpret_cast<__m512>(s[j + 1]))));
    _mm512_store_si512(w[j / 2], _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
  for (int64_t r0 = 0; r0 < lanes; r0 += VR) {
    for (int64_t c = 0; c < chunks; c += 2) {
      __m512 a[VR][2];
      for (int64_t r = 0; r < VR; ++r)
        for (int64_t h = 0; h < 2; ++h)
          a[r][h] = reinterpret_cast<__m512>(st.acc[(r0 + r) * chunks + c + h] * alpha[r0 + r]);
      for (int64_t j = 0; j < n8; j += 2) {
        const __m512i v0 = _mm512_loadu_si512(vrows[j] + c * KS), v1 = _mm512_loadu_si512(vrows[j + 1] + c * KS);
        const __m512bh vlo = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(v0, v1));
        const __m512bh vhi = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(v0, v1));
        for (int64_t r = 0; r < VR; ++r) {
          const __m512bh wr = reinterpret_cast<__m512bh>(_mm512_set1_epi32(w[j / 2][r0 + r]));
          a[r][0] = _mm512_dpbf16_ps(a[r][0], wr, vlo);
          a[r][1] = _mm512_dpbf16_ps(a[r][1], wr, vhi);
        }
      }
      for (int64_t r = 0; r < VR; ++r)
        for (int64_t h = 0; h < 2; ++h) st.acc[(r0 + r) * chunks + c + h] = reinterpret_cast<vfloat>(a[r][h]);
    }
  }
}

// Lane r's accumulator from lane_values_dot's order to head_dim order.
void unpermute_acc(const vfloat* acc, int64_t D, float* out) {
  for (int64_t c = 0; c < D / 32; ++c)
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t i = 0; i < 4; ++i) {
        out[32 * c + 8 * b + i] = acc[2 * c][4 * b + i];
        out[32 * c + 8 * b + 4 + i] = acc[2 * c + 1][4 * b + i];
      }
}
// lane_values on vdpbf16ps for many lanes, dim-major accumulators (acc[d][lane]): the weights
// are paired as in lane_values_dot_by_lane, and the value rows are interleaved once per tile
// into pairs (v_j[d], v_j+1[d]) that are broadcast against every lane's weights. On a prefill
// chunk's 16 lanes this took 0.87x the time of the lane-major sum; on a beam's 3 (one decode
// row of a 3-query GQA group), 4x: whichever suits the lane count runs. n8 is even; D a
// multiple of 32.
void lane_values_dot_by_dim(LaneState& st, const c10::BFloat16* const* vrows, int64_t n8, int64_t D, const vfloat* s,
                     vfloat alpha) {
  alignas(64) int32_t vpairs[KT / 2][kMaxHeadDim];
  __m512i w[KT / 2];  // w[pair]: per lane, the bf16 weights of keys 2 pair and 2 pair + 1
  const __m512i first_half = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                              39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i second_half = _mm512_add_epi16(first_half, _mm512_set1_epi16(16));
  for (int64_t j = 0; j < n8; j += 2) {
    const __m512i lo = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(reinterpret_cast<__m512>(s[j]))));
    const __m512i hi = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(reinterpret_cast<__m512>(s[j + 1]))));
    w[j / 2] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    for (int64_t c = 0; c < D; c += 32) {
      const __m512i v0 = _mm512_loadu_si512(vrows[j] + c), v1 = _mm512_loadu_si512(vrows[j + 1] + c);
      _mm512_store_si512(vpairs[j / 2] + c, _mm512_permutex2var_epi16(v0, first_half, v1));
      _mm512_store_si512(vpairs[j / 2] + c + 16, _mm512_permutex2var_epi16(v0, second_half, v1));
    }
  }
  for (int64_t d0 = 0; d0 < D; d0 += DB) {
    __m512 a[DB];
    for (int64_t i = 0; i < DB; ++i) a[i] = reinterpret_cast<__m512>(st.acc[d0 + i] * alpha);
    for (int64_t p = 0; p < n8 / 2; ++p) {
      const __m512bh wp = reinterpret_cast<__m512bh>(w[p]);
      for (int64_t i = 0; i < DB; ++i)
        a[i] = _mm512_dpbf16_ps(a[i], wp, reinterpret_cast<__m512bh>(_mm512_set1_epi32(vpairs[p][d0 + i])));
    }
    for (int64_t i = 0; i < DB; ++i) st.acc[d0 + i] = reinterpret_cast<vfloat>(a[i]);
  }
}
#endif

template <typename T>
constexpr bool is_bf16 = std::is_same_v<T, c10::BFloat16>;

// Whether this item's dot products run on vdpbf16ps (a bf16 cache, the switch on, compiled in).
template <typename T>
inline bool use_dot(const Params& prm) {
  return TTS_BF16_DOT && is_bf16<T> && prm.bf16_dot;
}

// The keys a lane group sees: [first, last) by any lane, [all_lo, all_hi) by every lane (a
// tile inside it needs no mask).
struct LaneRange {
  int64_t first, last, all_lo, all_hi;
};

// Lane group [v0, v0 + lanes) of an item, for every kv head: queries, each lane's visible keys
// and empty softmax states.
template <typename T>
LaneRange start_lanes(std::vector<LaneState>& states, const T* query, int64_t q_token_stride, const Plan& plan,
                      const Params& prm, const int32_t* it, int64_t v0, int64_t lanes) {
  const int64_t key_lo = it[1], key_hi = it[2], row_begin = it[3];
  const int64_t D = prm.head_dim, G = prm.num_heads / prm.num_kv_heads;
  int64_t first = key_hi, last = key_lo, all_lo = key_lo, all_hi = key_hi;
  for (int64_t h = 0; h < prm.num_kv_heads; ++h) {
    LaneState& st = states[h];
    std::fill(st.qt, st.qt + D, vfloat{});
    std::fill(st.acc, st.acc + L * (D / KS), vfloat{});
    st.lo = st.hi = vint{};
    st.m = splat(kNegInf);
    st.l = vfloat{};
#if TTS_BF16_DOT
    if (use_dot<T>(prm)) std::fill(st.qp, st.qp + D / 2, _mm512_setzero_si512());
#endif
  }
  // Lane r is query vector v0 + r: row entry (v0 + r) / G, head (v0 + r) % G of the group.
  for (int64_t r = 0; r < lanes; ++r) {
    const int64_t e = row_begin + (v0 + r) / G, g = (v0 + r) % G;
    const int64_t pos = plan.rows[e * 2 + 1];
    int64_t lo = key_lo, hi = std::min<int64_t>(key_hi, pos + 1);
    if (prm.window > 0) lo = std::max<int64_t>(lo, pos - prm.window + 1);
    const bool visible = lo < hi;
    all_lo = std::max(all_lo, lo);
    all_hi = std::min(all_hi, hi);
    if (visible) {
      first = std::min(first, lo);
      last = std::max(last, hi);
    }
    for (int64_t h = 0; h < prm.num_kv_heads; ++h) {
      LaneState& st = states[h];
      if (visible) {
        st.lo[r] = static_cast<int32_t>(lo);
        st.hi[r] = static_cast<int32_t>(hi);
      }
      const T* src = query + plan.rows[e * 2] * q_token_stride + (h * G + g) * D;
#if TTS_BF16_DOT
      if constexpr (is_bf16<T>) {
        if (prm.bf16_dot) {
          uint16_t* pairs = reinterpret_cast<uint16_t*>(st.qp);
          for (int64_t d = 0; d < D; ++d) pairs[(d / 2) * 2 * L + 2 * r + d % 2] = bf16_bits(src[d]);
          continue;
        }
      }
#endif
      for (int64_t d = 0; d < D; ++d) st.qt[d][r] = to_float(src[d]);
      if (lanes <= kMaxFewLanes)  // only few_lane_scores reads them
        for (int64_t d = 0; d < D; ++d) st.qrow[r][d] = to_float(src[d]);
    }
  }
  return {first, last, all_lo, all_hi};
}

// One item for every kv head: a tile of keys is visited by all heads in turn while its rows
// (all heads of a token sit together in the pool) are in cache.
template <typename T>
void attend_item(const T* query, int64_t q_token_stride, const T* k_cache, const T* v_cache,
                 const CacheView& cache, const Plan& plan, const Params& prm, int64_t item, int64_t next_item,
                 std::vector<LaneState>& states, Partials part) {
  const int32_t* it = plan.items + item * 5;
  const int64_t seq = it[0], row_begin = it[3], row_end = it[4];
  const int64_t D = prm.head_dim, G = prm.num_heads / prm.num_kv_heads, chunks = D / KS;
  const int64_t R = (row_end - row_begin) * G;  // query vectors per kv head: rows x heads of the group
  const int32_t* table = plan.tables + seq * plan.table_width;

  vfloat s[KT];
  int64_t offsets[KT];
  const T* krows[KT];
  const T* vrows[KT];
  int64_t noffsets[KT];
  const T* knext[KT];
  const T* vnext[KT];
  for (int64_t v0 = 0; v0 < R; v0 += L) {
    const int64_t lanes = std::min(L, R - v0);
    const LaneRange range = start_lanes(states, query, q_token_stride, plan, prm, it, v0, lanes);
    const bool dim_major = use_dot<T>(prm) && lanes > kMaxLanesByLane;
    const bool few_lanes = TTS_FEW_LANES && prm.few_lanes && lanes <= kMaxFewLanes;
    const int64_t first = range.first, last = range.last;
    if (first < last) row_offsets(table, cache, first, std::min(KT, last - first), noffsets);
    for (int64_t j0 = first; j0 < last; j0 += KT) {
      const int64_t n = std::min(KT, last - j0), n8 = (n + KB - 1) / KB * KB;
      std::copy(noffsets, noffsets + n, offsets);
      std::fill(offsets + n, offsets + n8, offsets[0]);  // past the last key: any valid row, masked out
      const bool mask = j0 < range.all_lo || j0 + n8 > range.all_hi;
      int64_t nnext = std::max<int64_t>(0, std::min(j0 + 2 * KT, last) - (j0 + KT));
      row_offsets(table, cache, j0 + KT, nnext, noffsets);
      if (prm.prefetch_next_item && j0 + KT >= last && v0 + L >= R && next_item >= 0) {
        // The item's last tile: the next item's first keys instead, so that a beam's short
        // suffix does not start on keys that are still in memory.
        const int32_t* nit = plan.items + next_item * 5;
        nnext = std::min<int64_t>(KT, nit[2] - nit[1]);
        row_offsets(plan.tables + nit[0] * plan.table_width, cache, nit[1], nnext, noffsets);
      }
      for (int64_t h = 0; h < prm.num_kv_heads; ++h) {
        for (int64_t j = 0; j < n8; ++j) {
          krows[j] = k_cache + offsets[j] + h * cache.head_stride;
          vrows[j] = v_cache + offsets[j] + h * cache.head_stride;
        }
        for (int64_t j = 0; j < nnext; ++j) {
          knext[j] = k_cache + noffsets[j] + h * cache.head_stride;
          vnext[j] = v_cache + noffsets[j] + h * cache.head_stride;
        }
#if TTS_BF16_DOT
        if constexpr (is_bf16<T>) {
          if (prm.bf16_dot) {
            lane_scores_dot(states[h], krows, j0, n8, D, prm, mask, s, knext, vnext, nnext);
            const vfloat alpha = lane_softmax<true>(states[h], n8, s);
            if (dim_major)
              lane_values_dot_by_dim(states[h], vrows, n8, D, s, alpha);
            else
              lane_values_dot_by_lane(states[h], vrows, n8, D, lanes, s, alpha);
            continue;
          }
        }
#endif
#if TTS_FEW_LANES
        if (few_lanes) {
          few_lane_scores(lanes, states[h], krows, j0, n8, D, prm, mask, s, knext, vnext, nnext);
          few_lane_values(lanes, states[h], vrows, n8, D, s, lane_softmax<false>(states[h], n8, s));
          continue;
        }
#endif
        lane_scores(states[h], krows, j0, n8, D, prm, mask, s, knext, vnext, nnext);
        const vfloat alpha = lane_softmax<false>(states[h], n8, s);
        lane_values(states[h], vrows, n8, D, lanes, s, alpha);
      }
    }
    for (int64_t h = 0; h < prm.num_kv_heads; ++h)
      for (int64_t r = 0; r < lanes; ++r) {
        const int64_t e = row_begin + (v0 + r) / G, head = h * G + (v0 + r) % G;
        const int64_t slot = e * prm.num_heads + head;
        part.max[slot] = states[h].m[r];
        part.sum[slot] = states[h].l[r];
        if (dim_major) {
          for (int64_t d = 0; d < D; ++d) part.acc[slot * D + d] = states[h].acc[d][r];
          continue;
        }
#if TTS_BF16_DOT
        if (use_dot<T>(prm)) {
          unpermute_acc(states[h].acc + r * chunks, D, part.acc + slot * D);
          continue;
        }
#endif
        std::memcpy(part.acc + slot * D, states[h].acc + r * chunks, D * sizeof(float));
      }
  }
}

template <typename T>
void merge_token(int64_t token, const int32_t* parts_ptr, const int32_t* parts, const Params& prm,
                 const Partials& part, T* out, int64_t out_token_stride) {
  const int64_t D = prm.head_dim;
  std::vector<float> o(D);
  for (int64_t h = 0; h < prm.num_heads; ++h) {
    float m = kNegInf;
    for (int32_t i = parts_ptr[token]; i < parts_ptr[token + 1]; ++i)
      m = std::max(m, part.max[parts[i] * prm.num_heads + h]);
    std::fill(o.begin(), o.end(), 0.0f);
    float l = 0.0f;
    for (int32_t i = parts_ptr[token]; i < parts_ptr[token + 1]; ++i) {
      const int64_t slot = parts[i] * prm.num_heads + h;
      const float w = exp_nonpositive(part.max[slot] - m);
      if (w == 0.0f) continue;
      l += w * part.sum[slot];
      const float* a = part.acc + slot * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] += w * a[d];
    }
    T* dst = out + token * out_token_stride + h * D;
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(o[d] * inv);
  }
}

// The paired value sum takes head_dim in 32-wide chunks.
bool dot_shape_ok(const at::Tensor& query) { return query.size(2) % 32 == 0; }

CacheView cache_view(const at::Tensor& cache) {
  TORCH_CHECK(cache.dim() == 4 && cache.stride(3) == 1, "cache must be [blocks, block_size, kv_heads, head_dim] "
              "with a contiguous head_dim");
  return {cache.stride(0), cache.stride(1), cache.stride(2), cache.size(1)};
}

}  // namespace

// query [T, H, D] (head and head_dim contiguous); k_cache/v_cache [N, bs, Hkv, D], any block
// and token strides (the elastic pool's block-major views); out like query. tables [S, W]
// int32; items [I, 5] int32; rows [E, 2] int32; parts_ptr [T + 1] and parts [E] int32: for
// each flat token, the row entries whose partials make its output.
void paged_attention(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& tables, const at::Tensor& items, const at::Tensor& rows,
                     const at::Tensor& parts_ptr, const at::Tensor& parts, at::Tensor& out, double scale,
                     double softcap, int64_t window, bool bf16_dot, bool few_lanes, bool prefetch_next_item) {
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1 && query.stride(1) == query.size(2),
              "query must be [tokens, heads, head_dim] with contiguous heads");
  TORCH_CHECK(out.sizes() == query.sizes() && out.stride(2) == 1 && out.stride(1) == out.size(2),
              "out must match query");
  TORCH_CHECK(k_cache.scalar_type() == query.scalar_type() && v_cache.scalar_type() == query.scalar_type(),
              "query and caches must share a dtype");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes(),
              "k_cache and v_cache must share a layout");
  for (const at::Tensor* t : {&tables, &items, &rows, &parts_ptr, &parts})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous(), "plan tensors must be contiguous int32");
  const CacheView cache = cache_view(k_cache);
  const Params prm{query.size(1), k_cache.size(2), query.size(2), static_cast<float>(scale),
                   static_cast<float>(softcap), window, bf16_dot && TTS_BF16_DOT && dot_shape_ok(query),
                   few_lanes && TTS_FEW_LANES, prefetch_next_item};
  TORCH_CHECK(prm.num_heads % prm.num_kv_heads == 0, "heads must be a multiple of kv heads");
  TORCH_CHECK(k_cache.size(3) == prm.head_dim, "head_dim mismatch");
  TORCH_CHECK(prm.head_dim % kHeadDimMultiple == 0 && prm.head_dim <= kMaxHeadDim,
              "head_dim must be a multiple of ", kHeadDimMultiple,
              " and at most ", kMaxHeadDim);
  const Plan plan{tables.data_ptr<int32_t>(), tables.size(1), items.data_ptr<int32_t>(), rows.data_ptr<int32_t>()};
  const int64_t num_items = items.size(0), num_entries = rows.size(0), num_tokens = query.size(0);

  auto fopts = query.options().dtype(at::kFloat);
  at::Tensor pmax = at::empty({num_entries, prm.num_heads}, fopts);
  at::Tensor psum = at::empty({num_entries, prm.num_heads}, fopts);
  at::Tensor pacc = at::empty({num_entries, prm.num_heads, prm.head_dim}, fopts);
  const Partials part{pmax.data_ptr<float>(), psum.data_ptr<float>(), pacc.data_ptr<float>()};

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* kc = k_cache.data_ptr<scalar_t>();
    const scalar_t* vc = v_cache.data_ptr<scalar_t>();
    // Items differ in size by orders of magnitude (a shared prompt vs one beam's suffix), so
    // each thread takes the next item when it is done (the plan lists the largest first)
    // instead of parallel_for's one fixed range per thread.
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_items), 1, [&](int64_t, int64_t) {
      std::vector<LaneState> states(prm.num_kv_heads);
      // Each thread claims its next item one ahead, to prefetch its first keys.
      for (int64_t w = next++; w < num_items;) {
        const int64_t after = next++;
        attend_item<scalar_t>(q, query.stride(0), kc, vc, cache, plan, prm, w, after < num_items ? after : -1,
                              states, part);
        w = after;
      }
    });
    scalar_t* o = out.data_ptr<scalar_t>();
    const int32_t* pp = parts_ptr.data_ptr<int32_t>();
    const int32_t* pl = parts.data_ptr<int32_t>();
    at::parallel_for(0, num_tokens, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) merge_token<scalar_t>(t, pp, pl, prm, part, o, out.stride(0));
    });
  });
}

// key/value [T, Hkv, D] (each token's heads contiguous) into the pools' slots (slot = block *
// block_size + offset; any block stride), one copy per token and pool: torch's index_copy_
// took 20-80 us a layer for a decode step or a PRM chunk, a whole forward's worth of copies.
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slots) {
  const CacheView cache = cache_view(k_cache);
  const int64_t heads = k_cache.size(2), dim = k_cache.size(3), tokens = key.size(0);
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes(),
              "k_cache and v_cache must share a layout");
  TORCH_CHECK(cache.head_stride == dim, "the pool must hold each token's heads contiguously");
  for (const at::Tensor* t : {&key, &value}) {
    TORCH_CHECK(t->scalar_type() == k_cache.scalar_type(), "new K/V and the pool must share a dtype");
    TORCH_CHECK(t->dim() == 3 && t->size(0) == tokens && t->size(1) == heads && t->size(2) == dim &&
                t->stride(2) == 1 && t->stride(1) == dim, "new K/V must be [tokens, kv_heads, head_dim] "
                "with each token's heads contiguous");
  }
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == tokens,
              "slots must be one contiguous int64 per token");
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t bytes = heads * dim * key.element_size(), capacity = k_cache.size(0) * cache.block_size;
  auto* k_out = static_cast<char*>(k_cache.data_ptr());
  auto* v_out = static_cast<char*>(v_cache.data_ptr());
  const auto* k_in = static_cast<const char*>(key.data_ptr());
  const auto* v_in = static_cast<const char*>(value.data_ptr());
  const int64_t size = key.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < capacity, "slot ", slot[t], " is outside the pool");
    const int64_t at = ((slot[t] / cache.block_size) * cache.block_stride + (slot[t] % cache.block_size) *
                        cache.token_stride) * size;
    std::memcpy(k_out + at, k_in + t * key.stride(0) * size, bytes);
    std::memcpy(v_out + at, v_in + t * value.stride(0) * size, bytes);
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "Paged attention over planned items, in place in the block pool");
  m.def("store_kv", &store_kv, "New tokens' K and V into their slots of the block pools");
  m.def("bf16_dot_available", [] { return static_cast<bool>(TTS_BF16_DOT); },
        "Whether this build takes bf16 dot products on AVX512-BF16");
}
