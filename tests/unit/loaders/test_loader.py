"""The text loader over real shards: exactly once per epoch for any world size and worker count,
exact resume (also into another world size and at an epoch end), real DataLoader workers, the real
node cache over HTTP, bad samples counted, and the ``python -m loaders keys`` CLI."""
from __future__ import annotations

import io
import contextlib
import logging
import os
import signal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache import CacheConfig, ShardCache
from loaders.tools.cli import main as loaders_cli
from loaders.config import DataConfig
from loaders.rank.loader import build_text_loader
from loaders.order.progress import merge_states
from shards import Manifest, ShardSequenceWriter, TokenBlockWriter, encode_text_sample

N_DOCS = 48
LAYOUTS = ["token_blocks/none", "token_blocks/zstd", "documents"]


def write_text_shards(directory: str, n_docs: int = N_DOCS, seed: int = 0, bad_key: str | None = None,
                      layout: str = "token_blocks/none") -> dict:
    """Shards of random token documents of very uneven lengths (1 .. ~700 tokens) and uneven
    shard sizes (rolled by bytes), as token blocks of ~600 tokens (raw or zstd) or one sample per
    document. Returns ``{key: tokens}``."""
    rng = np.random.default_rng(seed)
    docs = {}
    blocks = layout.startswith("token_blocks")
    w = (TokenBlockWriter(directory, max_bytes=12 * 1024, block_tokens=600, compression=layout.split("/")[1])
         if blocks else ShardSequenceWriter(directory, max_bytes=12 * 1024))
    for i in range(n_docs):
        n = int(rng.choice([1, 2, 5, 30, 90, 250, 700]))
        toks = rng.integers(0, 60000, n).astype(np.uint16)
        key = f"doc{i:04d}"
        if blocks:
            w.add(key, "test", toks)
        else:
            fields = encode_text_sample(toks, {"id": key})
            if key == bad_key:
                fields["tokens.npy.zst"] = b"not zstd at all"
            w.write(key, fields, tokens=n)
        docs[key] = toks
    Manifest(shards=w.close(), vocab_size=60000, layout=layout.split("/")[0]).save(directory)
    return docs


@pytest.fixture(scope="module", params=LAYOUTS)
def text_shards(request, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("text_shards"))
    return d, write_text_shards(d, layout=request.param)


def _cfg(d, **kw):
    base = dict(manifest=d, seq_len=64, micro_batch_size=2, num_workers=0, pack_window=16, shuffle_block=8)
    base.update(kw)
    return DataConfig(**base)


def _chunks(batches):
    """``{(position, chunk): (key, tokens)}`` over batches; fails on a chunk delivered twice."""
    out = {}
    for b in batches:
        segs = []
        for r in range(b.input_ids.shape[0]):
            d = b.document_ids[r]
            for k in range(int(d.max()) + 1 if (d >= 0).any() else 0):
                segs.append(b.input_ids[r][d == k].numpy())
        real = [tuple(c) for c in b.consumed.tolist() if c[2] > 0]
        assert len(real) == len(segs)
        for (p, c, _), seg in zip(real, segs):
            assert (p, c) not in out, f"chunk {(p, c)} delivered twice"
            out[(p, c)] = seg
    return out


def _assert_epoch(chunks, docs, seq_len, loader):
    """Every document's tokens delivered exactly once, in chunk order."""
    ds = loader.stream
    order = ds.order()
    keys = {}
    for b in range(order.num_blocks):
        for p, s, i in zip(*(a.tolist() for a in order.block_items(b))):
            keys[p] = (s, i)
    from loaders.read.shard_reader import ShardReader
    reader = ShardReader(ds.sources.manifest, ds.sources.url, ds.cache)
    seen = 0
    for p, (s, i) in keys.items():
        toks = docs[reader.key(s, i)]
        n = -(-len(toks) // seq_len)
        got = np.concatenate([chunks[(p, c)] for c in range(n)])
        assert got.tolist() == toks.tolist()
        seen += n
    reader.close()
    assert seen == len(chunks)


def _run_ranks(d, world, steps=None, state=None, **kw):
    """All ranks in lockstep (like a trainer) for ``steps`` steps (None: to the end of the epoch)."""
    loaders = [build_text_loader(_cfg(d, **kw), rank=r, world_size=world, in_process=True) for r in range(world)]
    if state is not None:
        for ld in loaders:
            ld.load_state_dict(state)
    its = [iter(ld) for ld in loaders]
    batches, step = [], 0
    while its and (steps is None or step < steps):
        for it in list(its):
            try:
                batches.append(next(it))
            except StopIteration:
                its.remove(it)
        step += 1
    return loaders, batches


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 8), workers=st.integers(0, 4), seed=st.integers(0, 3),
       batching=st.sampled_from(["packed", "token_budget"]), nodes=st.sampled_from([1, 2, 4]))
