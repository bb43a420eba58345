"""Command line of the trainer.

- ``python -m trainer --config FILE [key=value ...]``: train, alone or under ``torchrun``; re-running
  it into the same ``run_dir`` resumes (or refuses; ``checkpoint.overwrite=true`` starts over).
  ``--dry-run`` checks config, data and run folder and prints the start line without training;
  ``--nproc-per-node N`` validates once, then starts N local ranks like ``torchrun --standalone``.
  ``model.init_from=PATH`` starts from a Hugging Face Llama folder, a ``.pt`` export or a checkpoint's
  weights (model sizes left at their defaults come from it). Exit status: 0 done, 2 usage/config error, 1 runtime/data error (e.g. a 404), 130 Ctrl-C.
- ``python -m trainer verify CKPT [--config FILE]``: verify a checkpoint offline in one process
  (checksums of every tensor, a forward pass of the fixed batch); exit status 0 only if it passes.
- ``python -m trainer export CKPT OUT_DIR --format onnx [--precision fp32,fp16,int8] [--batch-sizes 1,8]``:
  ONNX models, each verified on the validation split before it keeps its name
  (:mod:`trainer.export`; ``conversion_report.json``); exit 1 when a variant exceeds its tolerance.
- ``python -m trainer export CKPT OUT.pt``: one consolidated, verified ``torch.save`` file
  (``torch.load(OUT.pt)["model"]`` holds the unsharded weights, ``["provenance"]`` where it came from;
  the report is ``OUT.pt.conversion_report.json`` beside it).
- ``python -m trainer export CKPT OUT --format hf``: a Hugging Face Llama folder OUT that
  ``transformers`` loads, checked with it (report ``OUT.conversion_report.json`` beside it).
- ``python -m trainer report RUN_DIR``: HTML report with PNG plots of a run (``RUN_DIR/report/``).
- ``python -m trainer replay RUN_DIR --step N``: re-run bad step N from the checkpoint before it
  and name the first module whose output went non-finite or spiked (forward, then backward).
"""
from __future__ import annotations

import argparse
import os
import sys

from colaflow.errors import INTERRUPTED, USAGE, exit_status, explain
from colaflow.wording import help_text


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _say(message: str) -> None:
    """One line on stderr, from rank 0 only (under torchrun every rank meets the same error)."""
    if _is_rank0():
        print(message, file=sys.stderr, flush=True)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file with a TrainConfig (sections model, data, cache, zero, ...)")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate config, data and run folder/checkpoint, print the start line, do not train")
    parser.add_argument("--nproc-per-node", type=int, default=0, metavar="N",
                        help="start N local ranks (torchrun --standalone) after validating the config once here")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. zero.stage=2 optim.lr=1e-3")
    return parser


def _load(args):
    """The validated config; raises ``ValueError`` (``ConfigError`` is one) or ``FileNotFoundError``."""
    from colaflow.config import load_config
    from trainer.config import TrainConfig
    from colaflow.network import set_network_timeout
    cfg = load_config(TrainConfig, args.config, args.overrides)
    cfg.validate()
    set_network_timeout(cfg.cache.resolved().timeout_s)  # the manifest is read before the cache opens
    return cfg


def interrupt_advice(cfg) -> str:
    """The line printed after Ctrl-C: resume from the last checkpoint, or start over when there is
    none (``cfg``: the run's ``TrainConfig``, ``None`` when it had not loaded yet)."""
    if cfg is None:
        return "interrupted"
    from trainer.checkpointing.layout import latest_checkpoint
    from trainer.run.folder import checkpoint_root
    root = checkpoint_root(cfg)
    try:
        last = latest_checkpoint(root)
    except Exception:  # noqa: BLE001 - unreadable storage: the general advice still holds
        last = root
    if last is None:
        return (f"interrupted before the first checkpoint (checkpoint.every={cfg.checkpoint.every}): nothing to "
                f"resume; run again with checkpoint.overwrite=true to start over")
    return f"interrupted; run the same command again to resume from the last checkpoint ({last})"


