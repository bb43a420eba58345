"""The training loop: data -> model -> ZeRO wrapper -> optimizer -> steps -> metrics -> checkpoints
(drawn in ``trainer/README.md``).
"""
from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from colaflow.config import to_dict
from loaders.protocols import RankLoader, ShardSource
from loaders.rank.batch import TokenBatch
from shards.format.tokens import check_token_ids
from trainer import checkpointing as ckpt
from trainer import attention, memory, pretrained
from trainer.config import TrainConfig
from trainer.distributed import parallel
from trainer.evaluation import Evaluation, evaluation_summary, maybe_evaluate
from trainer.metrics.hardware import HardwareMonitor
from trainer.metrics.meter import IntervalMeter
from trainer.metrics.mfu import flops_per_token, matmul_parameters, peak_flops
from trainer.metrics.model_stats import LayerStats
from trainer.metrics.profiling import StepProfiler
from trainer.metrics.sinks import MetricsLogger
from trainer.metrics.sources import source_fields
from trainer.model import GPT, count_parameters
from trainer.optim import clip_grad_norm, lr_at, set_lr
from trainer.run.announce import data_summary, start_line
from trainer.run.anomaly import AnomalyGuard
from trainer.run.events import EventLog
from trainer.run.folder import checkpoint_root, prepare_run
from trainer.run.hooks import NO_HOOKS, HookContext, StepHooks
from trainer.run.origins import check_resume_tokenizer, resolve_model


def build_data(cfg: TrainConfig, info: parallel.DistInfo) -> tuple[ShardSource, RankLoader]:
    """Per-rank shard cache and text loader (imported here so the trainer imports without them)."""
    from cache import ShardCache
    from loaders import build_text_loader
    cache = ShardCache(cfg.cache)
    return cache, build_text_loader(cfg.data, cache, info.rank, info.world_size)


def loader_state(loader: RankLoader, epoch: int) -> dict:
    """All ranks' loader state merged (a collective when ``torch.distributed`` is initialised)."""
    return {"epoch": epoch, "loader": loader.global_state_dict()}


class NoDataError(RuntimeError):
    """A whole epoch produced no batch (every shard failed, or all samples were empty)."""


class RollbackError(RuntimeError):
    """Too many bad steps in a row and no finished checkpoint to roll back to (a run error: exit 1)."""


def micro_batches(loader: RankLoader, epoch: int, vocab_size: int = 0):
    """Endless stream of ``(epoch, TokenBatch)``, calling ``loader.set_epoch`` at each new epoch
    (a loader restored mid-epoch continues where its state points). Each batch's token ids are
    checked against ``vocab_size`` (the model's embedding rows; 0 = unchecked) on the host, before
    the batch reaches the device, where an id past the embedding fails in an ``IndexError``.

    Raises:
        NoDataError: an epoch read from its start yields no batch.
        shards.format.tokens.TokenRangeError: a batch holds an id at or above ``vocab_size``.
    """
    while True:
        loader.set_epoch(epoch)
        # a resumed epoch may hold only empty documents after its last batch: then go on with the next
        resumed = loader.consumed > 0
        empty = True
        for batch in loader:
            empty = False
            check_token_ids(batch.host_ids, vocab_size, lambda: f"training batch of {', '.join(batch.keys[:3])}")
            yield epoch, batch
        if empty and not resumed:
            raise NoDataError(
                f"the loader yielded no batch in epoch {epoch}; the errors logged above name the shards. Common causes: "
                "cache.max_bytes smaller than one shard, an unreachable data.manifest, corrupt shards "
                "(python -m shards verify DIR), or every document empty")
        epoch += 1


