"""Resume state across real ranks: 2 processes (torch.distributed, gloo) run a few steps, gather
and merge their states with ``global_state_dict``; 3 ranks then finish the epoch exactly."""
from __future__ import annotations

import json
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

from loaders.dataset import build_text_loader
from test_loader import _cfg, _run_ranks, write_text_shards

STEPS = 3


def _rank_main(rank: int, world: int, shards: str, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        loader = build_text_loader(_cfg(shards), rank=rank, world_size=world)
        it = iter(loader)
        batches = [next(it) for _ in range(STEPS)]
        state = loader.global_state_dict()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"state": state, "consumed": [c for b in batches for c in b.consumed]}, f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_global_state_with_gloo_ranks_then_resume_on_three(tmp_path):
    shards = str(tmp_path / "shards")
    os.makedirs(shards)
    write_text_shards(shards)
    mp.spawn(_rank_main, args=(2, shards, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert ranks[0]["state"] == ranks[1]["state"]  # every rank holds the same merged state
    state = ranks[0]["state"]
    before = [tuple(c) for r in ranks for c in r["consumed"]]
    _, after_batches = _run_ranks(shards, 3, state=state)
    after = [tuple(c) for b in after_batches for c in b.consumed]
    delivered = [(p, c) for p, c, n in before + after if n > 0]
    assert len(delivered) == len(set(delivered)), "a chunk was delivered twice"
    n_chunks = {p: n for p, _, n in before + after}
    assert set(n_chunks) == set(range(state["num_samples"]))
    assert set(delivered) == {(p, c) for p, n in n_chunks.items() for c in range(n)}
