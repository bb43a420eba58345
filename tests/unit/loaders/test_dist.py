"""Resume state across real ranks: 2 processes (torch.distributed, gloo) run a few steps, gather
and merge their states with ``global_state_dict``; 3 ranks then finish the epoch exactly."""
from __future__ import annotations

import json
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

from loaders.rank.loader import build_text_loader
from tests.unit.loaders.test_loader import _cfg, _run_ranks, write_text_shards

STEPS = 3


def _rank_main(rank: int, world: int, shards: str, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        loader = build_text_loader(_cfg(shards), rank=rank, world_size=world)
        it = iter(loader)
        batches = [next(it) for _ in range(STEPS)]
        state = loader.global_state_dict()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"state": state, "consumed": [c for b in batches for c in b.consumed.tolist()]}, f)
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
    after = [tuple(c) for b in after_batches for c in b.consumed.tolist()]
    delivered = [(p, c) for p, c, n in before + after if n > 0]
    assert len(delivered) == len(set(delivered)), "a chunk was delivered twice"
    n_chunks = {p: n for p, _, n in before + after}
    assert set(n_chunks) == set(range(state["num_samples"]))
    assert set(delivered) == {(p, c) for p, n in n_chunks.items() for c in range(n)}


WORLD = 3


def _policy_rank(rank: int, world: int, shards: str, port: int, out: str) -> None:
    """Each policy for one epoch on real ranks: batch counts, delivered chunks, and the metrics."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = {}
        for policy in ("pad", "drop"):
            loader = build_text_loader(_cfg(shards, step_policy=policy), rank=rank, world_size=world)
            batches = list(loader)
            result[policy] = {"batches": len(batches), "metrics": loader.metrics(),
                              "masked": sum(b.num_real_tokens == 0 and not len(b.consumed) for b in batches),
                              "consumed": [c for b in batches for c in b.consumed.tolist()],
                              "state": loader.global_state_dict()}
        with open(os.path.join(out, f"policy{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def test_step_policies_give_equal_step_counts_on_gloo_ranks(tmp_path):
    shards = str(tmp_path / "shards")
    os.makedirs(shards)
    write_text_shards(shards)
    # without agreement the ranks' batch counts differ (packing depends on document lengths)
    loaders, _ = _run_ranks(shards, WORLD, step_policy="uneven")
    uneven = [ld.metrics()["batches"] for ld in loaders]
    assert len(set(uneven)) > 1
    mp.spawn(_policy_rank, args=(WORLD, shards, _free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.load(open(tmp_path / f"policy{r}.json")) for r in range(WORLD)]
    n_docs = ranks[0]["pad"]["state"]["num_samples"]

    pad = [r["pad"] for r in ranks]
    assert [p["batches"] for p in pad] == [max(uneven)] * WORLD
    assert [p["metrics"]["padded_batches"] for p in pad] == [max(uneven) - u for u in uneven]
    assert [p["masked"] for p in pad] == [max(uneven) - u for u in uneven]
    assert all(p["metrics"]["step_sync"] == "all_reduce" and p["metrics"]["dropped_batches"] == 0 for p in pad)
    chunks = [(p, c) for r in pad for p, c, n in r["consumed"] if n > 0]
    assert len(chunks) == len(set(chunks)), "a chunk was delivered twice"
    assert pad[0]["state"]["consumed"] == n_docs  # every sample read exactly once

    drop = [r["drop"] for r in ranks]
    assert [d["batches"] for d in drop] == [min(uneven)] * WORLD
    assert [d["metrics"]["dropped_batches"] for d in drop] == [u - min(uneven) for u in uneven]
    delivered = {p for r in drop for p, _, n in r["consumed"] if n > 0}
    dropped = sum(d["metrics"]["dropped_samples"] for d in drop)
    assert dropped > 0
    # the dropped documents are exactly those not (fully) delivered: consumed + dropped = all
    assert drop[0]["state"]["consumed"] + dropped == n_docs
    assert len(delivered) >= drop[0]["state"]["consumed"]
