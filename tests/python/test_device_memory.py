"""Device memory (ORT_MLX_DEVICE_MEMORY=1 / device_memory=1): IOBinding with tensors in the EP's
memory, a decode loop that keeps the KV cache there, OrtApi CopyTensors, and CPU-EP fallback.

Device memory is chosen when the EP library is registered (README "Device memory and
IOBinding"), and this pytest process registers it without; so the device-memory cases run in
one child process, tools/gpu_device_memory_check.py, whose per-case results each test reads.
The same tool is what runs on the GPU machine (--device gpu; ORT_MLX_TEST_DEVICE=gpu here).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxruntime_mlx as om
from oracle import DEVICE

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_device_memory_check.py"
STEPS = 6


# "cpu": the EP's memory as registered on MLX's CPU backend (a CPU-type device: ORT hands host
# buffers to the EP as they are). "gpu-type": the same memory declared GPU-type (what the EP
# registers on MLX's GPU backend), so ORT copies feeds, fetches and partition boundaries through
# the EP's data transfer, as it will on the GPU. On the GPU machine both run against MLX's GPU.
MODES = ["cpu-type", "gpu-type"]


@pytest.fixture(scope="module", params=MODES)
def results(request):
    env = dict(os.environ)
    env["ORT_MLX_EP_LIBRARY"] = om.library_path()
    cmd = [sys.executable, str(TOOL), "--device", DEVICE, "--steps", str(STEPS), "--json"]
    if request.param == "gpu-type":
        cmd.append("--gpu-type-memory")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, f"no JSON from the check tool (rc={r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    out = json.loads(lines[-1])["cases"]
    out["_gpu_type"] = request.param == "gpu-type" or DEVICE == "gpu"
    return out


def _ok(results, name):
    r = results[name]
    assert r["ok"], f"{name}: {r.get('error')}\n{r.get('traceback', '')}"
    return r


def test_memory_info_registered(results):
    r = _ok(results, "default_info")
    assert r["vendor_id"] == "0x4d4c"
    assert r["memory_info"] == ("MLX GPU" if results["_gpu_type"] else "MLX")


def test_copy_tensors_round_trip(results):
    # OrtApi CopyTensors host -> EP -> EP -> host through the EP's data transfer.
    d = _ok(results, "copy_tensors")["delta"]
    assert (d["copies_h2d"], d["copies_d2d"], d["copies_d2h"]) == (1, 1, 1)


def test_iobinding_device_tensors(results):
    # Inputs bound in EP memory are used in place (3 inputs x 3 runs); nothing is copied.
    d = _ok(results, "iobinding")["delta"]
    assert d["copies_h2d"] == d["copies_d2h"] == d["copies_d2d"] == 0
    assert d["inputs_borrowed"] == 9


def test_iobinding_outputs_allocated_by_ort_are_not_copied(results):
    # y is bound to the EP's device without a buffer: ORT allocates it with the EP's
    # allocator, which hands over the MLX result's buffer (3 runs); z, preallocated, is copied.
    d = _ok(results, "iobinding")["delta"]
    if DEVICE == "gpu":
        # MLX's GPU stream may still hold the result when ORT asks for the buffer: the EP
        # then copies instead of handing it over (measured on the H200: 0 of 3 adopted).
        assert d["outputs_adopted"] + d["outputs_copied"] == 6 and d["outputs_copied"] >= 3, d
        # each such copy is one copy by the CUDA driver (an MLX copy kernel is many times slower)
        assert d["outputs_by_driver"] == d["outputs_copied"], d
    else:
        assert d["outputs_adopted"] == 3 and d["outputs_copied"] == 3, d
        assert d["outputs_by_driver"] == 0, d


def test_host_feeds(results):
    d = _ok(results, "host_feeds")["delta"]
    n = 3 if results["_gpu_type"] else 0  # GPU-type: one h2d and one d2h per run
    assert d["copies_h2d"] == n and d["copies_d2h"] == n


def test_decode_loop_keeps_kv_on_device(results):
    r = _ok(results, "decode")
    d = r["during_loop"]
    assert r["steps"] == STEPS
    # Exact counts (asserted in the tool too): 2 uploads before the loop (w_out, the first
    # past), then per step one logits read and, with GPU-type memory, one new-token upload; no
    # device-to-device copy; no KV byte to the host; present/logits never copied by the EP.
    per_step = 1 if results["_gpu_type"] else 0
    assert d["copies_h2d"] == 2 + per_step * STEPS
    assert d["copies_d2h"] == STEPS and d["copies_d2d"] == 0
    assert d["bytes_d2h"] == STEPS * 16 * 4
    if DEVICE == "gpu":  # handed over or, while MLX's stream holds the buffer, copied
        assert d["outputs_adopted"] + d["outputs_copied"] == 2 * STEPS
    else:
        assert d["outputs_adopted"] == 2 * STEPS and d["outputs_copied"] == 0


def test_cpu_fallback_partition(results):
    # MLX -> ORT's CPU EP (MaxRoiPool) -> MLX with device memory on: runs, equal to the CPU EP.
    r = _ok(results, "fallback")
    assert r["placement"] == {om.EP_NAME: ["Mul", "Relu"], "CPUExecutionProvider": ["MaxRoiPool"]}


def test_option_mismatch_is_a_clear_error(results):
    assert "ORT_MLX_DEVICE_MEMORY" in _ok(results, "option_mismatch")["error"]


# ---- in this process: registered without device memory (the default) ----

def _no_device_memory_here():
    if os.environ.get("ORT_MLX_DEVICE_MEMORY", "0") not in ("", "0"):
        pytest.skip("this process registered the EP with ORT_MLX_DEVICE_MEMORY set")


def test_default_registers_no_device_memory():
    _no_device_memory_here()
    om.register()
    assert not om.device_memory_registered()
    dev = om.ep_devices(DEVICE)[0]
    assert dev.ep_metadata.get("mlx.device_memory") == "0"
    assert dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT) is None  # ORT: the EP uses CPU memory


def test_device_memory_option_without_registration_fails_clearly(capfd):
    _no_device_memory_here()
    so = ort.SessionOptions()
    so.add_provider_for_devices(om.ep_devices(DEVICE), {"device_memory": "1"})
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    # CreateEp fails naming the variable; ORT's Python layer prints it and retries on the CPU
    # EP alone (as for any EP creation error), so MLX must not be in the session.
    with pytest.warns(UserWarning):
        s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    assert om.EP_NAME not in s.get_providers()
    out, err = capfd.readouterr()
    assert "device_memory=1, but the MLX EP library was registered without device memory" in out + err
    assert "ORT_MLX_DEVICE_MEMORY=1" in out + err
    # and device_memory=0 is accepted: it is the default
    so = om.session_options(DEVICE, device_memory=0)
    s = ort.InferenceSession(m.SerializeToString(), sess_options=so)
    np.testing.assert_array_equal(s.run(None, {"x": np.ones(2, np.float32)})[0], -np.ones(2))


def test_llm_greedy_decode_with_kv_in_ep_memory(results):
    # The llama-fp32 test LLM decoded with IOBinding (present.* bound as the next past.*):
    # tokens equal ORT's CPU EP with numpy feeds (asserted in the tool); per step only the
    # logits come to the host, and the KV cache is used in place (4 KV inputs per step).
    r = _ok(results, "llm")
    if "skipped" in r:
        pytest.skip(r["skipped"])
    # every step (the prompt's too) through the OrtValue-vector run (generate.py), not IOBinding
    assert r["vector_runs"] == STEPS, r
    # each decode step fed the last run's values back as they came out (ResidentPast), none
    # wrapped into Python OrtValues and unwrapped again
    assert r["resident_pasts"] == STEPS - 1, r
    d = r["during_decode"]
    # (the logits are bound to the host: handed over as they are with CPU-type EP memory, one
    # d2h copy per decode step with GPU-type memory; the tool checks the exact bytes)
    assert d["copies_d2h"] == (STEPS - 1 if results["_gpu_type"] else 0) and d["copies_d2d"] == 0
    assert d["inputs_borrowed"] >= 4 * (STEPS - 1)
    if DEVICE != "gpu":  # on the GPU some outputs are copied (see the iobinding test)
        assert d["outputs_copied"] == 0
    if not results["_gpu_type"]:
        assert d["copies_h2d"] == 0


def test_growing_buffers_reuse_memory(results):
    # EP-memory buffers one row longer each step reuse freed ones (device_buffers.cc
    # allocation_size): a decode loop's KV outputs do not take fresh, zeroed pages every step.
    r = _ok(results, "growth")
    assert r["distinct_buffers"] <= 8, r


def test_large_outputs_reuse_freed_buffers(results):
    # A 2 MiB output ORT frees after each run (a prompt's logits) gets the buffer freed before
    # on MLX's CPU allocator (device_buffers.h: the pool), whose own cache may be full of the
    # run's intermediates; MLX's GPU allocators cache it themselves. Broken by no pool, or by
    # adopting the kernel's own MLX buffer for large outputs instead of binding ORT's.
    d = _ok(results, "large_outputs")["delta"]
    if DEVICE == "gpu":
        assert d["allocations_pooled"] == 0, d
    else:
        assert d["allocations_pooled"] >= 4, d


def test_llm_shared_kv_buffer_written_in_place(results):
    # genai's shared past/present buffer in EP memory: every present written into its own buffer
    # on the device (the tool checks the tokens against ORT's CPU EP in the same mode and that
    # each layer's OrtValue keeps its buffer).
    r = _ok(results, "llm_shared")
    if "skipped" in r:
        pytest.skip(r["skipped"])
    d = r["during_decode"]
    assert d["outputs_written_on_device"] > 0 and d["copies_d2d"] == 0
    if not results["_gpu_type"]:
        assert d["copies_h2d"] == 0 and d["copies_d2h"] == 0
