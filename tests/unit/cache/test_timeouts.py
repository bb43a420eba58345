"""Issue 37: every network read has the cache's timeout, not only the cache's own downloads: a
manifest URL that never answers used to be waited on for minutes although ``cache.timeout_s`` was 3."""
from __future__ import annotations

import json

import fsspec.config
import pytest

from colaflow.network import set_network_timeout
from shards import Manifest


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


def test_every_command_line_takes_the_timeout_from_the_cache_setting(stalled, monkeypatch, capsys):
    from colaflow.errors import RUNTIME, guard
    from shards.tools.cli import main

    monkeypatch.setenv("COLAFLOW_CACHE_TIMEOUT_S", "0.5")
    assert guard(lambda: main(["verify", "-q", stalled])) == RUNTIME
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "network read timed out" in lines[0] and "cache.timeout_s" in lines[0], lines
