"""Index files for DALI's webdataset reader, with bad samples left out and counted.

DALI's ``fn.readers.webdataset`` reads a shard at the byte offsets listed in an index
file (format ``v1.2``, as written by DALI's ``wds2idx`` tool): a first line
``v1.2 <num_samples>``, then one line per sample with, per member,
``<ext> <data_offset> <size> <member_name>``.

A sample whose image does not decode fails the whole DALI batch (the decoder raises, no
skip option), so while indexing every image is decoded once with PIL and every ``cls``
parsed; a sample that fails, or lacks the image or ``cls`` member, is left out of the index
and recorded in a dead-letter file ``<index>.rejected.jsonl`` (one JSON object per line:
``shard``, ``key``, ``reason``). An index is reused while it is newer than its shard.
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import asdict, dataclass, field

from PIL import Image
from tqdm import tqdm

from shards.io.reader import iter_groups

INDEX_VERSION = "v1.2"
VALIDATE_DRAFT_PX = 64  # JPEG: decode at reduced DCT scale; still reads every entropy-coded byte


@dataclass(frozen=True)
class Rejected:
    """One sample left out of an index: shard path, sample key, reason in words."""

    shard: str
    key: str
    reason: str


@dataclass
class IndexReport:
    """Result of :func:`ensure_indexes`.

    Attributes:
        shards: shard paths that hold at least one good sample, in input order.
        indexes: index path of each entry of ``shards``.
        samples: good samples over all shards.
        rejected: samples left out (dead letters), over all shards.
    """

    shards: list[str] = field(default_factory=list)
    indexes: list[str] = field(default_factory=list)
    samples: int = 0
    rejected: list[Rejected] = field(default_factory=list)


def _check_image(data: bytes) -> None:
    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (VALIDATE_DRAFT_PX, VALIDATE_DRAFT_PX))
        im.load()


def _reason(fields: dict[str, bytes], image_ext: str, validate: bool) -> str | None:
    for ext in (image_ext, "cls"):
        if ext not in fields:
            return f"missing member .{ext}"
    try:
        int(fields["cls"].decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return f"cls is not an integer: {fields['cls'][:20]!r}"
    if not validate:
        return None
    try:
        _check_image(fields[image_ext])
    except Exception as e:  # noqa: BLE001 - any decoder failure marks the sample bad
        return f"image does not decode: {type(e).__name__}: {e}"
    return None


def write_wds_index(shard: str, index_path: str, image_ext: str = "jpg",
                    validate: bool = True) -> tuple[int, list[Rejected]]:
    """Write the DALI index of one shard, leaving bad samples out.

    Args:
        shard: local path of a tar shard.
        index_path: index file to write (atomically), plus ``index_path + ".rejected.jsonl"``.
        image_ext: member suffix holding the image (``jpg``, ``png``, ...).
        validate: decode every image with PIL (set False to trust the images; missing
            members and a bad ``cls`` are still caught).
    Returns:
        ``(good_samples, rejected)``.
    Raises:
        ShardError: the shard is not a well-formed tar (see :func:`shards.io.reader.iter_groups`;
            the message names the shard and member: re-fetch or rebuild it).
    """
    lines, rejected = [], []
    for key, fields, infos in iter_groups(shard):  # strict: a malformed tar raises ShardError
        reason = _reason(fields, image_ext, validate)
        if reason is not None:
            rejected.append(Rejected(shard, key, reason))
            continue
        lines.append(" ".join(f"{ext} {ti.offset_data} {ti.size} {ti.name}" for ext, ti in infos.items()))
    for path, text in ((index_path, f"{INDEX_VERSION} {len(lines)}\n" + "".join(s + "\n" for s in lines)),
                       (index_path + ".rejected.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in rejected))):
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return len(lines), rejected


def index_path_for(shard: str, index_dir: str | None = None) -> str:
    """``shard-000000.tar`` → ``shard-000000.checked.idx`` beside it, or inside ``index_dir``.

    Not ``shard-000000.idx``: that name is the full index of :mod:`shards.io.index`, whose
    positions must match the shard; this one may leave samples out.
    """
    base = os.path.basename(shard)
    stem = base[:-4] if base.endswith(".tar") else base
    return os.path.join(index_dir or os.path.dirname(shard), stem + ".checked.idx")


def _read_existing(shard: str, index_path: str) -> tuple[int, list[Rejected]] | None:
    dead = index_path + ".rejected.jsonl"
    if not (os.path.exists(index_path) and os.path.exists(dead)
            and os.path.getmtime(index_path) >= os.path.getmtime(shard)):
        return None
    with open(index_path, encoding="utf-8") as f:
        version, _, count = f.readline().partition(" ")
    if version != INDEX_VERSION:
        return None
    with open(dead, encoding="utf-8") as f:
        return int(count), [Rejected(**json.loads(line)) for line in f if line.strip()]


def ensure_indexes(shards: list[str], index_dir: str | None = None, image_ext: str = "jpg",
                   validate: bool = True) -> IndexReport:
    """Make (or reuse) the index of every shard; report good samples and dead letters.

    Shards left with no good sample are dropped from the report's ``shards`` (DALI
    refuses an empty index). Prints a one-line summary when samples were rejected.

    Raises:
        shards.ShardError: a shard is not a well-formed tar.
        ValueError: no shard holds a good sample.
    """
    if index_dir:
        os.makedirs(index_dir, exist_ok=True)
    report = IndexReport()
    for shard in tqdm(shards, desc="index shards", unit="shard", disable=len(shards) < 8):
        idx = index_path_for(shard, index_dir)
        good, rejected = _read_existing(shard, idx) or write_wds_index(shard, idx, image_ext, validate)
        report.rejected.extend(rejected)
        if good:
            report.shards.append(shard)
            report.indexes.append(idx)
            report.samples += good
    if report.rejected:
        print(f"images index: left out {len(report.rejected)} bad samples (listed in *.idx.rejected.jsonl), "
              f"first: {report.rejected[0]}")
    if not report.samples:
        raise ValueError(f"no readable image sample in {len(shards)} shards "
                         f"(check the .{image_ext}/.cls members; dead letters in *.idx.rejected.jsonl)")
    return report
