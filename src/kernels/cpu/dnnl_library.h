// oneDNN as the CPU device's kernels load it (dnnl_library.cc): one dlopen of libdnnl.so.2, next
// to this library first, with every function the EP calls looked up once. Shared by the
// convolutions (dnnl_conv.cc) and the matrix products (dnnl_matmul.cc), so that both see the same
// library, the same engine and the same OpenMP setting. Internal to src/kernels/cpu; only with
// oneDNN's headers at build time.
#pragma once

#include <cstdint>
#include <functional>

namespace ortmlx::ops {

// Runs fn(begin, end) over [0, n) cut into `parts` ranges on the OpenMP threads oneDNN runs on
// (libgomp, loaded with it), the calling thread taking a share, so that the CPU kernels' loops
// (cpu_parallel_for) and the convolutions use one set of workers, which spin a while between
// regions instead of being woken each time. False, having run nothing, where oneDNN or libgomp is
// not loaded or the environment sets ORT_MLX_CPU_OPENMP_POOL=0 (read once a process).
bool openmp_parallel_for(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ortmlx::ops

#ifdef ORTMLX_HAVE_DNNL

#include <oneapi/dnnl/dnnl.h>

namespace ortmlx::ops {

#define ORTMLX_DNNL_FUNCTIONS(X)                                                              \
  X(engine_create) X(engine_destroy) X(stream_create) X(stream_destroy)                       \
  X(memory_desc_init_by_tag) X(memory_desc_get_size) X(memory_desc_equal) X(memory_create)    \
  X(memory_destroy) X(dilated_convolution_forward_desc_init)                                  \
  X(dilated_deconvolution_forward_desc_init) X(reorder_primitive_desc_create)                 \
  X(primitive_desc_create) X(primitive_desc_destroy) X(primitive_desc_query_md)               \
  X(primitive_desc_query)                                                                     \
  X(primitive_create) X(primitive_destroy) X(primitive_execute) X(primitive_attr_create)      \
  X(primitive_attr_destroy) X(primitive_attr_set_scratchpad_mode)                             \
  X(primitive_attr_set_post_ops) X(post_ops_create) X(post_ops_destroy) X(post_ops_append_eltwise) \
  X(post_ops_append_sum) X(sgemm)

// The library, its functions and the one CPU engine every plan uses. engine is null when the
// library or any function is missing: then nothing here may be called.
struct DnnlLibrary {
#define ORTMLX_DNNL_MEMBER(f) decltype(&::dnnl_##f) f = nullptr;
  ORTMLX_DNNL_FUNCTIONS(ORTMLX_DNNL_MEMBER)
#undef ORTMLX_DNNL_MEMBER
  dnnl_engine_t engine = nullptr;
  // Primitives take their scratch memory from the caller: oneDNN's own is per creating thread,
  // and plans are made on ORT's thread but run on MLX's stream thread.
  dnnl_primitive_attr_t user_scratchpad = nullptr;
  // The OpenMP runtime oneDNN runs on (its dependency, looked up through its handle): a small
  // convolution runs on the calling thread alone (ThreadLimit). Null where it is not found.
  void (*omp_set_num_threads)(int) = nullptr;
  int (*omp_get_max_threads)() = nullptr;
  // What `#pragma omp parallel num_threads(n)` compiles to, and a thread's place in the region
  // (openmp_parallel_for). Null where not found.
  void (*gomp_parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;
  int (*omp_get_thread_num)() = nullptr;
  int (*omp_get_num_threads)() = nullptr;

  DnnlLibrary();
  ~DnnlLibrary();
  DnnlLibrary(const DnnlLibrary&) = delete;
  DnnlLibrary& operator=(const DnnlLibrary&) = delete;
};

// While alive, oneDNN's primitives created or executed on this thread use at most `threads`
// OpenMP threads (0: no limit). Why: waking the second thread costs more than a small
// convolution or reorder takes, and a primitive keeps the thread count it was created with.
class ThreadLimit {
 public:
  explicit ThreadLimit(int threads);
  ~ThreadLimit();
  bool active() const { return prev_ > 0; }  // the limit is below what OpenMP would use
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

 private:
  int prev_ = 0;
};

// The process's one instance, loaded on first use and never destroyed: MLX's stream threads
// release their oneDNN streams when they end, which may be after static objects are gone.
const DnnlLibrary& dnnl_lib();

}  // namespace ortmlx::ops

#endif
