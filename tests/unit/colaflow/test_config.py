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


# Issue: a new user's bad input was accepted and misread, or refused with a misleading message.

def test_a_list_field_refuses_a_scalar_and_checks_its_elements():
    """``language.allowed=en`` used to be taken as the "list" ``"en"``: membership became a substring
    test and ``language.enabled=true`` filtered every English document as ``lang_en``."""
    with pytest.raises(ConfigError, match=r"^language.allowed: needs a list, e\.g\. language.allowed=\[en\]"):
        load_config(PipelineConfig, None, ["language.enabled=true", "language.allowed=en"])
    assert load_config(PipelineConfig, None, ["language.allowed=[en, de]"]).language.allowed == ["en", "de"]
    with pytest.raises(ConfigError, match=r"'language.allowed\[1\]' needs a str, got False .*quote the word"):
        load_config(PipelineConfig, None, ["language.allowed=[en, no]"])  # YAML 1.1: no = false
    with pytest.raises(ConfigError, match=r"^optim.betas: needs a list, e\.g\. optim.betas=\[0\.9\]"):
        load_config(TrainConfig, None, ["optim.betas=0.9"])
    with pytest.raises(ConfigError, match=r"'optim.betas\[1\]' needs a float, got 'x'"):
        load_config(TrainConfig, None, ["optim.betas=[0.9, x]"])
    assert load_config(TrainConfig, None, ["optim.betas=[0.9, '1e-1']"]).optim.betas == [0.9, 0.1]
    with pytest.raises(ConfigError, match=r"^hooks: needs a list"):
        load_config(TrainConfig, None, ["hooks=x"])


def test_a_mapping_field_refuses_a_scalar():
    with pytest.raises(ConfigError, match=r"^decontam.eval_sets: needs a mapping, e\.g\. decontam.eval_sets=\{"):
        load_config(PipelineConfig, None, ["decontam.eval_sets=evals/*.jsonl"])
    with pytest.raises(ConfigError, match=r"^quality.repetition.max_top_ngram: needs a mapping"):
        load_config(PipelineConfig, None, ["quality.repetition.max_top_ngram=0.2"])


def test_typed_list_tuple_dict_and_optional_fields(tmp_path):
    from dataclasses import dataclass, field

    from colaflow.config import from_dict

    @dataclass
    class Conf:
        ids: list[int] = field(default_factory=list)
        pair: tuple[int, str] = (0, "")
        many: tuple[float, ...] = ()
        table: dict[str, int] = field(default_factory=dict)
        path: str | None = None
        size: int | str = 0

    c = from_dict(Conf, {"ids": [1, "2"], "pair": [3, 4], "many": [1], "table": {"a": "5"}, "size": "1GB"})
    assert (c.ids, c.pair, c.many, c.table, c.path, c.size) == ([1, 2], (3, "4"), (1.0,), {"a": 5}, None, "1GB")
    with pytest.raises(ConfigError, match=r"'ids\[0\]' needs an int, got 'x'"):
        from_dict(Conf, {"ids": ["x"]})
    with pytest.raises(ConfigError, match=r"^pair: needs a list of 2 values, got 1"):
        from_dict(Conf, {"pair": [1]})
    with pytest.raises(ConfigError, match=r"^many: needs a list"):
        from_dict(Conf, {"many": 1.0})
    with pytest.raises(ConfigError, match=r"'table.a' needs an int"):
        from_dict(Conf, {"table": {"a": "x"}})
    with pytest.raises(ConfigError, match=r"'size' is empty: give an int or str"):
        from_dict(Conf, {"size": None})


def test_every_shipped_config_still_loads():
    """The stricter types must not refuse what ``configs/*.yaml`` hold."""
    import glob
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    loaded = 0
    for path in sorted(glob.glob(os.path.join(root, "configs", "*.yaml"))):
        cls = PipelineConfig if os.path.basename(path) == "pipeline.yaml" else TrainConfig
        load_config(cls, path).validate()
        loaded += 1
    assert loaded >= 4


def test_a_section_given_a_value_names_the_section_without_a_stray_dot():
    with pytest.raises(ConfigError, match=r"^tokenizer: expected a mapping, got int$"):
        load_config(PipelineConfig, None, ["tokenizer=3"])


def test_an_empty_override_value_is_called_empty():
    """``tokenizer.vocab_size=`` used to say ``needs an int, got None``."""
    with pytest.raises(ConfigError, match=r"'tokenizer.vocab_size' is empty: give an int, e\.g\. tokenizer.vocab_size="):
        load_config(PipelineConfig, None, ["tokenizer.vocab_size="])
    with pytest.raises(ConfigError, match=r"^language.allowed: empty; give a list"):
        load_config(PipelineConfig, None, ["language.allowed="])
    assert load_config(PipelineConfig, None, ["tokenizer.path="]).tokenizer.path is None  # optional: unset


def test_a_missing_config_file_is_one_line_naming_the_flag(tmp_path):
    """``--config nonexist.yaml`` used to print the raw ``[Errno 2] No such file or directory``."""
    missing = tmp_path / "nonexist.yaml"
    with pytest.raises(ConfigError, match=rf"^--config {missing}: no such file"):
        load_config(PipelineConfig, str(missing))
    with pytest.raises(ConfigError, match=rf"^--config {tmp_path}: is a folder"):
        load_config(PipelineConfig, str(tmp_path))


def test_a_config_file_that_is_a_list_gets_an_example_of_its_own_command(tmp_path):
    """A preprocessing YAML that is a list used to get the training example ``optim: {lr: 3e-4}``."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("- input\n")
    with pytest.raises(ConfigError) as info:
        load_config(PipelineConfig, str(bad))
    assert "optim" not in str(info.value) and "(e.g. input: {" in str(info.value)
    with pytest.raises(ConfigError, match=r"\(e\.g\. model: \{"):
        load_config(TrainConfig, str(bad))
