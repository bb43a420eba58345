"""Resuming a run (``--resume``): the work of every finished input split is kept in ``OUT/.work/``
and reused by the next run of the same job, which recomputes only the rest.

Each :class:`~pipelines.io.reading.Split` goes through the per-document stages as one unit
(:class:`SplitWorkFn`: ReadSplit → Parse → Steps); what it made of the split (each kept document's
:class:`~pipelines.stages.keys.DocKey` and MinHash signature, first, so that the passes that need keys
alone stop reading there, then the kept documents, the dead letters and the events) is written at
the end of the split, atomically (a
``.partial`` file renamed into place), to ``OUT/.work/<split id>.<job fingerprint>.split``. A split
whose record exists is read from it instead of from the input. The global stages (tokenizer, dedup,
tokenize, shards, finalize) always run on the union, so the output is byte-identical to an
uninterrupted run. The records are also where the job's text lives after Work: the global stages
move keys only, and the tokenizer sample and the final pass read the text back from here
(:func:`~pipelines.stages.keys.record_docs`); ``OUT/.work/spill/`` holds the encoded samples on
their way to the shards (:class:`pipelines.stages.write_shards.WriteShards`).

``OUT/.work/job.json`` holds the job's identity (:class:`JobIdentity`: every config value and each
input file's size and modification time); ``--resume`` refuses a job whose identity differs
(:func:`check_resume`). A run that fails keeps ``.work/`` (unless its error says to change the config
or input, :func:`keeps_work`); one that succeeds removes it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import uuid

import apache_beam as beam
import fsspec

from colaflow.wording import count
from pipelines.accounting.stats import EVENTS, event
from pipelines.config import PipelineConfig
from pipelines.io import frames
from pipelines.io.listing import InputListing
from pipelines.io.read import ParseFn
from pipelines.io.reading import Split, read_split
from pipelines.stages.filters import FilterFn, build_steps
from pipelines.stages.keys import KEY_BATCH, KEYS, doc_keys, key_rows, record_keys

WORK_DIR = ".work"  # hidden: readers of OUT never list it
JOB_FILE = "job.json"
# v3: the record starts with its documents' keys (frames of their own, read without the documents:
# WorkFolder.load_keys); a record of an earlier version is recomputed
RECORD_SUFFIX = ".v3.split"
SPILL_DIR = "spill"  # under WORK_DIR: run files of one run (KeyStats, BandStats, JSONL lines, encoded samples)
_SHOWN = 3  # changes named in a refusal before "and N more"
# documents filtered together, so that a model step (classifier.kind=hf) scores them in batches; a
# split's whole output is held in memory anyway (its record), this adds at most 256 parsed documents
FILTER_BATCH = 256


class ResumeError(ValueError):
    """``--resume`` refused: the config or the input files differ from the unfinished run's; the
    message names what changed and what to do."""


@dataclasses.dataclass(frozen=True)
class JobIdentity:
    """What every split's record depends on.

    Attributes:
        config: every config value by its dotted key (``tokenizer.vocab_size``), as JSON keeps it.
        root: the folder sample ids are named relative to (:attr:`InputListing.root`).
        inputs: each listed input file's path → ``[size in bytes, modification time]``.
    """

    config: dict
    root: str
    inputs: dict

    @classmethod
    def of(cls, cfg: PipelineConfig, listing: InputListing) -> JobIdentity:
        """The identity of a run of ``cfg`` over ``listing`` (stats each input file once).

        Args:
            cfg: the run's config.
            listing: what ``--input`` names.
        Returns:
            the :class:`JobIdentity`.
        """
        return cls(_settings(cfg), listing.root, {f.path: [f.size_in_bytes, _modified(f.path)] for f in listing.files})

    def to_json(self) -> str:
        """The identity as canonical JSON (sorted keys): the content of ``job.json``."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1)

    @property
    def fingerprint(self) -> str:
        """16 hex digits of the sha256 of :meth:`to_json`; part of every record's name."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()[:16]

    def changes(self, earlier: dict) -> list[str]:
        """What differs from ``earlier`` (a ``job.json`` read back), one phrase per config key or
        input file, config keys first; empty when nothing does."""
        found = []
        old_config = earlier.get("config", {})
        for key in sorted(set(self.config) | set(old_config)):
            before, now = old_config.get(key, "unset"), self.config.get(key, "unset")
            if before != now:
                found.append(f"config {key} was {json.dumps(before)}, now {json.dumps(now)}")
        if earlier.get("root") != self.root:
            found.append(f"the input root was {earlier.get('root')}, now {self.root}")
        old_inputs = earlier.get("inputs", {})
        for path in sorted(set(self.inputs) | set(old_inputs)):
            before, now = old_inputs.get(path), self.inputs.get(path)
            if before is None:
                found.append(f"input file {path} is new")
            elif now is None:
                found.append(f"input file {path} is gone")
            elif before[0] != now[0]:
                found.append(f"input file {path} changed ({before[0]:,} bytes, now {now[0]:,})")
            elif before[1] != now[1]:
                found.append(f"input file {path} was modified (same size)")
        return found


def _settings(obj, prefix: str = "") -> dict:
    """Every field of config dataclass ``obj`` by dotted key, sections flattened, values as JSON keeps them."""
    out = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value):
            out.update(_settings(value, f"{prefix}{field.name}."))
        else:
            out[prefix + field.name] = json.loads(json.dumps(value))
    return out


def _modified(path: str) -> str:
    """When ``path`` was last modified, as its filesystem says (local: ``st_mtime_ns``; object
    stores: the listed modification time, else the ETag)."""
    if "://" not in path or path.startswith("file://"):
        return str(os.stat(path.removeprefix("file://")).st_mtime_ns)
    fs, root = fsspec.core.url_to_fs(path)
    info = fs.info(root)
    return str(next((info[k] for k in ("mtime", "LastModified", "updated", "ETag") if info.get(k)), ""))


def split_id(split: Split) -> str:
    """16 hex digits naming ``split`` (its file, format and range)."""
    return hashlib.sha256(json.dumps(list(split)).encode("utf-8")).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class WorkFolder:
    """Where a job keeps its finished splits.

    Attributes:
        output_dir: the ``--output`` folder or fsspec URL.
        fingerprint: the job's :attr:`JobIdentity.fingerprint`.
    """

    output_dir: str
    fingerprint: str

    @property
    def url(self) -> str:
        """``OUT/.work``."""
        return f"{self.output_dir.rstrip('/')}/{WORK_DIR}"

    @property
    def spill(self) -> str:
        """``OUT/.work/spill``: the run files of this run (sorted key and band runs, JSONL lines, the final
        pass's encoded samples; always stale at a run's start)."""
        return f"{self.url}/{SPILL_DIR}"

    def record(self, split: Split) -> str:
        """The URL of ``split``'s record."""
        return f"{self.url}/{split_id(split)}.{self.fingerprint}{RECORD_SUFFIX}"

    def load(self, split: Split) -> bytes | None:
        """The bytes of ``split``'s record (:mod:`pipelines.io.frames`), ``None`` when it has none."""
        fs, path = fsspec.core.url_to_fs(self.record(split))
        try:
            return fs.cat_file(path)
        except FileNotFoundError:
            return None

    def load_keys(self, split: Split) -> list | None:
        """The ``(DocKey, signature)`` pairs of ``split``'s record (:func:`~pipelines.stages.keys.record_keys`:
        its documents are not read), ``None`` when it has none."""
        fs, path = fsspec.core.url_to_fs(self.record(split))
        try:
            with fs.open(path, "rb") as f:
                return record_keys(f)
        except FileNotFoundError:
            return None

    def save(self, split: Split, data: bytes) -> None:
        """Write ``split``'s record atomically: into a ``.partial`` file of its own, renamed into place."""
        fs, path = fsspec.core.url_to_fs(self.record(split))
        partial = f"{path}.{uuid.uuid4().hex[:8]}.partial"
        fs.pipe_file(partial, data)
        fs.mv(partial, path)


