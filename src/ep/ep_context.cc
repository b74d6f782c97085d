#include "ep/ep_context.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ep/graph_reader.h"
#include "graph/serialize.h"

namespace ortmlx::ep {

namespace fs = std::filesystem;

namespace {

// A side file: magic, the graph bytes' length, the graph bytes (constants external), zero
// padding to 64 bytes, then the constants blob the graph's offsets refer to.
constexpr char kFileMagic[8] = {'M', 'L', 'X', 'C', 'T', 'X', 'F', '1'};
constexpr size_t kFileAlign = 64;

struct OpAttrDeleter {
  void operator()(OrtOpAttr* a) const { if (a) g_ort->ReleaseOpAttr(a); }
};
using OpAttrPtr = std::unique_ptr<OrtOpAttr, OpAttrDeleter>;

OpAttrPtr int_attr(const char* name, int64_t v) {
  OrtOpAttr* a = nullptr;
  check(g_ort->CreateOpAttr(name, &v, 1, ORT_OP_ATTR_INT, &a));
  return OpAttrPtr(a);
}
OpAttrPtr string_attr(const char* name, std::string_view v) {
  if (v.size() > static_cast<size_t>(INT_MAX))
    throw std::invalid_argument(std::string("EPContext attribute '") + name + "' would be " +
                                std::to_string(v.size()) +
                                " bytes, more than an ONNX attribute holds: use "
                                "ep.context_embed_mode=0 (a side file)");
  OrtOpAttr* a = nullptr;
  check(g_ort->CreateOpAttr(name, v.data(), static_cast<int>(v.size()), ORT_OP_ATTR_STRING, &a));
  return OpAttrPtr(a);
}

std::string str_of(const char* s) { return s ? s : ""; }

const OrtOpAttr* find_attr(const OrtNode* n, const char* name) {
  const OrtOpAttr* a = nullptr;
  if (OrtStatus* st = g_ort->Node_GetAttributeByName(n, name, &a)) {
    g_ort->ReleaseStatus(st);  // ORT_NOT_FOUND: absent
    return nullptr;
  }
  return a;
}

// A (short) string attribute, without the NUL ORT appends; nullopt when absent.
std::optional<std::string> read_string_attr(const OrtNode* n, const char* name) {
  const OrtOpAttr* a = find_attr(n, name);
  if (!a) return std::nullopt;
  OrtOpAttrType type;
  check(g_ort->OpAttr_GetType(a, &type));
  if (type != ORT_OP_ATTR_STRING)
    throw std::invalid_argument(std::string("EPContext attribute '") + name + "' is not a string");
  size_t need = 0;
  if (OrtStatus* st = g_ort->ReadOpAttr(a, type, nullptr, 0, &need)) g_ort->ReleaseStatus(st);
  std::string s(need, '\0');
  size_t got = 0;
  if (need) check(g_ort->ReadOpAttr(a, type, s.data(), s.size(), &got));
  s.resize(std::min(got, s.size()));
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

std::optional<int64_t> read_int_attr(const OrtNode* n, const char* name) {
  const OrtOpAttr* a = find_attr(n, name);
  if (!a) return std::nullopt;
  OrtOpAttrType type;
  check(g_ort->OpAttr_GetType(a, &type));
  if (type != ORT_OP_ATTR_INT)
    throw std::invalid_argument(std::string("EPContext attribute '") + name + "' is not an int");
  int64_t v = 0;
  size_t got = 0;
  check(g_ort->ReadOpAttr(a, type, &v, sizeof v, &got));
  return v;
}

// The embedded payload, read once into memory the deserialized constants then point into.
std::pair<std::string_view, std::shared_ptr<const void>> read_payload_attr(const OrtNode* n) {
  const OrtOpAttr* a = find_attr(n, "ep_cache_context");
  if (!a) return {};
  OrtOpAttrType type;
  check(g_ort->OpAttr_GetType(a, &type));
  if (type != ORT_OP_ATTR_STRING)
    throw std::invalid_argument("EPContext attribute 'ep_cache_context' is not a string");
  size_t need = 0;
  if (OrtStatus* st = g_ort->ReadOpAttr(a, type, nullptr, 0, &need)) g_ort->ReleaseStatus(st);
  std::shared_ptr<char[]> buf(new char[need ? need : 1]);  // not zero-filled: ORT writes it all
  size_t got = 0;
  if (need) check(g_ort->ReadOpAttr(a, type, buf.get(), need, &got));
  return {std::string_view(buf.get(), std::min(got, need)), buf};
}

bool is_own_context(const OrtNode* n) {
  const char* op = nullptr;
  const char* domain = nullptr;
  check(g_ort->Node_GetOperatorType(n, &op));
  check(g_ort->Node_GetDomain(n, &domain));
  if (str_of(op) != kContextOp || str_of(domain) != kContextDomain) return false;
  auto source = read_string_attr(n, "source");
  return source && *source == kEpName;
}

std::vector<const OrtNode*> nodes_of(const OrtGraph* g) {
  size_t n = 0;
  check(g_ort->Graph_GetNumNodes(g, &n));
  std::vector<const OrtNode*> nodes(n);
  if (n) check(g_ort->Graph_GetNodes(g, nodes.data(), n));
  return nodes;
}

std::string model_path(const OrtGraph* g) {
  const ORTCHAR_T* p = nullptr;
  check(g_ort->Graph_GetModelPath(g, &p));
  return p ? std::string(p) : std::string();
}

// ORT's default for ep.context_file_path: <model>_ctx.onnx beside the model.
fs::path context_model_path(const ContextOptions& opt, const OrtGraph* g) {
  if (!opt.file_path.empty()) return fs::path(opt.file_path);
  std::string model = model_path(g);
  if (model.empty()) return {};
  fs::path m(model);
  return m.parent_path() / (m.stem().string() + "_ctx.onnx");
}

std::string safe_name(std::string_view s) {
  std::string out;
  for (char c : s)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') ? c : '_';
  return out;
}

void write_side_file(const fs::path& path, const std::string& graph_bytes, const std::string& blob) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f)
    throw std::invalid_argument("EPContext side file '" + path.string() +
                                "' cannot be written (" + std::strerror(errno) + ")");
  f.write(kFileMagic, sizeof kFileMagic);
  uint64_t len = graph_bytes.size();
  f.write(reinterpret_cast<const char*>(&len), sizeof len);
  f.write(graph_bytes.data(), static_cast<std::streamsize>(graph_bytes.size()));
  size_t at = sizeof kFileMagic + sizeof len + graph_bytes.size();
  size_t pad = (kFileAlign - at % kFileAlign) % kFileAlign;
  f.write(std::string(pad, '\0').data(), static_cast<std::streamsize>(pad));
  f.write(blob.data(), static_cast<std::streamsize>(blob.size()));
  f.flush();
  if (!f)
    throw std::runtime_error("EPContext side file '" + path.string() + "': write failed (" +
                             std::strerror(errno) + ")");
}

// A side file mapped read-only: the constants point into the mapping (no copy before the
// engine's own), which they keep alive.
struct SideFile {
  std::string_view graph_bytes, blob;
  std::shared_ptr<const void> mapping;
};

SideFile map_side_file(const fs::path& path) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("EPContext side file '" + path.string() + "': " + why);
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw bad(std::string("cannot be opened (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw bad(std::string("cannot read its size (") + std::strerror(e) + ")");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  uint64_t len = 0;
  const size_t head = sizeof kFileMagic + sizeof len;
  if (size < head) {
    ::close(fd);
    throw bad("truncated (" + std::to_string(size) + " bytes)");
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);  // the mapping stays valid
  if (addr == MAP_FAILED) throw bad(std::string("cannot be mapped (") + std::strerror(e) + ")");
  std::shared_ptr<const void> mapping(addr, [size](const void* p) {
    ::munmap(const_cast<void*>(p), size);
  });
  const char* base = static_cast<const char*>(addr);
  if (std::memcmp(base, kFileMagic, sizeof kFileMagic) != 0)
    throw bad("not an MLX EP context file (bad magic)");
  std::memcpy(&len, base + sizeof kFileMagic, sizeof len);
  if (len > size - head) throw bad("truncated: its graph needs " + std::to_string(len) + " bytes");
  const size_t at = head + static_cast<size_t>(len);
  const size_t blob_at = std::min(size, (at + kFileAlign - 1) / kFileAlign * kFileAlign);
  return {std::string_view(base + head, len), std::string_view(base + blob_at, size - blob_at),
          std::move(mapping)};
}

void check_compat(const std::string& node, const std::string& found, const std::string& expected) {
  if (found == expected) return;
  throw OrtError(ORT_FAIL, "EPContext node '" + node + "' was compiled for '" + found +
                               "', the running EP is '" + expected + "' (" +
                               compat_mismatch(found, expected) +
                               "): recompile the original model (ep.context_enable=1)");
}

}  // namespace

ContextOptions read_context_options(const OrtSessionOptions* so) {
  ContextOptions o;
  if (!so) return o;
  OrtKeyValuePairs* raw = nullptr;
  check(g_ort->GetSessionOptionsConfigEntries(so, &raw));
  KeyValuePairsPtr kv(raw);
  auto get = [&](const char* key) { return str_of(g_ort->GetKeyValue(kv.get(), key)); };
  auto flag = [&](const char* key, int def) {
    std::string v = get(key);
    if (v.empty()) return def;
    if (v != "0" && v != "1")
      throw std::invalid_argument(std::string("session option '") + key + "': '" + v +
                                  "' is not 0 or 1");
    return v == "1" ? 1 : 0;
  };
  o.enable = flag("ep.context_enable", 0) == 1;
  o.embed_mode = flag("ep.context_embed_mode", 0);
  o.file_path = get("ep.context_file_path");
  // ep.context_node_name_prefix is not applied: ORT 1.31 rejects an EPContext node whose name
  // differs from its fused node's ("invalid node while compiling"), and a plugin EP cannot name
  // the fused node. Those names already carry ORT's per-model hash.

  // Weightless nodes take the weights as inputs; this EP's payload always carries them, so
  // asking for them must not silently give a model with weights.
  if (o.enable && flag("ep.enable_weightless_ep_context_nodes", 0) == 1)
    throw std::invalid_argument(
        "ep.enable_weightless_ep_context_nodes=1: the MLX EP writes its EPContext nodes with the "
        "weights in their payload only (no weightless form)");
  return o;
}

std::vector<const OrtNode*> own_context_nodes(const OrtGraph* g) {
  std::vector<const OrtNode*> out;
  for (const OrtNode* n : nodes_of(g))
    if (is_own_context(n)) out.push_back(n);
  return out;
}

const OrtNode* own_context_graph(const OrtGraph* g) {
  auto nodes = nodes_of(g);
  return nodes.size() == 1 && is_own_context(nodes[0]) ? nodes[0] : nullptr;
}

OrtNode* make_context_node(const ContextOptions& opt, const OrtGraph* graph, const OrtNode* fused,
                           const graph::Graph& g, const std::string& compat) {
  const char* name = nullptr;
  check(g_ort->Node_GetName(fused, &name));
  const std::string partition = str_of(name);  // ORT requires it as the EPContext node's name
  std::string cache;  // the ep_cache_context attribute
  if (opt.embed_mode == 1) {
    cache = graph::serialize(g, compat);
  } else {
    const fs::path ctx_model = context_model_path(opt, graph);
    if (ctx_model.empty())
      throw std::invalid_argument(
          "ep.context_embed_mode=0 writes a side file next to the context model, but neither "
          "ep.context_file_path is set nor the model has a path (loaded from bytes): set one, "
          "or use ep.context_embed_mode=1");
    std::string blob;
    std::string bytes = graph::serialize(g, compat, &blob);
    cache = ctx_model.stem().string() + "_" + safe_name(partition) + ".mlxctx";
    write_side_file(ctx_model.parent_path() / cache, bytes, blob);
  }
  std::vector<OpAttrPtr> attrs;
  attrs.push_back(int_attr("main_context", 1));
  attrs.push_back(int_attr("embed_mode", opt.embed_mode));
  attrs.push_back(string_attr("ep_cache_context", cache));
  attrs.push_back(string_attr("source", kEpName));
  attrs.push_back(string_attr("ep_sdk_version", kEpVersion));
  attrs.push_back(string_attr("partition_name", partition));
  std::vector<OrtOpAttr*> raw;
  for (auto& a : attrs) raw.push_back(a.get());
  std::vector<const char*> ins, outs;
  for (const auto& s : g.inputs) ins.push_back(s.c_str());
  for (const auto& s : g.outputs) outs.push_back(s.c_str());
  const OrtModelEditorApi* editor = g_ort->GetModelEditorApi();
  if (!editor) throw OrtError(ORT_NOT_IMPLEMENTED, "this ORT build has no model editor API");
  OrtNode* node = nullptr;
  OrtStatus* st = editor->CreateNode(kContextOp, kContextDomain, partition.c_str(), ins.data(),
                                     ins.size(), outs.data(), outs.size(), raw.data(), raw.size(),
                                     &node);
  // ORT releases each attribute it copied and nulls its entry (the header says only "copied").
  for (size_t i = 0; i < raw.size(); ++i)
    if (!raw[i]) (void)attrs[i].release();
  check(st);
  return node;  // ORT owns it once Compile returns
}

graph::Graph load_context(const OrtGraph* graph, const OrtNode* ctx, const std::string& compat) {
  const char* name = nullptr;
  check(g_ort->Node_GetName(ctx, &name));
  const std::string node = str_of(name);
  // The EPContext schema's default embed_mode is 1.
  const int64_t embed = read_int_attr(ctx, "embed_mode").value_or(1);
  if (embed == 1) {
    auto [bytes, keep] = read_payload_attr(ctx);
    if (bytes.empty())
      throw std::invalid_argument("EPContext node '" + node + "' has no ep_cache_context");
    check_compat(node, graph::read_header(bytes).compat, compat);
    return graph::deserialize(bytes, std::nullopt, std::move(keep));
  }
  auto cache = read_string_attr(ctx, "ep_cache_context");
  if (!cache || cache->empty())
    throw std::invalid_argument("EPContext node '" + node + "' has no ep_cache_context");
  if (embed != 0)
    throw std::invalid_argument("EPContext node '" + node + "': embed_mode " +
                                std::to_string(embed) + " is not 0 or 1");
  fs::path file(*cache);
  if (file.is_relative()) {
    const std::string model = model_path(graph);
    if (model.empty())
      throw std::invalid_argument("EPContext node '" + node + "' names the side file '" + *cache +
                                  "' relative to the model's folder, but the model was loaded "
                                  "from bytes: load it from its path");
    file = fs::path(model).parent_path() / file;
  }
  SideFile side = map_side_file(file);
  check_compat(node, graph::read_header(side.graph_bytes).compat, compat);
  return graph::deserialize(side.graph_bytes, side.blob, std::move(side.mapping));
}

void check_context_signature(const std::string& node, const graph::Graph& g,
                             const std::vector<std::string>& inputs,
                             const std::vector<std::string>& outputs) {
  auto same = [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    return std::multiset<std::string>(a.begin(), a.end()) ==
           std::multiset<std::string>(b.begin(), b.end());
  };
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return "[" + s + "]";
  };
  if (!same(g.inputs, inputs) || !same(g.outputs, outputs))
    throw std::invalid_argument("EPContext node '" + node + "' takes " + list(inputs) +
                                " and gives " + list(outputs) + ", its saved graph " +
                                list(g.inputs) + " and " + list(g.outputs));
}

