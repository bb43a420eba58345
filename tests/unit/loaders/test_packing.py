"""Packing invariants: no token lost or duplicated, boundaries kept, positions restart, labels stay
inside documents; packing efficiency of best-fit-decreasing with a reasonable window."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.rank.batch import TokenBatch
from tests.support.object_packer import BestFitPacker, TokenBudgetBatcher, make_batch, split_document


def _run(packer, docs, seq_len):
    batches = []
    for pos, toks in enumerate(docs):
        for ch in split_document(pos, f"k{pos}", toks, seq_len):
            packer.add(ch)
        while packer.ready():
            batches.append(packer.pop())
    return [TokenBatch.from_packed(b) for b in batches + packer.flush()]


def _check_batch(b):
    """Row-level invariants; returns ``[(position, chunk, tokens)]`` in row order."""
    ids, lab, pos, doc = (t.numpy() for t in (b.input_ids, b.labels, b.position_ids, b.document_ids))
    assert ids.dtype == lab.dtype == pos.dtype == doc.dtype == np.int64
    consumed = [tuple(c) for c in b.consumed.tolist() if c[2] > 0]
    out = []
    rows, width = ids.shape
    for r in range(rows):
        d = doc[r]
        real = d >= 0
        assert real[:real.sum()].all()  # padding only at the row end
        n_docs = int(d.max()) + 1 if real.any() else 0
        for k in range(n_docs):
            idx = np.flatnonzero(d == k)
            assert len(idx) and (np.diff(idx) == 1).all()  # one contiguous segment per document
            seg = ids[r, idx]
            assert pos[r, idx].tolist() == list(range(len(idx)))  # positions restart
            assert lab[r, idx[:-1]].tolist() == seg[1:].tolist()  # next token inside the document
            assert lab[r, idx[-1]] == -100  # never across a boundary
            out.append(seg)
        pad = ~real
        assert (lab[r, pad] == -100).all() and (ids[r, pad] == 0).all()
    assert len(out) == len(consumed)
    return [(p, c, seg) for (p, c, _), seg in zip(consumed, out)]


def _check_all(batches, docs, seq_len):
    pieces = {}
    for b in batches:
        for p, c, seg in _check_batch(b):
            assert (p, c) not in pieces, "chunk delivered twice"
            pieces[(p, c)] = seg
    for p, toks in enumerate(docs):
        n = -(-len(toks) // seq_len)
        got = [pieces.pop((p, c)) for c in range(n)]
        assert all(len(g) <= seq_len for g in got)
        assert np.concatenate(got).tolist() == toks.tolist()
    assert not pieces


doc_lengths = st.lists(st.one_of(st.integers(1, 20), st.integers(1, 400)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(lengths=doc_lengths, seq_len=st.integers(2, 64), rows=st.integers(1, 6), window=st.integers(1, 40),
       slack=st.integers(0, 64))
def test_packed_invariants(lengths, seq_len, rows, window, slack):
    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(1, 50000, n) for n in lengths]
    batches = _run(BestFitPacker(seq_len, rows, window, slack), docs, seq_len)
    assert all(tuple(b.input_ids.shape) == (rows, seq_len) for b in batches)
    _check_all(batches, docs, seq_len)


@settings(max_examples=60, deadline=None)
@given(lengths=doc_lengths, seq_len=st.integers(2, 64), extra=st.integers(0, 200), window=st.integers(1, 40))
def test_token_budget_invariants(lengths, seq_len, extra, window):
    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(1, 50000, n) for n in lengths]
    max_tokens = seq_len + extra
    batches = _run(TokenBudgetBatcher(max_tokens, window), docs, seq_len)
    for b in batches:
        assert b.input_ids.numel() <= max_tokens
        assert (b.document_ids <= 0).all()  # one chunk per row
    _check_all(batches, docs, seq_len)


def test_long_document_chunks_restart_positions():
    toks = np.arange(10, 35)
    b = make_batch([[c] for c in split_document(0, "k", toks, 10)], 10)
    assert b.position_ids[:, 0].tolist() == [0, 0, 0]
    assert b.labels[0, 9] == -100 and b.labels[1, 0] == 21  # cut: no label across chunks
    assert b.document_ids[2].tolist() == [0] * 5 + [-1] * 5


@pytest.mark.parametrize("window", [16384, 65536])
def test_packing_efficiency_with_reasonable_window(window):
    """Best-fit-decreasing over a window of 32 or 128 rows' worth of tokens keeps >= 99.5% real
    tokens (vs ~40% for one document per row) on a long-tailed length distribution, at the default
    slack (rows with 2 tokens of room count as full)."""
    from loaders.config import DataConfig

    rng = np.random.default_rng(0)
    seq_len, rows = 512, 8
    lengths = np.minimum(rng.lognormal(5.0, 1.2, 4000).astype(int) + 1, 3000)
    docs = [rng.integers(0, 1000, n) for n in lengths]
    slack = int(DataConfig().pack_slack * seq_len)
    assert slack == 2
    batches = _run(BestFitPacker(seq_len, rows, window, slack), docs, seq_len)
    real = sum(b.num_doc_tokens for b in batches)
    slots = sum(b.input_ids.numel() for b in batches)
    assert real == int(lengths.sum())
    assert real / slots >= 0.995


def test_long_documents_pack_to_995_percent_with_the_default_window():
    """Documents of ~2,000 tokens (lognormal lengths, rows of 512): every document is cut into
    chunks of 512 and a tail; best-fit-decreasing over the default window (262,144 tokens) pairs the
    tails to >= 99.5 % real tokens, with every token delivered once."""
    from loaders.pack.batching import BestFit
    from loaders.pack.packer import ArrayPacker, split_documents
    from loaders.config import DataConfig

    rng = np.random.default_rng(1)
    seq_len, rows = 512, 16
    lengths = np.maximum(1, rng.lognormal(np.log(1500), 0.8, 3000)).astype(np.int64)
    pool = rng.integers(1, 60000, int(lengths.sum())).astype(np.uint16)
    offsets = np.cumsum(lengths) - lengths
    cfg = DataConfig(seq_len=seq_len, micro_batch_size=rows)
    packer, got = ArrayPacker(BestFit.from_config(cfg), cfg.pack_window), []
    for s in range(0, len(lengths), 500):
        part = slice(s, s + 500)
        got += list(packer.add(pool, [f"k{i}" for i in range(s, s + 500)],
                               split_documents(np.arange(len(lengths))[part], lengths[part], offsets[part], seq_len)))
    got += list(packer.flush())
    real = sum(b.num_doc_tokens for b in got)
    assert real == int(lengths.sum()) and real / sum(b.num_slots for b in got) >= 0.995
    delivered = sorted(tuple(c) for b in got for c in b.consumed.tolist())
    assert len(delivered) == len(set(delivered)) == int(sum(-(-lengths // seq_len)))


def _array_run(packer, docs, seq_len, group, arrays=2):
    """The array packer's batches over ``docs``, added ``group`` documents at a time (as shuffle blocks
    arrive), each group's documents in ``arrays`` token arrays (as in two shards; one: a raw shard's
    one mapping); empty ones are pending."""
    from loaders.pack.packer import split_documents

    got = []
    for start in range(0, len(docs), group):
        part = docs[start:start + group]
        lens = np.array([len(d) for d in part], np.int64)
        which = np.arange(len(part)) % arrays
        pools = [np.concatenate([d for d, w in zip(part, which) if w == k] + [np.zeros(0, np.uint16)])
                 for k in range(arrays)]
        offs = np.zeros(len(part), np.int64)
        for k in range(arrays):
            offs[which == k] = np.cumsum(lens[which == k]) - lens[which == k]
        real = lens > 0
        for p in np.flatnonzero(~real):
            packer.pending.append((start + int(p), -1, 0))
        chunks = split_documents(np.arange(start, start + len(part))[real], lens[real], offs[real], seq_len)
        chunks["doc"] = np.flatnonzero(real)[chunks["doc"]]
        chunks["pool"] = which[chunks["doc"]]
        got += list(packer.add(pools, [f"k{start + i}" for i in range(len(part))], chunks))
    return [TokenBatch.from_packed(b) for b in got + list(packer.flush())]


def _assert_same_batches(got, ref, lengths):
    """The same batches, row for row. The records of empty documents ride with their group's first batch in
    ``got``, so a batch of records only (no rows) that ``ref`` ends with may be missing there (only there)."""
    empties = sorted(tuple(c) for b in got for c in b.consumed.tolist() if c[2] == 0)  # reported with a group's first batch
    assert set(tuple(c) for b in ref for c in b.consumed.tolist() if c[2] == 0) <= set(empties) <= {(i, -1, 0) for i, n in
                                                                                   enumerate(lengths) if n == 0}
    assert all(b.shape[0] for b in got[:-1]) and all(b.shape[0] for b in ref[:-1])
    got, ref = [b for b in got if b.shape[0]], [b for b in ref if b.shape[0]]
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.input_ids.equal(b.input_ids) and a.labels.equal(b.labels) and a.keys == b.keys
        assert [c for c in a.consumed.tolist() if c[2] > 0] == [c for c in b.consumed.tolist() if c[2] > 0]


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 40)), min_size=1, max_size=30),
       seq_len=st.sampled_from([1, 2, 7, 16, 64]))
def test_best_fit_bins_is_chunk_by_chunk_best_fit(counts, seq_len):
    """The run-length best fit places every chunk where best fit one chunk at a time does (least room
    that fits, ties to the oldest bin), runs of equal chunks included, and sums the fills."""
    from loaders.pack.batching import best_fit_bins

    lengths = np.sort(np.minimum([n for n, c in counts for _ in range(c)], seq_len))[::-1].astype(np.int64)
    rooms, want = [], []
    for n in lengths.tolist():
        fit = [(r, b) for b, r in enumerate(rooms) if r >= n]
        b = min(fit)[1] if fit else len(rooms)
        if not fit:
            rooms.append(seq_len)
        rooms[b] -= n
        want.append(b)
    bin_of, fill = best_fit_bins(lengths, seq_len)
    assert bin_of.dtype == fill.dtype == np.int64
    assert bin_of.tolist() == want
    assert fill.tolist() == [seq_len - r for r in rooms]


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(0, 12), st.integers(12, 80)), min_size=1, max_size=80),
       seq_len=st.integers(2, 16), rows=st.integers(1, 4), window=st.integers(1, 400), group=st.integers(1, 30),
       slack=st.integers(0, 4))
def test_array_packer_over_one_token_array_gives_the_object_packers_batches(lengths, seq_len, rows, window, group,
                                                                            slack):
    """Every group's documents in one token array (a raw shard): rows that are one whole chunk are
    copied as windows of it, the others gathered by index; the object packer's batches either way."""
    from loaders.pack.batching import BestFit
    from loaders.pack.packer import ArrayPacker

    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(1, 60000, n).astype(np.uint16) for n in lengths]
    ref = [TokenBatch.from_packed(b) for b in _packed_run(BestFitPacker(seq_len, rows, window, slack), docs, seq_len)]
    got = _array_run(ArrayPacker(BestFit(seq_len, rows, slack), window), docs, seq_len, group, arrays=1)
    _assert_same_batches(got, ref, lengths)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 70), min_size=1, max_size=80), seq_len=st.integers(2, 32),
       rows=st.integers(1, 4), window=st.integers(1, 400), group=st.integers(1, 30), slack=st.integers(0, 8))
