"""``python -m trainer replay RUN_DIR --step N``: re-run one bad step and name the layer that went wrong first.

The anomaly guard (:mod:`trainer.run.anomaly`) writes each skipped step to ``RUN_DIR/events.jsonl``
with the sample keys of every rank's batch. Replay takes the newest finished checkpoint (full or
weights-only) saved before step ``N``, reads those samples from the run's shards, packs them into
one batch the way the loader does (:func:`loaders.pack.packer.pack_documents`: documents cut into ``seq_len`` chunks,
best-fit-decreasing rows) and runs forward and backward once, in one process, with deterministic
algorithms, the run's precision and its step hooks (``hooks:`` of ``config.json``, built afresh
and entered around the forward, so a fault a hook injected is replayed too). Hooks on every module record, in execution order, the statistics of its forward
output and of the gradient it passes back (backward ``grad_input``). The report names the first
module whose output is non-finite or spikes (RMS above ``spike_ratio`` x the RMS of its input),
forward first, then backward.

What it cannot reproduce: a checkpoint older than step ``N - 1`` gives the weights of that step,
not of ``N - 1`` (the report says which step the weights come from; save ``checkpoint.every``
often to replay exactly); a document longer than ``seq_len`` contributes all its chunks, while the
live batch may have held only some of them; rows may be arranged differently (the loss sum is the same).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import asdict, dataclass, field

import torch

BAD_EVENTS = ("nonfinite", "loss_spike")


class ReplayError(RuntimeError):
    """The step cannot be replayed (no event for it, no checkpoint before it, samples not found)."""


@dataclass
class TensorStats:
    """Statistics of one module output: ``rms`` and ``max_abs`` over its finite values, count of
    ``nan`` and ``inf`` values, ``numel``, ``dtype`` and ``shape``; ``input_rms`` of its input."""

    rms: float
    max_abs: float
    nan: int
    inf: int
    numel: int
    dtype: str
    shape: list[int]
    input_rms: float | None = None

    @property
    def finite(self) -> bool:
        """No NaN and no Inf in the output."""
        return self.nan == 0 and self.inf == 0


@dataclass
class Finding:
    """The first bad output of one pass: ``phase`` (``forward``/``backward``), ``module`` (its
    name in ``model.named_modules()``, ``""`` = the whole model, whose output is the loss),
    ``kind`` (``nonfinite``/``spike``), ``order`` (hook calls before it in that pass) and ``stats``."""

    phase: str
    module: str
    module_type: str
    kind: str
    order: int
    stats: TensorStats


@dataclass
class ReplayReport:
    """Result of :func:`replay_step` for one rank's batch."""

    step: int
    rank: int
    checkpoint: str
    weights_step: int
    keys: list[str]
    tokens: int
    loss: float
    event: dict
    forward: Finding | None = None
    backward: Finding | None = None
    injected: str | None = None  # what the run's step hooks did at this step (StepHooks.describe), if anything
    modules_checked: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> Finding | None:
        """The forward finding, else the backward one, else ``None`` (the step replays clean)."""
        return self.forward or self.backward

    def to_json(self) -> dict:
        """The report as plain JSON values (NaN statistics stay ``float('nan')``)."""
        return asdict(self)


