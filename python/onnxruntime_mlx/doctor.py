"""`python -m onnxruntime_mlx doctor`: versions, the EP library and its devices, the sgemm
GFLOP/s that the EP actually gets, and whether its CPU convolutions run through oneDNN.

The benchmark matters because of a trap (docs/setup): the mlx-cpu wheel bundles the reference
netlib BLAS (~4 GFLOP/s on a 2-core machine); scripts/setup repoints the venv's libmlx at
OpenBLAS (>100 GFLOP/s), and outside a checkout the package loads the system's OpenBLAS into
the global symbol scope before libmlx (onnxruntime_mlx._preload_blas). Timing a MatMul model *through ORT and the EP* proves which one the
EP's libmlx really resolved, whatever the process loaded first.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import onnxruntime_mlx as om
from onnxruntime_mlx.cpu_info import AVX512_FLAGS, cpu_flags  # noqa: F401 (doctor's names for them)


def matmul_model(n: int) -> bytes:
    """Y = A @ B, A and B [n, n] float32 graph inputs (fed every run, like real activations)."""
    g = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"], name="sgemm")], "sgemm",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [n, n]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n, n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def median_seconds(session: ort.InferenceSession, feeds: dict, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sgemm(n: int = 1024, runs: int = 10, warmup: int = 3, device: str = "auto") -> dict:
    """GFLOP/s of an n x n x n fp32 MatMul through the MLX EP (fallback disabled: it must run on
    MLX) and through ORT's CPU EP."""
    model = matmul_model(n)
    rng = np.random.default_rng(0)
    feeds = {"A": rng.standard_normal((n, n), dtype=np.float32),
             "B": rng.standard_normal((n, n), dtype=np.float32)}
    so = om.session_options(device, fallback=False)
    so.log_severity_level = 4  # a refused session is reported by the caller, once
    mlx = ort.InferenceSession(model, sess_options=so)
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(mlx.run(None, feeds)[0], cpu.run(None, feeds)[0],
                               rtol=1e-3, atol=1e-3)
    flops = 2.0 * n ** 3
    t_mlx = median_seconds(mlx, feeds, runs, warmup)
    t_cpu = median_seconds(cpu, feeds, runs, warmup)
    return {"n": n, "mlx_gflops": flops / t_mlx / 1e9, "cpu_gflops": flops / t_cpu / 1e9,
            "mlx_ms": t_mlx * 1e3, "cpu_ms": t_cpu * 1e3, "runs": runs}


def sgemm_line(r: dict) -> str:
    return (f"sgemm {r['n']}x{r['n']}x{r['n']} fp32: MLX EP {r['mlx_gflops']:.1f} GFLOP/s "
            f"({r['mlx_ms']:.2f} ms), CPU EP {r['cpu_gflops']:.1f} GFLOP/s ({r['cpu_ms']:.2f} ms)"
            f"  [median of {r['runs']} runs]")


