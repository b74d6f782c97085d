"""`python -m onnxruntime_mlx run MODEL`: run any ONNX model on the MLX EP and on ORT's CPU EP
in the same process, and report placement, accuracy and latency.

Placement comes from ORT itself (session.record_ep_graph_assignment_info), not from what the EP
claims: a node counts as "on MLX" only if ORT assigned it there. The reasons for nodes that fell
back come from the EP's own report (provider option report_path: JSON lines
{node, op, domain, reason} written at GetCapability).

Inputs are random unless given: --input NAME=FILE.npy (an array saved with numpy.save) or
--input NAME=VALUE (a Python literal: 16000, [1, 2, 3], "text"), cast to the input's type.
Symbolic dims of the given arrays size the random inputs that share them.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict

import numpy as np
import onnxruntime as ort

import onnxruntime_mlx as om

# ORT's tensor type strings -> numpy dtypes we can generate feeds for.
_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32,
    "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def parse_dims(items: list[str] | None) -> dict[str, int]:
    dims: dict[str, int] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise om.UsageError(f"--dim expects name=value (a non-negative integer), got {item!r}")
        dims[name.strip()] = int(value)
    return dims


def parse_options(items: list[str] | None) -> dict[str, str]:
    """--option KEY=VALUE items as provider options."""
    opts = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise om.UsageError(f"--option expects KEY=VALUE, got {item!r}")
        opts[k] = v
    return opts


def parse_inputs(items: list[str] | None) -> dict[str, str]:
    """--input NAME=FILE.npy|VALUE items as {name: text}."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise om.UsageError(f"--input expects NAME=FILE.npy or NAME=VALUE, got {item!r}")
        out[name.strip()] = value
    return out


def resolve_model(model: str | os.PathLike) -> pathlib.Path:
    """The .onnx file for `model`: the file itself, or model.onnx inside a directory."""
    path = pathlib.Path(model)
    if path.is_dir():
        if (path / "model.onnx").is_file():
            return path / "model.onnx"
        found = sorted(path.glob("*.onnx"))
        if len(found) == 1:
            return found[0]
        raise om.UsageError(f"{model} is a directory without a model.onnx"
                            + (f" (it holds {', '.join(p.name for p in found)}: name one)"
                               if found else ""))
    if not path.is_file():
        raise om.UsageError(f"no such model: {model}")
    return path


