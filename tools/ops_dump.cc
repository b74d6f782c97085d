// ortmlx_ops_dump: prints the op registry as JSON, for docs/ops.md (python -m onnxruntime_mlx
// ops-doc). The registry is the single source of truth; this tool only reads it.
//
//   ortmlx_ops_dump            one JSON object: every entry's domain, op, opset range, notes and
//                              the dtypes its support check accepts (probed, see below)
//   ortmlx_ops_dump --probe    reads probe lines from stdin, answers one JSON line per probe:
//                              "<domain>\t<op>\t<since>\t<in dtypes>\t<out dtypes>[\t<attrs>]"
//                              where the dtype lists are comma-separated dtype names ("-" =
//                              absent) and attrs is "name=i:1;name=is:2,2;name=f:0.5;
//                              name=fs:1,2;name=s:text;name=ss:a,b;name=t:<dtype>[:1,2]"
//                              (t: a 1-D tensor of these values, or a zero scalar): required
//                              attributes, and the parameters of ai.onnx.ml models.
//                              The Python side builds these from ONNX's schemas, so that an
//                              input with its own type constraint (Reshape's shape, Where's
//                              condition) gets a dtype the schema allows.
//
// Probing: a synthetic one-node graph::Graph is run through partition::check_node, the claim
// decision the EP itself makes (registry lookup, the common value checks, the entry's check).
// Attributes are absent (their defaults apply) unless a probe line gives them. Shapes are unknown to checks in practice only
// sometimes, so each probe tries a few shape layouts (unknown, rank 2, rank 4, rank 4 with
// rank-1 parameter inputs) and a dtype counts as accepted when any layout is claimed. The
// default probe gives every input and output the same dtype T, with 1, 2 or 3 inputs.
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <iostream>
#include <memory>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <mlx/types/half_types.h>  // float16_t, bfloat16_t
#include <mlx/version.h>            // mlx::core::version()

#include "graph/view.h"
#include "ops/registry.h"
#include "partition/partition.h"

namespace {

using ortmlx::graph::DType;
namespace graph = ortmlx::graph;
namespace ops = ortmlx::ops;

// The dtypes MLX has, in the order the docs list them.
const DType kMlxDtypes[] = {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64,
                            DType::Int8,    DType::Int16,   DType::Int32,    DType::Int64,
                            DType::UInt8,   DType::UInt16,  DType::UInt32,   DType::UInt64,
                            DType::Bool};

std::string json_str(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (int v = 0; v <= 64; ++v)
    if (name == graph::dtype_name(static_cast<DType>(v))) return static_cast<DType>(v);
  return std::nullopt;
}

enum class Layout { Unknown, Rank2, Rank4, Rank4Params1 };
constexpr Layout kLayouts[] = {Layout::Unknown, Layout::Rank2, Layout::Rank4,
                               Layout::Rank4Params1};

graph::ValueInfo value(const std::string& name, DType t, Layout layout, bool param) {
  graph::ValueInfo v;
  v.name = name;
  v.dtype = t;
  switch (layout) {
    case Layout::Unknown: break;
    case Layout::Rank2: v.has_shape = true; v.dims = {3, 4}; break;
    case Layout::Rank4: v.has_shape = true; v.dims = {2, 3, 4, 5}; break;
    case Layout::Rank4Params1:
      v.has_shape = true;
      v.dims = param ? std::vector<int64_t>{4} : std::vector<int64_t>{2, 3, 4, 5};
      break;
  }
  return v;
}

// One probe: "" when claimed, else the decline reason.
using Attrs = std::map<std::string, graph::Attribute, std::less<>>;

std::string probe_once(std::string_view domain, std::string_view op, int since,
                       const std::vector<std::optional<DType>>& ins,
                       const std::vector<std::optional<DType>>& outs, const Attrs& attrs,
                       Layout layout) {
  graph::Graph g;
  graph::Node n;
  n.attrs = attrs;
  n.name = "probe";
  n.op_type = op;
  n.domain = domain;
  n.since_version = since;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (!ins[i]) {
      n.inputs.emplace_back();
      continue;
    }
    auto name = "in" + std::to_string(i);
    n.inputs.push_back(name);
    g.inputs.push_back(name);
    g.values.emplace(name, value(name, *ins[i], layout, i > 0));
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i]) {
      n.outputs.emplace_back();
      continue;
    }
    auto name = "out" + std::to_string(i);
    n.outputs.push_back(name);
    g.outputs.push_back(name);
    g.values.emplace(name, value(name, *outs[i], layout, false));
  }
  g.opsets[std::string(domain)] = since;
  g.nodes.push_back(std::move(n));
  try {
    return ortmlx::partition::check_node(g, g.nodes[0], {});
  } catch (const std::exception& e) {
    return std::string("the support check threw: ") + e.what();
  }
}

