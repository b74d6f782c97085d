"""onnxruntime_mlx: run ONNX models on MLX through ONNX Runtime's plugin-EP interface.

    import onnxruntime_mlx
    sess = onnxruntime_mlx.InferenceSession("model.onnx")          # every check below, or:
    so = onnxruntime_mlx.session_options(device="cpu")             # options validated here
    sess = onnxruntime.InferenceSession("model.onnx", sess_options=so, enable_fallback=0)
"""
from __future__ import annotations

import os
import pathlib
import re

import onnxruntime as ort

EP_NAME = "MLXExecutionProvider"
REGISTRATION_NAME = "onnxruntime_mlx"
__version__ = "0.1.0"

# The EP negotiates ORT's C API down to version 23 (ORT 1.23); older ORTs have no plugin EPs.
MIN_ORT_VERSION = (1, 23)
TESTED_ORT_VERSIONS = "1.31"

_registered = False


class OptionError(ValueError):
    """A provider option (or device) the MLX EP does not take; raised before ORT sees it."""


class DeviceUnavailableError(RuntimeError):
    """The device asked for does not exist in this MLX build (device='gpu' without a GPU)."""


class NotOnMLXError(RuntimeError):
    """A session that was meant to run on the MLX EP does not (the EP is not in its providers,
    or no node was assigned to it)."""


class UsageError(Exception):
    """A bad command-line argument, model or input: the CLI prints it as one line, exit code 2."""


def check_ort_version(version: str | None = None) -> None:
    """Raises ImportError when the installed onnxruntime is older than MIN_ORT_VERSION."""
    version = ort.__version__ if version is None else version
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m or (int(m.group(1)), int(m.group(2))) < MIN_ORT_VERSION:
        need = ".".join(map(str, MIN_ORT_VERSION))
        raise ImportError(
            f"onnxruntime_mlx needs onnxruntime >= {need} (plugin execution providers); "
            f"onnxruntime {version} is installed: pip install -U 'onnxruntime>={need}' "
            f"(tested with {TESTED_ORT_VERSIONS})")


check_ort_version()


# -- provider options ----------------------------------------------------------------------
# The table the EP parses in src/ep/options.cc (tests/python/test_package_options.py checks the
# two agree): key -> allowed strings, or an inclusive integer range (bools count as 0/1).
_INT = re.compile(r"-?[0-9]+")
OPTIONS: dict[str, tuple] = {
    "device": ("auto", "cpu", "gpu"),
    "compile": (0, 1),
    "cache_size": (1, 1 << 20),
    "compile_after": (1, 1 << 20),
    "shape_family": (0, 1),
    "host_fold": (0, 1),
    "index_check": (0, 1),
    "gpu_kernels": (0, 1),
    "inplace_rows": (0, 1),
    "step_order": (0, 1),
    "fused_rotary": (0, 1),
    "zero_bias": (0, 1),
    "grouped_kv": (0, 1),
    "cpu_gemv": (0, 1),
    "log_level": (0, 3),
    "report_path": (str,),
    "memory_limit_mb": (0, 1 << 40),
    "cache_limit_mb": (0, 1 << 40),
    "device_memory": (0, 2),
    "tf32": (0, 1),
    "int8_emulation": (0, 1, "auto"),
    "profile_ops": (0, 1),
    "device_copies": (0, 2),
    "pinned_inputs": (0, 1 << 40),
    "cpu_poll": (0, 1),
    "cpu_poll_us": (1, 100000),
    "cpu_hold": (0, 1),
    "cpu_pin_workers": (0, 1),
    "cpu_attention": (0, 1),
    "cpu_gelu": (0, 1),
    "cpu_product_gelu": (0, 1),
    "cpu_swiglu": (0, 1),
    "cpu_int4_gemm": (0, 1),
    "cpu_in_place_io": (0, 1),
    "cpu_caller_eval": (0, 1),
    "cpu_caller_replay": (0, 1),
    "cpu_packed_matmul": (0, 1),
    "cpu_packed_blocks": (0, 1),
    "cpu_packed_prepared": (0, 1),
    "cpu_packed_rows": (0, 1 << 30),
    "cpu_packed_stream": (0, 1 << 20),
    "cpu_packed_ahead": (0, 1 << 16),
    "cpu_packed_depth": (0, 1 << 16),
    "cpu_skip_norm": (0, 1),
    "cpu_gqa_prompt": (0, 1),
    "cpu_dnnl_blocked": (0, 1),
    "cpu_dnnl_add": (0, 1),
    "cpu_dnnl_blocked16": (0, 1),
    "cpu_dnnl_winograd": (0, 1),
    "cpu_dnnl_concat_convs": (0, 1),
    "cpu_walk_large": (0, 1),
    "cpu_depthwise": (0, 1),
    "cpu_patch_deconv": (0, 1),
    "gpu_graph_replay": (0, 1),
    "fuse_matmuls": (0, 1),
    "fused_skip_norm": (0, 1),
    "step_row_writes": (0, 1),
    "fused_gqa_step": (0, 1),
    "flat_products": (0, 1),
    "transposed_weights": (0, 1),
    "cpu_dnnl": (0, 1),
    "cpu_dnnl_min_flops": (0, 1 << 50),
    "cpu_dnnl_parallel_min_flops": (0, 1 << 50),
    "cpu_program_parallel_min_flops": (0, 1 << 50),
    "cpu_dnnl_matmul": (0, 1),
    "fuse_conv_activation": (0, 1),
    "cpu_fuse": (0, 1, "auto"),
    "int4_dense_rows": (0, 1 << 30),
    "int4_dequantize_kernel": (0, 1),
    "gpu_attention_split_rows": (0, 8192),
    "cpu_avx512": (0, 1),
}


