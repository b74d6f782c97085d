#include "kernels/cuda/graph_replay.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include <dlfcn.h>

#include <mlx/backend/cuda/cuda.h>
#include <mlx/primitives.h>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/mlx_cuda_abi.h"

namespace ortmlx::kernels::cuda {

namespace {

// mlx::core::cu::CommandEncoder's fields up to the temporaries (MLX 0.32,
// mlx/backend/cuda/device.h): never constructed here, only read through a pointer MLX returns.
struct GraphNodeMirror {
  void* node;
  std::string node_type, id;
};
struct EncoderMirror {
  void* device;  // Device&
  void* stream;  // CudaStream: one cudaStream_t
  void* graph;   // CudaGraph: one cudaGraph_t
  std::shared_ptr<void> worker;
  int node_count;
  bool in_concurrent;
  std::vector<void*> from_nodes, to_nodes;
  std::string graph_nodes_key, graph_deps_key;
  std::vector<GraphNodeMirror> concurrent_nodes;
  std::vector<std::shared_ptr<mx::array::Data>> temporaries;
};

// CUDA driver entry points (CUresult is an int; handles are pointers) from the libcuda.so.1
// MLX loaded, and MLX's own encoder functions from its library.
struct Api {
  int (*graph_clone)(void** clone, void* graph) = nullptr;
  int (*graph_instantiate)(void** exec, void* graph, unsigned long long flags) = nullptr;
  int (*graph_launch)(void* exec, void* stream) = nullptr;
  int (*graph_exec_destroy)(void* exec) = nullptr;
  int (*graph_destroy)(void* graph) = nullptr;
  int (*graph_get_nodes)(void* graph, void** nodes, size_t* n) = nullptr;
  // cuGraphAddDependencies_v2 (with per-edge data, null: plain edges), or the four-argument
  // cuGraphAddDependencies of drivers before it.
  int (*graph_add_dependencies_v2)(void* graph, void* const* from, void* const* to, const void* edges,
                                   size_t n) = nullptr;
  int (*graph_add_dependencies)(void* graph, void* const* from, void* const* to, size_t n) = nullptr;
  int add_dependencies(void* graph, void* const* from, void* const* to, size_t n) const {
    return graph_add_dependencies_v2 ? graph_add_dependencies_v2(graph, from, to, nullptr, n)
                                     : graph_add_dependencies(graph, from, to, n);
  }
  int (*stream_synchronize)(void* stream) = nullptr;
  int (*memcpy_async)(unsigned long long dst, unsigned long long src, size_t n, void* stream) = nullptr;
  // mlx::core::cu::get_command_encoder(Stream) (a reference: a pointer in the ABI) and
  // CommandEncoder::commit() (`this` as its one argument).
  void* (*get_encoder)(mx::Stream) = nullptr;
  void (*commit)(void* encoder) = nullptr;
  bool loaded = false;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(::dlsym(lib, name));
  return fn != nullptr;
}

const Api& api() {
  static const Api a = [] {
    Api r;
    void* cuda = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    Dl_info info{};
    void* mlx = nullptr;
    if (::dladdr(reinterpret_cast<void*>(&mx::cu::is_available), &info) && info.dli_fname)
      mlx = ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!cuda || !mlx) return r;
    bool ok = bind(cuda, "cuGraphClone", r.graph_clone) &&
              bind(cuda, "cuGraphInstantiateWithFlags", r.graph_instantiate) &&
              bind(cuda, "cuGraphLaunch", r.graph_launch) && bind(cuda, "cuGraphExecDestroy", r.graph_exec_destroy) &&
              bind(cuda, "cuGraphDestroy", r.graph_destroy) && bind(cuda, "cuGraphGetNodes", r.graph_get_nodes) &&
              (bind(cuda, "cuGraphAddDependencies_v2", r.graph_add_dependencies_v2) ||
               bind(cuda, "cuGraphAddDependencies", r.graph_add_dependencies)) &&
              bind(cuda, "cuStreamSynchronize", r.stream_synchronize) &&
              bind(cuda, "cuMemcpyAsync", r.memcpy_async) &&
              bind(mlx, "_ZN3mlx4core2cu19get_command_encoderENS0_6StreamE", r.get_encoder) &&
              bind(mlx, "_ZN3mlx4core2cu14CommandEncoder6commitEv", r.commit);
    r.loaded = ok;
    return r;
  }();
  return a;
}

EncoderMirror* encoder(mx::Stream s) { return static_cast<EncoderMirror*>(api().get_encoder(s)); }

std::atomic<size_t> g_captures{0}, g_capture_failures{0}, g_launches{0};
// Bytes of MLX's memory the kept graphs hold between them (their own results and temporaries;
// not the inputs they read): a graph that would pass a quarter of MLX's memory limit is not kept.
std::atomic<size_t> g_held_bytes{0};

// The arrays `outputs` depend on that are not evaluated yet, inputs before their users, each
// multi-output primitive once (by its first output).
std::vector<mx::array> tape_of(const std::vector<mx::array>& outputs) {
  std::vector<mx::array> tape;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<std::pair<mx::array, size_t>> stack;
  auto visit = [&](const mx::array& a) {
    if (a.status() != mx::array::Status::unscheduled || seen.count(a.id())) return;
    seen.insert(a.id());
    for (const auto& sib : a.siblings()) seen.insert(sib.id());
    stack.emplace_back(a, 0);
  };
  for (const auto& o : outputs) {
    visit(o);
    while (!stack.empty()) {
      auto& [a, next] = stack.back();
      if (next < a.inputs().size()) {
        const auto in = a.inputs()[next++];
        visit(in);
        continue;
      }
      tape.push_back(a);
      stack.pop_back();
    }
  }
  return tape;
}

struct Walk {
  bool self_test = false;
  std::string failure;  // set when a layout check disagreed (self-test only)
};

}  // namespace

