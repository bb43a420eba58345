"""Bag partitions held as pickled bytes between the Dask tasks of a Beam job
(:mod:`pipelines.io.frames`), and the two ways of moving elements between them: a shuffle by
key (:func:`shuffle`, read back by :func:`group_pieces` or :func:`group`) and an even spread
(:func:`spread`). Dask's own bag operations that look into partitions (``groupby``,
``repartition``) do not apply to bytes partitions, hence these. Why bytes: ``pipelines/README.md``.
"""
from __future__ import annotations

import math

import dask.bag as db
from apache_beam.runners.dask.transform_evaluator import defenestrate
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from pipelines.io.frames import PartWriter, decode, decode_list, encode
from pipelines.runners.dask.combine import group_key


def _key_hash(key) -> int:
    # An int key is its own hash: N keys 0..N-1 (shard buckets, output parts) then go to N
    # different partitions of a group with at least N, one shard per task, where hashed keys
    # put two or three shards' samples in some tasks. Other keys are hashed as dask's own task
    # shuffle does, the same in every worker process (Python's hash() of a str is not).
    if type(key) is int:
        return key
    return int(tokenize(key), 16)


def _split_by_key(part: bytes, n: int) -> tuple:
    """``(key, value)`` elements of one partition → ``n`` encoded pieces of ``(key, value)`` by the
    hash of :func:`group_key`, values unwrapped from Beam's ``WindowedValue`` (a third fewer
    objects to decode)."""
    pieces = [PartWriter() for _ in range(n)]
    for key, value in decode(part):
        pieces[_key_hash(group_key(key)) % n].append((key, defenestrate(value)))
    return tuple(p.getvalue() for p in pieces)


def group_pieces(pieces: list):
    """Pieces of one group output partition → ``(key, [values])`` per key as :func:`group_key`
    tells keys apart (a generator), keys in order of first appearance (the key object first
    seen is the one output), values in piece order. Each key's values are released as the
    consumer moves on to the next key."""
    grouped: dict = {}
    for piece in pieces:
        for key, value in decode(piece):
            gkey = group_key(key)
            entry = grouped.get(gkey)
            if entry is None:
                grouped[gkey] = (key, [value])
            else:
                entry[1].append(value)
    for gkey in list(grouped):
        yield grouped.pop(gkey)


def group(pieces: list) -> bytes:
    """:func:`group_pieces` encoded: the partition of a group for consumers that read bytes."""
    return encode(group_pieces(pieces))


def _pieces(pieces: list) -> list:
    return pieces