class SplitWorkFn(beam.DoFn):
    """:class:`~pipelines.io.reading.Split` → one :data:`~pipelines.stages.keys.KEY_ROW` array of the
    documents kept of it (main output, :func:`~pipelines.stages.keys.key_rows`; none when it keeps
    none), its dead letters (tag ``dead``), the steps' listing lines
    (tag ``listed``) and its events (tag ``events``). The documents themselves stay in the record.

    A split with a record in the :class:`WorkFolder` is read from it. Any other is read
    (:func:`~pipelines.io.reading.read_split`), parsed (:class:`~pipelines.io.read.ParseFn`) and
    filtered (:class:`~pipelines.stages.filters.FilterFn`, :data:`FILTER_BATCH` documents at a time)
    as one bundle of those two DoFns, its outputs emitted as they come and kept as frames (one
    split's output in memory, as bytes, bounded by ``input.split_bytes``), and recorded once the
    split is done.
    """

    def __init__(self, work: WorkFolder, cfg: PipelineConfig, root: str, total_bytes: int = 0):
        self.work, self.input_cfg, self.dedup, self.total_bytes = work, cfg.input, cfg.dedup, total_bytes
        self.parse, self.filter = ParseFn(cfg.input, root), FilterFn(build_steps(cfg))
        self.run_id = uuid.uuid4().hex  # one progress bar per run, even when runs share a process

    def setup(self):
        """Set up the document steps (loads the language model when enabled)."""
        self.filter.setup()

    def process(self, split: Split):
        """Replay ``split``'s record, or compute and record it."""
        data = self.work.load(split)
        yield from (_replay(data) if data is not None else self._compute(split))

    def _compute(self, split: Split):
        kept, keys = frames.PartWriter(), frames.PartWriter()
        sid, pending, first, made = split_id(split), [], 0, []
        self.parse.start_bundle()
        self.filter.start_bundle()
        batch: list = []

        def filtered(docs: list):
            # The steps' outputs for one batch: tagged ones go out and into the record; a kept
            # document goes into the record only, its DocKey made once KEY_BATCH of them are pending.
            nonlocal pending, first
            for out in self.filter.filter_batch(docs):
                if isinstance(out, beam.pvalue.TaggedOutput):
                    kept.append((out.tag, out.value))
                    yield out
                    continue
                kept.append((None, out))
                pending.append(out)
                if len(pending) >= KEY_BATCH:
                    self._keys(pending, sid, first, keys, made)
                    first, pending = first + len(pending), []

        for unit in read_split(split, self.input_cfg, self.total_bytes, self.run_id):
            for parsed in self.parse.process(unit):
                if isinstance(parsed, beam.pvalue.TaggedOutput):  # a dead letter
                    kept.append((parsed.tag, parsed.value))
                    yield parsed
                    continue
                batch.append(parsed)
                if len(batch) == FILTER_BATCH:
                    yield from filtered(batch)
                    batch = []
        yield from filtered(batch)
        self._keys(pending, sid, first, keys, made)
        if made:
            yield key_rows(made)
        for tagged in [*self.parse.finish_bundle(), *self.filter.finish_bundle()]:
            value = tagged.value.value  # finish_bundle's events are windowed; here they go out of process
            kept.append((EVENTS, value))
            yield beam.pvalue.TaggedOutput(EVENTS, value)
        self.work.save(split, keys.getvalue() + kept.getvalue())  # two frame lists joined are one

    def _keys(self, docs: list, sid: str, first: int, keys: frames.PartWriter, made: list) -> None:
        for pair in doc_keys(docs, sid, first, self.dedup):
            keys.append((KEYS, pair))
            made.append(pair[0])


