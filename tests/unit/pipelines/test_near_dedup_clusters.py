"""Near-dedup as clusters (pipelines.stages.near_dedup): connected components of the similar LSH
candidate pairs, one document kept per cluster (the smallest id), on a real Beam run; a chain
A~B~C where A and C alone would not match goes whole, and the duplicates listing names the kept
representative. Components against a plain graph search (hypothesis)."""
from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.config import DedupConfig, TokenizerConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.near_dedup import Components, NearDedup, minhash, similarity
from pipelines.stages.tokenize import train_sentencepiece
from tests.support.pipeline import synthetic_config

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


def test_the_chain_is_a_chain():
    a, b, c = (minhash(t, CFG) for t in (A, B, C))
    assert similarity(a, b) >= CFG.threshold and similarity(b, c) >= CFG.threshold > similarity(a, c)


def _components(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Each id of ``pairs`` → the smallest id it reaches, by a plain graph search."""
    nbrs: dict[str, set[str]] = {}
    for x, y in pairs:
        nbrs.setdefault(x, set()).add(y)
        nbrs.setdefault(y, set()).add(x)
    out = {}
    for start in nbrs:
        seen, todo = {start}, [start]
        while todo:
            for n in nbrs[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        out[start] = min(seen)
    return out


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdefghij"), st.sampled_from("abcdefghij")), max_size=15),
       st.integers(0, 15))
def test_components_match_a_graph_search_whatever_the_split_into_bundles(pairs, cut):
    fn = Components()
    left, right = fn.create_accumulator(), fn.create_accumulator()
    for pair in pairs[:cut]:
        fn.add_input(left, pair)
    for pair in pairs[cut:]:
        fn.add_input(right, pair)
    assert fn.extract_output(fn.merge_accumulators([right, left])) == _components(pairs)


def test_a_chain_is_one_cluster_kept_by_its_smallest_id():
    """The middle of the chain has the largest id: comparing each document only with a smaller
    keeper would drop it and keep both ends."""
    docs = [Doc("a", A, "s"), Doc("c", B, "s"), Doc("b", C, "s"), Doc("d", OTHER, "s")]
    runner = DirectRunner()
    runner.is_interactive()  # skip the Prism download attempt (offline)
    with beam.Pipeline(runner=runner) as p:
        out = p | beam.Create(docs) | NearDedup(CFG)
        assert_that(out.docs | beam.Map(lambda d: d.id), equal_to(["a", "d"]), label="Kept")
        assert_that(out.duplicates | beam.Map(lambda line: (json.loads(line)["id"], json.loads(line)["duplicate_of"])),
                    equal_to([("b", "a"), ("c", "a")]), label="Listed")


def test_the_ledger_and_listing_on_a_job_run(tmp_path):
    rows = [{"id": "a", "text": A}, {"id": "c", "text": B}, {"id": "b", "text": C}, {"id": "d", "text": OTHER}]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(train_sentencepiece([A, OTHER] * 20, TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()
    cfg.dedup.near, cfg.dedup.num_perm, cfg.dedup.bands = True, CFG.num_perm, CFG.bands
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    total = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)["total"]
    assert total["filtered"] == {"near_duplicate": 2} and total["kept"] == 2 and total["balanced"]
    listed = sorted((d["id"], d["duplicate_of"]) for part in (tmp_path / "out" / "duplicates").glob("*.jsonl")
                    for d in map(json.loads, part.read_text().splitlines()))
    assert listed == [("in.jsonl/b", "in.jsonl/a"), ("in.jsonl/c", "in.jsonl/a")]