def forward_backward(model, batches: list[TokenBatch], info: parallel.DistInfo, cfg: TrainConfig,
                     timer=None, hooks: StepHooks = NO_HOOKS, step: int = 0):
    """Accumulate gradients of the mean loss over every real token of ``batches`` on all ranks: each
    micro-batch backpropagates ``loss_sum * world_size / global_tokens`` (DDP and FSDP average
    gradients over ranks), so every token weighs the same wherever it falls.

    Returns device tensors ``(loss_sum, local_tokens)``: this rank's summed loss (nats) and its
    real-token count. One all-reduce of the token count (``timer`` mark ``comm``); no host sync.
    Each micro-batch's forward runs inside ``hooks.forward(model, step, i, rank)``.
    """
    local_tokens = sum((b.labels != -100).sum() for b in batches).to(info.device)
    global_tokens = local_tokens.clone()
    dist.all_reduce(global_tokens)
    if timer is not None:
        timer.mark("comm")
    scale = info.world_size / global_tokens.clamp(min=1).float()
    loss_sum = torch.zeros((), device=info.device)
    for i, b in enumerate(batches):
        with parallel.set_grad_sync(model, i == len(batches) - 1):
            with hooks.forward(model, step, i, info.rank), \
                    parallel.autocast(info.device, cfg.precision, cfg.zero.stage):
                loss = model(b.input_ids, b.position_ids, b.document_ids, b.labels, b.one_document_rows)
            (loss * scale).backward()
        loss_sum += loss.detach().float()
    return loss_sum, local_tokens


def train_step(model, optimizer, batches: list[TokenBatch], info: parallel.DistInfo, cfg: TrainConfig,
               timer=None, guard: AnomalyGuard | None = None, step: int = 0, stats: LayerStats | None = None,
               hooks: StepHooks = NO_HOOKS):
    """:func:`forward_backward`, clip, optimizer step. Returns device tensors
    ``(loss_sum, local_tokens, grad_norm)`` (pre-clip global gradient norm). No host sync.
    ``timer`` (a :class:`trainer.metrics.timing.StepTimer`) gets marks ``comm``,
    ``forward_backward``, ``comm`` (clipping and the guard) and ``optimizer``.
    With a ``guard`` the step (``step``: 1-based number) is checked first and skipped when bad
    (``guard.applied`` says which; this costs one small all-reduce and one host read).
    ``stats`` (armed on logged steps) records per-layer gradient norms and update sizes.
    ``hooks.before_step(step, rank)`` runs first."""
    hooks.before_step(step, info.rank)
    loss_sum, local_tokens = forward_backward(model, batches, info, cfg, timer, hooks, step)
    if timer is not None:
        timer.mark("forward_backward")
    if stats is not None:
        stats.before_step()
    grad_norm = clip_grad_norm(list(model.parameters()), cfg.optim.grad_clip)
    keys = itertools.chain.from_iterable(b.keys for b in batches)  # read only if the step is reported
    apply = guard is None or guard.check(step, loss_sum, local_tokens, grad_norm, keys)
    if timer is not None:
        timer.mark("comm")
    if apply:
        optimizer.step()
    if stats is not None:
        stats.after_step()
    optimizer.zero_grad(set_to_none=True)
    if timer is not None:
        timer.mark("optimizer")
    return loss_sum, local_tokens, grad_norm


def build_model(cfg: TrainConfig, info: parallel.DistInfo, init: pretrained.Pretrained | None = None):
    """Model on the device (same seed on every rank, so FSDP shards one identical init), wrapped for
    ``zero.stage``, given the weights of ``init`` when set (rank 0 reads them, every rank receives
    its part), plus a fresh optimizer."""
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model).to(info.device)
    model.set_activation_checkpointing(cfg.activation_checkpointing)
    model.set_activation_offload(cfg.memory.offload_activations)
    if cfg.compile:
        for block in model.blocks:
            block.compile()
    wrapped = parallel.wrap_model(model, cfg.zero, info, cfg.precision)
    if init is not None:
        pretrained.load_into(wrapped, init, cfg.model)
    optimizer = parallel.build_optimizer(wrapped, cfg.zero.stage, cfg.optim.lr, cfg.optim.betas,
                                         cfg.optim.weight_decay)
    return model, wrapped, optimizer


def build_checkpointer(cfg: TrainConfig, info: parallel.DistInfo, root: str,
                       init_from: dict | None = None, tokenizer: dict | None = None) -> ckpt.Checkpointer:
    """Checkpoints of this run (verified from the stored bytes before they become visible);
    ``init_from``: the pretrained weights' fingerprint and ``tokenizer`` the data's
    (:func:`trainer.run.origins.resolve_vocab_size`), both recorded in every ``meta.json``."""
    return ckpt.Checkpointer(root, info.device, cfg.precision, cfg.zero.stage,
                             cfg.model.vocab_size, min(cfg.data.seq_len, cfg.model.max_seq_len), to_dict(cfg),
                             cfg.checkpoint.keep_last, cfg.checkpoint.async_save, init_from, tokenizer)


