"""Where this process sits in the job: explicit ``rank``/``world_size``, else ``torch.distributed``'s.

A loader that reads as rank 0 of 1 while its process is one of several ranks reads the same data as
every other rank; :func:`resolve_world` refuses that case instead of guessing.
"""
from __future__ import annotations

import os


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process's loader.

    Explicit arguments win; else the initialised default ``torch.distributed`` group's rank and size;
    else ``(0, 1)``, unless the environment (``WORLD_SIZE``, as torchrun sets it) says the job has
    several ranks.

    Raises:
        ValueError: only one of ``rank``/``world_size`` given, ``rank`` outside ``[0, world_size)``, or
            ``WORLD_SIZE`` > 1 with no process group and no explicit rank (every rank would read the same data).
    """
    if (rank is None) != (world_size is None):
        raise ValueError(f"rank={rank}, world_size={world_size}: give both, or neither (then torch.distributed's)")
    if rank is None:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        env = os.environ.get("WORLD_SIZE", "1")
        if env.strip().isdigit() and int(env) > 1:
            raise ValueError(f"WORLD_SIZE={env} but torch.distributed is not initialised: call "
                             "torch.distributed.init_process_group() before building the loader, or pass rank= and "
                             "world_size= (otherwise every rank reads the same data)")
        return 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world size {world_size}")
    return rank, world_size


def resolve_ranks_per_node(configured: int, rank: int, world_size: int) -> int:
    """Ranks per node (sharing one cache folder) of a job of ``world_size`` ranks.

    ``configured`` (``data.ranks_per_node``) when > 0; else torchrun's ``LOCAL_WORLD_SIZE`` when the
    environment's ``WORLD_SIZE`` is this job's (torchrun numbers ranks node by node: ``rank =
    GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``); else ``world_size`` (one node).

    Raises:
        ValueError: it does not divide ``world_size`` (nodes with different rank counts), or torchrun's
            ``GROUP_RANK`` is not ``rank // ranks_per_node`` (ranks not numbered node by node).
    """
    env = os.environ
    from_env = configured <= 0 and env.get("WORLD_SIZE", "").strip() == str(world_size) \
        and env.get("LOCAL_WORLD_SIZE", "").strip().isdigit()
    per_node = configured if configured > 0 else int(env["LOCAL_WORLD_SIZE"]) if from_env else world_size
    if per_node < 1 or world_size % per_node:
        raise ValueError(f"data.ranks_per_node={per_node} does not divide the world size {world_size}: run the same "
                         "number of ranks on every node, or set data.ranks_per_node to the ranks of one node")
    group = env.get("GROUP_RANK", "").strip()
    if from_env and group.isdigit() and int(group) != rank // per_node:
        raise ValueError(f"rank {rank} is on node GROUP_RANK={group}, not {rank // per_node}: the ranks are not "
                         f"numbered node by node; set data.ranks_per_node explicitly")
    return per_node