def test_array_packer_gives_the_object_packers_batches(lengths, seq_len, rows, window, group, slack):
    """The loader's numpy packer emits exactly the object packer's batches (ids, chunks, order) in ``packed`` mode."""
    from loaders.pack.batching import BestFit
    from loaders.pack.packer import ArrayPacker

    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(1, 60000, n).astype(np.uint16) for n in lengths]
    ref = [TokenBatch.from_packed(b) for b in _packed_run(BestFitPacker(seq_len, rows, window, slack), docs, seq_len)]
    got = _array_run(ArrayPacker(BestFit(seq_len, rows, slack), window), docs, seq_len, group)
    _assert_same_batches(got, ref, lengths)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 70), min_size=1, max_size=80), seq_len=st.integers(2, 32),
       extra=st.integers(0, 100), window=st.integers(1, 400), group=st.integers(1, 30))
def test_array_packer_gives_the_token_budget_batches(lengths, seq_len, extra, window, group):
    """In ``token_budget`` mode the same packer emits exactly the object batcher's batches: one chunk per row,
    rows padded to the batch's longest chunk, rows x width <= max_tokens."""
    from loaders.pack.batching import TokenBudget
    from loaders.pack.packer import ArrayPacker

    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(1, 60000, n).astype(np.uint16) for n in lengths]
    max_tokens = seq_len + extra
    ref = [TokenBatch.from_packed(b) for b in _packed_run(TokenBudgetBatcher(max_tokens, window), docs, seq_len)]
    got = _array_run(ArrayPacker(TokenBudget(max_tokens, seq_len), window), docs, seq_len, group)
    _assert_same_batches(got, ref, lengths)
    assert all(b.input_ids.numel() <= max_tokens and (b.document_ids <= 0).all() for b in got)


