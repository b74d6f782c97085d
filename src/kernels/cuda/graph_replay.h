// One evaluation of MLX's CUDA backend kept as a CUDA graph and launched again as a whole.
//
// Why: MLX records every kernel of an evaluation into a CUDA graph itself, but it builds that
// graph anew on every evaluation (each primitive's eval_gpu, a few microseconds of host time an
// array), so a decode step of a few hundred kernels spends more time on the host than on the
// GPU. A run whose shapes, host reads and buffers are those of an earlier run is the same graph
// with the same kernel parameters: this keeps the graph of one evaluation and launches it
// again, with no MLX call at all.
//
// How: the evaluation is made by walking its arrays through their primitives' eval_gpu (as
// mx::eval does, without its commits in between), so MLX's command encoder holds the whole
// evaluation as one graph. Before MLX launches it, the graph is cloned and instantiated here,
// and every buffer it touches (the arrays' data and the encoder's temporaries) is held for as
// long as the clone lives, so no later allocation can take them.
//
// The encoder's fields are read through a mirror of its layout (MLX 0.32's
// mlx/backend/cuda/device.h), checked on a small evaluation the first time, with its result
// compared after a launch of the clone on new input data; any disagreement turns the feature off
// for the process.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <mlx/mlx.h>

namespace ortmlx::kernels::cuda {

namespace mx = mlx::core;

// Whether graphs can be kept on this process's MLX (its CUDA backend with CUDA graphs on, a
// layout checked by the self-test). The first call runs the self-test on `s` (a GPU stream).
bool graph_replay_available(mx::Stream s, std::string* why = nullptr);

class GraphReplay {
 public:
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;

  // Evaluates `arrays` (on GPU stream `s`) and keeps the evaluation's graph. Returns null when
  // it cannot be kept (why in `why`); the arrays are evaluated either way (by mx::eval when the
  // capture did not start, by the encoder's own launch when it stopped part way). Their results
  // are available on return.
  static std::unique_ptr<GraphReplay> capture(std::vector<mx::array>& arrays, mx::Stream s,
                                              std::string* why);

  // Copies `bytes` from `src` (host or device memory) into `dst` (a held buffer) on MLX's
  // stream, ordered before the next launch. False if the driver refused.
  bool copy_in(void* dst, const void* src, size_t bytes);
  // Launches the graph on MLX's stream and waits for it. False if the driver refused (nothing
  // launched; the caller evaluates the usual way).
  bool launch();

 private:
  friend struct GraphCapturer;
  GraphReplay() = default;
  void* stream_ = nullptr;  // CUstream: MLX's stream for `s`
  void* graph_ = nullptr;   // CUgraph: the clone
  void* exec_ = nullptr;    // CUgraphExec
  size_t bytes_ = 0;        // of MLX's memory held for the graph (its results and temporaries)
  std::vector<std::shared_ptr<mx::array::Data>> held_;
};

// The device address of an evaluated array's first element on MLX's CUDA backend (without
// MLX's host read, which would move it to managed memory), or null.
void* device_address(const mx::array& a);

// Process totals for the report and tests.
struct GraphReplayCounters {
  size_t captures = 0, capture_failures = 0, launches = 0;
};
GraphReplayCounters graph_replay_counters();

}  // namespace ortmlx::kernels::cuda