def load_inputs(session: ort.InferenceSession, given: dict[str, str]) -> dict[str, np.ndarray]:
    """The --input arrays, checked against the model's inputs (name, type, rank, fixed dims)."""
    decl = {i.name: i for i in session.get_inputs()}
    out = {}
    for name, text in given.items():
        if name not in decl:
            raise om.UsageError(f"--input {name}: the model has no input {name!r} (its inputs: "
                                f"{', '.join(decl)})")
        inp = decl[name]
        dtype = object if inp.type == "tensor(string)" else _ORT_TYPES.get(inp.type)
        if dtype is None:
            raise om.UsageError(f"--input {name}: the input's type {inp.type} is not supported")
        if text.endswith(".npy"):
            try:
                arr = np.load(text, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise om.UsageError(f"--input {name}: cannot read {text}: {e}") from None
            if arr.dtype != np.dtype(dtype) and not (dtype is object and arr.dtype.kind == "U"):
                raise om.UsageError(f"--input {name}: {text} holds {arr.dtype}, the input is "
                                    f"{inp.type}")
            arr = arr.astype(dtype) if dtype is object else arr
        else:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                if dtype is not object:
                    raise om.UsageError(f"--input {name}: {text!r} is neither a .npy file nor a "
                                        "number or list literal") from None
                value = text
            try:
                arr = np.asarray(value, dtype=dtype)
            except (ValueError, TypeError, OverflowError) as e:
                raise om.UsageError(f"--input {name}: {text!r} is not a {inp.type}: {e}") from None
        shape = list(inp.shape)
        if len(shape) != arr.ndim or any(isinstance(d, int) and d >= 0 and d != n
                                         for d, n in zip(shape, arr.shape)):
            raise om.UsageError(f"--input {name}: shape {list(arr.shape)} does not fit the "
                                f"input's shape {shape}")
        out[name] = arr
    return out


def dims_of(session: ort.InferenceSession, arrays: dict[str, np.ndarray],
            dims: dict[str, int]) -> dict[str, int]:
    """`dims` plus the symbolic dims the given arrays fix; conflicts are a UsageError."""
    dims = dict(dims)
    bound: dict[str, tuple[int, str]] = {}
    for inp in session.get_inputs():
        if inp.name not in arrays:
            continue
        for d, n in zip(inp.shape, arrays[inp.name].shape):
            if not isinstance(d, str) or not d:
                continue
            if d in bound and bound[d][0] != n:
                raise om.UsageError(f"dim {d!r} is {bound[d][0]} in input {bound[d][1]!r} and "
                                    f"{n} in input {inp.name!r}")
            if d in dims and d not in bound and dims[d] != n:
                raise om.UsageError(f"--dim {d}={dims[d]} but input {inp.name!r} has {d}={n}")
            bound[d] = (n, inp.name)
            dims[d] = n
    return dims


def concrete_shape(shape: list, dims: dict[str, int], used: set[str],
                   defaulted: set[str] | None = None) -> list[int]:
    """ORT's input shape (ints, dim names, or None) with symbolic dims from `dims` (default 1)."""
    out = []
    for d in shape:
        if isinstance(d, int) and d >= 0:
            out.append(d)
        elif isinstance(d, str) and d in dims:
            used.add(d)
            out.append(dims[d])
        else:
            if defaulted is not None:
                defaulted.add(d if isinstance(d, str) and d else "(unnamed)")
            out.append(1)
    return out


def random_feeds(session: ort.InferenceSession, dims: dict[str, int],
                 seed: int = 0, given: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """One random array per graph input, from the input's type and (made concrete) shape.

    Floats: standard normal. Integers: [0, 100) for signed/unsigned types alike (a guess that
    stays inside most vocabularies and index ranges), except inputs named like a mask
    (attention_mask): ones, every position attended, as real inputs mostly are (random integers
    there turn an encoder's additive mask into +inf scores). Bools: fair coin. Strings: a few
    words."""
    rng = np.random.default_rng(seed)
    feeds = {}
    used: set[str] = set()
    defaulted: set[str] = set()
    given = given or {}
    for inp in session.get_inputs():
        if inp.name in given:
            feeds[inp.name] = given[inp.name]
            used.update(d for d in inp.shape if isinstance(d, str))
            continue
        shape = concrete_shape(inp.shape, dims, used, defaulted)
        if inp.type == "tensor(string)":
            words = np.array(["alpha", "Beta", "GAMMA", "delta 4", ""], dtype=object)
            feeds[inp.name] = words[rng.integers(0, len(words), size=shape)]
            continue
        dtype = _ORT_TYPES.get(inp.type)
        if dtype is None:
            raise om.UsageError(f"input {inp.name!r} has type {inp.type}: no random feed for "
                                "it (give it with --input)")
        if dtype == np.bool_:
            arr = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer) and "mask" in inp.name.lower():
            arr = np.ones(shape, dtype)
        elif np.issubdtype(dtype, np.integer):
            arr = rng.integers(0, min(100, np.iinfo(dtype).max), size=shape).astype(dtype)
        else:
            arr = rng.standard_normal(shape).astype(dtype)
        feeds[inp.name] = arr
    if defaulted:
        print(f"note: symbolic dim(s) {', '.join(sorted(defaulted))} set to 1 "
              "(give --dim name=value or --input)", file=sys.stderr)
    unused = set(dims) - used
    if unused:
        print(f"note: --dim {', '.join(sorted(unused))} matched no input dim", file=sys.stderr)
    return feeds


def read_fused_node_stats(path) -> list[dict]:
    """The EP's run statistics from a report_path file: one dict per fused node, written when
    its session is released (so read it after the session is gone)."""
    return [json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if '"fused_node"' in x]


def read_report(path: str) -> list[dict]:
    """The EP's decline report: one JSON object per line (ORT may call GetCapability more than
    once per session, so lines repeat; deduplicated here)."""
    seen, out = set(), []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                rec = json.loads(line)
                key = (rec.get("node"), rec.get("op"), rec.get("domain"), rec.get("reason"))
                if key not in seen:
                    seen.add(key)
                    out.append(rec)
    except FileNotFoundError:
        pass
    return out


def time_runs(sessions: list[ort.InferenceSession], feeds: dict, runs: int,
              warmup: int) -> list[list[float]]:
    """Per-run wall times in seconds for each session, after `warmup` untimed runs of each.
    The sessions take turns run by run, so that a machine whose load drifts (other jobs on a
    shared box) biases neither side."""
    for s in sessions:
        for _ in range(warmup):
            s.run(None, feeds)
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(runs):
        for s, t in zip(sessions, times):
            t0 = time.perf_counter()
            s.run(None, feeds)
            t.append(time.perf_counter() - t0)
    return times


def diff_stats(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs diff, max rel diff). The relative diff divides by |expected| floored at 1e-3 of
    the output's largest magnitude, so that elements that happen to be ~0 do not turn a
    1e-7 absolute difference into a meaningless huge ratio."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    if a.shape != e.shape:
        raise ValueError(f"shape {a.shape} vs {e.shape}")
    if a.size == 0:
        return 0.0, 0.0
    if a.dtype.kind not in "fc":
        a, e = a.astype(np.float64), e.astype(np.float64)
    a = a.astype(np.float64)
    e = e.astype(np.float64)
    d = np.abs(a - e)
    both_nan = np.isnan(a) & np.isnan(e)
    d[both_nan] = 0.0
    if np.isnan(d).any():
        return float("nan"), float("nan")
    finite = np.isfinite(e)
    scale = float(np.max(np.abs(e[finite]))) if finite.any() else 0.0
    floor = max(scale * 1e-3, np.finfo(np.float64).tiny)
    rel = d / np.maximum(np.abs(e), floor)
    return float(d.max()), float(rel.max())


def _same(a, b) -> bool:
    try:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return a.shape == b.shape and bool(np.all(a == b))
        return a == b
    except Exception:  # noqa: BLE001 - incomparable values are not the same
        return False


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def fmt_shape(arr: np.ndarray) -> str:
    dt = "string" if arr.dtype == object else arr.dtype
    return f"{dt}[{', '.join(str(d) for d in arr.shape)}]"


OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def file_summary(path: pathlib.Path) -> str:
    """'117 nodes, opset 17' from the file itself (weights in external files are not loaded)."""
    try:
        import onnx
        m = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - only a summary line; ORT reports real problems
        return f"not readable by onnx: {e}"
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), "?")
    return f"{len(m.graph.node)} nodes, opset {opset}"


