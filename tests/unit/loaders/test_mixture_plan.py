"""Properties of the mixture draw (loaders.mixture.plan), with hypothesis: token shares within 1 % over
every window of 1,000 batches, every source item drawn exactly once (each source's epochs in turn),
independence of anything but the sources and shares, and share changes that keep every item's place."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.mixture.plan import MixturePlan

BATCH_TOKENS = 32          # a small batch: 1,000 of them span 32k tokens
WINDOW = 1000 * BATCH_TOKENS

sources = st.lists(st.tuples(st.integers(5, 400), st.integers(1, 20), st.floats(0.05, 1.0)), min_size=1, max_size=4)


def _plan(srcs, epoch_tokens=None):
    items = [n for n, _, _ in srcs]
    tokens = [n * m for n, m, _ in srcs]
    return MixturePlan(items, tokens, [w for _, _, w in srcs], epoch_tokens or float(sum(tokens))), \
        np.array([m for _, m, _ in srcs])


def _draws(plan, epochs):
    parts = [plan.epoch_draws(e) for e in range(epochs)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


@settings(max_examples=60, deadline=None)
@given(srcs=sources)
def test_shares_within_one_percent_over_every_window_of_1000_batches(srcs):
    plan, per_item = _plan(srcs, epoch_tokens=3 * WINDOW)
    src, _ = _draws(plan, 2)
    tok = per_item[src]
    cum = np.concatenate([[0], np.cumsum(tok)])
    ends = np.searchsorted(cum, cum[:-1] + WINDOW)  # each window: draws from i until WINDOW tokens are reached
    ok = ends < len(cum)
    starts, ends = np.flatnonzero(ok), ends[ok]
    assert len(starts) > 0
    for s, share in enumerate(plan.shares):
        cs = np.concatenate([[0], np.cumsum(np.where(src == s, tok, 0))])
        got = (cs[ends] - cs[starts]) / (cum[ends] - cum[starts])
        assert np.abs(got - share).max() <= 0.01, (s, share, np.abs(got - share).max())


@settings(max_examples=60, deadline=None)
@given(srcs=sources, epochs=st.integers(1, 4))
def test_every_item_exactly_once_in_source_order(srcs, epochs):
    plan, _ = _plan(srcs)
    src, item = _draws(plan, epochs)
    for s in range(len(srcs)):
        mine = item[src == s]
        assert mine.tolist() == list(range(len(mine)))  # source epoch e = items e*N .. e*N+N-1, each once
    first = [plan.first_items(e) for e in range(epochs + 1)]
    for e in range(epochs):
        s_e, i_e = plan.epoch_draws(e)
        for s in range(len(srcs)):
            assert i_e[s_e == s].tolist() == list(range(first[e][s], first[e + 1][s]))


def test_draw_is_a_function_of_sources_and_shares_only():
    a = MixturePlan([100, 50], [1000, 2000], [0.7, 0.3], 3000.0)
    b = MixturePlan([100, 50], [1000, 2000], [7, 3], 3000.0)
    for e in range(3):
        assert all(np.array_equal(x, y) for x, y in zip(a.epoch_draws(e), b.epoch_draws(e)))
    state = MixturePlan.from_state([100, 50], [1000, 2000], a.state_dict())
    assert np.array_equal(state.epoch_draws(2)[1], a.epoch_draws(2)[1])


@settings(max_examples=60, deadline=None)
@given(srcs=sources, new=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4), epoch=st.integers(0, 2),
       frac=st.floats(0, 1), extra=st.lists(st.integers(0, 10_000), max_size=20))
def test_share_change_keeps_every_item_once_and_consumed_ones_in_their_epoch(srcs, new, epoch, frac, extra):
    new = new[:len(srcs)]
    if sum(new) <= 0:
        new[0] = 1.0
    plan, _ = _plan(srcs)
    before = [plan.epoch_draws(e) for e in range(epoch)]
    src, item = plan.epoch_draws(epoch)
    consumed = np.zeros(len(src), bool)
    consumed[:int(frac * len(src))] = True          # the prefix every rank got through ...
    if len(src):
        consumed[np.array(extra, np.int64) % len(src)] = True  # ... and what some consumers read ahead
    first = plan.first_items(epoch)
    cursors, highest = [], []
    for s in range(len(srcs)):
        got = set(item[(src == s) & consumed].tolist())
        c = first[s]
        while c in got:
            c += 1
        cursors.append(c)
        highest.append(max(got, default=c - 1))
    plan.change_shares(new, epoch, cursors, highest)
    for e in range(epoch):  # earlier epochs are untouched
        assert all(np.array_equal(x, y) for x, y in zip(before[e], plan.epoch_draws(e)))
    s_new, i_new = plan.epoch_draws(epoch)
    for s in range(len(srcs)):  # consumed items stay in this epoch (so they are not read again)
        assert set(item[(src == s) & consumed].tolist()) <= set(i_new[s_new == s].tolist())
    later = epoch + 4
    src_all, item_all = _draws(plan, later)
    for s in range(len(srcs)):
        mine = np.sort(item_all[src_all == s])
        assert mine.tolist() == list(range(len(mine)))  # no item twice, none skipped
