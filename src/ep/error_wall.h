// The one place that turns C++ exceptions into OrtStatus. Every callback ORT calls is noexcept
// and runs its body through guard(); nothing may unwind into ORT's C frames.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "engine/memory_guard.h"
#include "ep/ort_api.h"

namespace ortmlx::ep {

// `where` names the callback and, where known, the fused node (e.g. "Compute 'MLX_0'").
template <typename F>
OrtStatus* guard(const std::string& where, F&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const OrtError& e) {
    return g_ort->CreateStatus(e.code, ("[MLX EP] " + where + ": " + e.what()).c_str());
  } catch (const std::invalid_argument& e) {
    return g_ort->CreateStatus(ORT_INVALID_ARGUMENT, ("[MLX EP] " + where + ": " + e.what()).c_str());
  } catch (const engine::MemoryLimitError& e) {
    // Not ORT_EP_FAIL: ORT's Python wrapper answers that by re-running on the CPU EP, which
    // would take the memory the limit was set to protect.
    return g_ort->CreateStatus(ORT_RUNTIME_EXCEPTION, ("[MLX EP] " + where + ": " + e.what()).c_str());
  } catch (const std::bad_alloc&) {
    return g_ort->CreateStatus(ORT_EP_FAIL, ("[MLX EP] " + where + ": out of memory").c_str());
  } catch (const std::exception& e) {
    return g_ort->CreateStatus(ORT_EP_FAIL, ("[MLX EP] " + where + ": " + e.what()).c_str());
  } catch (...) {
    return g_ort->CreateStatus(ORT_EP_FAIL, ("[MLX EP] " + where + ": unknown exception").c_str());
  }
}

}  // namespace ortmlx::ep
