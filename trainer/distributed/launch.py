"""``python -m trainer --nproc-per-node N``: the trainer's ranks launched in-process, as torchrun would."""
from __future__ import annotations

from trainer.distributed.parallel import free_port


def launch_standalone(nproc: int, trainer_args: list[str]) -> int:
    """``torchrun --standalone --nproc-per-node=nproc -m trainer *trainer_args`` in this process, via
    ``torch.distributed.launcher.api.elastic_launch``; returns the exit status of the first rank
    that failed (2 config, 1 runtime/data, 130 Ctrl-C; see :mod:`trainer.run.cli`) or 0.

    The ranks print their own one-line errors (rank 0 only); torchrun's agent logs and its
    ``ChildFailedError`` report are held back, so a failure ends in one line, not one screen per rank.
    """
    import logging
    import sys
    import uuid

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                          start_method="spawn")
    try:
        elastic_launch(config, sys.executable)("-m", "trainer", *trainer_args)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        return next((c for c in codes if c in (1, 2, 130)), 1)
    except (KeyboardInterrupt, SignalException):
        return 130
    return 0
