"""The manifest: the dataset-level contract between preprocessing and training.

``manifest.json`` sits beside the shards and lists, per shard, its name, sample count,
token count, byte size and sha256, plus the tokenizer used. Readers on other nodes
load it by URL (fsspec) and hand the sha256/bytes to the cache for verification.
"""
from __future__ import annotations

# fsspec is imported where it is used: loader worker processes reading local shards skip its import
import json
import os
from dataclasses import asdict, dataclass, field, fields

from shards.format.layouts import LAYOUTS, get_layout
from shards.format.urls import shard_url  # noqa: F401  (re-exported: shard URLs beside a manifest)

FORMAT_VERSION = 3
# 1: one sample per document; 2 adds token blocks and per-shard document counts; 3: token blocks' metadata
# holds ids and sources as text columns (block metadata version 2, ``shards.format.blocks``)
SUPPORTED_VERSIONS = (1, 2, 3)


@dataclass(frozen=True)
class ShardInfo:
    """One shard as listed in the manifest.

    Attributes:
        name: file name relative to the manifest's folder, e.g. ``shard-000000.tar``.
        samples: number of samples (keys) in the shard.
        tokens: number of tokens over all samples (0 for non-text shards).
        bytes: exact file size in bytes.
        sha256: hex digest of the whole file.
        documents: documents in the shard (text; a token block holds many, see ``shards.format.blocks``).
        blocks: token blocks in the shard (0 for one-sample-per-document and image shards).
    """

    name: str
    samples: int
    tokens: int
    bytes: int
    sha256: str
    documents: int = 0
    blocks: int = 0


@dataclass(frozen=True)
class TokenizerIdentity:
    """Which tokenizer wrote the tokens, and how documents are marked in them.

    Attributes:
        kind: ``sentencepiece``, ``hf`` or ``tiktoken`` (``shards.tokenizers``).
        sha256: hex digest of the tokenizer file (the manifest's ``tokenizer``) as it was used.
        bos_id / eos_id / pad_id: the tokenizer's special ids, ``None`` where it has none.
        add_bos: every document starts with ``bos_id``.
        add_eos: every document ends with ``eos_id``.
    """

    kind: str = "sentencepiece"
    sha256: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False


def _identity(d: dict | None) -> TokenizerIdentity | None:
    """The :class:`TokenizerIdentity` of a manifest's entry; keys a later colaflow may add (optional
    facts within the same ``format_version``) are left out rather than refused."""
    if not d:
        return None
    known = {f.name for f in fields(TokenizerIdentity)}
    return TokenizerIdentity(**{k: v for k, v in d.items() if k in known})


