"""ONNX backend node conformance: runs ONNX's own node test cases through ONNX Runtime with the
MLX EP and gives each case exactly one status.

    python -m onnxruntime_mlx conformance [--filter REGEX] [--json PATH] [--jobs N]
                                          [--device cpu|gpu] [--timeout S]

Statuses (first that applies):
  oracle-fails  ORT's CPU EP alone cannot run the case (or disagrees with the shipped outputs);
                not counted against the EP
  crash         the worker process died (signal) or hung past --timeout
  error         creating or running the session raised
  wrong         the EP ran nodes and an output differs from the shipped output (a defect)
  declined      no node was claimed by the EP (the EP's decline reasons are listed)
  partial       outputs match, but some nodes fell back to the CPU EP (listed, with reasons)
  pass          outputs match and every node ran on MLXExecutionProvider

Cases run in long-lived worker subprocesses (one per job) fed over pipes, so a crash costs one
case, not the run. Each case runs every test_data_set `--runs` times (default 2): the engine
translates eagerly on the first run and runs the mx::compile'd program on the second, and both
must match. ORT's graph optimizations are disabled so that every node of the case reaches an EP
as written (constant folding would otherwise run parts of the case on the CPU at load time).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

STATUSES = ("pass", "partial", "declined", "wrong", "error", "crash", "oracle-fails")
# Tolerances of ONNX's backend runner (onnx/backend/test/loader); a case's data.json may
# override them. Integers, bools and strings must match exactly.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = ROOT / ".deps/libonnx-testdata/usr/share/libonnx-testdata/data/node"
DEFAULT_JSON = ROOT / "build/conformance.json"


# --------------------------------------------------------------------------------------------
# Case discovery (parent process)

def data_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("ORT_MLX_CONFORMANCE_DATA", DEFAULT_DATA_DIR))


def discover(directory: pathlib.Path | None = None, pattern: str | None = None) -> list[str]:
    """Names of the case folders (those with a model.onnx), sorted, filtered by re.search."""
    directory = pathlib.Path(directory or data_dir())
    if not directory.is_dir():
        raise FileNotFoundError(f"no ONNX node test data at {directory} (run scripts/setup)")
    rx = re.compile(pattern) if pattern else None
    return sorted(p.name for p in directory.iterdir()
                  if (p / "model.onnx").is_file() and (rx is None or rx.search(p.name)))


# --------------------------------------------------------------------------------------------
# One case (worker process)

# ONNX element types ORT's Python layer cannot turn into numpy arrays: fed and fetched as raw
# bytes through OrtValues (bfloat16, the float8s, the 4-bit and 2-bit types, float8e8m0).
_EXOTIC = {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26}


class _Unsupported(Exception):
    """The runner itself cannot express this case (e.g. map-typed inputs)."""


def _op_name(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _load_value(path: pathlib.Path, type_proto):
    """(value, TensorProto-or-None) of one .pb file, by the model's declared type."""
    import onnx
    from onnx import numpy_helper
    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq), None
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt), None
    if type_proto.HasField("tensor_type") or not type_proto.ByteSize():
        t = onnx.TensorProto()
        t.ParseFromString(data)
        return numpy_helper.to_array(t), t
    raise _Unsupported(f"{path.name}: {type_proto.WhichOneof('value')} values are not handled")


def _feed_value(value, tensor):
    """What ORT's Python API accepts: numpy, list (sequence), None (empty optional), or an
    OrtValue filled with raw bytes for element types numpy/ORT cannot exchange."""
    if tensor is None or tensor.data_type not in _EXOTIC:
        return value
    import ctypes
    import onnxruntime as ort
    from onnx import numpy_helper
    raw_tensor = tensor if tensor.HasField("raw_data") else numpy_helper.from_array(value)
    raw = raw_tensor.raw_data
    ov = ort.OrtValue.ortvalue_from_shape_and_type(list(tensor.dims), tensor.data_type)
    if ov.tensor_size_in_bytes() != len(raw):
        raise _Unsupported(f"cannot feed element type {tensor.data_type} "
                           f"({len(raw)} bytes for {ov.tensor_size_in_bytes()})")
    ctypes.memmove(ov.data_ptr(), raw, len(raw))
    return ov


def _ort_elem_type(type_str: str) -> int:
    """ONNX element type number of an OrtValue's data_type() string, e.g. 'tensor(bfloat16)'."""
    from onnx import TensorProto
    name = type_str[len("tensor("):-1].upper()
    name = {"FLOAT": "FLOAT", "DOUBLE": "DOUBLE"}.get(name, name)
    return TensorProto.DataType.Value(name)


