"""``loaders.TokenDataset`` in torch's ``DataLoader`` and torchdata's ``StatefulDataLoader`` with real worker
processes: every document exactly once per epoch across ranks and workers (checked against what the
shard writer wrote), exact resume at the same layout, resume at another worker count and world size,
ranks from a real gloo group, the batch formats, and misuse refused in one line."""
from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from loaders import DataConfig, TokenDataset, build_text_loader
from loaders.formats import FORMATS
from shards import Manifest, TokenBlockWriter
from tests.support.launch import run_local_workers
from tests.unit.loaders.test_loader import _chunks, write_text_shards

EOS = 99


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("dataset_shards"))
    return d, write_text_shards(d)


def _cfg(d, **kw):
    base = dict(manifest=d, seq_len=64, micro_batch_size=2, pack_window=16, shuffle_block=8)
    base.update(kw)
    return DataConfig(**base)


def _assert_exactly_once(batches, docs):
    """Every written document delivered exactly once, whole: chunks reassembled per position (no chunk
    twice, none missing) are, as a multiset, the documents the writer wrote."""
    chunks = _chunks(batches)  # fails on a chunk delivered twice
    n_chunks = {p: n for b in batches for p, _, n in b.consumed.tolist() if n > 0}
    assert set(chunks) == {(p, c) for p, n in n_chunks.items() for c in range(n)}, "a chunk is missing"
    got = collections.Counter(tuple(np.concatenate([chunks[(p, c)] for c in range(n)]).tolist())
                              for p, n in n_chunks.items())
    assert got == collections.Counter(tuple(t.tolist()) for t in docs.values())


def _stateful_ranks(d, world, workers, steps=None, saved=None, **kw):
    """Every rank's ``StatefulDataLoader`` over its ``TokenDataset``: ``steps`` batches each (None: the
    epoch), started from ``saved`` (every rank's earlier state) when given. Returns the batches and each
    rank's ``state_dict()`` as a checkpoint would hold it (through JSON)."""
    batches, states = [], []
    for rank in range(world):
        dataset = TokenDataset(_cfg(d, **kw), rank=rank, world_size=world)
        if saved is not None:
            dataset.load_state_dict(saved)
        loader = StatefulDataLoader(dataset, batch_size=None, num_workers=workers)
        it = iter(loader)
        for _ in range(steps if steps is not None else 1 << 30):
            try:
                batches.append(next(it))
            except StopIteration:
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
        del it
    return batches, states


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([0, 2])),
       new=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([0, 2])), steps=st.integers(0, 8))
@example(old=(1, 0), new=(3, 2), steps=5)  # (ranks, workers): every count changes, both ways
@example(old=(3, 2), new=(2, 0), steps=3)
def test_stateful_dataloader_resume_at_another_worker_count_and_world_size(shards, old, new, steps):
    d, docs = shards
    before, states = _stateful_ranks(d, *old, steps=steps)
    after, _ = _stateful_ranks(d, *new, saved=states)
    _assert_exactly_once(before + after, docs)


@pytest.mark.parametrize("world,workers", [(1, 0), (1, 2), (2, 2)])
def test_stateful_dataloader_resume_gives_the_next_batch_bit_for_bit(shards, world, workers):
    """Through ``StatefulDataLoader.load_state_dict`` at the same layout (pack_window=1): the batches
    after the resume are those of the uninterrupted run."""
    d, docs = shards
    for rank in range(world):
        def loader():
            return StatefulDataLoader(TokenDataset(_cfg(d, pack_window=1), rank=rank, world_size=world),
                                      batch_size=None, num_workers=workers)
        whole = list(loader())
        first = loader()
        it = iter(first)
        before = [next(it) for _ in range(5)]
        state = json.loads(json.dumps(first.state_dict()))
        del it
        again = loader()
        again.load_state_dict(state)
        after = list(again)
        assert len(before) + len(after) == len(whole)
        for a, b in zip(before + after, whole):
            assert a.keys == b.keys and a.consumed.tolist() == b.consumed.tolist()
            assert all(getattr(a, f).equal(getattr(b, f)) for f in ("input_ids", "labels", "position_ids"))


def test_torch_dataloader_workers_split_the_documents_and_epochs_differ(shards):
    """Plain torch ``DataLoader`` with 2 workers: each document once (it used to be read once per worker),
    and ``set_epoch`` gives the next epoch's order."""
    d, docs = shards
    dataset = TokenDataset(_cfg(d))
    epochs = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        epochs.append(list(DataLoader(dataset, batch_size=None, num_workers=2)))
        _assert_exactly_once(epochs[-1], docs)
    assert [b.keys for b in epochs[0]] != [b.keys for b in epochs[1]]
    assert [b.keys for b in epochs[0]] == [b.keys for b in DataLoader(TokenDataset(_cfg(d)), batch_size=None,
                                                                      num_workers=2)]


