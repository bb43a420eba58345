"""Merge the results of benchmarks/gpu_check.sh into one JSON file.

Reads the results folder the script fills: ``steps.jsonl`` (one ``{"name", "rc", "seconds",
"command"}`` line per step), ``pytest_gpu.xml`` (JUnit XML of ``pytest -m gpu``) and one JSON file
per benchmark (``environment``, ``kernels``, ``mfu_125m``, ``mfu_1b``, ``images``, ``memory``,
``attention``), and writes ``{"steps", "pytest", "summary", <benchmark>: ...}``. A missing or
unreadable file becomes ``{"missing": reason}`` under its name, so a partial run still reports.

``summary`` holds the headline numbers: MFU per model size and attention backend, the 1B model's
best MFU against the 45 % goal, Triton speed-ups and parity, DALI ``mixed`` images/s, and the
step peak per ZeRO stage.

Usage: ``python benchmarks/gpu_report.py RESULTS_DIR OUT.json`` (standard library only), and
``python benchmarks/gpu_report.py --environment OUT.json`` (the script's first step: GPU, torch,
CUDA and package versions; imports torch).
"""
from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

BENCHMARKS = ("environment", "kernels", "mfu_125m", "mfu_1b", "images", "memory", "attention")
MFU_GOAL_1B = 0.45


def environment() -> dict:
    """GPU and versions of torch, CUDA and the packages the GPU steps use (``MISSING (...)`` when absent)."""
    import torch
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "", "packages": {}}
    if shutil.which("nvidia-smi"):
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    for mod in ("triton", "nvidia.dali", "zstandard", "webdataset", "hypothesis", "apache_beam"):
        try:
            env["packages"][mod] = getattr(importlib.import_module(mod), "__version__", "ok")
        except ImportError as e:
            env["packages"][mod] = f"MISSING ({e})"
    return env


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"missing": f"{path.name} not written (its step failed or did not run; see steps and the log)"}
    except (OSError, ValueError) as e:
        return {"missing": f"{path.name} unreadable: {type(e).__name__}: {e}"}


def read_steps(path: Path) -> list[dict]:
    """The step records of ``steps.jsonl`` (a torn last line is skipped)."""
    steps = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                steps.append(json.loads(line))
            except ValueError:
                continue
    return steps


def read_pytest(path: Path) -> dict:
    """Counts and per-test outcomes (``passed``/``failed``/``error``/``skipped``) of a JUnit XML file."""
    if not path.exists():
        return {"missing": f"{path.name} not written"}
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[name] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "error", "skipped")}
    return {**counts, "tests": outcomes}


def summarise(report: dict) -> dict:
    """The headline numbers of a merged report (keys absent where their benchmark is missing)."""
    out: dict = {}
    mfu = {}
    for size in ("125m", "1b"):
        for v in report.get(f"mfu_{size}", {}).get("variants", []):
            mfu[f"{size} {v['attention']} kernels={v['kernels']}"] = v.get("mfu")
    if mfu:
        out["mfu"] = mfu
    best_1b = [v.get("mfu") for v in report.get("mfu_1b", {}).get("variants", []) if v.get("mfu") is not None]
    if best_1b:
        out["mfu_1b_best"] = max(best_1b)
        out["mfu_1b_goal_met"] = max(best_1b) >= MFU_GOAL_1B
    kernels = report.get("kernels", {}).get("kernels", [])
    if kernels:
        out["triton_speedup"] = {k["kernel"]: k["speedup"] for k in kernels}
        out["triton_parity_max_abs_diff"] = {k["kernel"]: k["max_abs_diff"] for k in kernels}
    mixed = report.get("images", {}).get("contenders", {}).get("DALI mixed/gpu")
    if mixed:
        out["dali_mixed_images_per_s"] = mixed["images_per_s"]
    records = report.get("memory", {}).get("records", [])
    if records:
        out["step_peak_gib"] = {r["mode"]: r["step_peak_bytes"] / 2 ** 30 for r in records}
    return out


def build_report(results: Path) -> dict:
    """The merged report of the results folder ``results`` (see the module docstring)."""
    report = {"steps": read_steps(results / "steps.jsonl"), "pytest": read_pytest(results / "pytest_gpu.xml")}
    for name in BENCHMARKS:
        report[name] = _read_json(results / f"{name}.json")
    report["failed_steps"] = [s["name"] for s in report["steps"] if s.get("rc") != 0]
    report["summary"] = summarise(report)
    return report


def main(argv: list[str] | None = None) -> int:
    """Write the merged report (or, with ``--environment``, the environment) and print it."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", help="the results folder gpu_check.sh fills")
    p.add_argument("out", nargs="?", help="the merged JSON file to write")
    p.add_argument("--environment", metavar="OUT", help="write the environment record to OUT instead")
    args = p.parse_args(argv)
    if args.environment:
        env = environment()
        print(json.dumps(env, indent=1))
        Path(args.environment).write_text(json.dumps(env, indent=1), encoding="utf-8")
        return 0
    if not (args.results and args.out):
        p.error("give RESULTS and OUT (or --environment OUT)")
    report = build_report(Path(args.results))
    Path(args.out).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    print(json.dumps(report["summary"], indent=1))
    print(f"gpu_report: {args.out} ({len(report['failed_steps'])} failed step(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