@settings(max_examples=60, deadline=None)
@given(lengths=doc_lengths, seq_len=st.integers(2, 64), rows=st.integers(1, 6), window=st.integers(1, 40),
       extra=st.integers(0, 200), group=st.integers(1, 30), slack=st.integers(0, 64))
def test_array_packer_invariants_in_both_modes(lengths, seq_len, rows, window, extra, group, slack):
    """Every token once, boundaries kept, positions restart, labels stay inside documents, in both modes."""
    from loaders.pack.batching import BestFit, TokenBudget
    from loaders.pack.packer import ArrayPacker

    rng = np.random.default_rng(len(lengths))
    docs = [rng.integers(1, 50000, n).astype(np.uint16) for n in lengths]
    packed = _array_run(ArrayPacker(BestFit(seq_len, rows, slack), window), docs, seq_len, group)
    assert all(tuple(b.input_ids.shape) == (rows, seq_len) for b in packed)
    _check_all(packed, docs, seq_len)
    budget = _array_run(ArrayPacker(TokenBudget(seq_len + extra, seq_len), window), docs, seq_len, group)
    assert all(b.input_ids.numel() <= seq_len + extra for b in budget)
    _check_all(budget, docs, seq_len)
    # the counts the packer makes per packing are the ones each batch's arrays give
    from loaders.rank.batch import one_document_rows
    for b in (x.packed for x in packed + budget if x.shape[0]):
        assert b.doc_tokens == int(b.lens.sum())
        assert b.one_document == one_document_rows(b.lens, b.row_chunks, b.ids.shape[1])


