"""Writes the cases tools/ep_churn.cc runs: <out>/<name>/model.onnx + inputs.bin, from the mixed
model set of tools/reliability.py (ONNX node tests of several op families + the demo encoder).

    python tools/sanitize_cases.py OUT_DIR      # prints the case dirs, one per line"""
from __future__ import annotations

import pathlib
import struct
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from onnx import helper  # noqa: E402

from reliability import load_cases  # noqa: E402


def write_inputs(path: pathlib.Path, feeds: dict) -> None:
    with open(path, "wb") as f:
        for name, arr in feeds.items():
            arr = np.ascontiguousarray(arr)
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw)
            f.write(struct.pack("<iI", helper.np_dtype_to_tensor_dtype(arr.dtype), arr.ndim))
            f.write(struct.pack(f"<{arr.ndim}q", *arr.shape))
            data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
            f.write(struct.pack("<Q", len(data)) + data)


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    for name, model, feeds in load_cases():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.onnx").write_bytes(model)
        write_inputs(d / "inputs.bin", feeds)
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