def _replay(data: bytes):
    """The outputs of a split's record, as :meth:`SplitWorkFn._compute` emitted them (the keys'
    rows, not the documents, on the main output)."""
    made = []
    for tag, value in frames.decode(data):
        if tag is None:
            continue
        if tag == KEYS:
            made.append(value[0])  # the key; its signature stays in the record
        elif tag == EVENTS:
            yield event(*value[0], value[1])  # bumps the Beam counter as the first run did
        else:
            yield beam.pvalue.TaggedOutput(tag, value)
    if made:
        yield key_rows(made)


def _read_job(output_dir: str) -> dict | None:
    """``OUT/.work/job.json`` as a dict, ``None`` when there is none."""
    fs, root = fsspec.core.url_to_fs(output_dir)
    try:
        return json.loads(fs.cat_file(f"{root}/{WORK_DIR}/{JOB_FILE}"))
    except FileNotFoundError:
        return None


def check_resume(output_dir: str, identity: JobIdentity) -> None:
    """Before a ``--resume`` run touches ``output_dir``: refuse when the unfinished run there was
    another job. Nothing to check when ``output_dir`` holds no unfinished run (the run starts fresh).

    Args:
        output_dir: the ``--output`` folder or fsspec URL.
        identity: this run's :class:`JobIdentity`.
    Raises:
        ResumeError: the config or the input files differ; one line naming the first changes.
    """
    earlier = _read_job(output_dir)
    found = [] if earlier is None else identity.changes(earlier)
    if found:
        more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
        raise ResumeError(f"--resume: the unfinished run in {output_dir.rstrip('/')} was another job: "
                          f"{'; '.join(found[:_SHOWN])}{more}. Rerun with its config and inputs, or without "
                          "--resume to start over")