def roll_back(ckpts: ckpt.Checkpointer, model, optimizer, guard: AnomalyGuard, step: int,
              micro_batches_per_step: int) -> int:
    """Reload the newest finished full checkpoint (model, optimizer, RNG; the loader keeps going
    forward) after ``guard.max_consecutive`` bad steps; returns the step to continue from. The good
    steps undone are counted (``micro_batches_per_step``: all ranks' micro-batches of one step).

    Raises:
        RollbackError: there is no checkpoint to go back to.
    """
    ckpts.wait()
    path = ckpt.latest_checkpoint(ckpts.root)
    if path is None:
        raise RollbackError(f"{guard.consecutive} bad steps in a row at step {step} and no checkpoint to roll back "
                           "to; set checkpoint.every, lower optim.lr or inspect events.jsonl")
    restored = ckpt.restore(path, model, optimizer)
    guard.rolled_back(step, restored.step, path, micro_batches_per_step)
    return restored.step


@dataclass
class Run:
    """Everything one training run holds between steps (built by :func:`start_run`)."""
    cfg: TrainConfig
    info: parallel.DistInfo
    cache: ShardSource
    loader: RankLoader
    model: torch.nn.Module  # the bare GPT (parameter counts, FLOPs)
    wrapped: torch.nn.Module  # the ZeRO-wrapped model that trains
    optimizer: torch.optim.Optimizer
    ckpts: ckpt.Checkpointer
    guard: AnomalyGuard
    hooks: StepHooks
    log: MetricsLogger | None = None  # sinks are built after a resume sets ``step``
    meter: IntervalMeter | None = None
    profiler: StepProfiler | None = None
    layer_stats: LayerStats | None = None
    step: int = 0
    epoch: int = 0
    first_step: int = 0
    tokens_seen: int = 0  # real tokens, all ranks, of the logged intervals
    loss_first: float | None = None
    loss_last: float | None = None
    saved: str | None = None  # newest checkpoint folder this run wrote
    init_from: dict | None = None  # {path, kind, sha256} of the pretrained weights (rank 0; None: random init)
    folder_lock: object = None  # rank 0's lock on run_dir (trainer.run.folder.lock_run_folder), released at the end
    evaluation: Evaluation | None = None  # built by the first maybe_evaluate

    def is_log_step(self, step: int) -> bool:
        """Whether optimizer step ``step`` (1-based) ends a log interval (``log_every``, the last, the first)."""
        return step % self.cfg.log_every == 0 or step == self.cfg.steps or step == self.first_step + 1

    def trainer_state(self) -> dict:
        """Trainer-side state saved in checkpoints beside model, optimizer and loader."""
        return {"anomaly": self.guard.state_dict()}


def resume(run: Run, path: str) -> None:
    """Restore model, optimizer, RNG, anomaly state and loader position from checkpoint ``path``."""
    restored = ckpt.restore(path, run.wrapped, run.optimizer)
    run.step = run.first_step = restored.step
    run.guard.load_state_dict((restored.trainer_state or {}).get("anomaly"))
    run.guard.events.write({"event": "resume", "step": run.step, "rank": run.info.rank, "checkpoint": path,
                            "rng_restored": restored.rng_restored, "world_size": run.info.world_size,
                            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))})
    if restored.loader_state is not None:
        run.loader.load_state_dict(restored.loader_state["loader"])
        run.epoch = run.loader.epoch