def test_exactly_once_any_world_and_workers(text_shards, world, workers, seed, batching, nodes):
    """Also with the ranks on several nodes, each reading its own shards."""
    d, docs = text_shards
    per_node = world // nodes if world % nodes == 0 else world
    loaders, batches = _run_ranks(d, world, num_workers=workers, seed=seed, batching=batching, max_tokens=128,
                                  ranks_per_node=per_node)
    _assert_epoch(_chunks(batches), docs, 64, loaders[0])
    assert all(ld.progress.complete_ranks == {ld.rank} for ld in loaders)
    assert merge_states([ld.state_dict() for ld in loaders])["consumed"] == N_DOCS


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.tuples(st.integers(1, 4), st.integers(0, 4), st.sampled_from([1, 2])),
       new=st.tuples(st.integers(1, 4), st.integers(0, 4), st.sampled_from([1, 2, 3])), steps=st.integers(0, 12))
def test_resume_mid_epoch_into_another_world_size(text_shards, old, new, steps):
    """(ranks per node, workers, nodes) before and after: also at another node count."""
    d, docs = text_shards
    first, before = _run_ranks(d, old[0] * old[2], steps=steps, num_workers=old[1], ranks_per_node=old[0])
    state = merge_states([ld.state_dict() for ld in first])
    assert state["deal"] is None or state["deal"]["nodes"] == old[2]  # None: no step taken
    second, after = _run_ranks(d, new[0] * new[2], state=state, num_workers=new[1], ranks_per_node=new[0])
    if state["consumed"] == N_DOCS:  # the stop fell at the epoch's end: the resume reads the next epoch
        assert all(ld.epoch == 1 for ld in second)
        _assert_epoch(_chunks(before), docs, 64, first[0])
        _assert_epoch(_chunks(after), docs, 64, second[0])
    else:
        _assert_epoch(_chunks(before + after), docs, 64, first[0])


def test_resume_at_epoch_end_starts_next_epoch(text_shards):
    d, docs = text_shards
    (ld,), ep0 = _run_ranks(d, 1)
    state = ld.state_dict()
    (nxt,), ep1 = _run_ranks(d, 1, state=state)
    assert nxt.epoch == 1
    fresh = build_text_loader(_cfg(d), in_process=True)
    fresh.set_epoch(1)
    assert [b.consumed.tolist() for b in ep1] == [b.consumed.tolist() for b in fresh]
    assert [b.keys for b in ep0] != [b.keys for b in ep1]
    _assert_epoch(_chunks(ep1), docs, 64, nxt)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 8), workers=st.integers(0, 4), new=st.tuples(st.integers(1, 8), st.integers(0, 4)))
def test_checkpoint_right_after_the_last_batch_resumes_into_the_next_epoch(text_shards, world, workers, new):
    """A state saved right after a rank's last batch (before its iterator finished, so the rank is
    not marked complete) resumes into the next epoch instead of yielding nothing, at any layout."""
    d, docs = text_shards
    cfg = _cfg(d, num_workers=workers)
    loaders = [build_text_loader(cfg, rank=r, world_size=world, in_process=True) for r in range(world)]
    counts = [len(list(build_text_loader(cfg, rank=r, world_size=world, in_process=True))) for r in range(world)]
    its = [iter(ld) for ld in loaders]
    for it, n in zip(its, counts):  # exactly each rank's batches: no next() past its last one
        for _ in range(n):
            next(it)
    state = merge_states([ld.state_dict() for ld in loaders])
    assert state["consumed"] == N_DOCS and state["epoch"] == 0
    resumed, ep1 = _run_ranks(d, new[0], state=state, num_workers=new[1])
    assert ep1 and all(ld.epoch == 1 for ld in resumed)
    _assert_epoch(_chunks(ep1), docs, 64, resumed[0])


