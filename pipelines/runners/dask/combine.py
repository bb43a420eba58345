"""``CombinePerKey`` for the Dask runner: a partial combine per bundle whose table of
accumulators is bounded, then a group by key and a merge.

Beam's :class:`apache_beam.transforms.combiners.LiftedCombinePerKey` keeps one accumulator per
key for the whole bundle and emits them all at its end. A Dask bundle is a whole partition
(about ``PARTITION_BYTES`` of input), and a combine over nearly distinct keys (exact dedup:
one content hash per document, the accumulator holding the document) then held the whole
partition as objects, the largest task of a worker at 16× the demo corpus. Beam's own SDK
workers bound the same table by key count and evict part of it when full
(``PGBKCVOperation`` in ``apache_beam/runners/worker/operations.py``); :class:`CombineTable`
does the same with a table sized for memory, and the runner writes what it evicts as bytes.
A key whose values are evicted more than once reaches the merge with several accumulators,
which ``merge_accumulators`` combines as it would partial results from several bundles.

Keys are told apart as Beam tells them (:func:`group_key`), here and in the runner's groups.
This module imports Beam only, not dask: the combine runs wherever the job's DoFns run.
"""
from __future__ import annotations

import itertools

import apache_beam as beam
from apache_beam.coders import FastPrimitivesCoder

TABLE_KEYS = 1024  # accumulators a partial combine holds before it evicts the oldest tenth

# Types whose Python equality is the equality of Beam's encoding of them: no bool, float or
# subclass (True == 1 == 1.0 and 0.0 == -0.0 in Python, but Beam encodes, so groups, them apart).
_PLAIN = frozenset({str, int, type(None)})
_KEY_CODER = FastPrimitivesCoder().as_deterministic_coder("a group on the Dask runner")


def group_key(key):
    """What a group compares for ``key``: ``key`` itself when it is a ``str``, ``int``, ``None``
    or a tuple of those (most keys, at the cost of a type check), else the ``bytes`` of its
    deterministic Beam encoding (never equal to a key of the first kind). Two keys are thus one
    group exactly when Beam's DirectRunner groups them, which compares encoded keys (the Beam
    model's ``GroupByKey``), where a ``dict`` of the keys themselves would merge ``True``, ``1``
    and ``1.0``. Raises ``TypeError`` for a key Beam cannot encode deterministically (a
    ``frozenset``, most class instances), as the DirectRunner does."""
    kind = type(key)
    if kind in _PLAIN or (kind is tuple and all(type(part) in _PLAIN for part in key)):
        return key
    return _KEY_CODER.encode(key)


class CombineTable(beam.DoFn):
    """``(key, value)`` → ``(key, accumulator)``: values combined per key in a table of at most
    ``max_keys`` accumulators (insertion order), keys told apart as the group after it tells
    them (:func:`group_key`: ``True`` and ``1`` are two keys). When a new
    key would pass the bound, the oldest tenth is emitted (compacted) and dropped; the rest is
    emitted at the bundle's end.
    ``args``/``kwargs`` of ``process`` are the combine's side inputs, passed to every call."""

    def __init__(self, combine_fn: beam.CombineFn, max_keys: int = TABLE_KEYS):
        self.combine_fn, self.max_keys = combine_fn, max_keys

    def setup(self):
        """Set up the combine fn."""
        self.combine_fn.setup()

    def start_bundle(self):
        """Start with an empty table."""
        self._table: dict = {}
        self._side: tuple = ((), {})

    def process(self, element, *args, **kwargs):
        """Add one value to its key's accumulator; yields the evicted ``(key, accumulator)`` pairs."""
        key, value = element
        gkey = group_key(key)
        fn, self._side = self.combine_fn, (args, kwargs)
        if gkey in self._table:
            key, acc = self._table[gkey]
        else:
            if len(self._table) >= self.max_keys:
                yield from self._evict(max(1, self.max_keys // 10))
            acc = fn.create_accumulator(*args, **kwargs)
        self._table[gkey] = key, fn.add_input(acc, value, *args, **kwargs)

    def finish_bundle(self):
        """Emit every accumulator left (global window)."""
        for pair in self._evict(len(self._table)):
            yield beam.transforms.window.GlobalWindows.windowed_value(pair)

    def teardown(self):
        """Tear down the combine fn."""
        self.combine_fn.teardown()

    def _evict(self, n: int):
        args, kwargs = self._side
        for gkey in list(itertools.islice(self._table, n)):
            key, acc = self._table.pop(gkey)
            yield key, self.combine_fn.compact(acc, *args, **kwargs)


def _merge(item, combine_fn: beam.CombineFn, *args, **kwargs):
    key, accumulators = item
    merged = combine_fn.merge_accumulators(accumulators, *args, **kwargs)
    return key, combine_fn.extract_output(merged, *args, **kwargs)


class LiftedCombine(beam.PTransform):
    """``CombinePerKey(combine_fn, *args, **kwargs)`` as :class:`CombineTable` → ``GroupByKey`` →
    merge and extract per key: the output of Beam's ``CombinePerKey`` (``(key, output)`` per key).
    ``combine_fn`` is a ``CombineFn`` or a callable (as ``CombinePerKey`` takes)."""

    def __init__(self, combine_fn, args: tuple = (), kwargs: dict | None = None):
        super().__init__()
        if not isinstance(combine_fn, beam.CombineFn):
            combine_fn = beam.CombineFn.from_callable(combine_fn)
        self.combine_fn, self.args, self.kwargs = combine_fn, tuple(args), dict(kwargs or {})

    def expand(self, pcoll):
        """Partial combine, group, merge."""
        return (pcoll
                | "Partial" >> beam.ParDo(CombineTable(self.combine_fn), *self.args, **self.kwargs)
                | "Group" >> beam.GroupByKey()
                | "Merge" >> beam.Map(_merge, self.combine_fn, *self.args, **self.kwargs))
