#!/usr/bin/env python3
"""Device-memory checks of the MLX EP (README "Device memory and IOBinding"), on either MLX
device: IOBinding with inputs/outputs in the EP's memory, a decode-style loop that keeps the KV
cache in EP memory between steps (data-transfer counts asserted), OrtApi CopyTensors round
trips, and a model split between the EP and ORT's CPU EP.

    python tools/gpu_device_memory_check.py --device cpu          # this machine (CPU backend)
    python tools/gpu_device_memory_check.py --device gpu          # the H200 (MLX CUDA backend)
    python tools/gpu_device_memory_check.py --case decode --steps 16 --json

Sets ORT_MLX_DEVICE_MEMORY=1 before registering the EP (device memory is chosen at
registration), so it runs in its own process; tests/python/test_device_memory.py runs it.
Prints one line per case (or JSON with --json); exits 1 if any case fails.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io as _io
import json
import os
import pathlib
import sys
import tempfile
import traceback

# Before the EP library is registered. "2" (--gpu-type-memory): the EP's memory is declared
# GPU-type on MLX's CPU backend too, so ORT treats the EP as a non-CPU device (as on the GPU).
os.environ["ORT_MLX_DEVICE_MEMORY"] = "2" if "--gpu-type-memory" in sys.argv else "1"
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnxruntime_mlx as om  # noqa: E402

C = ort.capi._pybind_state
DEVICE = "cpu"
F32 = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=(), opset=21):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m.SerializeToString()


def vi(name, shape, t=F32):
    return helper.make_tensor_value_info(name, t, shape)


class Report:
    """A report_path file: the EP appends one 'device_memory' line (process-wide counters) each
    time a device-memory session is released."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="mlx_dm_", suffix=".jsonl")
        os.close(fd)

    def last_counters(self) -> dict:
        lines = [json.loads(x) for x in pathlib.Path(self.path).read_text().splitlines() if x]
        lines = [x["device_memory"] for x in lines if "device_memory" in x]
        assert lines, "no device_memory line in the report"
        return lines[-1]


def session(model_bytes, report: Report | None = None, fallback=False, **opts):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if report:
        opts["report_path"] = report.path
    so = om.record_assignment(om.session_options(DEVICE, fallback=fallback, so=so,
                                                 device_memory=1, **opts))
    return ort.InferenceSession(model_bytes, sess_options=so)


_IDENTITY = None


def counters() -> dict:
    """The EP's process-wide device-memory counters now: a session of a one-node model is
    created and released unrun (no allocation, no copy), so its report line is a snapshot."""
    global _IDENTITY
    if _IDENTITY is None:
        _IDENTITY = model([helper.make_node("Neg", ["x"], ["y"])], [vi("x", [1])], [vi("y", [1])])
    r = Report()
    s = session(_IDENTITY, r)
    del s
    gc.collect()
    c = r.last_counters()
    os.unlink(r.path)
    return c


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after if k in before and isinstance(after[k], int)}


def mem_info():
    info = om.device_memory_info(DEVICE)
    assert info is not None, "the EP's OrtEpDevice has no DEFAULT memory info"
    return info


def empty_on_device(shape, dtype) -> ort.OrtValue:
    """An uninitialized OrtValue in the EP's memory (the EP's shared allocator)."""
    try:  # ORT 1.31: by the OrtEpDevice's memory info
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, memory_info=mem_info())
    except TypeError:  # older Pythons: by device type and vendor id (GPU-type memory only)
        info = mem_info()
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, "gpu", info.device_id,
                                                         info.device_vendor_id)


def copy_tensors(src, dst):
    """OrtApi CopyTensors (the EP's data transfer for EP memory)."""
    if hasattr(ort, "copy_tensors"):
        ort.copy_tensors(src, dst)
    else:
        C.copy_tensors([v._get_c_value() for v in src], [v._get_c_value() for v in dst], None)


def to_device(arr: np.ndarray) -> ort.OrtValue:
    """A new OrtValue in the EP's memory holding `arr` (OrtApi CopyTensors host -> device)."""
    dev = empty_on_device(arr.shape, arr.dtype)
    copy_tensors([ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr))], [dev])
    return dev


def to_host(v: ort.OrtValue) -> np.ndarray:
    """OrtApi CopyTensors device -> host."""
    dt = {1: np.float32, 7: np.int64, 6: np.int32, 10: np.float16}[v.element_type()] \
        if isinstance(v.element_type(), int) else v.element_type()
    host = ort.OrtValue.ortvalue_from_shape_and_type(v.shape(), dt)
    copy_tensors([v], [host])
    return host.numpy()


