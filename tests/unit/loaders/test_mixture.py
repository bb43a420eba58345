"""The mixture loader over real shards of two sources: exactly once within each source's epoch for
any world size and worker count, a source running into its next epoch while the other continues,
resume at another world size / worker count / weights with no duplicate and no gap, tokens per
source in the metrics, clear config errors, and ``python -m loaders keys`` naming each key's source."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loaders import DataConfig, build_text_loader
from loaders.tools.cli import main as loaders_cli
from loaders.read.shard_reader import ShardReader
from shards import Manifest
from colaflow.config import ConfigError
from tests.unit.loaders.test_loader import write_text_shards

SIZES = {"big": 40, "small": 12}


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    out = {}
    for i, (name, n) in enumerate(SIZES.items()):
        d = str(root / name)
        os.makedirs(d)
        out[name] = (d, write_text_shards(d, n, seed=10 + i))
    return out


def _cfg(srcs, weights=(0.5, 0.5), **kw):
    base = dict(mixture=[{"name": n, "manifest": srcs[n][0], "weight": w} for n, w in zip(SIZES, weights)],
                seq_len=64, micro_batch_size=2, num_workers=0, pack_window=16, shuffle_block=8,
                step_policy="uneven")
    base.update(kw)
    return DataConfig(**base)


def _run(srcs, world, steps=None, state=None, epochs=1, weights=(0.5, 0.5), **kw):
    """All ranks in lockstep for ``steps`` steps (None: ``epochs`` mixture epochs). Returns loaders and
    ``[(epoch, batch)]``."""
    loaders = [build_text_loader(_cfg(srcs, weights, **kw), rank=r, world_size=world, in_process=True)
               for r in range(world)]
    if state is not None:
        for ld in loaders:
            ld.load_state_dict(state)
    out, step, epoch = [], 0, loaders[0].epoch
    stop = epoch + epochs
    while steps is not None or epoch < stop:
        for ld in loaders:
            ld.set_epoch(epoch)
        its = [iter(ld) for ld in loaders]
        while its and (steps is None or step < steps):
            for it in list(its):
                try:
                    out.append((epoch, next(it)))
                except StopIteration:
                    its.remove(it)
            step += 1
        if steps is not None:
            break
        epoch += 1
    return loaders, out


def _delivered(loader, batches, got=None):
    """``{(source, item): {chunk: tokens}}`` (added to ``got``) of batches ``loader`` delivered; fails on
    a chunk delivered twice."""
    got = {} if got is None else got
    for epoch, b in batches:
        src, item = loader.sources.plan.epoch_draws(epoch)
        segs = []
        for r in range(b.input_ids.shape[0]):
            d = b.document_ids[r]
            segs += [b.input_ids[r][d == k].numpy() for k in range(int(d.max()) + 1 if (d >= 0).any() else 0)]
        real = [tuple(c) for c in b.consumed.tolist() if c[2] > 0]
        assert len(real) == len(segs)
        for (p, c, _), seg in zip(real, segs):
            doc = got.setdefault((int(src[p]), int(item[p])), {})
            assert c not in doc, f"chunk {c} of source item {(int(src[p]), int(item[p]))} delivered twice"
            doc[c] = seg
    return got


def _check(loader, srcs, got, complete_to=None):
    """Per source: items 0..k-1 delivered (no gap, none twice), each document whole and equal to the
    shard's tokens, each source epoch holding every key once. ``complete_to``: expected k per source."""
    order = loader.stream.order()
    for s, name in enumerate(SIZES):
        docs = srcs[name][1]
        items = sorted(i for (ss, i) in got if ss == s)
        assert items == list(range(len(items))), f"{name}: items delivered with a gap"
        if complete_to is not None:
            assert len(items) == complete_to[s]
        reader = ShardReader(Manifest.load(srcs[name][0]), srcs[name][0], loader.cache)
        shard, local = order.locate(np.full(len(items), s, np.int32), np.array(items, np.int64))
        keys = [reader.key(int(g) - int(order.offsets[s]), int(i)) for g, i in zip(shard, local)]
        reader.close()
        for e in range(0, len(items), len(docs)):  # each source epoch: every key once
            epoch_keys = keys[e:e + len(docs)]
            assert len(set(epoch_keys)) == len(epoch_keys)
            if len(epoch_keys) == len(docs):
                assert set(epoch_keys) == set(docs)
        for item, key in zip(items, keys):
            chunks = got[(s, item)]
            toks = np.concatenate([chunks[c] for c in sorted(chunks)])
            assert sorted(chunks) == list(range(len(chunks))) and toks.tolist() == docs[key].tolist()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 5), workers=st.integers(0, 3), seed=st.integers(0, 3), nodes=st.sampled_from([1, 2]),
       lanes=st.sampled_from([1, 4]))
