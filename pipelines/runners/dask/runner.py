"""Beam's DaskRunner with its graph translation fixed, so the preprocessing job runs on a Dask cluster.

:class:`ColaflowDaskRunner` (``--runner=DaskRunner``, :func:`pipelines.runners.selection.make_runner`)
fixes four faults of Beam 2.77's translation (``apache_beam.runners.dask``): tagged outputs mixed
into the main output, ``finish_bundle`` outputs lost, only the last sink computed, side inputs
recomputed per task; ``tests/unit/pipelines/test_dask_runner.py`` reproduces each. It also lifts
``CombinePerKey`` (:class:`pipelines.runners.dask.combine.LiftedCombine`), makes ``Reshuffle``
repartition, holds partitions as bytes (:mod:`pipelines.runners.dask.parts`), sets a DoFn up
once per worker thread, and names tasks after their Beam steps. ``pipelines/README.md`` and
``docs/cluster.md`` say why. Beam metrics are not collected on Dask (``result.metrics()`` raises
``NotImplementedError``); ``stats.json`` is built from event records in the graph.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import uuid

import apache_beam as beam
import dask.bag as db
from apache_beam import pvalue
from apache_beam.pipeline import PipelineVisitor, PTransformOverride
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, Receiver, _OutputHandler
from apache_beam.runners.dask.dask_runner import DaskOptions, DaskRunner
from apache_beam.runners.dask.overrides import _Create, _Flatten, _GroupByKeyOnly, _Reshuffle, dask_overrides
from apache_beam.runners.dask.transform_evaluator import get_windowed_value
from apache_beam.transforms.sideinputs import SideInputMap

from pipelines.io.frames import PartWriter, decode, decode_list, encode
from pipelines.runners.dask.combine import LiftedCombine
from pipelines.runners.dask.parts import group, group_pieces, shuffle, spread
from pipelines.runners.dask.trim import PLUGIN_NAME, TrimMemory
from pipelines.runners.dask.watch import JobResult

MIN_PARTITIONS = 4  # a Reshuffle spreads over at least this many bag partitions
PARTITION_BYTES = 4_000_000  # input bytes per bag partition: a task's share stays this size as the corpus grows


def partition_count(requested: int | None, threads: int, input_bytes: int) -> int:
    """Bag partitions of created and reshuffled data and of every group.

    ``requested`` (``--dask_npartitions``) when given; else the larger of ``MIN_PARTITIONS``,
    twice the cluster's worker ``threads`` and ``ceil(input_bytes / PARTITION_BYTES)``, so each
    task's slice of the input stays about ``PARTITION_BYTES`` however large the corpus (with a
    fixed count, every task's slice, and its memory, would grow with the corpus).
    """
    if requested:
        return requested
    return max(MIN_PARTITIONS, 2 * threads, -(-input_bytes // PARTITION_BYTES))


class _TagReceiver(Receiver):
    """Appends each element a DoFn emits on one tag to that tag's :class:`PartWriter`."""

    def __init__(self, writer: PartWriter):
        self.writer = writer

    def receive(self, windowed_value):
        self.writer.append(windowed_value.value)


class _Receivers(dict):
    """Tag (``None``: main output) → receiver; ``out`` maps each tag to the writer of the values emitted on it."""

    def __init__(self, out: dict):
        super().__init__()
        self.out = out

    def __missing__(self, tag):
        self[tag] = _TagReceiver(self.out.setdefault(tag, PartWriter()))
        return self[tag]


_SET_UP: dict = {}  # (run id, step, thread id) → (a DoFn of that step set up in this process, its state after setup)
_SET_UP_LOCK = threading.Lock()


def _set_up_fn(fn, key: tuple):
    """The DoFn instance to run with under ``key`` ``(run id, step, thread id)`` and its attributes
    right after ``setup``: one whose ``setup`` already ran in this process, else ``(fn, None)`` (set
    it up). Instances of other runs are dropped first (Beam calls ``teardown`` best-effort only)."""
    with _SET_UP_LOCK:
        for stale in [k for k in _SET_UP if k[0] != key[0]]:
            del _SET_UP[stale]
        return _SET_UP.get(key, (fn, None))