def on_gpu() -> bool:
    """Whether the EP runs on MLX's GPU backend in this check."""
    return DEVICE == "gpu"


def gpu_type_memory() -> bool:
    """Whether the EP's memory is a GPU-type device (MLX's GPU backend, or --gpu-type-memory):
    then ORT copies host feeds into it through the EP's data transfer. A CPU-type device (MLX's
    CPU backend) is host memory to ORT: it hands numpy feeds to the EP as they are."""
    return mem_info().name == "MLX GPU"


def ep_ort_device() -> C.OrtDevice:
    return om.device_memory_ort_device(DEVICE)


def assert_close(a, b, name):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)


def all_on_mlx(sess, n_nodes):
    placed = om.placement(sess)
    assert set(placed) == {om.EP_NAME}, f"nodes not on MLX: {placed}"
    assert len(placed[om.EP_NAME]) == n_nodes, placed


# ---- cases ----

def case_default_info():
    """The EP's devices carry a DEFAULT memory info of the EP's vendor."""
    info = mem_info()
    assert info.device_vendor_id == 0x4D4C, hex(info.device_vendor_id)
    assert om.device_memory_registered()
    return {"memory_info": info.name, "vendor_id": hex(info.device_vendor_id),
            "device_id": info.device_id}


def case_copy_tensors():
    """OrtApi CopyTensors: host -> device -> device -> host, values intact, one transfer each."""
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    before = counters()
    d1 = to_device(x)                                               # h2d
    d2 = empty_on_device([3, 5], np.float32)
    copy_tensors([d1], [d2])                                        # d2d
    back = to_host(d2)                                              # d2h
    np.testing.assert_array_equal(back, x)
    d = delta(before, counters())
    assert (d["copies_h2d"], d["copies_d2d"], d["copies_d2h"]) == (1, 1, 1), d
    assert d["bytes_h2d"] == d["bytes_d2d"] == d["bytes_d2h"] == x.nbytes, d
    assert d["allocations"] == 2, d
    # On MLX's CUDA backend the driver copies (a host memcpy would move the EP's managed pages
    # to the host, and the next kernel touching them would stall on page faults).
    assert d["copies_by_driver"] == (3 if DEVICE == "gpu" else 0), d
    del d1, d2
    gc.collect()
    return {"delta": d}


