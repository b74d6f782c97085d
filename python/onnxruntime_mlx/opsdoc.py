"""Prints the supported-ops table (docs/ops.md) from the EP's op registry (the single source
of truth); --out PATH writes it to a file instead (--out docs/ops.md regenerates the project's).

    python -m onnxruntime_mlx ops-doc [--tool PATH] [--conformance PATH] [--out PATH]

The registry is read through the C++ tool `ortmlx_ops_dump` (tools/ops_dump.cc, built next to
the EP library). The dtypes column is probed, not declared: for every entry and every MLX dtype
T, a synthetic node is put through the EP's own claim decision. Where ONNX (or ORT, for
com.microsoft) has a schema for the op, each input/output gets a dtype its type constraint
allows: T for the op's main type constraint, and for the others T when allowed, else int64, else
the first type MLX has; optional inputs are tried present and absent. Without a schema every
input and output gets T. Attributes are absent (defaults apply) except required ones, which get
a plain value (1, [1, 1], ...; Cast's `to` is T), and ai.onnx.ml ops, which get a tiny model
(PROBE_ATTRS); the check may still decline particular nodes: the notes say when.

The last section lists the ops the conformance run (build/conformance.json) saw declined.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
from collections import Counter, defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "docs/ops.md"
DEFAULT_CONFORMANCE = ROOT / "build/conformance.json"
TOOL = "ortmlx_ops_dump"

# The tool's dtype names (graph::dtype_name), in doc order, with short labels.
MLX_DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
              "uint8", "uint16", "uint32", "uint64", "bool"]
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
         "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
         "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool"}
# ONNX type strings -> the tool's dtype names
ONNX_TO_TOOL = {"float": "float32", "double": "float64", "float16": "float16",
                "bfloat16": "bfloat16", "int8": "int8", "int16": "int16", "int32": "int32",
                "int64": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
                "uint64": "uint64", "bool": "bool", "string": "string",
                "complex64": "complex64", "complex128": "complex128",
                "float8e4m3fn": "float8e4m3fn", "float8e4m3fnuz": "float8e4m3fnuz",
                "float8e5m2": "float8e5m2", "float8e5m2fnuz": "float8e5m2fnuz",
                "uint4": "uint4", "int4": "int4", "float4e2m1": "float4e2m1"}
DOMAIN_TITLES = {"": "ai.onnx", "ai.onnx.ml": "ai.onnx.ml", "com.microsoft": "com.microsoft"}


def find_tool(explicit: str | None = None) -> pathlib.Path:
    """$ORT_MLX_OPS_DUMP, next to $ORT_MLX_EP_LIBRARY, then build/."""
    candidates = []
    if explicit:
        candidates.append(pathlib.Path(explicit))
    if os.environ.get("ORT_MLX_OPS_DUMP"):
        candidates.append(pathlib.Path(os.environ["ORT_MLX_OPS_DUMP"]))
    if os.environ.get("ORT_MLX_EP_LIBRARY"):
        candidates.append(pathlib.Path(os.environ["ORT_MLX_EP_LIBRARY"]).parent / TOOL)
    candidates.append(ROOT / "build" / TOOL)
    for c in candidates:
        if c.is_file():
            return c.resolve()
    import onnxruntime_mlx as om
    raise om.UsageError(f"{TOOL} not found (looked at {', '.join(map(str, candidates))}); "
                        f"build it: cmake --build build --target {TOOL}, or give --tool")


# --------------------------------------------------------------------------------------------
# Schemas: ONNX's (ai.onnx, ai.onnx.ml) and ORT's (com.microsoft)

def _schema(domain: str, op: str, max_version: int):
    """The newest schema of domain.op with since_version <= max_version, or None."""
    if domain in ("", "ai.onnx.ml", "ai.onnx.preview.training"):
        import onnx.defs
        try:
            return onnx.defs.get_schema(op, max_version, domain)
        except Exception:  # noqa: BLE001 - not an ONNX op
            return None
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C
        found = [s for s in C.get_all_operator_schema()
                 if s.name == op and s.domain == domain and s.since_version <= max_version]
    except Exception:  # noqa: BLE001
        return None
    return max(found, key=lambda s: s.since_version) if found else None


def _type_str(param) -> str:
    return getattr(param, "type_str", None) or getattr(param, "typeStr", "")


def _option(param) -> str:
    return str(param.option).rsplit(".", 1)[-1].split(":")[0]  # Single / Optional / Variadic


def _tool_dtype(type_str: str) -> str | None:
    """'tensor(float)' -> 'float32'; None for sequences, maps, optionals."""
    if not type_str.startswith("tensor(") or not type_str.endswith(")"):
        return None
    return ONNX_TO_TOOL.get(type_str[len("tensor("):-1])


# Required attributes need a value to probe with; these ops need a meaningful one (probed
# dtype T is passed in), and ai.onnx.ml ops need a small consistent model. Other required
# attributes get 1 / [1, 1] / 1.0 / a zero scalar of T.
ONNX_ELEM = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6,
             "int64": 7, "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13,
             "bfloat16": 16}
_TREE = {"nodes_treeids": "is:0", "nodes_nodeids": "is:0", "nodes_featureids": "is:0",
         "nodes_modes": "ss:LEAF", "nodes_values": "fs:0", "nodes_truenodeids": "is:0",
         "nodes_falsenodeids": "is:0"}  # one tree that is a single leaf
PROBE_ATTRS = {
    ("", "Cast"): lambda t: {"to": f"i:{ONNX_ELEM[t]}"},
    ("", "Constant"): lambda t: {"value": f"t:{t}"},
    ("", "Einsum"): lambda t: {"equation": "s:ij,jk->ik"},
    ("com.microsoft", "MatMulNBits"): lambda t: {"K": "i:32", "N": "i:8", "block_size": "i:32"},
    # ai.onnx.ml models carry their parameters as attributes; 4 features (rank-2 layout [3, 4])
    ("ai.onnx.ml", "LinearClassifier"): lambda t: {
        "coefficients": "fs:" + ",".join(["1"] * 8), "intercepts": "fs:0,0",
        "classlabels_ints": "is:0,1"},
    ("ai.onnx.ml", "LinearRegressor"): lambda t: {
        "coefficients": "fs:1,1,1,1", "intercepts": "fs:0", "targets": "i:1"},
    ("ai.onnx.ml", "Scaler"): lambda t: {"scale": "fs:1", "offset": "fs:0"},
    ("ai.onnx.ml", "Imputer"): lambda t: (
        {"imputed_value_floats": "fs:0", "replaced_value_float": "f:0"} if t.startswith("float")
        else {"imputed_value_int64s": "is:0", "replaced_value_int64": "i:0"}),
    ("ai.onnx.ml", "OneHotEncoder"): lambda t: {"cats_int64s": "is:1,2"},
    ("ai.onnx.ml", "FeatureVectorizer"): lambda t: {"inputdimensions": "is:4,4"},
    ("ai.onnx.ml", "TreeEnsembleRegressor"): lambda t: {
        **_TREE, "target_treeids": "is:0", "target_nodeids": "is:0", "target_ids": "is:0",
        "target_weights": "fs:1", "n_targets": "i:1"},
    ("ai.onnx.ml", "TreeEnsembleClassifier"): lambda t: {
        **_TREE, "class_treeids": "is:0,0,0", "class_nodeids": "is:0,0,0",
        "class_ids": "is:0,1,2", "class_weights": "fs:1,1,1", "classlabels_int64s": "is:0,1,2"},
    ("ai.onnx.ml", "TreeEnsemble"): lambda t: {
        "tree_roots": "is:0", "nodes_featureids": "is:0", "nodes_splits": f"t:{t}:0",
        "nodes_modes": "t:uint8:0", "nodes_truenodeids": "is:0", "nodes_trueleafs": "is:1",
        "nodes_falsenodeids": "is:1", "nodes_falseleafs": "is:1", "leaf_targetids": "is:0,0",
        "leaf_weights": f"t:{t}:1,1", "n_targets": "i:1"},
    # a pool of two unigrams and one bigram
    ("", "TfIdfVectorizer"): lambda t: {
        "mode": "s:TF", "min_gram_length": "i:1", "max_gram_length": "i:2",
        "max_skip_count": "i:0", "ngram_counts": "is:0,2", "ngram_indexes": "is:0,1,2",
        "pool_int64s": "is:1,2,1,2"},
    ("ai.onnx.preview.training", "Momentum"): lambda t: {"mode": "s:standard"},
}
# Ops whose variadic input/output is several groups of tensors: how many copies make one
# well-formed node (default: 2 copies of a variadic input, 1 of a variadic output).
PROBE_VARIADIC = {
    ("ai.onnx.preview.training", "Adagrad"): (3, 2),  # X, G, H -> X_new, H_new
    ("ai.onnx.preview.training", "Adam"): (4, 3),     # X, G, V, H -> X_new, V_new, H_new
    ("ai.onnx.preview.training", "Momentum"): (3, 2),  # X, G, V -> X_new, V_new
}


def _probe_attrs(schema, domain: str, op: str, t: str) -> str:
    attrs = {}
    for name, a in schema.attributes.items():
        if not a.required:
            continue
        kind = str(a.type).rsplit(".", 1)[-1]
        attrs[name] = {"INT": "i:1", "INTS": "is:1,1", "FLOAT": "f:1", "FLOATS": "fs:1",
                       "STRING": "s:", "TENSOR": f"t:{t}"}.get(kind)
    if (domain, op) in PROBE_ATTRS:
        attrs.update(PROBE_ATTRS[(domain, op)](t))
    return ";".join(f"{k}={v}" for k, v in sorted(attrs.items()) if v is not None)


class _Formals:
    """An op schema's formal inputs/outputs with the dtypes each may take."""

    def __init__(self, schema):
        constraints = {t.type_param_str: list(t.allowed_type_strs) for t in schema.type_constraints}
        self.ok = True

        def params(formals):
            out = []
            for p in formals:
                ts = _type_str(p)
                allowed = [_tool_dtype(s) for s in constraints.get(ts, [ts])]
                if any(a is None for a in allowed) and all(a is None for a in allowed):
                    self.ok = False  # sequence/optional-only parameter: not probed by schema
                allowed = [a for a in allowed if a]
                out.append((ts, allowed, _option(p)))
            return out

        self.inputs = params(schema.inputs)
        self.outputs = params(schema.outputs)
        groups = [(ts, allowed) for ts, allowed, _ in self.inputs + self.outputs]
        # The main type constraint: the one allowing the most dtypes (inputs first on ties), so
        # Reshape's is its data, ConstantOfShape's its output, Where's not the condition.
        self.main = max(groups, key=lambda g: len(g[1]))[0] if groups else None
        self.main_allowed = max(groups, key=lambda g: len(g[1]))[1] if groups else []

    def assignment(self, t: str, with_optional: bool,
                   variadic: tuple[int, int] = (2, 1)) -> tuple[list[str], list[str]]:
        def pick(ts, allowed):
            if ts == self.main or t in allowed:
                return t
            if "int64" in allowed:
                return "int64"
            return next((a for a in allowed if a in MLX_DTYPES), allowed[0] if allowed else "-")

        ins = []
        for ts, allowed, opt in self.inputs:
            if opt == "Optional" and not with_optional:
                ins.append("-")
            else:
                ins.extend([pick(ts, allowed)] * (variadic[0] if opt == "Variadic" else 1))
        while ins and ins[-1] == "-":
            ins.pop()
        outs = []
        for ts, allowed, opt in self.outputs:
            outs.extend([pick(ts, allowed) if opt != "Optional" or with_optional else "-"] *
                        (variadic[1] if opt == "Variadic" else 1))
        return ins, outs


