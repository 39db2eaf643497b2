// Paged attention for the CPU that reads K/V where they live in the block pool.
//
// The work comes as a plan (built once per forward by cpu_attention.py and shared by every
// layer): each *item* is a run of keys [key_lo, key_hi) read through one sequence's block
// table, and a list of query rows (flat token, position) that attend to those keys. An item
// is evaluated for every KV head, with the query heads of the GQA group as extra rows, and
// leaves a partial softmax (max, sum, weighted values) per (row, head). A second pass merges
// each token's partials by log-sum-exp. Shared-prefix (cascade) attention is just a plan in
// which the rows of several sequences share an item over their common blocks: the block's
// keys are converted once and used by all of them.
//
// Scores are fp32 whatever the cache dtype (fp32 or bf16); masking is per row: causal
// (key <= position) and, with a sliding window, key > position - window.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for x <= 0 without a libm call, so the loops around it vectorize. Cephes' expf
// polynomial (relative error ~1e-7); arguments below -87 (and -inf, a masked key) give 0.
inline float exp_nonpositive(float x) {
  const float xc = std::max(x, -87.0f);
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? 0.0f : p * scale;
}

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

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
};

// Partials, indexed by (entry, head): running max and sum, and the value accumulator.
struct Partials {
  float* max;
  float* sum;
  float* acc;  // [entries, heads, head_dim]
};

// Tiles: KT keys at a time (one online-softmax update per tile), computed as sub-tiles of KS
// keys (one AVX-512 register of fp32) against RB query vectors at once, so each loaded key or
// value vector feeds RB multiply-adds from registers.
constexpr int64_t KT = 64;
constexpr int64_t KS = 16;
constexpr int64_t RB = 4;

// Keys [j0, j0 + n) of one kv head as fp32, zero-padded to KT: keys sub-tile-major
// kt[sub][d][KS] (a query's scores over a sub-tile are D broadcast multiply-adds), values
// vb[key][d].
template <typename T>
void load_tile(const T* k_head, const T* v_head, const int32_t* table, const CacheView& c, int64_t j0,
               int64_t n, int64_t D, float* kt, float* vb) {
  for (int64_t j = 0; j < KT; ++j) {
    const int64_t sub = j / KS, jj = j % KS;
    if (j >= n) {
      for (int64_t d = 0; d < D; ++d) kt[(sub * D + d) * KS + jj] = 0.0f;
      std::fill(vb + j * D, vb + (j + 1) * D, 0.0f);
      continue;
    }
    const int64_t key = j0 + j;
    const int64_t off = static_cast<int64_t>(table[key / c.block_size]) * c.block_stride +
                        (key % c.block_size) * c.token_stride;
    const T* kr = k_head + off;
    const T* vr = v_head + off;
    for (int64_t d = 0; d < D; ++d) kt[(sub * D + d) * KS + jj] = to_float(kr[d]);
    for (int64_t d = 0; d < D; ++d) vb[j * D + d] = to_float(vr[d]);
  }
}

// s[r][sub * KS + jj] = q[r] . key (unscaled) for the RB (or fewer) vectors from r0.
template <int64_t ROWS>
inline void scores_block(const float* q, int64_t r0, int64_t D, const float* kts, float* s, int64_t sub) {
  float acc[ROWS][KS] = {};
  for (int64_t d = 0; d < D; ++d) {
    const float* kd = kts + d * KS;
    for (int64_t r = 0; r < ROWS; ++r) {
      const float qv = q[(r0 + r) * D + d];
#pragma omp simd
      for (int64_t jj = 0; jj < KS; ++jj) acc[r][jj] += qv * kd[jj];
    }
  }
  for (int64_t r = 0; r < ROWS; ++r)
    std::memcpy(s + (r0 + r) * KT + sub * KS, acc[r], sizeof(acc[r]));
}

// acc[r] = acc[r] * alpha[r] + sum_j p[r][j] v[j] for the vectors from r0.
template <int64_t ROWS>
inline void values_block(const float* p, const float* alpha, int64_t r0, int64_t n, int64_t D, const float* vb,
                         float* acc) {
  for (int64_t d0 = 0; d0 < D; d0 += KS) {
    float a[ROWS][KS];
    for (int64_t r = 0; r < ROWS; ++r)
#pragma omp simd
      for (int64_t jj = 0; jj < KS; ++jj) a[r][jj] = acc[(r0 + r) * D + d0 + jj] * alpha[r0 + r];
    for (int64_t j = 0; j < n; ++j) {
      const float* v = vb + j * D + d0;
      for (int64_t r = 0; r < ROWS; ++r) {
        const float pr = p[(r0 + r) * KT + j];
#pragma omp simd
        for (int64_t jj = 0; jj < KS; ++jj) a[r][jj] += pr * v[jj];
      }
    }
    for (int64_t r = 0; r < ROWS; ++r) std::memcpy(acc + (r0 + r) * D + d0, a[r], sizeof(a[r]));
  }
}

// softcap * tanh(x / softcap) through exp of a non-positive argument, so the loop vectorizes.
inline float soft_cap(float x, float cap) {
  const float y = x / cap;
  const float e = exp_nonpositive(-2.0f * std::fabs(y));
  const float t = (1.0f - e) / (1.0f + e);
  return cap * (y < 0.0f ? -t : t);
}

