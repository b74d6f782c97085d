// Sibling products as one: MatMul (or MatMulNBits) nodes that multiply the same input by
// constant weights become one product with the weights concatenated along N, and a Split that
// hands each node its columns.
//
// Why: a decoder layer's gate and up projections (and the q, k, v projections of exporters that
// keep them apart) read the same activations; on a GPU a decode step is bound by its count of
// kernels, and one wider product costs what one of them does.
#pragma once

#include "graph/view.h"

namespace ortmlx::graph {

// Rewrites `g` in place (its nodes stay in topological order and are renumbered); the fused
// weights are new owned constants, the originals are left unread. Returns how many groups were
// fused. Groups: MatMul nodes with a float constant 2-D weight of one dtype and K; MatMulNBits
// nodes with equal attributes (K, bits, block_size, accuracy_level) whose constant inputs are
// laid out by N (no g_idx). Control-flow bodies are left as they are.
int fuse_sibling_matmuls(Graph& g);

}  // namespace ortmlx::graph