def start_work(output_dir: str, identity: JobIdentity, resume: bool) -> WorkFolder:
    """Ready ``OUT/.work/`` for a run of ``identity`` (after :func:`check_resume` and
    :func:`pipelines.io.output.prepare_output`) and say on stderr what is reused.

    With ``resume`` and an unfinished run of this job there, its finished splits are kept (a
    record cut short, ``*.partial``, is removed); otherwise any earlier work is removed (the run
    starts over). Then ``job.json`` is written.

    Args:
        output_dir: the ``--output`` folder or fsspec URL.
        identity: this run's :class:`JobIdentity`.
        resume: reuse the finished splits of the unfinished run (``--resume``).
    Returns:
        the run's :class:`WorkFolder`.
    """
    work = WorkFolder(output_dir, identity.fingerprint)
    fs, root = fsspec.core.url_to_fs(work.url)
    fs.invalidate_cache()
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)] if fs.exists(root) else []
    records = [n for n in names if n.endswith(RECORD_SUFFIX)]
    reused = [n for n in records if n.endswith(f".{work.fingerprint}{RECORD_SUFFIX}")]
    out = output_dir.rstrip("/")
    if resume and JOB_FILE in names:
        for name in names:
            if name.endswith(".partial") or name == SPILL_DIR:  # spilled samples belong to the run that died
                fs.rm(f"{root}/{name}", recursive=True)
        print(f"resuming the unfinished run in {out}: reusing {count(len(reused), 'finished input split')}",
              file=sys.stderr, flush=True)
    else:
        if names:
            fs.rm(root, recursive=True)
        if resume:
            print(f"note: --resume: {out} holds no unfinished run; starting a fresh run", file=sys.stderr, flush=True)
        elif records:
            print(f"note: starting over: removed the {count(len(records), 'finished input split')} of the unfinished "
                  f"run in {out} (pass --resume to reuse them)", file=sys.stderr, flush=True)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/{JOB_FILE}", identity.to_json().encode("utf-8"))
    return work


def keeps_work(error: BaseException) -> bool:
    """Whether a run that failed with ``error`` keeps ``OUT/.work/`` for ``--resume``: yes (Ctrl-C,
    SIGTERM, a lost worker, an I/O error, a bug), unless ``error`` says to change the config or the
    input (a ``ConfigError``, an ``EmptySampleError``: no document kept or no record read, a
    ``TokenRangeError``), where ``--resume`` would refuse the corrected rerun."""
    from colaflow.config import ConfigError
    from pipelines.stages.tokenize import EmptySampleError
    from shards.format.tokens import TokenRangeError

    return not isinstance(error, (ConfigError, EmptySampleError, TokenRangeError))


def remove_work(output_dir: str) -> None:
    """Remove ``OUT/.work/`` (a run succeeded, or failed where :func:`keeps_work` says no). Never
    raises: one warning line when it cannot."""
    fs, root = fsspec.core.url_to_fs(f"{output_dir.rstrip('/')}/{WORK_DIR}")
    try:
        fs.invalidate_cache()
        if fs.exists(root):
            fs.rm(root, recursive=True)
    except OSError as e:
        print(f"warning: cannot delete {output_dir.rstrip('/')}/{WORK_DIR}/ ({type(e).__name__}: {e}); delete it "
              "by hand", file=sys.stderr, flush=True)