def _fetch(ov):
    """numpy array of an output OrtValue, decoding exotic element types from raw bytes."""
    import ctypes
    import onnx
    from onnx import numpy_helper
    elem = _ort_elem_type(ov.data_type())
    if elem not in _EXOTIC:
        return ov.numpy()
    t = onnx.TensorProto()
    t.data_type = elem
    t.dims.extend(ov.shape())
    n = ov.tensor_size_in_bytes()
    t.raw_data = ctypes.string_at(ov.data_ptr(), n) if n else b""
    return numpy_helper.to_array(t)


class _Case:
    def __init__(self, case_dir: pathlib.Path):
        import onnx
        self.dir = case_dir
        self.model_bytes = (case_dir / "model.onnx").read_bytes()
        self.model = onnx.load_from_string(self.model_bytes)
        self.ops = sorted({_op_name(n) for n in self.model.graph.node})
        self.rtol, self.atol = DEFAULT_RTOL, DEFAULT_ATOL
        if (case_dir / "data.json").is_file():
            meta = json.loads((case_dir / "data.json").read_text())
            self.rtol = meta.get("rtol", self.rtol)
            self.atol = meta.get("atol", self.atol)
        self.datasets = []  # [(feeds, expected outputs)]
        self.error = None   # why the data could not be loaded
        try:
            self._load()
        except Exception as e:  # noqa: BLE001 - reported as the case's reason
            self.error = f"{type(e).__name__}: {e}"

    def _load(self):
        g = self.model.graph
        exotic = False
        for ds in sorted(self.dir.glob("test_data_set_*")):
            feeds, expected = {}, []
            n_in = len(list(ds.glob("input_*.pb")))
            for i in range(n_in):
                # Like ONNX's runner: input_i belongs to graph input i (by position).
                vi = g.input[i]
                value, tensor = _load_value(ds / f"input_{i}.pb", vi.type)
                exotic |= tensor is not None and tensor.data_type in _EXOTIC
                feeds[vi.name] = _feed_value(value, tensor)
            n_out = len(list(ds.glob("output_*.pb")))
            for i in range(n_out):
                value, tensor = _load_value(ds / f"output_{i}.pb", g.output[i].type)
                expected.append(value)
            self.datasets.append((feeds, expected))
        if not self.datasets:
            raise _Unsupported("no test_data_set_* folder")
        # OrtValue outputs are needed to read exotic element types; they need tensor inputs
        # and tensor outputs only (sequences and optionals go through run()).
        all_tensors = all(o.type.HasField("tensor_type") for o in g.output) and all(
            i.type.HasField("tensor_type") for i in g.input)
        exotic |= any(o.type.tensor_type.elem_type in _EXOTIC for o in g.output)
        self.use_ortvalues = exotic and all_tensors

    def run(self, sess) -> list[list]:
        """Outputs of every data set (one list per data set)."""
        import onnxruntime as ort
        results = []
        for feeds, _ in self.datasets:
            if self.use_ortvalues:
                ovs = {k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
                       for k, v in feeds.items()}
                results.append([_fetch(o) for o in sess.run_with_ort_values(None, ovs)])
            else:
                results.append(sess.run(None, feeds))
        return results

    def mismatch(self, results: list[list]) -> str | None:
        """None when every data set's outputs match the shipped ones, else what differs."""
        names = [o.name for o in self.model.graph.output]
        for d, ((_, expected), actual) in enumerate(zip(self.datasets, results)):
            if len(actual) != len(expected):
                return f"data set {d}: {len(actual)} outputs, expected {len(expected)}"
            for i, (a, e) in enumerate(zip(actual, expected)):
                where = f"output {i} '{names[i] if i < len(names) else i}'"
                if len(self.datasets) > 1:
                    where = f"data set {d} {where}"
                why = _compare(a, e, self.rtol, self.atol, where)
                if why:
                    return why
        return None