// Builds a GraphReplay (the walk of GraphReplay::capture; self-tests check the layout on it).
struct GraphCapturer {
  static std::unique_ptr<GraphReplay> capture(std::vector<mx::array>& arrays, mx::Stream s, std::string* why,
                                              Walk* walk);
};

namespace {

std::once_flag g_test_once;
bool g_test_ok = false;
std::string g_test_why;

// A small evaluation captured and launched again on new input data, its results compared
// with what MLX computes: the mirrored layout and the whole path at once.
void self_test(mx::Stream s) {
  try {
    auto x = mx::array({1.f, 2.f, 3.f, 4.f});
    auto y = mx::multiply(mx::add(x, mx::array(1.f), s), mx::array(2.f), s);
    mx::eval(x);
    std::vector<mx::array> todo{y};
    Walk walk{true, {}};
    std::string why;
    auto replay = GraphCapturer::capture(todo, s, &why, &walk);
    if (!walk.failure.empty()) {
      g_test_why = "layout check: " + walk.failure;
      return;
    }
    if (!replay) {
      g_test_why = "self-test capture: " + why;
      return;
    }
    auto read = [&](const mx::array& a, float* out) {
      void* p = device_address(a);
      return p && abi::driver().memcpy(reinterpret_cast<std::uintptr_t>(out), reinterpret_cast<std::uintptr_t>(p),
                                       4 * sizeof(float)) == 0;
    };
    float got[4] = {};
    if (!read(y, got) || got[0] != 4.f || got[3] != 10.f) {
      g_test_why = "self-test: MLX's own launch gave other values";
      return;
    }
    const float next[4] = {10.f, 20.f, 30.f, 40.f};
    if (!replay->copy_in(device_address(x), next, sizeof(next)) || !replay->launch() || !read(y, got)) {
      g_test_why = "self-test: the driver refused a copy or the launch";
      return;
    }
    if (got[0] != 22.f || got[1] != 42.f || got[2] != 62.f || got[3] != 82.f) {
      g_test_why = "self-test: the kept graph computed other values";
      return;
    }
    g_test_ok = true;
  } catch (const std::exception& e) {
    g_test_why = std::string("self-test threw: ") + e.what();
  }
}

bool graphs_disabled_by_env() {
  const char* v = std::getenv("MLX_USE_CUDA_GRAPHS");  // MLX reads it once, at its first use
  return v && (std::string_view(v) == "0" || std::string_view(v) == "false" || std::string_view(v) == "off");
}

}  // namespace

