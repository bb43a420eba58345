"""Command line of the trainer.

- ``python -m trainer --config FILE [key=value ...]``: train, alone or under ``torchrun``.
- ``python -m trainer verify CKPT [--config FILE]``: verify a checkpoint offline in one process
  (checksums of every tensor, a forward pass of the fixed batch); exit status 0 only if it passes.
- ``python -m trainer export CKPT OUT.pt``: write a checkpoint as one consolidated ``torch.save``
  file (``torch.load(OUT.pt)["model"]`` holds the unsharded weights).
- ``python -m trainer report RUN_DIR``: HTML report with PNG plots of a run (``RUN_DIR/report/``).
- ``python -m trainer replay RUN_DIR --step N``: re-run bad step N from the checkpoint before it
  and name the first module whose output went non-finite or spiked (forward, then backward).
"""
from __future__ import annotations

import argparse
import sys

import torch.distributed as dist


def _train(argv: list[str]) -> int:
    from cache.errors import CacheError
    from shards.config import ConfigError, load_config
    from shards.errors import explain
    from trainer.config import TrainConfig
    from trainer.train import NoDataError, train
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file with a TrainConfig (sections model, data, cache, zero, ...)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. zero.stage=2 optim.lr=1e-3")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
        cfg.validate()
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: config: {e}", file=sys.stderr)
        return 2
    try:
        train(cfg)
    except (FileNotFoundError, CacheError, NoDataError) as e:  # missing or unreadable data: no traceback
        print(f"error: {explain(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; continue with checkpoint.resume=latest (checkpoints in {cfg.run_dir}/"
              f"{cfg.checkpoint.dir}, every {cfg.checkpoint.every or 'no'} steps)", file=sys.stderr)
        return 130
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _verify(argv: list[str]) -> int:
    from trainer.checkpointing.verify import verify_offline
    parser = argparse.ArgumentParser(prog="python -m trainer verify", description="Verify a checkpoint offline.")
    parser.add_argument("checkpoint", help="checkpoint folder (step_XXXXXX or weights_XXXXXX)")
    parser.add_argument("--config", help="training config (default: the checkpoint's config.yaml)")
    args = parser.parse_args(argv)
    problems = verify_offline(args.checkpoint, args.config)
    if problems:
        print(f"FAILED: {args.checkpoint}", file=sys.stderr)
        for p in problems:
            print(p, file=sys.stderr)
        print("Resume from an older checkpoint (checkpoint.resume=PATH) or re-export from a good copy.",
              file=sys.stderr)
        return 1
    print(f"OK: {args.checkpoint} (every tensor matches its checksum; forward pass matches)")
    return 0


def _export(argv: list[str]) -> int:
    from trainer.checkpointing import export_checkpoint
    parser = argparse.ArgumentParser(prog="python -m trainer export",
                                     description="Consolidate a DCP checkpoint into one torch.save file.")
    parser.add_argument("checkpoint", help="checkpoint folder")
    parser.add_argument("out", help="output file, e.g. model.pt")
    args = parser.parse_args(argv)
    export_checkpoint(args.checkpoint, args.out)
    print(f"wrote {args.out} from {args.checkpoint}")
    return 0


def _report(argv: list[str]) -> int:
    from trainer.observability.report import main as report_main
    return report_main(argv)


def _replay(argv: list[str]) -> int:
    from trainer.observability.replay import main as replay_main
    return replay_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"verify": _verify, "export": _export, "report": _report, "replay": _replay}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    return _train(argv)


if __name__ == "__main__":
    from shards.errors import run_cli
    run_cli(main)
