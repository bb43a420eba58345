"""Consumed-position sets (loaders/order/positions.py) and the size of a rank's resume state."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.order.positions import PositionSet, decode_positions, encode_positions
from loaders.order.progress import Progress, merge_states


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 300), data=st.data())
def test_position_set_behaves_like_a_python_set(size, data):
    ref: set[int] = set()
    s = PositionSet(size)
    for _ in range(data.draw(st.integers(0, 6))):
        if size and data.draw(st.booleans()):
            pos = data.draw(st.lists(st.integers(0, size - 1), max_size=40))
            s.add(pos)
            ref |= set(pos)
        else:
            lo, hi = sorted(data.draw(st.tuples(st.integers(-3, size + 3), st.integers(-3, size + 3))))
            s.add_range(lo, hi)
            ref |= set(range(max(lo, 0), min(hi, size)))
        assert len(s) == len(ref) and s.positions().tolist() == sorted(ref)
        assert s.mask().nonzero()[0].tolist() == sorted(ref)
        lo = data.draw(st.integers(0, size + 1))
        assert s.first_missing(lo) == min([p for p in range(lo, size) if p not in ref], default=size) if lo < size \
            else s.first_missing(lo) == size
        assert s.positions(lo).tolist() == sorted(p for p in ref if p >= lo)
        assert all((p in s) == (p in ref) for p in range(-1, size + 2))
        saved = json.loads(json.dumps(s.encode(lo)))
        assert set(decode_positions(saved).tolist()) >= {p for p in ref if p >= lo}
        assert set(decode_positions(saved).tolist()) <= ref


def test_first_missing_scans_past_long_consumed_runs():
    s = PositionSet(10_000_003)
    s.add_range(0, 9_999_990)
    assert s.first_missing(5) == 9_999_990
    s.add_range(9_999_990, 10_000_003)
    assert s.first_missing() == 10_000_003 and len(s) == 10_000_003


def test_out_of_range_positions_and_bad_saved_values_are_errors():
    s = PositionSet(10)
    with pytest.raises(ValueError, match=r"out of range \[0, 10\)"):
        s.add([3, 10])
    with pytest.raises(ValueError, match="neither a list nor an encoded bitmap"):
        decode_positions({"from": 0, "bitmap": "not base64 zlib"})
    big = encode_positions([5, 70])
    p = Progress(0, {}, 20)
    with pytest.raises(ValueError, match="out of range"):
        p.done.add(decode_positions(big))
    assert decode_positions([3, 1, 3]).tolist() == [1, 3]  # version-1 states saved lists


def test_a_ranks_state_stays_small_when_its_positions_never_form_a_prefix():
    """Rank 0 of 8 consumes every 8th position, so its prefix never moves: its resume state used to
    list every position (and hold each in a Python set), growing with its share of the epoch."""
    n = 2_000_000
    p = Progress(0, {"seed": 0}, n, world_size=8)
    mine = np.arange(0, n, 8)
    for part in np.array_split(mine, 100):
        p.record_many(np.stack([part, np.zeros_like(part), np.ones_like(part)], 1))
    state = p.state_dict()
    assert p.prefix == 1 and state["consumed"] == len(mine)
    assert len(json.dumps(state)) < 5_000  # a list of the 250,000 positions is > 2 MB
    assert p.done.bits.nbytes == n // 8
    back = Progress.from_state(json.loads(json.dumps(state)))
    assert np.array_equal(back.done.positions(), mine)
    others = []
    for r in range(1, 8):
        q = Progress(0, {"seed": 0}, n, world_size=8)
        q.record_many(np.stack([mine + r, np.zeros_like(mine), np.ones_like(mine)], 1)[mine + r < n])
        others.append(q.state_dict())
    merged = merge_states([state, *others])
    assert merged["prefix"] == n and merged["consumed"] == n and len(json.dumps(merged)) < 1_000


def test_version_1_states_with_done_lists_still_load():
    old = {"version": 1, "epoch": 0, "order_key": {}, "num_samples": 10, "world_size": 1, "consumed": 4,
           "prefix": 2, "done": [4, 7], "partial": [[5, 2, [0]]], "complete_ranks": [], "bad": 0, "empty": 0}
    p = Progress.from_state(old)
    assert p.consumed == 4 and p.prefix == 2 and p.done.positions(2).tolist() == [4, 7]
    assert p.partial == {5: (2, {0})} and p.state_dict()["version"] == 2


@pytest.mark.parametrize("edit, match", [
    ({"partial": [[500, 3, [0]]]}, "position 500"),  # past the epoch: was an IndexError
    ({"partial": [[-3, 3, [0]]]}, "position -3"),  # negative: was silently accepted
    ({"partial": [[5, 2, [0, 7]]]}, "chunk 7 of 2"),  # would consume document 5 without its chunk 1
    ({"prefix": -5}, "prefix -5"),
    ({"epoch": -1}, "epoch -1"),
    ({"done": None}, "neither a list nor an encoded bitmap"),
    # a deal past the epoch skipped the rest of it (prefix) or lost documents (done); was accepted
    ({"deal": {"world_size": 1, "workers": 1, "prefix": 20, "done": []}}, "from prefix 20 is outside"),
    ({"deal": {"world_size": 1, "workers": 1, "prefix": 0, "done": [12]}}, "deal of world size 1"),
    ({"deal": {"world_size": 1, "workers": 1, "done": []}}, "KeyError: 'prefix'"),  # was a KeyError when dealt
])
def test_hand_edited_states_are_refused_with_a_value_error(edit, match):
    good = {"version": 2, "epoch": 0, "order_key": {}, "num_samples": 10, "world_size": 1, "consumed": 0,
            "prefix": 0, "done": encode_positions([4, 7]), "partial": [[5, 2, [0]]], "complete_ranks": []}
    assert Progress.from_state(good).partial == {5: (2, {0})}
    with pytest.raises(ValueError, match=f"loader state is malformed.*{match}"):
        Progress.from_state({**good, **edit})
    missing = dict(good)
    del missing["done"]
    with pytest.raises(ValueError, match="malformed.*KeyError"):  # was a KeyError
        Progress.from_state(missing)
