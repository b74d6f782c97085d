// MatMul weights stored transposed, [N, K] row-major, and read through a transposed view.
//
// Why: MLX's CUDA matmul takes its own GEMV kernel for a one-row product (a decode step) only
// when B is a transposed matrix; with ONNX's [K, N] weights it sets up a cuBLAS product every
// time, which costs several times a GEMV kernel's launch. Products of more rows are the same
// cuBLAS call either way.
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// Rewrites `g`'s constants in place: a float 2-D constant that only MatMul nodes read, as B (not
// a graph output, not read inside a subgraph), gets its data transposed (one copy, replacing the
// original) and `transposed` set; the engine makes it an array of the constant's own shape, a
// transposed view of that data, so the translators see no difference. Returns how many.
int transpose_matmul_weights(Graph& g, const std::vector<std::string>& graph_outputs);

// `src` ([rows, cols] of `elem` bytes each) transposed into `dst` ([cols, rows]); blocked.
void transpose_2d(const void* src, void* dst, int64_t rows, int64_t cols, size_t elem);

}  // namespace ortmlx::graph