def _compare(actual, expected, rtol, atol, where) -> str | None:
    import numpy as np
    if expected is None or actual is None:
        if expected is None and actual is None:
            return None
        return f"{where}: expected {'an empty optional' if expected is None else 'a value'}, " \
               f"got {'an empty optional' if actual is None else type(actual).__name__}"
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"{where}: expected a sequence, got {type(actual).__name__}"
        if len(actual) != len(expected):
            return f"{where}: sequence length {len(actual)}, expected {len(expected)}"
        for j, (a, e) in enumerate(zip(actual, expected)):
            if why := _compare(a, e, rtol, atol, f"{where}[{j}]"):
                return why
        return None
    if isinstance(actual, list):
        return f"{where}: expected a tensor, got a sequence"
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"{where}: shape {list(a.shape)}, expected {list(e.shape)}"
    if a.dtype != e.dtype:
        return f"{where}: dtype {a.dtype}, expected {e.dtype}"
    if a.size == 0:
        return None
    # Integers (also ml_dtypes' int4/uint4), bools and strings must match exactly.
    if e.dtype == object or e.dtype.kind in "biuSU" or "int" in e.dtype.name:
        bad = a != e
        if not np.any(bad):
            return None
        idx = tuple(int(x) for x in np.argwhere(bad)[0])
        diff = ""
        if e.dtype.kind in "iu" or "int" in e.dtype.name:
            diff = f", max abs diff {np.max(np.abs(a.astype(np.float64) - e.astype(np.float64))):.6g}"
        return f"{where}: {int(np.sum(bad))} of {e.size} elements differ{diff} " \
               f"(first at {list(idx)}: {a[idx]!r} vs {e[idx]!r})"
    # floating point, including bfloat16/float8 (ml_dtypes), compared in float64
    wide = np.complex128 if e.dtype.kind == "c" else np.float64
    af, ef = a.astype(wide), e.astype(wide)
    with np.errstate(invalid="ignore", over="ignore"):
        # like np.testing.assert_allclose: NaN == NaN, inf == inf of the same sign
        close = (np.abs(af - ef) <= atol + rtol * np.abs(ef)) | (af == ef) | \
                (np.isnan(af) & np.isnan(ef))
    if np.all(close):
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        diffs = np.abs(af - ef)
    finite = diffs[np.isfinite(diffs)]
    worst = f"{finite.max():.6g}" if finite.size else "inf/nan"
    idx = tuple(int(x) for x in np.argwhere(~close)[0])
    return f"{where}: {int(np.sum(~close))} of {e.size} elements differ, max abs diff {worst} " \
           f"(first at {list(idx)}: {af[idx]!r} vs {ef[idx]!r}; rtol {rtol}, atol {atol})"


def _short(e: BaseException, limit: int = 600) -> str:
    msg = " ".join(str(e).split())
    return (msg[:limit] + " ...") if len(msg) > limit else msg