def _packed_run(packer, docs, seq_len):
    out = []
    for pos, toks in enumerate(docs):
        if len(toks) == 0:
            packer.pending.append((pos, -1, 0))
            continue
        for ch in split_document(pos, f"k{pos}", toks, seq_len):
            packer.add(ch)
        while packer.ready():
            out.append(packer.pop())
    return out + packer.flush()


def test_packed_batch_pickles_compact_and_expands_the_same():
    import pickle

    rng = np.random.default_rng(0)
    B, T = 8, 256
    rows = [[c for i in range(4) for c in split_document(4 * r + i, f"d{4 * r + i}",
                                                         rng.integers(0, 60000, 60).astype(np.uint16), T)]
            for r in range(B - 1)]  # 7 rows of 4 documents, one padding row
    batch = make_batch(rows, T, n_rows=B)
    data = pickle.dumps(batch)
    assert len(data) <= 2 * (2 * B * (T + 1))  # at most twice a uint16 [B, T + 1] tensor (four int64 arrays: 16x)
    again = pickle.loads(data)
    for f in ("input_ids", "labels", "position_ids", "document_ids"):
        assert getattr(again, f).equal(getattr(batch, f)), f
    assert again.consumed.tolist() == batch.consumed.tolist() and again.keys == batch.keys


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.integers(1, 9), max_size=4), min_size=1, max_size=4), width=st.integers(9, 40))
def test_expand_derives_labels_positions_and_documents_per_chunk(rows, width):
    """expand() against a per-chunk loop: positions restart per chunk, labels stop at a chunk's last
    token, padding is (0, -100, 0, -1); the same on a lazily expanded batch moved with .to()."""
    from loaders.rank.batch import expand
    from loaders.pack.packed import PackedBatch

    rng = np.random.default_rng(width)
    fitted = []
    for r in rows:  # keep each row within width
        out, used = [], 0
        for n in r:
            if used + n <= width:
                out.append(n)
                used += n
        fitted.append(out)
    ids = np.zeros((len(fitted), width), np.uint16)
    want = {k: np.full((len(fitted), width), v, np.int64) for k, v in (("labels", -100), ("pos", 0), ("docs", -1))}
    for r, chunks in enumerate(fitted):
        col = 0
        for d, n in enumerate(chunks):
            toks = rng.integers(1, 60000, n)
            ids[r, col:col + n] = toks
            want["pos"][r, col:col + n] = np.arange(n)
            want["docs"][r, col:col + n] = d
            want["labels"][r, col:col + n - 1] = toks[1:]
            col += n
    lens = np.array([n for c in fitted for n in c], np.int32)
    counts = np.array([len(c) for c in fitted], np.int32)
    got = expand(torch.from_numpy(ids), torch.from_numpy(lens), torch.from_numpy(counts))
    assert got[0].dtype == torch.int64 and got[0].tolist() == ids.astype(np.int64).tolist()
    for t, k in zip(got[1:], ("labels", "pos", "docs")):
        assert t.tolist() == want[k].tolist(), k
    lazy = TokenBatch.from_packed(PackedBatch(ids, lens, counts)).to("cpu")
    assert lazy.labels.equal(got[1]) and lazy.document_ids.equal(got[3])
    assert lazy.num_doc_tokens == int(lens.sum()) and lazy.num_slots == ids.size
    # one document (or only padding) per row, from the packing and from the tensors alike
    one = bool(np.all(want["docs"] == want["docs"][:, :1]))
    assert lazy.one_document_rows is one and TokenBatch(*got, keys=[]).one_document_rows is one