def _allowed(key: str) -> str:
    spec = OPTIONS[key]
    if spec == (str,):
        return "a path"
    words = [s for s in spec if isinstance(s, str)]
    ints = [s for s in spec if isinstance(s, int)]
    parts = [f"an integer in [{ints[0]}, {ints[1]}]"] if ints else []
    return " or ".join(parts + [", ".join(words)] if words else parts)


def validate_options(options: dict) -> dict[str, str]:
    """The provider options as the strings ORT passes on, after checking each key and value
    against OPTIONS; raises OptionError naming the key and what it allows."""
    out = {}
    for key, value in options.items():
        if key not in OPTIONS:
            raise OptionError(f"unknown MLX EP option {key!r}; the options are: "
                              f"{', '.join(sorted(OPTIONS))}")
        spec = OPTIONS[key]
        if spec == (str,):
            if not isinstance(value, (str, os.PathLike)):
                raise OptionError(f"MLX EP option {key!r}: {value!r} is not a path")
            out[key] = os.fspath(value)
            continue
        words = [s for s in spec if isinstance(s, str)]
        ints = [s for s in spec if isinstance(s, int)]
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, str) and value in words:
            out[key] = value
            continue
        n = None
        if isinstance(value, int):
            n = value
        elif isinstance(value, str) and _INT.fullmatch(value):
            n = int(value)
        if n is None or not ints or not ints[0] <= n <= ints[1]:
            raise OptionError(f"MLX EP option {key!r}: {value!r} is not {_allowed(key)}")
        out[key] = str(n)
    return out


# -- the library -----------------------------------------------------------------------------

_LIB_NAMES = ("libonnxruntime_mlx_ep.so", "libonnxruntime_mlx_ep.dylib")


def get_library_path() -> str:
    """Absolute path of libonnxruntime_mlx_ep (ORT needs an absolute path).

    Looked up in $ORT_MLX_EP_LIBRARY, then inside this package (an installed wheel), then in
    the build folder of the checkout this package sits in."""
    env = os.environ.get("ORT_MLX_EP_LIBRARY")
    if env:
        p = pathlib.Path(env).resolve()
        if not p.is_file():
            raise FileNotFoundError(f"ORT_MLX_EP_LIBRARY={env} does not exist")
        return str(p)
    here = pathlib.Path(__file__).resolve().parent
    root = here.parents[1]
    for folder in (here, root / "build"):
        for name in _LIB_NAMES:
            if (folder / name).is_file():
                return str(folder / name)
    raise FileNotFoundError(
        f"libonnxruntime_mlx_ep not found in {here} (an installed wheel) nor under "
        f"{root / 'build'} (a checkout: run scripts/build), and ORT_MLX_EP_LIBRARY is not set")


def get_ep_names() -> list[str]:
    """The names of the execution providers the library creates (ORT's plugin-EP convention)."""
    return [EP_NAME]


