"""Cache config: human sizes, validation, node-pattern and environment overrides, YAML loading."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache import CacheConfig, load_cache_config, parse_size
from cache.config import format_size
from colaflow.config import ConfigError


@pytest.mark.parametrize("text,expected", [
    (0, 0), (123, 123), ("123", 123), ("1KiB", 1024), ("1.5 MiB", 1572864), ("200GiB", 200 * 2**30),
    ("2TB", 2 * 10**12), ("10mb", 10**7), ("1k", 1000), ("3 B", 3),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "12 parsecs", "-1", -5, "1..2GiB", True])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["", "B", "KiB", "MiB", "GiB", "kB", "MB", "GB"]))
def test_parse_size_units_scale(n, unit):
    scale = {"": 1, "B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30, "kB": 1000, "MB": 10**6, "GB": 10**9}[unit]
    assert parse_size(f"{n}{unit}") == n * scale
    assert parse_size(f"{n} {unit.lower()}") == n * scale


def test_format_size():
    assert format_size(512) == "512B"
    assert format_size(3 * 2**30) == "3.0GiB"


def test_config_validation():
    with pytest.raises(ConfigError, match="verify"):
        CacheConfig(verify="sometimes")
    with pytest.raises(ConfigError, match="max_bytes"):
        CacheConfig(max_bytes="lots")
    cfg = CacheConfig(max_bytes="2GiB", min_free_bytes="1MB")
    assert (cfg.max_bytes_int, cfg.min_free_bytes_int) == (2 * 2**30, 10**6)


def test_node_and_env_overrides():
    cfg = CacheConfig(max_bytes="1GiB", nodes={"gpu-*": {"max_bytes": "3TiB", "prefetch_shards": 8},
                                               "gpu-7": {"dir": "/nvme7"}})
    r = cfg.resolved(hostname="gpu-7", environ={})
    assert (r.max_bytes, r.prefetch_shards, r.dir) == ("3TiB", 8, "/nvme7")
    assert cfg.resolved(hostname="cpu-1", environ={}).max_bytes == "1GiB"
    env = {"COLAFLOW_CACHE_DIR": "~/x", "COLAFLOW_CACHE_MAX_BYTES": "5GiB", "COLAFLOW_CACHE_VERIFY": "always",
           "COLAFLOW_CACHE_RETRIES": "7", "OTHER": "1"}
    r = cfg.resolved(hostname="gpu-7", environ=env)  # environment beats node patterns
    assert (r.dir, r.max_bytes, r.verify, r.retries, r.prefetch_shards) == ("~/x", "5GiB", "always", 7, 8)
    with pytest.raises(ConfigError, match="COLAFLOW_CACHE_MAX_BYTE"):
        cfg.resolved(hostname="x", environ={"COLAFLOW_CACHE_MAX_BYTE": "1"})
    with pytest.raises(ConfigError, match=r"environment variable COLAFLOW_CACHE_MAX_BYTES='banana': .*not a byte size"):
        cfg.resolved(hostname="x", environ={"COLAFLOW_CACHE_MAX_BYTES": "banana"})


def test_load_cache_config_from_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  seq_len: 128\ncache:\n  max_bytes: 64MiB\n  nodes:\n    'node*': {verify: never}\n")
    cfg = load_cache_config(str(path), ["cache.retries=2", "timeout_s=3"], hostname="node3", environ={})
    assert (cfg.max_bytes_int, cfg.verify, cfg.retries, cfg.timeout_s) == (64 * 2**20, "never", 2, 3)
    (tmp_path / "c.yaml").write_text("max_bytes: 1MiB\n")
    assert load_cache_config(str(tmp_path / "c.yaml"), hostname="h", environ={}).max_bytes == "1MiB"
    with pytest.raises(ConfigError, match="unknown config key"):
        load_cache_config(None, ["cache.max_byte=1"], hostname="h", environ={})