def mapped_libraries(fragment: str) -> list[str]:
    """Paths of the shared objects mapped into this process whose file name contains
    `fragment` (Linux: /proc/self/maps; [] elsewhere)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                path = parts[-1] if len(parts) >= 6 else ""
                if path.startswith("/") and fragment in path.rsplit("/", 1)[-1]:
                    libs.add(path)
    except OSError:
        return []
    return sorted(libs)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def sgemm_provider() -> str:
    """The file that provides cblas_sgemm to the libmlx this process loaded (the one the EP
    uses): dlsym on libmlx's handle searches libmlx and then its dependencies in load order,
    as the dynamic linker binds libmlx's own references. OpenBLAS here means the setup patch
    works; mlx_cpu.libs/libblas-*.so is the slow reference BLAS."""
    mlx_libs = [p for p in mapped_libraries("libmlx") if p.endswith(".so") or ".so." in p]
    if not mlx_libs:
        return "(libmlx is not loaded)"
    try:
        # The global scope (what the package's OpenBLAS preload joins) comes first, then
        # libmlx's own dependencies.
        try:
            addr = ctypes.cast(ctypes.CDLL(None).cblas_sgemm, ctypes.c_void_p).value
        except AttributeError:
            handle = ctypes.CDLL(mlx_libs[0], mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY)
            addr = ctypes.cast(handle.cblas_sgemm, ctypes.c_void_p).value
        info = _DlInfo()
        if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
            return "(dladdr failed)"
        return info.dli_fname.decode()
    except (OSError, AttributeError) as e:
        return f"(unknown: {e})"


# OpenBLAS kernel sets that use AVX-512 (0.3.x names); any other on a CPU with these flags runs
# narrower kernels (OpenBLAS's sgemm about half as fast on a CPU with full-width AVX-512).
AVX512_CORES = ("skylakex", "cooperlake", "sapphirerapids")


def openblas_core(library: str) -> str | None:
    """The kernel set OpenBLAS picked in this process (openblas_get_corename), or None when
    `library` is not an OpenBLAS."""
    try:
        lib = ctypes.CDLL(library, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY)
        fn = lib.openblas_get_corename
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    return (fn() or b"?").decode()


def openblas_advice(core: str, forced: str | None, flags: set[str]) -> str | None:
    """Why OpenBLAS runs narrower kernels than the CPU has, and what to do; None when it does not."""
    if core.lower() in AVX512_CORES or not all(f in flags for f in AVX512_FLAGS):
        return None
    if forced is not None:
        return (f"OPENBLAS_CORETYPE={forced} forces OpenBLAS's {core} kernels on a CPU with AVX-512: "
                "unset it (or set SkylakeX) for its AVX-512 sgemm")
    return (f"OpenBLAS picked its {core} kernels on a CPU with AVX-512 (a CPU its version does not "
            "know): OPENBLAS_CORETYPE=SkylakeX selects its AVX-512 kernels")


def openblas_line(provider: str) -> str | None:
    core = openblas_core(provider)
    if core is None:
        return None
    forced = os.environ.get("OPENBLAS_CORETYPE")
    line = f"OpenBLAS core    {core}" + (f" (OPENBLAS_CORETYPE={forced})" if forced is not None else "")
    advice = openblas_advice(core, forced, cpu_flags())
    return line + (f"\nWARNING: {advice}" if advice else "")


def onednn_line() -> str:
    """Runs a 3x3 Conv (above the EP's cpu_dnnl_min_flops) on MLX's CPU device and says whether
    oneDNN ran it (the report's count) and which libdnnl the process mapped."""
    w = np.random.default_rng(0).standard_normal((16, 16, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "report.jsonl")
        s = om.InferenceSession(m.SerializeToString(), "cpu", fallback=False, report_path=report)
        s.run(None, {"x": np.ones((1, 16, 32, 32), np.float32)})
        del s
        with open(report) as f:
            line = next(json.loads(ln) for ln in f if '"fused_node"' in ln)
    libs = mapped_libraries("libdnnl")
    if line.get("process_dnnl_convs", 0) > 0:
        return f"oneDNN           {libs[0] if libs else '?'} (CPU convolutions run through it)"
    return ("oneDNN           not loaded: CPU convolutions use MLX's own (the wheel carries "
            "libdnnl.so.2; it needs the system's libgomp, GCC's OpenMP runtime)")


def process_getenv(key: str) -> str | None:
    """`key` in the process's C environment: what the libraries read, including what the EP or
    this package set there after Python took its os.environ snapshot."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    v = getenv(key.encode())
    return v.decode() if v is not None else None


def threads_line() -> str:
    """The process-wide settings that decide whether the CPU device's worker threads (OpenMP's,
    which oneDNN and the EP's kernels share, and OpenBLAS's) spin or sleep between kernels, as
    the process sees them once the EP and oneDNN are loaded (docs/options.md)."""
    def value(key: str) -> str:
        v = process_getenv(key)
        return "unset" if v is None else v
    pool = "the EP's own" if value("ORT_MLX_CPU_OPENMP_POOL") == "0" else "OpenMP's"
    return (f"CPU threads      GOMP_SPINCOUNT={value('GOMP_SPINCOUNT')} OMP_WAIT_POLICY={value('OMP_WAIT_POLICY')} "
            f"OPENBLAS_THREAD_TIMEOUT={value('OPENBLAS_THREAD_TIMEOUT')}; the EP's kernels split over {pool} threads")


def run(args: argparse.Namespace) -> int:
    om.register()  # the package's libmlx first, then mlx.core's (the same library)
    import mlx.core as mx

    p = print
    if not args.sgemm_only:
        p(f"onnxruntime      {ort.__version__}")
        p(f"onnx             {onnx.__version__}")
        p(f"mlx              {mx.__version__} (default device {mx.default_device()})")
        p(f"numpy            {np.__version__}")
        p(f"EP library       {om.library_path()}")
    om.register()
    if not args.sgemm_only:
        devs = [d for d in ort.get_ep_devices() if d.ep_name == om.EP_NAME]
        for d in devs:
            kind = str(d.device.type).rsplit(".", 1)[-1]
            meta = dict(d.ep_metadata)
            extra = ", ".join(f"{k}={v}" for k, v in sorted(meta.items()))
            p(f"EP device        {d.ep_name} on {kind} (vendor {d.device.vendor or '?'})"
              + (f" {extra}" if extra else ""))
        if not devs:
            p("EP device        none (the EP registered no devices)")
    try:
        r = sgemm(args.n, runs=args.runs, warmup=args.warmup, device=args.device)
    except Exception as e:  # noqa: BLE001 - report, do not trace back
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        p(f"sgemm {args.n}x{args.n}x{args.n} fp32: FAILED to run a MatMul on the MLX EP: {msg}")
        return 1
    p(sgemm_line(r))
    if not args.sgemm_only:
        provider = sgemm_provider()
        p(f"BLAS for libmlx  {provider} (provides cblas_sgemm)")
        p(f"BLAS preload     {om.blas_preload}")
        if line := openblas_line(provider):
            p(line)
        try:
            p(onednn_line())
        except Exception as e:  # noqa: BLE001 - report, do not trace back
            p(f"oneDNN           (could not check: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})")
        p(threads_line())
        # Reference BLAS runs ~4 GFLOP/s where MLAS runs >100: a gap that load cannot explain.
        if r["mlx_gflops"] < 0.2 * r["cpu_gflops"] and args.device != "gpu":
            p("WARNING: the EP's sgemm is at reference-BLAS speed: install OpenBLAS "
              "(apt install libopenblas0) and import onnxruntime_mlx before mlx.core, so that "
              "the package loads it for libmlx; in a checkout, scripts/setup patches the venv's "
              "libmlx instead")
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sgemm-only", action="store_true", help="print only the benchmark line")
    ap.add_argument("--n", type=int, default=1024, help="matrix size (default 1024)")
    ap.add_argument("--runs", type=int, default=10, help="timed runs (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    ap.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m onnxruntime_mlx.doctor")
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))