// Claimed under any layout? Returns "" or the first layout's reason.
std::string probe(std::string_view domain, std::string_view op, int since,
                  const std::vector<std::optional<DType>>& ins,
                  const std::vector<std::optional<DType>>& outs, const Attrs& attrs = {}) {
  std::string first;
  for (auto layout : kLayouts) {
    auto r = probe_once(domain, op, since, ins, outs, attrs, layout);
    if (r.empty()) return r;
    if (first.empty()) first = r;
  }
  return first;
}

void dump_registry() {
  std::ostringstream o;
  o << "{\"mlx_version\": " << json_str(mlx::core::version()) << ", \"any_opset\": " << ops::kAnyOpset
    << ", \"ops\": [";
  bool first_entry = true;
  for (const auto& e : ops::registry()) {
    o << (first_entry ? "\n" : ",\n");
    first_entry = false;
    o << " {\"domain\": " << json_str(e.domain) << ", \"op\": " << json_str(e.op_type)
      << ", \"min_opset\": " << e.min_opset << ", \"max_opset\": ";
    if (e.max_opset >= ops::kAnyOpset) o << "null"; else o << e.max_opset;
    o << ", \"notes\": " << json_str(e.notes) << ", \"has_check\": "
      << (e.check ? "true" : "false");
    // Default probe: every input and output of dtype T, 1..3 inputs, 1 output.
    std::vector<std::string> accepted;
    std::vector<std::pair<std::string, std::string>> declined;
    for (DType t : kMlxDtypes) {
      std::string why;
      for (size_t arity = 1; arity <= 3; ++arity) {
        std::vector<std::optional<DType>> ins(arity, t), outs(1, t);
        auto r = probe(e.domain, e.op_type, e.min_opset, ins, outs);
        if (r.empty()) { why.clear(); break; }
        if (why.empty()) why = r;
      }
      if (why.empty())
        accepted.push_back(graph::dtype_name(t));
      else
        declined.emplace_back(graph::dtype_name(t), why);
    }
    o << ", \"probe_opset\": " << e.min_opset << ", \"dtypes\": [";
    for (size_t i = 0; i < accepted.size(); ++i) o << (i ? ", " : "") << json_str(accepted[i]);
    o << "], \"declined\": {";
    for (size_t i = 0; i < declined.size(); ++i)
      o << (i ? ", " : "") << json_str(declined[i].first) << ": " << json_str(declined[i].second);
    o << "}}";
  }
  o << "\n]}\n";
  std::cout << o.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// `vals` stored as dtype t (little-endian host layout, as ONNX raw data).
std::optional<std::vector<std::byte>> tensor_bytes(DType t, const std::vector<double>& vals) {
  std::vector<std::byte> out(vals.size() * graph::dtype_size(t));
  auto put = [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < vals.size(); ++i) {
      T v = static_cast<T>(static_cast<float>(vals[i]));
      if constexpr (std::is_integral_v<T>) v = static_cast<T>(vals[i]);
      std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
    }
  };
  switch (t) {
    case DType::Float32: put(float{}); break;
    case DType::Float64:
      for (size_t i = 0; i < vals.size(); ++i) std::memcpy(out.data() + i * 8, &vals[i], 8);
      break;
    case DType::Float16: put(mlx::core::float16_t{}); break;
    case DType::BFloat16: put(mlx::core::bfloat16_t{}); break;
    case DType::Int8: put(int8_t{}); break;
    case DType::Int16: put(int16_t{}); break;
    case DType::Int32: put(int32_t{}); break;
    case DType::Int64: put(int64_t{}); break;
    case DType::UInt8: case DType::Bool: put(uint8_t{}); break;
    case DType::UInt16: put(uint16_t{}); break;
    case DType::UInt32: put(uint32_t{}); break;
    case DType::UInt64: put(uint64_t{}); break;
    default: return std::nullopt;
  }
  return out;
}