def test_exactly_once_within_each_source_epoch_any_world_and_workers(two_sources, world, workers, seed, nodes, lanes):
    """Also with the ranks on 2 nodes (when the world size is even), each reading its own shards."""
    per_node = world // nodes if world % nodes == 0 else world
    loaders, batches = _run(two_sources, world, epochs=2, num_workers=workers, seed=seed, ranks_per_node=per_node,
                            shard_lanes=lanes)
    ld = loaders[0]
    got = _delivered(ld, batches)
    _check(ld, two_sources, got, complete_to=ld.sources.plan.first_items(2))
    assert ld.sources.plan.first_items(2)[1] > SIZES["small"]  # the small source went on into its next epoch


def test_small_source_starts_its_next_epoch_logged_and_counted(two_sources, caplog):
    with caplog.at_level(logging.INFO, logger="loaders.mixture.mixture"):
        loaders, batches = _run(two_sources, 1, epochs=1)
    m = loaders[0].metrics()["sources"]
    assert m["small"]["epoch"] >= 1 and m["big"]["epoch"] == 0
    assert any("'small': epoch 0 read, starting its epoch 1" in r.getMessage() for r in caplog.records)
    assert m["big"]["tokens"] + m["small"]["tokens"] == sum(b.num_doc_tokens for _, b in batches)
    got = _delivered(loaders[0], batches)
    for s, name in enumerate(SIZES):
        assert m[name]["tokens"] == sum(len(t) for (ss, _), c in got.items() if ss == s for t in c.values())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.tuples(st.integers(1, 4), st.integers(0, 2)), new=st.tuples(st.integers(1, 5), st.integers(0, 2)),
       steps=st.integers(0, 20), weights=st.sampled_from([(0.5, 0.5), (0.9, 0.1), (0.2, 0.8)]))
@example(old=(4, 0), new=(1, 0), steps=19, weights=(0.5, 0.5))  # saved after the epoch's last batch, 3 of 4 ranks ended
def test_resume_other_world_size_workers_and_weights_no_duplicate_no_gap(two_sources, old, new, steps, weights):
    first, before = _run(two_sources, old[0], steps=steps, num_workers=old[1])
    state = first[0].global_state_dict() if old[0] == 1 else first[0].sources.merge([ld.state_dict() for ld in first])
    second, after = _run(two_sources, new[0], state=state, epochs=2, num_workers=new[1], weights=weights)
    ld = second[0]
    assert np.allclose(ld.sources.plan.shares, np.array(weights) / sum(weights))
    got = _delivered(ld, after, _delivered(first[0], before))
    end = ld.epoch + 1  # every epoch run to its end
    _check(ld, two_sources, got, complete_to=ld.sources.plan.first_items(end))
    merged = ld.sources.merge([x.state_dict() for x in second])
    total = sum(b.num_doc_tokens for _, b in before + after)
    assert sum(s["tokens"] for s in merged["sources"]) == total  # per-source tokens survive the resume


