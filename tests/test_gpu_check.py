"""The GPU check's script (benchmarks/gpu_check.py, make gpu-check) where there is no GPU: it skips every
GPU step by name, runs the others, writes its summary and exits 0; a step past its time is stopped."""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gpu_check  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the check runs its GPU steps (make gpu-check)")
@pytest.mark.timeout(120)
def test_without_a_gpu_the_check_skips_the_gpu_steps_and_runs_the_others(tmp_path):
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--quick", "--no-build", "--budget", "100"]
    done = subprocess.run(command + ["--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "GPU: none (no CUDA GPU)" in out
    assert "no CUDA GPU: skipping gpu tests" in out and "no CUDA GPU: skipping device benchmark" in out
    assert "--no-build: skipping build" in out
    assert "[gpu-check] host path benchmark: ok in" in out
    summary = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    assert [(s["step"], s["status"]) for s in summary["steps"]] == [
        ("build", "skipped"),
        ("gpu tests", "skipped"),
        ("decode benchmark", "skipped"),
        ("device benchmark", "skipped"),
        ("paths benchmark", "skipped"),
        ("host path benchmark", "ok"),
    ]
    assert summary["total_seconds"] < 100
    host = json.loads((tmp_path / "host_path_cpu.json").read_text())
    assert host["results"] and "torch_shards_faults_after" in host["results"][0]
    assert (tmp_path / "gpu_check_cpu.txt").read_text().count("| skipped |") == 5


def test_a_step_past_its_time_is_stopped_and_fails_the_check(tmp_path, capsys):
    check = gpu_check.Check(budget=60, out_dir=str(tmp_path), slug="cpu")
    assert check.run("quick", [sys.executable, "-c", "print('hello')"], timeout=30)
    assert not check.run("silent hang", [sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert not check.run("failing", [sys.executable, "-c", "raise SystemExit(3)"], timeout=30)
    check.deadline = 0  # the budget spent: later steps are not started
    assert not check.run("late", [sys.executable, "-c", "print('never')"], timeout=30)
    statuses = [s["status"] for s in check.steps]
    assert statuses[0] == "ok" and statuses[1].startswith("timed out") and statuses[2] == "failed (exit status 3)"
    assert check.steps[3]["status"] == "skipped" and check.steps[1]["seconds"] < 10
    assert check.steps[0]["tail"] == ["hello"] and check.failed
    out = capsys.readouterr().out
    assert "out of time: skipping late" in out and "never" not in out
