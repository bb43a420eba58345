"""User mistakes at the command lines end in one clear line, never a traceback."""
import os
import subprocess
import sys

import pytest

from tests.support.data import write_counting_shards
from tests.support.paths import REPO

ROOT = str(REPO)
ENV = dict(os.environ, PYTHONPATH=ROOT)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def test_trainer_reports_unreachable_manifest_and_bad_config(tmp_path):
    p = run("-m", "trainer", "--config", "configs/demo.yaml", "data.manifest=http://127.0.0.1:9/manifest.json",
            f"run_dir={tmp_path}", f"cache.dir={tmp_path / 'cache'}")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "not found or unreachable: http://127.0.0.1:9/manifest.json" in p.stderr and "Cannot connect" in p.stderr
    p = run("-m", "trainer", "--config", "configs/demo.yaml", "zero.stagee=2")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "unknown config key 'zero.stagee'" in p.stderr


@pytest.mark.parametrize("command", ["-m loaders", "-m colaflow loaders"])
def test_closed_pipe_ends_quietly(tmp_path, command):
    write_counting_shards(str(tmp_path), 400, max_samples=50, vocab=64, max_len=40)
    cmd = (f"{sys.executable} {command} keys --shards {tmp_path} --world-size 2 | head -n 2; "
           f"exit ${{PIPESTATUS[0]}}")
    p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert len(p.stdout.splitlines()) == 2


def test_cache_serve_refuses_missing_folder(tmp_path):
    p = run("-m", "cache", "serve", str(tmp_path / "missing"))
    assert p.returncode == 2 and "is not a folder" in p.stderr and "Traceback" not in p.stderr


def test_trainer_refuses_bad_data_settings_and_a_too_small_vocabulary_in_one_line(tmp_path):
    """Loader settings are checked with the config, before any rank starts; a model vocabulary
    smaller than the data's is a config error naming both sizes, not an embedding IndexError."""
    p = run("-m", "trainer", "--config", "configs/demo.yaml", "data.worker_start=banana", f"run_dir={tmp_path}")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "config: data.worker_start='banana': use one of fork, spawn" in p.stderr
    write_counting_shards(str(tmp_path / "data"), 40, max_samples=20, vocab=64, max_len=20)
    p = run("-m", "trainer", "--config", "configs/demo.yaml", f"data.manifest={tmp_path / 'data'}", "model.vocab_size=16",
            f"run_dir={tmp_path / 'run'}", f"cache.dir={tmp_path / 'cache'}", "--dry-run")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "model.vocab_size=16 is below the data's vocabulary (64" in p.stderr


def test_loaders_bench_names_a_missing_manifest(tmp_path):
    p = run("-m", "loaders", "bench", "--shards", str(tmp_path / "nope"))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "python -m loaders bench: not found or unreachable:" in p.stderr


def test_colaflow_commands_end_as_their_python_m_aliases(tmp_path):
    """``colaflow X`` runs the tool's own main: the same exit codes and one-line errors, under its
    colaflow name."""
    out = str(tmp_path / "out")
    for cmd in (["beam_runner.py"], ["-m", "colaflow", "preprocess"]):
        p = run(*cmd, "--input", str(tmp_path / "c.jsonl"), "--output", out, "split.val_fractio=0.1")
        assert p.returncode == 2 and "Traceback" not in p.stderr and not os.path.exists(out)
        assert p.stderr.strip() == "error: config: unknown config key 'split.val_fractio'; did you mean " \
                                   "'split.val_fraction'? valid keys: val_fraction"
    p = run("-m", "colaflow", "loaders", "bench", "--shards", str(tmp_path / "nope"))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("colaflow loaders bench: not found or unreachable:")
    p = run("-m", "colaflow", "cache", "serve", str(tmp_path / "missing"))
    assert p.returncode == 2 and "is not a folder" in p.stderr and "Traceback" not in p.stderr
    p = run("-m", "colaflow", "train")
    assert p.returncode == 2 and p.stderr.startswith("usage: colaflow train ")
    assert "error: give --config FILE and/or key=value overrides (colaflow train --help for more)" in p.stderr
    p = run("-m", "colaflow", "trian", "--config", "configs/demo.yaml")
    assert p.returncode == 2 and "colaflow: error: argument command: invalid choice: 'trian'" in p.stderr