def run_model(model: str, dims: dict[str, int], runs: int = 20, warmup: int = 3,
              device: str = "auto", fallback: bool = True, seed: int = 0, opt_level: str = "all",
              out=sys.stdout, inputs: dict[str, str] | None = None, **provider_options) -> dict:
    """Runs `model` (a file, or a directory holding model.onnx) on both EPs and prints the
    report; returns the numbers as a dict. `inputs`: {name: "FILE.npy" or a literal}.
    Raises NotOnMLXError, printing nothing, when no node runs on the MLX EP."""
    path = resolve_model(model)
    # Options and device are checked before the (possibly slow) CPU session is made.
    om.validate_options(provider_options)
    om.ep_devices(device)

    def base_options() -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.graph_optimization_level = OPT_LEVELS[opt_level]
        so.log_severity_level = 4  # ORT logs what it raises, and warns of fallback: we say both
        return so

    cpu = ort.InferenceSession(str(path), sess_options=base_options(),
                               providers=["CPUExecutionProvider"])
    given = load_inputs(cpu, inputs or {})
    feeds = random_feeds(cpu, dims_of(cpu, given, dims), seed, given)

    fd, report = tempfile.mkstemp(prefix="ortmlx-report-", suffix=".jsonl")
    os.close(fd)
    try:
        so = om.record_assignment(
            om.session_options(device, fallback=fallback, so=base_options(), report_path=report,
                               **provider_options))
        try:
            # enable_fallback=0: an EP error is raised, not retried on the CPU EP alone.
            mlx = om.check_session(ort.InferenceSession(str(path), sess_options=so,
                                                        enable_fallback=0))
        except om.NotOnMLXError:
            raise
        except Exception as e:  # noqa: BLE001 - say why, with the EP's reasons
            declined = read_report(report)
            print(f"error: the MLX EP session could not be created: {e}", file=out)
            for r in declined:
                print(f"  declined {r['op']} '{r['node']}': {r['reason']}", file=out)
            raise SystemExit(1) from None
        declined = read_report(report)
    finally:
        os.unlink(report)

    # Placement, as ORT assigned it.
    groups = [g for g in mlx.get_provider_graph_assignment_info() if g.ep_name == om.EP_NAME]
    placed = om.placement(mlx)
    n_total = sum(len(v) for v in placed.values())
    on_mlx = placed.get(om.EP_NAME, [])
    elsewhere = [(ep, name, op) for ep, nodes in placed.items() if ep != om.EP_NAME
                 for name, op in nodes]
    if not on_mlx:
        reasons = sorted({f"{r['op']}: {r['reason']}" for r in declined})
        raise om.NotOnMLXError(
            f"no node of {path} runs on {om.EP_NAME} ({n_total} nodes, all on "
            f"{', '.join(sorted(placed)) or 'no EP'}): nothing to report"
            + (f"; the EP declined {'; '.join(reasons[:5])}" if reasons else ""))

    # Accuracy: the first MLX run (eager probe) and a later one (compiled) are both checked.
    ref = cpu.run(None, feeds)
    first = mlx.run(None, feeds)
    mlx_times, cpu_times = time_runs([mlx, cpu], feeds, runs, warmup)
    last = mlx.run(None, feeds)

    out_names = [o.name for o in mlx.get_outputs()]
    diffs = {}
    for name, a0, a1, e in zip(out_names, first, last, ref):
        if not all(isinstance(v, np.ndarray) and v.dtype != object for v in (a0, a1, e)):
            # Strings, sequences, maps: exact comparison only (0 = identical, inf = not).
            same = all(_same(v, e) for v in (a0, a1))
            diffs[name] = (0.0, 0.0) if same else (float("inf"), float("inf"))
            continue
        abs0, rel0 = diff_stats(a0, e)
        abs1, rel1 = diff_stats(a1, e)
        diffs[name] = (max(abs0, abs1), max(rel0, rel1))

    mlx_med = statistics.median(mlx_times) if mlx_times else float("nan")
    cpu_med = statistics.median(cpu_times) if cpu_times else float("nan")

    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"model      {path}  ({file_summary(path)}; ORT optimization level '{opt_level}')")
    p("inputs     " + ", ".join(f"{k} {fmt_shape(v)}" for k, v in feeds.items()))
    pct = 100.0 * len(on_mlx) / n_total if n_total else 0.0
    p(f"placement  {len(on_mlx)} / {n_total} nodes on {om.EP_NAME} ({pct:.1f}%), "
      f"{len(groups)} fused subgraph(s)  [ORT's own assignment, after its graph optimizations]")
    if elsewhere:
        reasons_by_node = {r["node"]: r for r in declined}
        reasons_by_op: dict[str, list[str]] = defaultdict(list)
        for r in declined:
            if r["reason"] not in reasons_by_op[r["op"]]:
                reasons_by_op[r["op"]].append(r["reason"])
        counts = Counter((ep, op) for ep, _, op in elsewhere)
        p("fallback   op types not on MLX (EP's decline reason):")
        for (ep, op), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            reasons = sorted({reasons_by_node[name]["reason"] for e, name, o in elsewhere
                              if o == op and e == ep and name in reasons_by_node})
            if not reasons:
                reasons = reasons_by_op.get(op, []) or ["(no reason reported: claimed by the EP "
                                                        "but assigned elsewhere by ORT)"]
            p(f"  {op:<24} x{n:<4} on {ep}: {'; '.join(reasons)}")
    else:
        p("fallback   none")
    p("accuracy   vs CPUExecutionProvider (worst of the first run and a later, compiled one):")
    for name, (a, r) in diffs.items():
        p(f"  {name:<24} max abs diff {a:.3g}   max rel diff {r:.3g}")
    ratio = cpu_med / mlx_med if mlx_med > 0 else float("nan")
    p(f"latency    MLX EP {fmt_ms(mlx_med)}   CPU EP {fmt_ms(cpu_med)}   "
      f"(median of {runs} runs after {warmup} warmup)   CPU/MLX = {ratio:.2f}x")
    return {
        "nodes_total": n_total, "nodes_mlx": len(on_mlx), "groups": len(groups),
        "fallback": elsewhere, "declined": declined, "diffs": diffs,
        "mlx_ms": mlx_med * 1e3, "cpu_ms": cpu_med * 1e3, "feeds": feeds,
    }


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("model", help="an .onnx model, or a directory holding model.onnx")
    ap.add_argument("--input", action="append", metavar="NAME=FILE.npy|VALUE",
                    help="an input's value (repeatable): a .npy file or a literal such as 16000 "
                         "or [[1, 2]]; inputs not given are random")
    ap.add_argument("--dim", action="append", metavar="NAME=VALUE",
                    help="value of a symbolic input dim (repeatable; unnamed/unset dims are 1)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per EP (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    ap.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                    help="MLX device (default: MLX's GPU when there is one)")
    ap.add_argument("--no-fallback", action="store_true",
                    help="disable ORT's CPU fallback: fail unless every node runs on MLX")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random feeds")
    ap.add_argument("--opt-level", choices=list(OPT_LEVELS), default="all",
                    help="ORT graph optimization level for both sessions (default all; 'disable' "
                         "keeps e.g. the Shape->Gather->Concat chains that ORT otherwise folds)")
    ap.add_argument("--option", action="append", metavar="KEY=VALUE", default=[],
                    help="extra MLX EP provider option (repeatable), e.g. compile=0")


def run(args: argparse.Namespace) -> int:
    opts = parse_options(args.option)
    if args.runs < 1 or args.warmup < 0:
        raise om.UsageError("--runs must be >= 1 and --warmup >= 0")
    try:
        run_model(args.model, parse_dims(args.dim), runs=args.runs, warmup=args.warmup,
                  device=args.device, fallback=not args.no_fallback, seed=args.seed,
                  opt_level=args.opt_level, inputs=parse_inputs(args.input), **opts)
    except (om.UsageError, om.OptionError, om.DeviceUnavailableError, om.NotOnMLXError):
        raise  # one line and exit code 2, from __main__
    except Exception as e:  # noqa: BLE001
        # ORT's errors (a bad model, an EP error status at run time) are one clear line, not a
        # Python traceback; anything else is a bug here and keeps its traceback.
        if type(e).__module__.startswith("onnxruntime"):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m onnxruntime_mlx.runner")
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))
