"""The step loop reads device values on the host only at log steps, at world size 2.

``trainer.train.train`` runs on 2 real gloo ranks (CPU) with every Python-level way of reading a
tensor on the host counted: ``Tensor.item``, ``tolist``, ``cpu`` and the conversions
``bool()``/``float()``/``int()`` of a tensor. On CUDA each of these waits for the device (a host
sync); on CPU they are cheap, but they run in the same places, so counting them on CPU finds the
syncs a GPU run would pay for.

Each read is attributed to the innermost frame inside this repository, data path (``loaders/``,
``cache/``, ``shards/``) included: the loaders' step agreement across ranks (``loaders/rank/steps.py``)
runs before every micro-batch at world size > 1, and must not read a tensor (it sums a
numpy-backed flag on a gloo group). Reads inside
:meth:`trainer.metrics.meter.IntervalMeter.collect` are the log step's sync; reads before the
first step are start-up. Everything else in the loop is a per-step sync and must not exist.
"""
import os
import sys
from collections import Counter

import pytest
import torch

from tests.support.data import write_counting_shards
from trainer.metrics import meter as meter_mod
from trainer import train as train_mod
from trainer.config import TrainConfig
from tests.support.launch import run_local_workers
from tests.support.paths import REPO

ROOT = str(REPO)
VENV = os.path.join(ROOT, ".venv") + os.sep
# not ``numpy``: it raises on a device tensor, so it can only read host memory (a ``.cpu()`` before
# it is counted as the sync it is)
READS = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__")
VOCAB = 64
STEPS, ACCUM, LOG_EVERY, WORLD = 12, 2, 4, 2
# the label range check reads on the host only for CPU tensors (free there); on CUDA it is
# torch._assert_async, which never waits for the device
KNOWN_KERNEL_SYNCS = {("trainer/kernels/__init__.py::_check_ce", "__bool__")}


def _shards(directory: str) -> None:
    write_counting_shards(directory, 100, max_samples=50, vocab=VOCAB, max_len=40, seed=0)


def _repo_site() -> str | None:
    """``path::function`` of the innermost caller inside the repository (not this test or the venv),
    or None for a read that never waits for a device."""
    frame = sys._getframe(2)
    while frame is not None:
        path, func = frame.f_code.co_filename, frame.f_code.co_name
        if path.endswith(os.path.join("torch", "optim", "optimizer.py")) and func == "_get_value":
            return None  # AdamW's step counter lives on the host unless capturable: no device wait
        if path.startswith(ROOT + os.sep) and not path.startswith(VENV) and not path.endswith("test_host_sync.py"):
            return f"{os.path.relpath(path, ROOT)}::{func}"
        frame = frame.f_back
    return None


class SyncRecorder:
    """Counts host reads by phase: ``startup`` (before step 1), ``log`` (inside the meter's collect),
    ``step`` (anything else while the loop runs) and ``end`` (after the last step)."""

    def __init__(self):
        self.phase, self.step = "startup", 0
        self.reads: Counter = Counter()  # (phase, site, name) -> count
        self.steps_with_reads: set[int] = set()

    def record(self, name: str) -> None:
        site = _repo_site()
        if site is None:
            return
        self.reads[(self.phase, site, name)] += 1
        if self.phase == "step":
            self.steps_with_reads.add(self.step)

    def per_step(self) -> dict:
        return {(site, name): n for (phase, site, name), n in self.reads.items() if phase == "step"}


def _instrument(rec: SyncRecorder) -> None:
    """Patch the host reads and the loop's phase markers in this (worker) process."""
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            rec.record(_name)
            return _original(self, *args, **kwargs)
        setattr(torch.Tensor, name, counted)

    step_fn, collect_fn, finish_fn = train_mod.train_step, meter_mod.IntervalMeter.collect, train_mod.finish_run

    def train_step(*args, **kwargs):
        rec.phase, rec.step = "step", rec.step + 1
        return step_fn(*args, **kwargs)

    def collect(self, *args, **kwargs):
        previous, rec.phase = rec.phase, "log"
        try:
            return collect_fn(self, *args, **kwargs)
        finally:
            rec.phase = previous
    def finish_run(*args, **kwargs):  # the run's end (final save, summary) reads once per run, not per step
        rec.phase = "end"
        return finish_fn(*args, **kwargs)
    train_mod.train_step = train_step
    train_mod.finish_run = finish_run
    meter_mod.IntervalMeter.collect = collect