def _probe_with_schemas(tool: pathlib.Path, entries: list[dict]) -> None:
    """Replaces each entry's default-probe dtypes with schema-based probes where a schema
    exists (entry['probe'] says which was used)."""
    lines, owners = [], []
    for k, e in enumerate(entries):
        e["probe"] = "same dtype T for every input and output"
        top = e["max_opset"] if e["max_opset"] is not None else 10 ** 6
        schema = _schema(e["domain"], e["op"], top)
        if schema is None or schema.since_version < e["min_opset"]:
            continue
        if any(a.required and str(a.type).endswith("GRAPH") for a in schema.attributes.values()):
            # Control flow: what is claimed depends on the body graphs, not on a dtype.
            e["probe"] = "not probed: the body graphs decide"
            e["dtypes"], e["declined"] = None, {}
            continue
        formals = _Formals(schema)
        if not formals.ok or not formals.main:
            continue
        e["probe"] = f"schema opset {schema.since_version}"
        e["probe_opset"] = schema.since_version
        e["schema_dtypes"] = [t for t in MLX_DTYPES if t in formals.main_allowed]
        for t in e["schema_dtypes"]:
            for with_optional in (True, False):
                ins, outs = formals.assignment(
                    t, with_optional, PROBE_VARIADIC.get((e["domain"], e["op"]), (2, 1)))
                lines.append("\t".join([e["domain"], e["op"], str(schema.since_version),
                                        ",".join(ins), ",".join(outs),
                                        _probe_attrs(schema, e["domain"], e["op"], t)]))
                owners.append((k, t))
        e["_schema_probe"] = True
    if not lines:
        return
    out = subprocess.run([str(tool), "--probe"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, check=True).stdout.splitlines()
    if len(out) != len(lines):
        raise RuntimeError(f"{tool} --probe answered {len(out)} of {len(lines)} probes")
    accepted, reasons = defaultdict(set), defaultdict(dict)
    for (k, t), answer in zip(owners, out):
        a = json.loads(answer)
        if a["ok"]:
            accepted[k].add(t)
        else:
            reasons[k].setdefault(t, a["reason"])
    for k, e in enumerate(entries):
        if e.pop("_schema_probe", False):
            e["dtypes"] = [t for t in MLX_DTYPES if t in accepted[k]]
            e["declined"] = {t: r for t, r in reasons[k].items() if t not in accepted[k]}


def registry(tool: pathlib.Path, use_schemas: bool = True) -> dict:
    dump = json.loads(subprocess.run([str(tool)], capture_output=True, text=True,
                                     check=True).stdout)
    if use_schemas:
        _probe_with_schemas(tool, dump["ops"])
    return dump


# --------------------------------------------------------------------------------------------
# Markdown

def _dtypes_cell(dtypes: list[str] | None) -> str:
    if dtypes is None:
        return "per body graph"
    if not dtypes:
        return "—"
    d = set(dtypes)
    parts = []
    groups = [("float", ["float32", "float16", "bfloat16", "float64"]),
              ("int", ["int8", "int16", "int32", "int64"]),
              ("uint", ["uint8", "uint16", "uint32", "uint64"])]
    for name, members in groups:
        if set(members) <= d:
            parts.append(f"all {name}")
        else:
            parts.extend(SHORT[m] for m in members if m in d)
    if "bool" in d:
        parts.append("bool")
    return ", ".join(parts)


def _opsets_cell(e: dict) -> str:
    if e["max_opset"] is None:
        return f"{e['min_opset']}+"
    if e["max_opset"] == e["min_opset"]:
        return str(e["min_opset"])
    return f"{e['min_opset']}–{e['max_opset']}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _conformance_section(path: pathlib.Path, registered: set[tuple[str, str]]) -> list[str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ["", "## Declined in the conformance run", "",
                f"No conformance results at `{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`"
                "; run `python -m onnxruntime_mlx conformance`, then regenerate this file."]
    declined_nodes: dict[str, Counter] = defaultdict(Counter)
    cases_of: dict[str, set] = defaultdict(set)
    for name, r in data.get("cases", {}).items():
        for d in r.get("fallback", []) or []:
            dom = d.get("domain") or ""
            if dom == "MLXExecutionProvider":
                continue  # our own fused nodes, seen by a later GetCapability pass
            if not d.get("op") and not d.get("reason"):
                continue  # a report line that names no node (nothing declined)
            bare_op = d.get("op") or "?"
            op = bare_op if dom in ("", "ai.onnx") else f"{dom}.{bare_op}"
            declined_nodes[op][d.get("reason") or "?"] += 1
            cases_of[op].add(name)
    lines = ["", "## Declined in the conformance run", "",
             f"From `{path.name}`: {data.get('summary_line', '')}", "",
             "Ops whose nodes the EP declined in ONNX's backend node tests (so they ran on "
             "ORT's CPU EP), with the most common reasons. Nodes whose sequence or optional "
             "result leaves the fused group are among them: a plugin EP's fused node can only "
             "return tensors. `passed`: of those cases, the ones that passed all the same (ORT "
             "inlines a declined function op, e.g. NegativeLogLikelihoodLoss, into its function "
             "body, whose nodes the EP ran).", "",
             "| op | in registry | cases | passed | reasons |", "|---|---|---|---|---|"]
    for op in sorted(declined_nodes, key=str.lower):
        dom, _, bare = op.rpartition(".") if "." in op else ("", "", op)
        has = "yes" if (dom, bare) in registered else "no"
        reasons = declined_nodes[op].most_common(3)
        text = "; ".join(f"{_md(r)}" + (f" (×{n})" if n > 1 else "") for r, n in reasons)
        if len(declined_nodes[op]) > 3:
            text += f"; … {len(declined_nodes[op]) - 3} more"
        passed = sum(data["cases"][c].get("status") == "pass" for c in cases_of[op])
        lines.append(f"| {op} | {has} | {len(cases_of[op])} | {passed} | {text} |")
    return lines