std::map<std::string, std::string> parse_compat(std::string_view s) {
  std::map<std::string, std::string> out;
  size_t start = 0;
  bool first = true;
  while (start <= s.size()) {
    size_t end = s.find(';', start);
    if (end == std::string_view::npos) end = s.size();
    std::string_view tok = s.substr(start, end - start);
    if (size_t eq = tok.find('='); eq != std::string_view::npos)
      out[std::string(tok.substr(0, eq))] = std::string(tok.substr(eq + 1));
    else if (first)
      out[""] = std::string(tok);
    first = false;
    start = end + 1;
  }
  return out;
}

std::string compat_mismatch(std::string_view found, std::string_view expected) {
  auto f = parse_compat(found), e = parse_compat(expected);
  std::set<std::string> keys;
  for (auto& [k, _] : f) keys.insert(k);
  for (auto& [k, _] : e) keys.insert(k);
  std::string out;
  for (const auto& k : keys) {
    auto fv = f.count(k) ? f[k] : "(none)";
    auto ev = e.count(k) ? e[k] : "(none)";
    if (fv == ev) continue;
    if (!out.empty()) out += "; ";
    out += (k.empty() ? std::string("EP") : k) + " " + fv + " (model) vs " + ev + " (here)";
  }
  return out.empty() ? "different strings" : out;
}

}  // namespace ortmlx::ep
