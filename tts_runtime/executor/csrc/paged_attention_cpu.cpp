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

template <typename T>
void attend_item(const T* query, int64_t q_token_stride, const T* k_cache, const T* v_cache,
                 const CacheView& cache, const Plan& plan, const Params& prm, int64_t item,
                 int64_t kv_head, Partials part) {
  const int32_t* it = plan.items + item * 5;
  const int64_t seq = it[0], key_lo = it[1], key_hi = it[2], row_begin = it[3], row_end = it[4];
  const int64_t D = prm.head_dim, G = prm.num_heads / prm.num_kv_heads, bs = cache.block_size;
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

  std::vector<float> q(R * D), acc(R * D, 0.0f), m(R, kNegInf), l(R, 0.0f);
  for (int64_t e = row_begin; e < row_end; ++e) {
    const int64_t token = plan.rows[e * 2];
    for (int64_t g = 0; g < G; ++g) {
      const T* src = query + token * q_token_stride + (kv_head * G + g) * D;
      float* dst = q.data() + ((e - row_begin) * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = to_float(src[d]);
    }
  }

  // One cache block at a time: keys transposed to [D, n] so a query's scores over the block
  // are D broadcast multiply-adds over a row of n keys; values as [n, D].
  std::vector<float> kt(D * bs), vb(bs * D), s(bs);
  const int32_t* table = plan.tables + seq * plan.table_width;
  for (int64_t j0 = first - first % bs; j0 < last; j0 += bs) {
    const int64_t block = table[j0 / bs];
    const int64_t a = std::max(j0, first), b = std::min(j0 + bs, last), n = b - a;
    const T* kb = k_cache + block * cache.block_stride + kv_head * cache.head_stride;
    const T* vbk = v_cache + block * cache.block_stride + kv_head * cache.head_stride;
    for (int64_t j = 0; j < n; ++j) {
      const T* kr = kb + (a - j0 + j) * cache.token_stride;
      const T* vr = vbk + (a - j0 + j) * cache.token_stride;
      for (int64_t d = 0; d < D; ++d) {
        kt[d * n + j] = to_float(kr[d]);
        vb[j * D + d] = to_float(vr[d]);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t vis_lo = std::max(lo[r], a), vis_hi = std::min(hi[r], b);
      if (vis_lo >= vis_hi) continue;
      const float* qr = q.data() + r * D;
      std::fill(s.begin(), s.begin() + n, 0.0f);
      for (int64_t d = 0; d < D; ++d) {
        const float qd = qr[d];
        const float* kd = kt.data() + d * n;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) s[j] += qd * kd[j];
      }
      float block_max = kNegInf;
      for (int64_t j = 0; j < n; ++j) {
        float x = s[j] * prm.scale;
        if (prm.softcap > 0.0f) x = prm.softcap * std::tanh(x / prm.softcap);
        const int64_t key = a + j;
        x = (key >= vis_lo && key < vis_hi) ? x : kNegInf;
        s[j] = x;
        block_max = std::max(block_max, x);
      }
      const float m_new = std::max(m[r], block_max);
      const float alpha = exp_nonpositive(m[r] - m_new);  // m[r] = -inf on the first block: 0
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < n; ++j) {
        s[j] = exp_nonpositive(s[j] - m_new);
        sum += s[j];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
      float* ar = acc.data() + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
      for (int64_t j = 0; j < n; ++j) {
        const float p = s[j];
        const float* vr = vb.data() + j * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ar[d] += p * vr[d];
      }
    }
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
    at::parallel_for(0, num_items * kvh, 1, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w)
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
