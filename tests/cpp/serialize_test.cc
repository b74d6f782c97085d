// The EPContext format (graph/serialize): a graph with every attribute kind, nested bodies,
// value infos and constants comes back equal, inline or with its constants in a blob; bad or
// truncated bytes are refused with std::invalid_argument.
#include <gtest/gtest.h>

#include <cstring>

#include "graph/serialize.h"
#include "graph_builders.h"

using namespace ortmlx;
using graph::AttrType;
using graph::DType;

namespace {

graph::ConstTensor floats_const(std::vector<float> v, std::vector<int64_t> shape) {
  return graph::ConstTensor::from_bytes(DType::Float32, std::move(shape), v.data(),
                                        v.size() * sizeof(float));
}

graph::Attribute attr_of(AttrType t) {
  graph::Attribute a;
  a.type = t;
  return a;
}

// y = If(c) then (x + one) else (x * w); plus a node carrying one attribute of every kind.
graph::Graph sample() {
  graph::Graph then_g, else_g, g;
  then_g.is_subgraph = true;
  then_g.nodes.push_back(test::node("Add", {"x", "one"}, {"ty"}));
  then_g.constants["one"] = floats_const({1.f}, {});
  then_g.outputs = {"ty"};
  else_g.is_subgraph = true;
  else_g.nodes.push_back(test::node("Mul", {"x", "w"}, {"ey"}));
  else_g.outputs = {"ey"};
  else_g.constants["w"] = floats_const({2.f, 3.f, 4.f}, {3});

  auto n = test::node("If", {"c"}, {"y"});
  auto tb = attr_of(AttrType::Graph);
  tb.g = std::make_shared<const graph::Graph>(then_g);
  auto eb = attr_of(AttrType::Graph);
  eb.g = std::make_shared<const graph::Graph>(else_g);
  n.attrs["then_branch"] = tb;
  n.attrs["else_branch"] = eb;
  n.implicit_inputs = {"x"};
  n.name = "the_if";
  n.since_version = 16;

  auto k = test::node("Custom", {"y", ""}, {"z", ""});
  k.domain = "com.example";
  k.since_version = 1;
  auto ai = attr_of(AttrType::Int);
  ai.i = -7;
  k.attrs["i"] = ai;
  auto af = attr_of(AttrType::Float);
  af.f = 0.25f;
  k.attrs["f"] = af;
  auto ais = attr_of(AttrType::Ints);
  ais.ints = {1, -2, 3};
  k.attrs["ints"] = ais;
  auto afs = attr_of(AttrType::Floats);
  afs.floats = {0.5f, -1.5f};
  k.attrs["floats"] = afs;
  auto as = attr_of(AttrType::String);
  as.s = std::string("bin\0ary", 7);
  k.attrs["s"] = as;
  auto ass = attr_of(AttrType::Strings);
  ass.strings = {"a", "", "ccc"};
  k.attrs["strings"] = ass;
  auto at = attr_of(AttrType::Tensor);
  int32_t tv[2] = {5, 6};
  at.t = std::make_shared<graph::ConstTensor>(
      graph::ConstTensor::from_bytes(DType::Int32, {2}, tv, sizeof tv));
  k.attrs["t"] = at;
  k.attrs["u"] = attr_of(AttrType::Undefined);
  k.attrs["g_empty"] = attr_of(AttrType::Graph);

  g.nodes = {n, k};
  g.nodes[1].index = 1;
  g.inputs = {"c", "x"};
  g.outputs = {"z"};
  g.opsets = {{"", 17}, {"com.example", 1}};
  graph::ValueInfo vx;
  vx.name = "x";
  vx.dtype = DType::Float32;
  vx.has_shape = true;
  vx.dims = {-1, 3};
  vx.dim_names = {"batch", ""};
  g.values["x"] = vx;
  graph::ValueInfo vs;
  vs.name = "seq";
  vs.is_tensor = false;
  vs.kind = graph::ValueInfo::Kind::Sequence;
  vs.optional = true;
  vs.dtype = DType::Int64;
  g.values["seq"] = vs;
  g.constants["big"] = floats_const(std::vector<float>(1000, 1.5f), {10, 100});
  g.constants["empty"] = floats_const({}, {0, 4});
  return g;
}

void expect_tensor_eq(const graph::ConstTensor& a, const graph::ConstTensor& b) {
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.shape, b.shape);
  ASSERT_EQ(a.nbytes, b.nbytes);
  if (a.nbytes) {
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0);
  }
}