def _read_declines(path: str) -> list[dict]:
    """The EP's decline report: one JSON object per line, {node, op, domain, reason}; ORT may
    call GetCapability more than once, so duplicates are dropped."""
    import onnxruntime_mlx as om
    out, seen = [], set()
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("domain") == om.EP_NAME:
            continue  # a later GetCapability pass sees our own fused nodes: not a decline
        key = (d.get("node"), d.get("op"), d.get("domain"), d.get("reason"))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _oracle(case: _Case) -> str | None:
    """None when ORT's CPU EP alone reproduces the shipped outputs, else why not."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(case.model_bytes, sess_options=so,
                                    providers=["CPUExecutionProvider"])
        results = case.run(sess)
    except Exception as e:  # noqa: BLE001
        return f"CPU EP: {_short(e)}"
    why = case.mismatch(results)
    return f"CPU EP differs from the shipped outputs: {why}" if why else None


def _summarize_declines(declines: list[dict]) -> str:
    by_reason: dict[tuple[str, str], int] = {}
    for d in declines:
        op = d.get("op", "?") if d.get("domain", "") in ("", "ai.onnx") else \
            f"{d.get('domain')}.{d.get('op', '?')}"
        key = (op, d.get("reason", "?"))
        by_reason[key] = by_reason.get(key, 0) + 1
    # Top-level declines first: they are what keeps a control-flow body off the EP.
    order = sorted(by_reason.items(), key=lambda kv: kv[0][1].startswith("inside a control-flow"))
    return "; ".join(f"{op}{f' x{n}' if n > 1 else ''}: {reason}" for (op, reason), n in order)


def run_case(case_dir: str | pathlib.Path, device: str = "cpu", runs: int = 2) -> dict:
    """Runs one case (in this process) and returns {status, reason, ops, ...}."""
    import onnxruntime as ort

    import onnxruntime_mlx as om

    t0 = time.monotonic()
    case = _Case(pathlib.Path(case_dir))
    result = {"status": None, "reason": "", "ops": case.ops}

    def done(status, reason="", **extra):
        result.update(status=status, reason=reason, seconds=round(time.monotonic() - t0, 3),
                      **extra)
        return result

    if case.error:
        return done("oracle-fails", f"test data cannot be loaded: {case.error}")

    fd, report = tempfile.mkstemp(prefix="ortmlx-conf-", suffix=".jsonl")
    os.close(fd)
    try:
        placed, error, why = {}, None, None
        try:
            so = om.record_assignment(om.session_options(device, report_path=report))
            so.log_severity_level = 3
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(case.model_bytes, sess_options=so)
            placed = om.placement(sess)
            for r in range(max(1, runs)):
                why = case.mismatch(case.run(sess))
                if why:
                    if r:
                        why = f"run {r + 1} (compiled): {why}"
                    break
        except Exception as e:  # noqa: BLE001
            error = _short(e)
        declines = _read_declines(report)
    finally:
        os.unlink(report)

    on_mlx = placed.get(om.EP_NAME, [])
    elsewhere = [(ep, n) for ep, nodes in placed.items() if ep != om.EP_NAME for n in nodes]
    fallback = [{"op": d.get("op"), "domain": d.get("domain", ""), "node": d.get("node"),
                 "reason": d.get("reason")} for d in declines]
    extra = {"nodes_on_mlx": len(on_mlx), "nodes_total": len(on_mlx) + len(elsewhere)}
    if fallback:
        extra["fallback"] = fallback

    if error is not None or why is not None:
        # Only the EP is to blame if ORT's CPU EP alone gets this case right.
        oracle = _oracle(case)
        if oracle:
            return done("oracle-fails", oracle + (f" | MLX EP: {error or why}"), **extra)
        if error is not None:
            return done("error", error, **extra)
        if not on_mlx:
            # Nothing ran on MLX, yet the result differs from a CPU-only session: the case is
            # not deterministic (e.g. random ops) or ORT's placement differs; not our defect.
            return done("oracle-fails", f"nothing ran on MLX and the result differs: {why}",
                        **extra)
        return done("wrong", why, **extra)
    if not on_mlx:
        if not elsewhere:
            # ORT turns Constant nodes into initializers when it loads the graph: nothing is
            # left for any EP to run, so there is nothing to claim either.
            return done("declined", "no node reaches an EP (ORT folds the graph into "
                        "initializers)", **extra)
        reason = _summarize_declines(declines) or "no node was claimed (no decline reported)"
        return done("declined", reason, **extra)
    if elsewhere:
        reason = _summarize_declines(declines) or \
            "on other EPs: " + ", ".join(f"{op} ({ep})" for ep, (_, op) in elsewhere)
        return done("partial", f"{len(elsewhere)} of {extra['nodes_total']} nodes on CPU: {reason}",
                    **extra)
    return done("pass", **extra)


def _worker_main() -> None:
    """Worker loop: one JSON request per stdin line {dir, device, runs}, one JSON result per
    stdout line. Anything else written to fd 1 (by ORT, MLX or the EP) goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import onnxruntime as ort

    import onnxruntime_mlx as om
    ort.set_default_logger_severity(3)
    om.register()  # once per worker; every case's session reuses the registration
    proto.write(json.dumps({"ready": True}) + "\n")  # start-up is not part of a case's time
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        req = json.loads(line)
        try:
            res = run_case(req["dir"], req.get("device", "cpu"), req.get("runs", 2))
        except Exception as e:  # noqa: BLE001 - a runner bug must not kill the run either
            res = {"status": "error", "reason": f"conformance runner: {type(e).__name__}: "
                                                 f"{_short(e)}", "ops": []}
        proto.write(json.dumps(res) + "\n")


# --------------------------------------------------------------------------------------------
# Worker pool (parent process)