def _gloo_rank(d: str) -> dict:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dataset = TokenDataset(_cfg(d))  # no rank: the group's
    # fork: a process started by spawn makes spawn its default, and workers would import everything anew
    batches = list(DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    return {"rank": dataset.rank, "world": dataset.world_size, "text_loader": build_text_loader(_cfg(d)).rank,
            "positions": sorted({p for b in batches for p in b.consumed[:, 0].tolist()})}


def test_ranks_of_a_gloo_group_read_disjoint_documents_without_rank_arguments(shards):
    d, docs = shards
    ranks = run_local_workers(_gloo_rank, 2, d)
    assert [(r["rank"], r["world"], r["text_loader"]) for r in ranks] == [(0, 2, 0), (1, 2, 1)]
    assert not set(ranks[0]["positions"]) & set(ranks[1]["positions"])
    assert sorted(ranks[0]["positions"] + ranks[1]["positions"]) == list(range(len(docs)))


def test_world_size_in_the_environment_without_a_group_is_refused(shards, monkeypatch):
    d, _ = shards
    monkeypatch.setenv("WORLD_SIZE", "2")
    for build in (TokenDataset, build_text_loader):
        with pytest.raises(ValueError) as e:
            build(_cfg(d))
        message = str(e.value)
        assert message.startswith("WORLD_SIZE=2 but torch.distributed is not initialised") and "\n" not in message
    assert TokenDataset(_cfg(d), rank=1, world_size=2).rank == 1  # explicit arguments win
    with pytest.raises(ValueError, match="give both"):
        TokenDataset(_cfg(d), rank=1)


def test_remote_data_without_a_cache_is_refused_up_front(http_server):
    _, base_url, root = http_server
    write_text_shards(str(root))
    url = f"{base_url}/manifest.json"
    for build in (TokenDataset, build_text_loader):
        with pytest.raises(ValueError) as e:
            build(_cfg(url))
        message = str(e.value)
        assert message.startswith(f"data.manifest={url} is remote and no cache was given") and "\n" not in message


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_dataloader_that_batches_the_batches_again_is_refused(shards, fmt):
    d, _ = shards
    with pytest.raises(TypeError) as e:
        next(iter(DataLoader(TokenDataset(_cfg(d), format=fmt), batch_size=4)))
    assert "create the DataLoader with batch_size=None" in str(e.value) and "\n" not in str(e.value)


def test_bad_format_and_foreign_state_are_named(shards):
    d, _ = shards
    with pytest.raises(ValueError, match=r"data.format='keras': use one of colaflow, hf, torchtitan"):
        TokenDataset(_cfg(d, format="keras"))
    with pytest.raises(ValueError, match="no loaders.TokenDataset state in the given dict"):
        TokenDataset(_cfg(d)).load_state_dict({"step": 3})
    other = TokenDataset(_cfg(d, seed=1))
    with pytest.raises(ValueError, match="resume with the same data and data.seed"):
        other.load_state_dict(TokenDataset(_cfg(d)).state_dict())


def _eos_shards(d: str) -> list[list[int]]:
    """Documents of counting tokens, each ending with EOS (as preprocessing writes them); returns them."""
    rng = np.random.default_rng(0)
    w = TokenBlockWriter(d, max_samples=16, block_tokens=256)
    docs = []
    for i in range(40):
        toks = (int(rng.integers(0, 90)) + np.arange(int(rng.integers(3, 40)))) % 90
        docs.append(toks.tolist() + [EOS])
        w.add(f"doc{i:04d}", "test", np.asarray(docs[-1], np.uint16))
    Manifest(shards=w.close(), vocab_size=100, layout="token_blocks").save(d)
    return docs


def test_formats_carry_the_labels_each_framework_expects(tmp_path):
    d = str(tmp_path)
    _eos_shards(d)
    cfg = _cfg(d, seq_len=32, micro_batch_size=4, pack_window=256)
    native = list(TokenDataset(cfg))
    hf = list(TokenDataset(cfg, format="hf"))
    titan = list(TokenDataset(cfg, format="torchtitan"))
    assert len(native) == len(hf) == len(titan) > 3
    learns_eos = 0
    for b, h, (inputs, labels) in zip(native, hf, titan):
        ids, pos = b.input_ids, b.position_ids
        # no attention_mask and no KV cache: either would turn transformers' packed-sequence attention off
        assert set(h) == {"input_ids", "labels", "position_ids", "use_cache"} and h["use_cache"] is False
        assert h["input_ids"].equal(ids) and h["position_ids"].equal(pos)
        # HF shifts inside the model: a token is a target of the one before it, within its document
        assert h["labels"].equal(torch.where(pos > 0, ids, -100))
        assert inputs["input"].equal(ids) and inputs["positions"].equal(pos) and labels.equal(b.labels)
        nxt, next_pos = torch.roll(ids, -1, 1), torch.roll(pos, -1, 1)
        same_doc = (next_pos == pos + 1)
        same_doc[:, -1] = False
        assert labels.equal(torch.where(same_doc, nxt, -100))  # torchtitan: shifted, -100 across documents
        eos = ids == EOS
        assert (labels[eos] == -100).all()  # nothing is predicted from a document's EOS
        before_eos = torch.roll(eos, -1, 1) & same_doc
        assert (labels[before_eos] == EOS).all()  # the last text token learns EOS
        learns_eos += int(before_eos.sum())
    assert learns_eos >= 20


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_llama_keeps_packed_documents_apart(tmp_path, attn):
    """A packed ``hf`` batch through ``LlamaForCausalLM`` (``model(**batch)``, the model's default config) gives
    each document the logits it has alone; in training mode too."""
    from transformers import LlamaConfig, LlamaForCausalLM
    d = str(tmp_path)
    _eos_shards(d)
    batch = next(iter(TokenDataset(_cfg(d, seq_len=64, micro_batch_size=2, pack_window=256), format="hf")))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         attn_implementation=attn))  # dropout is 0: train mode is deterministic
    with torch.no_grad():
        packed = model(**batch).logits
        starts = 0
        for row, pos in zip(range(len(batch["input_ids"])), batch["position_ids"]):
            bounds = torch.nonzero(pos == 0).flatten().tolist() + [len(pos)]
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                if hi - lo < 2:
                    continue  # padding (each pad token is its own "document")
                alone = model(input_ids=batch["input_ids"][row:row + 1, lo:hi]).logits[0]
                torch.testing.assert_close(packed[row, lo:hi], alone, atol=1e-5, rtol=1e-4)
                starts += 1
    assert starts >= 3
