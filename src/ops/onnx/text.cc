// TfIdfVectorizer (opset 9) over integer tokens: counts, per row of X, the occurrences of each
// n-gram of pool_int64s, then weighs them (TF, IDF or TFIDF), as ORT's CPU kernel and ONNX's
// reference do it:
//   - n-grams of every length n in [min_gram_length, max_gram_length] are counted, with the items
//     skip_distance = 1 .. max_skip_count + 1 apart: (X[i], X[i + d], .., X[i + (n-1) d]) for every
//     start i whose last item is inside the row; unigrams only once (d = 1), since a skip does
//     not change them;
//   - pool entry p adds its count to output column ngram_indexes[p];
//   - weights (one per pool entry, applied in its column) multiply the counts (TFIDF) or the
//     0/1 presence (IDF), as ORT's kernel applies them.
// On MLX: for each (n, d), the row's windows (gathered with a host-built index) compared with the
// pool's n-grams of that length and summed over the windows; the counts of all pool entries go
// to their columns through one 0/1 matrix product (exact: counts stay far below 2^24).
// String pools (pool_strings) have no MLX dtype and are declined.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

// The pool, grouped by n-gram length (only the lengths counted), as the attributes describe it.
struct Pool {
  std::map<int64_t, std::vector<std::vector<int64_t>>> grams;  // n -> its n-grams, pool order
  std::map<int64_t, int64_t> first_id;  // n -> the pool index of its first n-gram
  std::vector<int64_t> indexes;         // ngram_indexes
  int64_t out_size = 0;
  int64_t min_n = 1, max_n = 1, max_skip = 0;
};

// Parses and validates the attributes; "" or why the node cannot be run.
std::string read_pool(const graph::Node& n, Pool& p) {
  if (n.has_attr("pool_strings")) return "string pools (pool_strings) have no MLX dtype";
  if (!n.has_attr("pool_int64s")) return "pool_int64s is required";
  const auto pool = n.attr_ints("pool_int64s");
  const auto counts = n.attr_ints("ngram_counts");
  p.indexes = n.attr_ints("ngram_indexes");
  p.min_n = n.attr_int("min_gram_length", 0);
  p.max_n = n.attr_int("max_gram_length", 0);
  p.max_skip = n.attr_int("max_skip_count", 0);
  if (p.min_n < 1 || p.max_n < p.min_n) return "need 1 <= min_gram_length <= max_gram_length";
  if (p.max_skip < 0) return "negative max_skip_count";
  if (p.max_n > 64 || p.max_skip > 1024) return "n-grams this long or skips this wide";
  if (counts.empty()) return "ngram_counts is required";
  if (p.indexes.empty()) return "ngram_indexes is required";
  int64_t id = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t n_len = static_cast<int64_t>(i) + 1;
    const int64_t start = counts[i];
    const int64_t end = i + 1 < counts.size() ? counts[i + 1] : static_cast<int64_t>(pool.size());
    if (start < 0 || end < start || end > static_cast<int64_t>(pool.size()))
      return "ngram_counts do not partition pool_int64s";
    if ((end - start) % n_len != 0)
      return "the pool's " + std::to_string(n_len) + "-grams do not fill whole n-grams";
    const int64_t k = (end - start) / n_len;
    if (n_len >= p.min_n && n_len <= p.max_n && k > 0) {
      auto& g = p.grams[n_len];
      std::set<std::vector<int64_t>> seen;
      p.first_id[n_len] = id;
      for (int64_t j = 0; j < k; ++j) {
        std::vector<int64_t> gram(pool.begin() + start + j * n_len,
                                  pool.begin() + start + (j + 1) * n_len);
        // The kernels keep one id per distinct n-gram (the last one): a repeated n-gram would
        // leave its first entry's column at zero.
        if (!seen.insert(gram).second) return "a repeated n-gram in the pool";
        g.push_back(std::move(gram));
      }
    }
    id += k;
  }
  if (static_cast<int64_t>(p.indexes.size()) < id)
    return "fewer ngram_indexes than n-grams in the pool";
  for (auto v : p.indexes)
    if (v < 0) return "negative ngram_indexes";
  p.out_size = *std::max_element(p.indexes.begin(), p.indexes.end()) + 1;
  if (p.out_size > (1 << 24)) return "the output row is too large";
  // One weight per pool entry (ORT's kernel insists on as many as ngram_indexes), landing in
  // that entry's column. Two entries sharing a column would need to say whose weight applies.
  const auto w = n.attr_floats("weights");
  if (!w.empty() && w.size() != p.indexes.size())
    return "weights and ngram_indexes differ in length";
  if (!w.empty() &&
      std::set<int64_t>(p.indexes.begin(), p.indexes.end()).size() != p.indexes.size())
    return "weights with two pool entries in one output column";
  return "";
}

