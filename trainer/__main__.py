"""``python -m trainer``: training (:mod:`trainer.run.cli`, whose ``--help`` lists everything) or one of
the subcommands verify, export, report and replay."""
from __future__ import annotations

import sys


def _verify(argv: list[str], prog: str) -> int:
    from trainer.checkpointing.verify import main as verify_main
    return verify_main(argv, prog)


def _export(argv: list[str], prog: str) -> int:
    from trainer.export.cli import main as export_main
    return export_main(argv, prog)


def _report(argv: list[str], prog: str) -> int:
    from trainer.report.render import main as report_main
    return report_main(argv, prog)


def _replay(argv: list[str], prog: str) -> int:
    from trainer.debug.replay import main as replay_main
    return replay_main(argv, prog)


def main(argv: list[str] | None = None, prog: str = "python -m trainer") -> int:
    """``python -m trainer [verify|export|report|replay] ...``: dispatch to the subcommand, else train;
    returns the exit code (2 usage/config, 1 runtime/data, 130 Ctrl-C). ``prog`` is the command line
    usage shows; a subcommand's is ``prog`` and its name (``colaflow`` gives ``colaflow verify``)."""
    argv = sys.argv[1:] if argv is None else argv
    commands = {"verify": _verify, "export": _export, "report": _report, "replay": _replay}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:], f"{prog} {argv[0]}")
    from trainer.run.cli import main as train_main
    return train_main(argv, prog)


if __name__ == "__main__":
    from colaflow.errors import run_cli
    run_cli(main)