def start_run(cfg: TrainConfig) -> Run:
    """Validate ``cfg``, join the process group, build data, model, optimizer, checkpointer and
    metric sinks; resume, refuse or overwrite per :func:`trainer.run.folder.plan_run`, and print
    the run's start line (:mod:`trainer.run.announce`).

    Raises:
        trainer.run.folder.RunFolderError: ``run_dir`` holds a run this config must not continue.
    """
    cfg.validate()
    memory.configure_cuda_allocator(cfg.memory.expandable_segments)  # before the first CUDA allocation
    info = parallel.init_distributed(cfg.device)
    attention.check_trainable(cfg.model.attention, info.device)
    origins = resolve_model(cfg)
    source = origins.pretrained
    plan = prepare_run(cfg, info.is_main)
    init = source if plan.checkpoint is None else None  # a resumed run's weights are in its checkpoint
    meta = ckpt.read_meta(plan.checkpoint) if plan.checkpoint else {}
    if plan.checkpoint:
        check_resume_tokenizer(meta, origins.tokenizer, plan.checkpoint)
    origin = None
    if source is not None and info.is_main:
        origin = source.fingerprint() if init is not None else meta.get("init_from")
    if info.is_main:
        print(start_line(cfg, data_summary(cfg.data), info.world_size, plan, init=init), flush=True)
        slow = parallel.precision_warning(info.device, cfg.precision)
        if slow:  # beside the start line: stderr stays for errors, one line each
            print(slow, flush=True)
    cache, loader = build_data(cfg, info)
    model, wrapped, optimizer = build_model(cfg, info, init)
    run = Run(cfg, info, cache, loader, model, wrapped, optimizer,
              build_checkpointer(cfg, info, checkpoint_root(cfg), origin, origins.tokenizer),
              AnomalyGuard(cfg.anomaly, cfg.run_dir, info.rank, info.device),
              StepHooks.build(cfg.hooks, HookContext(cfg.run_dir, EventLog.of_run(cfg.run_dir))), init_from=origin)
    run.folder_lock = plan.lock
    if plan.checkpoint:
        resume(run, plan.checkpoint)
    if info.is_main:
        os.makedirs(cfg.run_dir, exist_ok=True)
        with open(os.path.join(cfg.run_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(to_dict(cfg), f, indent=2)
    run.log = MetricsLogger.from_config(cfg.metrics, cfg.run_dir, cfg.steps, info.is_main, run.step,
                                        (cache.registry,) if cache.registry is not None else ())
    run.layer_stats = LayerStats(model, cfg.metrics.layer_stats, info.device, info.world_size)
    run.meter = IntervalMeter(info.device, info.world_size,
                              flops_per_token(matmul_parameters(model), cfg.model, cfg.data.seq_len),
                              peak_flops(cfg.metrics.peak_flops, info.device), cache, loader, run.layer_stats,
                              HardwareMonitor(info.device, cfg.metrics.hardware and info.is_main))
    run.profiler = StepProfiler(cfg.profile, cfg.run_dir, info.rank, info.device)
    return run


def log_interval(run: Run, lr: float, acc_loss: torch.Tensor, acc_tokens: torch.Tensor, grad_norm) -> None:
    """The interval's one host sync: collect metrics from all ranks (with the per-layer statistics of
    the interval's last step and the hardware metrics), log them, reset the accumulators."""
    record = run.meter.collect(run.step, run.epoch, lr, acc_loss, acc_tokens, grad_norm,
                               run.guard.skipped_nonfinite + run.guard.skipped_spikes)
    record.update(source_fields(run.loader, run.info.world_size))  # tokens per source of a data.mixture
    run.tokens_seen += record["tokens"]
    if record["loss"] is not None:  # None: every step of the interval was skipped
        run.loss_first = record["loss"] if run.loss_first is None else run.loss_first
        run.loss_last = record["loss"]
    run.log.log(record)
    acc_loss.zero_()
    acc_tokens.zero_()


def save_checkpoints(run: Run) -> None:
    """Full and weights-only checkpoints due at this step (``checkpoint.every``/``weights_every``)."""
    cfg, step = run.cfg.checkpoint, run.step
    if cfg.every and step % cfg.every == 0 and step < run.cfg.steps:
        run.saved = run.ckpts.save(step, run.wrapped, run.optimizer, loader_state(run.loader, run.epoch),
                                   run.trainer_state())
        run.guard.checkpointed()
    if cfg.weights_every and step % cfg.weights_every == 0:
        run.ckpts.save(step, run.wrapped, None, kind="weights")


def finish_run(run: Run, elapsed: float) -> dict:
    """Final checkpoint, close sinks, write and print the summary (``elapsed``: loop wall seconds)."""
    cfg, info = run.cfg, run.info
    if cfg.checkpoint.save_at_end and run.step > run.first_step:
        run.saved = run.ckpts.save(run.step, run.wrapped, run.optimizer, loader_state(run.loader, run.epoch),
                                   run.trainer_state())
    run.ckpts.close()
    run.log.close()
    bad = torch.tensor([run.loader.metrics().get("bad", 0)], dtype=torch.long, device=info.device)
    if dist.is_available() and dist.is_initialized() and info.world_size > 1:
        dist.all_reduce(bad)  # on the run's device: NCCL reduces no host tensor
    skipped = int(bad.item())
    summary = {"train_steps": run.step - run.first_step, "final_step": run.step, "world_size": info.world_size,
               "loss_first": run.loss_first, "loss_last": run.loss_last, "tokens_seen": run.tokens_seen,
               "tokens_per_second": run.tokens_seen / elapsed if elapsed > 0 else 0.0,
               "checkpoint": run.saved, "parameters": count_parameters(run.model), "anomalies": run.guard.summary(),
               "cache": run.cache.metrics(), "loader": run.loader.metrics(), "init_from": run.init_from,
               "skipped_documents": skipped, **evaluation_summary(run)}
    if info.is_main:
        with open(os.path.join(cfg.run_dir, "train_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, default=str)
        if run.loss_first is None:
            print(f"nothing to train: the run is already at step {run.step} of steps={cfg.steps}")
        else:
            lost = run.guard.summary()
            rolled = (f"; {lost['rollbacks']} rollback(s) undid {lost['good_steps_lost']} good steps "
                      f"({lost['good_micro_batches_lost']} micro-batches not revisited)" if lost["rollbacks"] else "")
            unread = (f"; skipped {skipped:,} unreadable document(s) of corrupt or missing shards (named in the "
                      "errors above; colaflow shards verify checks them)" if skipped else "")
            print(f"trained {summary['train_steps']} steps on {info.world_size} rank(s): loss "
                  f"{run.loss_first:.3f} -> {run.loss_last:.3f}, {summary['tokens_per_second']:.0f} tokens/s, "
                  f"{f'checkpoint {run.saved}' if run.saved else 'no checkpoint saved'}{rolled}{unread}")
    if run.folder_lock is not None:
        run.folder_lock.release()
    return summary


def train(cfg: TrainConfig) -> dict:
    """Run ``cfg.steps`` optimizer steps; returns the summary also written to ``run_dir/train_summary.json``.

    Summary keys: ``train_steps``, ``world_size``, ``loss_first``/``loss_last`` (nats per real token,
    first and last logged interval), ``tokens_per_second`` (real tokens, all ranks, per wall second
    of the loop), ``tokens_seen`` (real tokens, all ranks), ``checkpoint`` (folder or ``None``),
    ``parameters``, ``cache`` and ``loader`` (their ``metrics()`` on this rank), ``init_from``
    (``{path, kind, sha256}`` of ``model.init_from``'s weights, ``None`` without),
    ``val_loss_first``/``val_loss_last``/``val_perplexity_last``/``val_tokens``/``evaluations``
    (:mod:`trainer.evaluation`; ``None`` without validation data).
    """
    run = start_run(cfg)
    info, guard, timer = run.info, run.guard, run.meter.timer
    stream = micro_batches(run.loader, run.epoch, cfg.model.vocab_size)
    acc_loss = torch.zeros((), device=info.device)
    acc_tokens = torch.zeros((), dtype=torch.long, device=info.device)
    start = time.perf_counter()
    run.profiler.start()
    while run.step < cfg.steps:
        timer.start()
        batches = []
        for _ in range(cfg.optim.grad_accum_steps):
            run.epoch, b = next(stream)
            batches.append(b.to(info.device, non_blocking=True) if info.device.type == "cuda" else b)
        timer.mark("data_wait")
        lr = lr_at(run.step, cfg.optim, cfg.steps) * guard.lr_scale
        set_lr(run.optimizer, lr)
        if run.is_log_step(run.step + 1):
            run.layer_stats.arm()
        loss_sum, tokens, grad_norm = train_step(run.wrapped, run.optimizer, batches, info, cfg, timer, guard,
                                                 run.step + 1, run.layer_stats, run.hooks)
        if guard.applied:
            acc_loss += loss_sum
            acc_tokens += tokens
        run.step += 1
        run.log.step()
        run.profiler.step()
        if run.is_log_step(run.step):
            log_interval(run, lr, acc_loss, acc_tokens, grad_norm)
        if guard.needs_rollback:
            run.step = roll_back(run.ckpts, run.wrapped, run.optimizer, guard, run.step,
                                 cfg.optim.grad_accum_steps * info.world_size)
            run.log.rewind(run.step)  # the undone steps' records go: each step is logged once
            continue
        save_checkpoints(run)
        maybe_evaluate(run)
    run.profiler.stop()
    return finish_run(run, time.perf_counter() - start)
