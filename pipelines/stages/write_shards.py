"""Writing shards deterministically (:class:`WriteShards`: bucket by a stable hash of the key,
one tar per bucket, the samples passed between the steps as files in ``OUT/.work/spill/``), then
the commit (:func:`finalize`): shard names, manifest, tokenizer and ``stats.json``. ``pipelines/README.md`` says why every runner writes the same bytes."""
from __future__ import annotations

import contextlib
import dataclasses
import heapq
import json
import math
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from typing import NamedTuple

import apache_beam as beam
import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from colaflow.wording import count
from pipelines.accounting.stats import EVENTS, aggregate, event
from pipelines.config import ShardsConfig, TokenizerConfig
from pipelines.io.frames import decode_stream, encode
from pipelines.records import Doc
from pipelines.stages.clean import stable_bucket
from pipelines.stages.split import VAL, VAL_DIR, split_entry
from shards import Manifest, ShardIndex, ShardInfo, TarShardWriter, escape_key, shard_name
from shards.format.layouts import EncodedDocument, check_settings, get_layout
from shards.format.manifest import TokenizerIdentity
from shards.io.index import WIDS_FILE, build_shard_index, dali_index_path, wids_index, write_dali_index
from shards.tokenizers import TokenizerFile, build, folder_files

TMP_DIR = "_tmp_buckets"


def encode_sample(item: tuple[Doc, np.ndarray], store_text: bool = False, layout: str = "token_blocks"
                  ) -> EncodedDocument:
    """``(doc, tokens)`` → its :class:`shards.format.layouts.EncodedDocument` for ``layout``.

    The key is :func:`shards.escape_key` of the id (a hashed key for over-long ids; the id is in
    the metadata ``{"id", "source", "n_tokens", "n_bytes"}`` either way, plus the set fields of
    :class:`~pipelines.records.DocMeta`: ``url``, ``date``, ``language``, ``quality_score``); ``store_text`` keeps the text.
    """
    doc, tokens = item
    text_bytes = len(doc.text.encode("utf-8"))
    meta = {"id": doc.id, "source": doc.source, "n_tokens": int(tokens.size), "n_bytes": text_bytes}
    if doc.meta is not None:  # a web document's url, date and language; a quality score
        meta.update(doc.meta.fields())
    fields = get_layout(layout).encode(meta, tokens, doc.text if store_text else None)
    return EncodedDocument(escape_key(doc.id), fields, int(tokens.size), doc.source, text_bytes)


def encoded_size(doc: EncodedDocument, layout: str = "token_blocks") -> int:
    """Approximate shard bytes of an encoded document (:meth:`shards.format.layouts.Layout.encoded_bytes`)."""
    return get_layout(layout).encoded_bytes(doc)


def num_buckets(total_bytes: int, cfg: ShardsConfig) -> int:
    """Shard count: ``cfg.num_shards`` when set, else ``ceil(total_bytes / cfg.target_bytes)`` (at least 1)."""
    if cfg.num_shards > 0:
        return cfg.num_shards
    return max(1, math.ceil(total_bytes / cfg.target_bytes))


def assign_bucket(doc: EncodedDocument, total_bytes: int, cfg: ShardsConfig) -> tuple[int, EncodedDocument]:
    """``(bucket, doc)``: the document's bucket by a stable hash of its key over :func:`num_buckets`."""
    return stable_bucket(doc.key, num_buckets(total_bytes, cfg)), doc


def sample_order(doc: EncodedDocument) -> tuple[str, bytes]:
    """Where an encoded document goes in its shard: by key, then metadata."""
    return doc.key, doc.fields["json"]


RUN_FRAME_SAMPLES = 32  # samples per frame of a run: the writer holds one frame of each run as objects
RUN_BUFFER_BYTES = 32 << 20  # memory a bundle's samples hold as objects (held_bytes) before it emits its runs early


class SpilledSamples(NamedTuple):
    """Encoded samples (frames of :class:`shards.format.layouts.EncodedDocument`) in a file of the
    spill folder (:func:`spill`): its ``path`` (fsspec URL) and their ``size`` (:func:`encoded_size`, summed)."""

    path: str
    size: int


