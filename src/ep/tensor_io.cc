#include "ep/tensor_io.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "engine/device_buffers.h"
#include "ep/graph_reader.h"
#include "ops/lowp.h"

namespace ortmlx::ep {

namespace {

void read_tensor(const OrtValue* v, engine::HostTensor& t) {
  if (g_api_version >= 24) {  // the OrtValue's own shape, no info object allocated
    ONNXTensorElementDataType et;
    const int64_t* dims = nullptr;
    size_t rank = 0;
    check(g_ort->GetTensorElementTypeAndShapeDataReference(v, &et, &dims, &rank));
    t.shape.assign(dims, dims + rank);
    t.dtype = to_dtype(et);
    check(g_ort->GetTensorData(v, &t.data));
    return;
  }
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  check(g_ort->GetTensorTypeAndShape(v, &raw));
  TypeShapePtr info(raw);
  ONNXTensorElementDataType et;
  check(g_ort->GetTensorElementType(info.get(), &et));
  size_t rank = 0;
  check(g_ort->GetDimensionsCount(info.get(), &rank));
  t.shape.resize(rank);
  check(g_ort->GetDimensions(info.get(), t.shape.data(), rank));
  t.dtype = to_dtype(et);
  check(g_ort->GetTensorData(v, &t.data));
}

ONNXTensorElementDataType element_type(const OrtValue* v) {
  ONNXTensorElementDataType et;
  if (g_api_version >= 24) {
    const int64_t* dims = nullptr;
    size_t rank = 0;
    check(g_ort->GetTensorElementTypeAndShapeDataReference(v, &et, &dims, &rank));
    return et;
  }
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  check(g_ort->GetTensorTypeAndShape(v, &raw));
  TypeShapePtr info(raw);
  check(g_ort->GetTensorElementType(info.get(), &et));
  return et;
}

}  // namespace

const std::vector<int64_t>& ort_dims(const mlx::core::Shape& shape) {
  thread_local std::vector<int64_t> dims;
  dims.assign(shape.begin(), shape.end());
  return dims;
}

std::vector<engine::HostTensor> read_inputs(OrtKernelContext* ctx, size_t n_in,
                                            std::vector<ValuePtr>& items) {
  std::vector<engine::HostTensor> inputs(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    const OrtValue* v = nullptr;
    check(g_ort->KernelContext_GetInput(ctx, i, &v));
    // Sequences and optionals stay inside the group as outputs, but may come in: a graph
    // input, or a value ORT's CPU EP produced. An empty optional has no value.
    int has_value = v ? 1 : 0;
    if (v) check(g_ort->HasValue(v, &has_value));
    if (!has_value) {
      inputs[i].kind = engine::HostTensor::Kind::None;
      continue;
    }
    ONNXType type = ONNX_TYPE_UNKNOWN;
    check(g_ort->GetValueType(v, &type));
    if (type == ONNX_TYPE_SEQUENCE) {
      inputs[i].kind = engine::HostTensor::Kind::Sequence;
      size_t count = 0;
      check(g_ort->GetValueCount(v, &count));
      OrtAllocator* alloc = nullptr;
      check(g_ort->GetAllocatorWithDefaultOptions(&alloc));
      for (size_t k = 0; k < count; ++k) {
        OrtValue* item = nullptr;
        check(g_ort->GetValue(v, static_cast<int>(k), alloc, &item));
        items.emplace_back(item);
        inputs[i].items.emplace_back();
        read_tensor(item, inputs[i].items.back());
      }
      continue;
    }
    if (type != ONNX_TYPE_TENSOR)
      throw std::invalid_argument("input " + std::to_string(i) +
                                  " is neither a tensor nor a sequence of tensors");
    read_tensor(v, inputs[i]);
  }
  return inputs;
}

void write_outputs(OrtKernelContext* ctx, std::vector<mlx::core::array>& outputs,
                   const std::vector<engine::RowUpdate>& rows, bool device_memory, int device_copies,
                   mlx::core::Stream s) {
  namespace db = engine::device_buffers;
  // Outputs bound to existing buffers in EP memory (a shared past/present KV buffer): written
  // there by MLX on the device, all in one evaluation, after the loop.
  std::vector<std::pair<void*, mlx::core::array>> device_writes;
  std::vector<db::RowWrite> row_writes;
  std::vector<size_t> row_outputs;
  // A kept graph's outputs are its own buffers, launched again next run: copied, never adopted.
  const bool walked = engine::last_run_walked();
  const bool kept = engine::last_run_replayed() || walked;
  bool driver_copies = false;  // outputs copied into EP memory by the driver: waited for once, at the end
  auto copied_by_driver = [&] {
    driver_copies = true;
    db::counters().outputs_written_on_device++;
    db::counters().outputs_by_driver++;
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& a = outputs[i];
    const auto& dims = ort_dims(a.shape());
    const engine::RowUpdate* row = nullptr;
    for (const auto& r : rows)
      if (r.output == i) row = &r;
    if (row) {
      OrtValue* out = nullptr;
      check(g_ort->KernelContext_GetOutput(ctx, i, dims.data(), dims.size(), &out));
      void* dst = nullptr;
      check(g_ort->GetTensorMutableData(out, &dst));
      if (row->written) {
        // The run wrote the rows into this buffer, asked for before its evaluation.
        if (dst != row->input_data) throw std::logic_error("a bound output buffer changed during the run");
        auto& c = db::counters();
        c.outputs_written_on_device++;
        c.outputs_rows_in_place++;
        c.outputs_rows_in_step++;
        continue;
      }
      if (device_memory && dst == row->input_data) {
        row_writes.push_back({dst, a, row->update, row->start, row->axes});
        row_outputs.push_back(i);
        continue;
      }
      mlx::core::eval(outputs[i]);  // bound elsewhere: the whole output after all
    }
    OrtValue* out = nullptr;
    // Zero-copy output (device memory only): when nothing else holds the MLX result's
    // buffer, the allocation ORT makes for this output inside GetOutput (through our
    // allocator, same size) is given that buffer instead of a new one. Proven by the
    // pointer ORT hands back; otherwise the result is copied as usual (device_buffers.h).
    std::optional<db::Armed> armed;
    if (device_memory && !kept && db::adoptable(outputs[i])) armed.emplace(a);
    check(g_ort->KernelContext_GetOutput(ctx, i, dims.data(), dims.size(), &out));
    void* const taken = armed ? armed->taken() : nullptr;
    void* dst = nullptr;
    check(g_ort->GetTensorMutableData(out, &dst));
    // The element type ORT allocated: 4-bit types are packed two per byte in its buffer.
    const ONNXTensorElementDataType out_et = element_type(out);
    auto& counters = db::counters();
    if (taken && dst == taken && !ops::lowp::is_lowp(to_dtype(out_et))) {
      counters.outputs_adopted++;
      continue;
    }
    if (engine::holds_data_at(a, dst)) continue;  // already there (written in place)
    if (device_memory && db::owns(dst)) counters.outputs_copied++;
    // A kept graph's output anywhere, an evaluated one into a buffer in EP memory: one copy by
    // the driver (a copy as an MLX kernel, below, is a broadcast select, many times slower).
    const bool on_device = device_memory && db::owns(dst);
    if ((kept || on_device) && !ops::lowp::is_lowp(to_dtype(out_et)) && engine::copy_out_on_device(a, dst)) {
      if (on_device) copied_by_driver();  // (a copy to the host has finished when the driver returns)
      continue;
    }
    if (on_device && !walked && !ops::lowp::is_lowp(to_dtype(out_et))) {
      device_writes.emplace_back(dst, a);
      continue;
    }
    if (on_device && walked) counters.outputs_written_on_device++;  // by memcpy: CPU memory
    engine::copy_out(a, dst, to_dtype(out_et), device_copies);
  }
  if (!row_writes.empty()) {
    auto written = db::write_rows_in_place(row_writes, s);
    for (size_t k = 0; k < row_writes.size(); ++k) {
      auto& a = outputs[row_outputs[k]];
      if (written[k]) {
        db::counters().outputs_rows_in_place++;
        continue;
      }
      // Not taken in place: the buffer is untouched, so the whole output still reads it.
      mlx::core::eval(a);
      if (engine::copy_out_on_device(a, row_writes[k].dst)) {
        copied_by_driver();
        continue;
      }
      if (!db::write_on_device({{row_writes[k].dst, a}}, s)[0]) engine::copy_out(a, row_writes[k].dst);
    }
  }
  if (!device_writes.empty()) {
    auto written = db::write_on_device(device_writes, s);
    for (size_t k = 0; k < device_writes.size(); ++k)
      if (!written[k]) engine::copy_out(device_writes[k].second, device_writes[k].first);
  }
  if (driver_copies && !engine::finish_copies_on_device())
    throw std::runtime_error("[MLX EP] the CUDA driver failed to finish copying the outputs");
}

}  // namespace ortmlx::ep
