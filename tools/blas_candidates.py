"""Single-precision products of this machine's workloads through the CPU libraries the CPU
device could use, measured in one process, so the choice between them rests on figures:

    python tools/blas_candidates.py [--openblas /lib/x86_64-linux-gnu/libopenblas.so.0]
        [--scipy-openblas .../libscipy_openblas.so] [--onednn .../libdnnl.so.2]
        [--threads 1,2] [--seconds 0.2]

Libraries: the OpenBLAS MLX links (cblas_sgemm / cblas_sgemv), scipy-openblas32 (the same
interface, `scipy_` prefixed), oneDNN (dnnl_sgemm, row-major) and ORT's CPU EP (MLAS, a one-node
MatMul model: its figure includes ORT's per-run cost, about 10 us). Each is optional; a library
not given (or not loadable) is left out. Shapes (M x K x N): LLM decode rows and prompts of a
60M-parameter Llama (hidden 512, MLP 1536, vocabulary 32000), MiniLM-L3's products at batch 1 x
16 and 8 x 128, convolutions as im2col products (squeezenet's and resnet50's), and 1024^3.
Prints GFLOP/s, median of repeated calls, per library and thread count.

The candidates are not project dependencies; to fetch them into a scratch folder D:
    python -m pip install --target D/site scipy-openblas32      # D/site/scipy_openblas32/lib/
    (cd D && apt-get download libdnnl2 ocl-icd-libopencl1 && for f in *.deb; do dpkg-deb -x $f deb; done)
    LD_LIBRARY_PATH=D/deb/usr/lib/x86_64-linux-gnu python tools/blas_candidates.py \
        --scipy-openblas D/site/scipy_openblas32/lib/libscipy_openblas.so \
        --onednn D/deb/usr/lib/x86_64-linux-gnu/libdnnl.so.2"""
import argparse
import ctypes
import os
import statistics
import time

import numpy as np

SHAPES = [
    ("decode qkv/gate row", 1, 512, 1536),
    ("decode down row", 1, 1536, 512),
    ("decode lm_head row", 1, 512, 32000),
    ("prefill @128 gate", 128, 512, 1536),
    ("MiniLM b1x16 q", 16, 384, 384),
    ("MiniLM b1x16 ffn", 16, 384, 1536),
    ("MiniLM b8x128 ffn", 1024, 384, 1536),
    ("squeezenet conv1 im2col", 12321, 27, 64),
    ("resnet50 3x3 im2col", 3136, 576, 64),
    ("resnet50 late 3x3 im2col", 196, 2304, 256),
    ("1024^3", 1024, 1024, 1024),
]
ROW_MAJOR, NO_TRANS = 101, 111


def timed(fn, seconds):
    fn()
    reps, t = [], time.perf_counter()
    while time.perf_counter() - t < seconds or len(reps) < 5:
        t0 = time.perf_counter()
        fn()
        reps.append(time.perf_counter() - t0)
    return statistics.median(reps)


class Cblas:
    def __init__(self, path, prefix, set_threads):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        self.sgemm = getattr(self.lib, prefix + "cblas_sgemm")
        self.sgemv = getattr(self.lib, prefix + "cblas_sgemv")
        self.set_threads = getattr(self.lib, set_threads)

    def product(self, a, b, c):
        m, k = a.shape
        n = b.shape[1]
        f, i = ctypes.c_float, ctypes.c_int
        pa, pb, pc = (x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c))
        if m == 1:  # y = x W as W^T x: the row-vector product MLX's CPU kernels send to sgemv
            return lambda: self.sgemv(i(ROW_MAJOR), i(112), i(k), i(n), f(1), pb, i(n), pa, i(1), f(0), pc, i(1))
        return lambda: self.sgemm(i(ROW_MAJOR), i(NO_TRANS), i(NO_TRANS), i(m), i(n), i(k), f(1), pa, i(k),
                                  pb, i(n), f(0), pc, i(n))


class OneDnn:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        self.lib.dnnl_sgemm.argtypes = [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [
            ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
            ctypes.c_void_p, ctypes.c_int64]

    def set_threads(self, n):  # OpenMP build: the thread count comes from the OpenMP runtime
        ctypes.CDLL("libgomp.so.1").omp_set_num_threads(n)

    def product(self, a, b, c):
        m, k = a.shape
        n = b.shape[1]
        return lambda: self.lib.dnnl_sgemm(b"N", b"N", m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0,
                                           c.ctypes.data, n)


class OrtCpu:
    def __init__(self):
        import onnxruntime as ort
        self.ort = ort
        self.threads = 0

    def set_threads(self, n):
        self.threads = n

    def product(self, a, b, c):
        from onnx import TensorProto, helper, numpy_helper
        g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, list(c.shape))],
                              [numpy_helper.from_array(b, "b")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 9
        so = self.ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        s = self.ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return lambda: s.run(None, {"a": a})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--openblas", default="/lib/x86_64-linux-gnu/libopenblas.so.0")
    ap.add_argument("--scipy-openblas", default="")
    ap.add_argument("--onednn", default="")
    ap.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    ap.add_argument("--seconds", type=float, default=0.2)
    args = ap.parse_args()
    libs = {}
    for name, make in [("OpenBLAS (MLX's)", lambda: Cblas(args.openblas, "", "openblas_set_num_threads")),
                       ("scipy-openblas32", lambda: Cblas(args.scipy_openblas, "scipy_", "scipy_openblas_set_num_threads")),
                       ("oneDNN", lambda: OneDnn(args.onednn)),
                       ("ORT CPU EP (MLAS)", OrtCpu)]:
        try:
            if name == "scipy-openblas32" and not args.scipy_openblas or name == "oneDNN" and not args.onednn:
                continue
            libs[name] = make()
        except (OSError, AttributeError, ImportError) as e:
            print(f"[{name}] left out: {e}")
    threads = [int(t) for t in args.threads.split(",")]
    cols = [(lib, t) for lib in libs for t in threads]
    print("| shape (M x K x N) | " + " | ".join(f"{lib}, {t} thr" for lib, t in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    rng = np.random.default_rng(0)
    for label, m, k, n in SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        ref = a @ b
        row = []
        for lib, t in cols:
            libs[lib].set_threads(t)
            c = np.zeros((m, n), np.float32)
            fn = libs[lib].product(a, b, c)
            s = timed(fn, args.seconds)
            if not isinstance(libs[lib], OrtCpu):
                np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-2 * np.sqrt(k))
            row.append(f"{2 * m * k * n / s / 1e9:.1f}")
        print(f"| {label} ({m} x {k} x {n}) | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
