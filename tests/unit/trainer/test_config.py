"""TrainConfig from YAML + overrides, validation, learning-rate schedule."""
import glob
import os

import pytest

from colaflow.config import ConfigError, load_config
from trainer.config import TrainConfig
from trainer.optim import lr_at
from tests.support.paths import REPO

ROOT = str(REPO)
CONFIGS = [os.path.join(ROOT, "configs", "demo.yaml")] + sorted(glob.glob(os.path.join(ROOT, "configs", "train*.yaml")))


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_shipped_configs_load_and_validate(path):
    cfg = load_config(TrainConfig, path)
    cfg.validate()
    assert cfg.model.vocab_size == 0 and cfg.zero.stage in (0, 1, 2, 3)


def test_overrides_reach_nested_sections():
    cfg = load_config(TrainConfig, CONFIGS[0], ["zero.stage=3", "optim.lr=1e-3", "model.norm=layernorm",
                                               "data.seq_len=64", "cache.max_bytes=2GiB", "optim.betas=[0.8, 0.9]",
                                               "activation_checkpointing=true", "steps=7"])
    assert (cfg.zero.stage, cfg.optim.lr, cfg.model.norm) == (3, 1e-3, "layernorm")
    assert (cfg.data.seq_len, cfg.cache.max_bytes, cfg.optim.betas) == (64, "2GiB", [0.8, 0.9])
    assert cfg.activation_checkpointing is True and cfg.steps == 7
    assert cfg.data.manifest == "runs/demo/shards" and cfg.cache.dir == "runs/demo/cache"


def test_unknown_keys_are_rejected_with_valid_names():
    with pytest.raises(ConfigError, match="zero.stag"):
        load_config(TrainConfig, CONFIGS[0], ["zero.stag=2"])


@pytest.mark.parametrize("override,field", [("zero.stage=4", "zero.stage"), ("precision=fp16", "precision"),
                                            ("model.n_heads=3", "model.d_model"), ("device=tpu", "device"),
                                            ("steps=0", "steps")])
def test_validate_names_the_bad_field(override, field):
    cfg = load_config(TrainConfig, CONFIGS[0], [override])
    with pytest.raises(ValueError, match=field):
        cfg.validate()


