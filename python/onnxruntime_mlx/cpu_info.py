"""What the CPU offers, read from Linux's /proc/cpuinfo (empty elsewhere). Light: the package
reads it at import, before it loads OpenBLAS."""
from __future__ import annotations

# What OpenBLAS's SkylakeX kernels (its AVX-512 sgemm) need.
AVX512_FLAGS = ("avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
