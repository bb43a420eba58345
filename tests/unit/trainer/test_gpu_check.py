"""benchmarks/gpu_check.sh is ready for a GPU machine: it parses, its dry run lists every step and
writes the one JSON, and the merge reads what the benchmarks write."""
import json
import os
import subprocess
import sys

from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_report  # noqa: E402

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
STEPS = ["environment", "pytest -m gpu", "bench_mfu 125m", "bench_mfu 1b", "bench_kernels (CUDA)", "bench_memory",
         "bench_images (DALI mixed)", "bench_attention (CUDA)"]


def test_script_parses_and_its_dry_run_writes_the_json(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    p = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OUT=str(tmp_path), PY=sys.executable))
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [s["name"] for s in report["steps"]] == STEPS
    assert all(s["dry_run"] and s["rc"] == 0 for s in report["steps"])
    assert sum(s["limit_s"] for s in report["steps"]) <= 480  # the whole check in under 8 minutes
    for name in gpu_report.BENCHMARKS:
        assert "not written" in report[name]["missing"]
    assert report["summary"] == {} and report["failed_steps"] == []
    for script in ("bench_mfu.py", "bench_kernels.py", "bench_memory.py", "bench_images.py", "bench_attention.py"):
        assert (REPO / "benchmarks" / script).exists()


def test_merge_reads_results_and_judges_the_mfu_goal(tmp_path):
    steps = '{"name": "bench_mfu 1b", "rc": 0}\n{"name": "bench_images", "rc": 124}\n{"na'  # a torn last line
    (tmp_path / "steps.jsonl").write_text(steps)
    (tmp_path / "pytest_gpu.xml").write_text(
        '<testsuites><testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b">'
        '<failure message="x"/></testcase><testcase classname="t" name="c"><skipped/></testcase>'
        '</testsuite></testsuites>')
    variants = [{"kernels": "auto", "attention": "flex", "mfu": 0.47},
                {"kernels": "auto", "attention": "dense", "mfu": 0.31}]
    (tmp_path / "mfu_1b.json").write_text(json.dumps({"variants": variants}))
    (tmp_path / "memory.json").write_text(json.dumps({"records": [{"mode": "stage3", "step_peak_bytes": 2 ** 31}]}))
    (tmp_path / "kernels.json").write_text("{torn")
    report = gpu_report.build_report(tmp_path)
    assert report["failed_steps"] == ["bench_images"] and len(report["steps"]) == 2
    assert report["pytest"]["passed"] == 1 and report["pytest"]["failed"] == 1 and report["pytest"]["skipped"] == 1
    assert report["pytest"]["tests"]["t::b"] == "failed"
    summary = report["summary"]
    assert summary["mfu"] == {"1b flex kernels=auto": 0.47, "1b dense kernels=auto": 0.31}
    assert summary["mfu_1b_best"] == 0.47 and summary["mfu_1b_goal_met"] is True
    assert summary["step_peak_gib"] == {"stage3": 2.0}
    assert "unreadable" in report["kernels"]["missing"] and "not written" in report["images"]["missing"]
