// The EP's JSON-lines report (option report_path; the Python package reads it): claim
// decisions, per fused node run statistics, device-memory counters. One line per record.
#pragma once

#include <string>

#include "engine/engine.h"
#include "graph/view.h"
#include "partition/partition.h"

namespace ortmlx::ep {

// The declined nodes of one GetCapability pass (the EP's own fused nodes left out).
std::string declined_lines(const graph::Graph& g, const partition::Result& result);
std::string stats_line(const std::string& fused_node, const engine::Stats& st);
std::string device_memory_line();

}  // namespace ortmlx::ep
