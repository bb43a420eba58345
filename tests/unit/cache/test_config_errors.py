"""Bad ``cache:`` settings end in one line naming the key and what to do, exit 2, never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cache.config import CacheConfig, load_cache_config
from cache.tools.cli import main
from colaflow.config import ConfigError
from tests.support.paths import REPO

NODES_HINT = "must be a mapping {host pattern: {key: value}}"


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_nodes_that_is_not_a_mapping_is_refused_from_yaml_and_set(tmp_path, capsys):
    (tmp_path / "b.yaml").write_text(f"cache:\n  dir: {tmp_path / 'x'}\n  nodes: [a, b]\n")
    rc, _, err = _cli(capsys, "status", "--config", str(tmp_path / "b.yaml"))
    assert "cache.nodes=['a', 'b']" in _one_line_error(rc, err) and NODES_HINT in err
    rc, out, err = _cli(capsys, "status", "--dir", str(tmp_path / "c"), "--set", "nodes=abc")
    assert "cache.nodes='abc'" in _one_line_error(rc, err) and NODES_HINT in err and not out
    with pytest.raises(ConfigError, match="cache.nodes=3"):
        CacheConfig(nodes=3)
    assert CacheConfig(nodes=None).resolved(hostname="h", environ={}).nodes == {}  # an empty `nodes:` in YAML


def test_train_refuses_nodes_that_is_not_a_mapping(tmp_path):
    p = subprocess.run([sys.executable, "-m", "colaflow", "train", "--config", "configs/demo.yaml",
                        f"data.manifest={tmp_path / 'missing'}", "cache.nodes=abc", f"run_dir={tmp_path / 'run'}",
                        "--dry-run"], cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "cache.nodes='abc'" in p.stderr and NODES_HINT in p.stderr


def test_a_pattern_whose_value_is_not_a_mapping_is_refused_even_when_it_does_not_match():
    with pytest.raises(ConfigError, match=r'cache.nodes\["gpu-\*"\]=3: .*mapping'):
        CacheConfig(nodes={"gpu-*": 3})
    with pytest.raises(ConfigError, match=r"cannot itself hold 'nodes'"):
        CacheConfig(nodes={"gpu-*": {"nodes": {}}})


def test_a_bad_key_under_a_pattern_names_the_pattern(tmp_path, capsys):
    (tmp_path / "n.yaml").write_text(f"cache:\n  dir: {tmp_path / 'x'}\n  nodes:\n    '*': {{max_sise: 1}}\n")
    rc, _, err = _cli(capsys, "status", "--config", str(tmp_path / "n.yaml"))
    assert "unknown config key 'cache.nodes[\"*\"].max_sise'" in _one_line_error(rc, err)
    with pytest.raises(ConfigError, match=r'cache.nodes\["gpu-\*"\].max_bytes: size .banana.'):
        load_cache_config(None, ["nodes={'gpu-*': {max_bytes: banana}}"], hostname="cpu-1", environ={})
    with pytest.raises(ConfigError, match=r'cache.nodes\["gpu-\*"\].retries=-1: use'):
        CacheConfig(nodes={"gpu-*": {"retries": -1}})
    with pytest.raises(ConfigError, match=r"did you mean 'cache.nodes\[\"gpu-\*\"\].max_bytes'"):
        CacheConfig(nodes={"gpu-*": {"max_byte": 1}})


@pytest.mark.parametrize("rate", ["-5", "0", "nan"])
def test_tune_refuses_a_rate_that_is_not_positive(tmp_path, capsys, rate):
    rc, out, err = _cli(capsys, "tune", str(tmp_path / "manifest.json"), "--consume-mbps", rate,
                        "--dir", str(tmp_path / "c"))
    assert f"--consume-mbps {rate}" in _one_line_error(rc, err) and "> 0" in err and not out


@pytest.mark.parametrize("size", ["0", "0GiB"])
def test_max_bytes_must_be_positive(tmp_path, capsys, size):
    rc, out, err = _cli(capsys, "status", "--dir", str(tmp_path / "c"), "--set", f"max_bytes={size}")
    assert "cache.max_bytes" in _one_line_error(rc, err) and "> 0" in err and not out


def test_set_typo_gets_a_did_you_mean(tmp_path, capsys):
    rc, _, err = _cli(capsys, "status", "--dir", str(tmp_path / "c"), "--set", "max_byte=1GiB")
    assert "unknown config key 'cache.max_byte'; did you mean 'cache.max_bytes'?" in _one_line_error(rc, err)
