"""Every entry of the op registry has an oracle case: some test file under tests/python (the
conformance runner aside) names its op type (and its domain, for com.microsoft and ai.onnx.ml),
so a translator cannot land untested. The registry comes from the built ortmlx_ops_dump (the
same table the EP claims with). No exemptions: the conformance runner is not counted."""
import json
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DUMP = ROOT / "build" / "ortmlx_ops_dump"
HERE = pathlib.Path(__file__).parent


def test_every_registry_entry_has_an_oracle_case():
    if not DUMP.exists():
        pytest.skip(f"{DUMP} is not built")
    ops = json.loads(subprocess.run([str(DUMP)], check=True, capture_output=True, text=True).stdout)["ops"]
    assert len(ops) > 100  # the dump really is the registry
    texts = [p.read_text() for p in HERE.glob("test_*.py")
             if p.name not in ("test_conformance.py", pathlib.Path(__file__).name)]

    def covered(o):
        # The op type quoted in a test file; an op of another domain (com.microsoft, ai.onnx.ml)
        # in a file that names that domain, so that e.g. ai.onnx Attention's tests do not count
        # for com.microsoft Attention.
        quoted = re.compile(r"[\"']" + re.escape(o["op"]) + r"[\"']")
        return any(quoted.search(t) and (not o["domain"] or o["domain"] in t) for t in texts)

    missing = sorted({f"{o['domain'] or 'ai.onnx'}:{o['op']}" for o in ops if not covered(o)})
    assert not missing, "registry entries without an oracle case: " + ", ".join(missing)