def test_dataloader_workers_and_real_cache_over_http(http_server, tmp_path):
    """Real worker processes (:mod:`loaders.worker.pool`) reading through the real node cache from an
    HTTP server: same batches as the in-process order; resume after a few steps (workers had read
    ahead) is exact with another worker count."""
    _, base_url, root = http_server
    docs = write_text_shards(str(root))
    url = f"{base_url}/manifest.json"
    cache = ShardCache(CacheConfig(dir=str(tmp_path / "cache")))
    cfg = _cfg(url, num_workers=2)
    try:
        got = list(build_text_loader(cfg, cache, rank=0, world_size=2))
        want = list(build_text_loader(cfg, cache, rank=0, world_size=2, in_process=True))
        assert [b.consumed.tolist() for b in got] == [b.consumed.tolist() for b in want]
        assert all(a.input_ids.equal(b.input_ids) for a, b in zip(got, want))
        other = build_text_loader(cfg, cache, rank=1, world_size=2, in_process=True)
        _assert_epoch(_chunks(got + list(other)), docs, 64, other)
        # stop after 3 batches while the workers have read ahead; resume with 3 workers
        loader = build_text_loader(cfg, cache, rank=0, world_size=1)
        it = iter(loader)
        before = [next(it) for _ in range(3)]
        m = loader.metrics()  # the wait of each step is measured and summed over the 3 batches handed out
        assert m["batches"] == 3 and m["data_wait_seconds"] >= loader.data_wait_seconds > 0
        del it
        again = build_text_loader(_cfg(url, num_workers=3), cache, in_process=True)
        again.load_state_dict(loader.state_dict())
        _assert_epoch(_chunks(before + list(again)), docs, 64, again)
    finally:
        cache.close()


def test_bad_sample_is_counted_not_fatal(tmp_path):
    docs = write_text_shards(str(tmp_path), n_docs=12, bad_key="doc0003", layout="documents")
    loader = build_text_loader(_cfg(str(tmp_path)))
    keys = {k for b in loader for k in b.keys}
    assert keys == set(docs) - {"doc0003"}
    m = loader.metrics()
    assert m["bad"] == 1 and m["consumed"] == 12


def test_state_from_other_seed_is_refused(text_shards):
    d, _ = text_shards
    state = build_text_loader(_cfg(d, seed=1)).state_dict()
    with pytest.raises(ValueError, match="seed"):
        build_text_loader(_cfg(d, seed=2)).load_state_dict(state)
    state["num_samples"] -= 1  # same order key: was accepted (an IndexError once dealt)
    with pytest.raises(ValueError, match=f"counts {N_DOCS - 1} documents in an epoch, the data has {N_DOCS}"):
        build_text_loader(_cfg(d, seed=1)).load_state_dict(state)