def test_same_weights_resume_continues_the_same_order(two_sources):
    _, whole = _run(two_sources, 2, epochs=1, pack_window=1)
    first, before = _run(two_sources, 2, steps=6, pack_window=1)
    state = first[0].sources.merge([ld.state_dict() for ld in first])
    _, after = _run(two_sources, 2, state=state, epochs=1, pack_window=1)
    seq = lambda bs: [(e, p, c) for e, b in bs for p, c, n in b.consumed.tolist() if n > 0]  # noqa: E731
    assert sorted(seq(before + after)) == sorted(seq(whole))


def test_bad_mixture_configs_are_named(two_sources):
    d = two_sources["big"][0]
    for mixture, words in [
        ([{"manifest": d, "weight": 1, "epochs": 2}], "set one of"),
        ([{"manifest": d, "weight": 1}, {"manifest": d, "weight": 1}], "names repeat"),
        ([{"name": "a", "manifest": d, "weight": 1}, {"name": "b", "manifest": d, "epochs": 1}], "weights for every"),
        ([{"manifest": d, "wieght": 1}], "data.mixture[0].wieght"),
        ([{"name": "x", "manifest": d + "/nope", "weight": 1}], "mixture source 'x'"),
    ]:
        with pytest.raises((ConfigError, FileNotFoundError, ValueError), match=words.replace("[", r"\[").replace("]", r"\]")):
            build_text_loader(DataConfig(mixture=mixture), in_process=True)


def test_sources_written_by_different_tokenizers_are_refused_and_one_tokenizer_pads(tmp_path):
    from shards.format.manifest import TokenizerIdentity
    srcs = {}
    for i, name in enumerate(SIZES):
        d = str(tmp_path / name)
        os.makedirs(d)
        srcs[name] = (d, write_text_shards(d, 12, seed=i))
    def mark(sha_small):
        for name, sha in (("big", "a" * 64), ("small", sha_small)):
            m = Manifest.load(srcs[name][0])
            m.tokenizer_identity = TokenizerIdentity(kind="hf", sha256=sha, eos_id=5)
            m.save(srcs[name][0])
    mark("b" * 64)
    with pytest.raises(ValueError, match=r"tokenized by different tokenizer files \(sha256 \{'big': 'aaaaaaaaaaaa', "
                                         r"'small': 'bbbbbbbbbbbb'\}\); preprocess them with one tokenizer"):
        build_text_loader(_cfg(srcs), in_process=True)
    mark("a" * 64)
    batches = list(build_text_loader(_cfg(srcs), in_process=True))
    padding = np.concatenate([b.input_ids[b.document_ids < 0].numpy() for b in batches])
    assert len(padding) > 0 and set(padding.tolist()) == {5}


def test_state_of_a_single_dataset_is_refused(two_sources):
    single = build_text_loader(DataConfig(manifest=two_sources["big"][0]), in_process=True)
    mix = build_text_loader(_cfg(two_sources), in_process=True)
    with pytest.raises(ValueError, match="not a mixture state"):
        mix.load_state_dict(single.state_dict())


@pytest.mark.parametrize("edit, match", [
    (lambda s: s.pop("sources"), "KeyError: 'sources'"),  # was a KeyError
    (lambda s: s["sources"].pop(), r"sources \['big'\] are not"),  # was an IndexError
    (lambda s: s["sources"][0].update(cursor=-4), "negative cursor"),  # was accepted: items read again
    (lambda s: s["sources"][0].update(done=[-4]), "negative cursor or item"),
    # chunks 0 and 5 of 2 would count as both: the item consumed without its chunk 1
    (lambda s: s["sources"][0].update(partial=[[s["sources"][0]["cursor"] + 3, 2, [0, 5]]]), "partial chunk"),
])
def test_hand_edited_mixture_states_are_refused_with_a_value_error(two_sources, edit, match):
    loaders, _ = _run(two_sources, 2, steps=6)
    state = loaders[0].sources.merge([ld.state_dict() for ld in loaders])
    edit(state)
    with pytest.raises(ValueError, match=f"mixture loader state is malformed.*{match}"):
        build_text_loader(_cfg(two_sources), in_process=True).load_state_dict(state)


