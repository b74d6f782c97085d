// The plain graph view as bytes, for EPContext models: a fused group is saved once and rebuilt at
// a later session without ORT's graph (no re-read, no re-partition). Pure C++, no ORT.
//
// Layout (little-endian): magic "ORTMLXG\0", u32 format version, the compatibility string, a
// flag saying whether constant data is inline or in a separate blob, the graph (recursively,
// control-flow bodies included), and the end marker "GEND". External constants are (offset,
// length) into the blob, so a big model's weights can live in a side file. The end marker is
// not NUL, so trailing NULs a transport appends (ORT's string attributes) can be told apart.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/view.h"

namespace ortmlx::graph {

inline constexpr uint32_t kSerializeVersion = 1;

struct SerializedHeader {
  uint32_t version = 0;
  std::string compat;           // who may load it: EP version, MLX version, device
  bool external_constants = false;
};

// `blob` null: constant data inline. Otherwise each initializer's bytes (control-flow bodies'
// too) are appended to *blob (64-byte aligned offsets) and the result refers to them.
// Tensor attributes are always inline (they are small).
std::string serialize(const Graph& g, std::string_view compat, std::string* blob = nullptr);

// The header alone (cheap: the compatibility check runs before the graph is rebuilt).
// Throws std::invalid_argument on bytes that are not this format or not this version.
SerializedHeader read_header(std::string_view bytes);

// Rebuilds the graph; `blob` is required when the constants are external. With `keep` (the
// owner of the memory `bytes` and `blob` lie in: a mapped file, a read buffer) constants point
// into that memory and hold it, so a big payload is not copied again; without it they are
// copied. Throws std::invalid_argument naming what is wrong (truncated, bad magic, unknown
// version, out-of-range enum or offset, missing blob) -- never reads outside `bytes`/`blob`.
Graph deserialize(std::string_view bytes, std::optional<std::string_view> blob = std::nullopt,
                  std::shared_ptr<const void> keep = nullptr);

}  // namespace ortmlx::graph
