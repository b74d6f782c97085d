"""The benchmark harness stays working: `bench --quick` runs every group and writes its JSON,
table and plot (CI checks that it runs and that each figure was measured, never timings)."""
import json
import subprocess
import sys


def test_bench_quick_runs_every_group(tmp_path):
    r = subprocess.run([sys.executable, "-m", "onnxruntime_mlx", "bench", "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    data = json.loads((tmp_path / "bench.json").read_text())
    failed = [(x["subject"], x["provider"], x["result"].get("error")) for x in data["results"]
              if not x["result"].get("ok")]
    assert not failed, failed
    groups = {row["group"] for row in data["ratios"]}
    assert {"llm", "encoder", "cnn", "demo"} <= groups, groups
    # Every EP figure has its same-run baseline ratio (CPU EP everywhere, mlx-lm for the LLMs).
    assert all("ep/cpu" in row for row in data["ratios"])
    assert any("ep/mlx-lm" in row for row in data["ratios"] if row["group"] == "llm")
    o = data["overhead"]
    assert o["ok"] and 0 <= o["compiled"]["overhead_fraction"] < 1
    assert (tmp_path / "bench.md").read_text().count("|") > 20
    assert (tmp_path / "bench.png").stat().st_size > 1000