def _run_bundle(part, grouped: bool, fn, args, kwargs, step, run_id, window_fn, views, *side_values) -> dict:
    """Run DoFn ``fn`` (of Beam step ``step``, full label) over one bag partition as one bundle:
    encoded elements, or with ``grouped`` a group partition (:func:`pipelines.runners.dask.parts.shuffle`).

    ``views`` are ``(view class, view options, window mapping fn)`` per side input and
    ``side_values`` the matching fully computed side-input element lists. Returns, per output
    tag (``None``: main), the encoded values emitted by ``process`` and by ``finish_bundle``
    (fault 2), written as emitted through a :class:`pipelines.io.frames.PartWriter` per tag.

    As on Beam's own workers, a DoFn instance is set up once and reused for later bundles of
    its step in the same worker thread and run ``run_id`` (a per-bundle ``setup`` would, e.g.,
    load the language model once per partition); an instance whose bundle raised is discarded.
    After each bundle the instance's attributes are reset to what ``setup`` left, so what a
    bundle built (a DoFn's per-bundle buffers, up to a whole partition)
    is not kept alive in the worker, outside dask's memory accounting, until the next bundle.
    """
    out: dict = {}
    receivers = _Receivers(out)
    handler = _OutputHandler(window_fn=window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
                             per_element_output_counter=None, output_batch_converter=None,
                             process_yields_batches=False, process_batch_yields_elements=False)
    side_inputs = [SideInputMap(view_class, options, [get_windowed_value(v, mapping) for v in values])
                   for (view_class, options, mapping), values in zip(views, side_values)]
    key = (run_id, step, threading.get_ident())
    fn, after_setup = _set_up_fn(fn, key)
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn), handler, context=DoFnContext(step, state=None), side_inputs=side_inputs,
        input_args=args, input_kwargs=kwargs, user_state_context=None,
        bundle_finalizer_param=beam.DoFn.BundleFinalizerParam())
    try:
        if after_setup is None:
            invoker.invoke_setup()
            after_setup = dict(vars(fn))
            with _SET_UP_LOCK:
                _SET_UP[key] = fn, after_setup
        invoker.invoke_start_bundle()
        for item in group_pieces(part) if grouped else decode(part):
            invoker.invoke_process(get_windowed_value(item, window_fn))
        invoker.invoke_finish_bundle()
    except BaseException:
        with _SET_UP_LOCK:
            _SET_UP.pop(key, None)
        raise
    vars(fn).clear()
    vars(fn).update(after_setup)
    return {tag: writer.getvalue() for tag, writer in out.items()}


_EMPTY = encode([])


def _select(outputs: dict, tag, *_after) -> bytes:
    """The encoded values of one output tag from a ParDo partition's outputs (fault 1).
    ``_after``: partitions of the other tags' selects, passed only to run those first."""
    return outputs.get(tag, _EMPTY)


def _task_name(label: str, tag=None) -> str:
    """Dask task-name prefix for a Beam step (``Shards/WriteBucket`` → ``Shards.WriteBucket``, plus
    ``.tag`` for a tagged output): the dashboard and the scheduler's memory listing name stages."""
    name = re.sub(r"[^A-Za-z0-9_.]+", ".", label.replace("/", ".")).strip(".")
    return f"{name}.{tag}" if tag else name


def _single_key(node) -> bool:
    """Whether the group of Beam step ``node`` holds one key: it is part of a ``CombineGlobally``
    (all its elements keyed by ``None``), and not the first combine of a hot-key fanout (keyed by
    nonce). Its shuffle then needs one output partition, where ``partitions`` would each be
    tasks for nothing. Known by the labels of Beam's expansion (a ``KeyWithVoid`` step beside
    the combine, ``CombinePerKey(PreCombineFn)`` for the fanout), because the runner receives
    the pipeline rebuilt from its runner-API form, where composites are plain ``PTransform``s."""
    if "(PreCombineFn)" in node.full_label:
        return False
    while node.parent is not None:
        node = node.parent
        if any(part.full_label.rsplit("/", 1)[-1] == "KeyWithVoid" for part in node.parts):
            return True
    return False


def _join_parts(*parts: bytes) -> bytes:
    return b"".join(parts)  # frames concatenate


