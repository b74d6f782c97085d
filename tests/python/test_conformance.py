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
