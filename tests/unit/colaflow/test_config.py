"""Issue 37: every config value is checked before a run, in one line naming the key or the file:
a string field's form declared beside it, a YAML file or override value YAML cannot read."""
from __future__ import annotations

import pytest

from colaflow.config import ConfigError, check_fields, load_config
from pipelines.config import PipelineConfig
from trainer.config import TrainConfig


@pytest.mark.parametrize("prefix", ["a/b", "*", "", "-x", "../up"])
def test_a_shard_prefix_that_is_no_plain_file_name_is_refused(prefix):
    """``shards.prefix=a/b`` used to fail deep in the run (``No such file or directory: .../a/b-000000.tar``)."""
    cfg = PipelineConfig()
    cfg.shards.prefix = prefix
    with pytest.raises(ConfigError, match=r"shards.prefix=.*: use a string matching \[A-Za-z0-9\]"):
        check_fields(cfg)
    cfg.shards.prefix = "web-v2.en_1"
    check_fields(cfg)


def test_a_config_file_that_is_not_yaml_is_one_error_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=rf"{bad} is not valid YAML at line 3, column 1: .*; fix the file"):
        load_config(TrainConfig, str(bad))
    bad.write_text("- optim\n")
    with pytest.raises(ConfigError, match=rf"{bad} holds a YAML list, not a mapping"):
        load_config(TrainConfig, str(bad))


def test_an_override_value_yaml_cannot_read_is_taken_as_typed():
    """``key=*`` used to end in yaml's ScannerError traceback."""
    assert load_config(TrainConfig, None, ["run_dir=*x"]).run_dir == "*x"
    with pytest.raises(ConfigError, match=r"config key 'optim.lr' needs a float, got '\*'"):
        load_config(TrainConfig, None, ["optim.lr=*"])
