"""Validation of shards against the format and the manifest, strict or lenient.

Fault classes (each message names the shard and, where there is one, the member):

* sample level — ``duplicate_member``, ``non_adjacent``, ``no_suffix``, ``not_regular``,
  ``missing_field``, ``undecodable``;
* file level — ``truncated``, ``corrupt`` (tar structure), ``missing_shard``,
  ``size_mismatch``, ``checksum_mismatch``, ``count_mismatch`` (samples or tokens vs manifest),
  ``token_out_of_range`` (a token id at or above the manifest's ``vocab_size``);
* folder level — ``unlisted_shard`` (a ``.tar`` beside ``manifest.json`` that it does not list:
  a leftover of another run, or a manifest that lost an entry).

Strict mode fails a shard on any fault. Lenient mode skips faulty samples and counts
them; the shard still passes when its file-level checks pass. Sample and token counts
are compared with the manifest only when the shard read without any fault.
"""
from __future__ import annotations

# fsspec is imported where it is used: loader worker processes reading local shards skip its import
import os
from dataclasses import dataclass, field

import numpy as np

from shards.format.blocks import BLOCK_LAYOUT, decode_meta_dict
from shards.format.manifest import Manifest, ShardInfo
from shards.format.tokens import TokenRangeError, check_token_ids
from shards.io.index import HashingReader
from shards.io.reader import ReadStats, ShardError, iter_samples

SAMPLE_FAULTS = ("duplicate_member", "non_adjacent", "no_suffix", "not_regular", "missing_field", "undecodable")


@dataclass
class VerifyConfig:
    """How to verify shards.

    Attributes:
        strict: fail a shard on any fault (True) or skip and count faulty samples (False).
        schema: required fields per sample: ``text``, ``image``, ``any``, or ``auto``
            (``text`` when the manifest lists tokens or a tokenizer, else ``any``).
        checksums: compare sha256 and byte size with the manifest.
    """

    strict: bool = True
    schema: str = "auto"
    checksums: bool = True


@dataclass
class ShardReport:
    """Outcome of verifying one shard.

    Attributes:
        path: the shard's path or URL.
        samples: samples read and decoded; tokens: tokens in them; bytes: file size read.
        documents: documents in them (a token block holds many; otherwise one per sample).
        sha256: hex digest of the file as read ("" when it could not be read).
        stats: faults by class (sample- and file-level) with their messages.
        ok: whether the shard passes under the config it was verified with.
    """

    path: str
    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    documents: int = 0
    sha256: str = ""
    stats: ReadStats = field(default_factory=ReadStats)
    ok: bool = True

    @property
    def messages(self) -> list[str]:
        """The fault messages found while reading the shard."""
        return self.stats.messages


def _schema(cfg: VerifyConfig, manifest: Manifest | None) -> str:
    if cfg.schema != "auto":
        return cfg.schema
    return "text" if manifest is not None and (manifest.tokenizer or manifest.total_tokens) else "any"


def verify_shard(path: str, expected: ShardInfo | None = None, cfg: VerifyConfig | None = None,
                 schema: str = "any", vocab_size: int = 0) -> ShardReport:
    """Read a whole shard, decoding every member, and compare it with its manifest entry.

    Args:
        path: shard path or fsspec URL.
        expected: the shard's manifest entry (size, sha256, samples, tokens), if any.
        cfg: strict/lenient and which checks (default :class:`VerifyConfig`).
        schema: required fields per sample (``text``, ``image``, ``any``).
        vocab_size: the manifest's vocabulary; a token id at or above it is a ``token_out_of_range``
            fault (0 = not checked).
    Returns:
        a :class:`ShardReport`; never raises for a malformed shard (faults are in the report).
    """
    cfg = cfg or VerifyConfig()
    rep = ShardReport(path)
    stats = rep.stats
    try:
        import fsspec
        f = fsspec.open(path, "rb").open()
    except FileNotFoundError:
        stats.add("missing_shard", f"{path}: shard file is missing")
        rep.ok = False
        return rep
    with f:
        hf = HashingReader(f)
        for sample in iter_samples(path, hf, stats=stats, schema=schema):
            tokens = sample.get("tokens")
            n = int(tokens.size) if isinstance(tokens, np.ndarray) else 0
            try:
                check_token_ids(tokens if n else np.zeros(0), vocab_size, f"{path}: {sample['__key__']!r}")
            except TokenRangeError as e:
                stats.add("token_out_of_range", str(e))
            meta = sample.get("json")
            if isinstance(meta, dict) and meta.get("layout") == BLOCK_LAYOUT:
                where = f"{path}: block {sample['__key__']!r}"
                try:
                    block = decode_meta_dict(meta, where)
                    if block.tokens != n:
                        raise ValueError(f"{where}: {n} tokens, its metadata lists {len(block.ids)} documents of "
                                         f"{block.tokens} tokens")
                except ValueError as e:
                    stats.add("undecodable", f"{e}; rewrite the shard")
                    stats.samples -= 1
                    continue
                rep.documents += len(block.ids)
            else:
                rep.documents += 1
            rep.tokens += n
        rep.samples = stats.samples
        try:
            while hf.read(1 << 20):
                pass
        except OSError as e:
            stats.add("corrupt", f"{path}: read error after the last member: {e}")
    rep.bytes, rep.sha256 = hf.size, hf.sha256.hexdigest()
    skipped = sum(stats.counts[k] for k in SAMPLE_FAULTS)
    if expected is not None and cfg.checksums:
        if rep.bytes != expected.bytes:
            stats.add("size_mismatch", f"{path}: whole file: {rep.bytes} bytes, manifest says {expected.bytes}")
        elif rep.sha256 != expected.sha256:
            stats.add("checksum_mismatch", f"{path}: whole file: sha256 {rep.sha256[:16]}... differs from the "
                      f"manifest's {expected.sha256[:16]}...; re-download or rewrite the shard")
    if expected is not None and not stats.faults:  # counts only mean something for a clean read
        checks = [("samples", rep.samples, expected.samples), ("tokens", rep.tokens, expected.tokens)]
        if expected.documents:  # format 2 lists documents per shard
            checks.append(("documents", rep.documents, expected.documents))
        for what, got, want in checks:
            if got != want:
                stats.add("count_mismatch", f"{path}: whole file: {got} {what} read, manifest says {want}")
    tolerated = skipped if not cfg.strict else 0
    rep.ok = stats.faults == tolerated
    return rep


