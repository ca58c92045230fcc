"""The fuzzing harness's fixed-seed quick run (tests/fuzz/run.py --quick): 340
mutated copies of every seed file, each read whole by torch_shards and by the
reference library in forked children. Fails on any crash, hang, memory
blow-up, unclear error, silent difference or unlisted refusal of a file the
reference reads. The long run (3000+ cases) is `make fuzz-long`."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "fuzz", "run.py")
FAILURES = ["refused", "silent difference", "crash", "hang", "memory blow-up", "unclear error"]


def test_quick_fuzz_run_finds_no_crash_hang_blowup_or_silent_difference(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, RUNNER, "--quick", "--jobs", "2", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(report.read_text())
    summary, cases = results["summary"], results["cases"]
    failures = [case for case in cases if case["class"] in FAILURES]
    details = "\n".join(f"[{c['case']}] {c['seed']} {c['class']}: {c['mutation']}\n    {c['detail']}" for c in failures)
    assert not failures, f"{len(failures)} failing cases:\n{details}\n{done.stdout[-2000:]}"
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert len(cases) == 340
    # The mutations reach every seed and both outcomes: data read alike, and files both readers refuse.
    assert {case["seed"] for case in cases} == set(results["seeds"]) and len(results["seeds"]) >= 17
    assert summary["same data"] > 0 and summary["both refuse"] > 0
