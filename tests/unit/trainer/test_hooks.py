"""Step hooks (``hooks:``): a hook named in the config is built on every rank and called before each
step and around the forward of each micro-batch with the right step, micro-batch and rank; a bad
entry is a one-line config error naming it (exit 2 at the command line)."""
import contextlib
import json
import os
import subprocess
import sys

import pytest

from colaflow.config import ConfigError, load_config
from trainer.config import TrainConfig
from trainer.run.hooks import NO_HOOKS, BaseStepHook, StepHook, StepHooks, parse_hooks
from trainer.train import train

from tests.integration.test_trainer_e2e import build_shards
from tests.support.faults import CALL_RECORDER, FAULT_INJECTOR, CallRecorder
from tests.support.launch import run_local_workers
from tests.support.paths import REPO


def _train_worker(cfg: TrainConfig):
    return train(cfg)


def test_a_configured_hook_is_called_at_each_step_and_micro_batch_on_its_rank(tmp_path):
    shards, run = str(tmp_path / "shards"), tmp_path / "run"
    build_shards(shards)
    hooks = json.dumps([{"target": CALL_RECORDER}])
    cfg = load_config(TrainConfig, None, [
        f"data.manifest={shards}", f"run_dir={run}", f"cache.dir={tmp_path / 'cache'}", "model.d_model=32",
        "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=64", "data.seq_len=64", "data.micro_batch_size=1",
        "data.num_workers=0", "steps=3", "log_every=3", "checkpoint.every=0", "zero.stage=0", "device=cpu",
        "optim.grad_accum_steps=2", "metrics.progress=false", "eval.enabled=false", f"hooks={hooks}"])
    results = run_local_workers(_train_worker, 2, cfg)
    assert [r["final_step"] for r in results] == [3, 3]
    with open(run / "events.jsonl") as f:
        calls = [e for e in map(json.loads, f) if e["event"].startswith("hook_")]
    assert all(e["rank"] == e["process_rank"] for e in calls)
    for rank in (0, 1):  # each rank in its own order: before the step, then its two micro-batches
        assert [(e["event"], e["step"], e.get("micro_batch")) for e in calls if e["rank"] == rank] == [
            (kind, step, mb) for step in (1, 2, 3)
            for kind, mb in (("hook_before_step", None), ("hook_forward", 0), ("hook_forward", 1))]
    forwards = [e for e in calls if e["event"] == "hook_forward"]
    # the context wraps exactly one forward of the model as it trains (DDP-wrapped at ZeRO stage 0)
    assert {(e["model"], e["forward_calls"]) for e in forwards} == {("DistributedDataParallel", 1)}


class _Tagged(BaseStepHook):
    def __init__(self, context, tag: str, log: list):
        super().__init__(context)
        self.tag, self.log = tag, log

    @contextlib.contextmanager
    def forward(self, model, step, micro_batch, rank):
        self.log.append(("enter", self.tag, step, micro_batch, rank))
        yield
        self.log.append(("exit", self.tag))

    def describe(self, step, rank):
        return f"{self.tag} at {step} on {rank}" if step == 2 else None


def test_hooks_run_in_config_order_and_say_what_they_did():
    log = []
    hooks = StepHooks([("a:A", _Tagged(None, "a", log)), ("b:B", _Tagged(None, "b", log))])
    with hooks.forward(None, 5, 1, 0):
        log.append("forward")
    assert log == [("enter", "a", 5, 1, 0), ("enter", "b", 5, 1, 0), "forward", ("exit", "b"), ("exit", "a")]
    assert hooks.describe(2, 1) == "a:A: a at 2 on 1; b:B: b at 2 on 1"
    assert hooks.describe(3, 1) is None and NO_HOOKS.describe(2, 0) is None
    assert isinstance(BaseStepHook(None), StepHook) and issubclass(CallRecorder, StepHook)


def test_good_entries_resolve_to_their_classes():
    resolved = parse_hooks([{"target": FAULT_INJECTOR, "args": {"nan_at_steps": [3], "rank": 1}},
                            {"target": CALL_RECORDER}])
    assert [(r.cls.__name__, r.spec.args) for r in resolved] == [("FaultInjector", {"nan_at_steps": [3], "rank": 1}),
                                                                ("CallRecorder", {})]


@pytest.mark.parametrize("entry, says", [
    ({"target": "tests.support.no_such_module:Hook"},
     "hooks[1]: target='tests.support.no_such_module:Hook': cannot import tests.support.no_such_module "
     "(ModuleNotFoundError: No module named 'tests.support.no_such_module')"),
    ({"target": "tests.support.faults:NoSuchHook"},
     "hooks[1]: target='tests.support.faults:NoSuchHook': module tests.support.faults has no 'NoSuchHook'"),
    ({"target": "tests.support.faults"}, "hooks[1]: target='tests.support.faults': use 'package.module:Class'"),
    ({"target": "collections:OrderedDict"},
     "hooks[1]: target='collections:OrderedDict' is not a step hook class (needs before_step, forward and "
     "describe; subclass trainer.run.hooks.BaseStepHook)"),
    ({"target": "tests.support.faults:fault_hooks"}, "hooks[1]: target='tests.support.faults:fault_hooks' is not a "
                                                     "step hook class"),
    ({"target": FAULT_INJECTOR, "args": {"nan_steps": [3]}},
     f"hooks[1]: target='{FAULT_INJECTOR}' does not take args {{'nan_steps': [3]}}: got an unexpected keyword "
     "argument 'nan_steps'"),
    ({"target": FAULT_INJECTOR, "args": [3]}, "hooks[1].args: expected a mapping of FaultInjector's keyword "
                                              "arguments, got [3]"),
    ({"targt": FAULT_INJECTOR}, "unknown config key 'hooks[1].targt'; did you mean 'hooks[1].target'?"),
    (FAULT_INJECTOR, f"hooks[1]: expected a mapping {{target: 'package.module:Class', args: {{...}}}}, "
                     f"got '{FAULT_INJECTOR}'"),
])
def test_a_bad_entry_is_a_one_line_config_error_naming_it(entry, says):
    cfg = TrainConfig(hooks=[{"target": CALL_RECORDER}, entry])
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_bad_entry_ends_the_command_line_with_exit_2(tmp_path):
    hooks = json.dumps([{"target": "tests.support.faults:NoSuchHook"}])
    p = subprocess.run([sys.executable, "-m", "trainer", "--config", str(REPO / "configs" / "demo.yaml"),
                        f"hooks={hooks}", f"run_dir={tmp_path / 'run'}", "--dry-run"], cwd=str(tmp_path),
                       env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.strip() == ("error: config: hooks[0]: target='tests.support.faults:NoSuchHook': module "
                                "tests.support.faults has no 'NoSuchHook'")
    assert not os.path.exists(tmp_path / "run")
