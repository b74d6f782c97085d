// Small builders shared by the engine-level C++ tests: graph view nodes and attributes, host
// tensors for Program::run, and reading results back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "engine/program.h"
#include "graph/view.h"

namespace ortmlx::test {

inline graph::Node node(std::string op, std::vector<std::string> in, std::vector<std::string> out,
                        int opset = 21) {
  graph::Node n;
  n.name = op + "_" + (out.empty() ? std::string("x") : out[0]);
  n.op_type = std::move(op);
  n.since_version = opset;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

inline void int_attr(graph::Node& n, const std::string& name, int64_t v) {
  graph::Attribute a;
  a.type = graph::AttrType::Int;
  a.i = v;
  n.attrs[name] = a;
}

// A HostTensor over `v`'s bytes (the vector must outlive the run).
template <typename T>
engine::HostTensor host(graph::DType t, const std::vector<T>& v, std::vector<int64_t> shape) {
  return {t, std::move(shape), v.data()};
}

// A float32 [K, N] weight of varied values (no two neighbours alike) around `base`.
inline graph::ConstTensor float_weights(int64_t K, int64_t N, float base) {
  std::vector<float> v(static_cast<size_t>(K * N));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.25f * static_cast<float>(i % 7) - 0.1f * static_cast<float>(i % 3);
  return graph::ConstTensor::from_bytes(graph::DType::Float32, {K, N}, v.data(), v.size() * sizeof(float));
}

inline std::vector<float> floats(const mlx::core::array& a) {
  auto f = mlx::core::astype(a, mlx::core::float32);
  f.eval();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.size());
}

// A program of `g` (one float32 input) run once on `x`: every output as floats.
inline std::vector<std::vector<float>> run_floats(const graph::Graph& g, const engine::Options& o,
                                                  const std::vector<float>& x, std::vector<int64_t> shape) {
  auto p = engine::make_program("test", g, g.inputs, g.outputs, o);
  std::vector<std::vector<float>> outs;
  for (const auto& a : p->run({host(graph::DType::Float32, x, std::move(shape))})) outs.push_back(floats(a));
  return outs;
}

}  // namespace ortmlx::test