def _stats(t: torch.Tensor, input_rms: float | None = None) -> TensorStats:
    t = t.detach().float()
    finite = torch.isfinite(t)
    vals = t[finite]
    rms = float(vals.square().mean().sqrt()) if vals.numel() else float("nan")
    return TensorStats(rms=rms, max_abs=float(vals.abs().max()) if vals.numel() else float("nan"),
                       nan=int(torch.isnan(t).sum()), inf=int(torch.isinf(t).sum()), numel=t.numel(),
                       dtype=str(t.dtype).replace("torch.", ""), shape=list(t.shape), input_rms=input_rms)


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        return next((t for t in x if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    return None


class _Watcher:
    """Forward and full-backward hooks on every module; keeps the first bad output of each pass."""

    def __init__(self, model: torch.nn.Module, spike_ratio: float):
        self.spike_ratio = spike_ratio
        self.found: dict[str, Finding] = {}
        self.calls = {"forward": 0, "backward": 0}
        self.handles = []
        self.modules = 0
        for name, module in model.named_modules():
            self.modules += 1
            self.handles.append(module.register_forward_hook(self._hook("forward", name, module)))
            if name:  # the root's output is the loss: its gradient is the seed, not a finding
                self.handles.append(module.register_full_backward_hook(self._hook("backward", name, module)))

    def _hook(self, phase: str, name: str, module):
        def hook(_m, inputs, outputs):
            # forward: inputs -> output; backward: grad_output (coming in) -> grad_input (passed back)
            produced, consumed = (outputs, inputs) if phase == "forward" else (inputs, outputs)
            self.calls[phase] += 1
            out = _first_tensor(produced)
            if phase in self.found or out is None or not out.is_floating_point():
                return None
            src = _first_tensor(consumed)
            src_rms = _stats(src).rms if src is not None and src.is_floating_point() else None
            st = _stats(out, src_rms)
            kind = None
            if not st.finite:
                kind = "nonfinite"
            elif (self.spike_ratio > 0 and src_rms is not None and math.isfinite(src_rms) and src_rms > 0
                  and st.rms > self.spike_ratio * src_rms):
                kind = "spike"
            if kind:
                self.found[phase] = Finding(phase, name, type(module).__name__, kind, self.calls[phase] - 1, st)
            return None
        return hook

    def remove(self) -> None:
        """Take every hook off the model."""
        for h in self.handles:
            h.remove()


def read_events(run_dir: str) -> list[dict]:
    """The records of ``RUN_DIR/events.jsonl`` (unreadable lines skipped). Raises :class:`ReplayError` without the file."""
    path = os.path.join(run_dir, "events.jsonl")
    if not os.path.exists(path):
        raise ReplayError(f"{path}: no events file; the run logged no bad step (anomaly.enabled=true writes it)")
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def checkpoint_before(root: str, step: int) -> tuple[str, int]:
    """``(folder, step)`` of the newest finished checkpoint (full or weights-only) saved after at
    most ``step - 1`` steps. Raises :class:`ReplayError` when there is none."""
    from trainer.checkpointing import list_checkpoints, read_meta
    found = []
    for kind in ("full", "weights"):
        for path in list_checkpoints(root, kind):
            s = int(read_meta(path).get("step", -1))
            if s < step:
                found.append((s, path))
    if not found:
        raise ReplayError(f"no finished checkpoint under {root} before step {step}; replay needs one "
                          "(set checkpoint.every or checkpoint.weights_every in the next run)")
    s, path = max(found)
    return path, s


def batch_from_keys(cfg, keys: list[str]):
    """One :class:`loaders.rank.batch.TokenBatch` of the documents ``keys`` of the run's dataset, packed as the
    loader packs (``data.seq_len`` rows, at least ``data.micro_batch_size`` of them).

    Keys are document keys (:func:`shards.escape_key` of the id) in both layouts: one tar sample
    per document, or token blocks (``docs/shard-format.md`` §4.1), whose documents are read by
    index through :class:`shards.access.token_blocks.BlockShard`. Shards are scanned in manifest order
    until every key is found.

    Raises:
        ReplayError: a key is not in the dataset of ``data.manifest``.
    """
    from loaders.pack.packer import pack_documents
    from loaders.protocols import ShardSource
    from loaders.rank.batch import TokenBatch
    from loaders.read.shard_reader import LocalShards, ShardReader
    from shards import Manifest
    manifest = Manifest.load(cfg.data.manifest)
    local = "://" not in cfg.data.manifest or cfg.data.manifest.startswith("file://")
    cache: ShardSource
    if local:
        cache = LocalShards()
    else:
        from cache import ShardCache
        cache = ShardCache(cfg.cache)
    reader = ShardReader(manifest, cfg.data.manifest, cache, cfg.data.index_dir or None)
    wanted, found = set(keys), {}
    try:
        # a token-block shard holds more documents than tar samples: address documents, not samples
        for shard, documents in enumerate(manifest.document_counts()):
            for i in range(documents):
                if reader.key(shard, i) in wanted:
                    key, tokens = reader.tokens(shard, i)
                    found[key] = tokens
            reader.retain(set())
            if len(found) == len(wanted):
                break
    finally:
        reader.close()
        cache.close()
    missing = [k for k in keys if k not in found]
    if missing:
        raise ReplayError(f"{len(missing)} batch key(s) not in {cfg.data.manifest}: {missing[:5]}; "
                          "point data.manifest at the run's dataset (--manifest)")
    return TokenBatch.from_packed(pack_documents(keys, [found[k] for k in keys], cfg.data.seq_len,
                                                 cfg.data.micro_batch_size, manifest.padding_id))


def load_run_config(run_dir: str, manifest: str | None = None):
    """The run's :class:`trainer.config.TrainConfig` from ``RUN_DIR/config.json`` (``manifest`` overrides
    ``data.manifest``; see :func:`trainer.config.read_saved_config` for configs of older runs).

    Raises:
        ReplayError: no ``config.json``.
        colaflow.config.ConfigError: it holds a key this trainer does not know.
    """
    from trainer.config import read_saved_config
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise ReplayError(f"{path}: missing; RUN_DIR must be a training run folder")
    cfg = read_saved_config(path)
    if manifest:
        cfg.data.manifest = manifest
    return cfg


def replay_step(run_dir: str, step: int, rank: int | None = None, spike_ratio: float = 100.0,
                manifest: str | None = None) -> list[ReplayReport]:
    """Replay optimizer step ``step`` (1-based) of the run in ``run_dir`` on CPU, one report per rank
    that logged a bad-step event at that step (only ``rank`` when given).

    Raises:
        ReplayError: no such event, no checkpoint before the step, or the samples cannot be found.
    """
    from trainer.checkpointing import load_full_state
    cfg = load_run_config(run_dir, manifest)
    events = [e for e in read_events(run_dir) if e.get("event") in BAD_EVENTS and e.get("step") == step
              and (rank is None or e.get("rank") == rank)]
    if not events:
        bad = sorted({e["step"] for e in read_events(run_dir) if e.get("event") in BAD_EVENTS})
        raise ReplayError(f"no bad-step event at step {step}" + (f" on rank {rank}" if rank is not None else "")
                          + f" in {run_dir}/events.jsonl; bad steps logged: {bad or 'none'}")
    ckpt_root = os.path.join(run_dir, cfg.checkpoint.dir) if not os.path.isabs(cfg.checkpoint.dir) \
        else cfg.checkpoint.dir
    path, weights_step = checkpoint_before(ckpt_root, step)
    weights = load_full_state(path)["model"]
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return [_replay_event(cfg, run_dir, event, weights, path, weights_step, step, spike_ratio)
                for event in sorted(events, key=lambda e: e.get("rank", 0))]
    finally:
        torch.use_deterministic_algorithms(deterministic)


def _replay_event(cfg, run_dir: str, event: dict, weights: dict, path: str, weights_step: int, step: int,
                  spike_ratio: float) -> ReplayReport:
    """Forward and backward of one rank's logged batch on CPU with the watcher's hooks, inside the
    run's step hooks (built afresh; the replayed batch is their micro-batch 0)."""
    from trainer.distributed import parallel
    from trainer.model import GPT
    from trainer.run.events import EventLog
    from trainer.run.hooks import HookContext, StepHooks
    device = torch.device("cpu")
    rank = event.get("rank", 0)
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    model.load_state_dict(weights)
    model.set_activation_checkpointing(False)
    batch = batch_from_keys(cfg, list(event.get("keys", [])))
    hooks = StepHooks.build(cfg.hooks, HookContext(run_dir, EventLog.of_run(run_dir)))
    with contextlib.ExitStack() as stack:
        with hooks.forward(model, step, 0, rank):
            watcher = _Watcher(model, spike_ratio)  # after the step hooks': it sees outputs as the live run made them
            stack.callback(watcher.remove)
            with parallel.autocast(device, cfg.precision, 0):
                loss = model(batch.input_ids, batch.position_ids, batch.document_ids, batch.labels)
        tokens = int((batch.labels != -100).sum())
        loss.backward()
    notes = []
    if weights_step != step - 1:
        notes.append(f"weights are from step {weights_step}, not {step - 1}: later updates are not replayed")
    return ReplayReport(step, rank, path, weights_step, list(batch.keys), tokens,
                        float(loss.detach()) / max(tokens, 1), event, watcher.found.get("forward"),
                        watcher.found.get("backward"), hooks.describe(step, rank), watcher.modules, notes)


def _describe(f: Finding | None, phase: str) -> str:
    if f is None:
        return f"  {phase}: every module output finite, no spike"
    s = f.stats
    name = f.module or "<model> (the loss)"
    ratio = f", {s.rms / s.input_rms:.3g}x its input" if s.input_rms and math.isfinite(s.rms) else ""
    return (f"  {phase}: first {f.kind} output at {name} ({f.module_type}), hook call {f.order}: "
            f"nan={s.nan} inf={s.inf} of {s.numel} ({s.dtype} {s.shape}), rms={s.rms:.4g}{ratio}, "
            f"max|x|={s.max_abs:.4g}")


def format_report(r: ReplayReport) -> str:
    """Human-readable lines of one report."""
    lines = [f"step {r.step}, rank {r.rank}: {r.event.get('event')} (logged loss {r.event.get('loss')}, "
             f"grad norm {r.event.get('grad_norm')}); weights of step {r.weights_step} from {r.checkpoint}",
             f"  batch: {len(r.keys)} samples, {r.tokens} tokens; replayed loss {r.loss:.6g} nats/token",
             f"  the run's step hooks did: {r.injected}" if r.injected else "  no step hook reported anything at this step",
             _describe(r.forward, "forward"), _describe(r.backward, "backward")]
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m trainer replay") -> int:
    """CLI (``prog`` in its usage): exit 0 when replayed (the report is printed), 1 when it cannot be,
    2 on usage errors."""
    import argparse
    import sys

    from colaflow.wording import help_text

    ap = argparse.ArgumentParser(prog=prog, description=help_text(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="training run folder (holds config.json, events.jsonl, checkpoints/)")
    ap.add_argument("--step", type=int, required=True, help="the bad optimizer step to replay (1-based)")
    ap.add_argument("--rank", type=int, help="replay only this rank's batch (default: every rank that logged it)")
    ap.add_argument("--spike-ratio", type=float, default=100.0,
                    help="an output whose RMS exceeds this x its input's RMS is a spike (0 = off; default 100)")
    ap.add_argument("--manifest", help="dataset manifest if it moved since the run (default: the run's data.manifest)")
    ap.add_argument("--json", help="also write the reports as JSON to this file")
    args = ap.parse_args(argv)
    try:
        reports = replay_step(args.run_dir, args.step, args.rank, args.spike_ratio, args.manifest)
    except (ReplayError, FileNotFoundError, ValueError) as e:
        print(f"replay: {e}", file=sys.stderr)
        return 1
    for r in reports:
        print(format_report(r))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.to_json() for r in reports], f, indent=2)
    return 0