void expect_graph_eq(const graph::Graph& a, const graph::Graph& b) {
  EXPECT_EQ(a.is_subgraph, b.is_subgraph);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.outputs, b.outputs);
  EXPECT_EQ(a.opsets, b.opsets);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (const auto& [k, v] : a.values) {
    const auto* w = b.info(k);
    ASSERT_NE(w, nullptr) << k;
    EXPECT_EQ(v.name, w->name);
    EXPECT_EQ(v.is_tensor, w->is_tensor);
    EXPECT_EQ(v.kind, w->kind);
    EXPECT_EQ(v.optional, w->optional);
    EXPECT_EQ(v.dtype, w->dtype);
    EXPECT_EQ(v.has_shape, w->has_shape);
    EXPECT_EQ(v.dims, w->dims);
    EXPECT_EQ(v.dim_names, w->dim_names);
  }
  ASSERT_EQ(a.constants.size(), b.constants.size());
  for (const auto& [k, c] : a.constants) {
    const auto* d = b.constant(k);
    ASSERT_NE(d, nullptr) << k;
    expect_tensor_eq(c, *d);
  }
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const auto& n = a.nodes[i];
    const auto& m = b.nodes[i];
    EXPECT_EQ(m.index, i);
    EXPECT_EQ(n.name, m.name);
    EXPECT_EQ(n.op_type, m.op_type);
    EXPECT_EQ(n.domain, m.domain);
    EXPECT_EQ(n.since_version, m.since_version);
    EXPECT_EQ(n.inputs, m.inputs);
    EXPECT_EQ(n.outputs, m.outputs);
    EXPECT_EQ(n.implicit_inputs, m.implicit_inputs);
    ASSERT_EQ(n.attrs.size(), m.attrs.size());
    for (const auto& [name, x] : n.attrs) {
      const auto* y = m.attr(name);
      ASSERT_NE(y, nullptr) << name;
      EXPECT_EQ(x.type, y->type) << name;
      EXPECT_EQ(x.i, y->i);
      EXPECT_EQ(x.f, y->f);
      EXPECT_EQ(x.s, y->s);
      EXPECT_EQ(x.ints, y->ints);
      EXPECT_EQ(x.floats, y->floats);
      EXPECT_EQ(x.strings, y->strings);
      ASSERT_EQ(x.t != nullptr, y->t != nullptr) << name;
      if (x.t) expect_tensor_eq(*x.t, *y->t);
      ASSERT_EQ(x.g != nullptr, y->g != nullptr) << name;
      if (x.g) expect_graph_eq(*x.g, *y->g);
    }
  }
}

TEST(Serialize, RoundTripsInline) {
  auto g = sample();
  auto bytes = graph::serialize(g, "MLXExecutionProvider;version=0.1.0");
  auto h = graph::read_header(bytes);
  EXPECT_EQ(h.version, graph::kSerializeVersion);
  EXPECT_EQ(h.compat, "MLXExecutionProvider;version=0.1.0");
  EXPECT_FALSE(h.external_constants);
  auto back = graph::deserialize(bytes);
  expect_graph_eq(g, back);
  // Deterministic: the same graph (hash maps and all) gives the same bytes.
  EXPECT_EQ(graph::serialize(back, h.compat), bytes);
  // A string transport's NUL terminator is tolerated; anything else after the end is not.
  EXPECT_NO_THROW(graph::deserialize(bytes + std::string(2, '\0')));
  EXPECT_THROW(graph::deserialize(bytes + "x"), std::invalid_argument);
}

