"""python -m onnxruntime_mlx <command> ...

One small dispatcher: each command lives in its own module, which provides
`add_arguments(parser)` and `run(args) -> exit code`, and (optionally) a module docstring
shown by `--help`. To add a command, add one line to COMMANDS.
"""
from __future__ import annotations

import argparse
import importlib
import sys


# command -> (module under onnxruntime_mlx, one-line help)
COMMANDS = {
    "conformance": ("conformance", "run ONNX's backend node tests through the MLX EP"),
    "ops-doc": ("opsdoc", "print the supported-ops table (docs/ops.md) from the op registry"),
    "run": ("runner", "run a model on the MLX EP and ORT's CPU EP: placement, accuracy, latency"),
    "trace": ("trace", "run a model with the EP's trace on: a Chrome/Perfetto trace file and a summary"),
    "doctor": ("doctor", "versions, EP devices, and the sgemm GFLOP/s the EP gets"),
    "generate": ("generate", "greedy decoding of a genai-format LLM, KV cache kept between steps"),
    "bench": ("bench", "benchmarks: the EP vs ORT's CPU EP, mlx-lm and PyTorch, as ratios"),
    "demo-model": ("demo_model", "write the built-in demo model (a 2-layer transformer encoder)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m onnxruntime_mlx",
                                     description="ONNX Runtime's MLX execution provider tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parsers = {name: sub.add_parser(name, help=help_text,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
               for name, (_, help_text) in COMMANDS.items()}
    # Only the chosen command's module is imported: one command's imports cost the others
    # nothing, and a broken module breaks only its own command.
    name = next((a for a in argv if not a.startswith("-")), None)
    if name in parsers:
        mod = importlib.import_module(f"onnxruntime_mlx.{COMMANDS[name][0]}")
        parsers[name].description = mod.__doc__
        mod.add_arguments(parsers[name])
        parsers[name].set_defaults(_run=mod.run)
    args = parser.parse_args(argv)
    import onnxruntime_mlx as om
    try:
        return args._run(args) or 0
    except (om.UsageError, om.OptionError, om.DeviceUnavailableError, om.NotOnMLXError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
