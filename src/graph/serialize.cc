#include "graph/serialize.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

namespace ortmlx::graph {

// Fixed-width fields are copied as the host lays them out; the format says little-endian.
static_assert(std::endian::native == std::endian::little, "serialize.cc assumes little-endian");

namespace {

constexpr char kMagic[8] = {'O', 'R', 'T', 'M', 'L', 'X', 'G', '\0'};
constexpr char kEnd[4] = {'G', 'E', 'N', 'D'};
constexpr size_t kAlign = 64;
// Control-flow nesting deeper than this is a corrupt file, not a model (bounds the recursion).
constexpr int kMaxDepth = 64;

// Bits per element; 0 for types a constant cannot have (string, undefined).
uint64_t element_bits(DType t) {
  switch (t) {
    case DType::Int4: case DType::UInt4: case DType::Float4E2M1: return 4;
    case DType::Int2: case DType::UInt2: return 2;
    case DType::Float8E8M0: return 8;
    default: return 8 * dtype_size(t);
  }
}

class Writer {
 public:
  Writer(std::string* blob) : blob_(blob) {}
  std::string out;

  template <typename T>
  void pod(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  void u8(uint8_t v) { pod(v); }
  void u32(uint32_t v) { pod(v); }
  void u64(uint64_t v) { pod(v); }
  void i32(int32_t v) { pod(v); }
  void i64(int64_t v) { pod(v); }
  void str(std::string_view s) {
    u64(s.size());
    out.append(s.data(), s.size());
  }
  void strs(const std::vector<std::string>& v) {
    u64(v.size());
    for (const auto& s : v) str(s);
  }
  void ints(const std::vector<int64_t>& v) {
    u64(v.size());
    for (auto x : v) i64(x);
  }
  // external: whether the data may go to the blob (initializers) or stays inline (attributes).
  void tensor(const ConstTensor& t, bool external) {
    i32(static_cast<int32_t>(t.dtype));
    ints(t.shape);
    u64(t.nbytes);
    if (t.nbytes && !t.data) throw std::invalid_argument("serialize: a constant has no data");
    if (external && blob_) {
      size_t off = (blob_->size() + kAlign - 1) / kAlign * kAlign;
      blob_->resize(off, '\0');
      blob_->append(static_cast<const char*>(t.data), t.nbytes);
      u64(off);
    } else {
      out.append(static_cast<const char*>(t.data), t.nbytes);
    }
  }
  void value_info(const ValueInfo& v) {
    str(v.name);
    u8(v.is_tensor);
    u8(static_cast<uint8_t>(v.kind));
    u8(v.optional);
    i32(static_cast<int32_t>(v.dtype));
    u8(v.has_shape);
    ints(v.dims);
    strs(v.dim_names);
  }
  void attribute(const Attribute& a) {
    u8(static_cast<uint8_t>(a.type));
    switch (a.type) {
      case AttrType::Undefined: break;
      case AttrType::Int: i64(a.i); break;
      case AttrType::Float: pod(a.f); break;
      case AttrType::Ints: ints(a.ints); break;
      case AttrType::Floats:
        u64(a.floats.size());
        for (float f : a.floats) pod(f);
        break;
      case AttrType::String: str(a.s); break;
      case AttrType::Strings: strs(a.strings); break;
      case AttrType::Tensor:
        u8(a.t != nullptr);
        if (a.t) tensor(*a.t, /*external=*/false);
        break;
      case AttrType::Graph:
        u8(a.g != nullptr);
        if (a.g) graph(*a.g);
        break;
    }
  }
  void node(const Node& n) {
    str(n.name);
    str(n.op_type);
    str(n.domain);
    i32(n.since_version);
    strs(n.inputs);
    strs(n.outputs);
    u64(n.attrs.size());
    for (const auto& [name, a] : n.attrs) {
      str(name);
      attribute(a);
    }
    strs(n.implicit_inputs);
  }
  void graph(const Graph& g) {
    u8(g.is_subgraph);
    u64(g.opsets.size());
    for (const auto& [d, v] : g.opsets) {
      str(d);
      i32(v);
    }
    strs(g.inputs);
    strs(g.outputs);
    // Hash maps are written sorted: the same graph gives the same bytes.
    std::vector<const ValueInfo*> values;
    for (const auto& [_, v] : g.values) values.push_back(&v);
    std::sort(values.begin(), values.end(), [](auto* a, auto* b) { return a->name < b->name; });
    u64(values.size());
    for (const auto* v : values) value_info(*v);
    std::vector<std::pair<const std::string*, const ConstTensor*>> consts;
    for (const auto& [k, c] : g.constants) consts.emplace_back(&k, &c);
    std::sort(consts.begin(), consts.end(), [](auto& a, auto& b) { return *a.first < *b.first; });
    u64(consts.size());
    for (const auto& [k, c] : consts) {
      str(*k);
      tensor(*c, /*external=*/true);
    }
    u64(g.nodes.size());
    for (const auto& n : g.nodes) node(n);
  }

 private:
  std::string* blob_;
};

class Reader {
 public:
  Reader(std::string_view b, std::optional<std::string_view> blob, std::shared_ptr<const void> keep)
      : b_(b), blob_(blob), keep_(std::move(keep)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("MLX EP context data: " + what + " (at byte " +
                                std::to_string(pos_) + " of " + std::to_string(b_.size()) + ")");
  }
  void need(uint64_t n, const char* what) {
    if (n > b_.size() - pos_)
      fail(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes, " +
           std::to_string(b_.size() - pos_) + " left");
  }
  template <typename T>
  T pod(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint8_t u8(const char* w) { return pod<uint8_t>(w); }
  bool flag(const char* w) {
    uint8_t v = u8(w);
    if (v > 1) fail(std::string(w) + " is " + std::to_string(v) + ", not 0 or 1");
    return v;
  }
  uint32_t u32(const char* w) { return pod<uint32_t>(w); }
  uint64_t u64(const char* w) { return pod<uint64_t>(w); }
  int32_t i32(const char* w) { return pod<int32_t>(w); }
  int64_t i64(const char* w) { return pod<int64_t>(w); }
  // A count of items each at least `min_item` bytes long: checked against what is left, so a
  // corrupt count cannot ask for a huge allocation.
  size_t count(const char* what, size_t min_item) {
    uint64_t n = u64(what);
    if (min_item && n > (b_.size() - pos_) / min_item)
      fail(std::string("truncated: ") + what + " says " + std::to_string(n) +
           " items, more than the bytes left hold");
    return static_cast<size_t>(n);
  }
  std::string str(const char* what) {
    uint64_t n = u64(what);
    need(n, what);
    std::string s(b_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  std::vector<std::string> strs(const char* what) {
    std::vector<std::string> v(count(what, 8));
    for (auto& s : v) s = str(what);
    return v;
  }
  std::vector<int64_t> ints(const char* what) {
    std::vector<int64_t> v(count(what, 8));
    for (auto& x : v) x = i64(what);
    return v;
  }
  DType dtype(const char* what) {
    int32_t t = i32(what);
    if (t < 0 || t > static_cast<int32_t>(DType::Int2))
      fail(std::string(what) + ": unknown element type " + std::to_string(t));
    return static_cast<DType>(t);
  }
  ConstTensor tensor(bool external) {
    ConstTensor t;
    t.dtype = dtype("tensor element type");
    t.shape = ints("tensor shape");
    for (auto d : t.shape)
      if (d < 0) fail("tensor dimension " + std::to_string(d) + " is negative");
    uint64_t nbytes = u64("tensor byte count");
    // The byte count must be what the shape takes (the engine reads that many): packed for
    // the sub-byte types. Strings are never constants of the view.
    uint64_t bits = element_bits(t.dtype);
    if (!bits) fail(std::string("a constant of element type ") + dtype_name(t.dtype));
    uint64_t numel = 1;
    for (auto d : t.shape) {
      if (d && numel > UINT64_MAX / 128 / static_cast<uint64_t>(d)) fail("tensor shape overflows");
      numel *= static_cast<uint64_t>(d);
    }
    if ((numel * bits + 7) / 8 != nbytes)
      fail("tensor of " + std::to_string(numel) + " " + dtype_name(t.dtype) + " elements says " +
           std::to_string(nbytes) + " bytes");
    t.nbytes = static_cast<size_t>(nbytes);
    if (external) {
      uint64_t off = u64("constant offset");
      if (!blob_) fail("constants are in a separate blob, and none was given");
      if (off > blob_->size() || nbytes > blob_->size() - off)
        fail("constant at offset " + std::to_string(off) + " (" + std::to_string(nbytes) +
             " bytes) lies outside the blob of " + std::to_string(blob_->size()) + " bytes");
      return place(std::move(t), blob_->data() + off);
    }
    need(nbytes, "tensor data");
    const char* at = b_.data() + pos_;
    pos_ += nbytes;
    return place(std::move(t), at);
  }
  // The tensor's data at `at`: shared with the buffer's owner when there is one, else copied.
  ConstTensor place(ConstTensor t, const char* at) {
    if (!keep_) return ConstTensor::from_bytes(t.dtype, std::move(t.shape), at, t.nbytes);
    t.data = at;
    t.owned = keep_;
    return t;
  }
  ValueInfo value_info() {
    ValueInfo v;
    v.name = str("value name");
    v.is_tensor = flag("value is_tensor");
    uint8_t kind = u8("value kind");
    if (kind > static_cast<uint8_t>(ValueInfo::Kind::Other))
      fail("value kind " + std::to_string(kind) + " is unknown");
    v.kind = static_cast<ValueInfo::Kind>(kind);
    v.optional = flag("value optional");
    v.dtype = dtype("value element type");
    v.has_shape = flag("value has_shape");
    v.dims = ints("value dims");
    v.dim_names = strs("value dim names");
    return v;
  }
  Attribute attribute(int depth) {
    Attribute a;
    uint8_t type = u8("attribute type");
    if (type > static_cast<uint8_t>(AttrType::Graph))
      fail("attribute type " + std::to_string(type) + " is unknown");
    a.type = static_cast<AttrType>(type);
    switch (a.type) {
      case AttrType::Undefined: break;
      case AttrType::Int: a.i = i64("int attribute"); break;
      case AttrType::Float: a.f = pod<float>("float attribute"); break;
      case AttrType::Ints: a.ints = ints("ints attribute"); break;
      case AttrType::Floats:
        a.floats.resize(count("floats attribute", 4));
        for (auto& f : a.floats) f = pod<float>("floats attribute");
        break;
      case AttrType::String: a.s = str("string attribute"); break;
      case AttrType::Strings: a.strings = strs("strings attribute"); break;
      case AttrType::Tensor:
        if (flag("tensor attribute present"))
          a.t = std::make_shared<ConstTensor>(tensor(/*external=*/false));
        break;
      case AttrType::Graph:
        if (flag("graph attribute present"))
          a.g = std::make_shared<const Graph>(graph(depth + 1));
        break;
    }
    return a;
  }
  Node node(size_t index, int depth) {
    Node n;
    n.index = index;
    n.name = str("node name");
    n.op_type = str("node op type");
    n.domain = str("node domain");
    n.since_version = i32("node since_version");
    n.inputs = strs("node inputs");
    n.outputs = strs("node outputs");
    size_t na = count("node attributes", 9);
    for (size_t i = 0; i < na; ++i) {
      std::string name = str("attribute name");
      n.attrs.insert_or_assign(std::move(name), attribute(depth));
    }
    n.implicit_inputs = strs("node implicit inputs");
    return n;
  }
  Graph graph(int depth) {
    if (depth > kMaxDepth)
      fail("control-flow bodies nested deeper than " + std::to_string(kMaxDepth));
    Graph g;
    g.is_subgraph = flag("graph is_subgraph");
    size_t no = count("opsets", 12);
    for (size_t i = 0; i < no; ++i) {
      std::string d = str("opset domain");
      g.opsets[d] = i32("opset version");
    }
    g.inputs = strs("graph inputs");
    g.outputs = strs("graph outputs");
    size_t nv = count("value infos", 8);
    for (size_t i = 0; i < nv; ++i) {
      auto v = value_info();
      std::string name = v.name;
      g.values.insert_or_assign(std::move(name), std::move(v));
    }
    size_t nc = count("constants", 8);
    for (size_t i = 0; i < nc; ++i) {
      std::string name = str("constant name");
      g.constants.insert_or_assign(std::move(name), tensor(external_));
    }
    size_t nn = count("nodes", 8);
    g.nodes.reserve(nn);
    for (size_t i = 0; i < nn; ++i) g.nodes.push_back(node(i, depth));
    return g;
  }
  SerializedHeader header() {
    need(sizeof(kMagic), "magic");
    if (std::memcmp(b_.data(), kMagic, sizeof(kMagic)) != 0)
      fail("not MLX EP context data (bad magic)");
    pos_ = sizeof(kMagic);
    SerializedHeader h;
    h.version = u32("format version");
    if (h.version != kSerializeVersion)
      fail("format version " + std::to_string(h.version) + ", this EP reads version " +
           std::to_string(kSerializeVersion));
    h.compat = str("compatibility string");
    h.external_constants = flag("external constants flag");
    external_ = h.external_constants;
    return h;
  }
  void end() {
    need(sizeof(kEnd), "end marker");
    if (std::memcmp(b_.data() + pos_, kEnd, sizeof(kEnd)) != 0) fail("bad end marker");
    pos_ += sizeof(kEnd);
    // What may follow: NUL padding only (a string attribute's terminator).
    for (; pos_ < b_.size(); ++pos_)
      if (b_[pos_] != '\0') fail("unexpected bytes after the end marker");
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
  std::optional<std::string_view> blob_;
  std::shared_ptr<const void> keep_;
  bool external_ = false;
};

}  // namespace

std::string serialize(const Graph& g, std::string_view compat, std::string* blob) {
  Writer w(blob);
  w.out.append(kMagic, sizeof(kMagic));
  w.u32(kSerializeVersion);
  w.str(compat);
  w.u8(blob != nullptr);
  w.graph(g);
  w.out.append(kEnd, sizeof(kEnd));
  return std::move(w.out);
}

SerializedHeader read_header(std::string_view bytes) {
  return Reader(bytes, std::nullopt, nullptr).header();
}

Graph deserialize(std::string_view bytes, std::optional<std::string_view> blob,
                  std::shared_ptr<const void> keep) {
  Reader r(bytes, blob, std::move(keep));
  r.header();
  Graph g = r.graph(0);
  r.end();
  return g;
}

}  // namespace ortmlx::graph
