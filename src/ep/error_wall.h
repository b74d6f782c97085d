// The one place that turns C++ exceptions into OrtStatus. Every callback ORT calls is noexcept
// and runs its body through guard(); nothing may unwind into ORT's C frames.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <type_traits>

#include "engine/memory_guard.h"
#include "ep/ort_api.h"

namespace ortmlx::ep {

namespace detail {
// A guard's `where`: a string, or a callable that makes it (only when an error is reported: a
// run's Compute builds no string).
template <typename W>
std::string where_text(const W& where) {
  if constexpr (std::is_invocable_v<const W&>)
    return where();
  else
    return std::string(where);
}
}  // namespace detail

// `where` names the callback and, where known, the fused node (e.g. "Compute 'MLX_0'").
template <typename W, typename F>
OrtStatus* guard(const W& where, F&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const OrtError& e) {
    return g_ort->CreateStatus(e.code, ("[MLX EP] " + detail::where_text(where) + ": " + e.what()).c_str());
  } catch (const std::invalid_argument& e) {
    return g_ort->CreateStatus(ORT_INVALID_ARGUMENT, ("[MLX EP] " + detail::where_text(where) + ": " + e.what()).c_str());
  } catch (const engine::MemoryLimitError& e) {
    // Not ORT_EP_FAIL: ORT's Python wrapper answers that by re-running on the CPU EP, which
    // would take the memory the limit was set to protect.
    return g_ort->CreateStatus(ORT_RUNTIME_EXCEPTION, ("[MLX EP] " + detail::where_text(where) + ": " + e.what()).c_str());
  } catch (const std::bad_alloc&) {
    return g_ort->CreateStatus(ORT_EP_FAIL, ("[MLX EP] " + detail::where_text(where) + ": out of memory").c_str());
  } catch (const std::exception& e) {
    return g_ort->CreateStatus(ORT_EP_FAIL, ("[MLX EP] " + detail::where_text(where) + ": " + e.what()).c_str());
  } catch (...) {
    return g_ort->CreateStatus(ORT_EP_FAIL, ("[MLX EP] " + detail::where_text(where) + ": unknown exception").c_str());
  }
}

}  // namespace ortmlx::ep