Support check_tfidf(const NodeQuery& q) {
  if (auto r = input_dtype_in(q, 0, {DType::Int32, DType::Int64}); !r) return r;
  const int rank = q.input_rank(0);
  if (rank == 0 || rank > 2) return Support::no("X must be 1-D or 2-D");
  const auto mode = q.node.attr_string("mode", "");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF")
    return Support::no("mode must be TF, IDF or TFIDF");
  Pool p;
  if (auto why = read_pool(q.node, p); !why.empty()) return Support::no(why);
  return Support::yes();
}

Outputs translate_tfidf(OpContext& c) {
  const auto s = c.s;
  const auto& x_in = c.in(0);
  if (x_in.ndim() != 1 && x_in.ndim() != 2) c.fail("X must be 1-D or 2-D");
  Pool p;
  if (auto why = read_pool(c.node, p); !why.empty()) c.fail(why);
  const bool one_row = x_in.ndim() == 1;
  auto x = mx::astype(one_row ? mx::reshape(x_in, {1, -1}, s) : x_in, mx::int64, s);
  const int B = x.shape(0), C = x.shape(1);
  const int P = static_cast<int>(p.indexes.size());
  // counts of every pool entry, (B, P) float32; entries of uncounted lengths stay zero
  std::vector<mx::array> parts;
  int64_t covered = 0;
  auto zeros = [&](int64_t k) { return mx::zeros({B, static_cast<int>(k)}, mx::float32, s); };
  for (const auto& [n_len, grams] : p.grams) {
    const int64_t first = p.first_id.at(n_len);
    if (first > covered) parts.push_back(zeros(first - covered));
    const int K = static_cast<int>(grams.size()), n = static_cast<int>(n_len);
    std::vector<int64_t> flat;
    for (const auto& g : grams) flat.insert(flat.end(), g.begin(), g.end());
    auto pool = mx::reshape(mx::array(flat.begin(), {K, n}, mx::int64), {1, 1, K, n}, s);
    std::optional<mx::array> count;
    const int64_t skips = n == 1 ? 1 : p.max_skip + 1;
    for (int64_t d = 1; d <= skips; ++d) {
      const int64_t W = C - (n - 1) * d;  // starts whose last item is inside the row
      if (W <= 0) break;
      std::vector<int32_t> idx(static_cast<size_t>(W * n));
      for (int64_t i = 0; i < W; ++i)
        for (int j = 0; j < n; ++j) idx[i * n + j] = static_cast<int32_t>(i + j * d);
      auto win = mx::take(x, mx::array(idx.begin(), {static_cast<int>(W), n}, mx::int32), 1, s);
      auto hit =
          mx::all(mx::equal(mx::expand_dims(win, 2, s), pool, s), -1, false, s);  // (B, W, K)
      auto cnt = mx::sum(mx::astype(hit, mx::float32, s), 1, false, s);           // (B, K)
      count = count ? mx::add(*count, cnt, s) : cnt;
    }
    parts.push_back(count ? *count : zeros(K));
    covered = first + K;
  }
  if (covered < P) parts.push_back(zeros(P - covered));
  auto counts = parts.size() == 1 ? parts[0] : mx::concatenate(parts, 1, s);  // (B, P)
  // pool entry -> output column
  std::vector<float> to_col(static_cast<size_t>(P) * p.out_size, 0.f);
  for (int i = 0; i < P; ++i) to_col[static_cast<size_t>(i) * p.out_size + p.indexes[i]] = 1.f;
  auto y = mx::matmul(counts,
                      mx::array(to_col.begin(), {P, static_cast<int>(p.out_size)}, mx::float32), s);
  const auto mode = c.node.attr_string("mode", "TF");
  const auto w = c.node.attr_floats("weights");
  std::vector<float> col_w(static_cast<size_t>(p.out_size), 0.f);  // weight of each column
  for (size_t i = 0; i < w.size(); ++i) col_w[p.indexes[i]] = w[i];
  auto weights = mx::array(col_w.begin(), {static_cast<int>(p.out_size)}, mx::float32);
  if (mode == "IDF") {
    auto present = mx::astype(mx::greater(y, mx::array(0.f), s), mx::float32, s);
    y = w.empty() ? present : mx::multiply(present, weights, s);
  } else if (mode == "TFIDF" && !w.empty()) {
    y = mx::multiply(y, weights, s);
  }
  if (one_row) y = mx::reshape(y, {static_cast<int>(p.out_size)}, s);
  return {y};
}

const OpEntry kOps[] = {
    {"", "TfIdfVectorizer", 9, kAnyOpset, check_tfidf, translate_tfidf,
     "integer tokens (pool_int64s); string pools declined; a repeated pool n-gram declined"},
};

}  // namespace

std::span<const OpEntry> text_ops() { return kOps; }

}  // namespace ortmlx::ops
