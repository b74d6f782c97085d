// Tensor I/O between ORT's kernel context and the engine: a fused node's inputs read as
// engine::HostTensor views over ORT's buffers (sequences unpacked, empty optionals marked), and
// its results written to ORT's outputs (zero-copy adoption of the EP's own memory where proven,
// 4-bit types packed, otherwise one copy).
#pragma once

#include <vector>

#include <mlx/mlx.h>

#include "engine/engine.h"
#include "ep/ort_api.h"

namespace ortmlx::ep {

// `shape` as the dims ORT's output calls take, in a buffer of the calling thread's (valid until
// its next call there: a run asks for one output at a time).
const std::vector<int64_t>& ort_dims(const mlx::core::Shape& shape);

// The fused node's inputs. `items` keeps a sequence's tensors (copied out by ORT) alive: the
// HostTensors point into them until the run is over.
std::vector<engine::HostTensor> read_inputs(OrtKernelContext* ctx, size_t n_in,
                                            std::vector<ValuePtr>& items);

// Writes `outputs` (evaluated, row-contiguous, except those named by `rows`) to ORT's outputs.
// With `device_memory`, an output whose MLX buffer nothing else holds is adopted by ORT's
// allocation instead of copied. Outputs bound to existing buffers in EP memory are written
// there by MLX on stream `s`; an output in `rows` bound to the input buffer it updates gets
// only its rows written (engine::RowUpdate), any other is evaluated first. `device_copies`:
// engine::Options::device_copies.
void write_outputs(OrtKernelContext* ctx, std::vector<mlx::core::array>& outputs,
                   const std::vector<engine::RowUpdate>& rows, bool device_memory,
                   int device_copies, mlx::core::Stream s);

}  // namespace ortmlx::ep
