// Control flow: If, Loop, Scan, claimed whole with their bodies (the partitioner checks every
// node inside). A body is translated by the engine (ctx.run_subgraph) into the same MLX graph
// as the rest of the fused group, so:
//   - If reads its condition on the host and translates only the taken branch. A constant or
//     shape-derived condition stays compiled; a data-dependent one keys the program on that
//     input (small) or makes it eager (large) -- the engine decides, from the host read.
//   - Loop and Scan are unrolled: the trip count (M, or a Scan's sequence length) and a Loop's
//     condition are read on the host each iteration, and a compiled replay is keyed by them.
// If and Loop also carry sequences and optionals (ops::Value: a host-side list of arrays, or
// "none"), e.g. the common export of a Loop that appends one tensor per iteration with
// SequenceInsert; the partitioner keeps those values inside the fused group.
#include <climits>

#include "ops/common.h"

namespace ortmlx::ops {

namespace {

const graph::Graph* body_of(const graph::Node& n, const char* attr) {
  const auto* a = n.attr(attr);
  return a && a->type == graph::AttrType::Graph ? a->g.get() : nullptr;
}

size_t count_outputs(const graph::Node& n) { return n.outputs.size(); }

// The empty per-iteration stack of a loop that ran zero times: ORT gives it the body output's
// rank with unknown dims as 0, and the new axis (length 0) at `axis`.
mx::array empty_stack(const OpContext& ctx, const graph::Graph& body, size_t body_out,
                      size_t node_out, int64_t axis) {
  const auto* vi = body.info(body.outputs.at(body_out));
  DType t = vi && vi->dtype != DType::Undefined ? vi->dtype : ctx.out_dtype(node_out);
  if (t == DType::Undefined) ctx.fail("zero iterations and no known dtype for a scan output");
  std::vector<int64_t> dims;
  if (vi && vi->has_shape)
    for (auto d : vi->dims) dims.push_back(d < 0 ? 0 : d);
  int rank = static_cast<int>(dims.size()) + 1;
  dims.insert(dims.begin() + norm_axis(axis, rank, "scan output axis"), 0);
  return mx::zeros(to_shape(dims), mlx_dtype(t), ctx.s);
}

// ---- If --------------------------------------------------------------------------------------

Support check_if(const NodeQuery& q) {
  const auto* then_g = body_of(q.node, "then_branch");
  const auto* else_g = body_of(q.node, "else_branch");
  if (!then_g || !else_g) return Support::no("a branch subgraph is missing");
  if (then_g->outputs.size() < count_outputs(q.node) || else_g->outputs.size() < count_outputs(q.node))
    return Support::no("a branch returns fewer values than the node has outputs");
  return Support::yes();
}

Outputs translate_if(OpContext& ctx) {
  auto cond = ctx.host_ints(0);
  if (cond.size() != 1) ctx.fail("cond must hold exactly one element, has " + std::to_string(cond.size()));
  const auto* branch = body_of(ctx.node, cond[0] ? "then_branch" : "else_branch");
  if (!branch) ctx.fail("the branch subgraph is missing");
  return ctx.emit(ctx.run_subgraph_values(*branch, {}));
}

// ---- Loop ------------------------------------------------------------------------------------

Support check_loop(const NodeQuery& q) {
  const auto* body = body_of(q.node, "body");
  if (!body) return Support::no("the body subgraph is missing");
  if (!q.has_input(0) && !q.has_input(1))
    return Support::no("neither M nor cond is given: the loop never ends");
  size_t n_in = q.num_inputs();
  size_t carried = n_in > 2 ? n_in - 2 : 0;
  if (body->inputs.size() != 2 + carried)
    return Support::no("the body takes " + std::to_string(body->inputs.size()) +
                       " inputs, expected 2 + " + std::to_string(carried) + " loop-carried");
  if (body->outputs.size() < 1 + carried || body->outputs.size() - 1 < count_outputs(q.node))
    return Support::no("the body's outputs do not match the node's");
  return Support::yes();
}

Outputs translate_loop(OpContext& ctx) {
  const graph::Graph& body = *body_of(ctx.node, "body");
  const size_t carried = ctx.num_inputs() > 2 ? ctx.num_inputs() - 2 : 0;
  const size_t scans = body.outputs.size() - 1 - carried;
  const bool has_m = ctx.has(0), has_cond = ctx.has(1);
  const int64_t trip = has_m ? ctx.host_int(0) : INT64_MAX;
  bool go = has_cond ? ctx.host_int(1) != 0 : true;

  // The body's `cond` input is the previous iteration's cond output (true at first when the
  // node has none). With only M given, that output does not end the loop (ONNX: "ignored").
  mx::array cond = has_cond ? ctx.in(1) : mx::array(true);
  // Loop-carried values may be sequences or optionals (a sequence grown per iteration).
  std::vector<Value> state;
  for (size_t i = 0; i < carried; ++i) state.push_back(ctx.value(2 + i));
  std::vector<std::vector<mx::array>> per_iter(scans);
  for (int64_t it = 0; it < trip && go; ++it) {
    std::vector<Value> args{Value::of(mx::array(it)), Value::of(cond)};
    args.insert(args.end(), state.begin(), state.end());
    auto outs = ctx.run_subgraph_values(body, args);
    for (size_t j = 0; j < outs.size(); ++j)
      if ((j == 0 || j > carried) && !outs[j].is_tensor())
        ctx.fail("body output " + std::to_string(j) + " is " + outs[j].kind_name() +
                 ", expected a tensor (the condition, or a scan output)");
    cond = *outs[0].tensor;
    if (has_cond) go = ctx.host_scalar(cond) != 0;
    for (size_t i = 0; i < carried; ++i) state[i] = outs[1 + i];
    for (size_t k = 0; k < scans; ++k) per_iter[k].push_back(*outs[1 + carried + k].tensor);
  }

  Outputs result = ctx.emit(state);
  for (size_t k = 0; k < scans; ++k) {
    if (per_iter[k].empty()) {
      result.push_back(empty_stack(ctx, body, 1 + carried + k, carried + k, 0));
      continue;
    }
    const auto& shape0 = per_iter[k][0].shape();
    for (const auto& a : per_iter[k])
      if (a.shape() != shape0)
        ctx.fail("scan output " + std::to_string(k) + " changes shape between iterations");
    result.push_back(mx::stack(per_iter[k], 0, ctx.s));
  }
  return result;
}

// ---- Scan ------------------------------------------------------------------------------------

// The scan shared by opset 8 (per batch entry) and 9+: `state` are the initial states, `xs`
// the scan inputs; returns final states then the stacked scan outputs.
struct ScanSpec {
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;
};

Outputs run_scan(OpContext& ctx, const graph::Graph& body, std::vector<mx::array> state,
                 const std::vector<mx::array>& xs, const ScanSpec& spec, size_t n_out_scans) {
  const size_t n_state = state.size();
  int64_t len = -1;
  std::vector<int> axes;
  for (size_t j = 0; j < xs.size(); ++j) {
    int rank = static_cast<int>(xs[j].ndim());
    if (rank < 1) ctx.fail("scan input " + std::to_string(j) + " is a scalar");
    int ax = norm_axis(spec.in_axes[j], rank, "scan_input_axes");
    axes.push_back(ax);
    int64_t n = xs[j].shape(ax);
    if (len >= 0 && n != len)
      ctx.fail("scan inputs have different sequence lengths (" + std::to_string(len) + " and " +
               std::to_string(n) + ")");
    len = n;
  }
  if (len < 0) len = 0;
  std::vector<std::vector<mx::array>> per_iter(n_out_scans);
  for (int64_t t = 0; t < len; ++t) {
    std::vector<mx::array> args = state;
    for (size_t j = 0; j < xs.size(); ++j) {
      int idx = static_cast<int>(spec.in_dirs[j] ? len - 1 - t : t);
      args.push_back(mx::take(xs[j], idx, axes[j], ctx.s));
    }
    auto outs = ctx.run_subgraph(body, args);
    for (size_t i = 0; i < n_state; ++i) state[i] = outs[i];
    for (size_t k = 0; k < n_out_scans; ++k) per_iter[k].push_back(outs[n_state + k]);
  }
  Outputs result = state;
  for (size_t k = 0; k < n_out_scans; ++k) {
    auto& v = per_iter[k];
    if (v.empty()) {
      result.push_back(empty_stack(ctx, body, n_state + k, n_state + k, spec.out_axes[k]));
      continue;
    }
    // Reverse direction: iteration t's output lands at position len-1-t.
    if (spec.out_dirs[k]) std::reverse(v.begin(), v.end());
    int rank = static_cast<int>(v[0].ndim()) + 1;
    result.push_back(mx::stack(v, norm_axis(spec.out_axes[k], rank, "scan_output_axes"), ctx.s));
  }
  return result;
}

Support check_scan_attrs(const NodeQuery& q, size_t n_state, size_t n_scan_in,
                         const std::vector<const char*>& in_attrs) {
  const auto* body = body_of(q.node, "body");
  if (!body) return Support::no("the body subgraph is missing");
  if (body->inputs.size() != n_state + n_scan_in)
    return Support::no("the body takes " + std::to_string(body->inputs.size()) +
                       " inputs, expected " + std::to_string(n_state + n_scan_in));
  if (body->outputs.size() < count_outputs(q.node) || body->outputs.size() < n_state)
    return Support::no("the body's outputs do not match the node's");
  size_t n_out_scans = body->outputs.size() - n_state;
  for (const char* a : in_attrs)
    if (q.node.has_attr(a) && q.node.attr_ints(a).size() != n_scan_in)
      return Support::no(std::string(a) + " needs one entry per scan input");
  for (const char* a : {"scan_output_axes", "scan_output_directions"})
    if (q.node.has_attr(a) && q.node.attr_ints(a).size() != n_out_scans)
      return Support::no(std::string(a) + " needs one entry per scan output");
  return Support::yes();
}

ScanSpec scan_spec(const graph::Node& n, size_t n_scan_in, size_t n_out_scans,
                   const char* in_dirs_attr) {
  ScanSpec s;
  s.in_axes = n.attr_ints("scan_input_axes", std::vector<int64_t>(n_scan_in, 0));
  s.in_dirs = n.attr_ints(in_dirs_attr, std::vector<int64_t>(n_scan_in, 0));
  s.out_axes = n.attr_ints("scan_output_axes", std::vector<int64_t>(n_out_scans, 0));
  s.out_dirs = n.attr_ints("scan_output_directions", std::vector<int64_t>(n_out_scans, 0));
  return s;
}

// Scan 9+: inputs = N initial states, then M scan inputs (num_scan_inputs).
Support check_scan(const NodeQuery& q) {
  int64_t m = q.node.attr_int("num_scan_inputs", -1);
  if (m < 1 || static_cast<size_t>(m) > q.num_inputs())
    return Support::no("num_scan_inputs is missing or out of range");
  return check_scan_attrs(q, q.num_inputs() - static_cast<size_t>(m), static_cast<size_t>(m),
                          {"scan_input_axes", "scan_input_directions"});
}

Outputs translate_scan(OpContext& ctx) {
  const graph::Graph& body = *body_of(ctx.node, "body");
  const size_t m = static_cast<size_t>(ctx.node.attr_int("num_scan_inputs", 0));
  const size_t n_state = ctx.num_inputs() - m;
  std::vector<mx::array> state, xs;
  for (size_t i = 0; i < n_state; ++i) state.push_back(ctx.in(i));
  for (size_t j = 0; j < m; ++j) xs.push_back(ctx.in(n_state + j));
  auto spec = scan_spec(ctx.node, m, body.outputs.size() - n_state, "scan_input_directions");
  return run_scan(ctx, body, std::move(state), xs, spec, body.outputs.size() - n_state);
}

// Scan 8: input 0 is sequence_lens (optional), then N states and M scan inputs, all with a
// leading batch axis; the scan axis is 1. Each batch entry is scanned on its own.
Support check_scan8(const NodeQuery& q) {
  if (q.has_input(0))
    return Support::no("sequence_lens (per-batch lengths with zero padding) is not supported");
  int64_t m = q.node.attr_int("num_scan_inputs", -1);
  if (m < 1 || static_cast<size_t>(m) + 1 > q.num_inputs())
    return Support::no("num_scan_inputs is missing or out of range");
  return check_scan_attrs(q, q.num_inputs() - 1 - static_cast<size_t>(m), static_cast<size_t>(m),
                          {"directions"});
}

Outputs translate_scan8(OpContext& ctx) {
  const graph::Graph& body = *body_of(ctx.node, "body");
  const size_t m = static_cast<size_t>(ctx.node.attr_int("num_scan_inputs", 0));
  const size_t n_state = ctx.num_inputs() - 1 - m;
  const size_t n_out_scans = body.outputs.size() - n_state;
  ScanSpec spec = scan_spec(ctx.node, m, n_out_scans, "directions");
  spec.in_axes.assign(m, 0);  // axis 1 of the batched input = axis 0 of one batch entry
  spec.out_axes.assign(n_out_scans, 0);
  spec.out_dirs.assign(n_out_scans, 0);
  int64_t batch = -1;
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    if (ctx.in(i).ndim() < 1) ctx.fail("input " + std::to_string(i) + " has no batch axis");
    int64_t b = ctx.in(i).shape(0);
    if (batch >= 0 && b != batch) ctx.fail("inputs disagree on the batch size");
    batch = b;
  }
  std::vector<std::vector<mx::array>> per_batch(n_state + n_out_scans);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<mx::array> state, xs;
    for (size_t i = 0; i < n_state; ++i) state.push_back(mx::take(ctx.in(1 + i), static_cast<int>(b), 0, ctx.s));
    for (size_t j = 0; j < m; ++j) xs.push_back(mx::take(ctx.in(1 + n_state + j), static_cast<int>(b), 0, ctx.s));
    auto outs = run_scan(ctx, body, std::move(state), xs, spec, n_out_scans);
    for (size_t k = 0; k < outs.size(); ++k) per_batch[k].push_back(outs[k]);
  }
  Outputs result;
  for (size_t k = 0; k < per_batch.size(); ++k) {
    if (per_batch[k].empty()) {  // batch 0: the declared shapes with a 0 leading dim
      DType t = ctx.out_dtype(k);
      if (t == DType::Undefined) ctx.fail("an empty batch and no known output dtype");
      result.push_back(mx::zeros({0}, mlx_dtype(t), ctx.s));
      continue;
    }
    result.push_back(mx::stack(per_batch[k], 0, ctx.s));
  }
  return result;
}

const OpEntry kControlFlowOps[] = {
    {"", "If", 1, kAnyOpset, check_if, translate_if,
     "only the taken branch is translated (condition read on the host)"},
    {"", "Loop", 1, kAnyOpset, check_loop, translate_loop,
     "unrolled; M and cond read on the host each iteration; M and cond both absent "
     "(an endless loop) declined"},
    {"", "Scan", 8, 8, check_scan8, translate_scan8, "sequence_lens declined"},
    {"", "Scan", 9, kAnyOpset, check_scan, translate_scan, "unrolled over the sequence axis"},
};

}  // namespace

std::span<const OpEntry> control_flow_ops() { return kControlFlowOps; }

}  // namespace ortmlx::ops