template <typename T>
void attend_item(const T* query, int64_t q_token_stride, const T* k_cache, const T* v_cache,
                 const CacheView& cache, const Plan& plan, const Params& prm, int64_t item,
                 int64_t kv_head, Partials part) {
  const int32_t* it = plan.items + item * 5;
  const int64_t seq = it[0], key_lo = it[1], key_hi = it[2], row_begin = it[3], row_end = it[4];
  const int64_t D = prm.head_dim, G = prm.num_heads / prm.num_kv_heads;
  const int64_t R = (row_end - row_begin) * G;  // query vectors: rows x heads of the group

  // Per query vector: its visible keys [lo, hi) within this item.
  std::vector<int64_t> lo(R), hi(R);
  int64_t first = key_hi, last = key_lo;
  for (int64_t e = row_begin; e < row_end; ++e) {
    const int64_t pos = plan.rows[e * 2 + 1];
    int64_t l = key_lo, h = std::min<int64_t>(key_hi, pos + 1);
    if (prm.window > 0) l = std::max<int64_t>(l, pos - prm.window + 1);
    for (int64_t g = 0; g < G; ++g) {
      lo[(e - row_begin) * G + g] = l;
      hi[(e - row_begin) * G + g] = h;
    }
    if (l < h) {
      first = std::min(first, l);
      last = std::max(last, h);
    }
  }

  std::vector<float> q(R * D), acc(R * D, 0.0f), m(R, kNegInf), l(R, 0.0f), alpha(R);
  for (int64_t e = row_begin; e < row_end; ++e) {
    const int64_t token = plan.rows[e * 2];
    for (int64_t g = 0; g < G; ++g) {
      const T* src = query + token * q_token_stride + (kv_head * G + g) * D;
      float* dst = q.data() + ((e - row_begin) * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = to_float(src[d]);
    }
  }

  std::vector<float> kt(KT * D), vb(KT * D), s(R * KT);
  const int32_t* table = plan.tables + seq * plan.table_width;
  const T* k_head = k_cache + kv_head * cache.head_stride;
  const T* v_head = v_cache + kv_head * cache.head_stride;
  for (int64_t j0 = first; j0 < last; j0 += KT) {
    const int64_t n = std::min(KT, last - j0), subs = (n + KS - 1) / KS;
    load_tile(k_head, v_head, table, cache, j0, n, D, kt.data(), vb.data());
    for (int64_t sub = 0; sub < subs; ++sub) {
      const float* kts = kt.data() + sub * D * KS;
      int64_t r0 = 0;
      for (; r0 + RB <= R; r0 += RB) scores_block<RB>(q.data(), r0, D, kts, s.data(), sub);
      for (; r0 < R; ++r0) scores_block<1>(q.data(), r0, D, kts, s.data(), sub);
    }
    for (int64_t r = 0; r < R; ++r) {
      float* sr = s.data() + r * KT;
      const int64_t vis_lo = lo[r] - j0, vis_hi = std::min(hi[r] - j0, n);
      float tile_max = kNegInf;
#pragma omp simd reduction(max : tile_max)
      for (int64_t j = 0; j < KT; ++j) {
        float x = sr[j] * prm.scale;
        if (prm.softcap > 0.0f) x = soft_cap(x, prm.softcap);
        x = (j >= vis_lo && j < vis_hi) ? x : kNegInf;
        sr[j] = x;
        tile_max = std::max(tile_max, x);
      }
      if (tile_max == kNegInf) {  // nothing visible here: weights 0, state unchanged
        std::fill(sr, sr + KT, 0.0f);
        alpha[r] = 1.0f;
        continue;
      }
      const float m_new = std::max(m[r], tile_max);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < KT; ++j) {
        sr[j] = exp_nonpositive(sr[j] - m_new);
        sum += sr[j];
      }
      alpha[r] = exp_nonpositive(m[r] - m_new);  // m[r] = -inf before the first tile: 0
      l[r] = l[r] * alpha[r] + sum;
      m[r] = m_new;
    }
    int64_t r0 = 0;
    for (; r0 + RB <= R; r0 += RB) values_block<RB>(s.data(), alpha.data(), r0, n, D, vb.data(), acc.data());
    for (; r0 < R; ++r0) values_block<1>(s.data(), alpha.data(), r0, n, D, vb.data(), acc.data());
  }

  for (int64_t e = row_begin; e < row_end; ++e) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = (e - row_begin) * G + g, head = kv_head * G + g;
      const int64_t slot = e * prm.num_heads + head;
      part.max[slot] = m[r];
      part.sum[slot] = l[r];
      std::memcpy(part.acc + slot * D, acc.data() + r * D, D * sizeof(float));
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
                     double softcap, int64_t window) {
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
                   static_cast<float>(softcap), window};
  TORCH_CHECK(prm.num_heads % prm.num_kv_heads == 0, "heads must be a multiple of kv heads");
  TORCH_CHECK(k_cache.size(3) == prm.head_dim, "head_dim mismatch");
  TORCH_CHECK(prm.head_dim % KS == 0, "head_dim must be a multiple of ", KS);
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
    const int64_t kvh = prm.num_kv_heads;
    // Items differ in size by orders of magnitude (a shared prompt vs one beam's suffix), so
    // each thread takes the next item when it is done (the plan lists the largest first)
    // instead of parallel_for's one fixed range per thread.
    const int64_t total = num_items * kvh;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), total), 1, [&](int64_t, int64_t) {
      for (int64_t w = next++; w < total; w = next++)
        attend_item<scalar_t>(q, query.stride(0), kc, vc, cache, plan, prm, w / kvh, w % kvh, part);
    });
    scalar_t* o = out.data_ptr<scalar_t>();
    const int32_t* pp = parts_ptr.data_ptr<int32_t>();
    const int32_t* pl = parts.data_ptr<int32_t>();
    at::parallel_for(0, num_tokens, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) merge_token<scalar_t>(t, pp, pl, prm, part, o, out.stride(0));
    });
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "Paged attention over planned items, in place in the block pool");
}