def _flatten(bags: list, name: str):
    """Beam's ``Flatten`` of ``bags``: bags with one partition count are joined partition by
    partition (partition ``i`` of the result joins partition ``i`` of each), and the joined
    bags' partitions follow one another. The job flattens per-stage events and duplicates
    (``k`` bags of ``partitions`` small partitions each): joined, the group that follows (the
    events' sum) splits about ``partitions`` inputs, not ``k × partitions``, each a task with
    ``sqrt(partitions)`` pieces."""
    by_count: dict = {}
    for bag in bags:
        by_count.setdefault(bag.npartitions, []).append(bag)
    joined = [same[0] if len(same) == 1 else db.map_partitions(_join_parts, *same, token=name)
              for same in by_count.values()]
    return joined[0] if len(joined) == 1 else db.concat(joined)


def _concat(parts) -> list:
    return [x for part in parts for x in part]


def _nothing(_) -> list:
    return []


class _LiftCombines(PTransformOverride):
    """``CombinePerKey`` → :class:`pipelines.runners.dask.combine.LiftedCombine` (partial combine per bundle
    before the group)."""

    def matches(self, applied):
        return (isinstance(applied.transform, beam.CombinePerKey)
                and applied.inputs[0].windowing.is_default())

    def get_replacement_transform_for_applied_ptransform(self, applied):
        t = applied.transform
        return LiftedCombine(t.fn, t.args, t.kwargs)


@dataclasses.dataclass
class _Translator(PipelineVisitor):
    """Builds one ``dask.bag`` per PCollection; ``sinks`` collects those nothing consumes.
    ``grouped`` holds the PCollections whose bags have group partitions (a ``GroupByKey``'s
    output, :func:`pipelines.runners.dask.parts.shuffle`): a ParDo reads them as they are, any other
    consumer through :meth:`_encoded`."""

    partitions: int
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)  # keys reused DoFns per run
    bags: dict = dataclasses.field(default_factory=dict)
    consumed: set = dataclasses.field(default_factory=set)
    grouped: set = dataclasses.field(default_factory=set)
    encoded: dict = dataclasses.field(default_factory=dict)

    def _encoded(self, pcoll):
        """The bag of ``pcoll`` with encoded partitions (a group's encoded once, on first use)."""
        if pcoll not in self.grouped:
            return self.bags[pcoll]
        if pcoll not in self.encoded:
            name = f"{_task_name(pcoll.producer.full_label)}.encode"
            self.encoded[pcoll] = self.bags[pcoll].map_partitions(group, token=name)
        return self.encoded[pcoll]

    def visit_transform(self, node) -> None:
        transform = node.transform
        sources = [p for p in node.inputs if not isinstance(p, pvalue.PBegin)]
        self.consumed.update(sources)
        if isinstance(transform, (_Flatten, _GroupByKeyOnly, _Reshuffle)):
            inputs = [self._encoded(p) for p in sources]  # a ParDo reads a group's pieces as they are
        if isinstance(transform, _Create):
            values = list(transform.values)
            bag = db.from_sequence(values, npartitions=max(1, min(len(values), self.partitions))).map_partitions(
                encode, token=_task_name(node.full_label))
        elif isinstance(transform, _Flatten):
            bag = _flatten(inputs, _task_name(node.full_label))
        elif isinstance(transform, _GroupByKeyOnly):
            bag = shuffle(inputs[0], 1 if _single_key(node) else self.partitions, _task_name(node.full_label))
            self.grouped.update(node.outputs.values())
        elif isinstance(transform, _Reshuffle):
            bag = spread(inputs[0], self.partitions, _task_name(node.full_label))
        elif type(transform) is beam.ParDo:
            bag = self._pardo(node, sources[0])
        elif sources:  # _GroupAlsoByWindow and the like: identity in the global window
            bag = self.bags[sources[0]]
            if sources[0] in self.grouped:
                self.grouped.update(node.outputs.values())
        else:
            bag = None
        if type(transform) is not beam.ParDo:
            self.bags.update((pcoll, bag) for pcoll in node.outputs.values())
            return
        # The main output's select runs after the tagged ones: it is taken early (its consumers
        # are on the critical path), so once it has run no select is left that keeps the whole
        # ParDo output (main values included) in worker memory while other stages run.
        tagged = {tag: bag.map_partitions(_select, tag, token=_task_name(node.full_label, tag))
                  for tag in node.outputs if tag is not None}
        for tag, pcoll in node.outputs.items():
            self.bags[pcoll] = tagged[tag] if tag is not None else bag.map_partitions(
                _select, None, *tagged.values(), token=_task_name(node.full_label, "main"))

    def _pardo(self, node, source):
        transform = node.transform
        args, kwargs = transform.args, transform.kwargs  # side inputs as placeholders
        main = next(iter(node.main_inputs.values()))
        views, values = [], []
        for si in node.side_inputs:
            self.consumed.add(si.pvalue)
            views.append((type(si), si._view_options(), si._window_mapping_fn))
            # one graph node per side input, computed once (fault 4); not optimised on its own,
            # which would fuse a renamed copy of everything upstream into it
            side = self._encoded(si.pvalue).reduction(decode_list, _concat)
            values.append(side.to_delayed(optimize_graph=False))
        return self.bags[source].map_partitions(
            _run_bundle, source in self.grouped, transform.fn, list(args), kwargs, node.full_label, self.run_id,
            main.windowing.windowfn, views, *values, token=_task_name(node.full_label))

    def sinks(self):
        """One bag over every PCollection that no step reads, each mapped to empty partitions
        (fault 3): a single collection, so the graph is optimised and run once."""
        return db.concat([bag.map_partitions(_nothing) for pcoll, bag in self.bags.items()
                          if pcoll not in self.consumed and bag is not None])


