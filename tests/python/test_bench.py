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
    # The EP's and mlx-lm's decode passes also record their median and slowest step.
    llm = {(x["subject"], x["provider"]): x["result"] for x in data["results"] if x["group"] == "llm"}
    for (subject, provider), res in llm.items():
        if provider in ("mlx", "mlx-lm"):
            assert 0 < res["decode_step_ms_median@32"] <= res["decode_step_ms_max@32"], (subject, provider, res)
        if provider == "mlx":  # the EP's own statistics: no run fell back to MLX's CPU stream
            st = res["ep_stats"]
            assert st["runs"] > 0 and st["eval_arrays"] > 0 and st["empty_operand_runs"] == 0, st
    assert "EP statistics" in (tmp_path / "bench.md").read_text()
    # The header names OpenBLAS's kernels (and the variable that forces them), and the LLM cases
    # their phases' seconds.
    assert data["meta"]["openblas_core"], data["meta"]
    assert f"OpenBLAS {data['meta']['openblas_core']}" in (tmp_path / "bench.md").read_text()
    assert all(set(res["phase_s"]) >= {"session", "prefill@32", "decode@32"}
               for (_, provider), res in llm.items() if provider in ("mlx", "cpu"))


def test_case_timeout_keeps_the_figures_finished(tmp_path):
    """A case stopped at its time limit keeps the figures it finished and is marked partial,
    and its figures still get ratios (a GPU call's time limit otherwise loses a whole case)."""
    import pathlib
    from onnxruntime_mlx import bench
    model = pathlib.Path(__file__).resolve().parents[2] / "tests/models/llm/llama-fp32"
    # Prefill finishes in well under a second; 10^6 decode steps never do.
    spec = {"kind": "llm_mlx_lm", "model": str(model), "device": "cpu", "vocab": 512, "repeat": 3,
            "prefill": [32], "decode": [32], "steps": 10**6}
    res = bench.run_worker(spec, timeout=20)
    assert not res["ok"] and res["partial"] and "timed out" in res["error"], res
    assert res["prefill_tok_s@32"] > 0 and "decode_tok_s@32" not in res, res
    rows = bench.summarize([{"group": "llm", "subject": "m", "provider": "mlx", "result": res},
                            {"group": "llm", "subject": "m", "provider": "mlx-lm", "result": res}])["ratios"]
    assert [(r["figure"], r["ep/mlx-lm"]) for r in rows] == [("prefill_tok_s@32", 1.0)]


def test_gpu_plan_sets_one_tf32_for_every_system():
    """On the GPU every case carries the bench's one TF32 setting, and it reaches each system as
    its own option: the EP's tf32, ORT's CUDA EP's use_tf32 (whose default would be on)."""
    import argparse
    from onnxruntime_mlx import bench
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    for tf32 in (0, 1):
        args = p.parse_args(["--device", "gpu", "--only", "cnn,encoder", "--baselines", "ort-cuda",
                             "--tf32", str(tf32), "--quick"])
        cases = bench.plan(args)
        assert cases and all(spec["tf32"] == tf32 for _, _, spec in cases)
        providers = {spec["provider"] for _, _, spec in cases if "provider" in spec}
        assert {"mlx", "ort-cuda"} <= providers, providers
        spec = cases[0][2]
        assert bench._tf32_options(spec, "ort-cuda") == {"use_tf32": str(tf32)}
        assert bench._tf32_options(spec, "mlx") == {"tf32": tf32}
    cpu = p.parse_args(["--only", "cnn", "--quick"])
    assert all("tf32" not in spec for _, _, spec in bench.plan(cpu))
    assert bench._tf32_options({}, "ort-cuda") == {}


def test_rounds_pair_each_ratio_with_its_own_round():
    """With --rounds a figure is its median over the rounds and a ratio the median of the rounds'
    paired ratios (each EP figure against the same round's baseline), so a slow phase that falls
    on one round moves both sides of that round's ratio: here the medians' ratio would be 0.55,
    the paired ones are 1.1, 2.0 and 0.5."""
    from onnxruntime_mlx import bench
    ep, cpu = [1.0, 10.0, 2.0], [1.1, 20.0, 1.0]
    results = [{"group": "cnn", "subject": "m", "provider": p, "round": i, "result": {"ok": True, "latency_s": v[i]}}
               for i in range(3) for p, v in (("mlx", ep), ("cpu", cpu))]
    [row] = bench.summarize(results)["ratios"]
    assert row["ep"] == 2.0 and row["cpu"] == 1.1 and row["rounds"] == 3, row
    assert abs(row["ep/cpu"] - 1.1) < 1e-12, row
    # A round whose baseline failed gives no pair; one round is the figures as measured.
    results[-1]["result"] = {"ok": False, "error": "x"}
    [row] = bench.summarize(results)["ratios"]
    assert abs(row["ep/cpu"] - (1.1 + 2.0) / 2) < 1e-12, row
    [row] = bench.summarize([r for r in results if r["round"] == 0])["ratios"]
    assert row["ep"] == 1.0 and abs(row["ep/cpu"] - 1.1) < 1e-12 and "rounds" not in row, row


def test_rounds_run_every_measured_case_each_round(tmp_path):
    """`--rounds 2` runs each measured case twice, in turn (the demo model is written once), and
    the table says how its figures were taken."""
    r = subprocess.run([sys.executable, "-m", "onnxruntime_mlx", "bench", "--only", "demo", "--rounds", "2",
                        "--repeat", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    data = json.loads((tmp_path / "bench.json").read_text())
    runs = sorted((x["provider"], x["round"]) for x in data["results"])
    assert runs == [("cpu", 0), ("cpu", 1), ("mlx", 0), ("mlx", 1)], runs
    assert data["meta"]["rounds"] == 2 and all(row["rounds"] == 2 for row in data["ratios"]), data["ratios"]
    assert "median of 2 rounds" in (tmp_path / "bench.md").read_text()
