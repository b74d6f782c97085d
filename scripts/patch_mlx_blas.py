"""Point the venv's libmlx at Debian's OpenBLAS instead of the reference BLAS/LAPACK that the
mlx-cpu wheel bundles (measured: ~4 GFLOP/s vs ~180 GFLOP/s for a 1024^2 sgemm on 2 cores).

Rewrites libmlx.so's DT_NEEDED entries with patchelf, so every loader of this libmlx (our EP,
`import mlx.core`) binds cblas_*/LAPACK symbols to OpenBLAS, whatever the load order and with
no LD_PRELOAD. OpenBLAS exports both the CBLAS and the LAPACK symbols libmlx needs.
Idempotent: an already-patched library is left alone.
"""
import pathlib
import subprocess
import sys

import mlx  # noqa: F401  (locates the installed package)

OPENBLAS = "libopenblas.so.0"


def needed(lib: pathlib.Path) -> list[str]:
    out = subprocess.run(["patchelf", "--print-needed", str(lib)], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def main() -> int:
    lib = pathlib.Path(mlx.__path__[0]) / "lib" / "libmlx.so"
    deps = needed(lib)
    bundled = [d for d in deps if d.startswith(("libblas-", "liblapack-"))]
    if not bundled:
        print(f"[setup] libmlx already uses {OPENBLAS}" if OPENBLAS in deps else
              f"[setup] warning: no bundled BLAS in {lib.name}; left as is")
        return 0
    args = ["patchelf"]
    if OPENBLAS not in deps:
        args += ["--replace-needed", bundled[0], OPENBLAS]
        bundled = bundled[1:]
    for d in bundled:
        args += ["--remove-needed", d]
    subprocess.run(args + [str(lib)], check=True)
    print(f"[setup] libmlx now links {OPENBLAS} (was {', '.join(d for d in deps if d.startswith(('libblas-', 'liblapack-')))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