def _quiet_local_cluster() -> None:
    """Raise the ``distributed`` loggers to WARNING (from some 70 ``INFO distributed.*`` lines) for the
    local cluster ``Client()`` starts without ``--dask_client_address``: here, for its scheduler,
    and via ``DASK_LOGGING__DISTRIBUTED``, read by the worker processes it spawns."""
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "warning"
    logging.getLogger("distributed").setLevel(logging.WARNING)


class ColaflowDaskRunner(DaskRunner):
    """Beam's :class:`~apache_beam.runners.dask.dask_runner.DaskRunner` with the fixes listed in the
    module docstring. Options: ``--dask_client_address=HOST:PORT`` (a running ``dask scheduler``;
    without it a local cluster is started), ``--dask_npartitions`` (bag partitions of created and
    reshuffled data and of groups; default from :func:`partition_count`: one per
    ``PARTITION_BYTES`` of ``input_bytes``, at least twice the cluster's worker threads and
    ``MIN_PARTITIONS``). ``--dask_partition_size`` is not used.

    Args:
        input_bytes: total size of the job's input files in bytes (0 when unknown), which sizes
            the default partition count.

    Importing this module raises ``ImportError`` when ``dask``/``distributed`` are not installed
    (``pip install colaflow[dask]``).
    """

    def __init__(self, input_bytes: int = 0):
        super().__init__()
        self.input_bytes = input_bytes

    def run_pipeline(self, pipeline, options):
        """Translate ``pipeline`` into one ``dask.bag`` graph and submit it to the cluster (whose
        workers get the :class:`pipelines.runners.dask.trim.TrimMemory` plugin); returns a result whose
        ``wait_until_finish`` raises the first task error and then closes the client. Without
        ``--dask_client_address`` it starts an in-process local cluster, whose ``distributed``
        INFO lines are held back (:func:`_quiet_local_cluster`). Raises ``ConnectionError`` when no
        scheduler answers at ``--dask_client_address`` in time."""
        import dask.distributed as ddist

        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
        bag_kwargs = DaskOptions._extract_bag_kwargs(dask_options)
        if not dask_options.get("address"):
            _quiet_local_cluster()
        try:
            client = ddist.Client(**dask_options)
        except OSError as e:  # dask's "Timed out trying to connect": say which flag and what to start
            raise ConnectionError(f"no Dask scheduler answered at {dask_options.get('address')}: {e}; start one "
                                  "(`dask scheduler`, then `dask worker ADDRESS`; docs/cluster.md) or fix "
                                  "--dask_client_address") from e
        client.register_plugin(TrimMemory(), name=PLUGIN_NAME)
        threads = sum(client.nthreads().values())
        pipeline.replace_all([_LiftCombines()] + dask_overrides())
        translator = _Translator(partition_count(bag_kwargs.get("npartitions"), threads, self.input_bytes))
        pipeline.visit(translator)
        futures = client.compute(translator.sinks().to_delayed(optimize_graph=True))
        return JobResult(client, futures)

