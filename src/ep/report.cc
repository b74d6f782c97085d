#include "ep/report.h"

#include <sstream>

#include "engine/caller_eval.h"
#include "engine/device_buffers.h"
#include "engine/stream_hold.h"
#include "kernels/cpu/buffers.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/dequantize.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/graph_replay.h"
#include "kernels/cuda/pinned_inputs.h"
#include "kernels/cuda/skip_rms_norm.h"
#include "ep/memory_limits.h"
#include "ep/ort_api.h"
#include "trace/trace.h"

namespace ortmlx::ep {

using trace::json_escape;

std::string declined_lines(const graph::Graph& g, const partition::Result& result) {
  std::ostringstream f;
  for (const auto& d : result.declined) {
    const auto& n = g.nodes[d.node];
    if (n.domain == kEpName) continue;  // our own fused nodes, seen by a later ORT pass
    f << "{\"node\":\"" << json_escape(n.name) << "\",\"op\":\"" << json_escape(n.op_type)
      << "\",\"domain\":\"" << json_escape(n.domain) << "\",\"reason\":\""
      << json_escape(d.reason) << "\"}\n";
  }
  return f.str();
}

std::string stats_line(const std::string& fused_node, const engine::Stats& st) {
  std::ostringstream f;
  f << "{\"fused_node\":\"" << json_escape(fused_node) << "\",\"runs\":" << st.runs
    << ",\"compiled_runs\":" << st.compiled_runs << ",\"eager_runs\":" << st.eager_runs
    << ",\"traces\":" << st.traces << ",\"compute_ns\":" << st.compute_ns
    << ",\"eval_ns\":" << st.eval_ns << ",\"translate_ns\":" << st.translate_ns
    << ",\"host_reads\":" << st.host_reads << ",\"host_read_ns\":" << st.host_read_ns
    << ",\"host_folds\":" << st.host_folds
    << ",\"eval_arrays\":" << st.eval_arrays << ",\"walk_replays\":" << st.walk_replays << ",\"inputs_in_place\":" << st.inputs_in_place << ",\"outputs_in_place\":" << st.outputs_in_place << ",\"piecewise_runs\":" << st.piecewise_runs
    << ",\"segment_calls\":" << st.segment_calls << ",\"segment_traces\":" << st.segment_traces
    << ",\"segment_walks\":" << st.segment_walks << ",\"segment_walk_misses\":" << st.segment_walk_misses
    << ",\"empty_operand_runs\":" << st.empty_operand_runs
    << ",\"polled_evals\":" << st.polled_evals << ",\"after_short_evals\":" << st.after_short_evals
    << ",\"fusion_kept_fused\":" << st.fusion_kept_fused << ",\"fusion_kept_unfused\":" << st.fusion_kept_unfused
    << ",\"fusion_trials_skipped\":" << st.fusion_trials_skipped
    << ",\"compute_ns_compiled\":" << st.compute_ns_compiled
    << ",\"eval_ns_compiled\":" << st.eval_ns_compiled
    << ",\"outputs_ns_compiled\":" << st.outputs_ns_compiled
    << ",\"inputs_ns_compiled\":" << st.inputs_ns_compiled << ",\"call_ns_compiled\":" << st.call_ns_compiled
    << ",\"replay_captures\":" << st.replay_captures << ",\"replay_runs\":" << st.replay_runs
    << ",\"replay_drops\":" << st.replay_drops << ",\"replay_failures\":" << st.replay_failures
    << ",\"process_replay_captures\":" << kernels::cuda::graph_replay_counters().captures
    << ",\"process_replay_capture_failures\":" << kernels::cuda::graph_replay_counters().capture_failures
    << ",\"process_replay_launches\":" << kernels::cuda::graph_replay_counters().launches
    << ",\"process_decode_attention_nodes\":" << kernels::cuda::decode_attention_nodes()
    << ",\"process_decode_attention_qkv_nodes\":" << kernels::cuda::decode_attention_qkv_nodes()
    << ",\"process_decode_attention_split_nodes\":" << kernels::cuda::decode_attention_split_nodes()
    << ",\"process_skip_rms_norm_nodes\":" << kernels::cuda::skip_rms_norm_nodes()
    << ",\"process_dequantize_int4_nodes\":" << kernels::cuda::dequantize_int4_nodes()
    << ",\"process_device_copies\":" << kernels::cuda::host_copies()
    << ",\"process_pinned_inputs\":" << kernels::cuda::pinned_copies()
    << ",\"process_pinned_bytes\":" << kernels::cuda::pinned_bytes()
    << ",\"process_cache_limit_raises\":" << cache_limit_raises()
    << ",\"process_cache_limit_bytes\":" << cache_limit_bytes()
    << ",\"process_dnnl_convs\":" << ops::cpu_dnnl_conv_runs()
    << ",\"process_dnnl_one_thread_convs\":" << ops::cpu_dnnl_conv_one_thread_runs()
    << ",\"process_dnnl_conv_adds\":" << ops::cpu_dnnl_conv_add_runs()
    << ",\"process_dnnl_conv_adds_in_place\":" << ops::cpu_dnnl_conv_add_in_place()
    << ",\"process_dnnl_failures\":" << ops::cpu_dnnl_conv_failures()
    << ",\"process_dnnl_gemm_refusals\":" << ops::cpu_dnnl_conv_gemm_refusals()
    << ",\"process_dnnl_winograd_runs\":" << ops::cpu_dnnl_conv_winograd_runs()
    << ",\"process_dnnl_convs_concats\":" << ops::cpu_dnnl_convs_concats()
    << ",\"process_dnnl_matmuls\":" << ops::cpu_dnnl_matmul_runs()
    << ",\"process_dnnl_matmul_failures\":" << ops::cpu_dnnl_matmul_failures()
    << ",\"process_openmp_regions\":" << ops::cpu_openmp_regions()
    << ",\"process_packed_matmuls\":" << ops::cpu_packed_matmul_runs()
    << ",\"process_packed_huge_page_bytes\":" << ops::cpu_packed_huge_page_bytes()
    << ",\"process_packed_panel_layouts\":" << ops::cpu_packed_panel_layouts()
    << ",\"process_packed_prefetch_bytes\":" << ops::cpu_packed_prefetch_bytes()
    << ",\"process_packed_row_splits\":" << ops::cpu_packed_row_splits()
    << ",\"process_packed_stream_walks\":" << ops::cpu_packed_stream_walks()
    << ",\"process_packed_ahead_walks\":" << ops::cpu_packed_ahead_walks()
    << ",\"packed_default_depth\":" << ops::cpu_packed_default_depth()
    << ",\"process_int4_panel_layouts\":" << ops::cpu_int4_panel_layouts()
    << ",\"process_lstm_cells\":" << ops::cpu_lstm_cell_runs()
    << ",\"process_reused_outputs\":" << ops::cpu_reused_outputs()
    << ",\"process_held_runs\":" << engine::StreamHold::held_runs()
    << ",\"process_hold_lingers\":" << engine::StreamHold::lingers()
    << ",\"process_hold_linger_hits\":" << engine::StreamHold::linger_hits()
    << ",\"process_caller_arrays\":" << engine::caller_eval_arrays()
    << ",\"process_caller_stream_arrays\":" << engine::caller_eval_stream_arrays()
    << ",\"process_caller_left\":" << engine::caller_eval_left()
    << ",\"process_caller_replays\":" << engine::caller_eval_replays()
    << ",\"process_caller_released\":" << engine::caller_eval_released()
    << ",\"process_pinned_workers\":" << ops::cpu_pinned_openmp_workers()
    << ",\"process_pinned_stream\":" << (ops::cpu_pinned_stream_thread() ? "true" : "false")
    << ",\"process_device_copy_skips\":{";
  for (size_t i = 0; i < kernels::cuda::kCopySkipReasons; ++i) {
    auto why = static_cast<kernels::cuda::CopySkip>(i);
    f << (i ? "," : "") << '"' << kernels::cuda::copy_skip_name(why) << "\":" << kernels::cuda::copy_skips(why);
  }
  f << "}}\n";
  return f.str();
}

std::string device_memory_line() {
  namespace db = engine::device_buffers;
  const auto& c = db::counters();
  std::ostringstream f;
  f << "{\"device_memory\":{\"allocations\":" << c.allocations << ",\"frees\":" << c.frees
    << ",\"allocations_pooled\":" << c.allocations_pooled
    << ",\"live_buffers\":" << db::count() << ",\"live_bytes\":" << db::bytes()
    << ",\"inputs_borrowed\":" << c.inputs_borrowed << ",\"outputs_adopted\":"
    << c.outputs_adopted << ",\"outputs_copied\":" << c.outputs_copied
    << ",\"outputs_written_on_device\":" << c.outputs_written_on_device
    << ",\"outputs_by_driver\":" << c.outputs_by_driver
    << ",\"outputs_rows_in_place\":" << c.outputs_rows_in_place
    << ",\"outputs_rows_in_step\":" << c.outputs_rows_in_step
    << ",\"copies_h2d\":" << c.copies_h2d << ",\"copies_d2h\":" << c.copies_d2h
    << ",\"copies_d2d\":" << c.copies_d2d << ",\"bytes_h2d\":" << c.bytes_h2d
    << ",\"bytes_d2h\":" << c.bytes_d2h << ",\"bytes_d2d\":" << c.bytes_d2d
    << ",\"copies_by_driver\":" << c.copies_by_driver << "}}\n";
  return f.str();
}

}  // namespace ortmlx::ep
