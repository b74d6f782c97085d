// MLX's cache limit fitted to the runs (factory.cc, Limits).
//
// Why: MLX's allocator keeps freed buffers for reuse up to its cache limit (the EP's default is
// 256 MiB, see docs/options.md, cache_limit_mb) and hands the rest back to the OS. A run whose
// own buffers (intermediates, outputs copied out) come to more than that gets them back as fresh
// pages, each zeroed by the kernel on its first touch, every run: a 256 MiB x * x -> Relu spent
// most of its run in page faults. ORT's CPU EP keeps its arena's peak instead.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ortmlx::ep {

// As a run starts: MLX's peak memory since the last run started over its active memory now (the
// last run's buffers freed since, its outputs too, which this run allocates again). While no
// live session set cache_limit_mb, more than the cache limit raises the limit to hold it (and a
// quarter more), up to a quarter of MLX's memory limit; never lowered. Resets MLX's peak.
void fit_cache_to_run();
uint64_t cache_limit_raises();  // limits raised so in this process
size_t cache_limit_bytes();     // the limit the default mode holds now (0 before any session)

}  // namespace ortmlx::ep
