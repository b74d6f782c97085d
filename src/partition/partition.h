// Claim and group: which nodes the EP runs, fused into convex groups (no path may leave a group
// and come back, or ORT could not order the fused node against the others).
#pragma once

#include <string>
#include <vector>

#include "graph/view.h"

namespace ortmlx::partition {

struct Options {
  bool gpu = false;  // target device is a GPU: float64 is declined
};

struct Decline {
  size_t node;
  std::string reason;
};

struct Result {
  std::vector<std::vector<size_t>> groups;  // node indices, each group in topological order
  std::vector<Decline> declined;
};

// The claim decision for one node: empty string = supported, else the reason it is declined.
std::string check_node(const graph::Graph& g, const graph::Node& n, const Options& opt);

Result partition(const graph::Graph& g, const Options& opt);

// Groups claimed nodes into maximal convex sets. `claimed[i]` says whether node i is claimed.
// Exposed for unit tests.
std::vector<std::vector<size_t>> convex_groups(const graph::Graph& g,
                                               const std::vector<bool>& claimed);

}  // namespace ortmlx::partition
