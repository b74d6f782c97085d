// Sequences (seq(tensor)) and optionals. MLX has no list type, so a sequence is a host-side list
// of arrays (ops::Value, Kind::Sequence) that lives only while a fused group is translated:
// building, indexing and erasing are list operations on the host, and only ConcatFromSequence /
// SplitToSequence / the items themselves become MLX ops. Positions are host reads (recorded, so
// a compiled replay is keyed by them); lengths follow from the signature and those reads.
//
// What cannot run here is declined at claim time: ORT's plugin-EP kernel API only has tensor
// outputs, so the partitioner keeps every sequence/optional inside its fused group (a node
// whose sequence result is a graph output, or is read outside the group, is declined with that
// reason -- see partition.cc).
#include <numeric>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

const graph::Graph* body_of(const graph::Node& n, const char* attr) {
  const auto* a = n.attr(attr);
  return a && a->type == graph::AttrType::Graph ? a->g.get() : nullptr;
}

// The declared element dtype of a sequence value (its value info), Undefined when unknown.
DType declared_elem(const graph::Graph& g, const std::string& name) {
  const auto* v = g.info(name);
  return v ? v->dtype : DType::Undefined;
}

// A position in [-n, n-1] (or [-n, n] for an insertion), made non-negative. ONNX declares
// out-of-range positions invalid; ORT fails the run, so do we.
size_t position(OpContext& ctx, size_t input, size_t n, bool insert) {
  int64_t p = ctx.host_int(input);
  int64_t len = static_cast<int64_t>(n);
  int64_t hi = insert ? len : len - 1;
  if (p < -len || p > hi)
    ctx.fail("position " + std::to_string(p) + " is out of range for a sequence of " +
             std::to_string(n));
  return static_cast<size_t>(p < 0 ? p + len : p);
}

Support position_dtype(const NodeQuery& q, size_t i) {
  if (!q.has_input(i)) return Support::yes();
  DType t = q.input_dtype(i);
  if (t != DType::Undefined && t != DType::Int32 && t != DType::Int64)
    return Support::no("position must be int32 or int64");
  return Support::yes();
}

// ---- building and editing ----------------------------------------------------------------

Support check_sequence_empty(const NodeQuery& q) {
  auto t = static_cast<DType>(q.node.attr_int("dtype", static_cast<int64_t>(DType::Float32)));
  if (!to_mlx_dtype(t) || (q.gpu && t == DType::Float64))
    return Support::no(std::string("element dtype ") + graph::dtype_name(t) + " has no MLX dtype" +
                       (q.gpu ? " on the GPU" : ""));
  return Support::yes();
}

Outputs translate_sequence_empty(OpContext& ctx) {
  auto t = static_cast<DType>(ctx.node.attr_int("dtype", static_cast<int64_t>(DType::Float32)));
  return ctx.emit({Value::sequence({}, t)});
}

Outputs translate_sequence_construct(OpContext& ctx) {
  std::vector<mx::array> items;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    items.push_back(ctx.in(i));
    if (items.back().dtype() != items.front().dtype())
      ctx.fail("the tensors of a sequence must share one dtype");
  }
  return ctx.emit({Value::sequence(std::move(items), ctx.in_dtype(0))});
}

Outputs translate_sequence_at(OpContext& ctx) {
  const auto& items = ctx.seq_in(0);
  return {items[position(ctx, 1, items.size(), false)]};
}

Support check_position_1(const NodeQuery& q) { return position_dtype(q, 1); }
Support check_position_2(const NodeQuery& q) { return position_dtype(q, 2); }

Outputs translate_sequence_insert(OpContext& ctx) {
  const Value& seq = ctx.value(0);
  if (!seq.is_sequence()) ctx.fail("input 0 is " + std::string(seq.kind_name()));
  const mx::array& t = ctx.in(1);
  DType elem = seq.elem != DType::Undefined ? seq.elem : ctx.in_dtype(1);
  if (from_mlx_dtype(t.dtype()) != elem)
    ctx.fail(std::string("inserting a ") + graph::dtype_name(ctx.in_dtype(1)) +
             " tensor into a sequence of " + graph::dtype_name(elem));
  std::vector<mx::array> items = seq.items;
  size_t at = ctx.has(2) ? position(ctx, 2, items.size(), true) : items.size();
  items.insert(items.begin() + static_cast<std::ptrdiff_t>(at), t);
  return ctx.emit({Value::sequence(std::move(items), elem)});
}