def case_iobinding():
    """IOBinding: inputs bound as EP-memory OrtValues, outputs bound to the EP's device (ORT
    allocates them with the EP's allocator) and as preallocated EP-memory OrtValues; every node
    on MLX (CPU fallback disabled); outputs equal ORT's CPU EP."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal((6,)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["a", "w"], ["mm"]),
               helper.make_node("Add", ["mm", "b"], ["s"]),
               helper.make_node("Relu", ["s"], ["y"]),
               helper.make_node("Tanh", ["s"], ["z"])],
              [vi("a", [4, 8]), vi("w", [8, 6]), vi("b", [6])], [vi("y", [4, 6]), vi("z", [4, 6])])
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"a": a, "w": w, "b": b})
    sess = session(m)
    all_on_mlx(sess, 4)
    dev_in = {"a": to_device(a), "w": to_device(w), "b": to_device(b)}
    z_dev = empty_on_device([4, 6], np.float32)
    results = []
    before = counters()
    for _ in range(3):  # eager probe, then compiled runs
        io = sess.io_binding()
        for k, v in dev_in.items():
            io.bind_ortvalue_input(k, v)
        io._iobinding.bind_output("y", ep_ort_device())  # ORT allocates, in EP memory
        io.bind_ortvalue_output("z", z_dev)              # preallocated, in EP memory
        sess.run_with_iobinding(io)
        outs = io.get_outputs()
        results.append(outs[0])
    d = delta(before, counters())
    for y in results:
        assert_close(to_host(y), ref[0], "y")
    assert_close(to_host(z_dev), ref[1], "z")
    # No copies during the runs: inputs used in place (3 per run), y handed over without a
    # copy (adopted) and z written into its preallocated EP buffer (copied, 1 per run).
    assert d["copies_h2d"] == d["copies_d2h"] == d["copies_d2d"] == 0, d
    assert d["inputs_borrowed"] == 9, d
    assert d["outputs_adopted"] + d["outputs_copied"] == 6 and d["outputs_copied"] >= 3, d
    info = {"delta": d, "y_device": results[0].device_name()}
    del sess, results, outs, io
    gc.collect()
    return info


def case_host_feeds():
    """Plain numpy feeds and outputs with device memory on; results equal ORT's CPU EP. With
    GPU-type EP memory ORT copies through the EP's data transfer (one h2d per input, one d2h per
    output); with CPU-type EP memory (MLX's CPU backend) it hands the host buffers over as they
    are: no transfer at all."""
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    m = model([helper.make_node("Sigmoid", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])
    sess = session(m)
    all_on_mlx(sess, 1)
    before = counters()
    for _ in range(3):
        (y,) = sess.run(None, {"x": x})
        assert_close(y, 1 / (1 + np.exp(-x)), "y")
    d = delta(before, counters())
    n = 3 if gpu_type_memory() else 0
    assert d["copies_h2d"] == n and d["copies_d2h"] == n, d
    # On MLX's GPU backend a result's buffer may still be referenced by the stream's pending
    # work when the output is allocated: the EP then copies (safe fallback). Measured on the
    # H200 (2026-11-29): host_feeds adopted 0 of 3, decode 22 of 32. Exact on the CPU backend.
    assert d["outputs_adopted"] + d["outputs_copied"] == 3, d
    if not on_gpu():
        assert d["outputs_adopted"] == 3, d
    del sess
    gc.collect()
    return {"delta": d}


def decode_model(heads=2, dim=8, vocab=16):
    """One attention-like step: present = Concat(past, new) on the sequence axis; logits =
    ReduceSum(present, seq) @ w_out. KV and logits stay where they are bound."""
    nodes = [
        helper.make_node("Concat", ["past", "new"], ["present"], axis=2),
        helper.make_node("ReduceSum", ["present", "axes"], ["pooled"], keepdims=0),
        helper.make_node("Reshape", ["pooled", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w_out"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes, "decode",
        [vi("past", [1, heads, "T", dim]), vi("new", [1, heads, 1, dim]),
         vi("w_out", [heads * dim, vocab])],
        [vi("present", [1, heads, "T1", dim]), vi("logits", [1, vocab])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [2]),
         helper.make_tensor("flat_shape", TensorProto.INT64, [2], [1, heads * dim])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m.SerializeToString()


def case_decode(steps=8):
    """A decode loop: each step's `present` (bound to EP memory, ORT allocates it) is the next
    step's `past` input, bound as is. Per step the only transfers are the new token's K upload
    (h2d; none with CPU-type EP memory, where ORT hands the host buffer over) and the logits
    read back (d2h); the KV cache never crosses to the host until the final check. Counts are
    exact."""
    heads, dim, vocab = 2, 8, 16
    rng = np.random.default_rng(3)
    w_out = rng.standard_normal((heads * dim, vocab)).astype(np.float32)
    past0 = rng.standard_normal((1, heads, 1, dim)).astype(np.float32)
    news = [rng.standard_normal((1, heads, 1, dim)).astype(np.float32) for _ in range(steps)]
    m = decode_model(heads, dim, vocab)
    sess = session(m)
    n_nodes = len(onnx.load_from_string(m).graph.node)
    all_on_mlx(sess, n_nodes)

    before = counters()
    w_dev = to_device(w_out)          # 1 h2d, once
    past = to_device(past0)           # 1 h2d, once
    logits_host = []
    kv_ref = past0
    for t in range(steps):
        io = sess.io_binding()
        io.bind_ortvalue_input("past", past)
        io.bind_ortvalue_input("w_out", w_dev)
        io.bind_cpu_input("new", news[t])          # h2d by ORT: the new token's K, small
        io._iobinding.bind_output("present", ep_ort_device())
        io._iobinding.bind_output("logits", ep_ort_device())
        sess.run_with_iobinding(io)
        present, logits = io.get_outputs()
        logits_host.append(to_host(logits))        # d2h: the logits, small
        past = present                             # the KV stays in EP memory
        kv_ref = np.concatenate([kv_ref, news[t]], axis=2)
        np.testing.assert_allclose(logits_host[-1], kv_ref.sum(axis=2).reshape(1, -1) @ w_out,
                                   rtol=1e-4, atol=1e-4)
        del io
    during = delta(before, counters())
    final = to_host(past)                          # 1 d2h: the whole cache, once, at the end
    np.testing.assert_allclose(final, kv_ref, rtol=0, atol=0)
    logits_bytes = vocab * 4
    new_bytes = heads * dim * 4
    per_step_h2d = 1 if gpu_type_memory() else 0
    expect = {
        "copies_h2d": 2 + per_step_h2d * steps,
        "bytes_h2d": w_out.nbytes + past0.nbytes + per_step_h2d * steps * new_bytes,
        "copies_d2h": steps, "bytes_d2h": steps * logits_bytes,
        "copies_d2d": 0,
    }
    got = {k: during[k] for k in expect}
    assert got == expect, f"transfers {got} != expected {expect} (KV copied to/from the host?)"
    # past and w_out used in place each step (and the uploaded new K with GPU-type memory);
    # present and logits handed over without a copy.
    assert during["inputs_borrowed"] == (2 + per_step_h2d) * steps, during
    assert during["outputs_adopted"] + during["outputs_copied"] == 2 * steps, during
    if not on_gpu():  # see case_host_feeds on the GPU's copy fallback
        assert during["outputs_adopted"] == 2 * steps and during["outputs_copied"] == 0, during
    info = {"steps": steps, "gpu_type_memory": gpu_type_memory(), "kv_bytes_final": final.nbytes,
            "during_loop": during}
    del sess, past, present, logits, w_dev
    gc.collect()
    return info


def case_llm(steps=8, model_dir=ROOT / "tests" / "models" / "llm" / "llama-fp32"):
    """Greedy decoding of a genai-format test LLM through the package's resident Decoder
    (generate.py: every present.* output bound to EP memory with IOBinding and fed back as the
    next step's past_key_values.* as is); only the logits come back to the host (exact count
    and bytes); no device-to-device copy. The tokens must equal ORT's CPU EP decoding the
    same prompt with numpy feeds."""
    from onnxruntime_mlx.generate import DEFAULT_PROMPT, Decoder, ResidentPast
    if not (pathlib.Path(model_dir) / "model.onnx").is_file():
        return {"skipped": f"no model at {model_dir}"}
    ref_tokens, ref_logits, _ = Decoder(model_dir, "cpu").generate(DEFAULT_PROMPT, steps)
    dec = Decoder(model_dir, "mlx", DEVICE, device_memory=1)
    assert dec.resident
    placed = om.placement(dec.session)
    assert set(placed) == {om.EP_NAME}, f"nodes off MLX: {placed}"
    logits, past = dec.step(np.array([DEFAULT_PROMPT], np.int64), dec.empty_past(), len(DEFAULT_PROMPT))
    total = len(DEFAULT_PROMPT)
    tokens, first_logits = [], None
    before = counters()
    host_feed_bytes = logits_bytes = 0
    resident_pasts = 0  # steps fed the last step's values as the run gave them (ResidentPast)
    for _ in range(steps):
        last = logits[0, -1].astype(np.float32)
        first_logits = last if first_logits is None else first_logits
        tokens.append(int(np.argmax(last)))
        if len(tokens) == steps:
            break
        total += 1
        # fed from the host: the token id, the attention mask (and position ids, if any)
        host_feed_bytes += 8 + 8 * total + (8 if "position_ids" in dec.inputs else 0)
        resident_pasts += isinstance(past, ResidentPast) and past.wrapped() == 0
        logits, past = dec.step(np.array([[tokens[-1]]], np.int64), past, total)
        logits_bytes += logits.nbytes
    during = delta(before, counters())
    assert tokens == ref_tokens, f"tokens {tokens} != CPU EP {ref_tokens}"
    np.testing.assert_allclose(first_logits, ref_logits[0], rtol=1e-3, atol=1e-4)
    # The logits are bound to the host: with CPU-type EP memory ORT hands the EP's buffer over
    # (no transfer); with GPU-type memory it copies them out (one d2h per step).
    d2h = (steps - 1, logits_bytes) if gpu_type_memory() else (0, 0)
    assert (during["copies_d2h"], during["bytes_d2h"]) == d2h, during
    assert during["copies_d2d"] == 0, during
    assert during["bytes_h2d"] == (host_feed_bytes if gpu_type_memory() else 0), during
    kv_bytes = sum(v.tensor_size_in_bytes() for v in past.values()) \
        if hasattr(next(iter(past.values())), "tensor_size_in_bytes") else None
    info = {"model": str(model_dir), "steps": steps, "tokens": tokens, "kv_bytes_final": kv_bytes,
            "during_decode": during, "vector_runs": dec.vector_runs, "resident_pasts": resident_pasts}
    del dec, past, logits
    gc.collect()
    return info


def case_llm_shared(steps=8, model_dir=ROOT / "tests" / "models" / "llm" / "llama-fp32"):
    """onnxruntime-genai's shared KV buffer with the KV in EP memory: each layer's past and
    present are one OrtValue, bound as input and output. The EP writes each present into that
    buffer on the device (MLX donation, no host memcpy through the buffer), only its new row: every
    present of every decode step is counted as written in place; no KV byte crosses to the host. The tokens equal ORT's CPU EP decoding in the same mode."""
    from onnxruntime_mlx.generate import DEFAULT_PROMPT, Decoder
    if not (pathlib.Path(model_dir) / "model.onnx").is_file():
        return {"skipped": f"no model at {model_dir}"}
    max_length = len(DEFAULT_PROMPT) + steps + 8
    ref_tokens, _, _ = Decoder(model_dir, "cpu", share_buffer=True, max_length=max_length).generate(
        DEFAULT_PROMPT, steps)
    dec = Decoder(model_dir, "mlx", DEVICE, device_memory=1, share_buffer=True, max_length=max_length)
    logits, past = dec.step(np.array([DEFAULT_PROMPT], np.int64), dec.empty_past(), len(DEFAULT_PROMPT))
    total, tokens = len(DEFAULT_PROMPT), []
    before = counters()
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[0, -1])))
        if len(tokens) == steps:
            break
        total += 1
        buffers = {k: v.data_ptr() for k, v in past.items()}
        logits, past = dec.step(np.array([[tokens[-1]]], np.int64), past, total)
        assert {k: v.data_ptr() for k, v in past.items()} == buffers, "present left its buffer"
    during = delta(before, counters())
    assert tokens == ref_tokens, f"tokens {tokens} != CPU EP {ref_tokens}"
    # Every present, and nothing copied into EP memory by the host (with GPU-type memory the
    # logits, bound to the host, pass through an EP buffer too: adopted or written the same way).
    presents = 2 * dec.num_layers * (steps - 1)
    assert during["outputs_written_on_device"] >= presents, during
    # Each present bound to its own past buffer gets only its new row written (inplace_rows);
    # anything else bound to EP memory is copied into it on the device.
    assert during["outputs_rows_in_place"] == presents, during
    # Those rows are written inside each step's evaluation: on MLX's CUDA backend by one kernel
    # (kernels/cuda/write_rows.h), on the CPU by the step's attention kernel itself
    # (kernels/cpu/decode_attention.cc, its present bound to the buffer).
    assert during["outputs_rows_in_step"] == presents, during
    assert during["outputs_copied"] + during["outputs_rows_in_place"] == during["outputs_written_on_device"], during
    assert during["copies_d2d"] == 0, during
    info = {"model": str(model_dir), "steps": steps, "tokens": tokens, "during_decode": during}
    del dec, past, logits
    gc.collect()
    return info


