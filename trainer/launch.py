"""Start N local worker processes joined in one gloo/nccl group (tests, benchmarks, notebooks).

Production runs use ``torchrun``; this helper does the same rendezvous on one machine with
``torch.multiprocessing.spawn`` and a free 127.0.0.1 port, and collects each rank's return value.
"""
from __future__ import annotations

import os
import pickle
import sys
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.parallel import free_port


def _worker(local_rank: int, world_size: int, port: int, out_dir: str, fn, args: tuple) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    torch.set_num_threads(1)
    try:
        result = fn(*args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{local_rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # The result is on disk: leave without running C++ static destructors, where a gloo thread still
    # joinable at interpreter teardown occasionally aborts the process ("terminate called without an
    # active exception") after all work succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_local_workers(fn, world_size: int, *args) -> list:
    """Call ``fn(*args)`` in ``world_size`` spawned processes with torchrun-style env vars set.

    ``fn`` must be importable (module level) and its return value picklable; it is expected to call
    :func:`trainer.parallel.init_distributed`. Each process uses one CPU thread. Returns the list of
    return values by rank.

    Raises:
        torch.multiprocessing.ProcessRaisedException: a worker raised (its traceback is included).
    """
    with tempfile.TemporaryDirectory(prefix="colaflow-workers-") as out_dir:
        mp.spawn(_worker, args=(world_size, free_port(), out_dir, fn, args), nprocs=world_size, join=True)
        results = []
        for r in range(world_size):
            with open(os.path.join(out_dir, f"rank{r}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results


def launch_standalone(nproc: int, trainer_args: list[str]) -> int:
    """``torchrun --standalone --nproc-per-node=nproc -m trainer *trainer_args`` in this process, via
    ``torch.distributed.launcher.api.elastic_launch``; returns the exit status of the first rank
    that failed (2 config, 1 runtime/data, 130 Ctrl-C; see :mod:`trainer.__main__`) or 0.

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