def test_keys_cli_prints_each_keys_source(two_sources, tmp_path):
    import yaml
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"mixture": _cfg(two_sources).mixture, "shuffle_block": 8}}))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert loaders_cli(["keys", "--config", str(cfg), "--world-size", "2", "--workers", "2"]) == 0
    lines = [ln for ln in out.getvalue().splitlines() if not ln.startswith("#")]
    by_source = {name: [ln for ln in lines if f" source={name} " in ln] for name in SIZES}
    assert all(by_source.values()) and sum(map(len, by_source.values())) == len(lines)
    small_keys = [ln.rsplit("/", 1)[1] for ln in by_source["small"]]
    assert set(small_keys) == set(two_sources["small"][1])  # the small source's full epoch, keys from its shards


def test_budgets_read_each_source_its_epochs_per_mixture_epoch(two_sources):
    mixture = [{"name": "big", "manifest": two_sources["big"][0], "epochs": 1},
               {"name": "small", "manifest": two_sources["small"][0], "epochs": 2}]
    ld = build_text_loader(DataConfig(mixture=mixture), in_process=True)
    assert ld.sources.plan.first_items(1) == [SIZES["big"], 2 * SIZES["small"]]
    assert ld.sources.plan.first_items(3) == [3 * SIZES["big"], 6 * SIZES["small"]]


def test_worker_processes_read_a_mixture_of_layouts_like_in_process(two_sources, tmp_path):
    """A token-block source mixed with a one-sample-per-document source, read by real worker processes
    (:mod:`loaders.worker.pool`): the same batches as in process, every document of the epoch exactly once;
    the mixture's stream unpickles in a worker without importing torch."""
    docs_dir = str(tmp_path / "docs")
    os.makedirs(docs_dir)
    per_doc = write_text_shards(docs_dir, SIZES["small"], seed=11, layout="documents")
    srcs = {"big": two_sources["big"], "small": (docs_dir, per_doc)}
    cfg = _cfg(srcs, (0.6, 0.4), num_workers=2)
    mixture = build_text_loader(cfg, in_process=True).sources  # each source read in its own layout
    assert [s.manifest.layout for s in mixture.sources] == ["token_blocks", "documents"]
    got = list(build_text_loader(cfg, rank=0, world_size=1))
    ld = build_text_loader(cfg, rank=0, world_size=1, in_process=True)
    want = list(ld)
    assert [b.consumed.tolist() for b in got] == [b.consumed.tolist() for b in want]
    assert all(a.input_ids.equal(b.input_ids) for a, b in zip(got, want))
    _check(ld, srcs, _delivered(ld, [(0, b) for b in got]), complete_to=ld.sources.plan.first_items(1))
    probe = ("import sys, loaders.mixture.sources, loaders.worker.pool; "
             "sys.exit(1 if 'torch' in sys.modules else 0)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    assert subprocess.run([sys.executable, "-c", probe], env=env).returncode == 0


def test_empty_documents_are_counted_with_bulk_records(tmp_path):
    """The mixture counts empty documents (metrics and state) though resume records are applied in
    bulk, not per batch."""
    from shards import TokenBlockWriter

    srcs = {}
    for name, n in SIZES.items():
        d = str(tmp_path / name)
        w = TokenBlockWriter(d, max_bytes=64 * 1024, block_tokens=600)
        for i in range(n):
            w.add(f"{name}{i}", name, np.arange(1, 30, dtype=np.uint16) if i % 3 else np.zeros(0, np.uint16))
        Manifest(shards=w.close(), vocab_size=100, layout="token_blocks").save(d)
        srcs[name] = (d, None)
    ld = build_text_loader(_cfg(srcs), in_process=True)
    assert sum(b.num_doc_tokens for b in ld) > 0
    state = ld.state_dict()
    assert ld.metrics()["empty"] == ld.progress.empty == state["empty"] + state["empty_new"] >= 10