def test_one_document_rows_from_the_packing_survive_the_move():
    """Rows each filled by one document, or empty, are one-document rows (attention can be plain
    causal); a short document with padding after it, or two documents, are not."""
    from loaders.pack.packed import PackedBatch
    ids = np.ones((3, 8), np.uint16)
    cases = {((8, 8), (1, 1, 0)): True, ((8, 5), (1, 1, 0)): False, ((3, 5, 8), (2, 1, 0)): False}
    for (lens, counts), want in cases.items():
        batch = TokenBatch.from_packed(PackedBatch(ids, np.array(lens, np.int32), np.array(counts, np.int32)))
        assert batch.one_document_rows is want and batch.to("cpu").one_document_rows is want


def test_bins_that_cannot_fill_are_emitted_not_repacked_with_every_document():
    """Documents of 1,950-2,000 tokens leave tails of 414-464 tokens that never share a row of 512.
    Kept back as 'not full', they used to pile up until every new document triggered a packing of
    all of them (quadratic). A packing now also emits them once the kept bins exceed half the window."""
    from loaders.pack.batching import BestFit
    from loaders.pack.packer import ArrayPacker, split_documents

    rng = np.random.default_rng(5)
    seq_len, rows, window = 512, 4, 16384
    lengths = rng.integers(1950, 2001, 300).astype(np.int64)
    pool = rng.integers(1, 60000, int(lengths.sum())).astype(np.uint16)
    offsets = np.cumsum(lengths) - lengths
    packer, got, packings = ArrayPacker(BestFit(seq_len, rows, 2), window), [], []
    real_pack = packer._pack
    packer._pack = lambda final: packings.append(packer.buffered) or real_pack(final)
    for s in range(0, len(lengths), 10):
        part = slice(s, s + 10)
        got += list(packer.add(pool, [f"k{i}" for i in range(s, s + 10)],
                               split_documents(np.arange(len(lengths))[part], lengths[part], offsets[part], seq_len)))
        assert packer.buffered < window + 2000
    got += list(packer.flush())
    assert sum(b.num_doc_tokens for b in got) == int(lengths.sum())
    assert len(packings) <= 2 * int(lengths.sum()) // window + 2  # each packing emits >= half a window
    docs = [pool[o:o + n] for o, n in zip(offsets, lengths)]
    ref = [TokenBatch.from_packed(b) for b in _packed_run(BestFitPacker(seq_len, rows, window, 2), docs, seq_len)]
    assert len(ref) == len(got)
    for a, b in zip(ref, got):
        assert torch.equal(a.input_ids, TokenBatch.from_packed(b).input_ids)