def _worker(tmp: str, stage: int, anomaly: bool, eval_every: int = 0) -> dict:
    cfg = TrainConfig()
    cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads = 32, 1, 2
    cfg.data.manifest, cfg.data.seq_len, cfg.data.micro_batch_size, cfg.data.num_workers = \
        os.path.join(tmp, "shards"), 32, 2, 0
    cfg.cache.dir, cfg.run_dir = os.path.join(tmp, "cache", os.environ["RANK"]), os.path.join(tmp, "run")
    cfg.zero.stage, cfg.device, cfg.precision = stage, "cpu", "fp32"
    cfg.steps, cfg.log_every, cfg.optim.grad_accum_steps = STEPS, LOG_EVERY, ACCUM
    cfg.metrics.progress, cfg.metrics.tensorboard_dir = False, ""
    cfg.checkpoint.save_at_end, cfg.anomaly.enabled = False, anomaly
    if eval_every:
        cfg.eval.manifest, cfg.eval.every = os.path.join(tmp, "val"), eval_every
    rec = SyncRecorder()
    _instrument(rec)
    train_mod.train(cfg)
    rec.phase = "end"
    return {"step": rec.step, "reads": dict(rec.reads), "per_step": rec.per_step(),
            "steps_with_reads": rec.steps_with_reads}


def _run(tmp_path, stage: int, anomaly: bool, eval_every: int = 0) -> list[dict]:
    _shards(str(tmp_path / "shards"))
    if eval_every:
        write_counting_shards(str(tmp_path / "val"), 10, max_samples=10, vocab=VOCAB, max_len=40, seed=1)
    return run_local_workers(_worker, WORLD, str(tmp_path), stage, anomaly, eval_every)


@pytest.mark.parametrize("stage", [0, 3])
def test_step_loop_adds_no_sync_beyond_known_kernel_checks(tmp_path, stage):
    """The loop (train.py, parallel, optim, meter, model, kernels, loaders, cache) reads nothing
    between log steps on either rank; the only per-step read is the kernels' CPU-only label
    check, once per micro-batch."""
    for res in _run(tmp_path, stage, anomaly=False):
        assert res["step"] == STEPS
        assert any(phase == "log" for phase, _, _ in res["reads"])  # the counter sees the log step's sync
        assert res["per_step"] == {site: STEPS * ACCUM for site in KNOWN_KERNEL_SYNCS}, res["per_step"]


def test_anomaly_guard_is_the_one_sync_per_step(tmp_path):
    """With ``anomaly.enabled`` (the default) the guard reads 4 values once per step, by design
    (it decides on the host whether ``optimizer.step()`` runs); the loop adds nothing else."""
    for res in _run(tmp_path, 0, anomaly=True):
        per_step = {k: n for k, n in res["per_step"].items() if k not in KNOWN_KERNEL_SYNCS}
        assert res["steps_with_reads"] == set(range(1, STEPS + 1))
        assert {site.split("::")[0] for site, _ in per_step} == {"trainer/run/anomaly.py"}, per_step
        assert per_step[("trainer/run/anomaly.py::_check", "tolist")] == STEPS


def test_validation_reads_once_per_evaluation_and_nowhere_else(tmp_path):
    """With validation every 5 steps the evaluation's one read (its all-reduced totals) happens at
    steps 5, 10 and 12 (the last) on each rank; the training steps gain no read."""
    for res in _run(tmp_path, 0, anomaly=False, eval_every=5):
        per_step = {k: n for k, n in res["per_step"].items() if k not in KNOWN_KERNEL_SYNCS}
        assert per_step == {("trainer/evaluation/validation.py::evaluate", "tolist"): 3}, per_step
