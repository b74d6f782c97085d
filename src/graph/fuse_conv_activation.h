// The elementwise activation after a Conv as part of the Conv: the Conv node takes over the last
// activation node's output and lists the steps in two attributes (kConvActivation: the kinds,
// kConvActivationParams: two floats a step), and the activation nodes go.
//
// Why: on MLX's CPU device a convolution runs through oneDNN, which applies such steps to each
// output block while it is still in cache (post-ops); as nodes of their own they are one more
// pass over the activations each (single-threaded in MLX's CPU backend) and one more primitive
// to schedule a run, which dominates small convolutional models (mobile OCR, SE blocks).
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

// The attributes a fused Conv carries (internal names: ONNX attributes never start with '_').
inline constexpr const char* kConvActivation = "_ortmlx_activation";
inline constexpr const char* kConvActivationParams = "_ortmlx_activation_params";
// Set (1) on a Conv with a fused residual Add when its output may be written over the residual's
// buffer: the residual is produced by a node of the graph, is not one of its outputs, and every
// other node reading it is a Conv that the fused Conv depends on (so it has read the residual
// before, in any order that runs the graph's nodes after their inputs), and a Conv's output
// never shares its input's buffer.
inline constexpr const char* kConvResidualFree = "_ortmlx_residual_free";
// Set (1) on every Conv of a graph whose convolutions can all keep their channels in blocks of 16
// (mark_blocked16_convs).
inline constexpr const char* kConvBlocked16 = "_ortmlx_blocked16";
// Set (1) on a channel Concat of such a graph whose every input is a Conv's output (its fused
// activations' last) that nothing else reads and that is not a graph output: the convolutions may
// write into the concatenation's buffer (ops: cpu_dnnl_convs_concat).
inline constexpr const char* kConcatOfConvs = "_ortmlx_concat_of_convs";

// One fused step, applied in order to the convolution's output y.
struct ConvActivation {
  enum class Kind {
    Relu,         // max(y, 0)
    LeakyRelu,    // y < 0 ? a * y : y
    Clip,         // min(max(y, a), b); an absent bound is -inf / +inf
    Mul,          // y * a (a constant scalar)
    Add,          // y + a (a constant scalar)
    HardSigmoid,  // clip(a * y + b, 0, 1)
    HardSwish,    // y * clip(y + 3, 0, 6) / 6 (ONNX's HardSwish, or that pattern of nodes)
    Sigmoid,      // 1 / (1 + exp(-y))
    Tanh,
    Swish,        // y * sigmoid(y) (a Mul of y by a Sigmoid of y)
    AddInput,     // y + r, r the Conv's input 3 (a residual), only as the first step
  };
  Kind kind = Kind::Relu;
  float a = 0.f, b = 0.f;
};

const char* activation_name(ConvActivation::Kind k);

// The steps a (possibly) fused Conv node carries; empty when it carries none.
std::vector<ConvActivation> conv_activations(const Node& conv);

// A residual Add (or two-input Sum) right after a Conv of one group with a constant float32
// weight (oneDNN adds it as its Sum post-op), or after a grouped 1x1 Conv of stride 1 without
// padding (the EP's pointwise kernel adds it in its tiles), is the first step, AddInput, its
// other operand the Conv's input 3 (input 2 empty without a bias); that operand must be
// produced before the Conv (or be a graph input).
//
// Rewrites `g` in place (nodes stay in topological order and are renumbered). A value between
// two fused steps (or between the Conv and its first step) must be read by the pattern's nodes
// alone and be neither one of `graph_outputs` nor read inside a control-flow body; constants
// (Clip's bounds, Mul's and Add's operand) must be scalar initializers of at most the Conv's
// rank. Returns how many activation nodes were fused away.
int fuse_conv_activation(Graph& g, const std::vector<std::string>& graph_outputs);

// Marks every Conv of `g` (kConvBlocked16) when all of them are 2-D with known weight shapes,
// output channels and each group's input channels multiples of 16 (a first layer of one group
// may read fewer than 16, a last one no other Conv reads from may write any number), and one of them is a 3 x 3, stride-1 convolution of one group (which
// oneDNN runs as Winograd's algorithm in that layout only). Why all or none: a convolution in
// another layout next to one in 16-channel blocks costs two reorders between them (through
// ONNX's layout), more than Winograd saves in a mobile network's narrow layers. Returns how
// many Convs it marked. Marks such a graph's Concats of Convs too (kConcatOfConvs).
int mark_blocked16_convs(Graph& g, const std::vector<std::string>& graph_outputs);

}  // namespace ortmlx::graph