def case_fallback():
    """device_memory=1 with a node ORT's CPU EP runs (MaxRoiPool: no MLX translator): MLX -> CPU
    EP -> MLX. Reports what ORT does at the partition boundaries; outputs must equal the CPU EP."""
    x = np.random.default_rng(4).standard_normal((1, 2, 6, 6)).astype(np.float32)
    rois = np.array([[0, 0, 0, 5, 5], [0, 1, 2, 4, 5]], np.float32)
    m = model([helper.make_node("Mul", ["x", "x"], ["sq"]),
               helper.make_node("MaxRoiPool", ["sq", "rois"], ["f"], pooled_shape=[2, 2]),
               helper.make_node("Relu", ["f"], ["y"])],
              [vi("x", [1, 2, 6, 6]), vi("rois", [2, 5])], [vi("y", [2, 2, 2, 2])])
    feeds = {"x": x, "rois": rois}
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = session(m, fallback=True)
    placed = om.placement(sess)
    before = counters()
    (y,) = sess.run(None, feeds)
    d = delta(before, counters())
    assert_close(y, ref, "y")
    del sess
    gc.collect()
    return {"placement": {k: [n[1] for n in v] for k, v in placed.items()}, "delta": d}


def case_option_mismatch():
    """device_memory=0 on a registration with device memory: the EP's CreateEp fails with a
    message naming ORT_MLX_DEVICE_MEMORY (ORT's Python layer prints it and retries on the CPU
    EP alone, as for any EP creation error: the MLX EP must not be in the session)."""
    so = ort.SessionOptions()
    so.add_provider_for_devices(om.ep_devices(DEVICE), {"device_memory": "0"})
    m = model([helper.make_node("Neg", ["x"], ["y"])], [vi("x", [1])], [vi("y", [1])])
    out = _io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            s = ort.InferenceSession(m, sess_options=so)
    except Exception as e:  # noqa: BLE001  (the C API, or a Python without the retry)
        msg = str(e)
    else:
        assert om.EP_NAME not in s.get_providers(), s.get_providers()
        msg = out.getvalue()
    assert "device_memory=0" in msg and "ORT_MLX_DEVICE_MEMORY" in msg, msg
    return {"error": msg[msg.index("[MLX EP]"):][:240]}