def test_rows_of_the_shortest_documents_are_emitted_not_packed_again():
    """Documents of 7 tokens fill rows of 512 as 73 chunks and one token of room, which no later chunk
    fills. Counted as not full (slack 0), they stayed buffered up to half the window and were sorted and
    packed again at every packing (on the demo corpus ~18,000 such chunks for 17 batches a packing); with
    the default slack (2 tokens of 512) a packing emits them all, in whole batches, at the same padding."""
    from loaders.config import DataConfig
    from loaders.pack.batching import BestFit
    from loaders.pack.packer import ArrayPacker, split_documents

    seq_len, rows, window = 512, 4, 32768
    lengths = np.full(40_000, 7, np.int64)
    pool = np.arange(len(lengths) * 7, dtype=np.int64).astype(np.uint16)
    chunks = split_documents(np.arange(len(lengths)), lengths, np.arange(len(lengths)) * 7, seq_len)
    left, batches, default = {}, {}, int(DataConfig().pack_slack * seq_len)
    assert default == 2
    for slack in (0, default):
        packer, left[slack] = ArrayPacker(BestFit(seq_len, rows, slack), window), []
        real_pack = packer._pack
        packer._pack = lambda final, p=packer, out=left[slack], pack=real_pack: (pack(final), out.append(p._size))[0]
        batches[slack] = list(packer.add(pool, [f"k{i}" for i in range(len(lengths))], chunks)) + list(packer.flush())
        delivered = sorted(int(c[0]) for b in batches[slack] for c in b.consumed)
        assert delivered == list(range(len(lengths)))  # every document once
    assert min(left[0][:-1]) * 7 > window // 2 - rows * 511  # slack 0: half a window kept back every time
    assert max(left[default][:-1]) < rows * 73  # slack 2: less than a batch of rows kept back
    assert len(left[default]) < len(left[0]) / 1.5
    for slack in left:  # every row holds 73 chunks (511 tokens) but the flush's last
        assert len(batches[slack]) == -(-len(lengths) // (73 * rows))
        assert all(b.row_chunks.tolist() == [73] * rows for b in batches[slack][:-1])


def test_token_budget_groups_the_window_once_per_half_window():
    """The token-budget batcher used to sort its whole window for every batch (2.9 M tok/s at the
    default window); it now groups once and emits groups until half the window is left."""
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 1000, int(n)) for n in rng.integers(1, 120, 3000)]
    batcher, window = TokenBudgetBatcher(max_tokens=512, window=16384), 16384
    calls = []
    real_groups = batcher._groups
    batcher._groups = lambda: calls.append(1) or real_groups()
    batches = _run(batcher, docs, 128)
    _check_all(batches, docs, 128)
    assert len(batches) > 4 * len(calls) and len(calls) <= 2 * sum(len(d) for d in docs) // window + 2


def test_array_token_budget_packs_once_per_half_window():
    """The array packer in ``token_budget`` mode groups its buffer once per packing and emits groups until
    half the window is left, like the object batcher (not one sort of the window per batch)."""
    from loaders.pack.batching import TokenBudget
    from loaders.pack.packer import ArrayPacker

    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 1000, int(n)).astype(np.uint16) for n in rng.integers(1, 120, 3000)]
    window = 16384
    packer = ArrayPacker(TokenBudget(512, 128), window)
    calls = []
    real_pack = packer._pack
    packer._pack = lambda final: calls.append(final) or real_pack(final)
    batches = _array_run(packer, docs, 128, 100)
    _check_all(batches, docs, 128)
    assert len(batches) > 4 * len(calls) and len(calls) <= 2 * sum(len(d) for d in docs) // window + 2


