"""Host cost of one MLX kernel on the GPU, by kind: a chain of N ops on a [1, 1024] row is built
and evaluated at once (each op depends on the previous, as a decode step's layers do), and the
evaluation's median time over --reps is divided by N. Kinds: MLX's built-in unary op, a
[1, 1024] x [1024, 1024] product (the weight stored [K, N] as ONNX stores it, and [N, K] read
through a transposed view, which MLX's CUDA backend runs as its own GEMV kernel), MLX's int4
quantized product, a custom kernel (`mx.fast.cuda_kernel`) with a short source
and the same kernel with a long one (MLX hashes the source at every launch), and the built-in op
chain under `mx.compile` (fused into one kernel: the per-evaluation floor).

    python tools/gpu_launch_costs.py [--n 200] [--reps 20]

Run it once per MLX_USE_CUDA_GRAPHS value (MLX reads it once per process)."""
import argparse
import os
import statistics
import time

import mlx.core as mx

SOURCE = """
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) y[i] = static_cast<T>(tanhf(static_cast<float>(x[i])));
"""


def timed(build, reps):
    times = []
    for _ in range(reps + 2):
        out = build()
        t = time.perf_counter()
        mx.eval(out)
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    x0 = mx.random.normal((1, 1024)).astype(mx.float16)
    w = (mx.random.normal((1024, 1024)) * 0.03).astype(mx.float16)
    wt = mx.contiguous(w.T)
    wq, scales, biases = mx.quantize(wt, group_size=64, bits=4)
    mx.eval(x0, w, wt, wq, scales, biases)
    short = mx.fast.cuda_kernel("lc_tanh", ["x"], ["y"], SOURCE)
    long = mx.fast.cuda_kernel("lc_tanh_long", ["x"], ["y"], SOURCE, header="// padding\n" * 900)

    def chain(step):
        def build():
            x = x0
            for _ in range(a.n):
                x = step(x)
            return x
        return build

    def custom(k):
        return lambda x: k(inputs=[x], template=[("T", mx.float16), ("N", 1024)], grid=(1024, 1, 1),
                           threadgroup=(256, 1, 1), output_shapes=[x.shape], output_dtypes=[x.dtype])[0]

    fused = mx.compile(chain(mx.tanh))
    kinds = {
        "builtin tanh": chain(mx.tanh),
        "product by a [K, N] weight": chain(lambda x: x @ w),
        "product by a [N, K] weight's view": chain(lambda x: x @ wt.T),
        "int4 quantized_matmul": chain(lambda x: mx.quantized_matmul(x, wq, scales, biases, True, 64, 4)),
        "custom kernel, 60-byte source": chain(custom(short)),
        "custom kernel, 10 KB source": chain(custom(long)),
        "compiled tanh chain (one kernel)": fused,
    }
    graphs = os.environ.get("MLX_USE_CUDA_GRAPHS", "default")
    for name, build in kinds.items():
        try:
            t = timed(build, a.reps)
        except Exception as e:  # custom kernels need MLX's CUDA backend
            print(f"{name}: {e}")
            continue
        print(f"MLX_USE_CUDA_GRAPHS={graphs} {name:34s} eval of {a.n}: {t * 1e3:7.3f} ms, "
              f"{t / a.n * 1e6:6.2f} us an op", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
