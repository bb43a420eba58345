"""Near-dedup as clusters (pipelines.stages.near_dedup): connected components of the similar LSH
candidate pairs by large-star/small-star rounds, one document kept per cluster (the smallest id), on
real Beam runs; a chain A~B~C where A and C alone would not match goes whole, a chain longer than a
few rounds settle is reported and settled (or fails clearly past ``dedup.near_resolve_max``), the
duplicates listing names the kept representative, and the DirectRunner and a Dask cluster agree.
Components against a reference union-find written here (hypothesis)."""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import uuid

import apache_beam as beam
import cloudpickle
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.accounting.stats import NAMESPACE, RUN_SOURCE
from pipelines.config import DedupConfig, PipelineConfig, TokenizerConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.keys import doc_keys
from pipelines.stages.near_dedup import NEIGHBOURS_METRIC, Clusters, minhash, settle, similarity
from pipelines.stages.tokenize import train_sentencepiece
from tests.support.near import near_dedup
from tests.support.pipeline import synthetic_config

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the Dask workers cannot import this module

CFG = DedupConfig(near=True, num_perm=128, bands=32)
BASE = [f"w{i}" for i in range(300)]


def mutate(words: list[str], start: int, tag: str) -> list[str]:
    """``words`` with 5 words from ``start`` on (every tenth) replaced."""
    out = list(words)
    for j in range(5):
        out[start + 10 * j] = f"{tag}{j}"
    return out


A = " ".join(BASE)
B = " ".join(mutate(BASE, 0, "b"))
C = " ".join(mutate(mutate(BASE, 0, "b"), 150, "c"))
OTHER = " ".join(f"v{i}" for i in range(300))


def long_chain(n: int = 10) -> list[str]:
    """``n`` texts of 700 words, each the one before with 11 more words replaced (6 apart, past the
    last change): under ``CFG`` neighbours match (estimate >= 0.82) and texts two apart do not (<= 0.77)."""
    words, out = [f"w{i}" for i in range(700)], []
    for k in range(n):
        out.append(" ".join(words))
        for j in range(11):
            words[k * 66 + j * 6] = f"s{k}x{j}"
    return out


CHAIN = long_chain()
CHAIN_IDS = [f"c{k:02d}" for k in range(len(CHAIN))]  # in chain order: the slowest order for the rounds