# sha256 of every batch the loader gave on these shards (workers 1 and 2, both layouts of token blocks) at
# 7d7df22, before the packer's buffer, gathers and group bookkeeping were reworked: the rework must not move
# a token, a chunk, a key or a resume record (see _stream_digest)
STREAM_GOLDEN = {
    ("none", 1): "d57c091975c9bfa3a2969694cbc164aa870b39cc242715caffc539458bb95574",
    ("none", 2): "f78e2f874383c77277640787a60b8c4802122d19edc2bc864b305075975906b5",
    ("zstd", 1): "cf2a0526a5ce498f5131662c1a49b40f08e6429a3d7fdfb779189e9884f95ffb",
    ("zstd", 2): "332704724f0a09e542890701c5ea2be4e6dadcc968e6f23f6097b2d15550a458",
}


def _stream_digest(directory: str, workers: int) -> str:
    """sha256 over one epoch of the in-process loader on ``directory``: every batch's packed ids, chunk
    lengths, row chunk counts, resume records, keys, worker, token count and one-document flag."""
    import hashlib

    from loaders.config import DataConfig
    from loaders.rank.loader import build_text_loader

    cfg = DataConfig(manifest=directory, seq_len=64, micro_batch_size=4, num_workers=workers, pack_window=1500,
                     shuffle_block=96)
    h = hashlib.sha256()
    for b in build_text_loader(cfg, in_process=True):
        p = b.packed
        for a in (p.ids, p.lens, p.row_chunks, p.consumed):
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(repr((list(p.keys), p.worker, p.num_doc_tokens, p.one_document)).encode())
    return h.hexdigest()


def _golden_shards(directory: str, compression: str) -> None:
    """Token-block shards of 600 documents of 1 to ~1,000 tokens (most short, as the demo corpus's),
    in blocks of ~700 tokens, several shards."""
    from shards import Manifest, TokenBlockWriter

    rng = np.random.default_rng(38)
    w = TokenBlockWriter(directory, max_bytes=40 * 1024, block_tokens=700, compression=compression)
    for i in range(600):
        n = int(rng.choice([1, 3, 9, 20, 40, 64, 65, 130, 400, 1000], p=[.05, .1, .2, .2, .15, .1, .05, .07, .05, .03]))
        w.add(f"doc{i:04d}", "golden", rng.integers(0, 60000, n).astype(np.uint16))
    Manifest(shards=w.close(), vocab_size=60000, layout="token_blocks").save(directory)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_loader_batches_are_the_ones_before_the_packer_rework(tmp_path, compression):
    """The loader gives bit for bit the batches it gave before the rework (a golden digest per layout and
    worker count): raw blocks gather from one memory map per shard, zstd blocks from one array per block."""
    _golden_shards(str(tmp_path), compression)
    for workers in (1, 2):
        assert _stream_digest(str(tmp_path), workers) == STREAM_GOLDEN[(compression, workers)], (compression, workers)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.integers(0, 5), st.integers(0, 10**6)), max_size=300))
def test_distinct_ints_and_first_seen_are_the_set_and_first_appearance_order(values):
    """The group/shard helpers: ascending distinct values (short, one value, small range, wide range) and
    distinct values in order of first appearance (what ``dict.fromkeys`` gives)."""
    from loaders.pack.packed import distinct_ints
    from loaders.worker.stream import _first_seen

    a = np.array(values, np.int64)
    for arr in (a, np.repeat(a, 50)):  # short and long arrays take different ways
        assert distinct_ints(arr) == sorted(set(arr.tolist()))
        assert _first_seen(arr) == list(dict.fromkeys(arr.tolist()))


def test_a_chunk_outside_its_token_array_raises_instead_of_reading_another_token():
    """The single-array gather does not check each index: a chunk past the array's end (a shard whose
    offsets disagree with its tokens) raises before it."""
    from loaders.pack.batching import BestFit
    from loaders.pack.packer import ArrayPacker, split_documents

    pool = np.arange(100, dtype=np.uint16)
    chunks = split_documents(np.arange(2, dtype=np.int64), np.array([30, 20]), np.array([0, 90]), 16)
    packer = ArrayPacker(BestFit(16, 2, 0), 1000)
    with pytest.raises(IndexError, match="outside its token array of 100 tokens"):
        list(packer.add(pool, ["a", "b"], chunks)) + list(packer.flush())