// "name=i:1;name=is:2,2;..." -> attributes; returns "" or what is malformed.
std::string parse_attrs(const std::string& text, Attrs& attrs) {
  if (text.empty()) return {};
  for (auto& item : split(text, ';')) {
    auto eq = item.find('='), colon = item.find(':', eq == std::string::npos ? 0 : eq);
    if (eq == std::string::npos || colon == std::string::npos) return "attribute '" + item + "'";
    std::string name = item.substr(0, eq), kind = item.substr(eq + 1, colon - eq - 1),
                val = item.substr(colon + 1);
    graph::Attribute a;
    try {
      if (kind == "i") {
        a.type = graph::AttrType::Int;
        a.i = std::stoll(val);
      } else if (kind == "is") {
        a.type = graph::AttrType::Ints;
        for (auto& v : split(val, ',')) if (!v.empty()) a.ints.push_back(std::stoll(v));
      } else if (kind == "f") {
        a.type = graph::AttrType::Float;
        a.f = std::stof(val);
      } else if (kind == "fs") {
        a.type = graph::AttrType::Floats;
        for (auto& v : split(val, ',')) if (!v.empty()) a.floats.push_back(std::stof(v));
      } else if (kind == "s") {
        a.type = graph::AttrType::String;
        a.s = val;
      } else if (kind == "ss") {
        a.type = graph::AttrType::Strings;
        a.strings = split(val, ',');
      } else if (kind == "t") {
        auto parts = split(val, ':');
        auto t = parse_dtype(parts[0]);
        if (!t || !graph::dtype_size(*t)) return "attribute tensor dtype '" + parts[0] + "'";
        a.type = graph::AttrType::Tensor;
        if (parts.size() == 1) {
          std::vector<std::byte> zero(graph::dtype_size(*t));
          a.t = std::make_shared<graph::ConstTensor>(
              graph::ConstTensor::from_bytes(*t, {}, zero.data(), zero.size()));
        } else {
          std::vector<double> vals;
          for (auto& v : split(parts[1], ',')) vals.push_back(std::stod(v));
          auto bytes = tensor_bytes(*t, vals);
          if (!bytes) return "attribute tensor values of dtype '" + parts[0] + "'";
          a.t = std::make_shared<graph::ConstTensor>(graph::ConstTensor::from_bytes(
              *t, {static_cast<int64_t>(vals.size())}, bytes->data(), bytes->size()));
        }
      } else {
        return "attribute kind '" + kind + "'";
      }
    } catch (const std::exception&) {
      return "attribute value '" + item + "'";
    }
    attrs[name] = std::move(a);
  }
  return {};
}

// "--probe": one answer line per request line, in order.
int probe_stdin() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    auto f = split(line, '\t');
    if (f.size() != 5 && f.size() != 6) {
      std::cout << "{\"ok\": false, \"reason\": " << json_str("bad probe line: " + line) << "}\n";
      continue;
    }
    auto dtypes = [&](const std::string& list, std::string& bad) {
      std::vector<std::optional<DType>> out;
      if (list.empty()) return out;
      for (auto& name : split(list, ',')) {
        if (name == "-" || name.empty()) {
          out.emplace_back();
        } else if (auto t = parse_dtype(name)) {
          out.emplace_back(*t);
        } else {
          bad = "unknown dtype " + name;
          out.emplace_back();
        }
      }
      return out;
    };
    std::string bad;
    auto ins = dtypes(f[3], bad);
    auto outs = dtypes(f[4], bad);
    Attrs attrs;
    if (f.size() == 6 && bad.empty()) bad = parse_attrs(f[5], attrs);
    int since = std::atoi(f[2].c_str());
    std::string r = bad.empty() ? probe(f[0], f[1], since, ins, outs, attrs) : "bad probe: " + bad;
    std::cout << "{\"ok\": " << (r.empty() ? "true" : "false") << ", \"reason\": " << json_str(r)
              << "}\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  if (argc == 2 && std::string(argv[1]) == "--probe") return probe_stdin();
  if (argc != 1) {
    std::cerr << "usage: ortmlx_ops_dump [--probe]\n";
    return 2;
  }
  dump_registry();
  return 0;
}