def union_find(pairs) -> dict[str, str]:
    """Reference: ``{id: smallest id of its component}`` for every id of ``pairs`` but those smallest ids."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in pairs:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    return {x: root(x) for x in parent if root(x) != x}


def direct_runner() -> DirectRunner:
    runner = DirectRunner()
    runner.is_interactive()  # skip the Prism download attempt (offline)
    return runner


def test_the_chains_are_chains():
    a, b, c = (minhash(t, CFG) for t in (A, B, C))
    assert similarity(a, b) >= CFG.threshold and similarity(b, c) >= CFG.threshold > similarity(a, c)
    sigs = [minhash(t, CFG) for t in CHAIN]
    for i, x in enumerate(sigs):
        for j in range(i + 1, len(sigs)):
            assert (similarity(x, sigs[j]) >= CFG.threshold) == (j == i + 1)


graphs = st.lists(st.tuples(st.sampled_from("abcdefghijklmnop"), st.sampled_from("abcdefghijklmnop")), max_size=30)


@settings(max_examples=300, deadline=None)
@given(graphs)
def test_settle_matches_a_union_find(pairs):
    assert settle(set(pairs)) == union_find(pairs)


def _dump(element, folder: str) -> None:
    """Sink for tests: one JSON file per element."""
    with open(os.path.join(folder, uuid.uuid4().hex), "w") as f:
        json.dump(element, f)


def _read(folder: str) -> list:
    return [json.load(open(os.path.join(folder, n))) for n in sorted(os.listdir(folder))]


def _collected(build) -> list[list]:
    """Run ``build(p)`` (it returns PCollections) on the DirectRunner; the elements of each, and the result."""
    with tempfile.TemporaryDirectory() as tmp:
        p = beam.Pipeline(runner=direct_runner())
        folders = []
        for i, pcoll in enumerate(build(p)):
            folders.append(os.path.join(tmp, str(i)))
            os.mkdir(folders[-1])
            pcoll | f"Dump{i}" >> beam.Map(_dump, folders[-1])
        result = p.run()
        result.wait_until_finish()
        return [_read(f) for f in folders] + [result]


def _clusters(pairs, rounds: int, resolve_max: int = 1000) -> tuple[dict, int]:
    """``Clusters`` on the DirectRunner: ``({id: representative}, near_unresolved count)``."""
    found, unresolved, _ = _collected(lambda p: p | beam.Create(pairs or [("x", "x")]) | Clusters(rounds, resolve_max))
    found = [tuple(x) for x in found]
    unresolved = [((tuple(key)), n) for key, n in unresolved]
    out = dict(found)
    assert len(out) == len(set(found))  # a second representative (settled roots) is the same one
    assert all(key == (RUN_SOURCE, "near_unresolved") for key, _ in unresolved)
    return out, sum(n for _, n in unresolved)


@settings(max_examples=8, deadline=None)
@given(graphs, st.integers(1, 3))
def test_clusters_match_a_union_find_whatever_the_rounds(pairs, rounds):
    """Few rounds leave some graphs unfinished: settled after the rounds, the result is the same."""
    assert _clusters(pairs, rounds)[0] == union_find(pairs)


def test_a_sorted_chain_needs_log_rounds_and_too_few_are_reported():
    ids = [f"n{i:03d}" for i in range(65)]  # in chain order: ceil(log2(64)) = 6 rounds
    pairs = list(zip(ids[1:], ids))
    expected = {x: "n000" for x in ids[1:]}
    assert _clusters(pairs, 6) == (expected, 0)
    reps, unresolved = _clusters(pairs, 5)
    assert reps == expected and unresolved > 0


def _near_dedup(docs: list[Doc], cfg: DedupConfig):
    """NearDedup on the DirectRunner, on the documents' band rows and signatures (as the job reads
    them from the split records): (kept ids, listed (id, duplicate_of), run-level events, largest
    neighbourhood)."""
    pairs = doc_keys(docs, "s0", 0, cfg)

    def build(p):
        out = near_dedup(p, pairs, cfg, runs)
        return (out.dropped | beam.Map(lambda place: place.index),
                out.duplicates | beam.Flatten() | beam.Map(lambda line: (json.loads(line)["id"], json.loads(line)["duplicate_of"])),
                out.events | beam.Filter(lambda e: e[0][0] == RUN_SOURCE))

    with tempfile.TemporaryDirectory() as runs:
        dropped, listed, run_events, result = _collected(build)
    kept = [doc.id for i, doc in enumerate(docs) if i not in set(dropped)]
    listed = [tuple(x) for x in listed]
    run_events = [(tuple(key), n) for key, n in run_events]
    held = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(NEIGHBOURS_METRIC))
    return sorted(kept), sorted(listed), run_events, max(d.committed.max for d in held["distributions"])


def test_a_chain_is_one_cluster_kept_by_its_smallest_id():
    """The middle of the chain has the largest id: comparing each document only with a smaller
    keeper would drop it and keep both ends."""
    docs = [Doc("a", A, "s"), Doc("c", B, "s"), Doc("b", C, "s"), Doc("d", OTHER, "s")]
    kept, listed, run_events, _ = _near_dedup(docs, CFG)
    assert kept == ["a", "d"] and listed == [("b", "a"), ("c", "a")] and run_events == []


def test_a_long_chain_converges_across_rounds():
    """10 documents in chain order take 4 rounds: the default 8 finish it, one key holding at most
    the cluster (10 ids)."""
    docs = [Doc(i, t, "s") for i, t in zip(CHAIN_IDS, CHAIN)] + [Doc("a", A, "s"), Doc("b", B, "s")]
    kept, listed, run_events, held = _near_dedup(docs, CFG)
    assert kept == ["a", "c00"] and listed == [("b", "a")] + [(i, "c00") for i in CHAIN_IDS[1:]]
    assert run_events == [] and 1 <= held <= len(CHAIN)


def test_too_few_rounds_are_settled_and_reported(caplog):
    cfg = DedupConfig(near=True, num_perm=CFG.num_perm, bands=CFG.bands, near_rounds=1)
    docs = [Doc(i, t, "s") for i, t in zip(CHAIN_IDS, CHAIN)]
    with caplog.at_level(logging.WARNING):
        kept, listed, run_events, _ = _near_dedup(docs, cfg)
    assert kept == ["c00"] and listed == [(i, "c00") for i in CHAIN_IDS[1:]]
    ((key, n),) = run_events
    assert key == (RUN_SOURCE, "near_unresolved") and n > 0
    assert f"did not converge in dedup.near_rounds=1 rounds: {n} label pairs" in caplog.text


def test_too_few_rounds_past_the_bound_fail_with_what_to_do():
    cfg = DedupConfig(near=True, num_perm=CFG.num_perm, bands=CFG.bands, near_rounds=1, near_resolve_max=2)
    docs = [Doc(i, t, "s") for i, t in zip(CHAIN_IDS, CHAIN)]
    with pytest.raises(Exception, match=r"did not converge in dedup.near_rounds=1 rounds: more than "
                                        r"dedup.near_resolve_max=2 label pairs still disagree; raise dedup.near_rounds"):
        _near_dedup(docs, cfg)


def _job_input(tmp_path):
    rows = ([{"id": "a", "text": A}, {"id": "c", "text": B}, {"id": "b", "text": C}, {"id": "d", "text": OTHER}]
            + [{"id": i, "text": t} for i, t in zip(CHAIN_IDS, CHAIN)])
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(train_sentencepiece([A, OTHER] * 20, TokenizerConfig(vocab_size=300)))


def _job_config(tmp_path, rounds: int) -> PipelineConfig:
    cfg = synthetic_config()
    cfg.dedup.near, cfg.dedup.num_perm, cfg.dedup.bands, cfg.dedup.near_rounds = True, CFG.num_perm, CFG.bands, rounds
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    return cfg


def _listed(out) -> list[tuple[str, str]]:
    return sorted((d["id"], d["duplicate_of"]) for part in (out / "duplicates").glob("*.jsonl")
                  for d in map(json.loads, part.read_text().splitlines()))


EXPECTED = [("in.jsonl/b", "in.jsonl/a"), ("in.jsonl/c", "in.jsonl/a")] + [
    (f"in.jsonl/{i}", "in.jsonl/c00") for i in CHAIN_IDS[1:]]


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    pytest.importorskip("distributed")
    from tests.support.local_engines import child_env, start_dask

    engine = start_dask(tmp_path_factory.mktemp("dask-logs"), workers=2, env=child_env())
    yield engine
    engine.stop()


@pytest.mark.parametrize("rounds", [8, 2])
def test_the_ledger_listing_and_stats_on_the_direct_runner_and_dask(tmp_path, dask_cluster, rounds, capsys):
    _job_input(tmp_path)
    cfg = _job_config(tmp_path, rounds)
    direct = run(str(tmp_path / "in.jsonl"), str(tmp_path / "direct"), cfg, report=False)
    total = direct["total"]
    assert total["filtered"] == {"near_duplicate": 11} and total["kept"] == 3 and total["balanced"]
    assert _listed(tmp_path / "direct") == EXPECTED
    assert (direct["run"]["near_unresolved_pairs"] > 0) == (rounds == 2)
    assert ("raise dedup.near_rounds" in capsys.readouterr().err) == (rounds == 2)
    dask = run(str(tmp_path / "in.jsonl"), str(tmp_path / "dask"), cfg, report=False,
               beam_args=["--runner=DaskRunner", f"--dask_client_address={dask_cluster.address}"])
    assert _listed(tmp_path / "dask") == EXPECTED
    assert {k: v for k, v in dask.items() if k not in ("seconds", "metrics")} == {
        k: v for k, v in direct.items() if k not in ("seconds", "metrics")}