def _split_even(part: bytes, n: int) -> tuple:
    """One partition → ``n`` encoded contiguous pieces of (almost) equal length."""
    items = decode_list(part)
    size = -(-len(items) // n) if items else 0
    return tuple(encode(items[i * size:(i + 1) * size]) for i in range(n))


def _pick(pieces: tuple, i: int) -> bytes:
    return pieces[i]


def _pieces_bag(bag, n_out: int, split, split_args: tuple, join, prefix: str, pieces_per_output) -> db.Bag:
    """One task per input partition runs ``split(part, *split_args)`` (a tuple of encoded pieces),
    one small task per piece picks it out (so an output task fetches only its own pieces), and
    output partition ``j`` is ``join`` of ``pieces_per_output(j)`` (a list of ``(input, piece)``)."""
    token = tokenize(bag.name, n_out, split, split_args, join)
    split_name, pick_name, out_name = f"{prefix}-split-{token}", f"{prefix}-piece-{token}", f"{prefix}-{token}"
    dsk: dict = {(split_name, i): (split, (bag.name, i), *split_args) for i in range(bag.npartitions)}
    for j in range(n_out):
        keys = []
        for i, p in pieces_per_output(j):
            dsk[(pick_name, i, p)] = (_pick, (split_name, i), p)
            keys.append((pick_name, i, p))
        dsk[(out_name, j)] = (join, keys)
    return db.Bag(HighLevelGraph.from_collections(out_name, dsk, dependencies=[bag]), out_name, n_out)


def _first(pieces: list) -> bytes:
    return pieces[0]


# A shuffle of more than this many (input, output) pieces runs in two stages
ONE_STAGE_PIECES = 64
TWO_STAGE_MIN_OUTPUTS = 8  # ... and has more outputs than this (fewer gain nothing from a second stage)


def _split_routed(part: bytes, n: int, g: int) -> tuple:
    """Stage 1 of a two-stage shuffle: ``(key, value)`` elements → ``g`` encoded pieces of
    ``(output partition j, (key, value))`` by the last digit of ``j = hash % n`` in base ``g``
    (values unwrapped as by :func:`_split_by_key`)."""
    pieces = [PartWriter() for _ in range(g)]
    for key, value in decode(part):
        j = _key_hash(group_key(key)) % n
        pieces[j % g].append((j, (key, defenestrate(value))))
    return tuple(p.getvalue() for p in pieces)


def _join_split(pieces: list, g: int, a: int) -> tuple:
    """Stage 2 of a two-stage shuffle: the stage-1 pieces of one block of inputs → ``a`` encoded
    pieces of elements by the first digit of their output partition ``j`` (``j // g``)."""
    out = [PartWriter() for _ in range(a)]
    for piece in pieces:
        for j, item in decode(piece):
            out[j // g].append(item)
    return tuple(p.getvalue() for p in out)


def _two_stage(bag, n: int, prefix: str) -> db.Bag:
    """:func:`shuffle` in two stages of about ``sqrt(n)`` pieces per task, so the pieces grow as
    ``partitions × 2 sqrt(n)``, not ``partitions × n`` (dask's ``max_branch`` task shuffle works
    alike). Output ``j = a g + b`` (``g = ceil(sqrt(n))``): stage 1 sends each element of input
    ``i`` to block ``i // g``'s part ``b``; stage 2 sends each element of block ``k``'s part ``b``
    to output ``j``."""
    g = math.isqrt(n - 1) + 1
    a = -(-n // g)
    blocks = -(-bag.npartitions // g)
    token = tokenize(bag.name, n, "two-stage")
    split, pick1, mid, pick2 = (f"{prefix}-{step}-{token}" for step in ("split", "piece", "mid", "piece2"))
    out = f"{prefix}-{token}"
    dsk: dict = {}
    for i in range(bag.npartitions):
        dsk[(split, i)] = (_split_routed, (bag.name, i), n, g)
        for b in range(g):
            dsk[(pick1, i, b)] = (_pick, (split, i), b)
    for k in range(blocks):
        for b in range(g):
            inputs = range(k * g, min((k + 1) * g, bag.npartitions))
            dsk[(mid, k, b)] = (_join_split, [(pick1, i, b) for i in inputs], g, a)
            for x in range(a):
                dsk[(pick2, k, b, x)] = (_pick, (mid, k, b), x)
    for j in range(n):
        dsk[(out, j)] = (_pieces, [(pick2, k, j % g, j // g) for k in range(blocks)])
    return db.Bag(HighLevelGraph.from_collections(out, dsk, dependencies=[bag]), out, n)


def shuffle(bag, n: int, prefix: str = "shuffle") -> db.Bag:
    """Group a bag of encoded ``(key, value)`` partitions by key into ``n`` *group partitions*
    (Beam's ``GroupByKey``): each the list of encoded pieces of ``(key, value)`` that holds every
    value of its keys, which :func:`group_pieces` reads as ``(key, [values])`` (or :func:`group`
    encodes). The pieces are not regrouped into new bytes, so a consumer holds a key's values
    once as objects, beside the pieces dask holds anyway, not also as a second encoding and its
    copy. Moved as dask's task shuffle does: in one stage of
    ``partitions × n`` small tasks, or in two (:func:`_two_stage`) when that is more than
    ``ONE_STAGE_PIECES`` (per-task costs, the scheduler's and each worker's, grew with the
    square of the partition count). A key's values are held together only in its output task."""
    if bag.npartitions * n > ONE_STAGE_PIECES and n > TWO_STAGE_MIN_OUTPUTS:
        return _two_stage(bag, n, prefix)
    return _pieces_bag(bag, n, _split_by_key, (n,), _pieces, prefix,
                       lambda j: [(i, j) for i in range(bag.npartitions)])


def spread(bag, n: int, prefix: str = "spread") -> db.Bag:
    """At least ``n`` partitions: each input partition cut into ``ceil(n / partitions)`` even
    pieces (Beam's ``Reshuffle``, which only redistributes). A bag that has ``n`` or more
    partitions is returned as is."""
    k = -(-n // bag.npartitions)
    if k <= 1:
        return bag
    return _pieces_bag(bag, bag.npartitions * k, _split_even, (k,), _first, prefix,
                       lambda j: [divmod(j, k)])