def test_lr_warmup_then_cosine_to_min():
    cfg = load_config(TrainConfig, None, ["optim.lr=1.0", "optim.min_lr=0.1", "optim.warmup_steps=10"]).optim
    assert lr_at(0, cfg, 110) == pytest.approx(0.1)
    assert lr_at(9, cfg, 110) == pytest.approx(1.0)
    assert lr_at(60, cfg, 110) == pytest.approx(0.55)
    assert lr_at(110, cfg, 110) == pytest.approx(0.1)
    values = [lr_at(s, cfg, 110) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_saved_configs_of_older_runs_drop_their_inject_keys(tmp_path, caplog):
    """Runs written before step hooks saved ``anomaly.inject_*`` (fault-injection knobs since moved to
    tests/support/faults.py) in config.json and every checkpoint's config.yaml; they still load."""
    import json

    from colaflow.config import to_dict
    from trainer.config import read_saved_config
    old = to_dict(TrainConfig(steps=7))
    del old["hooks"]  # older runs had no hooks
    old["anomaly"].update(inject_nan_at_steps=[], inject_spike_at_steps=[], inject_spike_factor=1000.0,
                          inject_kill_at_step=0, inject_rank=-1, inject_layer="")
    quiet = tmp_path / "config.json"
    quiet.write_text(json.dumps(old))
    with caplog.at_level("WARNING", logger="trainer.config"):
        cfg = read_saved_config(str(quiet))
    assert cfg == TrainConfig(steps=7) and caplog.records == []  # the defaults said nothing: no warning
    old["anomaly"].update(inject_nan_at_steps=[3], inject_rank=1, inject_layer="blocks.1.mlp")
    loud = tmp_path / "config.yaml"
    loud.write_text(json.dumps(old))  # YAML reads the JSON as well
    with caplog.at_level("WARNING", logger="trainer.config"):
        cfg = read_saved_config(str(loud))
    assert cfg == TrainConfig(steps=7)
    warning, = [r.getMessage() for r in caplog.records]
    assert warning == (f"{loud}: anomaly.inject_nan_at_steps=[3], anomaly.inject_rank=1, "
                       "anomaly.inject_layer='blocks.1.mlp': test hooks of an older trainer, ignored (the faults "
                       "they injected are not re-applied; a step hook in hooks: does that now)")
    old["anomaly"]["inject_typo"] = 1  # other unknown keys stay errors
    loud.write_text(json.dumps(old))
    with pytest.raises(ConfigError, match="unknown config key 'anomaly.inject_typo'"):
        read_saved_config(str(loud))


def test_a_live_config_rejects_the_removed_inject_keys():
    with pytest.raises(ConfigError, match="unknown config key 'anomaly.inject_nan_at_steps'"):
        load_config(TrainConfig, None, ["anomaly.inject_nan_at_steps=[3]"])
    with pytest.raises(ConfigError, match=r"hooks: expected a list of mappings"):
        TrainConfig(hooks=5).validate()


@pytest.mark.parametrize("override, words", [
    ("optim.min_lr=-1e-4", ["optim.min_lr=-0.0001", ">= 0"]),  # issue 37: trained with a negative rate
    ("optim.lr=0", ["optim.lr=0.0", "> 0"]),
    ("optim.min_lr=0.1", ["optim.min_lr=0.1", "optim.lr=0.005"]),  # a relation: the cosine would rise
    ("optim.weight_decay=-0.1", ["optim.weight_decay"]),
    ("optim.betas=[0.9, 1.5]", ["optim.betas", "[0, 1)"]),
    ("optim.warmup_steps=-1", ["optim.warmup_steps"]),
    ("optim.grad_clip=-1", ["optim.grad_clip"]),
    ("model.max_seq_len=0", ["model.max_seq_len"]),
    ("model.rope_theta=0", ["model.rope_theta"]),
    ("model.norm_eps=-1e-5", ["model.norm_eps"]),
    ("model.ffn_mult=0", ["model.ffn_mult"]),
    ("data.seq_len=1", ["data.seq_len=1", ">= 2"]),
    ("data.num_workers=-1", ["data.num_workers"]),
    ("cache.timeout_s=0", ["cache.timeout_s"]),
    ("cache.backoff_s=-1", ["cache.backoff_s"]),
    ("anomaly.spike_ratio=0.5", ["anomaly.spike_ratio"]),
    ("anomaly.spike_warmup=-2", ["anomaly.spike_warmup"]),
    ("zero.bucket_cap_mb=0", ["zero.bucket_cap_mb"]),
    ("metrics.peak_flops=-1", ["metrics.peak_flops"]),
    ("profile.active=0", ["profile.active"]),
])
def test_every_out_of_range_value_is_one_named_error(override, words):
    """Issue 37: ranges are declared beside each field and checked in one pass (and relations between fields)."""
    with pytest.raises(ValueError) as e:
        load_config(TrainConfig, CONFIGS[0], [override]).validate()
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


def test_the_trainer_flags_may_follow_the_overrides(capsys):
    """``colaflow train key=value --dry-run key=value`` was refused as ``unrecognized arguments``."""
    from trainer.run.cli import main
    assert main(["steps=2", "--dry-run", "log_every=0"]) == 2
    assert "log_every=0: use a number >= 1" in capsys.readouterr().err


def test_bf16_on_a_cpu_without_bf16_kernels_is_warned_about():
    """A new user's demo trained in bf16 on an AVX2 CPU, emulated and 2x slower than fp32, silently."""
    import torch

    from trainer.distributed.parallel import cpu_has_bf16, precision_warning
    cpu = torch.device("cpu")
    warning = precision_warning(cpu, "bf16")
    assert (warning is None) == cpu_has_bf16()
    assert warning is None or "set precision=fp32" in warning
    assert precision_warning(cpu, "fp32") is None and precision_warning(torch.device("meta"), "bf16") is None
