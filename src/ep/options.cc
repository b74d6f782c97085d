#include "ep/options.h"

#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace ortmlx::ep {

namespace {

std::string lookup(const std::map<std::string, std::string>& entries, const std::string& key) {
  if (auto it = entries.find(key); it != entries.end()) return it->second;
  std::string env = "ORT_MLX_";
  for (char c : key) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (const char* v = std::getenv(env.c_str())) return v;
  return {};
}

long long to_int(const std::string& key, const std::string& v, long long lo, long long hi) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || x < lo || x > hi)
    throw std::invalid_argument("option '" + key + "': '" + v + "' is not an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

}  // namespace

EpOptions parse_options(const std::map<std::string, std::string>& entries) {
  static const char* known[] = {"device", "compile", "cache_size", "compile_after", "log_level",
                                "report_path", "memory_limit_mb", "cache_limit_mb",
                                "device_memory", "tf32", "int8_emulation", "shape_family", "host_fold",
                                "index_check", "step_order", "fused_rotary", "zero_bias",
                                "grouped_kv", "cpu_gemv", "gpu_kernels", "inplace_rows",
                                "profile_ops", "device_copies", "fuse_matmuls", "fused_skip_norm", "step_row_writes",
                                "fused_gqa_step", "flat_products", "transposed_weights", "cpu_dnnl", "cpu_dnnl_min_flops", "cpu_dnnl_parallel_min_flops", "cpu_program_parallel_min_flops", "cpu_dnnl_matmul", "fuse_conv_activation", "int4_dense_rows", "cpu_fuse", "pinned_inputs", "cpu_poll", "cpu_poll_us", "cpu_hold", "cpu_caller_eval", "cpu_caller_replay", "cpu_walk_large", "cpu_pin_workers", "cpu_attention", "cpu_gelu", "cpu_product_gelu", "cpu_int4_gemm", "cpu_in_place_io", "cpu_packed_matmul", "cpu_packed_blocks", "cpu_packed_rows", "cpu_packed_stream", "cpu_packed_ahead", "cpu_packed_depth", "cpu_packed_prepared", "cpu_skip_norm", "cpu_gqa_prompt", "cpu_swiglu", "cpu_dnnl_blocked", "cpu_dnnl_add", "cpu_dnnl_blocked16", "cpu_dnnl_winograd", "cpu_dnnl_concat_convs", "cpu_depthwise", "cpu_patch_deconv",
                                "gpu_graph_replay", "int4_dequantize_kernel", "gpu_attention_split_rows", "cpu_avx512"};
  for (const auto& [k, v] : entries) {
    bool ok = false;
    for (auto* n : known) ok |= k == n;
    if (!ok) throw std::invalid_argument("unknown MLX EP option '" + k + "'");
  }
  EpOptions o;
  if (auto v = lookup(entries, "device"); !v.empty()) {
    if (v != "auto" && v != "cpu" && v != "gpu")
      throw std::invalid_argument("option 'device': '" + v + "' is not auto, cpu or gpu");
    o.device = v;
  }
  if (auto v = lookup(entries, "compile"); !v.empty()) o.engine.compile = to_int("compile", v, 0, 1);
  if (auto v = lookup(entries, "cache_size"); !v.empty())
    o.engine.cache_capacity = to_int("cache_size", v, 1, 1 << 20);
  if (auto v = lookup(entries, "compile_after"); !v.empty())
    o.engine.compile_after = static_cast<int>(to_int("compile_after", v, 1, 1 << 20));
  if (auto v = lookup(entries, "shape_family"); !v.empty())
    o.engine.shape_family = to_int("shape_family", v, 0, 1);
  if (auto v = lookup(entries, "host_fold"); !v.empty())
    o.engine.host_fold = to_int("host_fold", v, 0, 1);
  if (auto v = lookup(entries, "index_check"); !v.empty())
    o.engine.index_check = to_int("index_check", v, 0, 1);
  for (auto [key, flag] : {std::pair{"step_order", &o.engine.step_order},
                           std::pair{"fused_rotary", &o.engine.fused_rotary},
                           std::pair{"zero_bias", &o.engine.zero_bias},
                           std::pair{"grouped_kv", &o.engine.grouped_kv},
                           std::pair{"cpu_gemv", &o.engine.cpu_gemv},
                           std::pair{"gpu_kernels", &o.engine.gpu_kernels},
                           std::pair{"inplace_rows", &o.engine.inplace_rows},
                           std::pair{"profile_ops", &o.engine.profile_ops},
                           std::pair{"fuse_matmuls", &o.engine.fuse_matmuls},
                           std::pair{"fused_skip_norm", &o.engine.fused_skip_norm},
                           std::pair{"step_row_writes", &o.engine.step_row_writes},
                           std::pair{"fused_gqa_step", &o.engine.fused_gqa_step},
                           std::pair{"flat_products", &o.engine.flat_products},
                           std::pair{"transposed_weights", &o.engine.transposed_weights},
                           std::pair{"cpu_dnnl", &o.engine.cpu_dnnl},
                           std::pair{"cpu_dnnl_matmul", &o.engine.cpu_dnnl_matmul},
                           std::pair{"fuse_conv_activation", &o.engine.fuse_conv_activation},
                           std::pair{"cpu_poll", &o.engine.cpu_poll},
                           std::pair{"cpu_hold", &o.engine.cpu_hold},
                           std::pair{"cpu_caller_eval", &o.engine.cpu_caller_eval},
                           std::pair{"cpu_caller_replay", &o.engine.cpu_caller_replay},
                           std::pair{"cpu_walk_large", &o.engine.cpu_walk_large},
                           std::pair{"cpu_pin_workers", &o.engine.cpu_pin_workers},
                           std::pair{"cpu_attention", &o.engine.cpu_attention},
                           std::pair{"cpu_gelu", &o.engine.cpu_gelu},
                           std::pair{"cpu_product_gelu", &o.engine.cpu_product_gelu},
                           std::pair{"cpu_swiglu", &o.engine.cpu_swiglu},
                           std::pair{"cpu_int4_gemm", &o.engine.cpu_int4_gemm},
                           std::pair{"cpu_in_place_io", &o.engine.cpu_in_place_io},
                           std::pair{"cpu_packed_matmul", &o.engine.cpu_packed_matmul},
                           std::pair{"cpu_packed_blocks", &o.engine.cpu_packed_blocks},
                           std::pair{"cpu_packed_prepared", &o.engine.cpu_packed_prepared},
                           std::pair{"cpu_skip_norm", &o.engine.cpu_skip_norm},
                           std::pair{"cpu_gqa_prompt", &o.engine.cpu_gqa_prompt},
                           std::pair{"cpu_dnnl_blocked", &o.engine.cpu_dnnl_blocked},
                           std::pair{"cpu_dnnl_add", &o.engine.cpu_dnnl_add},
                           std::pair{"cpu_dnnl_blocked16", &o.engine.cpu_dnnl_blocked16},
                           std::pair{"cpu_dnnl_winograd", &o.engine.cpu_dnnl_winograd},
                           std::pair{"cpu_dnnl_concat_convs", &o.engine.cpu_dnnl_concat_convs},
                           std::pair{"cpu_depthwise", &o.engine.cpu_depthwise},
                           std::pair{"cpu_patch_deconv", &o.engine.cpu_patch_deconv},
                           std::pair{"gpu_graph_replay", &o.engine.gpu_graph_replay},
                           std::pair{"int4_dequantize_kernel", &o.engine.int4_dequantize_kernel},
                           std::pair{"cpu_avx512", &o.engine.cpu_avx512}})
    if (auto v = lookup(entries, key); !v.empty()) *flag = to_int(key, v, 0, 1);
  if (auto v = lookup(entries, "cpu_dnnl_min_flops"); !v.empty())
    o.engine.cpu_dnnl_min_flops = to_int("cpu_dnnl_min_flops", v, 0, 1LL << 50);
  if (auto v = lookup(entries, "cpu_packed_rows"); !v.empty())
    o.engine.cpu_packed_rows = to_int("cpu_packed_rows", v, 0, 1 << 30);
  if (auto v = lookup(entries, "cpu_packed_stream"); !v.empty())
    o.engine.cpu_packed_stream = to_int("cpu_packed_stream", v, 0, 1 << 20);
  if (auto v = lookup(entries, "cpu_packed_ahead"); !v.empty())
    o.engine.cpu_packed_ahead = to_int("cpu_packed_ahead", v, 0, 1 << 16);
  if (auto v = lookup(entries, "cpu_packed_depth"); !v.empty())
    o.engine.cpu_packed_depth = to_int("cpu_packed_depth", v, 0, 1 << 16);
  if (auto v = lookup(entries, "cpu_poll_us"); !v.empty())
    o.engine.cpu_poll_us = to_int("cpu_poll_us", v, 1, 100000);
  if (auto v = lookup(entries, "cpu_dnnl_parallel_min_flops"); !v.empty())
    o.engine.cpu_dnnl_parallel_min_flops = to_int("cpu_dnnl_parallel_min_flops", v, 0, 1LL << 50);
  if (auto v = lookup(entries, "cpu_program_parallel_min_flops"); !v.empty())
    o.engine.cpu_program_parallel_min_flops = to_int("cpu_program_parallel_min_flops", v, 0, 1LL << 50);
  if (auto v = lookup(entries, "cpu_fuse"); !v.empty() && v != "auto")
    o.engine.cpu_fuse = static_cast<int>(to_int("cpu_fuse", v, 0, 1));
  if (auto v = lookup(entries, "device_copies"); !v.empty())
    o.engine.device_copies = static_cast<int>(to_int("device_copies", v, 0, 2));
  if (auto v = lookup(entries, "pinned_inputs"); !v.empty())
    o.engine.pinned_inputs = static_cast<size_t>(to_int("pinned_inputs", v, 0, 1LL << 40));
  if (auto v = lookup(entries, "int4_dense_rows"); !v.empty())
    o.engine.int4_dense_rows = static_cast<int>(to_int("int4_dense_rows", v, 0, 1 << 30));
  if (auto v = lookup(entries, "gpu_attention_split_rows"); !v.empty())
    o.engine.gpu_attention_split_rows = static_cast<int>(to_int("gpu_attention_split_rows", v, 0, 8192));
  if (auto v = lookup(entries, "log_level"); !v.empty())
    o.engine.log_level = static_cast<int>(to_int("log_level", v, 0, 3));
  o.report_path = lookup(entries, "report_path");
  if (auto v = lookup(entries, "memory_limit_mb"); !v.empty())
    o.memory_limit_mb = to_int("memory_limit_mb", v, 0, 1LL << 40);
  if (auto v = lookup(entries, "cache_limit_mb"); !v.empty())
    o.cache_limit_mb = to_int("cache_limit_mb", v, 0, 1LL << 40);
  if (auto v = lookup(entries, "device_memory"); !v.empty())
    o.device_memory = static_cast<int>(to_int("device_memory", v, 0, 2));
  if (auto v = lookup(entries, "tf32"); !v.empty()) o.tf32 = static_cast<int>(to_int("tf32", v, 0, 1));
  if (auto v = lookup(entries, "int8_emulation"); !v.empty() && v != "auto")
    o.engine.int8_emulation = static_cast<int>(to_int("int8_emulation", v, 0, 1));
  return o;
}

}  // namespace ortmlx::ep
