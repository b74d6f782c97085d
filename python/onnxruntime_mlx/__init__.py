"""onnxruntime_mlx: run ONNX models on MLX through ONNX Runtime's plugin-EP interface.

    import onnxruntime as ort, onnxruntime_mlx
    so = onnxruntime_mlx.session_options(device="cpu")
    sess = ort.InferenceSession("model.onnx", sess_options=so)
"""
from __future__ import annotations

import os
import pathlib

import onnxruntime as ort

EP_NAME = "MLXExecutionProvider"
REGISTRATION_NAME = "onnxruntime_mlx"
__version__ = "0.1.0"

_registered = False


def library_path() -> str:
    """Absolute path of the built libonnxruntime_mlx_ep.so (ORT needs an absolute path).

    Looked up in $ORT_MLX_EP_LIBRARY, then in the project's build folder."""
    env = os.environ.get("ORT_MLX_EP_LIBRARY")
    if env:
        p = pathlib.Path(env).resolve()
        if not p.is_file():
            raise FileNotFoundError(f"ORT_MLX_EP_LIBRARY={env} does not exist")
        return str(p)
    root = pathlib.Path(__file__).resolve().parents[2]
    for name in ("libonnxruntime_mlx_ep.so", "libonnxruntime_mlx_ep.dylib"):
        p = root / "build" / name
        if p.is_file():
            return str(p)
    raise FileNotFoundError(
        f"libonnxruntime_mlx_ep not found under {root / 'build'}; run scripts/test or "
        "scripts/demo (they build it), or set ORT_MLX_EP_LIBRARY")


def register(device_memory: bool | None = None) -> str:
    """Registers the EP library with ORT once per process; returns the library path.

    device_memory=True registers it with ORT_MLX_DEVICE_MEMORY=1 (the EP's devices then carry
    the EP's own memory: IOBinding with device tensors, see README "Device memory and
    IOBinding"); it is decided at registration, so asking for the other setting once registered
    raises RuntimeError. None: whatever ORT_MLX_DEVICE_MEMORY says (default off)."""
    global _registered
    path = library_path()
    if device_memory is not None and not _registered and not _mlx_devices():
        on = os.environ.get("ORT_MLX_DEVICE_MEMORY", "0") not in ("", "0")
        if bool(device_memory) != on:
            os.environ["ORT_MLX_DEVICE_MEMORY"] = "1" if device_memory else "0"
    if not _registered:
        if not _mlx_devices():
            ort.register_execution_provider_library(REGISTRATION_NAME, path)
        _registered = True
    if device_memory is not None and device_memory_registered() != bool(device_memory):
        raise RuntimeError(
            f"the MLX EP is already registered with device memory "
            f"{'on' if device_memory_registered() else 'off'}; it is chosen at registration "
            "(ORT_MLX_DEVICE_MEMORY), once per process")
    return path


def _mlx_devices() -> list:
    return [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]


def device_memory_registered() -> bool:
    """Whether the registered EP's devices use the EP's own memory (ORT_MLX_DEVICE_MEMORY=1)."""
    return any(d.ep_metadata.get("mlx.device_memory") == "1" for d in _mlx_devices())


def device_memory_info(device: str = "auto"):
    """The OrtMemoryInfo of the EP's device memory for `device` (None without device memory):
    allocate there with OrtValue.ortvalue_from_shape_and_type(shape, dtype, memory_info=...)."""
    return ep_devices(device)[0].memory_info(ort.OrtDeviceMemoryType.DEFAULT)


def device_memory_ort_device(device: str = "auto"):
    """The EP's device memory as the OrtDevice that IOBinding's bind_output takes
    (`io._iobinding.bind_output(name, om.device_memory_ort_device(...))`: the public bind_output
    has no vendor id argument). GPU-type on MLX's GPU backend (or ORT_MLX_DEVICE_MEMORY=2)."""
    from onnxruntime.capi import _pybind_state as C
    info = device_memory_info(device)
    if info is None:
        raise RuntimeError("the MLX EP was registered without device memory (ORT_MLX_DEVICE_MEMORY)")
    kind = C.OrtDevice.gpu() if info.name == "MLX GPU" else C.OrtDevice.cpu()
    return C.OrtDevice(kind, C.OrtDevice.default_memory(), info.device_vendor_id, info.device_id)


def ep_devices(device: str = "auto") -> list:
    """The OrtEpDevices of the MLX EP for `device` ("auto", "cpu" or "gpu")."""
    register()
    devs = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devs:
        raise RuntimeError("the MLX EP registered no devices")
    gpu = [d for d in devs if d.device.type == ort.OrtHardwareDeviceType.GPU]
    cpu = [d for d in devs if d.device.type == ort.OrtHardwareDeviceType.CPU]
    if device == "gpu":
        if not gpu:
            raise RuntimeError("device='gpu' asked, but this MLX build has no GPU backend")
        return gpu[:1]
    if device == "cpu":
        return cpu[:1]
    return (gpu or cpu)[:1]


def session_options(device: str = "auto", *, fallback: bool = True,
                    so: ort.SessionOptions | None = None, **provider_options) -> ort.SessionOptions:
    """SessionOptions with the MLX EP added for `device` (auto picks MLX's GPU when there is one).

    provider_options: compile, cache_size, compile_after, shape_family, host_fold, log_level, report_path,
    memory_limit_mb, cache_limit_mb, device_memory, tf32, int8_emulation, index_check, step_order,
    fused_rotary, zero_bias, grouped_kv, cpu_gemv (see README "Options"). fallback=False sets
    session.disable_cpu_ep_fallback=1, so a session fails unless every node runs on MLX."""
    so = so or ort.SessionOptions()
    if "device_memory" in provider_options:
        register(device_memory=bool(int(provider_options["device_memory"])))
    opts = {k: str(int(v) if isinstance(v, bool) else v) for k, v in provider_options.items()}
    devs = ep_devices(device)
    if device != "auto":
        opts.setdefault("device", device)
    so.add_provider_for_devices(devs, opts)
    if not fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return so


def placement(session: ort.InferenceSession) -> dict[str, list[tuple[str, str]]]:
    """Node placement as ORT itself reports it: {ep_name: [(node_name, op_type), ...]}.

    The session must have been created with
    session.record_ep_graph_assignment_info=1 (see assignment_options())."""
    out: dict[str, list[tuple[str, str]]] = {}
    for sub in session.get_provider_graph_assignment_info():
        out.setdefault(sub.ep_name, []).extend((n.name, n.op_type) for n in sub.get_nodes())
    return out


def record_assignment(so: ort.SessionOptions) -> ort.SessionOptions:
    """Asks ORT to record which EP runs each node (read back with placement())."""
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so