@dataclass
class Manifest:
    """Dataset manifest (``manifest.json``).

    Attributes:
        shards: shards in dataset order.
        tokenizer: the tokenizer file's path relative to the manifest's folder, or ``None``.
        tokenizer_identity: its kind, fingerprint and special ids; ``None`` in manifests written before
            colaflow recorded them (a sentencepiece model, documents without BOS/EOS).
        vocab_size: tokenizer vocabulary size (0 when there is no tokenizer).
        token_dtype: numpy dtype name of token arrays, ``uint16`` or ``uint32``.
        format_version: integer format version, bumped on incompatible change.
        layout: ``documents`` (one tar sample per document or image) or ``token_blocks`` (text:
            one tar sample per block of documents, ``shards.format.blocks``).
        splits: other shard sets of the same dataset, by split name (e.g. ``val``): each
            ``{"manifest": path of its manifest.json relative to this manifest's folder, "shards",
            "samples", "tokens", "sha256": hex digest of that manifest file}``; written only when
            non-empty (see :mod:`pipelines.stages.split`).
    """

    shards: list[ShardInfo] = field(default_factory=list)
    tokenizer: str | None = None
    tokenizer_identity: TokenizerIdentity | None = None
    vocab_size: int = 0
    token_dtype: str = "uint16"
    format_version: int = FORMAT_VERSION
    layout: str = "documents"
    splits: dict = field(default_factory=dict)

    @property
    def total_samples(self) -> int:
        """Samples (tar sample keys) over all shards."""
        return sum(s.samples for s in self.shards)

    @property
    def total_tokens(self) -> int:
        """Tokens over all shards."""
        return sum(s.tokens for s in self.shards)

    @property
    def total_bytes(self) -> int:
        """Shard file bytes over all shards."""
        return sum(s.bytes for s in self.shards)

    @property
    def padding_id(self) -> int:
        """The id a loader puts in padding cells: the tokenizer's ``pad_id``, else its ``eos_id``, else 0
        (padding is masked out of attention and loss either way; a real id of this vocabulary keeps
        any model's embedding lookup in range)."""
        ident = self.tokenizer_identity or TokenizerIdentity()
        return next((i for i in (ident.pad_id, ident.eos_id) if i is not None), 0)

    @property
    def total_documents(self) -> int:
        """Documents over all shards (equals :attr:`total_samples` for the per-document layout)."""
        return sum(self.document_counts())

    def document_counts(self) -> list[int]:
        """Documents per shard in manifest order (the loader's unit; a token block holds many)."""
        layout = get_layout(self.layout)
        return [layout.documents(s) for s in self.shards]

    def to_json(self) -> str:
        """The manifest as indented JSON text, with the derived totals (the bytes written to ``manifest.json``)."""
        d = asdict(self)
        d["total_samples"], d["total_tokens"], d["total_bytes"], d["total_documents"] = (
            self.total_samples, self.total_tokens, self.total_bytes, self.total_documents)
        if not self.splits:  # manifests without splits keep their earlier bytes
            d.pop("splits")
        if self.tokenizer_identity is None:
            d.pop("tokenizer_identity")
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    def save(self, directory: str) -> str:
        """Write ``manifest.json`` into ``directory`` atomically; returns its path."""
        path = os.path.join(directory, "manifest.json")
        tmp = path + f".tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        os.replace(tmp, path)
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        """Build from a parsed ``manifest.json``.

        Raises:
            ValueError: an unsupported ``format_version`` or ``layout``.
        """
        version = d.get("format_version")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"manifest format_version {version!r} is not supported (expected one of "
                             f"{SUPPORTED_VERSIONS}); upgrade colaflow or rewrite the shards")
        layout = d.get("layout", "documents")
        if layout not in LAYOUTS:
            raise ValueError(f"manifest layout {layout!r} is not one of {tuple(LAYOUTS)}")
        return cls(
            shards=[ShardInfo(**{k: s[k] for k in ("name", "samples", "tokens", "bytes", "sha256")},
                              documents=int(s.get("documents", 0)), blocks=int(s.get("blocks", 0)))
                    for s in d["shards"]],
            tokenizer=d.get("tokenizer"),
            tokenizer_identity=_identity(d.get("tokenizer_identity")),
            vocab_size=int(d.get("vocab_size", 0)),
            token_dtype=d.get("token_dtype", "uint16"),
            format_version=version,
            layout=layout,
            splits=dict(d.get("splits") or {}),
        )

    @classmethod
    def load(cls, url: str) -> "Manifest":
        """Load a manifest from a local path, a folder holding ``manifest.json``, or any fsspec URL.

        Raises:
            FileNotFoundError: no manifest at ``url``.
            ValueError: the file is not a manifest of a supported version.
        """
        if "://" not in url and os.path.isdir(url):
            url = os.path.join(url, "manifest.json")
        import fsspec
        with fsspec.open(url, "r", encoding="utf-8") as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{url}: not a JSON manifest ({e})") from e
        return cls.from_dict(d)


def split_manifest_url(manifest_url: str, manifest: Manifest, split: str) -> str:
    """URL of the manifest of split ``split`` (e.g. ``val``) of the dataset at ``manifest_url``.

    Raises:
        KeyError: the manifest lists no such split (the message names the splits it has).
    """
    if split not in manifest.splits:
        raise KeyError(f"{manifest_url}: the manifest has no {split!r} split (splits: {sorted(manifest.splits) or 'none'});"
                       " preprocess with split.val_fraction > 0")
    return shard_url(manifest_url, manifest.splits[split]["manifest"])