def held_bytes(doc: EncodedDocument) -> int:
    """About the memory a decoded sample holds as Python objects: the tuple, its key and source,
    its ``fields`` dict and their values (``sys.getsizeof`` of each). A short document's objects
    take several times its encoded bytes (:func:`encoded_size`), so a buffer counted in those grew
    far past its bound (at 16x a quarter of the demo corpus, 135 MB for 32 MB counted)."""
    return (sys.getsizeof(doc) + sys.getsizeof(doc.key) + sys.getsizeof(doc.source) + sys.getsizeof(doc.fields)
            + sum(sys.getsizeof(v) for v in doc.fields.values()))


def spill(folder: str, data: bytes) -> str:
    """Write ``data`` to a new file (a random name) under ``folder``; returns its URL."""
    path = f"{folder.rstrip('/')}/{uuid.uuid4().hex}.frames"
    fs, local = _fs(path)
    fs.makedirs(local.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(local, data)
    return path


class BucketRuns:
    """One bundle's items per bucket, each bucket's written as one sorted run file (:func:`spill`) when
    the items hold more than ``limit`` bytes, and at the end of the bundle.

    Args:
        folder: the spill folder (fsspec URL).
        limit: bytes the held items may take (as the caller counts them) before the runs are written.
        encode_run: a bucket's items → the run file's bytes (it sorts them).
    """

    def __init__(self, folder: str, limit: int, encode_run: Callable[[list], bytes]):
        self.folder, self.limit, self.encode_run = folder, limit, encode_run
        self._runs: dict[int, list] = {}
        self._held = 0

    def add(self, bucket: int, item, size: int) -> list[tuple[int, str]]:
        """Hold ``item`` (``size`` bytes) in ``bucket``'s run; returns ``(bucket, path)`` of every run
        written (all of them once the held items pass ``limit``, else none). A list, not a generator:
        the item is held whether or not the caller reads what comes back."""
        self._runs.setdefault(bucket, []).append(item)
        self._held += size
        return self.flush() if self._held > self.limit else []

    def flush(self) -> list[tuple[int, str]]:
        """Write every held run, in bucket order; returns ``(bucket, path)`` of each."""
        runs, self._runs, self._held = self._runs, {}, 0
        return [(bucket, spill(self.folder, self.encode_run(runs.pop(bucket)))) for bucket in sorted(runs)]


def _sample_run(samples: list) -> bytes:
    """A bucket's samples sorted by :func:`sample_order`, as frames of ``RUN_FRAME_SAMPLES``."""
    samples.sort(key=sample_order)
    return encode(samples, RUN_FRAME_SAMPLES)


class AssignBucketsFn(beam.DoFn):
    """:class:`SpilledSamples` → ``(bucket, path of a run)`` per bucket, once per bundle: the bundle's
    samples of that bucket (:func:`assign_bucket`) sorted by :func:`sample_order`, encoded as frames
    of ``RUN_FRAME_SAMPLES`` (:func:`pipelines.io.frames.encode`) into a file of ``folder``
    (:func:`spill`). A bundle whose samples hold more than ``RUN_BUFFER_BYTES`` as objects
    (:func:`held_bytes`) writes its runs early and starts new ones, so a runner with large bundles (the
    DirectRunner's can be the whole corpus) never holds more than that here.

    Why runs, and why in files: :class:`WriteBucketFn` merges a bucket's runs, reading one frame of
    each at a time, so it holds the bucket as bytes, not as one object tree per sample; and the group
    moves one path per bundle and bucket, so what the runner buffers between the steps (the
    DirectRunner buffers a whole grouping) is paths, not the corpus's tokens.

    Args:
        folder: the spill folder (fsspec URL) the runs go to.
    """

    def __init__(self, folder: str):
        self.folder = folder

    def start_bundle(self):
        """Start empty runs."""
        self._runs = BucketRuns(self.folder, RUN_BUFFER_BYTES, _sample_run)

    def process(self, spilled: SpilledSamples, total_bytes: int, cfg: ShardsConfig):
        """Add each document of ``spilled`` to its bucket's run (``total_bytes``: the side input of
        encoded bytes; ``cfg``: the shard settings); writes runs only past ``RUN_BUFFER_BYTES``."""
        with fsspec.open(spilled.path, "rb") as f:
            for doc in decode_stream(f):
                bucket, _ = assign_bucket(doc, total_bytes, cfg)
                yield from self._runs.add(bucket, doc, held_bytes(doc))

    def finish_bundle(self):
        """Write the runs left, in bucket order."""
        for run in self._runs.flush():
            yield beam.transforms.window.GlobalWindows.windowed_value(run)


def bucket_name(bucket: int) -> str:
    """Temporary file name of a bucket's tar before the commit renames it to a shard."""
    return f"bucket-{bucket:06d}"


def length_bin(n_tokens: int) -> int:
    """Lower edge of a document's power-of-two length bin in tokens (0, 1, 2, 4, 8, ...)."""
    return 1 << (n_tokens.bit_length() - 1) if n_tokens > 0 else 0


def _fs(url: str):
    return fsspec.core.url_to_fs(url)


class WrittenShard(NamedTuple):
    """One written bucket, before the commit names it: its ``bucket`` number, the shard's ``info``
    (:class:`shards.ShardInfo`, named after the bucket until then) and its ``index``
    (:class:`shards.ShardIndex` without per-sample offsets, or ``None`` without ``shards.write_index``)."""

    bucket: int
    info: ShardInfo
    index: ShardIndex | None


class WriteBucketFn(beam.DoFn):
    """``(bucket, paths of its runs)`` → the :class:`WrittenShard` of a tar under ``OUT/_tmp_buckets/``.

    The runs are files of encoded samples, each sorted by :func:`sample_order`
    (:class:`AssignBucketsFn`); they are read a frame at a time and merged, so samples are written
    sorted by key and only one frame of each run exists as objects at a time. A key seen twice (two documents with the
    same id but different text) keeps the first in sort order and emits ``filtered:duplicate_id`` for the
    other. Emits ``kept``, ``tokens`` and ``text_bytes`` events per source. With ``write_index``
    the DALI ``.idx`` is built here, in parallel, from the file just written. Documents encoded
    for ``token_blocks`` are cut into blocks of ``block_tokens`` in key order.
    """

    def __init__(self, output_dir: str, write_index: bool, compression: str = "none", block_tokens: int = 0,
                 layout: str = "token_blocks"):
        self.output_dir, self.write_index = output_dir, write_index
        self.compression, self.block_tokens, self.layout = compression, block_tokens, layout

    def process(self, item):
        """Write one bucket's runs, merged by key, into one tar (token blocks or one sample per
        document); yields ``(bucket, ShardInfo, index)`` and ``kept``/``tokens``/length events."""
        bucket, paths = item
        with contextlib.ExitStack() as files:
            runs = [decode_stream(files.enter_context(fsspec.open(path, "rb"))) for path in paths]
            yield from self._write(bucket, heapq.merge(*runs, key=sample_order))

    def _write(self, bucket: int, docs):
        fs, root = _fs(self.output_dir)
        name = bucket_name(bucket)
        local = isinstance(fs, LocalFileSystem)
        tmp_local = os.path.join(root, TMP_DIR) if local else tempfile.mkdtemp(prefix="colaflow-")
        os.makedirs(tmp_local, exist_ok=True)
        path = os.path.join(tmp_local, name)
        last_key = None
        counts: dict[tuple[str, str], int] = {}  # summed per bucket: one event per (source, name)
        with TarShardWriter(path) as writer:
            sink = get_layout(self.layout).sink(writer.write, self.compression, self.block_tokens)
            for doc in docs:
                if doc.key == last_key:
                    counts[doc.source, "filtered:duplicate_id"] = counts.get((doc.source, "filtered:duplicate_id"), 0) + 1
                    continue
                last_key = doc.key
                sink.add(doc)
                for name, n in (("kept", 1), ("tokens", doc.tokens), ("text_bytes", doc.text_bytes),
                                (f"length:{length_bin(doc.tokens)}", 1)):
                    counts[doc.source, name] = counts.get((doc.source, name), 0) + n
            sink.flush()
        for (source, name), n in sorted(counts.items()):
            yield event(source, name, n)
        index = None
        if self.write_index:
            index = build_shard_index(path, url=name, schema="text")
            write_dali_index(index, dali_index_path(path))
            index = dataclasses.replace(index, samples=[])  # offsets live in the .idx; keep the side input small
        if not local:
            fs.makedirs(f"{root}/{TMP_DIR}", exist_ok=True)
            for local_file in [path] + ([dali_index_path(path)] if index else []):
                fs.put_file(local_file, f"{root}/{TMP_DIR}/{os.path.basename(local_file)}")
                os.unlink(local_file)
            os.rmdir(tmp_local)
        yield WrittenShard(bucket, writer.info, index)


class TokenizerOutput(NamedTuple):
    """What every shard set of a run carries of its tokenizer, made once per run (:func:`tokenizer_output`).

    Attributes:
        name: the tokenizer file's name (the manifest's ``tokenizer``).
        files: file name -> bytes written beside the shards (:func:`shards.tokenizers.folder_files`).
        identity: the manifest's ``tokenizer_identity``.
        vocab_size: ids are below it.
    """

    name: str
    files: dict
    identity: TokenizerIdentity
    vocab_size: int


def tokenizer_output(tokenizer: TokenizerFile, tokenizer_cfg: TokenizerConfig) -> TokenizerOutput:
    """The :class:`TokenizerOutput` of ``tokenizer`` as ``tokenizer_cfg`` uses it (its identity); the
    transformers files are converted and checked here, once for the training and validation sets."""
    from pipelines.stages.tokenize import identity

    tok = build(tokenizer)
    return TokenizerOutput(tokenizer.name, folder_files(tokenizer, tok), identity(tok, tokenizer_cfg), tok.vocab_size)


def commit_shards(output_dir: str, cfg: ShardsConfig, shards: list, tokenizer: TokenizerOutput,
                  splits: dict | None = None) -> Manifest:
    """Commit one shard set: rename bucket tars (and their ``.idx``) to ``{prefix}-NNNNNN`` in bucket
    order, remove stale shards of an earlier run, write the tokenizer's files, the wids
    ``shardindex.json`` (with ``cfg.write_index``) and, last, ``manifest.json`` (with the tokenizer's
    identity, ``splits``, and ``cfg.layout`` also when ``shards`` is empty); returns the manifest."""
    from pipelines.stages.tokenize import token_dtype

    vocab_size = tokenizer.vocab_size
    fs, root = _fs(output_dir)
    fs.makedirs(root, exist_ok=True)
    infos, indexes = [], []
    for n, (bucket, info, index) in enumerate(sorted(shards, key=lambda s: s.bucket)):
        final = shard_name(cfg.prefix, n)
        src = f"{root}/{TMP_DIR}/{bucket_name(bucket)}"
        for a, b in [(src, f"{root}/{final}"), (dali_index_path(src), dali_index_path(f"{root}/{final}"))]:
            if fs.exists(a):
                fs.mv(a, b)
        infos.append(dataclasses.replace(info, name=final))
        if index is not None:
            indexes.append(dataclasses.replace(index, url=final))
    keep = {i.name for i in infos}
    for stale in fs.glob(f"{root}/{cfg.prefix}-*.tar") + fs.glob(f"{root}/{cfg.prefix}-*.idx"):
        if stale.rsplit("/", 1)[-1].replace(".idx", ".tar") not in keep:
            fs.rm(stale)
    if fs.exists(f"{root}/{TMP_DIR}"):
        fs.rm(f"{root}/{TMP_DIR}", recursive=True)
    for name, data in tokenizer.files.items():
        fs.pipe_file(f"{root}/{name}", data)
    if indexes:
        fs.pipe_file(f"{root}/{WIDS_FILE}", (json.dumps(wids_index(indexes), indent=1) + "\n").encode("utf-8"))
    # the configured layout, not one read off the shards: a job that wrote none has no shard to tell
    manifest = Manifest(shards=infos, tokenizer=tokenizer.name, tokenizer_identity=tokenizer.identity,
                        vocab_size=vocab_size,
                        token_dtype=token_dtype(vocab_size).name, splits=splits or {}, layout=cfg.layout)
    fs.pipe_file(f"{root}/manifest.json", manifest.to_json().encode("utf-8"))
    return manifest


def finalize(_, output_dir: str, cfg: ShardsConfig, tokenizer_cfg: TokenizerConfig, shards: list, events: list,
             tokenizer: TokenizerFile, val_shards: list | None = None) -> dict:
    """Commit the run: the validation shard set first (``OUT/val/``, when ``val_shards`` is given),
    then the training shards with a manifest listing it under ``splits`` (see :func:`commit_shards`),
    then ``stats.json``; returns the stats. ``stats["splits"]`` counts shards, documents and tokens
    per split; ``stats["shards_requested"]`` is ``cfg.num_shards`` (0: derived from ``target_bytes``),
    which empty buckets can leave above ``stats["shards"]`` (see :func:`pipelines.accounting.report.shard_shortfall`).

    Raises:
        pipelines.stages.tokenize.EmptySampleError: no document was kept (every record dead-lettered or
            filtered; the message gives the reasons), before anything is committed; a
            ``NoRecordsError`` when no record was read at all."""
    from pipelines.accounting.read_summary import ReadSummary
    from pipelines.stages.tokenize import empty_error

    stats = aggregate(events)
    if not stats["total"]["kept"]:  # with --tokenizer no sample was trained, so nothing failed before
        raise empty_error(ReadSummary.from_total(stats["total"]), "no document was kept, so no shard was written",
                          "or the clean.* settings")
    splits, output = {}, tokenizer_output(tokenizer, tokenizer_cfg)
    if val_shards is not None:
        val = commit_shards(f"{output_dir}/{VAL_DIR}", cfg, val_shards, output)
        splits[VAL] = split_entry(val, f"{VAL_DIR}/manifest.json", val.to_json().encode("utf-8"))
    manifest = commit_shards(output_dir, cfg, shards, output, splits)
    fs, root = _fs(output_dir)
    index_bytes = sum(fs.size(p) for p in fs.glob(f"{root}/{cfg.prefix}-*.idx"))
    if fs.exists(f"{root}/{WIDS_FILE}"):
        index_bytes += fs.size(f"{root}/{WIDS_FILE}")
    stats.update(shards=len(manifest.shards), shards_requested=cfg.num_shards, vocab_size=manifest.vocab_size, token_dtype=manifest.token_dtype,
                 layout=manifest.layout, shard_bytes=manifest.total_bytes, index_bytes=index_bytes,
                 shard_bytes_per_token=(manifest.total_bytes + index_bytes) / max(manifest.total_tokens, 1))
    if splits:
        stats["splits"] = {"train": {"shards": len(manifest.shards), "samples": manifest.total_documents,
                                     "tokens": manifest.total_tokens},
                           **{name: {k: e[k] for k in ("shards", "samples", "tokens")} for name, e in splits.items()}}
    fs.pipe_file(f"{root}/stats.json", (json.dumps(stats, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    extra = "".join(f" (+{e['shards']} {name})" for name, e in splits.items())
    print(f"committed {count(len(manifest.shards), 'shard')}{extra}, manifest.json and stats.json to {output_dir}",
          file=sys.stderr, flush=True)
    return stats


class WriteShards(beam.PTransform):
    """``PCollection[SpilledSamples]`` → a :class:`WrittenShard` per bucket (tag ``events``). The
    samples stay in files of the spill folder until :class:`WriteBucketFn` writes them: what the steps
    pass (and a runner buffers until the total size, a side input, is known) is paths and sizes.

    Args:
        output_dir: the folder of the shard set.
        cfg: the shard settings.
        folder: the spill folder (fsspec URL) of the bucket runs.
    """

    def __init__(self, output_dir: str, cfg: ShardsConfig, folder: str):
        super().__init__()
        check_settings(cfg.layout, cfg.compression, cfg.block_tokens)
        self.output_dir, self.cfg, self.folder = output_dir, cfg, folder

    def expand(self, spilled):
        """Spilled samples → written shards (main output) and events: size the dataset, assign
        buckets, group the runs' paths and write one tar per bucket."""
        total = (spilled | "Size" >> beam.Map(lambda s: s.size)
                 | "TotalSize" >> beam.CombineGlobally(sum))
        return (spilled
                | "Assign" >> beam.ParDo(AssignBucketsFn(self.folder), beam.pvalue.AsSingleton(total), self.cfg)
                | "GroupBucket" >> beam.GroupByKey()
                | "WriteBucket" >> beam.ParDo(WriteBucketFn(self.output_dir, self.cfg.write_index, self.cfg.compression,
                                                            self.cfg.block_tokens, self.cfg.layout)).with_outputs(EVENTS, main="shards"))