Outputs translate_sequence_erase(OpContext& ctx) {
  const Value& seq = ctx.value(0);
  if (!seq.is_sequence()) ctx.fail("input 0 is " + std::string(seq.kind_name()));
  std::vector<mx::array> items = seq.items;
  if (items.empty()) ctx.fail("erasing from an empty sequence");
  size_t at = ctx.has(1) ? position(ctx, 1, items.size(), false) : items.size() - 1;
  items.erase(items.begin() + static_cast<std::ptrdiff_t>(at));
  return ctx.emit({Value::sequence(std::move(items), seq.elem)});
}

Outputs translate_sequence_length(OpContext& ctx) {
  return {mx::array(static_cast<int64_t>(ctx.seq_in(0).size()))};
}

// ---- to and from tensors -----------------------------------------------------------------

Support check_concat_from_sequence(const NodeQuery& q) {
  if (!q.node.has_attr("axis")) return Support::no("the axis attribute is required");
  int64_t new_axis = q.node.attr_int("new_axis", 0);
  if (new_axis != 0 && new_axis != 1) return Support::no("new_axis must be 0 or 1");
  return Support::yes();
}

Outputs translate_concat_from_sequence(OpContext& ctx) {
  const auto& items = ctx.seq_in(0);
  // ONNX leaves an empty sequence undefined (there is no shape to give the result); ORT fails.
  if (items.empty()) ctx.fail("the sequence is empty");
  const bool new_axis = ctx.node.attr_int("new_axis", 0) == 1;
  const int rank = static_cast<int>(items[0].ndim());
  int64_t axis = ctx.node.attr_int("axis", 0);
  // new_axis=1 stacks: the axis indexes the result, one rank higher ([-r-1, r]).
  int ax = norm_axis(axis, new_axis ? rank + 1 : rank, "ConcatFromSequence axis");
  for (const auto& a : items) {
    if (static_cast<int>(a.ndim()) != rank) ctx.fail("the tensors differ in rank");
    if (a.dtype() != items[0].dtype()) ctx.fail("the tensors differ in dtype");
    for (int d = 0; d < rank; ++d)
      if ((new_axis || d != ax) && a.shape(d) != items[0].shape(d))
        ctx.fail("the tensors differ in shape off the concatenation axis");
  }
  if (new_axis) return {mx::stack(items, ax, ctx.s)};
  return {mx::concatenate(items, ax, ctx.s)};
}

Support check_split_to_sequence(const NodeQuery& q) {
  if (q.has_input(1)) {
    DType t = q.input_dtype(1);
    if (t != DType::Undefined && t != DType::Int32 && t != DType::Int64)
      return Support::no("split must be int32 or int64");
    int r = q.input_rank(1);
    if (r > 1) return Support::no("split must be a scalar or a 1-D tensor");
  }
  return Support::yes();
}

Outputs translate_split_to_sequence(OpContext& ctx) {
  const mx::array& x = ctx.in(0);
  const int rank = static_cast<int>(x.ndim());
  if (rank < 1) ctx.fail("cannot split a scalar");
  const int ax = norm_axis(ctx.node.attr_int("axis", 0), rank, "SplitToSequence axis");
  const int64_t dim = x.shape(ax);
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (!ctx.has(1)) {
    // No split: chunks of 1, and keepdims=0 drops the split axis from each.
    sizes.assign(static_cast<size_t>(dim), 1);
    squeeze = ctx.node.attr_int("keepdims", 1) == 0;
  } else if (ctx.in(1).ndim() == 0) {
    // A scalar: chunks of that size, the last one possibly shorter (keepdims is ignored).
    int64_t n = ctx.host_int(1);
    if (n <= 0) ctx.fail("split must be positive, got " + std::to_string(n));
    for (int64_t done = 0; done < dim; done += n) sizes.push_back(std::min(n, dim - done));
  } else {
    sizes = ctx.host_ints(1);
    for (auto v : sizes)
      if (v < 0) ctx.fail("split has a negative length");
    if (std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != dim)
      ctx.fail("split lengths do not add up to the axis length " + std::to_string(dim));
  }
  std::vector<mx::array> items;
  mx::Shape start(rank, 0), stop(x.shape().begin(), x.shape().end()), strides(rank, 1);
  int64_t at = 0;
  for (auto n : sizes) {
    start[ax] = static_cast<int32_t>(at);
    stop[ax] = static_cast<int32_t>(at + n);
    mx::array part = mx::slice(x, start, stop, strides, ctx.s);
    items.push_back(squeeze ? mx::squeeze(part, ax, ctx.s) : part);
    at += n;
  }
  return ctx.emit({Value::sequence(std::move(items), ctx.in_dtype(0))});
}

// ---- SequenceMap ---------------------------------------------------------------------------