TEST(Serialize, RoundTripsWithConstantsInABlob) {
  auto g = sample();
  std::string blob;
  auto bytes = graph::serialize(g, "c", &blob);
  EXPECT_TRUE(graph::read_header(bytes).external_constants);
  // The weights went to the blob, not the graph bytes.
  EXPECT_GE(blob.size(), 4000u + 12u + 4u);
  EXPECT_LT(bytes.size(), 4000u);
  // Copied (no owner given): equal, and independent of the blob's memory.
  auto back = graph::deserialize(bytes, blob);
  expect_graph_eq(g, back);
  EXPECT_NE(back.constant("big")->data, static_cast<const void*>(blob.data()));
  // With the owner of the memory: constants point into the blob and keep it alive.
  auto keep = std::make_shared<std::string>(blob);
  auto shared = graph::deserialize(bytes, std::string_view(*keep), keep);
  expect_graph_eq(g, shared);
  const auto* big = shared.constant("big");
  EXPECT_EQ(big->owned, keep);
  EXPECT_GE(static_cast<const char*>(big->data), keep->data());
  EXPECT_LT(static_cast<const char*>(big->data), keep->data() + keep->size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data) % 64, reinterpret_cast<uintptr_t>(keep->data()) % 64);
  // Without the blob, or with a short one, it is refused.
  EXPECT_THROW(graph::deserialize(bytes), std::invalid_argument);
  try {
    graph::deserialize(bytes, std::string_view(blob).substr(0, blob.size() / 2));
    FAIL() << "a short blob was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("outside the blob"), std::string::npos) << e.what();
  }
}

TEST(Serialize, InlineConstantsCanShareTheBuffer) {
  auto g = sample();
  auto keep = std::make_shared<std::string>(graph::serialize(g, "c"));
  auto back = graph::deserialize(*keep, std::nullopt, keep);
  expect_graph_eq(g, back);
  EXPECT_EQ(back.constant("big")->owned, keep);
  // Tensor attributes too (they point into the buffer as well).
  EXPECT_EQ(back.nodes[1].attr("t")->t->owned, keep);
}

TEST(Serialize, ConstantSizesMustMatchTheirShapes) {
  // Packed 4-bit constants round-trip (ceil(numel / 2) bytes)...
  graph::Graph g;
  uint8_t packed[3] = {0x21, 0x43, 0x05};
  g.constants["q"] = graph::ConstTensor::from_bytes(DType::Int4, {5}, packed, 3);
  auto back = graph::deserialize(graph::serialize(g, "c"));
  EXPECT_EQ(back.constant("q")->nbytes, 3u);
  // ...and a byte count the shape does not take is refused: the engine would read past it.
  g.constants["q"] = graph::ConstTensor::from_bytes(DType::Int4, {9}, packed, 3);
  EXPECT_THROW(graph::deserialize(graph::serialize(g, "c")), std::invalid_argument);
  g.constants["q"] = graph::ConstTensor::from_bytes(DType::Float32, {2}, packed, 3);
  EXPECT_THROW(graph::deserialize(graph::serialize(g, "c")), std::invalid_argument);
}

TEST(Serialize, EveryTruncationIsRejected) {
  auto bytes = graph::serialize(sample(), "compat");
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      graph::deserialize(std::string_view(bytes).substr(0, n));
      FAIL() << "a prefix of " << n << " of " << bytes.size() << " bytes was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("MLX EP context data"), std::string::npos);
    }
  }
}

TEST(Serialize, BadHeaderAndCorruptFieldsAreNamed) {
  auto bytes = graph::serialize(sample(), "compat");
  auto msg = [](const std::string& b) -> std::string {
    try {
      graph::deserialize(b);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  auto bad = bytes;
  bad[0] = 'X';
  EXPECT_NE(msg(bad).find("bad magic"), std::string::npos) << msg(bad);
  bad = bytes;
  bad[8] = 9;  // the format version
  EXPECT_NE(msg(bad).find("format version 9"), std::string::npos) << msg(bad);
  EXPECT_THROW(graph::read_header(bad), std::invalid_argument);
  // A huge string length must not allocate: it is checked against the bytes left.
  bad = bytes;
  uint64_t huge = ~uint64_t{0} >> 1;
  std::memcpy(bad.data() + 12, &huge, sizeof huge);
  EXPECT_NE(msg(bad).find("truncated"), std::string::npos) << msg(bad);
  // Flipping any single byte either still parses or fails with invalid_argument (never UB:
  // run under the sanitizer build to check the "never" part).
  for (size_t i = 0; i < bytes.size(); ++i) {
    bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0xA5);
    try {
      graph::deserialize(bad);
    } catch (const std::invalid_argument&) {
    }
  }
}

}  // namespace
