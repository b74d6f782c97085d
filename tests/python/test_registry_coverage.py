"""Every entry of the op registry has an oracle case: some test file under tests/python (the
conformance runner aside) names its op type, so a translator cannot land untested. The registry
comes from the built ortmlx_ops_dump (the same table the EP claims with)."""
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
    text = "\n".join(p.read_text() for p in HERE.glob("test_*.py")
                     if p.name not in ("test_conformance.py", pathlib.Path(__file__).name))
    missing = sorted({f"{o['domain'] or 'ai.onnx'}:{o['op']}" for o in ops
                      if not re.search(r"[\"']" + re.escape(o["op"]) + r"[\"']", text)})
    assert not missing, "registry entries without an oracle case: " + ", ".join(missing)
