"""Issue 37: every network read has the cache's timeout, not only the cache's own downloads: a
manifest URL that never answers used to be waited on for minutes although ``cache.timeout_s`` was 3."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import fsspec.config
import pytest

from colaflow.network import set_network_timeout
from shards import Manifest
from tests.support.paths import REPO


@pytest.fixture
def stalled(http_server):
    server, base, root = http_server
    (root / "manifest.json").write_text(json.dumps({"format_version": 2, "shards": []}))
    server.faults.stall_s = 30.0
    server.faults.plan["manifest.json"] = ["stall"] * 10
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    yield f"{base}/manifest.json"
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved)


def test_a_manifest_that_never_answers_times_out(stalled):
    set_network_timeout(0.5)
    with pytest.raises(TimeoutError):
        Manifest.load(stalled)


def test_every_command_line_takes_the_timeout_from_the_cache_setting(stalled):
    env = dict(os.environ, PYTHONPATH=str(REPO), COLAFLOW_CACHE_TIMEOUT_S="0.5")
    p = subprocess.run([sys.executable, "-m", "shards", "verify", "-q", stalled], cwd=str(REPO), env=env,
                       capture_output=True, text=True, timeout=25)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 1 and len(lines) == 1 and "Timeout" in lines[0], p.stderr[-2000:]