library_path = get_library_path  # the names of earlier versions
ep_names = get_ep_names


# What _preload_blas() did: the library path it loaded, or why it loaded none (doctor shows it).
blas_preload: str = "not tried"


def _avx512_cpu() -> bool:
    """Whether the CPU has what OpenBLAS's SkylakeX kernels need (Linux's /proc/cpuinfo)."""
    from .cpu_info import AVX512_FLAGS, cpu_flags
    return all(f in cpu_flags() for f in AVX512_FLAGS)


def _preload_blas() -> None:
    """Makes the mlx-cpu wheel's libmlx use the system's OpenBLAS.

    That wheel's libmlx takes cblas_*/LAPACK from the reference BLAS it bundles (an sgemm ~30x
    slower than OpenBLAS). Symbols are looked up in the process's global scope before a
    library's own dependencies, so OpenBLAS loaded with RTLD_GLOBAL before libmlx is what
    libmlx binds to. ORT_MLX_BLAS: a library to load instead, or "bundled" to keep the wheel's.
    Too late when libmlx is already loaded (`import mlx.core` first): doctor says so."""
    global blas_preload
    import ctypes
    import ctypes.util
    import sys
    # OpenBLAS's workers spin (yielding) for 2^28 TSC cycles (~0.1 s) after each call before they
    # sleep: one spinning beside oneDNN's two OpenMP threads leaves those to share a core, and a
    # CNN's runs take ~2.5x their time in streaks. 2^20 (~0.3 ms) still bridges a model's
    # back-to-back products. OpenBLAS reads it once, when it loads; a user's value wins.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")
    # An OpenBLAS older than the CPU (Debian's 0.3.21 on an Emerald Rapids Xeon) picks its SSE3
    # Prescott kernels by itself: one-row Gemms and MLX's own products then run at a fraction
    # of the AVX-512 rate. On a CPU with the AVX-512 that OpenBLAS's SkylakeX kernels use, its
    # fp32 kernels are the ones OpenBLAS picks where it knows the CPU (Cooperlake and
    # SapphireRapids share them); a user's value wins.
    if _avx512_cpu():
        os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
    choice = os.environ.get("ORT_MLX_BLAS", "")
    if choice == "bundled" or not sys.platform.startswith("linux"):
        blas_preload = "none (ORT_MLX_BLAS=bundled)" if choice else "none (not Linux)"
        return
    path = choice or ctypes.util.find_library("openblas")
    if not path:
        blas_preload = "none (no OpenBLAS found: apt install libopenblas0, or set ORT_MLX_BLAS)"
        return
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        if choice:
            raise OSError(f"ORT_MLX_BLAS={choice}: {e}") from None
        blas_preload = f"none ({e})"
        return
    blas_preload = path


_preload_blas()  # at import: before anything (the EP, `import mlx.core`) loads libmlx


def _preload_mlx(library: str) -> None:
    """For a wheel's library whose RPATH ($ORIGIN/../mlx/lib) finds no libmlx (mlx installed in
    another site folder): loads the installed `mlx` package's libmlx first, so that the
    library's DT_NEEDED libmlx.so resolves to it. A library elsewhere (a checkout's build, one
    built against another MLX) keeps its own RPATH."""
    import ctypes
    here = pathlib.Path(__file__).resolve().parent
    lib_dir = pathlib.Path(library).resolve().parent
    names = ("libmlx.so", "libmlx.dylib")
    if lib_dir != here or any((here.parent / "mlx" / "lib" / n).is_file() for n in names):
        return
    try:
        import mlx
    except ImportError:
        return
    for d in getattr(mlx, "__path__", []):
        for name in names:
            lib = pathlib.Path(d) / "lib" / name
            if lib.is_file():
                ctypes.CDLL(str(lib))
                return


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
            _preload_mlx(path)
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
    if device not in OPTIONS["device"]:
        raise OptionError(f"MLX EP option 'device': {device!r} is not one of auto, cpu, gpu")
    register()
    devs = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devs:
        raise RuntimeError("the MLX EP registered no devices")
    gpu = [d for d in devs if d.device.type == ort.OrtHardwareDeviceType.GPU]
    cpu = [d for d in devs if d.device.type == ort.OrtHardwareDeviceType.CPU]
    if device == "gpu":
        if not gpu:
            raise DeviceUnavailableError("device 'gpu' asked, but this MLX build has no GPU "
                                         "backend (its devices: cpu)")
        return gpu[:1]
    if device == "cpu":
        return cpu[:1]
    return (gpu or cpu)[:1]