def test_keys_cli_lists_every_sample_once(text_shards):
    d, docs = text_shards
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        loaders_cli(["keys", "--shards", d, "--world-size", "3", "--workers", "2", "--epoch", "1",
                     "data.ranks_per_node=1"])  # 3 nodes
    rows = [line.split() for line in out.getvalue().splitlines() if not line.startswith("#")]
    assert sorted(r[-1].split("/")[-1] for r in rows) == sorted(docs)
    assert {r[0] for r in rows} == {"rank=0", "rank=1", "rank=2"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        loaders_cli(["keys", "--shards", os.path.join(d, "manifest.json"), "--world-size", "2", "--workers", "1",
                     "--resume-at", "8", "data.seq_len=64", "data.micro_batch_size=2", "data.pack_window=4"])
    rest = [line for line in out.getvalue().splitlines() if not line.startswith("#")]
    assert 0 < len(rest) < N_DOCS


def test_drop_and_pad_policies_are_reported(text_shards):
    d, _ = text_shards
    loaders, batches = _run_ranks(d, 5, remainder="drop")
    assert loaders[0].metrics()["dropped"] == N_DOCS % 5
    assert merge_states([ld.state_dict() for ld in loaders])["consumed"] == N_DOCS - N_DOCS % 5
    loaders, batches = _run_ranks(d, 5, remainder="pad")
    assert loaders[0].metrics()["padded"] == 5 - N_DOCS % 5
    assert merge_states([ld.state_dict() for ld in loaders])["consumed"] == N_DOCS


def test_keys_cli_simulated_ranks_do_not_warn_and_refuse_a_resume_past_the_end(tmp_path, caplog, capsys):
    d = str(tmp_path)
    write_text_shards(d, n_docs=12)
    args = ["keys", "--shards", d, "--world-size", "2", "data.seq_len=64", "data.micro_batch_size=2"]
    with caplog.at_level(logging.WARNING):
        assert loaders_cli([*args, "--resume-at", "1"]) == 0
    assert "needs torch.distributed" not in caplog.text
    capsys.readouterr()
    assert loaders_cli([*args, "--resume-at", "99999999"]) == 2
    out = capsys.readouterr()
    assert "rank=" not in out.out
    assert "--resume-at 99999999 is past the end of epoch 0: its 12 documents last" in out.err
    assert len(out.err.strip().splitlines()) == 1


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_worker_start_methods_give_the_in_process_batches(text_shards, start):
    """Forked and spawned worker processes deliver exactly the in-process batches (ids, resume records)."""
    d = text_shards[0]
    got = list(build_text_loader(_cfg(d, num_workers=2, worker_start=start)))
    want = list(build_text_loader(_cfg(d, num_workers=2), in_process=True))
    assert [b.consumed.tolist() for b in got] == [b.consumed.tolist() for b in want]
    assert all(a.input_ids.equal(b.input_ids) and list(a.keys) == list(b.keys) for a, b in zip(got, want))


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_killed_worker_is_reported_with_its_exit_status(tmp_path, start):
    """A worker that dies mid-epoch (SIGKILL while its pipe is full) stops the epoch with a
    WorkerError naming the worker and its status, instead of hanging or ending the epoch early."""
    from loaders.worker.pool import WorkerError, WorkerPool

    write_text_shards(str(tmp_path), n_docs=3000)
    loader = build_text_loader(_cfg(str(tmp_path), num_workers=1, micro_batch_size=1, seq_len=16))
    loader.stream.start(loader.progress)
    pool = WorkerPool(loader.stream, 1, start)
    os.kill(pool.procs[0].pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"loader worker 0 \(pid \d+\) exited with status -9"):
        for _ in pool:
            pass


@pytest.mark.parametrize("layout", ["token_blocks/none", "documents"])
@pytest.mark.parametrize("batching", ["packed", "token_budget"])
def test_empty_documents_after_the_last_batch_are_consumed(tmp_path, layout, batching):
    """Empty documents after a consumer's last batch used to ride with no batch and were lost from
    the state (1 of 13 consumed): the resume state must account for every document, and a checkpoint
    after the last batch must go on with the next epoch."""
    d = str(tmp_path / "s")
    blocks = layout.startswith("token_blocks")
    w = TokenBlockWriter(d, max_bytes=64 * 1024, block_tokens=2048) if blocks else ShardSequenceWriter(d, max_bytes=64 * 1024)
    for i in range(13):
        toks = np.arange(1, 40, dtype=np.uint16) if i == 0 else np.zeros(0, np.uint16)
        if blocks:
            w.add(f"e{i}", "t", toks)
        else:
            w.write(f"e{i}", encode_text_sample(toks, {"id": f"e{i}"}), tokens=len(toks))
    Manifest(shards=w.close(), vocab_size=100, layout=layout.split("/")[0]).save(d)
    for workers, world in ((0, 1), (2, 1), (0, 3)):
        cfg = _cfg(d, shuffle=False, batching=batching, max_tokens=64, num_workers=workers)
        loaders = [build_text_loader(cfg, rank=r, world_size=world, in_process=True) for r in range(world)]
        batches = [b for ld in loaders for b in ld]
        assert sum(b.num_doc_tokens for b in batches) == 39 and all(b.shape[0] for b in batches)
        state = merge_states([ld.state_dict() for ld in loaders])
        assert (state["consumed"], state["empty"]) == (13, 12)
        again = build_text_loader(cfg, in_process=True)
        again.load_state_dict(state)
        assert again.epoch == 1


def test_state_after_the_last_batch_counts_the_empty_documents_after_it(tmp_path):
    """A checkpoint taken right after the last batch (the trainer asks for no further batch) holds the
    empty documents its consumer met after it, so the resume goes on with the next epoch (it used to
    re-enter the finished epoch, find only empty documents and stop with 'the loader yielded no
    batch'). With 2 workers, the other worker's documents (all empty) may not have been delivered
    yet: the resumed epoch then yields no batch and the trainer goes on with the next one."""
    from trainer.train import micro_batches

    d = str(tmp_path / "s")
    w = TokenBlockWriter(d, max_bytes=64 * 1024, block_tokens=2048)
    for i in range(13):
        w.add(f"e{i}", "t", np.arange(1, 40, dtype=np.uint16) if i == 0 else np.zeros(0, np.uint16))
    Manifest(shards=w.close(), vocab_size=100, layout="token_blocks").save(d)
    for workers, consumed in ((0, 13), (2, 7)):
        cfg = _cfg(d, shuffle=False, num_workers=workers)
        ld = build_text_loader(cfg)
        next(iter(ld))  # the one batch, and no next() past it
        state = ld.state_dict()
        assert (state["consumed"], state["empty"]) == (consumed, consumed - 1)
        again = build_text_loader(cfg, in_process=True)
        again.load_state_dict(state)
        epoch, batch = next(micro_batches(again, again.epoch))
        assert epoch == 1 and batch.num_doc_tokens == 39


def test_pack_window_settings_are_named_in_errors_and_warnings(tmp_path, caplog):
    """A bad value is one error naming the field and the value; a window below one batch (rows mostly
    padding) is warned about, with the size to use."""
    with pytest.raises(ValueError, match=r"data.pack_window=0: use a number >= 1"):
        DataConfig(manifest="x", pack_window=0).validate()
    with pytest.raises(ValueError, match=r"data.prefetch_batches=-1: use a number >= 1"):
        DataConfig(manifest="x", prefetch_batches=-1).validate()
    d = str(tmp_path / "s")
    write_text_shards(d)
    with caplog.at_level(logging.WARNING, logger="loaders.rank.loader"):
        build_text_loader(_cfg(d, pack_window=100))
    assert "data.pack_window=100 tokens is less than one batch (seq_len x micro_batch_size = 128)" in caplog.text
    assert "use at least 4096" in caplog.text


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 8), workers=st.integers(0, 4), steps=st.integers(1, 40), nodes=st.sampled_from([1, 2]))
def test_resume_with_the_same_layout_repeats_the_batches_bit_for_bit(text_shards, world, workers, steps, nodes):
    """With pack_window=1 a resume at the same world size and worker count delivers exactly the batches
    the uninterrupted run would have: each consumer keeps the documents it was dealt (long ones
    too) and the workers' round-robin goes on where it was. It used to re-deal the documents left,
    so ranks whose counts differed (a long document) or several workers changed the order. Also with
    the ranks on 2 nodes (an even world size), each reading its own shards."""
    d, _ = text_shards
    per_node = world // nodes if world % nodes == 0 else world
    kw = dict(pack_window=1, micro_batch_size=1, num_workers=workers, ranks_per_node=per_node)
    _, whole = _run_ranks(d, world, **kw)
    steps = 1 + (steps - 1) % max(1, len(whole) // world - 1)  # stop inside the epoch (some rank has more)
    first, before = _run_ranks(d, world, steps=steps, **kw)
    state = merge_states([ld.state_dict() for ld in first])
    _, after = _run_ranks(d, world, state=state, **kw)
    assert len(before + after) == len(whole)
    assert all(a.input_ids.equal(b.input_ids) for a, b in zip(before + after, whole))


def test_resume_with_forked_workers_repeats_the_batches(text_shards):
    """The same with real worker processes (2 per rank, one rank)."""
    d, _ = text_shards
    cfg = _cfg(d, pack_window=1, micro_batch_size=1, num_workers=2)
    whole = [b.input_ids for b in build_text_loader(cfg)]
    ld = build_text_loader(cfg)
    it = iter(ld)
    before = [next(it).input_ids for _ in range(7)]
    state = ld.state_dict()
    it.close()
    again = build_text_loader(cfg)
    again.load_state_dict(state)
    after = [b.input_ids for b in again]
    assert len(before + after) == len(whole) and all(a.equal(b) for a, b in zip(before + after, whole))


def test_prefetch_thread_keeps_at_most_prefetch_batches_ready_whatever_a_packing_makes():
    """The background thread hands a run of 30 batches (one packing) over as room comes: the trainer never
    finds more than ``depth`` ready, and every batch comes once, in order."""
    from loaders.pack.packed import PackedBatch
    from loaders.rank.loader import _thread_prefetch

    def batch(v):
        return PackedBatch(np.full((1, 4), v, np.uint16), np.array([4], np.int32), np.array([1], np.int32))

    runs = ([batch(100 * r + i) for i in range(30)] for r in range(3))
    ready = []
    out = [int(b.input_ids[0, 0]) for b in _thread_prefetch(runs, 3, False, ready.append)]
    assert out == [100 * r + i for r in range(3) for i in range(30)]
    assert len(ready) == 91 and max(ready) <= 3  # an ask per batch, and the last one meets the end


@pytest.mark.parametrize("layout", ["token_blocks/none", "token_blocks/zstd"])  # one token array / many
@pytest.mark.parametrize("ids,pad", [({}, 0), ({"eos_id": 7}, 7), ({"eos_id": 7, "pad_id": 3}, 3)],
                         ids=["no-tokenizer-ids", "eos", "pad"])
def test_padding_cells_hold_the_tokenizers_pad_id_else_its_eos_id(tmp_path, layout, ids, pad):
    from shards.format.manifest import TokenizerIdentity
    d = str(tmp_path)
    docs = write_text_shards(d, n_docs=16, layout=layout)
    m = Manifest.load(d)
    m.tokenizer_identity = TokenizerIdentity(kind="hf", **ids) if ids else None
    m.save(d)
    batches = list(build_text_loader(_cfg(d), in_process=True))
    padding = np.concatenate([b.input_ids[b.document_ids < 0].numpy() for b in batches])
    assert len(padding) > 0 and set(padding.tolist()) == {pad}
    _assert_epoch(_chunks(batches), docs, 64, build_text_loader(_cfg(d), in_process=True))


@pytest.mark.parametrize("vocab", [100_277, 128_256])  # cl100k_base, Llama 3
def test_vocabularies_above_uint16_round_trip_as_uint32(tmp_path, vocab):
    from shards.format.tokens import check_token_ids
    from pipelines.stages.tokenize import token_dtype
    dtype = token_dtype(vocab)
    assert dtype == np.uint32
    rng = np.random.default_rng(vocab)
    docs = {f"doc{i:02d}": rng.integers(65_000, vocab, int(rng.integers(20, 200))).astype(dtype) for i in range(12)}
    docs["doc00"][0] = vocab - 1  # the largest id survives
    w = TokenBlockWriter(str(tmp_path), block_tokens=256, compression="zstd")
    for key, toks in docs.items():
        w.add(key, "test", toks)
    Manifest(shards=w.close(), vocab_size=vocab, token_dtype="uint32", layout="token_blocks").save(str(tmp_path))
    batches = list(build_text_loader(_cfg(str(tmp_path)), in_process=True))
    for b in batches:
        check_token_ids(b.host_ids, vocab, "batch")
    delivered = np.concatenate([b.input_ids[b.document_ids >= 0].numpy() for b in batches])
    assert delivered.max() == vocab - 1 and delivered.min() >= 65_000
    assert sorted(delivered.tolist()) == sorted(np.concatenate(list(docs.values())).tolist())