def resolve(paths: list[str]) -> list[tuple[str, ShardInfo | None, Manifest | None]]:
    """Expand CLI arguments into ``(shard_path, manifest_entry, manifest)``.

    A folder or ``manifest.json`` stands for every shard in the manifest (a folder without a
    manifest: its ``*.tar`` files, sorted); a ``.tar`` path uses the entry of the
    ``manifest.json`` beside it when there is one.
    Raises:
        FileNotFoundError: a path that does not exist; ValueError: a malformed manifest.
    """
    out = []
    for p in paths:
        if os.path.isdir(p) and not os.path.exists(os.path.join(p, "manifest.json")):
            out += [(os.path.join(p, n), None, None) for n in sorted(os.listdir(p)) if n.endswith(".tar")]
            continue
        if os.path.isdir(p) or p.endswith("manifest.json"):
            m = Manifest.load(p)
            base = p if os.path.isdir(p) else os.path.dirname(p)
            out += [(os.path.join(base, s.name), s, m) for s in m.shards]
            continue
        beside = os.path.join(os.path.dirname(p), "manifest.json")
        m = Manifest.load(beside) if os.path.exists(beside) else None
        entry = next((s for s in m.shards if s.name == os.path.basename(p)), None) if m else None
        out.append((p, entry, m if entry else None))
    return out


def unlisted_shards(paths: list[str]) -> list[ShardReport]:
    """A failed report (``unlisted_shard``) per ``.tar`` in a local folder (or beside a local
    ``manifest.json``) among ``paths`` that its manifest does not list."""
    reports = []
    for p in paths:
        folder = p if os.path.isdir(p) else os.path.dirname(p) if p.endswith("manifest.json") else None
        if folder is None or "://" in p or not os.path.exists(os.path.join(folder, "manifest.json")):
            continue
        listed = {s.name for s in Manifest.load(folder).shards}
        for name in sorted(n for n in os.listdir(folder) if n.endswith(".tar") and n not in listed):
            rep = ShardReport(os.path.join(folder, name), ok=False)
            rep.stats.add("unlisted_shard", f"{rep.path}: not listed in {os.path.join(folder, 'manifest.json')}: "
                          "a leftover of another run, or the manifest lost its entry; delete the file or rewrite "
                          "the dataset")
            reports.append(rep)
    return reports


def verify_paths(paths: list[str], cfg: VerifyConfig | None = None, progress: bool = True) -> list[ShardReport]:
    """Verify shards given as folders, manifests or ``.tar`` paths (see :func:`resolve`) against
    their manifest, token ids against its ``vocab_size`` included; a ``.tar`` in such a folder that
    the manifest does not list fails too (:func:`unlisted_shards`)."""
    cfg = cfg or VerifyConfig()
    reports = []
    from tqdm import tqdm  # imported where used, as fsspec is (loader workers import this module)

    for path, entry, manifest in tqdm(resolve(paths), desc="verify", unit="shard", disable=not progress):
        reports.append(verify_shard(path, entry, cfg, _schema(cfg, manifest), manifest.vocab_size if manifest else 0))
    return reports + unlisted_shards(paths)


def check_shard(path: str, expected: ShardInfo | None = None, schema: str = "any") -> None:
    """Strict verification of one shard for callers that want an exception (e.g. a cache).

    Raises:
        ShardError: the first fault found; ``kind`` names its class.
    """
    rep = verify_shard(path, expected, VerifyConfig(strict=True), schema)
    if not rep.ok:
        kind = next(iter(rep.stats.counts))
        raise ShardError(rep.messages[0] if rep.messages else f"{path}: {kind}", kind)