void* device_address(const mx::array& a) {
  const auto* view = abi::view_of(a);
  if (!view || !view->data) return nullptr;
  return static_cast<char*>(view->data) + a.offset();
}

bool graph_replay_available(mx::Stream s, std::string* why) {
  auto no = [why](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (s.device != mx::Device::gpu || !available()) return no("not MLX's CUDA backend");
  if (!api().loaded || !abi::driver().loaded()) return no("the CUDA driver's graph functions or MLX's encoder not found");
  if (!abi::layout_ok()) return no("MLX's buffer layout is not the one this build knows");
  if (std::string_view(mx::version()).rfind("0.32.", 0) != 0) return no("an MLX version whose encoder layout is not known");
  if (graphs_disabled_by_env()) return no("MLX_USE_CUDA_GRAPHS is off");
  std::call_once(g_test_once, [s] { self_test(s); });
  if (!g_test_ok) {
    if (why) *why = g_test_why;
    return false;
  }
  return true;
}

std::unique_ptr<GraphReplay> GraphCapturer::capture(std::vector<mx::array>& arrays, mx::Stream s,
                                                    std::string* why, Walk* walk) {
  const auto& d = api();
  auto not_started = [&](const std::string& w) -> std::unique_ptr<GraphReplay> {
    *why = w;
    mx::eval(arrays);
    return nullptr;
  };
  auto tape = tape_of(arrays);
  if (tape.empty()) return not_started("nothing to evaluate");
  for (const auto& a : tape) {
    if (!a.has_primitive() || a.is_tracer()) return not_started("an array without a primitive");
    if (a.primitive().stream() != s) return not_started("an array on another stream");
  }
  mx::synchronize(s);  // the encoder is empty: what it holds after the walk is this evaluation
  EncoderMirror* enc = encoder(s);
  if (!enc || enc->node_count != 0 || !enc->from_nodes.empty() || !enc->graph)
    return not_started("MLX's encoder is not empty after a synchronize");
  void* const graph = enc->graph;
  auto finish_by_mlx = [&](const std::string& w) -> std::unique_ptr<GraphReplay> {
    // What the walk encoded is launched by MLX; the rest of the evaluation is MLX's own.
    *why = w;
    d.commit(enc);
    mx::eval(arrays);  // waits for the stream: the walked arrays' work is done too
    for (auto& a : tape)
      if (a.status() == mx::array::Status::evaluated && !a.event().valid()) {
        a.set_status(mx::array::Status::available);
        for (auto& sib : a.siblings()) sib.set_status(mx::array::Status::available);
      }
    return nullptr;
  };
  int last_count = 0;
  for (auto& a : tape) {
    auto outputs = a.outputs();
    try {
      a.primitive().eval_gpu(a.inputs(), outputs);
    } catch (...) {
      d.commit(enc);  // the arrays walked so far run; the error is the evaluation's
      throw;
    }
    a.set_status(mx::array::Status::evaluated);
    for (auto& sib : a.siblings()) sib.set_status(mx::array::Status::evaluated);
    // A primitive that committed the encoder itself launched part of the evaluation already.
    if (enc->graph != graph || enc->node_count < last_count) return finish_by_mlx("MLX committed during the walk");
    last_count = enc->node_count;
  }
  size_t nodes = 0;
  if (d.graph_get_nodes(graph, nullptr, &nodes) != 0) return finish_by_mlx("the driver could not count the nodes");
  if (walk && walk->self_test) {
    // Two kernels, one edge between them, in an encoder of the mirrored layout.
    if (enc->node_count != 2 || nodes != 2 || enc->from_nodes.size() != 1 || enc->to_nodes.size() != 1 ||
        enc->graph_nodes_key != "K-K-" || enc->temporaries.size() > 64) {
      walk->failure = "node count " + std::to_string(enc->node_count) + ", graph nodes " + std::to_string(nodes);
      return finish_by_mlx(walk->failure);
    }
  }
  if (nodes == 0) return finish_by_mlx("no kernels");
  if (enc->from_nodes.size() != enc->to_nodes.size()) return finish_by_mlx("inconsistent dependencies");
  if (!enc->from_nodes.empty()) {
    if (d.add_dependencies(graph, enc->from_nodes.data(), enc->to_nodes.data(), enc->from_nodes.size()) != 0)
      return finish_by_mlx("the driver refused the dependencies");
    enc->from_nodes.clear();  // added: MLX's commit must not add them again
    enc->to_nodes.clear();
  }
  std::unique_ptr<GraphReplay> r(new GraphReplay());
  r->stream_ = enc->stream;
  if (d.graph_clone(&r->graph_, graph) != 0) {
    r->graph_ = nullptr;
    return finish_by_mlx("the driver could not clone the graph");
  }
  if (d.graph_instantiate(&r->exec_, r->graph_, 0) != 0) {
    r->exec_ = nullptr;
    return finish_by_mlx("the driver could not instantiate the graph");
  }
  // Every buffer the graph reads or writes stays allocated while it is kept.
  std::unordered_set<const void*> held;
  auto hold = [&](const mx::array& a) {
    const auto& data = a.data_shared_ptr();
    if (data && held.insert(data.get()).second) r->held_.push_back(data);
  };
  for (const auto& a : tape) {
    for (const auto& out : a.outputs()) hold(out);
    for (const auto& in : a.inputs()) hold(in);
  }
  for (const auto& t : enc->temporaries)
    if (t && held.insert(t.get()).second) r->held_.push_back(t);
  // A graph holds all of its buffers at once, where MLX's evaluation reuses them as it goes.
  std::unordered_set<const void*> own;
  size_t bytes = 0;
  auto count = [&](const std::shared_ptr<mx::allocator::Data>& data) {
    if (data && data->is_owned() && own.insert(data.get()).second)
      bytes += mx::allocator::allocator().size(data->buffer());
  };
  for (const auto& a : tape)
    for (const auto& out : a.outputs()) count(out.data_shared_ptr());
  for (const auto& t : enc->temporaries) count(t);
  const size_t limit = mx::get_memory_limit() / 4;
  if (g_held_bytes.load(std::memory_order_relaxed) + bytes > limit) {
    r.reset();  // before MLX's commit: nothing of it is launched
    return finish_by_mlx("the kept graphs would hold over a quarter of MLX's memory limit");
  }
  r->bytes_ = bytes;
  g_held_bytes.fetch_add(bytes, std::memory_order_relaxed);
  d.commit(enc);  // MLX launches its own graph: this run's results
  mx::synchronize(s);
  for (auto& a : tape) {
    a.set_status(mx::array::Status::available);
    for (auto& sib : a.siblings()) sib.set_status(mx::array::Status::available);
  }
  return r;
}

std::unique_ptr<GraphReplay> GraphReplay::capture(std::vector<mx::array>& arrays, mx::Stream s, std::string* why) {
  if (!graph_replay_available(s, why)) {
    mx::eval(arrays);
    g_capture_failures.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  auto r = GraphCapturer::capture(arrays, s, why, nullptr);
  (r ? g_captures : g_capture_failures).fetch_add(1, std::memory_order_relaxed);
  return r;
}

GraphReplay::~GraphReplay() {
  // No launch is in flight (each waits for its graph), and MLX's stream may be gone already (a
  // thread's stream goes with the thread): nothing here touches it.
  g_held_bytes.fetch_sub(bytes_, std::memory_order_relaxed);
  const auto& d = api();
  if (exec_) d.graph_exec_destroy(exec_);
  if (graph_) d.graph_destroy(graph_);
}

bool GraphReplay::copy_in(void* dst, const void* src, size_t bytes) {
  if (!dst || !src) return false;
  if (bytes == 0) return true;
  return api().memcpy_async(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes,
                            stream_) == 0;
}

bool GraphReplay::launch() {
  const auto& d = api();
  if (d.graph_launch(exec_, stream_) != 0) return false;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return d.stream_synchronize(stream_) == 0;
}

GraphReplayCounters graph_replay_counters() {
  return {g_captures.load(std::memory_order_relaxed), g_capture_failures.load(std::memory_order_relaxed),
          g_launches.load(std::memory_order_relaxed)};
}

}  // namespace ortmlx::kernels::cuda