def case_growth():
    """A KV cache one row longer each step, in EP memory: each new buffer freed before the next is
    made. Allocations are rounded up (to an eighth of their power of two from 64 KiB), so MLX's
    allocator hands a freed buffer back for the next, slightly larger request instead of taking
    fresh pages from the OS every step: 41 steps of 4 KiB more reuse a few buffers."""
    ptrs = []
    for rows in range(100, 141):
        v = empty_on_device([rows, 1024], np.float32)
        ptrs.append(v.data_ptr())
        del v
    distinct = len(set(ptrs))
    assert distinct <= 8, f"{distinct} distinct buffers for 41 steps"
    return {"distinct_buffers": distinct}


def case_large_outputs():
    """A product's 2 MiB output bound to the EP's device (ORT allocates it with the EP's
    allocator) and dropped after each run, as a prompt's logits are: on MLX's CPU allocator the
    EP keeps the freed buffer and the next run's output takes it (allocations_pooled), instead of
    fresh pages zeroed by the OS every run; on a GPU backend MLX's own cache does (no pool).
    Values equal ORT's CPU EP every run."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["a", "w"], ["y"])], [vi("a", [512, 256])], [vi("y", [512, 1024])],
              [numpy_helper.from_array(w, "w")])
    sess = session(m)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    before = counters()
    for run in range(6):
        a = rng.standard_normal((512, 256)).astype(np.float32)
        io = sess.io_binding()
        io.bind_cpu_input("a", a)
        io._iobinding.bind_output("y", ep_ort_device())
        sess.run_with_iobinding(io)
        y = io.get_outputs()[0]
        assert_close(to_host(y), ref.run(None, {"a": a})[0], "y")
        del y, io
        gc.collect()
    d = delta(before, counters())
    del sess
    gc.collect()
    return {"delta": d}


CASES = {
    "default_info": case_default_info,
    "growth": case_growth,
    "large_outputs": case_large_outputs,
    "copy_tensors": case_copy_tensors,
    "iobinding": case_iobinding,
    "host_feeds": case_host_feeds,
    "decode": case_decode,
    "llm": case_llm,
    "llm_shared": case_llm_shared,
    "fallback": case_fallback,
    "option_mismatch": case_option_mismatch,
}


def main(argv=None) -> int:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=os.environ.get("ORT_MLX_TEST_DEVICE", "cpu"),
                    choices=["cpu", "gpu"])
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    ap.add_argument("--steps", type=int, default=8, help="decode loop steps")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--gpu-type-memory", action="store_true",
                    help="register the EP's memory as a GPU-type device on MLX's CPU backend too "
                         "(ORT_MLX_DEVICE_MEMORY=2): ORT's non-CPU-device paths on a CPU machine")
    args = ap.parse_args(argv)
    DEVICE = args.device
    om.register(device_memory=True)
    results = {}
    for name in args.case or list(CASES):
        fn = CASES[name]
        try:
            info = fn(args.steps) if name in ("decode", "llm", "llm_shared") else fn()
            results[name] = {"ok": True, **(info or {})}
        except Exception as e:  # noqa: BLE001
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-2000:]}
        gc.collect()
    summary = {"device": DEVICE, "ort": ort.__version__, "library": om.library_path(),
               "cases": results}
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        for name, r in results.items():
            print(f"{'PASS' if r['ok'] else 'FAIL'} {name}: "
                  f"{json.dumps({k: v for k, v in r.items() if k not in ('ok', 'traceback')}, default=str)}")
            if not r["ok"]:
                print(r["traceback"])
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
