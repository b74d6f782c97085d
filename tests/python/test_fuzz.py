"""A short, bounded pass of tools/fuzz_ep.py (the long form is in docs/performance.md "Reliability gates"): mutated
node-test models run on the MLX EP and on ORT's CPU EP in one process. It fails on a crash of
the process or on a result that differs from the CPU EP and is not a triaged known mismatch
(fuzz_ep.known_mismatch). Starts from the committed corpus tests/fuzz_corpus/."""
import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_bounded_fuzz_pass(tmp_path):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "tests/fuzz_corpus", corpus)
    env = dict(os.environ, ORT_DISABLE_TELEMETRY="1")
    env.pop("FUZZ_FINDINGS", None)  # a new mismatch must fail this test
    r = subprocess.run([sys.executable, str(ROOT / "tools/fuzz_ep.py"), "-seed=1", "-runs=400",
                        "-max_total_time=30", f"-artifact_prefix={tmp_path}/", str(corpus)],
                       capture_output=True, text=True, timeout=120, env=env)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    stats = [ln for ln in log.splitlines() if ln.startswith("[fuzz] ")]
    assert stats, log[-3000:]
    s = ast.literal_eval(stats[-1][len("[fuzz] "):])
    # The pass must have exercised the EP, not only models ORT itself refuses.
    assert s["inputs"] >= 20 and s["valid"] > 0 and s["mlx_ran"] > 0, s
    assert s["mismatches"] == 0, s