def dry_run(cfg) -> int:
    """``--dry-run``: check data (manifest), run folder (free of a live run, :func:`trainer.run.folder.lock_run_folder`), checkpoint compatibility and the checkpoint's stored
    bytes against its checksums (one stored item in memory at a time); print the start line.

    Raises:
        trainer.checkpointing.verify.CheckpointVerifyError: the checkpoint to resume from is damaged.
        colaflow.config.ConfigError: the cache cannot hold a shard, or ``eval.manifest`` is missing
            (:func:`trainer.run.announce.check_runnable`).
    """
    from trainer.checkpointing import read_meta
    from trainer.run.announce import check_runnable, data_summary, start_line
    from trainer.run.folder import lock_run_folder, plan_run
    from trainer.run.origins import check_resume_tokenizer, resolve_model
    origins = resolve_model(cfg)
    lock_run_folder(cfg.run_dir, probe=True)  # a live run there: say so, not what a later launch would find
    plan = plan_run(cfg)
    if plan.checkpoint:
        meta = read_meta(plan.checkpoint)
        check_resume_tokenizer(meta, origins.tokenizer, plan.checkpoint)
        import torch  # reading the stored tensors back: torch and DCP, which a fresh run's dry run needs neither of

        from trainer.checkpointing.verify import check_stored
        check_stored(plan.checkpoint, plan.checkpoint, meta["checksums"], meta.get("digests", {}), torch.device("cpu"))
    data = data_summary(cfg.data)
    check_runnable(cfg, data)
    print(start_line(cfg, data, int(os.environ.get("WORLD_SIZE", "1")), plan, dry_run=True,
                     init=origins.pretrained if plan.checkpoint is None else None))
    print("dry run: config, data and run folder are fine; nothing was trained")
    return 0


def _where(e: Exception, cfg) -> str | None:
    """What error ``e`` of a launch is about, for its one line: ``config`` (the config did not load),
    ``run`` (run folder, checkpoints, bad steps, a failed write) or ``data``; ``None`` for an
    unexpected error, which keeps its traceback. ``cfg``: the loaded ``TrainConfig``, else ``None``."""
    from cache.errors import CacheError
    from colaflow.errors import io_cause
    from shards.format.tokens import TokenRangeError
    from trainer.checkpointing.layout import CheckpointStorageError
    # OSError: no space, read-only, no permission, a time-out (also wrapped: io_cause)
    if isinstance(e, (ValueError, OSError, CacheError, TokenRangeError)) or io_cause(e) is not None:
        written = isinstance(e, CheckpointStorageError) or io_cause(e) is not None
        return "config" if cfg is None else "run" if isinstance(e, ValueError) or written else "data"
    # raised only by modules that import torch, so already loaded then; imported above, before the
    # common errors were ruled out, they would load torch for every config error
    from trainer.checkpointing.verify import CheckpointVerifyError
    from trainer.train import NoDataError, RollbackError
    if isinstance(e, (CheckpointVerifyError, RollbackError)):
        return "run"
    return "data" if isinstance(e, NoDataError) else None


def main(argv: list[str], prog: str = "python -m trainer") -> int:
    """``python -m trainer [--config FILE] [--dry-run] [--nproc-per-node N] [key=value ...]``: train;
    returns the exit code (0 done, 2 usage/config, 1 runtime/data, 130 Ctrl-C). ``prog``: the command
    line usage shows (``colaflow train``)."""
    if not argv:  # training on built-in defaults is never what a bare command meant
        _parser(prog).print_usage(sys.stderr)
        _say(f"error: give --config FILE and/or key=value overrides ({prog} --help for more)")
        return USAGE
    args = _parser(prog).parse_intermixed_args(argv)  # --dry-run after the overrides too
    if args.config and "://" not in args.config and not os.path.isfile(args.config):
        _say(f"error: config file not found: {args.config}")
        return USAGE
    cfg = None  # set once the config loads: later errors are about the run or its data
    try:
        cfg = _load(args)
        if args.dry_run:
            return dry_run(cfg)
        if args.nproc_per_node:
            from trainer.distributed.launch import launch_standalone
            return launch_standalone(args.nproc_per_node, (["--config", args.config] if args.config else [])
                                     + args.overrides)
        from trainer.train import train
        train(cfg)
    except KeyboardInterrupt:
        _say(interrupt_advice(cfg))
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - expected user/data errors end in one line; others re-raise
        where = _where(e, cfg)
        if where is None:
            raise
        _say(f"error: {where}: {explain(e)}")
        return exit_status(e)
    finally:
        dist = sys.modules.get("torch.distributed")  # not imported at all when the config was wrong
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0