Support check_sequence_map(const NodeQuery& q) {
  const auto* body = body_of(q.node, "body");
  if (!body) return Support::no("the body subgraph is missing");
  if (body->inputs.size() != q.num_inputs())
    return Support::no("the body takes " + std::to_string(body->inputs.size()) +
                       " inputs, the node has " + std::to_string(q.num_inputs()));
  if (body->outputs.size() != q.node.outputs.size())
    return Support::no("the body's outputs do not match the node's");
  return Support::yes();
}

// Runs the body once per position of the sequence inputs (tensor inputs are passed whole to
// every iteration) and collects each body output into a sequence. Unrolled, like Loop.
Outputs translate_sequence_map(OpContext& ctx) {
  const graph::Graph& body = *body_of(ctx.node, "body");
  const size_t n = ctx.seq_in(0).size();
  for (size_t i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.value(i).is_sequence() && ctx.value(i).items.size() != n)
      ctx.fail("the input sequences differ in length");
  std::vector<std::vector<mx::array>> collected(body.outputs.size());
  for (size_t k = 0; k < n; ++k) {
    std::vector<Value> args;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      const Value& v = ctx.value(i);
      args.push_back(v.is_sequence() ? Value::of(v.items[k]) : v);
    }
    auto outs = ctx.run_subgraph_values(body, args);
    for (size_t j = 0; j < outs.size() && j < collected.size(); ++j) {
      if (!outs[j].is_tensor()) ctx.fail("the body returned " + std::string(outs[j].kind_name()));
      collected[j].push_back(*outs[j].tensor);
    }
  }
  std::vector<Value> result;
  for (size_t j = 0; j < collected.size(); ++j) {
    DType elem = declared_elem(ctx.graph, ctx.node.has_output(j) ? ctx.node.outputs[j] : "");
    result.push_back(Value::sequence(std::move(collected[j]), elem));
  }
  return ctx.emit(std::move(result));
}

// ---- optionals ------------------------------------------------------------------------------

// Optional(x) is x itself (an optional holding an element is carried as the element);
// Optional() is the empty optional.
Outputs translate_optional(OpContext& ctx) {
  return ctx.emit({ctx.given(0) ? ctx.value(0) : Value::none()});
}

// Opset 18 also takes a plain tensor/sequence (true) or no input at all (false).
Outputs translate_optional_has_element(OpContext& ctx) {
  bool has = ctx.given(0) && !ctx.value(0).is_none();
  return {mx::array(has)};
}

Outputs translate_optional_get_element(OpContext& ctx) {
  const Value& v = ctx.value(0);
  if (v.is_none()) ctx.fail("the optional is empty");  // ONNX: undefined; ORT fails the run
  return ctx.emit({v});
}

const OpEntry kSequenceOps[] = {
    {"", "SequenceEmpty", 11, kAnyOpset, check_sequence_empty, translate_sequence_empty,
     "sequences live only inside a fused group (a plugin EP returns tensors only)"},
    {"", "SequenceConstruct", 11, kAnyOpset, nullptr, translate_sequence_construct,
     "sequences live only inside a fused group"},
    {"", "SequenceAt", 11, kAnyOpset, check_position_1, translate_sequence_at,
     "position read on the host"},
    {"", "SequenceInsert", 11, kAnyOpset, check_position_2, translate_sequence_insert,
     "position read on the host; sequences live only inside a fused group"},
    {"", "SequenceErase", 11, kAnyOpset, check_position_1, translate_sequence_erase,
     "position read on the host; sequences live only inside a fused group"},
    {"", "SequenceLength", 11, kAnyOpset, nullptr, translate_sequence_length},
    {"", "ConcatFromSequence", 11, kAnyOpset, check_concat_from_sequence,
     translate_concat_from_sequence, "an empty sequence fails at run time (as on ORT's CPU EP)"},
    {"", "SplitToSequence", 11, kAnyOpset, check_split_to_sequence, translate_split_to_sequence,
     "split read on the host; sequences live only inside a fused group"},
    {"", "SequenceMap", 17, kAnyOpset, check_sequence_map, translate_sequence_map,
     "unrolled over the sequence; sequences live only inside a fused group"},
    {"", "Optional", 15, kAnyOpset, nullptr, translate_optional,
     "optionals live only inside a fused group"},
    {"", "OptionalHasElement", 15, kAnyOpset, nullptr, translate_optional_has_element},
    {"", "OptionalGetElement", 15, kAnyOpset, nullptr, translate_optional_get_element,
     "a sequence result lives only inside a fused group"},
};

}  // namespace

std::span<const OpEntry> sequence_ops() { return kSequenceOps; }

}  // namespace ortmlx::ops
