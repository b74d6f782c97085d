"""GFLOP/s of MLX's float32 products on the CPU device (OpenBLAS's sgemm in a checkout) for a
few shapes of the bench's models; run once per OpenBLAS setting, e.g.

    OPENBLAS_CORETYPE=Haswell python tools/sgemm_rates.py
    env -u OPENBLAS_CORETYPE python tools/sgemm_rates.py

(OpenBLAS reads the variable when it loads: one process per setting)."""
import statistics
import time

import mlx.core as mx

SHAPES = [(1024, 384, 1536), (1024, 1536, 384), (1024, 384, 384), (16, 384, 1536), (128, 64, 128), (3136, 64, 256)]


def main():
    mx.set_default_device(mx.cpu)
    cells = []
    for m, k, n in SHAPES:
        a, b = mx.random.normal((m, k)), mx.random.normal((k, n))
        mx.eval(a, b)
        for _ in range(5):
            mx.eval(a @ b)
        t = []
        for _ in range(30):
            t0 = time.perf_counter()
            mx.eval(a @ b)
            t.append(time.perf_counter() - t0)
        cells.append(f"{m}x{k}x{n}: {2 * m * k * n / statistics.median(t) / 1e9:.0f} GF/s")
    print(" | ".join(cells))


if __name__ == "__main__":
    main()
