// The loader of dnnl_library.h, and cpu_dnnl_available() (kernels.h) with or without oneDNN.
#include "kernels/cpu/dnnl_library.h"

#include "kernels/cpu/kernels.h"

#ifdef ORTMLX_HAVE_DNNL

#include <cstdlib>
#include <string>

#include <dlfcn.h>

namespace ortmlx::ops {

namespace {

// This library's own folder first (the wheel and the build tree put oneDNN there, with the
// OpenCL loader it links against), then the system's search path.
void* open_library() {
  // libgomp reads this once, when it loads: OpenMP's workers then sleep after a oneDNN call
  // instead of spinning beside the MLX stream thread and BLAS's threads. A user's value wins.
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&open_library), &info) && info.dli_fname) {
    std::string dir = info.dli_fname;
    dir.erase(dir.rfind('/') + 1);
    if (!dir.empty()) {
      ::dlopen((dir + "libOpenCL.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);  // absent: the system's
      if (void* h = ::dlopen((dir + "libdnnl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    }
  }
  return ::dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
}

}  // namespace

DnnlLibrary::DnnlLibrary() {
  void* h = open_library();
  if (!h) return;
  bool all = true;
#define ORTMLX_DNNL_LOOKUP(f) \
  f = reinterpret_cast<decltype(f)>(::dlsym(h, "dnnl_" #f)); \
  all = all && f;
  ORTMLX_DNNL_FUNCTIONS(ORTMLX_DNNL_LOOKUP)
#undef ORTMLX_DNNL_LOOKUP
  if (!all || engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
    engine = nullptr;
    return;
  }
  omp_set_num_threads = reinterpret_cast<void (*)(int)>(::dlsym(h, "omp_set_num_threads"));
  omp_get_max_threads = reinterpret_cast<int (*)()>(::dlsym(h, "omp_get_max_threads"));
  if (!omp_set_num_threads || !omp_get_max_threads) omp_set_num_threads = nullptr, omp_get_max_threads = nullptr;
  if (primitive_attr_create(&user_scratchpad) != dnnl_success ||
      primitive_attr_set_scratchpad_mode(user_scratchpad, dnnl_scratchpad_mode_user) != dnnl_success) {
    engine_destroy(engine);
    engine = nullptr;
  }
}

DnnlLibrary::~DnnlLibrary() {
  if (user_scratchpad) primitive_attr_destroy(user_scratchpad);
  if (engine) engine_destroy(engine);
}

const DnnlLibrary& dnnl_lib() {
  static const DnnlLibrary* l = new DnnlLibrary;
  return *l;
}

bool cpu_dnnl_available() { return dnnl_lib().engine != nullptr; }

ThreadLimit::ThreadLimit(int threads) {
  const auto& l = dnnl_lib();
  if (threads <= 0 || !l.omp_set_num_threads) return;
  prev_ = l.omp_get_max_threads();
  if (prev_ > threads) l.omp_set_num_threads(threads);
  else prev_ = 0;
}

ThreadLimit::~ThreadLimit() {
  if (prev_ > 0) dnnl_lib().omp_set_num_threads(prev_);
}

}  // namespace ortmlx::ops

#else  // no oneDNN headers at build time

namespace ortmlx::ops {

bool cpu_dnnl_available() { return false; }

}  // namespace ortmlx::ops

#endif
