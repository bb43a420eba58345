"""Start N local worker processes joined in one gloo group (tests and benchmarks).

Production runs use ``torchrun``; this does the same rendezvous on one machine with
``torch.multiprocessing.spawn`` and a free 127.0.0.1 port, and collects each rank's return value.
"""
from __future__ import annotations

import os
import pickle
import sys
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.distributed.parallel import free_port


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
    :func:`trainer.distributed.parallel.init_distributed`. Each process uses one CPU thread. Returns the list of
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