def render(dump: dict, conformance: pathlib.Path | None) -> str:
    entries = dump["ops"]
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        by_domain[e["domain"]].append(e)
    n_types = len({(e["domain"], e["op"]) for e in entries})
    lines = [
        "# Supported operators",
        "",
        "<!-- Generated by `python -m onnxruntime_mlx ops-doc --out docs/ops.md` from the op registry "
        "(src/ops/*.cc). Do not edit by hand: regenerate. -->",
        "",
        f"{n_types} op types in {len(entries)} registry entries (MLX {dump.get('mlx_version')}; "
        f"generated {datetime.date.today().isoformat()}).",
        "",
        "- **opsets**: the ONNX opset versions (the node's schema `since_version`) the entry "
        "claims; `N+` means every version from N on.",
        "- **dtypes**: element types the entry's support check accepts for the op's main type "
        "constraint, probed through the EP's own claim decision with default attributes "
        "(`all float` = float32, float16, bfloat16, float64). A check can still decline a "
        "particular node (attributes, shapes); the notes say when. On the GPU float64 is "
        "always declined.",
        "- Nodes the EP declines run on ORT's CPU EP (unless CPU fallback is disabled).",
    ]
    order = ["", "ai.onnx.ml", "com.microsoft"]
    for dom in order + sorted(d for d in by_domain if d not in order):
        if dom not in by_domain:
            continue
        ops = sorted(by_domain[dom], key=lambda e: (e["op"].lower(), e["min_opset"]))
        lines += ["", f"## {DOMAIN_TITLES.get(dom, dom)} ({len({e['op'] for e in ops})} ops)", "",
                  "| op | opsets | dtypes | notes |", "|---|---|---|---|"]
        for e in ops:
            lines.append(f"| {e['op']} | {_opsets_cell(e)} | {_dtypes_cell(e['dtypes'])} | "
                         f"{_md(e.get('notes') or '')} |")
    if conformance is not None:
        registered = {(e["domain"], e["op"]) for e in entries}
        lines += _conformance_section(conformance, registered)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tool", metavar="PATH", help=f"the {TOOL} binary (default: next to the EP "
                   "library, then build/)")
    p.add_argument("--conformance", metavar="PATH", default=str(DEFAULT_CONFORMANCE),
                   help="conformance results to list declined ops from (default: %(default)s)")
    p.add_argument("--out", metavar="PATH", default="-",
                   help=f"output file (default: stdout; the project's table is {DEFAULT_OUT})")
    p.add_argument("--no-schemas", action="store_true",
                   help="probe with the same dtype for every input/output (no ONNX schemas)")
    p.add_argument("--json", metavar="PATH", help="also write the probed registry as JSON")


def run(args: argparse.Namespace) -> int:
    tool = find_tool(args.tool)
    dump = registry(tool, use_schemas=not args.no_schemas)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dump, indent=1) + "\n")
    text = render(dump, pathlib.Path(args.conformance) if args.conformance else None)
    if args.out == "-":
        print(text, end="")
        return 0
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({len(dump['ops'])} entries)")
    return 0