def session_options(device: str = "auto", *, fallback: bool = True,
                    so: ort.SessionOptions | None = None, **provider_options) -> ort.SessionOptions:
    """SessionOptions with the MLX EP added for `device` (auto picks MLX's GPU when there is one).

    provider_options: see OPTIONS (and docs/options.md); an unknown key or a bad value raises
    OptionError (a ValueError) naming the key and what it allows, before ORT sees it.
    fallback=False sets session.disable_cpu_ep_fallback=1, so a session fails unless every
    node runs on MLX. Create the session with InferenceSession() below, or pass
    enable_fallback=0 to onnxruntime.InferenceSession: otherwise ORT's Python layer answers an
    EP error by printing it and retrying the whole session on the CPU EP alone."""
    opts = validate_options(provider_options)
    if device not in OPTIONS["device"]:
        raise OptionError(f"MLX EP option 'device': {device!r} is not one of auto, cpu, gpu")
    so = so or ort.SessionOptions()
    if "device_memory" in opts:
        register(device_memory=bool(int(opts["device_memory"])))
    devs = ep_devices(device)
    if device != "auto":
        opts.setdefault("device", device)
    so.add_provider_for_devices(devs, opts)
    if not fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return so


def check_session(session: ort.InferenceSession) -> ort.InferenceSession:
    """Raises NotOnMLXError unless the MLX EP is one of `session`'s providers."""
    if EP_NAME not in session.get_providers():
        raise NotOnMLXError(f"the session does not use {EP_NAME} (its providers: "
                            f"{', '.join(session.get_providers())})")
    return session


def InferenceSession(model, device: str = "auto", *, fallback: bool = True,  # noqa: N802
                     sess_options: ort.SessionOptions | None = None,
                     **provider_options) -> ort.InferenceSession:
    """An onnxruntime.InferenceSession on the MLX EP that cannot silently end up on the CPU EP.

    Options are validated (OptionError); ORT's Python-level fallback is off (enable_fallback=0:
    an EP error while creating or running the session is raised, not answered by retrying on
    the CPU EP alone); and the session is checked to have the MLX EP among its providers.
    fallback=False also keeps every node on MLX (session.disable_cpu_ep_fallback)."""
    so = session_options(device, fallback=fallback, so=sess_options, **provider_options)
    model = os.fspath(model) if isinstance(model, os.PathLike) else model
    return check_session(ort.InferenceSession(model, sess_options=so, enable_fallback=0))


def placement(session: ort.InferenceSession, model=None) -> dict[str, list[tuple[str, str]]]:
    """Node placement as ORT itself reports it: {ep_name: [(node_name, op_type), ...]}.

    The session must have been created with
    session.record_ep_graph_assignment_info=1 (see assignment_options()). ORT reports the nodes
    of the main graph only; given the model (a path, bytes or an onnx.ModelProto), the nodes
    inside If/Loop/Scan bodies are listed too, under their control-flow node's EP (an EP that
    claims such a node runs its bodies as part of it), named "parent/attribute/node"."""
    out: dict[str, list[tuple[str, str]]] = {}
    for sub in session.get_provider_graph_assignment_info():
        out.setdefault(sub.ep_name, []).extend((n.name, n.op_type) for n in sub.get_nodes())
    if model is None:
        return out
    import onnx
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray)):
        proto = onnx.load_from_string(bytes(model))
    else:
        proto = onnx.load(str(model), load_external_data=False)
    ep_of = {name: ep for ep, nodes in out.items() for name, _ in nodes}

    def bodies(node, prefix):
        for attr in node.attribute:
            graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for g in graphs:
                for inner in g.node:
                    name = f"{prefix}/{attr.name}/{inner.name or inner.op_type}"
                    yield name, inner
                    yield from bodies(inner, name)

    for node in proto.graph.node:
        ep = ep_of.get(node.name)
        if ep is None:
            continue
        out[ep].extend((name, inner.op_type) for name, inner in bodies(node, node.name))
    return out


def record_assignment(so: ort.SessionOptions) -> ort.SessionOptions:
    """Asks ORT to record which EP runs each node (read back with placement())."""
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return so
