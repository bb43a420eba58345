"""The preprocessing job on real multi-process engines on 127.0.0.1, compared file by file
(sha256) with the DirectRunner: a Dask cluster (scheduler + 2 worker processes) through
``ColaflowDaskRunner``, and Beam's PortableRunner with an external SDK worker pool whose workers
are booted by ``pipelines/runners/worker_boot.py`` (installs the staged wheel, loads the options)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import PipelineConfig
from examples.demo.corpus import write_corpus
from pipelines.job import run
from tests.support.local_engines import child_env, start_dask, start_worker_pool
from tests.support.paths import REPO
from tests.support.pipeline import synthetic_config

ROOT = REPO
# records per source: one split per file at any size below split_bytes (16 MB), so more records
# exercise no other path; 150 Shakespeare paragraphs still repeat a stage direction (an exact duplicate)
PER_SOURCE = 150


def small_config() -> PipelineConfig:
    cfg = synthetic_config()
    cfg.tokenizer.vocab_size = 600
    cfg.shards.num_shards = 3
    cfg.dedup.near = True
    return cfg


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def direct(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    write_corpus(str(corpus), limit_per_source=PER_SOURCE)
    out = tmp_path_factory.mktemp("direct") / "out"
    stats = run(f"{corpus}/*.jsonl", str(out), small_config())
    return corpus, out, stats


def test_dask_cluster_output_is_byte_identical(direct, tmp_path):
    pytest.importorskip("distributed")
    corpus, expected, direct_stats = direct
    engine = start_dask(tmp_path / "logs", workers=2, env=child_env())
    try:
        stats = run(f"{corpus}/*.jsonl", str(tmp_path / "out"), small_config(),
                    ["--runner=DaskRunner", f"--dask_client_address={engine.address}"])
        logs = engine.log_text()
    finally:
        engine.stop()
    assert digests(tmp_path / "out") == digests(expected)
    assert len(digests(expected)) >= 12  # shards, indexes, manifest, stats, model, listings, report
    assert stats["metrics"] == {}  # no Beam metrics on Dask; the stats come from event records
    assert stats["total"]["input_records"] == 2 * PER_SOURCE and stats["total"]["balanced"]
    assert {k: v for k, v in stats.items() if k not in ("seconds", "metrics")} == {
        k: v for k, v in direct_stats.items() if k not in ("seconds", "metrics")}
    assert logs.count("training sentencepiece") == 1  # trained in a worker process, once


def test_external_worker_pool_installs_the_staged_wheel(direct, tmp_path):
    corpus, expected, _ = direct
    dist, src = tmp_path / "dist", tmp_path / "src"  # built from a copy: no build/ left in the checkout
    for name in ("pyproject.toml", "beam_runner.py"):
        src.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for package in ("colaflow", "pipelines", "shards", "cache", "loaders", "trainer"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(dist), str(src)], check=True, cwd=tmp_path)
    (wheel,) = dist.glob("colaflow-*.whl")
    # The pool runs without site processing and only the dependencies' folder on its path, so
    # colaflow (installed editable here) is not importable there until the boot installs the wheel.
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": site, "HOME": str(tmp_path),
           "COLAFLOW_BOOT_DIR": str(tmp_path / "boot")}
    probe = subprocess.run([sys.executable, "-S", "-c", "import pipelines"], env=env, cwd=tmp_path,
                           capture_output=True)
    assert probe.returncode != 0
    boot = tmp_path / "boot.sh"
    boot.write_text(f'#!/bin/sh\nexec {sys.executable} -S {ROOT / "pipelines" / "runners" / "worker_boot.py"} "$@"\n')
    boot.chmod(0o755)
    engine = start_worker_pool(tmp_path / "logs", [sys.executable, "-S"], str(boot), env)
    try:
        run(f"{corpus}/*.jsonl", str(tmp_path / "out"), small_config(),
            ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
             f"--environment_config={engine.address}", f"--extra_package={wheel}", "--job_name=colaflow-pool-test"])
        logs = engine.log_text()
    finally:
        engine.stop()
    assert digests(tmp_path / "out") == digests(expected)
    installed = list((tmp_path / "boot").glob("*/site/pipelines/job.py"))
    assert installed  # the boot installed the staged wheel ...
    assert not list((tmp_path / "boot").glob("*/site/torch"))  # ... and no dependency already there
    assert "'job_name': 'colaflow-pool-test'" in logs  # the SDK worker loaded the pipeline options


def test_no_module_beside_the_worker_boot_script_shadows_the_standard_library():
    """``worker_boot.py`` runs as a script, so its folder comes first on ``sys.path``: a module there
    named like a standard-library one (``select.py``) replaced it in the SDK worker, and the pool's
    workers died at start while the job waited for them."""
    scripts = ROOT / "pipelines" / "runners"
    names = {p.stem for p in scripts.glob("*.py")}
    assert "worker_boot" in names and "selection" in names
    assert not names & set(sys.stdlib_module_names)
    assert "select" in sys.stdlib_module_names  # what pipelines/runners/select.py shadowed