class _Worker:
    START_TIMEOUT = 120  # importing onnxruntime and registering the EP

    def __init__(self, env: dict):
        self.ready = False
        self.log = tempfile.TemporaryFile()
        code = "from onnxruntime_mlx.conformance import _worker_main; _worker_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     text=True, bufsize=1)

    def _log_tail(self, since: int) -> str:
        self.log.seek(since)
        tail = self.log.read()[-4000:].decode("utf-8", "replace")
        lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-600:]

    def _died(self, since: int, what: str) -> dict:
        rc = self.proc.wait()
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        tail = self._log_tail(since)
        return {"status": "crash", "reason": f"{what} ({how})" + (f": {tail}" if tail else "")}

    def run(self, request: dict, timeout: float) -> dict:
        self.log.seek(0, os.SEEK_END)
        since = self.log.tell()
        if not self.ready:
            ready, _, _ = select.select([self.proc.stdout], [], [], self.START_TIMEOUT)
            line = self.proc.stdout.readline() if ready else ""
            if not line:
                self.kill()
                return self._died(since, "worker failed to start")
            self.ready = True
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # died before: the read below sees EOF
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.kill()
            return {"status": "crash", "reason": f"hung: no result after {timeout:g} s "
                                                 "(worker killed)"}
        line = self.proc.stdout.readline()
        if line:
            return json.loads(line)
        return self._died(since, "worker died")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self.log.close()


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done = total, enabled, 0
        self.counts = dict.fromkeys(STATUSES, 0)
        self.t0 = time.monotonic()
        self.tty = enabled and sys.stderr.isatty()
        self.last_line = 0.0

    def update(self, status: str):
        self.done += 1
        self.counts[status] = self.counts.get(status, 0) + 1
        if not self.enabled:
            return
        now = time.monotonic()
        counts = " ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        text = f"[{self.done:>{len(str(self.total))}}/{self.total}] {counts}  {now - self.t0:.0f}s"
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
            sys.stderr.flush()
        elif now - self.last_line >= 10 or self.done == self.total:
            self.last_line = now
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def close(self):
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _worker_env(device: str) -> dict:
    import onnxruntime_mlx as om
    env = dict(os.environ)
    # Fail here, once, when the EP library is missing or has no such device.
    env["ORT_MLX_EP_LIBRARY"] = om.library_path()
    om.ep_devices(device)
    pkg_parent = str(pathlib.Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    env.setdefault("ORT_DISABLE_TELEMETRY", "1")
    return env


class Report:
    """Results of a run: `cases` maps case name -> {status, reason, ops, ...}."""

    def __init__(self, cases: dict, elapsed: float, jobs: int, device: str, directory: str):
        self.cases, self.elapsed, self.jobs, self.device, self.data_dir = \
            cases, elapsed, jobs, device, directory

    @property
    def counts(self) -> dict:
        c = dict.fromkeys(STATUSES, 0)
        for r in self.cases.values():
            c[r["status"]] = c.get(r["status"], 0) + 1
        return c

    def summary_line(self) -> str:
        c = self.counts
        parts = ", ".join(f"{c[s]} {s}" for s in STATUSES)
        return (f"conformance: {len(self.cases)} cases: {parts} "
                f"({self.elapsed:.0f} s, {self.jobs} jobs, device {self.device})")

    def by_op(self) -> dict:
        table: dict[str, dict] = {}
        for r in self.cases.values():
            for op in r.get("ops") or ["(none)"]:
                row = table.setdefault(op, dict.fromkeys(STATUSES, 0))
                row[r["status"]] += 1
        return dict(sorted(table.items(), key=lambda kv: kv[0].lower()))

    def table(self) -> str:
        cols = [("pass", "pass"), ("partial", "partial"), ("declined", "declined"),
                ("wrong", "wrong"), ("error", "error"), ("crash", "crash"),
                ("oracle-fails", "oracle")]
        rows = self.by_op()
        w = max([len("op")] + [len(op) for op in rows])
        head = f"{'op':<{w}}  {'cases':>5}  " + "  ".join(f"{h:>8}" for _, h in cols)
        lines = [head, "-" * len(head)]
        for op, row in rows.items():
            lines.append(f"{op:<{w}}  {sum(row.values()):>5}  " +
                         "  ".join(f"{row[s] or '':>8}" for s, _ in cols))
        return "\n".join(lines)

    def defects(self) -> list[tuple[str, dict]]:
        return [(n, r) for n, r in sorted(self.cases.items())
                if r["status"] in ("wrong", "error", "crash")]

    def to_json(self) -> dict:
        import onnxruntime as ort
        return {"summary": self.counts, "total": len(self.cases), "summary_line":
                self.summary_line(), "elapsed_s": round(self.elapsed, 1), "jobs": self.jobs,
                "device": self.device, "data_dir": self.data_dir,
                "onnxruntime": ort.__version__, "cases": dict(sorted(self.cases.items()))}

    def write_json(self, path: str | pathlib.Path):
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")


def run_conformance(pattern: str | None = None, *, jobs: int = 2, device: str = "cpu",
                    timeout: float = 300, runs: int = 2, progress: bool = True,
                    directory: str | pathlib.Path | None = None,
                    json_path: str | pathlib.Path | None = None) -> Report:
    """Runs the (filtered) node cases in `jobs` worker processes and returns a Report."""
    directory = pathlib.Path(directory or data_dir())
    names = discover(directory, pattern)
    env = _worker_env(device)
    todo: queue.Queue = queue.Queue()
    for n in names:
        todo.put(n)
    results: dict[str, dict] = {}
    lock = threading.Lock()
    bar = _Progress(len(names), progress)
    t0 = time.monotonic()
    live: set = set()  # workers running now, so a SIGTERM (a `timeout` around the run) kills them

    def slot():
        worker = None
        try:
            while True:
                try:
                    name = todo.get_nowait()
                except queue.Empty:
                    return
                if worker is None or not worker.alive():
                    if worker is not None:
                        worker.close()
                        live.discard(worker)
                    worker = _Worker(env)
                    live.add(worker)
                req = {"dir": str(directory / name), "device": device, "runs": runs}
                res = worker.run(req, timeout)
                if res["status"] == "crash":
                    worker.close()
                    live.discard(worker)
                    worker = None
                    res.setdefault("ops", _ops_of(directory / name))
                with lock:
                    results[name] = res
                    bar.update(res["status"])
        finally:
            if worker is not None:
                worker.close()
                live.discard(worker)

    def on_term(signum, _frame):
        # Without this the workers outlive a killed runner (each finishes its case first) and
        # keep the machine busy. What finished is reported (and written) as a partial result:
        # a `timeout` around a long GPU run still leaves its counts.
        for w in list(live):
            w.proc.kill()
        with lock:
            done = dict(results)
        partial = Report(done, time.monotonic() - t0, max(1, jobs), device, str(directory))
        sys.stderr.write(f"\n{partial.summary_line()} -- interrupted after {len(done)} of {len(names)} cases\n")
        if json_path:
            partial.write_json(json_path)
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main else None
    threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, jobs))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    bar.close()
    report = Report(results, time.monotonic() - t0, max(1, jobs), device, str(directory))
    if json_path:
        report.write_json(json_path)
    return report


