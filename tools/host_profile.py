"""Where a run's host time goes: samples the process's threads while warm runs repeat
(tools/host_sampler.cc, built here with g++ and loaded through ctypes: no perf needed) and
prints the functions its wall time was spent in (running or waiting), self and inclusive, plus
the runs' wall time.

    python3 tools/host_profile.py CASE [--provider mlx|cuda] [--runs 50] [--top 60]
        [--interval-us 100] [--all-threads | --running] [--option key=value ...] [--out FILE]

CASE as in tools/gpu_kernel_profile.py (prefill:MODEL_DIR:N, decode:MODEL_DIR:CONTEXT,
model:FILE.onnx[:name=d0xd1,...]); the EP runs on the GPU device like it, or for model cases
on the CPU device (--device cpu; --all-threads then shows MLX's stream thread and the BLAS and
OpenMP workers)."""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_kernel_profile import llm_runner, model_runner, parse_case  # noqa: E402


def load_sampler() -> ctypes.CDLL:
    so = pathlib.Path(tempfile.mkdtemp()) / "host_sampler.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(so), str(HERE / "host_sampler.cc"), "-ldl"],
                   check=True)
    lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
    lib.host_sampler_start.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.host_sampler_stop.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.host_sampler_stop.restype = ctypes.c_long
    return lib


def loaded_libraries() -> dict:
    """basename -> path of every shared library mapped into this process."""
    libs = {}
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if path.startswith("/"):
            libs.setdefault(pathlib.Path(path).name, path)
    return libs


def symbol_table(path: str) -> list:
    """(address, name) of the functions in a library's symbol table (nm; empty if stripped)."""
    try:
        out = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    table = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            table.append((int(parts[0], 16), parts[2]))
    return sorted(table)


def resolve(text: str, top: int) -> str:
    """The sampler's report with `library+0xOFFSET` entries (functions dladdr cannot name: not
    exported) named from the library's symbol table where it has one, and the lines of each
    section summed again by the names they now have."""
    import bisect
    import re
    libs, tables = loaded_libraries(), {}
    pattern = re.compile(r"^(\S+)\+0x([0-9a-f]+)$")

    def name(entry: str) -> str:
        m = pattern.match(entry)
        if not m or m.group(1) not in libs:
            return entry
        lib = m.group(1)
        if lib not in tables:
            tables[lib] = symbol_table(libs[lib])
        table = tables[lib]
        i = bisect.bisect_right(table, (int(m.group(2), 16), "\uffff")) - 1
        if i < 0:
            return entry
        sym = table[i][1]
        return f"{sym[:157] + '...' if len(sym) > 160 else sym}  [{lib}]"

    out, section = [], None
    for line in text.splitlines() + ["== end"]:
        if line.startswith("== "):
            if section:
                title, rows = section
                out.append(title)
                for entry, pct in sorted(rows.items(), key=lambda kv: -kv[1])[:top]:
                    out.append(f"{pct:6.2f}%  {entry}")
                out.append("")
            section = (line, {}) if line != "== end" else None
            continue
        m = re.match(r"^\s*([0-9.]+)%  (.*)$", line)
        if section and m:
            key = name(m.group(2)) if "by library" not in section[0] else m.group(2)
            section[1][key] = section[1].get(key, 0.0) + float(m.group(1))
        elif not section:
            out.append(line)
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case")
    p.add_argument("--provider", default="mlx", choices=["mlx", "cuda", "cpu"],
                   help="the EP, ORT's CUDA EP, or ORT's CPU EP (model cases only)")
    p.add_argument("--device", default="gpu", choices=["gpu", "cpu"], help="the EP's MLX device (model cases)")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--top", type=int, default=60)
    p.add_argument("--interval-us", type=int, default=100)
    p.add_argument("--all-threads", action="store_true", help="sample every thread, not only the one running the runs")
    p.add_argument("--running", action="store_true", help="sample every thread that is running at the "
                   "tick (not blocked): where the process's CPU time goes")
    p.add_argument("--option", action="append", default=[], help="provider option key=value")
    p.add_argument("--out", default="")
    a = p.parse_args()
    lib = load_sampler()
    options = dict(o.split("=", 1) for o in a.option)
    kind, path, arg = parse_case(a.case)
    run = model_runner(path, arg, a.provider, options, a.device) if kind == "model" else \
        llm_runner(kind, path, arg, a.provider, options)
    for _ in range(5):  # past the probe and the compile of a new signature
        run()
    t0 = time.perf_counter()
    for _ in range(a.runs):
        run()
    plain_ms = (time.perf_counter() - t0) / a.runs * 1e3
    if lib.host_sampler_start(a.interval_us, 2 if a.running else int(a.all_threads)) != 0:
        raise SystemExit("the sampler could not start (SIGPROF timer)")
    t0 = time.perf_counter()
    for _ in range(a.runs):
        run()
    sampled_ms = (time.perf_counter() - t0) / a.runs * 1e3
    out = a.out or tempfile.mktemp(suffix=".txt")
    n = lib.host_sampler_stop(out.encode(), a.top)
    print(f"== {a.case} [{a.provider}] {a.runs} runs: wall {plain_ms:.3f} ms/run ({sampled_ms:.3f} sampled), "
          f"{n} samples, one every {a.interval_us} us of wall time")
    print(resolve(pathlib.Path(out).read_text(), a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
