#include "graph/transpose_weights.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace ortmlx::graph {

namespace {

template <typename T>
void transpose_typed(const T* src, T* dst, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = 64;  // a block of each stays in cache
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t r1 = std::min(rows, r0 + kBlock), c1 = std::min(cols, c0 + kBlock);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
    }
}

bool float_weight(const ConstTensor* w) {
  return w && w->data && w->shape.size() == 2 && w->shape[0] > 0 && w->shape[1] > 0 &&
         (w->dtype == DType::Float16 || w->dtype == DType::BFloat16 || w->dtype == DType::Float32);
}

}  // namespace

void transpose_2d(const void* src, void* dst, int64_t rows, int64_t cols, size_t elem) {
  switch (elem) {
    case 2:
      return transpose_typed(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), rows, cols);
    case 4:
      return transpose_typed(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), rows, cols);
    case 8:
      return transpose_typed(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), rows, cols);
  }
  throw std::invalid_argument("transpose_2d: element size " + std::to_string(elem));
}

int transpose_matmul_weights(Graph& g, const std::vector<std::string>& graph_outputs) {
  // A weight qualifies only if every reader is a MatMul taking it as B.
  std::unordered_map<std::string, bool> only_as_b;
  std::unordered_set<std::string> elsewhere(graph_outputs.begin(), graph_outputs.end());
  for (const auto& n : g.nodes) {
    const bool product = n.domain.empty() && n.op_type == "MatMul" && n.inputs.size() == 2 &&
                         n.has_input(0) && !g.constant(n.inputs[0]);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!n.has_input(i)) continue;
      auto it = only_as_b.try_emplace(n.inputs[i], true).first;
      it->second = it->second && product && i == 1;
    }
    for (const auto& [attr, body] : n.subgraphs())
      for (const auto& name : outer_names(*body)) elsewhere.insert(name);
  }
  int done = 0;
  for (const auto& [name, ok] : only_as_b) {
    if (!ok || elsewhere.count(name)) continue;
    auto it = g.constants.find(name);
    if (it == g.constants.end() || it->second.transposed || !float_weight(&it->second)) continue;
    ConstTensor& w = it->second;
    auto buf = std::make_shared<std::vector<std::byte>>(w.nbytes);
    transpose_2d(w.data, buf->data(), w.shape[0], w.shape[1], dtype_size(w.dtype));
    w.data = buf->data();
    w.owned = std::move(buf);
    w.transposed = true;
    ++done;
  }
  return done;
}

}  // namespace ortmlx::graph