def _ops_of(case_dir: pathlib.Path) -> list[str]:
    try:
        import onnx
        m = onnx.load(str(case_dir / "model.onnx"))
        return sorted({_op_name(n) for n in m.graph.node})
    except Exception:  # noqa: BLE001
        return []


# --------------------------------------------------------------------------------------------
# Command line (`python -m onnxruntime_mlx conformance`)

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--filter", metavar="REGEX", help="only cases whose name matches (re.search)")
    p.add_argument("--json", metavar="PATH", default=str(DEFAULT_JSON),
                   help="per-case results (default: %(default)s)")
    p.add_argument("--jobs", "-j", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--timeout", type=float, default=300, metavar="S",
                   help="seconds per case before its worker is killed (default 300)")
    p.add_argument("--runs", type=int, default=2,
                   help="runs per data set; the 2nd runs the compiled program (default 2)")
    p.add_argument("--data", metavar="DIR", help=f"node test folder (default {DEFAULT_DATA_DIR})")
    p.add_argument("--no-table", action="store_true", help="skip the per-op table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    import onnxruntime_mlx as om
    if args.filter:
        try:
            re.compile(args.filter)
        except re.error as e:
            raise om.UsageError(f"--filter {args.filter!r} is not a regular expression: {e}") from None
    directory = pathlib.Path(args.data or data_dir())
    if not directory.is_dir():
        raise om.UsageError(f"no ONNX node test data at {directory} (run scripts/setup, or --data)")
    if args.jobs < 1 or args.runs < 1:
        raise om.UsageError("--jobs and --runs must be >= 1")
    om.ep_devices(args.device)
    report = run_conformance(args.filter, jobs=args.jobs, device=args.device,
                             timeout=args.timeout, runs=args.runs, progress=not args.quiet,
                             directory=args.data, json_path=args.json)
    if not args.no_table:
        print(report.table())
        print()
    for name, r in report.defects():
        print(f"{r['status']:>6}  {name}: {r['reason']}")
    print(report.summary_line())
    if args.json:
        print(f"per-case results: {args.json}")
    c = report.counts
    return 1 if c["wrong"] or c["crash"] else 0
