"""ONNX's backend node tests through the MLX EP (python -m onnxruntime_mlx conformance).

The whole set runs once per session (worker subprocesses, so a crash is recorded, not fatal).
Gates: no `wrong` result, no `crash`, and at least the checked-in number of `pass` cases
(tests/python/conformance_baseline.json; raise it as ops land, never lower it).
"""
import json
import os
import pathlib

import pytest

from onnxruntime_mlx import conformance

BASELINE = pathlib.Path(__file__).with_name("conformance_baseline.json")
JOBS = int(os.environ.get("ORT_MLX_CONFORMANCE_JOBS", "2"))


@pytest.fixture(scope="session")
def report():
    try:
        conformance.discover()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return conformance.run_conformance(jobs=JOBS, device="cpu", progress=False,
                                       json_path=conformance.DEFAULT_JSON)


def _listing(report, status):
    return "\n".join(f"  {n}: {r['reason']}" for n, r in sorted(report.cases.items())
                     if r["status"] == status)


def test_no_wrong_results(report):
    assert report.counts["wrong"] == 0, "wrong results:\n" + _listing(report, "wrong")


def test_no_crashes(report):
    assert report.counts["crash"] == 0, "crashes:\n" + _listing(report, "crash")


def test_pass_count_not_below_baseline(report):
    floor = json.loads(BASELINE.read_text())["min_pass"]
    print("\n" + report.summary_line())
    assert report.counts["pass"] >= floor, (
        f"{report.counts['pass']} cases pass, the baseline is {floor}: {report.summary_line()}")


def test_sigterm_reports_partial_and_stops_workers(tmp_path):
    """A `timeout` around the runner (the GPU script gives it a share of a device call) sends
    SIGTERM: what finished is printed and written as a partial result, and no worker outlives
    the runner (they would keep the machine busy during whatever runs next)."""
    import signal
    import subprocess
    import sys
    import time
    try:
        conformance.discover()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    out = tmp_path / "partial.json"
    p = subprocess.Popen([sys.executable, "-m", "onnxruntime_mlx", "conformance", "--jobs", "2",
                          "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    time.sleep(4)
    workers = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "interrupted after" in err, err[-2000:]
    assert json.loads(out.read_text())["total"] > 0
    time.sleep(0.5)
    alive = [w for w in workers if os.path.exists(f"/proc/{w}") and
             "zombie" not in open(f"/proc/{w}/status").read().lower()]
    assert workers and not alive, (workers, alive)
